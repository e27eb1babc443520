//! Kvstore mode as the API reports it: `GET /v1/nodes` and `GET /v1/kvstore`.

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use std::net::IpAddr;

/// One node (`GET /v1/nodes`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// Name.
    pub name: String,
    /// Underlay IP.
    pub node_ip: IpAddr,
    /// Pod CIDRs.
    pub pod_cidrs: Vec<IpNet>,
    /// Router IPs.
    pub router_ips: Vec<IpAddr>,
    /// This node?
    pub local: bool,
}

/// `GET /v1/kvstore`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvstoreStatus {
    /// `etcd` (kvstore mode), `crd` (identities through the Kubernetes API server), or `none`
    /// in single-node mode.
    pub backend: String,
    /// Last kvstore operation succeeded.
    pub connected: bool,
    /// Endpoints given.
    pub endpoints: Vec<String>,
    /// Current lease (kvstore mode).
    pub lease: Option<i64>,
    /// Remote nodes known.
    pub remote_nodes: usize,
    /// Remote endpoint addresses in the ipcache.
    pub remote_ips: usize,
}
