//! The manager's operations, composing the registry, identities and policy with the node's side
//! effects (host netlink, eBPF datapath). The HTTP layer (`api`) only translates.
//!
//! One lock (`State`) covers the registry and the policy state: every operation sees and leaves
//! them consistent with each other and with the datapath, and there is no lock ordering to get
//! wrong. Operations under it are map writes and sled flushes (tens of µs); the slow netlink
//! deletes of host veths happen outside it.

mod cluster;
mod labels;
mod policy_api;
mod regen;
pub mod validate;
mod verify;

pub use cluster::ClusterLink;
pub use labels::{from_api_labels, to_api_labels};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use weft_api::{
    AllocateRequest, Allocation, Attachment, DeleteResponse, Endpoint, EndpointState, GcResponse,
    PoolStatus, RegisterRequest, StatusResponse,
};
use weft_policy::rule::NamedPorts;

use crate::datapath::{Datapath, DatapathError, EndpointDatapath};
use crate::endpoint::{EndpointError, Registry};
use crate::hostnet::{HostNet, HostNetError};
use crate::ipcache::{Ipcache, Source, Write};
use crate::link_reaper::LinkReaper;
use crate::node::ChosenCidr;
use crate::policy_state::{PolicyState, PolicyStateError, PortOwner};
use weft_api::delete_queue::DeleteQueue;

/// How long an allocation may stay un-registered before GC or the reaper may treat it as
/// abandoned: an ADD in flight must not lose its IP.
pub const ADD_GRACE_MS: u64 = 5 * 60 * 1000;

/// Failures of manager operations, as the API reports them.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    /// Registry or IPAM.
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    /// Node plumbing.
    #[error(transparent)]
    HostNet(#[from] HostNetError),
    /// eBPF datapath.
    #[error("datapath: {0}")]
    Datapath(#[from] DatapathError),
    /// Identities or policy persistence.
    #[error(transparent)]
    Policy(#[from] PolicyStateError),
    /// A request that does not make sense (bad labels, bad policy file...).
    #[error("{0}")]
    Invalid(String),
    /// Not ready to serve yet.
    #[error("weft-manager is starting; retry shortly")]
    NotReady,
    /// Kvstore mode: a new label set needs a cluster-wide number and etcd cannot be reached
    /// (retryable).
    #[error(
        "labels {labels} need a new cluster-wide identity and the kvstore is unreachable ({source}); retry once etcd is back (pods with known labels still start)"
    )]
    KvstoreUnavailable {
        /// The label set.
        labels: String,
        /// Why etcd could not be asked.
        source: crate::kvstore::KvError,
    },
    /// Kvstore mode: the cluster could not number a new label set (conflict, exhausted, a
    /// malformed record).
    #[error(transparent)]
    ClusterIdentity(crate::kvstore::identities::ClusterIdentityError),
}

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
    cluster: Option<ClusterLink>,
    /// Masquerade rules, kept in step with the node registry.
    masquerade: Option<Arc<crate::masquerade::Masquerader>>,
    /// Prometheus families counted as things happen (`crate::prom`).
    prom: Arc<crate::prom::Metrics>,
    /// Rule texts parsed before: a re-imported file parses only its changed rules.
    parse_memo: Mutex<weft_policy::parse::memo::ParseMemo>,
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

/// Hands memory freed by a large regeneration back to the kernel. Computing and encoding the
/// policies of hundreds of endpoints allocates hundreds of MiB in small pieces that glibc kept
/// cached afterwards (~130 MiB RSS at 250 endpoints and 1000 rules without a trim, ~65 MiB with
/// it; docs/BENCHMARKS.md). jemalloc with the daemon's options returns empty pages at once; this
/// purge covers an operator's `MALLOC_CONF` that delays it.
///
/// The trim right away is not enough after a large store write: sled frees the tree nodes a
/// batch superseded through epoch-based reclamation, seconds later, on its own threads. After
/// deleting 50 000 rules the live heap is ~5 MiB but ~150 MiB of those late frees stayed
/// resident (docs/BENCHMARKS.md "Memory after a large delete"), so a background thread trims
/// again on [`LATE_TRIMS`]' schedule, restarted by every new request.
///
/// Every trim runs on that thread, never on the request's: a trim of a large heap takes
/// milliseconds, which a one-rule import (≤ 10 ms, issue #10) cannot afford to wait for.
pub(crate) fn release_freed_memory() {
    if !TRIMMER.request() {
        trim_now(); // no thread: trim here rather than never
    }
}

