//! The endpoint registry: who owns which endpoint id and IPs, and in which state.
//!
//! Ownership is the (container id, ifname) pair: every lookup that can free something goes
//! through it, so a stale DEL for container X can never release what container Y holds now
//! (Cilium #10065).
//!
//! Its children: [`ipam`] the address pools, [`restore`] start-up reconciliation against the
//! node, [`link_reaper`] host veths deleted after DEL answered. Calls `store`, `node::hostnet`
//! and `datapath` only.

pub mod ipam;
pub mod link_reaper;
pub mod restore;

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use weft_api::{AllocateRequest, Endpoint, EndpointState, IpConfig, RegisterRequest, naming};

use crate::endpoint::ipam::{IpamError, Pool};
use crate::store::{Flushing, Store, StoreError};

/// Registry failures.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    /// No address left.
    #[error(transparent)]
    Ipam(#[from] IpamError),
    /// Persisting failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// No endpoint with that id.
    #[error("endpoint {0} not found")]
    NotFound(u32),
    /// A register for an endpoint that another container owns.
    #[error("endpoint {id} belongs to container {owner}, not {claimed}")]
    WrongOwner {
        /// Endpoint id.
        id: u32,
        /// Real owner.
        owner: String,
        /// Who asked.
        claimed: String,
    },
    /// The endpoint is being deleted; it cannot become ready again.
    #[error("endpoint {0} is being deleted; ADD again after the DEL completes")]
    BeingDeleted(u32),
    /// The request is malformed.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// A register for a ready endpoint that names another link or other MACs.
    #[error(
        "endpoint {id} is already ready on {host_ifname} (ifindex {ifindex}, host MAC {host_mac}, pod MAC {pod_mac}); a ready endpoint cannot be moved: DEL and ADD the pod again"
    )]
    AlreadyReady {
        /// Endpoint id.
        id: u32,
        /// Its host veth.
        host_ifname: String,
        /// Registered ifindex.
        ifindex: u32,
        /// Registered host MAC.
        host_mac: weft_api::MacAddr,
        /// Registered pod MAC.
        pod_mac: weft_api::MacAddr,
    },
}

type Owner = (String, String);

/// In-memory view of the store plus the pools; all mutations write through to sled first.
pub struct Registry {
    store: Store,
    pools: Vec<Pool>,
    endpoints: BTreeMap<u32, Endpoint>,
    owners: HashMap<Owner, u32>,
    next_id: u32,
}

impl Registry {
    /// Loads every endpoint and allocation from `store` into pools over `cidrs`.
    /// Allocations no endpoint owns (a crash between two writes cannot produce them, but an
    /// older version might have) are released.
    pub fn open(store: Store, pools: Vec<Pool>) -> Result<Self, EndpointError> {
        let mut reg = Self {
            next_id: store.next_endpoint_id()?,
            store,
            pools,
            endpoints: BTreeMap::new(),
            owners: HashMap::new(),
        };
        for ep in reg.store.load_endpoints()? {
            for ip in &ep.ips {
                match reg.pools.iter_mut().find(|p| p.same_family(ip.address)) {
                    // The start refuses a pod CIDR change while endpoints use the old one,
                    // unless their DELs are queued: such an address is released with them.
                    Some(pool) if !pool.cidr().contains(&ip.address) => tracing::warn!(
                        endpoint_id = ep.id,
                        address = %ip.address,
                        pool = %pool.cidr(),
                        "endpoint address outside the node's pod CIDR (its DEL is queued)"
                    ),
                    Some(pool) => {
                        pool.claim(ip.address)?;
                    }
                    None => {}
                }
            }
            reg.next_id = reg.next_id.max(ep.id + 1);
            reg.owners
                .insert((ep.container_id.clone(), ep.ifname.clone()), ep.id);
            reg.endpoints.insert(ep.id, ep);
        }
        for (ip, id) in reg.store.load_ips()? {
            if !reg.endpoints.contains_key(&id) {
                tracing::warn!(
                    ip,
                    endpoint_id = id,
                    "releasing allocation without endpoint"
                );
                reg.store.remove_ip(&ip)?;
            }
        }
        Ok(reg)
    }

