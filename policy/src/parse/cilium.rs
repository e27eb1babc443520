//! Cilium's rule format (`pkg/policy/api` Rule), as `cilium policy import` and a CNP's spec
//! take it.

use super::ports;
use super::walk::{self, CidrFlavor, FieldError, Obj, Res};
use crate::labels::{Label, LabelSet, source};
use crate::mapstate::Direction;
use crate::rule::{
    CidrSelector, Enforcement, Entity, NamedPort, PeerRule, PeerSelector, PortProto, Rule,
};
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
///
/// In lenient mode ([`walk::lenient`], cluster objects) only the endpoint selector must parse:
/// a section entry that cannot be expressed is left out and noted, the rule still applies in
/// its direction (an allow entry then allows nothing; a deny entry is widened to deny every
/// peer and port of that direction), so the selected pods fail closed.
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
    let labels = soft(o.array("labels"), "the rule's labels are ignored")?;
    for (p, l) in labels.flatten().unwrap_or_default() {
        if let Some(l) = soft(rule_label(l, &p), "this label is ignored")? {
            rule.labels.insert(l);
        }
    }
    if let Some(Some(d)) = soft(o.str("description"), "ignored")? {
        d.clone_into(&mut rule.description);
    }
    let (ingress, allow_in) = section(&mut o, "ingress", Direction::Ingress, false)?;
    let (ingress_deny, deny_in) = section(&mut o, "ingressDeny", Direction::Ingress, true)?;
    let (egress, allow_out) = section(&mut o, "egress", Direction::Egress, false)?;
    let (egress_deny, deny_out) = section(&mut o, "egressDeny", Direction::Egress, true)?;
    (rule.ingress, rule.ingress_deny) = (ingress, ingress_deny);
    (rule.egress, rule.egress_deny) = (egress, egress_deny);
    // "If omitted or empty, this rule does not apply at ingress" (Cilium api.Rule docs).
    let applies_ingress = allow_in || deny_in;
    let applies_egress = allow_out || deny_out;
    let (mut dd_ingress, mut dd_egress) = (true, true);
    if let Some(dd) = o.get("enableDefaultDeny") {
        let flags = (|| {
            let mut d = Obj::new(dd, &o.at("enableDefaultDeny"))?;
            let flags = (d.bool("ingress")?, d.bool("egress")?);
            d.finish(&[])?;
            Ok(flags)
        })();
        if let Some((i, e)) = soft(flags, "default deny stays on in both directions")? {
            dd_ingress = i.unwrap_or(true);
            dd_egress = e.unwrap_or(true);
        }
    }
    rule.ingress_mode = Enforcement::from_flags(applies_ingress, dd_ingress);
    rule.egress_mode = Enforcement::from_flags(applies_egress, dd_egress);
    soft(o.finish(&["nodeSelector"]), "the field is ignored")?;
    Ok(rule)
}

/// `r`, or in lenient mode `None` with the error noted as not enforced (`what`: what that
/// means for the rule).
pub(super) fn soft<T>(r: Res<T>, what: &str) -> Res<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if walk::lenient() => {
            walk::not_enforced(&e, what);
            Ok(None)
        }
        Err(e) => Err(e),
    }
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

/// One section's entries, and whether the rule applies in its direction because of it (the
/// list has entries, even ones left out in lenient mode).
fn section(
    o: &mut Obj<'_>,
    field: &'static str,
    dir: Direction,
    deny: bool,
) -> Res<(Vec<PeerRule>, bool)> {
    let dropped = if deny {
        match dir {
            Direction::Ingress => {
                "denied instead: every ingress of the selected pods (fail closed)"
            }
            Direction::Egress => "denied instead: every egress of the selected pods (fail closed)",
        }
    } else {
        "this rule allows nothing (the selected pods stay isolated in its direction)"
    };
    let Some(list) = soft(o.array(field), dropped)? else {
        return Ok((if deny { vec![deny_all()] } else { Vec::new() }, true));
    };
    let list = list.unwrap_or_default();
    let present = !list.is_empty();
    let mut out = Vec::with_capacity(list.len());
    for (p, v) in list {
        match soft(peer_rule(v, &p, dir, deny), dropped)? {
            Some(r) => out.push(r),
            None if deny => out.push(deny_all()),
            None => {}
        }
    }
    Ok((out, present))
}

