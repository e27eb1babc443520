//! Plain data crossing the [`super::Datapath`] seam.

use serde::Serialize;
use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use weft_ebpf as abi;

/// Service frontends and their backends as the kernel has them, by frontend id.
pub type LbTable =
    std::collections::BTreeMap<u32, (weft_api::lb::Frontend, Vec<weft_api::lb::Backend>)>;

/// Where the maps live and how big they are. Sizes apply when a map is created; an existing
/// pinned map keeps the size it was created with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatapathConfig {
    /// bpffs directory for the pinned maps (mounted if it is not on bpffs).
    pub pin_dir: PathBuf,
    /// `endpoints` max entries.
    pub endpoints_max: u32,
    /// `ipcache` max entries.
    pub ipcache_max: u32,
    /// `policy_pairs` max entries: (slot, peer identity, direction) pairs of every slot
    /// together (allocated as used).
    pub policy_max: u32,
    /// `policy_lists` max entries: the entries of the distinct port lists (LPM nodes are
    /// allocated as used).
    pub policy_lists_max: u32,
    /// `ct` max entries (LRU).
    pub ct_max: u32,
    /// `frags` max entries (LRU: datagrams being fragmented right now).
    pub frags_max: u32,
    /// `metrics` max entries.
    pub metrics_max: u32,
    /// `events` ring buffer bytes (power of two, multiple of the page size).
    pub events_bytes: u32,
    /// `lb_services` and `lb_revnat` max entries (Service frontends).
    pub lb_frontends_max: u32,
    /// `lb_backends` max entries (all frontends' backends together).
    pub lb_backends_max: u32,
    /// `lb_flows` max entries (LRU: flows to frontends).
    pub lb_flows_max: u32,
    /// Capacity of the drop event broadcast channel.
    pub event_channel: usize,
}

impl DatapathConfig {
    /// `max_entries` of every map (bytes for the `events` ring), by map name: what the loader
    /// sets when it creates a map, and what the program pins' digest covers.
    #[must_use]
    pub fn map_sizes(&self) -> [(&'static str, u32); 13] {
        use abi::map_names as names;
        [
            (names::ENDPOINTS, self.endpoints_max),
            (names::IPCACHE, self.ipcache_max),
            (names::POLICY_PAIRS, self.policy_max),
            (names::POLICY_LISTS, self.policy_lists_max),
            (names::POLICY_GEN, self.endpoints_max),
            (names::CT, self.ct_max),
            (names::FRAGS, self.frags_max),
            (names::METRICS, self.metrics_max),
            (names::EVENTS, self.events_bytes),
            (names::LB_SERVICES, self.lb_frontends_max),
            (names::LB_BACKENDS, self.lb_backends_max),
            (names::LB_REVNAT, self.lb_frontends_max),
            (names::LB_FLOWS, self.lb_flows_max),
        ]
    }
}

impl Default for DatapathConfig {
    fn default() -> Self {
        Self {
            pin_dir: PathBuf::from("/sys/fs/bpf/weft"),
            endpoints_max: 65_536,
            ipcache_max: 512 * 1024,
            policy_max: 1024 * 1024,
            policy_lists_max: 256 * 1024,
            ct_max: 512 * 1024,
            frags_max: 8192,
            metrics_max: 256 * 1024,
            events_bytes: 256 * 1024,
            lb_frontends_max: 65_536,
            lb_backends_max: 256 * 1024,
            lb_flows_max: 256 * 1024,
            event_channel: 4096,
        }
    }
}

/// What the datapath needs to know about one endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EndpointDatapath {
    /// Endpoint id.
    pub endpoint_id: u32,
    /// Security identity.
    pub identity: u32,
    /// Policy slot the endpoint enforces (shared with the endpoints of the same identity).
    pub policy_id: u32,
    /// ifindex of the host-side veth (in the manager's netns).
    pub host_ifindex: u32,
    /// Name of the host-side veth.
    pub host_ifname: String,
    /// Pod IPs (at most one per family is recorded in the endpoint entry).
    pub ips: Vec<IpAddr>,
    /// Pod-side MAC.
    pub pod_mac: [u8; 6],
}

/// The flags a policy slot gives its members' `endpoints` entries: enforcement per direction,
/// and which `ClusterNetworkPolicy` tiers the datapath looks up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlotFlags {
    /// Ingress `NetworkPolicy` enforced.
    pub ingress_enforced: bool,
    /// Egress `NetworkPolicy` enforced.
    pub egress_enforced: bool,
    /// Tiers with entries, per direction.
    pub tiers: weft_policy::mapstate::TierFlags,
}

