//! Kubernetes objects: `cilium.io/v2 CiliumNetworkPolicy` and `networking.k8s.io/v1
//! NetworkPolicy`, translated as Cilium's `ParseToCiliumRule` and `ParseNetworkPolicy` do.

use super::ports;
use super::walk::{self, CidrFlavor, FieldError, Obj, Res};
use super::{DocError, cilium, join_loc};
use crate::labels::{Label, LabelSet, keys, source};
use crate::mapstate::Direction;
use crate::rule::{
    CidrSelector, Enforcement, Entity, NamedPort, PeerRule, PeerSelector, PortProto, Rule,
};
use crate::selector::{Requirement, Selector};
use serde_json::Value;

pub(super) struct Meta {
    pub(super) name: String,
    namespace: String,
    uid: Option<String>,
}

/// Object metadata is read leniently: `kubectl get -o yaml` output carries many fields
/// (resourceVersion, managedFields, ...) that do not affect policy.
pub(super) fn meta(v: &Value) -> Res<Meta> {
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

pub(super) fn derived_labels(kind: &str, m: &Meta) -> LabelSet {
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

pub(super) fn api_version(o: &mut Obj<'_>, expected: &[&str]) -> Res<()> {
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
    parse_cilium_object(v, prefix, out, false)
}

/// A `CiliumClusterwideNetworkPolicy`: like a CNP, but its selectors are not restricted to a
/// namespace and its rules carry no namespace label (Cilium's `GetPolicyLabels` with ns "").
pub fn parse_ccnp(v: &Value, prefix: &str, out: &mut Vec<Rule>) -> Result<(), DocError> {
    parse_cilium_object(v, prefix, out, true)
}

/// The object kind of a Cilium policy.
fn cilium_kind(clusterwide: bool) -> &'static str {
    if clusterwide {
        "CiliumClusterwideNetworkPolicy"
    } else {
        "CiliumNetworkPolicy"
    }
}

fn parse_cilium_object(
    v: &Value,
    prefix: &str,
    out: &mut Vec<Rule>,
    clusterwide: bool,
) -> Result<(), DocError> {
    let kind = cilium_kind(clusterwide);
    let name_loc = |m: Option<&Meta>| {
        let id = match m {
            None => String::new(),
            Some(m) if clusterwide => format!(" \"{}\"", m.name),
            Some(m) => format!(" \"{}/{}\"", m.namespace, m.name),
        };
        join_loc(prefix, &format!("{kind}{id}"))
    };
    let m = meta(v).map_err(|e| (name_loc(None), e))?;
    let loc = name_loc(Some(&m));
    let before = walk::notes_len();
    parse_cilium_specs(v, &m, &loc, out, clusterwide)?;
    walk::locate_notes_since(before, &loc);
    Ok(())
}

fn parse_cilium_specs(
    v: &Value,
    m: &Meta,
    loc: &str,
    out: &mut Vec<Rule>,
    clusterwide: bool,
) -> Result<(), DocError> {
    let kind = cilium_kind(clusterwide);
    let fail = |e| (loc.to_owned(), e);
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
    cilium::soft(o.finish(&[]), "the field is ignored").map_err(fail)?;
    if specs.is_empty() {
        return Err(fail(FieldError::new(
            "spec",
            format!("missing (a {kind} needs spec or specs)"),
        )));
    }
    let mut derived = derived_labels(kind, m);
    if clusterwide {
        derived.remove_key(source::K8S, keys::POLICY_NAMESPACE);
    }
    for (p, s) in specs {
        let mut rule = cilium::parse_rule(s, &p).map_err(fail)?;
        if clusterwide {
            for l in derived.iter() {
                rule.labels.insert(l.clone());
            }
            out.push(rule);
            continue;
        }
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
pub(super) fn k8s_selector(v: &Value, path: &str) -> Res<Selector> {
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
/// `k8s:io.cilium.k8s.namespace.labels.<key>`: in Kubernetes mode the manager mirrors every
/// label of the pod's namespace there, so any key works. Outside it only
/// `kubernetes.io/metadata.name` is on endpoints (the manager knows no Namespace objects).
///
/// A namespaceSelector selects pods only: every one also requires the pod-namespace label, so
/// a `NotIn` or `DoesNotExist` requirement (true where the key is absent) cannot match `world`,
/// a CIDR or any other identity without a namespace.
pub(super) fn namespace_selector(v: &Value, path: &str) -> Res<Vec<Requirement>> {
    let sel = walk::selector(v, path)?;
    let in_a_namespace = Requirement::new(POD_NS, crate::selector::Operator::Exists);
    Ok(std::iter::once(in_a_namespace)
        .chain(sel.requirements().map(|r| Requirement {
            source: source::K8S.to_owned(),
            key: format!("{}{}", keys::NAMESPACE_LABELS_PREFIX, r.key),
            op: r.op.clone(),
        }))
        .collect())
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
        ..cilium::cidr_rule(v, path, CidrFlavor::Kubernetes)?
    })
}

fn np_ports(list: Option<Vec<(String, &Value)>>) -> Res<(Vec<PortProto>, Vec<NamedPort>)> {
    let mut out = Vec::new();
    let mut named = Vec::new();
    for (p, v) in list.unwrap_or_default() {
        let mut o = Obj::new(v, &p)?;
        let fields = ports::port_fields(&mut o, false)?;
        let proto_path = o.at("protocol");
        let protos = match o.str("protocol")? {
            Some(name @ ("TCP" | "UDP" | "SCTP")) => ports::protocols(name, &proto_path)?,
            Some(other) => {
                return Err(FieldError::new(
                    proto_path,
                    format!("unknown protocol {other:?} (expected TCP, UDP or SCTP)"),
                ));
            }
            None => ports::protocols("TCP", &proto_path)?,
        };
        o.finish(&[])?;
        fields.add(&protos, &mut out, &mut named)?;
    }
    out.sort();
    out.dedup();
    named.sort();
    named.dedup();
    Ok((out, named))
}

/// What an entry that cannot be expressed means for its policy.
const ENTRY_LEFT_OUT: &str =
    "this rule allows nothing (the policy still isolates its pods for its policyTypes)";

/// A section's entries. In lenient mode (cluster objects) an entry that cannot be expressed
/// is left out and noted; the policy's isolation does not depend on its entries.
fn np_section(
    list: Option<Vec<(String, &Value)>>,
    peers_field: &'static str,
    ns: &str,
) -> Res<Vec<PeerRule>> {
    let mut rules = Vec::new();
    for (p, v) in list.unwrap_or_default() {
        if let Some(entry) = cilium::soft(np_entry(v, &p, peers_field, ns), ENTRY_LEFT_OUT)? {
            rules.extend(entry);
        }
    }
    Ok(rules)
}

/// One `ingress[i]` or `egress[i]`: usually one peer rule; two when an egress entry names
/// ports and has ipBlock peers (lenient mode), see below.
fn np_entry(v: &Value, path: &str, peers_field: &'static str, ns: &str) -> Res<Vec<PeerRule>> {
    let mut o = Obj::new(v, path)?;
    let mut peers = Vec::new();
    for (pp, peer) in o.array(peers_field)?.unwrap_or_default() {
        peers.push(np_peer(peer, &pp, ns)?);
    }
    // Kubernetes: a missing or empty from/to list matches all sources/destinations.
    if peers.is_empty() {
        peers.push(PeerSelector::Entity(Entity::All));
    }
    let ports_path = o.at("ports");
    let (ports, named_ports) = np_ports(o.array("ports")?)?;
    o.finish(&[])?;
    peers.sort();
    peers.dedup();
    let is_block = |p: &PeerSelector| matches!(p, PeerSelector::Cidr(c) if c.match_pods);
    let egress = peers_field == "to";
    if !(egress && peers.iter().any(is_block)) || named_ports.is_empty() {
        return Ok(vec![PeerRule {
            peers,
            ports,
            named_ports,
        }]);
    }
    // An egress name resolves against the destination pod's container ports; for a pod reached
    // through an ipBlock the policy map only knows the block (the by-IP entries), not the pod,
    // so the name cannot be resolved there.
    let names: Vec<&str> = named_ports.iter().map(|n| n.name.as_str()).collect();
    let e = FieldError::new(
        ports_path,
        format!(
            "not supported yet: a named port ({}) in an egress rule with an ipBlock peer (give the port number)",
            names.join(", ")
        ),
    );
    if !walk::lenient() {
        return Err(e);
    }
    walk::not_enforced(
        &e,
        "towards the ipBlock peers this rule allows only its numeric ports",
    );
    let (blocks, others): (Vec<PeerSelector>, Vec<PeerSelector>) =
        peers.into_iter().partition(|p| is_block(p));
    let mut out = Vec::new();
    if !others.is_empty() {
        out.push(PeerRule {
            peers: others,
            ports: ports.clone(),
            named_ports,
        });
    }
    // Without numeric ports the blocks get no entry at all (an empty port list would mean
    // every port).
    if !ports.is_empty() {
        out.push(PeerRule::new(blocks, ports));
    }
    Ok(out)
}

/// A Kubernetes `NetworkPolicy`.
pub fn parse_network_policy(v: &Value, prefix: &str, out: &mut Vec<Rule>) -> Result<(), DocError> {
    let m = meta(v).map_err(|e| (join_loc(prefix, "NetworkPolicy"), e))?;
    let loc = join_loc(
        prefix,
        &format!("NetworkPolicy \"{}/{}\"", m.namespace, m.name),
    );
    let fail = |e| (loc.clone(), e);
    let before = walk::notes_len();
    let mut o = Obj::new(v, "").map_err(fail)?;
    api_version(&mut o, &["networking.k8s.io/v1"]).map_err(fail)?;
    o.get("kind");
    o.get("metadata");
    o.get("status");
    let spec = o
        .get("spec")
        .ok_or_else(|| fail(FieldError::new("spec", "missing")))?;
    cilium::soft(o.finish(&[]), "the field is ignored").map_err(fail)?;
    let rule = np_spec(spec, &m).map_err(fail)?;
    walk::locate_notes_since(before, &loc);
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
    // `None`: malformed (lenient mode), which counts as a list with rules that allow nothing.
    let ingress = cilium::soft(s.array("ingress"), ENTRY_LEFT_OUT)?;
    let egress = cilium::soft(s.array("egress"), ENTRY_LEFT_OUT)?;
    let mut types = Vec::new();
    for (p, t) in s.array("policyTypes")?.unwrap_or_default() {
        match t.as_str() {
            Some(t @ ("Ingress" | "Egress")) => types.push(t),
            _ => return Err(FieldError::new(p, "expected \"Ingress\" or \"Egress\"")),
        }
    }
    cilium::soft(s.finish(&[]), "the field is ignored")?;
    if types.is_empty() {
        // Kubernetes defaults policyTypes to Ingress, plus Egress when there are egress rules.
        types.push("Ingress");
        if egress
            .as_ref()
            .is_none_or(|e| e.as_ref().is_some_and(|e| !e.is_empty()))
        {
            types.push("Egress");
        }
    }
    let (ingress, egress) = (ingress.flatten(), egress.flatten());
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
