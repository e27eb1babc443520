//! The rule repository in sled: one record per rule, so that a change writes only the rules it
//! adds or removes; the single-record format of earlier versions is migrated at load.

use std::collections::HashMap;
use weft_policy::repository::{RepoChange, Repository};
use weft_policy::rule::Rule;

use super::error::PolicyStateError;
use crate::store::Store;

/// Where versions before per-rule records kept the whole repository (read once, migrated).
pub(super) const LEGACY_REPO_KEY: &str = "policy_repository";

/// Which store record holds each rule, so a change writes only the rules it adds or removes.
/// Keyed by a 64-bit hash of the rule (identical rules may be several records); a collision
/// between two different rules of one repository is vanishingly unlikely at these sizes.
#[derive(Default)]
pub(super) struct RuleRecords {
    by_hash: HashMap<u64, Vec<u64>>,
    next: u64,
}

impl RuleRecords {
    pub(super) fn hash(rule: &Rule) -> u64 {
        rule.content_hash()
    }

    pub(super) fn add(&mut self, rule: &Rule) -> u64 {
        let seq = self.next;
        self.next += 1;
        self.by_hash.entry(Self::hash(rule)).or_default().push(seq);
        seq
    }

    /// Loads the repository, migrating the single-record format of earlier versions.
    pub(super) fn load(store: &Store) -> Result<(Self, Repository), PolicyStateError> {
        let mut records = Self::default();
        if let Some(stored) = store.load_rules()? {
            let mut rules = Vec::with_capacity(stored.rules.len());
            records.next = stored.next;
            for (seq, rule) in stored.rules {
                records
                    .by_hash
                    .entry(Self::hash(&rule))
                    .or_default()
                    .push(seq);
                records.next = records.next.max(seq + 1);
                rules.push(rule);
            }
            if store.get_meta::<Repository>(LEGACY_REPO_KEY)?.is_some() {
                // A migration that stopped between writing the records and this removal.
                store.remove_meta(LEGACY_REPO_KEY)?;
            }
            return Ok((records, Repository::restore(rules, stored.revision)));
        }
        let repo: Repository = store.get_meta(LEGACY_REPO_KEY)?.unwrap_or_default();
        let add: Vec<(u64, &Rule)> = repo
            .rules()
            .iter()
            .map(|r| (records.add(r), &**r))
            .collect();
        store.write_rules(repo.revision(), None, &add)?;
        store.flush()?;
        store.remove_meta(LEGACY_REPO_KEY)?;
        Ok((records, repo))
    }

    /// Persists a repository change (unflushed: the caller flushes the store before it answers):
    /// its removed and added rules and the new revision. The
    /// record map changes only once the store has the change, so a failed write (disk full)
    /// leaves both as they were; a removed rule without a record (cannot happen unless they
    /// diverged) makes it rewrite every rule of `repo` instead.
    pub(super) fn persist(
        &mut self,
        store: &Store,
        change: &RepoChange,
        repo: &Repository,
    ) -> Result<(), PolicyStateError> {
        // The records of the removed rules, found without changing `self` (not cloned either:
        // that would cost every rule of the repository on a one-rule change).
        let mut taken: HashMap<u64, usize> = HashMap::new();
        let mut remove = Vec::with_capacity(change.removed.len());
        for r in &change.removed {
            let h = Self::hash(r);
            let n = taken.entry(h).or_default();
            let seq = self
                .by_hash
                .get(&h)
                .and_then(|seqs| seqs.len().checked_sub(*n + 1).and_then(|i| seqs.get(i)));
            let Some(&seq) = seq else {
                tracing::warn!("a removed rule has no store record: rewriting every rule");
                return self.rewrite(store, repo);
            };
            *n += 1;
            remove.push((h, seq));
        }
        let add: Vec<(u64, u64, &Rule)> = change
            .added
            .iter()
            .enumerate()
            .map(|(i, r)| (Self::hash(r), self.next + i as u64, &**r))
            .collect();
        let seqs: Vec<u64> = remove.iter().map(|(_, seq)| *seq).collect();
        let writes: Vec<(u64, &Rule)> = add.iter().map(|(_, seq, r)| (*seq, *r)).collect();
        store.write_rules(repo.revision(), Some(&seqs), &writes)?;
        for (h, _) in remove {
            if let Some(seqs) = self.by_hash.get_mut(&h) {
                seqs.pop();
                if seqs.is_empty() {
                    self.by_hash.remove(&h);
                }
            }
        }
        for (h, seq, _) in add {
            self.by_hash.entry(h).or_default().push(seq);
        }
        self.next += writes.len() as u64;
        Ok(())
    }

    /// Replaces every record with the rules of `repo`, atomically. The new records are
    /// numbered on from the old ones ([`Store::write_rules`] writes a large change in steps
    /// only then).
    pub(super) fn rewrite(
        &mut self,
        store: &Store,
        repo: &Repository,
    ) -> Result<(), PolicyStateError> {
        let mut next = Self {
            next: self.next,
            ..Self::default()
        };
        let add: Vec<(u64, &Rule)> = repo.rules().iter().map(|r| (next.add(r), &**r)).collect();
        store.write_rules(repo.revision(), None, &add)?;
        *self = next;
        Ok(())
    }
}
