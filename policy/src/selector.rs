//! Label selectors (matchLabels + matchExpressions) over source-prefixed labels.
//!
//! A selector is kept in a canonical form (sorted requirements, sorted value sets) so that
//! equal selectors written differently share one selector-cache entry.

use crate::labels::{LabelSet, source};
use crate::sorted::Set;
use serde::{Deserialize, Serialize};
use std::fmt;

/// A selector operator with its values.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Operator {
    /// Some label with the key has one of the values.
    In(Set<String>),
    /// No label with the key has any of the values (an absent key matches, as in Kubernetes).
    NotIn(Set<String>),
    /// Some label has the key.
    Exists,
    /// No label has the key.
    DoesNotExist,
}

/// One requirement on one key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Requirement {
    /// Label source, or `any` to match every source.
    pub source: String,
    /// Label key.
    pub key: String,
    /// What must hold.
    pub op: Operator,
}

impl Requirement {
    /// Builds a requirement from a selector key such as `app`, `k8s:app` or `any:app`.
    #[must_use]
    pub fn new(selector_key: &str, op: Operator) -> Self {
        let (source, key) = split_key(selector_key);
        Self {
            source: source.to_owned(),
            key: key.to_owned(),
            op,
        }
    }

    fn matches(&self, labels: &LabelSet) -> bool {
        let mut values = labels.values_of(&self.source, &self.key);
        match &self.op {
            Operator::In(set) => values.any(|v| set.contains(v)),
            Operator::NotIn(set) => values.all(|v| !set.contains(v)),
            Operator::Exists => values.next().is_some(),
            Operator::DoesNotExist => values.next().is_none(),
        }
    }
}

/// Splits `src:key` into source and key; no source means any source (Cilium selectors).
#[must_use]
pub fn split_key(selector_key: &str) -> (&str, &str) {
    match selector_key.split_once(':') {
        Some((src, key)) if !src.is_empty() => (src, key),
        _ => (source::ANY, selector_key),
    }
}

/// An endpoint selector. No requirements (`{}`) selects every endpoint.
///
/// The requirements are a [`Set`] (a sorted vector without duplicates, not a `BTreeSet`: a
/// selector holds one or two); order, equality and hash are a `BTreeSet`'s.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Selector {
    requirements: Set<Requirement>,
}

impl Selector {
    /// The selector that matches every endpoint.
    #[must_use]
    pub fn all() -> Self {
        Self::default()
    }

    /// Builds a selector from requirements.
    #[must_use]
    pub fn from_requirements(reqs: impl IntoIterator<Item = Requirement>) -> Self {
        Self {
            requirements: reqs.into_iter().collect(),
        }
    }

    /// Adds `key in (value)`, the matchLabels form.
    pub fn add_match(&mut self, selector_key: &str, value: &str) {
        self.add(Requirement::new(
            selector_key,
            Operator::In(Set::from([value.to_owned()])),
        ));
    }

    /// Adds any requirement.
    pub fn add(&mut self, req: Requirement) {
        self.requirements.insert(req);
    }

    /// The requirements, sorted.
    pub fn requirements(&self) -> impl Iterator<Item = &Requirement> {
        self.requirements.iter()
    }

    /// True for `{}`.
    #[must_use]
    pub fn is_wildcard(&self) -> bool {
        self.requirements.is_empty()
    }

    /// True when some requirement is on this key (any source given as `any` matches all).
    #[must_use]
    pub fn has_key(&self, key: &str) -> bool {
        self.requirements.iter().any(|r| r.key == key)
    }

    /// True when some requirement's key starts with `prefix`.
    #[must_use]
    pub fn has_key_prefix(&self, prefix: &str) -> bool {
        self.requirements.iter().any(|r| r.key.starts_with(prefix))
    }

    /// True when some requirement names the `reserved` source (such selectors are never
    /// namespaced, as in Cilium).
    #[must_use]
    pub fn mentions_reserved(&self) -> bool {
        self.requirements
            .iter()
            .any(|r| r.source == source::RESERVED)
    }

