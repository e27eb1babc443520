//! The golden corpus of `weft_policy::compiler`: a fixed set of policies (the rule shapes the
//! engine computes: L3 and L4 peers, port ranges, named ports of the endpoint and of its peers,
//! entities, CIDRs with exceptions, ipBlock, denies over allows, default deny, both directions,
//! SCTP and any protocol, `ClusterNetworkPolicy` tiers) over a fixed set of endpoints, computed with each
//! `ComputeOptions` value, and digested. The digest names identities by what they stand for
//! (label set, prefix), not by number: allocation order is not the computation.
//!
//! When `a_change_of_the_computation_comes_with_a_new_compiler_version` fails, the computation
//! changed: append the line it prints to `POLICY_COMPILER_GOLDENS` and bump
//! `POLICY_COMPILER_VERSION` (policy/src/compiler.rs), so that a restarted manager recomputes
//! the slots an older build wrote. The corpus lives only here: changing it changes the
//! goldens' meaning (record why in the commit, and append a line as for a change of the
//! computation).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    reason = "an integration test crate: its helpers panic with context like its tests (clippy.toml's allow-*-in-tests covers only #[test] functions)"
)]

use std::collections::BTreeMap;
use weft_policy::cidr::CidrReferences;
use weft_policy::compiler::{POLICY_COMPILER_GOLDENS, POLICY_COMPILER_VERSION};
use weft_policy::compute::{ComputeOptions, compute_with_ports};
use weft_policy::identity::{IdentityAllocator, IdentityKey, MemoryStore};
use weft_policy::labels::LabelSet;
use weft_policy::mapstate::{Direction, Identity, Verdict, reserved};
use weft_policy::parse::parse_policy_file;
use weft_policy::peerports::PeerPorts;
use weft_policy::repository::Repository;
use weft_policy::rule::NamedPorts;
use weft_policy::selectorcache::SelectorCache;

/// Cilium rule lists and Kubernetes objects, one file each.
const CORPUS: &[(&str, &str)] = &[
    (
        "l3-l4.json",
        r#"[{"labels":[{"key":"name","value":"db-from-web"}],
             "endpointSelector":{"matchLabels":{"app":"db"}},
             "ingress":[{"fromEndpoints":[{"matchLabels":{"app":"web"}}],
                         "toPorts":[{"ports":[{"port":"5432","protocol":"TCP"},{"port":"7000","endPort":7100,"protocol":"TCP"}]}]},
                        {"fromEndpoints":[{"matchLabels":{"k8s:io.kubernetes.pod.namespace":"monitoring"}}],
                         "toPorts":[{"ports":[{"port":"9187","protocol":"ANY"}]}]}],
             "egress":[{"toEndpoints":[{"matchExpressions":[{"key":"app","operator":"In","values":["web","client"]}]}]}]},
            {"labels":[{"key":"name","value":"client-to-web-named"}],
             "endpointSelector":{"matchLabels":{"app":"client","k8s:io.kubernetes.pod.namespace":"default"}},
             "egress":[{"toEndpoints":[{"matchLabels":{"app":"web"}}],
                        "toPorts":[{"ports":[{"port":"http","protocol":"TCP"},{"port":"dns","protocol":"UDP"}]}]}]}]"#,
    ),
    (
        "cidr-entities.json",
        r#"[{"labels":[{"key":"name","value":"web-egress"}],
             "endpointSelector":{"matchLabels":{"app":"web"}},
             "egress":[{"toCIDRSet":[{"cidr":"10.0.0.0/8","except":["10.96.0.0/12"]}]},
                       {"toPorts":[{"ports":[{"port":"53","protocol":"ANY"}]}]},
                       {"toEntities":["host","cluster"]}]},
            {"labels":[{"key":"name","value":"web-ingress"}],
             "endpointSelector":{"matchLabels":{"app":"web"}},
             "ingress":[{"fromEntities":["world"],"toPorts":[{"ports":[{"port":"443","protocol":"TCP"}]}]},
                        {"fromCIDR":["192.168.0.0/16","172.16.1.1"],
                         "toPorts":[{"ports":[{"port":"8000","endPort":8080,"protocol":"TCP"}]}]},
                        {"fromEndpoints":[{"matchLabels":{"app":"client"}}],
                         "toPorts":[{"ports":[{"port":"http","protocol":"TCP"},{"port":"9000","protocol":"SCTP"}]}]}]}]"#,
    ),
    (
        "deny.json",
        r#"[{"labels":[{"key":"name","value":"web-deny"}],
             "endpointSelector":{"matchLabels":{"app":"web"}},
             "ingress":[{"fromEndpoints":[{}]}],
             "ingressDeny":[{"fromEndpoints":[{"matchLabels":{"app":"prom"}}],
                             "toPorts":[{"ports":[{"port":"9000","endPort":9100,"protocol":"TCP"}]}]}]},
            {"labels":[{"key":"name","value":"client-deny"}],
             "endpointSelector":{"matchLabels":{"app":"client"}},
             "egress":[{"toEntities":["all"]}],
             "egressDeny":[{"toCIDR":["10.96.0.0/12"]},
                           {"toEndpoints":[{"matchLabels":{"tier":"backend"}}],
                            "toPorts":[{"ports":[{"port":"1","endPort":1023,"protocol":"UDP"}]}]}]}]"#,
    ),
    (
        "np-named.yaml",
        r"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-named, namespace: default}
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Ingress, Egress]
  ingress:
  - from:
    - namespaceSelector: {matchExpressions: [{key: team, operator: In, values: [payments]}]}
    - podSelector: {matchLabels: {app: client}}
    ports: [{port: http}, {port: dns, protocol: UDP}, {port: 8443, endPort: 8447}]
  egress:
  - to:
    - ipBlock: {cidr: 192.0.2.0/24, except: [192.0.2.128/25]}
    ports: [{port: 443, protocol: TCP}, {port: 53, protocol: UDP}]
