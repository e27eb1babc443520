//! Multi-node through the kvstore (Cilium's kvstore mode): this node's record, endpoint IPs and
//! identity references are published under a lease it keeps alive (`session.rs`), and every
//! node's records are watched into the manager (`watch.rs`): remote identities into the
//! selector cache, remote endpoint IPs into the ipcache, remote nodes' pod CIDRs into routes.
//!
//! The manager never waits on the store for what it already knows: publishing is a
//! reconciliation of "what should be there" against "what was written" that simply runs again
//! after an outage; only a label set never seen before needs the store (its number is
//! cluster-wide), and that fails fast with a retryable error while the store is down.

pub mod agent;
pub mod link;
pub mod nodeip;
pub mod routes;
pub mod session;
pub mod watch;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::kvstore::identities::{self, ClusterIdentityError};
use crate::kvstore::keys::{IpRecord, NodeRecord};
use crate::kvstore::{Kv, LeaseId};
use weft_policy::labels::LabelSet;
use weft_policy::mapstate::Identity;

/// Settings of the cluster agent.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// This node.
    pub node: NodeRecord,
    /// Lease time-to-live: how long other nodes keep this node's entries after it stops.
    pub lease_ttl_s: i64,
    /// How often unreferenced identities are collected.
    pub gc_interval: Duration,
}

/// The agent's shared state.
pub struct Cluster {
    kv: Arc<dyn Kv>,
    config: ClusterConfig,
    connected: AtomicBool,
    lease: Mutex<Option<LeaseId>>,
    /// Remote nodes, by name (kept by the watcher).
    nodes: Mutex<BTreeMap<String, NodeRecord>>,
    /// Remote endpoint IPs as published (kept by the watcher).
    ips: Mutex<BTreeMap<IpAddr, IpRecord>>,
    wake: (Mutex<bool>, Condvar),
    stop: AtomicBool,
    /// The watcher has applied one full listing.
    synced: (Mutex<bool>, Condvar),
}

impl Cluster {
    /// An agent over `kv`; nothing runs until [`session::spawn`] and [`watch::spawn`].
    #[must_use]
    pub fn new(kv: Arc<dyn Kv>, config: ClusterConfig) -> Self {
        Self {
            kv,
            config,
            connected: AtomicBool::new(false),
            lease: Mutex::new(None),
            nodes: Mutex::new(BTreeMap::new()),
            ips: Mutex::new(BTreeMap::new()),
            wake: (Mutex::new(false), Condvar::new()),
            stop: AtomicBool::new(false),
            synced: (Mutex::new(false), Condvar::new()),
        }
    }

    /// This node's name.
    #[must_use]
    pub fn node_name(&self) -> &str {
        &self.config.node.name
    }

    /// This node's record.
    #[must_use]
    pub fn node(&self) -> &NodeRecord {
        &self.config.node
    }

    /// Did the last store operation succeed?
    #[must_use]
    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::SeqCst)
    }

    fn set_connected(&self, up: bool) {
        if self.connected.swap(up, Ordering::SeqCst) != up {
            if up {
                tracing::info!("kvstore connected");
            } else {
                tracing::warn!(
                    "kvstore disconnected: running on what is known; new identities wait"
                );
            }
        }
    }

    /// The lease this node's keys live under.
    #[must_use]
    pub fn lease(&self) -> Option<LeaseId> {
        *crate::sys::locks::lock(&self.lease)
    }

    /// Remote nodes.
    #[must_use]
    pub fn nodes(&self) -> BTreeMap<String, NodeRecord> {
        crate::sys::locks::lock(&self.nodes).clone()
    }

    /// Remote endpoint IPs.
    #[must_use]
    pub fn remote_ips(&self) -> BTreeMap<IpAddr, IpRecord> {
        crate::sys::locks::lock(&self.ips).clone()
    }

    /// The cluster-wide number of a label set this node does not hold yet.
    pub fn allocate_identity(&self, labels: &LabelSet) -> Result<Identity, ClusterIdentityError> {
        let got = identities::allocate(&*self.kv, labels);
        self.set_connected(!matches!(&got, Err(ClusterIdentityError::Kv(e)) if e.is_unavailable()));
        got
    }

    /// Asks the session to publish now (an endpoint or identity changed).
    pub fn poke(&self) {
        let (lock, cvar) = &self.wake;
        *crate::sys::locks::lock(lock) = true;
        cvar.notify_all();
    }

    /// Waits for a poke or `timeout`.
    fn wait(&self, timeout: Duration) {
        let (lock, cvar) = &self.wake;
        let guard = crate::sys::locks::lock(lock);
        let mut woken = crate::sys::locks::wait_timeout_while(cvar, guard, timeout, |w| !*w);
        *woken = false;
    }

    /// Has the watcher applied a full listing since start?
    #[must_use]
    pub fn synced(&self) -> bool {
        *crate::sys::locks::lock(&self.synced.0)
    }

    fn mark_synced(&self) {
        *crate::sys::locks::lock(&self.synced.0) = true;
        self.synced.1.notify_all();
    }

    /// Waits up to `timeout` for the first full listing; returns whether it came.
    #[must_use]
    pub fn wait_first_sync(&self, timeout: Duration) -> bool {
        let guard = crate::sys::locks::lock(&self.synced.0);
        let done = crate::sys::locks::wait_timeout_while(&self.synced.1, guard, timeout, |s| !*s);
        *done
    }

    /// Stops the threads (tests).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.poke();
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
}