    /// The pools.
    #[must_use]
    pub fn pools(&self) -> &[Pool] {
        &self.pools
    }

    /// Every endpoint, by id.
    pub fn list(&self) -> impl Iterator<Item = &Endpoint> {
        self.endpoints.values()
    }

    /// One endpoint.
    #[must_use]
    pub fn get(&self, id: u32) -> Option<&Endpoint> {
        self.endpoints.get(&id)
    }

    /// The endpoint of (container id, ifname), if any.
    #[must_use]
    pub fn find(&self, container_id: &str, ifname: &str) -> Option<&Endpoint> {
        self.owners
            .get(&(container_id.to_owned(), ifname.to_owned()))
            .and_then(|id| self.endpoints.get(id))
    }

    /// Reserves an endpoint id and one IP per pool, persisted before returning. A repeated
    /// request for the same (container id, ifname) gets the existing allocation back.
    pub fn allocate(
        &mut self,
        req: &AllocateRequest,
        labels: Vec<weft_api::Label>,
        identity: u32,
    ) -> Result<Endpoint, EndpointError> {
        if req.container_id.is_empty() || req.ifname.is_empty() {
            return Err(EndpointError::Invalid(
                "container_id and ifname are required".into(),
            ));
        }
        if let Some(ep) = self.find(&req.container_id, &req.ifname) {
            return Ok(ep.clone());
        }
        let mut ips = Vec::with_capacity(self.pools.len());
        for pool in &mut self.pools {
            match pool.allocate() {
                Ok(address) => ips.push(IpConfig {
                    address,
                    gateway: pool.router(),
                }),
                Err(e) => {
                    self.release_ips(&ips);
                    return Err(e.into());
                }
            }
        }
        let ep = Endpoint {
            id: self.next_id,
            container_id: req.container_id.clone(),
            ifname: req.ifname.clone(),
            netns: req.netns.clone(),
            pod_namespace: req.pod_namespace.clone(),
            pod_name: req.pod_name.clone(),
            labels,
            identity,
            ips,
            host_ifname: naming::host_ifname(&req.container_id, &req.ifname),
            host_ifindex: None,
            host_mac: None,
            pod_mac: None,
            state: EndpointState::Allocated,
            policy_revision: 0,
            created_ms: crate::sys::clock::now_ms(),
        };
        if let Err(e) = self.store.put_endpoint(&ep, Some(ep.id + 1)) {
            self.release_ips(&ep.ips);
            return Err(e.into());
        }
        self.next_id += 1;
        self.owners
            .insert((ep.container_id.clone(), ep.ifname.clone()), ep.id);
        self.endpoints.insert(ep.id, ep.clone());
        Ok(ep)
    }

    fn release_ips(&mut self, ips: &[IpConfig]) {
        for ip in ips {
            if let Some(pool) = self.pools.iter_mut().find(|p| p.same_family(ip.address)) {
                pool.release(ip.address);
            }
        }
    }

