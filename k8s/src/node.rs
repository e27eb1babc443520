//! The Node object: its JSON for the manager's CIDR selection (`weft_manager::node`, which
//! applies the priority of docs/ARCHITECTURE.md, "Pod CIDRs"), and the annotation patch written back (Cilium's
//! `AnnotateNode`: pod CIDR and router IP per family, Weft's keys beside Cilium's).

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use serde_json::{Map, Value, json};
use std::net::IpAddr;

/// The Node as the manager's `NodeManifest` reads it (the same JSON `kubectl get -o json`
/// prints, so the file and the API path share one parser).
#[must_use]
pub fn manifest_json(node: &Node) -> Value {
    serde_json::to_value(node).unwrap_or(Value::Null)
}

/// The merge patch that annotates the node with the CIDRs it uses and their router IPs.
#[must_use]
pub fn annotation_patch(cidrs: &[(IpNet, IpAddr)]) -> Value {
    let mut ann = Map::new();
    for (cidr, router) in cidrs {
        let fam = if cidr.addr().is_ipv4() {
            "ipv4"
        } else {
            "ipv6"
        };
        for prefix in ["network.weft.io", "network.cilium.io"] {
            ann.insert(format!("{prefix}/{fam}-pod-cidr"), cidr.to_string().into());
        }
        ann.insert(
            format!("network.weft.io/{fam}-router-ip"),
            router.to_string().into(),
        );
        ann.insert(
            format!("network.cilium.io/{fam}-cilium-host"),
            router.to_string().into(),
        );
    }
    json!({ "metadata": { "annotations": ann } })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata;

    #[test]
    fn node_round_trips_with_its_cidr_fields() {
        let node: Node = testdata::load("node.json");
        let v = manifest_json(&node);
        assert_eq!(v["metadata"]["name"], "worker-1");
        assert_eq!(v["spec"]["podCIDRs"][1], "fd00:10:244:1::/64");
        assert_eq!(v["spec"]["podCIDR"], "10.244.1.0/24");
    }

    #[test]
    fn patch_names_both_families_in_both_vocabularies() {
        let p = annotation_patch(&[
            (
                "10.244.1.0/24".parse().unwrap(),
                "10.244.1.1".parse().unwrap(),
            ),
            (
                "fd00:10:244:1::/64".parse().unwrap(),
                "fd00:10:244:1::1".parse().unwrap(),
            ),
        ]);
        let a = &p["metadata"]["annotations"];
        assert_eq!(a["network.weft.io/ipv4-pod-cidr"], "10.244.1.0/24");
        assert_eq!(a["network.cilium.io/ipv4-pod-cidr"], "10.244.1.0/24");
        assert_eq!(a["network.weft.io/ipv4-router-ip"], "10.244.1.1");
        assert_eq!(a["network.cilium.io/ipv4-cilium-host"], "10.244.1.1");
        assert_eq!(a["network.cilium.io/ipv6-pod-cidr"], "fd00:10:244:1::/64");
        assert_eq!(a["network.weft.io/ipv6-router-ip"], "fd00:10:244:1::1");
    }
}
