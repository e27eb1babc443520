//! `weftctl map list` / `map dump`: map summaries and decoded entries.

use super::encode::{PolicyBlock, tier_of, tier_verdict};
use super::error::DatapathError;
use super::state::Maps;
use super::types::{MapSummary, addr_from, direction_name, drop_reason_name};
use aya::maps::MapInfo;
use aya::maps::lpm_trie::Key;
use serde_json::{Value, json};
use std::net::IpAddr;
use std::path::Path;
use weft_ebpf::{self as abi, map_names as names};

fn verdict(v: u8) -> &'static str {
    match v {
        abi::VERDICT_ALLOW => "allow",
        abi::VERDICT_DENY | abi::VERDICT_TIER_DENY => "deny",
        abi::VERDICT_TIER_PASS => "pass",
        abi::VERDICT_TIER_ACCEPT => "accept",
        _ => "unknown",
    }
}

/// One decoded policy entry (as the two policy maps hold it together): `NetworkPolicy` entries
/// as before tiers; a `ClusterNetworkPolicy` tier entry also names its tier and its rule's
/// priority and index.
fn policy_entry(b: &PolicyBlock, v: abi::PolicyValue) -> Value {
    let d = &b.key;
    let mut e = json!({
        "policy_id": d.policy_id,
        "identity": d.identity,
        "direction": direction_name(d.direction & abi::POLICY_DIR_MASK),
    });
    ports_and_value(&mut e, b.prefix_len, d.proto, d.dport, v);
    tier_fields(&mut e, d.direction, v);
    e
}

/// Adds a policy entry's protocol, port range and verdict (from its prefix length and key).
fn ports_and_value(e: &mut Value, prefix_len: u32, proto: u8, dport: u16, v: abi::PolicyValue) {
    let any_proto = prefix_len < abi::POLICY_PROTO_PREFIX;
    let (lo, hi) = if any_proto {
        (0, u16::MAX)
    } else {
        port_range(prefix_len, dport)
    };
    if let Some(fields) = e.as_object_mut() {
        fields.insert("proto".into(), json!(if any_proto { 0 } else { proto }));
        fields.insert("port_lo".into(), json!(lo));
        fields.insert("port_hi".into(), json!(hi));
        fields.insert("verdict".into(), json!(verdict(v.verdict)));
    }
}

/// The `ClusterNetworkPolicy` tier a policy key's direction byte names (`None`: the
/// `NetworkPolicy` layer).
fn tier_name(direction: u8) -> Option<String> {
    let tier = direction >> abi::POLICY_TIER_SHIFT;
    (tier != abi::TIER_POLICY)
        .then(|| tier_of(tier).map_or_else(|| format!("unknown-{tier}"), |t| t.to_string()))
}

/// Adds the tier of an entry of a `ClusterNetworkPolicy` tier, its rule's priority and index.
fn tier_fields(e: &mut Value, direction: u8, v: abi::PolicyValue) {
    if let (Some(name), Some(fields)) = (tier_name(direction), e.as_object_mut()) {
        fields.insert("tier".into(), json!(name));
        fields.insert("priority".into(), json!(v.priority));
        fields.insert("rule".into(), json!(v.rule));
    }
}

pub(crate) fn list(maps: &Maps, pin_dir: &Path) -> Vec<MapSummary> {
    names::ALL
        .iter()
        .map(|&name| {
            let info = MapInfo::from_pin(pin_dir.join(name)).ok();
            let entries = match name {
                names::ENDPOINTS => maps.endpoints.keys().count(),
                names::IPCACHE => maps.ipcache.keys().count(),
                names::POLICY_PAIRS => maps.policy_pairs.keys().count(),
                names::POLICY_LISTS => maps.policy_lists.keys().count(),
                names::POLICY_GEN => maps.policy_gen.keys().count(),
                names::CT => maps.ct.keys().count(),
                names::FRAGS => maps.frags.keys().count(),
                names::METRICS => maps.metrics.keys().count(),
                other => super::lb::count(maps, other).unwrap_or(0),
            };
            MapSummary {
                name: name.to_owned(),
                map_type: info
                    .as_ref()
                    .and_then(|i| i.map_type().ok())
                    .map_or_else(|| "unknown".to_owned(), |t| format!("{t:?}")),
                entries: entries as u64,
                max_entries: info.map_or(0, |i| i.max_entries()),
            }
        })
        .collect()
}

fn endpoints(maps: &Maps) -> Result<Vec<Value>, DatapathError> {
    let mut out = Vec::new();
    for item in &maps.endpoints {
        let (ifindex, e) = item.map_err(DatapathError::map(names::ENDPOINTS))?;
        out.push(json!({
            "ifindex": ifindex,
            "endpoint_id": e.endpoint_id,
            "identity": e.identity,
            "policy_id": e.policy_id,
            "ingress_enforced": e.flags & abi::EP_INGRESS_ENFORCED != 0,
            "egress_enforced": e.flags & abi::EP_EGRESS_ENFORCED != 0,
            "tiers": tier_names(e.flags),
            "mac": weft_api::MacAddr::new(e.mac).to_string(),
            "ipv4": (e.flags & abi::EP_HAS_IPV4 != 0).then(|| IpAddr::from(e.ipv4).to_string()),
            "ipv6": (e.flags & abi::EP_HAS_IPV6 != 0).then(|| IpAddr::from(e.ipv6).to_string()),
        }));
    }
    Ok(out)
}

