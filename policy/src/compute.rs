//! Per-endpoint policy computation: repository + selector cache → [`EndpointPolicy`].
//!
//! # Deny invariant
//!
//! The datapath looks up the packet's peer identity and identity 0 and drops when any
//! matching entry is a deny; but within one identity it may stop at the most specific
//! (protocol, port) match, so an allow could shadow a broader deny of the same identity.
//! Hence: for every allow entry `A` and every deny entry `D` with `D.identity` equal to
//! `A.identity` or 0 whose traffic overlaps, the result contains a deny entry keyed
//! `(A.identity, A ∩ D)`, or a deny at `A.identity` covering `A ∩ D` that the lookup prefers
//! to `A` (a protocol where `A` has none, or ports within `A`'s). When `D` covers all of `A`,
//! that key is `A`'s own, so `A` itself becomes a deny.
//! [`EndpointPolicy::deny_shadowing_violations`] checks this.

use crate::labels::LabelSet;
use crate::mapstate::{
    Direction, EndpointPolicy, Identity, PolicyEntry, Tier, TierVerdict, Verdict, overlap, reserved,
};
use crate::repository::Repository;
use crate::rule::{NamedPorts, PeerRule, PeerSelector, PortProto, Rule};
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
    compute_with_ports(endpoint_labels, &NamedPorts::new(), repo, cache, opts)
}

/// [`compute`] for an endpoint whose pod has these named ports (ingress rules' `port: name`
/// resolve against them; a name it lacks matches nothing).
#[must_use]
pub fn compute_with_ports(
    endpoint_labels: &LabelSet,
    named: &NamedPorts,
    repo: &Repository,
    cache: &SelectorCache,
    opts: &ComputeOptions,
) -> EndpointPolicy {
    let selecting: Vec<&Rule> = repo.selecting(endpoint_labels).collect();
    compute_from(&selecting, named, cache, *opts, None)
}

/// The entries of `identities` only, for an endpoint that `selecting` rules select: what
/// [`compute`] would give for those identities, at a fraction of the cost when few identities
/// changed (a new pod's identity, a CIDR identity). `selecting` may leave out rules that select
/// the endpoint as long as it keeps every one with a peer matching one of `identities` and
/// every one with a wildcard peer (their denies carve every identity's allows). Reserved
/// identities are not supported here (their entries depend on enforcement): `None`.
#[must_use]
pub fn compute_identities(
    selecting: &[&Rule],
    named: &NamedPorts,
    cache: &SelectorCache,
    opts: &ComputeOptions,
    identities: &BTreeSet<Identity>,
) -> Option<BTreeMap<PolicyEntry, Verdict>> {
    if identities.iter().any(|&id| id < reserved::FIRST_ALLOCATED) {
        return None;
    }
    Some(compute_restricted(selecting, named, cache, opts, identities).entries)
}

/// [`compute`] restricted to the entries of `identities`, from every rule that selects the
/// endpoint (`selecting`, complete: the enforcement flags are the whole policy's). A rule change
/// whose peers resolve only to `identities` and that leaves [`EnforcementCounts::shape`] as it
/// was changes nothing else.
#[must_use]
pub fn compute_restricted(
    selecting: &[&Rule],
    named: &NamedPorts,
    cache: &SelectorCache,
    opts: &ComputeOptions,
    identities: &BTreeSet<Identity>,
) -> EndpointPolicy {
    let mut policy = compute_from(selecting, named, cache, *opts, Some(identities));
    policy
        .entries
        .retain(|e, _| identities.contains(&e.identity));
    policy
}

/// Per direction, how many rules of an endpoint apply and how many ask for default deny, and
/// how many `ClusterNetworkPolicy` rules of each tier it has. The enforcement and tier flags and
/// the entries no peer selector produces (allow-all when no rule asks for default deny, allow
/// from the host) depend only on [`Self::shape`]. Counts so that a change can be undone: the
/// rules before a change are those after it, minus the added, plus the removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EnforcementCounts {
    applies: [i64; 2],
    default_deny: [i64; 2],
    /// [Admin, Baseline] × [ingress, egress].
    tiered: [[i64; 2]; 2],
}

/// [`EnforcementCounts::shape`]: per direction (ingress, egress) enforced and in default deny,
/// then per tier (Admin, Baseline) and direction whether the tier has rules.
pub type Shape = ([(bool, bool); 2], [[bool; 2]; 2]);

impl EnforcementCounts {
    /// Counts `rule` `n` times (negative to take it out).
    pub fn add(&mut self, rule: &Rule, n: i64) {
        if let Some(t) = &rule.tier {
            let [admin, baseline] = &mut self.tiered;
            let [ingress, egress] = if t.tier == Tier::Baseline {
                baseline
            } else {
                admin
            };
            match t.direction {
                Direction::Ingress => *ingress += n,
                Direction::Egress => *egress += n,
            }
        }
        for ((dir, applies), default_deny) in [Direction::Ingress, Direction::Egress]
            .into_iter()
            .zip(self.applies.iter_mut())
            .zip(self.default_deny.iter_mut())
        {
            if rule.applies(dir) {
                *applies += n;
            }
            if rule.applies(dir) && rule.default_deny(dir) {
                *default_deny += n;
            }
        }
    }

