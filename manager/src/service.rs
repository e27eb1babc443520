//! The manager's operations, composing the registry with the node's side effects.
//! The HTTP layer (`api`) only translates; every rule lives here or below.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use weft_api::{
    AllocateRequest, Allocation, Attachment, DeleteResponse, Endpoint, EndpointState, GcResponse,
    PoolStatus, RegisterRequest, StatusResponse,
};

use crate::endpoint::{EndpointError, Registry};
use crate::hostnet::{HostNet, HostNetError};
use crate::node::ChosenCidr;

/// How long an allocation may stay un-registered before GC may treat it as abandoned: an ADD
/// in flight (kubelet's CNI timeout is minutes) must not lose its IP to a concurrent GC.
pub const ADD_GRACE_MS: u64 = 5 * 60 * 1000;

/// Failures of manager operations, as the API reports them.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    /// Registry or IPAM.
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    /// Node plumbing.
    #[error(transparent)]
    HostNet(#[from] HostNetError),
    /// Not ready to serve yet.
    #[error("weft-manager is starting; retry shortly")]
    NotReady,
}

/// The running manager's state.
pub struct Manager {
    node_name: String,
    cidrs: Vec<ChosenCidr>,
    registry: Mutex<Registry>,
    hostnet: Arc<dyn HostNet>,
    ready: AtomicBool,
}

impl Manager {
    /// Assembles a manager over an opened registry.
    pub fn new(
        node_name: String,
        cidrs: Vec<ChosenCidr>,
        registry: Registry,
        hostnet: Arc<dyn HostNet>,
    ) -> Self {
        Self {
            node_name,
            cidrs,
            registry: Mutex::new(registry),
            hostnet,
            ready: AtomicBool::new(false),
        }
    }

