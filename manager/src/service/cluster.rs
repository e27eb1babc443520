//! The manager as a member of a cluster (kvstore or CRD mode): what it publishes (`Local`), how
//! remote records land in it (`Remote`), cluster-wide identity numbers for new label sets, and
//! the node list and cluster store status for the API.

use ipnet::IpNet;
use std::collections::BTreeMap;
use std::sync::Arc;
use weft_api::{EndpointState, KvstoreStatus, NodeInfo};
use weft_policy::labels::LabelSet;
use weft_policy::mapstate::Identity;

use super::{Manager, ManagerError};
use crate::cluster::agent::Agent;
use crate::cluster::link::ClusterLink;
use crate::cluster::session::{Desired, Local, PodRecord};
use crate::cluster::watch::Remote;
use crate::kvstore::keys::{IpRecord, NodeRecord};
use crate::kvstore::keys::{named_port_records, named_ports_of};
use crate::node::ipcache::Source;
use crate::policy_state::PortOwner;
use weft_policy::rule::NamedPorts;

impl Manager {
    /// Joins a cluster: new label sets get their numbers from the kvstore from now on.
    #[must_use]
    pub fn with_cluster(mut self, link: ClusterLink) -> Self {
        self.state().pol.set_cluster_ids(true);
        self.cluster = Some(link);
        self
    }

    /// Keeps the masquerade rules' pod CIDRs in step with the node registry.
    #[must_use]
    pub fn with_masquerade(mut self, m: Arc<crate::node::masquerade::Masquerader>) -> Self {
        self.masquerade = Some(m);
        self
    }

    /// The cluster agent, in kvstore or CRD mode.
    #[must_use]
    pub fn cluster(&self) -> Option<&Arc<dyn Agent>> {
        self.cluster.as_ref().map(|l| &l.cluster)
    }

    /// Asks the cluster agent to publish the local state now.
    pub(crate) fn poke_cluster(&self) {
        if let Some(l) = &self.cluster {
            l.cluster.poke();
        }
    }

    /// The cluster-wide number for `labels` when this node does not hold it yet (`None` in
    /// single-node mode or when it does). Called without the state lock: it may wait on etcd.
    pub(crate) fn cluster_identity(
        &self,
        labels: &LabelSet,
    ) -> Result<Option<Identity>, ManagerError> {
        let Some(link) = &self.cluster else {
            return Ok(None);
        };
        if self.state().pol.local_id(labels).is_some() {
            return Ok(None);
        }
        match link.cluster.allocate_identity(labels) {
            Ok(id) => Ok(Some(id)),
            Err(source) if source.is_unavailable() => Err(ManagerError::KvstoreUnavailable {
                labels: labels.to_string(),
                source,
            }),
            Err(e) => Err(ManagerError::ClusterIdentity(e)),
        }
    }

    /// Makes the ipcache entries of remote node `node`'s endpoints exactly `entries` (address
    /// prefix → identity): a cluster-store (re)list or the node's lease expiring (empty map).
    /// A remote entry never hides a local endpoint's or the node's own. The caller makes the
    /// identities known to the selector cache (and regenerates) before this, so an address
    /// never resolves to an identity no policy knows yet.
    pub fn sync_remote_endpoints(
        &self,
        node: &str,
        entries: &BTreeMap<ipnet::IpNet, weft_policy::mapstate::Identity>,
    ) -> Result<(), ManagerError> {
        let mut st = self.state();
        st.ipcache
            .replace_source(&Source::RemoteEndpoint(node.to_owned()), entries);
        self.flush_ipcache(&mut st)?;
        // Named ports of addresses it no longer has go too (all of them when it left).
        let kept: std::collections::BTreeSet<std::net::IpAddr> =
            entries.keys().map(ipnet::IpNet::addr).collect();
        let effects = st.pol.retain_node_ports(node, |ip| kept.contains(ip));
        self.regenerate_users(&mut st, &effects)?;
        Ok(())
    }

