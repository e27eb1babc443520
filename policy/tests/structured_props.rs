//! Structured properties of the policy engine: arbitrary Cilium rules and Kubernetes
//! `NetworkPolicies` built from the shapes the parsers accept (selectors with labels and
//! expressions, endpoint / CIDR / CIDR-set / entity / ipBlock / namespace peers, ports, ranges,
//! named ports, every protocol, denies, policyTypes), with a few broken pieces. Random text
//! (props.rs) is refused by the JSON parser at its first bytes; these reach rule translation and
//! the computation. Every accepted policy is imported into a world of endpoints and computed:
//! the deny invariant holds, and `policy trace` agrees with the map's verdict for sampled flows.
//! The test counts the cases that get that far and requires a minimum share, and counts which
//! rule kinds and fields the accepted policies carried: each must have been exercised (figures
//! in docs/OPERATIONS.md "Property tests").

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    reason = "an integration test crate: its helpers panic with context like its tests (clippy.toml's allow-*-in-tests covers only #[test] functions)"
)]

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// A runner config of `n` cases; no failure persistence (an integration test has no source
/// file proptest could find; a failure prints its minimal case).
fn cases(n: u32) -> Config {
    Config {
        cases: n,
        failure_persistence: None,
        ..Config::default()
    }
}
use serde_json::{Value, json};
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use weft_policy::cidr::CidrReferences;
use weft_policy::compute::{ComputeOptions, compute_with_ports};
use weft_policy::identity::{IdentityAllocator, IdentityKey, MemoryStore};
use weft_policy::labels::LabelSet;
use weft_policy::mapstate::{Direction, reserved};
use weft_policy::parse::parse_policy_file;
use weft_policy::repository::Repository;
use weft_policy::rule::NamedPorts;
use weft_policy::selectorcache::SelectorCache;
use weft_policy::trace::{TracePeer, trace};

const CASES: u32 = 400;
const APPS: [&str; 3] = ["web", "db", "client"];
const NAMESPACES: [&str; 2] = ["default", "prod"];

fn pick<T: Clone + std::fmt::Debug + 'static>(items: &'static [T]) -> impl Strategy<Value = T> {
    proptest::sample::select(items)
}

fn selector() -> impl Strategy<Value = Value> {
    prop_oneof![
        3 => pick(&APPS).prop_map(|a| json!({"matchLabels": {"app": a}})),
        1 => Just(json!({})),
        1 => (pick(&["In", "NotIn"]), proptest::sample::subsequence(APPS.to_vec(), 1..3))
            .prop_map(|(op, v)| json!({"matchExpressions": [{"key": "app", "operator": op, "values": v}]})),
        1 => Just(json!({"matchExpressions": [{"key": "tier", "operator": "Exists"}]})),
        1 => pick(&NAMESPACES).prop_map(|n| json!({"matchLabels": {"k8s:io.kubernetes.pod.namespace": n}})),
    ]
}

fn cidr() -> impl Strategy<Value = String> {
    prop_oneof![
        12 => pick(&["10.0.0.0/8", "10.1.0.0/16", "192.168.1.0/24", "0.0.0.0/0", "fd00::/64", "10.1.2.3"])
            .prop_map(str::to_owned),
        1 => Just("300.1.1.1/8".to_owned()),
    ]
}

fn port() -> impl Strategy<Value = Value> {
    // ICMP is refused ("not supported yet"): rare, so that most rules get through.
    let proto = || pick(&["TCP", "TCP", "TCP", "UDP", "UDP", "SCTP", "ANY", "ICMP"]);
    prop_oneof![
        4 => (1u16..2000, proto()).prop_map(|(p, pr)| json!({"port": p.to_string(), "protocol": pr})),
        2 => (1u16..1000, 0u16..200, proto()).prop_map(|(p, n, pr)| json!({"port": p.to_string(), "endPort": p + n, "protocol": pr})),
        1 => pick(&["http", "dns", "metrics"]).prop_map(|n| json!({"port": n, "protocol": "TCP"})),
        1 => Just(json!({"port": "70000", "protocol": "TCP"})),
    ]
}

fn to_ports() -> impl Strategy<Value = Option<Value>> {
    proptest::option::weighted(
        0.6,
        proptest::collection::vec(port(), 1..3).prop_map(|p| json!([{"ports": p}])),
    )
}

