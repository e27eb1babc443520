//! Unit tests of the manager's operations over fake host plumbing and a fake datapath; the
//! managers and pods they start from are in `support`.

mod named_ports;
mod reimport;
mod slots;
pub(crate) mod support;

use super::*;
use crate::datapath::{FakeCall, FakeDatapath};
use crate::endpoint::EndpointError;
use crate::node::hostnet::FakeHostNet;
use std::collections::BTreeMap;
use support::{fake_manager, make_ready, pod_request};
use weft_api::{AllocateRequest, Attachment, TraceRequest};
use weft_policy::mapstate::{Direction, PolicyEntry, Verdict, proto};

struct World {
    m: Manager,
    net: Arc<FakeHostNet>,
    dp: Arc<FakeDatapath>,
}

fn world() -> World {
    world_with(None)
}

fn world_with(queue: Option<weft_api::delete_queue::DeleteQueue>) -> World {
    let net = Arc::new(FakeHostNet::default());
    let dp = Arc::new(FakeDatapath::default());
    let mut m = fake_manager(net.clone(), dp.clone());
    if let Some(q) = queue {
        m = m.with_delete_queue(q);
    }
    World { m, net, dp }
}

fn bare_request(c: &str) -> AllocateRequest {
    AllocateRequest {
        container_id: c.into(),
        ifname: "eth0".into(),
        netns: "/x".into(),
        pod_namespace: None,
        pod_name: None,
        labels: vec![],
    }
}

fn alloc(m: &Manager, c: &str, app: &str) -> Endpoint {
    m.allocate(&pod_request(c, app)).unwrap()
}

fn pod(w: &World, c: &str, app: &str) -> Endpoint {
    let ep = alloc(&w.m, c, app);
    make_ready(&w.m, &ep)
}

const GETTING_STARTED: &str = r#"[{"labels":[{"key":"name","value":"l3-rule"}],"endpointSelector":{"matchLabels":{"id":"app1"}},"ingress":[{"fromEndpoints":[{"matchLabels":{"id":"app2"}}],"toPorts":[{"ports":[{"port":"80","protocol":"TCP"}]}]}]}]"#;

fn allows(w: &World, ep: &Endpoint, from: &Endpoint, port: u16) -> bool {
    let p = w.dp.policy(ep.id).expect("policy installed");
    p.lookup(Direction::Ingress, from.identity, proto::TCP, port) == Verdict::Allow
}

#[tokio::test]
async fn gc_releases_only_invalid_settled_endpoints() {
    let w = world();
    let keep = pod(&w, "keep", "a");
    let stale = pod(&w, "stale", "a");
    let inflight = alloc(&w.m, "inflight", "a");
    w.net
        .links
        .lock()
        .unwrap()
        .insert(stale.host_ifname.clone(), 5);
    let valid = [Attachment {
        container_id: keep.container_id.clone(),
        ifname: "eth0".into(),
    }];
    let out = w.m.gc(&valid, inflight.created_ms + 1000).await.unwrap();
    assert_eq!(out.released.len(), 1);
    assert_eq!(out.released[0].container_id, "stale");
    assert!(
        w.m.find("inflight", "eth0").is_some(),
        "ADD in flight survives GC"
    );
    assert!(!w.net.links.lock().unwrap().contains_key(&stale.host_ifname));
    assert!(
        !w.dp.attached().iter().any(|e| e.endpoint_id == stale.id),
        "GC detached the datapath"
    );
    let out =
        w.m.gc(&valid, inflight.created_ms + ADD_GRACE_MS + 1)
            .await
            .unwrap();
    assert_eq!(out.released[0].container_id, "inflight");
    assert_eq!(w.m.status().pools[0].used, 1);
}

#[tokio::test]
async fn delete_is_idempotent_and_scoped_to_the_owner() {
    let w = world();
    let a = pod(&w, "a", "x");
    assert!(w.m.delete("b", "eth0").await.unwrap().deleted.is_none());
    assert_eq!(
        w.m.delete("a", "eth0").await.unwrap().deleted.unwrap().id,
        a.id
    );
    assert!(w.m.delete("a", "eth0").await.unwrap().deleted.is_none());
    assert_eq!(w.m.status().pools[0].used, 0);
    assert!(w.dp.attached().is_empty());
    assert!(
        w.m.identities().iter().all(|i| i.id < 256),
        "identity released"
    );
}