",
    ),
    (
        "np-default-deny.yaml",
        r"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: default-deny, namespace: prod}
spec:
  podSelector: {}
  policyTypes: [Ingress, Egress]
",
    ),
    (
        "np-ipblock-pods.yaml",
        r"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: ipblock, namespace: monitoring}
spec:
  podSelector: {}
  ingress:
  - from:
    - ipBlock: {cidr: 10.0.0.0/16, except: [10.0.1.0/24]}
    ports: [{port: 9090, protocol: TCP}]
",
    ),
    (
        "cnp-tiers.yaml",
        r#"
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: admin-web}
spec:
  tier: Admin
  priority: 10
  subject:
    pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: web}}}
  ingress:
  - name: pass-client
    action: Pass
    from: [{pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: client}}}}]
    protocols: [{tcp: {destinationPort: {range: {start: 8000, end: 8100}}}}]
  - name: deny-payments
    action: Deny
    from: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: payments}}}]
  - name: accept-all-http
    action: Accept
    from: [{namespaces: {}}]
    protocols: [{tcp: {destinationPort: {number: 8080}}}, {destinationNamedPort: dns}]
  egress:
  - name: deny-net
    action: Deny
    to: [{networks: ["10.0.0.0/16", "0.0.0.0/0"]}]
    protocols: [{udp: {destinationPort: {number: 53}}}, {sctp: {destinationPort: {number: 9000}}}]
---
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: baseline-default}
spec:
  tier: Baseline
  priority: 5
  subject:
    namespaces: {}
  ingress:
  - name: accept-monitoring
    action: Accept
    from: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: monitoring}}}]
  - name: deny-rest
    action: Deny
    from: [{namespaces: {}}]
"#,
    ),
];

/// (name, namespace, labels, named ports).
type EndpointSpec = (
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
    &'static [(&'static str, u8, u16)],
);

const ENDPOINTS: &[EndpointSpec] = &[
    (
        "web",
        "default",
        &[("app", "web")],
        &[("http", 6, 8080), ("dns", 17, 5353)],
    ),
    (
        "web-other-ports",
        "default",
        &[("app", "web")],
        &[("http", 6, 9090)],
    ),
    ("db", "default", &[("app", "db"), ("tier", "backend")], &[]),
    ("client", "default", &[("app", "client")], &[]),
    ("prod-client", "prod", &[("app", "client")], &[]),
    ("prom", "monitoring", &[("app", "prom")], &[]),
    ("billing", "payments", &[("app", "billing")], &[]),
    ("unselected", "kube-system", &[("app", "dns")], &[]),
];

/// FNV-1a, written out here so the digest does not depend on code under test.
struct Fnv(u64);

impl Fnv {
    fn feed(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
        // Field separator: ("ab","c") and ("a","bc") differ.
        self.0 ^= 0xff;
        self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
    }
}

