//! Weft's eBPF datapath: the object compiled from `ebpf/weft_tc.c` by `build.rs`, and the
//! `#[repr(C)]` mirrors of the map keys/values/events declared in `ebpf/include/weft_maps.h`.
//!
//! The constants (directions, flags, reasons, prefix lengths) are generated from the C header, so
//! they have a single definition; the struct layouts are checked against the C compiler's in the
//! tests below. With the `aya` feature the types implement `aya::Pod` for typed map access.

#![warn(missing_docs)]

#[allow(
    clippy::unreadable_literal,
    reason = "generated from weft_maps.h by layout.c; the C header is the readable source"
)]
mod layout {
    include!(concat!(env!("OUT_DIR"), "/layout.rs"));
}

pub use layout::*;

/// Aligns `include_bytes!` data: the ELF parser reads structs out of the object in place.
#[repr(C, align(32))]
struct Aligned<B: ?Sized> {
    bytes: B,
}

static OBJECT: &Aligned<[u8]> = &Aligned {
    bytes: *include_bytes!(concat!(env!("OUT_DIR"), "/weft_tc.o")),
};

/// The compiled BPF object (ELF with BTF), aligned for aya's loader.
#[must_use]
pub fn object() -> &'static [u8] {
    &OBJECT.bytes
}

/// Program attached to tc ingress of the host veth: packets leaving the pod (its egress policy).
pub const PROG_FROM_POD: &str = "weft_from_pod";
/// Program attached to tc egress of the host veth: packets entering the pod (its ingress policy).
pub const PROG_TO_POD: &str = "weft_to_pod";

/// Map names (also their pin file names).
pub mod map_names {
    /// ifindex → [`super::EndpointInfo`].
    pub const ENDPOINTS: &str = "endpoints";
    /// [`super::IpcacheKey`] → [`super::IpcacheValue`].
    pub const IPCACHE: &str = "ipcache";
    /// [`super::PolicyPairKey`] → port list id (`u32`): the first step of a policy lookup.
    pub const POLICY_PAIRS: &str = "policy_pairs";
    /// [`super::PolicyListKey`] → [`super::PolicyValue`]: the port lists.
    pub const POLICY_LISTS: &str = "policy_lists";
    /// Not a map: the policy entries the two maps above hold together, one per
    /// [`super::PolicyKey`], as `map dump` shows them.
    pub const POLICY: &str = "policy";
    /// The one LPM trie of every policy entry of builds before the two-step lookup: its pin is
    /// removed once every endpoint runs programs that do not read it.
    pub const LEGACY_POLICY: &str = "policy";
    /// [`super::CtKey`] → [`super::CtValue`].
    pub const CT: &str = "ct";
    /// [`super::MetricsKey`] → per-CPU [`super::MetricsValue`].
    pub const METRICS: &str = "metrics";
    /// [`super::FragKey`] → [`super::FragValue`].
    pub const FRAGS: &str = "frags";
    /// Ring buffer of [`super::DropEvent`].
    pub const EVENTS: &str = "events";
    /// policy slot (`u32`) → generation (`u64`): the manager's record of finished slot writes.
    pub const POLICY_GEN: &str = "policy_gen";
    /// [`super::LbKey`] → [`super::LbService`]: Service frontends.
    pub const LB_SERVICES: &str = "lb_services";
    /// [`super::LbBackendKey`] → [`super::LbAddr`]: each frontend's backends.
    pub const LB_BACKENDS: &str = "lb_backends";
    /// frontend id (`u32`) → [`super::LbAddr`]: the frontend's own address, for replies.
    pub const LB_REVNAT: &str = "lb_revnat";
    /// [`super::LbFlowKey`] → [`super::LbFlow`]: the backend each flow was given.
    pub const LB_FLOWS: &str = "lb_flows";
    /// All of them.
    pub const ALL: [&str; 13] = [
        ENDPOINTS,
        IPCACHE,
        POLICY_PAIRS,
        POLICY_LISTS,
        POLICY_GEN,
        CT,
        FRAGS,
        METRICS,
        EVENTS,
        LB_SERVICES,
        LB_BACKENDS,
        LB_REVNAT,
        LB_FLOWS,
    ];
}

