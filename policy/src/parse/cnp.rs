//! `policy.networking.k8s.io` `ClusterNetworkPolicy` (sig-network's network-policy-api v0.3.0:
//! v1beta1, the storage version, and v1alpha2, whose schema is the same). Cluster-scoped.
//!
//! Each rule (one entry of `spec.ingress` or `spec.egress`) becomes one [`Rule`]: its
//! endpoint selector is the subject, its only entry (peers and ports) is in the allow section
//! of its direction whatever the action, both enforcement modes are
//! [`crate::rule::Enforcement::NotApplied`] (the `NetworkPolicy` layer never sees it), and
//! [`Rule::tier`] carries the tier, priority, direction, index, action and name. Every rule
//! of an object has the same labels (kind, name, uid), so re-importing the object replaces
//! all of them and deleting it deletes all of them.
//!
//! Fail closed as the API asks: a peer or protocol with none of the fields Weft knows (a newer
//! CRD's field, pruned of nothing) makes its rule match nothing when it accepts, and deny all
//! traffic of its direction when it denies or passes. Cluster objects only (lenient parsing);
//! in a file such a part is an error.

use super::k8s::{self, namespace_selector};
use super::ports::is_port_name;
use super::walk::{self, CidrFlavor, FieldError, NoteKind, Obj, Res};
use super::{DocError, cilium, join_loc};
use crate::labels::{LabelSet, keys, source};
use crate::mapstate::{Direction, Tier, TierAction, proto};
use crate::rule::{
    CidrSelector, Entity, NamedPort, PeerRule, PeerSelector, PortProto, Rule, TierRule,
};
use crate::selector::Selector;
use serde_json::Value;

/// The kind, and the derived-from label's value.
pub const KIND: &str = "ClusterNetworkPolicy";

/// The API versions read.
const API_VERSIONS: [&str; 2] = [
    "policy.networking.k8s.io/v1beta1",
    "policy.networking.k8s.io/v1alpha2",
];

/// The most rules per direction (the CRD's `MaxItems`), which the rule index encodes.
const MAX_RULES: usize = 25;

/// A `ClusterNetworkPolicy`: one rule per ingress and egress rule (none when it has neither).
pub fn parse_cluster_network_policy(
    v: &Value,
    prefix: &str,
    out: &mut Vec<Rule>,
) -> Result<(), DocError> {
    let m = k8s::meta(v).map_err(|e| (join_loc(prefix, KIND), e))?;
    let loc = join_loc(prefix, &format!("{KIND} \"{}\"", m.name));
    let fail = |e| (loc.clone(), e);
    let before = walk::notes_len();
    let mut o = Obj::new(v, "").map_err(fail)?;
    k8s::api_version(&mut o, &API_VERSIONS).map_err(fail)?;
    o.get("kind");
    o.get("metadata");
    o.get("status");
    let spec = o
        .get("spec")
        .ok_or_else(|| fail(FieldError::new("spec", "missing")))?;
    cilium::soft(o.finish(&[]), "the field is ignored").map_err(fail)?;
    // Cluster-scoped: no namespace label (`meta` defaults one for namespaced kinds).
    let mut labels = k8s::derived_labels(KIND, &m);
    labels.remove_key(source::K8S, keys::POLICY_NAMESPACE);
    out.extend(spec_rules(spec, &labels).map_err(fail)?);
    walk::locate_notes_since(before, &loc);
    Ok(())
}

