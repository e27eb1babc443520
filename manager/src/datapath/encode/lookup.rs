//! The userspace mirror of the datapath's decision for a new flow (`decide` in `weft_tc.c`)
//! over an encoded slot, for the tests and the fuzzer that hold the encoding to the contract
//! ([`EndpointPolicy::lookup`](weft_policy::mapstate::EndpointPolicy::lookup)).

use super::{Encoded, PolicyBlock, contains, dir_byte, tier_byte, tier_verdict};
use weft_ebpf::{self as abi, PolicyKey, PolicyValue};
use weft_policy::mapstate::{Direction, Tier, TierAction, TierVerdict, Verdict};

/// A packet's peer as the datapath knows it from the ipcache: its identity, and for an address
/// inside a CIDR rule's prefix that rule's identity (its by-IP twin is looked up too).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Peer {
    /// The peer's security identity.
    pub identity: u32,
    /// The identity of the longest CIDR-rule prefix holding the peer's address, else 0.
    pub cidr_identity: u32,
}

impl Peer {
    /// A peer known by its identity alone.
    #[must_use]
    pub const fn identity(identity: u32) -> Self {
        Self {
            identity,
            cidr_identity: 0,
        }
    }
}

/// What the datapath decides for a new flow, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// [`Verdict::Allow`] or [`Verdict::Deny`].
    pub verdict: Verdict,
    /// The `REASON_*` counted (and in a drop event).
    pub reason: u8,
    /// The `ClusterNetworkPolicy` rule that decided, if one did.
    pub rule: Option<(Tier, TierVerdict)>,
}

/// The longest block of `identity` in the layer and direction `direction` (a key's direction
/// byte) matching the packet: `policy_verdict`'s map lookup.
fn longest(
    encoded: &Encoded,
    identity: u32,
    direction: u8,
    proto: u8,
    port: u16,
) -> Option<PolicyValue> {
    let packet = |b: &PolicyBlock| PolicyBlock {
        prefix_len: abi::POLICY_FULL_PREFIX,
        key: PolicyKey {
            proto,
            dport: port.to_be(),
            ..b.key
        },
    };
    encoded
        .iter()
        .filter(|(b, _)| {
            b.key.identity == identity && b.key.direction == direction && contains(b, &packet(b))
        })
        .max_by_key(|(b, _)| b.prefix_len)
        .map(|(_, v)| *v)
}

/// The `NetworkPolicy` layer's verdict for one identity (`policy_verdict`): a deny of the exact
/// identity wins, else identity 0's block, else the exact one's; `None`: nothing matches.
fn layer_verdict(
    encoded: &Encoded,
    identity: u32,
    dir: u8,
    proto: u8,
    port: u16,
) -> Option<Verdict> {
    let exact = longest(encoded, identity, dir, proto, port);
    if exact.is_some_and(|v| v.verdict == abi::VERDICT_DENY) {
        return Some(Verdict::Deny);
    }
    match longest(encoded, 0, dir, proto, port).or(exact)?.verdict {
        abi::VERDICT_DENY => Some(Verdict::Deny),
        _ => Some(Verdict::Allow),
    }
}

/// The `NetworkPolicy` layer's verdict (`verdict_for`): the peer's identity, then, when that
/// decided nothing, the by-IP twin of its CIDR identity; `None` when nothing matches (default
/// deny when enforced). `port` is host order.
#[must_use]
pub fn policy_layer(
    encoded: &Encoded,
    peer: Peer,
    direction: Direction,
    proto: u8,
    port: u16,
) -> Option<Verdict> {
    let dir = dir_byte(direction);
    layer_verdict(encoded, peer.identity, dir, proto, port).or_else(|| {
        (peer.cidr_identity != 0).then_some(())?;
        let twin = peer.cidr_identity | abi::IDENTITY_BY_IP;
        layer_verdict(encoded, twin, dir, proto, port)
    })
}

/// The first entry in precedence of a `ClusterNetworkPolicy` tier for the peer (`tier_entry`):
/// the longest match of each of its identities (its own, 0, the by-IP twin), the smallest
/// precedence across them. The tier flag is not consulted.
#[must_use]
pub fn tier_entry(
    encoded: &Encoded,
    tier: Tier,
    peer: Peer,
    direction: Direction,
    proto: u8,
    port: u16,
) -> Option<TierVerdict> {
    let dir = abi::policy_direction(dir_byte(direction), tier_byte(tier));
    let twin = (peer.cidr_identity != 0).then_some(peer.cidr_identity | abi::IDENTITY_BY_IP);
    [Some(peer.identity), Some(0), twin]
        .into_iter()
        .flatten()
        .filter_map(|id| longest(encoded, id, dir, proto, port))
        .filter(|v| v.verdict != 0)
        .min_by_key(PolicyValue::precedence)
        .and_then(tier_verdict)
}

/// The datapath's decision for a new flow of a slot with these `endpoints` flags (`decide`):
/// the Admin tier when its flag is set (accept or deny is final), the `NetworkPolicy` layer when
/// enforced (final), the Baseline tier when its flag is set, else allow.
#[must_use]
pub fn lookup_encoded(
    encoded: &Encoded,
    flags: u32,
    peer: Peer,
    direction: Direction,
    proto: u8,
    port: u16,
) -> Decision {
    let (enforced, admin, baseline) = match direction {
        Direction::Ingress => (
            abi::EP_INGRESS_ENFORCED,
            abi::EP_ADMIN_INGRESS,
            abi::EP_BASELINE_INGRESS,
        ),
        Direction::Egress => (
            abi::EP_EGRESS_ENFORCED,
            abi::EP_ADMIN_EGRESS,
            abi::EP_BASELINE_EGRESS,
        ),
    };
    let tier = |t: Tier, (accept, deny): (u8, u8)| {
        let v = tier_entry(encoded, t, peer, direction, proto, port)?;
        let (verdict, reason) = match v.action {
            TierAction::Accept => (Verdict::Allow, accept),
            TierAction::Deny => (Verdict::Deny, deny),
            TierAction::Pass => return None,
        };
        Some(Decision {
            verdict,
            reason,
            rule: Some((t, v)),
        })
    };
    if flags & admin != 0 {
        let reasons = (abi::REASON_ALLOW_ADMIN, abi::REASON_DROP_ADMIN_DENY);
        if let Some(d) = tier(Tier::Admin, reasons) {
            return d;
        }
    }
    if flags & enforced != 0 {
        let (verdict, reason) = match policy_layer(encoded, peer, direction, proto, port) {
            Some(Verdict::Allow) => (Verdict::Allow, abi::REASON_ALLOW_POLICY),
            Some(_) => (Verdict::Deny, abi::REASON_DROP_POLICY_DENY),
            None => (Verdict::Deny, abi::REASON_DROP_POLICY_DEFAULT),
        };
        return Decision {
            verdict,
            reason,
            rule: None,
        };
    }
    if flags & baseline != 0 {
        let reasons = (abi::REASON_ALLOW_BASELINE, abi::REASON_DROP_BASELINE_DENY);
        if let Some(d) = tier(Tier::Baseline, reasons) {
            return d;
        }
    }
    Decision {
        verdict: Verdict::Allow,
        reason: abi::REASON_ALLOW_NOT_ENFORCED,
        rule: None,
    }
}
