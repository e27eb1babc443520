//! The policy repository: the rule list with a revision, Cilium's add/replace/delete semantics.

use crate::labels::{Label, LabelSet, keys, source};
use crate::rule::{PeerSelector, Rule};
use crate::subjects::{SubjectIndex, SubjectKeys};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

/// What one add or delete did. The caller regenerates only endpoints that an added or removed
/// rule selects ([`RepoChange::selects`]) and bumps the revision of all others.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RepoChange {
    /// Revision after the change (unchanged when nothing changed).
    pub revision: u64,
    /// Rules added: shared with the repository, which holds the same rules (a whole-file import
    /// would otherwise hold every rule twice while the change is applied).
    pub added: Vec<Arc<Rule>>,
    /// Rules removed (replaced or deleted).
    pub removed: Vec<Arc<Rule>>,
}

impl RepoChange {
    /// True when nothing changed.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty()
    }

    /// True when an endpoint with these labels may have a different policy now.
    #[must_use]
    pub fn selects(&self, endpoint_labels: &LabelSet) -> bool {
        self.added
            .iter()
            .chain(&self.removed)
            .any(|r| r.endpoint_selector.matches(endpoint_labels))
    }
}

/// A rule given to [`Repository::add_reusing`].
#[derive(Debug, Clone)]
pub enum Incoming {
    /// A rule.
    New(Rule),
    /// A rule identical to the one at this position of the repository.
    Existing(usize),
}

/// Rules plus a revision; serializable so the manager can persist it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "Stored")]
pub struct Repository {
    rules: Vec<Arc<Rule>>,
    revision: u64,
    /// Each rule's content hash and index keys, same order: a re-import finds its unchanged
    /// rules, and the index is rebuilt, without hashing the whole repository again. Derived
    /// from `rules`, so not stored.
    #[serde(skip)]
    hashes: Vec<Hashes>,
    /// The rules by endpoint selector, for [`Self::selecting`]. Derived from `rules`.
    #[serde(skip)]
    subjects: SubjectIndex,
}

/// A rule's hashes, kept beside it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Hashes {
    /// [`Rule::content_hash`].
    rule: u64,
    /// Its endpoint selector's keys in the [`SubjectIndex`].
    subject: SubjectKeys,
}

impl Hashes {
    fn of(rule: &Rule) -> Self {
        Self {
            rule: rule.content_hash(),
            subject: SubjectKeys::of(&rule.endpoint_selector),
        }
    }
}

/// The index of the rules with these hashes by endpoint selector.
fn subjects(hashes: &[Hashes]) -> SubjectIndex {
    SubjectIndex::new(hashes.iter().map(|h| &h.subject))
}

/// The serialized form of a [`Repository`].
#[derive(Deserialize)]
struct Stored {
    rules: Vec<Rule>,
    revision: u64,
}

impl From<Stored> for Repository {
    fn from(s: Stored) -> Self {
        Self::restore(s.rules, s.revision)
    }
}

impl Default for Repository {
    fn default() -> Self {
        Self::new()
    }
}

/// Labels that name a rule for replacement. Rules from Kubernetes objects are replaced as a
/// whole object (kind, namespace, name — not uid, so a re-created object replaces its old
/// version); other rules by all their labels. Empty: the rule replaces nothing.
fn replace_key(rule: &Rule) -> impl Iterator<Item = &Label> {
    const DERIVED: [&str; 3] = [
        keys::POLICY_DERIVED_FROM,
        keys::POLICY_NAME,
        keys::POLICY_NAMESPACE,
    ];
    let k8s = |l: &Label| l.source == source::K8S && DERIVED.contains(&l.key.as_str());
    let object = rule
        .labels
        .iter()
        .any(|l| l.source == source::K8S && l.key == keys::POLICY_DERIVED_FROM);
    rule.labels.iter().filter(move |l| !object || k8s(l))
}

/// True when an incoming rule replaces a rule with `labels`: its key is non-empty and
/// contained in them.
fn replaces(incoming: &Rule, labels: &LabelSet) -> bool {
    let mut key = replace_key(incoming).peekable();
    key.peek().is_some() && labels.contains_all(key)
}

/// Old rules × incoming keys up to which the rules an import replaces are found by testing
/// each key directly; above it, through a [`LabelIndex`]. A re-imported file names most of
/// its rules by position ([`Incoming::Existing`]); those replace themselves, so only the few
/// rules it does not name are tested, and building the index would cost more than that.
const DIRECT_TESTS: usize = 8192;

