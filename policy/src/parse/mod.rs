//! Policy file parsing: Cilium rule lists (JSON/YAML), `CiliumNetworkPolicy`, Kubernetes
//! `NetworkPolicy` and `ClusterNetworkPolicy`, one document or several (`---`) or a `List`,
//! all into [`Rule`]s.
//!
//! Input is read into a generic value tree and walked by hand rather than derived with serde,
//! so every error can name the rule and the exact field path, and so fields Cilium knows but
//! Weft does not implement are told apart from typos.

mod cilium;
mod cnp;
mod k8s;
pub mod memo;
mod ports;
mod walk;
mod yaml_items;

use crate::rule::Rule;
use serde::Deserialize;
use serde_json::Value;
use std::fmt;

pub use walk::{FieldError, Note, NoteKind};

/// A rejected policy file. Display: `file: location: path: message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// The file name the caller passed.
    pub file: String,
    /// Which rule or object, e.g. `rule 2 (name "x")` (indices count from 0).
    pub location: String,
    /// The field path inside it, e.g. `ingress[0].toPorts[0].ports[0].port`.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        for part in [&self.location, &self.path] {
            if !part.is_empty() {
                write!(f, ": {part}")?;
            }
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ParseError {}

/// Parses a whole policy file. All or nothing: any error rejects every rule in it.
pub fn parse_policy_file(file: &str, text: &str) -> Result<Vec<Rule>, ParseError> {
    parse_noted(file, text).map(|p| p.rules)
}

/// Rules and what the parse noted about them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    /// The rules.
    pub rules: Vec<Rule>,
    /// Warnings, and in [`parse_cluster_object`] the parts left out. In a file each path starts
    /// with its rule's or object's location; in a cluster object it is the path in the object.
    pub notes: Vec<Note>,
}

/// [`parse_policy_file`] with its warnings ([`NoteKind::Warning`]: e.g. a CIDR with host bits
/// set, enforced as the network it names).
pub fn parse_noted(file: &str, text: &str) -> Result<Parsed, ParseError> {
    parse_file(file, text, true, false)
}

/// Parses a policy object the cluster's API server accepted (Kubernetes mode), failing closed:
/// only what decides whom it selects must parse (metadata, `podSelector`/`endpointSelector`,
/// `policyTypes`); an ingress or egress entry Weft cannot express is left out and noted
/// ([`NoteKind::NotEnforced`]) while the policy keeps isolating its pods in that direction (a
/// Cilium deny entry is widened to deny the whole direction instead). Rejecting the object
/// would leave its pods unisolated. A `ClusterNetworkPolicy` rule Weft cannot read fails
/// closed as that API asks (see `cnp`); an object without rules gives none.
pub fn parse_cluster_object(file: &str, text: &str) -> Result<Parsed, ParseError> {
    parse_file(file, text, false, true)
}

/// `fast`: a first pass without field paths (see `walk::without_paths`).
fn parse_file(file: &str, text: &str, fast: bool, lenient: bool) -> Result<Parsed, ParseError> {
    let fail = |location: String, e: FieldError| ParseError {
        file: file.to_owned(),
        location,
        path: e.path,
        message: e.message,
    };
    let docs = split_documents(text).map_err(|m| fail(String::new(), FieldError::new("", m)))?;
    let many = docs.len() > 1;
    let parse_all = || {
        let mut rules = Vec::new();
        for (d, doc) in docs.iter().enumerate() {
            let prefix = if many {
                format!("document {d}")
            } else {
                String::new()
            };
            parse_value(doc, &prefix, &mut rules)?;
        }
        Ok::<_, DocError>(rules)
    };
    // Fast pass without field paths; an error or a note is reported from a second pass that
    // has them.
    let first = fast.then(|| walk::collecting_notes(lenient, || walk::without_paths(parse_all)));
    let (rules, notes) = match first {
        Some((Ok(rules), notes)) if notes.is_empty() => (Ok(rules), notes),
        _ => walk::collecting_notes(lenient, parse_all),
    };
    let rules = rules.map_err(|(loc, e)| fail(loc, e))?;
    // A cluster object may have no rules (a ClusterNetworkPolicy without ingress or egress).
    if rules.is_empty() && !lenient {
        return Err(fail(
            String::new(),
            FieldError::new("", "no policy rules in file"),
        ));
    }
    Ok(Parsed { rules, notes })
}

