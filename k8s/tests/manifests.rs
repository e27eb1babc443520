//! Every manifest in conf/k8s/ deserialises into its typed k8s-openapi object with no field
//! left over, so a typo (`hostNetwrok`, a misplaced `mountPropagation`) fails here instead of
//! being silently dropped by the API server's lenient decoding.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    reason = "an integration test crate: its helpers panic with context like its tests (clippy.toml's allow-*-in-tests covers only #[test] functions)"
)]

use serde::de::DeserializeOwned;
use serde_json::Value;
use std::path::PathBuf;
use weft_k8s::k8s_openapi::api::apps::v1::DaemonSet;
use weft_k8s::k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use weft_k8s::k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use weft_k8s::k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

fn conf_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../conf/k8s")
}

/// Deserialises `v` as `T`, failing on any field `T` does not have.
fn strict<T: DeserializeOwned>(v: Value) -> Result<T, String> {
    let mut unknown = Vec::new();
    // serde_ignored writes `?` for each Option layer (k8s-openapi wraps most fields): drop them.
    let t: T = serde_ignored::deserialize(v, |path| {
        unknown.push(path.to_string().replace(".?", "").replace("?.", ""));
    })
    .map_err(|e| e.to_string())?;
    if unknown.is_empty() {
        Ok(t)
    } else {
        Err(format!("unknown fields: {}", unknown.join(", ")))
    }
}

/// Every document of every file: (file, kind, object).
fn documents() -> Vec<(String, String, Value)> {
    let mut out = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(conf_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    for path in files {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            path.extension().is_some_and(|e| e == "yaml"),
            "{name}: conf/k8s/ holds only .yaml manifests"
        );
        let text = std::fs::read_to_string(&path).unwrap();
        let docs: Vec<Value> =
            serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{name}: not YAML: {e}"));
        for doc in docs.into_iter().filter(|d| !d.is_null()) {
            let kind = doc["kind"].as_str().unwrap_or_default().to_owned();
            out.push((name.clone(), kind, doc));
        }
    }
    out
}

fn check(kind: &str, v: Value) -> Result<(), String> {
    match kind {
        "CustomResourceDefinition" => strict::<CustomResourceDefinition>(v).map(drop),
        "ServiceAccount" => strict::<ServiceAccount>(v).map(drop),
        "ClusterRole" => strict::<ClusterRole>(v).map(drop),
        "ClusterRoleBinding" => strict::<ClusterRoleBinding>(v).map(drop),
        "ConfigMap" => strict::<ConfigMap>(v).map(drop),
        "DaemonSet" => strict::<DaemonSet>(v).map(drop),
        other => Err(format!("unexpected kind {other:?}: add it to this test")),
    }
}

#[test]
fn every_manifest_is_its_typed_object_exactly() {
    let docs = documents();
    let mut kinds: Vec<&str> = docs.iter().map(|(_, k, _)| k.as_str()).collect();
    kinds.sort_unstable();
    assert_eq!(
        kinds,
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "CustomResourceDefinition",
            "CustomResourceDefinition",
            "CustomResourceDefinition",
            "CustomResourceDefinition",
            "CustomResourceDefinition",
            "CustomResourceDefinition",
            "DaemonSet",
            "ServiceAccount"
        ]
    );
    for (file, kind, v) in docs {
        check(&kind, v).unwrap_or_else(|e| panic!("{file}: {kind}: {e}"));
    }
}

#[test]
fn a_typo_is_refused() {
    let (_, _, mut ds) = documents()
        .into_iter()
        .find(|(_, k, _)| k == "DaemonSet")
        .unwrap();
    ds["spec"]["template"]["spec"]["hostNetwrok"] = true.into();
    let e = check("DaemonSet", ds).unwrap_err();
    assert!(e.contains("spec.template.spec.hostNetwrok"), "{e}");
}