/// The labels of the rules an import does not name, indexed so that finding those its keys
/// replace is linear in the keys, not rules × keys: a rule's labels contain a key only if they
/// contain each of its labels, so a key is looked up under its label that the fewest rules carry
/// (`rule=r7`, not `bench=policy`), compared by key and value since a key label without source
/// matches any source.
struct LabelIndex<'a> {
    by_label: HashMap<(&'a str, &'a str), Vec<usize>>,
}

impl<'a> LabelIndex<'a> {
    /// Indexes `rules` (position, rule).
    fn new(rules: impl Iterator<Item = (usize, &'a Arc<Rule>)>) -> Self {
        let mut by_label: HashMap<(&str, &str), Vec<usize>> = HashMap::new();
        for (i, r) in rules {
            for l in r.labels.iter() {
                by_label
                    .entry((l.key.as_str(), l.value.as_str()))
                    .or_default()
                    .push(i);
            }
        }
        Self { by_label }
    }

    /// Positions in `old` of the indexed rules whose labels contain every label of `key` (not
    /// empty).
    fn containing<'k>(
        &'k self,
        old: &'k [Arc<Rule>],
        key: &'k [&'k Label],
    ) -> impl Iterator<Item = usize> + 'k {
        let candidates = key
            .iter()
            .map(|l| {
                self.by_label
                    .get(&(l.key.as_str(), l.value.as_str()))
                    .map_or(&[][..], Vec::as_slice)
            })
            .min_by_key(|c| c.len())
            .unwrap_or(&[]);
        candidates.iter().copied().filter(move |&j| {
            old.get(j)
                .is_some_and(|r| r.labels.contains_all(key.iter().copied()))
        })
    }
}

fn resolve<'a>(old: &'a [Arc<Rule>], r: &'a Incoming) -> Option<&'a Rule> {
    match r {
        Incoming::New(r) => Some(r),
        Incoming::Existing(i) => old.get(*i).map(AsRef::as_ref),
    }
}

/// Positions (ascending) of the `old` rules that `incoming` replaces: those whose labels
/// contain an incoming rule's non-empty key. `direct_tests`: see [`DIRECT_TESTS`].
fn replaced_by(old: &[Arc<Rule>], incoming: &[Incoming], direct_tests: usize) -> Vec<usize> {
    let has_key = |r: &Rule| replace_key(r).next().is_some();
    // A rule's key is among its own labels: a rule named by position replaces itself.
    let mut replaced = vec![false; old.len()];
    for r in incoming {
        if let Incoming::Existing(i) = r
            && old.get(*i).is_some_and(|r| has_key(r))
            && let Some(x) = replaced.get_mut(*i)
        {
            *x = true;
        }
    }
    let unnamed = replaced.iter().filter(|x| !**x).count();
    let keyed: Vec<&Rule> = incoming
        .iter()
        .filter_map(|r| resolve(old, r))
        .filter(|r| has_key(r))
        .collect();
    if unnamed.saturating_mul(keyed.len()) <= direct_tests {
        for (x, rule) in replaced.iter_mut().zip(old).filter(|(x, _)| !**x) {
            *x = keyed.iter().any(|k| replaces(k, &rule.labels));
        }
    } else {
        let index = LabelIndex::new(
            old.iter()
                .enumerate()
                .filter(|(i, _)| !replaced.get(*i).copied().unwrap_or(true)),
        );
        let mut hits = Vec::new();
        let mut key = Vec::new();
        for k in &keyed {
            key.clear();
            key.extend(replace_key(k));
            hits.extend(index.containing(old, &key));
        }
        for j in hits {
            if let Some(x) = replaced.get_mut(j) {
                *x = true;
            }
        }
    }
    (0..old.len())
        .filter(|&i| replaced.get(i).copied().unwrap_or(false))
        .collect()
}

impl Repository {
    /// An empty repository at revision 1 (Cilium starts there too).
    #[must_use]
    pub fn new() -> Self {
        Self {
            rules: Vec::new(),
            revision: 1,
            hashes: Vec::new(),
            subjects: SubjectIndex::default(),
        }
    }

    /// A repository as persisted: its rules (in the order to keep) and revision.
    #[must_use]
    pub fn restore(rules: Vec<Rule>, revision: u64) -> Self {
        let rules: Vec<Arc<Rule>> = rules.into_iter().map(Arc::new).collect();
        let hashes: Vec<Hashes> = rules.iter().map(|r| Hashes::of(r)).collect();
        let subjects = subjects(&hashes);
        Self {
            rules,
            revision,
            hashes,
            subjects,
        }
    }

