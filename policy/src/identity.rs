//! Identity allocation: label sets and CIDR prefixes to numeric, reference-counted identities.
//!
//! Ids are persisted through [`IdentityStore`] *before* they are handed out, so a restarted
//! manager restores the same numbers the pinned eBPF maps still use.

use crate::labels::LabelSet;
use crate::mapstate::{Identity, reserved};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What an identity stands for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IdentityKey {
    /// A set of endpoint security labels (ids from 256).
    Labels(LabelSet),
    /// A CIDR prefix used by policy (ids from 1<<24).
    Cidr(IpNet),
}

/// Persistence seam for identities (the manager implements it on sled).
pub trait IdentityStore {
    /// Records that `id` belongs to `key`. Must be durable when it returns Ok.
    fn save(&mut self, id: Identity, key: &IdentityKey) -> Result<(), StoreError>;
    /// Forgets `id` (released).
    fn remove(&mut self, id: Identity) -> Result<(), StoreError>;
}

/// A store failure, carried as text so the seam does not leak the backend's error type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("identity store: {0}")]
pub struct StoreError(pub String);

/// Allocation failures.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// The store refused the write; nothing was allocated.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Every id of the range is in use.
    #[error("no free {0} identity left")]
    Exhausted(&'static str),
    /// A restored pair conflicts with another one.
    #[error("restored identity {id} conflicts: {reason}")]
    RestoreConflict {
        /// The id.
        id: Identity,
        /// What is wrong.
        reason: String,
    },
    /// Release of an id nobody holds.
    #[error("identity {0} is not allocated")]
    NotAllocated(Identity),
}

/// In-memory store, for tests and for callers that do not persist.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryStore {
    /// Saved pairs.
    pub saved: BTreeMap<Identity, IdentityKey>,
    /// When set, every write fails (to test the seam's error path).
    pub fail: bool,
}

impl IdentityStore for MemoryStore {
    fn save(&mut self, id: Identity, key: &IdentityKey) -> Result<(), StoreError> {
        if self.fail {
            return Err(StoreError("injected failure".into()));
        }
        self.saved.insert(id, key.clone());
        Ok(())
    }

    fn remove(&mut self, id: Identity) -> Result<(), StoreError> {
        if self.fail {
            return Err(StoreError("injected failure".into()));
        }
        self.saved.remove(&id);
        Ok(())
    }
}

#[derive(Debug, Clone)]
struct Slot {
    key: IdentityKey,
    refs: u64,
    /// Since when (ms) an identity without references is kept for reuse
    /// ([`IdentityAllocator::release_to_idle`]); `None` while referenced, and for restored ids.
    idle_since: Option<u64>,
}

/// Result of [`IdentityAllocator::acquire`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acquired {
    /// The id.
    pub id: Identity,
    /// True when the id was newly created (the caller must tell the selector cache).
    pub new: bool,
}

/// Reference-counted allocator for label and CIDR identities.
#[derive(Debug, Clone, Default)]
pub struct IdentityAllocator {
    by_id: BTreeMap<Identity, Slot>,
    by_key: BTreeMap<IdentityKey, Identity>,
    // Cursors only move forward (wrapping): a just-released id is not handed out again soon,
    // so stale ipcache or conntrack state cannot be confused with a new owner.
    next_label: Identity,
    next_cidr: Identity,
}

const LABEL_RANGE: (Identity, Identity) = (reserved::FIRST_ALLOCATED, reserved::FIRST_CIDR - 1);
const CIDR_RANGE: (Identity, Identity) = (reserved::FIRST_CIDR, (1 << 25) - 1);

impl IdentityAllocator {
    /// An empty allocator.
    #[must_use]
    pub fn new() -> Self {
        Self {
            next_label: LABEL_RANGE.0,
            next_cidr: CIDR_RANGE.0,
            ..Self::default()
        }
    }

