//! The versioned key layout (docs/KVSTORE.md), modelled on Cilium's `cilium/state/...`:
//! every kind of record has its own prefix with a version segment, so a later format can live
//! next to this one during an upgrade.

use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use weft_policy::labels::LabelSet;
use weft_policy::mapstate::{Identity, proto};
use weft_policy::rule::NamedPorts;

/// Root of everything Weft writes.
pub const ROOT: &str = "weft/state/";
/// Node records, leased: `nodes/v1/<node>` → [`NodeRecord`].
pub const NODES: &str = "weft/state/nodes/v1/";
/// Identity master keys, not leased: `identities/v1/key/<labels>` → id.
pub const ID_BY_LABELS: &str = "weft/state/identities/v1/key/";
/// Identity numbers, not leased: `identities/v1/id/<n>` → label set (JSON).
pub const ID_BY_NUMBER: &str = "weft/state/identities/v1/id/";
/// Per-node references, leased: `identities/v1/value/<labels>/<node>` → id.
pub const ID_REFS: &str = "weft/state/identities/v1/value/";
/// ipcache entries of endpoints, leased: `ip/v1/default/<ip>` → [`IpRecord`].
pub const IPS: &str = "weft/state/ip/v1/default/";

/// What a node publishes about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// Node name.
    pub name: String,
    /// Underlay address other nodes route its pod CIDRs through.
    pub node_ip: IpAddr,
    /// Pod CIDRs.
    pub pod_cidrs: Vec<ipnet::IpNet>,
    /// Router (gateway) IPs of its pods.
    pub router_ips: Vec<IpAddr>,
}

/// One endpoint address as the cluster sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpRecord {
    /// The pod IP.
    pub ip: IpAddr,
    /// Its security identity.
    pub identity: Identity,
    /// Node that owns it.
    pub node: String,
    /// That node's underlay IP.
    pub node_ip: IpAddr,
    /// The named container ports of its pod (what egress rules' `port: name` resolve to on
    /// other nodes), as Cilium's ipcache metadata carries them. Absent in records of older
    /// versions and for pods without any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub named_ports: Vec<NamedPortRecord>,
}

/// One named container port of a pod: `{"name": "http", "protocol": "TCP", "port": 8080}`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NamedPortRecord {
    /// The port's name.
    pub name: String,
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
    /// Its number.
    pub port: u16,
}

/// A pod's named ports as records (sorted).
#[must_use]
pub fn named_port_records(ports: &NamedPorts) -> Vec<NamedPortRecord> {
    ports
        .iter()
        .filter_map(|((name, proto), port)| {
            let protocol = match *proto {
                proto::TCP => "TCP",
                proto::UDP => "UDP",
                proto::SCTP => "SCTP",
                _ => return None,
            };
            Some(NamedPortRecord {
                name: name.clone(),
                protocol: protocol.into(),
                port: *port,
            })
        })
        .collect()
}

/// Records back into named ports; a record with an unknown protocol, an invalid name or port
/// 0 (written by a newer or broken node) is skipped with a warning.
#[must_use]
pub fn named_ports_of(records: &[NamedPortRecord]) -> NamedPorts {
    let mut out = NamedPorts::new();
    for r in records {
        let proto = match r.protocol.as_str() {
            "TCP" => proto::TCP,
            "UDP" => proto::UDP,
            "SCTP" => proto::SCTP,
            _ => {
                tracing::warn!(name = %r.name, protocol = %r.protocol, "ignoring a named port of an unknown protocol");
                continue;
            }
        };
        if r.port == 0 || r.name.is_empty() || r.name.len() > 15 {
            tracing::warn!(name = %r.name, port = r.port, "ignoring an invalid named port");
            continue;
        }
        out.entry((r.name.clone(), proto)).or_insert(r.port);
    }
    out
}

/// A label set as a key segment: each label's text with `%`, `/` and `,` percent-encoded,
/// joined by `,`. Injective, and never contains `/`, so `<labels>/` is an exact prefix.
#[must_use]
pub fn labels_segment(labels: &LabelSet) -> String {
    let mut out = String::new();
    for (i, l) in labels.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        for c in l.to_string().chars() {
            match c {
                '%' => out.push_str("%25"),
                '/' => out.push_str("%2F"),
                ',' => out.push_str("%2C"),
                c => out.push(c),
            }
        }
    }
    out
}

/// `identities/v1/key/<labels>`.
#[must_use]
pub fn id_by_labels(labels: &LabelSet) -> String {
    format!("{ID_BY_LABELS}{}", labels_segment(labels))
}

/// `identities/v1/id/<n>`.
#[must_use]
pub fn id_by_number(id: Identity) -> String {
    format!("{ID_BY_NUMBER}{id}")
}

/// `identities/v1/value/<labels>/` (every node's reference).
#[must_use]
pub fn id_refs(labels: &LabelSet) -> String {
    format!("{ID_REFS}{}/", labels_segment(labels))
}

/// `identities/v1/value/<labels>/<node>`.
#[must_use]
pub fn id_ref(labels: &LabelSet, node: &str) -> String {
    format!("{}{node}", id_refs(labels))
}

/// `nodes/v1/<node>`.
#[must_use]
pub fn node(name: &str) -> String {
    format!("{NODES}{name}")
}

/// `ip/v1/default/<ip>`.
#[must_use]
pub fn ip(addr: IpAddr) -> String {
    format!("{IPS}{addr}")
}

/// A node name usable as a key segment.
pub fn check_node_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.contains('/') || name.len() > 253 {
        return Err(format!(
            "node name {name:?} cannot be used in the kvstore: it must be 1-253 characters without '/' (set --node-name)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_policy::labels::Label;

    #[test]
    fn label_segments_are_injective_and_slash_free() {
        let a: LabelSet = [Label::new("k8s", "app.kubernetes.io/name", "a,b")]
            .into_iter()
            .collect();
        let b: LabelSet = [
            Label::new("k8s", "app.kubernetes.io/name", "a"),
            Label::new("k8s", "b", ""),
        ]
        .into_iter()
        .collect();
        let (sa, sb) = (labels_segment(&a), labels_segment(&b));
        assert!(!sa.contains('/') && !sb.contains('/'), "{sa} {sb}");
        assert_ne!(sa, sb);
        assert_eq!(
            id_ref(&a, "n1"),
            format!("weft/state/identities/v1/value/{sa}/n1")
        );
    }

    #[test]
    fn node_names_with_slashes_are_refused() {
        assert!(check_node_name("a/b").is_err());
        assert!(check_node_name("").is_err());
        assert!(check_node_name("node-1").is_ok());
    }
}