    /// Per direction (ingress, egress): enforced, and in default deny; per tier and direction:
    /// has rules.
    #[must_use]
    pub fn shape(&self) -> Shape {
        let ([ai, ae], [di, de]) = (self.applies, self.default_deny);
        let t = self.tiered.map(|d| d.map(|n| n > 0));
        ([(ai > 0, di > 0), (ae > 0, de > 0)], t)
    }
}

/// True when a rule has a peer that resolves to every identity (identity 0).
#[must_use]
pub fn has_wildcard_peer(rule: &Rule) -> bool {
    rule.peers().any(SelectorCache::is_wildcard)
}

/// `only`: expand peers to these identities (and the wildcard 0) only.
fn compute_from(
    selecting: &[&Rule],
    named: &NamedPorts,
    cache: &SelectorCache,
    opts: ComputeOptions,
    only: Option<&BTreeSet<Identity>>,
) -> EndpointPolicy {
    let only = only.map(Only::new);
    let only = only.as_ref();
    let mut out = EndpointPolicy::default();
    for dir in [Direction::Ingress, Direction::Egress] {
        let rules: Vec<&Rule> = selecting
            .iter()
            .copied()
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
                expand(pr, named, dir, cache, only, &mut allows);
            }
            for pr in deny {
                expand(pr, named, dir, cache, only, &mut denies);
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
    for dir in [Direction::Ingress, Direction::Egress] {
        for tier in Tier::CLUSTER {
            tier_entries(selecting, named, cache, only, (tier, dir), &mut out);
        }
    }
    out
}

/// The entries of one `ClusterNetworkPolicy` tier in one direction: every rule's peers and ports
/// expanded with the rule's verdict (the first in precedence where two rules give the same
/// entry), then resolved so that a longest-prefix match per identity is the first matching
/// rule ([`resolve_tier`]).
fn tier_entries(
    selecting: &[&Rule],
    named: &NamedPorts,
    cache: &SelectorCache,
    only: Option<&Only<'_>>,
    (tier, dir): (Tier, Direction),
    out: &mut EndpointPolicy,
) {
    let mut found = BTreeMap::new();
    let mut any_rule = false;
    for r in selecting {
        let Some((section, verdict)) = r.tier_section(tier, dir) else {
            continue;
        };
        any_rule = true;
        let mut set = BTreeSet::new();
        for pr in section {
            expand(pr, named, dir, cache, only, &mut set);
        }
        for e in set {
            found
                .entry(e)
                .and_modify(|v: &mut TierVerdict| {
                    if verdict.precedes(v) {
                        *v = verdict;
                    }
                })
                .or_insert(verdict);
        }
    }
    if !any_rule {
        return;
    }
    out.tiers.set(tier, dir, true);
    for (e, v) in resolve_tier(&found) {
        out.entries.insert(e.in_tier(tier), Verdict::Tier(v));
    }
}

/// Makes one tier's entries (of one direction) disjoint per identity and protocol: for every
/// port, the entry that covers it is the first in precedence among all entries covering it,
/// any-protocol entries included. A protocol's range is kept only where it comes before the
/// identity's any-protocol entry (elsewhere a longest-prefix match falls back to that one);
/// adjacent ranges with the same verdict merge.
#[must_use]
pub fn resolve_tier(found: &BTreeMap<PolicyEntry, TierVerdict>) -> Vec<(PolicyEntry, TierVerdict)> {
    let mut groups: BTreeMap<(Direction, Identity), Vec<(&PolicyEntry, TierVerdict)>> =
        BTreeMap::new();
    for (e, v) in found {
        groups
            .entry((e.direction, e.identity))
            .or_default()
            .push((e, *v));
    }
    let mut out = Vec::new();
    for ((dir, id), entries) in groups {
        let any = entries
            .iter()
            .filter(|(e, _)| e.proto == 0)
            .map(|(_, v)| *v)
            .min();
        if let Some(v) = any {
            out.push((PolicyEntry::new(dir, id, 0, 0, u16::MAX), v));
        }
        let mut by_proto: BTreeMap<u8, Vec<(u32, u32, TierVerdict)>> = BTreeMap::new();
        for (e, v) in entries.iter().filter(|(e, _)| e.proto != 0) {
            by_proto.entry(e.proto).or_default().push((
                u32::from(e.port_lo),
                u32::from(e.port_hi),
                *v,
            ));
        }
        for (proto, ranges) in by_proto {
            let mut bounds: Vec<u32> = ranges
                .iter()
                .flat_map(|&(lo, hi, _)| [lo, hi + 1])
                .collect();
            bounds.sort_unstable();
            bounds.dedup();
            let mut run: Option<(u32, u32, TierVerdict)> = None;
            for (&lo, &next) in bounds.iter().zip(bounds.iter().skip(1)) {
                let hi = next - 1;
                let best = ranges
                    .iter()
                    .filter(|&&(l, h, _)| l <= lo && hi <= h)
                    .map(|&(_, _, v)| v)
                    .min();
                let keep = best.filter(|b| any.is_none_or(|a| b.precedes(&a)));
                run = match (run, keep) {
                    (Some((rl, rh, rv)), Some(b)) if rv == b && rh + 1 == lo => Some((rl, hi, rv)),
                    (prev, next) => {
                        if let Some(r) = prev {
                            out.push((port_entry(dir, id, proto, r), r.2));
                        }
                        next.map(|b| (lo, hi, b))
                    }
                };
            }
            if let Some(r) = run {
                out.push((port_entry(dir, id, proto, r), r.2));
            }
        }
    }
    out
}

fn port_entry(
    dir: Direction,
    id: Identity,
    proto: u8,
    (lo, hi, _): (u32, u32, TierVerdict),
) -> PolicyEntry {
    // Bounds come from u16 ports: lo <= hi <= 65535.
    let port = |p: u32| u16::try_from(p).unwrap_or(u16::MAX);
    PolicyEntry::new(dir, id, proto, port(lo), port(hi))
}

fn entry(direction: Direction, identity: Identity, pp: PortProto) -> PolicyEntry {
    PolicyEntry::new(direction, identity, pp.proto, pp.lo, pp.hi)
}

/// `only` with what a peer's identities are checked against: `only` without the by-IP bit,
/// and the wildcard 0, sorted (built once per computation, not per peer).
struct Only<'a> {
    identities: &'a BTreeSet<Identity>,
    candidates: Vec<Identity>,
}

