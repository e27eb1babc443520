//! The real datapath: aya 0.14, maps pinned by name, netlink `cls_bpf` attachments.

use super::error::DatapathError;
use super::events::EventReader;
use super::progpin;
use super::state::{Maps, endpoint_info, filter_error, ignore_missing, ipcache_key};
use super::types::{
    DatapathConfig, DropEvent, EndpointDatapath, KernelEndpoint, KernelState, MapSummary, SlotFlags,
};
use super::{Datapath, attach, bpffs, dump};
use crate::node::ipcache::Value as IpcacheValue;
use aya::maps::{MapData, MapError, RingBuf};
use aya::programs::TcAttachType;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Mutex, MutexGuard, PoisonError};
use tokio::sync::broadcast;
use weft_ebpf::{self as abi, map_names as names};
use weft_policy::mapstate::{EndpointPolicy, PolicyEntry, Verdict};

/// The kernel datapath. Open once per manager; `Drop` leaves programs attached and maps pinned.
pub struct BpfDatapath {
    config: DatapathConfig,
    maps: Mutex<Maps>,
    events: broadcast::Sender<DropEvent>,
    _reader: EventReader,
}

/// The host veth's ifindex, checked against the one the endpoint was created with.
fn checked_ifindex(ep: &EndpointDatapath) -> Result<u32, DatapathError> {
    let ifindex = nix::net::if_::if_nametoindex(ep.host_ifname.as_str())
        .map_err(|e| DatapathError::Invalid(format!("interface {}: {e}", ep.host_ifname)))?;
    if ifindex != ep.host_ifindex {
        return Err(DatapathError::Invalid(format!(
            "interface {} has ifindex {ifindex}, not {}",
            ep.host_ifname, ep.host_ifindex
        )));
    }
    Ok(ifindex)
}

fn take<T: TryFrom<aya::maps::Map, Error = MapError>>(
    maps: &mut HashMap<&'static str, aya::maps::Map>,
    name: &'static str,
) -> Result<T, DatapathError> {
    let map = maps.remove(name).ok_or(DatapathError::Missing(name))?;
    T::try_from(map).map_err(DatapathError::map(name))
}

