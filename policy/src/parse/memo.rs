//! Re-import without re-parsing: a cluster re-applies the same 1000-rule file with one rule
//! edited, and parsing every rule again costs far more than applying the one change. A JSON rule
//! list is split into its elements' texts; an element whose exact text was parsed before is
//! not parsed again but named by the content hash of the rule it gave ([`Piece::Known`]), which
//! the repository resolves to its identical rule ([`crate::repository::Incoming`]). Anything
//! unusual (YAML, objects, errors) takes the full parser, so results and error messages are
//! exactly [`super::parse_policy_file`]'s.

use super::{ParseError, cilium, parse_policy_file, walk};
use crate::repository::{Incoming, Repository};
use crate::rule::{Rule, hash_of};
use std::collections::HashMap;

/// One element of an imported rule list.
#[derive(Debug)]
pub enum Piece<'a> {
    /// Parsed now.
    Parsed(Rule),
    /// Parsed before to a rule with this [`Rule::content_hash`]; `text` is the element, for
    /// the rare case the repository no longer holds that rule.
    Known {
        /// Content hash of the rule.
        rule: u64,
        /// The element's JSON text.
        text: &'a str,
    },
}

/// Element text hash → content hash of the rule it parses to. Each entry is a fact about the
/// parser, never stale; the table is bounded by clearing it when it outgrows the last files.
#[derive(Debug, Default)]
pub struct ParseMemo {
    by_text: HashMap<u64, u64>,
}

/// Nesting deeper than this takes the full parser: `serde_json`'s recursion limit counts the
/// enclosing array, so an element alone could parse where the file does not.
const MAX_DEPTH: usize = 100;

impl ParseMemo {
    /// An empty memo.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses `text` as [`parse_policy_file`] does (same rules, same order, same errors), with
    /// elements seen before as [`Piece::Known`].
    pub fn parse<'a>(&mut self, file: &str, text: &'a str) -> Result<Vec<Piece<'a>>, ParseError> {
        let full = || {
            parse_policy_file(file, text)
                .map(|rules| rules.into_iter().map(Piece::Parsed).collect())
        };
        let Some(elements) = json_array_elements(text) else {
            return full();
        };
        if self.by_text.len() > 4 * elements.len() + 4096 {
            self.by_text.clear();
        }
        let mut out = Vec::with_capacity(elements.len());
        for element in elements {
            let h = hash_of(element);
            if let Some(&rule) = self.by_text.get(&h) {
                out.push(Piece::Known {
                    rule,
                    text: element,
                });
                continue;
            }
            // An error is reported by the full parser, with the rule's location and path.
            let Ok(rule) = parse_element(element) else {
                return full();
            };
            self.by_text.insert(h, rule.content_hash());
            out.push(Piece::Parsed(rule));
        }
        Ok(out)
    }
}

/// Turns pieces into rules for [`Repository::add_reusing`]: a known rule is named by its
/// position in `repo`; one the repository no longer holds (deleted since) is parsed again.
pub fn incoming(pieces: Vec<Piece<'_>>, repo: &Repository) -> Result<Vec<Incoming>, String> {
    let known = pieces.iter().any(|p| matches!(p, Piece::Known { .. }));
    let positions = if known {
        repo.positions_by_hash()
    } else {
        HashMap::new()
    };
    pieces
        .into_iter()
        .map(|p| match p {
            Piece::Parsed(r) => Ok(Incoming::New(r)),
            Piece::Known { rule, text } => match positions.get(&rule) {
                Some(&i) => Ok(Incoming::Existing(i)),
                None => parse_element(text).map(Incoming::New),
            },
        })
        .collect()
}

/// Parses one element of a JSON rule list, as the full parser does inside the list.
pub fn parse_element(text: &str) -> Result<Rule, String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    walk::without_paths(|| cilium::parse_rule(&v, ""))
        .map_err(|e| format!("{}: {}", e.path, e.message))
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while matches!(b.get(i), Some(b' ' | b'\n' | b'\t' | b'\r')) {
        i += 1;
    }
    i
}

/// End of the string starting at `b[i] == '"'`: the index after its closing quote.
fn string_end(b: &[u8], mut i: usize) -> Option<usize> {
    i += 1;
    loop {
        i += memchr::memchr2(b'"', b'\\', b.get(i..)?)?;
        match b.get(i)? {
            b'"' => return Some(i + 1),
            _ => i += 2,
        }
    }
}

