//! Wire types of the Weft manager's REST/JSON API (`/v1/` on a unix socket).
//!
//! Shared by the CNI plugin, the manager and weftctl so the three can never disagree on a field.
//! Nothing here does I/O except the optional [`client`] module.
#![warn(missing_docs)]
#[cfg(feature = "client")]
pub mod client;
pub mod cluster;
#[cfg(feature = "client")]
pub mod delete_queue;
pub mod error;
pub mod fnv;
pub mod lb;
pub mod mac;
pub mod naming;
pub mod policy;
#[cfg(feature = "client")]
pub mod trust;

pub use cluster::{KvstoreStatus, NodeInfo};
pub use error::{ApiError, ApiErrorKind};
pub use mac::MacAddr;
pub use policy::{
    IdentityInfo, ImportRequest, ImportResult, LabelsRequest, TracePeerRequest, TraceRequest,
    TraceResult, VerifyReport,
};

use serde::{Deserialize, Serialize};
use std::net::IpAddr;

/// Largest request body the manager reads (413 `too_large` beyond it). The client refuses to
/// send more, so the caller sees the limit instead of a broken connection.
pub const MAX_REQUEST_BODY: usize = 2 << 20;

/// A label as CNI CONVENTIONS pass it in `args.cni.labels`, and as endpoints carry it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Label {
    /// Key, optionally with a Cilium source prefix (`k8s:app`).
    pub key: String,
    /// Value (may be empty).
    #[serde(default)]
    pub value: String,
}

/// `POST /v1/endpoints`: reserve an endpoint id and one IP per configured family.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocateRequest {
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// `CNI_NETNS` path.
    pub netns: String,
    /// `K8S_POD_NAMESPACE` from `CNI_ARGS`, if given.
    #[serde(default)]
    pub pod_namespace: Option<String>,
    /// `K8S_POD_NAME` from `CNI_ARGS`, if given.
    #[serde(default)]
    pub pod_name: Option<String>,
    /// Labels from `args.cni.labels`.
    #[serde(default)]
    pub labels: Vec<Label>,
}

/// One address handed to a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpConfig {
    /// The pod's address (configured as a host route: /32 or /128).
    pub address: IpAddr,
    /// The node's router IP for this family: the pod's gateway.
    pub gateway: IpAddr,
}

/// Lifecycle of an endpoint. `Allocated` is the persisted intent written before any kernel change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EndpointState {
    /// IPs reserved, CNI plumbing in progress (or the CNI died midway).
    Allocated,
    /// Plumbed and registered: the datapath is enforcing for it.
    Ready,
    /// Being torn down.
    Deleting,
}

/// What the CNI reports after plumbing the veth (`POST /v1/endpoints/{id}/ready`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterRequest {
    /// Must match the allocation: a register for another container is refused.
    pub container_id: String,
    /// Host-side veth name.
    pub host_ifname: String,
    /// Host-side veth ifindex (in the node's netns).
    pub host_ifindex: u32,
    /// Host-side veth MAC.
    pub host_mac: MacAddr,
    /// Pod-side interface MAC.
    pub pod_mac: MacAddr,
}

/// An endpoint as the manager stores and reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    /// Node-local endpoint id (never reused while the endpoint lives).
    pub id: u32,
    /// `CNI_CONTAINERID` that owns it.
    pub container_id: String,
    /// `CNI_IFNAME` inside the pod.
    pub ifname: String,
    /// Pod netns path.
    pub netns: String,
    /// Pod namespace, if known.
    #[serde(default)]
    pub pod_namespace: Option<String>,
    /// Pod name, if known.
    #[serde(default)]
    pub pod_name: Option<String>,
    /// Security-relevant labels, sorted.
    #[serde(default)]
    pub labels: Vec<Label>,
    /// Numeric security identity (0 until assigned).
    #[serde(default)]
    pub identity: u32,
    /// Addresses, one per family.
    pub ips: Vec<IpConfig>,
    /// Host-side veth name (derived from container id and ifname).
    pub host_ifname: String,
    /// Host-side veth ifindex once registered.
    #[serde(default)]
    pub host_ifindex: Option<u32>,
    /// Host-side MAC once registered.
    #[serde(default)]
    pub host_mac: Option<MacAddr>,
    /// Pod-side MAC once registered.
    #[serde(default)]
    pub pod_mac: Option<MacAddr>,
    /// Lifecycle state.
    pub state: EndpointState,
    /// Policy revision this endpoint enforces.
    #[serde(default)]
    pub policy_revision: u64,
    /// Unix milliseconds when the allocation was made.
    #[serde(default)]
    pub created_ms: u64,
}