/// Value of the `endpoints` map (key: host-side ifindex, `u32`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EndpointInfo {
    /// Endpoint id.
    pub endpoint_id: u32,
    /// The endpoint's security identity.
    pub identity: u32,
    /// `EP_*` flags.
    pub flags: u32,
    /// Policy slot whose entries the endpoint enforces.
    pub policy_id: u32,
    /// Pod-side MAC.
    pub mac: [u8; 6],
    /// Padding (zero).
    pub pad: [u8; 2],
    /// IPv4 address, network order (valid with `EP_HAS_IPV4`).
    pub ipv4: [u8; 4],
    /// IPv6 address (valid with `EP_HAS_IPV6`).
    pub ipv6: [u8; 16],
}

/// Data part of the `ipcache` LPM key (aya adds the `prefixlen` word in front).
/// The prefix length is `IPCACHE_FIXED_PREFIX` + address bits.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct IpcacheKey {
    /// `FAMILY_V4` or `FAMILY_V6`.
    pub family: u8,
    /// Padding (zero).
    pub pad: [u8; 3],
    /// Address; IPv4 uses the first four bytes.
    pub addr: [u8; 16],
}

/// Value of the `ipcache` map.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IpcacheValue {
    /// Security identity of the prefix.
    pub identity: u32,
    /// For an endpoint's address: identity of the longest CIDR-rule prefix containing it, else 0
    /// (Kubernetes ipBlock matching by pod IP).
    pub cidr_identity: u32,
}

/// A policy entry's key without its prefix length: what the manager computes and diffs, stored
/// in two steps ([`PolicyPairKey`], then [`PolicyListKey`]); no map is keyed by it.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PolicyKey {
    /// Policy slot the entry belongs to (shared by the endpoints of one identity).
    pub policy_id: u32,
    /// Peer identity, 0 = any.
    pub identity: u32,
    /// `DIR_INGRESS` or `DIR_EGRESS`.
    pub direction: u8,
    /// IP protocol (0 = any, then outside the prefix).
    pub proto: u8,
    /// Destination port (ICMP: type), network byte order.
    pub dport: u16,
}

/// Key of the `policy_pairs` map: the fixed part of a policy entry's key.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PolicyPairKey {
    /// Policy slot.
    pub policy_id: u32,
    /// Peer identity, 0 = any.
    pub identity: u32,
    /// Direction and layer ([`policy_direction`]).
    pub direction: u8,
    /// Padding (zero).
    pub pad: [u8; 3],
}

impl PolicyPairKey {
    /// The pair of a policy entry's key.
    #[must_use]
    pub const fn of(key: &PolicyKey) -> Self {
        Self {
            policy_id: key.policy_id,
            identity: key.identity,
            direction: key.direction,
            pad: [0; 3],
        }
    }
}

/// Data part of the `policy_lists` LPM key (aya adds the `prefixlen` word in front): a port list
/// id, then a policy entry's proto and dport.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PolicyListKey {
    /// Port list id (the value of `policy_pairs`).
    pub list_id: u32,
    /// Padding (zero, inside the prefix).
    pub pad: u8,
    /// IP protocol (0 = any, then outside the prefix).
    pub proto: u8,
    /// Destination port (ICMP: type), network byte order.
    pub dport: u16,
}

/// How much shorter a list entry's prefix is than the policy entry's: the slot, identity and
/// direction (72 bits) replaced by the list id and a pad byte (40 bits).
pub const POLICY_LIST_PREFIX_SHIFT: u32 = POLICY_FIXED_PREFIX - POLICY_LIST_FIXED_PREFIX;

/// Value of the `policy_lists` map.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PolicyValue {
    /// `VERDICT_ALLOW` or `VERDICT_DENY` (`NetworkPolicy` layer), `VERDICT_TIER_DENY`,
    /// `VERDICT_TIER_PASS` or `VERDICT_TIER_ACCEPT` (`ClusterNetworkPolicy` tiers).
    pub verdict: u8,
    /// A tier entry's rule index in its policy's direction list (0 in the `NetworkPolicy` layer).
    pub rule: u8,
    /// A tier entry's policy priority (0 in the `NetworkPolicy` layer).
    pub priority: u16,
}

impl PolicyValue {
    /// A `NetworkPolicy`-layer value.
    #[must_use]
    pub const fn verdict(verdict: u8) -> Self {
        Self {
            verdict,
            rule: 0,
            priority: 0,
        }
    }

    /// A tier entry's precedence as the datapath compares it: smaller wins.
    #[must_use]
    pub const fn precedence(&self) -> u32 {
        ((self.priority as u32) << 16) | ((self.rule as u32) << 8) | self.verdict as u32
    }
}

