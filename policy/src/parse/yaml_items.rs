//! The top-level items of a YAML policy file, found without parsing it, for the parse memo
//! ([`super::memo`]): a file re-applied with one rule edited is split into its items' texts,
//! and only the items whose text is new are parsed.
//!
//! Two shapes are split, each a block sequence at column 0: a Cilium rule list (`- ...` items)
//! and a `List` object whose `items:` key, at column 0, holds the sequence (as kubectl's
//! `get -o yaml` and Python's yaml module write it). An item runs from its `- ` line to the
//! next one. A cut at a column-0 `- ` line is where YAML starts the next item unless the line
//! sits inside a multi-line quoted scalar or flow collection, and then the item before it is
//! unterminated: it does not parse alone, so it is never memoized and the memo falls back to
//! the full parser.
//! What YAML could make depend on another item (anchors and aliases, tags, directives, several
//! documents) is not split at all: such a file takes the full parser.

/// What a split file's items are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// The file is a block sequence of Cilium rules.
    Rules,
    /// The file is a `List` object; its `items` are policy objects (or Cilium rules).
    List,
}

/// A split YAML file.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Split<'a> {
    pub(crate) shape: Shape,
    /// For [`Shape::List`]: the text before the items, ending with the `items:` line.
    pub(crate) header: &'a str,
    /// Each item's (start, end) in the text.
    pub(crate) items: Vec<(usize, usize)>,
}

/// A line that starts an item of a column-0 block sequence.
fn starts_item(line: &str) -> bool {
    line == "-" || line.starts_with("- ")
}

/// Blank, or a comment.
fn is_filler(line: &str) -> bool {
    let t = line.trim_start_matches([' ', '\t']);
    t.is_empty() || t.starts_with('#')
}

/// `items:` at column 0, possibly with trailing blanks or a comment.
fn is_items_key(line: &str) -> bool {
    line.strip_prefix("items:")
        .is_some_and(|rest| is_filler(rest) && (rest.is_empty() || rest.starts_with([' ', '\t'])))
}

/// The file's items, or `None` when it is not one of the two shapes (or uses what YAML could
/// make depend on another item): the full parser then decides what it is.
pub(crate) fn split(text: &str) -> Option<Split<'_>> {
    if text.contains(['&', '*', '!']) {
        return None;
    }
    let mut items: Vec<(usize, usize)> = Vec::new();
    let mut header_end = None;
    let mut shape = None;
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        let start = at;
        at += line.len();
        let line = line.trim_end_matches(['\n', '\r']);
        if line.starts_with(['%', '\t']) || line.starts_with("---") || line.starts_with("...") {
            return None;
        }
        if line.starts_with(' ') || is_filler(line) {
            continue;
        }
        match shape {
            None if starts_item(line) => shape = Some(Shape::Rules),
            None => shape = Some(Shape::List),
            Some(_) => {}
        }
        if starts_item(line) {
            if shape == Some(Shape::List) && header_end.is_none() {
                return None;
            }
            if let Some(last) = items.last_mut() {
                last.1 = start;
            }
            items.push((start, text.len()));
        } else if shape == Some(Shape::List) && header_end.is_none() {
            if is_items_key(line) {
                header_end = Some(at);
            }
        } else {
            // A column-0 key after the items (or in a rule list): the full parser.
            return None;
        }
    }
    let shape = shape?;
    if items.is_empty() {
        return None;
    }
    let header = match shape {
        Shape::Rules => "",
        Shape::List => text.get(..header_end?)?,
    };
    Some(Split {
        shape,
        header,
        items,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(text: &str) -> Option<(Shape, &str, Vec<&str>)> {
        let s = split(text)?;
        let items = s.items.iter().map(|&(a, b)| &text[a..b]).collect();
        Some((s.shape, s.header, items))
    }

    #[test]
    fn a_rule_list_splits_at_its_column_0_items() {
        let text =
            "# rules\n- a: 1\n  b: [x,\n    y]\n\n# two\n- c: |\n    - not an item\n-\n- d\n";
        assert_eq!(
            texts(text),
            Some((
                Shape::Rules,
                "",
                vec![
                    "- a: 1\n  b: [x,\n    y]\n\n# two\n",
                    "- c: |\n    - not an item\n",
                    "-\n",
                    "- d\n"
                ]
            ))
        );
    }

    #[test]
    fn a_list_splits_after_its_items_key() {
        let text = "apiVersion: v1\nkind: List\nmetadata: {}\nitems:  # the policies\n- kind: NetworkPolicy\n  x: 1\n- kind: NetworkPolicy\n";
        assert_eq!(
            texts(text),
            Some((
                Shape::List,
                "apiVersion: v1\nkind: List\nmetadata: {}\nitems:  # the policies\n",
                vec!["- kind: NetworkPolicy\n  x: 1\n", "- kind: NetworkPolicy\n"]
            ))
        );
    }

    #[test]
    fn what_could_tie_items_together_or_is_another_shape_is_not_split() {
        for text in [
            "- &a {x: 1}\n- *a\n",
            "- !!str x\n",
            "%YAML 1.2\n---\n- a\n",
            "---\n- a\n",
            "- a\n---\n- b\n",
            "- a\n...\n",
            "- a\nkey: 1\n",
            "kind: List\nitems:\n  - a\n",
            "kind: List\n- a\n",
            "kind: List\nitems:\n- a\nmetadata: {}\n",
            "kind: List\nitems: []\n",
            "items:x\n- a\n",
            "[1, 2]\n",
            "{\"a\": 1}\n",
            "",
            "# nothing\n",
            "\t- a\n",
        ] {
            assert_eq!(split(text), None, "{text:?}");
        }
    }
}
