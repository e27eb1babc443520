//! What a change means per policy slot: which slots an identity or repository change touches
//! (the targets) and what each needs (new entries for the changed identities, or a whole
//! recomputation), computed once per distinct label set. Pure reads of the state; `regen`
//! applies the results as [`pipelined`] hands them over.

use std::collections::{BTreeMap, BTreeSet};
use weft_api::EndpointState;
use weft_policy::compute::{
    EnforcementCounts, compute_identities, compute_restricted, has_wildcard_peer,
};
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
            (uses || has_wildcard_peer(r)).then_some((r, uses))
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

/// `compute` of every item on two worker threads, handed to `apply` in the items' order on
/// this thread as each is ready: one slot's kernel writes overlap the computation of the next
/// ones, and at most [`AHEAD`] results per worker wait, so memory stays bounded whatever the
/// number of slots. The first error of `apply` stops the workers and is returned.
pub(super) fn pipelined<T: Sync, R: Send, E>(
    items: &[T],
    compute: impl Fn(&T) -> R + Sync,
    mut apply: impl FnMut(&T, R) -> Result<(), E>,
) -> Result<(), E> {
    const WORKERS: usize = 2;
    if items.len() < 2 {
        return items.iter().try_for_each(|item| apply(item, compute(item)));
    }
    std::thread::scope(|s| {
        let compute = &compute;
        let (results, workers): (Vec<_>, Vec<_>) = (0..WORKERS)
            .map(|w| {
                let (tx, rx) = std::sync::mpsc::sync_channel(AHEAD);
                let worker = s.spawn(move || {
                    for item in items.iter().skip(w).step_by(WORKERS) {
                        if tx.send(compute(item)).is_err() {
                            break; // `apply` failed: nobody takes results any more
                        }
                    }
                });
                (rx, worker)
            })
            .unzip();
        let mut outcome = Ok(());
        // Worker `w` computes items w, w + WORKERS, ...: item i's result comes from worker
        // i % WORKERS.
        for (item, from) in items.iter().zip(results.iter().cycle()) {
            // A worker that panicked hung up: its panic is raised below.
            let Ok(result) = from.recv() else {
                break;
            };
            outcome = apply(item, result);
            if outcome.is_err() {
                break;
            }
        }
        drop(results);
        for worker in workers {
            if let Err(panic) = worker.join() {
                std::panic::resume_unwind(panic);
            }
        }
        outcome
    })
}

/// Results a worker of [`pipelined`] may have ready before `apply` takes them.
const AHEAD: usize = 4;

/// What a change means for one endpoint.
#[derive(Clone)]
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
            .flat_map(Rule::peers)
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
    let targets = slot_targets(m, st, &BTreeSet::new())
        .into_iter()
        .filter(|(_, labels, _)| change.selects(labels))
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
        .any(has_wildcard_peer)
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

#[cfg(test)]
mod tests {
    use super::pipelined;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn pipelined_applies_every_result_in_the_items_order() {
        for n in [0, 1, 2, 3, 17, 100] {
            let items: Vec<u64> = (0..n).collect();
            let mut seen = Vec::new();
            // Later items compute faster: order must come from the items, not the workers.
            pipelined(
                &items,
                |&i| {
                    std::thread::sleep(std::time::Duration::from_micros((n - i) * 20));
                    i * 10
                },
                |&i, r| {
                    seen.push((i, r));
                    Ok::<_, ()>(())
                },
            )
            .unwrap();
            assert_eq!(seen, items.iter().map(|&i| (i, i * 10)).collect::<Vec<_>>());
        }
    }

    #[test]
    fn pipelined_stops_at_the_first_error_and_returns_it() {
        let items: Vec<usize> = (0..10_000).collect();
        let computed = AtomicUsize::new(0);
        let mut applied = 0;
        let result = pipelined(
            &items,
            |&i| {
                computed.fetch_add(1, Ordering::Relaxed);
                i
            },
            |&i, _| {
                applied += 1;
                if i == 5 {
                    Err(format!("item {i}"))
                } else {
                    Ok(())
                }
            },
        );
        assert_eq!(result, Err("item 5".to_owned()));
        assert_eq!(applied, 6);
        // The workers stop once nobody takes their results: a few ahead, not all 10 000.
        assert!(computed.load(Ordering::Relaxed) < 100, "{computed:?}");
    }

    #[test]
    #[should_panic(expected = "compute failed")]
    fn a_worker_panic_reaches_the_caller() {
        let items: Vec<usize> = (0..10).collect();
        let _ = pipelined(
            &items,
            |&i| {
                assert!(i != 3, "compute failed");
                i
            },
            |_, _| Ok::<_, ()>(()),
        );
    }
}
