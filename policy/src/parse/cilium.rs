//! Cilium's rule format (`pkg/policy/api` Rule), as `cilium policy import` and a CNP's spec
//! take it.

use super::walk::{self, FieldError, Obj, Res};
use crate::labels::{Label, LabelSet, source};
use crate::mapstate::Direction;
use crate::rule::{CidrSelector, Enforcement, Entity, PeerRule, PeerSelector, PortProto, Rule};
use serde_json::Value;

/// `rule 2 (name "x")`: the index plus the rule's `name` label when it has one.
pub fn rule_location(i: usize, v: &Value) -> String {
    let name = v
        .get("labels")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find_map(|l| match l {
            Value::Object(m) if m.get("key").and_then(Value::as_str) == Some("name") => {
                m.get("value").and_then(Value::as_str).map(str::to_owned)
            }
            Value::String(s) => s.strip_prefix("name=").map(str::to_owned),
            _ => None,
        });
    match name {
        Some(n) => format!("rule {i} (name {n:?})"),
        None => format!("rule {i}"),
    }
}

/// Parses one Cilium rule. `path` prefixes field paths (e.g. `spec` inside a CNP).
pub fn parse_rule(v: &Value, path: &str) -> Res<Rule> {
    let mut o = Obj::new(v, path)?;
    let sel_path = o.at("endpointSelector");
    let endpoint_selector = match o.get("endpointSelector") {
        Some(s) => walk::selector(s, &sel_path)?,
        None if o.has("nodeSelector") => {
            return Err(FieldError::new(
                o.at("nodeSelector"),
                "not supported yet: field \"nodeSelector\" (host policies)",
            ));
        }
        None => {
            return Err(FieldError::new(
                sel_path,
                "missing (every rule needs an endpointSelector)",
            ));
        }
    };
    let mut rule = Rule::new(endpoint_selector, LabelSet::new());
    for (p, l) in o.array("labels")?.unwrap_or_default() {
        rule.labels.insert(rule_label(l, &p)?);
    }
    o.str("description")?
        .unwrap_or_default()
        .clone_into(&mut rule.description);
    rule.ingress = section(&mut o, "ingress", Direction::Ingress, false)?;
    rule.ingress_deny = section(&mut o, "ingressDeny", Direction::Ingress, true)?;
    rule.egress = section(&mut o, "egress", Direction::Egress, false)?;
    rule.egress_deny = section(&mut o, "egressDeny", Direction::Egress, true)?;
    // "If omitted or empty, this rule does not apply at ingress" (Cilium api.Rule docs).
    let applies_ingress = !rule.ingress.is_empty() || !rule.ingress_deny.is_empty();
    let applies_egress = !rule.egress.is_empty() || !rule.egress_deny.is_empty();
    let (mut dd_ingress, mut dd_egress) = (true, true);
    if let Some(dd) = o.get("enableDefaultDeny") {
        let mut d = Obj::new(dd, &o.at("enableDefaultDeny"))?;
        dd_ingress = d.bool("ingress")?.unwrap_or(true);
        dd_egress = d.bool("egress")?.unwrap_or(true);
        d.finish(&[])?;
    }
    rule.ingress_mode = Enforcement::from_flags(applies_ingress, dd_ingress);
    rule.egress_mode = Enforcement::from_flags(applies_egress, dd_egress);
    o.finish(&["nodeSelector"])?;
    Ok(rule)
}

/// A rule label: `{"key","value","source"}` or Cilium's short string form `src:key=value`.
fn rule_label(v: &Value, path: &str) -> Res<Label> {
    if let Value::String(s) = v {
        return Label::parse_with_source(s, source::UNSPEC)
            .map_err(|e| FieldError::new(path, e.to_string()));
    }
    let mut o = Obj::new(v, path)?;
    let key = o.str("key")?.unwrap_or_default();
    if key.is_empty() {
        return Err(FieldError::new(o.at("key"), "missing or empty"));
    }
    let value = o.str("value")?.unwrap_or_default();
    let src = o
        .str("source")?
        .filter(|s| !s.is_empty())
        .unwrap_or(source::UNSPEC);
    o.finish(&[])?;
    Ok(Label::new(src, key, value))
}

fn section(o: &mut Obj<'_>, field: &'static str, dir: Direction, deny: bool) -> Res<Vec<PeerRule>> {
    o.array(field)?
        .unwrap_or_default()
        .into_iter()
        .map(|(p, v)| peer_rule(v, &p, dir, deny))
        .collect()
}

const INGRESS_UNSUPPORTED: &[&str] = &[
    "fromRequires",
    "fromGroups",
    "fromNodes",
    "icmps",
    "authentication",
];
const EGRESS_UNSUPPORTED: &[&str] = &[
    "toRequires",
    "toGroups",
    "toNodes",
    "toServices",
    "toFQDNs",
    "icmps",
    "authentication",
];