    /// True when every requirement holds for `labels`.
    #[must_use]
    pub fn matches(&self, labels: &LabelSet) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.requirements.is_empty() {
            return f.write_str("{}");
        }
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            let key = format!("{}:{}", r.source, r.key);
            match &r.op {
                Operator::In(v) if v.len() == 1 => {
                    write!(f, "{key}={}", v.iter().next().map_or("", String::as_str))?;
                }
                Operator::In(v) => write!(f, "{key} in ({})", join(v))?,
                Operator::NotIn(v) => write!(f, "{key} notin ({})", join(v))?,
                Operator::Exists => write!(f, "{key}")?,
                Operator::DoesNotExist => write!(f, "!{key}")?,
            }
        }
        Ok(())
    }
}

fn join(v: &Set<String>) -> String {
    v.iter().map(String::as_str).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labels::Label;
    use std::collections::BTreeSet;

    fn set(v: &[&str]) -> Set<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    fn labels(v: &[&str]) -> LabelSet {
        v.iter()
            .map(|s| Label::parse_with_source(s, "k8s").unwrap())
            .collect()
    }

    #[test]
    fn operators_table() {
        let web = labels(&["app=web", "tier=front"]);
        let db = labels(&["app=db"]);
        let cases: Vec<(Requirement, bool, bool)> = vec![
            (
                Requirement::new("app", Operator::In(set(&["web", "x"]))),
                true,
                false,
            ),
            (
                Requirement::new("app", Operator::NotIn(set(&["web"]))),
                false,
                true,
            ),
            (
                Requirement::new("tier", Operator::NotIn(set(&["front"]))),
                false,
                true,
            ),
            (Requirement::new("tier", Operator::Exists), true, false),
            (
                Requirement::new("tier", Operator::DoesNotExist),
                false,
                true,
            ),
            (
                Requirement::new("k8s:app", Operator::In(set(&["db"]))),
                false,
                true,
            ),
            (
                Requirement::new("any:app", Operator::In(set(&["db"]))),
                false,
                true,
            ),
            (
                Requirement::new("unspec:app", Operator::In(set(&["db"]))),
                false,
                false,
            ),
        ];
        for (req, on_web, on_db) in cases {
            let s = Selector::from_requirements([req.clone()]);
            assert_eq!(s.matches(&web), on_web, "{s} on web");
            assert_eq!(s.matches(&db), on_db, "{s} on db");
        }
    }

    #[test]
    fn empty_selects_all_and_canonical_form() {
        assert!(Selector::all().matches(&labels(&["a=b"])));
        let mut a = Selector::all();
        a.add_match("x", "1");
        a.add_match("y", "2");
        let mut b = Selector::all();
        b.add_match("y", "2");
        b.add_match("x", "1");
        assert_eq!(a, b);
        assert_eq!(a.to_string(), "any:x=1,any:y=2");
    }

    proptest::proptest! {
        /// The sorted vector of requirements orders, compares, hashes and serializes as the
        /// `BTreeSet` it replaced, whatever order they were added in.
        #[test]
        fn a_selector_is_its_btree_set_in_order_equality_hash_and_form(
            a in proptest::collection::vec((0..3u8, 0..3u8), 0..5),
            b in proptest::collection::vec((0..3u8, 0..3u8), 0..5),
        ) {
            let reqs = |v: &[(u8, u8)]| -> Vec<Requirement> {
                v.iter()
                    .map(|(k, x)| {
                        let op = if *x == 0 { Operator::Exists } else { Operator::In(set(&[&format!("v{x}")])) };
                        Requirement::new(&format!("k{k}"), op)
                    })
                    .collect()
            };
            let (ra, rb) = (reqs(&a), reqs(&b));
            let mut one_by_one = Selector::all();
            for r in ra.iter().rev() {
                one_by_one.add(r.clone());
            }
            let sa = Selector::from_requirements(ra.clone());
            let sb = Selector::from_requirements(rb.clone());
            proptest::prop_assert_eq!(&one_by_one, &sa);
            let (ta, tb): (BTreeSet<Requirement>, BTreeSet<Requirement>) =
                (ra.into_iter().collect(), rb.into_iter().collect());
            proptest::prop_assert!(sa.requirements().eq(ta.iter()));
            proptest::prop_assert_eq!(sa.cmp(&sb), ta.cmp(&tb));
            proptest::prop_assert_eq!(crate::rule::hash_of(&sa), crate::rule::hash_of(&ta));
            let json = serde_json::to_string(&sa).unwrap();
            proptest::prop_assert_eq!(&json, &serde_json::to_string(&ta).unwrap());
            proptest::prop_assert_eq!(serde_json::from_str::<Selector>(&json).unwrap(), sa);
        }
    }
}
