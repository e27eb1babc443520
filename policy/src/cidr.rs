//! Keeping one CIDR identity per prefix the repository uses (Cilium's `AllocateCIDRs` /
//! `ReleaseCIDRIdentitiesByCIDR` around `policyAdd`).
//!
//! # Ordering for the caller
//!
//! After an import: [`CidrReferences::sync`], then regenerate the affected endpoints, and only
//! then insert `added` into the ipcache. If the ipcache resolved a prefix to its new identity
//! before the policy maps knew that identity, traffic to the prefix would hit default deny
//! for a moment (Cilium postpones the upsert for the same reason). Delete `released` from the
//! ipcache after regenerating too: the prefix then falls back to the next shorter prefix or
//! world, which every regenerated map already handles.

use crate::identity::{IdentityAllocator, IdentityError, IdentityKey, IdentityStore};
use crate::mapstate::Identity;
use crate::rule::PeerSelector;
use crate::selectorcache::SelectorCache;
use ipnet::IpNet;
use std::collections::{BTreeMap, BTreeSet};

/// What a sync changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CidrSync {
    /// Prefixes that now have a reference from the repository (insert into the ipcache).
    pub added: Vec<(IpNet, Identity)>,
    /// Prefixes whose identity was freed (delete from the ipcache).
    pub released: Vec<(IpNet, Identity)>,
    /// Selectors whose identity sets changed: regenerate endpoints using them.
    pub changed: BTreeSet<PeerSelector>,
    /// The identities that entered or left those sets (the new and the freed ones).
    pub identities: BTreeSet<Identity>,
}

/// The references the repository holds on CIDR identities: exactly one per prefix in use.
#[derive(Debug, Clone, Default)]
pub struct CidrReferences {
    held: BTreeMap<IpNet, Identity>,
}

impl CidrReferences {
    /// No references held (also the state after a restart: restored identities have none).
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Prefixes held and their identities.
    #[must_use]
    pub fn held(&self) -> &BTreeMap<IpNet, Identity> {
        &self.held
    }

    /// Takes references on `wanted` prefixes not yet held and drops those no longer wanted.
    /// Acquisitions happen first and are undone if one fails, so on error nothing changed
    /// except possibly some releases at the end (which the next sync retries).
    pub fn sync(
        &mut self,
        wanted: &BTreeSet<IpNet>,
        alloc: &mut IdentityAllocator,
        store: &mut dyn IdentityStore,
        cache: &mut SelectorCache,
    ) -> Result<CidrSync, IdentityError> {
        let mut out = CidrSync::default();
        let mut taken: Vec<(IpNet, Identity, bool)> = Vec::new();
        for p in wanted.iter().filter(|p| !self.held.contains_key(p)) {
            let key = IdentityKey::Cidr(*p);
            match alloc.acquire(store, &key) {
                Ok(a) => taken.push((*p, a.id, a.new)),
                Err(e) => {
                    for (_, id, _) in taken.iter().rev() {
                        // Best effort: these ids were just taken and are known to the allocator.
                        let _ = alloc.release(store, *id);
                    }
                    return Err(e);
                }
            }
        }
        for (p, id, new) in taken {
            if new {
                out.changed
                    .extend(cache.identity_added(id, &IdentityKey::Cidr(p)));
                out.identities
                    .extend([id, crate::mapstate::reserved::by_ip(id)]);
            }
            self.held.insert(p, id);
            out.added.push((p, id));
        }
        let stale: Vec<(IpNet, Identity)> = self
            .held
            .iter()
            .filter(|(p, _)| !wanted.contains(p))
            .map(|(p, id)| (*p, *id))
            .collect();
        for (p, id) in stale {
            let freed = alloc.release(store, id)?;
            self.held.remove(&p);
            if freed {
                out.changed.extend(cache.identity_removed(id));
                out.identities
                    .extend([id, crate::mapstate::reserved::by_ip(id)]);
                out.released.push((p, id));
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::MemoryStore;
    use crate::rule::{CidrSelector, Entity};

    fn set(v: &[&str]) -> BTreeSet<IpNet> {
        v.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn sync_acquires_and_releases() {
        let (mut alloc, mut store, mut cache) = (
            IdentityAllocator::new(),
            MemoryStore::default(),
            SelectorCache::new(),
        );
        let world = PeerSelector::Entity(Entity::World);
        let cidr = PeerSelector::Cidr(CidrSelector {
            cidr: "10.0.0.0/8".parse().unwrap(),
            except: vec![],
            match_pods: false,
        });
        let mut repo = crate::repository::Repository::new();
        let mut rule = crate::rule::Rule::new(
            crate::selector::Selector::all(),
            crate::labels::LabelSet::new(),
        );
        rule.egress.push(crate::rule::PeerRule {
            peers: vec![world.clone(), cidr.clone()],
            ports: vec![],
        });
        repo.add(vec![rule]);
        cache.sync(&repo);

        let mut refs = CidrReferences::new();
        let s = refs
            .sync(
                &set(&["10.0.0.0/8", "10.1.0.0/16"]),
                &mut alloc,
                &mut store,
                &mut cache,
            )
            .unwrap();
        assert_eq!(s.added.len(), 2);
        assert_eq!(s.changed, BTreeSet::from([world.clone(), cidr.clone()]));
        assert_eq!(cache.identities(&cidr).len(), 2);
        // Idempotent.
        assert_eq!(
            refs.sync(
                &set(&["10.0.0.0/8", "10.1.0.0/16"]),
                &mut alloc,
                &mut store,
                &mut cache
            )
            .unwrap(),
            CidrSync::default()
        );
        let s = refs
            .sync(&set(&["10.0.0.0/8"]), &mut alloc, &mut store, &mut cache)
            .unwrap();
        assert_eq!(
            s.released,
            [("10.1.0.0/16".parse().unwrap(), (1 << 24) + 1)]
        );
        assert_eq!(store.saved.len(), 1);
        assert_eq!(cache.identities(&cidr).len(), 1);
    }

    /// Accepts a number of saves, then fails; removes always work.
    struct Flaky {
        inner: MemoryStore,
        saves_left: usize,
    }

    impl IdentityStore for Flaky {
        fn save(
            &mut self,
            id: Identity,
            key: &IdentityKey,
        ) -> Result<(), crate::identity::StoreError> {
            if self.saves_left == 0 {
                return Err(crate::identity::StoreError("full".into()));
            }
            self.saves_left -= 1;
            self.inner.save(id, key)
        }

        fn remove(&mut self, id: Identity) -> Result<(), crate::identity::StoreError> {
            self.inner.remove(id)
        }
    }

    #[test]
    fn failed_acquire_undoes_the_batch() {
        let (mut alloc, mut cache) = (IdentityAllocator::new(), SelectorCache::new());
        let mut store = Flaky {
            inner: MemoryStore::default(),
            saves_left: 2,
        };
        let mut refs = CidrReferences::new();
        refs.sync(&set(&["10.0.0.0/8"]), &mut alloc, &mut store, &mut cache)
            .unwrap();
        // One more save succeeds (10.1/16), the next (10.2/16) fails: 10.1/16 must be undone.
        let err = refs.sync(
            &set(&["10.0.0.0/8", "10.1.0.0/16", "10.2.0.0/16"]),
            &mut alloc,
            &mut store,
            &mut cache,
        );
        assert!(err.is_err());
        assert_eq!(refs.held().len(), 1);
        assert_eq!(alloc.cidr_identities().count(), 1);
        assert_eq!(store.inner.saved.len(), 1);
    }
}
