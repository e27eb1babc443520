//! Node CIDRs: which pod CIDR each family uses, chosen by the priority of docs/ARCHITECTURE.md, "Pod CIDRs"
//! (`spec.podCIDRs` > `spec.podCIDR` > annotation > config), as Cilium's `ParseNode` does.
//!
//! Its children: [`hostnet`] the node's netlink plumbing behind a seam (with its fake),
//! [`nodenet`] what the node's netns already holds, [`masquerade`] SNAT for traffic leaving the
//! cluster, [`ipcache`] who owns each prefix of the ipcache map. Calls `sys` and `datapath` only.

pub mod hostdev;
pub mod hostnet;
pub mod ipcache;
pub mod masquerade;
pub mod nodenet;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;
use weft_api::CidrSource;

/// Annotation names per family, in the order they are tried (Weft's own first, then Cilium's two).
const V4_ANNOTATIONS: [&str; 3] = [
    "network.weft.io/ipv4-pod-cidr",
    "network.cilium.io/ipv4-pod-cidr",
    "io.cilium.network.ipv4-pod-cidr",
];
const V6_ANNOTATIONS: [&str; 3] = [
    "network.weft.io/ipv6-pod-cidr",
    "network.cilium.io/ipv6-pod-cidr",
    "io.cilium.network.ipv6-pod-cidr",
];

/// Why the node's CIDRs could not be determined.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The manifest file could not be read.
    #[error("cannot read node manifest {path}: {source}")]
    Read {
        /// Path.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// The manifest is neither a JSON nor a YAML Kubernetes Node.
    #[error(
        "node manifest {path} is not a Kubernetes Node in JSON or YAML: {detail} (pass the output of `kubectl get node NAME -o json`)"
    )]
    Parse {
        /// Path.
        path: String,
        /// Parser message.
        detail: String,
    },
    /// No source gave a usable CIDR for any family.
    #[error(
        "no usable pod CIDR for this node{}: set spec.podCIDRs or spec.podCIDR in the node manifest (--node-manifest), or the annotation network.weft.io/ipv4-pod-cidr (or ipv6), or pass --pod-cidr CIDR / pod_cidrs in --config",
        skipped_list(.skipped)
    )]
    NoCidr {
        /// Why each candidate was skipped.
        skipped: Vec<String>,
    },
    /// Two `--pod-cidr`s of one family: only one can be the pool.
    #[error(
        "--pod-cidr {first} and --pod-cidr {second} are both {family}: a node has one pod CIDR per family; pass one"
    )]
    DuplicateFamily {
        /// The first.
        first: String,
        /// The second.
        second: String,
        /// "IPv4" or "IPv6".
        family: &'static str,
    },
    /// The manifest describes another node.
    #[error(
        "node manifest {path} is for node {manifest_node:?}, but this is node {node:?}: pass this node's manifest, or --node-name {manifest_node} if this really is that node"
    )]
    OtherNode {
        /// Path.
        path: String,
        /// `metadata.name` in the manifest.
        manifest_node: String,
        /// This node's name.
        node: String,
    },
    /// The chosen CIDR would take over an address or route of the node.
    #[error("{0}")]
    Conflict(String),
}

fn skipped_list(skipped: &[String]) -> String {
    if skipped.is_empty() {
        String::new()
    } else {
        format!(" ({})", skipped.join("; "))
    }
}

/// A minimal Kubernetes Node: only the fields Weft reads.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct NodeManifest {
    /// `metadata`.
    #[serde(default)]
    pub metadata: NodeMetadata,
    /// `spec`.
    #[serde(default)]
    pub spec: NodeSpec,
}

/// `metadata` of a Node.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct NodeMetadata {
    /// `metadata.name`.
    #[serde(default)]
    pub name: Option<String>,
    /// `metadata.annotations`.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

/// `spec` of a Node. CIDRs stay strings here: an invalid one is skipped, not fatal.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct NodeSpec {
    /// `spec.podCIDR`.
    #[serde(default, rename = "podCIDR")]
    pub pod_cidr: Option<String>,
    /// `spec.podCIDRs`.
    #[serde(default, rename = "podCIDRs")]
    pub pod_cidrs: Vec<String>,
}

