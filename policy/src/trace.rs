//! `policy trace`: which verdict a flow gets and which rule decided it.

use crate::compute::ComputeOptions;
use crate::labels::LabelSet;
use crate::mapstate::{Direction, Identity, Tier, TierAction, TierVerdict, Verdict, reserved};
use crate::repository::Repository;
use crate::rule::{NamedPorts, PeerRule, PeerSelector, Rule};
use crate::selectorcache::SelectorCache;
use std::fmt;

/// One side of a traced flow.
#[derive(Debug, Clone, Copy)]
pub struct TracePeer<'a> {
    /// Its identity (as the ipcache would resolve its address).
    pub identity: Identity,
    /// Its security labels when it is a local endpoint subject to policy; `None` for host,
    /// world or CIDR peers, whose own policy is not Weft's business.
    pub labels: Option<&'a LabelSet>,
    /// Its pod's named ports (ingress rules' `port: name` resolve against the destination's).
    pub named_ports: Option<&'a NamedPorts>,
    /// For an endpoint's address: the CIDR identity of the longest CIDR-rule prefix containing
    /// it (the ipcache's `cidr_identity`), which Kubernetes ipBlock peers match; else 0.
    pub cidr_identity: Identity,
}

/// Why a direction decided what it did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// No rule selects the endpoint in this direction.
    NotSelected,
    /// Selected, and nothing allows the flow.
    DefaultDeny,
    /// Allowed by the rule with these labels.
    AllowedBy(LabelSet),
    /// Denied by the rule with these labels (deny beats allow).
    DeniedBy(LabelSet),
    /// Selected only by rules with default deny disabled.
    DefaultDenyDisabled,
    /// Ingress from the host, always allowed ([`ComputeOptions::allow_from_host`]).
    HostAlwaysAllowed,
    /// Allowed by a Kubernetes ipBlock of the rule with these labels matching the pod's IP.
    AllowedByIpBlock(LabelSet),
    /// Decided (accepted or denied) by a `ClusterNetworkPolicy` rule.
    Tier(TierDecision),
}

/// The `ClusterNetworkPolicy` rule that matched a flow first in its tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierDecision {
    /// Admin or Baseline.
    pub tier: Tier,
    /// The object's labels (kind, name).
    pub labels: LabelSet,
    /// The object's priority.
    pub priority: u16,
    /// The rule's index in its direction's list.
    pub index: u8,
    /// The rule's name (may be empty).
    pub name: String,
    /// What it does.
    pub action: TierAction,
}

impl fmt::Display for TierDecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} by {} tier rule {}",
            match self.action {
                TierAction::Accept => "accepted",
                TierAction::Deny => "denied",
                TierAction::Pass => "passed",
            },
            self.tier,
            self.index
        )?;
        if !self.name.is_empty() {
            write!(f, " {:?}", self.name)?;
        }
        write!(f, " of priority {} [{}]", self.priority, self.labels)
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotSelected => f.write_str("not selected (default allow)"),
            Self::DefaultDeny => f.write_str("default deny"),
            Self::AllowedBy(l) => write!(f, "allowed by rule [{l}]"),
            Self::DeniedBy(l) => write!(f, "denied by rule [{l}]"),
            Self::DefaultDenyDisabled => {
                f.write_str("allowed (selecting rules disable default deny)")
            }
            Self::HostAlwaysAllowed => f.write_str("allowed (ingress from host is always allowed)"),
            Self::AllowedByIpBlock(l) => write!(f, "allowed by an ipBlock of rule [{l}] (pod IP)"),
            Self::Tier(t) => t.fmt(f),
        }
    }
}

/// The outcome in one direction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectionTrace {
    /// Allow or deny.
    pub verdict: Verdict,
    /// Why.
    pub decision: Decision,
    /// The Admin tier rule whose Pass sent the flow on to the later layers, if one did.
    pub passed: Option<TierDecision>,
}

impl fmt::Display for DirectionTrace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.decision.fmt(f)?;
        if let Some(p) = &self.passed {
            write!(f, ", after a Pass: {p}")?;
        }
        Ok(())
    }
}

