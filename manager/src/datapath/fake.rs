//! In-memory [`Datapath`] for unit tests of the rest of the manager: records every call and
//! keeps the state a real datapath would (attached endpoints, policies, ipcache).

use super::types::{DropEvent, EndpointDatapath, MapSummary, SlotFlags};
use super::{Datapath, DatapathError};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use tokio::sync::broadcast;
use weft_policy::mapstate::{EndpointPolicy, PolicyEntry, Verdict};

/// A recorded call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FakeCall {
    /// `attach_endpoint(endpoint_id)`.
    Attach(u32),
    /// `detach_endpoint(endpoint_id)`.
    Detach(u32),
    /// `apply_policy(slot)`.
    ApplyPolicy(u32),
    /// `apply_policy_identities(slot, identities)`.
    ApplyPolicyIdentities(u32, BTreeSet<u32>),
    /// `switch_slot(endpoint_id, slot)`.
    SwitchSlot(u32, u32),
    /// `release_slot(slot)`.
    ReleaseSlot(u32),
    /// `load_slots(slots)`.
    LoadSlots(BTreeSet<u32>),
    /// `begin_read_back()`.
    BeginReadBack,
    /// `upsert_ipcache(prefix, identity)`.
    UpsertIpcache(ipnet::IpNet, u32),
    /// `remove_ipcache(prefix)`.
    RemoveIpcache(ipnet::IpNet),
    /// `reconcile(keep)`.
    Reconcile(BTreeSet<u32>),
    /// `readopt_endpoint(endpoint_id)` that left the endpoint alone (programs reused, entry
    /// unchanged); one that re-attached records [`FakeCall::Attach`].
    ReadoptKept(u32),
    /// `commit_programs()`.
    CommitPrograms,
    /// `lb_upsert(id, frontend, backends)`.
    LbUpsert(u32, weft_api::lb::Frontend, usize),
    /// `lb_remove(id)`.
    LbRemove(u32),
}

#[derive(Default)]
struct State {
    calls: Vec<FakeCall>,
    endpoints: BTreeMap<u32, EndpointDatapath>,
    /// Policy per slot.
    policies: BTreeMap<u32, EndpointPolicy>,
    /// The enforcement and tier flags in each endpoint's kernel entry.
    entry_flags: BTreeMap<u32, SlotFlags>,
    /// What the datapath process knows of each slot's flags: like the real one's, lost with
    /// the process ([`FakeDatapath::reopen`]) except where a member's entry has them.
    slot_flags: BTreeMap<u32, SlotFlags>,
    generations: BTreeMap<u32, u64>,
    ipcache: BTreeMap<ipnet::IpNet, crate::node::ipcache::Value>,
    lb: super::LbTable,
    fail_attach: bool,
    /// Programs reused from pins (a restart with the same object).
    reused: bool,
    /// Programs pinned (reused, or committed).
    committed: bool,
    /// Endpoints whose filters do not run the current programs.
    tampered: BTreeSet<u32>,
}

impl State {
    /// The kernel would keep the slots a wrong `previous` leaves behind: the fake refuses it.
    fn check_lb_previous(&self, call: &str, id: u32, previous: usize) -> Result<(), DatapathError> {
        let had = self.lb.get(&id).map_or(0, |(_, b)| b.len());
        if had == previous {
            return Ok(());
        }
        Err(DatapathError::Invalid(format!(
            "{call}({id}): previous {previous}, the maps hold {had}"
        )))
    }

    /// The flags an entry pointing at `slot` gets: unknown ones are none, as in the kernel.
    fn flags_of(&self, slot: u32) -> SlotFlags {
        self.slot_flags.get(&slot).copied().unwrap_or_default()
    }
}

/// The fake. `FakeDatapath::default()` starts empty.
pub struct FakeDatapath {
    state: Mutex<State>,
    events: broadcast::Sender<DropEvent>,
}

