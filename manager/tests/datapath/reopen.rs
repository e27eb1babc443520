//! The conntrack reopen rule (docs/DATAPATH.md, "Conntrack and policy changes"): a TCP SYN
//! without ACK meets today's policy even when its 5-tuple has a ct entry — that of a connection
//! closed with an RST or with FINs, or an open one whose two ends vanished without a packet.
//! Flows that are established when the policy changes (TCP and UDP) keep passing.

use crate::support::World;
use crate::support::checks::{ips, open_and_attach, policy, wait_event};
use crate::support::sessions::{Close, closing_server, connect_from, session, wait_port_free};
use crate::support::traffic::{WAIT, echo_servers, tcp_ok, udp_ok};
use std::io::{Read, Write};
use std::net::SocketAddr;
use weft_manager::datapath::{BpfDatapath, Datapath};
use weft_policy::mapstate::proto;

const A: usize = 0;
const B: usize = 1;
/// B's endpoint id and A's identity (`support::World`).
const EP_B: u32 = 101;
/// The service the closed connections used; the policy below denies it.
const SERVICE: u16 = 81;
/// Still allowed from A after the policy change: the positive control.
const OTHER: u16 = 82;

/// B's ingress after the change: enforced, only TCP 82 from A allowed, so 81 is denied to
/// everyone (default deny, as with a Kubernetes deny-all plus an unrelated allow).
fn deny_service() -> weft_policy::mapstate::EndpointPolicy {
    policy(true, false, "ingress 1000 tcp 82 allow")
}

/// The state ("open", "closing", "closed") of B's ingress ct entry for A:`sport` → B:81.
fn ct_state(dp: &BpfDatapath, sport: u16) -> Vec<String> {
    dp.map_dump("ct")
        .unwrap()
        .iter()
        .filter(|e| {
            e["endpoint_id"] == EP_B
                && e["direction"] == "ingress"
                && e["sport"] == sport
                && e["dport"] == SERVICE
        })
        .map(|e| e["state"].as_str().unwrap().to_owned())
        .collect()
}

/// With no policy, A connects from a fixed port to B:81 and ends the connection as `close`
/// says; the same tuple is used again at once (the positive control: reuse works). Then B's
/// ingress denies 81. A new SYN from the same port must be dropped by policy — seen as a drop
/// event of exactly that tuple, not only as a failed connect — while A → B:82 still passes.
fn reused_tuple_meets_the_new_policy(close: Close, first_port: u16, ct_after_close: &str) {
    let w = World::new();
    let dp = open_and_attach(&w);
    let ended = closing_server(&w.pods[B].ns, SERVICE);
    echo_servers(&w.pods[B].ns, OTHER);
    let a = &w.pods[A].ns;
    let ports = [first_port, first_port + 1];
    let mut states = Vec::new();
    for (ip, port) in ips(&w, B).into_iter().zip(ports) {
        let dst = SocketAddr::new(ip, SERVICE);
        for round in ["first session", "reuse without policy"] {
            session(a, port, dst, close, &ended)
                .unwrap_or_else(|e| panic!("{round} :{port} → {dst} ({close:?}): {e}"));
            wait_port_free(a, port);
        }
        states.push((port, ct_state(&dp, port)));
    }

    let mut rx = dp.subscribe_events();
    dp.apply_policy(EP_B, &deny_service(), 2).unwrap();
    for (n, (ip, port)) in ips(&w, B).into_iter().zip(ports).enumerate() {
        let dst = SocketAddr::new(ip, SERVICE);
        assert!(
            tcp_ok(a, ip, OTHER),
            "A → {ip}:{OTHER} is allowed and must pass"
        );
        let fresh = first_port + 10 + u16::try_from(n).unwrap();
        let err = session(a, fresh, dst, close, &ended)
            .expect_err("a new connection from a fresh port must meet the new policy");
        assert!(err.starts_with("connect"), ":{fresh} → {dst}: {err}");
        let ev = wait_event(&mut rx, |e| e.src_port == fresh);
        assert_eq!(
            (ev.dst_ip, ev.dst_port, ev.reason),
            (ip, SERVICE, "policy-default")
        );

        let err = session(a, port, dst, close, &ended)
            .expect_err("a new SYN on a closed connection's tuple must meet the new policy");
        assert!(err.starts_with("connect"), ":{port} → {dst}: {err}");
        let ev = wait_event(&mut rx, |e| e.src_port == port);
        assert_eq!(
            (ev.endpoint_id, ev.direction, ev.reason, ev.proto),
            (EP_B, "ingress", "policy-default", proto::TCP),
            "{ev}"
        );
        assert_eq!((ev.dst_ip, ev.dst_port), (ip, SERVICE), "{ev}");
        wait_port_free(a, port);
    }
    // What conntrack recorded of the old connections (the denied SYNs left it alone).
    for (port, state) in states {
        assert_eq!(state, [ct_after_close], "B's ingress entry for :{port}");
        assert_eq!(
            ct_state(&dp, port),
            [ct_after_close],
            ":{port} after the drop"
        );
    }
}

