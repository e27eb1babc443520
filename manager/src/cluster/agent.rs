//! The cluster agent as the manager sees it, whichever backend holds the cluster's state:
//! the kvstore ([`super::Cluster`], etcd) or the API server's CRDs
//! ([`crate::crd::agent::CrdCluster`]). Both publish the manager's [`Local`] state, feed its
//! [`Remote`] side and number new label sets for it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::session::Local;
use super::watch::Remote;
use crate::kvstore::identities::ClusterIdentityError;
use crate::kvstore::keys::NodeRecord;
use weft_policy::labels::LabelSet;
use weft_policy::mapstate::Identity;

/// What the manager needs of a cluster agent.
pub trait Agent: Send + Sync {
    /// `etcd` or `crd` (status).
    fn backend(&self) -> &'static str;
    /// This node.
    fn node(&self) -> &NodeRecord;
    /// Remote nodes, by name.
    fn nodes(&self) -> BTreeMap<String, NodeRecord>;
    /// How many remote endpoint addresses are known.
    fn remote_ip_count(&self) -> usize;
    /// Did the last call to the store succeed?
    fn connected(&self) -> bool;
    /// The kvstore lease this node's keys live under (kvstore mode).
    fn lease(&self) -> Option<i64>;
    /// Has a full listing been applied since start?
    fn synced(&self) -> bool;
    /// The cluster-wide number of a label set this node does not hold yet.
    fn allocate_identity(&self, labels: &LabelSet) -> Result<Identity, ClusterIdentityError>;
    /// Asks the agent to publish now (an endpoint or identity changed).
    fn poke(&self);
    /// Starts the agent's threads, publishing `local` and feeding `remote`.
    fn start(
        self: Arc<Self>,
        local: Arc<dyn Local>,
        remote: Arc<dyn Remote>,
    ) -> std::io::Result<()>;
    /// Waits up to `timeout` for the first full listing; returns whether it came.
    fn wait_first_sync(&self, timeout: Duration) -> bool;
}

impl Agent for super::Cluster {
    fn backend(&self) -> &'static str {
        "etcd"
    }
    fn node(&self) -> &NodeRecord {
        self.node()
    }
    fn nodes(&self) -> BTreeMap<String, NodeRecord> {
        self.nodes()
    }
    fn remote_ip_count(&self) -> usize {
        self.remote_ips().len()
    }
    fn connected(&self) -> bool {
        self.connected()
    }
    fn lease(&self) -> Option<i64> {
        self.lease()
    }
    fn synced(&self) -> bool {
        self.synced()
    }
    fn allocate_identity(&self, labels: &LabelSet) -> Result<Identity, ClusterIdentityError> {
        self.allocate_identity(labels)
    }
    fn poke(&self) {
        self.poke();
    }
    fn start(
        self: Arc<Self>,
        local: Arc<dyn Local>,
        remote: Arc<dyn Remote>,
    ) -> std::io::Result<()> {
        super::watch::spawn(self.clone(), remote)?;
        super::session::spawn(self, local)?;
        Ok(())
    }
    fn wait_first_sync(&self, timeout: Duration) -> bool {
        self.wait_first_sync(timeout)
    }
}
