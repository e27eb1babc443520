//! `ClusterNetworkPolicy` tiers on real packets (docs/DATAPATH.md, "`ClusterNetworkPolicy`
//! tiers"): the Admin tier before the `NetworkPolicy` layer, the Baseline tier after it, Pass,
//! precedence across the exact identity, any peer and the by-IP twin, the tier flags, and the
//! deciding rule in drop events. Every drop is paired with a packet the same policy lets
//! through, and identified by its event (a policy drop, not a tool failure).

use crate::support::World;
use crate::support::checks::{ips, open_and_attach, policy, wait_event};
use crate::support::traffic::{echo_servers, tcp_ok};
use weft_manager::datapath::{BpfDatapath, Datapath, DropEvent};
use weft_manager::node::ipcache::Value;
use weft_policy::mapstate::{
    Direction, EndpointPolicy, PolicyEntry, Tier, TierAction, TierVerdict, Verdict, proto, reserved,
};

use Direction::{Egress as Out, Ingress as In};
use TierAction::{Accept, Deny, Pass};

const A: usize = 0;
const B: usize = 1;
const ID_A: u32 = 1000;
const ID_B: u32 = 1001;
const EP_A: u32 = 100;
const EP_B: u32 = 101;

/// Adds `tier` entries (and sets the tier's flag): `(direction, identity, tcp port,
/// priority, rule, action)`; identity 0 = any peer; port 0 = any protocol.
fn with_tier(
    mut p: EndpointPolicy,
    tier: Tier,
    entries: &[(Direction, u32, u16, u16, u8, TierAction)],
) -> EndpointPolicy {
    for &(dir, identity, port, priority, rule, action) in entries {
        let entry = if port == 0 {
            PolicyEntry::new(dir, identity, proto::ANY, 0, u16::MAX)
        } else {
            PolicyEntry::new(dir, identity, proto::TCP, port, port)
        };
        let v = TierVerdict {
            priority,
            rule,
            action,
        };
        p.entries.insert(entry.in_tier(tier), Verdict::Tier(v));
        p.tiers.set(tier, dir, true);
    }
    p
}

/// TCP from A to `port` on both of B's addresses passes (`true`) or is dropped.
fn a_to_b(w: &World, port: u16) -> [bool; 2] {
    ips(w, B).map(|ip| tcp_ok(&w.pods[A].ns, ip, port))
}

/// The drop event of A's TCP packet to B's `port` at `endpoint`.
fn drop_of(
    rx: &mut tokio::sync::broadcast::Receiver<DropEvent>,
    endpoint: u32,
    port: u16,
) -> DropEvent {
    wait_event(rx, |e| {
        e.endpoint_id == endpoint && e.proto == proto::TCP && e.dst_port == port
    })
}

/// The tier, priority and rule an event names.
fn rule_of(e: &DropEvent) -> Option<(&'static str, u16, u8)> {
    e.tier_rule.map(|t| (t.tier, t.priority, t.rule))
}

fn servers(w: &World, ports: std::ops::RangeInclusive<u16>) {
    for port in ports {
        echo_servers(&w.pods[B].ns, port);
    }
}

fn apply(dp: &BpfDatapath, w: &World, pod: usize, p: &EndpointPolicy, generation: u64) {
    dp.apply_policy(w.pods[pod].ep.endpoint_id, p, generation)
        .unwrap();
}

