//! Multi-node in Kubernetes mode without an etcd of Weft's own (Cilium's CRD mode): the
//! cluster agent's second backend. Identities are agreed through the API server as
//! `WeftIdentity` objects (cluster-scoped, named after the number) confirmed by a
//! `WeftIdentityKey` per label set (named after the labels' hash), this node's pods are
//! published as `WeftEndpoint` objects (namespaced, owned by their Pod), and other nodes come
//! from the Node objects. The same [`crate::cluster::session::Local`] and
//! [`crate::cluster::watch::Remote`] sides as kvstore mode, so routes, ipcache and selector
//! cache do not know which backend fed them.
//!
//! The API server is behind the [`Api`] seam: kube-rs in production (`kube.rs`), an
//! in-memory fake in tests (`mem.rs`). The protocol: `identities.rs`; the watched state and
//! what it delivers: `view.rs`; the agent and its threads: `agent.rs`. docs/KUBERNETES.md,
//! "Identities and remote pods across nodes: CRD mode", has the whole story.

pub mod agent;
pub mod identities;
pub mod kube;
pub mod mem;
#[cfg(test)]
mod tests;
pub mod view;

use std::net::IpAddr;
use std::sync::mpsc::Receiver;

use crate::kvstore::keys::{NamedPortRecord, NodeRecord};
use weft_policy::labels::LabelSet;
use weft_policy::mapstate::Identity;

/// API group of Weft's objects.
pub const GROUP: &str = "weft.io";
/// Their version.
pub const VERSION: &str = "v1alpha1";
/// The label on `WeftIdentity` and `WeftIdentityKey` objects carrying [`labels_hash`].
pub const HASH_LABEL: &str = "weft.io/labels-hash";
/// The annotation a node writes on a `WeftIdentityKey` when it starts using the identity
/// (moving its resourceVersion, which the collector's guarded delete checks).
pub const CLAIMED_ANNOTATION: &str = "weft.io/last-claimed-by";

/// Failures talking to the API server.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    /// The API server could not be reached (fake outage).
    #[error("Kubernetes API server unreachable: {0}")]
    Unavailable(String),
    /// A call failed.
    #[error("Kubernetes API: {what}: {source}")]
    Api {
        /// Which call.
        what: String,
        /// Cause.
        source: weft_k8s::kube::Error,
    },
    /// An object is not what Weft writes (edited by hand, or a newer version).
    #[error("Kubernetes API: malformed {what}: {detail}")]
    Malformed {
        /// Which object.
        what: String,
        /// What is wrong.
        detail: String,
    },
    /// The watchers could not be started.
    #[error("Kubernetes API: cannot start the CRD watchers: {0}")]
    Threads(#[source] std::io::Error),
}

impl CrdError {
    /// The API server could not be asked (connection refused, timeout, 5xx, throttled):
    /// retry later; nothing was refused.
    #[must_use]
    pub fn is_unavailable(&self) -> bool {
        match self {
            Self::Unavailable(_) => true,
            Self::Api { source, .. } => match source {
                weft_k8s::kube::Error::Api(status) => status.code >= 500 || status.code == 429,
                _ => true,
            },
            Self::Malformed { .. } | Self::Threads(_) => false,
        }
    }
}