    /// One remote endpoint address appeared or changed identity or named ports (cluster-store
    /// watch event). Its named ports reach the policies first, then its address the ipcache.
    pub fn upsert_remote_endpoint(
        &self,
        node: &str,
        prefix: ipnet::IpNet,
        identity: weft_policy::mapstate::Identity,
        ports: NamedPorts,
    ) -> Result<(), ManagerError> {
        let mut st = self.state();
        let owner = PortOwner::Remote {
            node: node.to_owned(),
            ip: prefix.addr(),
        };
        let effects = st.pol.set_peer_ports(owner, identity, ports);
        self.regenerate_users(&mut st, &effects)?;
        st.ipcache
            .set(prefix, Source::RemoteEndpoint(node.to_owned()), identity);
        self.flush_ipcache(&mut st)
    }

    /// One remote endpoint address went away (cluster-store watch event).
    pub fn remove_remote_endpoint(
        &self,
        node: &str,
        prefix: ipnet::IpNet,
    ) -> Result<(), ManagerError> {
        let mut st = self.state();
        st.ipcache
            .unset(prefix, &Source::RemoteEndpoint(node.to_owned()));
        self.flush_ipcache(&mut st)?;
        let owner = PortOwner::Remote {
            node: node.to_owned(),
            ip: prefix.addr(),
        };
        let effects = st.pol.remove_peer_ports(&owner);
        self.regenerate_users(&mut st, &effects)?;
        Ok(())
    }

    /// Every node: this one, then the remote ones.
    #[must_use]
    pub fn nodes(&self) -> Vec<NodeInfo> {
        let Some(link) = &self.cluster else {
            return Vec::new();
        };
        let own = link.cluster.node();
        let mut out = vec![NodeInfo {
            name: own.name.clone(),
            node_ip: own.node_ip,
            pod_cidrs: own.pod_cidrs.clone(),
            router_ips: own.router_ips.clone(),
            local: true,
        }];
        out.extend(link.cluster.nodes().into_values().map(|n| NodeInfo {
            name: n.name,
            node_ip: n.node_ip,
            pod_cidrs: n.pod_cidrs,
            router_ips: n.router_ips,
            local: false,
        }));
        out
    }

    /// The kvstore's state.
    #[must_use]
    pub fn kvstore_status(&self) -> KvstoreStatus {
        match &self.cluster {
            None => KvstoreStatus {
                backend: "none".into(),
                connected: false,
                endpoints: Vec::new(),
                lease: None,
                remote_nodes: 0,
                remote_ips: 0,
            },
            Some(l) => KvstoreStatus {
                backend: l.cluster.backend().into(),
                connected: l.cluster.connected(),
                endpoints: l.endpoints.clone(),
                lease: l.cluster.lease(),
                remote_nodes: l.cluster.nodes().len(),
                remote_ips: l.cluster.remote_ip_count(),
            },
        }
    }
}

impl Local for Manager {
    fn desired(&self) -> Desired {
        let Some(link) = &self.cluster else {
            return Desired::default();
        };
        let own = link.cluster.node();
        let st = self.state();
        let ips = st
            .reg
            .list()
            .filter(|ep| ep.state == EndpointState::Ready && ep.identity != 0)
            .flat_map(|ep| {
                let named_ports = named_port_records(&self.named_ports(ep));
                ep.ips.iter().map(move |i| IpRecord {
                    ip: i.address,
                    identity: ep.identity,
                    node: own.name.clone(),
                    node_ip: own.node_ip,
                    named_ports: named_ports.clone(),
                })
            })
            .collect();
        let refs = st
            .pol
            .held_labels()
            .map(|(id, l)| (l.clone(), id))
            .collect();
        // CRD mode: pods the pod watch knows (their uid owns the `WeftEndpoint`).
        let cache = self.k8s_cache();
        let pods = st
            .reg
            .list()
            .filter(|ep| ep.state == EndpointState::Ready && ep.identity != 0)
            .filter_map(|ep| {
                let (ns, name) = (ep.pod_namespace.as_ref()?, ep.pod_name.as_ref()?);
                Some(PodRecord {
                    namespace: ns.clone(),
                    name: name.clone(),
                    uid: cache?.pod_uid(ns, name)?,
                    ips: ep.ips.iter().map(|i| i.address).collect(),
                    identity: ep.identity,
                    named_ports: named_port_records(&self.named_ports(ep)),
                })
            })
            .collect();
        // Ready in Kubernetes mode means the watches' initial lists, the pods' included, are in.
        let pods_listed = cache.is_some() && self.is_ready();
        Desired {
            ips,
            refs,
            pods,
            pods_listed,
        }
    }
}

