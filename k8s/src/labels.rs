//! Endpoint labels from a Pod and its Namespace, as Cilium's agent derives them: the pod's
//! labels (source `k8s`), `io.kubernetes.pod.namespace`, the namespace's labels mirrored as
//! `io.cilium.k8s.namespace.labels.<key>` (what `namespaceSelector` translates to) and the
//! service account as `io.cilium.k8s.policy.serviceaccount`.

use k8s_openapi::api::core::v1::Pod;
use std::collections::BTreeMap;
use weft_policy::labels::{Label, LabelSet, keys, source};

/// Cilium's label key for a pod's service account.
pub const SERVICE_ACCOUNT: &str = "io.cilium.k8s.policy.serviceaccount";

/// Labels controllers put on every pod of a rollout; Cilium's default identity-relevant label
/// filter drops them, or every rollout would mint a new identity for the same workload.
const IGNORED: [&str; 3] = [
    "pod-template-hash",
    "controller-revision-hash",
    "pod-template-generation",
];

/// Keys a pod must not set on itself: they name its namespace or that namespace's labels,
/// which only the manager may assert.
fn managed(key: &str) -> bool {
    key == keys::POD_NAMESPACE
        || key.starts_with(keys::NAMESPACE_LABELS_PREFIX)
        || key == SERVICE_ACCOUNT
}

/// The security labels of `pod`'s endpoint. `namespace_labels`: the labels of the pod's
/// Namespace when the cache has it; without it only `kubernetes.io/metadata.name` is mirrored
/// (Kubernetes sets that label on every namespace, so it is known from the name alone).
#[must_use]
pub fn endpoint_labels(pod: &Pod, namespace_labels: Option<&BTreeMap<String, String>>) -> LabelSet {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let mut set = LabelSet::new();
    for (k, v) in pod.metadata.labels.iter().flatten() {
        if !managed(k) && !IGNORED.contains(&k.as_str()) {
            set.insert(Label::new(source::K8S, k, v));
        }
    }
    set.insert(Label::new(source::K8S, keys::POD_NAMESPACE, ns));
    for (k, v) in namespace_labels.into_iter().flatten() {
        let key = format!("{}{k}", keys::NAMESPACE_LABELS_PREFIX);
        set.insert(Label::new(source::K8S, &key, v));
    }
    // Set last: a namespace object cannot rename itself either.
    let name_key = format!("{}{}", keys::NAMESPACE_LABELS_PREFIX, keys::NAMESPACE_NAME);
    set.insert(Label::new(source::K8S, &name_key, ns));
    let sa = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.as_deref())
        .filter(|s| !s.is_empty());
    if let Some(sa) = sa {
        set.insert(Label::new(source::K8S, SERVICE_ACCOUNT, sa));
    }
    set
}

/// A named container port (`spec.containers[].ports[]` with a `name`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct NamedPort {
    /// The port's name (an `IANA_SVC_NAME`).
    pub name: String,
    /// `containerPort`.
    pub port: u16,
    /// `TCP`, `UDP` or `SCTP` (Kubernetes defaults to TCP).
    pub protocol: String,
}

