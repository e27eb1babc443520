//! The policy repository: the rule list with a revision, Cilium's add/replace/delete semantics.

use crate::labels::{Label, LabelSet, keys, source};
use crate::rule::{PeerSelector, Rule};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap};

/// What one add or delete did. The caller regenerates only endpoints that an added or removed
/// rule selects ([`RepoChange::selects`]) and bumps the revision of all others.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RepoChange {
    /// Revision after the change (unchanged when nothing changed).
    pub revision: u64,
    /// Rules added.
    pub added: Vec<Rule>,
    /// Rules removed (replaced or deleted).
    pub removed: Vec<Rule>,
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
    rules: Vec<Rule>,
    revision: u64,
    /// [`Rule::content_hash`] of each rule, same order: a re-import finds its unchanged rules
    /// without hashing the whole repository again. Derived from `rules`, so not stored.
    #[serde(skip)]
    hashes: Vec<u64>,
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
/// version); other rules by all their labels.
fn replace_key(rule: &Rule) -> Vec<&Label> {
    let derived = [
        keys::POLICY_DERIVED_FROM,
        keys::POLICY_NAME,
        keys::POLICY_NAMESPACE,
    ];
    let k8s: Vec<&Label> = rule
        .labels
        .iter()
        .filter(|l| l.source == source::K8S && derived.contains(&l.key.as_str()))
        .collect();
    if k8s.iter().any(|l| l.key == keys::POLICY_DERIVED_FROM) {
        k8s
    } else {
        rule.labels.iter().collect()
    }
}

/// Replacement keys indexed so that finding the rules an import replaces is linear, not
/// rules × keys: a rule's labels contain a key only if they contain each of its labels, so each
/// key is filed under its label that the fewest keys share (`rule=r7`, not `bench=policy`),
/// compared by key and value since a key label without source matches any source.
struct ReplaceIndex<'a> {
    by_label: HashMap<(&'a str, &'a str), Vec<&'a [&'a Label]>>,
}

impl<'a> ReplaceIndex<'a> {
    fn new(keys: &'a BTreeSet<Vec<&'a Label>>) -> Self {
        let kv = |l: &&'a Label| (l.key.as_str(), l.value.as_str());
        let mut freq: HashMap<(&str, &str), usize> = HashMap::new();
        for l in keys.iter().flatten() {
            *freq.entry(kv(l)).or_default() += 1;
        }
        let mut by_label: HashMap<(&str, &str), Vec<&[&Label]>> = HashMap::new();
        for k in keys {
            if let Some(rarest) = k
                .iter()
                .map(kv)
                .min_by_key(|x| freq.get(x).copied().unwrap_or(0))
            {
                by_label.entry(rarest).or_default().push(k);
            }
        }
        Self { by_label }
    }

    fn replaces(&self, labels: &LabelSet) -> bool {
        labels.iter().any(|l| {
            self.by_label
                .get(&(l.key.as_str(), l.value.as_str()))
                .is_some_and(|ks| ks.iter().any(|k| labels.contains_all(k.iter().copied())))
        })
    }
}

impl Repository {
    /// An empty repository at revision 1 (Cilium starts there too).
    #[must_use]
    pub fn new() -> Self {
        Self {
            rules: Vec::new(),
            revision: 1,
            hashes: Vec::new(),
        }
    }

    /// A repository as persisted: its rules (in the order to keep) and revision.
    #[must_use]
    pub fn restore(rules: Vec<Rule>, revision: u64) -> Self {
        let hashes = rules.iter().map(Rule::content_hash).collect();
        Self {
            rules,
            revision,
            hashes,
        }
    }

