//! Named ports: an ingress rule's `port: name` becomes, per endpoint, the number its own pod
//! gives that name; a pod without the name gets no entry from it; trace agrees.

use crate::world::World;
use weft_policy::compute::compute_with_ports;
use weft_policy::mapstate::Direction::Ingress;
use weft_policy::mapstate::proto::{TCP, UDP};
use weft_policy::mapstate::{PolicyEntry, Verdict, reserved};
use weft_policy::rule::NamedPorts;
use weft_policy::trace::{TracePeer, trace};

const NAMED: &str = r"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-http, namespace: default}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: client}}}]
    ports: [{port: http}, {port: dns, protocol: UDP}]
";

fn ports(list: &[(&str, u8, u16)]) -> NamedPorts {
    list.iter()
        .map(|(n, p, port)| (((*n).to_owned(), *p), *port))
        .collect()
}

#[test]
fn named_ports_resolve_against_the_selected_pods_own_ports() {
    let mut w = World::new();
    w.import(NAMED);
    let web = &w.eps["web"].1;
    let client = w.eps["client"].0;
    let mine = ports(&[("http", TCP, 8080), ("dns", UDP, 5353), ("dns", TCP, 53)]);
    let p = compute_with_ports(web, &mine, &w.repo, &w.cache, &w.opts);
    let got: Vec<PolicyEntry> = p
        .entries
        .iter()
        .filter(|(e, v)| e.identity == client && **v == Verdict::Allow)
        .map(|(e, _)| *e)
        .collect();
    assert_eq!(
        got,
        [
            PolicyEntry::new(Ingress, client, TCP, 8080, 8080),
            PolicyEntry::new(Ingress, client, UDP, 5353, 5353),
        ]
    );
    // Another replica whose container calls port 9090 "http".
    let other = compute_with_ports(
        web,
        &ports(&[("http", TCP, 9090)]),
        &w.repo,
        &w.cache,
        &w.opts,
    );
    assert!(
        other
            .entries
            .contains_key(&PolicyEntry::new(Ingress, client, TCP, 9090, 9090))
    );
    // A pod without the names: enforced, nothing allowed from the client.
    let none = compute_with_ports(web, &NamedPorts::new(), &w.repo, &w.cache, &w.opts);
    assert!(none.ingress_enforced);
    assert!(none.entries.keys().all(|e| e.identity == reserved::HOST));

    let flow = |port, named: &NamedPorts| {
        trace(
            &w.repo,
            &w.cache,
            TracePeer {
                identity: client,
                labels: None,
                named_ports: None,
                cidr_identity: 0,
            },
            TracePeer {
                identity: w.eps["web"].0,
                labels: Some(web),
                named_ports: Some(named),
                cidr_identity: 0,
            },
            TCP,
            port,
            &w.opts,
        )
        .verdict
    };
    assert_eq!(flow(8080, &mine), Verdict::Allow);
    assert_eq!(flow(9090, &mine), Verdict::Deny);
    assert_eq!(flow(8080, &NamedPorts::new()), Verdict::Deny);
}

#[test]
fn a_named_port_in_an_egress_rule_is_refused() {
    let text = NAMED
        .replace("ingress:", "policyTypes: [Egress]\n  egress:")
        .replace("from:", "to:");
    let e = weft_policy::parse::parse_policy_file("np.yaml", &text)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("not supported yet: named port \"http\" in an egress rule"),
        "{e}"
    );
}
