//! Regeneration planning: the map operations that turn one endpoint policy into another.
//!
//! # Order
//!
//! Apply [`PolicyDiff`] in this order and nothing allowed both before and after is ever
//! dropped in between (Cilium #46927):
//! 1. `add`, as listed: new and changed entries, **denies first** so newly denied traffic is
//!    never let through by a newly added allow in between;
//! 2. the enforcement flags (`ingress_enforced` / `egress_enforced` when `Some`): turning
//!    enforcement on only after the entries it needs exist, off before entries vanish;
//! 3. `remove`: entries no longer wanted, last.

use crate::mapstate::{EndpointPolicy, PolicyEntry, Verdict};

/// Map operations for one endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyDiff {
    /// Entries to insert or overwrite, denies before allows.
    pub add: Vec<(PolicyEntry, Verdict)>,
    /// New ingress enforcement flag, when it changes.
    pub ingress_enforced: Option<bool>,
    /// New egress enforcement flag, when it changes.
    pub egress_enforced: Option<bool>,
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
    add.sort_by_key(|(k, v)| (*v != Verdict::Deny, *k));
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
        remove,
    }
}

impl EndpointPolicy {
    /// Applies a diff in its documented order (for tests and dry runs of the datapath).
    pub fn apply(&mut self, diff: &PolicyDiff) {
        for (k, v) in &diff.add {
            self.entries.insert(*k, *v);
        }
        if let Some(e) = diff.ingress_enforced {
            self.ingress_enforced = e;
        }
        if let Some(e) = diff.egress_enforced {
            self.egress_enforced = e;
        }
        for k in &diff.remove {
            self.entries.remove(k);
        }
    }
}