#[test]
fn same_labels_share_an_identity_and_namespace_is_a_label() {
    let w = world();
    let a = alloc(&w.m, "a", "web");
    let b = alloc(&w.m, "b", "web");
    let c = alloc(&w.m, "c", "db");
    assert_eq!(a.identity, b.identity);
    assert_ne!(a.identity, c.identity);
    assert!(a.identity >= 256);
    assert!(
        a.labels
            .iter()
            .any(|l| l.key == "k8s:io.kubernetes.pod.namespace" && l.value == "default")
    );
}

#[test]
fn getting_started_policy_regenerates_selectively_and_reports_the_revision() {
    let w = world();
    let app1 = pod(&w, "p1", "app1");
    let app2 = pod(&w, "p2", "app2");
    let app3 = pod(&w, "p3", "app3");
    assert!(allows(&w, &app1, &app3, 80), "no policy: default allow");
    let r = w.m.import_policy("gs.json", GETTING_STARTED).unwrap();
    assert_eq!(r.regenerated, 1, "only app1 is selected");
    assert!(allows(&w, &app1, &app2, 80));
    assert!(!allows(&w, &app1, &app3, 80));
    assert!(!allows(&w, &app1, &app2, 81));
    assert!(!w.dp.policy(app2.id).unwrap().ingress_enforced);
    for ep in w.m.endpoints() {
        assert_eq!(
            ep.policy_revision, r.revision,
            "every endpoint at the new revision"
        );
    }
    // A new app2 pod shares app2's identity: app1 allows it with no re-import.
    let late = pod(&w, "p4", "app2");
    assert!(allows(&w, &app1, &late, 80));
    // A pod with a new identity matching the selector updates app1's map when it appears.
    let d = w.m.delete_policy(&["name=l3-rule".into()], false).unwrap();
    assert!(d.revision > r.revision);
    assert!(allows(&w, &app1, &app3, 80), "deleted: allow all again");
}

#[test]
fn new_identity_matching_a_selector_updates_existing_peers() {
    let w = world();
    let app1 = pod(&w, "p1", "app1");
    w.m.import_policy(
        "sel.json",
        r#"[{"labels":[{"key":"name","value":"r"}],"endpointSelector":{"matchLabels":{"id":"app1"}},
            "ingress":[{"fromEndpoints":[{"matchExpressions":[{"key":"id","operator":"In","values":["app2","app5"]}]}]}]}]"#,
    )
    .unwrap();
    let before = w.dp.policy(app1.id).unwrap();
    let app5 = pod(&w, "p5", "app5");
    let after = w.dp.policy(app1.id).unwrap();
    assert_ne!(before, after, "app1's map gained app5's identity");
    assert_eq!(
        after.lookup(Direction::Ingress, app5.identity, proto::TCP, 1234),
        Verdict::Allow
    );
}

#[test]
fn label_change_moves_an_endpoint_into_a_selector() {
    let w = world();
    let app1 = pod(&w, "p1", "app1");
    let other = pod(&w, "p9", "app9");
    w.m.import_policy("gs.json", GETTING_STARTED).unwrap();
    assert!(!allows(&w, &app1, &other, 80));
    let moved = w.m.set_labels(other.id, &["id=app2".into()], &[]).unwrap();
    assert_ne!(moved.identity, other.identity);
    assert!(allows(&w, &app1, &moved, 80));
    assert!(
        w.dp.attached()
            .iter()
            .any(|e| e.endpoint_id == moved.id && e.identity == moved.identity),
        "the datapath maps the endpoint to its new identity"
    );
    let err =
        w.m.set_labels(moved.id, &[], &["io.kubernetes.pod.namespace".into()])
            .unwrap_err();
    assert!(err.to_string().contains("namespace"), "{err}");
}

#[test]
fn trace_agrees_with_the_installed_map() {
    let w = world();
    let app1 = pod(&w, "p1", "app1");
    let app2 = pod(&w, "p2", "app2");
    let app3 = pod(&w, "p3", "app3");
    w.m.import_policy("gs.json", GETTING_STARTED).unwrap();
    for (src, port, want) in [
        (&app2, 80, "allow"),
        (&app3, 80, "deny"),
        (&app2, 81, "deny"),
    ] {
        let t =
            w.m.trace(&TraceRequest {
                src: weft_api::TracePeerRequest {
                    endpoint: Some(src.id),
                    ..Default::default()
                },
                dst: weft_api::TracePeerRequest {
                    labels: vec!["id=app1".into()],
                    ..Default::default()
                },
                port,
                protocol: "tcp".into(),
            })
            .unwrap();
        assert_eq!(t.verdict, want, "{t:?}");
        assert_eq!(allows(&w, &app1, src, port), want == "allow");
    }
}

