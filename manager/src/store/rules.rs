//! The policy rules in sled, one record per rule so that a change writes only the rules it adds
//! or removes: sequence number (u64 BE) → `Rule` JSON. Beside them three records whose keys
//! are shorter than a sequence number (versions before them skip such keys):
//! - [`REVISION`]: the repository revision (u64 BE);
//! - [`NEXT`]: every committed record's sequence number is below it (u64 BE);
//! - [`DEAD`]: records a committed change removed and that are not deleted yet (u64 BE each).
//!
//! A change is atomic: a load finds all of it (its records, removals and revision) or none. A
//! small change is one sled batch. A large one (a whole file imported: a thousand rules removed
//! and a thousand added) is not: sled keeps every version of a tree node that a batch supersedes
//! until the batch ends, ~10 MiB for such a batch and the largest part of the manager's memory
//! peak during an import (docs/BENCHMARKS.md, "Manager memory"). A large change instead
//! 1. writes its records, [`CHUNK`] per batch, numbered at or above [`NEXT`]: not committed, so
//!    a load skips them;
//! 2. commits in one batch: the revision, [`NEXT`] above the new records, and [`DEAD`] listing
//!    the records it removes;
//! 3. deletes the dead records, [`CHUNK`] per batch, then [`DEAD`].
//!
//! sled recovers a prefix of its batches after a crash, so a load skips records not committed
//! and records listed dead, and finishes the deletion a stopped change left behind.

use std::collections::HashSet;
use weft_policy::rule::Rule;

use super::{Store, StoreError, encode, fixed};

/// The repository revision.
const REVISION: &[u8] = b"rev";
/// Every committed record's sequence number is below this one.
const NEXT: &[u8] = b"next";
/// Records committed as removed, not deleted yet.
const DEAD: &[u8] = b"dead";

/// Records written or deleted per batch in a large change; a change of at most this many
/// records is one batch.
const CHUNK: usize = 64;

/// Persisted rules.
#[derive(Debug)]
pub struct StoredRules {
    /// The repository revision.
    pub revision: u64,
    /// Every rule with its sequence number, in sequence order.
    pub rules: Vec<(u64, Rule)>,
    /// Above every sequence number used so far: a change numbers its new records from here
    /// (or above).
    pub next: u64,
}

fn seq_of(key: &[u8]) -> Option<u64> {
    <[u8; 8]>::try_from(key).ok().map(u64::from_be_bytes)
}

fn number(value: &[u8], key: &str, what: &'static str) -> Result<u64, StoreError> {
    fixed(value, || key.into(), what).map(u64::from_be_bytes)
}

impl Store {
    /// The persisted policy rules, or `None` when none were ever committed. Finishes what a
    /// change that stopped left (records not committed, records committed as removed).
    pub fn load_rules(&self) -> Result<Option<StoredRules>, StoreError> {
        let next = self.committed_next()?;
        let dead = self.dead_rules()?;
        let revision = match self.rules.get(REVISION)? {
            Some(rev) => Some(number(&rev, "rules/rev", "the revision")?),
            None => None,
        };
        let mut rules = Vec::new();
        let mut stale = Vec::new();
        let mut above = 0;
        for item in &self.rules {
            let (k, v) = item?;
            let Some(seq) = seq_of(&k) else {
                continue; // the revision, next and dead records
            };
            above = above.max(seq + 1);
            let committed = revision.is_some() && next.is_none_or(|n| seq < n);
            if !committed || dead.contains(&seq) {
                stale.push(seq);
                continue;
            }
            let rule = serde_json::from_slice(&v).map_err(|source| StoreError::Corrupt {
                key: format!("rules/{seq}"),
                source,
            })?;
            rules.push((seq, rule));
        }
        if !stale.is_empty() || !dead.is_empty() {
            tracing::info!(
                records = stale.len(),
                "deleting the rule records a stopped policy change left"
            );
            self.delete_rule_records(&stale)?;
        }
        Ok(revision.map(|revision| StoredRules {
            revision,
            rules,
            next: next.unwrap_or(above).max(above),
        }))
    }