impl Default for FakeDatapath {
    fn default() -> Self {
        Self {
            state: Mutex::default(),
            events: broadcast::channel(64).0,
        }
    }
}

impl FakeDatapath {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Every call so far, in order.
    #[must_use]
    pub fn calls(&self) -> Vec<FakeCall> {
        self.state().calls.clone()
    }

    /// The policy of the slot an attached endpoint points at.
    #[must_use]
    pub fn policy(&self, endpoint_id: u32) -> Option<EndpointPolicy> {
        let s = self.state();
        let slot = s.endpoints.get(&endpoint_id)?.policy_id;
        s.policies.get(&slot).cloned()
    }

    /// The slot an attached endpoint points at.
    #[must_use]
    pub fn slot_of(&self, endpoint_id: u32) -> Option<u32> {
        self.state()
            .endpoints
            .get(&endpoint_id)
            .map(|e| e.policy_id)
    }

    /// Slots that hold a policy.
    #[must_use]
    pub fn slots(&self) -> BTreeSet<u32> {
        self.state().policies.keys().copied().collect()
    }

    /// A new datapath process over the same kernel state (a manager restart): what it knows of
    /// slot flags comes from the endpoints' entries only.
    pub fn reopen(&self) {
        let mut s = self.state();
        let known: BTreeMap<u32, SlotFlags> = s
            .endpoints
            .values()
            .filter_map(|ep| Some((ep.policy_id, *s.entry_flags.get(&ep.endpoint_id)?)))
            .collect();
        s.slot_flags = known;
    }

    /// Overwrites a slot's generation (tests of the restart's trust decision).
    pub fn set_generation(&self, slot: u32, generation: u64) {
        self.state().generations.insert(slot, generation);
    }

    /// Forgets the calls recorded so far.
    pub fn clear_calls(&self) {
        self.state().calls.clear();
    }

    /// Attached endpoints.
    #[must_use]
    pub fn attached(&self) -> Vec<EndpointDatapath> {
        self.state().endpoints.values().cloned().collect()
    }

    /// The ipcache contents.
    #[must_use]
    pub fn ipcache(&self) -> BTreeMap<ipnet::IpNet, u32> {
        self.state()
            .ipcache
            .iter()
            .map(|(p, v)| (*p, v.identity))
            .collect()
    }

    /// Makes the next `attach_endpoint` calls fail (to test undo paths).
    pub fn fail_attach(&self, fail: bool) {
        self.state().fail_attach = fail;
    }

    /// Simulates a restart: `true` as if the programs were reused from their pins (same
    /// object, same maps), `false` as if loaded afresh (not pinned until committed).
    pub fn restart_programs(&self, reused: bool) {
        let mut s = self.state();
        s.reused = reused;
        s.committed = reused;
    }

    /// Whether the programs are pinned (what the next start would reuse).
    #[must_use]
    pub fn programs_committed(&self) -> bool {
        self.state().committed
    }

    /// Makes an endpoint's filters run some other program (until it is attached again).
    pub fn tamper_filter(&self, endpoint_id: u32) {
        self.state().tampered.insert(endpoint_id);
    }

    /// Injects a drop event for subscribers.
    pub fn emit(&self, event: DropEvent) {
        let _ = self.events.send(event);
    }
}

impl Datapath for FakeDatapath {
    fn attach_endpoint(&self, ep: &EndpointDatapath) -> Result<(), DatapathError> {
        let mut s = self.state();
        s.calls.push(FakeCall::Attach(ep.endpoint_id));
        if s.fail_attach {
            return Err(DatapathError::Invalid(format!(
                "fake attach failure for {}",
                ep.host_ifname
            )));
        }
        let flags = s.flags_of(ep.policy_id);
        s.entry_flags.insert(ep.endpoint_id, flags);
        s.endpoints.insert(ep.endpoint_id, ep.clone());
        s.tampered.remove(&ep.endpoint_id);
        Ok(())
    }