impl<'a> Only<'a> {
    fn new(identities: &'a BTreeSet<Identity>) -> Self {
        let candidates: BTreeSet<Identity> = std::iter::once(reserved::ANY)
            .chain(identities.iter().map(|&id| id & !reserved::BY_IP))
            .collect();
        Self {
            identities,
            candidates: candidates.into_iter().collect(),
        }
    }
}

fn expand(
    pr: &PeerRule,
    named: &NamedPorts,
    dir: Direction,
    cache: &SelectorCache,
    only: Option<&Only<'_>>,
    out: &mut BTreeSet<PolicyEntry>,
) {
    // Ingress names resolve against the endpoint's own pod (`named`), the same for every peer;
    // egress names against each destination identity's pods.
    let by_destination = dir == Direction::Egress && !pr.named_ports.is_empty();
    // Resolved on first use: a restricted computation matches few of its rules' peers.
    let mut resolved: Option<Vec<PortProto>> = None;
    for peer in &pr.peers {
        let ids = cache.identities(peer);
        let by_ip = matches!(peer, PeerSelector::Cidr(c) if c.match_pods);
        let mut add = |id: Identity| {
            let ports: &[PortProto] = resolved.get_or_insert_with(|| {
                if by_destination {
                    pr.numeric_ports()
                } else {
                    pr.resolved_ports(named)
                }
            });
            out.extend(ports.iter().map(|&pp| entry(dir, id, pp)));
            if by_destination && let Some(theirs) = cache.named_ports(id) {
                out.extend(pr.destination_ports(theirs).map(|pp| entry(dir, id, pp)));
            }
            // A Kubernetes ipBlock also matches pods by IP: the by-IP twin of each of its CIDR
            // identities (the datapath looks it up with the pod's `cidr_identity`). Egress
            // names never come with an ipBlock (the parser splits them off).
            if by_ip && id >= reserved::FIRST_CIDR {
                let twin = reserved::by_ip(id);
                if only.is_none_or(|o| o.identities.contains(&twin)) {
                    out.extend(ports.iter().map(|&pp| entry(dir, twin, pp)));
                }
            }
        };
        match only {
            None => ids.iter().for_each(|&id| add(id)),
            Some(only) => only
                .candidates
                .iter()
                .filter(|id| ids.contains(id))
                .for_each(|&id| add(id)),
        }
        // The wildcard's identity 0 has no pods and so no names: its names stand for every
        // identity whose pods have them.
        if by_destination && SelectorCache::is_wildcard(peer) {
            for (&id, theirs) in cache.all_named_ports() {
                if only.is_some_and(|o| o.candidates.binary_search(&id).is_err()) {
                    continue;
                }
                out.extend(pr.destination_ports(theirs).map(|pp| entry(dir, id, pp)));
            }
        }
    }
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