    /// Removes the rules numbered `remove` (every stored rule for `None`), adds `add` and
    /// records `revision`, atomically (the module's doc says how); not flushed: the caller
    /// flushes ([`Self::flush`]) before it reports the change done, overlapping the fsync with
    /// other work. A large change's new records must be numbered from [`StoredRules::next`]
    /// on; otherwise it is written as one batch.
    pub fn write_rules(
        &self,
        revision: u64,
        remove: Option<&[u64]>,
        add: &[(u64, &Rule)],
    ) -> Result<(), StoreError> {
        // A deletion that an earlier write could not finish: its list is replaced below.
        let pending = self.dead_rules()?;
        if !pending.is_empty() {
            let pending: Vec<u64> = pending.into_iter().collect();
            self.delete_rule_records(&pending)?;
        }
        // Every record's number, read once and only when needed: for `next` in a store of an
        // earlier version (none recorded), and for the dead list when every rule goes.
        let committed = self.committed_next()?;
        let listed = if committed.is_none() || remove.is_none() {
            self.rule_seqs()?
        } else {
            Vec::new()
        };
        let next = committed.unwrap_or_else(|| listed.iter().map(|s| s + 1).max().unwrap_or(0));
        let dead = match remove {
            Some(remove) => remove.to_vec(),
            None => listed.into_iter().filter(|s| *s < next).collect(),
        };
        let new_next = add.iter().map(|(s, _)| s + 1).fold(next, u64::max);
        let staged = dead.len() + add.len() > CHUNK && add.iter().all(|(s, _)| *s >= next);
        if !staged {
            let mut batch = sled::Batch::default();
            for seq in &dead {
                batch.remove(&seq.to_be_bytes());
            }
            for (seq, rule) in add {
                batch.insert(&seq.to_be_bytes(), encode("a rule", rule)?);
            }
            batch.insert(REVISION, &revision.to_be_bytes());
            batch.insert(NEXT, &new_next.to_be_bytes());
            self.rules.apply_batch(batch)?;
            return Ok(());
        }
        self.stage_rules(add)?;
        self.commit_rules(revision, new_next, &dead)?;
        self.delete_rule_records(&dead)
    }

    /// Step 1 of a large change: its new records, not committed.
    fn stage_rules(&self, add: &[(u64, &Rule)]) -> Result<(), StoreError> {
        for chunk in add.chunks(CHUNK) {
            let mut batch = sled::Batch::default();
            for (seq, rule) in chunk {
                batch.insert(&seq.to_be_bytes(), encode("a rule", rule)?);
            }
            self.rules.apply_batch(batch)?;
        }
        Ok(())
    }

    /// Step 2 of a large change: the revision, the records below `next` and the removed ones.
    fn commit_rules(&self, revision: u64, next: u64, dead: &[u64]) -> Result<(), StoreError> {
        let mut batch = sled::Batch::default();
        batch.insert(REVISION, &revision.to_be_bytes());
        batch.insert(NEXT, &next.to_be_bytes());
        if !dead.is_empty() {
            let list: Vec<u8> = dead.iter().flat_map(|s| s.to_be_bytes()).collect();
            batch.insert(DEAD, list);
        }
        self.rules.apply_batch(batch)?;
        Ok(())
    }

    /// Step 3 of a large change (and what a load finishes): deletes `records`, [`CHUNK`] per
    /// batch, then the list of dead records.
    fn delete_rule_records(&self, records: &[u64]) -> Result<(), StoreError> {
        for chunk in records.chunks(CHUNK) {
            let mut batch = sled::Batch::default();
            for seq in chunk {
                batch.remove(&seq.to_be_bytes());
            }
            self.rules.apply_batch(batch)?;
        }
        self.rules.remove(DEAD)?;
        Ok(())
    }

    fn committed_next(&self) -> Result<Option<u64>, StoreError> {
        match self.rules.get(NEXT)? {
            Some(v) => Ok(Some(number(&v, "rules/next", "the next sequence number")?)),
            None => Ok(None),
        }
    }

    fn dead_rules(&self) -> Result<HashSet<u64>, StoreError> {
        let Some(list) = self.rules.get(DEAD)? else {
            return Ok(HashSet::new());
        };
        if list.len() % 8 != 0 {
            return Err(StoreError::BadLength {
                key: "rules/dead".into(),
                what: "a sequence number of the list",
                len: 8,
            });
        }
        Ok(list
            .chunks_exact(8)
            .filter_map(seq_of)
            .collect::<HashSet<u64>>())
    }

    /// The sequence number of every rule record, committed or not.
    fn rule_seqs(&self) -> Result<Vec<u64>, StoreError> {
        let mut out = Vec::new();
        for key in self.rules.iter().keys() {
            if let Some(seq) = seq_of(&key?) {
                out.push(seq);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
