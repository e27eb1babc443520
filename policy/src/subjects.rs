//! Which rules select an endpoint, without matching every rule's endpoint selector: each rule
//! indexed under the labels one of its selector's `key In (values)` requirements needs. An
//! endpoint's candidates are the rules indexed under one of its labels plus those whose selector
//! has no `In` requirement; only the candidates' selectors are matched.
//!
//! The index is rebuilt with every change of the repository, from keys computed once per rule
//! ([`SubjectKeys`], kept beside the rule): a rebuild touches no selector.

use crate::labels::{LabelSet, keys};
use crate::selector::{Operator, Selector};
use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

/// The labels a rule is indexed under: [`label_key`] of each value of one `In` requirement of
/// its endpoint selector, or none (the rule is a candidate for every endpoint).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SubjectKeys(Option<Box<[u64]>>);

impl SubjectKeys {
    /// The keys of a rule with this endpoint selector. The `In` requirement with the fewest
    /// values is used, one on the namespace (shared by every rule of a namespace) last.
    pub(crate) fn of(selector: &Selector) -> Self {
        let narrowest = selector
            .requirements()
            .filter_map(|r| match &r.op {
                Operator::In(values) => Some((r.key.as_str(), values)),
                _ => None,
            })
            .min_by_key(|(key, values)| (*key == keys::POD_NAMESPACE, values.len()));
        Self(narrowest.map(|(key, values)| values.iter().map(|v| label_key(key, v)).collect()))
    }
}

/// The index of a repository's rules by endpoint selector. Derived from the rules' keys;
/// rebuilt with them ([`SubjectIndex::new`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SubjectIndex {
    /// Positions of the rules by [`label_key`] of a label their selector requires, ascending.
    by_label: HashMap<u64, Vec<usize>>,
    /// Positions of the rules whose selector has no `In` requirement, ascending.
    unindexed: Vec<usize>,
}

/// A label's key and value hashed: the index's key. Two labels may share it; a candidate's
/// selector is matched in full, so a collision only adds a candidate.
fn label_key(key: &str, value: &str) -> u64 {
    let mut h = DefaultHasher::new();
    key.hash(&mut h);
    value.hash(&mut h);
    h.finish()
}