    /// Current revision.
    #[must_use]
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// All rules, in insertion order.
    #[must_use]
    pub fn rules(&self) -> &[Arc<Rule>] {
        &self.rules
    }

    /// Adds rules. An existing rule whose labels contain a new rule's labels is replaced
    /// (Cilium's `SearchRLocked` subset match); rules without labels replace nothing.
    /// Always bumps the revision. A rule replaced by an identical one is in neither list of the
    /// returned change: re-importing a file with one rule edited regenerates only the endpoints
    /// that rule selects.
    pub fn add(&mut self, rules: Vec<Rule>) -> RepoChange {
        self.add_reusing(rules.into_iter().map(Incoming::New).collect())
    }

    /// Positions of the rules by [`Rule::content_hash`] (the first of identical ones), for
    /// [`Incoming::Existing`].
    #[must_use]
    pub fn positions_by_hash(&self) -> HashMap<u64, usize> {
        let mut out = HashMap::with_capacity(self.hashes.len());
        for (i, h) in self.hashes.iter().enumerate() {
            out.entry(h.rule).or_insert(i);
        }
        out
    }

    /// [`Self::add`], where an incoming rule may be given as the position of an identical
    /// rule already here: exactly the same change, without parsing, cloning or comparing that
    /// rule (a re-imported file with one rule edited costs that one rule).
    pub fn add_reusing(&mut self, rules: Vec<Incoming>) -> RepoChange {
        let old = std::mem::take(&mut self.rules);
        let old_hashes = std::mem::take(&mut self.hashes);
        let replaced = replaced_by(&old, &rules, DIRECT_TESTS);
        self.revision += 1;
        // Pair each new rule with an identical replaced one, which then stays where it is (so
        // the order survives a restart: the manager persists rules in that order). Re-imported
        // files keep their order, so the next unpaired old rule is tried first and the search is
        // linear in practice; content hashes spare comparing rules that differ.
        let mut unpaired: Vec<Option<usize>> = replaced.into_iter().map(Some).collect();
        let mut hint = 0;
        let mut added = Vec::new();
        let mut added_hashes = Vec::new();
        for r in rules {
            let h = match &r {
                Incoming::New(r) => r.content_hash(),
                Incoming::Existing(i) => old_hashes.get(*i).map(|o| o.rule).unwrap_or_default(),
            };
            let same = |slot: &Option<usize>| match (&r, slot) {
                (_, None) => false,
                (Incoming::Existing(i), Some(j)) if i == j => true,
                (r, Some(j)) => {
                    old_hashes.get(*j).map(|o| o.rule) == Some(h)
                        && old.get(*j).is_some()
                        && old.get(*j).map(AsRef::as_ref) == resolve(&old, r)
                }
            };
            if let Some(k) = (hint..unpaired.len())
                .chain(0..hint)
                .find(|&k| unpaired.get(k).is_some_and(same))
            {
                if let Some(slot) = unpaired.get_mut(k) {
                    *slot = None;
                }
                hint = k + 1;
            } else {
                let rule = match r {
                    Incoming::New(r) => Some((
                        Hashes {
                            rule: h,
                            subject: SubjectKeys::of(&r.endpoint_selector),
                        },
                        Arc::new(r),
                    )),
                    Incoming::Existing(i) => old_hashes.get(i).cloned().zip(old.get(i).cloned()),
                };
                if let Some((hashes, rule)) = rule {
                    added.push(rule);
                    added_hashes.push(hashes);
                }
            }
        }
        let mut gone: Vec<bool> = vec![false; old.len()];
        for i in unpaired.into_iter().flatten() {
            if let Some(g) = gone.get_mut(i) {
                *g = true;
            }
        }
        // In place: the kept rules stay in their vector (no copy of the whole repository for a
        // change of one rule).
        let (mut rules, mut hashes) = (old, old_hashes);
        let mut goes = gone.iter().copied();
        let removed: Vec<Arc<Rule>> = rules
            .extract_if(.., |_| goes.next().unwrap_or(false))
            .collect();
        let mut goes = gone.iter().copied();
        hashes.retain(|_| !goes.next().unwrap_or(false));
        rules.extend(added.iter().cloned());
        hashes.extend(added_hashes);
        self.subjects = subjects(&hashes);
        self.rules = rules;
        self.hashes = hashes;
        RepoChange {
            revision: self.revision,
            added,
            removed,
        }
    }

