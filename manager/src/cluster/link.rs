//! What the manager holds of the cluster agent (kvstore or CRD mode): the agent, the routes to
//! other nodes' pod CIDRs and where their futures run. Built by the daemon, handed to
//! `crate::service::Manager::with_cluster`.

use std::sync::Arc;

use super::agent::Agent;
use super::routes::RouteTable;

/// What the manager needs of the cluster agent.
pub struct ClusterLink {
    /// The agent.
    pub cluster: Arc<dyn Agent>,
    /// Routes to other nodes' pod CIDRs.
    pub routes: Arc<dyn RouteTable>,
    /// Runtime the route futures run on (the watch thread is not a runtime thread).
    pub runtime: tokio::runtime::Handle,
    /// The kvstore endpoints, for status (none in CRD mode).
    pub endpoints: Vec<String>,
}
