//! The endpoint operations: allocate (CNI ADD's first half), register (its second), delete,
//! and the look-ups the API and the CNI's GC and CHECK use.

use weft_api::delete_queue::DeleteQueue;
use weft_api::{
    AllocateRequest, Allocation, Attachment, DeleteResponse, Endpoint, EndpointState, GcResponse,
    RegisterRequest,
};

use super::{
    ADD_GRACE_MS, Manager, ManagerError, State, datapath_view, from_api_labels, to_api_labels,
    validate,
};
use crate::endpoint::EndpointError;
use crate::node::ipcache::Source;
use crate::policy_state::PortOwner;

impl Manager {
    /// Reserves an endpoint, its identity and its IPs (all persisted before returning). Peers
    /// whose selectors match a new identity are regenerated now, so they already allow the new
    /// pod when its IPs appear in the ipcache at registration.
    pub fn allocate(&self, req: &AllocateRequest) -> Result<Endpoint, ManagerError> {
        self.allocate_with_labels(req, None)
    }

    /// [`Self::allocate`] with the endpoint's labels given (Kubernetes mode: from its pod and
    /// namespace) instead of built from the request's CNI labels.
    pub fn allocate_with_labels(
        &self,
        req: &AllocateRequest,
        pod_labels: Option<weft_policy::labels::LabelSet>,
    ) -> Result<Endpoint, ManagerError> {
        let t0 = std::time::Instant::now();
        validate::allocate(req)?;
        let labels = pod_labels.unwrap_or_else(|| {
            weft_policy::labels::LabelSet::for_pod(
                req.pod_namespace.as_deref().unwrap_or("default"),
                req.labels
                    .iter()
                    .map(|l| (l.key.as_str(), l.value.as_str())),
            )
        });
        // Before the state lock: a new label set may wait on the kvstore.
        let cluster_id = if self.find(&req.container_id, &req.ifname).is_some() {
            None
        } else {
            self.cluster_identity(&labels)?
        };
        // A DEL for this pair queued while the manager was unreachable came before this ADD:
        // apply it first, or a later drain would remove what this ADD creates. Taken before
        // the state lock: the drain holds the queue lock while it takes the state lock.
        let queued = self
            .delete_queue
            .as_ref()
            .map_or(Ok(false), |q| q.take(&req.container_id, &req.ifname));
        let mut st = self.state();
        match queued {
            Ok(true) => {
                if let Some(ep) = st.reg.begin_delete(&req.container_id, &req.ifname)? {
                    // The CNI's DEL tried to delete the host veth too; if that failed, this
                    // ADD's veth creation fails with "exists" and the runtime's DEL removes it.
                    self.forget_locked(&mut st, ep.id)?;
                    tracing::info!(endpoint_id = ep.id, container_id = %ep.container_id, "queued DEL applied before a new ADD");
                }
            }
            Ok(false) => {}
            Err(e) => tracing::error!("delete queue: {e}"),
        }
        if let Some(ep) = st.reg.find(&req.container_id, &req.ifname) {
            if ep.state == EndpointState::Deleting {
                return Err(EndpointError::BeingDeleted(ep.id).into());
            }
            return Ok(ep.clone());
        }
        let (identity, effects) = match cluster_id {
            Some(id) => st.pol.acquire_as(&labels, Some(id))?,
            None => st.pol.acquire(&labels)?,
        };
        let ep = match st.reg.allocate(req, to_api_labels(&labels), identity) {
            Ok(ep) => ep,
            Err(e) => {
                let undo = st.pol.release(identity)?;
                self.regenerate_users(&mut st, &undo)?;
                return Err(e.into());
            }
        };
        self.regenerate_users(&mut st, &effects)?;
        self.poke_cluster();
        tracing::info!(
            endpoint_id = ep.id,
            container_id = %ep.container_id,
            ifname = %ep.ifname,
            identity,
            ips = ?ep.ips.iter().map(|i| i.address).collect::<Vec<_>>(),
            us = t0.elapsed().as_micros(),
            "endpoint allocated"
        );
        Ok(ep)
    }