/// One ingress (`from*`) or egress (`to*`) peer rule.
fn peer_rule(prefix: &'static str) -> impl Strategy<Value = Value> {
    let peers = prop_oneof![
        3 => proptest::collection::vec(selector(), 1..3).prop_map(move |s| (format!("{prefix}Endpoints"), json!(s))),
        1 => proptest::collection::vec(cidr(), 1..3).prop_map(move |c| (format!("{prefix}CIDR"), json!(c))),
        1 => (cidr(), proptest::collection::vec(cidr(), 0..2))
            .prop_map(move |(c, e)| (format!("{prefix}CIDRSet"), json!([{"cidr": c, "except": e}]))),
        1 => proptest::collection::vec(pick(&["world", "host", "cluster", "all"]), 1..3)
            .prop_map(move |e| (format!("{prefix}Entities"), json!(e))),
    ];
    (proptest::option::weighted(0.85, peers), to_ports()).prop_map(|(peer, ports)| {
        let mut r = serde_json::Map::new();
        if let Some((k, v)) = peer {
            r.insert(k, v);
        }
        if let Some(p) = ports {
            r.insert("toPorts".into(), p);
        }
        Value::Object(r)
    })
}

fn cilium_rule() -> impl Strategy<Value = Value> {
    let section = |prefix| {
        proptest::option::weighted(0.5, proptest::collection::vec(peer_rule(prefix), 1..3))
    };
    (
        0u32..4,
        selector(),
        section("from"),
        section("to"),
        section("from"),
        section("to"),
    )
        .prop_map(|(n, sel, ing, eg, ing_deny, eg_deny)| {
            let mut r = json!({"labels": [{"key": "name", "value": format!("r{n}")}], "endpointSelector": sel});
            for (k, v) in [("ingress", ing), ("egress", eg), ("ingressDeny", ing_deny), ("egressDeny", eg_deny)] {
                if let Some(v) = v {
                    r[k] = json!(v);
                }
            }
            r
        })
}

/// A `NetworkPolicy` rule: its peers (`from` / `to`) and its ports, each optional.
type NpRule = (Option<Vec<Value>>, Option<Vec<Value>>);

fn k8s_policy() -> impl Strategy<Value = Value> {
    let np_port = prop_oneof![
        3 => (1u16..2000, pick(&["TCP", "UDP", "SCTP"])).prop_map(|(p, pr)| json!({"port": p, "protocol": pr})),
        1 => (1u16..1000, 0u16..100).prop_map(|(p, n)| json!({"port": p, "endPort": p + n})),
        1 => pick(&["http", "dns"]).prop_map(|n| json!({"port": n})),
    ];
    let np_peer = prop_oneof![
        2 => selector().prop_map(|s| json!({"podSelector": s})),
        1 => pick(&NAMESPACES).prop_map(|n| json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": n}}})),
        1 => (pick(&["10.0.0.0/8", "10.1.0.0/16", "0.0.0.0/0"]), proptest::option::of(pick(&["10.1.2.0/24", "10.2.0.0/16"])))
            .prop_map(|(c, e)| json!({"ipBlock": {"cidr": c, "except": e.into_iter().collect::<Vec<_>>()}})),
    ];
    let np_rule = (
        proptest::option::of(proptest::collection::vec(np_peer, 1..3)),
        proptest::option::of(proptest::collection::vec(np_port, 1..3)),
    );
    (
        0u32..3,
        pick(&NAMESPACES),
        selector(),
        proptest::sample::subsequence(vec!["Ingress", "Egress"], 0..3),
        proptest::collection::vec(np_rule.clone(), 0..3),
        proptest::collection::vec(np_rule, 0..3),
    )
        .prop_map(|(n, ns, sel, types, ing, eg)| {
            let rules = |rs: Vec<NpRule>, peer_key: &str| -> Vec<Value> {
                rs.into_iter()
                    .map(|(peers, ports)| {
                        let mut r = serde_json::Map::new();
                        if let Some(p) = peers {
                            r.insert(peer_key.into(), json!(p));
                        }
                        if let Some(p) = ports {
                            r.insert("ports".into(), json!(p));
                        }
                        Value::Object(r)
                    })
                    .collect()
            };
            let mut spec = json!({"podSelector": sel, "ingress": rules(ing, "from"), "egress": rules(eg, "to")});
            if !types.is_empty() {
                spec["policyTypes"] = json!(types);
            }
            json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                   "metadata": {"name": format!("np{n}"), "namespace": ns}, "spec": spec})
        })
}

/// A file: a Cilium rule list, or a Kubernetes object (as JSON, which the YAML reader takes).
fn policy_file() -> impl Strategy<Value = (&'static str, String)> {
    prop_oneof![
        proptest::collection::vec(cilium_rule(), 1..4)
            .prop_map(|r| ("p.json", Value::Array(r).to_string())),
        k8s_policy().prop_map(|p| ("p.yaml", p.to_string())),
    ]
}