impl SlotFlags {
    /// The flags `policy` gives its endpoints.
    #[must_use]
    pub fn of(policy: &weft_policy::mapstate::EndpointPolicy) -> Self {
        Self {
            ingress_enforced: policy.ingress_enforced,
            egress_enforced: policy.egress_enforced,
            tiers: policy.tiers,
        }
    }
}

/// One `endpoints` map entry as the kernel holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelEndpoint {
    /// Host veth ifindex (the map key).
    pub ifindex: u32,
    /// Security identity.
    pub identity: u32,
    /// Policy slot.
    pub policy_id: u32,
    /// Ingress policy enforced.
    pub ingress_enforced: bool,
    /// Egress policy enforced.
    pub egress_enforced: bool,
    /// `ClusterNetworkPolicy` tiers looked up, per direction.
    pub tiers: weft_policy::mapstate::TierFlags,
    /// Pod-side MAC.
    pub mac: [u8; 6],
    /// Pod addresses (one per family at most).
    pub ips: Vec<IpAddr>,
}

/// The kernel maps' contents read back as they are now (not the in-memory mirrors), for the
/// manager's consistency check (`weftctl map verify`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelState {
    /// `endpoints`, by endpoint id.
    pub endpoints: std::collections::BTreeMap<u32, KernelEndpoint>,
    /// `policy` blocks, by slot.
    pub policy: std::collections::BTreeMap<u32, super::encode::Encoded>,
    /// `policy_gen`, by slot.
    pub generations: std::collections::BTreeMap<u32, u64>,
    /// `ipcache`.
    pub ipcache: std::collections::BTreeMap<ipnet::IpNet, crate::node::ipcache::Value>,
}

/// One map in `weftctl map list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MapSummary {
    /// Map name.
    pub name: String,
    /// Kernel map type.
    pub map_type: String,
    /// Current entries (0 for the ring buffer).
    pub entries: u64,
    /// Max entries (bytes for the ring buffer).
    pub max_entries: u32,
}

/// A dropped packet, decoded from the `events` ring buffer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DropEvent {
    /// Endpoint id.
    pub endpoint_id: u32,
    /// Host veth ifindex.
    pub ifindex: u32,
    /// "ingress" (into the pod) or "egress" (out of the pod).
    pub direction: &'static str,
    /// Why: "policy-deny" (an explicit deny), "policy-default" (no allow matched), "admin-deny"
    /// and "baseline-deny" (a `ClusterNetworkPolicy` rule of that tier), "invalid" (unparseable),
    /// "invalid-source" (the pod sent from an address that is not its own).
    pub reason: &'static str,
    /// The `ClusterNetworkPolicy` rule that denied it ("admin-deny", "baseline-deny").
    #[serde(skip_serializing_if = "Option::is_none", flatten)]
    pub tier_rule: Option<TierRule>,
    /// The `ClusterNetworkPolicy` that rule belongs to, when the manager could name it
    /// (`weftctl monitor`); several when more than one has that tier, priority and rule index.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// IP protocol number.
    pub proto: u8,
    /// Source address.
    pub src_ip: IpAddr,
    /// Source port (ICMP echo: identifier; else 0).
    pub src_port: u16,
    /// Destination address.
    pub dst_ip: IpAddr,
    /// Destination port (ICMP: type).
    pub dst_port: u16,
    /// Source identity.
    pub src_identity: u32,
    /// Destination identity.
    pub dst_identity: u32,
    /// Kernel monotonic timestamp (ns since boot).
    pub ts_ns: u64,
}

/// The `ClusterNetworkPolicy` rule behind a drop: its tier, its policy's priority and its index
/// in the policy's ingress or egress list (the policy with that priority in that tier has it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TierRule {
    /// "Admin" or "Baseline".
    pub tier: &'static str,
    /// The policy's `spec.priority`.
    pub priority: u16,
    /// The rule's index.
    pub rule: u8,
}

/// Stable name of a `REASON_*` value (metrics dumps and events).
#[must_use]
pub fn drop_reason_name(reason: u8) -> &'static str {
    match reason {
        abi::REASON_ALLOW_POLICY => "allow-policy",
        abi::REASON_ALLOW_NOT_ENFORCED => "allow-not-enforced",
        abi::REASON_ALLOW_ESTABLISHED => "allow-established",
        abi::REASON_ALLOW_REPLY => "allow-reply",
        abi::REASON_ALLOW_RELATED => "allow-related",
        abi::REASON_PASS_NEIGHBOUR => "pass-neighbour",
        abi::REASON_PASS_NOT_IP => "pass-not-ip",
        abi::REASON_DROP_POLICY_DENY => "policy-deny",
        abi::REASON_DROP_POLICY_DEFAULT => "policy-default",
        abi::REASON_DROP_INVALID => "invalid",
        abi::REASON_DROP_SPOOFED => "invalid-source",
        abi::REASON_ALLOW_ADMIN => "allow-admin",
        abi::REASON_DROP_ADMIN_DENY => "admin-deny",
        abi::REASON_ALLOW_BASELINE => "allow-baseline",
        abi::REASON_DROP_BASELINE_DENY => "baseline-deny",
        _ => "unknown",
    }
}