#[test]
fn daemonset_is_what_the_node_agent_needs() {
    let (_, _, v) = documents()
        .into_iter()
        .find(|(_, k, _)| k == "DaemonSet")
        .unwrap();
    let ds: DaemonSet = strict(v).unwrap();
    let template = ds.spec.unwrap().template;
    let annotations = template.metadata.unwrap().annotations.unwrap_or_default();
    let pod = template.spec.unwrap();
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(pod.service_account_name.as_deref(), Some("weft"));
    let c = &pod.containers[0];
    assert_eq!(c.security_context.as_ref().unwrap().privileged, Some(true));
    assert!(c.readiness_probe.is_some() && c.liveness_probe.is_some());
    // Prometheus finds the metrics port by the annotations; it must be the one the manager
    // listens on (metrics_listen in the ConfigMap).
    let port = c
        .ports
        .as_ref()
        .unwrap()
        .iter()
        .find(|p| p.name.as_deref() == Some("prometheus"));
    assert_eq!(port.map(|p| p.container_port), Some(9962));
    assert_eq!(
        annotations.get("prometheus.io/scrape").map(String::as_str),
        Some("true")
    );
    assert_eq!(
        annotations.get("prometheus.io/port").map(String::as_str),
        Some("9962")
    );
    let (_, _, cm) = documents()
        .into_iter()
        .find(|(_, k, _)| k == "ConfigMap")
        .unwrap();
    let toml = cm["data"]["manager.toml"].as_str().unwrap();
    assert!(
        toml.lines()
            .any(|l| l.trim() == "metrics_listen = \":9962\""),
        "{toml}"
    );
    let env = c.env.as_ref().unwrap();
    let node = env.iter().find(|e| e.name == "NODE_NAME").unwrap();
    let field = node
        .value_from
        .as_ref()
        .unwrap()
        .field_ref
        .as_ref()
        .unwrap();
    assert_eq!(field.field_path, "spec.nodeName");
    let host_paths: Vec<String> = pod
        .volumes
        .unwrap()
        .into_iter()
        .filter_map(|v| Some(v.host_path?.path))
        .collect();
    for p in [
        "/sys/fs/bpf",
        "/opt/cni/bin",
        "/etc/cni/net.d",
        "/run/weft",
        "/var/lib/weft",
    ] {
        assert!(
            host_paths.iter().any(|h| h == p),
            "{p} not mounted: {host_paths:?}"
        );
    }
}

#[test]
fn cluster_role_grants_only_reads_the_node_patch_the_cnp_status_and_crd_mode_writes() {
    let (_, _, v) = documents()
        .into_iter()
        .find(|(_, k, _)| k == "ClusterRole")
        .unwrap();
    let role: ClusterRole = strict(v).unwrap();
    for rule in role.rules.unwrap() {
        let resources = rule.resources.unwrap_or_default();
        for verb in &rule.verbs {
            // CRD identity mode: numbers reserved by create and collected by delete; keys
            // also touched by patch; endpoints applied (patch) and deleted.
            let weft = resources == ["weftidentities"]
                || resources == ["weftidentitykeys"]
                || resources == ["weftendpoints"];
            let allowed = match verb.as_str() {
                "list" | "watch" => true,
                "get" | "create" | "delete" if weft => true,
                "patch" if resources == ["weftidentitykeys"] || resources == ["weftendpoints"] => {
                    true
                }
                "get" => resources == ["nodes"] || resources == ["clusternetworkpolicies"],
                "patch" => resources == ["nodes"] || resources == ["clusternetworkpolicies/status"],
                "update" => resources == ["clusternetworkpolicies/status"],
                _ => false,
            };
            assert!(
                allowed,
                "verb {verb} on {resources:?} is more than Weft needs"
            );
        }
    }
}

