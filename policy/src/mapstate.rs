//! The computed policy of one endpoint: what the datapath installs into its policy map.
//!
//! This is the contract between the policy engine (which computes it) and the datapath (which
//! encodes it into eBPF map keys). Wildcards are explicit values, never absent fields.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Numeric security identity. `0` in a [`PolicyEntry`] means "any identity".
pub type Identity = u32;

/// Reserved identities (Cilium's numbering).
pub mod reserved {
    use super::Identity;
    /// Wildcard in policy entries: any peer.
    pub const ANY: Identity = 0;
    /// The node itself (router IP and node addresses).
    pub const HOST: Identity = 1;
    /// Everything outside the cluster (ipcache `0.0.0.0/0`, `::/0`).
    pub const WORLD: Identity = 2;
    /// Pods not managed by Weft.
    pub const UNMANAGED: Identity = 3;
    /// First identity allocated for label sets.
    pub const FIRST_ALLOCATED: Identity = 256;
    /// First identity allocated for CIDR selectors (Cilium's local-scope bit).
    pub const FIRST_CIDR: Identity = 1 << 24;
    /// Set on a CIDR identity in a policy entry: the entry matches a managed pod whose address
    /// lies in that identity's prefix (Kubernetes `ipBlock` semantics), looked up with the
    /// ipcache's `cidr_identity` of the pod. Equals `WEFT_IDENTITY_BY_IP` in `weft_maps.h`.
    pub const BY_IP: Identity = 1 << 30;

    /// The by-IP twin of a CIDR identity.
    #[must_use]
    pub const fn by_ip(cidr_identity: Identity) -> Identity {
        cidr_identity | BY_IP
    }
}

/// Traffic direction from the endpoint's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Packets entering the endpoint (peer = source).
    Ingress,
    /// Packets leaving the endpoint (peer = destination).
    Egress,
}

/// IP protocol numbers used by policy. `0` means any protocol (and then ports must be any).
pub mod proto {
    /// Any protocol.
    pub const ANY: u8 = 0;
    /// ICMP.
    pub const ICMP: u8 = 1;
    /// TCP.
    pub const TCP: u8 = 6;
    /// UDP.
    pub const UDP: u8 = 17;
    /// `ICMPv6`.
    pub const ICMPV6: u8 = 58;
    /// SCTP.
    pub const SCTP: u8 = 132;
}

/// The layer of policy an entry belongs to, in evaluation order (`ClusterNetworkPolicy`'s tiers,
/// `policy.networking.k8s.io`): the Admin tier, then `NetworkPolicy` and Cilium rules, then the
/// Baseline tier, then the default (allow).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// `NetworkPolicy`, `CiliumNetworkPolicy`, Cilium rules: allow and deny entries.
    #[default]
    Policy,
    /// `ClusterNetworkPolicy` `tier: Admin`: decided before everything else.
    Admin,
    /// `ClusterNetworkPolicy` `tier: Baseline`: decides only what no `NetworkPolicy` selects.
    Baseline,
}

impl Tier {
    /// True for the `NetworkPolicy` layer (the default, left out of serialized entries).
    #[must_use]
    pub fn is_policy(&self) -> bool {
        *self == Self::Policy
    }

    /// The two `ClusterNetworkPolicy` tiers.
    pub const CLUSTER: [Self; 2] = [Self::Admin, Self::Baseline];
}

impl std::fmt::Display for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Policy => "NetworkPolicy",
            Self::Admin => "Admin",
            Self::Baseline => "Baseline",
        })
    }
}

/// A `ClusterNetworkPolicy` rule's action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum TierAction {
    /// Drop; nothing after it is consulted. Listed first: of two rules with the same
    /// precedence, the deny wins (fail closed).
    Deny,
    /// Skip the rest of this tier: the next layer decides.
    Pass,
    /// Allow; nothing after it is consulted (the peer's own ingress still applies).
    Accept,
}

impl TierAction {
    /// What the action decides for the packet: allow or deny, or nothing (Pass: the next layer
    /// decides).
    #[must_use]
    pub fn verdict(self) -> Option<Verdict> {
        match self {
            Self::Accept => Some(Verdict::Allow),
            Self::Deny => Some(Verdict::Deny),
            Self::Pass => None,
        }
    }
}

