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

/// One policy map entry. `identity == 0` is any peer; `proto == 0` is any protocol;
/// `port_lo == 0 && port_hi == 65535` is any port. A single port has `port_lo == port_hi`.
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
}

impl PolicyEntry {
    /// An entry; `port_lo..=port_hi` is the destination port range.
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
        }
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
}

/// The full policy of one endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointPolicy {
    /// Some rule selects the endpoint for ingress: default deny for ingress.
    pub ingress_enforced: bool,
    /// Some rule selects the endpoint for egress: default deny for egress.
    pub egress_enforced: bool,
    /// Entries. Where an allow and a deny both match a packet, deny wins.
    pub entries: BTreeMap<PolicyEntry, Verdict>,
}

impl PolicyEntry {
    /// True when a packet from/to `identity` with that protocol and destination port matches.
    #[must_use]
    pub fn matches(&self, direction: Direction, identity: Identity, proto: u8, port: u16) -> bool {
        self.direction == direction
            && (self.identity == reserved::ANY || self.identity == identity)
            && (self.proto == proto::ANY || self.proto == proto)
            && (self.port_lo..=self.port_hi).contains(&port)
    }
}

impl EndpointPolicy {
    /// Reference semantics of the map: not enforced → allow; any matching deny → deny; any
    /// matching allow → allow; else default deny. Replies of allowed connections are the
    /// conntrack's business and not modelled here.
    #[must_use]
    pub fn lookup(
        &self,
        direction: Direction,
        identity: Identity,
        proto: u8,
        port: u16,
    ) -> Verdict {
        let enforced = match direction {
            Direction::Ingress => self.ingress_enforced,
            Direction::Egress => self.egress_enforced,
        };
        if !enforced {
            return Verdict::Allow;
        }
        let mut allowed = false;
        for (e, v) in &self.entries {
            if e.matches(direction, identity, proto, port) {
                match v {
                    Verdict::Deny => return Verdict::Deny,
                    Verdict::Allow => allowed = true,
                }
            }
        }
        if allowed {
            Verdict::Allow
        } else {
            Verdict::Deny
        }
    }

    /// Allow entries that a deny of the same identity (or of identity 0) overlaps without a
    /// deny entry at the allow's identity for the overlapping part; must be empty (see the
    /// deny invariant in `compute`).
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
            if *v != Verdict::Allow {
                continue;
            }
            for d in &denies {
                if a.identity == reserved::ANY && d.identity != reserved::ANY {
                    continue;
                }
                if let Some(x) = overlap(a, d)
                    && self.entries.get(&x) != Some(&Verdict::Deny)
                {
                    out.push((*a, **d));
                }
            }
        }
        out
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
