//! Re-imports through the parse memo (only changed rules parsed, unchanged ones reused from the
//! repository) against the full path: after every random edit of a file the repository is what
//! parsing the whole file gives, and every slot holds exactly its from-scratch policy.

use super::support::{fake_manager_on, ready_pod};
use crate::datapath::FakeDatapath;
use crate::node::hostnet::FakeHostNet;
use crate::store::Store;
use proptest::prelude::*;
use std::sync::Arc;
use weft_policy::parse::parse_policy_file;
use weft_policy::repository::Repository;

/// Rule `n` of a file: its port, peer app and kind vary with the edits.
fn rule(n: usize, port: u16, peer: usize, kind: u8) -> String {
    let (dir, peers) = match kind % 4 {
        0 => (
            "ingress",
            format!(r#""fromEndpoints":[{{"matchLabels":{{"id":"a{peer}"}}}}]"#),
        ),
        1 => (
            "egress",
            format!(r#""toEndpoints":[{{"matchLabels":{{"id":"a{peer}"}}}}]"#),
        ),
        2 => (
            "egress",
            format!(r#""toCIDRSet":[{{"cidr":"10.{peer}.0.0/16","except":["10.{peer}.1.0/24"]}}]"#),
        ),
        _ => (
            "ingressDeny",
            format!(r#""fromEndpoints":[{{"matchLabels":{{"id":"a{peer}"}}}}]"#),
        ),
    };
    format!(
        r#"{{"labels":[{{"key":"rule","value":"r{n}"}}],"endpointSelector":{{"matchLabels":{{"id":"a{}"}}}},
            "{dir}":[{{{peers},"toPorts":[{{"ports":[{{"port":"{port}","protocol":"TCP"}}]}}]}}]}}"#,
        n % 3
    )
}

#[derive(Debug, Clone)]
enum Edit {
    Port(usize, u16),
    Peer(usize, usize),
    Kind(usize, u8),
    Drop(usize),
    Duplicate(usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (0usize..8, 1u16..5).prop_map(|(i, p)| Edit::Port(i, p)),
        (0usize..8, 0usize..3).prop_map(|(i, p)| Edit::Peer(i, p)),
        (0usize..8, 0u8..4).prop_map(|(i, k)| Edit::Kind(i, k)),
        (0usize..8).prop_map(Edit::Drop),
        (0usize..8).prop_map(Edit::Duplicate),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn one_rule_reimports_equal_the_full_parse_and_the_from_scratch_maps(
        edits in proptest::collection::vec(edit(), 1..6)
    ) {
        let dp = Arc::new(FakeDatapath::default());
        let store = Store::temporary().unwrap();
        let m = fake_manager_on(&store, Arc::new(FakeHostNet::default()), dp.clone());
        for (i, app) in ["a0", "a0", "a1", "a2"].iter().enumerate() {
            ready_pod(&m, &format!("c{i}"), app);
        }
        // (port, peer, kind) of each rule, in file order; None: dropped.
        let mut rules: Vec<Option<(u16, usize, u8)>> =
            (0u8..8).map(|n| Some((1 + u16::from(n % 3), usize::from(n % 3), n % 4))).collect();
        let mut extra: Vec<usize> = Vec::new();
        let mut slow = Repository::new();
        for step in 0..=edits.len() {
            if let Some(e) = step.checked_sub(1).and_then(|s| edits.get(s)) {
                match e.clone() {
                    Edit::Port(i, p) => if let Some(r) = rules[i].as_mut() { r.0 = p },
                    Edit::Peer(i, p) => if let Some(r) = rules[i].as_mut() { r.1 = p },
                    Edit::Kind(i, k) => if let Some(r) = rules[i].as_mut() { r.2 = k },
                    Edit::Drop(i) => rules[i] = None,
                    Edit::Duplicate(i) => extra.push(i),
                }
            }
            let mut texts: Vec<String> = rules
                .iter()
                .enumerate()
                .filter_map(|(n, r)| r.map(|(p, q, k)| rule(n, p, q, k)))
                .collect();
            texts.extend(extra.iter().filter_map(|&n| rules[n].map(|(p, q, k)| rule(n, p, q, k))));
            if texts.is_empty() {
                continue;
            }
            let text = format!("[{}]", texts.join(",\n"));
            let full = parse_policy_file("p.json", &text).unwrap();
            let want = slow.add(full);
            let got = m.import_policy("p.json", &text).unwrap();
            prop_assert_eq!(got.revision, want.revision);
            let st = m.state();
            prop_assert_eq!(st.pol.repo(), &slow, "step {}", step);
            // The selector cache, kept up to date per changed rule, is the one built afresh.
            prop_assert!(st.pol.cache() == &st.pol.fresh_cache(), "step {}", step);
            drop(st);
            let r = m.verify().unwrap();
            prop_assert!(r.consistent, "step {}: {:?}", step, r.problems);
        }
    }
}

#[test]
fn a_broken_rule_in_a_reimport_is_reported_as_the_full_parser_does_and_changes_nothing() {
    let dp = Arc::new(FakeDatapath::default());
    let m = fake_manager_on(
        &Store::temporary().unwrap(),
        Arc::new(FakeHostNet::default()),
        dp,
    );
    let good = format!("[{},{}]", rule(0, 80, 1, 0), rule(1, 81, 2, 1));
    let before = m.import_policy("p.json", &good).unwrap();
    let bad = format!(
        "[{},{}]",
        rule(0, 80, 1, 0),
        rule(1, 81, 2, 1).replace("TCP", "XTCP")
    );
    let want = parse_policy_file("p.json", &bad).unwrap_err().to_string();
    let err = m.import_policy("p.json", &bad).unwrap_err().to_string();
    assert!(err.contains(&want), "{err} / {want}");
    assert_eq!(m.state().pol.repo().revision(), before.revision);
}