impl NodeManifest {
    /// Reads a Node from a JSON or YAML file (YAML is a superset of JSON, but JSON is tried
    /// first for its sharper error messages).
    pub fn load(path: &Path) -> Result<Self, NodeError> {
        let text = std::fs::read_to_string(path).map_err(|source| NodeError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text).map_err(|detail| NodeError::Parse {
            path: path.display().to_string(),
            detail,
        })
    }

    /// Parses JSON or YAML text.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.trim_start().starts_with('{') {
            serde_json::from_str(text).map_err(|e| e.to_string())
        } else {
            serde_yaml::from_str(text).map_err(|e| e.to_string())
        }
    }
}

/// The CIDR one family uses, and where it came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChosenCidr {
    /// The pod CIDR (host bits cleared).
    pub cidr: IpNet,
    /// Which source won.
    pub source: CidrSource,
    /// Which field or annotation exactly.
    pub detail: String,
}

impl ChosenCidr {
    /// The router IP: first usable address, owned by the node on `weft_host`.
    #[must_use]
    pub fn router_ip(&self) -> IpAddr {
        nth_address(self.cidr, 1)
    }
}

/// The `n`th address of `net` (0 = network address).
#[must_use]
pub fn nth_address(net: IpNet, n: u128) -> IpAddr {
    match net {
        IpNet::V4(v4) => {
            let base = u32::from(v4.network());
            IpAddr::V4((base.wrapping_add(u32::try_from(n).unwrap_or(u32::MAX))).into())
        }
        IpNet::V6(v6) => IpAddr::V6((u128::from(v6.network()).wrapping_add(n)).into()),
    }
}

/// The result of CIDR selection: at most one CIDR per family, and what was skipped on the way.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    /// IPv4 pool.
    pub v4: Option<ChosenCidr>,
    /// IPv6 pool.
    pub v6: Option<ChosenCidr>,
    /// One line per invalid or ignored entry, for the log.
    pub warnings: Vec<String>,
}

impl Selection {
    /// The chosen CIDRs, IPv4 first.
    #[must_use]
    pub fn cidrs(&self) -> Vec<ChosenCidr> {
        self.v4.iter().chain(self.v6.iter()).cloned().collect()
    }
}

/// Smallest pools accepted: IPv4 needs network + broadcast + router + one pod.
const MAX_PREFIX_V4: u8 = 30;
const MAX_PREFIX_V6: u8 = 126;
/// Largest pools accepted (docs/OPERATIONS.md): a node CIDR wider than /8 (IPv4) or /48 (IPv6)
/// is a typo or a cluster CIDR, and routing it to `weft_host` would capture the node's traffic.
pub const MIN_PREFIX_V4: u8 = 8;
/// See [`MIN_PREFIX_V4`].
pub const MIN_PREFIX_V6: u8 = 48;

fn parse_cidr(raw: &str, origin: &str, warnings: &mut Vec<String>) -> Option<IpNet> {
    let Ok(net) = raw.trim().parse::<IpNet>() else {
        warnings.push(format!("{origin}: {raw:?} is not a valid CIDR; ignored"));
        return None;
    };
    let too_small = match net {
        IpNet::V4(n) => n.prefix_len() > MAX_PREFIX_V4,
        IpNet::V6(n) => n.prefix_len() > MAX_PREFIX_V6,
    };
    if net.prefix_len() == 0 {
        warnings.push(format!(
            "{origin}: {raw} is a default route, not a pod CIDR (it would take over all of the node's traffic); ignored"
        ));
        return None;
    }
    let too_wide = match net {
        IpNet::V4(n) => n.prefix_len() < MIN_PREFIX_V4,
        IpNet::V6(n) => n.prefix_len() < MIN_PREFIX_V6,
    };
    if too_wide {
        warnings.push(format!(
            "{origin}: {raw} is too wide for one node's pods (at least /{MIN_PREFIX_V4} for IPv4, /{MIN_PREFIX_V6} for IPv6); ignored"
        ));
        return None;
    }
    if too_small {
        warnings.push(format!(
            "{origin}: {raw} is too small for a pod pool (at most /{MAX_PREFIX_V4} for IPv4, /{MAX_PREFIX_V6} for IPv6); ignored"
        ));
        return None;
    }
    if net.trunc() != net {
        warnings.push(format!(
            "{origin}: {raw} has host bits set; using {}",
            net.trunc()
        ));
    }
    Some(net.trunc())
}

