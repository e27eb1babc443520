//! Re-import through the parse memo and [`Repository::add_reusing`] is exactly the full path
//! (parse every rule, [`Repository::add`]): same change, same repository, same errors, for
//! random sequences of imports with edits, duplicates, unlabelled and invalid rules.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    reason = "an integration test crate: its helpers panic with context like its tests (clippy.toml's allow-*-in-tests covers only #[test] functions)"
)]

use proptest::prelude::*;
use weft_policy::parse::memo::{ParseMemo, incoming};
use weft_policy::parse::parse_policy_file;
use weft_policy::repository::Repository;

/// One rule element: name (None: no labels), app selected, port; or a broken element.
fn element() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => (proptest::option::of(0u8..4), 0u8..3, 1u16..4, any::<bool>()).prop_map(|(name, app, port, extra)| {
            let labels = match name {
                Some(n) if extra => format!(r#"[{{"key":"name","value":"r{n}"}},{{"key":"x","value":"y"}}]"#),
                Some(n) => format!(r#"[{{"key":"name","value":"r{n}"}}]"#),
                None => "[]".into(),
            };
            format!(
                r#"{{"labels":{labels},"endpointSelector":{{"matchLabels":{{"app":"a{app}"}}}},"ingress":[{{"toPorts":[{{"ports":[{{"port":"{port}","protocol":"TCP"}}]}}]}}]}}"#
            )
        }),
        1 => Just(r#"{"endpointSelector":{"matchLabels":{"app":"a"}},"ingress":[{"toPorts":[{"ports":[{"port":"x"}]}]}]}"#.to_string()),
        1 => Just("null".to_string()),
    ]
}

/// Imports `files` in turn through the memo and through the full path (parse every rule,
/// [`Repository::add`]): the same change, repository and errors each time.
fn memo_equals_full(name: &str, files: &[String]) -> Result<(), TestCaseError> {
    let mut memo = ParseMemo::new();
    let mut fast = Repository::new();
    let mut slow = Repository::new();
    for text in files {
        let want = parse_policy_file(name, text);
        let got = memo.parse(name, text);
        match (want, got) {
            (Err(w), Err(g)) => prop_assert_eq!(w, g),
            (Ok(rules), Ok(pieces)) => {
                let inc = incoming(pieces, &fast).unwrap();
                prop_assert_eq!(fast.add_reusing(inc), slow.add(rules));
                prop_assert_eq!(&fast, &slow);
            }
            (w, g) => prop_assert!(false, "full {:?} vs memo {:?}", w, g.map(|p| p.len())),
        }
    }
    Ok(())
}

fn file() -> impl Strategy<Value = String> {
    (proptest::collection::vec(element(), 0..6), 0usize..3).prop_map(|(els, ws)| {
        let sep = [",", " ,\n", ",\t"][ws];
        format!("[{}]", els.join(sep))
    })
}

proptest! {
    #[test]
    fn memoized_reimport_equals_parsing_everything(files in proptest::collection::vec(file(), 1..5)) {
        memo_equals_full("p.json", &files)?;
    }

    #[test]
    fn memo_parse_of_any_text_agrees_with_the_full_parser(text in "[\\[\\]{}\",: a-z0-9\n]{0,80}") {
        let want = parse_policy_file("p.json", &text).map(|r| r.len());
        let got = ParseMemo::new().parse("p.json", &text).map(|p| p.len());
        prop_assert_eq!(want, got);
    }
}

/// One item of a YAML rule list: block or flow style, broken, null, with a comment, with a
/// quoted scalar running over a column-0 `- ` line, or with an anchor.
fn yaml_rule_item() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => (0u8..4, 0u8..3, 1u16..4).prop_map(|(n, app, port)| format!(
            "- labels:\n  - key: name\n    value: r{n}\n  endpointSelector:\n    matchLabels:\n      app: a{app}\n  ingress:\n  - toPorts:\n    - ports:\n      - port: \"{port}\"\n        protocol: TCP\n"
        )),
        2 => element().prop_map(|e| format!("- {e}\n")),
        1 => Just("# a comment\n\n".to_string()),
        1 => Just("-\n".to_string()),
        1 => Just("- description: \"two\n- lines\"\n  endpointSelector: {}\n".to_string()),
        1 => Just("- &r {endpointSelector: {}}\n".to_string()),
    ]
}

/// One item of a YAML `List`: a `CiliumNetworkPolicy` (one rule, or two with `specs`), a
/// `NetworkPolicy`, or a broken object.
fn yaml_list_item() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => (0u8..4, 0u8..3, 1u16..4).prop_map(|(n, app, port)| format!(
            "- apiVersion: cilium.io/v2\n  kind: CiliumNetworkPolicy\n  metadata:\n    name: p{n}\n    namespace: default\n  spec:\n    endpointSelector:\n      matchLabels:\n        app: a{app}\n    ingress:\n    - toPorts:\n      - ports:\n        - port: \"{port}\"\n          protocol: TCP\n"
        )),
        2 => (0u8..4, 0u8..3).prop_map(|(n, app)| format!(
            "- apiVersion: networking.k8s.io/v1\n  kind: NetworkPolicy\n  metadata: {{name: n{n}, namespace: default}}\n  spec:\n    podSelector: {{matchLabels: {{app: a{app}}}}}\n    policyTypes: [Ingress]\n"
        )),
        1 => Just("- apiVersion: cilium.io/v2\n  kind: CiliumNetworkPolicy\n  metadata: {name: two, namespace: default}\n  specs:\n  - endpointSelector: {}\n  - endpointSelector: {matchLabels: {app: a1}}\n".to_string()),
        1 => Just("- kind: NetworkPolicy\n  spec: 3\n".to_string()),
        1 => Just("# a comment\n".to_string()),
    ]
}

fn yaml_file() -> impl Strategy<Value = String> {
    prop_oneof![
        proptest::collection::vec(yaml_rule_item(), 0..6).prop_map(|items| items.concat()),
        proptest::collection::vec(yaml_list_item(), 0..6)
            .prop_map(|items| format!("apiVersion: v1\nkind: List\nitems:\n{}", items.concat())),
    ]
}

proptest! {
    #[test]
    fn memoized_yaml_reimport_equals_parsing_everything(files in proptest::collection::vec(yaml_file(), 1..5)) {
        memo_equals_full("p.yaml", &files)?;
    }
}