/// The outcome of a trace: the source's egress, then the destination's ingress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    /// Egress policy of the source (`None` when the source is not a local endpoint).
    pub egress: Option<DirectionTrace>,
    /// Ingress policy of the destination (`None` when it is not a local endpoint).
    pub ingress: Option<DirectionTrace>,
    /// Deny if either side denies.
    pub verdict: Verdict,
}

/// Traces a flow `src → dst` to destination port `port` with IP protocol `proto`.
#[must_use]
pub fn trace(
    repo: &Repository,
    cache: &SelectorCache,
    src: TracePeer<'_>,
    dst: TracePeer<'_>,
    proto: u8,
    port: u16,
    opts: &ComputeOptions,
) -> Trace {
    let none = NamedPorts::new();
    let egress = src.labels.map(|l| {
        decide(
            repo,
            cache,
            (l, src.named_ports.unwrap_or(&none)),
            Direction::Egress,
            (dst.identity, dst.cidr_identity),
            proto,
            port,
            *opts,
        )
    });
    let ingress = dst.labels.map(|l| {
        decide(
            repo,
            cache,
            (l, dst.named_ports.unwrap_or(&none)),
            Direction::Ingress,
            (src.identity, src.cidr_identity),
            proto,
            port,
            *opts,
        )
    });
    let denied = [&egress, &ingress]
        .into_iter()
        .flatten()
        .any(|t| t.verdict == Verdict::Deny);
    Trace {
        egress,
        ingress,
        verdict: if denied {
            Verdict::Deny
        } else {
            Verdict::Allow
        },
    }
}

/// Whether an entry of `dir` matches the peer and the port. Names resolve as the computation
/// resolves them: in ingress against the endpoint's own pod (`named`), in egress against the
/// destination identity's pods.
fn hits(
    pr: &PeerRule,
    (named, dir): (&NamedPorts, Direction),
    cache: &SelectorCache,
    peer: Identity,
    proto: u8,
    port: u16,
) -> bool {
    if !pr.peers.iter().any(|s| cache.peer_matches(s, peer)) {
        return false;
    }
    if dir == Direction::Egress && !pr.named_ports.is_empty() {
        return pr.numeric_ports().iter().any(|p| p.matches(proto, port))
            || cache.named_ports(peer).is_some_and(|theirs| {
                pr.destination_ports(theirs).any(|p| p.matches(proto, port))
            });
    }
    pr.resolved_ports(named)
        .iter()
        .any(|p| p.matches(proto, port))
}

/// A Kubernetes ipBlock of `pr` contains the pod address whose CIDR identity is `cidr_identity`.
fn hits_by_ip(
    pr: &PeerRule,
    (named, dir): (&NamedPorts, Direction),
    cache: &SelectorCache,
    cidr_identity: Identity,
    proto: u8,
    port: u16,
) -> bool {
    let ports = match dir {
        Direction::Egress => pr.numeric_ports(),
        Direction::Ingress => pr.resolved_ports(named),
    };
    ports.iter().any(|p| p.matches(proto, port))
        && cidr_identity != 0
        && pr.peers.iter().any(|s| {
            matches!(s, PeerSelector::Cidr(c) if c.match_pods)
                && cache.peer_matches(s, cidr_identity)
        })
}

/// The first rule of `tier` (in precedence) selecting the endpoint that matches the flow, by
/// the peer's identity or (a network containing a pod's address) by its CIDR identity.
fn tier_first(
    repo: &Repository,
    cache: &SelectorCache,
    (labels, named): (&LabelSet, &NamedPorts),
    (tier, dir): (Tier, Direction),
    (peer, peer_cidr): (Identity, Identity),
    proto: u8,
    port: u16,
) -> Option<TierDecision> {
    let mut best: Option<(TierVerdict, &Rule)> = None;
    for r in repo.selecting(labels) {
        let Some((section, verdict)) = r.tier_section(tier, dir) else {
            continue;
        };
        if best.as_ref().is_some_and(|(b, _)| !verdict.precedes(b)) {
            continue;
        }
        let hit = section.iter().any(|pr| {
            hits(pr, (named, dir), cache, peer, proto, port)
                || hits_by_ip(pr, (named, dir), cache, peer_cidr, proto, port)
        });
        if hit {
            best = Some((verdict, r));
        }
    }
    let (v, r) = best?;
    let t = r.tier.as_ref()?;
    Some(TierDecision {
        tier,
        labels: r.labels.clone(),
        priority: v.priority,
        index: v.rule,
        name: t.name.clone(),
        action: v.action,
    })
}