/// What a deny entry that cannot be expressed becomes: every peer, every port.
fn deny_all() -> PeerRule {
    PeerRule::new(vec![PeerSelector::Entity(Entity::All)], Vec::new())
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
                cidr: walk::cidr(c, &p, CidrFlavor::Cilium)?,
                except: Vec::new(),
                match_pods: false,
            }));
        }
    }
    if let Some(list) = o.array(cidrsets)? {
        has_l3 = true;
        for (p, c) in list {
            peers.push(PeerSelector::Cidr(cidr_rule(c, &p, CidrFlavor::Cilium)?));
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
    let mut named_ports = Vec::new();
    let mut has_ports = false;
    for (p, pr) in o.array("toPorts")?.unwrap_or_default() {
        has_ports = true;
        let (numbers, names) = port_rule(pr, &p, deny)?;
        ports.extend(numbers);
        named_ports.extend(names);
    }
    let ports_path = o.at("toPorts");
    o.finish(unsupported)?;
    if dir == Direction::Egress
        && let (Some(n), Some(c)) = (
            named_ports.first(),
            peers.iter().find(|p| matches!(p, PeerSelector::Cidr(_))),
        )
    {
        // Cilium resolves an egress name over every pod of the cluster and allows that number
        // to any peer; Weft resolves it per destination pod, and a CIDR is no pod.
        walk::note(
            walk::NoteKind::Warning,
            &ports_path,
            format!(
                "named port {:?} with the CIDR peer {c}: a name resolves to the destination pod's container port, and CIDR destinations have none, so it allows nothing there (give the port number)",
                n.name
            ),
        );
    }
    // Cilium: a section with toPorts but no L3 peer applies to every peer; a section with
    // neither (`ingress: [{}]`) selects the endpoint but allows nothing.
    if !has_l3 && has_ports {
        peers.push(PeerSelector::Entity(Entity::All));
    }
    peers.sort();
    peers.dedup();
    ports.sort();
    ports.dedup();
    named_ports.sort();
    named_ports.dedup();
    Ok(PeerRule {
        peers,
        ports,
        named_ports,
    })
}

/// `{cidr, except}`. Each except must lie inside the cidr (Cilium validates the same).
pub fn cidr_rule(v: &Value, path: &str, flavor: CidrFlavor) -> Res<CidrSelector> {
    let mut o = Obj::new(v, path)?;
    let cidr_path = o.at("cidr");
    let cidr = match o.get("cidr") {
        Some(c) => walk::cidr(c, &cidr_path, flavor)?,
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
        let ex = walk::cidr(e, &p, flavor)?;
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

fn port_rule(v: &Value, path: &str, deny: bool) -> Res<(Vec<PortProto>, Vec<NamedPort>)> {
    let mut o = Obj::new(v, path)?;
    let mut out = Vec::new();
    let mut named = Vec::new();
    for (p, pp) in o.array("ports")?.unwrap_or_default() {
        let mut q = Obj::new(pp, &p)?;
        let fields = ports::port_fields(&mut q, true)?;
        let protos = match q.str("protocol")? {
            Some(name) => ports::protocols(name, &q.at("protocol"))?,
            None => ports::protocols("ANY", "")?,
        };
        q.finish(&[])?;
        fields.add(&protos, &mut out, &mut named)?;
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
    if out.is_empty() && named.is_empty() {
        // Cilium: a toPorts entry without ports matches every port.
        out.push(PortProto::ANY);
    }
    Ok((out, named))
}
