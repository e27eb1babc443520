//! `ClusterNetworkPolicy` tiers: the computed map (the datapath's reference lookup, by identity
//! and by the peer's address) and `policy trace` give the same verdict and name the same rule.
//! Rules are built directly in the model the parser produces (one `Rule` per tier rule), so
//! these tests judge the computation and the trace, not the parser.

use crate::world::World;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use std::collections::BTreeMap;
use weft_policy::labels::{Label, LabelSet, keys, source};
use weft_policy::mapstate::{
    Direction, EndpointPolicy, PolicyEntry, Tier, TierAction, TierVerdict, Verdict, proto, reserved,
};
use weft_policy::rule::{CidrSelector, PeerRule, PeerSelector, PortProto, Rule, TierRule};
use weft_policy::selector::{Operator, Requirement, Selector};
use weft_policy::trace::Decision;

/// Pod addresses of the world's endpoints (networks peers match them by IP).
const ADDRS: &[(&str, &str)] = &[
    ("web", "10.1.2.1"),
    ("db", "10.1.2.2"),
    ("client", "10.1.2.3"),
    ("prod-client", "10.1.3.1"),
    ("prom", "10.1.4.1"),
];

/// The address of an endpoint of [`ADDRS`]; `None` for one without (no by-address match).
fn addr_of(ep: &str) -> Option<&'static str> {
    ADDRS.iter().find(|(n, _)| *n == ep).map(|(_, a)| *a)
}

fn app(a: &str) -> Selector {
    let mut s = Selector::all();
    s.add_match("k8s:app", a);
    s
}

fn namespace(ns: &str) -> Selector {
    let mut s = Selector::all();
    s.add_match(&format!("k8s:{}", keys::POD_NAMESPACE), ns);
    s
}

/// Every pod (`namespaces: {}`).
fn any_pod() -> Selector {
    Selector::from_requirements([Requirement::new(
        &format!("k8s:{}", keys::POD_NAMESPACE),
        Operator::Exists,
    )])
}

fn network(cidr: &str) -> PeerSelector {
    PeerSelector::Cidr(CidrSelector {
        cidr: cidr.parse().unwrap(),
        except: Vec::new(),
        match_pods: true,
    })
}

fn tcp(lo: u16, hi: u16) -> PortProto {
    PortProto {
        proto: proto::TCP,
        lo,
        hi,
    }
}

struct Spec<'a> {
    name: &'a str,
    tier: Tier,
    priority: u16,
    subject: Selector,
}

/// One rule of the object `spec`, at `index` of its direction's list.
fn tier_rule(
    spec: &Spec<'_>,
    (dir, index): (Direction, u8),
    action: TierAction,
    peers: Vec<PeerSelector>,
    ports: Vec<PortProto>,
) -> Rule {
    let mut labels = LabelSet::new();
    labels.insert(Label::new(
        source::K8S,
        keys::POLICY_DERIVED_FROM,
        "ClusterNetworkPolicy",
    ));
    labels.insert(Label::new(source::K8S, keys::POLICY_NAME, spec.name));
    let mut r = Rule::new(spec.subject.clone(), labels);
    let pr = PeerRule::new(peers, ports);
    match dir {
        Direction::Ingress => r.ingress.push(pr),
        Direction::Egress => r.egress.push(pr),
    }
    r.tier = Some(TierRule {
        tier: spec.tier,
        priority: spec.priority,
        direction: dir,
        index,
        action,
        name: format!("r{index}"),
    });
    r
}

fn tiered_world() -> World {
    World::new()
}

fn add(w: &mut World, rules: Vec<Rule>) {
    w.repo.add(rules);
    w.sync_cidrs();
    w.cache.sync(&w.repo);
}

/// The verdict `ep` gives the flow with the endpoint `peer` in `dir`: the computed map's
/// (identity and address) and trace's, which must agree; with trace's decision.
fn judge(w: &World, ep: &str, dir: Direction, peer: &str, flow: (u8, u16)) -> (Verdict, Decision) {
    let pol = w.policy(ep);
    lpm_contract(&pol);
    let cidr = match addr_of(peer).map(|a| w.ip(a)) {
        None | Some(reserved::WORLD) => 0,
        Some(id) => id,
    };
    let (v, side) = w.judged(&pol, ep, dir, (&format!("ep:{peer}"), cidr), flow);
    (v, side.decision)
}