    /// Deletes every rule whose labels contain all of `filter` (a filter label without source
    /// matches any source). An empty filter deletes nothing; use [`Self::delete_all`].
    /// Bumps the revision only when something was deleted.
    pub fn delete(&mut self, filter: &[Label]) -> RepoChange {
        if filter.is_empty() {
            return RepoChange {
                revision: self.revision,
                ..RepoChange::default()
            };
        }
        self.remove_where(|r| r.labels.contains_all(filter))
    }

    /// Deletes every rule.
    pub fn delete_all(&mut self) -> RepoChange {
        self.remove_where(|_| true)
    }

    fn remove_where(&mut self, pred: impl Fn(&Rule) -> bool) -> RepoChange {
        let mut removed = Vec::new();
        let old = std::mem::take(&mut self.rules);
        let old_hashes = std::mem::take(&mut self.hashes);
        for (r, h) in old.into_iter().zip(old_hashes) {
            if pred(&r) {
                removed.push(r);
            } else {
                self.rules.push(r);
                self.hashes.push(h);
            }
        }
        if !removed.is_empty() {
            self.revision += 1;
            self.subjects = subjects(&self.hashes);
        }
        RepoChange {
            revision: self.revision,
            added: Vec::new(),
            removed,
        }
    }

    /// Rules whose labels contain all of `filter` (all rules for an empty filter).
    pub fn search<'a>(&'a self, filter: &'a [Label]) -> impl Iterator<Item = &'a Rule> + 'a {
        self.rules
            .iter()
            .map(AsRef::as_ref)
            .filter(move |r: &&Rule| r.labels.contains_all(filter))
    }

    /// Rules that apply to an endpoint with these labels, in the repository's order. Only the
    /// selectors of rules indexed under one of the labels are matched ([`SubjectIndex`]).
    pub fn selecting<'a>(
        &'a self,
        endpoint_labels: &'a LabelSet,
    ) -> impl Iterator<Item = &'a Rule> + 'a {
        self.subjects
            .candidates(endpoint_labels)
            .into_iter()
            .filter_map(|i| self.rules.get(i).map(AsRef::as_ref))
            .filter(move |r: &&Rule| r.endpoint_selector.matches(endpoint_labels))
    }

    /// Every distinct peer selector: what the selector cache must track.
    #[must_use]
    pub fn peer_selectors(&self) -> BTreeSet<&PeerSelector> {
        self.rules.iter().flat_map(|r| r.peers()).collect()
    }

    /// Every CIDR prefix in use (excepts included): each needs a CIDR identity.
    #[must_use]
    pub fn cidr_prefixes(&self) -> BTreeSet<IpNet> {
        self.rules.iter().flat_map(|r| r.cidr_prefixes()).collect()
    }

    /// True when a rule applying to this endpoint uses one of `changed` as a peer, i.e. the
    /// endpoint must be regenerated after a selector-cache update.
    #[must_use]
    pub fn endpoint_uses(
        &self,
        endpoint_labels: &LabelSet,
        changed: &BTreeSet<PeerSelector>,
    ) -> bool {
        !changed.is_empty()
            && self
                .selecting(endpoint_labels)
                .any(|r| r.peers().any(|p| changed.contains(p)))
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn identical_replacement_is_not_a_change_but_bumps_the_revision() {
        let rules = crate::parse::parse_policy_file(
            "t.json",
            r#"[{"labels":[{"key":"name","value":"a"}],"endpointSelector":{"matchLabels":{"app":"x"}},"ingress":[{}]},
                {"labels":[{"key":"name","value":"b"}],"endpointSelector":{"matchLabels":{"app":"y"}},"ingress":[{}]}]"#,
        )
        .unwrap();
        let mut repo = Repository::new();
        repo.add(rules.clone());
        let rev = repo.revision();
        let same = repo.add(rules.clone());
        assert!(same.is_empty(), "{same:?}");
        assert_eq!(same.revision, rev + 1);
        let mut edited = rules.clone();
        edited[0].endpoint_selector = edited[1].endpoint_selector.clone();
        let one = repo.add(edited.clone());
        assert_eq!(
            (one.added.len(), one.removed.len()),
            (1, 1),
            "only rule a changed"
        );
        assert_eq!(
            repo.rules(),
            [Arc::new(rules[1].clone()), Arc::new(edited[0].clone())],
            "the unchanged rule kept its place, the new version of a comes last"
        );
    }

    use super::*;
    use crate::selector::Selector;

    fn rule(labels: &[&str]) -> Rule {
        let l = labels
            .iter()
            .map(|s| Label::parse_with_source(s, source::UNSPEC).unwrap())
            .collect();
        Rule::new(Selector::all(), l)
    }

    #[test]
    fn add_replaces_same_labels_and_bumps() {
        let mut r = Repository::new();
        assert_eq!(r.revision(), 1);
        let c = r.add(vec![rule(&["name=a"]), rule(&["name=b"])]);
        assert_eq!((c.revision, c.added.len(), c.removed.len()), (2, 2, 0));
        let mut v2 = rule(&["name=a"]);
        v2.description = "second version".into();
        let c = r.add(vec![v2]);
        assert_eq!((c.revision, c.added.len(), c.removed.len()), (3, 1, 1));
        assert_eq!(r.rules().len(), 2);
        // Unlabelled rules accumulate.
        r.add(vec![rule(&[])]);
        r.add(vec![rule(&[])]);
        assert_eq!(r.rules().len(), 4);
    }

    #[test]
    fn delete_by_subset_and_all() {
        let mut r = Repository::new();
        r.add(vec![
            rule(&["name=a", "team=x"]),
            rule(&["name=b", "team=x"]),
            rule(&["name=c"]),
        ]);
        let rev = r.revision();
        let c = r.delete(&[Label::parse_filter("team=x").unwrap()]);
        assert_eq!((c.removed.len(), c.revision), (2, rev + 1));
        let c = r.delete(&[Label::parse_filter("team=x").unwrap()]);
        assert!(c.is_empty());
        assert_eq!(c.revision, rev + 1, "no change, no bump");
        assert!(r.delete(&[]).is_empty());
        assert_eq!(r.delete_all().removed.len(), 1);
        assert!(r.rules().is_empty());
    }

    #[test]
    fn serializes() {
        let mut r = Repository::new();
        r.add(vec![rule(&["name=a"])]);
        let j = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<Repository>(&j).unwrap(), r);
    }
}

