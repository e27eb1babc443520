//! Start-up in the order of docs/ARCHITECTURE.md, "Restore", then serving the API until SIGTERM.
//!
//! Its children: [`config`] the settings, [`guard`] what is refused before anything is touched,
//! [`k8s`] Kubernetes mode (the Node, the watchers), [`cni_install`] the `DaemonSet`'s install of
//! the plugin and conflist, [`node_start`] the node's identity, pod CIDRs and lost-state guard.
//! The daemon calls every other module; nothing calls it.

pub mod cni_install;
pub mod config;
pub mod guard;
pub mod k8s;
pub mod node_start;

use node_start::{node_cidrs, node_identity, refuse_lost_state};

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;
use tokio::net::UnixListener;
use weft_api::delete_queue::DeleteQueue;

use crate::daemon::config::Config;
use crate::datapath::{BpfDatapath, Datapath, DatapathConfig, DatapathError};
use crate::endpoint::ipam::Pool;
use crate::endpoint::{EndpointError, Registry};
use crate::node::ChosenCidr;
use crate::node::hostnet::{HostNet, HostNetError, NetlinkHostNet};
use crate::policy_state::{PolicyState, PolicyStateError};
use crate::service::{Manager, from_api_labels};
use crate::slots::SlotTable;
use crate::store::{Store, StoreError};

