//! Privileged datapath tests: real programs on real veths in private netns, real traffic.
//! They need root, clang-19 and bpffs, and fail (never skip) without them.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    reason = "an integration test crate: its helpers panic with context like its tests (clippy.toml's allow-*-in-tests covers only #[test] functions)"
)]

mod support;

/// Restart, detach, reconcile, map dumps and policy updates under traffic.
mod lifecycle;

/// The two-step policy layout: shared port lists, failed writes, crash leftovers.
mod lists;

/// The conntrack reopen rule and established flows across a policy change.
mod reopen;

/// ClusterNetworkPolicy tiers on real packets.
mod tiers;

use std::collections::BTreeSet;
use std::net::IpAddr;
use support::checks::{
    assert_endpoint_gone, identity, ips, open_and_attach, open_and_attach_with, policy, prog_id,
    wait_event,
};
use support::traffic::{echo_servers, ping_ok, tcp_ok, udp_big_ok, udp_ok, udp_refused};
use support::{World, in_ns};
use weft_manager::datapath::{BpfDatapath, Datapath};
use weft_policy::mapstate::proto;

const A: usize = 0;
const B: usize = 1;
const ID_A: u32 = 1000;

#[test]
fn allowed_ports_pass_denied_ports_drop_with_an_event() {
    let w = World::new();
    let dp = open_and_attach(&w);
    echo_servers(&w.pods[B].ns, 8080);
    echo_servers(&w.pods[B].ns, 8081);
    let p = policy(
        true,
        false,
        "ingress 1000 tcp 8080 allow; ingress 1000 udp 8080 allow",
    );
    dp.apply_policy(w.pods[B].ep.endpoint_id, &p, 1).unwrap();
    let mut rx = dp.subscribe_events();
    for (n, ip) in ips(&w, B).into_iter().enumerate() {
        let a = &w.pods[A].ns;
        assert!(tcp_ok(a, ip, 8080), "TCP 8080 to {ip} must pass");
        assert!(
            udp_ok(a, ip, 8080, 40_000),
            "UDP 8080 to {ip} must pass (and its reply)"
        );
        assert!(!tcp_ok(a, ip, 8081), "TCP 8081 to {ip} must be dropped");
        let src_port = 41_000 + u16::try_from(n).unwrap();
        assert!(
            !udp_ok(a, ip, 8081, src_port),
            "UDP 8081 to {ip} must be dropped"
        );
        // Events arrive in traffic order: TCP first.
        let tcp = wait_event(&mut rx, |e| e.proto == proto::TCP && e.dst_ip == ip);
        assert_eq!(tcp.dst_port, 8081);
        let ev = wait_event(&mut rx, |e| e.proto == proto::UDP && e.dst_ip == ip);
        assert_eq!(ev.src_ip, ips(&w, A)[n]);
        assert_eq!((ev.src_port, ev.dst_port), (src_port, 8081));
        assert_eq!((ev.src_identity, ev.dst_identity), (ID_A, 1001));
        assert_eq!(
            (ev.endpoint_id, ev.direction, ev.reason),
            (101, "ingress", "policy-default")
        );
        assert_ne!(tcp.src_port, 0);
    }
    let metrics = dp.map_dump("metrics").unwrap();
    assert!(
        metrics.iter().any(|m| m["endpoint_id"] == 101
            && m["reason"] == "policy-default"
            && m["packets"].as_u64() > Some(0)),
        "{metrics:#?}"
    );
}

#[test]
fn replies_of_pod_initiated_flows_pass_an_enforced_ingress() {
    let w = World::new();
    let dp = open_and_attach(&w);
    echo_servers(&w.pods[B].ns, 9000);
    echo_servers(&w.pods[A].ns, 9000);
    // A: ingress enforced with nothing allowed; egress to B allowed.
    let p = policy(
        true,
        true,
        "egress 1001 tcp 9000 allow; egress 1001 udp 9000 allow",
    );
    dp.apply_policy(w.pods[A].ep.endpoint_id, &p, 1).unwrap();
    for ip in ips(&w, B) {
        assert!(
            tcp_ok(&w.pods[A].ns, ip, 9000),
            "A→{ip} TCP and its replies must pass"
        );
        assert!(
            udp_ok(&w.pods[A].ns, ip, 9000, 42_000),
            "A→{ip} UDP and its replies must pass"
        );
    }
    for ip in ips(&w, A) {
        assert!(
            !tcp_ok(&w.pods[B].ns, ip, 9000),
            "B→A {ip} must be dropped by A's ingress"
        );
    }
    let ct = dp.map_dump("ct").unwrap();
    assert!(
        ct.iter()
            .any(|e| e["endpoint_id"] == 100 && e["direction"] == "egress" && e["dport"] == 9000),
        "{ct:#?}"
    );
}

