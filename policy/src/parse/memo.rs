//! Re-import without re-parsing: a cluster re-applies the same 1000-rule file with one rule
//! edited, and parsing every rule again costs far more than applying the one change. A JSON rule
//! list is split into its elements' texts; an element whose exact text was parsed before is
//! not parsed again but named by the content hash of the rule it gave ([`Piece::Known`]), which
//! the repository resolves to its identical rule ([`crate::repository::Incoming`]). A YAML rule
//! list or `List` of policy objects is split the same way into its items
//! ([`super::yaml_items`]). Anything unusual (other shapes, an item giving other than one rule,
//! errors, warnings) takes the full parser, so results and error messages are exactly
//! [`super::parse_policy_file`]'s.

use super::yaml_items::{self, Shape};
use super::{Note, ParseError, cilium, parse_noted, parse_value, walk};
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
        /// The element's text.
        text: &'a str,
        /// How `text` is parsed alone.
        form: Form,
    },
}

/// What an element's text is, which says how it is parsed alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Form {
    /// An element of a JSON rule list.
    Json,
    /// An item (`- ...`) of a YAML rule list.
    YamlRule,
    /// An item (`- ...`) of a YAML `List`'s `items`: a policy object giving one rule.
    YamlListItem,
}

/// Element text hash → content hash of the rule it parses to. Each entry is a fact about the
/// parser, never stale; the table is bounded by clearing it when it outgrows the last files.
#[derive(Debug, Default)]
pub struct ParseMemo {
    by_text: HashMap<u64, u64>,
    /// The last rule list split: a re-applied file differs from it in a few bytes, so only the
    /// elements between their common prefix and suffix are split and hashed again.
    last: Option<LastFile>,
    /// The warnings of the last [`Self::parse`].
    notes: Vec<Note>,
}

/// A split rule list: its text and its elements as (start, end, text hash).
#[derive(Debug, Default)]
struct LastFile {
    text: String,
    elements: Vec<Element>,
}

type Element = (usize, usize, u64);

/// Nesting deeper than this takes the full parser: `serde_json`'s recursion limit counts the
/// enclosing array, so an element alone could parse where the file does not.
const MAX_DEPTH: usize = 100;

impl ParseMemo {
    /// An empty memo.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses `text` as [`super::parse_policy_file`] does (same rules, same order, same errors), with
    /// elements seen before as [`Piece::Known`].
    /// Its warnings ([`super::parse_noted`]'s) are kept for [`Self::take_notes`]: an element
    /// that has any is never memoized, so they come back on every import.
    pub fn parse<'a>(&mut self, file: &str, text: &'a str) -> Result<Vec<Piece<'a>>, ParseError> {
        self.notes.clear();
        if let Some(elements) = split_reusing(text, self.last.as_ref()) {
            if let Some(pieces) = self.memoized(text, &elements, Form::Json) {
                // Into the same buffer: a fresh one would fault in the file's pages on every
                // import.
                let last = self.last.get_or_insert_with(LastFile::default);
                last.text.clear();
                last.text.push_str(text);
                last.elements = elements;
                return Ok(pieces);
            }
        } else if let Some(split) = yaml_items::split(text)
            && let Some(form) = yaml_form(&split)
        {
            let items: Vec<Element> = split
                .items
                .iter()
                .map(|&(start, end)| (start, end, hash_of(&(form, text.get(start..end)))))
                .collect();
            if let Some(pieces) = self.memoized(text, &items, form) {
                return Ok(pieces);
            }
        }
        parse_noted(file, text).map(|p| {
            self.notes = p.notes;
            p.rules.into_iter().map(Piece::Parsed).collect()
        })
    }

    /// The pieces of a split text, or `None` when an element new to the memo gives an error
    /// or a warning (the full parser reports it, with the rule's location and path).
    fn memoized<'a>(
        &mut self,
        text: &'a str,
        elements: &[Element],
        form: Form,
    ) -> Option<Vec<Piece<'a>>> {
        if self.by_text.len() > 4 * elements.len() + 4096 {
            self.by_text.clear();
        }
        let mut out = Vec::with_capacity(elements.len());
        for &(start, end, h) in elements {
            let element = text.get(start..end).unwrap_or_default();
            if let Some(&rule) = self.by_text.get(&h) {
                out.push(Piece::Known {
                    rule,
                    text: element,
                    form,
                });
                continue;
            }
            let (Ok(rule), notes) = walk::collecting_notes(false, || parse_alone(form, element))
            else {
                return None;
            };
            if !notes.is_empty() {
                return None;
            }
            self.by_text.insert(h, rule.content_hash());
            out.push(Piece::Parsed(rule));
        }
        Some(out)
    }

    /// The warnings of the last [`Self::parse`] (e.g. CIDRs with host bits set, masked).
    pub fn take_notes(&mut self) -> Vec<Note> {
        std::mem::take(&mut self.notes)
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
            Piece::Known { rule, text, form } => match positions.get(&rule) {
                Some(&i) => Ok(Incoming::Existing(i)),
                None => parse_alone(form, text).map(Incoming::New),
            },
        })
        .collect()
}

