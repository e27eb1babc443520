//! Policy slots: endpoints with the same identity and named ports have the same policy, so they
//! share one set of policy entries (a slot), referenced from each endpoint's
//! `endpoints` entry. Map entries, regeneration work and restart read-back then grow with the
//! distinct (identity, named ports) pairs on the node, not with its endpoints.
//!
//! This module is the bookkeeping: which slot stands for which key, which endpoints point at it,
//! and, per slot, the generation and digest of its last complete write. Those are persisted so
//! that a restarted manager trusts a slot whose generation in the kernel (`policy_gen`, 0 while a
//! write is under way) equals the recorded one, and does not read it back. Each record says
//! which policy compiler wrote it ([`Compiler`]): a slot another build computed is recomputed
//! (and read back when that build encoded it otherwise), never kept as computed.
//! docs/DATAPATH.md, "Policy slots" and "Restart that trusts what it wrote".

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use weft_policy::mapstate::{EndpointPolicy, Identity, TierFlags};
use weft_policy::rule::NamedPorts;

use crate::store::{Store, StoreError};

/// What makes two endpoints' policies equal: identity and the named ports of the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SlotKey {
    /// Security identity.
    pub identity: Identity,
    /// Digest of the pod's named ports (0: none).
    pub ports: u64,
}

impl SlotKey {
    /// The key of an endpoint with `identity` and `named` ports.
    #[must_use]
    pub fn new(identity: Identity, named: &NamedPorts) -> Self {
        let ports = if named.is_empty() {
            0
        } else {
            let mut bytes = Vec::new();
            for ((name, proto), port) in named {
                bytes.extend_from_slice(name.as_bytes());
                bytes.push(0);
                bytes.push(*proto);
                bytes.extend_from_slice(&port.to_le_bytes());
            }
            weft_api::fnv::hash64(&bytes)
        };
        Self { identity, ports }
    }
}

/// A slot's enforcement flags: whether its members' ingress and egress are policed at all, and
/// which `ClusterNetworkPolicy` tiers they look up. The kernel keeps them only in its members'
/// `endpoints` entries, so a slot kept without members across a restart has them from its
/// record alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Enforcement {
    /// Ingress is enforced.
    pub ingress: bool,
    /// Egress is enforced.
    pub egress: bool,
    /// Tiers with entries (absent in records of builds without tiers: none).
    #[serde(default, skip_serializing_if = "TierFlags::is_empty")]
    pub tiers: TierFlags,
}

impl Enforcement {
    /// The flags `policy` gives its endpoints.
    #[must_use]
    pub fn of(policy: &EndpointPolicy) -> Self {
        Self {
            ingress: policy.ingress_enforced,
            egress: policy.egress_enforced,
            tiers: policy.tiers,
        }
    }
}

/// What computed and encoded a slot's contents: the versions of the policy computation
/// ([`weft_policy::compiler::POLICY_COMPILER_VERSION`]) and of its encoding into the policy maps, the
/// flag bits and the slot digest ([`crate::datapath::POLICY_ENCODING_VERSION`]). Persisted in
/// each record: a restart trusts what another build wrote only as far as this build computes
/// and encodes the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Compiler {
    /// Version of the policy computation.
    pub policy: u32,
    /// Version of the map encoding and slot digest.
    pub encoding: u32,
}

impl Compiler {
    /// This build's.
    pub const CURRENT: Self = Self {
        policy: weft_policy::compiler::POLICY_COMPILER_VERSION,
        encoding: crate::datapath::POLICY_ENCODING_VERSION,
    };
}

impl std::fmt::Display for Compiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "policy v{} encoding v{}", self.policy, self.encoding)
    }
}

/// The persisted part of a slot. A record from before `enforcement` existed does not parse:
/// its slot is read back and rewritten, as one without a record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// What the slot stands for.
    pub key: SlotKey,
    /// Generation of its last complete write (the kernel's `policy_gen` value then).
    pub generation: u64,
    /// Digest of its contents then ([`crate::datapath::digest`]).
    pub digest: u64,
    /// Its enforcement flags then.
    pub enforcement: Enforcement,
    /// What computed and encoded those contents (`None`: a build from before records said).
    #[serde(default)]
    pub compiler: Option<Compiler>,
}

#[derive(Debug, Clone)]
struct Slot {
    /// `None`: a slot found in the kernel without a record (nobody will be given it).
    key: Option<SlotKey>,
    members: BTreeSet<u32>,
    /// Digest of the contents, when known to be complete.
    digest: Option<u64>,
    /// The flags of the last complete whole-policy write.
    enforcement: Option<Enforcement>,
    /// Generation of the last complete write (0: none yet, or one failed).
    generation: u64,
    /// Restored from a previous run with a matching generation and this build's
    /// [`Compiler`]: its entries are what this computation gave for that run's inputs.
    trusted: bool,
    /// What computed the contents `digest` stands for (`None`: unknown).
    compiler: Option<Compiler>,
    /// Since when (ms) a slot without members is kept for the next endpoint of its key
    /// ([`SlotTable::mark_idle`]).
    idle_since: Option<u64>,
}