// At equal (priority, rule) a deny comes first, then pass, then accept: the verdict codes are
// the last part of the precedence.
const _: () =
    assert!(VERDICT_TIER_DENY < VERDICT_TIER_PASS && VERDICT_TIER_PASS < VERDICT_TIER_ACCEPT);

/// The direction byte of a policy key: the direction and the layer (`TIER_*`).
#[must_use]
pub const fn policy_direction(direction: u8, tier: u8) -> u8 {
    direction | (tier << POLICY_TIER_SHIFT)
}

/// Key of the `ct` map.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct CtKey {
    /// Source address (IPv4 in the first four bytes).
    pub saddr: [u8; 16],
    /// Destination address.
    pub daddr: [u8; 16],
    /// Source port, network order (ICMP echo request: identifier).
    pub sport: u16,
    /// Destination port, network order (ICMP echo reply: identifier).
    pub dport: u16,
    /// Endpoint that saw the packet.
    pub endpoint_id: u32,
    /// IP protocol.
    pub proto: u8,
    /// Direction of the packet that created the entry.
    pub direction: u8,
    /// `FAMILY_V4` or `FAMILY_V6`.
    pub family: u8,
    /// Padding (zero).
    pub pad: u8,
}

/// Value of the `ct` map.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CtValue {
    /// `bpf_ktime_get_ns` at creation.
    pub created_ns: u64,
    /// Last refresh (at most once a second).
    pub last_seen_ns: u64,
    /// Why the first packet passed (`REASON_*`).
    pub reason: u8,
    /// TCP close state: `CT_CLOSING_ORIG` / `CT_CLOSING_REPLY` (both = `CT_CLOSED`), and
    /// `CT_SERVICE` / `CT_HAIRPIN` for a flow translated from a Service frontend.
    pub flags: u8,
    /// Padding (zero).
    pub pad: [u8; 2],
    /// The frontend's id in `lb_revnat` (`CT_SERVICE`), else 0.
    pub rev_nat: u32,
}

/// Key of the `lb_services` map: a Service frontend.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct LbKey {
    /// The `ClusterIP` (IPv4 in the first 4 bytes, the rest zero).
    pub addr: [u8; 16],
    /// The Service port, network order.
    pub port: u16,
    /// IP protocol.
    pub proto: u8,
    /// `FAMILY_V4` or `FAMILY_V6`.
    pub family: u8,
}

/// Value of the `lb_services` map.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LbService {
    /// The frontend's id (`lb_backends`, `lb_revnat`, conntrack's `rev_nat`).
    pub id: u32,
    /// Backends in `lb_backends` slots `0..count` (never 0: such a frontend has no entry).
    pub count: u32,
}

/// Key of the `lb_backends` map.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct LbBackendKey {
    /// The frontend's id.
    pub id: u32,
    /// The backend's slot.
    pub slot: u32,
}

/// A backend (`lb_backends`) or a frontend's own address (`lb_revnat`, key: its id).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct LbAddr {
    /// Address (IPv4 in the first 4 bytes, the rest zero).
    pub addr: [u8; 16],
    /// Port, network order.
    pub port: u16,
    /// `FAMILY_V4` or `FAMILY_V6`.
    pub family: u8,
    /// The frontend's IP protocol (`lb_revnat`); 0 in `lb_backends`.
    pub proto: u8,
}

/// Key of the `lb_flows` map: a flow's tuple as the client sent it.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct LbFlowKey {
    /// Client address.
    pub saddr: [u8; 16],
    /// Frontend address.
    pub daddr: [u8; 16],
    /// Client port, network order.
    pub sport: u16,
    /// Frontend port, network order.
    pub dport: u16,
    /// IP protocol.
    pub proto: u8,
    /// `FAMILY_V4` or `FAMILY_V6`.
    pub family: u8,
    /// Padding (zero).
    pub pad: [u8; 2],
}

/// Value of the `lb_flows` map: the backend the flow was given.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LbFlow {
    /// The backend.
    pub backend: LbAddr,
    /// Its slot when it was chosen.
    pub slot: u32,
}

/// Key of the `frags` map: one fragmented datagram.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct FragKey {
    /// Source address.
    pub saddr: [u8; 16],
    /// Destination address.
    pub daddr: [u8; 16],
    /// IP identification (IPv4: 16 bits, IPv6: 32 bits), host order.
    pub id: u32,
    /// IP protocol.
    pub proto: u8,
    /// `FAMILY_V4` or `FAMILY_V6`.
    pub family: u8,
    /// Padding (zero).
    pub pad: [u8; 2],
}

