//! Properties of policy parsing (stable counterparts of `fuzz/fuzz_targets/policy_parse.rs`): any
//! text parses or fails with an error, never a panic; labels accepted are safe to print and
//! read back as themselves.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    reason = "an integration test crate: its helpers panic with context like its tests (clippy.toml's allow-*-in-tests covers only #[test] functions)"
)]

use proptest::prelude::*;
use weft_policy::labels::{Label, LabelSet};
use weft_policy::parse::parse_policy_file;

proptest! {
    #[test]
    fn any_text_parses_or_fails_cleanly(text in ".{0,300}", yaml in any::<bool>()) {
        let file = if yaml { "p.yaml" } else { "p.json" };
        let _ = parse_policy_file(file, &text);
    }

    #[test]
    fn structured_rules_with_any_strings_never_panic(
        key in ".{0,16}", value in ".{0,16}", port in ".{0,8}", proto in ".{0,6}", cidr in ".{0,20}",
    ) {
        let doc = serde_json::json!([{
            "endpointSelector": {"matchLabels": {key.clone(): value.clone()}},
            "ingress": [{
                "fromEndpoints": [{"matchLabels": {value: key}}],
                "toPorts": [{"ports": [{"port": port, "protocol": proto}]}],
            }],
            "egress": [{"toCIDR": [cidr]}],
        }]);
        let _ = parse_policy_file("p.json", &doc.to_string());
    }

    #[test]
    fn accepted_labels_hold_no_control_characters_and_round_trip(s in ".{0,40}") {
        if let Ok(l) = Label::parse_with_source(&s, "k8s") {
            let shown = l.to_string();
            prop_assert!(!shown.chars().any(|c| c.is_control() || c.is_whitespace()));
            prop_assert_eq!(Label::parse_with_source(&shown, "k8s").unwrap(), l);
        }
        let _ = LabelSet::parse_list(&s, "k8s");
    }
}
