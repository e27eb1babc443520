//! Kernel-side state the datapath owns: the typed pinned maps, the loaded programs, and the
//! in-memory mirrors needed to diff policies and find endpoints by id.

use super::batch;
use super::encode::{PolicyBlock, SLOT_FLAGS, diff, encode_sorted, enforcement_flags, flag_bits};
use super::error::DatapathError;
use super::shadow::Shadow;
use super::trie::{LpmKey, PendingRead, by_slot, policy_blocks, policy_error};
use super::types::EndpointDatapath;
use aya::Ebpf;
use aya::maps::lpm_trie::{Key, LpmTrie};
use aya::maps::{HashMap as BpfHash, MapData, MapError, PerCpuHashMap};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use weft_ebpf::{self as abi, map_names as names};
use weft_policy::mapstate::{EndpointPolicy, PolicyEntry, TierFlags, Verdict, reserved};

/// The two programs this manager attaches: the object's own (loaded and verified by this
/// process, held by `Maps::ebpf`) or the ones a previous manager pinned for the same object.
pub(crate) struct Programs {
    /// `[weft_from_pod, weft_to_pod]` opened from their pins, when reused.
    pub(crate) pinned: Option<[aya::programs::SchedClassifier; 2]>,
    /// Digest of the object and map sizes (the pins' directory).
    pub(crate) digest: String,
    /// The programs are pinned (reused, or pinned after every endpoint was moved to them).
    pub(crate) committed: bool,
    /// Kernel ids of `[weft_from_pod, weft_to_pod]`, once asked for.
    pub(crate) ids: Option<[u32; 2]>,
}

/// A failed tc filter dump (or its socket).
pub(crate) fn filter_error(source: std::io::Error) -> DatapathError {
    DatapathError::Syscall {
        map: "tc filters",
        source,
    }
}

impl Programs {
    /// [`super::Datapath::programs`].
    pub(crate) fn word(&self) -> &'static str {
        if self.pinned.is_some() {
            super::PROGRAMS_REUSED
        } else {
            super::PROGRAMS_LOADED
        }
    }
}

pub(crate) struct Maps {
    /// Owns the programs when this process loaded them (`None`: reused from their pins);
    /// dropping it closes our fds, not the attached filters.
    pub(crate) ebpf: Option<Ebpf>,
    pub(crate) programs: Programs,
    /// Netlink socket for tc filter dumps (opened on first use).
    pub(crate) filters: Option<super::tcfilter::Socket>,
    pub(crate) endpoints: BpfHash<MapData, u32, abi::EndpointInfo>,
    pub(crate) ipcache: LpmTrie<MapData, abi::IpcacheKey, abi::IpcacheValue>,
    pub(crate) policy: LpmTrie<MapData, abi::PolicyKey, abi::PolicyValue>,
    pub(crate) policy_gen: BpfHash<MapData, u32, u64>,
    pub(crate) ct: BpfHash<MapData, abi::CtKey, abi::CtValue>,
    pub(crate) frags: BpfHash<MapData, abi::FragKey, abi::FragValue>,
    pub(crate) metrics: PerCpuHashMap<MapData, abi::MetricsKey, abi::MetricsValue>,
    pub(crate) lb_services: BpfHash<MapData, abi::LbKey, abi::LbService>,
    pub(crate) lb_backends: BpfHash<MapData, abi::LbBackendKey, abi::LbAddr>,
    pub(crate) lb_revnat: BpfHash<MapData, u32, abi::LbAddr>,
    pub(crate) lb_flows: BpfHash<MapData, abi::LbFlowKey, abi::LbFlow>,
    /// What the policy map holds per slot, for the slots whose entries were read back or
    /// written by this process (the diff base of the next write), packed.
    pub(crate) installed: HashMap<u32, Shadow>,
    /// The buffer every shadow of a write is packed through ([`Shadow::pack_into`]).
    pub(crate) scratch: Vec<u8>,
    /// Slots a previous run left in the trie whose entries were not read back (a restart that
    /// trusted them): read back together, with one dump, the first time one is written.
    pub(crate) unloaded: BTreeSet<u32>,
    /// A dump of the policy trie begun ahead ([`Self::begin_read_back`]), waited for and taken
    /// by the first write of the trie.
    pub(crate) pending: Option<PendingRead>,
    /// Enforcement and tier flags per slot (copied into each member's `endpoints` entry).
    pub(crate) slot_flags: HashMap<u32, u32>,
    /// endpoint id → slot, mirrors the endpoints map.
    pub(crate) slot_of: HashMap<u32, u32>,
    /// endpoint id → host ifindex, mirrors the endpoints map.
    pub(crate) by_id: HashMap<u32, u32>,
}

