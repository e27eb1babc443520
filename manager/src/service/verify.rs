//! `weftctl map verify`: the kernel maps against a from-scratch computation of the control
//! plane's state. Everything the manager maintains incrementally (selector cache, per-identity
//! regeneration, ipcache owners, the datapath's mirrors) is bypassed: the expected maps are
//! computed anew from the registry, the identities and the repository, and the actual ones are
//! read from the kernel. The model-based test (scripts/e2e/model.sh) runs it after every step.

use std::collections::{BTreeMap, BTreeSet};
use weft_api::{EndpointState, VerifyReport};
use weft_policy::compute::compute_with_ports;
use weft_policy::labels::LabelSet;
use weft_policy::mapstate::{EndpointPolicy, Identity};
use weft_policy::rule::NamedPorts;

use super::{Manager, ManagerError, State, from_api_labels, initial_ipcache};
use crate::datapath::{KernelState, encode_policy};
use crate::node::ipcache::Source;
use crate::policy_state::PortOwner;

const MAX_DETAILS: usize = 3;

impl Manager {
    /// Compares every kernel map with what the control plane's state implies.
    pub fn verify(&self) -> Result<VerifyReport, ManagerError> {
        // Under the state lock: no operation changes maps while they are read.
        let st = self.state();
        let kernel = self.datapath.kernel_state()?;
        let mut r = VerifyReport::default();

        let referenced = st.pol.repo().cidr_prefixes();
        let held: BTreeSet<_> = st.pol.cidr_identities().into_keys().collect();
        if referenced != held {
            r.problems.push(format!(
                "CIDR identities held {held:?} differ from the prefixes the rules use {referenced:?}"
            ));
        }
        // An endpoint being torn down (veth deletion outside the lock) may or may not still be
        // in the maps.
        let deleting: BTreeSet<u32> = st
            .reg
            .list()
            .filter(|ep| ep.state == EndpointState::Deleting)
            .map(|ep| ep.id)
            .collect();
        let named = |ep: &weft_api::Endpoint| self.named_ports(ep);
        check_endpoints(&st, &kernel, &deleting, &named, &mut r);
        self.check_peer_ports(&st, &named, &mut r);
        check_ipcache(&st, &kernel, &deleting, &mut r);
        // Restarts leave filters alone when the programs are reused: a filter changed behind
        // Weft's back (tc filter del/replace) is found here.
        let veths: Vec<(u32, String)> = st
            .reg
            .list()
            .filter(|ep| ep.state == EndpointState::Ready)
            .filter_map(|ep| super::datapath_view(ep).map(|v| (ep.id, v.host_ifname)))
            .collect();
        r.problems.extend(self.datapath.check_filters(&veths)?);
        r.consistent = r.problems.is_empty();
        Ok(r)
    }
}

impl Manager {
    /// The named ports egress rules resolve against are those of this node's ready pods as
    /// they are now. (Other nodes' arrive through the kvstore watcher, which updates its own
    /// record of them before it takes the state lock: comparing them here could race.)
    fn check_peer_ports(
        &self,
        st: &State,
        named: &dyn Fn(&weft_api::Endpoint) -> NamedPorts,
        r: &mut VerifyReport,
    ) {
        // A pod the watch no longer has (deleted before its CNI DEL) keeps the ports it had
        // until its endpoint goes: not compared.
        let gone = |ep: &weft_api::Endpoint| match (
            self.k8s_cache(),
            ep.pod_namespace.as_deref(),
            ep.pod_name.as_deref(),
        ) {
            (Some(c), Some(ns), Some(name)) => c.named_ports(ns, name).is_none(),
            _ => false,
        };
        let compared: BTreeSet<u32> = st
            .reg
            .list()
            .filter(|ep| ep.state == EndpointState::Ready && !gone(ep))
            .map(|ep| ep.id)
            .collect();
        let want: BTreeMap<PortOwner, (Identity, NamedPorts)> = st
            .reg
            .list()
            .filter(|ep| compared.contains(&ep.id))
            .map(|ep| (PortOwner::Local(ep.id), (ep.identity, named(ep))))
            .filter(|(_, (_, ports))| !ports.is_empty())
            .collect();
        let got: BTreeMap<PortOwner, (Identity, NamedPorts)> = st
            .pol
            .peer_port_owners()
            .filter(|(o, _, _)| match o {
                PortOwner::Local(id) => {
                    compared.contains(id) || st.reg.get(*id).is_none_or(|ep| !gone(ep))
                }
                PortOwner::Remote { .. } => false,
            })
            .map(|(o, id, p)| (o.clone(), (id, p.clone())))
            .collect();
        if want != got {
            let differ: Vec<&PortOwner> = want
                .keys()
                .chain(got.keys())
                .filter(|o| want.get(*o) != got.get(*o))
                .take(MAX_DETAILS)
                .collect();
            r.problems.push(format!(
                "named ports of peer pods differ from the pods' own (e.g. {differ:?})"
            ));
        }
    }
}