#[test]
fn rejected_import_changes_nothing() {
    let w = world();
    pod(&w, "p1", "app1");
    let rev = w.m.status().policy_revision;
    let err =
        w.m.import_policy(
            "bad.json",
            r#"[{"endpointSelector":{},"ingress":[{"toPorts":[{"ports":[{"port":"70000"}]}]}]}]"#,
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("bad.json") && err.contains("port"), "{err}");
    assert_eq!(w.m.status().policy_revision, rev);
}

#[test]
fn deny_entry_reaches_the_datapath() {
    let w = world();
    let app1 = pod(&w, "p1", "app1");
    w.m.import_policy(
        "deny.json",
        r#"[{"labels":[{"key":"name","value":"d"}],"endpointSelector":{"matchLabels":{"id":"app1"}},
            "ingressDeny":[{"fromEntities":["all"],"toPorts":[{"ports":[{"port":"22","protocol":"TCP"}]}]}],
            "ingress":[{"fromEntities":["all"]}]}]"#,
    )
    .unwrap();
    let p = w.dp.policy(app1.id).unwrap();
    assert!(p.entries.iter().any(|(k, v)| *v == Verdict::Deny
        && *k == PolicyEntry::new(Direction::Ingress, 0, proto::TCP, 22, 22)));
}

#[tokio::test]
async fn abandoned_add_is_reaped_with_its_ip_but_a_completed_one_is_not() {
    let w = world();
    let abandoned = alloc(&w.m, "killed-cni", "a");
    let completed = pod(&w, "finished", "a");
    let now = abandoned.created_ms.max(completed.created_ms) + ADD_GRACE_MS + 1;
    assert_eq!(
        crate::endpoint::restore::reap_abandoned(&w.m, abandoned.created_ms + 1).await,
        0,
        "still within the grace period"
    );
    assert_eq!(crate::endpoint::restore::reap_abandoned(&w.m, now).await, 1);
    assert!(w.m.find("killed-cni", "eth0").is_none());
    assert!(
        w.m.find("finished", "eth0").is_some(),
        "a completed ADD is never reaped"
    );
    assert_eq!(
        w.m.status().pools[0].used,
        1,
        "the abandoned IP is free again"
    );
}

#[tokio::test]
async fn a_stale_snapshot_never_tears_down_an_endpoint_that_moved_on() {
    let w = world();
    let seen = alloc(&w.m, "slow-cni", "a");
    // The reaper or GC saw it `allocated`; it registered before the removal got the lock.
    make_ready(&w.m, &seen);
    assert!(!w.m.remove_fully(&seen).await.unwrap());
    assert_eq!(
        w.m.find("slow-cni", "eth0").unwrap().state,
        EndpointState::Ready
    );
    // A DEL and a new ADD for the same pair: the old snapshot names another id now.
    w.m.delete("slow-cni", "eth0").await.unwrap();
    let again = alloc(&w.m, "slow-cni", "a");
    assert_ne!(again.id, seen.id);
    assert!(!w.m.remove_fully(&seen).await.unwrap());
    assert!(w.m.find("slow-cni", "eth0").is_some());
}

#[test]
fn a_queued_del_is_applied_before_a_new_add_of_the_same_pair() {
    let dir = tempfile::tempdir().unwrap();
    let queue = weft_api::delete_queue::DeleteQueue::for_socket(&dir.path().join("m.sock"));
    let w = world_with(Some(queue.clone()));
    let old = w.m.allocate(&bare_request("c")).unwrap();
    make_ready(&w.m, &old);
    // The manager was unreachable for the DEL; the runtime then ADDs the same pair again.
    queue
        .push(&weft_api::delete_queue::DeleteRequest {
            container_id: "c".into(),
            ifname: "eth0".into(),
        })
        .unwrap();
    let new = w.m.allocate(&bare_request("c")).unwrap();
    assert_ne!(new.id, old.id, "a fresh endpoint, not the deleted one");
    assert!(queue.is_empty().unwrap());
    assert!(!w.dp.attached().iter().any(|e| e.endpoint_id == old.id));
}