fn batch_error(e: batch::BatchError) -> DatapathError {
    policy_error(e.source)
}

pub(crate) fn ignore_missing(r: Result<(), MapError>) -> Result<(), MapError> {
    match r {
        Err(MapError::KeyNotFound) => Ok(()),
        Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        other => other,
    }
}

pub(crate) fn ipcache_key(prefix: ipnet::IpNet) -> Key<abi::IpcacheKey> {
    let prefix = prefix.trunc();
    let mut data = abi::IpcacheKey::default();
    match prefix.addr() {
        IpAddr::V4(a) => {
            data.family = abi::FAMILY_V4;
            data.addr[..4].copy_from_slice(&a.octets());
        }
        IpAddr::V6(a) => {
            data.family = abi::FAMILY_V6;
            data.addr = a.octets();
        }
    }
    Key::new(
        abi::IPCACHE_FIXED_PREFIX + u32::from(prefix.prefix_len()),
        data,
    )
}

impl Maps {
    /// The program `name` (one of the two) this manager attaches.
    pub(crate) fn program(
        &mut self,
        name: &'static str,
    ) -> Result<&mut aya::programs::SchedClassifier, DatapathError> {
        if let Some([from_pod, to_pod]) = self.programs.pinned.as_mut() {
            return match name {
                abi::PROG_FROM_POD => Ok(from_pod),
                abi::PROG_TO_POD => Ok(to_pod),
                _ => Err(DatapathError::Missing(name)),
            };
        }
        self.ebpf
            .as_mut()
            .and_then(|e| e.program_mut(name))
            .ok_or(DatapathError::Missing(name))?
            .try_into()
            .map_err(|e| DatapathError::Program {
                program: name,
                ifname: String::new(),
                source: Box::new(e),
            })
    }