/// Identity of an object's version: the collector deletes only the version it judged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Meta {
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.resourceVersion`.
    pub resource_version: String,
}

/// A `WeftIdentity`: number `number` is taken by `labels`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentityObject {
    /// The number (the object's name).
    pub number: Identity,
    /// The label set.
    pub labels: LabelSet,
    /// Version.
    pub meta: Meta,
}

/// A `WeftIdentityKey`: the label set's number, cluster-wide (the master key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyObject {
    /// [`labels_hash`] of `labels` (the object's name).
    pub hash: String,
    /// The number.
    pub number: Identity,
    /// The label set (checked against the hash's other users).
    pub labels: LabelSet,
    /// Version.
    pub meta: Meta,
}

/// A `WeftEndpoint`: one pod's addresses and identity, published by its node.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct EndpointObject {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name (the object's name).
    pub name: String,
    /// The Pod's uid (the object's owner).
    pub pod_uid: String,
    /// Node that runs it.
    pub node: String,
    /// That node's underlay address.
    pub node_ip: IpAddr,
    /// Pod addresses.
    pub ips: Vec<IpAddr>,
    /// Security identity.
    pub identity: Identity,
    /// Named container ports.
    pub named_ports: Vec<NamedPortRecord>,
}

/// The four kinds watched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// `WeftIdentity`.
    Identity,
    /// `WeftIdentityKey`.
    Key,
    /// `WeftEndpoint`.
    Endpoint,
    /// `Node`.
    Node,
}

impl Kind {
    /// All of them.
    pub const ALL: [Self; 4] = [Self::Identity, Self::Key, Self::Endpoint, Self::Node];
}

/// One watched object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Object {
    /// A `WeftIdentity`.
    Identity(IdentityObject),
    /// A `WeftIdentityKey`.
    Key(KeyObject),
    /// A `WeftEndpoint`.
    Endpoint(EndpointObject),
    /// A Node (as Weft routes to it).
    Node(NodeRecord),
}

impl Object {
    /// Its kind.
    #[must_use]
    pub fn kind(&self) -> Kind {
        match self {
            Self::Identity(_) => Kind::Identity,
            Self::Key(_) => Kind::Key,
            Self::Endpoint(_) => Kind::Endpoint,
            Self::Node(_) => Kind::Node,
        }
    }
}

/// What the watch delivers.
#[derive(Debug)]
pub enum Change {
    /// A complete listing of one kind (at start and after every re-list): replaces what was
    /// known of it.
    Listed(Kind, Vec<Object>),
    /// Created or changed.
    Put(Object),
    /// Deleted.
    Deleted(Object),
    /// The watch of a kind failed; it is retried (a `Listed` of it follows when it recovers).
    Broken(Kind, String),
}

/// The API server as the CRD backend uses it. Synchronous, like [`crate::kvstore::Kv`]: the
/// callers are the manager's blocking paths and the agent's threads.
pub trait Api: Send + Sync {
    /// Every `WeftIdentity`.
    fn list_identities(&self) -> Result<Vec<IdentityObject>, CrdError>;
    /// One `WeftIdentity`.
    fn get_identity(&self, number: Identity) -> Result<Option<IdentityObject>, CrdError>;
    /// Creates `WeftIdentity` `number`; `false` when the name is taken (409).
    fn create_identity(&self, number: Identity, labels: &LabelSet) -> Result<bool, CrdError>;
    /// Deletes exactly version `meta` of `WeftIdentity` `number`; `false` when it is gone or
    /// changed since.
    fn delete_identity(&self, number: Identity, meta: &Meta) -> Result<bool, CrdError>;
    /// One `WeftIdentityKey`.
    fn get_key(&self, hash: &str) -> Result<Option<KeyObject>, CrdError>;
    /// Creates the `WeftIdentityKey` of `labels` → `number`; `false` when it exists (409).
    fn create_key(&self, labels: &LabelSet, number: Identity) -> Result<bool, CrdError>;
    /// Marks the key as claimed by `node` now (a write that moves its resourceVersion);
    /// `false` when it is gone.
    fn touch_key(&self, hash: &str, node: &str) -> Result<bool, CrdError>;
    /// Deletes exactly version `meta` of a key; `false` when it is gone or changed since.
    fn delete_key(&self, hash: &str, meta: &Meta) -> Result<bool, CrdError>;
    /// Creates or replaces a `WeftEndpoint` (server-side apply).
    fn apply_endpoint(&self, ep: &EndpointObject) -> Result<(), CrdError>;
    /// Deletes the `WeftEndpoint` `ep` names if it is still this pod's on this node (a pod of
    /// the same name elsewhere keeps its own); missing is fine.
    fn delete_endpoint(&self, ep: &EndpointObject) -> Result<(), CrdError>;
    /// Watches the four kinds. The stream never ends: a broken watch is reported
    /// ([`Change::Broken`]) and re-listed by the implementation.
    fn watch(&self) -> Result<Receiver<Change>, CrdError>;
}

/// The label set's hash: lower-case hex of the first 20 bytes of SHA-256 over its labels,
/// one per line (a label value: at most 63 characters). Collisions are detected (the key
/// object carries the labels) and reported, never merged.
#[must_use]
pub fn labels_hash(labels: &LabelSet) -> String {
    use std::fmt::Write;
    let mut text = String::new();
    for l in labels.iter() {
        text.push_str(&l.to_string());
        text.push('\n');
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    digest
        .as_ref()
        .iter()
        .take(20)
        .fold(String::with_capacity(40), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}