#[test]
fn an_add_for_a_pair_being_deleted_is_told_to_retry() {
    let w = world();
    let a = pod(&w, "c", "a");
    w.m.begin_delete_pair("c", "eth0").unwrap();
    let err = w.m.allocate(&bare_request("c")).unwrap_err();
    assert!(matches!(
        err,
        ManagerError::Endpoint(EndpointError::BeingDeleted(id)) if id == a.id
    ));
}

/// Every ready endpoint's installed policy is what a full computation gives now.
fn assert_installed_is_complete(w: &World, step: &str) {
    let st = w.m.state();
    for ep in st.reg.list().filter(|e| e.state == EndpointState::Ready) {
        let want = st
            .pol
            .compute(&from_api_labels(&ep.labels), &w.m.named_ports(ep));
        let got = w.dp.policy(ep.id).unwrap_or_default();
        assert_eq!(got, want, "{step}: endpoint {} {:?}", ep.id, ep.labels);
    }
}

fn identity_updates(w: &World, since: usize) -> Vec<FakeCall> {
    w.dp.calls()[since..]
        .iter()
        .filter(|c| matches!(c, FakeCall::ApplyPolicyIdentities(..)))
        .cloned()
        .collect()
}

#[tokio::test]
async fn identity_changes_rewrite_only_their_entries_and_match_a_full_recompute() {
    let w = world();
    let a = pod(&w, "a", "app1");
    let b = pod(&w, "b", "app2");
    let third = pod(&w, "c", "app3");
    // Selectors an arriving or leaving identity moves through, a deny, a wildcard deny that
    // carves every identity's allows, and world (which every CIDR identity joins).
    w.m.import_policy(
        "p.json",
        r#"[{"labels":[{"key":"r","value":"1"}],"endpointSelector":{"matchLabels":{"id":"app1"}},
             "ingress":[{"fromEndpoints":[{"matchExpressions":[{"key":"id","operator":"In","values":["app2","app4"]}]}],
                         "toPorts":[{"ports":[{"port":"80","endPort":100,"protocol":"TCP"}]}]}],
             "ingressDeny":[{"fromEndpoints":[{"matchLabels":{"id":"app5"}}],"toPorts":[{"ports":[{"port":"90","protocol":"TCP"}]}]}]},
            {"labels":[{"key":"r","value":"4"}],"endpointSelector":{"matchLabels":{"id":"app1"}},
             "ingressDeny":[{"fromEntities":["all"],"toPorts":[{"ports":[{"port":"99","protocol":"TCP"}]}]}]},
            {"labels":[{"key":"r","value":"2"}],"endpointSelector":{},
             "egress":[{"toEntities":["world","cluster"],"toPorts":[{"ports":[{"port":"443","protocol":"TCP"}]}]}]}]"#,
    )
    .unwrap();
    assert_installed_is_complete(&w, "import");

    let mark = w.dp.calls().len();
    let newcomer = pod(&w, "d", "app4");
    let updates = identity_updates(&w, mark);
    assert!(
        updates.contains(&FakeCall::ApplyPolicyIdentities(
            w.dp.slot_of(a.id).unwrap(),
            [newcomer.identity].into()
        )),
        "a's entries for the new identity only: {updates:?}"
    );
    assert_installed_is_complete(&w, "new identity");

    w.m.set_labels(b.id, &["id=app5".into()], &[]).unwrap();
    assert_installed_is_complete(&w, "label change into the deny");
    w.m.delete("d", "eth0").await.unwrap();
    assert_installed_is_complete(&w, "identity released");

    let mark = w.dp.calls().len();
    w.m.import_policy(
        "cidr.json",
        r#"[{"labels":[{"key":"r","value":"3"}],"endpointSelector":{"matchLabels":{"id":"app3"}},
             "egress":[{"toCIDRSet":[{"cidr":"192.0.2.0/24","except":["192.0.2.128/25"]}]}]}]"#,
    )
    .unwrap();
    assert!(
        !identity_updates(&w, mark).is_empty(),
        "the CIDR identities joined world: its users were updated per identity"
    );
    assert_installed_is_complete(&w, "CIDR identities");
    w.m.delete_policy(&["r=3".into()], false).unwrap();
    assert_installed_is_complete(&w, "CIDR identities released");

    // A rule edited in place: same enforcement for a, so only its peers' entries change.
    let mark = w.dp.calls().len();
    w.m.import_policy(
        "edit.json",
        r#"[{"labels":[{"key":"r","value":"1"}],"endpointSelector":{"matchLabels":{"id":"app1"}},
             "ingress":[{"fromEndpoints":[{"matchLabels":{"id":"app3"}}],
                         "toPorts":[{"ports":[{"port":"8080","protocol":"TCP"}]}]}]}]"#,
    )
    .unwrap();
    let calls = w.dp.calls()[mark..].to_vec();
    let a_slot = w.dp.slot_of(a.id).unwrap();
    assert!(
        calls
            .iter()
            .any(|c| matches!(c, FakeCall::ApplyPolicyIdentities(s, _) if *s == a_slot))
            && !calls.contains(&FakeCall::ApplyPolicy(a_slot)),
        "{calls:?}"
    );
    assert_installed_is_complete(&w, "rule edited");
    // A rule that puts an endpoint into ingress enforcement changes more than some identities.
    let mark = w.dp.calls().len();
    w.m.import_policy(
        "ingress.json",
        r#"[{"labels":[{"key":"r","value":"5"}],"endpointSelector":{"matchLabels":{"id":"app3"}},
             "ingress":[{"fromEndpoints":[{"matchLabels":{"id":"app1"}}]}]}]"#,
    )
    .unwrap();
    let third_slot = w.dp.slot_of(third.id).unwrap();
    assert!(w.dp.calls()[mark..].contains(&FakeCall::ApplyPolicy(third_slot)));
    assert_installed_is_complete(&w, "enforcement changed");
}