    /// Records the plumbed veth; the endpoint becomes `ready` once `finish` persists it.
    /// Returns the endpoint as it will be stored, without storing it yet, so the caller can
    /// program the datapath first and only then declare it ready.
    pub fn prepare_ready(&self, id: u32, reg: &RegisterRequest) -> Result<Endpoint, EndpointError> {
        let ep = self.endpoints.get(&id).ok_or(EndpointError::NotFound(id))?;
        if ep.container_id != reg.container_id {
            return Err(EndpointError::WrongOwner {
                id,
                owner: ep.container_id.clone(),
                claimed: reg.container_id.clone(),
            });
        }
        if ep.state == EndpointState::Deleting {
            // A register racing a DEL (or a reaped ADD) must not bring the endpoint back.
            return Err(EndpointError::BeingDeleted(id));
        }
        if reg.host_ifname != ep.host_ifname {
            return Err(EndpointError::Invalid(format!(
                "host_ifname {} does not match the endpoint's {}",
                reg.host_ifname, ep.host_ifname
            )));
        }
        if ep.state == EndpointState::Ready
            && (ep.host_ifindex != Some(reg.host_ifindex)
                || ep.host_mac != Some(reg.host_mac)
                || ep.pod_mac != Some(reg.pod_mac))
        {
            // Re-pointing a live endpoint at another link or MAC would redirect its traffic.
            return Err(EndpointError::AlreadyReady {
                id,
                host_ifname: ep.host_ifname.clone(),
                ifindex: ep.host_ifindex.unwrap_or_default(),
                host_mac: ep.host_mac.unwrap_or_default(),
                pod_mac: ep.pod_mac.unwrap_or_default(),
            });
        }
        let mut ep = ep.clone();
        ep.host_ifindex = Some(reg.host_ifindex);
        ep.host_mac = Some(reg.host_mac);
        ep.pod_mac = Some(reg.pod_mac);
        ep.state = EndpointState::Ready;
        Ok(ep)
    }

    /// [`Self::update`] whose write reaches the disk while the caller goes on: durable once the
    /// returned flush is waited for. The record is current in memory at once; the one it
    /// replaced is returned, for [`Self::revert`].
    pub fn update_flushing(&mut self, ep: Endpoint) -> Result<(Flushing, Endpoint), EndpointError> {
        let current = self
            .endpoints
            .get_mut(&ep.id)
            .ok_or(EndpointError::NotFound(ep.id))?;
        self.store.stage_endpoint(&ep, None)?;
        let before = std::mem::replace(current, ep);
        Ok((self.store.begin_flush(), before))
    }

    /// Puts back a record that [`Self::update_flushing`] replaced, in memory even when the
    /// store refuses the write (the error is returned: the disk may still hold the newer one).
    pub fn revert(&mut self, ep: Endpoint) -> Result<(), EndpointError> {
        let stored = self.store.put_endpoint(&ep, None);
        self.endpoints.insert(ep.id, ep);
        Ok(stored?)
    }

    /// Persists an updated endpoint (same id and owner).
    pub fn update(&mut self, ep: Endpoint) -> Result<Endpoint, EndpointError> {
        if !self.endpoints.contains_key(&ep.id) {
            return Err(EndpointError::NotFound(ep.id));
        }
        self.store.put_endpoint(&ep, None)?;
        self.endpoints.insert(ep.id, ep.clone());
        Ok(ep)
    }

    /// Marks the endpoint of (container id, ifname) `deleting` (persisted) and returns it, so the
    /// caller can tear down its datapath state before [`Registry::forget`] releases the IPs.
    pub fn begin_delete(
        &mut self,
        container_id: &str,
        ifname: &str,
    ) -> Result<Option<Endpoint>, EndpointError> {
        let Some(mut ep) = self.find(container_id, ifname).cloned() else {
            return Ok(None);
        };
        if ep.state != EndpointState::Deleting {
            ep.state = EndpointState::Deleting;
            self.update(ep.clone())?;
        }
        Ok(Some(ep))
    }

    /// Removes the endpoint and frees its IPs.
    pub fn forget(&mut self, id: u32) -> Result<Option<Endpoint>, EndpointError> {
        let Some(ep) = self.endpoints.get(&id).cloned() else {
            return Ok(None);
        };
        self.store.remove_endpoint(&ep)?;
        self.release_ips(&ep.ips);
        self.owners
            .remove(&(ep.container_id.clone(), ep.ifname.clone()));
        self.endpoints.remove(&id);
        Ok(Some(ep))
    }

    /// Records the policy revision an endpoint enforces. Not persisted on its own: a restarted
    /// manager regenerates every endpoint, which sets it again.
    pub fn set_revision(&mut self, id: u32, revision: u64) {
        if let Some(ep) = self.endpoints.get_mut(&id) {
            ep.policy_revision = revision;
        }
    }