    /// Rebuilds the allocator from persisted pairs. Restored ids start with zero references:
    /// the caller re-acquires what it still uses, then calls [`Self::release_unused`].
    pub fn restore(
        pairs: impl IntoIterator<Item = (Identity, IdentityKey)>,
    ) -> Result<Self, IdentityError> {
        let mut a = Self::new();
        for (id, key) in pairs {
            Self::check_range(&key, id)?;
            let range = Self::range_of(&key);
            if let Some(other) = a.by_key.get(&key) {
                return Err(IdentityError::RestoreConflict {
                    id,
                    reason: format!("same key as identity {other}"),
                });
            }
            if a.by_id.contains_key(&id) {
                return Err(IdentityError::RestoreConflict {
                    id,
                    reason: "id restored twice".into(),
                });
            }
            match &key {
                IdentityKey::Labels(_) => a.next_label = a.next_label.max(id + 1).min(range.1),
                IdentityKey::Cidr(_) => a.next_cidr = a.next_cidr.max(id + 1).min(range.1),
            }
            a.by_key.insert(key.clone(), id);
            a.by_id.insert(
                id,
                Slot {
                    key,
                    refs: 0,
                    idle_since: None,
                },
            );
        }
        Ok(a)
    }

    fn range_of(key: &IdentityKey) -> (Identity, Identity) {
        match key {
            IdentityKey::Labels(_) => LABEL_RANGE,
            IdentityKey::Cidr(_) => CIDR_RANGE,
        }
    }

    /// Takes a reference on the identity of `key`, allocating and persisting it if needed.
    pub fn acquire(
        &mut self,
        store: &mut dyn IdentityStore,
        key: &IdentityKey,
    ) -> Result<Acquired, IdentityError> {
        if let Some(&id) = self.by_key.get(key) {
            let slot = self
                .by_id
                .get_mut(&id)
                .ok_or(IdentityError::NotAllocated(id))?;
            slot.refs += 1;
            slot.idle_since = None;
            // A restored or idle id becomes "new" for nobody: it was already known.
            return Ok(Acquired { id, new: false });
        }
        let (lo, hi) = Self::range_of(key);
        let cursor = match key {
            IdentityKey::Labels(_) => self.next_label,
            IdentityKey::Cidr(_) => self.next_cidr,
        };
        let id = (cursor..=hi)
            .chain(lo..cursor)
            .find(|id| !self.by_id.contains_key(id))
            .ok_or(IdentityError::Exhausted(match key {
                IdentityKey::Labels(_) => "label",
                IdentityKey::Cidr(_) => "CIDR",
            }))?;
        store.save(id, key)?;
        self.by_key.insert(key.clone(), id);
        self.by_id.insert(
            id,
            Slot {
                key: key.clone(),
                refs: 1,
                idle_since: None,
            },
        );
        let next = if id == hi { lo } else { id + 1 };
        match key {
            IdentityKey::Labels(_) => self.next_label = next,
            IdentityKey::Cidr(_) => self.next_cidr = next,
        }
        Ok(Acquired { id, new: true })
    }

    /// Refuses `id` for `key` when it is outside the number range of `key`'s kind.
    fn check_range(key: &IdentityKey, id: Identity) -> Result<(), IdentityError> {
        let (lo, hi) = Self::range_of(key);
        if id < lo || id > hi {
            return Err(IdentityError::RestoreConflict {
                id,
                reason: format!("outside the range {lo}..={hi} of its kind"),
            });
        }
        Ok(())
    }

    /// Takes a reference on `key` under a number chosen elsewhere (the cluster's kvstore),
    /// persisting it if new. Refuses when this node knows `key` under another number, or
    /// `id` as another key: the caller must not silently renumber live endpoints.
    pub fn acquire_as(
        &mut self,
        store: &mut dyn IdentityStore,
        key: &IdentityKey,
        id: Identity,
    ) -> Result<Acquired, IdentityError> {
        if let Some(&have) = self.by_key.get(key) {
            if have != id {
                return Err(IdentityError::RestoreConflict {
                    id,
                    reason: format!("this node already has identity {have} for the same labels"),
                });
            }
            let Some(slot) = self.by_id.get_mut(&id) else {
                return Err(IdentityError::RestoreConflict {
                    id,
                    reason: "the identity tables disagree (by key, not by number)".into(),
                });
            };
            slot.refs += 1;
            slot.idle_since = None;
            return Ok(Acquired { id, new: false });
        }
        Self::check_range(key, id)?;
        if self.by_id.contains_key(&id) {
            return Err(IdentityError::RestoreConflict {
                id,
                reason: "this node uses the number for other labels".into(),
            });
        }
        store.save(id, key)?;
        self.by_key.insert(key.clone(), id);
        self.by_id.insert(
            id,
            Slot {
                key: key.clone(),
                refs: 1,
                idle_since: None,
            },
        );
        Ok(Acquired { id, new: true })
    }

