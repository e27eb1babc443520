//! The manager's operations, composing the registry, identities and policy with the node's side
//! effects (host netlink, eBPF datapath). The HTTP layer (`api`) only translates.
//!
//! One lock (`State`) covers the registry and the policy state: every operation sees and leaves
//! them consistent with each other and with the datapath, and there is no lock ordering to get
//! wrong. Operations under it are map writes and sled flushes (tens of µs); the slow netlink
//! deletes of host veths happen outside it.

mod cluster;
mod endpoints;
mod error;
mod labels;
mod metrics;
mod monitor;
mod pipeline;
mod policy_api;
mod regen;
mod trim;
pub mod validate;
mod verify;
mod work;

pub use labels::{from_api_labels, to_api_labels};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use weft_api::{Endpoint, EndpointState, PoolStatus, StatusResponse};
use weft_policy::rule::NamedPorts;

use crate::datapath::{Datapath, EndpointDatapath};
use crate::endpoint::Registry;
use crate::endpoint::link_reaper::LinkReaper;
use crate::node::ChosenCidr;
use crate::node::hostnet::HostNet;
use crate::node::ipcache::{Ipcache, Source, Write};
use crate::policy_state::{PolicyState, PortOwner};
use weft_api::delete_queue::DeleteQueue;

/// How long an allocation may stay un-registered before GC or the reaper may treat it as
/// abandoned: an ADD in flight must not lose its IP.
pub const ADD_GRACE_MS: u64 = 5 * 60 * 1000;

pub use error::ManagerError;

/// Everything behind the lock.
pub(crate) struct State {
    pub(crate) reg: Registry,
    pub(crate) pol: PolicyState,
    /// Policy slots: which endpoints share which policy entries, and the digest of each
    /// slot's last complete write (regeneration skips slots it would not change).
    pub(crate) slots: crate::slots::SlotTable,
    /// Set by a restart that found the policy inputs unchanged: its full regeneration skips
    /// the slots it trusted.
    pub(crate) trust_inputs: bool,
    /// Who wants which ipcache prefix; the kernel map shows the winners.
    pub(crate) ipcache: Ipcache,
}

/// The running manager.
pub struct Manager {
    node_name: String,
    cidrs: Vec<ChosenCidr>,
    state: Mutex<State>,
    hostnet: Arc<dyn HostNet>,
    /// Deletes host veths after DEL has answered.
    reaper: LinkReaper,
    datapath: Arc<dyn Datapath>,
    ready: AtomicBool,
    /// What keeps the manager from ready or from a current view (e.g. a Kubernetes list the
    /// `ClusterRole` denies), one line each, reported by status.
    warnings: Mutex<Vec<String>>,
    /// Restore duration by phase, reported by status.
    restore_ms: Mutex<Vec<(String, f64)>>,
    regenerations: AtomicU64,
    /// DELs the CNI queued while this manager was unreachable.
    delete_queue: Option<DeleteQueue>,
    /// A regeneration failed half-way: housekeeping recomputes every endpoint.
    needs_regeneration: AtomicBool,
    /// Kubernetes mode: pods, namespaces and policy statuses from the watchers.
    pub(crate) k8s_cache: std::sync::OnceLock<Arc<weft_k8s::cache::ClusterCache>>,
    /// Kvstore mode: the cluster agent.
    cluster: Option<crate::cluster::link::ClusterLink>,
    /// Masquerade rules, kept in step with the node registry.
    masquerade: Option<Arc<crate::node::masquerade::Masquerader>>,
    /// Prometheus families counted as things happen (`crate::prom`).
    prom: Arc<crate::prom::Metrics>,
    /// Rule texts parsed before: a re-imported file parses only its changed rules.
    parse_memo: Mutex<weft_policy::parse::memo::ParseMemo>,
    /// Service frontends and their backends (Kubernetes mode fills it).
    lb: crate::lb::Services,
}

/// The datapath's view of a registered endpoint (`None` before registration).
pub(crate) fn datapath_view(ep: &Endpoint) -> Option<EndpointDatapath> {
    let host_ifindex = ep.host_ifindex?;
    let pod_mac = ep.pod_mac?.octets();
    Some(EndpointDatapath {
        endpoint_id: ep.id,
        identity: ep.identity,
        // The caller sets the slot (`State::slots`).
        policy_id: 0,
        host_ifindex,
        host_ifname: ep.host_ifname.clone(),
        ips: ep.ips.iter().map(|i| i.address).collect(),
        pod_mac,
    })
}

