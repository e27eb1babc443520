//! The real datapath: aya 0.14, maps pinned by name, netlink `cls_bpf` attachments.

use super::encode::{Encoded, PolicyBlock, diff, encode_policy};
use super::error::DatapathError;
use super::events::EventReader;
use super::types::{DatapathConfig, DropEvent, EndpointDatapath, MapSummary};
use super::{Datapath, attach, bpffs, dump};
use aya::maps::lpm_trie::{Key, LpmTrie};
use aya::maps::{HashMap as BpfHash, MapData, MapError, PerCpuHashMap, RingBuf};
use aya::programs::{SchedClassifier, TcAttachType};
use aya::{Ebpf, EbpfLoader};
use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Mutex, MutexGuard, PoisonError};
use tokio::sync::broadcast;
use weft_ebpf::{self as abi, map_names as names};
use weft_policy::mapstate::{EndpointPolicy, reserved};

pub(crate) struct Maps {
    /// Owns the loaded programs; dropping it closes our fds, not the attached filters.
    ebpf: Ebpf,
    pub(crate) endpoints: BpfHash<MapData, u32, abi::EndpointInfo>,
    pub(crate) ipcache: LpmTrie<MapData, abi::IpcacheKey, abi::IpcacheValue>,
    pub(crate) policy: LpmTrie<MapData, abi::PolicyKey, abi::PolicyValue>,
    pub(crate) ct: BpfHash<MapData, abi::CtKey, abi::CtValue>,
    pub(crate) metrics: PerCpuHashMap<MapData, abi::MetricsKey, abi::MetricsValue>,
    /// What the policy map holds per endpoint (read back from the map at open, so a restarted
    /// manager diffs against the kernel's state, not against nothing).
    installed: HashMap<u32, Encoded>,
    /// Enforcement flags per endpoint id, also for endpoints whose policy arrives before attach.
    enforcement: HashMap<u32, u32>,
    /// endpoint id → host ifindex, mirrors the endpoints map.
    by_id: HashMap<u32, u32>,
}

/// The kernel datapath. Open once per manager; `Drop` leaves programs attached and maps pinned.
pub struct BpfDatapath {
    config: DatapathConfig,
    maps: Mutex<Maps>,
    events: broadcast::Sender<DropEvent>,
    _reader: EventReader,
}

