//! Table renderings of the API's answers for weftctl's default output.

use serde_json::Value;
use weft_api::{Allocation, Endpoint, StatusResponse, VerifyReport};

use crate::table;

pub fn status_table(s: &StatusResponse) -> String {
    let mut out = format!(
        "Node:       {}\nReady:      {}\nEndpoints:  {}\nPolicy rev: {}\nVersion:    {}\n",
        s.node_name, s.ready, s.endpoints, s.policy_revision, s.version
    );
    if let Some(p) = &s.programs {
        out.push_str("Programs:   ");
        out.push_str(p);
        out.push('\n');
    }
    for w in &s.warnings {
        out.push_str("Warning:    ");
        out.push_str(w);
        out.push('\n');
    }
    out.push('\n');
    let rows: Vec<Vec<String>> = s
        .pools
        .iter()
        .map(|p| {
            vec![
                p.cidr.clone(),
                match &p.source_detail {
                    Some(d) if *d != p.source.to_string() => format!("{} ({d})", p.source),
                    _ => p.source.to_string(),
                },
                p.router_ip.to_string(),
                format!("{}/{}", p.used, p.capacity),
            ]
        })
        .collect();
    out.push_str(&table::render(&["CIDR", "SOURCE", "ROUTER", "USED"], &rows));
    out
}

pub fn endpoint_table(eps: &[Endpoint]) -> String {
    let rows: Vec<Vec<String>> = eps
        .iter()
        .map(|e| {
            vec![
                e.id.to_string(),
                format!("{:?}", e.state).to_lowercase(),
                e.ips
                    .iter()
                    .map(|i| i.address.to_string())
                    .collect::<Vec<_>>()
                    .join(","),
                e.host_ifname.clone(),
                e.identity.to_string(),
                match (&e.pod_namespace, &e.pod_name) {
                    (Some(ns), Some(n)) => format!("{ns}/{n}"),
                    _ => "-".into(),
                },
                e.container_id.chars().take(12).collect(),
                e.labels
                    .iter()
                    .map(|l| format!("{}={}", l.key, l.value))
                    .collect::<Vec<_>>()
                    .join(","),
            ]
        })
        .collect();
    table::render(
        &[
            "ID",
            "STATE",
            "IPS",
            "HOST-IF",
            "IDENTITY",
            "POD",
            "CONTAINER",
            "LABELS",
        ],
        &rows,
    )
}

pub fn ipam_table(allocs: &[Allocation]) -> String {
    let rows: Vec<Vec<String>> = allocs
        .iter()
        .map(|a| {
            vec![
                a.address.to_string(),
                a.pool.clone(),
                a.endpoint_id.to_string(),
                a.container_id.chars().take(12).collect(),
                a.ifname.clone(),
            ]
        })
        .collect();
    table::render(
        &["ADDRESS", "POOL", "ENDPOINT", "CONTAINER", "IFNAME"],
        &rows,
    )
}

fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// `policy list`.
pub fn policy_table(v: &Value) -> String {
    let rules = v["rules"].as_array().cloned().unwrap_or_default();
    let rows: Vec<Vec<String>> = rules
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let count = |k: &str| r[k].as_array().map_or(0, Vec::len);
            vec![
                i.to_string(),
                origin_of(&r["labels"]).into(),
                tier_of(&r["tier"]),
                labels_of(&r["labels"]),
                serde_json::to_string(&r["endpoint_selector"]).unwrap_or_default(),
                format!("{}/{}", count("ingress"), count("ingress_deny")),
                format!("{}/{}", count("egress"), count("egress_deny")),
            ]
        })
        .collect();
    let rejected: Vec<Vec<String>> = v["rejected"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| vec![s(&r["object"]), s(&r["error"])])
        .collect();
    let rejected = if rejected.is_empty() {
        String::new()
    } else {
        format!(
            "\nRejected cluster policies (previous rules of each object, if any, stay in force):\n{}",
            table::render(&["OBJECT", "ERROR"], &rejected)
        )
    };
    let mut partial: Vec<Vec<String>> = Vec::new();
    for p in v["partial"].as_array().into_iter().flatten() {
        for (what, key) in [("not enforced", "not_enforced"), ("warning", "warnings")] {
            for n in p[key].as_array().into_iter().flatten() {
                partial.push(vec![s(&p["object"]), what.into(), s(n)]);
            }
        }
    }
    let partial = if partial.is_empty() {
        String::new()
    } else {
        format!(
            "\nPartially enforced cluster policies (a rule not enforced allows nothing; its pods stay isolated):\n{}",
            table::render(&["OBJECT", "STATUS", "DETAIL"], &partial)
        )
    };
    format!(
        "Revision: {}\n{}{}{rejected}{partial}",
        s(&v["revision"]),
        table::render(
            &[
                "#",
                "ORIGIN",
                "TIER",
                "LABELS",
                "SELECTOR",
                "INGRESS(allow/deny)",
                "EGRESS(allow/deny)"
            ],
            &rows
        ),
        tiered_table(&v["cluster_network_policies"]),
    )
}

