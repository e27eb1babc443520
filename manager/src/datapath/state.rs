//! Kernel-side state the datapath owns: the typed pinned maps, the loaded programs, and the
//! in-memory mirrors needed to diff policies and find endpoints by id.

use super::encode::{SLOT_FLAGS, flag_bits};
use super::error::DatapathError;
use super::lists::Lists;
use super::shadow::Shadow;
use super::trie::PendingRead;
use super::types::EndpointDatapath;
use aya::Ebpf;
use aya::maps::lpm_trie::{Key, LpmTrie};
use aya::maps::{HashMap as BpfHash, MapData, MapError, PerCpuHashMap};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use weft_ebpf::{self as abi, map_names as names};
use weft_policy::mapstate::{TierFlags, reserved};

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
    pub(crate) policy_pairs: BpfHash<MapData, abi::PolicyPairKey, u32>,
    pub(crate) policy_lists: LpmTrie<MapData, abi::PolicyListKey, abi::PolicyValue>,
    pub(crate) policy_gen: BpfHash<MapData, u32, u64>,
    pub(crate) ct: BpfHash<MapData, abi::CtKey, abi::CtValue>,
    pub(crate) frags: BpfHash<MapData, abi::FragKey, abi::FragValue>,
    pub(crate) metrics: PerCpuHashMap<MapData, abi::MetricsKey, abi::MetricsValue>,
    pub(crate) lb_services: BpfHash<MapData, abi::LbKey, abi::LbService>,
    pub(crate) lb_backends: BpfHash<MapData, abi::LbBackendKey, abi::LbAddr>,
    pub(crate) lb_revnat: BpfHash<MapData, u32, abi::LbAddr>,
    pub(crate) lb_flows: BpfHash<MapData, abi::LbFlowKey, abi::LbFlow>,
    /// What the policy maps hold per slot, for the slots whose entries were read back or
    /// written by this process (the diff base of the next write), packed.
    pub(crate) installed: HashMap<u32, Shadow>,
    /// The buffer every shadow of a write is packed through ([`Shadow::pack_into`]).
    pub(crate) scratch: Vec<u8>,
    /// Slots a previous run left in the policy maps whose entries were not read back (a restart
    /// that trusted them), or whose last write failed: read back together, with one dump, the
    /// first time one is written.
    pub(crate) unloaded: BTreeSet<u32>,
    /// A dump of the policy maps begun ahead ([`Self::begin_read_back`]), waited for and taken
    /// by the first write of them.
    pub(crate) pending: Option<PendingRead>,
    /// The port lists `policy_lists` holds (module `lists`); `None` until read from the kernel
    /// (the first write reads it) and after a write that failed half-way (read again).
    pub(crate) lists: Option<Lists>,
    /// How many entries `policy_lists` has room for.
    pub(crate) lists_max: usize,
    /// Enforcement and tier flags per slot (copied into each member's `endpoints` entry).
    pub(crate) slot_flags: HashMap<u32, u32>,
    /// endpoint id → slot, mirrors the endpoints map.
    pub(crate) slot_of: HashMap<u32, u32>,
    /// endpoint id → host ifindex, mirrors the endpoints map.
    pub(crate) by_id: HashMap<u32, u32>,
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

    /// Rebuilds the small mirrors from the pinned maps (they may predate this process). The
    /// policy maps are not read: every slot they may hold entries of has a `policy_gen` key, and
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
    pub(crate) fn set_slot_flags(&mut self, slot: u32, flags: u32) -> Result<(), DatapathError> {
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