#[test]
fn a_pods_ipcache_entry_outlives_a_cidr_rule_for_its_address() {
    // Issue #13: releasing a /32 CIDR identity equal to a pod's address erased the pod's entry.
    let w = world();
    let a = pod(&w, "a", "a");
    let b = pod(&w, "b", "b");
    let b_ip = ipnet::IpNet::from(b.ips[0].address);
    let np = format!(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: x, namespace: default}}\n\
         spec:\n  podSelector: {{matchLabels: {{id: a}}}}\n  ingress:\n  - from:\n    - ipBlock: {{cidr: 10.0.1.0/24, except: [{b_ip}]}}\n"
    );
    w.m.import_policy("np.yaml", &np).unwrap();
    assert_eq!(
        w.dp.ipcache()[&b_ip],
        b.identity,
        "the endpoint wins over the /32"
    );
    w.m.delete_policy(&[], true).unwrap();
    assert_eq!(
        w.dp.ipcache()[&b_ip],
        b.identity,
        "and survives its release"
    );
    assert_eq!(
        w.dp.ipcache()[&ipnet::IpNet::from(a.ips[0].address)],
        a.identity
    );
}

#[tokio::test]
async fn remote_entries_never_hide_local_ones_and_come_back_when_the_local_one_goes() {
    let w = world();
    let a = pod(&w, "a", "a");
    let ip = ipnet::IpNet::from(a.ips[0].address);
    let other: ipnet::IpNet = "10.0.9.7/32".parse().unwrap();
    let remote = BTreeMap::from([(ip, 999), (other, 998)]);
    w.m.sync_remote_endpoints("node-b", &remote).unwrap();
    assert_eq!(w.dp.ipcache()[&ip], a.identity);
    assert_eq!(w.dp.ipcache()[&other], 998);
    w.m.delete("a", "eth0").await.unwrap();
    assert_eq!(w.dp.ipcache()[&ip], 999, "the next owner's entry");
    w.m.sync_remote_endpoints("node-b", &BTreeMap::new())
        .unwrap();
    assert!(!w.dp.ipcache().contains_key(&ip));
    assert!(!w.dp.ipcache().contains_key(&other));
}