/// A `ClusterNetworkPolicy` rule's place: `admin 10 ingress[0] Deny "name"`; `-` for other rules.
fn tier_of(t: &Value) -> String {
    if t.is_null() {
        return "-".into();
    }
    let name = t["name"].as_str().filter(|n| !n.is_empty());
    format!(
        "{} {} {}[{}] {}{}",
        s(&t["tier"]),
        s(&t["priority"]),
        s(&t["direction"]),
        s(&t["index"]),
        s(&t["action"]),
        name.map(|n| format!(" {n:?}")).unwrap_or_default()
    )
}

/// The `ClusterNetworkPolicy` objects the watchers took, accepted or not (`cluster_network_policies`).
fn tiered_table(v: &Value) -> String {
    let rows: Vec<Vec<String>> = v
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            vec![
                s(&p["name"]),
                s(&p["tier"]),
                s(&p["priority"]),
                s(&p["rules"]),
                s(&p["status"]),
                p["message"]
                    .as_str()
                    .filter(|m| !m.is_empty())
                    .unwrap_or("-")
                    .to_owned(),
            ]
        })
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    format!(
        "\nClusterNetworkPolicies (a rejected one's previous rules, if any, stay in force):\n{}",
        table::render(
            &["NAME", "TIER", "PRIORITY", "RULES", "STATUS", "DETAIL"],
            &rows
        )
    )
}

/// `cluster` for rules the Kubernetes watchers added (`k8s:io.weft.policy.origin=cluster`),
/// `import` for everything `weftctl policy import` added.
fn origin_of(labels: &Value) -> &'static str {
    let cluster = labels
        .as_array()
        .into_iter()
        .flatten()
        .any(|l| l.as_str() == Some(weft_api::policy::CLUSTER_POLICY_LABEL));
    if cluster { "cluster" } else { "import" }
}

fn labels_of(v: &Value) -> String {
    match v {
        Value::Array(items) => items
            .iter()
            .map(|l| match (&l["source"], &l["key"], &l["value"]) {
                (Value::String(src), Value::String(k), Value::String(val)) if val.is_empty() => {
                    format!("{src}:{k}")
                }
                (Value::String(src), Value::String(k), Value::String(val)) => {
                    format!("{src}:{k}={val}")
                }
                _ => l.to_string(),
            })
            .collect::<Vec<_>>()
            .join(","),
        other => s(other),
    }
}

/// `identity list`.
pub fn identity_table(v: &Value) -> String {
    let rows: Vec<Vec<String>> = v
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| {
            vec![
                s(&i["id"]),
                s(&i["references"]),
                i["source"].as_str().unwrap_or("local").to_owned(),
                i["labels"]
                    .as_array()
                    .map(|l| l.iter().map(s).collect::<Vec<_>>().join(","))
                    .unwrap_or_default(),
            ]
        })
        .collect();
    table::render(&["ID", "REFS", "SOURCE", "LABELS"], &rows)
}

/// The kvstore line of `status`.
pub fn kvstore_line(v: &Value) -> String {
    match v["backend"].as_str() {
        None | Some("none") => "\nKvstore:    none (single node)\n".into(),
        Some(backend) => format!(
            "\nKvstore:    {backend} {} ({}), {} remote node(s), {} remote address(es)\n",
            if v["connected"].as_bool() == Some(true) {
                "connected"
            } else {
                "disconnected"
            },
            if backend == "crd" {
                "the Kubernetes API server".to_owned()
            } else {
                v["endpoints"]
                    .as_array()
                    .map(|e| e.iter().map(s).collect::<Vec<_>>().join(","))
                    .unwrap_or_default()
            },
            s(&v["remote_nodes"]),
            s(&v["remote_ips"]),
        ),
    }
}