    /// Registers the plumbed veth: attaches the datapath, installs the endpoint's policy, and
    /// only then persists it `ready` (Cilium's `SyncBuildEndpoint`: ADD returns enforcing).
    pub fn register(&self, id: u32, req: &RegisterRequest) -> Result<Endpoint, ManagerError> {
        let t_req = std::time::Instant::now();
        validate::register(req)?;
        let mut st = self.state();
        let mut ep = st.reg.prepare_ready(id, req)?;
        let mut view = datapath_view(&ep).ok_or_else(|| {
            ManagerError::Invalid(format!(
                "endpoint {id} has no pod MAC or host ifindex after registering"
            ))
        })?;
        let t0 = std::time::Instant::now();
        // Its named ports first: peers whose egress rules name them (and its own slot) know
        // them before its addresses resolve. Then the slot (a replica finds it written): the
        // endpoint's entry points at complete entries with their enforcement flags from the
        // moment it exists.
        let labels = from_api_labels(&ep.labels);
        let named = self.named_ports(&ep);
        let port_owner = PortOwner::Local(ep.id);
        let ports = st
            .pol
            .set_peer_ports(port_owner.clone(), ep.identity, named.clone());
        let slot = self
            .regenerate_users(&mut st, &ports)
            .and_then(|_| self.prepare_slot(&mut st, ep.identity, &labels, &named));
        view.policy_id = match slot {
            Ok(slot) => slot,
            Err(e) => {
                self.forget_ports(&mut st, &port_owner);
                return Err(e);
            }
        };
        let slot_us = t0.elapsed().as_micros();
        ep.policy_revision = st.pol.repo().revision();
        // The ready record goes to disk while the programs attach: its write (~0.3 ms) was the
        // longest step of a register. The reply still waits for both. Should the manager die
        // before the datapath is done, its restart finds a ready endpoint whose veth exists
        // and programs it, as for any other; the runtime, which got no answer, retries or DELs.
        let (flushing, before) = st.reg.update_flushing(ep.clone())?;
        let attached = self.datapath.attach_endpoint(&view);
        st.slots.join(ep.id, view.policy_id);
        let attach_us = t0.elapsed().as_micros();
        let owner = Source::LocalEndpoint(ep.id);
        for ip in &view.ips {
            st.ipcache
                .set(ipnet::IpNet::from(*ip), owner.clone(), view.identity);
        }
        let done = attached
            .map_err(ManagerError::from)
            .and_then(|()| self.flush_ipcache(&mut st))
            .and_then(|()| Ok(flushing.wait().map_err(EndpointError::from)?));
        let ep = match done {
            Ok(()) => ep,
            Err(e) => {
                // The record goes back to what it was (`allocated` without an ifindex, for a
                // first register), so nothing else would ever detach what was just attached.
                if let Err(d) = st.reg.revert(before) {
                    tracing::error!(endpoint_id = id, "undoing a failed register: {d}");
                }
                for ip in &view.ips {
                    st.ipcache.unset(ipnet::IpNet::from(*ip), &owner);
                }
                if let Err(d) = self.flush_ipcache(&mut st) {
                    tracing::error!(endpoint_id = id, "undoing a failed register: {d}");
                }
                if let Err(d) = self.datapath.detach_endpoint(&view) {
                    tracing::error!(endpoint_id = id, "undoing a failed register: {d}");
                }
                if let Some(slot) = st.slots.leave(id)
                    && let Err(d) = self.release_if_unused(&mut st, slot)
                {
                    tracing::error!(endpoint_id = id, "undoing a failed register: {d}");
                }
                self.forget_ports(&mut st, &port_owner);
                return Err(e);
            }
        };
        let datapath_us = t0.elapsed().as_micros();
        self.poke_cluster();
        tracing::info!(
            endpoint_id = ep.id,
            host_ifname = %ep.host_ifname,
            revision = ep.policy_revision,
            policy_slot = view.policy_id,
            slot_us,
            attach_us,
            datapath_us,
            us = t_req.elapsed().as_micros(),
            "endpoint ready"
        );
        Ok(ep)
    }