/// One candidate per (source, family), in priority order.
struct Candidate {
    net: IpNet,
    source: CidrSource,
    detail: String,
}

fn candidates(
    node: &NodeManifest,
    config: &[String],
    warnings: &mut Vec<String>,
) -> Vec<Candidate> {
    let mut out = Vec::new();
    let spec = &node.spec;
    if spec.pod_cidrs.len() > 2 {
        warnings.push(format!(
            "spec.podCIDRs has {} entries (at most 2, one per family); ignored",
            spec.pod_cidrs.len()
        ));
    } else {
        let (mut seen_v4, mut seen_v6) = (false, false);
        for raw in &spec.pod_cidrs {
            if let Some(net) = parse_cidr(raw, "spec.podCIDRs", warnings) {
                let seen = match net {
                    IpNet::V4(_) => &mut seen_v4,
                    IpNet::V6(_) => &mut seen_v6,
                };
                if *seen {
                    warnings.push(format!(
                        "spec.podCIDRs: second CIDR of the same family {raw} ignored"
                    ));
                    continue;
                }
                *seen = true;
                out.push(Candidate {
                    net,
                    source: CidrSource::SpecPodCidrs,
                    detail: "spec.podCIDRs".into(),
                });
            }
        }
    }
    if let Some(raw) = &spec.pod_cidr
        && let Some(net) = parse_cidr(raw, "spec.podCIDR", warnings)
    {
        out.push(Candidate {
            net,
            source: CidrSource::SpecPodCidr,
            detail: "spec.podCIDR".into(),
        });
    }
    for (names, want_v6) in [(&V4_ANNOTATIONS, false), (&V6_ANNOTATIONS, true)] {
        for name in names {
            let Some(raw) = node.metadata.annotations.get(*name) else {
                continue;
            };
            let origin = format!("annotation {name}");
            if let Some(net) = parse_cidr(raw, &origin, warnings) {
                if matches!(net, IpNet::V6(_)) != want_v6 {
                    warnings.push(format!("{origin}: {raw} is of the wrong family; ignored"));
                    continue;
                }
                out.push(Candidate {
                    net,
                    source: CidrSource::Annotation,
                    detail: (*name).to_string(),
                });
            }
        }
    }
    for raw in config {
        if let Some(net) = parse_cidr(raw, "--pod-cidr", warnings) {
            out.push(Candidate {
                net,
                source: CidrSource::Config,
                detail: "--pod-cidr".into(),
            });
        }
    }
    out
}