/// The ipcache owners restored state implies: the node's router IPs and world defaults, every
/// registered endpoint's addresses, the repository's CIDR identities. Nothing is written yet:
/// [`Manager::reconcile_ipcache`] diffs it against what the kernel holds.
pub(crate) fn initial_ipcache(reg: &Registry, pol: &PolicyState) -> Ipcache {
    use weft_policy::mapstate::reserved;
    let mut c = Ipcache::new();
    for world in [
        ipnet::Ipv4Net::default().into(),
        ipnet::Ipv6Net::default().into(),
    ] {
        c.set(world, Source::Node, reserved::WORLD);
    }
    for pool in reg.pools() {
        c.set(
            ipnet::IpNet::from(pool.router()),
            Source::Node,
            reserved::HOST,
        );
    }
    for ep in reg.list() {
        if ep.state == EndpointState::Ready || ep.state == EndpointState::Deleting {
            for ip in &ep.ips {
                c.set(
                    ipnet::IpNet::from(ip.address),
                    Source::LocalEndpoint(ep.id),
                    ep.identity,
                );
            }
        }
    }
    for (prefix, id) in pol.cidr_identities() {
        c.set(prefix, Source::Cidr, id);
    }
    c
}

pub(crate) use trim::release_freed_memory;

/// Frontend ids the Service maps have room for (`DatapathConfig::lb_frontends_max`).
const LB_FRONTENDS_MAX: u32 = 65_536;

impl Manager {
    /// Assembles a manager over restored state.
    pub fn new(
        node_name: String,
        cidrs: Vec<ChosenCidr>,
        reg: Registry,
        pol: PolicyState,
        hostnet: Arc<dyn HostNet>,
        datapath: Arc<dyn Datapath>,
    ) -> Self {
        Self {
            node_name,
            cidrs,
            state: Mutex::new(State {
                ipcache: initial_ipcache(&reg, &pol),
                slots: crate::slots::SlotTable::new(pol.store().clone()),
                trust_inputs: false,
                reg,
                pol,
            }),
            reaper: LinkReaper::new(Arc::clone(&hostnet)),
            hostnet,
            lb: crate::lb::Services::new(Arc::clone(&datapath), LB_FRONTENDS_MAX),
            datapath,
            ready: AtomicBool::new(false),
            warnings: Mutex::new(Vec::new()),
            restore_ms: Mutex::new(Vec::new()),
            regenerations: AtomicU64::new(0),
            delete_queue: None,
            needs_regeneration: AtomicBool::new(false),
            k8s_cache: std::sync::OnceLock::new(),
            cluster: None,
            masquerade: None,
            prom: Arc::default(),
            parse_memo: Mutex::default(),
        }
    }

    /// Service frontends and their backends.
    pub fn lb(&self) -> &crate::lb::Services {
        &self.lb
    }

    /// The Prometheus metrics handle.
    pub fn prom(&self) -> &Arc<crate::prom::Metrics> {
        &self.prom
    }

    /// Kubernetes mode: endpoint labels come from `cache` from now on.
    pub fn set_k8s_cache(&self, cache: Arc<weft_k8s::cache::ClusterCache>) {
        let _ = self.k8s_cache.set(cache);
    }

    /// The cluster cache in Kubernetes mode.
    pub fn k8s_cache(&self) -> Option<&Arc<weft_k8s::cache::ClusterCache>> {
        self.k8s_cache.get()
    }

    /// Recomputes an endpoint's policy and installs it if it changed (its pod's named ports
    /// arrived or changed), and updates what its named ports mean for its peers' egress rules
    /// (and, in kvstore mode, for other nodes). Returns whether the maps changed.
    pub fn refresh_endpoint(&self, id: u32) -> Result<bool, ManagerError> {
        let mut st = self.state();
        let mut changed = 0;
        if let Some(ep) = st.reg.get(id).cloned()
            && ep.state == EndpointState::Ready
        {
            let ports =
                st.pol
                    .set_peer_ports(PortOwner::Local(id), ep.identity, self.named_ports(&ep));
            changed += self.regenerate_users(&mut st, &ports)?;
        }
        changed += self.regenerate(&mut st, &[id])?;
        drop(st);
        self.poke_cluster();
        Ok(changed > 0)
    }