/// The tier entries' contract with the datapath's longest-prefix match: within one (tier,
/// direction, identity, protocol) the port ranges are disjoint, and a protocol's range comes
/// before the identity's any-protocol entry, so the narrowest match is the first in precedence.
fn lpm_contract(pol: &EndpointPolicy) {
    let mut groups: BTreeMap<_, Vec<(&PolicyEntry, TierVerdict)>> = BTreeMap::new();
    for (e, v) in &pol.entries {
        if let Verdict::Tier(t) = v {
            assert!(
                !e.tier.is_policy(),
                "tier verdict in the policy layer: {e:?}"
            );
            groups
                .entry((e.tier, e.direction, e.identity))
                .or_default()
                .push((e, *t));
        } else {
            assert!(e.tier.is_policy(), "allow/deny in a tier: {e:?}");
        }
    }
    for (key, entries) in groups {
        let any: Vec<_> = entries.iter().filter(|(e, _)| e.proto == 0).collect();
        assert!(
            any.len() <= 1,
            "two any-protocol entries for {key:?}: {any:?}"
        );
        for (i, (a, va)) in entries.iter().enumerate() {
            if a.proto == 0 {
                continue;
            }
            if let Some((_, vany)) = any.first() {
                assert!(
                    va.precedes(vany),
                    "{a:?} does not come before the any entry {vany:?}"
                );
            }
            for (b, _) in entries.iter().skip(i + 1) {
                let overlap =
                    a.proto == b.proto && a.port_lo <= b.port_hi && b.port_lo <= a.port_hi;
                assert!(!overlap, "overlapping tier entries {a:?} and {b:?}");
            }
        }
    }
}

fn tier_of(d: &Decision) -> Option<(Tier, u16, u8, TierAction)> {
    match d {
        Decision::Tier(t) => Some((t.tier, t.priority, t.index, t.action)),
        _ => None,
    }
}

const TCP80: (u8, u16) = (proto::TCP, 80);

#[test]
fn admin_deny_beats_a_networkpolicy_allow_and_trace_names_the_rule() {
    let mut w = tiered_world();
    w.import(
        r#"[{"endpointSelector":{"matchLabels":{"app":"web"}},
            "ingress":[{"fromEndpoints":[{"matchLabels":{"app":"client"}}]}]}]"#,
    );
    assert_eq!(
        judge(&w, "web", Direction::Ingress, "client", TCP80).0,
        Verdict::Allow
    );
    let spec = Spec {
        name: "no-client",
        tier: Tier::Admin,
        priority: 10,
        subject: app("web"),
    };
    add(
        &mut w,
        vec![tier_rule(
            &spec,
            (Direction::Ingress, 0),
            TierAction::Deny,
            vec![PeerSelector::Endpoints(app("client"))],
            vec![],
        )],
    );
    let (v, d) = judge(&w, "web", Direction::Ingress, "client", TCP80);
    assert_eq!(v, Verdict::Deny);
    assert_eq!(tier_of(&d), Some((Tier::Admin, 10, 0, TierAction::Deny)));
    assert!(d.to_string().contains("no-client"), "{d}");
    // Another peer still gets the NetworkPolicy's default deny, not the tier's.
    let (v, d) = judge(&w, "web", Direction::Ingress, "db", TCP80);
    assert_eq!((v, d), (Verdict::Deny, Decision::DefaultDeny));
}