/// Pauses before each follow-up trim: trims at 0, 0.5, 1.5, 3.5 and 7.5 s after the last
/// request.
const LATE_TRIMS: [std::time::Duration; 4] = [
    std::time::Duration::from_millis(500),
    std::time::Duration::from_secs(1),
    std::time::Duration::from_secs(2),
    std::time::Duration::from_secs(4),
];

fn trim_now() {
    let t0 = std::time::Instant::now();
    crate::allocator::purge();
    tracing::debug!(us = t0.elapsed().as_micros(), "freed memory released");
}

/// The trim thread's mailbox: a request counter it waits on.
struct Trimmer {
    requests: std::sync::Mutex<u64>,
    wake: std::sync::Condvar,
    started: std::sync::OnceLock<bool>,
}

static TRIMMER: Trimmer = Trimmer {
    requests: std::sync::Mutex::new(0),
    wake: std::sync::Condvar::new(),
    started: std::sync::OnceLock::new(),
};

impl Trimmer {
    fn lock(&self) -> std::sync::MutexGuard<'_, u64> {
        self.requests
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Asks the thread for a trim now and the late ones after; false when it cannot run.
    fn request(&'static self) -> bool {
        *self.lock() += 1;
        self.wake.notify_one();
        *self.started.get_or_init(|| {
            std::thread::Builder::new()
                .name("trim".into())
                .spawn(move || self.run())
                .inspect_err(|e| {
                    tracing::warn!(error = %e, "cannot start the trim thread; trimming inline");
                })
                .is_ok()
        })
    }

    fn run(&self) {
        let mut seen = 0;
        loop {
            let mut n = self.lock();
            while *n == seen {
                n = self
                    .wake
                    .wait(n)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
            seen = *n;
            drop(n);
            trim_now();
            for delay in LATE_TRIMS {
                let n = self.lock();
                let (n, _) = self
                    .wake
                    .wait_timeout_while(n, delay, |n| *n == seen)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if *n != seen {
                    break; // a new request: trim at once and start the schedule over
                }
                drop(n);
                trim_now();
            }
        }
    }
}

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

    /// Reserves an endpoint, its identity and its IPs (all persisted before returning). Peers
    /// whose selectors match a new identity are regenerated now, so they already allow the new
    /// pod when its IPs appear in the ipcache at registration.
    pub fn allocate(&self, req: &AllocateRequest) -> Result<Endpoint, ManagerError> {
        self.allocate_with_labels(req, None)
    }

    /// [`Self::allocate`] with the endpoint's labels given (Kubernetes mode: from its pod and
    /// namespace) instead of built from the request's CNI labels.
    pub fn allocate_with_labels(
        &self,
        req: &AllocateRequest,
        pod_labels: Option<weft_policy::labels::LabelSet>,
    ) -> Result<Endpoint, ManagerError> {
        let t0 = std::time::Instant::now();
        validate::allocate(req)?;
        let labels = pod_labels.unwrap_or_else(|| {
            weft_policy::labels::LabelSet::for_pod(
                req.pod_namespace.as_deref().unwrap_or("default"),
                req.labels
                    .iter()
                    .map(|l| (l.key.as_str(), l.value.as_str())),
            )
        });
        // Before the state lock: a new label set may wait on the kvstore.
        let cluster_id = if self.find(&req.container_id, &req.ifname).is_some() {
            None
        } else {
            self.cluster_identity(&labels)?
        };
        // A DEL for this pair queued while the manager was unreachable came before this ADD:
        // apply it first, or a later drain would remove what this ADD creates. Taken before
        // the state lock: the drain holds the queue lock while it takes the state lock.
        let queued = self
            .delete_queue
            .as_ref()
            .map_or(Ok(false), |q| q.take(&req.container_id, &req.ifname));
        let mut st = self.state();
        match queued {
            Ok(true) => {
                if let Some(ep) = st.reg.begin_delete(&req.container_id, &req.ifname)? {
                    // The CNI's DEL tried to delete the host veth too; if that failed, this
                    // ADD's veth creation fails with "exists" and the runtime's DEL removes it.
                    self.forget_locked(&mut st, ep.id)?;
                    tracing::info!(endpoint_id = ep.id, container_id = %ep.container_id, "queued DEL applied before a new ADD");
                }
            }
            Ok(false) => {}
            Err(e) => tracing::error!("delete queue: {e}"),
        }
        if let Some(ep) = st.reg.find(&req.container_id, &req.ifname) {
            if ep.state == EndpointState::Deleting {
                return Err(EndpointError::BeingDeleted(ep.id).into());
            }
            return Ok(ep.clone());
        }
        let (identity, effects) = match cluster_id {
            Some(id) => st.pol.acquire_as(&labels, Some(id))?,
            None => st.pol.acquire(&labels)?,
        };
        let ep = match st.reg.allocate(req, to_api_labels(&labels), identity) {
            Ok(ep) => ep,
            Err(e) => {
                let undo = st.pol.release(identity)?;
                self.regenerate_users(&mut st, &undo)?;
                return Err(e.into());
            }
        };
        self.regenerate_users(&mut st, &effects)?;
        self.poke_cluster();
        tracing::info!(
            endpoint_id = ep.id,
            container_id = %ep.container_id,
            ifname = %ep.ifname,
            identity,
            ips = ?ep.ips.iter().map(|i| i.address).collect::<Vec<_>>(),
            us = t0.elapsed().as_micros(),
            "endpoint allocated"
        );
        Ok(ep)
    }

