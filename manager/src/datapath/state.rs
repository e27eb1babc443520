//! Kernel-side state the datapath owns: the typed pinned maps, the loaded programs, and the
//! in-memory mirrors needed to diff policies and find endpoints by id.

use super::batch;
use super::encode::{Encoded, PolicyBlock, diff, encode_entries, encode_policy};
use super::error::DatapathError;
use super::types::EndpointDatapath;
use aya::Ebpf;
use aya::maps::lpm_trie::{Key, LpmTrie};
use aya::maps::{HashMap as BpfHash, MapData, MapError, PerCpuHashMap};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use weft_ebpf::{self as abi, map_names as names};
use weft_policy::mapstate::{EndpointPolicy, PolicyEntry, Verdict, reserved};

pub(crate) struct Maps {
    /// Owns the loaded programs; dropping it closes our fds, not the attached filters.
    pub(crate) ebpf: Ebpf,
    pub(crate) endpoints: BpfHash<MapData, u32, abi::EndpointInfo>,
    pub(crate) ipcache: LpmTrie<MapData, abi::IpcacheKey, abi::IpcacheValue>,
    pub(crate) policy: LpmTrie<MapData, abi::PolicyKey, abi::PolicyValue>,
    pub(crate) ct: BpfHash<MapData, abi::CtKey, abi::CtValue>,
    pub(crate) frags: BpfHash<MapData, abi::FragKey, abi::FragValue>,
    pub(crate) metrics: PerCpuHashMap<MapData, abi::MetricsKey, abi::MetricsValue>,
    /// What the policy map holds per endpoint (read back from the map at open, so a restarted
    /// manager diffs against the kernel's state, not against nothing).
    pub(crate) installed: HashMap<u32, Encoded>,
    /// Enforcement flags per endpoint id, also for endpoints whose policy arrives before attach.
    pub(crate) enforcement: HashMap<u32, u32>,
    /// endpoint id → host ifindex, mirrors the endpoints map.
    pub(crate) by_id: HashMap<u32, u32>,
}

/// The policy trie's key as the kernel lays it out (`struct bpf_lpm_trie_key` + data), for
/// batch calls; aya's `Key` is the same bytes but has no `Default`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct LpmKey {
    prefix_len: u32,
    data: abi::PolicyKey,
}

impl LpmKey {
    fn of(b: &PolicyBlock) -> Self {
        Self {
            prefix_len: b.prefix_len,
            data: b.key,
        }
    }
}

const _: () = assert!(std::mem::size_of::<LpmKey>() == std::mem::size_of::<Key<abi::PolicyKey>>());