    /// Removes the endpoint of (container id, ifname), if that container owns one: the host
    /// veth is set down (the kernel drops its routes), then datapath state, the record, its IPs
    /// and its identity reference go; the veth itself is deleted in the background (see
    /// `link_reaper`), also when there is no endpoint (an ADD that failed half-way).
    pub async fn delete(
        &self,
        container_id: &str,
        ifname: &str,
    ) -> Result<DeleteResponse, ManagerError> {
        validate::owner(container_id, ifname)?;
        let host_ifname = weft_api::naming::host_ifname(container_id, ifname);
        let begun = self.state().reg.begin_delete(container_id, ifname)?;
        let Some(ep) = begun else {
            // An ADD that failed half-way may have left its veth (down first, so the reaper
            // has its ifindex).
            if let Some(index) = self.hostnet.set_link_down(&host_ifname).await? {
                self.reaper.schedule(&host_ifname, index);
            }
            return Ok(DeleteResponse { deleted: None });
        };
        // Down before the IPs are freed: a route through the veth would still send a reused
        // IP's traffic to the old pod. A failure leaves the endpoint `deleting`; the runtime's
        // retry of DEL continues from there.
        let index = self.hostnet.set_link_down(&ep.host_ifname).await?;
        let deleted = {
            let mut st = self.state();
            self.forget_locked(&mut st, ep.id)?
        };
        if let Some(index) = index {
            self.reaper.schedule(&ep.host_ifname, index);
        }
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

    /// Finishes the delete of endpoint `id`: datapath state, then the record, its IPs and its
    /// identity reference. Works from the record as it is now, and only if it is still being
    /// deleted: another path may have finished it while the caller waited for the lock.
    fn forget_locked(&self, st: &mut State, id: u32) -> Result<Option<Endpoint>, ManagerError> {
        let Some(ep) = st.reg.get(id).cloned() else {
            return Ok(None);
        };
        if ep.state != EndpointState::Deleting {
            return Ok(None);
        }
        if let Some(view) = datapath_view(&ep) {
            self.datapath.detach_endpoint(&view)?;
        }
        for ip in &ep.ips {
            st.ipcache
                .unset(ipnet::IpNet::from(ip.address), &Source::LocalEndpoint(id));
        }
        self.flush_ipcache(st)?;
        let ports = st.pol.remove_peer_ports(&PortOwner::Local(id));
        self.regenerate_users(st, &ports)?;
        if let Some(slot) = st.slots.leave(id) {
            self.retire_slot(st, slot)?;
        }
        let deleted = st.reg.forget(id)?;
        if let Some(gone) = &deleted
            && gone.identity != 0
        {
            let effects = st.pol.release(gone.identity)?;
            self.regenerate_users(st, &effects)?;
        }
        self.poke_cluster();
        Ok(deleted)
    }

    /// Marks the endpoint of a pair `deleting` (the delete-queue drain does this while it holds
    /// the queue lock, so an ADD for the same pair afterwards sees the delete in progress).
    pub fn begin_delete_pair(
        &self,
        container_id: &str,
        ifname: &str,
    ) -> Result<Option<Endpoint>, ManagerError> {
        Ok(self.state().reg.begin_delete(container_id, ifname)?)
    }

    /// Tears an endpoint down completely on the manager's own initiative (restore, GC, reaper,
    /// queued DEL): `deleting` first, then the host veth, then datapath and record. `ep` is the
    /// caller's snapshot: if the endpoint changed since (another id owns the pair now, or it
    /// moved to another state, e.g. an abandoned-looking ADD registered meanwhile), nothing is
    /// done and `false` is returned.
    pub async fn remove_fully(&self, ep: &Endpoint) -> Result<bool, ManagerError> {
        let doomed = {
            let mut st = self.state();
            let same = st
                .reg
                .get(ep.id)
                .is_some_and(|cur| cur.state == ep.state || cur.state == EndpointState::Deleting);
            if !same {
                return Ok(false);
            }
            match st.reg.begin_delete(&ep.container_id, &ep.ifname)? {
                Some(cur) if cur.id == ep.id => cur,
                _ => return Ok(false),
            }
        };
        self.hostnet.delete_link(&doomed.host_ifname).await?;
        let mut st = self.state();
        self.forget_locked(&mut st, doomed.id)?;
        Ok(true)
    }

    /// Waits until no background deletion of (container, ifname)'s host veth is pending: an
    /// ADD creates a link of that name.
    pub async fn settle_host_link(&self, container_id: &str, ifname: &str) {
        self.reaper
            .settle(&weft_api::naming::host_ifname(container_id, ifname))
            .await;
    }

    /// Host veths whose deletion is pending or running.
    pub fn links_being_reaped(&self) -> Vec<String> {
        self.reaper.pending()
    }

    /// Schedules the deletion of every host veth no endpoint owns: a manager killed with
    /// deletions pending left them behind. Runs before the API socket is bound: an ADD whose
    /// pair exists before its allocation (the CNI creates both at once) either fails to reach
    /// this manager, or has its allocation wait (`settle`) for the deletion of its pair and then
    /// fails on the missing link; it never ends up ready on a link deleted later. Returns how
    /// many were scheduled.
    pub async fn reap_orphan_links(&self) -> Result<usize, ManagerError> {
        let links = self.hostnet.link_indexes().await?;
        let owned: std::collections::BTreeSet<String> = self
            .state()
            .reg
            .list()
            .map(|ep| ep.host_ifname.clone())
            .collect();
        let mut n = 0;
        let orphans = links
            .iter()
            .filter(|(l, _)| weft_api::naming::is_host_ifname(l) && !owned.contains(*l));
        for (link, index) in orphans {
            tracing::info!(link = %link, "host veth without an endpoint: deleting");
            self.reaper.schedule(link, *index);
            n += 1;
        }
        Ok(n)
    }

    /// The CNI's delete queue, when attached.
    pub fn delete_queue(&self) -> Option<&DeleteQueue> {
        self.delete_queue.as_ref()
    }

    /// Deletes a host link left without an endpoint (missing is fine).
    pub async fn delete_host_link(&self, name: &str) -> Result<(), ManagerError> {
        Ok(self.hostnet.delete_link(name).await?)
    }

    /// Releases every endpoint not in `valid`, except ADDs still in flight; their host veths
    /// are deleted too, since no DEL will come for them.
    pub async fn gc(&self, valid: &[Attachment], now_ms: u64) -> Result<GcResponse, ManagerError> {
        let doomed: Vec<Endpoint> = self
            .state()
            .reg
            .list()
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
            .collect();
        let mut released = Vec::new();
        for ep in doomed {
            if self.remove_fully(&ep).await? {
                tracing::info!(endpoint_id = ep.id, container_id = %ep.container_id, "released by GC");
                released.push(ep);
            }
        }
        Ok(GcResponse { released })
    }

    /// Every endpoint.
    pub fn endpoints(&self) -> Vec<Endpoint> {
        self.state().reg.list().cloned().collect()
    }

    /// One endpoint by id.
    pub fn endpoint(&self, id: u32) -> Option<Endpoint> {
        self.state().reg.get(id).cloned()
    }

    /// The endpoint of (container id, ifname).
    pub fn find(&self, container_id: &str, ifname: &str) -> Option<Endpoint> {
        self.state().reg.find(container_id, ifname).cloned()
    }

    /// Every IP allocation.
    pub fn allocations(&self) -> Vec<Allocation> {
        let st = self.state();
        let mut out: Vec<Allocation> = st
            .reg
            .list()
            .flat_map(|ep| {
                ep.ips.iter().map(|ip| Allocation {
                    address: ip.address,
                    pool: st
                        .reg
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