fn join_loc(prefix: &str, loc: &str) -> String {
    match (prefix.is_empty(), loc.is_empty()) {
        (true, _) => loc.to_owned(),
        (false, true) => prefix.to_owned(),
        (false, false) => format!("{prefix}, {loc}"),
    }
}

type DocError = (String, FieldError);

fn parse_value(v: &Value, prefix: &str, out: &mut Vec<Rule>) -> Result<(), DocError> {
    match v {
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                let loc = || join_loc(prefix, &cilium::rule_location(i, item));
                let before = walk::notes_len();
                out.push(cilium::parse_rule(item, "").map_err(|e| (loc(), e))?);
                if walk::notes_len() > before {
                    walk::locate_notes_since(before, &loc());
                }
            }
            Ok(())
        }
        Value::Object(map) => {
            let kind = map.get("kind").and_then(Value::as_str);
            match kind {
                Some("CiliumNetworkPolicy") => k8s::parse_cnp(v, prefix, out),
                Some("CiliumClusterwideNetworkPolicy") => k8s::parse_ccnp(v, prefix, out),
                Some("NetworkPolicy") => k8s::parse_network_policy(v, prefix, out),
                Some(cnp::KIND) => cnp::parse_cluster_network_policy(v, prefix, out),
                Some(k) if k == "List" || k.ends_with("List") => {
                    let items = map.get("items").and_then(Value::as_array).ok_or_else(|| {
                        (
                            prefix.to_owned(),
                            FieldError::new("items", "a List needs an items array"),
                        )
                    })?;
                    for (i, item) in items.iter().enumerate() {
                        parse_value(item, &join_loc(prefix, &format!("item {i}")), out)?;
                    }
                    Ok(())
                }
                Some(k) => Err((
                    prefix.to_owned(),
                    FieldError::new(
                        "kind",
                        format!(
                            "unsupported kind {k:?} (expected CiliumNetworkPolicy, CiliumClusterwideNetworkPolicy, NetworkPolicy, ClusterNetworkPolicy or List)"
                        ),
                    ),
                )),
                None => {
                    let loc = || join_loc(prefix, &cilium::rule_location(0, v));
                    let before = walk::notes_len();
                    out.push(cilium::parse_rule(v, "").map_err(|e| (loc(), e))?);
                    if walk::notes_len() > before {
                        walk::locate_notes_since(before, &loc());
                    }
                    Ok(())
                }
            }
        }
        Value::Null => Ok(()),
        _ => Err((
            prefix.to_owned(),
            FieldError::new("", "expected a rule list, a policy object or a List"),
        )),
    }
}

/// JSON is tried first for its better error positions; anything else is YAML, possibly with
/// several `---` documents.
fn split_documents(text: &str) -> Result<Vec<Value>, String> {
    let trimmed = text.trim_start();
    if trimmed.starts_with('[') || trimmed.starts_with('{') {
        match serde_json::from_str::<Value>(text) {
            Ok(v) => return Ok(vec![v]),
            Err(json_err) => {
                // Flow-style YAML also starts with a bracket; only report JSON if YAML fails too.
                return yaml_documents(text).map_err(|_| format!("invalid JSON: {json_err}"));
            }
        }
    }
    yaml_documents(text)
}