/// `node list`.
pub fn node_table(v: &Value) -> String {
    let join = |x: &Value| {
        x.as_array()
            .map(|a| a.iter().map(s).collect::<Vec<_>>().join(","))
            .unwrap_or_default()
    };
    let rows: Vec<Vec<String>> = v
        .as_array()
        .into_iter()
        .flatten()
        .map(|n| {
            vec![
                format!(
                    "{}{}",
                    s(&n["name"]),
                    if n["local"].as_bool() == Some(true) {
                        " (local)"
                    } else {
                        ""
                    }
                ),
                s(&n["node_ip"]),
                join(&n["pod_cidrs"]),
                join(&n["router_ips"]),
            ]
        })
        .collect();
    table::render(&["NAME", "NODE IP", "POD CIDRS", "ROUTERS"], &rows)
}

/// `service list`: one row per frontend.
pub fn service_table(v: &Value) -> String {
    let mut rows: Vec<Vec<String>> = Vec::new();
    for svc in v.as_array().into_iter().flatten() {
        for f in svc["frontends"].as_array().into_iter().flatten() {
            let fe = &f["frontend"];
            let backends: Vec<String> = f["backends"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|b| match b["addr"].as_str() {
                    Some(a) if a.contains(':') => format!("[{a}]:{}", s(&b["port"])),
                    _ => format!("{}:{}", s(&b["addr"]), s(&b["port"])),
                })
                .collect();
            let addr = s(&fe["addr"]);
            rows.push(vec![
                s(&f["id"]),
                s(&svc["name"]),
                if addr.contains(':') {
                    format!("[{addr}]:{}/{}", s(&fe["port"]), s(&fe["proto"]))
                } else {
                    format!("{addr}:{}/{}", s(&fe["port"]), s(&fe["proto"]))
                },
                if backends.is_empty() {
                    "(none: kube-proxy's)".to_owned()
                } else {
                    backends.join(",")
                },
            ]);
        }
    }
    table::render(&["ID", "SERVICE", "FRONTEND", "BACKENDS"], &rows)
}

/// `map list`.
pub fn map_list_table(v: &Value) -> String {
    let rows: Vec<Vec<String>> = v
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            ["name", "map_type", "entries", "max_entries"]
                .iter()
                .map(|k| s(&m[*k]))
                .collect()
        })
        .collect();
    table::render(&["NAME", "TYPE", "ENTRIES", "MAX"], &rows)
}

/// `map dump NAME`: one decoded entry per line.
pub fn map_dump_lines(v: &Value) -> String {
    let mut out = String::new();
    for e in v.as_array().into_iter().flatten() {
        out.push_str(&e.to_string());
        out.push('\n');
    }
    out
}

/// `map verify`: a summary line, then one line per disagreement.
pub fn verify_lines(r: &VerifyReport) -> String {
    let head = format!(
        "{} endpoints, {} policy slots, {} policy blocks, {} ipcache prefixes: {}",
        r.endpoints,
        r.slots,
        r.policy_entries,
        r.ipcache_entries,
        if r.problems.is_empty() {
            "consistent"
        } else {
            "INCONSISTENT"
        }
    );
    std::iter::once(head)
        .chain(r.problems.iter().map(|p| format!("  {}", p.escape_debug())))
        .collect::<Vec<_>>()
        .join("\n")
}