#[expect(
    clippy::too_many_arguments,
    reason = "one flow's worth of plain inputs"
)]
fn decide(
    repo: &Repository,
    cache: &SelectorCache,
    (labels, named): (&LabelSet, &NamedPorts),
    dir: Direction,
    (peer, peer_cidr): (Identity, Identity),
    proto: u8,
    port: u16,
    opts: ComputeOptions,
) -> DirectionTrace {
    let tier = |tier| {
        tier_first(
            repo,
            cache,
            (labels, named),
            (tier, dir),
            (peer, peer_cidr),
            proto,
            port,
        )
    };
    let mut passed = None;
    if let Some(t) = tier(Tier::Admin) {
        match t.action.verdict() {
            Some(v) => return tier_done(v, t, None),
            None => passed = Some(t),
        }
    }
    let mut out = decide_policy(
        repo,
        cache,
        (labels, named),
        dir,
        (peer, peer_cidr),
        proto,
        port,
        opts,
    );
    if out.decision == Decision::NotSelected
        && let Some(t) = tier(Tier::Baseline)
        && let Some(v) = t.action.verdict()
    {
        return tier_done(v, t, passed);
    }
    out.passed = passed;
    out
}

fn tier_done(verdict: Verdict, t: TierDecision, passed: Option<TierDecision>) -> DirectionTrace {
    DirectionTrace {
        verdict,
        decision: Decision::Tier(t),
        passed,
    }
}

/// The `NetworkPolicy` layer's decision ([`Decision::NotSelected`] when it has none).
#[expect(
    clippy::too_many_arguments,
    reason = "one flow's worth of plain inputs"
)]
fn decide_policy(
    repo: &Repository,
    cache: &SelectorCache,
    (labels, named): (&LabelSet, &NamedPorts),
    dir: Direction,
    (peer, peer_cidr): (Identity, Identity),
    proto: u8,
    port: u16,
    opts: ComputeOptions,
) -> DirectionTrace {
    let rules: Vec<&Rule> = repo.selecting(labels).filter(|r| r.applies(dir)).collect();
    let done = |verdict, decision| DirectionTrace {
        verdict,
        decision,
        passed: None,
    };
    if rules.is_empty() {
        return done(Verdict::Allow, Decision::NotSelected);
    }
    for r in &rules {
        if r.sections(dir)
            .1
            .iter()
            .any(|pr| hits(pr, (named, dir), cache, peer, proto, port))
        {
            return done(Verdict::Deny, Decision::DeniedBy(r.labels.clone()));
        }
    }
    for r in &rules {
        if r.sections(dir)
            .0
            .iter()
            .any(|pr| hits(pr, (named, dir), cache, peer, proto, port))
        {
            return done(Verdict::Allow, Decision::AllowedBy(r.labels.clone()));
        }
    }
    if dir == Direction::Ingress && opts.allow_from_host && peer == reserved::HOST {
        return done(Verdict::Allow, Decision::HostAlwaysAllowed);
    }
    if !rules.iter().any(|r| r.default_deny(dir)) {
        return done(Verdict::Allow, Decision::DefaultDenyDisabled);
    }
    // The datapath tries the by-IP entries only when the peer's identity decided nothing.
    for r in &rules {
        if r.sections(dir)
            .0
            .iter()
            .any(|pr| hits_by_ip(pr, (named, dir), cache, peer_cidr, proto, port))
        {
            return done(Verdict::Allow, Decision::AllowedByIpBlock(r.labels.clone()));
        }
    }
    done(Verdict::Deny, Decision::DefaultDeny)
}