/// What a restore found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Restored {
    /// Slots whose kernel generation equals their record's, written with this build's
    /// encoding: not read back, their record's digest taken as their contents'.
    pub trusted: BTreeSet<u32>,
    /// Slots that may hold entries but cannot be trusted (a write did not finish, no record, a
    /// record of another generation, or of another or unknown encoding): read back and diffed.
    pub untrusted: BTreeSet<u32>,
    /// The persisted inputs digest equals the current one: trusted slots this build's
    /// compiler wrote need no recompute.
    pub inputs_unchanged: bool,
    /// Slots whose record another build's compiler wrote, with its versions (`None`: a build
    /// from before records said): none is taken as computed. With this build's encoding each
    /// is recomputed and compared with its record's digest; with another or an unknown one it
    /// is read back ([`Self::untrusted`]) and rewritten where it differs.
    pub other_compiler: BTreeMap<u32, Option<Compiler>>,
}

/// A slot's record is kept (its digest and enforcement trusted, its entries not read back)
/// when its last write completed under the generation the kernel holds, by a build with this
/// one's encoding: entries another encoding wrote are not what this one writes for the same
/// policy, and their record's digest is another digest, so nothing of theirs is kept.
fn kept(record: Option<&Record>, generation: u64, current: Compiler) -> bool {
    generation != 0
        && record.is_some_and(|rec| {
            rec.generation == generation
                && rec.compiler.is_some_and(|c| c.encoding == current.encoding)
        })
}

/// Every slot of the node.
pub struct SlotTable {
    store: Store,
    slots: BTreeMap<u32, Slot>,
    by_key: HashMap<SlotKey, u32>,
    of: HashMap<u32, u32>,
    next_generation: u64,
    /// Slots whose record must be rewritten (or removed) at the next persist.
    unpersisted: BTreeSet<u32>,
}

impl SlotTable {
    /// An empty table (a node whose kernel maps hold no slot).
    #[must_use]
    pub fn new(store: Store) -> Self {
        Self {
            store,
            slots: BTreeMap::new(),
            by_key: HashMap::new(),
            of: HashMap::new(),
            next_generation: 1,
            unpersisted: BTreeSet::new(),
        }
    }

    /// Rebuilds the table from the persisted records and the kernel's `policy_gen` map.
    /// `inputs` is the current inputs digest ([`crate::policy_state::PolicyState::inputs_digest`]).
    pub fn restore(
        store: Store,
        kernel: &BTreeMap<u32, u64>,
        inputs: u64,
    ) -> Result<(Self, Restored), StoreError> {
        let (records, persisted_inputs) = store.load_slots::<Record>()?;
        let current = Compiler::CURRENT;
        let mut t = Self::new(store);
        let mut r = Restored {
            inputs_unchanged: persisted_inputs == Some(inputs),
            ..Restored::default()
        };
        let max_record = records
            .values()
            .map(|rec| rec.generation)
            .max()
            .unwrap_or(0);
        let max_kernel = kernel.values().copied().max().unwrap_or(0);
        t.next_generation = max_record.max(max_kernel) + 1;
        for (&slot, &generation) in kernel {
            let record = records.get(&slot);
            if let Some(rec) = record.filter(|rec| rec.compiler != Some(current)) {
                r.other_compiler.insert(slot, rec.compiler);
            }
            let kept = kept(record, generation, current);
            let kept_record = record.filter(|_| kept);
            let key = record.map(|rec| rec.key);
            if let Some(k) = key {
                t.by_key.entry(k).or_insert(slot);
            }
            t.slots.insert(
                slot,
                Slot {
                    key,
                    members: BTreeSet::new(),
                    digest: kept_record.map(|rec| rec.digest),
                    enforcement: kept_record.map(|rec| rec.enforcement),
                    generation: if kept { generation } else { 0 },
                    // Another build's computation is recomputed, whatever the inputs.
                    trusted: kept_record.is_some_and(|rec| rec.compiler == Some(current)),
                    compiler: kept_record.and_then(|rec| rec.compiler),
                    idle_since: None,
                },
            );
            if kept {
                r.trusted.insert(slot);
            } else {
                r.untrusted.insert(slot);
                t.unpersisted.insert(slot);
            }
        }
        // Records of slots the kernel no longer has (maps recreated): removed at next persist.
        t.unpersisted
            .extend(records.keys().filter(|s| !kernel.contains_key(s)));
        Ok((t, r))
    }