#[test]
fn icmp_and_neighbour_discovery_follow_policy() {
    let w = World::new();
    let dp = open_and_attach(&w);
    let allow_icmp = policy(
        true,
        false,
        "ingress 1000 icmp 0-65535 allow; ingress 1000 icmpv6 0-65535 allow",
    );
    dp.apply_policy(101, &allow_icmp, 1).unwrap();
    for ip in ips(&w, B) {
        assert!(ping_ok(&w.pods[A].ns, ip), "ping {ip} allowed");
    }
    // Flush the node's neighbours: IPv6 ping now needs NDP through the enforcing programs.
    support::sh(&["ip", "-n", &w.node, "neigh", "flush", "all"]);
    let mut rx = dp.subscribe_events();
    dp.apply_policy(101, &policy(true, false, ""), 1).unwrap();
    // ICMP ct entries are per echo id: a new ping process uses a new id.
    for ip in ips(&w, B) {
        assert!(!ping_ok(&w.pods[A].ns, ip), "ping {ip} must be dropped");
        let ev = wait_event(&mut rx, |e| e.dst_ip == ip);
        assert!(ev.proto == proto::ICMP || ev.proto == proto::ICMPV6);
        assert!(
            ev.dst_port == 8 || ev.dst_port == 128,
            "echo request type: {ev}"
        );
    }
    // Only echo requests (ICMP "port" = type) are allowed now: the node's neighbour solicitations
    // into the pod (ICMPv6 135) must pass anyway, and the echo replies pass as ct replies.
    support::sh(&["ip", "-n", &w.node, "neigh", "flush", "all"]);
    let echo_only = "ingress 1000 icmp 8 allow; ingress 1000 icmpv6 128 allow";
    dp.apply_policy(101, &policy(true, true, echo_only), 1)
        .unwrap();
    for ip in ips(&w, B) {
        assert!(
            ping_ok(&w.pods[A].ns, ip),
            "ping {ip} allowed again, NDP passes"
        );
    }
    let neigh = support::sh(&[
        "ip",
        "-n",
        &w.node,
        "-6",
        "neigh",
        "show",
        "dev",
        &w.pods[B].host_if,
    ]);
    assert!(
        neigh.contains(&w.pods[B].ip6.to_string()),
        "node resolved B over NDP: {neigh}"
    );
}

#[test]
fn peer_identities_come_from_the_ipcache_world_by_default() {
    let w = World::new();
    let dp = open_and_attach(&w);
    let from_host = "ingress 1 icmp 0-65535 allow";
    dp.apply_policy(101, &policy(true, false, from_host), 1)
        .unwrap();
    let mut rx = dp.subscribe_events();
    let b4: IpAddr = w.pods[B].ip4.into();
    // The node's 169.254.1.1 is not in the ipcache yet: it is "world".
    assert!(!ping_ok(&w.node, b4), "world is not allowed");
    let ev = wait_event(&mut rx, |e| e.dst_ip == b4);
    assert_eq!((ev.src_identity, ev.dst_identity), (2, 1001));
    dp.upsert_ipcache("169.254.1.1/32".parse().unwrap(), identity(1))
        .unwrap();
    assert!(ping_ok(&w.node, b4), "host identity is allowed");
    assert!(!ping_ok(&w.pods[A].ns, b4), "pod A (identity 1000) is not");
}

#[test]
fn enforcement_off_passes_everything() {
    let w = World::new();
    let dp = open_and_attach(&w);
    echo_servers(&w.pods[B].ns, 7000);
    let deny_all = "ingress 0 any * deny";
    dp.apply_policy(101, &policy(false, false, deny_all), 1)
        .unwrap();
    for ip in ips(&w, B) {
        assert!(tcp_ok(&w.pods[A].ns, ip, 7000));
        assert!(udp_ok(&w.pods[A].ns, ip, 7000, 43_000));
        assert!(ping_ok(&w.pods[A].ns, ip));
    }
    dp.apply_policy(101, &policy(true, false, deny_all), 1)
        .unwrap();
    for ip in ips(&w, B) {
        assert!(
            !tcp_ok(&w.pods[A].ns, ip, 7000),
            "enforced deny-all drops {ip}"
        );
    }
}