#[cfg(test)]
mod replace_props {
    use super::*;
    use crate::selector::Selector;
    use proptest::prelude::*;

    /// Labels from a small pool, so that keys often contain each other; kind 3 is a
    /// Kubernetes object (replaced by kind, namespace and name, whatever its uid).
    fn labels() -> impl Strategy<Value = LabelSet> {
        (0u8..4, 0u8..3, any::<bool>(), 0u8..2).prop_map(|(kind, n, extra, uid)| {
            let mut l = Vec::new();
            match kind {
                0 => {}
                3 => {
                    for (k, v) in [
                        (keys::POLICY_DERIVED_FROM, "NetworkPolicy".to_string()),
                        (keys::POLICY_NAME, format!("n{n}")),
                        (keys::POLICY_NAMESPACE, "default".to_string()),
                        (keys::POLICY_UID, format!("u{uid}")),
                    ] {
                        l.push(Label::new(source::K8S, k, &v));
                    }
                }
                _ => l.push(Label::new(source::UNSPEC, "name", &format!("r{n}"))),
            }
            if extra {
                l.push(Label::new(source::UNSPEC, "x", "y"));
            }
            l.into_iter().collect()
        })
    }

    fn incoming(old: usize) -> impl Strategy<Value = Incoming> {
        prop_oneof![
            labels().prop_map(|l| Incoming::New(Rule::new(Selector::all(), l))),
            (0..old.max(1) + 1).prop_map(Incoming::Existing),
        ]
    }

    proptest! {
        #[test]
        fn direct_tests_and_the_index_find_exactly_the_rules_whose_labels_hold_a_key(
            (old, inc) in proptest::collection::vec(labels(), 0..8).prop_flat_map(|old| {
                let n = old.len();
                (Just(old), proptest::collection::vec(incoming(n), 0..8))
            })
        ) {
            let old: Vec<Arc<Rule>> =
                old.into_iter().map(|l| Arc::new(Rule::new(Selector::all(), l))).collect();
            let want: Vec<usize> = (0..old.len())
                .filter(|&j| {
                    inc.iter()
                        .filter_map(|r| resolve(&old, r))
                        .any(|r| replaces(r, &old[j].labels))
                })
                .collect();
            prop_assert_eq!(&replaced_by(&old, &inc, usize::MAX), &want);
            prop_assert_eq!(&replaced_by(&old, &inc, 0), &want);
        }
    }
}