/// The computed corpus, as text: one line per endpoint and options, one per entry.
fn computed_corpus() -> Vec<String> {
    let mut repo = Repository::new();
    for (name, text) in CORPUS {
        let rules = parse_policy_file(name, text).unwrap_or_else(|e| panic!("{name}: {e}"));
        repo.add(rules);
    }
    let (mut alloc, mut store) = (IdentityAllocator::new(), MemoryStore::default());
    let mut endpoints = Vec::new();
    let mut peer_ports = PeerPorts::new();
    for (name, ns, labels, ports) in ENDPOINTS {
        let labels = LabelSet::for_pod(ns, labels.iter().copied());
        let id = alloc
            .acquire(&mut store, &IdentityKey::Labels(labels.clone()))
            .unwrap()
            .id;
        let named: NamedPorts = ports
            .iter()
            .map(|(n, p, port)| (((*n).to_owned(), *p), *port))
            .collect();
        peer_ports.set(*name, id, named.clone());
        endpoints.push((*name, labels, named));
    }
    let mut cache = SelectorCache::build(&alloc, &repo);
    CidrReferences::new()
        .sync(&repo.cidr_prefixes(), &mut alloc, &mut store, &mut cache)
        .unwrap();
    cache.sync(&repo);
    for (id, ports) in peer_ports.unions() {
        cache.set_named_ports(id, ports);
    }
    let names: BTreeMap<Identity, String> = alloc
        .iter()
        .map(|(id, key)| {
            let name = match key {
                IdentityKey::Labels(l) => format!("labels:{l}"),
                IdentityKey::Cidr(p) => format!("cidr:{p}"),
            };
            (id, name)
        })
        .collect();
    let name_of = |id: Identity| -> String {
        let base = id & !reserved::BY_IP;
        let by_ip = id & reserved::BY_IP != 0 && base >= reserved::FIRST_CIDR;
        match names.get(&base) {
            Some(n) if by_ip => format!("by-ip:{n}"),
            Some(n) if base == id => n.clone(),
            _ => format!("reserved:{id}"),
        }
    };
    let mut lines = Vec::new();
    for allow_from_host in [true, false] {
        let opts = ComputeOptions { allow_from_host };
        for (name, labels, named) in &endpoints {
            let p = compute_with_ports(labels, named, &repo, &cache, &opts);
            let tiers = if p.tiers.is_empty() {
                String::new()
            } else {
                format!(" tiers={:?}", p.tiers)
            };
            lines.push(format!(
                "{name} allow_from_host={allow_from_host} ingress_enforced={} egress_enforced={}{tiers}",
                p.ingress_enforced, p.egress_enforced
            ));
            for (e, v) in &p.entries {
                let dir = match e.direction {
                    Direction::Ingress => "in",
                    Direction::Egress => "out",
                };
                let verdict = match v {
                    Verdict::Allow => "allow".to_owned(),
                    Verdict::Deny => "deny".to_owned(),
                    Verdict::Tier(t) => format!(
                        "{} {} priority={} rule={}",
                        e.tier, t.action, t.priority, t.rule
                    ),
                };
                lines.push(format!(
                    "  {dir} {} proto={} ports={}-{} {verdict}",
                    name_of(e.identity),
                    e.proto,
                    e.port_lo,
                    e.port_hi
                ));
            }
        }
    }
    lines
}

/// The corpus reaches what it claims to: a change that made it compute nothing (a parse
/// change, a selector that no longer matches) would leave the digest meaningless.
#[test]
fn the_corpus_exercises_every_shape_it_claims() {
    let text = computed_corpus().join("\n");
    for needle in [
        " deny",
        "by-ip:cidr:10.0.0.0/16",
        "cidr:10.96.0.0/12",
        "reserved:2 proto=6 ports=443-443",
        "reserved:1 proto=0 ports=0-65535 allow",
        "proto=132",
        "proto=0 ports=0-65535",
        "ports=8080-8080",
        "ports=9090-9090",
        "ports=7000-7100",
        // The peer's named ports: client's egress to web's "dns".
        "out labels:k8s:app=web,k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name=default,\
         k8s:io.kubernetes.pod.namespace=default proto=17 ports=5353-5353 allow",
        "prod-client allow_from_host=true ingress_enforced=true egress_enforced=true",
        "unselected allow_from_host=false ingress_enforced=false egress_enforced=false tiers=",
        // ClusterNetworkPolicy tiers: each action, both tiers, networks by address.
        "Admin Pass priority=10 rule=0",
        "Admin Deny priority=10 rule=1",
        "Admin Accept priority=10 rule=2",
        "Baseline Accept priority=5 rule=0",
        "Baseline Deny priority=5 rule=1",
        "by-ip:cidr:10.0.0.0/16 proto=17 ports=53-53 Admin Deny",
    ] {
        assert!(
            text.contains(needle),
            "the corpus no longer computes {needle:?}:\n{text}"
        );
    }
}

#[test]
fn a_change_of_the_computation_comes_with_a_new_compiler_version() {
    let mut h = Fnv(0xcbf2_9ce4_8422_2325);
    for line in computed_corpus() {
        h.feed(line.as_bytes());
    }
    let got = h.0;
    let (last_version, last_golden) = *POLICY_COMPILER_GOLDENS.last().unwrap();
    assert_eq!(
        last_version, POLICY_COMPILER_VERSION,
        "POLICY_COMPILER_GOLDENS must end with the line of POLICY_COMPILER_VERSION"
    );
    for pair in POLICY_COMPILER_GOLDENS.windows(2) {
        assert!(
            pair[0].0 < pair[1].0 && pair[0].1 != pair[1].1,
            "POLICY_COMPILER_GOLDENS: versions increase and each digest is new"
        );
    }
    assert!(
        got == last_golden,
        "the policy computation changed: the golden corpus digests to {got:#018x}, version \
         {POLICY_COMPILER_VERSION} computed {last_golden:#018x}. Bump POLICY_COMPILER_VERSION \
         to {next} and append `({next}, {got:#018x}),` to POLICY_COMPILER_GOLDENS in \
         policy/src/compiler.rs, so a restart recomputes what older builds wrote",
        next = POLICY_COMPILER_VERSION + 1,
    );
}
