//! Egress rules' named ports resolve against the destination pods' container ports: this
//! node's pods (from the pod watch) and other nodes' (from their kvstore records), kept per
//! identity as pods come, change and go.

use super::support::{fake_manager, make_ready, pod_request};
use crate::cluster::watch::Remote;
use crate::datapath::FakeDatapath;
use crate::hostnet::FakeHostNet;
use crate::kvstore::keys::{IpRecord, NamedPortRecord};
use crate::service::*;
use std::collections::BTreeMap;
use weft_policy::mapstate::{Direction, Identity, Verdict, proto};

/// Egress of `id=cli` to `id=srv` pods (any node) on the port they call `http`.
const CLI_TO_SRV_HTTP: &str = r#"[{"labels":["name=cli-out"],
  "endpointSelector":{"matchLabels":{"id":"cli"}},
  "egress":[{"toEndpoints":[{"matchLabels":{"id":"srv"}}],
             "toPorts":[{"ports":[{"port":"http","protocol":"TCP"}]}]}]}]"#;

struct World {
    m: Manager,
    dp: Arc<FakeDatapath>,
    pods: Arc<weft_k8s::cache::ClusterCache>,
}

fn world() -> World {
    let dp = Arc::new(FakeDatapath::default());
    let m = fake_manager(Arc::new(FakeHostNet::default()), dp.clone());
    let pods = Arc::new(weft_k8s::cache::ClusterCache::default());
    m.set_k8s_cache(pods.clone());
    World { m, dp, pods }
}

/// The pod watch has pod `default/name` with these container ports.
fn watch_pod(w: &World, name: &str, ports: &[(&str, u16)]) {
    let ports: Vec<serde_json::Value> = ports
        .iter()
        .map(|(n, p)| serde_json::json!({"name": n, "containerPort": p, "protocol": "TCP"}))
        .collect();
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "c", "ports": ports}]},
    });
    w.pods.put_pod(serde_json::from_value(pod).expect("a pod"));
}

fn ready(w: &World, c: &str, app: &str, ports: &[(&str, u16)]) -> Endpoint {
    watch_pod(w, c, ports);
    let ep = w.m.allocate(&pod_request(c, app)).expect("allocate");
    make_ready(&w.m, &ep)
}

fn egress(w: &World, from: &Endpoint, to: Identity, port: u16) -> Verdict {
    w.dp.policy(from.id)
        .expect("policy installed")
        .lookup(Direction::Egress, to, proto::TCP, port)
}

fn consistent(w: &World) {
    let r = w.m.verify().expect("verify");
    assert!(r.consistent, "{:?}", r.problems);
}

#[tokio::test]
async fn egress_names_follow_this_nodes_pods() {
    let w = world();
    let cli = ready(&w, "cli", "cli", &[]);
    let srv = ready(&w, "srv-1", "srv", &[("http", 8080)]);
    // The rule after the pods (a repository change) ...
    w.m.import_policy("p.json", CLI_TO_SRV_HTTP).unwrap();
    assert_eq!(egress(&w, &cli, srv.identity, 8080), Verdict::Allow);
    assert_eq!(egress(&w, &cli, srv.identity, 8081), Verdict::Deny);
    // ... and pods after the rule (identity and port changes): a second replica calls 8081
    // "http", so the identity is reachable on both.
    let srv2 = ready(&w, "srv-2", "srv", &[("http", 8081)]);
    assert_eq!(srv2.identity, srv.identity);
    assert_eq!(egress(&w, &cli, srv.identity, 8081), Verdict::Allow);
    consistent(&w);
    w.m.delete("srv-2", "eth0").await.unwrap();
    assert_eq!(egress(&w, &cli, srv.identity, 8081), Verdict::Deny);
    assert_eq!(egress(&w, &cli, srv.identity, 8080), Verdict::Allow);
    // The pod's ports change (the watch delivers it again): followed.
    watch_pod(&w, "srv-1", &[("http", 9090)]);
    assert!(w.m.refresh_endpoint(srv.id).unwrap());
    assert_eq!(egress(&w, &cli, srv.identity, 9090), Verdict::Allow);
    assert_eq!(egress(&w, &cli, srv.identity, 8080), Verdict::Deny);
    consistent(&w);
    // A relabelled pod takes its ports to its new identity.
    let moved =
        w.m.set_labels(srv.id, &["id=other".into()], &["id".into()])
            .unwrap();
    assert_ne!(moved.identity, srv.identity);
    assert_eq!(egress(&w, &cli, srv.identity, 9090), Verdict::Deny);
    consistent(&w);
}

#[tokio::test]
async fn egress_names_of_other_nodes_pods_come_with_their_records() {
    let w = world();
    let cli = ready(&w, "cli", "cli", &[]);
    w.m.import_policy("p.json", CLI_TO_SRV_HTTP).unwrap();
    let srv = weft_policy::labels::LabelSet::for_pod("default", [("id", "srv")]);
    w.m.identity_put(70_000, srv);
    let record = |ip: &str, port: u16| IpRecord {
        ip: ip.parse().unwrap(),
        identity: 70_000,
        node: "node-b".into(),
        node_ip: "192.0.2.2".parse().unwrap(),
        named_ports: vec![NamedPortRecord {
            name: "http".into(),
            protocol: "TCP".into(),
            port,
        }],
    };
    assert_eq!(egress(&w, &cli, 70_000, 8080), Verdict::Deny);
    w.m.ip_put(&record("10.9.0.5", 8080));
    assert_eq!(egress(&w, &cli, 70_000, 8080), Verdict::Allow);
    w.m.ip_put(&record("10.9.0.6", 8081));
    assert_eq!(egress(&w, &cli, 70_000, 8081), Verdict::Allow);
    consistent(&w);
    w.m.ip_deleted(&record("10.9.0.6", 8081));
    assert_eq!(egress(&w, &cli, 70_000, 8081), Verdict::Deny);
    // The node leaves: its addresses and their ports go.
    w.m.sync_remote_endpoints("node-b", &BTreeMap::new())
        .unwrap();
    assert_eq!(egress(&w, &cli, 70_000, 8080), Verdict::Deny);
    consistent(&w);
}

#[test]
fn records_carry_the_pods_named_ports_and_old_records_still_parse() {
    let ports = weft_policy::rule::NamedPorts::from([
        (("http".to_owned(), proto::TCP), 8080),
        (("dns".to_owned(), proto::UDP), 53),
    ]);
    let records = crate::kvstore::keys::named_port_records(&ports);
    assert_eq!(crate::kvstore::keys::named_ports_of(&records), ports);
    let old: IpRecord = serde_json::from_str(
        r#"{"ip":"10.0.0.1","identity":300,"node":"b","node_ip":"192.0.2.2"}"#,
    )
    .unwrap();
    assert!(old.named_ports.is_empty());
    let bad = [NamedPortRecord {
        name: "x".into(),
        protocol: "ICMP".into(),
        port: 1,
    }];
    assert!(crate::kvstore::keys::named_ports_of(&bad).is_empty());
}