#[test]
fn deny_beats_allow_and_port_ranges_match_inside_only() {
    let w = World::new();
    let dp = open_and_attach(&w);
    for port in [8999, 9000, 9005, 9010, 9011, 9100, 9101] {
        echo_servers(&w.pods[B].ns, port);
    }
    let p = policy(
        true,
        false,
        "ingress 1000 tcp 9000-9010 allow; ingress 0 tcp 9100-9101 allow; ingress 1000 tcp 9101 deny; ingress 0 tcp 9005 deny",
    );
    dp.apply_policy(101, &p, 1).unwrap();
    let mut rx = dp.subscribe_events();
    for ip in ips(&w, B) {
        let a = &w.pods[A].ns;
        assert!(
            tcp_ok(a, ip, 9000) && tcp_ok(a, ip, 9010),
            "range ends pass for {ip}"
        );
        assert!(
            !tcp_ok(a, ip, 8999) && !tcp_ok(a, ip, 9011),
            "outside the range drops for {ip}"
        );
        assert!(
            !tcp_ok(a, ip, 9005),
            "any-identity deny inside the allowed range wins for {ip}"
        );
        assert!(tcp_ok(a, ip, 9100), "any-identity allow for {ip}");
        assert!(
            !tcp_ok(a, ip, 9101),
            "exact deny beats any-identity allow for {ip}"
        );
        let ev = wait_event(&mut rx, |e| e.dst_ip == ip && e.dst_port == 9101);
        assert_eq!(ev.reason, "policy-deny");
    }
}

#[test]
fn fragmented_datagrams_follow_the_first_fragment() {
    let w = World::new();
    let dp = open_and_attach(&w);
    echo_servers(&w.pods[B].ns, 5000);
    // B admits UDP 5000 from A; A admits nothing: the fragmented echo must pass as a reply.
    dp.apply_policy(101, &policy(true, false, "ingress 1000 udp 5000 allow"), 1)
        .unwrap();
    dp.apply_policy(100, &policy(true, false, ""), 1).unwrap();
    for (n, ip) in ips(&w, B).into_iter().enumerate() {
        let local = 44_000 + u16::try_from(n).unwrap();
        assert!(
            udp_big_ok(&w.pods[A].ns, ip, 5000, local, 4000),
            "4000-byte datagram to {ip} and back"
        );
        assert!(
            !udp_big_ok(&w.pods[A].ns, ip, 5001, local + 10, 4000),
            "port 5001 to {ip} denied"
        );
    }
    let frags = dp.map_dump("frags").unwrap();
    for ip in ips(&w, B) {
        let seen = frags
            .iter()
            .any(|f| f["dst"] == ip.to_string() && f["dport"] == 5000);
        assert!(seen, "first fragments to {ip} recorded: {frags:#?}");
    }
}

#[test]
fn icmp_errors_of_a_flow_pass_as_related() {
    let w = World::new();
    let dp = open_and_attach(&w);
    // A admits nothing: B's port-unreachable for A's datagram must pass as related to A's flow.
    dp.apply_policy(100, &policy(true, false, ""), 1).unwrap();
    for ip in ips(&w, B) {
        assert!(
            udp_refused(&w.pods[A].ns, ip, 5999),
            "port unreachable from {ip} reached A"
        );
    }
    let metrics = dp.map_dump("metrics").unwrap();
    let related = metrics
        .iter()
        .find(|m| m["endpoint_id"] == 100 && m["reason"] == "allow-related")
        .unwrap_or_else(|| panic!("no related packets counted: {metrics:#?}"));
    assert!(related["packets"].as_u64() >= Some(2), "{related}");
}

#[test]
fn pods_cannot_send_from_addresses_that_are_not_theirs() {
    let w = World::new();
    let dp = open_and_attach(&w);
    echo_servers(&w.pods[B].ns, 5000);
    let mut rx = dp.subscribe_events();
    let (a, b) = (&w.pods[A], &w.pods[B]);
    let mut spoofed: Vec<IpAddr> = Vec::new();
    for own in [IpAddr::from(a.ip4), IpAddr::from(a.ip6)] {
        let fake = match own {
            IpAddr::V4(v4) => IpAddr::from([v4.octets()[0], v4.octets()[1], v4.octets()[2], 99]),
            IpAddr::V6(v6) => IpAddr::from({
                let mut o = v6.octets();
                o[15] = 0x99;
                o
            }),
        };
        let prefix = format!("{fake}/{}", if fake.is_ipv4() { 32 } else { 128 });
        support::sh(&[
            "ip", "-n", &a.ns, "addr", "add", &prefix, "dev", "eth0", "nodad",
        ]);
        spoofed.push(fake);
    }
    // Not enforced anywhere, yet the forged sources are dropped and the real ones pass.
    for (fake, dst) in spoofed
        .iter()
        .zip([IpAddr::from(b.ip4), IpAddr::from(b.ip6)])
    {
        assert!(udp_ok(&a.ns, dst, 5000, 45_000), "own address to {dst}");
        let sock = in_ns(&a.ns, || {
            std::net::UdpSocket::bind((*fake, 0)).expect("bind forged")
        });
        sock.send_to(b"forged", (dst, 5000)).unwrap();
        let ev = support::checks::wait_event(&mut rx, |e| e.src_ip == *fake);
        assert_eq!(
            (ev.reason, ev.direction, ev.endpoint_id),
            ("invalid-source", "egress", 100)
        );
    }
}
