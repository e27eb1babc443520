//! Real traffic between the pods: TCP and UDP echo over sockets created inside the pod netns,
//! and `ping` via nsenter. Timeouts bound how long a dropped packet is waited for; nothing here
//! asserts a duration.

use super::in_ns;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::Command;
use std::time::Duration;

pub const WAIT: Duration = Duration::from_millis(1500);

/// Starts TCP and UDP echo servers on `port` (dual stack) in netns `ns`, for the test's life.
pub fn echo_servers(ns: &str, port: u16) {
    let (tcp, udp) = in_ns(ns, || {
        let any: SocketAddr = format!("[::]:{port}").parse().unwrap();
        (
            TcpListener::bind(any).expect("bind tcp"),
            UdpSocket::bind(any).expect("bind udp"),
        )
    });
    std::thread::spawn(move || {
        for conn in tcp.incoming() {
            let Ok(mut conn) = conn else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 64];
                while let Ok(n) = conn.read(&mut buf) {
                    if n == 0 || conn.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 65_536];
        while let Ok((n, peer)) = udp.recv_from(&mut buf) {
            let _ = udp.send_to(&buf[..n], peer);
        }
    });
}

/// TCP connect + echo round trip from netns `ns`: true when the reply came back.
pub fn tcp_ok(ns: &str, ip: IpAddr, port: u16) -> bool {
    let Ok(mut s) = in_ns(ns, || {
        TcpStream::connect_timeout(&SocketAddr::new(ip, port), WAIT)
    }) else {
        return false;
    };
    s.set_read_timeout(Some(WAIT)).unwrap();
    let mut buf = [0u8; 5];
    s.write_all(b"hello").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"hello"
}

/// UDP datagram + echo from netns `ns`, from a fixed local port: true when the echo came back.
pub fn udp_ok(ns: &str, ip: IpAddr, port: u16, local_port: u16) -> bool {
    udp_echo(ns, ip, port, local_port, b"ping")
}

/// Like [`udp_ok`] with a `size`-byte datagram (bigger than the MTU: sent as IP fragments).
pub fn udp_big_ok(ns: &str, ip: IpAddr, port: u16, local_port: u16, size: usize) -> bool {
    let payload: Vec<u8> = (0..size).map(|i| u8::try_from(i % 251).unwrap()).collect();
    udp_echo(ns, ip, port, local_port, &payload)
}

fn udp_echo(ns: &str, ip: IpAddr, port: u16, local_port: u16, payload: &[u8]) -> bool {
    let local: SocketAddr = match ip {
        IpAddr::V4(_) => format!("0.0.0.0:{local_port}"),
        IpAddr::V6(_) => format!("[::]:{local_port}"),
    }
    .parse()
    .unwrap();
    let s = in_ns(ns, || UdpSocket::bind(local).expect("bind udp client"));
    s.set_read_timeout(Some(WAIT)).unwrap();
    let mut buf = vec![0u8; 65_536];
    // Two tries: the very first datagram can be lost to neighbour resolution.
    for _ in 0..2 {
        s.send_to(payload, SocketAddr::new(ip, port)).unwrap();
        if let Ok((n, _)) = s.recv_from(&mut buf) {
            return &buf[..n] == payload;
        }
    }
    false
}

/// One echo request with `ping` from netns `ns`.
pub fn ping_ok(ns: &str, ip: IpAddr) -> bool {
    Command::new("nsenter")
        .arg(format!("--net=/run/netns/{ns}"))
        .args(["ping", "-c", "1", "-W", "1", "-q", &ip.to_string()])
        .output()
        .expect("run ping")
        .status
        .success()
}

/// A UDP datagram to a closed port from netns `ns`: true when the ICMP port-unreachable came
/// back (the connected socket then reports ECONNREFUSED), false when nothing came back.
pub fn udp_refused(ns: &str, ip: IpAddr, port: u16) -> bool {
    let any: SocketAddr = if ip.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }
        .parse()
        .unwrap();
    let s = in_ns(ns, || UdpSocket::bind(any).expect("bind udp client"));
    s.connect(SocketAddr::new(ip, port)).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    let mut buf = [0u8; 16];
    s.send(b"anyone?").unwrap();
    matches!(s.recv(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused)
}