    /// Who holds `addr`.
    #[must_use]
    pub fn owner_of(&self, addr: IpAddr) -> Option<&Endpoint> {
        self.endpoints
            .values()
            .find(|e| e.ips.iter().any(|i| i.address == addr))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_api::Label;

    fn reg() -> Registry {
        let pools = vec![
            Pool::new("10.0.1.0/29".parse().unwrap()),
            Pool::new("fd00::/120".parse().unwrap()),
        ];
        Registry::open(Store::temporary().unwrap(), pools).unwrap()
    }

    fn req(c: &str) -> AllocateRequest {
        AllocateRequest {
            container_id: c.into(),
            ifname: "eth0".into(),
            netns: "/run/netns/x".into(),
            pod_namespace: Some("default".into()),
            pod_name: Some(c.into()),
            labels: vec![
                Label {
                    key: "b".into(),
                    value: "2".into(),
                },
                Label {
                    key: "a".into(),
                    value: "1".into(),
                },
            ],
        }
    }

    impl Registry {
        fn allocate_test(&mut self, req: &AllocateRequest) -> Result<Endpoint, EndpointError> {
            let mut labels = req.labels.clone();
            labels.sort();
            self.allocate(req, labels, 300)
        }
    }

    fn register(ep: &Endpoint) -> RegisterRequest {
        RegisterRequest {
            container_id: ep.container_id.clone(),
            host_ifname: ep.host_ifname.clone(),
            host_ifindex: 7,
            host_mac: weft_api::MacAddr::new([2, 0, 0, 0, 0, 1]),
            pod_mac: weft_api::MacAddr::new([2, 0, 0, 0, 0, 2]),
        }
    }

    fn reg_at(dir: &std::path::Path) -> Registry {
        let pools = vec![Pool::new("10.0.1.0/29".parse().unwrap())];
        Registry::open(Store::open(dir).unwrap(), pools).unwrap()
    }

    /// Allocates, then writes the ready record as a registration does; returns the allocation.
    fn ready_during_the_attach(r: &mut Registry) -> Endpoint {
        let a = r.allocate_test(&req("c1")).unwrap();
        let ready = r.prepare_ready(a.id, &register(&a)).unwrap();
        let (flushing, before) = r.update_flushing(ready).unwrap();
        assert_eq!(before, a, "the replaced record comes back");
        assert_eq!(r.get(a.id).unwrap().state, EndpointState::Ready);
        flushing.wait().unwrap();
        a
    }

    #[test]
    fn a_ready_record_written_during_the_attach_is_on_disk_once_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let id = ready_during_the_attach(&mut reg_at(dir.path())).id;
        let r = reg_at(dir.path());
        assert_eq!(r.get(id).unwrap().state, EndpointState::Ready);
        assert_eq!(r.get(id).unwrap().host_ifindex, Some(7));
    }