    /// Registers the plumbed veth: attaches the datapath, installs the endpoint's policy, and
    /// only then persists it `ready` (Cilium's `SyncBuildEndpoint`: ADD returns enforcing).
    pub fn register(&self, id: u32, req: &RegisterRequest) -> Result<Endpoint, ManagerError> {
        let t_req = std::time::Instant::now();
        validate::register(req)?;
        let mut st = self.state();
        let mut ep = st.reg.prepare_ready(id, req)?;
        let mut view = datapath_view(&ep).ok_or_else(|| {
            ManagerError::Invalid(format!(
                "endpoint {id} has no pod MAC or host ifindex after registering"
            ))
        })?;
        let t0 = std::time::Instant::now();
        // Its named ports first: peers whose egress rules name them (and its own slot) know
        // them before its addresses resolve. Then the slot (a replica finds it written): the
        // endpoint's entry points at complete entries with their enforcement flags from the
        // moment it exists.
        let labels = from_api_labels(&ep.labels);
        let named = self.named_ports(&ep);
        let port_owner = PortOwner::Local(ep.id);
        let ports = st
            .pol
            .set_peer_ports(port_owner.clone(), ep.identity, named.clone());
        let slot = self
            .regenerate_users(&mut st, &ports)
            .and_then(|_| self.prepare_slot(&mut st, ep.identity, &labels, &named));
        view.policy_id = match slot {
            Ok(slot) => slot,
            Err(e) => {
                self.forget_ports(&mut st, &port_owner);
                return Err(e);
            }
        };
        let slot_us = t0.elapsed().as_micros();
        ep.policy_revision = st.pol.repo().revision();
        // The ready record goes to disk while the programs attach: its write (~0.3 ms) was the
        // longest step of a register. The reply still waits for both. Should the manager die
        // before the datapath is done, its restart finds a ready endpoint whose veth exists
        // and programs it, as for any other; the runtime, which got no answer, retries or DELs.
        let (flushing, before) = st.reg.update_flushing(ep.clone())?;
        let attached = self.datapath.attach_endpoint(&view);
        st.slots.join(ep.id, view.policy_id);
        let attach_us = t0.elapsed().as_micros();
        let owner = Source::LocalEndpoint(ep.id);
        for ip in &view.ips {
            st.ipcache
                .set(ipnet::IpNet::from(*ip), owner.clone(), view.identity);
        }
        let done = attached
            .map_err(ManagerError::from)
            .and_then(|()| self.flush_ipcache(&mut st))
            .and_then(|()| Ok(flushing.wait().map_err(EndpointError::from)?));
        let ep = match done {
            Ok(()) => ep,
            Err(e) => {
                // The record goes back to what it was (`allocated` without an ifindex, for a
                // first register), so nothing else would ever detach what was just attached.
                if let Err(d) = st.reg.revert(before) {
                    tracing::error!(endpoint_id = id, "undoing a failed register: {d}");
                }
                for ip in &view.ips {
                    st.ipcache.unset(ipnet::IpNet::from(*ip), &owner);
                }
                if let Err(d) = self.flush_ipcache(&mut st) {
                    tracing::error!(endpoint_id = id, "undoing a failed register: {d}");
                }
                if let Err(d) = self.datapath.detach_endpoint(&view) {
                    tracing::error!(endpoint_id = id, "undoing a failed register: {d}");
                }
                if let Some(slot) = st.slots.leave(id)
                    && let Err(d) = self.release_if_unused(&mut st, slot)
                {
                    tracing::error!(endpoint_id = id, "undoing a failed register: {d}");
                }
                self.forget_ports(&mut st, &port_owner);
                return Err(e);
            }
        };
        let datapath_us = t0.elapsed().as_micros();
        self.poke_cluster();
        tracing::info!(
            endpoint_id = ep.id,
            host_ifname = %ep.host_ifname,
            revision = ep.policy_revision,
            policy_slot = view.policy_id,
            slot_us,
            attach_us,
            datapath_us,
            us = t_req.elapsed().as_micros(),
            "endpoint ready"
        );
        Ok(ep)
    }