#[test]
fn cluster_role_lets_every_watcher_list_and_watch() {
    let (_, _, v) = documents()
        .into_iter()
        .find(|(_, k, _)| k == "ClusterRole")
        .unwrap();
    let role: ClusterRole = strict(v).unwrap();
    let grants = |group: &str, resource: &str, verb: &str| {
        role.rules.iter().flatten().any(|r| {
            r.api_groups.iter().flatten().any(|g| g == group)
                && r.resources.iter().flatten().any(|x| x == resource)
                && r.verbs.iter().any(|v| v == verb)
        })
    };
    for (group, resource) in [
        ("", "nodes"),
        ("", "pods"),
        ("", "namespaces"),
        ("", "services"),
        ("networking.k8s.io", "networkpolicies"),
        ("discovery.k8s.io", "endpointslices"),
        ("cilium.io", "ciliumnetworkpolicies"),
        ("cilium.io", "ciliumclusterwidenetworkpolicies"),
        ("policy.networking.k8s.io", "clusternetworkpolicies"),
        ("weft.io", "weftidentities"),
        ("weft.io", "weftidentitykeys"),
        ("weft.io", "weftendpoints"),
    ] {
        for verb in ["list", "watch"] {
            assert!(
                grants(group, resource, verb),
                "{verb} {resource} in group {group:?} is not granted"
            );
        }
    }
    // ClusterNetworkPolicy status.conditions are written back (accepted or rejected).
    for verb in ["patch", "update"] {
        assert!(
            grants(
                "policy.networking.k8s.io",
                "clusternetworkpolicies/status",
                verb
            ),
            "{verb} clusternetworkpolicies/status is not granted"
        );
    }
    // CRD identity mode's calls (manager/src/crd/kube.rs).
    for (resource, verb) in [
        ("weftidentities", "get"),
        ("weftidentities", "create"),
        ("weftidentities", "delete"),
        ("weftidentitykeys", "get"),
        ("weftidentitykeys", "create"),
        ("weftidentitykeys", "patch"),
        ("weftidentitykeys", "delete"),
        ("weftendpoints", "get"),
        ("weftendpoints", "patch"),
        ("weftendpoints", "delete"),
    ] {
        assert!(
            grants("weft.io", resource, verb),
            "{verb} {resource} (CRD identity mode) is not granted"
        );
    }
}

/// Every property of a structural schema has its type.
fn typed(path: &str, s: &serde_json::Value) {
    assert!(s["type"].is_string(), "{path}: no type");
    for (k, p) in s["properties"].as_object().into_iter().flatten() {
        typed(&format!("{path}.{k}"), p);
    }
    if !s["items"].is_null() {
        typed(&format!("{path}[]"), &s["items"]);
    }
}

/// The CRDs of CRD identity mode are structural (every property typed, as an API server
/// requires of apiextensions.k8s.io/v1) and name what manager/src/crd/kube.rs uses.
#[test]
fn weft_crds_are_structural_and_match_the_manager() {
    let crds: Vec<CustomResourceDefinition> = documents()
        .into_iter()
        .filter(|(file, _, _)| file == "00-crd-weft.yaml")
        .map(|(_, _, v)| strict(v).unwrap())
        .collect();
    let names: Vec<(&str, &str, &str)> = crds
        .iter()
        .map(|c| {
            (
                c.spec.names.kind.as_str(),
                c.spec.names.plural.as_str(),
                c.spec.scope.as_str(),
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            ("WeftIdentity", "weftidentities", "Cluster"),
            ("WeftIdentityKey", "weftidentitykeys", "Cluster"),
            ("WeftEndpoint", "weftendpoints", "Namespaced")
        ]
    );
    for c in &crds {
        assert_eq!(c.spec.group, "weft.io");
        let v = &c.spec.versions[0];
        assert_eq!(
            (v.name.as_str(), v.served, v.storage),
            ("v1alpha1", true, true)
        );
        let schema = serde_json::to_value(&v.schema.as_ref().unwrap().open_api_v3_schema).unwrap();
        typed(&c.spec.names.kind, &schema);
    }
}

#[test]
fn cluster_network_policy_crd_is_the_conformance_suites_release() {
    // The conformance suite refuses to run (and its report names the release) by these
    // annotations; v1beta1 is the stored version, v1alpha2 still served.
    let (_, _, v) = documents()
        .into_iter()
        .find(|(_, k, d)| {
            k == "CustomResourceDefinition"
                && d["metadata"]["name"] == "clusternetworkpolicies.policy.networking.k8s.io"
        })
        .unwrap();
    let crd: CustomResourceDefinition = strict(v).unwrap();
    let annotations = crd.metadata.annotations.unwrap_or_default();
    assert_eq!(
        annotations
            .get("policy.networking.k8s.io/bundle-version")
            .map(String::as_str),
        Some("v0.3.0")
    );
    assert_eq!(
        annotations
            .get("policy.networking.k8s.io/channel")
            .map(String::as_str),
        Some("standard")
    );
    assert_eq!(crd.spec.scope, "Cluster");
    let versions: Vec<(&str, bool, bool)> = crd
        .spec
        .versions
        .iter()
        .map(|v| (v.name.as_str(), v.served, v.storage))
        .collect();
    assert_eq!(
        versions,
        [("v1alpha2", true, false), ("v1beta1", true, true)]
    );
}