/// Chooses each family's CIDR: the first valid candidate in priority order wins.
pub fn select(node: &NodeManifest, config_cidrs: &[String]) -> Result<Selection, NodeError> {
    let mut first: [Option<&String>; 2] = [None, None];
    for raw in config_cidrs {
        let Ok(net) = raw.trim().parse::<IpNet>() else {
            continue;
        };
        let fam = usize::from(net.network().is_ipv6());
        if let Some(prev) = first.get_mut(fam) {
            if let Some(p) = prev {
                return Err(NodeError::DuplicateFamily {
                    first: (*p).clone(),
                    second: raw.clone(),
                    family: if fam == 0 { "IPv4" } else { "IPv6" },
                });
            }
            *prev = Some(raw);
        }
    }
    let mut sel = Selection::default();
    for c in candidates(node, config_cidrs, &mut sel.warnings) {
        let slot = match c.net {
            IpNet::V4(_) => &mut sel.v4,
            IpNet::V6(_) => &mut sel.v6,
        };
        if slot.is_none() {
            *slot = Some(ChosenCidr {
                cidr: c.net,
                source: c.source,
                detail: c.detail,
            });
        }
    }
    if sel.v4.is_none() && sel.v6.is_none() {
        return Err(NodeError::NoCidr {
            skipped: sel.warnings,
        });
    }
    Ok(sel)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(json: &str) -> NodeManifest {
        NodeManifest::parse(json).unwrap()
    }

    fn v4(sel: &Selection) -> (String, CidrSource) {
        let c = sel.v4.as_ref().unwrap();
        (c.cidr.to_string(), c.source)
    }

    #[test]
    fn pod_cidrs_dual_stack_wins_over_everything() {
        let n = node(
            r#"{"spec":{"podCIDRs":["10.0.1.0/24","fd00:1::/64"],"podCIDR":"10.0.9.0/24"},
                "metadata":{"annotations":{"network.weft.io/ipv4-pod-cidr":"10.99.0.0/24"}}}"#,
        );
        let sel = select(&n, &["10.5.0.0/16".into()]).unwrap();
        assert_eq!(v4(&sel), ("10.0.1.0/24".into(), CidrSource::SpecPodCidrs));
        let v6 = sel.v6.unwrap();
        assert_eq!(v6.cidr.to_string(), "fd00:1::/64");
        assert_eq!(v6.source, CidrSource::SpecPodCidrs);
    }

    #[test]
    fn pod_cidr_beats_annotation() {
        let n = node(
            r#"{"spec":{"podCIDR":"10.0.1.0/24"},
                "metadata":{"annotations":{"network.weft.io/ipv4-pod-cidr":"10.99.0.0/24"}}}"#,
        );
        let sel = select(&n, &[]).unwrap();
        assert_eq!(v4(&sel), ("10.0.1.0/24".into(), CidrSource::SpecPodCidr));
        assert!(sel.v6.is_none());
    }

    #[test]
    fn invalid_pod_cidr_falls_back_to_annotation() {
        let n = node(
            r#"{"spec":{"podCIDR":"10.0.1.0/33"},
                "metadata":{"annotations":{"network.weft.io/ipv4-pod-cidr":"10.99.0.0/24"}}}"#,
        );
        let sel = select(&n, &[]).unwrap();
        assert_eq!(v4(&sel), ("10.99.0.0/24".into(), CidrSource::Annotation));
        assert!(sel.warnings.iter().any(|w| w.contains("spec.podCIDR")));
    }

    #[test]
    fn cilium_annotation_names_are_accepted() {
        for name in [
            "network.cilium.io/ipv4-pod-cidr",
            "io.cilium.network.ipv4-pod-cidr",
        ] {
            let n = node(&format!(
                r#"{{"metadata":{{"annotations":{{"{name}":"10.7.0.0/24"}}}}}}"#
            ));
            let sel = select(&n, &[]).unwrap();
            assert_eq!(sel.v4.unwrap().detail, name);
        }
    }

    #[test]
    fn annotation_of_wrong_family_is_skipped() {
        let n =
            node(r#"{"metadata":{"annotations":{"network.weft.io/ipv4-pod-cidr":"fd00::/64"}}}"#);
        let sel = select(&n, &["10.1.0.0/24".into()]).unwrap();
        assert_eq!(v4(&sel), ("10.1.0.0/24".into(), CidrSource::Config));
        assert!(sel.v6.is_none());
    }

    #[test]
    fn config_is_the_last_resort() {
        let sel = select(&NodeManifest::default(), &["10.2.0.0/24".into()]).unwrap();
        assert_eq!(v4(&sel), ("10.2.0.0/24".into(), CidrSource::Config));
    }

    #[test]
    fn nothing_usable_is_an_error_naming_every_source() {
        let n = node(r#"{"spec":{"podCIDR":"garbage"}}"#);
        let err = select(&n, &[]).unwrap_err().to_string();
        for s in ["spec.podCIDRs", "spec.podCIDR", "annotation", "--pod-cidr"] {
            assert!(err.contains(s), "{err} should name {s}");
        }
    }

    #[test]
    fn too_many_pod_cidrs_are_ignored_whole() {
        let n = node(
            r#"{"spec":{"podCIDRs":["10.0.1.0/24","fd00::/64","10.0.2.0/24"],"podCIDR":"10.0.3.0/24"}}"#,
        );
        let sel = select(&n, &[]).unwrap();
        assert_eq!(v4(&sel), ("10.0.3.0/24".into(), CidrSource::SpecPodCidr));
    }

    #[test]
    fn host_bits_are_cleared_and_tiny_pools_refused() {
        let sel = select(&NodeManifest::default(), &["10.3.0.7/24".into()]).unwrap();
        assert_eq!(v4(&sel).0, "10.3.0.0/24");
        assert!(select(&NodeManifest::default(), &["10.3.0.0/31".into()]).is_err());
    }

    #[test]
    fn default_routes_and_too_wide_cidrs_are_refused_by_value() {
        for (raw, why) in [
            ("0.0.0.0/0", "default route"),
            ("::/0", "default route"),
            ("10.0.0.0/7", "too wide"),
            ("fd00::/47", "too wide"),
        ] {
            let err = select(&NodeManifest::default(), &[raw.into()])
                .unwrap_err()
                .to_string();
            assert!(err.contains(raw) && err.contains(why), "{raw}: {err}");
        }
        assert!(select(&NodeManifest::default(), &["10.0.0.0/8".into()]).is_ok());
        assert!(select(&NodeManifest::default(), &["fd00::/48".into()]).is_ok());
    }

    #[test]
    fn two_pod_cidrs_of_one_family_are_refused() {
        let err = select(
            &NodeManifest::default(),
            &["10.1.0.0/24".into(), "10.1.0.0/16".into()],
        )
        .unwrap_err();
        assert!(matches!(err, NodeError::DuplicateFamily { .. }), "{err}");
        assert!(err.to_string().contains("10.1.0.0/16"));
    }

    #[test]
    fn yaml_manifest_parses() {
        let n = NodeManifest::parse(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: n1\nspec:\n  podCIDR: 10.0.4.0/24\n",
        )
        .unwrap();
        assert_eq!(n.metadata.name.as_deref(), Some("n1"));
        assert_eq!(v4(&select(&n, &[]).unwrap()).0, "10.0.4.0/24");
    }

    #[test]
    fn router_ip_is_first_usable() {
        let sel = select(
            &NodeManifest::default(),
            &["10.0.1.0/24".into(), "fd00::/64".into()],
        )
        .unwrap();
        assert_eq!(sel.v4.unwrap().router_ip().to_string(), "10.0.1.1");
        assert_eq!(sel.v6.unwrap().router_ip().to_string(), "fd00::1");
    }
}

#[cfg(test)]
mod testdata {
    use super::*;

    fn load(name: &str) -> NodeManifest {
        NodeManifest::load(
            &Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../testdata/nodes")
                .join(name),
        )
        .unwrap()
    }

    fn pick(name: &str) -> Result<Vec<(String, CidrSource, String)>, NodeError> {
        Ok(select(&load(name), &[])?
            .cidrs()
            .into_iter()
            .map(|c| (c.cidr.to_string(), c.source, c.detail))
            .collect())
    }

    #[test]
    fn every_testdata_manifest_gives_its_documented_outcome() {
        use CidrSource::{Annotation, SpecPodCidr, SpecPodCidrs};
        let s = |a: &str| a.to_string();
        assert_eq!(
            pick("podcidrs-dual-stack.json").unwrap(),
            [
                (s("10.0.2.0/24"), SpecPodCidrs, s("spec.podCIDRs")),
                (s("fd00:10:2::/64"), SpecPodCidrs, s("spec.podCIDRs"))
            ]
        );
        assert_eq!(
            pick("podcidr-only.yaml").unwrap(),
            [(s("10.0.3.0/24"), SpecPodCidr, s("spec.podCIDR"))]
        );
        assert_eq!(
            pick("annotation-only.json").unwrap(),
            [
                (
                    s("10.0.4.0/24"),
                    Annotation,
                    s("network.weft.io/ipv4-pod-cidr")
                ),
                (
                    s("fd00:10:4::/64"),
                    Annotation,
                    s("network.cilium.io/ipv6-pod-cidr")
                )
            ]
        );
        assert_eq!(
            pick("podcidr-and-annotation.json").unwrap(),
            [(s("10.0.1.0/24"), SpecPodCidr, s("spec.podCIDR"))]
        );
        assert_eq!(
            pick("invalid-podcidr-valid-annotation.yaml").unwrap(),
            [(
                s("10.0.5.0/24"),
                Annotation,
                s("io.cilium.network.ipv4-pod-cidr")
            )]
        );
        assert!(matches!(
            pick("no-cidr.json"),
            Err(NodeError::NoCidr { .. })
        ));
    }
}