impl std::fmt::Display for TierAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Deny => "Deny",
            Self::Pass => "Pass",
            Self::Accept => "Accept",
        })
    }
}

/// What a tier entry decides and with which precedence: the rule at `rule` (its index in its
/// policy's ingress or egress list) of a policy of `priority`. Lower `(priority, rule, action)`
/// takes precedence; a packet gets the action of the matching entry that comes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TierVerdict {
    /// The policy's `spec.priority` (0..=1000).
    pub priority: u16,
    /// The rule's index in its direction's list (0..25).
    pub rule: u8,
    /// The rule's action.
    pub action: TierAction,
}

impl TierVerdict {
    /// True when `self` takes precedence over `other` (derived order: smaller first).
    #[must_use]
    pub fn precedes(&self, other: &Self) -> bool {
        self < other
    }
}

/// One policy map entry. `identity == 0` is any peer; `proto == 0` is any protocol;
/// `port_lo == 0 && port_hi == 65535` is any port. A single port has `port_lo == port_hi`.
/// Entries of the two `ClusterNetworkPolicy` tiers carry their [`Tier`] and a
/// [`Verdict::Tier`]; within one tier, direction, identity and protocol their port ranges are
/// disjoint, and a protocol's range exists only where it takes precedence over that identity's
/// any-protocol entry (so a longest-prefix match is the answer for that identity).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PolicyEntry {
    /// Direction.
    pub direction: Direction,
    /// Peer identity or 0 for any.
    pub identity: Identity,
    /// IP protocol or 0 for any.
    pub proto: u8,
    /// First destination port (inclusive).
    pub port_lo: u16,
    /// Last destination port (inclusive).
    pub port_hi: u16,
    /// The layer: [`Tier::Policy`] for `NetworkPolicy` and Cilium rules.
    #[serde(default, skip_serializing_if = "Tier::is_policy")]
    pub tier: Tier,
}

impl PolicyEntry {
    /// An entry of the `NetworkPolicy` layer; `port_lo..=port_hi` is the destination port range.
    #[must_use]
    pub const fn new(
        direction: Direction,
        identity: Identity,
        proto: u8,
        port_lo: u16,
        port_hi: u16,
    ) -> Self {
        Self {
            direction,
            identity,
            proto,
            port_lo,
            port_hi,
            tier: Tier::Policy,
        }
    }

    /// The same entry in another layer.
    #[must_use]
    pub const fn in_tier(self, tier: Tier) -> Self {
        Self { tier, ..self }
    }

    /// Every port.
    pub const ALL_PORTS: (u16, u16) = (0, u16::MAX);

    /// True when the entry covers every port.
    #[must_use]
    pub fn all_ports(&self) -> bool {
        (self.port_lo, self.port_hi) == Self::ALL_PORTS
    }
}

/// What an entry decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Let the packet (and its connection) through.
    Allow,
    /// Drop it; beats any allow that also matches.
    Deny,
    /// A `ClusterNetworkPolicy` tier entry (only in entries of [`Tier::Admin`] or
    /// [`Tier::Baseline`]): its action and precedence.
    Tier(TierVerdict),
}

/// Which `ClusterNetworkPolicy` tiers have entries for an endpoint, per direction: the datapath
/// looks a tier up only when its flag is set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "the four flags the datapath reads, one per tier and direction"
)]
pub struct TierFlags {
    /// Admin tier, ingress.
    pub admin_ingress: bool,
    /// Admin tier, egress.
    pub admin_egress: bool,
    /// Baseline tier, ingress.
    pub baseline_ingress: bool,
    /// Baseline tier, egress.
    pub baseline_egress: bool,
}

impl TierFlags {
    /// No tier in either direction.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// The flag of `tier` (Admin or Baseline) in `dir`; false for [`Tier::Policy`].
    #[must_use]
    pub fn get(&self, tier: Tier, dir: Direction) -> bool {
        match (tier, dir) {
            (Tier::Admin, Direction::Ingress) => self.admin_ingress,
            (Tier::Admin, Direction::Egress) => self.admin_egress,
            (Tier::Baseline, Direction::Ingress) => self.baseline_ingress,
            (Tier::Baseline, Direction::Egress) => self.baseline_egress,
            (Tier::Policy, _) => false,
        }
    }