fn spec_rules(spec: &Value, labels: &LabelSet) -> Res<Vec<Rule>> {
    let mut s = Obj::new(spec, "spec")?;
    let tier = tier(&mut s)?;
    let priority = priority(&mut s)?;
    let subject_path = s.at("subject");
    let subject = match s.get("subject") {
        Some(v) => subject(v, &subject_path)?,
        None => {
            return Err(FieldError::new(
                subject_path,
                "missing (namespaces: {} selects every pod)",
            ));
        }
    };
    let mut lists = Vec::new();
    for (field, dir) in [
        ("ingress", Direction::Ingress),
        ("egress", Direction::Egress),
    ] {
        let path = s.at(field);
        let list = s.array(field)?.unwrap_or_default();
        if list.len() > MAX_RULES {
            return Err(FieldError::new(
                path,
                format!(
                    "{} rules, at most {MAX_RULES} are allowed (split them over several objects)",
                    list.len()
                ),
            ));
        }
        lists.push((dir, list));
    }
    cilium::soft(s.finish(&[]), "the field is ignored")?;
    let mut out = Vec::new();
    for (dir, list) in lists {
        for (i, (path, v)) in list.into_iter().enumerate() {
            let Some((t, entry)) = tier_rule(v, &path, dir, tier, priority, i)? else {
                continue;
            };
            let mut rule = Rule::new(subject.clone(), labels.clone());
            match dir {
                Direction::Ingress => rule.ingress = vec![entry],
                Direction::Egress => rule.egress = vec![entry],
            }
            rule.tier = Some(t);
            out.push(rule);
        }
    }
    Ok(out)
}

fn tier(s: &mut Obj<'_>) -> Res<Tier> {
    let path = s.at("tier");
    match s.str("tier")? {
        Some("Admin") => Ok(Tier::Admin),
        Some("Baseline") => Ok(Tier::Baseline),
        Some(other) => Err(FieldError::new(
            path,
            format!("unknown tier {other:?} (expected Admin or Baseline)"),
        )),
        None => Err(FieldError::new(path, "missing (Admin or Baseline)")),
    }
}

fn priority(s: &mut Obj<'_>) -> Res<u16> {
    let path = s.at("priority");
    let range = "from 0 to 1000, lower first";
    match s.get("priority") {
        None => Err(FieldError::new(path, format!("missing (a number {range})"))),
        Some(Value::Number(n)) => n
            .as_u64()
            .filter(|&p| p <= 1000)
            .and_then(|p| u16::try_from(p).ok())
            .ok_or_else(|| FieldError::new(path, format!("{n} is not a priority ({range})"))),
        Some(other) => Err(FieldError::new(
            path,
            format!("expected a number {range}, got {}", walk::kind(other)),
        )),
    }
}

/// Parts of one rule Weft cannot read in a cluster object (a newer CRD's fields): the rule
/// fails closed. In a file each is an error.
#[derive(Default)]
struct Unreadable(Vec<FieldError>);

impl Unreadable {
    fn add(&mut self, e: FieldError) -> Res<()> {
        if walk::lenient() {
            self.0.push(e);
            Ok(())
        } else {
            Err(e)
        }
    }

    fn finish(&mut self, o: Obj<'_>) -> Res<()> {
        match o.finish(&[]) {
            Ok(()) => Ok(()),
            Err(e) => self.add(e),
        }
    }
}

/// The fields of `o` among `fields` that are set, each with its value and path.
fn present<'v>(o: &mut Obj<'v>, fields: &[&'static str]) -> Vec<(&'static str, &'v Value, String)> {
    fields
        .iter()
        .filter_map(|&f| {
            let path = o.at(f);
            o.get(f).map(|v| (f, v, path))
        })
        .collect()
}