    /// Drops one reference; returns true when the identity was freed (and removed from the
    /// store). The caller then tells the selector cache.
    pub fn release(
        &mut self,
        store: &mut dyn IdentityStore,
        id: Identity,
    ) -> Result<bool, IdentityError> {
        let slot = self
            .by_id
            .get_mut(&id)
            .ok_or(IdentityError::NotAllocated(id))?;
        if slot.refs > 1 {
            slot.refs -= 1;
            return Ok(false);
        }
        store.remove(id)?;
        if let Some(slot) = self.by_id.remove(&id) {
            self.by_key.remove(&slot.key);
        }
        Ok(true)
    }

    /// Drops one reference, but keeps an identity that loses its last one, idle since `now_ms`,
    /// instead of freeing it: the next endpoint with the same key gets the same number back,
    /// and nothing that selects it changes (Cilium keeps identities until a GC interval for the
    /// same reason). [`Self::collect_idle`] frees it later. Returns true when the identity
    /// became idle. Nothing is written to the store.
    pub fn release_to_idle(&mut self, id: Identity, now_ms: u64) -> Result<bool, IdentityError> {
        let slot = self
            .by_id
            .get_mut(&id)
            .filter(|s| s.refs > 0)
            .ok_or(IdentityError::NotAllocated(id))?;
        slot.refs -= 1;
        if slot.refs > 0 {
            return Ok(false);
        }
        slot.idle_since = Some(now_ms);
        Ok(true)
    }

    /// Frees the identities idle for at least `grace_ms` at `now_ms`; returns them.
    pub fn collect_idle(
        &mut self,
        store: &mut dyn IdentityStore,
        now_ms: u64,
        grace_ms: u64,
    ) -> Result<Vec<Identity>, IdentityError> {
        let expired: Vec<Identity> = self
            .by_id
            .iter()
            .filter(|(_, s)| {
                s.refs == 0
                    && s.idle_since
                        .is_some_and(|t| now_ms.saturating_sub(t) >= grace_ms)
            })
            .map(|(id, _)| *id)
            .collect();
        self.forget(store, &expired)?;
        Ok(expired)
    }

    /// Removes `ids` from the store, then from both tables.
    fn forget(
        &mut self,
        store: &mut dyn IdentityStore,
        ids: &[Identity],
    ) -> Result<(), IdentityError> {
        for id in ids {
            store.remove(*id)?;
            if let Some(slot) = self.by_id.remove(id) {
                self.by_key.remove(&slot.key);
            }
        }
        Ok(())
    }

    /// Whether `id` is kept without references (see [`Self::release_to_idle`]).
    #[must_use]
    pub fn is_idle(&self, id: Identity) -> bool {
        self.by_id.get(&id).is_some_and(|s| s.idle_since.is_some())
    }

    /// Keeps every restored label identity nobody re-acquired as idle since `now_ms` (a restart
    /// inside the grace period changes no number and no selector); returns them.
    pub fn idle_unused_labels(&mut self, now_ms: u64) -> Vec<Identity> {
        let mut idle = Vec::new();
        for (id, s) in &mut self.by_id {
            if s.refs == 0 && s.idle_since.is_none() && matches!(s.key, IdentityKey::Labels(_)) {
                s.idle_since = Some(now_ms);
                idle.push(*id);
            }
        }
        idle
    }

    /// Frees every restored identity nobody re-acquired and none kept idle; returns the freed
    /// ids.
    pub fn release_unused(
        &mut self,
        store: &mut dyn IdentityStore,
    ) -> Result<Vec<Identity>, IdentityError> {
        let unused: Vec<Identity> = self
            .by_id
            .iter()
            .filter(|(_, s)| s.refs == 0 && s.idle_since.is_none())
            .map(|(id, _)| *id)
            .collect();
        self.forget(store, &unused)?;
        Ok(unused)
    }

