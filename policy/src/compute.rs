//! Per-endpoint policy computation: repository + selector cache → [`EndpointPolicy`].
//!
//! # Deny invariant
//!
//! The datapath looks up the packet's peer identity and identity 0 and drops when any
//! matching entry is a deny; but within one identity it may stop at the most specific
//! (protocol, port) match, so an allow could shadow a broader deny of the same identity.
//! Hence: for every allow entry `A` and every deny entry `D` with `D.identity` equal to
//! `A.identity` or 0 whose traffic overlaps, the result contains a deny entry keyed
//! `(A.identity, A ∩ D)`. When `D` covers all of `A`, that key is `A`'s own, so `A` itself
//! becomes a deny. [`EndpointPolicy::deny_shadowing_violations`] checks this.

use crate::labels::LabelSet;
use crate::mapstate::{Direction, EndpointPolicy, Identity, PolicyEntry, Verdict, reserved};
use crate::repository::Repository;
use crate::rule::{PeerRule, PortProto, Rule};
use crate::selectorcache::SelectorCache;
use std::collections::{BTreeMap, BTreeSet};

/// Knobs of the computation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ComputeOptions {
    /// Always allow ingress from the host (identity 1) when ingress is enforced. Cilium does
    /// this in Kubernetes mode (`AllowLocalhost=always`) so kubelet probes keep working.
    /// An explicit deny from the host still wins.
    pub allow_from_host: bool,
}

impl Default for ComputeOptions {
    fn default() -> Self {
        Self {
            allow_from_host: true,
        }
    }
}

/// Computes the policy of an endpoint with these security labels.
#[must_use]
pub fn compute(
    endpoint_labels: &LabelSet,
    repo: &Repository,
    cache: &SelectorCache,
    opts: &ComputeOptions,
) -> EndpointPolicy {
    let mut out = EndpointPolicy::default();
    for dir in [Direction::Ingress, Direction::Egress] {
        let rules: Vec<&Rule> = repo
            .selecting(endpoint_labels)
            .filter(|r| r.applies(dir))
            .collect();
        if rules.is_empty() {
            continue;
        }
        match dir {
            Direction::Ingress => out.ingress_enforced = true,
            Direction::Egress => out.egress_enforced = true,
        }
        let mut allows = BTreeSet::new();
        let mut denies = BTreeSet::new();
        for r in &rules {
            let (allow, deny) = r.sections(dir);
            for pr in allow {
                expand(pr, dir, cache, &mut allows);
            }
            for pr in deny {
                expand(pr, dir, cache, &mut denies);
            }
        }
        if !rules.iter().any(|r| r.default_deny(dir)) {
            // Cilium's enableDefaultDeny=false: enforced (so denies apply) but allow-all.
            allows.insert(entry(dir, reserved::ANY, PortProto::ANY));
        }
        if dir == Direction::Ingress && opts.allow_from_host {
            allows.insert(entry(dir, reserved::HOST, PortProto::ANY));
        }
        finalize(&allows, &denies, &mut out.entries);
    }
    out
}

fn entry(direction: Direction, identity: Identity, pp: PortProto) -> PolicyEntry {
    PolicyEntry {
        direction,
        identity,
        proto: pp.proto,
        port_lo: pp.lo,
        port_hi: pp.hi,
    }
}

fn expand(pr: &PeerRule, dir: Direction, cache: &SelectorCache, out: &mut BTreeSet<PolicyEntry>) {
    let ports: &[PortProto] = if pr.ports.is_empty() {
        &[PortProto::ANY]
    } else {
        &pr.ports
    };
    for peer in &pr.peers {
        for &id in cache.identities(peer).iter() {
            out.extend(ports.iter().map(|&pp| entry(dir, id, pp)));
        }
    }
}

/// The part of `allow`'s traffic that `deny` also matches, keyed at `allow`'s identity.
/// `None` when they do not overlap or the deny does not apply to that identity.
pub(crate) fn overlap(allow: &PolicyEntry, deny: &PolicyEntry) -> Option<PolicyEntry> {
    if allow.direction != deny.direction
        || (deny.identity != allow.identity && deny.identity != reserved::ANY)
    {
        return None;
    }
    let proto = match (allow.proto, deny.proto) {
        (a, d) if a == d => a,
        (a, 0) => a,
        (0, d) => d,
        _ => return None,
    };
    let (lo, hi) = (
        allow.port_lo.max(deny.port_lo),
        allow.port_hi.min(deny.port_hi),
    );
    (lo <= hi).then_some(PolicyEntry {
        direction: allow.direction,
        identity: allow.identity,
        proto,
        port_lo: lo,
        port_hi: hi,
    })
}

fn finalize(
    allows: &BTreeSet<PolicyEntry>,
    denies: &BTreeSet<PolicyEntry>,
    out: &mut BTreeMap<PolicyEntry, Verdict>,
) {
    for a in allows {
        out.insert(*a, Verdict::Allow);
    }
    let mut by_identity: BTreeMap<Identity, Vec<&PolicyEntry>> = BTreeMap::new();
    for d in denies {
        out.insert(*d, Verdict::Deny);
        by_identity.entry(d.identity).or_default().push(d);
    }
    for a in allows {
        let same = by_identity.get(&a.identity).into_iter().flatten();
        let any = by_identity.get(&reserved::ANY).into_iter().flatten();
        let carve: Vec<PolicyEntry> = if a.identity == reserved::ANY {
            same.filter_map(|d| overlap(a, d)).collect()
        } else {
            same.chain(any).filter_map(|d| overlap(a, d)).collect()
        };
        for x in carve {
            out.insert(x, Verdict::Deny);
        }
    }
}
