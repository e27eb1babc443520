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

fn file() -> impl Strategy<Value = String> {
    (proptest::collection::vec(element(), 0..6), 0usize..3).prop_map(|(els, ws)| {
        let sep = [",", " ,\n", ",\t"][ws];
        format!("[{}]", els.join(sep))
    })
}

proptest! {
    #[test]
    fn memoized_reimport_equals_parsing_everything(files in proptest::collection::vec(file(), 1..5)) {
        let mut memo = ParseMemo::new();
        let mut fast = Repository::new();
        let mut slow = Repository::new();
        for text in &files {
            let want = parse_policy_file("p.json", text);
            let got = memo.parse("p.json", text);
            match (want, got) {
                (Err(w), Err(g)) => prop_assert_eq!(w, g),
                (Ok(rules), Ok(pieces)) => {
                    let inc = incoming(pieces, &fast).unwrap();
                    prop_assert_eq!(fast.add_reusing(inc), slow.add(rules));
                    prop_assert_eq!(&fast, &slow);
                }
                (w, g) => prop_assert!(false, "full {:?} vs memo {:?}", w.is_ok(), g.is_ok()),
            }
        }
    }

    #[test]
    fn memo_parse_of_any_text_agrees_with_the_full_parser(text in "[\\[\\]{}\",: a-z0-9\n]{0,80}") {
        let want = parse_policy_file("p.json", &text).map(|r| r.len());
        let got = ParseMemo::new().parse("p.json", &text).map(|p| p.len());
        prop_assert_eq!(want, got);
    }
}
