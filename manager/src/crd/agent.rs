//! The cluster agent over the API server: the watch thread keeps the [`View`] and hands the
//! manager what changes; the session thread publishes this node's pods as `WeftEndpoint`
//! objects, makes sure the identities its endpoints hold still exist, and collects unused
//! identities. Neither ever blocks the manager: the CNI ADD path only calls
//! [`CrdCluster::allocate`] for a label set this node has never held.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::identities::{self, Collector};
use super::view::{Delivered, View};
use super::{Api, EndpointObject};
use crate::cluster::agent::Agent;
use crate::cluster::session::{Desired, Local};
use crate::cluster::watch::Remote;
use crate::kvstore::identities::ClusterIdentityError;
use crate::kvstore::keys::NodeRecord;
use weft_policy::labels::LabelSet;
use weft_policy::mapstate::Identity;

/// Settings of the CRD agent.
#[derive(Debug, Clone)]
pub struct CrdConfig {
    /// This node.
    pub node: NodeRecord,
    /// How often unused identities are looked for.
    pub gc_interval: Duration,
    /// How long an identity must be seen unused before it is deleted.
    pub gc_grace: Duration,
}

/// The agent's shared state.
pub struct CrdCluster {
    api: Arc<dyn Api>,
    config: CrdConfig,
    connected: AtomicBool,
    view: Mutex<View>,
    delivered: Mutex<Delivered>,
    /// Complete listings applied so far (the session publishes everything again after each).
    listings: AtomicU64,
    /// The last error of each broken watch (logged once until it changes or recovers).
    broken: Mutex<BTreeMap<super::Kind, String>>,
    wake: (Mutex<bool>, Condvar),
    stop: AtomicBool,
    synced: (Mutex<bool>, Condvar),
}

impl CrdCluster {
    /// An agent over `api`; nothing runs until [`Agent::start`].
    #[must_use]
    pub fn new(api: Arc<dyn Api>, config: CrdConfig) -> Self {
        Self {
            api,
            config,
            connected: AtomicBool::new(false),
            view: Mutex::new(View::default()),
            delivered: Mutex::new(Delivered::default()),
            listings: AtomicU64::new(0),
            broken: Mutex::new(BTreeMap::new()),
            wake: (Mutex::new(false), Condvar::new()),
            stop: AtomicBool::new(false),
            synced: (Mutex::new(false), Condvar::new()),
        }
    }

    fn name(&self) -> &str {
        &self.config.node.name
    }

    fn set_connected(&self, up: bool) {
        if self.connected.swap(up, Ordering::SeqCst) != up {
            if up {
                tracing::info!("Kubernetes API server reachable (CRD identity mode)");
            } else {
                tracing::warn!(
                    "Kubernetes API server unreachable: running on what is known; new identities wait"
                );
            }
        }
    }

    /// The cluster-wide number of `labels`.
    pub fn allocate(&self, labels: &LabelSet) -> Result<Identity, ClusterIdentityError> {
        let got = identities::allocate(&*self.api, labels, self.name());
        self.set_connected(!matches!(&got, Err(e) if e.is_unavailable()));
        got
    }

    /// Applies one watch change and hands the manager the difference.
    pub(crate) fn handle(&self, change: super::Change, remote: &dyn Remote) {
        match &change {
            super::Change::Broken(kind, e) => {
                let mut last = crate::sys::locks::lock(&self.broken);
                if last.get(kind) != Some(e) {
                    // A missing CRD or RBAC verb shows here (conf/k8s/00-crd-weft.yaml, 01-rbac.yaml).
                    tracing::warn!(?kind, "CRD identity mode: watch failing (retried): {e}");
                    last.insert(*kind, e.clone());
                }
            }
            super::Change::Listed(kind, _) => {
                crate::sys::locks::lock(&self.broken).remove(kind);
            }
            _ => {}
        }
        let mut view = crate::sys::locks::lock(&self.view);
        let completed = view.apply(change);
        // Connected while no watch is broken (a write's failure says otherwise meanwhile).
        self.set_connected(crate::sys::locks::lock(&self.broken).is_empty());
        if !view.synced() {
            return;
        }
        let derived = view.derive(self.name());
        drop(view);
        crate::sys::locks::lock(&self.delivered).update(derived, remote);
        if completed {
            self.listings.fetch_add(1, Ordering::SeqCst);
            *crate::sys::locks::lock(&self.synced.0) = true;
            self.synced.1.notify_all();
            remote.listed();
            self.poke();
        }
    }

