//! Selective, incremental regeneration (DESIGN §4). Only endpoints whose selected rules or peer
//! identity sets changed are touched, and within them, where the change allows, only the entries
//! of the peer identities it concerns (a new or freed identity; the peers of an edited rule).
//! Everything reaches the datapath as a map diff. Why restricting to identities is exact:
//! docs/POLICY.md, "How the manager drives it".

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use weft_api::EndpointState;
use weft_policy::compute::{
    EnforcementCounts, compute_identities, compute_restricted, has_wildcard_peer,
};
use weft_policy::labels::LabelSet;
use weft_policy::mapstate::{EndpointPolicy, Identity, PolicyEntry, Verdict, reserved};
use weft_policy::repository::RepoChange;
use weft_policy::rule::{NamedPorts, Rule};

use super::{Manager, ManagerError, State, from_api_labels};
use crate::ipcache::Source;
use crate::policy_state::Effects;

impl Manager {
    /// Updates the endpoints an identity change affects (`effects`: identities that entered or
    /// left some selectors): in every ready endpoint with a rule using one of those selectors,
    /// only the entries of those identities are recomputed and replaced.
    pub(crate) fn regenerate_users(
        &self,
        st: &mut State,
        effects: &Effects,
    ) -> Result<usize, ManagerError> {
        self.regenerate_identities(st, effects, &BTreeSet::new())
    }

    /// Regenerates the endpoints a repository change can affect. Those an added or removed rule
    /// selects get the entries of the identities the changed rules' peers resolve to, or, when
    /// the change also moves their enforcement (or has a wildcard peer), a full recomputation;
    /// those merely using a selector whose identities changed (a CIDR identity came or went) get
    /// those identities' entries. Every ready endpoint then records the new revision (an
    /// unaffected endpoint enforces it already).
    pub(crate) fn regenerate_for_change(
        &self,
        st: &mut State,
        change: &RepoChange,
        effects: &Effects,
    ) -> Result<usize, ManagerError> {
        let (identities, work) = change_work(self, st, change, effects);
        let done: BTreeSet<u32> = work.iter().map(|(id, _)| *id).collect();
        let n = self.apply_work(st, &identities, work)?
            + self.regenerate_identities(st, effects, &done)?;
        let rev = st.pol.repo().revision();
        let ready: Vec<u32> = st
            .reg
            .list()
            .filter(|ep| ep.state == EndpointState::Ready)
            .map(|ep| ep.id)
            .collect();
        for id in ready {
            st.reg.set_revision(id, rev);
        }
        Ok(n)
    }

    /// See [`Self::regenerate_users`]; endpoints in `skip` are left alone (the caller
    /// has regenerated them).
    fn regenerate_identities(
        &self,
        st: &mut State,
        effects: &Effects,
        skip: &BTreeSet<u32>,
    ) -> Result<usize, ManagerError> {
        if effects.changed.is_empty() {
            return Ok(0);
        }
        let work = identity_work(self, st, effects, skip);
        self.apply_work(st, &effects.identities, work)
    }

    /// Installs per-endpoint work: the new entries of `identities` where given, a full
    /// regeneration where not. Returns how many endpoints were updated.
    fn apply_work(
        &self,
        st: &mut State,
        identities: &BTreeSet<Identity>,
        work: Vec<(u32, Update)>,
    ) -> Result<usize, ManagerError> {
        let mut full = Vec::new();
        let mut n = 0;
        for (id, update) in work {
            match update {
                Update::Whole => full.push(id),
                Update::Identities(entries) => {
                    self.apply_identities(st, id, identities, &entries)?;
                    n += 1;
                }
            }
        }
        Ok(n + self.regenerate(st, &full)?)
    }

