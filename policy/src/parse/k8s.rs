//! Kubernetes objects: `cilium.io/v2 CiliumNetworkPolicy` and `networking.k8s.io/v1
//! NetworkPolicy`, translated as Cilium's `ParseToCiliumRule` and `ParseNetworkPolicy` do.

use super::walk::{self, FieldError, Obj, Res};
use super::{DocError, cilium, join_loc};
use crate::labels::{Label, LabelSet, keys, source};
use crate::mapstate::Direction;
use crate::rule::{CidrSelector, Enforcement, Entity, PeerRule, PeerSelector, PortProto, Rule};
use crate::selector::{Requirement, Selector};
use serde_json::Value;

struct Meta {
    name: String,
    namespace: String,
    uid: Option<String>,
}

/// Object metadata is read leniently: `kubectl get -o yaml` output carries many fields
/// (resourceVersion, managedFields, ...) that do not affect policy.
fn meta(v: &Value) -> Res<Meta> {
    let m = v
        .get("metadata")
        .ok_or_else(|| FieldError::new("metadata", "missing"))?;
    let name = m
        .get("name")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| FieldError::new("metadata.name", "missing"))?;
    // kubectl applies namespaced objects without a namespace to "default".
    let namespace = m
        .get("namespace")
        .and_then(Value::as_str)
        .unwrap_or("default");
    Ok(Meta {
        name: name.to_owned(),
        namespace: namespace.to_owned(),
        uid: m.get("uid").and_then(Value::as_str).map(str::to_owned),
    })
}

fn derived_labels(kind: &str, m: &Meta) -> LabelSet {
    let mut set = LabelSet::new();
    set.insert(Label::new(source::K8S, keys::POLICY_DERIVED_FROM, kind));
    set.insert(Label::new(source::K8S, keys::POLICY_NAME, &m.name));
    set.insert(Label::new(
        source::K8S,
        keys::POLICY_NAMESPACE,
        &m.namespace,
    ));
    if let Some(uid) = &m.uid {
        set.insert(Label::new(source::K8S, keys::POLICY_UID, uid));
    }
    set
}

fn api_version(o: &mut Obj<'_>, expected: &[&str]) -> Res<()> {
    let path = o.at("apiVersion");
    match o.str("apiVersion")? {
        Some(v) if expected.contains(&v) => Ok(()),
        Some(v) => Err(FieldError::new(
            path,
            format!(
                "unsupported apiVersion {v:?} (expected {})",
                expected.join(" or ")
            ),
        )),
        None => Err(FieldError::new(path, "missing")),
    }
}

const POD_NS: &str = "k8s:io.kubernetes.pod.namespace";

/// Restricts a selector to one namespace unless it already names one (Cilium's
/// `getEndpointSelector`): a namespace label, a namespace-labels key or a reserved label.
fn namespaced(sel: &Selector, ns: &str) -> Selector {
    if sel.has_key(keys::POD_NAMESPACE)
        || sel.has_key_prefix(keys::NAMESPACE_LABELS_PREFIX)
        || sel.mentions_reserved()
    {
        return sel.clone();
    }
    let mut s = sel.clone();
    s.add_match(POD_NS, ns);
    s
}

/// A `CiliumNetworkPolicy`: `spec` and/or `specs`, each a Cilium rule, namespaced.
pub fn parse_cnp(v: &Value, prefix: &str, out: &mut Vec<Rule>) -> Result<(), DocError> {
    let name_loc = |m: Option<&Meta>| {
        let id = m.map_or_else(String::new, |m| format!(" \"{}/{}\"", m.namespace, m.name));
        join_loc(prefix, &format!("CiliumNetworkPolicy{id}"))
    };
    let m = meta(v).map_err(|e| (name_loc(None), e))?;
    let loc = name_loc(Some(&m));
    let fail = |e| (loc.clone(), e);
    let mut o = Obj::new(v, "").map_err(fail)?;
    api_version(&mut o, &["cilium.io/v2"]).map_err(fail)?;
    o.get("kind");
    o.get("metadata");
    o.get("status");
    let mut specs = Vec::new();
    if let Some(s) = o.get("spec") {
        specs.push((String::from("spec"), s));
    }
    for (p, s) in o.array("specs").map_err(fail)?.unwrap_or_default() {
        specs.push((p, s));
    }
    o.finish(&[]).map_err(fail)?;
    if specs.is_empty() {
        return Err(fail(FieldError::new(
            "spec",
            "missing (a CiliumNetworkPolicy needs spec or specs)",
        )));
    }
    let derived = derived_labels("CiliumNetworkPolicy", &m);
    for (p, s) in specs {
        let mut rule = cilium::parse_rule(s, &p).map_err(fail)?;
        // The endpoint selector always applies in the policy's namespace (Cilium drops any
        // other namespace match with a warning).
        let reqs = rule
            .endpoint_selector
            .requirements()
            .filter(|r| r.key != keys::POD_NAMESPACE)
            .cloned();
        let mut es = Selector::from_requirements(reqs);
        es.add_match(POD_NS, &m.namespace);
        rule.endpoint_selector = es;
        for peer in rule.peers_mut() {
            if let PeerSelector::Endpoints(sel) = peer {
                *sel = namespaced(sel, &m.namespace);
            }
        }
        for l in derived.iter() {
            rule.labels.insert(l.clone());
        }
        out.push(rule);
    }
    Ok(())
}