/// The pod's named ports, sorted; unnamed ports and out-of-range numbers are skipped.
#[must_use]
pub fn named_ports(pod: &Pod) -> Vec<NamedPort> {
    let mut out: Vec<NamedPort> = pod
        .spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            Some(NamedPort {
                name: p.name.clone().filter(|n| !n.is_empty())?,
                port: u16::try_from(p.container_port).ok().filter(|p| *p > 0)?,
                protocol: p.protocol.clone().unwrap_or_else(|| "TCP".to_owned()),
            })
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The pod's named ports as policy computation resolves them: (name, IP protocol) → port.
/// A name on two containers with different numbers is ambiguous; like Cilium, the first
/// (lowest number) wins and the conflict is logged.
#[must_use]
pub fn policy_named_ports(pod: &Pod) -> weft_policy::rule::NamedPorts {
    use weft_policy::mapstate::proto;
    let mut out = weft_policy::rule::NamedPorts::new();
    for p in named_ports(pod) {
        let Some(number) = (match p.protocol.as_str() {
            "TCP" => Some(proto::TCP),
            "UDP" => Some(proto::UDP),
            "SCTP" => Some(proto::SCTP),
            _ => None,
        }) else {
            continue;
        };
        match out.entry((p.name.clone(), number)) {
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(p.port);
            }
            std::collections::btree_map::Entry::Occupied(o) if *o.get() != p.port => {
                tracing::warn!(
                    pod = ?pod.metadata.name,
                    name = %p.name,
                    used = *o.get(),
                    ignored = p.port,
                    "named port defined twice with different numbers"
                );
            }
            std::collections::btree_map::Entry::Occupied(_) => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata;
    use k8s_openapi::api::core::v1::Namespace;

    fn strings(set: &LabelSet) -> Vec<String> {
        set.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn pod_and_namespace_labels() {
        let pod: Pod = testdata::load("pod-web.json");
        let ns: Namespace = testdata::load("namespace-prod.json");
        let set = endpoint_labels(&pod, ns.metadata.labels.as_ref());
        assert_eq!(
            strings(&set),
            [
                "k8s:app=web",
                "k8s:io.cilium.k8s.namespace.labels.env=production",
                "k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name=prod",
                "k8s:io.cilium.k8s.namespace.labels.team=payments",
                "k8s:io.cilium.k8s.policy.serviceaccount=web-sa",
                "k8s:io.kubernetes.pod.namespace=prod",
                "k8s:tier=frontend",
            ]
        );
    }

    #[test]
    fn without_the_namespace_only_its_name_is_mirrored() {
        let pod: Pod = testdata::load("pod-web.json");
        let set = endpoint_labels(&pod, None);
        let s = strings(&set);
        assert!(s.contains(
            &"k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name=prod".to_owned()
        ));
        assert!(!s.iter().any(|l| l.contains("labels.team")), "{s:?}");
    }

    #[test]
    fn a_pod_cannot_claim_namespace_labels() {
        let mut pod: Pod = testdata::load("pod-web.json");
        let labels = pod.metadata.labels.get_or_insert_default();
        labels.insert("io.kubernetes.pod.namespace".into(), "kube-system".into());
        labels.insert("io.cilium.k8s.namespace.labels.team".into(), "ops".into());
        labels.insert(SERVICE_ACCOUNT.into(), "admin".into());
        let s = strings(&endpoint_labels(&pod, None));
        assert!(s.contains(&"k8s:io.kubernetes.pod.namespace=prod".to_owned()));
        assert!(s.contains(&"k8s:io.cilium.k8s.policy.serviceaccount=web-sa".to_owned()));
        assert!(
            !s.iter()
                .any(|l| l.contains("team=ops") || l.contains("kube-system")),
            "{s:?}"
        );
    }

    #[test]
    fn named_ports_from_every_container() {
        let pod: Pod = testdata::load("pod-web.json");
        let names: Vec<(String, u16, String)> = named_ports(&pod)
            .into_iter()
            .map(|p| (p.name, p.port, p.protocol))
            .collect();
        assert_eq!(
            names,
            [
                ("dns-udp".into(), 5353, "UDP".into()),
                ("http".into(), 8080, "TCP".into()),
                ("metrics".into(), 9100, "TCP".into()),
            ]
        );
    }

    #[test]
    fn policy_named_ports_are_keyed_by_name_and_protocol() {
        let pod: Pod = testdata::load("pod-web.json");
        let ports = policy_named_ports(&pod);
        assert_eq!(ports.get(&("http".into(), 6)), Some(&8080));
        assert_eq!(ports.get(&("dns-udp".into(), 17)), Some(&5353));
        assert_eq!(ports.get(&("dns-udp".into(), 6)), None);
        assert_eq!(ports.len(), 3);
    }
}