/// Parses one element alone, as the full parser does in its file.
fn parse_alone(form: Form, text: &str) -> Result<Rule, String> {
    let v = match form {
        Form::Json => serde_json::from_str(text).map_err(|e| e.to_string())?,
        Form::YamlRule | Form::YamlListItem => yaml_item(text)?,
    };
    if form == Form::YamlListItem {
        let mut rules = Vec::new();
        walk::without_paths(|| parse_value(&v, "", &mut rules))
            .map_err(|(_, e)| format!("{}: {}", e.path, e.message))?;
        let [rule] = <[Rule; 1]>::try_from(rules)
            .map_err(|r| format!("the object gives {} rules, not one", r.len()))?;
        return Ok(rule);
    }
    walk::without_paths(|| cilium::parse_rule(&v, ""))
        .map_err(|e| format!("{}: {}", e.path, e.message))
}

/// The value of a YAML item's text (`- ...`): a sequence of that one value.
fn yaml_item(text: &str) -> Result<serde_json::Value, String> {
    match serde_yaml::from_str(text).map_err(|e| e.to_string())? {
        serde_json::Value::Array(items) => <[serde_json::Value; 1]>::try_from(items)
            .map(|[v]| v)
            .map_err(|items| format!("{} values, not one item", items.len())),
        _ => Err("not a sequence item".into()),
    }
}

/// How a split YAML file's items are parsed: a `List`'s only when its text before the items
/// says `kind: List` (or `...List`), as the full parser requires.
fn yaml_form(split: &yaml_items::Split<'_>) -> Option<Form> {
    match split.shape {
        Shape::Rules => Some(Form::YamlRule),
        Shape::List => {
            let header: serde_json::Value = serde_yaml::from_str(split.header).ok()?;
            let kind = header.get("kind")?.as_str()?;
            (kind == "List" || kind.ends_with("List")).then_some(Form::YamlListItem)
        }
    }
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
    split_reusing(text, None)?
        .into_iter()
        .map(|(start, end, _)| text.get(start..end))
        .collect()
}