/// The rule kinds and fields a policy document carries: its keys (`fromCIDRSet`, `endPort`,
/// `ipBlock`, ...), selector operators, protocols, named ports and non-empty `except` lists.
fn features(v: &Value, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("operator" | "protocol", Value::String(s)) => {
                        out.insert(format!("{k}={s}"));
                    }
                    ("port", Value::String(s)) if s.parse::<u32>().is_err() => {
                        out.insert("port=<name>".into());
                    }
                    ("except", Value::Array(a)) if !a.is_empty() => {
                        out.insert("except".into());
                    }
                    ("kind", Value::String(s)) => {
                        out.insert(format!("kind={s}"));
                    }
                    _ => {
                        out.insert(k.clone());
                    }
                }
                features(v, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|v| features(v, out)),
        _ => {}
    }
}

/// Every rule kind and field the generator produces: each must occur in at least one policy
/// that the parser accepted and the engine computed.
const EXPECTED_FEATURES: [&str; 31] = [
    // Cilium rules.
    "endpointSelector",
    "ingress",
    "egress",
    "ingressDeny",
    "egressDeny",
    "fromEndpoints",
    "toEndpoints",
    "fromCIDR",
    "toCIDR",
    "fromCIDRSet",
    "toCIDRSet",
    "fromEntities",
    "toEntities",
    "toPorts",
    "except",
    "protocol=ANY",
    "protocol=SCTP",
    // Both.
    "matchLabels",
    "operator=In",
    "operator=NotIn",
    "operator=Exists",
    "endPort",
    "port=<name>",
    "protocol=TCP",
    "protocol=UDP",
    // Kubernetes NetworkPolicy.
    "kind=NetworkPolicy",
    "podSelector",
    "namespaceSelector",
    "ipBlock",
    "policyTypes",
    "from",
];

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one property: parse, compute, trace every flow, then the coverage it reached"
)]
fn structured_policies_reach_the_computation_and_trace_agrees_with_the_map() {
    let (accepted, with_entries) = (Cell::new(0u32), Cell::new(0u32));
    let refused = RefCell::new(BTreeMap::<String, u32>::new());
    let reached = RefCell::new(BTreeMap::<String, u32>::new());
    let broken_accepted = RefCell::new(Vec::<String>::new());
    let mut runner = TestRunner::new(cases(CASES));
    runner
        .run(
            &(policy_file(), 1u16..2000),
            |((file, text), probe_port)| {
                let rules = match parse_policy_file(file, &text) {
                    Ok(rules) => rules,
                    Err(e) => {
                        // Why, without the object's name, path or value.
                        let text = e.to_string();
                        let why: String = text
                            .rsplit(": ")
                            .next()
                            .unwrap_or_default()
                            .chars()
                            .filter(|c| !c.is_ascii_digit())
                            .take(40)
                            .collect();
                        *refused.borrow_mut().entry(why).or_default() += 1;
                        return Ok(());
                    }
                };
                accepted.set(accepted.get() + 1);
                let mut seen = BTreeSet::new();
                features(&serde_json::from_str(&text).unwrap(), &mut seen);
                for f in seen {
                    *reached.borrow_mut().entry(f).or_default() += 1;
                }
                // The broken pieces (port 70000, address 300.1.1.1) are never accepted.
                if text.contains("\"70000\"") || text.contains("300.1.1.1") {
                    broken_accepted.borrow_mut().push(text.clone());
                }
                let mut repo = Repository::new();
                repo.add(rules);
                let (mut alloc, mut store) = (IdentityAllocator::new(), MemoryStore::default());
                let mut eps = Vec::new();
                for ns in NAMESPACES {
                    for app in APPS {
                        let labels = LabelSet::for_pod(ns, [("app", app)]);
                        let id = alloc
                            .acquire(&mut store, &IdentityKey::Labels(labels.clone()))
                            .unwrap()
                            .id;
                        eps.push((id, labels));
                    }
                }
                let mut cache = SelectorCache::build(&alloc, &repo);
                CidrReferences::new()
                    .sync(&repo.cidr_prefixes(), &mut alloc, &mut store, &mut cache)
                    .unwrap();
                cache.sync(&repo);
                let opts = ComputeOptions::default();
                let named: NamedPorts =
                    [(("http".to_owned(), 6), 8080), (("dns".to_owned(), 17), 53)].into();
                let mut any_entry = false;
                for (_, labels) in &eps {
                    let p = compute_with_ports(labels, &named, &repo, &cache, &opts);
                    prop_assert!(p.deny_shadowing_violations().is_empty(), "{text}");
                    any_entry |= !p.entries.is_empty();
                    // Every peer endpoint, the host and the world, on the probe port and on 8080.
                    let peers = eps
                        .iter()
                        .map(|(id, _)| *id)
                        .chain([reserved::HOST, reserved::WORLD]);
                    for peer in peers {
                        for (proto, port) in
                            [(6u8, probe_port), (6, 8080), (17, 53), (132, probe_port)]
                        {
                            let me = TracePeer {
                                identity: 0,
                                labels: Some(labels),
                                named_ports: Some(&named),
                                cidr_identity: 0,
                            };
                            let other = TracePeer {
                                identity: peer,
                                labels: None,
                                named_ports: None,
                                cidr_identity: 0,
                            };
                            let ingress = trace(&repo, &cache, other, me, proto, port, &opts);
                            prop_assert_eq!(
                                ingress.ingress.map(|d| d.verdict),
                                Some(p.lookup(Direction::Ingress, peer, proto, port)),
                                "ingress {:?} <- {} {}/{}: {}",
                                labels.to_string(),
                                peer,
                                proto,
                                port,
                                text
                            );
                            let egress = trace(&repo, &cache, me, other, proto, port, &opts);
                            prop_assert_eq!(
                                egress.egress.map(|d| d.verdict),
                                Some(p.lookup(Direction::Egress, peer, proto, port)),
                                "egress {:?} -> {} {}/{}: {}",
                                labels.to_string(),
                                peer,
                                proto,
                                port,
                                text
                            );
                        }
                    }
                }
                if any_entry {
                    with_entries.set(with_entries.get() + 1);
                }
                Ok(())
            },
        )
        .unwrap();
    let (accepted, with_entries) = (accepted.get(), with_entries.get());
    let reached = reached.into_inner();
    eprintln!(
        "{CASES} structured policies: {accepted} accepted and computed, {with_entries} with map entries; refused: {:#?}\n\
         accepted policies carrying each field: {reached:#?}",
        refused.borrow()
    );
    let missing: Vec<&str> = EXPECTED_FEATURES
        .into_iter()
        .filter(|f| !reached.contains_key(*f))
        .collect();
    assert!(
        missing.is_empty(),
        "no accepted policy exercised {missing:?}: the generator no longer reaches them"
    );
    assert!(
        broken_accepted.borrow().is_empty(),
        "broken policies accepted: {:#?}",
        broken_accepted.borrow()
    );
    assert!(
        !refused.borrow().is_empty(),
        "no broken piece was refused: the generator no longer produces them"
    );
    assert!(
        accepted >= CASES * 2 / 5,
        "only {accepted} of {CASES} accepted: the generator no longer reaches the computation"
    );
    assert!(
        with_entries >= CASES / 3,
        "only {with_entries} of {CASES} computed any entry"
    );
}