    /// Removes the endpoint of (container id, ifname), if that container owns one: the host
    /// veth is set down (the kernel drops its routes), then datapath state, the record, its IPs
    /// and its identity reference go; the veth itself is deleted in the background (see
    /// `link_reaper`), also when there is no endpoint (an ADD that failed half-way).
    pub async fn delete(
        &self,
        container_id: &str,
        ifname: &str,
    ) -> Result<DeleteResponse, ManagerError> {
        validate::owner(container_id, ifname)?;
        let host_ifname = weft_api::naming::host_ifname(container_id, ifname);
        let begun = self.state().reg.begin_delete(container_id, ifname)?;
        let Some(ep) = begun else {
            // An ADD that failed half-way may have left its veth (down first, so the reaper
            // has its ifindex).
            if let Some(index) = self.hostnet.set_link_down(&host_ifname).await? {
                self.reaper.schedule(&host_ifname, index);
            }
            return Ok(DeleteResponse { deleted: None });
        };
        // Down before the IPs are freed: a route through the veth would still send a reused
        // IP's traffic to the old pod. A failure leaves the endpoint `deleting`; the runtime's
        // retry of DEL continues from there.
        let index = self.hostnet.set_link_down(&ep.host_ifname).await?;
        let deleted = {
            let mut st = self.state();
            self.forget_locked(&mut st, ep.id)?
        };
        if let Some(index) = index {
            self.reaper.schedule(&ep.host_ifname, index);
        }
        if let Some(ep) = &deleted {
            tracing::info!(
                endpoint_id = ep.id,
                container_id,
                ifname,
                "endpoint deleted"
            );
        }
        Ok(DeleteResponse { deleted })
    }

    /// Finishes the delete of endpoint `id`: datapath state, then the record, its IPs and its
    /// identity reference. Works from the record as it is now, and only if it is still being
    /// deleted: another path may have finished it while the caller waited for the lock.
    fn forget_locked(&self, st: &mut State, id: u32) -> Result<Option<Endpoint>, ManagerError> {
        let Some(ep) = st.reg.get(id).cloned() else {
            return Ok(None);
        };
        if ep.state != EndpointState::Deleting {
            return Ok(None);
        }
        if let Some(view) = datapath_view(&ep) {
            self.datapath.detach_endpoint(&view)?;
        }
        for ip in &ep.ips {
            st.ipcache
                .unset(ipnet::IpNet::from(ip.address), &Source::LocalEndpoint(id));
        }
        self.flush_ipcache(st)?;
        let ports = st.pol.remove_peer_ports(&PortOwner::Local(id));
        self.regenerate_users(st, &ports)?;
        if let Some(slot) = st.slots.leave(id) {
            self.retire_slot(st, slot)?;
        }
        let deleted = st.reg.forget(id)?;
        if let Some(gone) = &deleted
            && gone.identity != 0
        {
            let effects = st.pol.release(gone.identity)?;
            self.regenerate_users(st, &effects)?;
        }
        self.poke_cluster();
        Ok(deleted)
    }

    /// Marks the endpoint of a pair `deleting` (the delete-queue drain does this while it holds
    /// the queue lock, so an ADD for the same pair afterwards sees the delete in progress).
    pub fn begin_delete_pair(
        &self,
        container_id: &str,
        ifname: &str,
    ) -> Result<Option<Endpoint>, ManagerError> {
        Ok(self.state().reg.begin_delete(container_id, ifname)?)
    }

    /// Tears an endpoint down completely on the manager's own initiative (restore, GC, reaper,
    /// queued DEL): `deleting` first, then the host veth, then datapath and record. `ep` is the
    /// caller's snapshot: if the endpoint changed since (another id owns the pair now, or it
    /// moved to another state, e.g. an abandoned-looking ADD registered meanwhile), nothing is
    /// done and `false` is returned.
    pub async fn remove_fully(&self, ep: &Endpoint) -> Result<bool, ManagerError> {
        let doomed = {
            let mut st = self.state();
            let same = st
                .reg
                .get(ep.id)
                .is_some_and(|cur| cur.state == ep.state || cur.state == EndpointState::Deleting);
            if !same {
                return Ok(false);
            }
            match st.reg.begin_delete(&ep.container_id, &ep.ifname)? {
                Some(cur) if cur.id == ep.id => cur,
                _ => return Ok(false),
            }
        };
        self.hostnet.delete_link(&doomed.host_ifname).await?;
        let mut st = self.state();
        self.forget_locked(&mut st, doomed.id)?;
        Ok(true)
    }

