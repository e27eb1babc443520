//! Regeneration planning: the map operations that turn one endpoint policy into another.
//!
//! # Order
//!
//! Apply [`PolicyDiff`] in this order and nothing allowed both before and after is ever
//! dropped in between (Cilium #46927):
//! 1. `add`, as listed: new and changed entries, **denies first** (`NetworkPolicy` denies and
//!    `ClusterNetworkPolicy` Deny entries) so newly denied traffic is never let through by a
//!    newly added allow in between;
//! 2. the flags: enforcement (`ingress_enforced` / `egress_enforced` when `Some`) and the
//!    `ClusterNetworkPolicy` tier flags (`tiers` when `Some`), all at once: a flag turns on only
//!    after the entries it needs exist, and off before entries vanish (the datapath looks a
//!    tier up only when its flag is set, so a tier's entries are never consulted half-written);
//! 3. `remove`: entries no longer wanted, last.

use crate::mapstate::{EndpointPolicy, PolicyEntry, TierAction, TierFlags, Verdict};

/// Map operations for one endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyDiff {
    /// Entries to insert or overwrite, denies before allows.
    pub add: Vec<(PolicyEntry, Verdict)>,
    /// New ingress enforcement flag, when it changes.
    pub ingress_enforced: Option<bool>,
    /// New egress enforcement flag, when it changes.
    pub egress_enforced: Option<bool>,
    /// New tier flags, when they change.
    pub tiers: Option<TierFlags>,
    /// Entries to delete, after everything else.
    pub remove: Vec<PolicyEntry>,
}

impl PolicyDiff {
    /// True when the maps are already right.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.add.is_empty()
            && self.remove.is_empty()
            && self.ingress_enforced.is_none()
            && self.egress_enforced.is_none()
            && self.tiers.is_none()
    }
}

/// True for what drops: a `NetworkPolicy` deny or a tier's Deny.
fn denies(v: Verdict) -> bool {
    match v {
        Verdict::Deny => true,
        Verdict::Allow => false,
        Verdict::Tier(t) => t.action == TierAction::Deny,
    }
}

/// Plans the change from `old` (installed) to `new` (computed).
#[must_use]
pub fn plan(old: &EndpointPolicy, new: &EndpointPolicy) -> PolicyDiff {
    let mut add: Vec<(PolicyEntry, Verdict)> = new
        .entries
        .iter()
        .filter(|(k, v)| old.entries.get(k) != Some(v))
        .map(|(k, v)| (*k, *v))
        .collect();
    add.sort_by_key(|(k, v)| (!denies(*v), *k));
    let remove = old
        .entries
        .keys()
        .filter(|k| !new.entries.contains_key(k))
        .copied()
        .collect();
    PolicyDiff {
        add,
        ingress_enforced: (old.ingress_enforced != new.ingress_enforced)
            .then_some(new.ingress_enforced),
        egress_enforced: (old.egress_enforced != new.egress_enforced)
            .then_some(new.egress_enforced),
        tiers: (old.tiers != new.tiers).then_some(new.tiers),
        remove,
    }
}

impl EndpointPolicy {
    /// Applies a diff in its documented order (for tests and dry runs of the datapath).
    pub fn apply(&mut self, diff: &PolicyDiff) {
        self.apply_stepwise(diff, |_, _| {});
    }

    /// [`Self::apply`] one map operation at a time, calling `each` with the policy after every
    /// operation and its step ("add", "flags", "remove"): what the datapath holds at each moment
    /// of a regeneration.
    pub fn apply_stepwise(&mut self, diff: &PolicyDiff, mut each: impl FnMut(&Self, &str)) {
        for (k, v) in &diff.add {
            self.entries.insert(*k, *v);
            each(self, "add");
        }
        self.apply_flags(diff);
        each(self, "flags");
        for k in &diff.remove {
            self.entries.remove(k);
            each(self, "remove");
        }
    }