impl SubjectIndex {
    /// The index of the rules with these keys, in the rules' order.
    pub(crate) fn new<'a>(rules: impl Iterator<Item = &'a SubjectKeys>) -> Self {
        let mut by_label: HashMap<u64, Vec<usize>> = HashMap::new();
        let mut unindexed = Vec::new();
        for (i, subject) in rules.enumerate() {
            match &subject.0 {
                Some(labels) => {
                    for &k in labels {
                        let bucket = by_label.entry(k).or_default();
                        // A selector's values are distinct, but their keys may collide.
                        if bucket.last() != Some(&i) {
                            bucket.push(i);
                        }
                    }
                }
                None => unindexed.push(i),
            }
        }
        Self {
            by_label,
            unindexed,
        }
    }

    /// Positions of the rules that may select an endpoint with these labels (a superset of
    /// those that do), ascending; the caller matches their selectors.
    pub(crate) fn candidates(&self, labels: &LabelSet) -> Vec<usize> {
        let mut out = self.unindexed.clone();
        for l in labels.iter() {
            if let Some(rules) = self.by_label.get(&label_key(&l.key, &l.value)) {
                out.extend(rules);
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labels::{Label, source};
    use crate::repository::Repository;
    use crate::rule::Rule;
    use crate::selector::Requirement;
    use proptest::prelude::*;

    const KEYS: [&str; 3] = ["app", "tier", keys::POD_NAMESPACE];
    const SOURCES: [&str; 3] = [source::ANY, source::K8S, source::UNSPEC];

    fn value(v: u8) -> String {
        format!("v{v}")
    }

    /// Requirements over a small pool of keys, values and sources, so that selectors repeat,
    /// share labels and match or fail on the source alone.
    fn requirement() -> impl Strategy<Value = Requirement> {
        (0..KEYS.len(), 0..SOURCES.len(), 0u8..4, 0u8..4, 0u8..3).prop_map(|(k, s, kind, a, b)| {
            let values: crate::sorted::Set<String> = [value(a), value(b)].into();
            let op = match kind {
                0 | 1 => Operator::In(values),
                2 => Operator::NotIn(values),
                _ if a % 2 == 0 => Operator::Exists,
                _ => Operator::DoesNotExist,
            };
            Requirement {
                source: SOURCES[s].to_owned(),
                key: KEYS[k].to_owned(),
                op,
            }
        })
    }

    /// A rule named `n` (rules of one name replace each other).
    fn rule() -> impl Strategy<Value = Rule> {
        (proptest::collection::vec(requirement(), 0..3), 0u8..6).prop_map(|(reqs, n)| {
            let labels = [Label::new(source::UNSPEC, "name", &format!("r{n}"))];
            Rule::new(
                Selector::from_requirements(reqs),
                labels.into_iter().collect(),
            )
        })
    }

    fn endpoint() -> impl Strategy<Value = LabelSet> {
        proptest::collection::vec((0..KEYS.len(), 1..SOURCES.len(), 0u8..3), 0..4).prop_map(|ls| {
            ls.into_iter()
                .map(|(k, s, v)| Label::new(SOURCES[s], KEYS[k], &value(v)))
                .collect()
        })
    }

    /// An import of some rules (replacing those of the same name) or a delete by name.
    #[derive(Debug, Clone)]
    enum Op {
        Add(Vec<Rule>),
        Delete(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => proptest::collection::vec(rule(), 0..6).prop_map(Op::Add),
            1 => (0u8..6).prop_map(Op::Delete),
        ]
    }

    proptest! {
        #[test]
        fn the_repository_selects_exactly_the_rules_whose_selector_matches(
            ops in proptest::collection::vec(op(), 1..6),
            endpoints in proptest::collection::vec(endpoint(), 1..4),
        ) {
            let mut repo = Repository::new();
            for op in ops {
                match op {
                    Op::Add(rules) => {
                        repo.add(rules);
                    }
                    Op::Delete(n) => {
                        repo.delete(&[Label::new(source::UNSPEC, "name", &format!("r{n}"))]);
                    }
                }
                for labels in &endpoints {
                    let want: Vec<&Rule> = repo
                        .rules()
                        .iter()
                        .map(AsRef::as_ref)
                        .filter(|r: &&Rule| r.endpoint_selector.matches(labels))
                        .collect();
                    prop_assert_eq!(repo.selecting(labels).collect::<Vec<_>>(), want);
                }
            }
        }
    }

    #[test]
    fn a_rule_is_indexed_by_its_narrowest_requirement() {
        let ns = Requirement::new(
            &format!("k8s:{}", keys::POD_NAMESPACE),
            Operator::In(["default".to_owned()].into()),
        );
        let app = Requirement::new("app", Operator::In(["web".to_owned()].into()));
        let tiers = Requirement::new(
            "tier",
            Operator::In(["a".to_owned(), "b".to_owned()].into()),
        );
        let keys = |reqs: Vec<Requirement>| SubjectKeys::of(&Selector::from_requirements(reqs));
        let rules = [
            keys(vec![ns.clone(), tiers.clone(), app.clone()]),
            keys(vec![Requirement::new("app", Operator::Exists)]),
            keys(vec![ns.clone(), tiers]),
            keys(vec![ns]),
        ];
        let index = SubjectIndex::new(rules.iter());
        assert_eq!(index.unindexed, vec![1]);
        assert_eq!(index.by_label.get(&label_key("app", "web")), Some(&vec![0]));
        assert_eq!(index.by_label.get(&label_key("tier", "b")), Some(&vec![2]));
        assert_eq!(
            index
                .by_label
                .get(&label_key(keys::POD_NAMESPACE, "default")),
            Some(&vec![3])
        );
        let web: LabelSet = [
            Label::new(source::K8S, "app", "web"),
            Label::new(source::K8S, "tier", "b"),
        ]
        .into_iter()
        .collect();
        assert_eq!(index.candidates(&web), vec![0, 1, 2]);
    }
}