    fn registry(&self) -> MutexGuard<'_, Registry> {
        // A panic while holding the lock leaves consistent state: every mutation writes sled
        // first and memory second, so recovering the guard is safe.
        self.registry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Declares start-up finished.
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::SeqCst);
    }

    /// Has start-up finished?
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// Node, pools and counts.
    pub fn status(&self) -> StatusResponse {
        let reg = self.registry();
        let pools = reg
            .pools()
            .iter()
            .zip(&self.cidrs)
            .map(|(pool, chosen)| PoolStatus {
                cidr: pool.cidr().to_string(),
                source: chosen.source,
                source_detail: Some(chosen.detail.clone()),
                router_ip: pool.router(),
                used: u64::try_from(pool.used()).unwrap_or(u64::MAX),
                capacity: u64::try_from(pool.capacity()).unwrap_or(u64::MAX),
            })
            .collect();
        StatusResponse {
            node_name: self.node_name.clone(),
            ready: self.is_ready(),
            pools,
            endpoints: reg.list().count() as u64,
            policy_revision: 0,
            version: env!("CARGO_PKG_VERSION").into(),
        }
    }

    /// Reserves an endpoint and its IPs (persisted before returning).
    pub fn allocate(&self, req: &AllocateRequest) -> Result<Endpoint, ManagerError> {
        let ep = self.registry().allocate(req)?;
        tracing::info!(
            endpoint_id = ep.id,
            container_id = %ep.container_id,
            ifname = %ep.ifname,
            ips = ?ep.ips.iter().map(|i| i.address).collect::<Vec<_>>(),
            "endpoint allocated"
        );
        Ok(ep)
    }

    /// Registers the plumbed veth: the endpoint becomes `ready`.
    pub fn register(&self, id: u32, req: &RegisterRequest) -> Result<Endpoint, ManagerError> {
        let mut reg = self.registry();
        let ep = reg.prepare_ready(id, req)?;
        let ep = reg.update(ep)?;
        tracing::info!(endpoint_id = ep.id, host_ifname = %ep.host_ifname, "endpoint ready");
        Ok(ep)
    }

    /// Removes the endpoint of (container id, ifname), if that container owns one.
    pub fn delete(&self, container_id: &str, ifname: &str) -> Result<DeleteResponse, ManagerError> {
        let mut reg = self.registry();
        let Some(ep) = reg.begin_delete(container_id, ifname)? else {
            return Ok(DeleteResponse { deleted: None });
        };
        let deleted = reg.forget(ep.id)?;
        if let Some(ep) = &deleted {
            tracing::info!(
                endpoint_id = ep.id,
                container_id,
                ifname,
                "endpoint deleted"
            );
        }
        Ok(DeleteResponse { deleted })
    }

    /// Releases every endpoint not in `valid`, except ADDs still in flight; their host veths
    /// are deleted too, since no DEL will come for them.
    pub async fn gc(&self, valid: &[Attachment], now_ms: u64) -> Result<GcResponse, ManagerError> {
        let doomed: Vec<Endpoint> = {
            let reg = self.registry();
            reg.list()
                .filter(|ep| {
                    !valid
                        .iter()
                        .any(|a| a.container_id == ep.container_id && a.ifname == ep.ifname)
                })
                .filter(|ep| {
                    ep.state != EndpointState::Allocated
                        || now_ms.saturating_sub(ep.created_ms) > ADD_GRACE_MS
                })
                .cloned()
                .collect()
        };
        let mut released = Vec::new();
        for ep in doomed {
            self.remove_fully(&ep).await?;
            tracing::info!(endpoint_id = ep.id, container_id = %ep.container_id, "released by GC");
            released.push(ep);
        }
        Ok(GcResponse { released })
    }

    /// Tears an endpoint down completely on the manager's own initiative (restore, GC, reaper,
    /// queued DEL): state `deleting` first, then the host veth, then the record and its IPs.
    pub async fn remove_fully(&self, ep: &Endpoint) -> Result<(), ManagerError> {
        if self
            .registry()
            .begin_delete(&ep.container_id, &ep.ifname)?
            .is_none()
        {
            return Ok(());
        }
        self.hostnet.delete_link(&ep.host_ifname).await?;
        self.registry().forget(ep.id)?;
        Ok(())
    }

    /// Deletes a host link left without an endpoint (missing is fine).
    pub async fn delete_host_link(&self, name: &str) -> Result<(), ManagerError> {
        Ok(self.hostnet.delete_link(name).await?)
    }

    /// Every endpoint.
    pub fn endpoints(&self) -> Vec<Endpoint> {
        self.registry().list().cloned().collect()
    }

    /// One endpoint by id.
    pub fn endpoint(&self, id: u32) -> Option<Endpoint> {
        self.registry().get(id).cloned()
    }

    /// The endpoint of (container id, ifname).
    pub fn find(&self, container_id: &str, ifname: &str) -> Option<Endpoint> {
        self.registry().find(container_id, ifname).cloned()
    }

    /// Every IP allocation.
    pub fn allocations(&self) -> Vec<Allocation> {
        let reg = self.registry();
        let mut out: Vec<Allocation> = reg
            .list()
            .flat_map(|ep| {
                ep.ips.iter().map(|ip| Allocation {
                    address: ip.address,
                    pool: reg
                        .pools()
                        .iter()
                        .find(|p| p.same_family(ip.address))
                        .map(|p| p.cidr().to_string())
                        .unwrap_or_default(),
                    endpoint_id: ep.id,
                    container_id: ep.container_id.clone(),
                    ifname: ep.ifname.clone(),
                })
            })
            .collect();
        out.sort_by_key(|a| a.address);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hostnet::FakeHostNet;
    use crate::ipam::Pool;
    use crate::store::Store;

    fn manager() -> (Manager, Arc<FakeHostNet>) {
        let net = Arc::new(FakeHostNet::default());
        let cidr = crate::node::select(
            &crate::node::NodeManifest::default(),
            &["10.0.1.0/24".into()],
        )
        .unwrap()
        .cidrs();
        let reg =
            Registry::open(Store::temporary().unwrap(), vec![Pool::new(cidr[0].cidr)]).unwrap();
        (Manager::new("n".into(), cidr, reg, net.clone()), net)
    }

    fn alloc(m: &Manager, c: &str) -> Endpoint {
        m.allocate(&AllocateRequest {
            container_id: c.into(),
            ifname: "eth0".into(),
            netns: "/x".into(),
            pod_namespace: None,
            pod_name: None,
            labels: vec![],
        })
        .unwrap()
    }

    fn make_ready(m: &Manager, ep: &Endpoint) {
        m.register(
            ep.id,
            &RegisterRequest {
                container_id: ep.container_id.clone(),
                host_ifname: ep.host_ifname.clone(),
                host_ifindex: 9,
                host_mac: "02:00:00:00:00:01".into(),
                pod_mac: "02:00:00:00:00:02".into(),
            },
        )
        .unwrap();
    }

    #[tokio::test]
    async fn gc_releases_only_invalid_settled_endpoints() {
        let (m, net) = manager();
        let keep = alloc(&m, "keep");
        let stale = alloc(&m, "stale");
        let inflight = alloc(&m, "inflight");
        make_ready(&m, &keep);
        make_ready(&m, &stale);
        net.links
            .lock()
            .unwrap()
            .insert(stale.host_ifname.clone(), 5);
        let valid = [Attachment {
            container_id: "keep".into(),
            ifname: "eth0".into(),
        }];
        let out = m.gc(&valid, inflight.created_ms + 1000).await.unwrap();
        assert_eq!(out.released.len(), 1);
        assert_eq!(out.released[0].container_id, "stale");
        assert!(
            m.find("inflight", "eth0").is_some(),
            "ADD in flight survives GC"
        );
        assert!(!net.links.lock().unwrap().contains_key(&stale.host_ifname));
        // Once past the grace period, an abandoned allocation goes too.
        let out = m
            .gc(&valid, inflight.created_ms + ADD_GRACE_MS + 1)
            .await
            .unwrap();
        assert_eq!(out.released[0].container_id, "inflight");
        assert_eq!(m.status().pools[0].used, 1);
    }

    #[test]
    fn delete_is_idempotent_and_scoped_to_the_owner() {
        let (m, _) = manager();
        let a = alloc(&m, "a");
        assert!(m.delete("b", "eth0").unwrap().deleted.is_none());
        assert_eq!(m.delete("a", "eth0").unwrap().deleted.unwrap().id, a.id);
        assert!(m.delete("a", "eth0").unwrap().deleted.is_none());
        assert_eq!(m.status().pools[0].used, 0);
    }
}