    /// Step 2 of a diff alone: the enforcement and tier flags.
    pub fn apply_flags(&mut self, diff: &PolicyDiff) {
        if let Some(e) = diff.ingress_enforced {
            self.ingress_enforced = e;
        }
        if let Some(e) = diff.egress_enforced {
            self.egress_enforced = e;
        }
        if let Some(t) = diff.tiers {
            self.tiers = t;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mapstate::{Direction, Tier, TierVerdict, proto};

    fn tier_entry(tier: Tier, identity: u32, port: u16) -> PolicyEntry {
        PolicyEntry::new(Direction::Ingress, identity, proto::TCP, port, port).in_tier(tier)
    }

    fn tv(priority: u16, action: TierAction) -> Verdict {
        Verdict::Tier(TierVerdict {
            priority,
            rule: 0,
            action,
        })
    }

    /// Every probe's verdict at every step of the diff, applied one operation at a time, is
    /// what both ends agree on when they agree.
    fn assert_no_transient_change(old: &EndpointPolicy, new: &EndpointPolicy) {
        let probes: Vec<(u32, u16)> = [0, 300, 301]
            .into_iter()
            .flat_map(|id| (79..=82).map(move |p| (id, p)))
            .collect();
        let d = plan(old, new);
        let check = |s: &EndpointPolicy, step: &str| {
            for &(id, port) in &probes {
                let (a, b) = (
                    old.lookup(Direction::Ingress, id, proto::TCP, port),
                    new.lookup(Direction::Ingress, id, proto::TCP, port),
                );
                let now = s.lookup(Direction::Ingress, id, proto::TCP, port);
                assert!(
                    a != b || now == a,
                    "{step}: {id} tcp/{port} is {now:?}, before and after {a:?}\n{d:#?}"
                );
            }
        };
        let mut state = old.clone();
        state.apply_stepwise(&d, check);
        assert_eq!(&state, new);
        let mut applied = old.clone();
        applied.apply(&d);
        assert_eq!(&applied, new);
        assert!(plan(new, new).is_empty());
    }

    #[test]
    fn tier_flags_change_between_adds_and_removes() {
        // No tier → an Admin tier that accepts 80 and passes 81 over a NetworkPolicy that
        // allows 80 and 81, and a Baseline deny of everything → back to nothing.
        let mut np = EndpointPolicy {
            ingress_enforced: true,
            ..EndpointPolicy::default()
        };
        for port in [80, 81] {
            np.entries.insert(
                PolicyEntry::new(Direction::Ingress, 300, proto::TCP, port, port),
                Verdict::Allow,
            );
        }
        let mut tiered = np.clone();
        tiered.tiers.set(Tier::Admin, Direction::Ingress, true);
        tiered.tiers.set(Tier::Baseline, Direction::Ingress, true);
        tiered
            .entries
            .insert(tier_entry(Tier::Admin, 300, 80), tv(5, TierAction::Accept));
        tiered
            .entries
            .insert(tier_entry(Tier::Admin, 0, 81), tv(6, TierAction::Pass));
        tiered.entries.insert(
            PolicyEntry::new(Direction::Ingress, 0, proto::ANY, 0, u16::MAX)
                .in_tier(Tier::Baseline),
            tv(1, TierAction::Deny),
        );
        let d = plan(&np, &tiered);
        assert_eq!(d.tiers, Some(tiered.tiers));
        assert_eq!(d.ingress_enforced, None);
        assert!(d.remove.is_empty());
        assert!(denies(d.add[0].1), "denies first: {d:#?}");
        assert_no_transient_change(&np, &tiered);
        let back = plan(&tiered, &np);
        assert_eq!(back.tiers, Some(np.tiers));
        assert_eq!(back.remove.len(), 3);
        assert_no_transient_change(&tiered, &np);
        // NetworkPolicy enforcement goes while the Baseline tier comes: both flags at once.
        let mut baseline_only = tiered.clone();
        baseline_only.ingress_enforced = false;
        baseline_only.entries.retain(|e, _| !e.tier.is_policy());
        assert_no_transient_change(&np, &baseline_only);
        assert_no_transient_change(&baseline_only, &tiered);
    }

    #[test]
    fn a_tier_verdict_change_is_an_add() {
        let mut a = EndpointPolicy::default();
        a.tiers.set(Tier::Admin, Direction::Ingress, true);
        a.entries
            .insert(tier_entry(Tier::Admin, 300, 80), tv(5, TierAction::Accept));
        let mut b = a.clone();
        b.entries
            .insert(tier_entry(Tier::Admin, 300, 80), tv(4, TierAction::Deny));
        let d = plan(&a, &b);
        assert_eq!(
            d.add,
            [(tier_entry(Tier::Admin, 300, 80), tv(4, TierAction::Deny))]
        );
        assert!(d.remove.is_empty() && d.tiers.is_none());
        assert_no_transient_change(&a, &b);
    }
}
