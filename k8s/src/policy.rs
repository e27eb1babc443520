//! `NetworkPolicy`, `CiliumNetworkPolicy`, `CiliumClusterwideNetworkPolicy` and
//! `ClusterNetworkPolicy` objects into policy repository rules. Each object's rules carry Cilium's derived labels (kind, namespace, name,
//! uid), which is how the repository replaces an object's rules as a whole and deletes them
//! with it, plus `k8s:io.weft.policy.origin=cluster` so `weftctl policy list` can tell them from
//! what `weftctl policy import` added.

use serde_json::Value;
use std::fmt;
use weft_policy::labels::{Label, keys, source};
use weft_policy::parse::NoteKind;
use weft_policy::rule::Rule;

/// Rule label key marking rules that came from the API server.
pub const ORIGIN_KEY: &str = "io.weft.policy.origin";
/// Its value.
pub const ORIGIN_CLUSTER: &str = "cluster";

/// The policy kinds Weft follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PolicyKind {
    /// networking.k8s.io/v1 `NetworkPolicy`.
    NetworkPolicy,
    /// cilium.io/v2 `CiliumNetworkPolicy`.
    CiliumNetworkPolicy,
    /// cilium.io/v2 `CiliumClusterwideNetworkPolicy`.
    CiliumClusterwideNetworkPolicy,
    /// policy.networking.k8s.io/v1beta1 `ClusterNetworkPolicy` (admin and baseline tiers).
    ClusterNetworkPolicy,
}

impl PolicyKind {
    /// The `kind` field and derived-from label value.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NetworkPolicy => "NetworkPolicy",
            Self::CiliumNetworkPolicy => "CiliumNetworkPolicy",
            Self::CiliumClusterwideNetworkPolicy => "CiliumClusterwideNetworkPolicy",
            Self::ClusterNetworkPolicy => "ClusterNetworkPolicy",
        }
    }

    /// Whether its objects are cluster-scoped (no namespace).
    #[must_use]
    pub fn cluster_scoped(self) -> bool {
        matches!(
            self,
            Self::CiliumClusterwideNetworkPolicy | Self::ClusterNetworkPolicy
        )
    }

    /// The apiVersion Weft watches it at.
    #[must_use]
    pub fn api_version(self) -> &'static str {
        match self {
            Self::NetworkPolicy => "networking.k8s.io/v1",
            Self::CiliumNetworkPolicy | Self::CiliumClusterwideNetworkPolicy => "cilium.io/v2",
            Self::ClusterNetworkPolicy => "policy.networking.k8s.io/v1beta1",
        }
    }
}

/// Which object a set of rules came from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PolicyKey {
    /// Kind.
    pub kind: PolicyKind,
    /// Namespace (none for the cluster-scoped kinds).
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
            k if k.cluster_scoped() => None,
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
            "ClusterNetworkPolicy" => PolicyKind::ClusterNetworkPolicy,
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

/// One object translated: its rules and what Weft could not enforce of it, or enforces with a
/// caveat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Translated {
    /// Which object.
    pub key: PolicyKey,
    /// Its rules, with the origin label.
    pub rules: Vec<Rule>,
    /// Parts left out (fail closed: each allows nothing, or a deny widened to its whole
    /// direction), each as `field.path: why; what that means`.
    pub not_enforced: Vec<String>,
    /// Parts enforced with a caveat (e.g. a CIDR with host bits set, masked).
    pub warnings: Vec<String>,
}