/// Start-up failures; each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// State database.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Restoring endpoints.
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    /// The eBPF datapath could not be opened.
    #[error("eBPF datapath: {0}")]
    Datapath(#[from] DatapathError),
    /// Identities or policies could not be restored.
    #[error("restoring identities and policies: {0}")]
    Policy(#[from] PolicyStateError),
    /// Validating restored endpoints.
    #[error("restoring endpoints: {0}")]
    Restore(#[from] crate::service::ManagerError),
    /// Node plumbing.
    #[error(transparent)]
    HostNet(#[from] HostNetError),
    /// The Service maps could not be read back.
    #[error("restoring Service frontends: {0}")]
    Services(#[from] crate::lb::LbError),
    /// The node's identity, pod CIDRs or state at start.
    #[error(transparent)]
    NodeStart(#[from] node_start::NodeStartError),
    /// Kubernetes mode.
    #[error(transparent)]
    K8s(#[from] crate::daemon::k8s::K8sError),
    /// A start-up guard refused (untrusted dir, busy pin dir, socket path in use).
    #[error(transparent)]
    Guard(#[from] crate::daemon::guard::GuardError),
    /// The delete queue's directory is not trusted.
    #[error(transparent)]
    Queue(#[from] weft_api::delete_queue::QueueError),
    /// Kvstore mode: this node cannot join as configured (its name or address).
    #[error("kvstore: {0}")]
    KvstoreNode(String),
    /// Kvstore mode: the etcd client could not be set up.
    #[error(transparent)]
    Kvstore(#[from] crate::kvstore::KvError),
    /// Kvstore mode: the cluster agent's threads could not be started.
    #[error("kvstore: starting its threads: {0}")]
    KvstoreThreads(#[source] std::io::Error),
    /// CRD mode: the API client's runtime could not be started.
    #[error("CRD identity mode: starting the API client's runtime: {0}")]
    CrdRuntime(#[source] std::io::Error),
    /// The masquerade table could not be installed.
    #[error(transparent)]
    Masquerade(#[from] crate::node::masquerade::MasqueradeError),
    /// Filesystem work around the socket or state dir.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// Path.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
}

/// Kvstore mode: the agent for this node (nothing connects yet; etcd may be down).
fn cluster_link(
    config: &Config,
    kv: &crate::daemon::config::KvstoreConfig,
    node_name: &str,
    cidrs: &[ChosenCidr],
) -> Result<crate::cluster::link::ClusterLink, StartError> {
    use crate::cluster::{Cluster, ClusterConfig, nodeip, routes::NetlinkRoutes};
    use crate::kvstore::{etcd::EtcdKv, keys};
    keys::check_node_name(node_name).map_err(StartError::KvstoreNode)?;
    let node_ip = match config.node_ip {
        Some(ip) => ip,
        None => nodeip::detect().map_err(StartError::KvstoreNode)?,
    };
    let store = EtcdKv::new(
        kv.endpoints.clone(),
        &kv.tls,
        std::time::Duration::from_secs(2),
    )?;
    let node = keys::NodeRecord {
        name: node_name.to_owned(),
        node_ip,
        pod_cidrs: cidrs.iter().map(|c| c.cidr).collect(),
        router_ips: cidrs.iter().map(ChosenCidr::router_ip).collect(),
    };
    tracing::info!(node = %node.name, %node_ip, endpoints = ?kv.endpoints, "kvstore mode");
    let cluster = Cluster::new(
        Arc::new(store),
        ClusterConfig {
            node,
            lease_ttl_s: i64::try_from(kv.lease_ttl_s).unwrap_or(15),
            gc_interval: std::time::Duration::from_secs(30),
        },
    );
    Ok(crate::cluster::link::ClusterLink {
        cluster: Arc::new(cluster) as Arc<dyn crate::cluster::agent::Agent>,
        routes: Arc::new(NetlinkRoutes::new()?),
        runtime: tokio::runtime::Handle::current(),
        endpoints: kv.endpoints.clone(),
    })
}

/// How long CRD mode waits before deleting an identity it has seen unused.
const CRD_GC_GRACE: std::time::Duration = std::time::Duration::from_mins(5);

/// CRD mode: the agent for this node over the API server (nothing connects yet). Its
/// underlay address: `--node-ip`, else the Node's `InternalIP`, else detected.
fn crd_link(
    config: &Config,
    k8s: &crate::daemon::k8s::Connected,
    node_name: &str,
    cidrs: &[ChosenCidr],
) -> Result<crate::cluster::link::ClusterLink, StartError> {
    use crate::cluster::{nodeip, routes::NetlinkRoutes};
    use crate::crd::agent::{CrdCluster, CrdConfig};
    let node_ip = match config
        .node_ip
        .or_else(|| crate::crd::kube::node_record(&k8s.node).map(|r| r.node_ip))
    {
        Some(ip) => ip,
        None => nodeip::detect().map_err(StartError::KvstoreNode)?,
    };
    let node = crate::kvstore::keys::NodeRecord {
        name: node_name.to_owned(),
        node_ip,
        pod_cidrs: cidrs.iter().map(|c| c.cidr).collect(),
        router_ips: cidrs.iter().map(ChosenCidr::router_ip).collect(),
    };
    let kubeconfig = config.k8s.as_ref().and_then(|k| k.kubeconfig.clone());
    let api = crate::crd::kube::KubeApi::new(kubeconfig, std::time::Duration::from_secs(5))
        .map_err(StartError::CrdRuntime)?;
    tracing::info!(node = %node.name, %node_ip, "CRD identity mode: identities and remote pods through the API server");
    let cluster = CrdCluster::new(
        Arc::new(api),
        CrdConfig {
            node,
            gc_interval: std::time::Duration::from_mins(1),
            gc_grace: CRD_GC_GRACE,
        },
    );
    Ok(crate::cluster::link::ClusterLink {
        cluster: Arc::new(cluster),
        routes: Arc::new(NetlinkRoutes::new()?),
        runtime: tokio::runtime::Handle::current(),
        endpoints: Vec::new(),
    })
}

/// The masquerade table, installed before any pod can send and recreated idempotently on
/// every start (`None` when turned off).
fn masquerade(
    config: &Config,
    own_cidrs: Vec<ipnet::IpNet>,
    kept: &[ipnet::IpNet],
) -> Result<Option<Arc<crate::node::masquerade::Masquerader>>, StartError> {
    use crate::node::masquerade::{Masquerader, NftCommand};
    if !config.masquerade {
        // Turned off since the last run: nothing of it may stay behind. Without nft there is
        // nothing of it either.
        if let Err(e) = crate::node::masquerade::uninstall(&NftCommand) {
            tracing::warn!("--masquerade=false: removing an earlier masquerade table: {e}");
        }
        return Ok(None);
    }
    let m = Masquerader::new(
        Arc::new(NftCommand),
        own_cidrs,
        config.non_masquerade_cidrs.clone(),
    );
    m.install(kept)?;
    Ok(Some(Arc::new(m)))
}

/// Times the phases of start-up for the log, `weftctl status` and the benchmark.
struct Phases {
    start: Instant,
    last: Instant,
    done: Vec<(String, f64)>,
}

impl Phases {
    fn new() -> Self {
        let now = Instant::now();
        Self {
            start: now,
            last: now,
            done: Vec::new(),
        }
    }

    fn mark(&mut self, name: &str) {
        let now = Instant::now();
        self.done
            .push((name.into(), (now - self.last).as_secs_f64() * 1000.0));
        self.last = now;
    }
}

/// The start-up guards: root-only files, trusted state and socket dirs and delete queue, the
/// pin dir locked against a second manager. Returns the delete queue.
fn guard_paths(config: &Config) -> Result<DeleteQueue, StartError> {
    // Everything the manager creates (sled files, the queue) is for root only.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    crate::daemon::guard::secure_state_dir(&config.state_dir)?;
    crate::daemon::guard::check_socket(&config.socket)?;
    let queue = DeleteQueue::for_socket(&config.socket);
    queue.ensure_trusted()?;
    crate::datapath::ensure_bpffs(&config.bpffs)?;
    crate::daemon::guard::lock_pin_dir(&config.bpffs)?;
    Ok(queue)
}

/// Kvstore mode: starts the cluster agent's watch and session, and waits (bounded: etcd may be
/// down) for the remote identities and addresses, so the regeneration and the ipcache
/// reconciliation that follow do not flap them. False when not in kvstore mode.
async fn join_cluster(manager: &Arc<Manager>) -> Result<bool, StartError> {
    let Some(cluster) = manager.cluster().cloned() else {
        return Ok(false);
    };
    cluster
        .clone()
        .start(manager.clone(), manager.clone())
        .map_err(StartError::KvstoreThreads)?;
    let synced = tokio::task::spawn_blocking(move || {
        cluster.wait_first_sync(std::time::Duration::from_secs(3))
    })
    .await
    .unwrap_or(false);
    if !synced {
        tracing::warn!("kvstore not reachable at start: running on what this node knows");
    }
    Ok(true)
}

/// What start-up's restore steps found (logged once the manager serves).
struct Restored {
    kept: usize,
    removed: usize,
    stale: usize,
    stale_ipcache: usize,
    regenerated: usize,
    drained: usize,
    orphan_links: usize,
}

/// Start-up once the manager is built: its endpoints checked against the kernel, the cluster
/// joined, the datapath and ipcache reconciled and every policy regenerated, the delete queue
/// drained and orphan links reaped, each a phase of `phases`.
async fn restore_all(
    manager: &Arc<Manager>,
    hostnet: &dyn HostNet,
    queue: &DeleteQueue,
    phases: &mut Phases,
) -> Result<Restored, StartError> {
    let (kept, removed) =
        crate::endpoint::restore::restore_endpoints(manager, hostnet, crate::sys::clock::now_ms())
            .await?;
    phases.mark("validate");
    if join_cluster(manager).await? {
        phases.mark("kvstore");
    }
    manager.readopt()?;
    phases.mark("re-adopt");
    let stale = manager.reconcile_datapath()?;
    phases.mark("reconcile");
    let regenerated = manager.regenerate_all()?;
    let stale_ipcache = manager.reconcile_ipcache()?;
    phases.mark("regenerate");
    let drained = crate::endpoint::restore::drain_delete_queue(manager, queue).await;
    phases.mark("delete-queue");
    let orphan_links = manager.reap_orphan_links().await?;
    Ok(Restored {
        kept,
        removed,
        stale,
        stale_ipcache,
        regenerated,
        drained,
        orphan_links,
    })
}

/// The Service frontends the pinned maps hold (a restart), with their ids. Outside Kubernetes
/// mode nothing claims them: frontends a Kubernetes-mode run left go at once.
fn restore_services(manager: &Manager, k8s: bool) -> Result<usize, StartError> {
    let n = manager.lb().restore()?;
    if !k8s {
        manager.lb().sweep_unclaimed()?;
    }
    Ok(n)
}

/// Everything before serving, in the order of docs/ARCHITECTURE.md, "Restore": returns the manager
/// and its socket; ready, except in Kubernetes mode, where it turns ready once its watchers have
/// synced.
/// The datapath keeps enforcing from its pinned maps throughout: nothing here recreates a map
/// or removes an entry before its replacement exists.
// The start-up sequence in order, each phase one call: one line over the limit.
#[allow(clippy::too_many_lines)]
pub async fn start(config: &Config) -> Result<Started, StartError> {
    let mut phases = Phases::new();
    let (manifest, node_name) = node_identity(config)?;
    let queue = guard_paths(config)?;
    let store = Store::open(&config.state_dir)?;
    phases.mark("store");

    let datapath: Arc<dyn Datapath> = Arc::new(BpfDatapath::open(DatapathConfig {
        pin_dir: config.bpffs.clone(),
        ..DatapathConfig::default()
    })?);
    phases.mark("maps");

    refuse_lost_state(config, &store, &*datapath)?;
    // A restart that cannot trust some slot (another build's encoding wrote it, or its last
    // write did not finish) reads the policy maps back: begun now, the dump runs beside the
    // restore steps below instead of before the policy is regenerated.
    if SlotTable::read_back_ahead(&store, &datapath.slot_generations()?)? {
        datapath.begin_read_back()?;
    }
    let k8s = match &config.k8s {
        Some(settings) => Some(crate::daemon::k8s::connect(settings, &node_name).await?),
        None => None,
    };
    // Kubernetes mode: the Node as the API server returned it, over any manifest.
    let manifest = k8s
        .as_ref()
        .map_or(manifest, |c| crate::daemon::k8s::manifest(&c.node));
    let hostnet: Arc<dyn HostNet> = Arc::new(NetlinkHostNet::new()?);
    let view = hostnet.node_view().await?;
    let cidrs = node_cidrs(config, &manifest, &store, &queue, &view)?;
    let chosen = cidrs.clone();
    let routers: Vec<_> = cidrs.iter().map(|c| (c.router_ip(), c.cidr)).collect();
    hostnet.ensure_host_device(&routers).await?;
    phases.mark("node");

    let pools = cidrs.iter().map(|c| Pool::new(c.cidr)).collect();
    let registry = Registry::open(store.clone(), pools)?;
    let label_sets: Vec<_> = registry
        .list()
        .map(|ep| from_api_labels(&ep.labels))
        .collect();
    let grace_ms = u64::try_from(config.identity_grace.as_millis()).unwrap_or(u64::MAX);
    let (policy, _) =
        PolicyState::restore_with_grace(store, &label_sets, grace_ms, crate::sys::clock::now_ms())?;
    phases.mark("ipam+identities+policy");

    let k8s_node = node_name.clone();
    let link = match (&config.kvstore, &k8s) {
        (_, Some(conn)) if config.crd_identities => {
            Some(crd_link(config, conn, &node_name, &cidrs)?)
        }
        (Some(kv), _) => Some(cluster_link(config, kv, &node_name, &cidrs)?),
        _ => None,
    };
    let own_cidrs: Vec<ipnet::IpNet> = cidrs.iter().map(|c| c.cidr).collect();
    let mut manager = Manager::new(
        node_name,
        cidrs,
        registry,
        policy,
        hostnet.clone(),
        datapath,
    )
    .with_delete_queue(queue.clone());
    if let Some(link) = link {
        manager = manager.with_cluster(link);
    }
    // Other nodes' pod CIDRs Weft routed before this start: only with a cluster agent (its
    // first listing replaces them); without one no route of Weft's has a meaning any more.
    let kept = if manager.cluster().is_some() {
        view.weft_routes.clone()
    } else {
        Vec::new()
    };
    if let Some(m) = masquerade(config, own_cidrs, &kept)? {
        manager = manager.with_masquerade(m);
    }
    phases.mark("masquerade");
    let manager = Arc::new(manager);
    let restored = restore_all(&manager, &*hostnet, &queue, &mut phases).await?;
    let frontends = restore_services(&manager, k8s.is_some())?;
    phases.mark("services");
    let watchers = match k8s {
        Some(conn) => Some(crate::daemon::k8s::start(&manager, conn, &k8s_node, &chosen).await),
        None => None,
    };

    let listener = crate::daemon::guard::bind_socket(&config.socket)?;
    for (name, ms) in &phases.done {
        manager.record_phase(name, *ms);
    }
    manager.record_phase("total", phases.start.elapsed().as_secs_f64() * 1000.0);
    if watchers.is_none() {
        manager.set_ready();
    }
    tracing::info!(
        endpoints = restored.kept,
        removed_at_restore = restored.removed,
        stale_datapath_endpoints = restored.stale,
        stale_ipcache = restored.stale_ipcache,
        regenerated = restored.regenerated,
        queued_deletes = restored.drained,
        service_frontends = frontends,
        orphan_links = restored.orphan_links,
        phases = ?phases.done,
        elapsed_ms = phases.start.elapsed().as_secs_f64() * 1000.0,
        socket = %config.socket.display(),
        "{}",
        if watchers.is_some() {
            "weft-manager restored; serving, ready once the Kubernetes initial lists are in"
        } else {
            "weft-manager ready"
        }
    );
    Ok(Started {
        manager,
        listener,
        watchers,
    })
}

/// What [`start`] hands to serving.
pub struct Started {
    /// The manager: ready, unless `watchers` still have to sync.
    pub manager: Arc<Manager>,
    /// The API socket, bound.
    pub listener: UnixListener,
    /// Kubernetes mode: the watchers whose initial lists [`crate::daemon::k8s::become_ready`] awaits.
    pub watchers: Option<Arc<weft_k8s::watch::Watchers>>,
}

/// Serves the API until SIGTERM or SIGINT; the datapath is left in place on exit.
pub async fn serve(
    manager: Arc<Manager>,
    listener: UnixListener,
    socket: &Path,
) -> std::io::Result<()> {
    tokio::spawn(crate::endpoint::restore::housekeeping(
        manager.clone(),
        std::time::Duration::from_secs(2),
    ));
    let app = crate::http::api::router(manager);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let shutdown = async move {
        tokio::select! {
            _ = term.recv() => {},
            _ = tokio::signal::ctrl_c() => {},
        }
        tracing::info!("signal received; stopping (datapath stays in place)");
    };
    crate::http::listener::serve(
        listener,
        app,
        crate::http::listener::Limits::default(),
        shutdown,
    )
    .await?;
    let _ = std::fs::remove_file(socket);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn config(args: &[&str]) -> Config {
        let mut all = vec!["weft-manager"];
        all.extend_from_slice(args);
        Config::resolve(crate::daemon::config::Cli::parse_from(all)).unwrap()
    }

    #[test]
    fn a_manifest_for_another_node_is_refused_when_the_name_is_given() {
        let m = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../testdata/nodes/podcidr-only.yaml"
        );
        let err = node_identity(&config(&["--node-manifest", m, "--node-name", "other"]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("\"node-podcidr\"") && err.contains("\"other\""),
            "{err}"
        );
        let (_, name) = node_identity(&config(&["--node-manifest", m])).unwrap();
        assert_eq!(
            name, "node-podcidr",
            "without --node-name the manifest names the node"
        );
        let (_, name) = node_identity(&config(&[
            "--node-manifest",
            m,
            "--node-name",
            "node-podcidr",
        ]))
        .unwrap();
        assert_eq!(name, "node-podcidr");
    }
}