#[test]
fn a_syn_reusing_the_tuple_of_a_connection_closed_by_rst_meets_the_new_policy() {
    reused_tuple_meets_the_new_policy(Close::Rst, 43_100, "closed");
}

#[test]
fn a_syn_reusing_the_tuple_of_a_connection_closed_by_fin_meets_the_new_policy() {
    reused_tuple_meets_the_new_policy(Close::Fin, 43_200, "closed");
}

/// Both ends forgot the connection without a FIN or RST (a crashed peer, a timeout): the ct
/// entry is still open. A SYN on it is a new connection all the same.
#[test]
fn a_syn_on_an_open_entry_whose_connection_vanished_meets_the_new_policy() {
    reused_tuple_meets_the_new_policy(Close::Silent, 43_300, "open");
}

/// Cilium's rule, kept: a policy change does not cut established flows. Their ct entries keep
/// passing them (TCP until 6 h idle or closed, UDP until 60 s idle); new flows meet the policy.
#[test]
fn flows_established_before_a_policy_change_keep_passing() {
    const PORT: u16 = 83;
    let w = World::new();
    let dp = open_and_attach(&w);
    echo_servers(&w.pods[B].ns, PORT);
    let a = &w.pods[A].ns;
    let mut conns = Vec::new();
    for (n, ip) in ips(&w, B).into_iter().enumerate() {
        let n = u16::try_from(n).unwrap();
        let mut c = connect_from(a, 43_400 + n, SocketAddr::new(ip, PORT)).expect("connect");
        c.set_read_timeout(Some(WAIT)).unwrap();
        assert!(echo(&mut c), "TCP to {ip} before the change");
        assert!(
            udp_ok(a, ip, PORT, 43_410 + n),
            "UDP to {ip} before the change"
        );
        conns.push((ip, n, c));
    }
    let mut rx = dp.subscribe_events();
    dp.apply_policy(EP_B, &policy(true, false, ""), 2).unwrap();
    for (ip, n, mut c) in conns {
        assert!(
            echo(&mut c),
            "the established TCP connection to {ip} keeps passing"
        );
        assert!(
            udp_ok(a, ip, PORT, 43_410 + n),
            "the UDP flow to {ip} keeps passing"
        );
        assert!(
            !tcp_ok(a, ip, PORT),
            "a new TCP connection to {ip} is dropped"
        );
        assert!(
            !udp_ok(a, ip, PORT, 43_420 + n),
            "a new UDP flow to {ip} is dropped"
        );
        let ev = wait_event(&mut rx, |e| e.src_port == 43_420 + n);
        assert_eq!((ev.dst_ip, ev.reason), (ip, "policy-default"));
    }
}

fn echo(c: &mut std::net::TcpStream) -> bool {
    let mut buf = [0u8; 4];
    c.write_all(b"ping").is_ok() && c.read_exact(&mut buf).is_ok() && &buf == b"ping"
}
