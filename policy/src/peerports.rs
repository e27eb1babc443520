//! Named ports of peer identities: for each identity, the numbers its pods give each port name,
//! as the union over its endpoints (this node's pods and, in kvstore mode, other nodes'). Egress
//! rules' `port: name` resolve against it ([`crate::selectorcache::SelectorCache::set_named_ports`]).
//!
//! Kept by owner (an endpoint, or a remote address), so an endpoint's arrival, change of
//! identity or ports, or departure touches exactly the identities it belonged to. When two pods
//! of one identity give a name different numbers, the identity gets both: the policy map is
//! keyed by identity, so a destination of that identity is allowed on either number
//! (docs/POLICY.md, "Named ports").

use crate::mapstate::Identity;
use crate::rule::{IdentityPorts, NamedPorts};
use std::collections::{BTreeMap, BTreeSet};

/// Per identity, (name, protocol) → port → how many owners give that name this port.
type Counts = BTreeMap<Identity, BTreeMap<(String, u8), BTreeMap<u16, usize>>>;

/// Owners' named ports and their union per identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerPorts<O: Ord + Clone> {
    owners: BTreeMap<O, (Identity, NamedPorts)>,
    counts: Counts,
}

impl<O: Ord + Clone> Default for PeerPorts<O> {
    fn default() -> Self {
        Self {
            owners: BTreeMap::new(),
            counts: BTreeMap::new(),
        }
    }
}

impl<O: Ord + Clone> PeerPorts<O> {
    /// Nobody has named ports.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// `owner` has identity `id` and these named ports now (replacing what it had; no ports is
    /// the same as [`Self::remove`]). Returns the identities whose union changed.
    pub fn set(&mut self, owner: O, id: Identity, ports: NamedPorts) -> BTreeSet<Identity> {
        if self.owners.get(&owner) == Some(&(id, ports.clone()))
            || (ports.is_empty() && !self.owners.contains_key(&owner))
        {
            return BTreeSet::new();
        }
        let old = self.owners.get(&owner).map(|(i, _)| *i);
        let before: Vec<(Identity, IdentityPorts)> = old
            .into_iter()
            .chain(std::iter::once(id))
            .map(|i| (i, self.union(i)))
            .collect();
        if let Some((old_id, old_ports)) = self.owners.remove(&owner) {
            self.count(old_id, &old_ports, false);
        }
        if !ports.is_empty() {
            self.count(id, &ports, true);
            self.owners.insert(owner, (id, ports));
        }
        before
            .into_iter()
            .filter(|(i, was)| self.union(*i) != *was)
            .map(|(i, _)| i)
            .collect()
    }

    /// `owner` is gone. Returns the identities whose union changed.
    pub fn remove(&mut self, owner: &O) -> BTreeSet<Identity> {
        match self.owners.get(owner) {
            Some((id, _)) => self.set(owner.clone(), *id, NamedPorts::new()),
            None => BTreeSet::new(),
        }
    }

    /// Removes every owner `gone` says is gone (a remote node left). Returns the identities
    /// whose union changed.
    pub fn remove_where(&mut self, gone: impl Fn(&O) -> bool) -> BTreeSet<Identity> {
        let doomed: Vec<O> = self.owners.keys().filter(|o| gone(o)).cloned().collect();
        let mut changed = BTreeSet::new();
        for o in doomed {
            changed.extend(self.remove(&o));
        }
        changed
    }

