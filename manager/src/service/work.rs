//! What a change means per policy slot: which slots an identity or repository change touches
//! and what each needs (new entries for the changed identities, or a whole recomputation),
//! computed once per distinct label set, on both cores. Pure reads of the state; `regen`
//! applies the result.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use weft_api::EndpointState;
use weft_policy::compute::{
    EnforcementCounts, compute_identities, compute_restricted, has_wildcard_peer,
};
use weft_policy::labels::LabelSet;
use weft_policy::mapstate::{Identity, PolicyEntry, Verdict, reserved};
use weft_policy::repository::RepoChange;
use weft_policy::rule::{NamedPorts, Rule};

use super::{Manager, State, from_api_labels};
use crate::policy_state::Effects;

/// One ready endpoint of every slot (not in `skip`): the labels and named ports its policy is
/// computed from.
pub(super) fn slot_representatives<'a>(
    m: &Manager,
    st: &'a State,
    skip: &BTreeSet<u32>,
) -> BTreeMap<u32, (&'a weft_api::Endpoint, NamedPorts)> {
    let mut out = BTreeMap::new();
    for ep in st.reg.list() {
        if ep.state != EndpointState::Ready {
            continue;
        }
        let Some(slot) = st.slots.slot_of(ep.id) else {
            continue;
        };
        if skip.contains(&slot) || out.contains_key(&slot) {
            continue;
        }
        out.insert(slot, (ep, m.named_ports(ep)));
    }
    out
}

/// Which slots (not in `skip`) an identity change touches, and what each needs.
/// Computed once
/// per distinct label set, from only the rules that can matter: those using a changed selector
/// (the only ones whose peers can match a changed identity) and those with a wildcard peer
/// (whose denies carve every identity's allows).
pub(super) fn identity_work(
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
    let mut work = Vec::new();
    for (slot, (ep, named)) in slot_representatives(m, st, skip) {
        let labels = from_api_labels(&ep.labels);
        let update = (|| {
            let labels = &labels;
            let named = &named;
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
        })();
        if let Some(update) = update {
            work.push((slot, update));
        }
    }
    work
}

/// `f` of every item, in order; the second half on another thread. Each selected slot's
/// computation matches every rule's selector and expands the rules that select it: pure
/// work that the node's two cores halve (docs/BENCHMARKS.md, "one-rule change").
pub(super) fn on_two_cores<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    if items.len() < 2 {
        return items.iter().map(&f).collect();
    }
    let (first, second) = items.split_at(items.len() / 2);
    std::thread::scope(|s| {
        let other = s.spawn(|| second.iter().map(&f).collect::<Vec<R>>());
        let mut out: Vec<R> = first.iter().map(&f).collect();
        out.extend(
            other
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
        );
        out
    })
}

/// What a change means for one endpoint.
#[derive(Clone)]
pub(super) enum Update {
    /// Recompute and install its whole policy.
    Whole,
    /// Replace the entries of the change's identities with these.
    Identities(Arc<BTreeMap<PolicyEntry, Verdict>>),
}

/// The identities a repository change touches, and the slots its rules select with
/// what each needs: the new entries of those identities, or a whole recomputation when a
/// changed rule has a wildcard peer (identity 0 carves every identity), or the change moves
/// the endpoint's enforcement (flags, allow-all, allow-from-host). Computed once per distinct
/// label set.
pub(super) fn change_work(
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
    let selected: Vec<(u32, LabelSet, NamedPorts)> = slot_representatives(m, st, &BTreeSet::new())
        .into_iter()
        .filter_map(|(slot, (ep, named))| {
            let labels = from_api_labels(&ep.labels);
            change.selects(&labels).then_some((slot, labels, named))
        })
        .collect();
    let (repo, cache, options) = (st.pol.repo(), st.pol.cache(), st.pol.options());
    let identities_ref = &identities;
    let update = |(_, labels, named): &(u32, LabelSet, NamedPorts)| {
        if !sliceable {
            return Update::Whole;
        }
        let selecting: Vec<&Rule> = repo.selecting(labels).collect();
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
            return Update::Whole;
        }
        let policy = compute_restricted(&selecting, named, cache, options, identities_ref);
        Update::Identities(Arc::new(policy.entries))
    };
    let updates = on_two_cores(&selected, update);
    let work = selected
        .iter()
        .map(|(slot, ..)| *slot)
        .zip(updates)
        .collect();
    (identities, work)
}