    /// Whether [`Self::restore`] will find a slot it cannot keep, whose entries are then read
    /// back: known from the records and the kernel's generations alone, before the policy is
    /// restored, so a start can begin that read-back early
    /// ([`crate::datapath::Datapath::begin_read_back`]).
    pub fn read_back_ahead(store: &Store, kernel: &BTreeMap<u32, u64>) -> Result<bool, StoreError> {
        let (records, _) = store.load_slots::<Record>()?;
        Ok(kernel
            .iter()
            .any(|(slot, &generation)| !kept(records.get(slot), generation, Compiler::CURRENT)))
    }

    /// The slot an endpoint points at.
    #[must_use]
    pub fn slot_of(&self, endpoint_id: u32) -> Option<u32> {
        self.of.get(&endpoint_id).copied()
    }

    /// The slot standing for `key`, if any.
    #[must_use]
    pub fn find(&self, key: &SlotKey) -> Option<u32> {
        self.by_key.get(key).copied()
    }

    /// The key a slot stands for.
    #[must_use]
    pub fn key(&self, slot: u32) -> Option<SlotKey> {
        self.slots.get(&slot).and_then(|s| s.key)
    }

    /// The slot for `key`, created empty (no entries, no members) when there is none.
    /// Returns it and whether it was created.
    pub fn ensure(&mut self, key: SlotKey) -> (u32, bool) {
        if let Some(&slot) = self.by_key.get(&key) {
            return (slot, false);
        }
        // Lowest free id above 0: ids stay small and a freed one is reused.
        // There are never 2^32 slots (the maps hold 65 536 endpoints).
        let slot = (1..=u32::MAX)
            .find(|id| !self.slots.contains_key(id))
            .unwrap_or(u32::MAX);
        self.slots.insert(
            slot,
            Slot {
                key: Some(key),
                members: BTreeSet::new(),
                digest: None,
                enforcement: None,
                generation: 0,
                trusted: false,
                compiler: None,
                idle_since: None,
            },
        );
        self.by_key.insert(key, slot);
        (slot, true)
    }

    /// Records that an endpoint points at `slot` now. Returns the slot it pointed at before.
    pub fn join(&mut self, endpoint_id: u32, slot: u32) -> Option<u32> {
        let old = self.of.insert(endpoint_id, slot);
        if let Some(old) = old.filter(|&o| o != slot)
            && let Some(s) = self.slots.get_mut(&old)
        {
            s.members.remove(&endpoint_id);
        }
        if let Some(s) = self.slots.get_mut(&slot) {
            s.members.insert(endpoint_id);
            s.idle_since = None;
        }
        old.filter(|&o| o != slot)
    }

    /// Records that an endpoint is gone. Returns its slot.
    pub fn leave(&mut self, endpoint_id: u32) -> Option<u32> {
        let slot = self.of.remove(&endpoint_id)?;
        if let Some(s) = self.slots.get_mut(&slot) {
            s.members.remove(&endpoint_id);
        }
        Some(slot)
    }