/// The weakness this file replaces, measured: the random text of props.rs
/// (`any_text_parses_or_fails_cleanly`, `.{0,300}`) almost never gets past serde's first
/// character as JSON and is never a policy; the structured generator's files are valid documents
/// and mostly policies.
#[test]
fn random_text_stops_at_the_first_byte_where_structured_input_gets_through() {
    let n = 1000u32;
    let mut runner = TestRunner::new(cases(n));
    let (past_first_char, valid_json, random_policies) =
        (Cell::new(0u32), Cell::new(0u32), Cell::new(0u32));
    runner
        .run(&(".{0,300}", any::<bool>()), |(text, yaml)| {
            match serde_json::from_str::<Value>(&text) {
                Ok(_) => {
                    valid_json.set(valid_json.get() + 1);
                    past_first_char.set(past_first_char.get() + 1);
                }
                Err(e) if e.line() > 1 || e.column() > 1 => {
                    past_first_char.set(past_first_char.get() + 1);
                }
                Err(_) => {}
            }
            if parse_policy_file(if yaml { "p.yaml" } else { "p.json" }, &text)
                .is_ok_and(|r| !r.is_empty())
            {
                random_policies.set(random_policies.get() + 1);
            }
            Ok(())
        })
        .unwrap();
    let structured_policies = Cell::new(0u32);
    let mut runner = TestRunner::new(cases(n));
    runner
        .run(&policy_file(), |(file, text)| {
            if parse_policy_file(file, &text).is_ok_and(|r| !r.is_empty()) {
                structured_policies.set(structured_policies.get() + 1);
            }
            Ok(())
        })
        .unwrap();
    let (past, json, random, structured) = (
        past_first_char.get(),
        valid_json.get(),
        random_policies.get(),
        structured_policies.get(),
    );
    eprintln!(
        "{n} random texts: {past} got past serde's first character, {json} were JSON, {random} parsed to a policy; \
         {n} structured files: {structured} parsed to a policy"
    );
    assert!(
        structured >= n / 2 && structured > 10 * random.max(1),
        "structured {structured} vs random {random} of {n}: the structured generator no longer reaches further"
    );
}
