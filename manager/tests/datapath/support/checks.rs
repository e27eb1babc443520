//! Helpers shared by the datapath tests: policies, attach, events, checks of leftovers.

use super::{World, in_ns};
use std::net::IpAddr;
use std::time::{Duration, Instant};
use tokio::sync::broadcast::Receiver;
use weft_manager::datapath::{BpfDatapath, Datapath, DropEvent};
use weft_policy::mapstate::{Direction, EndpointPolicy, PolicyEntry, Verdict, proto};

/// Builds a policy from `"direction identity proto ports verdict; ..."`, e.g.
/// `"ingress 1000 tcp 8080-8090 allow; ingress 0 any * deny"` (identity 0 = any peer, proto
/// `any` with ports `*`; ports are one number or `lo-hi`; ICMP "ports" are types).
pub fn policy(ingress: bool, egress: bool, rules: &str) -> EndpointPolicy {
    let mut entries = std::collections::BTreeMap::new();
    for rule in rules.split(';').map(str::trim).filter(|r| !r.is_empty()) {
        let f: Vec<&str> = rule.split_whitespace().collect();
        assert_eq!(f.len(), 5, "bad rule {rule:?}");
        let direction = match f[0] {
            "ingress" => Direction::Ingress,
            "egress" => Direction::Egress,
            d => panic!("bad direction {d}"),
        };
        let proto = match f[2] {
            "any" => proto::ANY,
            "tcp" => proto::TCP,
            "udp" => proto::UDP,
            "icmp" => proto::ICMP,
            "icmpv6" => proto::ICMPV6,
            p => panic!("bad proto {p}"),
        };
        let (port_lo, port_hi) = match f[3].split_once('-') {
            _ if f[3] == "*" => (0, u16::MAX),
            Some((lo, hi)) => (lo.parse().unwrap(), hi.parse().unwrap()),
            None => (f[3].parse().unwrap(), f[3].parse().unwrap()),
        };
        let verdict = if f[4] == "deny" {
            Verdict::Deny
        } else {
            Verdict::Allow
        };
        let identity = f[1].parse().unwrap();
        entries.insert(
            PolicyEntry::new(direction, identity, proto, port_lo, port_hi),
            verdict,
        );
    }
    EndpointPolicy {
        ingress_enforced: ingress,
        egress_enforced: egress,
        entries,
        ..EndpointPolicy::default()
    }
}

pub fn open_and_attach(w: &World) -> BpfDatapath {
    open_and_attach_with(w, w.config())
}

/// [`open_and_attach`] with a datapath configuration of the caller's (map sizes).
pub fn open_and_attach_with(
    w: &World,
    config: weft_manager::datapath::DatapathConfig,
) -> BpfDatapath {
    let dp = BpfDatapath::open(config).expect("open datapath");
    for p in &w.pods {
        in_ns(&w.node, || dp.attach_endpoint(&p.ep)).expect("attach");
        // What the manager's ipcache owners would write for the endpoint's addresses.
        for ip in &p.ep.ips {
            dp.upsert_ipcache(ipnet::IpNet::from(*ip), identity(p.ep.identity))
                .expect("ipcache");
        }
    }
    dp
}

/// An ipcache value for a plain identity.
pub fn identity(identity: u32) -> weft_manager::node::ipcache::Value {
    weft_manager::node::ipcache::Value {
        identity,
        cidr_identity: 0,
    }
}

/// Waits for a drop event matching `pred`.
pub fn wait_event(rx: &mut Receiver<DropEvent>, pred: impl Fn(&DropEvent) -> bool) -> DropEvent {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        match rx.try_recv() {
            Ok(ev) if pred(&ev) => return ev,
            Ok(ev) => seen.push(ev.to_string()),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    panic!("no matching drop event; saw {seen:#?}");
}

/// No filter and no map entry refers to pod `i` any more.
pub fn assert_endpoint_gone(w: &World, dp: &BpfDatapath, i: usize) {
    let id = w.pods[i].ep.endpoint_id;
    for dir in ["ingress", "egress"] {
        let filters = w.tc_filters(i, dir);
        assert!(!filters.contains("weft"), "{dir} filter left: {filters}");
    }
    // The policy slot is not the endpoint's: the manager releases it when its last user goes.
    for map in ["endpoints", "ct", "metrics"] {
        let dump = dp.map_dump(map).unwrap();
        let left: Vec<_> = dump.iter().filter(|e| e["endpoint_id"] == id).collect();
        assert!(
            left.is_empty(),
            "{map} still has entries of {id}: {left:#?}"
        );
    }
    // The endpoint's ipcache entries are the manager's (crate::node::ipcache), not the datapath's.
}

/// The program id in `tc filter show` output.
pub fn prog_id(filters: &str) -> u32 {
    let after = filters
        .split(" id ")
        .nth(1)
        .unwrap_or_else(|| panic!("no program in {filters}"));
    after.split_whitespace().next().unwrap().parse().unwrap()
}

pub fn ips(w: &World, i: usize) -> [IpAddr; 2] {
    [w.pods[i].ip4.into(), w.pods[i].ip6.into()]
}