/// Value of the `frags` map: the ports seen in the first fragment.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FragValue {
    /// Source port, network order.
    pub sport: u16,
    /// Destination port, network order.
    pub dport: u16,
    /// Port used for the policy lookup, network order.
    pub policy_port: u16,
    /// The protocol has ports.
    pub has_ports: u8,
    /// Padding (zero).
    pub pad: u8,
}

/// Key of the per-CPU `metrics` map.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct MetricsKey {
    /// Endpoint id (0 for packets on an interface with no endpoint entry).
    pub endpoint_id: u32,
    /// Direction.
    pub direction: u8,
    /// `REASON_*`.
    pub reason: u8,
    /// Padding (zero).
    pub pad: u16,
}

/// Per-CPU value of the `metrics` map.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MetricsValue {
    /// Packets.
    pub packets: u64,
    /// Bytes.
    pub bytes: u64,
}

/// Record in the `events` ring buffer, sent for every dropped packet.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DropEvent {
    /// `bpf_ktime_get_ns` (monotonic, boot-relative).
    pub ts_ns: u64,
    /// Endpoint id.
    pub endpoint_id: u32,
    /// Host-side ifindex.
    pub ifindex: u32,
    /// Identity of the source.
    pub src_identity: u32,
    /// Identity of the destination.
    pub dst_identity: u32,
    /// Direction (from the endpoint's view).
    pub direction: u8,
    /// `REASON_DROP_*`.
    pub reason: u8,
    /// `FAMILY_V4` or `FAMILY_V6`.
    pub family: u8,
    /// IP protocol.
    pub proto: u8,
    /// Source port, network order.
    pub sport: u16,
    /// Destination port (ICMP: type), network order.
    pub dport: u16,
    /// Source address.
    pub saddr: [u8; 16],
    /// Destination address.
    pub daddr: [u8; 16],
    /// The deciding `ClusterNetworkPolicy` tier (`TIER_ADMIN`, `TIER_BASELINE`) of an admin or
    /// baseline deny; 0 otherwise.
    pub tier: u8,
    /// That tier rule's index in its policy's direction list.
    pub rule: u8,
    /// That tier rule's policy priority.
    pub priority: u16,
    /// Padding (zero).
    pub pad: u32,
}

impl DropEvent {
    /// Decodes a ring buffer record; `None` when it is too short. A record of an older object
    /// (`DROP_EVENT_BASE_SIZE` bytes, before the tier fields were appended) reads with them 0.
    #[must_use]
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.len() < DROP_EVENT_BASE_SIZE {
            return None;
        }
        let mut full = [0u8; size_of::<Self>()];
        for (to, from) in full.iter_mut().zip(bytes) {
            *to = *from;
        }
        // SAFETY: the buffer has the type's size, the type is plain old data valid for any bit
        // pattern, and read_unaligned has no alignment requirement.
        Some(unsafe { full.as_ptr().cast::<Self>().read_unaligned() })
    }
}

#[cfg(feature = "aya")]
mod pod {
    use super::{
        CtKey, CtValue, EndpointInfo, FragKey, FragValue, IpcacheKey, IpcacheValue, LbAddr,
        LbBackendKey, LbFlow, LbFlowKey, LbKey, LbService, MetricsKey, MetricsValue, PolicyKey,
        PolicyListKey, PolicyPairKey, PolicyValue,
    };
    // SAFETY (all): #[repr(C)], Copy, no pointers, every bit pattern valid, padding explicit.
    unsafe impl aya::Pod for EndpointInfo {}
    unsafe impl aya::Pod for IpcacheKey {}
    unsafe impl aya::Pod for IpcacheValue {}
    unsafe impl aya::Pod for PolicyKey {}
    unsafe impl aya::Pod for PolicyPairKey {}
    unsafe impl aya::Pod for PolicyListKey {}
    unsafe impl aya::Pod for PolicyValue {}
    unsafe impl aya::Pod for CtKey {}
    unsafe impl aya::Pod for CtValue {}
    unsafe impl aya::Pod for FragKey {}
    unsafe impl aya::Pod for FragValue {}
    unsafe impl aya::Pod for MetricsKey {}
    unsafe impl aya::Pod for MetricsValue {}
    unsafe impl aya::Pod for LbKey {}
    unsafe impl aya::Pod for LbService {}
    unsafe impl aya::Pod for LbBackendKey {}
    unsafe impl aya::Pod for LbAddr {}
    unsafe impl aya::Pod for LbFlowKey {}
    unsafe impl aya::Pod for LbFlow {}
}

#[cfg(test)]
mod tests;