    fn readopt_endpoint(&self, ep: &EndpointDatapath) -> Result<bool, DatapathError> {
        {
            let mut s = self.state();
            if s.reused
                && s.endpoints.get(&ep.endpoint_id) == Some(ep)
                && s.entry_flags.get(&ep.endpoint_id) == Some(&s.flags_of(ep.policy_id))
            {
                s.calls.push(FakeCall::ReadoptKept(ep.endpoint_id));
                return Ok(false);
            }
        }
        self.attach_endpoint(ep)?;
        Ok(true)
    }

    fn commit_programs(&self) -> Result<(), DatapathError> {
        let mut s = self.state();
        s.calls.push(FakeCall::CommitPrograms);
        s.committed = true;
        Ok(())
    }

    fn programs(&self) -> &'static str {
        if self.state().reused {
            super::PROGRAMS_REUSED
        } else {
            super::PROGRAMS_LOADED
        }
    }

    fn check_filters(&self, endpoints: &[(u32, String)]) -> Result<Vec<String>, DatapathError> {
        let s = self.state();
        Ok(endpoints
            .iter()
            .filter(|(id, _)| s.tampered.contains(id))
            .map(|(id, ifname)| {
                format!("endpoint {id}: {ifname}: Weft's filter does not run the current programs")
            })
            .collect())
    }

    fn detach_endpoint(&self, ep: &EndpointDatapath) -> Result<(), DatapathError> {
        let mut s = self.state();
        s.calls.push(FakeCall::Detach(ep.endpoint_id));
        s.endpoints.remove(&ep.endpoint_id);
        s.entry_flags.remove(&ep.endpoint_id);
        Ok(())
    }

    fn apply_policy(
        &self,
        slot: u32,
        policy: &EndpointPolicy,
        generation: u64,
    ) -> Result<u64, DatapathError> {
        let mut s = self.state();
        s.calls.push(FakeCall::ApplyPolicy(slot));
        s.policies.insert(slot, policy.clone());
        let flags = SlotFlags::of(policy);
        s.slot_flags.insert(slot, flags);
        let members: Vec<u32> = s
            .endpoints
            .values()
            .filter(|e| e.policy_id == slot)
            .map(|e| e.endpoint_id)
            .collect();
        for ep in members {
            s.entry_flags.insert(ep, flags);
        }
        s.generations.insert(slot, generation);
        Ok(fake_digest(slot, policy))
    }

    fn apply_policy_identities(
        &self,
        slot: u32,
        identities: &BTreeSet<u32>,
        entries: &BTreeMap<PolicyEntry, Verdict>,
        generation: u64,
    ) -> Result<u64, DatapathError> {
        let mut s = self.state();
        s.calls
            .push(FakeCall::ApplyPolicyIdentities(slot, identities.clone()));
        let policy = s.policies.entry(slot).or_default();
        policy
            .entries
            .retain(|e, _| !identities.contains(&e.identity));
        policy.entries.extend(entries.iter().map(|(e, v)| (*e, *v)));
        let print = fake_digest(slot, policy);
        s.generations.insert(slot, generation);
        Ok(print)
    }

    fn switch_slot(&self, endpoint_id: u32, slot: u32) -> Result<(), DatapathError> {
        let mut s = self.state();
        s.calls.push(FakeCall::SwitchSlot(endpoint_id, slot));
        let flags = s.flags_of(slot);
        if let Some(ep) = s.endpoints.get_mut(&endpoint_id) {
            ep.policy_id = slot;
            s.entry_flags.insert(endpoint_id, flags);
        }
        Ok(())
    }

    fn release_slot(&self, slot: u32) -> Result<(), DatapathError> {
        let mut s = self.state();
        s.calls.push(FakeCall::ReleaseSlot(slot));
        s.policies.remove(&slot);
        s.generations.remove(&slot);
        s.slot_flags.remove(&slot);
        Ok(())
    }

    fn end_policy_writes(&self) -> Result<(), DatapathError> {
        Ok(())
    }

    fn restore_slot_flags(&self, slot: u32, flags: SlotFlags) {
        self.state().slot_flags.entry(slot).or_insert(flags);
    }

    fn slot_generations(&self) -> Result<BTreeMap<u32, u64>, DatapathError> {
        Ok(self.state().generations.clone())
    }

    fn load_slots(&self, slots: &BTreeSet<u32>) -> Result<(), DatapathError> {
        self.state().calls.push(FakeCall::LoadSlots(slots.clone()));
        Ok(())
    }

    fn begin_read_back(&self) -> Result<(), DatapathError> {
        self.state().calls.push(FakeCall::BeginReadBack);
        Ok(())
    }

    fn upsert_ipcache(
        &self,
        prefix: ipnet::IpNet,
        value: crate::node::ipcache::Value,
    ) -> Result<(), DatapathError> {
        let mut s = self.state();
        s.calls
            .push(FakeCall::UpsertIpcache(prefix, value.identity));
        s.ipcache.insert(prefix, value);
        Ok(())
    }

    fn ipcache_entries(
        &self,
    ) -> Result<BTreeMap<ipnet::IpNet, crate::node::ipcache::Value>, DatapathError> {
        Ok(self.state().ipcache.clone())
    }

    fn remove_ipcache(&self, prefix: ipnet::IpNet) -> Result<(), DatapathError> {
        let mut s = self.state();
        s.calls.push(FakeCall::RemoveIpcache(prefix));
        s.ipcache.remove(&prefix);
        Ok(())
    }

    fn lb_upsert(
        &self,
        id: u32,
        frontend: &weft_api::lb::Frontend,
        backends: &[weft_api::lb::Backend],
        previous: usize,
    ) -> Result<(), DatapathError> {
        let mut s = self.state();
        s.check_lb_previous("lb_upsert", id, previous)?;
        s.calls
            .push(FakeCall::LbUpsert(id, *frontend, backends.len()));
        s.lb.insert(id, (*frontend, backends.to_vec()));
        Ok(())
    }

    fn lb_remove(
        &self,
        id: u32,
        _frontend: &weft_api::lb::Frontend,
        previous: usize,
    ) -> Result<(), DatapathError> {
        let mut s = self.state();
        s.check_lb_previous("lb_remove", id, previous)?;
        s.calls.push(FakeCall::LbRemove(id));
        s.lb.remove(&id);
        Ok(())
    }

    fn lb_frontends(&self) -> Result<super::LbTable, DatapathError> {
        Ok(self.state().lb.clone())
    }

    fn kernel_state(&self) -> Result<super::KernelState, DatapathError> {
        let s = self.state();
        let endpoints = s
            .endpoints
            .values()
            .map(|ep| {
                let flags = s
                    .entry_flags
                    .get(&ep.endpoint_id)
                    .copied()
                    .unwrap_or_default();
                (
                    ep.endpoint_id,
                    super::KernelEndpoint {
                        ifindex: ep.host_ifindex,
                        identity: ep.identity,
                        policy_id: ep.policy_id,
                        ingress_enforced: flags.ingress_enforced,
                        egress_enforced: flags.egress_enforced,
                        tiers: flags.tiers,
                        mac: ep.pod_mac,
                        ips: ep.ips.clone(),
                    },
                )
            })
            .collect();
        let policy = s
            .policies
            .iter()
            .map(|(id, p)| (*id, super::encode_policy(*id, p)))
            .collect();
        Ok(super::KernelState {
            endpoints,
            policy,
            generations: s.generations.clone(),
            ipcache: s.ipcache.clone(),
        })
    }

    fn endpoint_ids(&self) -> Result<BTreeSet<u32>, DatapathError> {
        Ok(self.state().endpoints.keys().copied().collect())
    }

    fn endpoint_slots(&self) -> Result<BTreeMap<u32, u32>, DatapathError> {
        Ok(self
            .state()
            .endpoints
            .values()
            .map(|e| (e.endpoint_id, e.policy_id))
            .collect())
    }

    fn reconcile(&self, keep: &BTreeSet<u32>) -> Result<BTreeSet<u32>, DatapathError> {
        let mut s = self.state();
        s.calls.push(FakeCall::Reconcile(keep.clone()));
        let stale: BTreeSet<u32> = s
            .endpoints
            .keys()
            .filter(|id| !keep.contains(id))
            .copied()
            .collect();
        for id in &stale {
            s.endpoints.remove(id);
            s.entry_flags.remove(id);
        }
        Ok(stale)
    }

    fn map_list(&self) -> Vec<MapSummary> {
        let s = self.state();
        let summary = |name: &str, map_type: &str, entries: usize| MapSummary {
            name: name.into(),
            map_type: map_type.into(),
            entries: entries as u64,
            max_entries: 0,
        };
        vec![
            summary("endpoints", "Hash", s.endpoints.len()),
            summary("ipcache", "LpmTrie", s.ipcache.len()),
            summary(
                "policy",
                "LpmTrie",
                s.policies.values().map(|p| p.entries.len()).sum(),
            ),
        ]
    }

    fn map_dump(&self, name: &str) -> Result<Vec<serde_json::Value>, DatapathError> {
        let s = self.state();
        match name {
            "endpoints" => Ok(s.endpoints.values().map(|e| serde_json::json!(e)).collect()),
            "ipcache" => Ok(s
                .ipcache
                .iter()
                .map(|(p, v)| {
                    serde_json::json!({
                        "prefix": p.to_string(),
                        "identity": v.identity,
                        "cidr_identity": v.cidr_identity,
                    })
                })
                .collect()),
            "policy" => Ok(s
                .policies
                .iter()
                .map(|(id, p)| serde_json::json!({"policy_id": id, "policy": p}))
                .collect()),
            other => Err(DatapathError::UnknownMap(other.into())),
        }
    }

    fn subscribe_events(&self) -> broadcast::Receiver<DropEvent> {
        self.events.subscribe()
    }
}