    /// The id of `key`, if allocated.
    #[must_use]
    pub fn lookup(&self, key: &IdentityKey) -> Option<Identity> {
        self.by_key.get(key).copied()
    }

    /// What `id` stands for.
    #[must_use]
    pub fn key_of(&self, id: Identity) -> Option<&IdentityKey> {
        self.by_id.get(&id).map(|s| &s.key)
    }

    /// Current reference count of `id` (0 for restored, unclaimed ids).
    #[must_use]
    pub fn refcount(&self, id: Identity) -> Option<u64> {
        self.by_id.get(&id).map(|s| s.refs)
    }

    /// Every allocated identity, ascending.
    pub fn iter(&self) -> impl Iterator<Item = (Identity, &IdentityKey)> {
        self.by_id.iter().map(|(id, s)| (*id, &s.key))
    }

    /// The CIDR identities, i.e. what the caller must keep in the ipcache.
    pub fn cidr_identities(&self) -> impl Iterator<Item = (IpNet, Identity)> + '_ {
        self.by_id.iter().filter_map(|(id, s)| match &s.key {
            IdentityKey::Cidr(p) => Some((*p, *id)),
            IdentityKey::Labels(_) => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lbl(app: &str) -> IdentityKey {
        IdentityKey::Labels(LabelSet::for_pod("default", [("app", app)]))
    }

    #[test]
    fn acquire_as_takes_the_given_number_and_refuses_conflicts() {
        let mut store = MemoryStore::default();
        let mut a = IdentityAllocator::new();
        assert_eq!(
            a.acquire_as(&mut store, &lbl("web"), 300).unwrap(),
            Acquired { id: 300, new: true }
        );
        assert_eq!(
            a.acquire_as(&mut store, &lbl("web"), 300).unwrap(),
            Acquired {
                id: 300,
                new: false
            }
        );
        assert_eq!(a.refcount(300), Some(2));
        assert!(a.acquire_as(&mut store, &lbl("web"), 301).is_err());
        assert!(a.acquire_as(&mut store, &lbl("db"), 300).is_err());
        assert!(
            a.acquire_as(&mut store, &lbl("db"), 2).is_err(),
            "reserved range"
        );
        assert_eq!(store.saved.len(), 1);
    }

    #[test]
    fn refcount_and_release() {
        let mut store = MemoryStore::default();
        let mut a = IdentityAllocator::new();
        let x = a.acquire(&mut store, &lbl("web")).unwrap();
        assert_eq!(x, Acquired { id: 256, new: true });
        let y = a.acquire(&mut store, &lbl("web")).unwrap();
        assert_eq!(
            y,
            Acquired {
                id: 256,
                new: false
            }
        );
        assert_eq!(a.acquire(&mut store, &lbl("db")).unwrap().id, 257);
        assert!(!a.release(&mut store, 256).unwrap());
        assert!(store.saved.contains_key(&256));
        assert!(a.release(&mut store, 256).unwrap());
        assert!(!store.saved.contains_key(&256));
        assert_eq!(
            a.release(&mut store, 256),
            Err(IdentityError::NotAllocated(256))
        );
        // Not reused right away.
        assert_eq!(a.acquire(&mut store, &lbl("web")).unwrap().id, 258);
    }

    #[test]
    fn an_idle_identity_keeps_its_number_until_collected() {
        let mut store = MemoryStore::default();
        let mut a = IdentityAllocator::new();
        let web = a.acquire(&mut store, &lbl("web")).unwrap().id;
        a.acquire(&mut store, &lbl("web")).unwrap();
        assert!(
            !a.release_to_idle(web, 1_000).unwrap(),
            "one reference left"
        );
        assert!(!a.is_idle(web));
        assert!(a.release_to_idle(web, 1_000).unwrap());
        assert!(a.is_idle(web));
        assert_eq!(a.refcount(web), Some(0));
        assert!(store.saved.contains_key(&web), "kept on disk while idle");
        assert_eq!(
            a.release_to_idle(web, 1_001),
            Err(IdentityError::NotAllocated(web)),
            "no reference left to drop"
        );
        // Reused while idle: same number, not new, no longer idle.
        assert_eq!(
            a.acquire(&mut store, &lbl("web")).unwrap(),
            Acquired {
                id: web,
                new: false
            }
        );
        assert!(!a.is_idle(web));
        assert!(a.release_to_idle(web, 2_000).unwrap());
        // Not before the grace period is over; exactly at its end, yes.
        assert!(a.collect_idle(&mut store, 2_999, 1_000).unwrap().is_empty());
        let db = a.acquire(&mut store, &lbl("db")).unwrap().id;
        assert_eq!(a.collect_idle(&mut store, 3_000, 1_000).unwrap(), vec![web]);
        assert_eq!(a.refcount(web), None);
        assert!(!store.saved.contains_key(&web));
        assert_eq!(
            a.refcount(db),
            Some(1),
            "referenced ids are never collected"
        );
        assert_ne!(a.acquire(&mut store, &lbl("web")).unwrap().id, web);
    }

    #[test]
    fn restored_unclaimed_ids_are_released_or_kept_idle() {
        let mut store = MemoryStore::default();
        let cidr = IdentityKey::Cidr("10.0.0.0/8".parse().unwrap());
        let restored = [(300, lbl("web")), (301, lbl("db")), (1 << 24, cidr)];
        let mut a = IdentityAllocator::restore(restored.clone()).unwrap();
        assert!(a.collect_idle(&mut store, u64::MAX, 0).unwrap().is_empty());
        assert_eq!(
            a.release_unused(&mut store).unwrap(),
            vec![300, 301, 1 << 24]
        );

        let mut a = IdentityAllocator::restore(restored).unwrap();
        a.acquire(&mut store, &lbl("db")).unwrap();
        assert_eq!(
            a.idle_unused_labels(5),
            vec![300],
            "labels only, unclaimed only"
        );
        assert_eq!(a.release_unused(&mut store).unwrap(), vec![1 << 24]);
        assert!(a.is_idle(300));
        assert_eq!(a.collect_idle(&mut store, 15, 10).unwrap(), vec![300]);
    }

    #[test]
    fn cidr_range() {
        let mut store = MemoryStore::default();
        let mut a = IdentityAllocator::new();
        let k = IdentityKey::Cidr("10.0.0.0/8".parse().unwrap());
        assert_eq!(a.acquire(&mut store, &k).unwrap().id, reserved::FIRST_CIDR);
        assert_eq!(
            a.cidr_identities().collect::<Vec<_>>(),
            [("10.0.0.0/8".parse().unwrap(), 1 << 24)]
        );
    }

    #[test]
    fn restore_keeps_ids_and_frees_unclaimed() {
        let mut store = MemoryStore::default();
        let mut a = IdentityAllocator::new();
        for app in ["a", "b", "c"] {
            a.acquire(&mut store, &lbl(app)).unwrap();
        }
        let mut b = IdentityAllocator::restore(store.saved.clone()).unwrap();
        assert_eq!(
            b.acquire(&mut store, &lbl("b")).unwrap(),
            Acquired {
                id: 257,
                new: false
            }
        );
        assert_eq!(b.release_unused(&mut store).unwrap(), vec![256, 258]);
        assert_eq!(store.saved.keys().copied().collect::<Vec<_>>(), vec![257]);
        // New ids continue after the highest restored one.
        assert_eq!(b.acquire(&mut store, &lbl("d")).unwrap().id, 259);
    }

    #[test]
    fn restore_rejects_conflicts() {
        let dup = [(256, lbl("a")), (300, lbl("a"))];
        assert!(matches!(
            IdentityAllocator::restore(dup),
            Err(IdentityError::RestoreConflict { id: 300, .. })
        ));
        let out = [(5, lbl("a"))];
        assert!(IdentityAllocator::restore(out).is_err());
    }

    #[test]
    fn store_failure_allocates_nothing() {
        let mut store = MemoryStore {
            fail: true,
            ..MemoryStore::default()
        };
        let mut a = IdentityAllocator::new();
        assert!(matches!(
            a.acquire(&mut store, &lbl("x")),
            Err(IdentityError::Store(_))
        ));
        assert_eq!(a.lookup(&lbl("x")), None);
        store.fail = false;
        assert_eq!(a.acquire(&mut store, &lbl("x")).unwrap().id, 256);
    }
}