/// The `endpoints`, `policy` and `policy_gen` maps: one entry per Ready endpoint, pointing at a slot
/// that holds exactly a fresh computation of the endpoint's policy and whose last write
/// completed; no entries of unknown endpoints, no slot nobody points at.
///
/// `named`: an endpoint's own named ports (ingress rules' names resolve against them).
fn check_endpoints(
    st: &State,
    kernel: &KernelState,
    deleting: &BTreeSet<u32>,
    named: &dyn Fn(&weft_api::Endpoint) -> NamedPorts,
    r: &mut VerifyReport,
) {
    let cache = st.pol.fresh_cache();
    let mut ready = BTreeSet::new();
    let mut policies: BTreeMap<(LabelSet, NamedPorts), EndpointPolicy> = BTreeMap::new();
    // (slot, labels, named ports) already compared: replicas share them.
    let mut compared: BTreeSet<(u32, LabelSet, NamedPorts)> = BTreeSet::new();
    for ep in st.reg.list().filter(|ep| ep.state == EndpointState::Ready) {
        ready.insert(ep.id);
        let labels = from_api_labels(&ep.labels);
        let ports = named(ep);
        let policy = policies
            .entry((labels.clone(), ports.clone()))
            .or_insert_with(|| {
                compute_with_ports(&labels, &ports, st.pol.repo(), &cache, st.pol.options())
            });
        let Some(k) = kernel.endpoints.get(&ep.id) else {
            r.problems
                .push(format!("endpoint {}: no endpoints map entry", ep.id));
            continue;
        };
        let ips: Vec<_> = ep.ips.iter().map(|i| i.address).collect();
        let agrees = Some(k.ifindex) == ep.host_ifindex
            && k.identity == ep.identity
            && (k.ingress_enforced, k.egress_enforced)
                == (policy.ingress_enforced, policy.egress_enforced)
            && k.tiers == policy.tiers
            && k.ips.iter().all(|ip| ips.contains(ip));
        if !agrees {
            r.problems.push(format!(
                "endpoint {}: endpoints entry {k:?} disagrees (identity {}, ifindex {:?}, enforced in/eg {}/{}, tiers {:?}, ips {ips:?})",
                ep.id,
                ep.identity,
                ep.host_ifindex,
                policy.ingress_enforced,
                policy.egress_enforced,
                policy.tiers
            ));
        }
        let slot = k.policy_id;
        if st.slots.slot_of(ep.id) != Some(slot) {
            r.problems.push(format!(
                "endpoint {}: the kernel points it at slot {slot}, the manager's table at {:?}",
                ep.id,
                st.slots.slot_of(ep.id)
            ));
        }
        match kernel.generations.get(&slot) {
            Some(0) => r.problems.push(format!(
                "slot {slot}: a write did not complete (generation 0)"
            )),
            None => r.problems.push(format!("slot {slot}: no policy_gen entry")),
            Some(_) => {}
        }
        if !compared.insert((slot, labels, ports)) {
            continue;
        }
        let want = encode_policy(slot, policy);
        r.policy_entries += want.len();
        let got = kernel.policy.get(&slot).cloned().unwrap_or_default();
        if got != want {
            let missing: Vec<_> = want.iter().filter(|(b, v)| got.get(b) != Some(v)).collect();
            let extra: Vec<_> = got.iter().filter(|(b, v)| want.get(b) != Some(v)).collect();
            r.problems.push(format!(
                "endpoint {} (slot {slot}): policy map has {} blocks, a fresh computation {}; {} missing or different (e.g. {:?}), {} extra (e.g. {:?})",
                ep.id,
                got.len(),
                want.len(),
                missing.len(),
                missing.iter().take(MAX_DETAILS).collect::<Vec<_>>(),
                extra.len(),
                extra.iter().take(MAX_DETAILS).collect::<Vec<_>>(),
            ));
        }
    }
    let known = |id: &u32| ready.contains(id) || deleting.contains(id);
    for id in kernel.endpoints.keys().filter(|id| !known(id)) {
        r.problems.push(format!(
            "endpoints map has an entry for unknown endpoint {id}"
        ));
    }
    let used: BTreeSet<u32> = kernel.endpoints.values().map(|k| k.policy_id).collect();
    for slot in kernel
        .policy
        .keys()
        .chain(kernel.generations.keys())
        .filter(|s| !used.contains(s))
        // Kept idle for the next pod of its identity (grace period): nobody looks it up.
        .filter(|s| !st.slots.is_idle(**s))
        .collect::<BTreeSet<_>>()
    {
        r.problems.push(format!(
            "policy slot {slot} is in the maps but no endpoint uses it"
        ));
    }
    r.endpoints = ready.len();
    r.slots = used.len();
}