/// Keys in Kubernetes label selectors have no source; Cilium gives them the `k8s` source.
fn k8s_selector(v: &Value, path: &str) -> Res<Selector> {
    let sel = walk::selector(v, path)?;
    Ok(Selector::from_requirements(sel.requirements().map(|r| {
        Requirement {
            source: source::K8S.to_owned(),
            key: r.key.clone(),
            op: r.op.clone(),
        }
    })))
}

/// A namespaceSelector. Cilium matches it against the namespace's labels exposed on pods as
/// `k8s:io.cilium.k8s.namespace.labels.<key>`. Weft has no Namespace objects, so the only
/// namespace label it knows is `kubernetes.io/metadata.name`, which Kubernetes sets on every
/// namespace and the manager puts on every pod; other keys would silently match nothing, so
/// they are rejected.
fn namespace_selector(v: &Value, path: &str) -> Res<Vec<Requirement>> {
    let sel = walk::selector(v, path)?;
    if sel.is_wildcard() {
        return Ok(vec![Requirement::new(
            POD_NS,
            crate::selector::Operator::Exists,
        )]);
    }
    sel.requirements()
        .map(|r| {
            if r.key != keys::NAMESPACE_NAME {
                return Err(FieldError::new(
                    path,
                    format!(
                        "not supported yet: namespaceSelector key {:?} (Weft knows no namespace labels; only {:?} works)",
                        r.key,
                        keys::NAMESPACE_NAME
                    ),
                ));
            }
            Ok(Requirement {
                source: source::K8S.to_owned(),
                key: format!("{}{}", keys::NAMESPACE_LABELS_PREFIX, r.key),
                op: r.op.clone(),
            })
        })
        .collect()
}

fn np_peer(v: &Value, path: &str, ns: &str) -> Res<PeerSelector> {
    let mut o = Obj::new(v, path)?;
    let pod = o.get("podSelector");
    let nsel = o.get("namespaceSelector");
    let ip = o.get("ipBlock");
    let (pod_path, ns_path, ip_path) = (
        o.at("podSelector"),
        o.at("namespaceSelector"),
        o.at("ipBlock"),
    );
    o.finish(&[])?;
    if let Some(ip) = ip {
        if pod.is_some() || nsel.is_some() {
            return Err(FieldError::new(
                ip_path,
                "ipBlock cannot be combined with podSelector or namespaceSelector",
            ));
        }
        return Ok(PeerSelector::Cidr(cidr_block(ip, &ip_path)?));
    }
    let mut sel = match pod {
        Some(p) => k8s_selector(p, &pod_path)?,
        None if nsel.is_none() => {
            return Err(FieldError::new(
                path,
                "a peer needs podSelector, namespaceSelector or ipBlock",
            ));
        }
        None => Selector::all(),
    };
    match nsel {
        Some(n) => {
            for r in namespace_selector(n, &ns_path)? {
                sel.add(r);
            }
        }
        None => sel.add_match(POD_NS, ns),
    }
    Ok(PeerSelector::Endpoints(sel))
}

/// Kubernetes (and Calico) let an ipBlock match pod IPs; Cilium's CIDR rules do not.
fn cidr_block(v: &Value, path: &str) -> Res<CidrSelector> {
    Ok(CidrSelector {
        match_pods: true,
        ..cilium::cidr_rule(v, path)?
    })
}