    /// The named ports of identity `id`'s pods (empty when none has any).
    #[must_use]
    pub fn union(&self, id: Identity) -> IdentityPorts {
        self.counts
            .get(&id)
            .map(|names| {
                names
                    .iter()
                    .map(|(k, ports)| (k.clone(), ports.keys().copied().collect()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every identity with named ports, with its union.
    pub fn unions(&self) -> impl Iterator<Item = (Identity, IdentityPorts)> + '_ {
        self.counts.keys().map(|&id| (id, self.union(id)))
    }

    /// Every owner with its identity and ports.
    pub fn owners(&self) -> impl Iterator<Item = (&O, Identity, &NamedPorts)> {
        self.owners.iter().map(|(o, (id, p))| (o, *id, p))
    }

    fn count(&mut self, id: Identity, ports: &NamedPorts, add: bool) {
        let names = self.counts.entry(id).or_default();
        for (key, &port) in ports {
            let numbers = names.entry(key.clone()).or_default();
            let n = numbers.entry(port).or_default();
            if add {
                *n += 1;
            } else {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    numbers.remove(&port);
                }
            }
            if numbers.is_empty() {
                names.remove(key);
            }
        }
        if names.is_empty() {
            self.counts.remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ports(list: &[(&str, u16)]) -> NamedPorts {
        list.iter()
            .map(|(n, p)| (((*n).to_owned(), 6), *p))
            .collect()
    }

    fn union(list: &[(&str, &[u16])]) -> IdentityPorts {
        list.iter()
            .map(|(n, ps)| (((*n).to_owned(), 6), ps.iter().copied().collect()))
            .collect()
    }

    #[test]
    fn replicas_that_differ_give_their_identity_both_numbers() {
        let mut pp: PeerPorts<u32> = PeerPorts::new();
        assert_eq!(
            pp.set(1, 300, ports(&[("http", 80)])),
            BTreeSet::from([300])
        );
        // Same numbers again: nothing changed.
        assert!(pp.set(2, 300, ports(&[("http", 80)])).is_empty());
        assert_eq!(
            pp.set(3, 300, ports(&[("http", 81)])),
            BTreeSet::from([300])
        );
        assert_eq!(pp.union(300), union(&[("http", &[80, 81])]));
        // One of the two pods with 80 leaves: 80 stays.
        assert!(pp.remove(&1).is_empty());
        assert_eq!(pp.remove(&2), BTreeSet::from([300]));
        assert_eq!(pp.union(300), union(&[("http", &[81])]));
        // A relabelled pod moves its ports to its new identity.
        assert_eq!(
            pp.set(3, 301, ports(&[("http", 81)])),
            BTreeSet::from([300, 301])
        );
        assert!(pp.union(300).is_empty());
        assert_eq!(pp.remove_where(|o| *o == 3), BTreeSet::from([301]));
        assert_eq!(pp, PeerPorts::new());
    }

    proptest! {
        /// Whatever the sequence, the unions are those of the owners as they are now, and the
        /// identities reported changed are exactly those whose union moved.
        #[test]
        fn unions_follow_the_owners(
            ops in proptest::collection::vec(
                (0u32..6, 300u32..303, proptest::collection::btree_map(
                    (prop_oneof![Just("a"), Just("b")], Just(6u8)), 80u16..83, 0..3)),
                0..40)
        ) {
            let mut pp: PeerPorts<u32> = PeerPorts::new();
            let mut model: BTreeMap<u32, (Identity, NamedPorts)> = BTreeMap::new();
            let fresh = |m: &BTreeMap<u32, (Identity, NamedPorts)>, id: Identity| {
                let mut u = IdentityPorts::new();
                for (i, p) in m.values() {
                    if *i == id {
                        for (k, port) in p {
                            u.entry(k.clone()).or_default().insert(*port);
                        }
                    }
                }
                u
            };
            for (owner, id, named) in ops {
                let named: NamedPorts = named.into_iter().map(|((n, p), port)| ((n.to_owned(), p), port)).collect();
                let before: Vec<IdentityPorts> = (300..303).map(|i| fresh(&model, i)).collect();
                let changed = pp.set(owner, id, named.clone());
                if named.is_empty() { model.remove(&owner); } else { model.insert(owner, (id, named)); }
                for (k, i) in (300..303).enumerate() {
                    let now = fresh(&model, i);
                    prop_assert_eq!(&pp.union(i), &now);
                    prop_assert_eq!(changed.contains(&i), before[k] != now);
                }
            }
        }
    }
}