/// One `monitor` line.
pub fn event_line(e: &Value) -> String {
    let sock = |ip: &Value, port: &Value| {
        let ip = s(ip);
        if ip.contains(':') {
            format!("[{ip}]:{}", s(port))
        } else {
            format!("{ip}:{}", s(port))
        }
    };
    let proto = match e["proto"].as_u64() {
        Some(6) => "tcp".to_string(),
        Some(17) => "udp".into(),
        Some(132) => "sctp".into(),
        Some(1) => "icmp".into(),
        Some(58) => "icmpv6".into(),
        other => format!("proto {}", other.unwrap_or(0)),
    };
    let mut line = format!(
        "drop ({}) endpoint {} {} {} {} -> {} identity {} -> {}",
        s(&e["reason"]),
        s(&e["endpoint_id"]),
        s(&e["direction"]),
        proto,
        sock(&e["src_ip"], &e["src_port"]),
        sock(&e["dst_ip"], &e["dst_port"]),
        s(&e["src_identity"]),
        s(&e["dst_identity"]),
    );
    // A ClusterNetworkPolicy rule's drop: which one.
    if !e["tier"].is_null() {
        use std::fmt::Write;
        // Writing to a String cannot fail.
        let _ = write!(
            line,
            " tier {} priority {} rule {}",
            s(&e["tier"]),
            s(&e["priority"]),
            s(&e["rule"])
        );
        if !e["policy"].is_null() {
            let _ = write!(line, " ({})", s(&e["policy"]));
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_list_shows_cluster_network_policies_with_tier_and_priority() {
        let v = serde_json::json!({
            "revision": 9,
            "rules": [
                {"labels": ["k8s:io.cilium.k8s.policy.derived-from=ClusterNetworkPolicy",
                            "k8s:io.weft.policy.origin=cluster"],
                 "tier": {"tier": "admin", "priority": 10, "direction": "egress", "index": 1,
                          "action": "Deny", "name": "no-metadata"}},
                {"labels": ["unspec:name=l3-rule"]},
            ],
            "cluster_network_policies": [
                {"name": "protect", "tier": "Admin", "priority": 10, "rules": 3,
                 "status": "Accepted", "message": ""},
                {"name": "broken", "tier": "Baseline", "priority": 5, "rules": null,
                 "status": "Rejected", "message": "spec.egress[0].to[0].nodes: not supported yet"},
            ],
        });
        let out = policy_table(&v);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[1].contains("TIER"), "{out}");
        assert!(
            lines[2].contains(r#"admin 10 egress[1] Deny "no-metadata""#),
            "{out}"
        );
        assert!(lines[3].contains(" - "), "{out}");
        let cnps: Vec<&str> = out
            .lines()
            .skip_while(|l| !l.starts_with("ClusterNetworkPolicies"))
            .collect();
        assert!(
            cnps[1].contains("PRIORITY") && cnps[1].contains("STATUS"),
            "{out}"
        );
        let row = |name: &str| {
            cnps.iter()
                .find(|l| l.starts_with(name))
                .copied()
                .unwrap_or("")
        };
        let protect: Vec<&str> = row("protect").split_whitespace().collect();
        assert_eq!(
            protect,
            ["protect", "Admin", "10", "3", "Accepted", "-"],
            "{out}"
        );
        let broken = row("broken");
        assert!(
            broken.contains("Baseline")
                && broken.contains("Rejected")
                && broken.contains("nodes: not supported yet"),
            "{out}"
        );
    }

    #[test]
    fn a_tier_drop_line_names_its_rule_and_policy() {
        let mut e = serde_json::json!({
            "reason": "admin-deny", "endpoint_id": 101, "direction": "ingress", "proto": 6,
            "src_ip": "10.0.0.10", "src_port": 41000, "dst_ip": "10.0.0.11", "dst_port": 8080,
            "src_identity": 1000, "dst_identity": 1001,
        });
        let plain = event_line(&e);
        assert!(plain.ends_with("identity 1000 -> 1001"), "{plain}");
        e["tier"] = "Admin".into();
        e["priority"] = 10.into();
        e["rule"] = 1.into();
        assert_eq!(
            event_line(&e),
            format!("{plain} tier Admin priority 10 rule 1")
        );
        e["policy"] = "block-ssh/ssh".into();
        assert_eq!(
            event_line(&e),
            format!("{plain} tier Admin priority 10 rule 1 (block-ssh/ssh)")
        );
    }

    #[test]
    fn policy_list_tells_cluster_rules_from_imported_ones_and_shows_rejections() {
        let v = serde_json::json!({
            "revision": 7,
            "rules": [
                {"labels": ["k8s:io.cilium.k8s.policy.name=a", "k8s:io.weft.policy.origin=cluster"]},
                {"labels": ["unspec:name=l3-rule"]},
            ],
            "rejected": [{"object": "NetworkPolicy prod/bad", "error": "spec: missing"}],
            "partial": [{"object": "CiliumNetworkPolicy prod/fqdn",
                         "not_enforced": ["spec.egress[0].toFQDNs: not supported yet"],
                         "warnings": ["spec.egress[1].toCIDR[0]: host bits"]}],
        });
        let out = policy_table(&v);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[1].contains("ORIGIN"), "{out}");
        assert!(lines[2].contains("cluster"), "{out}");
        assert!(lines[3].contains("import"), "{out}");
        assert!(
            out.contains("NetworkPolicy prod/bad") && out.contains("spec: missing"),
            "{out}"
        );
        let partial: Vec<&str> = out
            .lines()
            .skip_while(|l| !l.starts_with("Partially enforced"))
            .collect();
        assert!(
            partial[2].contains("CiliumNetworkPolicy prod/fqdn"),
            "{out}"
        );
        assert!(
            partial[2].contains("not enforced") && partial[2].contains("toFQDNs"),
            "{out}"
        );
        assert!(
            partial[3].contains("warning") && partial[3].contains("host bits"),
            "{out}"
        );
    }
}