    /// The endpoints pointing at `slot`.
    #[must_use]
    pub fn members(&self, slot: u32) -> Vec<u32> {
        self.slots
            .get(&slot)
            .map(|s| s.members.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Slots no endpoint points at (to release).
    #[must_use]
    pub fn unused(&self) -> Vec<u32> {
        self.slots
            .iter()
            .filter(|(_, s)| s.members.is_empty())
            .map(|(id, _)| *id)
            .collect()
    }

    /// Whether `slot` has no member.
    #[must_use]
    pub fn is_unused(&self, slot: u32) -> bool {
        self.slots.get(&slot).is_some_and(|s| s.members.is_empty())
    }

    /// Keeps `slot`, which has no member, for reuse by the next endpoint of its key (a pod
    /// replaced by one with the same labels), idle since `now_ms`, until
    /// [`Self::idle_expired`] hands it back for release. Its entries stay as last written; a
    /// reuse recomputes the policy and rewrites the slot only if that differs
    /// (`Manager::prepare_slot`).
    pub fn mark_idle(&mut self, slot: u32, now_ms: u64) {
        if let Some(s) = self.slots.get_mut(&slot)
            && s.members.is_empty()
            && s.idle_since.is_none()
        {
            s.idle_since = Some(now_ms);
        }
    }

    /// Whether `slot` is kept idle (no member) for reuse.
    #[must_use]
    pub fn is_idle(&self, slot: u32) -> bool {
        self.slots
            .get(&slot)
            .is_some_and(|s| s.members.is_empty() && s.idle_since.is_some())
    }

    /// Idle slots to release at `now_ms`: idle for at least `grace_ms`, or standing for an
    /// identity `held` says is gone.
    #[must_use]
    pub fn idle_expired(
        &self,
        now_ms: u64,
        grace_ms: u64,
        held: impl Fn(Identity) -> bool,
    ) -> Vec<u32> {
        self.slots
            .iter()
            .filter(|(_, s)| s.members.is_empty())
            .filter(|(_, s)| {
                s.idle_since.is_some_and(|t| {
                    now_ms.saturating_sub(t) >= grace_ms || s.key.is_some_and(|k| !held(k.identity))
                })
            })
            .map(|(id, _)| *id)
            .collect()
    }

    /// Forgets a released slot.
    pub fn remove(&mut self, slot: u32) {
        if let Some(s) = self.slots.remove(&slot)
            && let Some(k) = s.key
            && self.by_key.get(&k) == Some(&slot)
        {
            self.by_key.remove(&k);
        }
        self.unpersisted.insert(slot);
    }

    /// Starts a write of `slot`: its contents are unknown until [`Self::written`], and so are
    /// its enforcement flags if the write is of a `whole` policy. Returns the generation to
    /// write.
    pub fn begin_write(&mut self, slot: u32, whole: bool) -> u64 {
        let generation = self.next_generation;
        self.next_generation += 1;
        if let Some(s) = self.slots.get_mut(&slot) {
            s.digest = None;
            s.generation = 0;
            s.trusted = false;
            if whole {
                s.enforcement = None;
                s.compiler = None;
            }
        }
        self.unpersisted.insert(slot);
        generation
    }

    /// A write of `slot` completed at `generation`, leaving contents with `digest`, and the
    /// flags `enforcement` (`None`: a write of some identities' entries, which keeps them).
    pub fn written(
        &mut self,
        slot: u32,
        generation: u64,
        digest: u64,
        enforcement: Option<Enforcement>,
    ) {
        if let Some(s) = self.slots.get_mut(&slot) {
            s.digest = Some(digest);
            s.generation = generation;
            // A write of some identities leaves the others' entries as whoever computed them.
            if enforcement.is_some() {
                s.compiler = Some(Compiler::CURRENT);
            }
            s.enforcement = enforcement.or(s.enforcement);
        }
    }

    /// This build computed `slot`'s policy and found its contents equal (same digest) to what
    /// is there: from now on its record says this build's compiler wrote it.
    pub fn computed(&mut self, slot: u32) {
        if let Some(s) = self.slots.get_mut(&slot)
            && s.digest.is_some()
            && s.compiler != Some(Compiler::CURRENT)
        {
            s.compiler = Some(Compiler::CURRENT);
            self.unpersisted.insert(slot);
        }
    }

    /// The enforcement flags of a slot's last complete write, if known.
    #[must_use]
    pub fn enforcement(&self, slot: u32) -> Option<Enforcement> {
        self.slots.get(&slot).and_then(|s| s.enforcement)
    }

    /// The digest of a slot's complete contents, if known.
    #[must_use]
    pub fn digest(&self, slot: u32) -> Option<u64> {
        self.slots.get(&slot).and_then(|s| s.digest)
    }

    /// Whether a restore trusted `slot` as this build's computation for the previous run's
    /// inputs, and nothing wrote it since.
    #[must_use]
    pub fn trusted(&self, slot: u32) -> bool {
        self.slots.get(&slot).is_some_and(|s| s.trusted)
    }

    /// Ends the restart's use of trust: from now on every slot is recomputed when asked.
    pub fn forget_trust(&mut self) {
        for s in self.slots.values_mut() {
            s.trusted = false;
        }
    }

    /// Number of slots.
    #[must_use]
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether there is no slot.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Writes the records changed since the last call, and `inputs` (the digest the slots are
    /// now complete for; `None` when they may not be: the next restart recomputes them all).
    pub fn persist(&mut self, inputs: Option<u64>) -> Result<(), StoreError> {
        let mut put = Vec::new();
        let mut remove = Vec::new();
        for slot in &self.unpersisted {
            match self.slots.get(slot) {
                Some(s) => match (s.key, s.digest, s.enforcement) {
                    (Some(key), Some(digest), Some(enforcement)) if s.generation != 0 => {
                        put.push((
                            *slot,
                            Record {
                                key,
                                generation: s.generation,
                                digest,
                                enforcement,
                                compiler: s.compiler,
                            },
                        ));
                    }
                    _ => remove.push(*slot),
                },
                None => remove.push(*slot),
            }
        }
        let refs: Vec<(u32, &Record)> = put.iter().map(|(s, r)| (*s, r)).collect();
        self.store.write_slots(&refs, &remove, inputs)?;
        self.unpersisted.clear();
        Ok(())
    }

    /// Whether records changed since the last persist.
    #[must_use]
    pub fn needs_persist(&self) -> bool {
        !self.unpersisted.is_empty()
    }
}

#[cfg(test)]
mod tests;
