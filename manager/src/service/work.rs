//! What a change means per policy slot: which slots an identity or repository change touches
//! (the targets) and what each needs (new entries for the changed identities, or a whole
//! recomputation), computed once per distinct label set. Pure reads of the state; `regen`
//! applies the results as [`super::pipeline::pipelined`] hands them over.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use weft_api::EndpointState;
use weft_policy::compute::{
    EnforcementCounts, compute_identities, compute_restricted, has_wildcard_peer,
};
use weft_policy::identity::IdentityKey;
use weft_policy::labels::LabelSet;
use weft_policy::mapstate::{Identity, PolicyEntry, Verdict, reserved};
use weft_policy::repository::RepoChange;
use weft_policy::rule::{NamedPorts, Rule};

use super::{Manager, State, from_api_labels};
use crate::policy_state::{Effects, PolicyState};

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

/// A slot to compute: its id and the labels and named ports of one of its ready endpoints.
pub(super) type Target = (u32, LabelSet, NamedPorts);

/// Every slot with a ready endpoint (not in `skip`), as a [`Target`].
pub(super) fn slot_targets(m: &Manager, st: &State, skip: &BTreeSet<u32>) -> Vec<Target> {
    slot_representatives(m, st, skip)
        .into_iter()
        .map(|(slot, (ep, named))| (slot, from_api_labels(&ep.labels), named))
        .collect()
}

/// What an identity change means for a target: `None` when none of its rules uses a changed
/// selector. Computed from only the rules that can matter: those using a changed selector (the
/// only ones whose peers can match a changed identity) and those with a wildcard peer (whose
/// denies carve every identity's allows).
pub(super) fn identity_update<'a>(
    pol: &'a PolicyState,
    effects: &'a Effects,
) -> impl Fn(&Target) -> Option<Update> + Sync + 'a {
    let candidates: Vec<(&Rule, bool)> = pol
        .repo()
        .rules()
        .iter()
        .filter_map(|r| {
            let uses = r.peers().any(|p| effects.changed.contains(p));
            (uses || has_wildcard_peer(r)).then_some((&**r, uses))
        })
        .collect();
    move |(_, labels, named): &Target| {
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
                    pol.cache(),
                    pol.options(),
                    &effects.identities,
                )
            })
            .flatten();
        Some(entries.map_or(Update::Whole, Update::Identities))
    }
}

/// What a change means for one endpoint.
pub(super) enum Update {
    /// Recompute and install its whole policy.
    Whole,
    /// Replace the entries of the change's identities with these.
    Identities(BTreeMap<PolicyEntry, Verdict>),
}

/// The identities a repository change touches, and the slots its rules select. Removed rules'
/// selectors may no longer be tracked: the cache resolves them on the fly. CIDR identities that
/// just went are in no selector any more, hence `effects`.
pub(super) fn change_targets(
    m: &Manager,
    st: &State,
    change: &RepoChange,
    effects: &Effects,
) -> (BTreeSet<Identity>, Vec<Target>) {
    let mut identities = effects.identities.clone();
    if sliceable(change) {
        for p in change
            .added
            .iter()
            .chain(&change.removed)
            .flat_map(|r| r.peers())
        {
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
    // Tested on the labels its identity holds (an endpoint's identity is its label set), so
    // only the few slots the change selects have theirs copied into a target.
    let targets = slot_representatives(m, st, &BTreeSet::new())
        .into_iter()
        .filter_map(|(slot, (ep, named))| {
            let labels = match st.pol.identity_key(ep.identity) {
                Some(IdentityKey::Labels(labels)) => Cow::Borrowed(labels),
                _ => Cow::Owned(from_api_labels(&ep.labels)),
            };
            change
                .selects(&labels)
                .then(|| (slot, labels.into_owned(), named))
        })
        .collect();
    (identities, targets)
}

/// Whether a change can be applied as the entries of some identities: not when a changed rule
/// has a wildcard peer (identity 0 carves every identity).
fn sliceable(change: &RepoChange) -> bool {
    !change
        .added
        .iter()
        .chain(&change.removed)
        .any(|r| has_wildcard_peer(r))
}

/// What a repository change means for a target it selects: the new entries of `identities`,
/// or a whole recomputation when the change cannot be sliced ([`sliceable`]) or moves the
/// endpoint's enforcement (flags, allow-all, allow-from-host).
pub(super) fn change_update<'a>(
    pol: &'a PolicyState,
    change: &'a RepoChange,
    identities: &'a BTreeSet<Identity>,
) -> impl Fn(&Target) -> Update + Sync + 'a {
    let sliceable = sliceable(change);
    move |(_, labels, named): &Target| {
        if !sliceable {
            return Update::Whole;
        }
        let selecting: Vec<&Rule> = pol.repo().selecting(labels).collect();
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
        let policy = compute_restricted(&selecting, named, pol.cache(), pol.options(), identities);
        Update::Identities(policy.entries)
    }
}
