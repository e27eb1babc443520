//! Selective regeneration (DESIGN §4): only endpoints whose selected rules or peer identity sets
//! changed are recomputed, and only a changed result reaches the datapath, as a map diff.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use weft_api::EndpointState;
use weft_policy::repository::RepoChange;
use weft_policy::rule::PeerSelector;

use super::{Manager, ManagerError, State, from_api_labels};

impl Manager {
    /// Regenerates the ready endpoints whose selected rules use one of `changed` selectors.
    pub(crate) fn regenerate_users(
        &self,
        st: &mut State,
        changed: &BTreeSet<PeerSelector>,
    ) -> Result<usize, ManagerError> {
        if changed.is_empty() {
            return Ok(0);
        }
        let ids: Vec<u32> = st
            .reg
            .list()
            .filter(|ep| {
                ep.state == EndpointState::Ready
                    && st
                        .pol
                        .repo()
                        .endpoint_uses(&from_api_labels(&ep.labels), changed)
            })
            .map(|ep| ep.id)
            .collect();
        self.regenerate(st, &ids)
    }

    /// Regenerates the endpoints a repository change can affect: those an added or removed rule
    /// selects, and those using a selector whose identities changed. Every ready endpoint then
    /// records the new revision (an unaffected endpoint enforces it already).
    pub(crate) fn regenerate_for_change(
        &self,
        st: &mut State,
        change: &RepoChange,
        changed: &BTreeSet<PeerSelector>,
    ) -> Result<usize, ManagerError> {
        let ids: Vec<u32> = st
            .reg
            .list()
            .filter(|ep| ep.state == EndpointState::Ready)
            .filter(|ep| {
                let labels = from_api_labels(&ep.labels);
                change.selects(&labels) || st.pol.repo().endpoint_uses(&labels, changed)
            })
            .map(|ep| ep.id)
            .collect();
        let n = self.regenerate(st, &ids)?;
        // Endpoints the change cannot affect enforce the new revision as they are.
        let rev = st.pol.repo().revision();
        let rest: Vec<u32> = st
            .reg
            .list()
            .filter(|ep| ep.state == EndpointState::Ready && !ids.contains(&ep.id))
            .map(|ep| ep.id)
            .collect();
        for id in rest {
            st.reg.set_revision(id, rev);
        }
        Ok(n)
    }

    /// Re-attaches every ready endpoint after a restart: the programs are replaced atomically
    /// (the veth never runs without one) and the endpoint/ipcache entries rewritten in place.
    pub fn readopt(&self) -> Result<usize, ManagerError> {
        let st = self.state();
        let mut n = 0;
        for ep in st.reg.list().filter(|ep| ep.state == EndpointState::Ready) {
            if let Some(view) = super::datapath_view(ep) {
                self.datapath.attach_endpoint(&view)?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// Removes datapath state of endpoints the registry does not know (e.g. deleted while the
    /// manager was down, or created by a run whose state was lost). Returns how many.
    pub fn reconcile_datapath(&self) -> Result<usize, ManagerError> {
        let keep: BTreeSet<u32> = self
            .state()
            .reg
            .list()
            .filter(|ep| ep.state == EndpointState::Ready)
            .map(|ep| ep.id)
            .collect();
        let removed = self.datapath.reconcile(&keep)?;
        for id in &removed {
            tracing::warn!(
                endpoint_id = id,
                "removed datapath state of an unknown endpoint"
            );
        }
        Ok(removed.len())
    }

    /// Recomputes every ready endpoint (start-up): the datapath diffs against the pinned maps,
    /// so entries that stay are never touched and nothing is deleted before its replacement.
    pub fn regenerate_all(&self) -> Result<usize, ManagerError> {
        let mut st = self.state();
        let ids: Vec<u32> = st.reg.list().map(|ep| ep.id).collect();
        let n = self.regenerate(&mut st, &ids)?;
        for (prefix, id) in st.pol.cidr_identities() {
            self.datapath.upsert_ipcache(prefix, id)?;
        }
        Ok(n)
    }

    /// Removes ipcache entries nothing owns any more: addresses of pods that died while the
    /// manager was down, CIDR identities no rule references. Wanted entries are left alone.
    pub fn reconcile_ipcache(&self) -> Result<usize, ManagerError> {
        let mut wanted: BTreeSet<String> = ["0.0.0.0/0", "::/0"].map(String::from).into();
        {
            let st = self.state();
            for pool in st.reg.pools() {
                wanted.insert(ipnet::IpNet::from(pool.router()).to_string());
            }
            for ep in st.reg.list() {
                for ip in &ep.ips {
                    wanted.insert(ipnet::IpNet::from(ip.address).to_string());
                }
            }
            for prefix in st.pol.cidr_identities().keys() {
                wanted.insert(prefix.to_string());
            }
        }
        let mut removed = 0;
        for entry in self.datapath.map_dump("ipcache")? {
            let Some(prefix) = entry["prefix"].as_str() else {
                continue;
            };
            if wanted.contains(prefix) {
                continue;
            }
            if let Ok(net) = prefix.parse::<ipnet::IpNet>() {
                self.datapath.remove_ipcache(net)?;
                tracing::warn!(prefix, "removed stale ipcache entry");
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Recomputes the policy of `ids` and installs what changed. Returns how many endpoints
    /// had their maps changed.
    pub(crate) fn regenerate(&self, st: &mut State, ids: &[u32]) -> Result<usize, ManagerError> {
        let rev = st.pol.repo().revision();
        let mut changed = 0;
        for &id in ids {
            let Some(ep) = st.reg.get(id) else { continue };
            if ep.state != EndpointState::Ready {
                continue;
            }
            let policy = st.pol.compute(&from_api_labels(&ep.labels));
            let print = super::fingerprint(&policy);
            if st.installed.get(&id) != Some(&print) {
                let t0 = std::time::Instant::now();
                self.datapath.apply_policy(id, &policy)?;
                tracing::debug!(
                    endpoint_id = id,
                    entries = policy.entries.len(),
                    us = t0.elapsed().as_micros(),
                    "endpoint regenerated"
                );
                st.installed.insert(id, print);
                changed += 1;
            }
            st.reg.set_revision(id, rev);
        }
        self.regenerations
            .fetch_add(changed as u64, Ordering::Relaxed);
        Ok(changed)
    }
}