    #[test]
    fn a_failed_register_reverts_to_the_allocated_record_in_memory_and_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let id = {
            let mut r = reg_at(dir.path());
            let a = ready_during_the_attach(&mut r);
            r.revert(a.clone()).unwrap();
            assert_eq!(r.get(a.id), Some(&a));
            a.id
        };
        let r = reg_at(dir.path());
        assert_eq!(r.get(id).unwrap().state, EndpointState::Allocated);
        assert_eq!(r.get(id).unwrap().host_ifindex, None);
    }

    #[test]
    fn allocate_gives_one_ip_per_family_and_is_idempotent() {
        let mut r = reg();
        let a = r.allocate_test(&req("c1")).unwrap();
        assert_eq!(a.ips.len(), 2);
        assert_eq!(a.ips[0].gateway.to_string(), "10.0.1.1");
        assert_eq!(a.labels[0].key, "a", "labels are sorted");
        assert_eq!(r.allocate_test(&req("c1")).unwrap(), a);
        let b = r.allocate_test(&req("c2")).unwrap();
        assert_ne!(a.ips[0].address, b.ips[0].address);
        assert_ne!(a.id, b.id);
    }

    #[test]
    fn exhaustion_names_the_pool_and_leaks_nothing() {
        let mut r = reg();
        for i in 0..5 {
            r.allocate_test(&req(&format!("c{i}"))).unwrap();
        }
        let err = r.allocate_test(&req("c9")).unwrap_err().to_string();
        assert!(err.contains("10.0.1.0/29"), "{err}");
        assert_eq!(
            r.pools()[1].used(),
            5,
            "the v6 address of the failed request is released"
        );
    }

    #[test]
    fn stale_delete_never_frees_another_containers_ip() {
        let mut r = reg();
        let x = r.allocate_test(&req("x")).unwrap();
        let ep = r.begin_delete("x", "eth0").unwrap().unwrap();
        r.forget(ep.id).unwrap();
        let y = r.allocate_test(&req("y")).unwrap();
        // A late, repeated DEL for x finds nothing, whatever IP y got.
        assert!(r.begin_delete("x", "eth0").unwrap().is_none());
        assert_eq!(r.find("y", "eth0").unwrap().ips, y.ips);
        assert_ne!(x.id, y.id);
    }

    #[test]
    fn register_checks_the_owner() {
        let mut r = reg();
        let a = r.allocate_test(&req("c1")).unwrap();
        let mut bad = register(&a);
        bad.container_id = "other".into();
        assert!(matches!(
            r.prepare_ready(a.id, &bad),
            Err(EndpointError::WrongOwner { .. })
        ));
        let ready = r.prepare_ready(a.id, &register(&a)).unwrap();
        r.update(ready).unwrap();
        assert_eq!(r.get(a.id).unwrap().state, EndpointState::Ready);
    }

    #[test]
    fn a_ready_endpoint_cannot_be_moved_to_another_link_or_mac() {
        let mut r = reg();
        let a = r.allocate_test(&req("c1")).unwrap();
        let ready = r.prepare_ready(a.id, &register(&a)).unwrap();
        r.update(ready.clone()).unwrap();
        // The same registration again is a harmless retry.
        assert_eq!(r.prepare_ready(a.id, &register(&a)).unwrap(), ready);
        for change in [
            |x: &mut RegisterRequest| x.host_mac = weft_api::MacAddr::new([2, 0, 0, 0, 0, 0x99]),
            |x: &mut RegisterRequest| x.pod_mac = weft_api::MacAddr::new([2, 0, 0, 0, 0, 0x98]),
            |x: &mut RegisterRequest| x.host_ifindex = 99,
        ] {
            let mut moved = register(&a);
            change(&mut moved);
            assert!(matches!(
                r.prepare_ready(a.id, &moved),
                Err(EndpointError::AlreadyReady { .. })
            ));
        }
        assert_eq!(r.get(a.id).unwrap(), &ready);
    }

    #[test]
    fn register_refuses_an_endpoint_being_deleted() {
        let mut r = reg();
        let a = r.allocate_test(&req("c1")).unwrap();
        r.begin_delete("c1", "eth0").unwrap();
        assert!(matches!(
            r.prepare_ready(a.id, &register(&a)),
            Err(EndpointError::BeingDeleted(_))
        ));
    }

    #[test]
    fn state_survives_reopen() {
        let store = Store::temporary().unwrap();
        let pools = || vec![Pool::new("10.0.1.0/29".parse().unwrap())];
        let mut r = Registry::open(store.clone(), pools()).unwrap();
        let a = r.allocate_test(&req("c1")).unwrap();
        let b = r.allocate_test(&req("c2")).unwrap();
        r.forget(b.id).unwrap();
        drop(r);
        let mut r = Registry::open(store, pools()).unwrap();
        assert_eq!(r.find("c1", "eth0").unwrap(), &a);
        assert_eq!(r.pools()[0].used(), 1);
        let c = r.allocate_test(&req("c3")).unwrap();
        assert!(c.id > b.id, "ids are never reused");
    }
}