#[test]
fn the_admin_tier_decides_before_network_policy_and_pass_hands_over() {
    let w = World::new();
    let dp = open_and_attach(&w);
    servers(&w, 8080..=8085);
    // NetworkPolicy: A may reach 8080 and 8081 only.
    let np = policy(
        true,
        false,
        "ingress 1000 tcp 8080 allow; ingress 1000 tcp 8081 allow",
    );
    let p = with_tier(
        np,
        Tier::Admin,
        &[
            // Deny beats the NetworkPolicy allow.
            (In, ID_A, 8080, 10, 1, Deny),
            // Pass: the NetworkPolicy decides, with its allow or its default deny.
            (In, 0, 8081, 5, 0, Pass),
            (In, 0, 8082, 50, 0, Pass),
            // Accept beats the NetworkPolicy's default deny.
            (In, 0, 8083, 20, 2, Accept),
            // Same priority: the exact identity's earlier rule (accept) comes first.
            (In, ID_A, 8084, 30, 0, Accept),
            (In, 0, 8084, 30, 1, Deny),
            // Any peer's deny at a smaller priority beats A's accept.
            (In, ID_A, 8085, 40, 0, Accept),
            (In, 0, 8085, 39, 3, Deny),
        ],
    );
    apply(&dp, &w, B, &p, 1);
    let mut rx = dp.subscribe_events();
    assert_eq!(a_to_b(&w, 8081), [true; 2], "Pass hands over to the allow");
    assert_eq!(a_to_b(&w, 8083), [true; 2], "Accept beats default deny");
    assert_eq!(
        a_to_b(&w, 8084),
        [true; 2],
        "the earlier rule (accept) wins"
    );
    assert_eq!(a_to_b(&w, 8080), [false; 2], "Deny beats the allow");
    assert_eq!(
        a_to_b(&w, 8082),
        [false; 2],
        "Pass hands over to default deny"
    );
    assert_eq!(a_to_b(&w, 8085), [false; 2], "priority 39 comes before 40");
    for _ in 0..2 {
        let e = drop_of(&mut rx, EP_B, 8080);
        assert_eq!((e.reason, e.src_identity), ("admin-deny", ID_A));
        assert_eq!(rule_of(&e), Some(("Admin", 10, 1)));
        assert!(
            e.to_string().ends_with("tier Admin priority 10 rule 1"),
            "{e}"
        );
    }
    let e = drop_of(&mut rx, EP_B, 8082);
    assert_eq!((e.reason, rule_of(&e)), ("policy-default", None));
    let e = drop_of(&mut rx, EP_B, 8085);
    assert_eq!(
        (e.reason, rule_of(&e)),
        ("admin-deny", Some(("Admin", 39, 3)))
    );
    // Metrics count the admin tier's accepts and denies apart.
    let metrics = dp.map_dump("metrics").unwrap();
    for reason in [
        "allow-admin",
        "admin-deny",
        "allow-policy",
        "policy-default",
    ] {
        assert!(
            metrics
                .iter()
                .any(|m| m["endpoint_id"] == EP_B && m["reason"] == reason),
            "{reason}: {metrics:#?}"
        );
    }
    // The dump names tier, action, priority and rule.
    let dump = dp.map_dump("policy").unwrap();
    assert!(
        dump.iter().any(|e| e["tier"] == "Admin"
            && e["verdict"] == "deny"
            && e["priority"] == 39
            && e["rule"] == 3
            && e["identity"] == 0
            && e["port_lo"] == 8085),
        "{dump:#?}"
    );
}

