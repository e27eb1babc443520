//! Named ports: an ingress rule's `port: name` becomes, per endpoint, the number its own pod
//! gives that name; a pod without the name gets no entry from it. An egress rule's name becomes,
//! per destination identity, the numbers that identity's pods give it. Trace agrees.

use crate::world::World;
use weft_policy::compute::compute_with_ports;
use weft_policy::mapstate::Direction::{Egress, Ingress};
use weft_policy::mapstate::proto::{TCP, UDP};
use weft_policy::mapstate::{PolicyEntry, Verdict, reserved};
use weft_policy::rule::{IdentityPorts, NamedPorts};
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

fn theirs(list: &[(&str, u8, &[u16])]) -> IdentityPorts {
    list.iter()
        .map(|(n, p, ports)| (((*n).to_owned(), *p), ports.iter().copied().collect()))
        .collect()
}

const EGRESS_NAMED: &str = r"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: client-out, namespace: default}
spec:
  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
  egress:
  - to: [{podSelector: {matchLabels: {tier: backend}}}, {podSelector: {matchLabels: {app: web}}}]
    ports: [{port: pg}, {port: 9187}]
";

#[test]
fn egress_names_resolve_against_each_destination_identitys_pods() {
    let mut w = World::new();
    w.import(EGRESS_NAMED);
    let (db, web) = (w.eps["db"].0, w.eps["web"].0);
    // Nobody has the name yet: only the numeric port.
    assert_eq!(
        w.verdict("client", Egress, "ep:db", TCP, 5432),
        Verdict::Deny
    );
    assert_eq!(
        w.verdict("client", Egress, "ep:db", TCP, 9187),
        Verdict::Allow
    );
    let changed = w.cache.set_named_ports(db, theirs(&[("pg", TCP, &[5432])]));
    assert_eq!(changed.len(), 1, "the tier=backend selector: {changed:?}");
    assert!(
        w.cache
            .set_named_ports(db, theirs(&[("pg", TCP, &[5432])]))
            .is_empty()
    );
    assert_eq!(
        w.verdict("client", Egress, "ep:db", TCP, 5432),
        Verdict::Allow
    );
    assert_eq!(
        w.verdict("client", Egress, "ep:db", TCP, 5433),
        Verdict::Deny
    );
    // web names no pg port: nothing by name towards it.
    w.cache
        .set_named_ports(web, theirs(&[("http", TCP, &[80])]));
    assert_eq!(
        w.verdict("client", Egress, "ep:web", TCP, 80),
        Verdict::Deny
    );
    assert_eq!(
        w.verdict("client", Egress, "ep:web", TCP, 5432),
        Verdict::Deny
    );
    // A second replica of db calls 5433 "pg": the identity gets both numbers.
    w.cache
        .set_named_ports(db, theirs(&[("pg", TCP, &[5432, 5433])]));
    let p = w.policy("client");
    for port in [5432, 5433] {
        assert_eq!(
            p.entries
                .get(&PolicyEntry::new(Egress, db, TCP, port, port)),
            Some(&Verdict::Allow)
        );
    }
    // UDP "pg" is another name.
    assert_eq!(
        w.verdict("client", Egress, "ep:db", UDP, 5432),
        Verdict::Deny
    );
    // The pods leave: the entries go.
    w.cache.set_named_ports(db, IdentityPorts::new());
    assert_eq!(
        w.verdict("client", Egress, "ep:db", TCP, 5432),
        Verdict::Deny
    );
}

#[test]
fn an_egress_name_to_every_destination_means_every_pod_with_the_name() {
    let mut w = World::new();
    w.import(
        r"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: any-http, namespace: default}
spec:
  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
  egress: [{ports: [{port: http}]}]
",
    );
    let (db, web) = (w.eps["db"].0, w.eps["web"].0);
    w.cache
        .set_named_ports(web, theirs(&[("http", TCP, &[8080])]));
    w.cache.set_named_ports(db, theirs(&[("http", TCP, &[80])]));
    assert_eq!(
        w.verdict("client", Egress, "ep:web", TCP, 8080),
        Verdict::Allow
    );
    assert_eq!(
        w.verdict("client", Egress, "ep:web", TCP, 80),
        Verdict::Deny
    );
    assert_eq!(
        w.verdict("client", Egress, "ep:db", TCP, 80),
        Verdict::Allow
    );
    // Outside the cluster there are no container ports, hence no names.
    assert_eq!(w.verdict("client", Egress, "world", TCP, 80), Verdict::Deny);
    assert_eq!(
        w.verdict("client", Egress, "ip:192.0.2.1", TCP, 8080),
        Verdict::Deny
    );
    // No identity-0 entry: the name is never "any port".
    assert!(
        w.policy("client")
            .entries
            .keys()
            .all(|e| e.identity != reserved::ANY)
    );
}

#[test]
fn egress_names_in_a_cilium_rule_and_with_a_cidr_peer() {
    let mut w = World::new();
    let parsed = weft_policy::parse::parse_noted(
        "f",
        r#"[{"endpointSelector":{"matchLabels":{"app":"client"}},
             "egress":[{"toEndpoints":[{"matchLabels":{"app":"web"}}],
                        "toPorts":[{"ports":[{"port":"http","protocol":"TCP"}]}]},
                       {"toCIDR":["192.0.2.0/24"],
                        "toPorts":[{"ports":[{"port":"http","protocol":"TCP"}]}]}]}]"#,
    )
    .unwrap();
    assert!(
        parsed.notes[0]
            .to_string()
            .contains("CIDR destinations have none, so it allows nothing there"),
        "{:?}",
        parsed.notes
    );
    w.repo.add(parsed.rules);
    w.sync_cidrs();
    w.cache.sync(&w.repo);
    let web = w.eps["web"].0;
    w.cache
        .set_named_ports(web, theirs(&[("http", TCP, &[8080])]));
    assert_eq!(
        w.verdict("client", Egress, "ep:web", TCP, 8080),
        Verdict::Allow
    );
    assert_eq!(
        w.verdict("client", Egress, "ip:192.0.2.1", TCP, 8080),
        Verdict::Deny
    );
}
