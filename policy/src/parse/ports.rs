//! The `ports[]` items both policy APIs share: port numbers and names, `endPort` ranges,
//! protocols, and named ports kept apart from numeric ones.

use serde_json::Value;

use super::walk::{FieldError, Obj, Res, kind};
use crate::mapstate::proto;
use crate::rule::PortProto;

/// A port number from a string or a number; `0` is "all ports" where `allow_zero`.
fn port_number(v: &Value, path: &str, allow_zero: bool) -> Res<u16> {
    let text = match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        other => {
            return Err(FieldError::new(
                path,
                format!("expected a port number, got {}", kind(other)),
            ));
        }
    };
    match text.parse::<u32>() {
        Ok(0) if allow_zero => Ok(0),
        Ok(n @ 1..=65535) => {
            u16::try_from(n).map_err(|_| FieldError::new(path, "port out of range"))
        }
        Ok(_) | Err(_) => Err(FieldError::new(
            path,
            format!("{text:?} is not a port number (1-65535)"),
        )),
    }
}

/// A port as written: a number, or a container port's name (`IANA_SVC_NAME`).
#[derive(Debug, Clone, PartialEq, Eq)]
enum PortSpec {
    /// 0 (where allowed: all ports) or 1-65535.
    Number(u16),
    /// A named port.
    Name(String),
}

/// A port number or name. Names follow Kubernetes' `IANA_SVC_NAME`: at most 15 lowercase
/// letters, digits and inner single hyphens, with at least one letter.
fn port_spec(v: &Value, path: &str, allow_zero: bool) -> Res<PortSpec> {
    if let Value::String(s) = v
        && s.chars().any(|c| c.is_ascii_alphabetic())
    {
        if !is_port_name(s) {
            return Err(FieldError::new(
                path,
                format!(
                    "{s:?} is neither a port number (1-65535) nor a port name (at most 15 lowercase letters, digits and single inner hyphens)"
                ),
            ));
        }
        return Ok(PortSpec::Name(s.clone()));
    }
    port_number(v, path, allow_zero).map(PortSpec::Number)
}

/// Kubernetes' `IANA_SVC_NAME`: at most 15 lowercase letters, digits and inner single hyphens,
/// with at least one letter.
pub fn is_port_name(s: &str) -> bool {
    s.len() <= 15
        && s.chars().any(|c| c.is_ascii_lowercase())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-')
        && !s.contains("--")
}

/// Named ports of one entry; `end` must be absent. In an ingress rule the name is the selected
/// pod's own port; in an egress rule, the destination pod's.
fn named_ports(
    protos: &[u8],
    name: &str,
    has_end: bool,
    path: &str,
) -> Res<Vec<crate::rule::NamedPort>> {
    if has_end {
        return Err(FieldError::new(
            path,
            format!("endPort needs a numeric port, not the name {name:?}"),
        ));
    }
    let protos: Vec<u8> = protos
        .iter()
        .flat_map(|&p| {
            if p == proto::ANY {
                vec![proto::TCP, proto::UDP, proto::SCTP]
            } else {
                vec![p]
            }
        })
        .collect();
    Ok(protos
        .into_iter()
        .map(|proto| crate::rule::NamedPort {
            proto,
            name: name.to_owned(),
        })
        .collect())
}

/// Protocols a port can name. `ANY` with a port expands to TCP, UDP and SCTP because the map
/// contract only allows protocol 0 together with all ports.
pub fn protocols(name: &str, path: &str) -> Res<Vec<u8>> {
    match name.to_ascii_uppercase().as_str() {
        "TCP" => Ok(vec![proto::TCP]),
        "UDP" => Ok(vec![proto::UDP]),
        "SCTP" => Ok(vec![proto::SCTP]),
        "ANY" => Ok(vec![proto::ANY]),
        "ICMP" | "ICMPV6" => Err(FieldError::new(
            path,
            format!("not supported yet: protocol {name:?} in ports"),
        )),
        _ => Err(FieldError::new(
            path,
            format!("unknown protocol {name:?} (expected TCP, UDP, SCTP or ANY)"),
        )),
    }
}

/// One `ports[]` item's `port` (absent: all ports) and `endPort`, with their field paths for
/// the errors [`PortFields::add`] reports. Read before the item's protocol, so that a bad port is
/// the error reported first.
pub struct PortFields {
    port: PortSpec,
    end: Option<u16>,
    port_path: String,
    end_path: String,
}

/// Reads `item`'s `port` and `endPort`; a `port` of `0` is allowed (all ports) where
/// `allow_zero` (Cilium), not in a `NetworkPolicy`.
pub fn port_fields(item: &mut Obj<'_>, allow_zero: bool) -> Res<PortFields> {
    let port_path = item.at("port");
    let port = match item.get("port") {
        Some(v) => port_spec(v, &port_path, allow_zero)?,
        None => PortSpec::Number(0),
    };
    let end_path = item.at("endPort");
    let end = match item.get("endPort") {
        Some(v) => Some(port_number(v, &end_path, false)?),
        None => None,
    };
    Ok(PortFields {
        port,
        end,
        port_path,
        end_path,
    })
}

impl PortFields {
    /// Adds the item's entries for `protos`: a number (or range) to `numeric`, a name to `named`.
    pub fn add(
        self,
        protos: &[u8],
        numeric: &mut Vec<PortProto>,
        named: &mut Vec<crate::rule::NamedPort>,
    ) -> Res<()> {
        match self.port {
            PortSpec::Number(port) => {
                numeric.extend(port_entries(protos, port, self.end, &self.end_path)?);
            }
            PortSpec::Name(name) => {
                named.extend(named_ports(
                    protos,
                    &name,
                    self.end.is_some(),
                    &self.port_path,
                )?);
            }
        }
        Ok(())
    }
}

/// Turns one (protocols, port, endPort) triple into port entries.
fn port_entries(protos: &[u8], port: u16, end: Option<u16>, end_path: &str) -> Res<Vec<PortProto>> {
    let (lo, hi) = match (port, end) {
        (0, Some(_)) => return Err(FieldError::new(end_path, "endPort needs a port")),
        (0, None) => (0, u16::MAX),
        (p, None) => (p, p),
        (p, Some(e)) if e < p => {
            return Err(FieldError::new(
                end_path,
                format!("endPort {e} is below port {p}"),
            ));
        }
        (p, Some(e)) => (p, e),
    };
    let all = (lo, hi) == (0, u16::MAX);
    Ok(protos
        .iter()
        .flat_map(|&p| {
            if p == proto::ANY && !all {
                vec![proto::TCP, proto::UDP, proto::SCTP]
            } else {
                vec![p]
            }
        })
        .map(|proto| PortProto { proto, lo, hi })
        .collect())
}