fn yaml_documents(text: &str) -> Result<Vec<Value>, String> {
    let mut docs = Vec::new();
    for de in serde_yaml::Deserializer::from_str(text) {
        let v = Value::deserialize(de).map_err(|e| format!("invalid YAML: {e}"))?;
        if !v.is_null() {
            docs.push(v);
        }
    }
    Ok(docs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fast_pass_without_paths_gives_the_same_rules_and_errors() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/policies");
        let mut n = 0;
        for dir in [root.clone(), root.join("invalid")] {
            for e in std::fs::read_dir(dir).unwrap() {
                let p = e.unwrap().path();
                if !p.is_file() {
                    continue;
                }
                let text = std::fs::read_to_string(&p).unwrap();
                let name = p.display().to_string();
                let show = |r: Result<Parsed, ParseError>| format!("{r:?}");
                assert_eq!(
                    show(parse_file(&name, &text, true, false)),
                    show(parse_file(&name, &text, false, false)),
                    "{name}"
                );
                n += 1;
            }
        }
        assert!(n > 20, "testdata went missing: {n}");
    }
    use crate::labels::{Label, LabelSet};
    use crate::mapstate::Direction;

    fn err(text: &str) -> String {
        parse_policy_file("f", text).unwrap_err().to_string()
    }

    #[test]
    fn single_rule_object_and_short_labels() {
        let r = parse_policy_file(
            "f",
            r#"{"endpointSelector":{},"labels":["k8s:team=a","name=b"],"egress":[{}]}"#,
        )
        .unwrap();
        assert!(r[0].labels.contains(&Label::new("k8s", "team", "a")));
        assert!(r[0].labels.contains(&Label::new("unspec", "name", "b")));
        assert!(r[0].applies(Direction::Egress) && r[0].egress[0].peers.is_empty());
    }

    #[test]
    fn yaml_scalars_become_label_values() {
        let r = parse_policy_file(
            "f",
            "- endpointSelector: {matchLabels: {version: 2, canary: true}}\n  ingress: [{}]\n",
        )
        .unwrap();
        let pod: LabelSet = [("version", "2"), ("canary", "true")]
            .into_iter()
            .map(|(k, v)| Label::new("k8s", k, v))
            .collect();
        assert!(r[0].endpoint_selector.matches(&pod));
    }

    #[test]
    fn empty_ingress_list_does_not_apply() {
        let r = parse_policy_file("f", r#"[{"endpointSelector":{},"ingress":[]}]"#).unwrap();
        assert!(!r[0].applies(Direction::Ingress));
    }

    #[test]
    fn error_table() {
        let cases = [
            (
                r#"[{"endpointSelector":{},"enableDefaultDeny":{"ingres":false}}]"#,
                r#"rule 0: enableDefaultDeny.ingres: unknown field "ingres""#,
            ),
            (
                r#"[{"endpointSelector":{"matchLabels":{"":"x"}}}]"#,
                "endpointSelector.matchLabels.: empty label key",
            ),
            (
                r#"[{"endpointSelector":{},"ingress":[{"fromCIDR":"10.0.0.0/8"}]}]"#,
                "ingress[0].fromCIDR: expected a list, got a string",
            ),
            (
                r#"[{"endpointSelector":{},"ingress":[{"toPorts":[{"ports":[{"port":"53","protocol":"ICMP"}]}]}]}]"#,
                r#"not supported yet: protocol "ICMP""#,
            ),
            (
                r#"[{"endpointSelector":{},"ingress":[{"toPorts":[{"ports":[{"port":"53","protocol":"TCPX"}]}]}]}]"#,
                r#"unknown protocol "TCPX""#,
            ),
            (
                r#"[{"endpointSelector":{},"ingress":[{"toPorts":[{"ports":[{"endPort":90}]}]}]}]"#,
                "endPort: endPort needs a port",
            ),
            (
                r#"[{"endpointSelector":{"matchExpressions":[{"key":"a","operator":"Exists","values":["x"]}]}}]"#,
                "operator Exists takes no values",
            ),
            (
                r#"[{"endpointSelector":{"matchExpressions":[{"key":"a","operator":"In"}]}}]"#,
                "operator In needs at least one value",
            ),
            (
                r#"[{"endpointSelector":{},"nodeSelector":{}}]"#,
                r#"nodeSelector: not supported yet: field "nodeSelector""#,
            ),
            (r#"{"kind":"List"}"#, "items: a List needs an items array"),
            ("42", "expected a rule list, a policy object or a List"),
            ("[]", "no policy rules in file"),
            ("a: [b", "invalid YAML"),
        ];
        for (text, want) in cases {
            let got = err(text);
            assert!(got.contains(want), "{text}\n  got:  {got}\n  want: {want}");
            assert!(got.starts_with("f: "), "{got}");
        }
    }

    #[test]
    fn list_of_network_policies() {
        let text = "kind: NetworkPolicyList\napiVersion: networking.k8s.io/v1\nitems:\n- apiVersion: networking.k8s.io/v1\n  kind: NetworkPolicy\n  metadata: {name: a}\n  spec: {podSelector: {}}\n- apiVersion: networking.k8s.io/v1\n  kind: NetworkPolicy\n  metadata: {name: b}\n  spec: {podSelector: {}, egress: [{to: [{ipBlock: {cidr: 10.0.0.0/33}}]}]}\n";
        let e = err(text);
        assert!(e.contains(r#"item 1, NetworkPolicy "default/b": spec.egress[0].to[0].ipBlock.cidr: "10.0.0.0/33" is not a CIDR"#), "{e}");
    }
}