/// [`json_array_elements`] as (start, end, text hash), taking from `last` the elements in the
/// prefix and suffix `text` shares with it. The split is a left-to-right scan whose state at
/// an element's start is only "an element starts here": an element that ends before the
/// common prefix does is found at the same place, and once the scan reaches the start of an
/// element of `last` inside the common suffix, the rest is `last`'s rest, shifted.
fn split_reusing(text: &str, last: Option<&LastFile>) -> Option<Vec<Element>> {
    let b = text.as_bytes();
    let mut i = skip_ws(b, 0);
    if b.get(i) != Some(&b'[') {
        return None;
    }
    i = skip_ws(b, i + 1);
    if b.get(i) == Some(&b']') {
        return None;
    }
    let (mut out, tail) = match last {
        Some(last) => reused(b, last),
        None => (Vec::new(), Tail::default()),
    };
    if let Some(&(_, end, _)) = out.last() {
        i = skip_ws(b, end);
        match b.get(i)? {
            b',' => i = skip_ws(b, i + 1),
            b']' => return (skip_ws(b, i + 1) == b.len()).then_some(out),
            _ => return None,
        }
    }
    loop {
        if let Some(rest) = tail.from(i) {
            out.extend(rest);
            return Some(out);
        }
        let end = value_end(b, i)?;
        if end == i {
            return None;
        }
        out.push((i, end, hash_of(text.get(i..end)?)));
        i = skip_ws(b, end);
        match b.get(i)? {
            b',' => i = skip_ws(b, i + 1),
            b']' => break,
            _ => return None,
        }
    }
    (skip_ws(b, i + 1) == b.len()).then_some(out)
}

/// The elements of the last file inside the suffix it shares with the new text.
#[derive(Default)]
struct Tail<'l> {
    elements: &'l [Element],
    /// Where the shared suffix starts in the new text.
    from: usize,
    /// New length minus old length.
    shift: isize,
}

impl Tail<'_> {
    /// The new text's elements from `i` on, when an element of the shared suffix starts there.
    fn from(&self, i: usize) -> Option<impl Iterator<Item = Element> + '_> {
        if i < self.from {
            return None;
        }
        let old = i.checked_add_signed(-self.shift)?;
        let k = self.elements.binary_search_by_key(&old, |e| e.0).ok()?;
        let shift = self.shift;
        Some(self.elements.get(k..)?.iter().map(move |&(s, e, h)| {
            (
                s.checked_add_signed(shift).unwrap_or(s),
                e.checked_add_signed(shift).unwrap_or(e),
                h,
            )
        }))
    }
}

/// Bytes compared at once (by `memcmp`) when looking for a shared prefix or suffix.
const CHUNK: usize = 256;

/// How many bytes two chunked texts share from their chunks' side: whole equal chunks, then
/// `within` the first chunks that differ.
fn common_len<'x>(
    a: impl Iterator<Item = &'x [u8]>,
    b: impl Iterator<Item = &'x [u8]>,
    within: impl Fn(&[u8], &[u8]) -> usize,
) -> usize {
    let mut n = 0;
    for (x, y) in a.zip(b) {
        if x == y {
            n += x.len();
        } else {
            return n + within(x, y);
        }
    }
    n
}

