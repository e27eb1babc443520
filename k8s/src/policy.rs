//! `NetworkPolicy`, `CiliumNetworkPolicy` and `CiliumClusterwideNetworkPolicy` objects into policy
//! repository rules. Each object's rules carry Cilium's derived labels (kind, namespace, name,
//! uid), which is how the repository replaces an object's rules as a whole and deletes them
//! with it, plus `k8s:io.weft.policy.origin=cluster` so `weftctl policy list` can tell them from
//! what `weftctl policy import` added.

use serde_json::Value;
use std::fmt;
use weft_policy::labels::{Label, keys, source};
use weft_policy::rule::Rule;

/// Rule label key marking rules that came from the API server.
pub const ORIGIN_KEY: &str = "io.weft.policy.origin";
/// Its value.
pub const ORIGIN_CLUSTER: &str = "cluster";

/// The three policy kinds Weft follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PolicyKind {
    /// networking.k8s.io/v1 `NetworkPolicy`.
    NetworkPolicy,
    /// cilium.io/v2 `CiliumNetworkPolicy`.
    CiliumNetworkPolicy,
    /// cilium.io/v2 `CiliumClusterwideNetworkPolicy`.
    CiliumClusterwideNetworkPolicy,
}

impl PolicyKind {
    /// The `kind` field and derived-from label value.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NetworkPolicy => "NetworkPolicy",
            Self::CiliumNetworkPolicy => "CiliumNetworkPolicy",
            Self::CiliumClusterwideNetworkPolicy => "CiliumClusterwideNetworkPolicy",
        }
    }
}

/// Which object a set of rules came from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PolicyKey {
    /// Kind.
    pub kind: PolicyKind,
    /// Namespace (none for the clusterwide kind).
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
}

impl fmt::Display for PolicyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {ns}/{}", self.kind.as_str(), self.name),
            None => write!(f, "{} {}", self.kind.as_str(), self.name),
        }
    }
}

impl PolicyKey {
    /// The key of an object as the API server returns it.
    pub fn of(kind: PolicyKind, obj: &Value) -> Result<Self, String> {
        let meta = obj.get("metadata");
        let name = meta
            .and_then(|m| m.get("name"))
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| format!("{} without metadata.name", kind.as_str()))?;
        let namespace = match kind {
            PolicyKind::CiliumClusterwideNetworkPolicy => None,
            _ => Some(
                meta.and_then(|m| m.get("namespace"))
                    .and_then(Value::as_str)
                    .unwrap_or("default")
                    .to_owned(),
            ),
        };
        Ok(Self {
            kind,
            namespace,
            name: name.to_owned(),
        })
    }

    /// Labels every rule of this object carries: what deleting the object deletes.
    #[must_use]
    pub fn filter(&self) -> Vec<Label> {
        let mut out = vec![
            Label::new(source::K8S, keys::POLICY_DERIVED_FROM, self.kind.as_str()),
            Label::new(source::K8S, keys::POLICY_NAME, &self.name),
        ];
        if let Some(ns) = &self.namespace {
            out.push(Label::new(source::K8S, keys::POLICY_NAMESPACE, ns));
        }
        out.push(origin_label());
        out
    }

    /// The key of a cluster-sourced rule, from its labels; `None` for other rules.
    #[must_use]
    pub fn of_rule(rule: &Rule) -> Option<Self> {
        let get = |k: &str| {
            rule.labels
                .iter()
                .find(|l| l.source == source::K8S && l.key == k)
                .map(|l| l.value.clone())
        };
        if get(ORIGIN_KEY).as_deref() != Some(ORIGIN_CLUSTER) {
            return None;
        }
        let kind = match get(keys::POLICY_DERIVED_FROM)?.as_str() {
            "NetworkPolicy" => PolicyKind::NetworkPolicy,
            "CiliumNetworkPolicy" => PolicyKind::CiliumNetworkPolicy,
            "CiliumClusterwideNetworkPolicy" => PolicyKind::CiliumClusterwideNetworkPolicy,
            _ => return None,
        };
        Some(Self {
            kind,
            namespace: get(keys::POLICY_NAMESPACE),
            name: get(keys::POLICY_NAME)?,
        })
    }
}

/// `k8s:io.weft.policy.origin=cluster`.
#[must_use]
pub fn origin_label() -> Label {
    Label::new(source::K8S, ORIGIN_KEY, ORIGIN_CLUSTER)
}