    /// Waits until no background deletion of (container, ifname)'s host veth is pending: an
    /// ADD creates a link of that name.
    pub async fn settle_host_link(&self, container_id: &str, ifname: &str) {
        self.reaper
            .settle(&weft_api::naming::host_ifname(container_id, ifname))
            .await;
    }

    /// Host veths whose deletion is pending or running.
    pub fn links_being_reaped(&self) -> Vec<String> {
        self.reaper.pending()
    }

    /// Schedules the deletion of every host veth no endpoint owns: a manager killed with
    /// deletions pending left them behind. Runs before the API socket is bound: an ADD whose
    /// pair exists before its allocation (the CNI creates both at once) either fails to reach
    /// this manager, or has its allocation wait (`settle`) for the deletion of its pair and then
    /// fails on the missing link; it never ends up ready on a link deleted later. Returns how
    /// many were scheduled.
    pub async fn reap_orphan_links(&self) -> Result<usize, ManagerError> {
        let links = self.hostnet.link_indexes().await?;
        let owned: std::collections::BTreeSet<String> = self
            .state()
            .reg
            .list()
            .map(|ep| ep.host_ifname.clone())
            .collect();
        let mut n = 0;
        let orphans = links
            .iter()
            .filter(|(l, _)| weft_api::naming::is_host_ifname(l) && !owned.contains(*l));
        for (link, index) in orphans {
            tracing::info!(link = %link, "host veth without an endpoint: deleting");
            self.reaper.schedule(link, *index);
            n += 1;
        }
        Ok(n)
    }

    /// The CNI's delete queue, when attached.
    pub fn delete_queue(&self) -> Option<&DeleteQueue> {
        self.delete_queue.as_ref()
    }

    /// Deletes a host link left without an endpoint (missing is fine).
    pub async fn delete_host_link(&self, name: &str) -> Result<(), ManagerError> {
        Ok(self.hostnet.delete_link(name).await?)
    }

    /// Releases every endpoint not in `valid`, except ADDs still in flight; their host veths
    /// are deleted too, since no DEL will come for them.
    pub async fn gc(&self, valid: &[Attachment], now_ms: u64) -> Result<GcResponse, ManagerError> {
        let doomed: Vec<Endpoint> = self
            .state()
            .reg
            .list()
            .filter(|ep| {
                !valid
                    .iter()
                    .any(|a| a.container_id == ep.container_id && a.ifname == ep.ifname)
            })
            .filter(|ep| {
                ep.state != EndpointState::Allocated
                    || now_ms.saturating_sub(ep.created_ms) > ADD_GRACE_MS
            })
            .cloned()
            .collect();
        let mut released = Vec::new();
        for ep in doomed {
            if self.remove_fully(&ep).await? {
                tracing::info!(endpoint_id = ep.id, container_id = %ep.container_id, "released by GC");
                released.push(ep);
            }
        }
        Ok(GcResponse { released })
    }

    /// Every endpoint.
    pub fn endpoints(&self) -> Vec<Endpoint> {
        self.state().reg.list().cloned().collect()
    }

    /// One endpoint by id.
    pub fn endpoint(&self, id: u32) -> Option<Endpoint> {
        self.state().reg.get(id).cloned()
    }

    /// The endpoint of (container id, ifname).
    pub fn find(&self, container_id: &str, ifname: &str) -> Option<Endpoint> {
        self.state().reg.find(container_id, ifname).cloned()
    }

    /// Every IP allocation.
    pub fn allocations(&self) -> Vec<Allocation> {
        let st = self.state();
        let mut out: Vec<Allocation> = st
            .reg
            .list()
            .flat_map(|ep| {
                ep.ips.iter().map(|ip| Allocation {
                    address: ip.address,
                    pool: st
                        .reg
                        .pools()
                        .iter()
                        .find(|p| p.same_family(ip.address))
                        .map(|p| p.cidr().to_string())
                        .unwrap_or_default(),
                    endpoint_id: ep.id,
                    container_id: ep.container_id.clone(),
                    ifname: ep.ifname.clone(),
                })
            })
            .collect();
        out.sort_by_key(|a| a.address);
        out
    }
}

#[cfg(test)]
pub(crate) mod tests;