/// End of the value starting at `b[i]`: strings and brackets are matched (string-aware);
/// scalars run to the next separator. Validation is left to `serde_json`: an element is parsed
/// alone, or is byte for byte an element that parsed before.
fn value_end(b: &[u8], mut i: usize) -> Option<usize> {
    match b.get(i)? {
        b'"' => string_end(b, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            loop {
                // Most bytes are none of these: skip them without the per-byte match.
                i += b
                    .get(i..)?
                    .iter()
                    .position(|c| matches!(c, b'"' | b'{' | b'[' | b'}' | b']'))?;
                match b.get(i)? {
                    b'"' => {
                        i = string_end(b, i)?;
                        continue;
                    }
                    b'{' | b'[' => {
                        depth += 1;
                        if depth > MAX_DEPTH {
                            return None;
                        }
                    }
                    _ => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                }
                i += 1;
            }
        }
        _ => {
            while !matches!(
                b.get(i),
                None | Some(b',' | b']' | b' ' | b'\n' | b'\t' | b'\r')
            ) {
                i += 1;
            }
            Some(i)
        }
    }
}

/// The texts of a top-level JSON array's elements, or `None` when `text` is not a non-empty
/// array separated the JSON way (then the full parser decides what it is). Splitting only
/// partitions the text: if every element is valid JSON, so is the whole.
#[must_use]
pub fn json_array_elements(text: &str) -> Option<Vec<&str>> {
    let b = text.as_bytes();
    let mut i = skip_ws(b, 0);
    if b.get(i) != Some(&b'[') {
        return None;
    }
    i = skip_ws(b, i + 1);
    if b.get(i) == Some(&b']') {
        return None;
    }
    let mut out = Vec::new();
    loop {
        let end = value_end(b, i)?;
        if end == i {
            return None;
        }
        out.push(text.get(i..end)?);
        i = skip_ws(b, end);
        match b.get(i)? {
            b',' => i = skip_ws(b, i + 1),
            b']' => break,
            _ => return None,
        }
    }
    (skip_ws(b, i + 1) == b.len()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(name: &str, port: u16) -> String {
        format!(
            r#"{{"labels":[{{"key":"name","value":"{name}"}}],"description":"x\"],{{","endpointSelector":{{"matchLabels":{{"app":"a"}}}},
               "ingress":[{{"fromEndpoints":[{{"matchLabels":{{"app":"b"}}}}],"toPorts":[{{"ports":[{{"port":"{port}","protocol":"TCP"}}]}}]}}]}}"#
        )
    }

    fn resolve(pieces: Vec<Piece<'_>>, rules: &[Rule]) -> Vec<Rule> {
        pieces
            .into_iter()
            .map(|p| match p {
                Piece::Parsed(r) => r,
                Piece::Known { rule, .. } => rules
                    .iter()
                    .find(|r| r.content_hash() == rule)
                    .cloned()
                    .expect("known rule"),
            })
            .collect()
    }

    #[test]
    fn splits_arrays_and_leaves_the_rest_to_the_full_parser() {
        assert_eq!(
            json_array_elements(" [ {\"a\": \"],\"} ,\n[1, 2],\"x\" , 3 ]\n"),
            Some(vec!["{\"a\": \"],\"}", "[1, 2]", "\"x\"", "3"])
        );
        for bad in [
            "[]",
            "{}",
            "[1,]",
            "[1 2]",
            "[1] x",
            "[{\"a\":1}",
            "---\n- a",
            "[1,,2]",
        ] {
            assert_eq!(json_array_elements(bad), None, "{bad}");
        }
    }

    #[test]
    fn memoized_parse_equals_the_full_parse_and_its_errors() {
        let mut memo = ParseMemo::new();
        let first = format!("[{},{}]", rule("a", 80), rule("b", 81));
        let pieces = memo.parse("f", &first).unwrap();
        assert!(pieces.iter().all(|p| matches!(p, Piece::Parsed(_))));
        let rules = resolve(pieces, &[]);
        assert_eq!(rules, parse_policy_file("f", &first).unwrap());

        let second = format!("[\n{} , {}]", rule("a", 80), rule("b", 82));
        let pieces = memo.parse("f", &second).unwrap();
        assert!(matches!(pieces[0], Piece::Known { .. }));
        assert!(matches!(pieces[1], Piece::Parsed(_)));
        assert_eq!(
            resolve(pieces, &rules),
            parse_policy_file("f", &second).unwrap()
        );

        let broken = format!("[{},{{\"endpointSelector\":3}}]", rule("a", 80));
        assert_eq!(
            memo.parse("f", &broken).unwrap_err(),
            parse_policy_file("f", &broken).unwrap_err()
        );
        let yaml = "- endpointSelector: {}\n  ingress: [{}]\n";
        assert_eq!(
            resolve(memo.parse("f", yaml).unwrap(), &[]),
            parse_policy_file("f", yaml).unwrap()
        );
    }

    #[test]
    fn too_deep_elements_take_the_full_parser() {
        let deep = format!("[{}1{}]", "[".repeat(127), "]".repeat(127));
        assert_eq!(json_array_elements(&deep), None);
    }
}