#[test]
fn the_baseline_tier_decides_only_what_network_policy_does_not_and_flags_gate_tiers() {
    let w = World::new();
    let dp = open_and_attach(&w);
    servers(&w, 8080..=8083);
    let baseline = [
        (In, 0, 8080, 0, 3, Deny),
        (In, ID_A, 8081, 1, 0, Accept),
        (In, ID_A, 8082, 0, 0, Pass),
        // Everything else: denied (any protocol, the last in precedence).
        (In, 0, 0, 100, 0, Deny),
    ];
    let mut rx = dp.subscribe_events();
    // A NetworkPolicy selects B: it decides, the Baseline tier is not consulted.
    let np = policy(true, false, "ingress 1000 tcp 8080 allow");
    apply(&dp, &w, B, &with_tier(np, Tier::Baseline, &baseline), 1);
    assert_eq!(a_to_b(&w, 8080), [true; 2], "the NetworkPolicy allow wins");
    assert_eq!(
        a_to_b(&w, 8081),
        [false; 2],
        "default deny, not Baseline's accept"
    );
    let e = drop_of(&mut rx, EP_B, 8081);
    assert_eq!((e.reason, rule_of(&e)), ("policy-default", None));

    // No NetworkPolicy selects B for ingress: the Baseline tier decides.
    let p = with_tier(EndpointPolicy::default(), Tier::Baseline, &baseline);
    apply(&dp, &w, B, &p, 2);
    assert_eq!(a_to_b(&w, 8081), [true; 2], "Baseline accept");
    assert_eq!(
        a_to_b(&w, 8082),
        [true; 2],
        "Baseline pass: nothing after it, allowed"
    );
    assert_eq!(a_to_b(&w, 8080), [false; 2], "Baseline deny");
    assert_eq!(
        a_to_b(&w, 8083),
        [false; 2],
        "Baseline deny of any protocol"
    );
    let e = drop_of(&mut rx, EP_B, 8080);
    assert_eq!(
        (e.reason, rule_of(&e)),
        ("baseline-deny", Some(("Baseline", 0, 3)))
    );
    let e = drop_of(&mut rx, EP_B, 8083);
    assert_eq!(
        (e.reason, rule_of(&e)),
        ("baseline-deny", Some(("Baseline", 100, 0)))
    );
    let endpoints = dp.map_dump("endpoints").unwrap();
    let b = endpoints.iter().find(|e| e["endpoint_id"] == EP_B).unwrap();
    assert_eq!(b["tiers"], serde_json::json!(["baseline-ingress"]), "{b}");

    // The same entries without the tier's flag are never looked up.
    let mut unflagged = p.clone();
    unflagged.tiers = weft_policy::mapstate::TierFlags::default();
    apply(&dp, &w, B, &unflagged, 3);
    assert_eq!(a_to_b(&w, 8080), [true; 2], "no flag: not enforced");
    let endpoints = dp.map_dump("endpoints").unwrap();
    let b = endpoints.iter().find(|e| e["endpoint_id"] == EP_B).unwrap();
    assert_eq!(b["tiers"], serde_json::json!([]), "{b}");
}

#[test]
fn a_pod_address_in_a_network_peer_meets_its_by_ip_entries_and_egress_tiers_apply() {
    let w = World::new();
    let dp = open_and_attach(&w);
    servers(&w, 8080..=8082);
    // A's addresses lie in a CIDR rule's prefix (what the manager's ipcache writes for them).
    let cidr = reserved::FIRST_CIDR + 7;
    for ip in ips(&w, A) {
        let value = Value {
            identity: ID_A,
            cidr_identity: cidr,
        };
        dp.upsert_ipcache(ipnet::IpNet::from(ip), value).unwrap();
    }
    let twin = reserved::by_ip(cidr);
    let p = with_tier(
        EndpointPolicy::default(),
        Tier::Admin,
        &[
            // A by its identity: accepted at priority 2; by its address: denied at 1.
            (In, ID_A, 8080, 2, 0, Accept),
            (In, twin, 8080, 1, 0, Deny),
            // The other way round: the identity's rule comes first.
            (In, ID_A, 8081, 1, 0, Accept),
            (In, twin, 8081, 2, 0, Deny),
        ],
    );
    apply(&dp, &w, B, &p, 1);
    let mut rx = dp.subscribe_events();
    assert_eq!(a_to_b(&w, 8081), [true; 2], "identity accept first");
    assert_eq!(a_to_b(&w, 8080), [false; 2], "by-IP deny first");
    let e = drop_of(&mut rx, EP_B, 8080);
    assert_eq!(
        (e.reason, rule_of(&e)),
        ("admin-deny", Some(("Admin", 1, 0)))
    );

    // Egress: A's Admin tier denies B on 8082 (A's egress is not otherwise enforced).
    let p = with_tier(
        EndpointPolicy::default(),
        Tier::Admin,
        &[(Out, ID_B, 8082, 7, 5, Deny)],
    );
    apply(&dp, &w, A, &p, 1);
    assert_eq!(a_to_b(&w, 8081), [true; 2], "egress: other ports pass");
    assert_eq!(a_to_b(&w, 8082), [false; 2], "egress: admin deny");
    let e = drop_of(&mut rx, EP_A, 8082);
    assert_eq!((e.reason, e.direction), ("admin-deny", "egress"));
    assert_eq!((e.dst_identity, rule_of(&e)), (ID_B, Some(("Admin", 7, 5))));
}