impl BpfDatapath {
    /// Ensures bpffs, loads the object reusing every map already pinned under
    /// `config.pin_dir` (creating the missing ones), reuses the programs pinned for this
    /// object when they use exactly those maps or else loads (verifies) them afresh, installs
    /// the world ipcache entries if missing and starts the event reader. Nothing is attached
    /// here. After a fresh load the programs are pinned only by [`Datapath::commit_programs`],
    /// once every endpoint runs them (docs/DATAPATH.md, "Program pins").
    pub fn open(config: DatapathConfig) -> Result<Self, DatapathError> {
        bpffs::ensure(&config.pin_dir)?;
        let t0 = std::time::Instant::now();
        let digest = progpin::object_digest(abi::object(), &config);
        let mut opened = progpin::open(&config, &digest)?;
        tracing::info!(
            programs = opened.programs.word(),
            reason = opened
                .reason
                .as_deref()
                .unwrap_or("pinned for this object, using the opened maps"),
            ms = t0.elapsed().as_secs_f64() * 1000.0,
            "eBPF programs"
        );
        let ring: RingBuf<MapData> = take(&mut opened.maps, names::EVENTS)?;
        let mut maps = Maps {
            endpoints: take(&mut opened.maps, names::ENDPOINTS)?,
            ipcache: take(&mut opened.maps, names::IPCACHE)?,
            policy_pairs: take(&mut opened.maps, names::POLICY_PAIRS)?,
            policy_lists: take(&mut opened.maps, names::POLICY_LISTS)?,
            policy_gen: take(&mut opened.maps, names::POLICY_GEN)?,
            ct: take(&mut opened.maps, names::CT)?,
            frags: take(&mut opened.maps, names::FRAGS)?,
            metrics: take(&mut opened.maps, names::METRICS)?,
            lb_services: take(&mut opened.maps, names::LB_SERVICES)?,
            lb_backends: take(&mut opened.maps, names::LB_BACKENDS)?,
            lb_revnat: take(&mut opened.maps, names::LB_REVNAT)?,
            lb_flows: take(&mut opened.maps, names::LB_FLOWS)?,
            ebpf: opened.ebpf,
            programs: opened.programs,
            filters: None,
            installed: HashMap::new(),
            scratch: Vec::new(),
            unloaded: BTreeSet::new(),
            pending: None,
            lists: None,
            lists_max: config.policy_lists_max as usize,
            slot_flags: HashMap::new(),
            slot_of: HashMap::new(),
            by_id: HashMap::new(),
        };
        maps.read_back()?;
        let legacy = config.pin_dir.join(names::LEGACY_POLICY);
        if legacy.exists() {
            maps.migrate_legacy(&legacy)?;
        }
        maps.install_world()?;
        let (events, _) = broadcast::channel(config.event_channel);
        let reader =
            EventReader::spawn(ring, events.clone()).map_err(|source| DatapathError::Syscall {
                map: names::EVENTS,
                source,
            })?;
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

impl Datapath for BpfDatapath {
    fn attach_endpoint(&self, ep: &EndpointDatapath) -> Result<(), DatapathError> {
        let ifindex = checked_ifindex(ep)?;
        let mut maps = self.lock();
        // Maps first: the moment the programs run, the endpoint's entries are in place.
        let flags = maps.slot_flags.get(&ep.policy_id).copied().unwrap_or(0);
        maps.endpoints
            .insert(ifindex, endpoint_info(ep, flags), 0)
            .map_err(DatapathError::map(names::ENDPOINTS))?;
        maps.by_id.insert(ep.endpoint_id, ifindex);
        maps.slot_of.insert(ep.endpoint_id, ep.policy_id);
        attach::ensure_clsact(&ep.host_ifname)?;
        for (program, direction) in [
            (abi::PROG_FROM_POD, TcAttachType::Ingress),
            (abi::PROG_TO_POD, TcAttachType::Egress),
        ] {
            attach::attach(maps.program(program)?, program, &ep.host_ifname, direction)?;
        }
        Ok(())
    }

    fn readopt_endpoint(&self, ep: &EndpointDatapath) -> Result<bool, DatapathError> {
        {
            let mut maps = self.lock();
            if maps.programs.pinned.is_some() {
                let ifindex = checked_ifindex(ep)?;
                let flags = maps.slot_flags.get(&ep.policy_id).copied().unwrap_or(0);
                let want = endpoint_info(ep, flags);
                // The filters a previous manager attached point at these very programs
                // (they were pinned only once every endpoint ran them); an entry that is
                // exactly what this manager would write means nothing changed for it.
                // One filter dump per direction (µs each) guards against a filter removed or
                // replaced behind Weft's back while it was down.
                if let Ok(have) = maps.endpoints.get(&ifindex, 0)
                    && have == want
                {
                    let ids = maps.program_ids()?;
                    if maps
                        .filters()?
                        .wrong(ifindex, ids)
                        .map_err(filter_error)?
                        .is_empty()
                    {
                        return Ok(false);
                    }
                }
            }
        }
        self.attach_endpoint(ep)?;
        Ok(true)
    }

    fn commit_programs(&self) -> Result<(), DatapathError> {
        let mut maps = self.lock();
        if maps.programs.committed {
            return Ok(());
        }
        // Every endpoint runs these programs now: the policy trie of builds before the two-step
        // lookup is read by none of them. Unpinned before the programs are: a start that finds
        // it again (a crash in between) has not reused programs and copies it again, which is
        // what it holds until the restore rewrites the slots.
        let legacy = self.config.pin_dir.join(names::LEGACY_POLICY);
        match std::fs::remove_file(&legacy) {
            Ok(()) => {
                tracing::info!(pin = %legacy.display(), "unpinned the earlier builds' policy map");
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(DatapathError::Bpffs {
                    path: legacy,
                    source,
                });
            }
        }
        let digest = maps.programs.digest.clone();
        let dir = progpin::pin_path(&self.config.pin_dir, &digest, "");
        std::fs::create_dir_all(&dir).map_err(|source| DatapathError::Bpffs {
            path: dir.clone(),
            source,
        })?;
        // A crash between the two pins leaves one: the next start sees a partial set and
        // loads afresh.
        for program in [abi::PROG_FROM_POD, abi::PROG_TO_POD] {
            let path = progpin::pin_path(&self.config.pin_dir, &digest, program);
            maps.program(program)?
                .pin(&path)
                .map_err(|e| DatapathError::Bpffs {
                    path,
                    source: std::io::Error::other(e),
                })?;
        }
        maps.programs.committed = true;
        tracing::info!(digest, "eBPF programs pinned: the next start reuses them");
        Ok(())
    }

    fn programs(&self) -> &'static str {
        self.lock().programs.word()
    }

    fn check_filters(&self, endpoints: &[(u32, String)]) -> Result<Vec<String>, DatapathError> {
        let mut maps = self.lock();
        let want = maps.program_ids()?;
        let mut problems = Vec::new();
        for (endpoint_id, ifname) in endpoints {
            let Ok(ifindex) = nix::net::if_::if_nametoindex(ifname.as_str()) else {
                problems.push(format!(
                    "endpoint {endpoint_id}: host veth {ifname} is missing"
                ));
                continue;
            };
            let wrong = maps.filters()?.wrong(ifindex, want).map_err(filter_error)?;
            problems.extend(
                wrong
                    .into_iter()
                    .map(|p| format!("endpoint {endpoint_id}: {ifname} {p}")),
            );
        }
        Ok(problems)
    }

    fn detach_endpoint(&self, ep: &EndpointDatapath) -> Result<(), DatapathError> {
        // Programs first: a program without its endpoint entry lets everything through.
        let from = attach::detach(abi::PROG_FROM_POD, &ep.host_ifname, TcAttachType::Ingress);
        let to = attach::detach(abi::PROG_TO_POD, &ep.host_ifname, TcAttachType::Egress);
        let mut maps = self.lock();
        maps.remove_endpoint_entry(ep.host_ifindex, ep.endpoint_id)?;
        maps.purge(&BTreeSet::from([ep.endpoint_id]))?;
        from.and(to)
    }

    fn apply_policy(
        &self,
        slot: u32,
        policy: &EndpointPolicy,
        generation: u64,
    ) -> Result<u64, DatapathError> {
        self.lock().apply(slot, policy, generation)
    }

    fn apply_policy_identities(
        &self,
        slot: u32,
        identities: &BTreeSet<u32>,
        entries: &BTreeMap<PolicyEntry, Verdict>,
        generation: u64,
    ) -> Result<u64, DatapathError> {
        self.lock()
            .apply_identities(slot, identities, entries, generation)
    }

    fn switch_slot(&self, endpoint_id: u32, slot: u32) -> Result<(), DatapathError> {
        self.lock().switch_slot(endpoint_id, slot)
    }

    fn restore_slot_flags(&self, slot: u32, flags: SlotFlags) {
        self.lock().restore_slot_flags(
            slot,
            flags.ingress_enforced,
            flags.egress_enforced,
            flags.tiers,
        );
    }

    fn release_slot(&self, slot: u32) -> Result<(), DatapathError> {
        self.lock().release_slot(slot)
    }

    fn end_policy_writes(&self) -> Result<(), DatapathError> {
        self.lock().collect_lists()
    }

    fn slot_generations(&self) -> Result<BTreeMap<u32, u64>, DatapathError> {
        self.lock().generations()
    }

    fn load_slots(&self, slots: &BTreeSet<u32>) -> Result<(), DatapathError> {
        self.lock().load_slots(slots)
    }

    fn begin_read_back(&self) -> Result<(), DatapathError> {
        self.lock().begin_read_back()
    }

    fn upsert_ipcache(&self, prefix: ipnet::IpNet, v: IpcacheValue) -> Result<(), DatapathError> {
        let value = abi::IpcacheValue {
            identity: v.identity,
            cidr_identity: v.cidr_identity,
        };
        self.lock()
            .ipcache
            .insert(&ipcache_key(prefix), value, 0)
            .map_err(DatapathError::map(names::IPCACHE))
    }

    fn lb_upsert(
        &self,
        id: u32,
        frontend: &weft_api::lb::Frontend,
        backends: &[weft_api::lb::Backend],
        previous: usize,
    ) -> Result<(), DatapathError> {
        self.lock().lb_upsert(id, frontend, backends, previous)
    }

    fn lb_remove(
        &self,
        id: u32,
        frontend: &weft_api::lb::Frontend,
        previous: usize,
    ) -> Result<(), DatapathError> {
        self.lock().lb_remove(id, frontend, previous)
    }

    fn lb_frontends(&self) -> Result<super::LbTable, DatapathError> {
        self.lock().lb_frontends()
    }

    fn remove_ipcache(&self, prefix: ipnet::IpNet) -> Result<(), DatapathError> {
        ignore_missing(self.lock().ipcache.remove(&ipcache_key(prefix)))
            .map_err(DatapathError::map(names::IPCACHE))
    }

    fn ipcache_entries(&self) -> Result<BTreeMap<ipnet::IpNet, IpcacheValue>, DatapathError> {
        let maps = self.lock();
        let mut out = BTreeMap::new();
        for item in &maps.ipcache {
            let (k, v) = item.map_err(DatapathError::map(names::IPCACHE))?;
            if let Some(prefix) = dump::ipcache_prefix(&k) {
                out.insert(
                    prefix,
                    IpcacheValue {
                        identity: v.identity,
                        cidr_identity: v.cidr_identity,
                    },
                );
            }
        }
        Ok(out)
    }

    fn kernel_state(&self) -> Result<KernelState, DatapathError> {
        let blocks = self.lock().kernel_policy(|_| true)?;
        let policy = blocks
            .chunk_by(|a, b| a.0.key.policy_id == b.0.key.policy_id)
            .filter_map(|run| {
                let slot = run.first()?.0.key.policy_id;
                Some((slot, run.iter().copied().collect()))
            })
            .collect();
        let generations = self.lock().generations()?;
        let ipcache = self.ipcache_entries()?;
        let maps = self.lock();
        let mut endpoints = BTreeMap::new();
        for item in &maps.endpoints {
            let (ifindex, e) = item.map_err(DatapathError::map(names::ENDPOINTS))?;
            let mut ips = Vec::new();
            if e.flags & abi::EP_HAS_IPV4 != 0 {
                ips.push(std::net::IpAddr::from(e.ipv4));
            }
            if e.flags & abi::EP_HAS_IPV6 != 0 {
                ips.push(std::net::IpAddr::from(e.ipv6));
            }
            endpoints.insert(
                e.endpoint_id,
                KernelEndpoint {
                    ifindex,
                    identity: e.identity,
                    policy_id: e.policy_id,
                    ingress_enforced: e.flags & abi::EP_INGRESS_ENFORCED != 0,
                    egress_enforced: e.flags & abi::EP_EGRESS_ENFORCED != 0,
                    tiers: super::encode::tier_flags(e.flags),
                    mac: e.mac,
                    ips,
                },
            );
        }
        Ok(KernelState {
            endpoints,
            policy,
            generations,
            ipcache,
        })
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

    fn endpoint_slots(&self) -> Result<BTreeMap<u32, u32>, DatapathError> {
        Ok(self
            .lock()
            .slot_of
            .iter()
            .map(|(&ep, &slot)| (ep, slot))
            .collect())
    }

    fn reconcile(&self, keep: &BTreeSet<u32>) -> Result<BTreeSet<u32>, DatapathError> {
        let mut maps = self.lock();
        let stale_eps: Vec<(u32, abi::EndpointInfo)> = maps
            .endpoints
            .iter()
            .filter_map(Result::ok)
            .filter(|(_, info)| !keep.contains(&info.endpoint_id))
            .collect();
        let stale: BTreeSet<u32> = stale_eps.iter().map(|(_, info)| info.endpoint_id).collect();
        for (ifindex, info) in stale_eps {
            if let Ok(name) = nix::net::if_::if_indextoname(ifindex) {
                let name = name.to_string_lossy().into_owned();
                attach::detach(abi::PROG_FROM_POD, &name, TcAttachType::Ingress)?;
                attach::detach(abi::PROG_TO_POD, &name, TcAttachType::Egress)?;
            }
            maps.remove_endpoint_entry(ifindex, info.endpoint_id)?;
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