    /// Sets the flag of `tier` in `dir` (no-op for [`Tier::Policy`]).
    pub fn set(&mut self, tier: Tier, dir: Direction, on: bool) {
        match (tier, dir) {
            (Tier::Admin, Direction::Ingress) => self.admin_ingress = on,
            (Tier::Admin, Direction::Egress) => self.admin_egress = on,
            (Tier::Baseline, Direction::Ingress) => self.baseline_ingress = on,
            (Tier::Baseline, Direction::Egress) => self.baseline_egress = on,
            (Tier::Policy, _) => {}
        }
    }
}

/// The full policy of one endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointPolicy {
    /// Some rule selects the endpoint for ingress: default deny for ingress.
    pub ingress_enforced: bool,
    /// Some rule selects the endpoint for egress: default deny for egress.
    pub egress_enforced: bool,
    /// Which `ClusterNetworkPolicy` tiers select the endpoint, per direction.
    #[serde(default, skip_serializing_if = "TierFlags::is_empty")]
    pub tiers: TierFlags,
    /// Entries. In the `NetworkPolicy` layer, where an allow and a deny both match a packet,
    /// deny wins; in a tier, the entry whose [`TierVerdict`] comes first.
    pub entries: BTreeMap<PolicyEntry, Verdict>,
}

impl PolicyEntry {
    /// True when a packet from/to `identity` with that protocol and destination port matches
    /// (whatever the entry's tier).
    #[must_use]
    pub fn matches(&self, direction: Direction, identity: Identity, proto: u8, port: u16) -> bool {
        self.direction == direction
            && (self.identity == reserved::ANY || self.identity == identity)
            && (self.proto == proto::ANY || self.proto == proto)
            && (self.port_lo..=self.port_hi).contains(&port)
    }
}

impl EndpointPolicy {
    /// Reference semantics of the map, for a peer with this identity (and no by-IP match):
    /// the Admin tier (when its flag is set) decides with the first matching entry unless that
    /// entry passes; then, when enforced, the `NetworkPolicy` layer decides (any matching deny →
    /// deny; any matching allow → allow; else default deny); then the Baseline tier (when its
    /// flag is set) decides with its first matching entry unless it passes; else allow. Replies
    /// of allowed connections are the conntrack's business and not modelled here.
    #[must_use]
    pub fn lookup(
        &self,
        direction: Direction,
        identity: Identity,
        proto: u8,
        port: u16,
    ) -> Verdict {
        if let Some(v) = self.tier_decision(Tier::Admin, direction, identity, proto, port) {
            return v;
        }
        if let Some(v) = self.policy_decision(direction, identity, proto, port) {
            return v;
        }
        self.tier_decision(Tier::Baseline, direction, identity, proto, port)
            .unwrap_or(Verdict::Allow)
    }

    /// [`Self::lookup`] for a peer that may also match by address: `cidr_identity` is the CIDR
    /// identity of the longest CIDR-rule prefix containing the peer's address (the ipcache's
    /// `cidr_identity`, 0 for none), whose by-IP twin ([`reserved::by_ip`]) Kubernetes ipBlocks
    /// and `ClusterNetworkPolicy` networks are keyed on. This is the datapath's decision: in a
    /// tier, the first in precedence among the identity's, the wildcard's and the twin's
    /// entries; in the `NetworkPolicy` layer, the twin only when the identity decided nothing.
    #[must_use]
    pub fn lookup_peer(
        &self,
        direction: Direction,
        (identity, cidr_identity): (Identity, Identity),
        proto: u8,
        port: u16,
    ) -> Verdict {
        let tier = |tier| {
            let own = self.tier_entry(tier, direction, identity, proto, port);
            let twin = (cidr_identity != 0)
                .then(|| {
                    self.tier_entry(tier, direction, reserved::by_ip(cidr_identity), proto, port)
                })
                .flatten();
            own.into_iter().chain(twin).min()?.action.verdict()
        };
        if let Some(v) = tier(Tier::Admin) {
            return v;
        }
        let decided = self
            .entries
            .iter()
            .any(|(e, _)| e.tier.is_policy() && e.matches(direction, identity, proto, port));
        let np_peer = if decided || cidr_identity == 0 {
            identity
        } else {
            reserved::by_ip(cidr_identity)
        };
        if let Some(v) = self.policy_decision(direction, np_peer, proto, port) {
            return v;
        }
        tier(Tier::Baseline).unwrap_or(Verdict::Allow)
    }