/// The tiers an `endpoints` entry looks up, e.g. `["admin-ingress", "baseline-egress"]`.
fn tier_names(flags: u32) -> Vec<&'static str> {
    [
        (abi::EP_ADMIN_INGRESS, "admin-ingress"),
        (abi::EP_ADMIN_EGRESS, "admin-egress"),
        (abi::EP_BASELINE_INGRESS, "baseline-ingress"),
        (abi::EP_BASELINE_EGRESS, "baseline-egress"),
    ]
    .into_iter()
    .filter(|(bit, _)| flags & bit != 0)
    .map(|(_, name)| name)
    .collect()
}

/// The prefix an ipcache key stands for (`None` for a key no manager writes).
pub(crate) fn ipcache_prefix(k: &Key<abi::IpcacheKey>) -> Option<ipnet::IpNet> {
    let data = k.data();
    let len = k.prefix_len().checked_sub(abi::IPCACHE_FIXED_PREFIX)?;
    let len = u8::try_from(len).ok()?;
    ipnet::IpNet::new(addr_from(data.family, &data.addr), len).ok()
}

fn ipcache(maps: &Maps) -> Result<Vec<Value>, DatapathError> {
    let mut out = Vec::new();
    for item in &maps.ipcache {
        let (k, v) = item.map_err(DatapathError::map(names::IPCACHE))?;
        let data = k.data();
        let len = k.prefix_len().saturating_sub(abi::IPCACHE_FIXED_PREFIX);
        let mut e = json!({
            "prefix": format!("{}/{len}", addr_from(data.family, &data.addr)),
            "identity": v.identity,
        });
        if let (true, Some(fields)) = (v.cidr_identity != 0, e.as_object_mut()) {
            fields.insert("cidr_identity".into(), json!(v.cidr_identity));
        }
        out.push(e);
    }
    Ok(out)
}

/// Port range covered by a policy block: the prefix fixes the high bits of the port.
fn port_range(prefix_len: u32, dport_be: u16) -> (u16, u16) {
    let fixed = prefix_len.saturating_sub(abi::POLICY_PROTO_PREFIX).min(16);
    let lo = u16::from_be(dport_be);
    let span = u16::MAX.checked_shr(fixed).unwrap_or(0);
    (lo, lo | span)
}

/// The policy entries of every slot, from both policy maps.
fn policy(maps: &Maps) -> Result<Vec<Value>, DatapathError> {
    let entries = maps.kernel_policy(|_| true)?;
    Ok(entries.iter().map(|(b, v)| policy_entry(b, *v)).collect())
}

fn policy_pairs(maps: &Maps) -> Result<Vec<Value>, DatapathError> {
    let mut out = Vec::new();
    for item in &maps.policy_pairs {
        let (k, list_id) = item.map_err(DatapathError::map(names::POLICY_PAIRS))?;
        let mut e = json!({
            "policy_id": k.policy_id,
            "identity": k.identity,
            "direction": direction_name(k.direction & abi::POLICY_DIR_MASK),
            "list_id": list_id,
        });
        if let (Some(name), Some(fields)) = (tier_name(k.direction), e.as_object_mut()) {
            fields.insert("tier".into(), json!(name));
        }
        out.push(e);
    }
    Ok(out)
}

fn policy_lists(maps: &Maps) -> Result<Vec<Value>, DatapathError> {
    let mut out = Vec::new();
    for item in &maps.policy_lists {
        let (k, v) = item.map_err(DatapathError::map(names::POLICY_LISTS))?;
        let d = k.data();
        let mut e = json!({ "list_id": d.list_id });
        let prefix_len = k.prefix_len() + abi::POLICY_LIST_PREFIX_SHIFT;
        ports_and_value(&mut e, prefix_len, d.proto, d.dport, v);
        if tier_verdict(v).is_some()
            && let Some(fields) = e.as_object_mut()
        {
            fields.insert("priority".into(), json!(v.priority));
            fields.insert("rule".into(), json!(v.rule));
        }
        out.push(e);
    }
    Ok(out)
}

/// The TCP close state a ct entry records (other protocols stay "open").
fn close_state(flags: u8) -> &'static str {
    match flags & abi::CT_CLOSED {
        0 => "open",
        abi::CT_CLOSED => "closed",
        _ => "closing",
    }
}

fn policy_gen(maps: &Maps) -> Result<Vec<Value>, DatapathError> {
    Ok(maps
        .generations()?
        .into_iter()
        .map(|(slot, generation)| json!({"policy_id": slot, "generation": generation}))
        .collect())
}