/// Answer to `DELETE /v1/endpoints?container_id=..&ifname=..`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteResponse {
    /// The endpoint that was removed, or `None` when there was nothing of that container's.
    pub deleted: Option<Endpoint>,
}

/// One (container id, ifname) pair from `cni.dev/valid-attachments`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Attachment {
    /// Container id.
    #[serde(rename = "containerID")]
    pub container_id: String,
    /// Interface name.
    pub ifname: String,
}

/// `POST /v1/gc`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcRequest {
    /// Every attachment still in use; all others are released.
    pub valid_attachments: Vec<Attachment>,
}

/// Answer to `POST /v1/gc`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcResponse {
    /// Endpoints released.
    pub released: Vec<Endpoint>,
}

/// Where a node CIDR came from (in priority order: docs/ARCHITECTURE.md, "Pod CIDRs").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CidrSource {
    /// `spec.podCIDRs`.
    #[serde(rename = "spec.podCIDRs")]
    SpecPodCidrs,
    /// `spec.podCIDR`.
    #[serde(rename = "spec.podCIDR")]
    SpecPodCidr,
    /// A node annotation.
    #[serde(rename = "annotation")]
    Annotation,
    /// `--pod-cidr` / `pod_cidrs` in the config.
    #[serde(rename = "config")]
    Config,
}

impl std::fmt::Display for CidrSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::SpecPodCidrs => "spec.podCIDRs",
            Self::SpecPodCidr => "spec.podCIDR",
            Self::Annotation => "annotation",
            Self::Config => "config",
        })
    }
}

/// A pool (one node CIDR) with its usage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolStatus {
    /// The CIDR, e.g. `10.0.1.0/24`.
    pub cidr: String,
    /// Where it came from.
    pub source: CidrSource,
    /// Detail of the source (annotation name, ...).
    #[serde(default)]
    pub source_detail: Option<String>,
    /// The router IP (gateway of every pod) on `weft_host`.
    pub router_ip: IpAddr,
    /// Addresses allocated to endpoints.
    pub used: u64,
    /// Addresses allocatable in total (after network/broadcast/router reservations).
    pub capacity: u64,
}

/// `GET /v1/status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusResponse {
    /// Node name.
    pub node_name: String,
    /// Ready to serve CNI requests.
    pub ready: bool,
    /// Pools, one per family.
    pub pools: Vec<PoolStatus>,
    /// Endpoints known.
    pub endpoints: u64,
    /// Current policy repository revision.
    #[serde(default)]
    pub policy_revision: u64,
    /// Manager version.
    pub version: String,
    /// How long each phase of the last start-up took, in ms.
    #[serde(default)]
    pub restore_ms: Vec<(String, f64)>,
    /// Endpoint regenerations that changed maps since start.
    #[serde(default)]
    pub regenerations: u64,
    /// The eBPF programs of this run: `reused` (pinned by an earlier manager for the same
    /// object) or `loaded` (verified by this one). Absent from managers that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub programs: Option<String>,
    /// What keeps the manager from ready or from a current view, one line each (e.g. a
    /// Kubernetes list its `ClusterRole` denies, a CRD that is not installed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// One IPAM allocation (`GET /v1/ipam`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    /// The address.
    pub address: IpAddr,
    /// Pool CIDR it came from.
    pub pool: String,
    /// Owning endpoint id.
    pub endpoint_id: u32,
    /// Owning container id.
    pub container_id: String,
    /// Owning ifname.
    pub ifname: String,
}