/// The rules of one object, with the origin label. `Err`: why the object is rejected, in the
/// policy parser's words (field path and the fix).
pub fn translate(kind: PolicyKind, obj: &Value) -> Result<(PolicyKey, Vec<Rule>), String> {
    let key = PolicyKey::of(kind, obj)?;
    // Watch events of typed resources may omit apiVersion/kind; the parser dispatches on them.
    let mut obj = obj.clone();
    if let Some(map) = obj.as_object_mut() {
        let api = match kind {
            PolicyKind::NetworkPolicy => "networking.k8s.io/v1",
            _ => "cilium.io/v2",
        };
        map.entry("apiVersion").or_insert_with(|| api.into());
        map.entry("kind").or_insert_with(|| kind.as_str().into());
    }
    let text = serde_json::to_string(&obj).map_err(|e| e.to_string())?;
    let mut rules = weft_policy::parse::parse_policy_file(&key.to_string(), &text)
        .map_err(|e| e.to_string())?;
    for r in &mut rules {
        r.labels.insert(origin_label());
    }
    Ok((key, rules))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata;
    use weft_policy::labels::LabelSet;
    use weft_policy::mapstate::Direction;

    fn pod(ns: &str, labels: &[(&str, &str)], ns_labels: &[(&str, &str)]) -> LabelSet {
        let mut set = LabelSet::for_pod(ns, labels.iter().copied());
        for (k, v) in ns_labels {
            set.insert(Label::new(
                "k8s",
                &format!("io.cilium.k8s.namespace.labels.{k}"),
                v,
            ));
        }
        set
    }

    #[test]
    fn cnp_is_namespaced_and_marked_as_cluster() {
        let (key, rules) =
            translate(PolicyKind::CiliumNetworkPolicy, &testdata::json("cnp.json")).unwrap();
        assert_eq!(
            key.to_string(),
            "CiliumNetworkPolicy prod/web-from-frontend"
        );
        assert_eq!(rules.len(), 1);
        let r = &rules[0];
        assert_eq!(PolicyKey::of_rule(r), Some(key.clone()));
        for l in key.filter() {
            assert!(r.labels.iter().any(|x| *x == l), "{l} missing");
        }
        assert!(
            r.endpoint_selector
                .matches(&pod("prod", &[("app", "web")], &[]))
        );
        assert!(
            !r.endpoint_selector
                .matches(&pod("dev", &[("app", "web")], &[]))
        );
    }

    #[test]
    fn ccnp_selects_every_namespace() {
        let (key, rules) = translate(
            PolicyKind::CiliumClusterwideNetworkPolicy,
            &testdata::json("ccnp.json"),
        )
        .unwrap();
        assert_eq!(key.namespace, None);
        assert_eq!(PolicyKey::of_rule(&rules[0]), Some(key));
        assert!(rules[0].applies(Direction::Egress));
        assert!(rules[0].endpoint_selector.matches(&pod("a", &[], &[])));
        assert!(
            rules[0]
                .endpoint_selector
                .matches(&pod("b", &[("x", "y")], &[]))
        );
    }

    #[test]
    fn network_policy_namespace_selector_on_any_key() {
        let obj = testdata::json("networkpolicy-ns-expr-named-port.json");
        let (_, rules) = translate(PolicyKind::NetworkPolicy, &obj).unwrap();
        assert!(rules[0].ingress[0].ports.is_empty());
        assert_eq!(
            rules[0].ingress[0].named_ports,
            [weft_policy::rule::NamedPort {
                proto: 6,
                name: "http".into()
            }]
        );
        let peer = match &rules[0].ingress[0].peers[0] {
            weft_policy::rule::PeerSelector::Endpoints(s) => s.clone(),
            other => panic!("{other}"),
        };
        assert!(peer.matches(&pod("shop", &[], &[("team", "billing")])));
        assert!(!peer.matches(&pod("shop", &[], &[("team", "ops")])));
        assert!(!peer.matches(&pod("shop", &[], &[])));
    }

    #[test]
    fn rejected_object_says_why() {
        let mut obj = testdata::json("networkpolicy-ns-expr-named-port.json");
        obj["spec"]["egress"] = obj["spec"]["ingress"].clone();
        obj["spec"]["egress"][0]["to"] = obj["spec"]["egress"][0]["from"].take();
        obj["spec"]["policyTypes"] = serde_json::json!(["Ingress", "Egress"]);
        let err = translate(PolicyKind::NetworkPolicy, &obj).unwrap_err();
        assert!(
            err.starts_with("NetworkPolicy prod/allow-payments-http"),
            "{err}"
        );
        assert!(
            err.contains("not supported yet: named port \"http\" in an egress rule"),
            "{err}"
        );
    }

    #[test]
    fn imported_rules_have_no_cluster_key() {
        let text = std::fs::read_to_string(testdata::dir().join("cnp.json")).unwrap();
        let rules = weft_policy::parse::parse_policy_file("cnp.json", &text).unwrap();
        assert_eq!(PolicyKey::of_rule(&rules[0]), None);
    }
}