/// The rules of one object, with the origin label, failing closed
/// ([`weft_policy::parse::parse_cluster_object`]): a rule Weft cannot express is left out and
/// the object's pods stay isolated. `Err`: the object cannot even be read far enough to know
/// which pods it selects (metadata, `podSelector`/`endpointSelector`, `policyTypes`), in the
/// policy parser's words (field path and the fix).
pub fn translate(kind: PolicyKind, obj: &Value) -> Result<Translated, String> {
    let key = PolicyKey::of(kind, obj)?;
    // Watch events of typed resources may omit apiVersion/kind; the parser dispatches on them.
    let mut obj = obj.clone();
    if let Some(map) = obj.as_object_mut() {
        map.entry("apiVersion")
            .or_insert_with(|| kind.api_version().into());
        map.entry("kind").or_insert_with(|| kind.as_str().into());
    }
    let text = serde_json::to_string(&obj).map_err(|e| e.to_string())?;
    let parsed = weft_policy::parse::parse_cluster_object(&key.to_string(), &text)
        .map_err(|e| e.to_string())?;
    let mut rules = parsed.rules;
    for r in &mut rules {
        r.labels.insert(origin_label());
    }
    let (mut not_enforced, mut warnings) = (Vec::new(), Vec::new());
    for n in parsed.notes {
        match n.kind {
            NoteKind::NotEnforced => not_enforced.push(n.to_string()),
            NoteKind::Warning => warnings.push(n.to_string()),
        }
    }
    Ok(Translated {
        key,
        rules,
        not_enforced,
        warnings,
    })
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
        let Translated { key, rules, .. } =
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
        let Translated { key, rules, .. } = translate(
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
        let rules = translate(PolicyKind::NetworkPolicy, &obj).unwrap().rules;
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
    fn an_egress_named_port_is_enforced() {
        let mut obj = testdata::json("networkpolicy-ns-expr-named-port.json");
        obj["spec"]["egress"] = obj["spec"]["ingress"].clone();
        let rule = obj["spec"]["egress"][0].as_object_mut().unwrap();
        let peers = rule.remove("from").unwrap();
        rule.insert("to".into(), peers);
        obj["spec"]["policyTypes"] = serde_json::json!(["Ingress", "Egress"]);
        let t = translate(PolicyKind::NetworkPolicy, &obj).unwrap();
        assert!(t.not_enforced.is_empty() && t.warnings.is_empty(), "{t:?}");
        assert_eq!(t.rules[0].egress[0].named_ports[0].name, "http");
    }

    #[test]
    fn what_cannot_be_expressed_is_named_and_the_pods_stay_isolated() {
        let mut obj = testdata::json("networkpolicy-ns-expr-named-port.json");
        obj["spec"]["policyTypes"] = serde_json::json!(["Ingress", "Egress"]);
        obj["spec"]["egress"] = serde_json::json!([
            {"to": [{"ipBlock": {"cidr": "10.0.16.5/4"}}], "ports": [{"port": "http"}]}
        ]);
        let t = translate(PolicyKind::NetworkPolicy, &obj).unwrap();
        assert!(t.rules[0].default_deny(Direction::Egress));
        assert!(t.rules[0].egress.is_empty());
        assert_eq!(
            t.not_enforced,
            [
                "spec.egress[0].ports: not supported yet: a named port (http) in an egress rule with an ipBlock peer (give the port number); towards the ipBlock peers this rule allows only its numeric ports"
            ]
        );
        assert!(t.warnings[0].contains("spec.egress[0].to[0].ipBlock.cidr: \"10.0.16.5/4\" has host bits set: enforced as 0.0.0.0/4"), "{:?}", t.warnings);
    }

    #[test]
    fn an_object_whose_selector_cannot_be_read_is_rejected() {
        let mut obj = testdata::json("networkpolicy-ns-expr-named-port.json");
        obj["spec"]["podSelector"] =
            serde_json::json!({"matchExpressions": [{"key": "a", "operator": "Equals"}]});
        let err = translate(PolicyKind::NetworkPolicy, &obj).unwrap_err();
        assert!(
            err.starts_with("NetworkPolicy prod/allow-payments-http"),
            "{err}"
        );
        assert!(err.contains("unknown operator \"Equals\""), "{err}");
    }

    #[test]
    fn cluster_network_policy_is_cluster_scoped_one_rule_per_entry() {
        use weft_policy::mapstate::TierAction;
        let obj = testdata::json("clusternetworkpolicy.json");
        let t = translate(PolicyKind::ClusterNetworkPolicy, &obj).unwrap();
        assert_eq!(t.key.to_string(), "ClusterNetworkPolicy protect-metadata");
        assert_eq!(t.key.namespace, None);
        assert_eq!(t.rules.len(), 2);
        for r in &t.rules {
            assert_eq!(PolicyKey::of_rule(r), Some(t.key.clone()));
            for l in t.key.filter() {
                assert!(r.labels.iter().any(|x| *x == l), "{l} missing");
            }
        }
        let tiers: Vec<_> = t
            .rules
            .iter()
            .map(|r| {
                let x = r.tier.as_ref().unwrap();
                (x.direction, x.index, x.action, x.name.as_str())
            })
            .collect();
        assert_eq!(
            tiers,
            [
                (
                    Direction::Ingress,
                    0,
                    TierAction::Accept,
                    "monitoring-always"
                ),
                (Direction::Egress, 0, TierAction::Deny, "no-metadata"),
            ]
        );
        // Watch events may lack apiVersion and kind: the kind's are filled in.
        let mut bare = obj.clone();
        bare.as_object_mut().unwrap().remove("apiVersion");
        bare.as_object_mut().unwrap().remove("kind");
        assert_eq!(
            translate(PolicyKind::ClusterNetworkPolicy, &bare)
                .unwrap()
                .rules,
            t.rules
        );
    }

    #[test]
    fn a_cluster_network_policy_with_a_nodes_peer_is_rejected_naming_it() {
        let mut obj = testdata::json("clusternetworkpolicy.json");
        obj["spec"]["egress"][0]["to"][0] = serde_json::json!({"nodes": {}});
        let e = translate(PolicyKind::ClusterNetworkPolicy, &obj).unwrap_err();
        assert!(
            e.contains("ClusterNetworkPolicy protect-metadata: ClusterNetworkPolicy \"protect-metadata\": spec.egress[0].to[0].nodes: not supported yet: nodes peers"),
            "{e}"
        );
    }

    #[test]
    fn imported_rules_have_no_cluster_key() {
        let text = std::fs::read_to_string(testdata::dir().join("cnp.json")).unwrap();
        let rules = weft_policy::parse::parse_policy_file("cnp.json", &text).unwrap();
        assert_eq!(PolicyKey::of_rule(&rules[0]), None);
    }
}
