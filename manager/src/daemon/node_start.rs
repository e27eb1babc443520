//! Start-up's node steps: which node this is (its manifest and name), its pod CIDRs (a change
//! that would orphan live endpoints refused), and the guard against a lost state database.

use weft_api::delete_queue::DeleteQueue;

use crate::daemon::config::Config;
use crate::datapath::{Datapath, DatapathError};
use crate::node::{self, ChosenCidr, NodeError, NodeManifest};
use crate::store::{Store, StoreError};

/// Start-up failures of the node steps; each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum NodeStartError {
    /// Node CIDR selection, or the manifest.
    #[error(transparent)]
    Node(#[from] NodeError),
    /// State database.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The delete queue could not be read.
    #[error(transparent)]
    Queue(#[from] weft_api::delete_queue::QueueError),
    /// The datapath's endpoints could not be listed.
    #[error("eBPF datapath: {0}")]
    Datapath(#[from] DatapathError),
    /// The CIDR changed under live endpoints.
    #[error(
        "the node's pod CIDR changed from {old} to {new} while {count} endpoint(s) still use addresses from {old}: delete those pods first (weftctl endpoint list), or start with the old CIDR again (--pod-cidr {old} / restore the node manifest); to discard all state instead, stop weft-manager and remove {state_dir}"
    )]
    CidrChanged {
        /// Persisted CIDR.
        old: String,
        /// Newly selected CIDR (or "none").
        new: String,
        /// Endpoints in the old pool.
        count: usize,
        /// State dir to remove.
        state_dir: String,
    },
    /// The state database is new but the datapath has endpoints.
    #[error(
        "the state database in {state_dir} is empty, but the pinned datapath in {bpffs} still holds {endpoints} endpoint(s): the manager's state was lost or --state-dir points elsewhere. Weft will not guess which pod owns which IP. Recover by restoring {state_dir} from a backup (or pointing --state-dir at it); or delete those pods, remove the pinned maps (rm -rf {bpffs}) and start again. See docs/OPERATIONS.md"
    )]
    StateLost {
        /// State dir.
        state_dir: String,
        /// Pin dir.
        bpffs: String,
        /// Endpoints in the datapath.
        endpoints: usize,
    },
}

/// Persisted node record (the `AnnotateNode` write-back): the node CIDRs last chosen.
const NODE_KEY: &str = "node";

/// The node manifest and this node's name. A manifest names its node: an explicit
/// `--node-name` that differs means the wrong manifest (another node's CIDRs would be used),
/// refused before anything is touched; without `--node-name` the manifest's name is this node's.
pub(super) fn node_identity(config: &Config) -> Result<(NodeManifest, String), NodeStartError> {
    let Some(path) = &config.node_manifest else {
        return Ok((NodeManifest::default(), config.node_name.clone()));
    };
    let manifest = NodeManifest::load(path)?;
    let name = match manifest.metadata.name.clone() {
        Some(m) if m != config.node_name && config.node_name_given => {
            return Err(NodeError::OtherNode {
                path: path.display().to_string(),
                manifest_node: m,
                node: config.node_name.clone(),
            }
            .into());
        }
        Some(m) => m,
        None => config.node_name.clone(),
    };
    Ok((manifest, name))
}

/// Picks the node CIDRs and refuses a change that would orphan live endpoints.
pub(super) fn node_cidrs(
    config: &Config,
    manifest: &NodeManifest,
    store: &Store,
    queue: &DeleteQueue,
    view: &crate::node::nodenet::NodeView,
) -> Result<Vec<ChosenCidr>, NodeStartError> {
    let selection = node::select(manifest, &config.pod_cidrs)?;
    for w in &selection.warnings {
        tracing::warn!("{w}");
    }
    let chosen = selection.cidrs();
    for c in &chosen {
        if let Some(why) = crate::node::nodenet::conflict(c.cidr, view) {
            return Err(NodeError::Conflict(format!("{} ({}): {why}", c.cidr, c.detail)).into());
        }
    }
    let previous: Vec<ChosenCidr> = store.get_meta(NODE_KEY)?.unwrap_or_default();
    // Each CIDR the last run used that this start would replace.
    let replaced: Vec<(&ChosenCidr, Option<&ChosenCidr>)> = previous
        .iter()
        .map(|old| {
            let new = chosen
                .iter()
                .find(|c| c.cidr.network().is_ipv4() == old.cidr.network().is_ipv4());
            (old, new)
        })
        .filter(|(old, new)| new.map(|n| n.cidr) != Some(old.cidr))
        .collect();
    if !replaced.is_empty() {
        // An endpoint whose DEL waits in the queue (the kubelet deleted its pod while no
        // manager ran: a node that was away and got another pod CIDR) is on its way out: the
        // drain after the restore removes it.
        let queued = queue.pending()?;
        let endpoints: Vec<_> = store
            .load_endpoints()?
            .into_iter()
            .filter(|e| {
                !queued
                    .iter()
                    .any(|r| r.container_id == e.container_id && r.ifname == e.ifname)
            })
            .collect();
        for (old, new) in replaced {
            let count = endpoints
                .iter()
                .filter(|e| e.ips.iter().any(|ip| old.cidr.contains(&ip.address)))
                .count();
            if count > 0 {
                return Err(NodeStartError::CidrChanged {
                    old: old.cidr.to_string(),
                    new: new.map_or_else(|| "none".into(), |n| n.cidr.to_string()),
                    count,
                    state_dir: config.state_dir.display().to_string(),
                });
            }
        }
    }
    for c in &chosen {
        tracing::info!(cidr = %c.cidr, source = %c.source, detail = %c.detail, router = %c.router_ip(), "node pod CIDR");
    }
    // A write flushes the database: only when the choice changed.
    if previous != chosen {
        store.put_meta(NODE_KEY, &chosen)?;
    }
    Ok(chosen)
}

/// A fresh state database next to a datapath that still holds endpoints means the state was lost
/// (or `--state-dir` points elsewhere). Rebuilding from the maps would have to guess which pod
/// owns which IP and identity, so the manager refuses and says how to recover.
pub(super) fn refuse_lost_state(
    config: &Config,
    store: &Store,
    datapath: &dyn Datapath,
) -> Result<(), NodeStartError> {
    let fresh = store.get_meta::<Vec<ChosenCidr>>(NODE_KEY)?.is_none();
    let live = datapath.endpoint_ids()?.len();
    if fresh && live > 0 {
        return Err(NodeStartError::StateLost {
            state_dir: config.state_dir.display().to_string(),
            bpffs: config.bpffs.display().to_string(),
            endpoints: live,
        });
    }
    Ok(())
}