fn ct(maps: &Maps) -> Result<Vec<Value>, DatapathError> {
    let mut out = Vec::new();
    for item in &maps.ct {
        let (k, v) = item.map_err(DatapathError::map(names::CT))?;
        out.push(json!({
            "endpoint_id": k.endpoint_id,
            "direction": direction_name(k.direction),
            "proto": k.proto,
            "src": addr_from(k.family, &k.saddr).to_string(),
            "sport": u16::from_be(k.sport),
            "dst": addr_from(k.family, &k.daddr).to_string(),
            "dport": u16::from_be(k.dport),
            "reason": drop_reason_name(v.reason),
            "state": close_state(v.flags),
            "service": (v.flags & abi::CT_SERVICE != 0).then_some(v.rev_nat),
            "hairpin": v.flags & abi::CT_HAIRPIN != 0,
            "created_ns": v.created_ns,
            "last_seen_ns": v.last_seen_ns,
        }));
    }
    Ok(out)
}

fn frags(maps: &Maps) -> Result<Vec<Value>, DatapathError> {
    let mut out = Vec::new();
    for item in &maps.frags {
        let (k, v) = item.map_err(DatapathError::map(names::FRAGS))?;
        out.push(json!({
            "src": addr_from(k.family, &k.saddr).to_string(),
            "dst": addr_from(k.family, &k.daddr).to_string(),
            "id": k.id,
            "proto": k.proto,
            "sport": u16::from_be(v.sport),
            "dport": u16::from_be(v.dport),
        }));
    }
    Ok(out)
}

fn metrics(maps: &Maps) -> Result<Vec<Value>, DatapathError> {
    let mut out = Vec::new();
    for item in &maps.metrics {
        let (k, per_cpu) = item.map_err(DatapathError::map(names::METRICS))?;
        let (packets, bytes) = per_cpu
            .iter()
            .fold((0u64, 0u64), |(p, b), v| (p + v.packets, b + v.bytes));
        out.push(json!({
            "endpoint_id": k.endpoint_id,
            "direction": direction_name(k.direction),
            "reason": drop_reason_name(k.reason),
            "packets": packets,
            "bytes": bytes,
        }));
    }
    Ok(out)
}

pub(crate) fn dump(maps: &Maps, name: &str) -> Result<Vec<Value>, DatapathError> {
    match name {
        names::ENDPOINTS => endpoints(maps),
        names::IPCACHE => ipcache(maps),
        names::POLICY => policy(maps),
        names::POLICY_PAIRS => policy_pairs(maps),
        names::POLICY_LISTS => policy_lists(maps),
        names::POLICY_GEN => policy_gen(maps),
        names::CT => ct(maps),
        names::FRAGS => frags(maps),
        names::METRICS => metrics(maps),
        names::EVENTS => Err(DatapathError::Invalid(
            "events is a ring buffer: read it with `weftctl monitor`".into(),
        )),
        other => super::lb::dump(maps, other)
            .unwrap_or_else(|| Err(DatapathError::UnknownMap(other.to_owned()))),
    }
}

#[cfg(test)]
mod tests {
    use super::{close_state, policy_entry, port_range, tier_names};
    use crate::datapath::PolicyBlock;
    use weft_ebpf as abi;

    #[test]
    fn tier_entries_name_their_tier_action_priority_and_rule() {
        let key = |direction| PolicyBlock {
            key: abi::PolicyKey {
                policy_id: 3,
                identity: 300,
                direction,
                proto: 6,
                dport: 80u16.to_be(),
            },
            prefix_len: abi::POLICY_FULL_PREFIX,
        };
        let tiered = abi::PolicyValue {
            verdict: abi::VERDICT_TIER_PASS,
            rule: 4,
            priority: 20,
        };
        let e = policy_entry(
            &key(abi::policy_direction(abi::DIR_EGRESS, abi::TIER_BASELINE)),
            tiered,
        );
        assert_eq!(
            e,
            serde_json::json!({"policy_id": 3, "identity": 300, "direction": "egress",
                "proto": 6, "port_lo": 80, "port_hi": 80, "verdict": "pass",
                "tier": "Baseline", "priority": 20, "rule": 4})
        );
        let e = policy_entry(
            &key(abi::DIR_EGRESS),
            abi::PolicyValue::verdict(abi::VERDICT_DENY),
        );
        assert_eq!(e["verdict"], "deny");
        assert!(e.get("tier").is_none(), "{e}");
        assert_eq!(
            tier_names(abi::EP_ADMIN_INGRESS | abi::EP_BASELINE_EGRESS | abi::EP_HAS_IPV4),
            ["admin-ingress", "baseline-egress"]
        );
    }

    #[test]
    fn close_state_names_each_side() {
        assert_eq!(close_state(0), "open");
        assert_eq!(close_state(abi::CT_CLOSING_ORIG), "closing");
        assert_eq!(close_state(abi::CT_CLOSING_REPLY), "closing");
        assert_eq!(close_state(abi::CT_CLOSED), "closed");
    }

    #[test]
    fn port_range_from_prefix() {
        assert_eq!(port_range(abi::POLICY_FULL_PREFIX, 80u16.to_be()), (80, 80));
        assert_eq!(
            port_range(abi::POLICY_FULL_PREFIX - 2, 8080u16.to_be()),
            (8080, 8083)
        );
        assert_eq!(port_range(abi::POLICY_PROTO_PREFIX, 0), (0, 65535));
    }
}