    /// Replaces the entries of `identities` in an endpoint's maps.
    fn apply_identities(
        &self,
        st: &mut State,
        id: u32,
        identities: &BTreeSet<Identity>,
        entries: &BTreeMap<PolicyEntry, Verdict>,
    ) -> Result<(), ManagerError> {
        // The fingerprint describes the whole old policy: once the maps may have changed, a
        // later full regeneration must not skip this endpoint because its policy matches it.
        st.installed.remove(&id);
        let t0 = std::time::Instant::now();
        self.datapath
            .apply_policy_identities(id, identities, entries)
            .inspect_err(|_| self.prom.regeneration_failed())?;
        self.prom.regenerated(t0.elapsed());
        tracing::debug!(
            endpoint_id = id,
            identities = identities.len(),
            entries = entries.len(),
            us = t0.elapsed().as_micros(),
            "endpoint regenerated (changed identities)"
        );
        self.regenerations.fetch_add(1, Ordering::Relaxed);
        Ok(())
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
    /// The repository's CIDR identities enter the ipcache after the policies that know them.
    pub fn regenerate_all(&self) -> Result<usize, ManagerError> {
        let n = {
            let mut st = self.state();
            let ids: Vec<u32> = st.reg.list().map(|ep| ep.id).collect();
            let n = self.regenerate(&mut st, &ids)?;
            let cidrs = st.pol.cidr_identities();
            st.ipcache.replace_source(&Source::Cidr, &cidrs);
            self.flush_ipcache(&mut st)?;
            n
        };
        super::release_freed_memory();
        Ok(n)
    }

    /// Makes the kernel's ipcache exactly what its owners want: reads the map back, then
    /// rewrites wrong entries in place and removes those nothing owns any more (addresses of
    /// pods that died while the manager was down, CIDR identities no rule references).
    /// Returns how many entries were written or removed.
    pub fn reconcile_ipcache(&self) -> Result<usize, ManagerError> {
        let kernel = self.datapath.ipcache_entries()?;
        let mut st = self.state();
        // Kvstore mode before the first listing (etcd down at start): an address nothing here
        // owns may be a remote pod's. It stays until the listing says (`Remote::listed`);
        // checked under the lock the listing's callback takes, so it cannot slip in between.
        if self.cluster().is_some_and(|c| !c.synced()) {
            let unowned: BTreeMap<ipnet::IpNet, Identity> = kernel
                .iter()
                .filter(|(p, _)| p.prefix_len() == p.max_prefix_len())
                .filter(|(p, _)| st.ipcache.winner(p).is_none())
                .map(|(p, v)| (*p, v.identity))
                .collect();
            if !unowned.is_empty() {
                tracing::info!(
                    entries = unowned.len(),
                    "kvstore not listed yet: keeping unowned host entries until it is"
                );
            }
            st.ipcache
                .replace_source(&Source::restored_remote(), &unowned);
        }
        st.ipcache.set_written(kernel);
        let writes = st.ipcache.clone().pending();
        for w in &writes {
            if let crate::ipcache::Write::Remove(prefix) = w {
                tracing::warn!(%prefix, "removing stale ipcache entry");
            }
        }
        self.flush_ipcache(&mut st)?;
        Ok(writes.len())
    }

    /// Recomputes the policy of `ids` and installs what changed. Returns how many endpoints
    /// had their maps changed.
    pub(crate) fn regenerate(&self, st: &mut State, ids: &[u32]) -> Result<usize, ManagerError> {
        let rev = st.pol.repo().revision();
        let mut changed = 0;
        // Endpoints with the same labels (replicas) have the same policy: compute it once.
        // Named ports are part of the key: replicas share them, other pods may not.
        let mut computed: HashMap<(LabelSet, NamedPorts), Arc<(EndpointPolicy, u64)>> =
            HashMap::new();
        for &id in ids {
            let Some(ep) = st.reg.get(id) else { continue };
            if ep.state != EndpointState::Ready {
                continue;
            }
            let result = computed
                .entry((from_api_labels(&ep.labels), self.named_ports(ep)))
                .or_insert_with_key(|(labels, named)| {
                    let policy = st.pol.compute(labels, named);
                    let print = super::fingerprint(&policy);
                    Arc::new((policy, print))
                })
                .clone();
            let (policy, print) = (&result.0, result.1);
            if st.installed.get(&id) != Some(&print) {
                // Forgotten first: a write that fails half-way leaves maps matching neither.
                st.installed.remove(&id);
                let t0 = std::time::Instant::now();
                self.datapath
                    .apply_policy(id, policy)
                    .inspect_err(|_| self.prom.regeneration_failed())?;
                self.prom.regenerated(t0.elapsed());
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

/// Which ready endpoints (not in `skip`) an identity change touches, and what each needs.
/// Computed once
/// per distinct label set, from only the rules that can matter: those using a changed selector
/// (the only ones whose peers can match a changed identity) and those with a wildcard peer
/// (whose denies carve every identity's allows).
fn identity_work(
    m: &Manager,
    st: &State,
    effects: &Effects,
    skip: &BTreeSet<u32>,
) -> Vec<(u32, Update)> {
    let candidates: Vec<(&Rule, bool)> = st
        .pol
        .repo()
        .rules()
        .iter()
        .filter_map(|r| {
            let uses = r.peers().any(|p| effects.changed.contains(p));
            (uses || has_wildcard_peer(r)).then_some((r, uses))
        })
        .collect();
    let mut by_labels: HashMap<(LabelSet, NamedPorts), Option<Update>> = HashMap::new();
    let mut work = Vec::new();
    for ep in st.reg.list() {
        if ep.state != EndpointState::Ready || skip.contains(&ep.id) {
            continue;
        }
        let update = by_labels
            .entry((from_api_labels(&ep.labels), m.named_ports(ep)))
            .or_insert_with_key(|(labels, named)| {
                let relevant: Vec<(&Rule, bool)> = candidates
                    .iter()
                    .copied()
                    .filter(|(r, _)| r.endpoint_selector.matches(labels))
                    .collect();
                if !relevant.iter().any(|(_, uses)| *uses) {
                    return None; // no rule of this endpoint uses a changed selector
                }
                let rules: Vec<&Rule> = relevant.iter().map(|(r, _)| *r).collect();
                let entries = (!effects.identities.is_empty())
                    .then(|| {
                        compute_identities(
                            &rules,
                            named,
                            st.pol.cache(),
                            st.pol.options(),
                            &effects.identities,
                        )
                    })
                    .flatten();
                Some(entries.map_or(Update::Whole, |e| Update::Identities(Arc::new(e))))
            });
        if let Some(update) = update {
            work.push((ep.id, update.clone()));
        }
    }
    work
}

/// What a change means for one endpoint.
#[derive(Clone)]
enum Update {
    /// Recompute and install its whole policy.
    Whole,
    /// Replace the entries of the change's identities with these.
    Identities(Arc<BTreeMap<PolicyEntry, Verdict>>),
}

/// The identities a repository change touches, and the ready endpoints its rules select with
/// what each needs: the new entries of those identities, or a whole recomputation when a
/// changed rule has a wildcard peer (identity 0 carves every identity), or the change moves
/// the endpoint's enforcement (flags, allow-all, allow-from-host). Computed once per distinct
/// label set.
fn change_work(
    m: &Manager,
    st: &State,
    change: &RepoChange,
    effects: &Effects,
) -> (BTreeSet<Identity>, Vec<(u32, Update)>) {
    let changed: Vec<&Rule> = change.added.iter().chain(&change.removed).collect();
    let sliceable = !changed.iter().any(|r| has_wildcard_peer(r));
    // Removed rules' selectors may no longer be tracked: the cache resolves them on the fly.
    // CIDR identities that just went are in no selector any more, hence `effects`.
    let mut identities = effects.identities.clone();
    if sliceable {
        for p in changed.iter().flat_map(|r| r.peers()) {
            let ids = st.pol.cache().identities(p);
            identities.extend(ids.iter());
            // An ipBlock's by-IP twins (weft_policy::compute) change with it.
            if matches!(p, weft_policy::rule::PeerSelector::Cidr(c) if c.match_pods) {
                identities.extend(
                    ids.iter()
                        .filter(|&&id| id >= reserved::FIRST_CIDR)
                        .map(|&id| reserved::by_ip(id)),
                );
            }
        }
    }
    let mut by_labels: HashMap<(LabelSet, NamedPorts), Option<Update>> = HashMap::new();
    let mut work = Vec::new();
    for ep in st.reg.list() {
        if ep.state != EndpointState::Ready {
            continue;
        }
        let update = by_labels
            .entry((from_api_labels(&ep.labels), m.named_ports(ep)))
            .or_insert_with_key(|(labels, named)| {
                if !change.selects(labels) {
                    return None;
                }
                if !sliceable {
                    return Some(Update::Whole);
                }
                let selecting: Vec<&Rule> = st.pol.repo().selecting(labels).collect();
                let mut now = EnforcementCounts::default();
                for r in &selecting {
                    now.add(r, 1);
                }
                let mut before = now;
                for r in change
                    .added
                    .iter()
                    .filter(|r| r.endpoint_selector.matches(labels))
                {
                    before.add(r, -1);
                }
                for r in change
                    .removed
                    .iter()
                    .filter(|r| r.endpoint_selector.matches(labels))
                {
                    before.add(r, 1);
                }
                if before.shape() != now.shape() {
                    return Some(Update::Whole);
                }
                let policy = compute_restricted(
                    &selecting,
                    named,
                    st.pol.cache(),
                    st.pol.options(),
                    &identities,
                );
                Some(Update::Identities(Arc::new(policy.entries)))
            });
        if let Some(update) = update {
            work.push((ep.id, update.clone()));
        }
    }
    (identities, work)
}