fn take<T: TryFrom<aya::maps::Map, Error = MapError>>(
    ebpf: &mut Ebpf,
    name: &'static str,
) -> Result<T, DatapathError> {
    let map = ebpf.take_map(name).ok_or(DatapathError::Missing(name))?;
    T::try_from(map).map_err(DatapathError::map(name))
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

impl BpfDatapath {
    /// Ensures bpffs, loads the object reusing every map already pinned under
    /// `config.pin_dir` (creating the missing ones), loads the programs, installs the world
    /// ipcache entries if missing and starts the event reader. Nothing is attached here.
    pub fn open(config: DatapathConfig) -> Result<Self, DatapathError> {
        bpffs::ensure(&config.pin_dir)?;
        let mut ebpf = EbpfLoader::new()
            .default_map_pin_directory(&config.pin_dir)
            .map_max_entries(names::ENDPOINTS, config.endpoints_max)
            .map_max_entries(names::IPCACHE, config.ipcache_max)
            .map_max_entries(names::POLICY, config.policy_max)
            .map_max_entries(names::CT, config.ct_max)
            .map_max_entries(names::METRICS, config.metrics_max)
            .map_max_entries(names::EVENTS, config.events_bytes)
            .load(abi::object())
            .map_err(|e| DatapathError::Load(Box::new(e)))?;
        for program in [abi::PROG_FROM_POD, abi::PROG_TO_POD] {
            let prog: &mut SchedClassifier = ebpf
                .program_mut(program)
                .ok_or(DatapathError::Missing(program))?
                .try_into()
                .and_then(|p: &mut SchedClassifier| p.load().map(|()| p))
                .map_err(|e| DatapathError::Program {
                    program,
                    ifname: String::new(),
                    source: Box::new(e),
                })?;
            let _ = prog;
        }
        let ring: RingBuf<MapData> = take(&mut ebpf, names::EVENTS)?;
        let mut maps = Maps {
            endpoints: take(&mut ebpf, names::ENDPOINTS)?,
            ipcache: take(&mut ebpf, names::IPCACHE)?,
            policy: take(&mut ebpf, names::POLICY)?,
            ct: take(&mut ebpf, names::CT)?,
            metrics: take(&mut ebpf, names::METRICS)?,
            ebpf,
            installed: HashMap::new(),
            enforcement: HashMap::new(),
            by_id: HashMap::new(),
        };
        maps.read_back()?;
        maps.install_world()?;
        let (events, _) = broadcast::channel(config.event_channel);
        let reader = EventReader::spawn(ring, events.clone());
        Ok(Self {
            config,
            maps: Mutex::new(maps),
            events,
            _reader: reader,
        })
    }

    /// The configuration this datapath was opened with.
    #[must_use]
    pub fn config(&self) -> &DatapathConfig {
        &self.config
    }

    fn lock(&self) -> MutexGuard<'_, Maps> {
        self.maps.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Maps {
    /// Rebuilds the in-memory mirrors from the pinned maps (they may predate this process).
    fn read_back(&mut self) -> Result<(), DatapathError> {
        for item in &self.endpoints {
            let (ifindex, info) = item.map_err(DatapathError::map(names::ENDPOINTS))?;
            self.by_id.insert(info.endpoint_id, ifindex);
            self.enforcement
                .insert(info.endpoint_id, info.flags & ENFORCE_MASK);
        }
        for item in &self.policy {
            let (key, value) = item.map_err(DatapathError::map(names::POLICY))?;
            let block = PolicyBlock {
                prefix_len: key.prefix_len(),
                key: key.data(),
            };
            self.installed
                .entry(block.key.endpoint_id)
                .or_default()
                .insert(block, value.verdict);
        }
        Ok(())
    }

    fn install_world(&mut self) -> Result<(), DatapathError> {
        for prefix in ["0.0.0.0/0", "::/0"] {
            let key = ipcache_key(prefix.parse().expect("valid prefix"));
            match self.ipcache.get(&key, 0) {
                Ok(_) => {}
                Err(MapError::KeyNotFound) => {
                    let value = abi::IpcacheValue {
                        identity: reserved::WORLD,
                        flags: 0,
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

    fn set_flags(&mut self, endpoint_id: u32, flags: u32) -> Result<(), DatapathError> {
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

    fn apply(&mut self, endpoint_id: u32, policy: &EndpointPolicy) -> Result<(), DatapathError> {
        let new = encode_policy(endpoint_id, policy);
        let mut current = self.installed.remove(&endpoint_id).unwrap_or_default();
        let (upserts, removes) = diff(&current, &new);
        let result = (|| {
            // Add-before-delete (Cilium #46927): the union of old and new never drops a packet
            // that both allow; the encoding guarantees no deny block covers such a packet.
            for (block, verdict) in upserts {
                let value = abi::PolicyValue {
                    verdict,
                    pad: [0; 3],
                };
                self.policy
                    .insert(&Key::new(block.prefix_len, block.key), value, 0)
                    .map_err(DatapathError::map(names::POLICY))?;
                current.insert(block, verdict);
            }
            self.set_flags(endpoint_id, enforcement_flags(policy))?;
            for block in removes {
                ignore_missing(self.policy.remove(&Key::new(block.prefix_len, block.key)))
                    .map_err(DatapathError::map(names::POLICY))?;
                current.remove(&block);
            }
            Ok(())
        })();
        // Record exactly what reached the kernel, also after a failure half-way.
        self.installed.insert(endpoint_id, current);
        result
    }

    /// Removes the policy, ct and metrics entries of the given endpoints.
    fn purge(&mut self, ids: &BTreeSet<u32>) -> Result<(), DatapathError> {
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
        let stale_metrics: Vec<abi::MetricsKey> = self
            .metrics
            .keys()
            .filter_map(Result::ok)
            .filter(|k| ids.contains(&k.endpoint_id))
            .collect();
        for key in stale_metrics {
            ignore_missing(self.metrics.remove(&key))
                .map_err(DatapathError::map(names::METRICS))?;
        }
        Ok(())
    }

    fn remove_endpoint_entry(
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

fn endpoint_info(ep: &EndpointDatapath, flags: u32) -> abi::EndpointInfo {
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

fn endpoint_ips(info: &abi::EndpointInfo) -> Vec<IpAddr> {
    let mut ips = Vec::new();
    if info.flags & abi::EP_HAS_IPV4 != 0 {
        ips.push(IpAddr::from(info.ipv4));
    }
    if info.flags & abi::EP_HAS_IPV6 != 0 {
        ips.push(IpAddr::from(info.ipv6));
    }
    ips
}

impl Datapath for BpfDatapath {
    fn attach_endpoint(&self, ep: &EndpointDatapath) -> Result<(), DatapathError> {
        let ifindex = nix::net::if_::if_nametoindex(ep.host_ifname.as_str())
            .map_err(|e| DatapathError::Invalid(format!("interface {}: {e}", ep.host_ifname)))?;
        if ifindex != ep.host_ifindex {
            return Err(DatapathError::Invalid(format!(
                "interface {} has ifindex {ifindex}, not {}",
                ep.host_ifname, ep.host_ifindex
            )));
        }
        let mut maps = self.lock();
        // Maps first: the moment the programs run, the endpoint's entries are in place.
        let flags = maps.enforcement.get(&ep.endpoint_id).copied().unwrap_or(0);
        maps.endpoints
            .insert(ifindex, endpoint_info(ep, flags), 0)
            .map_err(DatapathError::map(names::ENDPOINTS))?;
        maps.by_id.insert(ep.endpoint_id, ifindex);
        maps.enforcement.insert(ep.endpoint_id, flags);
        for ip in &ep.ips {
            let value = abi::IpcacheValue {
                identity: ep.identity,
                flags: 0,
            };
            maps.ipcache
                .insert(&ipcache_key(ipnet::IpNet::from(*ip)), value, 0)
                .map_err(DatapathError::map(names::IPCACHE))?;
        }
        attach::ensure_clsact(&ep.host_ifname)?;
        attach::attach(
            &mut maps.ebpf,
            abi::PROG_FROM_POD,
            &ep.host_ifname,
            TcAttachType::Ingress,
        )?;
        attach::attach(
            &mut maps.ebpf,
            abi::PROG_TO_POD,
            &ep.host_ifname,
            TcAttachType::Egress,
        )?;
        Ok(())
    }

    fn detach_endpoint(&self, ep: &EndpointDatapath) -> Result<(), DatapathError> {
        // Programs first: a program without its endpoint entry lets everything through.
        let from = attach::detach(abi::PROG_FROM_POD, &ep.host_ifname, TcAttachType::Ingress);
        let to = attach::detach(abi::PROG_TO_POD, &ep.host_ifname, TcAttachType::Egress);
        let mut maps = self.lock();
        maps.remove_endpoint_entry(ep.host_ifindex, ep.endpoint_id)?;
        for ip in &ep.ips {
            ignore_missing(maps.ipcache.remove(&ipcache_key(ipnet::IpNet::from(*ip))))
                .map_err(DatapathError::map(names::IPCACHE))?;
        }
        maps.purge(&BTreeSet::from([ep.endpoint_id]))?;
        from.and(to)
    }

    fn apply_policy(&self, endpoint_id: u32, policy: &EndpointPolicy) -> Result<(), DatapathError> {
        self.lock().apply(endpoint_id, policy)
    }

    fn upsert_ipcache(&self, prefix: ipnet::IpNet, identity: u32) -> Result<(), DatapathError> {
        let value = abi::IpcacheValue { identity, flags: 0 };
        self.lock()
            .ipcache
            .insert(&ipcache_key(prefix), value, 0)
            .map_err(DatapathError::map(names::IPCACHE))
    }

    fn remove_ipcache(&self, prefix: ipnet::IpNet) -> Result<(), DatapathError> {
        ignore_missing(self.lock().ipcache.remove(&ipcache_key(prefix)))
            .map_err(DatapathError::map(names::IPCACHE))
    }

    fn endpoint_ids(&self) -> Result<BTreeSet<u32>, DatapathError> {
        let maps = self.lock();
        let mut ids = BTreeSet::new();
        for item in &maps.endpoints {
            ids.insert(
                item.map_err(DatapathError::map(names::ENDPOINTS))?
                    .1
                    .endpoint_id,
            );
        }
        Ok(ids)
    }

    fn reconcile(&self, keep: &BTreeSet<u32>) -> Result<BTreeSet<u32>, DatapathError> {
        let mut maps = self.lock();
        let stale_eps: Vec<(u32, abi::EndpointInfo)> = maps
            .endpoints
            .iter()
            .filter_map(Result::ok)
            .filter(|(_, info)| !keep.contains(&info.endpoint_id))
            .collect();
        let mut stale: BTreeSet<u32> = stale_eps.iter().map(|(_, info)| info.endpoint_id).collect();
        stale.extend(maps.installed.keys().filter(|id| !keep.contains(id)));
        for (ifindex, info) in stale_eps {
            if let Ok(name) = nix::net::if_::if_indextoname(ifindex) {
                let name = name.to_string_lossy().into_owned();
                attach::detach(abi::PROG_FROM_POD, &name, TcAttachType::Ingress)?;
                attach::detach(abi::PROG_TO_POD, &name, TcAttachType::Egress)?;
            }
            maps.remove_endpoint_entry(ifindex, info.endpoint_id)?;
            for ip in endpoint_ips(&info) {
                ignore_missing(maps.ipcache.remove(&ipcache_key(ipnet::IpNet::from(ip))))
                    .map_err(DatapathError::map(names::IPCACHE))?;
            }
        }
        maps.purge(&stale)?;
        Ok(stale)
    }

    fn map_list(&self) -> Vec<MapSummary> {
        dump::list(&self.lock(), &self.config.pin_dir)
    }

    fn map_dump(&self, name: &str) -> Result<Vec<serde_json::Value>, DatapathError> {
        dump::dump(&self.lock(), name)
    }

    fn subscribe_events(&self) -> broadcast::Receiver<DropEvent> {
        self.events.subscribe()
    }
}