#[test]
fn pass_hands_the_flow_to_networkpolicy_then_baseline() {
    let mut w = tiered_world();
    let admin = Spec {
        name: "pass-client",
        tier: Tier::Admin,
        priority: 5,
        subject: any_pod(),
    };
    let admin_deny = Spec {
        name: "deny-all",
        tier: Tier::Admin,
        priority: 20,
        subject: any_pod(),
    };
    let baseline = Spec {
        name: "baseline-deny",
        tier: Tier::Baseline,
        priority: 1,
        subject: any_pod(),
    };
    add(
        &mut w,
        vec![
            tier_rule(
                &admin,
                (Direction::Ingress, 0),
                TierAction::Pass,
                vec![PeerSelector::Endpoints(app("client"))],
                vec![],
            ),
            tier_rule(
                &admin_deny,
                (Direction::Ingress, 0),
                TierAction::Deny,
                vec![PeerSelector::Endpoints(any_pod())],
                vec![tcp(80, 80)],
            ),
            tier_rule(
                &baseline,
                (Direction::Ingress, 0),
                TierAction::Deny,
                vec![PeerSelector::Endpoints(any_pod())],
                vec![],
            ),
        ],
    );
    // client → web: passed (priority 5 before the deny at 20), no NetworkPolicy, baseline deny.
    let (v, d) = judge(&w, "web", Direction::Ingress, "client", TCP80);
    assert_eq!(v, Verdict::Deny);
    assert_eq!(tier_of(&d), Some((Tier::Baseline, 1, 0, TierAction::Deny)));
    // db → web on 80: the admin deny at 20.
    let (v, d) = judge(&w, "web", Direction::Ingress, "db", TCP80);
    assert_eq!(v, Verdict::Deny);
    assert_eq!(tier_of(&d), Some((Tier::Admin, 20, 0, TierAction::Deny)));
    // A NetworkPolicy selecting web now decides what was passed: client allowed.
    w.import(
        r#"[{"endpointSelector":{"matchLabels":{"app":"web"}},
            "ingress":[{"fromEndpoints":[{"matchLabels":{"app":"client"}}]}]}]"#,
    );
    let (v, d) = judge(&w, "web", Direction::Ingress, "client", TCP80);
    assert_eq!(v, Verdict::Allow);
    assert!(matches!(d, Decision::AllowedBy(_)), "{d:?}");
    // ... and its default deny is final: baseline is not consulted for web's other peers.
    let (v, d) = judge(&w, "web", Direction::Ingress, "prom", (proto::UDP, 53));
    assert_eq!((v, d), (Verdict::Deny, Decision::DefaultDeny));
}

#[test]
fn lower_priority_value_and_earlier_rule_come_first() {
    let mut w = tiered_world();
    let p40 = Spec {
        name: "p40",
        tier: Tier::Admin,
        priority: 40,
        subject: app("db"),
    };
    let p50 = Spec {
        name: "p50",
        tier: Tier::Admin,
        priority: 50,
        subject: app("db"),
    };
    let client = || vec![PeerSelector::Endpoints(app("client"))];
    add(
        &mut w,
        vec![
            tier_rule(
                &p50,
                (Direction::Ingress, 0),
                TierAction::Deny,
                client(),
                vec![],
            ),
            tier_rule(
                &p40,
                (Direction::Ingress, 0),
                TierAction::Accept,
                client(),
                vec![tcp(80, 80)],
            ),
            tier_rule(
                &p40,
                (Direction::Ingress, 1),
                TierAction::Deny,
                client(),
                vec![tcp(0, 65535)],
            ),
        ],
    );
    let (v, d) = judge(&w, "db", Direction::Ingress, "client", TCP80);
    assert_eq!(v, Verdict::Allow);
    assert_eq!(tier_of(&d), Some((Tier::Admin, 40, 0, TierAction::Accept)));
    let (v, d) = judge(&w, "db", Direction::Ingress, "client", (proto::TCP, 81));
    assert_eq!(v, Verdict::Deny);
    assert_eq!(tier_of(&d), Some((Tier::Admin, 40, 1, TierAction::Deny)));
    let (v, d) = judge(&w, "db", Direction::Ingress, "client", (proto::UDP, 80));
    assert_eq!(v, Verdict::Deny);
    assert_eq!(tier_of(&d), Some((Tier::Admin, 50, 0, TierAction::Deny)));
    // A priority change of one object: only its rules move.
    let p60 = Spec {
        priority: 60,
        ..p40
    };
    w.repo.add(vec![
        tier_rule(
            &p60,
            (Direction::Ingress, 0),
            TierAction::Accept,
            client(),
            vec![tcp(80, 80)],
        ),
        tier_rule(
            &p60,
            (Direction::Ingress, 1),
            TierAction::Deny,
            client(),
            vec![tcp(0, 65535)],
        ),
    ]);
    w.cache.sync(&w.repo);
    let (v, d) = judge(&w, "db", Direction::Ingress, "client", TCP80);
    assert_eq!(v, Verdict::Deny);
    assert_eq!(tier_of(&d), Some((Tier::Admin, 50, 0, TierAction::Deny)));
}