#[test]
fn verify_finds_the_kernel_consistent_and_notices_a_lost_entry() {
    let w = world();
    let a = pod(&w, "a", "app1");
    let _b = pod(&w, "b", "app2");
    w.m.import_policy("p.json", GETTING_STARTED).unwrap();
    let r = w.m.verify().unwrap();
    assert!(r.consistent, "{:?}", r.problems);
    assert_eq!(r.endpoints, 2);
    let ip = ipnet::IpNet::from(a.ips[0].address);
    w.dp.remove_ipcache(ip).unwrap();
    let r = w.m.verify().unwrap();
    assert!(!r.consistent);
    assert!(r.problems[0].contains(&ip.to_string()), "{:?}", r.problems);
    w.m.reconcile_ipcache().unwrap();
    assert!(w.m.verify().unwrap().consistent, "reconcile repairs it");
}

#[tokio::test]
async fn del_sets_the_veth_down_frees_the_ip_and_deletes_the_veth_after_answering() {
    let w = world();
    let a = pod(&w, "a", "x");
    w.net.links.lock().unwrap().insert(a.host_ifname.clone(), 9);
    w.m.delete("a", "eth0").await.unwrap();
    assert!(
        w.net.down.lock().unwrap().contains(&a.host_ifname)
            || !w.net.links.lock().unwrap().contains_key(&a.host_ifname),
        "the veth is down (or already gone) when DEL answers"
    );
    assert_eq!(w.m.status().pools[0].used, 0, "the IP is free");
    // A new ADD of the same pair waits for the deletion: its link has the same name.
    w.m.settle_host_link("a", "eth0").await;
    assert!(!w.net.links.lock().unwrap().contains_key(&a.host_ifname));
    assert!(w.m.links_being_reaped().is_empty());
}

#[tokio::test]
async fn orphan_host_veths_are_reaped_but_not_an_endpoints_nor_weft_host() {
    let w = world();
    let a = pod(&w, "a", "x");
    let orphan = weft_api::naming::host_ifname("gone", "eth0");
    {
        let mut links = w.net.links.lock().unwrap();
        links.insert(a.host_ifname.clone(), 9);
        links.insert(orphan.clone(), 10);
        links.insert(crate::node::hostnet::HOST_DEVICE.into(), 2);
    }
    assert_eq!(w.m.reap_orphan_links().await.unwrap(), 1);
    w.m.settle_host_link("gone", "eth0").await;
    let links = w.net.links.lock().unwrap();
    assert!(!links.contains_key(&orphan));
    assert!(links.contains_key(&a.host_ifname));
    assert!(links.contains_key(crate::node::hostnet::HOST_DEVICE));
}

#[test]
fn verify_covers_cluster_network_policy_tier_entries_and_flags() {
    use weft_policy::labels::{Label, LabelSet, keys, source};
    use weft_policy::mapstate::{Tier, TierAction};
    use weft_policy::rule::{Entity, PeerRule, PeerSelector, Rule, TierRule};
    use weft_policy::selector::Selector;
    let w = world();
    let a = pod(&w, "a", "app1");
    let _b = pod(&w, "b", "app2");
    let labels: LabelSet = [Label::new(source::K8S, keys::POLICY_NAME, "cnp")]
        .into_iter()
        .collect();
    let mut r = Rule::new(Selector::all(), labels);
    r.ingress = vec![PeerRule::new(
        vec![PeerSelector::Entity(Entity::Cluster)],
        vec![],
    )];
    r.tier = Some(TierRule {
        tier: Tier::Admin,
        priority: 5,
        direction: Direction::Ingress,
        index: 0,
        action: TierAction::Deny,
        name: String::new(),
    });
    // Into the repository only: the datapath was not told.
    w.m.state().pol.add_rules(vec![r]).unwrap();
    let r = w.m.verify().unwrap();
    assert!(!r.consistent);
    assert!(
        r.problems
            .iter()
            .any(|p| p.contains("tiers") && p.contains(&format!("endpoint {}:", a.id))),
        "the endpoint entry lacks the Admin flag: {:?}",
        r.problems
    );
    assert!(
        r.problems
            .iter()
            .any(|p| p.contains("missing or different")),
        "the slot lacks the Admin entries: {:?}",
        r.problems
    );
    w.m.regenerate_all().unwrap();
    let r = w.m.verify().unwrap();
    assert!(r.consistent, "{:?}", r.problems);
    let p = w.dp.policy(a.id).unwrap();
    assert!(p.tiers.admin_ingress);
    assert!(p.entries.keys().any(|e| e.tier == Tier::Admin));
}