    /// Current revision.
    #[must_use]
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// All rules, in insertion order.
    #[must_use]
    pub fn rules(&self) -> &[Rule] {
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
            out.entry(*h).or_insert(i);
        }
        out
    }

    /// [`Self::add`], where an incoming rule may be given as the position of an identical
    /// rule already here: exactly the same change, without parsing, cloning or comparing that
    /// rule (a re-imported file with one rule edited costs that one rule).
    pub fn add_reusing(&mut self, rules: Vec<Incoming>) -> RepoChange {
        fn resolve<'a>(old: &'a [Rule], r: &'a Incoming) -> Option<&'a Rule> {
            match r {
                Incoming::New(r) => Some(r),
                Incoming::Existing(i) => old.get(*i),
            }
        }
        let old = std::mem::take(&mut self.rules);
        let old_hashes = std::mem::take(&mut self.hashes);
        let keys: BTreeSet<Vec<&Label>> = rules
            .iter()
            .filter_map(|r| resolve(&old, r))
            .map(replace_key)
            .filter(|k| !k.is_empty())
            .collect();
        let index = ReplaceIndex::new(&keys);
        let replaced: Vec<usize> = (0..old.len())
            .filter(|&i| old.get(i).is_some_and(|r| index.replaces(&r.labels)))
            .collect();
        drop(index);
        drop(keys);
        self.revision += 1;
        // Pair each new rule with an identical replaced one, which then stays where it is (so
        // the order survives a restart: the manager persists rules in that order). Re-imported
        // files keep their order, so the next unpaired old rule is tried first and the search is
        // linear in practice.
        let mut unpaired: Vec<Option<usize>> = replaced.into_iter().map(Some).collect();
        let mut hint = 0;
        let mut added = Vec::new();
        for r in rules {
            let same = |slot: &Option<usize>| match (&r, slot) {
                (_, None) => false,
                (Incoming::Existing(i), Some(j)) if i == j => true,
                (r, Some(j)) => old.get(*j).is_some() && old.get(*j) == resolve(&old, r),
            };
            match (hint..unpaired.len())
                .chain(0..hint)
                .find(|&k| unpaired.get(k).is_some_and(same))
            {
                Some(k) => {
                    if let Some(slot) = unpaired.get_mut(k) {
                        *slot = None;
                    }
                    hint = k + 1;
                }
                None => match r {
                    Incoming::New(r) => added.push(r),
                    Incoming::Existing(i) => added.extend(old.get(i).cloned()),
                },
            }
        }
        let mut gone: Vec<usize> = unpaired.into_iter().flatten().collect();
        gone.sort_unstable();
        let mut removed = Vec::with_capacity(gone.len());
        self.rules = Vec::with_capacity(old.len() - gone.len() + added.len());
        self.hashes = Vec::with_capacity(self.rules.capacity());
        let mut gone = gone.into_iter().peekable();
        for (i, (r, h)) in old.into_iter().zip(old_hashes).enumerate() {
            if gone.next_if_eq(&i).is_some() {
                removed.push(r);
            } else {
                self.rules.push(r);
                self.hashes.push(h);
            }
        }
        self.rules.extend(added.iter().cloned());
        self.hashes.extend(added.iter().map(Rule::content_hash));
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
            .filter(move |r| r.labels.contains_all(filter))
    }

    /// Rules that apply to an endpoint with these labels.
    pub fn selecting<'a>(
        &'a self,
        endpoint_labels: &'a LabelSet,
    ) -> impl Iterator<Item = &'a Rule> + 'a {
        self.rules
            .iter()
            .filter(move |r| r.endpoint_selector.matches(endpoint_labels))
    }

    /// Every distinct peer selector: what the selector cache must track.
    #[must_use]
    pub fn peer_selectors(&self) -> BTreeSet<&PeerSelector> {
        self.rules.iter().flat_map(Rule::peers).collect()
    }

    /// Every CIDR prefix in use (excepts included): each needs a CIDR identity.
    #[must_use]
    pub fn cidr_prefixes(&self) -> BTreeSet<IpNet> {
        self.rules
            .iter()
            .flat_map(Rule::cidr_prefixes)
            .filter(|p| p.prefix_len() > 0)
            .collect()
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
            [rules[1].clone(), edited[0].clone()],
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