/// `fields` as `a, b or c`.
fn one_of(fields: &[&str]) -> String {
    match fields {
        [] => String::new(),
        [one] => (*one).to_owned(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

/// Exactly one field of `fields` set, and no other: `None` (noted in `bad`) when none is or
/// another field is.
fn pick<'v>(
    mut o: Obj<'v>,
    path: &str,
    fields: &[&'static str],
    what: &str,
    bad: &mut Unreadable,
) -> Res<Option<(&'static str, &'v Value, String)>> {
    let mut set = present(&mut o, fields);
    if let [(first, _, _), (second, _, _), ..] = set.as_slice() {
        return Err(FieldError::new(
            o.at(second),
            format!(
                "{what} takes exactly one of {}, not both {first} and {second}",
                one_of(fields)
            ),
        ));
    }
    let before = bad.0.len();
    bad.finish(o)?;
    let one = set.pop();
    if bad.0.len() > before {
        return Ok(None);
    }
    if one.is_none() {
        bad.add(FieldError::new(
            path,
            format!("{what} needs one of {}", one_of(fields)),
        ))?;
    }
    Ok(one)
}

fn subject(v: &Value, path: &str) -> Res<Selector> {
    let mut bad = Unreadable::default();
    let one = pick(
        Obj::new(v, path)?,
        path,
        &["namespaces", "pods"],
        "subject",
        &mut bad,
    )?;
    let sel = match one {
        Some(("namespaces", v, p)) => Some(Selector::from_requirements(namespace_selector(v, &p)?)),
        Some((_, v, p)) => Some(namespaced_pods(v, &p, &mut bad)?),
        None => None,
    };
    // Whom the object selects must be known: an unreadable subject rejects the object.
    match (bad.0.into_iter().next(), sel) {
        (Some(e), _) => Err(FieldError::new(
            e.path,
            format!("{}: which pods the policy selects is unknown", e.message),
        )),
        (None, Some(sel)) => Ok(sel),
        (None, None) => Err(FieldError::new(
            path,
            "subject needs namespaces or pods (namespaces: {} selects every pod)",
        )),
    }
}

/// `pods: {namespaceSelector, podSelector}`: pods matching both, in any namespace.
fn namespaced_pods(v: &Value, path: &str, bad: &mut Unreadable) -> Res<Selector> {
    let mut o = Obj::new(v, path)?;
    let ns_path = o.at("namespaceSelector");
    let ns = o.get("namespaceSelector");
    let pod_path = o.at("podSelector");
    let pod = o.get("podSelector");
    bad.finish(o)?;
    let Some(pod) = pod else {
        return Err(FieldError::new(
            pod_path,
            "missing (podSelector: {} selects every pod of the selected namespaces)",
        ));
    };
    let mut sel = k8s::k8s_selector(pod, &pod_path)?;
    // namespaceSelector left out selects every namespace, as `{}` does.
    let empty = Value::Object(serde_json::Map::new());
    for r in namespace_selector(ns.unwrap_or(&empty), &ns_path)? {
        sel.add(r);
    }
    Ok(sel)
}

/// One rule: its [`TierRule`] and entry, `None` for an accepting rule that fails closed (it
/// matches nothing).
fn tier_rule(
    v: &Value,
    path: &str,
    dir: Direction,
    tier: Tier,
    priority: u16,
    index: usize,
) -> Res<Option<(TierRule, PeerRule)>> {
    let mut o = Obj::new(v, path)?;
    let name_path = o.at("name");
    let name = o.str("name")?.unwrap_or_default().to_owned();
    if name.chars().count() > 100 {
        return Err(FieldError::new(
            name_path,
            "longer than 100 characters (shorten the rule's name)",
        ));
    }
    let action_path = o.at("action");
    let action = match o.str("action")? {
        Some("Accept") => TierAction::Accept,
        Some("Deny") => TierAction::Deny,
        Some("Pass") => TierAction::Pass,
        Some(other) => {
            return Err(FieldError::new(
                action_path,
                format!("unknown action {other:?} (expected Accept, Deny or Pass)"),
            ));
        }
        None => {
            return Err(FieldError::new(
                action_path,
                "missing (Accept, Deny or Pass)",
            ));
        }
    };
    let egress = dir == Direction::Egress;
    let peers_field = if egress { "to" } else { "from" };
    let peers_path = o.at(peers_field);
    let peer_list = o.array(peers_field)?;
    let protocols_path = o.at("protocols");
    let protocols = o.array("protocols")?;
    let mut bad = Unreadable::default();
    bad.finish(o)?;
    let peer_list = peer_list.unwrap_or_default();
    if peer_list.is_empty() {
        return Err(FieldError::new(
            peers_path,
            format!(
                "needs at least one peer (namespaces: {{}} is every pod{})",
                if egress {
                    ", networks: [0.0.0.0/0, ::/0] every address"
                } else {
                    ""
                }
            ),
        ));
    }
    let mut peers = Vec::new();
    for (p, peer_v) in peer_list {
        peers.extend(peer(peer_v, &p, egress, &mut bad)?);
    }
    let (ports, named_ports) = match protocols {
        None => (Vec::new(), Vec::new()),
        Some(list) if list.is_empty() => {
            return Err(FieldError::new(
                protocols_path,
                "an empty list (leave protocols out to match every protocol and port)",
            ));
        }
        Some(list) => protocol_list(list, &mut bad)?,
    };
    if egress && !named_ports.is_empty() && peers.iter().any(|p| matches!(p, PeerSelector::Cidr(_)))
    {
        return Err(FieldError::new(
            protocols_path,
            "destinationNamedPort cannot be used with networks peers (addresses have no named ports: give the port number)",
        ));
    }
    let index = u8::try_from(index).map_err(|_| FieldError::new(path, "too many rules"))?;
    let mut t = TierRule {
        tier,
        priority,
        direction: dir,
        index,
        action,
        name,
    };
    if !bad.0.is_empty() {
        let entry = fail_closed(t.action, &bad.0);
        t.action = TierAction::Deny;
        return Ok(entry.map(|e| (t, e)));
    }
    peers.sort();
    peers.dedup();
    Ok(Some((
        t,
        PeerRule {
            peers,
            ports,
            named_ports,
        },
    )))
}

/// A rule with unreadable parts, as the API asks: an Accept rule matches nothing (`None`); a
/// Deny or Pass rule denies all traffic of its direction (the entry; the caller makes the
/// action Deny).
fn fail_closed(action: TierAction, bad: &[FieldError]) -> Option<PeerRule> {
    let what = match action {
        TierAction::Accept => "this Accept rule matches nothing (fail closed)".to_owned(),
        a => format!("this {a} rule denies all traffic of its direction (fail closed)"),
    };
    for e in bad {
        walk::note(
            NoteKind::NotEnforced,
            &e.path,
            format!("{}; {what}", e.message),
        );
    }
    (action != TierAction::Accept)
        .then(|| PeerRule::new(vec![PeerSelector::Entity(Entity::All)], Vec::new()))
}

/// One `from[i]` or `to[i]`: one peer, or one per CIDR of `networks`.
fn peer(v: &Value, path: &str, egress: bool, bad: &mut Unreadable) -> Res<Vec<PeerSelector>> {
    let fields: &[&'static str] = if egress {
        &["namespaces", "pods", "nodes", "networks", "domainNames"]
    } else {
        &["namespaces", "pods"]
    };
    let one = pick(Obj::new(v, path)?, path, fields, "a peer", bad)?;
    let Some((field, v, p)) = one else {
        return Ok(Vec::new());
    };
    match field {
        "namespaces" => Ok(vec![PeerSelector::Endpoints(Selector::from_requirements(
            namespace_selector(v, &p)?,
        ))]),
        "pods" => Ok(vec![PeerSelector::Endpoints(namespaced_pods(v, &p, bad)?)]),
        "networks" => networks(v, &p),
        "nodes" => Err(FieldError::new(
            p,
            "not supported yet: nodes peers (select the nodes' addresses with networks instead)",
        )),
        _ => Err(FieldError::new(
            p,
            "not supported yet: domainNames peers (select the addresses with networks instead)",
        )),
    }
}

/// `networks`: CIDRs that also match pods whose address lies in them (the API: "Accept or Deny
/// 0.0.0.0/0 allows or denies all IPv4 pod-to-pod traffic").
fn networks(v: &Value, path: &str) -> Res<Vec<PeerSelector>> {
    let Value::Array(list) = v else {
        return Err(FieldError::new(
            path,
            format!("expected a list of CIDRs, got {}", walk::kind(v)),
        ));
    };
    if list.is_empty() {
        return Err(FieldError::new(
            path,
            "needs at least one CIDR (e.g. 10.0.0.0/8)",
        ));
    }
    list.iter()
        .enumerate()
        .map(|(i, c)| {
            let cidr = walk::cidr(c, &format!("{path}[{i}]"), CidrFlavor::Kubernetes)?;
            Ok(PeerSelector::Cidr(CidrSelector {
                cidr,
                except: Vec::new(),
                match_pods: true,
            }))
        })
        .collect()
}

fn protocol_list(
    list: Vec<(String, &Value)>,
    bad: &mut Unreadable,
) -> Res<(Vec<PortProto>, Vec<NamedPort>)> {
    let (mut ports, mut named) = (Vec::new(), Vec::new());
    for (p, v) in list {
        let one = pick(
            Obj::new(v, &p)?,
            &p,
            &["tcp", "udp", "sctp", "destinationNamedPort"],
            "a protocol",
            bad,
        )?;
        match one {
            None => {}
            Some(("destinationNamedPort", v, p)) => {
                let name = match v {
                    Value::String(s) if is_port_name(s) => s,
                    _ => {
                        return Err(FieldError::new(
                            p,
                            format!(
                                "{v} is not a port name (at most 15 lowercase letters, digits and single inner hyphens, at least one letter)"
                            ),
                        ));
                    }
                };
                // The container port's own protocol decides: the name matches on each.
                named.extend(
                    [proto::TCP, proto::UDP, proto::SCTP].map(|proto| NamedPort {
                        proto,
                        name: name.clone(),
                    }),
                );
            }
            Some((field, v, p)) => {
                let proto = match field {
                    "tcp" => proto::TCP,
                    "udp" => proto::UDP,
                    _ => proto::SCTP,
                };
                if let Some(pp) = destination_port(v, &p, proto, bad)? {
                    ports.push(pp);
                }
            }
        }
    }
    ports.sort();
    ports.dedup();
    named.sort();
    named.dedup();
    Ok((ports, named))
}

/// `tcp: {destinationPort: {number | range}}`; without destinationPort, every port of the
/// protocol.
fn destination_port(
    v: &Value,
    path: &str,
    proto: u8,
    bad: &mut Unreadable,
) -> Res<Option<PortProto>> {
    let mut o = Obj::new(v, path)?;
    let dp_path = o.at("destinationPort");
    let dp = o.get("destinationPort");
    bad.finish(o)?;
    let Some(dp) = dp else {
        return Ok(Some(PortProto {
            proto,
            lo: 0,
            hi: u16::MAX,
        }));
    };
    let one = pick(
        Obj::new(dp, &dp_path)?,
        &dp_path,
        &["number", "range"],
        "destinationPort",
        bad,
    )?;
    match one {
        None => Ok(None),
        Some(("number", v, p)) => {
            let n = port(v, &p)?;
            Ok(Some(PortProto {
                proto,
                lo: n,
                hi: n,
            }))
        }
        Some((_, v, p)) => {
            let mut r = Obj::new(v, &p)?;
            let (start_path, end_path) = (r.at("start"), r.at("end"));
            let (start, end) = (r.get("start"), r.get("end"));
            bad.finish(r)?;
            let start = port(
                start.ok_or_else(|| FieldError::new(&start_path, "missing"))?,
                &start_path,
            )?;
            let end = port(
                end.ok_or_else(|| FieldError::new(&end_path, "missing"))?,
                &end_path,
            )?;
            if start >= end {
                return Err(FieldError::new(
                    end_path,
                    format!(
                        "end {end} must be above start {start} (for a single port give number)"
                    ),
                ));
            }
            Ok(Some(PortProto {
                proto,
                lo: start,
                hi: end,
            }))
        }
    }
}

fn port(v: &Value, path: &str) -> Res<u16> {
    v.as_u64()
        .filter(|n| (1..=65535).contains(n))
        .and_then(|n| u16::try_from(n).ok())
        .ok_or_else(|| FieldError::new(path, format!("{v} is not a port number (1-65535)")))
}

#[cfg(test)]
mod tests;