    /// Drops an endpoint's named ports after a failed change (best effort: a failure leaves
    /// a full regeneration to housekeeping).
    pub(crate) fn forget_ports(&self, st: &mut State, owner: &PortOwner) {
        let effects = st.pol.remove_peer_ports(owner);
        if let Err(e) = self.regenerate_users(st, &effects) {
            tracing::error!("dropping named ports after a failed change: {e}");
            self.mark_needs_regeneration();
        }
    }

    /// The named container ports of an endpoint's pod, which ingress rules' `port: name`
    /// resolve to: from the pod watch in Kubernetes mode; none otherwise or before the pod
    /// arrives (the pod's event regenerates the endpoint then).
    pub(crate) fn named_ports(&self, ep: &Endpoint) -> NamedPorts {
        match (
            self.k8s_cache(),
            ep.pod_namespace.as_deref(),
            ep.pod_name.as_deref(),
        ) {
            (Some(c), Some(ns), Some(name)) => c.named_ports(ns, name).unwrap_or_default(),
            _ => NamedPorts::new(),
        }
    }

    /// Asks housekeeping to recompute every endpoint: a policy or label change failed after
    /// it was recorded, and a retry of the same request would see nothing to do.
    pub fn mark_needs_regeneration(&self) {
        self.needs_regeneration.store(true, Ordering::SeqCst);
    }

    /// Runs a full regeneration if one was asked for. Returns whether it ran.
    pub fn repair_if_needed(&self) -> Result<bool, ManagerError> {
        if !self.needs_regeneration.swap(false, Ordering::SeqCst) {
            return Ok(false);
        }
        let result = self.regenerate_all().and_then(|_| self.reconcile_ipcache());
        if result.is_err() {
            self.mark_needs_regeneration();
        }
        result.map(|_| true)
    }

    /// Attaches the CNI's delete queue (see [`Manager::allocate`]).
    #[must_use]
    pub fn with_delete_queue(mut self, queue: DeleteQueue) -> Self {
        self.delete_queue = Some(queue);
        self
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        // Every mutation writes sled first and memory second, so state behind a poisoned lock
        // is still consistent.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The datapath.
    pub fn datapath(&self) -> &Arc<dyn Datapath> {
        &self.datapath
    }

    /// Declares start-up finished.
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::SeqCst);
    }

    /// Has start-up finished?
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// Replaces the status warnings.
    pub fn set_warnings(&self, warnings: Vec<String>) {
        *self
            .warnings
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = warnings;
    }

    /// Records how long a restore phase took.
    pub fn record_phase(&self, phase: &str, ms: f64) {
        self.restore_ms
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((phase.to_owned(), ms));
    }

    /// Node, pools and counts.
    pub fn status(&self) -> StatusResponse {
        let st = self.state();
        let pools = st
            .reg
            .pools()
            .iter()
            .zip(&self.cidrs)
            .map(|(pool, chosen)| PoolStatus {
                cidr: pool.cidr().to_string(),
                source: chosen.source,
                source_detail: Some(chosen.detail.clone()),
                router_ip: pool.router(),
                used: u64::try_from(pool.used()).unwrap_or(u64::MAX),
                capacity: u64::try_from(pool.capacity()).unwrap_or(u64::MAX),
            })
            .collect();
        StatusResponse {
            node_name: self.node_name.clone(),
            ready: self.is_ready(),
            pools,
            endpoints: st.reg.list().count() as u64,
            policy_revision: st.pol.repo().revision(),
            version: env!("CARGO_PKG_VERSION").into(),
            restore_ms: self
                .restore_ms
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone(),
            regenerations: self.regenerations.load(Ordering::Relaxed),
            programs: Some(self.datapath.programs().into()),
            warnings: self
                .warnings
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone(),
        }
    }

    /// Writes what the ipcache owners changed to the kernel map: upserts first, removals last.
    /// On failure the kernel's state is unknown, so the next flush rewrites everything wanted.
    pub(crate) fn flush_ipcache(&self, st: &mut State) -> Result<(), ManagerError> {
        for w in st.ipcache.pending() {
            let done = match w {
                Write::Upsert(prefix, value) => self.datapath.upsert_ipcache(prefix, value),
                Write::Remove(prefix) => self.datapath.remove_ipcache(prefix),
            };
            if let Err(e) = done {
                st.ipcache.forget_written();
                self.mark_needs_regeneration();
                return Err(e.into());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests;