fn batch_error(e: batch::BatchError) -> DatapathError {
    DatapathError::Syscall {
        map: names::POLICY,
        source: e.source,
    }
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

fn enforcement_flags(policy: &EndpointPolicy) -> u32 {
    let mut flags = 0;
    if policy.ingress_enforced {
        flags |= abi::EP_INGRESS_ENFORCED;
    }
    if policy.egress_enforced {
        flags |= abi::EP_EGRESS_ENFORCED;
    }
    flags
}

const ENFORCE_MASK: u32 = abi::EP_INGRESS_ENFORCED | abi::EP_EGRESS_ENFORCED;

impl Maps {
    fn policy_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use aya::maps::IterableMap;
        use std::os::fd::AsFd;
        self.policy.map().fd().as_fd()
    }

    /// Every policy block in the kernel, by endpoint id.
    pub(crate) fn kernel_policy(&self) -> Result<HashMap<u32, Encoded>, DatapathError> {
        let entries: Vec<(LpmKey, abi::PolicyValue)> = batch::lookup_all(self.policy_fd())
            .map_err(|source| DatapathError::Syscall {
                map: names::POLICY,
                source,
            })?;
        let mut out: HashMap<u32, Encoded> = HashMap::new();
        for (key, value) in entries {
            let block = PolicyBlock {
                key: key.data,
                prefix_len: key.prefix_len,
            };
            out.entry(block.key.endpoint_id)
                .or_default()
                .insert(block, value.verdict);
        }
        Ok(out)
    }

    /// Rebuilds the in-memory mirrors from the pinned maps (they may predate this process).
    pub(crate) fn read_back(&mut self) -> Result<(), DatapathError> {
        for item in &self.endpoints {
            let (ifindex, info) = item.map_err(DatapathError::map(names::ENDPOINTS))?;
            self.by_id.insert(info.endpoint_id, ifindex);
            self.enforcement
                .insert(info.endpoint_id, info.flags & ENFORCE_MASK);
        }
        let entries: Vec<(LpmKey, abi::PolicyValue)> = batch::lookup_all(self.policy_fd())
            .map_err(|source| DatapathError::Syscall {
                map: names::POLICY,
                source,
            })?;
        // The trie hands entries back in its own order: sorted first, each endpoint's run is
        // bulk-built into its map instead of inserted entry by entry (~900 000 at 1000 rules).
        let mut blocks: Vec<(PolicyBlock, u8)> = entries
            .into_iter()
            .map(|(key, value)| {
                let block = PolicyBlock {
                    key: key.data,
                    prefix_len: key.prefix_len,
                };
                (block, value.verdict)
            })
            .collect();
        blocks.sort_unstable();
        for run in blocks.chunk_by(|a, b| a.0.key.endpoint_id == b.0.key.endpoint_id) {
            if let Some(first) = run.first() {
                self.installed
                    .insert(first.0.key.endpoint_id, run.iter().copied().collect());
            }
        }
        Ok(())
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

    pub(crate) fn set_flags(&mut self, endpoint_id: u32, flags: u32) -> Result<(), DatapathError> {
        self.enforcement.insert(endpoint_id, flags);
        let Some(&ifindex) = self.by_id.get(&endpoint_id) else {
            return Ok(());
        };
        let mut info = self
            .endpoints
            .get(&ifindex, 0)
            .map_err(DatapathError::map(names::ENDPOINTS))?;
        info.flags = (info.flags & !ENFORCE_MASK) | flags;
        self.endpoints
            .insert(ifindex, info, 0)
            .map_err(DatapathError::map(names::ENDPOINTS))
    }

    pub(crate) fn apply(
        &mut self,
        endpoint_id: u32,
        policy: &EndpointPolicy,
    ) -> Result<(), DatapathError> {
        let new = encode_policy(endpoint_id, policy);
        let current = self.installed.remove(&endpoint_id).unwrap_or_default();
        let (upserts, removes) = diff(&current, &new);
        self.write(
            endpoint_id,
            current,
            &upserts,
            &removes,
            Some(enforcement_flags(policy)),
        )
    }

    /// Replaces the entries of `identities` only; the rest of the endpoint's policy and its
    /// enforcement flags stay as they are.
    pub(crate) fn apply_identities(
        &mut self,
        endpoint_id: u32,
        identities: &BTreeSet<u32>,
        entries: &BTreeMap<PolicyEntry, Verdict>,
    ) -> Result<(), DatapathError> {
        let new = encode_entries(endpoint_id, entries);
        let current = self.installed.remove(&endpoint_id).unwrap_or_default();
        let old: Encoded = identities
            .iter()
            .flat_map(|&id| current.range(PolicyBlock::identity_range(endpoint_id, id)))
            .map(|(b, v)| (*b, *v))
            .collect();
        let (upserts, removes) = diff(&old, &new);
        self.write(endpoint_id, current, &upserts, &removes, None)
    }

    /// Writes a diff into the policy map and records in `installed` exactly what reached the
    /// kernel, also after a failure half-way.
    fn write(
        &mut self,
        endpoint_id: u32,
        mut current: Encoded,
        upserts: &[(PolicyBlock, u8)],
        removes: &[PolicyBlock],
        flags: Option<u32>,
    ) -> Result<(), DatapathError> {
        let result = (|| {
            // Add-before-delete (Cilium #46927): the union of old and new never drops a packet
            // that both allow; the encoding guarantees no deny block covers such a packet.
            let keys: Vec<LpmKey> = upserts.iter().map(|(b, _)| LpmKey::of(b)).collect();
            let values: Vec<abi::PolicyValue> = upserts
                .iter()
                .map(|&(_, verdict)| abi::PolicyValue {
                    verdict,
                    pad: [0; 3],
                })
                .collect();
            let written = batch::update(self.policy_fd(), &keys, &values);
            let done = written.as_ref().map_or_else(|e| e.done, |()| upserts.len());
            current.extend(upserts.iter().take(done).copied());
            written.map_err(batch_error)?;
            if let Some(flags) = flags {
                self.set_flags(endpoint_id, flags)?;
            }
            let keys: Vec<LpmKey> = removes.iter().map(LpmKey::of).collect();
            let deleted = batch::delete(self.policy_fd(), &keys);
            let done = deleted.as_ref().map_or_else(|e| e.done, |()| removes.len());
            for block in removes.iter().take(done) {
                current.remove(block);
            }
            deleted.map_err(batch_error)
        })();
        self.installed.insert(endpoint_id, current);
        result
    }

    /// Removes the policy, ct and metrics entries of the given endpoints.
    pub(crate) fn purge(&mut self, ids: &BTreeSet<u32>) -> Result<(), DatapathError> {
        for id in ids {
            if let Some(blocks) = self.installed.remove(id) {
                for block in blocks.keys() {
                    ignore_missing(self.policy.remove(&Key::new(block.prefix_len, block.key)))
                        .map_err(DatapathError::map(names::POLICY))?;
                }
            }
            self.enforcement.remove(id);
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