    /// The kernel ids of the two programs this manager attaches.
    pub(crate) fn program_ids(&mut self) -> Result<[u32; 2], DatapathError> {
        if let Some(ids) = self.programs.ids {
            return Ok(ids);
        }
        let mut id = |name: &'static str| -> Result<u32, DatapathError> {
            Ok(self
                .program(name)?
                .info()
                .map_err(|e| DatapathError::Program {
                    program: name,
                    ifname: String::new(),
                    source: Box::new(e),
                })?
                .id())
        };
        let ids = [id(abi::PROG_FROM_POD)?, id(abi::PROG_TO_POD)?];
        self.programs.ids = Some(ids);
        Ok(ids)
    }

    /// The tc filter socket.
    pub(crate) fn filters(&mut self) -> Result<&mut super::tcfilter::Socket, DatapathError> {
        let socket = match self.filters.take() {
            Some(s) => s,
            None => super::tcfilter::Socket::open().map_err(filter_error)?,
        };
        Ok(self.filters.insert(socket))
    }

    fn policy_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use aya::maps::IterableMap;
        use std::os::fd::AsFd;
        self.policy.map().fd().as_fd()
    }

    /// Every policy block in the kernel of the slots `keep` accepts, in key order (so each
    /// slot's blocks are together: [`by_slot`]).
    pub(crate) fn kernel_policy(
        &self,
        keep: impl Fn(u32) -> bool,
    ) -> Result<Vec<(PolicyBlock, abi::PolicyValue)>, DatapathError> {
        let entries = batch::lookup_all(self.policy_fd());
        policy_blocks(entries, keep)
    }

    /// Starts reading the policy trie back on a thread of its own (module `trie`); a dump
    /// already under way is left to finish.
    pub(crate) fn begin_read_back(&mut self) -> Result<(), DatapathError> {
        if self.pending.is_none() && !self.unloaded.is_empty() {
            self.pending = Some(PendingRead::start(self.policy_fd()).map_err(policy_error)?);
        }
        Ok(())
    }

    /// Rebuilds the small mirrors from the pinned maps (they may predate this process). The
    /// policy trie is not read: every slot it may hold entries of has a `policy_gen` key, and
    /// their entries are read back only when needed ([`Self::load_slots`]).
    pub(crate) fn read_back(&mut self) -> Result<(), DatapathError> {
        for item in &self.endpoints {
            let (ifindex, info) = item.map_err(DatapathError::map(names::ENDPOINTS))?;
            self.by_id.insert(info.endpoint_id, ifindex);
            self.slot_of.insert(info.endpoint_id, info.policy_id);
            self.slot_flags
                .insert(info.policy_id, info.flags & SLOT_FLAGS);
        }
        for item in self.policy_gen.keys() {
            self.unloaded
                .insert(item.map_err(DatapathError::map(names::POLICY_GEN))?);
        }
        Ok(())
    }

    /// The `policy_gen` map.
    pub(crate) fn generations(&self) -> Result<BTreeMap<u32, u64>, DatapathError> {
        let mut out = BTreeMap::new();
        for item in &self.policy_gen {
            let (slot, generation) = item.map_err(DatapathError::map(names::POLICY_GEN))?;
            out.insert(slot, generation);
        }
        Ok(out)
    }

    /// Reads back the entries of the not yet loaded slots among `slots` (one dump of the trie).
    /// With a dump begun ahead ([`Self::begin_read_back`]) under way, that dump reads them,
    /// and the first write of the trie takes it ([`Self::ensure_loaded`]).
    pub(crate) fn load_slots(&mut self, slots: &BTreeSet<u32>) -> Result<(), DatapathError> {
        if self.pending.is_some() {
            return Ok(());
        }
        self.read_slots(slots)
    }

    /// Loads the not yet loaded slots among `slots` from the dump begun ahead (waited for),
    /// or from one dump now; a dump begun ahead is always taken, even when none is wanted.
    fn read_slots(&mut self, slots: &BTreeSet<u32>) -> Result<(), DatapathError> {
        let wanted: BTreeSet<u32> = slots.intersection(&self.unloaded).copied().collect();
        if wanted.is_empty() && self.pending.is_none() {
            return Ok(());
        }
        let t0 = std::time::Instant::now();
        let pending = self.pending.take();
        // A dump begun ahead read the trie as it is: nothing wrote it since.
        let entries = match pending {
            Some(pending) => pending.finish(),
            None => batch::lookup_all(self.policy_fd()),
        };
        let read = policy_blocks(entries, |slot| wanted.contains(&slot))?;
        // A slot with no entry left in the trie holds nothing; the others hold what was read.
        for slot in &wanted {
            self.installed.insert(*slot, Shadow::default());
            self.unloaded.remove(slot);
        }
        for (slot, blocks) in by_slot(&read) {
            let shadow = Shadow::pack_into(&mut self.scratch, blocks.iter().copied());
            self.installed.insert(slot, shadow);
        }
        tracing::info!(
            slots = wanted.len(),
            ms = t0.elapsed().as_secs_f64() * 1000.0,
            "policy slots read back"
        );
        Ok(())
    }

    /// Before writing a slot: its entries must be known (a trusted slot's are read back now,
    /// together with every other unloaded slot: one dump instead of one per slot). A dump
    /// begun ahead is taken first, whatever the slot: the trie is not written while it is
    /// read, and every unloaded slot is loaded from what it read.
    fn ensure_loaded(&mut self, slot: u32) -> Result<(), DatapathError> {
        if self.pending.is_some() || self.unloaded.contains(&slot) {
            let all = self.unloaded.clone();
            self.read_slots(&all)?;
        }
        Ok(())
    }

    fn set_generation(&mut self, slot: u32, generation: u64) -> Result<(), DatapathError> {
        self.policy_gen
            .insert(slot, generation, 0)
            .map_err(DatapathError::map(names::POLICY_GEN))
    }

    pub(crate) fn install_world(&mut self) -> Result<(), DatapathError> {
        // The two default routes (0.0.0.0/0 and ::/0).
        for prefix in [
            ipnet::Ipv4Net::default().into(),
            ipnet::Ipv6Net::default().into(),
        ] {
            let key = ipcache_key(prefix);
            match self.ipcache.get(&key, 0) {
                Ok(_) => {}
                Err(MapError::KeyNotFound) => {
                    let value = abi::IpcacheValue {
                        identity: reserved::WORLD,
                        cidr_identity: 0,
                    };
                    self.ipcache
                        .insert(&key, value, 0)
                        .map_err(DatapathError::map(names::IPCACHE))?;
                }
                Err(e) => return Err(DatapathError::map(names::IPCACHE)(e)),
            }
        }
        Ok(())
    }

    /// See [`super::Datapath::restore_slot_flags`].
    pub(crate) fn restore_slot_flags(
        &mut self,
        slot: u32,
        ingress: bool,
        egress: bool,
        tiers: TierFlags,
    ) {
        self.slot_flags
            .entry(slot)
            .or_insert(flag_bits(ingress, egress, tiers));
    }

    /// Gives every member of `slot` the slot's enforcement and tier flags.
    fn set_slot_flags(&mut self, slot: u32, flags: u32) -> Result<(), DatapathError> {
        if self.slot_flags.insert(slot, flags) == Some(flags) {
            return Ok(());
        }
        let members: Vec<u32> = self
            .slot_of
            .iter()
            .filter(|&(_, &s)| s == slot)
            .map(|(&ep, _)| ep)
            .collect();
        for ep in members {
            self.rewrite_entry(ep, |info| {
                info.flags = (info.flags & !SLOT_FLAGS) | flags;
            })?;
        }
        Ok(())
    }

    /// Read-modify-write of one endpoint's entry (a missing entry: nothing to do).
    fn rewrite_entry(
        &mut self,
        endpoint_id: u32,
        change: impl FnOnce(&mut abi::EndpointInfo),
    ) -> Result<(), DatapathError> {
        let Some(&ifindex) = self.by_id.get(&endpoint_id) else {
            return Ok(());
        };
        let mut info = self
            .endpoints
            .get(&ifindex, 0)
            .map_err(DatapathError::map(names::ENDPOINTS))?;
        change(&mut info);
        self.endpoints
            .insert(ifindex, info, 0)
            .map_err(DatapathError::map(names::ENDPOINTS))
    }

    /// Points an endpoint at another slot: one update of its entry carries the slot and the
    /// slot's flags, so the datapath sees either the old policy or the new one.
    pub(crate) fn switch_slot(&mut self, endpoint_id: u32, slot: u32) -> Result<(), DatapathError> {
        let flags = self.slot_flags.get(&slot).copied().unwrap_or(0);
        self.rewrite_entry(endpoint_id, |info| {
            info.policy_id = slot;
            info.flags = (info.flags & !SLOT_FLAGS) | flags;
        })?;
        self.slot_of.insert(endpoint_id, slot);
        Ok(())
    }

    pub(crate) fn apply(
        &mut self,
        slot: u32,
        policy: &EndpointPolicy,
        generation: u64,
    ) -> Result<u64, DatapathError> {
        self.ensure_loaded(slot)?;
        let new = encode_sorted(slot, &policy.entries);
        let flags = enforcement_flags(policy);
        let base = self.installed.remove(&slot).unwrap_or_default();
        let (upserts, removes) = diff(base.iter(slot), new.iter().copied());
        let after = Shadow::pack_into(&mut self.scratch, new.into_iter());
        let complete = (after.digest(flags), after);
        self.write(
            slot,
            &base,
            &upserts,
            &removes,
            Some(flags),
            generation,
            complete,
        )
    }

    /// Replaces the entries of `identities` only; the rest of the slot's policy and its
    /// enforcement flags stay as they are.
    pub(crate) fn apply_identities(
        &mut self,
        slot: u32,
        identities: &BTreeSet<u32>,
        entries: &BTreeMap<PolicyEntry, Verdict>,
        generation: u64,
    ) -> Result<u64, DatapathError> {
        self.ensure_loaded(slot)?;
        let new = encode_sorted(slot, entries);
        let base = self.installed.remove(&slot).unwrap_or_default();
        let flags = self.slot_flags.get(&slot).copied().unwrap_or(0);
        let (old, after) = base.replacing(slot, identities, &new, &mut self.scratch);
        let (upserts, removes) = diff(old, new.iter().copied());
        let complete = (after.digest(flags), after);
        self.write(slot, &base, &upserts, &removes, None, generation, complete)
    }

    /// Writes a diff into the policy map over `base` (the slot's shadow, taken out of
    /// `installed`) and records in `installed` exactly what reached the kernel: `complete` (the
    /// slot's shadow and digest once every write of the diff is in, computed by the caller in
    /// the pass that diffed) when the write completes, the diff's part that reached the kernel
    /// merged over `base` after a failure half-way. The slot's generation is 0 while it is
    /// written and `generation` once it is complete. Returns the digest of the slot's contents.
    #[allow(clippy::too_many_arguments)]
    fn write(
        &mut self,
        slot: u32,
        base: &Shadow,
        upserts: &[(PolicyBlock, abi::PolicyValue)],
        removes: &[PolicyBlock],
        flags: Option<u32>,
        generation: u64,
        complete: (u64, Shadow),
    ) -> Result<u64, DatapathError> {
        let (mut upserts_done, mut removes_done) = (0, 0);
        let result = (|| {
            self.set_generation(slot, 0)?;
            // Add-before-delete (Cilium #46927): the union of old and new never drops a packet
            // that both allow; the encoding guarantees no deny block covers such a packet. The
            // flags between the two: a tier's flag turns on once its entries are in, and off
            // before they go.
            let keys: Vec<LpmKey> = upserts.iter().map(|(b, _)| LpmKey::of(b)).collect();
            let values: Vec<abi::PolicyValue> = upserts.iter().map(|&(_, v)| v).collect();
            let written = batch::update(self.policy_fd(), &keys, &values);
            upserts_done = written.as_ref().map_or_else(|e| e.done, |()| upserts.len());
            written.map_err(batch_error)?;
            if let Some(flags) = flags {
                self.set_slot_flags(slot, flags)?;
            }
            let keys: Vec<LpmKey> = removes.iter().map(LpmKey::of).collect();
            let deleted = batch::delete(self.policy_fd(), &keys);
            removes_done = deleted.as_ref().map_or_else(|e| e.done, |()| removes.len());
            deleted.map_err(batch_error)?;
            self.set_generation(slot, generation)
        })();
        let Err(error) = result else {
            let (digest, shadow) = complete;
            self.installed.insert(slot, shadow);
            return Ok(digest);
        };
        // Upserts and removes are disjoint (`diff`); a remove is the later write.
        let reached: BTreeMap<PolicyBlock, Option<abi::PolicyValue>> = upserts
            .iter()
            .take(upserts_done)
            .map(|&(b, v)| (b, Some(v)))
            .chain(removes.iter().take(removes_done).map(|&b| (b, None)))
            .collect();
        let shadow = base.merged(slot, &reached, &mut self.scratch);
        self.installed.insert(slot, shadow);
        Err(error)
    }

    /// Removes a slot's entries, then its generation (the key stays while entries may remain).
    pub(crate) fn release_slot(&mut self, slot: u32) -> Result<(), DatapathError> {
        self.ensure_loaded(slot)?;
        self.set_generation(slot, 0)?;
        let blocks: Vec<PolicyBlock> = self
            .installed
            .get(&slot)
            .map(|s| s.blocks(slot).collect())
            .unwrap_or_default();
        let keys: Vec<LpmKey> = blocks.iter().map(LpmKey::of).collect();
        let deleted = batch::delete(self.policy_fd(), &keys);
        if let Err(e) = deleted {
            if let Some(shadow) = self.installed.get_mut(&slot) {
                let removed = blocks.iter().take(e.done).map(|&b| (b, None)).collect();
                *shadow = shadow.merged(slot, &removed, &mut self.scratch);
            }
            return Err(batch_error(e));
        }
        self.installed.remove(&slot);
        self.slot_flags.remove(&slot);
        ignore_missing(self.policy_gen.remove(&slot)).map_err(DatapathError::map(names::POLICY_GEN))
    }

    /// Removes the ct and metrics entries of the given endpoints.
    pub(crate) fn purge(&mut self, ids: &BTreeSet<u32>) -> Result<(), DatapathError> {
        for id in ids {
            self.slot_of.remove(id);
        }
        // Scans only live flows; an endpoint id reused by a new pod must not inherit them.
        let stale_ct: Vec<abi::CtKey> = self
            .ct
            .keys()
            .filter_map(Result::ok)
            .filter(|k| ids.contains(&k.endpoint_id))
            .collect();
        for key in stale_ct {
            ignore_missing(self.ct.remove(&key)).map_err(DatapathError::map(names::CT))?;
        }
        // Metrics keys are known: deleting them directly avoids scanning every bucket.
        for &endpoint_id in ids {
            for direction in [abi::DIR_INGRESS, abi::DIR_EGRESS] {
                for reason in 0..=abi::REASON_MAX {
                    let key = abi::MetricsKey {
                        endpoint_id,
                        direction,
                        reason,
                        pad: 0,
                    };
                    ignore_missing(self.metrics.remove(&key))
                        .map_err(DatapathError::map(names::METRICS))?;
                }
            }
        }
        Ok(())
    }

    pub(crate) fn remove_endpoint_entry(
        &mut self,
        ifindex: u32,
        endpoint_id: u32,
    ) -> Result<(), DatapathError> {
        match self.endpoints.get(&ifindex, 0) {
            Ok(info) if info.endpoint_id == endpoint_id => {
                ignore_missing(self.endpoints.remove(&ifindex))
                    .map_err(DatapathError::map(names::ENDPOINTS))?;
            }
            Ok(_) | Err(MapError::KeyNotFound) => {}
            Err(e) => return Err(DatapathError::map(names::ENDPOINTS)(e)),
        }
        if self.by_id.get(&endpoint_id) == Some(&ifindex) {
            self.by_id.remove(&endpoint_id);
        }
        Ok(())
    }
}

pub(crate) fn endpoint_info(ep: &EndpointDatapath, flags: u32) -> abi::EndpointInfo {
    let mut info = abi::EndpointInfo {
        endpoint_id: ep.endpoint_id,
        identity: ep.identity,
        flags,
        policy_id: ep.policy_id,
        mac: ep.pod_mac,
        ..Default::default()
    };
    for ip in &ep.ips {
        match ip {
            IpAddr::V4(a) if info.flags & abi::EP_HAS_IPV4 == 0 => {
                info.ipv4 = a.octets();
                info.flags |= abi::EP_HAS_IPV4;
            }
            IpAddr::V6(a) if info.flags & abi::EP_HAS_IPV6 == 0 => {
                info.ipv6 = a.octets();
                info.flags |= abi::EP_HAS_IPV6;
            }
            _ => {}
        }
    }
    info
}
