//! Kubernetes ipBlocks match pods by address, whatever the block's size: `0.0.0.0/0` too, and
//! whether or not other rules name prefixes around the pod (issue 25: `0.0.0.0/0` matched pods
//! only once an unrelated rule gave their addresses a CIDR identity).

use crate::world::World;
use weft_policy::mapstate::Direction::{Egress, Ingress};
use weft_policy::mapstate::Verdict::{Allow, Deny};
use weft_policy::mapstate::proto::TCP;

fn np(name: &str, app: &str, section: &str) -> String {
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  podSelector: {{matchLabels: {{app: {app}}}}}\n{section}"
    )
}

const DB: (&str, &str) = ("ep:db", "10.0.16.3");

#[test]
fn egress_to_everything_reaches_pods() {
    let mut w = World::new();
    w.import(&np(
        "all",
        "web",
        "  policyTypes: [Egress]\n  egress: [{to: [{ipBlock: {cidr: 0.0.0.0/0}}]}]\n",
    ));
    assert_eq!(w.verdict_by_ip("web", Egress, DB, TCP, 80), Allow);
    assert_eq!(w.verdict("web", Egress, "ip:192.0.2.1", TCP, 80), Allow);
    // An unrelated rule naming the pods' /24 elsewhere changes nothing.
    w.import(&np(
        "other",
        "prom",
        "  policyTypes: [Egress]\n  egress: [{to: [{ipBlock: {cidr: 10.0.16.0/24}}]}]\n",
    ));
    assert_eq!(w.verdict_by_ip("web", Egress, DB, TCP, 80), Allow);
    // And an except still carves the pod out.
    w.import(&np(
        "all",
        "web",
        "  policyTypes: [Egress]\n  egress: [{to: [{ipBlock: {cidr: 0.0.0.0/0, except: [10.0.16.3/32]}}]}]\n",
    ));
    assert_eq!(w.verdict_by_ip("web", Egress, DB, TCP, 80), Deny);
    assert_eq!(
        w.verdict_by_ip("web", Egress, ("ep:client", "10.0.16.4"), TCP, 80),
        Allow
    );
}

#[test]
fn ingress_from_everything_admits_pods() {
    let mut w = World::new();
    w.import(&np(
        "all",
        "web",
        "  ingress: [{from: [{ipBlock: {cidr: 0.0.0.0/0}}], ports: [{port: 80}]}]\n",
    ));
    assert_eq!(w.verdict_by_ip("web", Ingress, DB, TCP, 80), Allow);
    assert_eq!(w.verdict_by_ip("web", Ingress, DB, TCP, 81), Deny);
    // Cilium's fromCIDR 0.0.0.0/0 is `world` and matches no pod (Cilium semantics).
    let mut c = World::new();
    c.import(
        r#"[{"endpointSelector":{"matchLabels":{"app":"web"}},"ingress":[{"fromCIDR":["0.0.0.0/0"]}]}]"#,
    );
    assert_eq!(c.verdict_by_ip("web", Ingress, DB, TCP, 80), Deny);
    assert_eq!(c.verdict("web", Ingress, "world", TCP, 80), Allow);
}

#[test]
fn the_default_prefix_gets_an_identity_only_as_an_ipblock() {
    let mut w = World::new();
    w.import(r#"[{"endpointSelector":{},"egress":[{"toCIDR":["0.0.0.0/0"]}]}]"#);
    assert!(w.repo.cidr_prefixes().is_empty(), "Cilium's /0 is world");
    w.import(&np(
        "all",
        "web",
        "  policyTypes: [Egress]\n  egress: [{to: [{ipBlock: {cidr: 0.0.0.0/0, except: [10.0.0.0/8]}}]}]\n",
    ));
    let prefixes: Vec<String> = w
        .repo
        .cidr_prefixes()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(prefixes, ["0.0.0.0/0", "10.0.0.0/8"]);
}

/// A `namespaceSelector` selects pods only: `NotIn` (true where the key is absent) must not match
/// `world` or a CIDR (upstream "should enforce egress policy allowing traffic to a server in a
/// different namespace based on `PodSelector` and `NamespaceSelector` `[NotIn]`").
#[test]
fn a_not_in_namespace_selector_matches_no_address_outside_the_cluster() {
    let mut w = World::new();
    w.import(&np(
        "not-prod",
        "web",
        "  policyTypes: [Egress]\n  egress: [{to: [{namespaceSelector: {matchExpressions: [{key: kubernetes.io/metadata.name, operator: NotIn, values: [prod]}]}}]}]\n",
    ));
    assert_eq!(w.verdict("web", Egress, "ep:db", TCP, 80), Allow);
    assert_eq!(w.verdict("web", Egress, "ep:prom", TCP, 80), Allow);
    assert_eq!(w.verdict("web", Egress, "ep:prod-client", TCP, 80), Deny);
    assert_eq!(w.verdict("web", Egress, "world", TCP, 80), Deny);
    assert_eq!(w.verdict("web", Egress, "ip:192.0.2.1", TCP, 80), Deny);
    assert_eq!(w.verdict("web", Egress, "host", TCP, 80), Deny);
    // DoesNotExist likewise.
    w.import(&np(
        "not-prod",
        "web",
        "  policyTypes: [Egress]\n  egress: [{to: [{namespaceSelector: {matchExpressions: [{key: team, operator: DoesNotExist}]}}]}]\n",
    ));
    assert_eq!(w.verdict("web", Egress, "ep:db", TCP, 80), Allow);
    assert_eq!(w.verdict("web", Egress, "world", TCP, 80), Deny);
}