    /// The `WeftEndpoint` objects `desired` calls for.
    fn wanted(&self, desired: &Desired) -> BTreeMap<(String, String), EndpointObject> {
        desired
            .pods
            .iter()
            .map(|p| {
                let ep = EndpointObject {
                    namespace: p.namespace.clone(),
                    name: p.name.clone(),
                    pod_uid: p.uid.clone(),
                    node: self.name().to_owned(),
                    node_ip: self.config.node.node_ip,
                    ips: p.ips.clone(),
                    identity: p.identity,
                    named_ports: p.named_ports.clone(),
                };
                ((p.namespace.clone(), p.name.clone()), ep)
            })
            .collect()
    }

    /// One reconciliation of this node's objects against `published` (what it last wrote,
    /// or found at the last listing): identities its endpoints hold first (re-created if
    /// deleted), then endpoints.
    pub(crate) fn publish(
        &self,
        desired: &Desired,
        published: &mut BTreeMap<(String, String), EndpointObject>,
        reported: &mut BTreeSet<(LabelSet, Identity)>,
    ) -> Result<(), super::CrdError> {
        let missing: Vec<(LabelSet, Identity)> = {
            let view = crate::sys::locks::lock(&self.view);
            desired
                .refs
                .iter()
                .filter(|(l, n)| !view.agrees(l, **n))
                .map(|(l, n)| (l.clone(), *n))
                .collect()
        };
        for (labels, n) in missing {
            match identities::ensure(&*self.api, &labels, n) {
                Ok(()) => {}
                Err(ClusterIdentityError::Crd(e)) if e.is_unavailable() => return Err(e),
                Err(e) => {
                    // Retrying cannot fix it; said once, until it changes.
                    if reported.insert((labels, n)) {
                        tracing::error!("{e}");
                    }
                }
            }
        }
        let want = self.wanted(desired);
        for (id, ep) in &want {
            if published.get(id) != Some(ep) {
                self.api.apply_endpoint(ep)?;
                published.insert(id.clone(), ep.clone());
            }
        }
        if !desired.pods_listed {
            // A pod missing from `want` may only be unknown yet (the pod watch has not listed
            // since a restart): withdrawing its object would drop its address from every other
            // node's ipcache until the list comes in, and their policy with it.
            return Ok(());
        }
        let stale: Vec<(String, String)> = published
            .keys()
            .filter(|k| !want.contains_key(*k))
            .cloned()
            .collect();
        for id in stale {
            if let Some(ep) = published.get(&id) {
                self.api.delete_endpoint(ep)?;
            }
            published.remove(&id);
        }
        Ok(())
    }

    /// Is this node the collector: the first by name among the Nodes it knows (each node
    /// decides alone; two that disagree for a moment are harmless, every delete is guarded).
    fn collects(&self) -> bool {
        let view = crate::sys::locks::lock(&self.view);
        view.node_names()
            .next()
            .is_none_or(|first| first == self.name())
    }

    /// One collection pass (the session calls it every `gc_interval`).
    pub(crate) fn collect(
        &self,
        collector: &mut Collector,
        local: &BTreeSet<Identity>,
        now: Instant,
    ) -> Result<usize, super::CrdError> {
        // A copy: the watch thread must not wait on the collector's calls.
        let view = crate::sys::locks::lock(&self.view).clone();
        collector.run(&*self.api, &view, local, now)
    }

    /// A copy of what the watches show.
    #[must_use]
    pub fn view_snapshot(&self) -> View {
        crate::sys::locks::lock(&self.view).clone()
    }