fn fake_digest(_slot: u32, policy: &EndpointPolicy) -> u64 {
    super::policy_digest(policy)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(id: u32) -> EndpointDatapath {
        EndpointDatapath {
            endpoint_id: id,
            identity: 300,
            policy_id: id,
            host_ifindex: 10 + id,
            host_ifname: format!("weft{id}"),
            ips: vec!["10.0.0.5".parse().unwrap()],
            pod_mac: [2, 0, 0, 0, 0, 1],
        }
    }

    #[test]
    fn records_calls_and_reconciles() {
        // The manager holds it as a trait object.
        let fake: std::sync::Arc<FakeDatapath> = std::sync::Arc::default();
        let _as_dyn: std::sync::Arc<dyn Datapath> = fake.clone();
        fake.attach_endpoint(&ep(1)).unwrap();
        fake.attach_endpoint(&ep(2)).unwrap();
        fake.apply_policy(2, &EndpointPolicy::default(), 1).unwrap();
        assert!(fake.policy(2).is_some());
        let removed = fake.reconcile(&BTreeSet::from([1])).unwrap();
        assert_eq!(removed, BTreeSet::from([2]));
        assert_eq!(fake.endpoint_ids().unwrap(), BTreeSet::from([1]));
        assert!(fake.policy(2).is_none());
        fake.fail_attach(true);
        assert!(fake.attach_endpoint(&ep(3)).is_err());
        assert_eq!(
            fake.calls()[..3],
            [
                FakeCall::Attach(1),
                FakeCall::Attach(2),
                FakeCall::ApplyPolicy(2)
            ]
        );
    }
}
