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
    /// [`super::PolicyKey`] → [`super::PolicyValue`].
    pub const POLICY: &str = "policy";
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
    /// All of them.
    pub const ALL: [&str; 8] = [
        ENDPOINTS, IPCACHE, POLICY, POLICY_GEN, CT, FRAGS, METRICS, EVENTS,
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

/// Data part of the `policy` LPM key (aya adds the `prefixlen` word in front).
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

/// Value of the `policy` map.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PolicyValue {
    /// `VERDICT_ALLOW` or `VERDICT_DENY`.
    pub verdict: u8,
    /// Padding (zero).
    pub pad: [u8; 3],
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
    /// TCP close state: `CT_CLOSING_ORIG` / `CT_CLOSING_REPLY` (both = `CT_CLOSED`).
    pub flags: u8,
    /// Padding (zero).
    pub pad: [u8; 6],
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
}

impl DropEvent {
    /// Decodes a ring buffer record; `None` when it is too short.
    #[must_use]
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.len() < size_of::<Self>() {
            return None;
        }
        // SAFETY: the length is checked, the type is plain old data valid for any bit pattern,
        // and read_unaligned has no alignment requirement.
        Some(unsafe { bytes.as_ptr().cast::<Self>().read_unaligned() })
    }
}

#[cfg(feature = "aya")]
mod pod {
    use super::{
        CtKey, CtValue, EndpointInfo, FragKey, FragValue, IpcacheKey, IpcacheValue, MetricsKey,
        MetricsValue, PolicyKey, PolicyValue,
    };
    // SAFETY (all): #[repr(C)], Copy, no pointers, every bit pattern valid, padding explicit.
    unsafe impl aya::Pod for EndpointInfo {}
    unsafe impl aya::Pod for IpcacheKey {}
    unsafe impl aya::Pod for IpcacheValue {}
    unsafe impl aya::Pod for PolicyKey {}
    unsafe impl aya::Pod for PolicyValue {}
    unsafe impl aya::Pod for CtKey {}
    unsafe impl aya::Pod for CtValue {}
    unsafe impl aya::Pod for FragKey {}
    unsafe impl aya::Pod for FragValue {}
    unsafe impl aya::Pod for MetricsKey {}
    unsafe impl aya::Pod for MetricsValue {}
}

#[cfg(test)]
mod tests;