    fn wait(&self, timeout: Duration) {
        let (lock, cvar) = &self.wake;
        let guard = crate::sys::locks::lock(lock);
        let mut woken = crate::sys::locks::wait_timeout_while(cvar, guard, timeout, |w| !*w);
        *woken = false;
    }

    /// Stops the threads (tests).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.poke();
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn run_watch(&self, remote: &dyn Remote) {
        let rx = loop {
            if self.stopped() {
                return;
            }
            match self.api.watch() {
                Ok(rx) => break rx,
                Err(e) => {
                    tracing::warn!("CRD watch: {e}");
                    self.set_connected(false);
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        };
        while !self.stopped() {
            match rx.recv_timeout(Duration::from_secs(1)) {
                Ok(change) => self.handle(change, remote),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    tracing::error!("CRD watch ended; remote state is frozen");
                    return;
                }
            }
        }
    }

    fn run_session(&self, local: &dyn Local) {
        let mut published = BTreeMap::new();
        let mut seen_listings = 0;
        let mut reported = BTreeSet::new();
        let mut collector = Collector::new(self.config.gc_grace);
        let mut last_gc = Instant::now();
        while !self.stopped() {
            let listings = self.listings.load(Ordering::SeqCst);
            if listings == 0 || !crate::sys::locks::lock(&self.view).synced() {
                self.wait(Duration::from_secs(1));
                continue;
            }
            if listings != seen_listings {
                // What the API server has now is what was published: after an outage, pods
                // that came and went meanwhile are reconciled against it.
                published = crate::sys::locks::lock(&self.view).endpoints_of(self.name());
                seen_listings = listings;
            }
            let desired = local.desired();
            match self.publish(&desired, &mut published, &mut reported) {
                Ok(()) => self.set_connected(true),
                Err(e) => {
                    tracing::debug!("CRD publish: {e}");
                    self.set_connected(!e.is_unavailable());
                }
            }
            if last_gc.elapsed() >= self.config.gc_interval && self.collects() {
                last_gc = Instant::now();
                let held: BTreeSet<Identity> = desired.refs.values().copied().collect();
                match self.collect(&mut collector, &held, Instant::now()) {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(deleted = n, "unused identity objects collected"),
                    Err(e) => tracing::debug!("identity collection: {e}"),
                }
            }
            self.wait(Duration::from_secs(1));
        }
    }
}

impl Agent for CrdCluster {
    fn backend(&self) -> &'static str {
        "crd"
    }
    fn node(&self) -> &NodeRecord {
        &self.config.node
    }
    fn nodes(&self) -> BTreeMap<String, NodeRecord> {
        crate::sys::locks::lock(&self.delivered).nodes.clone()
    }
    fn remote_ip_count(&self) -> usize {
        crate::sys::locks::lock(&self.delivered).ips.len()
    }
    fn connected(&self) -> bool {
        self.connected.load(Ordering::SeqCst)
    }
    fn lease(&self) -> Option<i64> {
        None
    }
    fn synced(&self) -> bool {
        *crate::sys::locks::lock(&self.synced.0)
    }
    fn allocate_identity(&self, labels: &LabelSet) -> Result<Identity, ClusterIdentityError> {
        self.allocate(labels)
    }
    fn poke(&self) {
        let (lock, cvar) = &self.wake;
        *crate::sys::locks::lock(lock) = true;
        cvar.notify_all();
    }
    fn start(
        self: Arc<Self>,
        local: Arc<dyn Local>,
        remote: Arc<dyn Remote>,
    ) -> std::io::Result<()> {
        let me = self.clone();
        std::thread::Builder::new()
            .name("weft-crd-watch".into())
            .spawn(move || me.run_watch(&*remote))?;
        std::thread::Builder::new()
            .name("weft-crd-session".into())
            .spawn(move || self.run_session(&*local))?;
        Ok(())
    }
    fn wait_first_sync(&self, timeout: Duration) -> bool {
        let guard = crate::sys::locks::lock(&self.synced.0);
        let done = crate::sys::locks::wait_timeout_while(&self.synced.1, guard, timeout, |s| !*s);
        *done
    }
}
