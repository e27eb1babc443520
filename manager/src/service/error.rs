//! What a manager operation can fail with, as the API reports it (the HTTP status of each kind
//! is mapped once, in `crate::http::api`).

use crate::datapath::DatapathError;
use crate::endpoint::EndpointError;
use crate::node::hostnet::HostNetError;
use crate::policy_state::PolicyStateError;

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
        "labels {labels} need a new cluster-wide identity and the cluster store is unreachable ({source}); retry once it is back (pods with known labels still start)"
    )]
    KvstoreUnavailable {
        /// The label set.
        labels: String,
        /// Why the store (etcd, or the API server in CRD mode) could not be asked.
        source: crate::kvstore::identities::ClusterIdentityError,
    },
    /// Kvstore mode: the cluster could not number a new label set (conflict, exhausted, a
    /// malformed record).
    #[error(transparent)]
    ClusterIdentity(crate::kvstore::identities::ClusterIdentityError),
}