fn np_ports(list: Option<Vec<(String, &Value)>>) -> Res<Vec<PortProto>> {
    let mut out = Vec::new();
    for (p, v) in list.unwrap_or_default() {
        let mut o = Obj::new(v, &p)?;
        let port_path = o.at("port");
        let port = match o.get("port") {
            Some(v) => walk::port_number(v, &port_path, false)?,
            None => 0,
        };
        let end_path = o.at("endPort");
        let end = match o.get("endPort") {
            Some(v) => Some(walk::port_number(v, &end_path, false)?),
            None => None,
        };
        let proto_path = o.at("protocol");
        let protos = match o.str("protocol")? {
            Some(name @ ("TCP" | "UDP" | "SCTP")) => walk::protocols(name, &proto_path)?,
            Some(other) => {
                return Err(FieldError::new(
                    proto_path,
                    format!("unknown protocol {other:?} (expected TCP, UDP or SCTP)"),
                ));
            }
            None => walk::protocols("TCP", &proto_path)?,
        };
        o.finish(&[])?;
        out.extend(walk::port_entries(&protos, port, end, &end_path)?);
    }
    out.sort();
    out.dedup();
    Ok(out)
}

fn np_section(
    list: Option<Vec<(String, &Value)>>,
    peers_field: &'static str,
    ns: &str,
) -> Res<Vec<PeerRule>> {
    let mut rules = Vec::new();
    for (p, v) in list.unwrap_or_default() {
        let mut o = Obj::new(v, &p)?;
        let mut peers = Vec::new();
        for (pp, peer) in o.array(peers_field)?.unwrap_or_default() {
            peers.push(np_peer(peer, &pp, ns)?);
        }
        // Kubernetes: a missing or empty from/to list matches all sources/destinations.
        if peers.is_empty() {
            peers.push(PeerSelector::Entity(Entity::All));
        }
        let ports = np_ports(o.array("ports")?)?;
        o.finish(&[])?;
        peers.sort();
        peers.dedup();
        rules.push(PeerRule { peers, ports });
    }
    Ok(rules)
}

/// A Kubernetes `NetworkPolicy`.
pub fn parse_network_policy(v: &Value, prefix: &str, out: &mut Vec<Rule>) -> Result<(), DocError> {
    let m = meta(v).map_err(|e| (join_loc(prefix, "NetworkPolicy"), e))?;
    let loc = join_loc(
        prefix,
        &format!("NetworkPolicy \"{}/{}\"", m.namespace, m.name),
    );
    let fail = |e| (loc.clone(), e);
    let mut o = Obj::new(v, "").map_err(fail)?;
    api_version(&mut o, &["networking.k8s.io/v1"]).map_err(fail)?;
    o.get("kind");
    o.get("metadata");
    o.get("status");
    let spec = o
        .get("spec")
        .ok_or_else(|| fail(FieldError::new("spec", "missing")))?;
    o.finish(&[]).map_err(fail)?;
    let rule = np_spec(spec, &m).map_err(fail)?;
    out.push(rule);
    Ok(())
}

fn np_spec(spec: &Value, m: &Meta) -> Res<Rule> {
    let mut s = Obj::new(spec, "spec")?;
    let ps_path = s.at("podSelector");
    let mut es = match s.get("podSelector") {
        Some(p) => k8s_selector(p, &ps_path)?,
        None => {
            return Err(FieldError::new(
                ps_path,
                "missing (use {} to select every pod in the namespace)",
            ));
        }
    };
    es.add_match(POD_NS, &m.namespace);
    let ingress = s.array("ingress")?;
    let egress = s.array("egress")?;
    let mut types = Vec::new();
    for (p, t) in s.array("policyTypes")?.unwrap_or_default() {
        match t.as_str() {
            Some(t @ ("Ingress" | "Egress")) => types.push(t),
            _ => return Err(FieldError::new(p, "expected \"Ingress\" or \"Egress\"")),
        }
    }
    s.finish(&[])?;
    if types.is_empty() {
        // Kubernetes defaults policyTypes to Ingress, plus Egress when there are egress rules.
        types.push("Ingress");
        if egress.as_ref().is_some_and(|e| !e.is_empty()) {
            types.push("Egress");
        }
    }
    let mut rule = Rule::new(es, derived_labels("NetworkPolicy", m));
    rule.ingress_mode = Enforcement::from_flags(types.contains(&"Ingress"), true);
    rule.egress_mode = Enforcement::from_flags(types.contains(&"Egress"), true);
    // Rules of a direction not listed in policyTypes have no effect in Kubernetes.
    if rule.applies(Direction::Ingress) {
        rule.ingress = np_section(ingress, "from", &m.namespace)?;
    }
    if rule.applies(Direction::Egress) {
        rule.egress = np_section(egress, "to", &m.namespace)?;
    }
    Ok(rule)
}