#[test]
fn networks_match_pods_by_address_after_an_earlier_accept() {
    let mut w = tiered_world();
    let spec = Spec {
        name: "egress",
        tier: Tier::Admin,
        priority: 85,
        subject: app("client"),
    };
    add(
        &mut w,
        vec![
            tier_rule(
                &spec,
                (Direction::Egress, 0),
                TierAction::Accept,
                vec![PeerSelector::Endpoints(namespace("prod"))],
                vec![],
            ),
            tier_rule(
                &spec,
                (Direction::Egress, 1),
                TierAction::Deny,
                vec![network("0.0.0.0/0")],
                vec![],
            ),
        ],
    );
    let (v, d) = judge(&w, "client", Direction::Egress, "prod-client", TCP80);
    assert_eq!(v, Verdict::Allow);
    assert_eq!(tier_of(&d), Some((Tier::Admin, 85, 0, TierAction::Accept)));
    let (v, d) = judge(&w, "client", Direction::Egress, "web", TCP80);
    assert_eq!(v, Verdict::Deny);
    assert_eq!(tier_of(&d), Some((Tier::Admin, 85, 1, TierAction::Deny)));
    // Then allow two pods by address, before the deny.
    let rules = vec![
        tier_rule(
            &spec,
            (Direction::Egress, 0),
            TierAction::Accept,
            vec![network("10.1.2.2/32"), network("10.1.4.1/32")],
            vec![],
        ),
        tier_rule(
            &spec,
            (Direction::Egress, 1),
            TierAction::Accept,
            vec![PeerSelector::Endpoints(namespace("prod"))],
            vec![],
        ),
        tier_rule(
            &spec,
            (Direction::Egress, 2),
            TierAction::Deny,
            vec![network("0.0.0.0/0")],
            vec![],
        ),
    ];
    add(&mut w, rules);
    assert_eq!(
        judge(&w, "client", Direction::Egress, "db", TCP80).0,
        Verdict::Allow
    );
    assert_eq!(
        judge(&w, "client", Direction::Egress, "prom", TCP80).0,
        Verdict::Allow
    );
    assert_eq!(
        judge(&w, "client", Direction::Egress, "web", TCP80).0,
        Verdict::Deny
    );
}

/// A random tier rule: tier, priority, index, direction, action, subject, peers, ports.
fn arb_rule() -> impl Strategy<Value = Rule> {
    let selector = prop_oneof![
        Just(app("web")),
        Just(app("db")),
        Just(app("client")),
        Just(namespace("prod")),
        Just(any_pod()),
    ];
    let peer = prop_oneof![
        4 => selector.clone().prop_map(PeerSelector::Endpoints),
        1 => Just(network("0.0.0.0/0")),
        1 => Just(network("10.1.2.0/24")),
        1 => Just(network("10.1.2.2/32")),
    ];
    let port = prop_oneof![
        Just(tcp(80, 80)),
        Just(tcp(0, 1023)),
        Just(tcp(80, 90)),
        Just(PortProto {
            proto: proto::UDP,
            lo: 53,
            hi: 53
        }),
    ];
    (
        prop_oneof![Just(Tier::Admin), Just(Tier::Baseline)],
        0u16..4,
        0u8..3,
        prop_oneof![Just(Direction::Ingress), Just(Direction::Egress)],
        prop_oneof![
            Just(TierAction::Accept),
            Just(TierAction::Deny),
            Just(TierAction::Pass)
        ],
        selector,
        proptest::collection::vec(peer, 1..3),
        proptest::collection::vec(port, 0..3),
        0u8..4,
    )
        .prop_map(
            |(tier, priority, index, dir, action, subject, peers, ports, name)| {
                let spec = Spec {
                    name: &format!("cnp{name}-{priority}"),
                    tier,
                    priority,
                    subject,
                };
                tier_rule(&spec, (dir, index), action, peers, ports)
            },
        )
}

const NP: &[&str] = &[
    r#"[{"endpointSelector":{"matchLabels":{"app":"web"}},
        "ingress":[{"fromEndpoints":[{"matchLabels":{"app":"client"}}],
                    "toPorts":[{"ports":[{"port":"80","protocol":"TCP"}]}]}]}]"#,
    r#"[{"endpointSelector":{"matchLabels":{"app":"client"}},
        "egress":[{"toEndpoints":[{"matchLabels":{"app":"db"}}]}]}]"#,
];