pub(crate) fn direction_name(direction: u8) -> &'static str {
    if direction & abi::POLICY_DIR_MASK == abi::DIR_EGRESS {
        "egress"
    } else {
        "ingress"
    }
}

pub(crate) fn addr_from(family: u8, raw: &[u8; 16]) -> IpAddr {
    if family == abi::FAMILY_V4 {
        IpAddr::from([raw[0], raw[1], raw[2], raw[3]])
    } else {
        IpAddr::from(*raw)
    }
}

impl From<&abi::DropEvent> for DropEvent {
    fn from(e: &abi::DropEvent) -> Self {
        Self {
            endpoint_id: e.endpoint_id,
            ifindex: e.ifindex,
            direction: direction_name(e.direction),
            reason: drop_reason_name(e.reason),
            tier_rule: match e.tier {
                abi::TIER_ADMIN => Some("Admin"),
                abi::TIER_BASELINE => Some("Baseline"),
                _ => None,
            }
            .map(|tier| TierRule {
                tier,
                priority: e.priority,
                rule: e.rule,
            }),
            policy: None,
            proto: e.proto,
            src_ip: addr_from(e.family, &e.saddr),
            src_port: u16::from_be(e.sport),
            dst_ip: addr_from(e.family, &e.daddr),
            dst_port: u16::from_be(e.dport),
            src_identity: e.src_identity,
            dst_identity: e.dst_identity,
            ts_ns: e.ts_ns,
        }
    }
}

fn proto_name(proto: u8) -> String {
    match proto {
        1 => "ICMP".into(),
        6 => "TCP".into(),
        17 => "UDP".into(),
        58 => "ICMPv6".into(),
        132 => "SCTP".into(),
        p => format!("proto-{p}"),
    }
}

fn sock(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(a) => format!("{a}:{port}"),
        IpAddr::V6(a) => format!("[{a}]:{port}"),
    }
}

impl fmt::Display for DropEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "drop ({}) endpoint {} {} {} {} -> {} identity {} -> {}",
            self.reason,
            self.endpoint_id,
            self.direction,
            proto_name(self.proto),
            sock(self.src_ip, self.src_port),
            sock(self.dst_ip, self.dst_port),
            self.src_identity,
            self.dst_identity
        )?;
        if let Some(t) = &self.tier_rule {
            write!(
                f,
                " tier {} priority {} rule {}",
                t.tier, t.priority, t.rule
            )?;
        }
        if let Some(p) = &self.policy {
            write!(f, " ({p})")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drop_event_decodes_network_order_and_prints_one_line() {
        let mut raw = abi::DropEvent {
            endpoint_id: 9,
            direction: abi::DIR_INGRESS,
            reason: abi::REASON_DROP_POLICY_DENY,
            family: abi::FAMILY_V6,
            proto: 6,
            sport: 40000u16.to_be(),
            dport: 8080u16.to_be(),
            src_identity: 300,
            dst_identity: 301,
            ..Default::default()
        };
        raw.saddr[15] = 1;
        raw.daddr[15] = 2;
        let ev = DropEvent::from(&raw);
        assert_eq!(ev.dst_port, 8080);
        assert_eq!(ev.src_ip, "::1".parse::<IpAddr>().unwrap());
        assert_eq!(
            ev.to_string(),
            "drop (policy-deny) endpoint 9 ingress TCP [::1]:40000 -> [::2]:8080 identity 300 -> 301"
        );
        raw.family = abi::FAMILY_V4;
        raw.saddr[..4].copy_from_slice(&[10, 0, 0, 1]);
        assert_eq!(
            DropEvent::from(&raw).src_ip,
            "10.0.0.1".parse::<IpAddr>().unwrap()
        );
        assert!(serde_json::to_value(&ev).unwrap().get("tier").is_none());
        raw.reason = abi::REASON_DROP_ADMIN_DENY;
        (raw.tier, raw.priority, raw.rule) = (abi::TIER_ADMIN, 30, 2);
        let ev = DropEvent::from(&raw);
        assert!(
            ev.to_string()
                .starts_with("drop (admin-deny) endpoint 9 ingress TCP 10.0.0.1:40000"),
            "{ev}"
        );
        assert!(
            ev.to_string().ends_with(" tier Admin priority 30 rule 2"),
            "{ev}"
        );
        let json = serde_json::to_value(&ev).unwrap();
        assert_eq!(
            (&json["tier"], &json["priority"], &json["rule"]),
            (&"Admin".into(), &30.into(), &2.into())
        );
    }
}