    /// The `NetworkPolicy` layer's verdict, `None` when no rule of it selects the endpoint in
    /// `direction`.
    #[must_use]
    pub fn policy_decision(
        &self,
        direction: Direction,
        identity: Identity,
        proto: u8,
        port: u16,
    ) -> Option<Verdict> {
        let enforced = match direction {
            Direction::Ingress => self.ingress_enforced,
            Direction::Egress => self.egress_enforced,
        };
        if !enforced {
            return None;
        }
        let mut allowed = false;
        for (e, v) in &self.entries {
            if e.tier.is_policy() && e.matches(direction, identity, proto, port) {
                match v {
                    Verdict::Deny => return Some(Verdict::Deny),
                    Verdict::Allow => allowed = true,
                    Verdict::Tier(_) => {}
                }
            }
        }
        Some(if allowed {
            Verdict::Allow
        } else {
            Verdict::Deny
        })
    }

    /// The first matching entry of a tier (Admin or Baseline) with its flag set.
    #[must_use]
    pub fn tier_entry(
        &self,
        tier: Tier,
        direction: Direction,
        identity: Identity,
        proto: u8,
        port: u16,
    ) -> Option<TierVerdict> {
        if !self.tiers.get(tier, direction) {
            return None;
        }
        self.entries
            .iter()
            .filter(|(e, _)| e.tier == tier && e.matches(direction, identity, proto, port))
            .filter_map(|(_, v)| match v {
                Verdict::Tier(t) => Some(*t),
                Verdict::Allow | Verdict::Deny => None,
            })
            .min()
    }

    /// A tier's final verdict: `None` when no entry matches or the first one passes.
    fn tier_decision(
        &self,
        tier: Tier,
        direction: Direction,
        identity: Identity,
        proto: u8,
        port: u16,
    ) -> Option<Verdict> {
        self.tier_entry(tier, direction, identity, proto, port)?
            .action
            .verdict()
    }

    /// Allow entries that a deny of the same identity (or of identity 0) overlaps without a
    /// deny entry at the allow's identity that drops the overlapping part (its exact key, or a
    /// deny covering it that the lookup prefers to the allow); must be empty (see the deny
    /// invariant in `compute`).
    #[must_use]
    pub fn deny_shadowing_violations(&self) -> Vec<(PolicyEntry, PolicyEntry)> {
        let denies: Vec<&PolicyEntry> = self
            .entries
            .iter()
            .filter(|(_, v)| **v == Verdict::Deny)
            .map(|(e, _)| e)
            .collect();
        let mut out = Vec::new();
        for (a, v) in &self.entries {
            if *v != Verdict::Allow || !a.tier.is_policy() {
                continue;
            }
            for d in &denies {
                if a.identity == reserved::ANY && d.identity != reserved::ANY {
                    continue;
                }
                if let Some(x) = overlap(a, d)
                    && !denies.iter().any(|c| decides_against(c, a, &x))
                {
                    out.push((*a, **d));
                }
            }
        }
        out
    }
}

/// Whether the deny `c` drops all of `x` (part of `allow`'s traffic) in the datapath's lookup:
/// keyed at `x`'s identity, it covers `x`, and within that identity it is at least as specific
/// as `allow` (a protocol where `allow` has none, or the same protocol and ports within
/// `allow`'s), so the longest-prefix match finds it, not `allow`. The exact key `x` is one such
/// deny; a wider one is another (an any-identity deny carved at the host's identity over the
/// port range it denies, beside an allow-all from the host).
fn decides_against(c: &PolicyEntry, allow: &PolicyEntry, x: &PolicyEntry) -> bool {
    let covers = c.direction == x.direction
        && c.identity == x.identity
        && c.tier == x.tier
        && (c.proto == 0 || c.proto == x.proto)
        && c.port_lo <= x.port_lo
        && x.port_hi <= c.port_hi;
    let narrower = (allow.proto == 0 && c.proto != 0)
        || (c.proto == allow.proto && allow.port_lo <= c.port_lo && c.port_hi <= allow.port_hi);
    covers && narrower
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
        tier: allow.tier,
    })
}