/// The elements of `last` that end inside the prefix it shares with `b` (a byte before the
/// prefix's end: a scalar ends where its separator is), and the ones inside the shared suffix.
fn reused<'l>(b: &[u8], last: &'l LastFile) -> (Vec<Element>, Tail<'l>) {
    let old = last.text.as_bytes();
    let prefix = common_len(b.chunks(CHUNK), old.chunks(CHUNK), |x, y| {
        x.iter().zip(y).take_while(|(x, y)| x == y).count()
    });
    let room = b.len().min(old.len()) - prefix;
    let suffix = common_len(b.rchunks(CHUNK), old.rchunks(CHUNK), |x, y| {
        x.iter()
            .rev()
            .zip(y.iter().rev())
            .take_while(|(x, y)| x == y)
            .count()
    })
    .min(room);
    let head = last.elements.partition_point(|e| e.1 < prefix);
    let first_tail = last
        .elements
        .partition_point(|e| e.0 < old.len() - suffix)
        .max(head);
    let shift = isize::try_from(b.len()).unwrap_or(isize::MAX)
        - isize::try_from(old.len()).unwrap_or(isize::MAX);
    (
        last.elements.get(..head).unwrap_or_default().to_vec(),
        Tail {
            elements: last.elements.get(first_tail..).unwrap_or_default(),
            from: b.len() - suffix,
            shift,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::parse_policy_file;

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

    fn yaml_rule(name: &str, port: u16) -> String {
        format!(
            "- labels:\n  - key: name\n    value: {name}\n  endpointSelector:\n    matchLabels: {{app: a}}\n  ingress:\n  - toPorts:\n    - ports:\n      - port: \"{port}\"\n        protocol: TCP\n"
        )
    }

    fn cnp(name: &str, port: u16) -> String {
        format!(
            "- apiVersion: cilium.io/v2\n  kind: CiliumNetworkPolicy\n  metadata: {{name: {name}, namespace: default}}\n  spec:\n    endpointSelector: {{}}\n    ingress:\n    - toPorts:\n      - ports:\n        - port: \"{port}\"\n"
        )
    }

    /// Imports `first`, then `second` (which edits its last element): the second import parses
    /// only that element, and both equal the full parse.
    fn reparses_only_the_edited_element(first: &str, second: &str, form: Form) {
        let mut memo = ParseMemo::new();
        let pieces = memo.parse("f", first).unwrap();
        assert!(pieces.iter().all(|p| matches!(p, Piece::Parsed(_))));
        let rules = resolve(pieces, &[]);
        assert_eq!(rules, parse_policy_file("f", first).unwrap());
        let pieces = memo.parse("f", second).unwrap();
        let (last, rest) = pieces.split_last().unwrap();
        assert!(matches!(last, Piece::Parsed(_)));
        assert!(
            rest.iter()
                .all(|p| matches!(p, Piece::Known { form: f, .. } if *f == form)),
            "{rest:?}"
        );
        assert_eq!(
            resolve(pieces, &rules),
            parse_policy_file("f", second).unwrap()
        );
    }

    #[test]
    fn a_yaml_rule_list_is_memoized_by_item() {
        let file = |port| format!("# rules\n{}{}", yaml_rule("a", 80), yaml_rule("b", port));
        reparses_only_the_edited_element(&file(81), &file(82), Form::YamlRule);
    }

    #[test]
    fn a_yaml_list_of_policy_objects_is_memoized_by_item() {
        let file = |port| {
            format!(
                "apiVersion: v1\nkind: List\nitems:\n{}{}",
                cnp("a", 80),
                cnp("b", port)
            )
        };
        reparses_only_the_edited_element(&file(81), &file(82), Form::YamlListItem);
    }

    #[test]
    fn yaml_errors_warnings_and_aliases_take_the_full_parser() {
        let mut memo = ParseMemo::new();
        let good = format!("{}{}", yaml_rule("a", 80), yaml_rule("b", 81));
        memo.parse("f", &good).unwrap();
        for text in [
            format!("{}- endpointSelector: 3\n", yaml_rule("a", 80)),
            format!(
                "{}- endpointSelector: {{}}\n  egress: [{{toCIDR: [10.0.0.1/8]}}]\n",
                yaml_rule("a", 80)
            ),
            format!(
                "{}- &x {{endpointSelector: {{}}}}\n- *x\n",
                yaml_rule("a", 80)
            ),
            format!("kind: NotAList\nitems:\n{}", cnp("a", 80)),
        ] {
            let want = crate::parse::parse_noted("f", &text);
            let got = memo.parse("f", &text);
            match (&want, &got) {
                (Ok(want), Ok(got)) => {
                    assert!(got.iter().all(|p| matches!(p, Piece::Parsed(_))), "{text}");
                    assert_eq!(want.notes, memo.take_notes(), "{text}");
                }
                (Err(w), Err(g)) => assert_eq!(w, g, "{text}"),
                _ => panic!("{text}: full {want:?}, memo {got:?}"),
            }
        }
    }

    #[test]
    fn warnings_come_back_on_every_import() {
        let mut memo = ParseMemo::new();
        let text = format!(
            r#"[{},{{"endpointSelector":{{}},"egress":[{{"toCIDR":["10.0.0.1/8"]}}]}}]"#,
            rule("a", 80)
        );
        for _ in 0..2 {
            let pieces = memo.parse("f", &text).unwrap();
            assert_eq!(pieces.len(), 2);
            let notes = memo.take_notes();
            assert_eq!(notes.len(), 1, "{notes:?}");
            assert!(
                notes[0]
                    .to_string()
                    .starts_with("rule 1: egress[0].toCIDR[0]: ")
            );
        }
        memo.parse("f", &format!("[{}]", rule("a", 80))).unwrap();
        assert!(memo.take_notes().is_empty());
    }

    #[test]
    fn too_deep_elements_take_the_full_parser() {
        let deep = format!("[{}1{}]", "[".repeat(127), "]".repeat(127));
        assert_eq!(json_array_elements(&deep), None);
    }

    /// What [`ParseMemo::parse`] keeps of a text it split.
    fn last_of(text: &str) -> Option<LastFile> {
        Some(LastFile {
            text: text.into(),
            elements: split_reusing(text, None)?,
        })
    }

    #[test]
    fn reusing_the_last_split_changes_nothing_on_the_edge_cases() {
        let cases = [
            ("[1,2,3]", "[1,2,3]"),
            ("[1,2,3]", "[1,2,34]"),
            ("[1,2,3]", "[12,2,3]"),
            ("[1,2,3]", "[1,2 ,3]"),
            ("[1,2,3]", "[1,2]"),
            ("[1,2,3]", "[1,2,3,4]"),
            ("[\"a\",\"b\"]", "[\"a\",\"b\",\"a\",\"b\"]"),
            ("[{\"a\":[1]},{\"b\":2}]", "[{\"a\":[1]}]"),
            (
                "[{\"a\":[1]},{\"b\":2}]",
                "[{\"a\":[1],\"c\":{}},{\"b\":2}]",
            ),
            ("[1,2,3]", "[1,2,3] x"),
            ("[1,2,3]", "[1,2,3"),
        ];
        for (old, new) in cases {
            let last = last_of(old).unwrap();
            assert_eq!(
                split_reusing(new, Some(&last)),
                split_reusing(new, None),
                "{old} -> {new}"
            );
        }
    }

    #[test]
    fn reusing_the_last_split_of_long_texts_equals_splitting_again() {
        let file = |edit: usize, with: &str| {
            let els: Vec<String> = (0..600)
                .map(|i| {
                    if i == edit {
                        with.to_string()
                    } else {
                        format!(r#"{{"rule":"r{i}","ports":[{}]}}"#, i % 7)
                    }
                })
                .collect();
            format!("[\n{}\n]", els.join(",\n"))
        };
        let last = last_of(&file(usize::MAX, "")).unwrap();
        for edit in [0, 1, 57, 300, 598, 599] {
            for with in ["1", r#"{"rule":"x"}"#, r#"{"rule":"r0","ports":[0]} , 5"#] {
                let new = file(edit, with);
                let reused = split_reusing(&new, Some(&last));
                assert_eq!(reused, split_reusing(&new, None), "edit {edit} {with}");
                assert!(reused.is_some());
            }
        }
    }

    fn element() -> impl proptest::strategy::Strategy<Value = String> {
        proptest::prop_oneof![
            proptest::string::string_regex("[0-9a-z]{1,3}").unwrap(),
            proptest::string::string_regex(r#""[a-z,\]]{0,3}""#).unwrap(),
            proptest::string::string_regex(r#"\{"k":\[[0-9]{1,2}\]\}"#).unwrap(),
        ]
    }

    proptest::proptest! {
        #[test]
        fn reusing_the_last_split_equals_splitting_again(
            elements in proptest::collection::vec(element(), 1..8),
            at in 0usize..64,
            cut in 0usize..6,
            insert in r#"[\[\]{}",: a-z0-9]{0,6}"#,
        ) {
            let old = format!("[{}]", elements.join(","));
            let at = at.min(old.len());
            let end = (at + cut).min(old.len());
            let new = format!(
                "{}{}{}",
                old.get(..at).unwrap_or_default(),
                insert,
                old.get(end..).unwrap_or_default()
            );
            if let Some(last) = last_of(&old) {
                proptest::prop_assert_eq!(split_reusing(&new, Some(&last)), split_reusing(&new, None));
            }
        }
    }
}