/// The ipcache: exactly the winners of a fresh owner table (registry, repository, and the
/// remote nodes' entries as held).
fn check_ipcache(st: &State, kernel: &KernelState, deleting: &BTreeSet<u32>, r: &mut VerifyReport) {
    let mut fresh = initial_ipcache(&st.reg, &st.pol);
    for (node, entries) in remote_sources(&st.ipcache) {
        fresh.replace_source(&Source::RemoteEndpoint(node), &entries);
    }
    let skip: BTreeSet<ipnet::IpNet> = st
        .reg
        .list()
        .filter(|ep| deleting.contains(&ep.id))
        .flat_map(|ep| ep.ips.iter().map(|i| ipnet::IpNet::from(i.address)))
        .collect();
    let want = fresh.desired();
    for (prefix, v) in want.iter().filter(|(p, _)| !skip.contains(p)) {
        match kernel.ipcache.get(prefix) {
            Some(k) if k == v => {}
            other => r.problems.push(format!(
                "ipcache {prefix}: kernel {other:?}, expected {v:?}"
            )),
        }
    }
    for prefix in kernel.ipcache.keys() {
        if !want.contains_key(prefix) && !skip.contains(prefix) {
            r.problems
                .push(format!("ipcache {prefix}: in the kernel, wanted by nobody"));
        }
    }
    r.ipcache_entries = want.len();
}

/// The remote nodes' entries as the ipcache owners hold them (the cluster store's view: there
/// is no other copy to recompute them from).
fn remote_sources(
    c: &crate::node::ipcache::Ipcache,
) -> BTreeMap<String, BTreeMap<ipnet::IpNet, u32>> {
    let mut out: BTreeMap<String, BTreeMap<ipnet::IpNet, u32>> = BTreeMap::new();
    for (prefix, source, identity) in c.all_owners() {
        if let Source::RemoteEndpoint(node) = source {
            out.entry(node.clone())
                .or_default()
                .insert(prefix, identity);
        }
    }
    out
}