fn peer_rule(v: &Value, path: &str, dir: Direction, deny: bool) -> Res<PeerRule> {
    let mut o = Obj::new(v, path)?;
    let (eps, cidrs, cidrsets, entities, unsupported) = match dir {
        Direction::Ingress => (
            "fromEndpoints",
            "fromCIDR",
            "fromCIDRSet",
            "fromEntities",
            INGRESS_UNSUPPORTED,
        ),
        Direction::Egress => (
            "toEndpoints",
            "toCIDR",
            "toCIDRSet",
            "toEntities",
            EGRESS_UNSUPPORTED,
        ),
    };
    let mut peers = Vec::new();
    let mut has_l3 = false;
    if let Some(list) = o.array(eps)? {
        has_l3 = true;
        for (p, s) in list {
            peers.push(PeerSelector::Endpoints(walk::selector(s, &p)?));
        }
    }
    if let Some(list) = o.array(cidrs)? {
        has_l3 = true;
        for (p, c) in list {
            peers.push(PeerSelector::Cidr(CidrSelector {
                cidr: walk::cidr(c, &p)?,
                except: Vec::new(),
                match_pods: false,
            }));
        }
    }
    if let Some(list) = o.array(cidrsets)? {
        has_l3 = true;
        for (p, c) in list {
            peers.push(PeerSelector::Cidr(cidr_rule(c, &p)?));
        }
    }
    if let Some(list) = o.array(entities)? {
        has_l3 = true;
        for (p, e) in list {
            let name = e
                .as_str()
                .ok_or_else(|| FieldError::new(&p, "expected an entity name"))?;
            peers.push(PeerSelector::Entity(
                Entity::parse(name).map_err(|m| FieldError::new(&p, m))?,
            ));
        }
    }
    let mut ports = Vec::new();
    let mut has_ports = false;
    for (p, pr) in o.array("toPorts")?.unwrap_or_default() {
        has_ports = true;
        ports.extend(port_rule(pr, &p, deny)?);
    }
    o.finish(unsupported)?;
    // Cilium: a section with toPorts but no L3 peer applies to every peer; a section with
    // neither (`ingress: [{}]`) selects the endpoint but allows nothing.
    if !has_l3 && has_ports {
        peers.push(PeerSelector::Entity(Entity::All));
    }
    peers.sort();
    peers.dedup();
    ports.sort();
    ports.dedup();
    Ok(PeerRule { peers, ports })
}

/// `{cidr, except}`. Each except must lie inside the cidr (Cilium validates the same).
pub fn cidr_rule(v: &Value, path: &str) -> Res<CidrSelector> {
    let mut o = Obj::new(v, path)?;
    let cidr_path = o.at("cidr");
    let cidr = match o.get("cidr") {
        Some(c) => walk::cidr(c, &cidr_path)?,
        None if o.has("cidrGroupRef") || o.has("cidrGroupSelector") => {
            return Err(FieldError::new(
                path,
                "not supported yet: CIDR groups (cidrGroupRef, cidrGroupSelector)",
            ));
        }
        None => return Err(FieldError::new(cidr_path, "missing")),
    };
    let mut except = Vec::new();
    for (p, e) in o.array("except")?.unwrap_or_default() {
        let ex = walk::cidr(e, &p)?;
        if !cidr.contains(&ex) {
            return Err(FieldError::new(
                p,
                format!("except {ex} is not inside {cidr}"),
            ));
        }
        except.push(ex);
    }
    o.finish(&["cidrGroupRef", "cidrGroupSelector"])?;
    except.sort();
    except.dedup();
    Ok(CidrSelector {
        cidr,
        except,
        match_pods: false,
    })
}

fn port_rule(v: &Value, path: &str, deny: bool) -> Res<Vec<PortProto>> {
    let mut o = Obj::new(v, path)?;
    let mut out = Vec::new();
    for (p, pp) in o.array("ports")?.unwrap_or_default() {
        let mut q = Obj::new(pp, &p)?;
        let port_path = q.at("port");
        let port = match q.get("port") {
            Some(v) => walk::port_number(v, &port_path, true)?,
            None => 0,
        };
        let end_path = q.at("endPort");
        let end = match q.get("endPort") {
            Some(v) => Some(walk::port_number(v, &end_path, false)?),
            None => None,
        };
        let protos = match q.str("protocol")? {
            Some(name) => walk::protocols(name, &q.at("protocol"))?,
            None => walk::protocols("ANY", "")?,
        };
        q.finish(&[])?;
        out.extend(walk::port_entries(&protos, port, end, &end_path)?);
    }
    let unsupported: &[&str] = if deny {
        &[]
    } else {
        &[
            "rules",
            "originatingTLS",
            "terminatingTLS",
            "serverNames",
            "listener",
        ]
    };
    o.finish(unsupported)?;
    if out.is_empty() {
        // Cilium: a toPorts entry without ports matches every port.
        out.push(PortProto::ANY);
    }
    Ok(out)
}