impl Remote for Manager {
    fn identity_put(&self, id: Identity, labels: LabelSet) {
        let mut st = self.state();
        let effects = st.pol.remote_identity_added(id, labels);
        if let Err(e) = self.regenerate_users(&mut st, &effects) {
            tracing::error!(identity = id, "regenerating for a remote identity: {e}");
            self.mark_needs_regeneration();
        }
    }

    fn identity_deleted(&self, id: Identity) {
        let mut st = self.state();
        let effects = st.pol.remote_identity_removed(id);
        if let Err(e) = self.regenerate_users(&mut st, &effects) {
            tracing::error!(
                identity = id,
                "regenerating after a remote identity left: {e}"
            );
            self.mark_needs_regeneration();
        }
    }

    fn ip_put(&self, r: &IpRecord) {
        // The ipcache's owner precedence keeps a local endpoint's entry over a remote one.
        let ports = named_ports_of(&r.named_ports);
        if let Err(e) = self.upsert_remote_endpoint(&r.node, IpNet::from(r.ip), r.identity, ports) {
            tracing::error!(ip = %r.ip, node = %r.node, "remote ipcache entry: {e}");
        }
    }

    fn ip_deleted(&self, r: &IpRecord) {
        if let Err(e) = self.remove_remote_endpoint(&r.node, IpNet::from(r.ip)) {
            tracing::error!(ip = %r.ip, node = %r.node, "removing a remote ipcache entry: {e}");
        }
    }

    fn node_put(&self, r: &NodeRecord) {
        let Some(link) = &self.cluster else { return };
        // Before the route: traffic to the new node's pods must keep its pod source.
        if let Some(m) = &self.masquerade
            && let Err(e) = m.node_put(&r.name, &r.pod_cidrs)
        {
            tracing::error!(node = %r.name, "masquerade exemption for the node's pods: {e}");
        }
        for cidr in &r.pod_cidrs {
            if cidr.network().is_ipv4() != r.node_ip.is_ipv4() {
                continue; // direct routing needs a gateway of the same family
            }
            let done = link.runtime.block_on(link.routes.replace(*cidr, r.node_ip));
            match done {
                Ok(()) => {
                    tracing::info!(node = %r.name, %cidr, via = %r.node_ip, "route to remote node");
                }
                Err(e) => tracing::error!(node = %r.name, %cidr, "route to remote node: {e}"),
            }
        }
    }

    fn listed(&self) {
        // Remote identities and host entries kept from before a restart until the store
        // could say which still exist.
        {
            let mut st = self.state();
            let effects = st.pol.drop_unconfirmed_remote();
            if let Err(e) = self.regenerate_users(&mut st, &effects) {
                tracing::error!("regenerating after stale remote identities left: {e}");
                self.mark_needs_regeneration();
            }
        }
        let restored = crate::node::ipcache::RESTORED_REMOTE;
        if let Err(e) = self.sync_remote_endpoints(restored, &BTreeMap::new()) {
            tracing::error!("dropping host entries kept over the restart: {e}");
        }
        // The nodes are known now: the pod CIDRs the last run routed give way to theirs.
        if let Some(m) = &self.masquerade
            && let Err(e) = m.drop_kept()
        {
            tracing::error!("masquerade: dropping the pod CIDRs kept over the restart: {e}");
        }
    }

    fn node_deleted(&self, r: &NodeRecord) {
        let Some(link) = &self.cluster else { return };
        // Its addresses leave with their own delete events (same lease); this also drops any
        // the watch missed.
        if let Err(e) = self.sync_remote_endpoints(&r.name, &BTreeMap::new()) {
            tracing::error!(node = %r.name, "removing a departed node's ipcache entries: {e}");
        }
        for cidr in &r.pod_cidrs {
            match link.runtime.block_on(link.routes.remove(*cidr)) {
                Ok(()) => tracing::info!(node = %r.name, %cidr, "route to departed node removed"),
                Err(e) => tracing::error!(node = %r.name, %cidr, "removing route: {e}"),
            }
        }
        if let Some(m) = &self.masquerade
            && let Err(e) = m.node_deleted(&r.name)
        {
            tracing::error!(node = %r.name, "masquerade after a node left: {e}");
        }
    }
}