#[test]
fn random_tiers_trace_agrees_with_the_map_by_identity_and_address() {
    let mut runner = TestRunner::new(Config {
        cases: 150,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (
        proptest::collection::vec(arb_rule(), 1..7),
        proptest::collection::vec(0usize..NP.len(), 0..2),
    );
    let decided: std::cell::RefCell<BTreeMap<&str, usize>> = std::cell::RefCell::default();
    runner
        .run(&strategy, |(rules, nps)| {
            let mut w = tiered_world();
            for i in nps {
                w.import(NP[i]);
            }
            add(&mut w, rules);
            for (ep, _) in ADDRS {
                for (peer, _) in ADDRS {
                    if ep == peer {
                        continue;
                    }
                    for dir in [Direction::Ingress, Direction::Egress] {
                        for flow in [
                            TCP80,
                            (proto::TCP, 85),
                            (proto::TCP, 2000),
                            (proto::UDP, 53),
                        ] {
                            let (_, d) = judge(&w, ep, dir, peer, flow);
                            let key = match tier_of(&d) {
                                Some((Tier::Admin, ..)) => "admin",
                                Some((Tier::Baseline, ..)) => "baseline",
                                _ => "other",
                            };
                            *decided.borrow_mut().entry(key).or_default() += 1;
                        }
                    }
                }
            }
            Ok(())
        })
        .unwrap();
    // The generator must reach every layer's decisions.
    let decided = decided.into_inner();
    for key in ["admin", "baseline", "other"] {
        assert!(
            decided.get(key).copied().unwrap_or(0) > 100,
            "{key} decided too few flows: {decided:?}"
        );
    }
}

/// The conformance suite's priority test, parsed from the objects: Admin priority 50 denies
/// slytherin → gryffindor; an Admin policy at 60 passes it to a Baseline that accepts; moved
/// to priority 40, the Pass comes first and the Baseline accepts.
#[test]
fn conformance_priority_shape_from_parsed_objects() {
    let mut w = World::new();
    w.add_endpoint(
        "harry",
        LabelSet::for_pod("gryffindor", [("conformance-house", "gryffindor")]),
    );
    w.add_endpoint(
        "draco",
        LabelSet::for_pod("slytherin", [("conformance-house", "slytherin")]),
    );
    let objects = |pass_priority: u32| {
        format!(
            r"
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {{name: priority-50-example}}
spec:
  tier: Admin
  priority: 50
  subject:
    namespaces: {{matchLabels: {{kubernetes.io/metadata.name: gryffindor}}}}
  ingress:
  - name: deny-slytherin
    action: Deny
    from: [{{namespaces: {{matchLabels: {{kubernetes.io/metadata.name: slytherin}}}}}}]
---
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {{name: pass-example}}
spec:
  tier: Admin
  priority: {pass_priority}
  subject:
    namespaces: {{matchLabels: {{kubernetes.io/metadata.name: gryffindor}}}}
  ingress:
  - name: pass-slytherin
    action: Pass
    from: [{{namespaces: {{matchLabels: {{kubernetes.io/metadata.name: slytherin}}}}}}]
---
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {{name: baseline-example}}
spec:
  tier: Baseline
  priority: 50
  subject:
    namespaces: {{matchLabels: {{kubernetes.io/metadata.name: gryffindor}}}}
  ingress:
  - name: accept-slytherin
    action: Accept
    from: [{{namespaces: {{matchLabels: {{kubernetes.io/metadata.name: slytherin}}}}}}]
  - name: deny-rest
    action: Deny
    from: [{{namespaces: {{}}}}]
"
        )
    };
    w.import(&objects(60));
    let (v, d) = judge(&w, "harry", Direction::Ingress, "draco", TCP80);
    assert_eq!(v, Verdict::Deny);
    assert_eq!(tier_of(&d), Some((Tier::Admin, 50, 0, TierAction::Deny)));
    w.import(&objects(40));
    let (v, d) = judge(&w, "harry", Direction::Ingress, "draco", TCP80);
    assert_eq!(v, Verdict::Allow);
    assert_eq!(
        tier_of(&d),
        Some((Tier::Baseline, 50, 0, TierAction::Accept))
    );
    // Everyone else in gryffindor's way gets the baseline's deny.
    let (v, d) = judge(&w, "harry", Direction::Ingress, "client", TCP80);
    assert_eq!(v, Verdict::Deny);
    assert_eq!(tier_of(&d), Some((Tier::Baseline, 50, 1, TierAction::Deny)));
}
