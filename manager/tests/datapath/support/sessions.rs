//! TCP sessions from a fixed source port, ended the way a test asks (RST, FIN, or silently), and
//! a server that reports how each connection ended on its side: what went over the wire is
//! checked, not assumed. Used to reuse a closed connection's 5-tuple for a new connection.

use super::in_ns;
use nix::sys::socket::{
    AddressFamily, SockFlag, SockType, SockaddrStorage, bind, connect, setsockopt, socket, sockopt,
};
use nix::sys::time::TimeVal;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::Duration;

use super::traffic::WAIT;

/// How a session ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Close {
    /// The client aborts with `SO_LINGER {on, 0}`: one RST, no FIN; the server reads ECONNRESET.
    Rst,
    /// The server closes first (FIN), the client reads EOF and closes (FIN): the server's socket
    /// ends in `TIME_WAIT`, the client's is gone, so the client can bind the port again at once.
    Fin,
    /// Both ends drop the connection without a packet (`TCP_REPAIR` before close): what a crashed
    /// peer leaves behind — conntrack still holds an open entry.
    Silent,
}

impl Close {
    fn request(self) -> &'static [u8; 3] {
        match self {
            Close::Rst => b"rst",
            Close::Fin => b"fin",
            Close::Silent => b"sil",
        }
    }
}

/// What the server saw at the end of one connection, keyed by the client's source port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ended {
    pub peer_port: u16,
    pub how: Close,
}

/// Starts a TCP server on `port` (dual stack) in netns `ns`. Per connection it echoes a 3-byte
/// request and ends the way it names; each ending is reported on the returned channel.
pub fn closing_server(ns: &str, port: u16) -> Receiver<Ended> {
    let listener = in_ns(ns, || {
        TcpListener::bind(SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), port)).expect("bind tcp")
    });
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let tx = tx.clone();
            std::thread::spawn(move || serve(conn, &tx));
        }
    });
    rx
}

fn serve(mut conn: TcpStream, tx: &Sender<Ended>) {
    let peer_port = conn.peer_addr().map_or(0, |a| a.port());
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut req = [0u8; 3];
    if conn.read_exact(&mut req).is_err() || conn.write_all(&req).is_err() {
        return;
    }
    let mut rest = [0u8; 16];
    let how = match &req {
        b"fin" => {
            // Active close: our FIN first, then the client's FIN shows as EOF.
            let _ = conn.shutdown(std::net::Shutdown::Write);
            matches!(conn.read(&mut rest), Ok(0)).then_some(Close::Fin)
        }
        b"rst" => matches!(conn.read(&mut rest), Err(e) if e.kind() == ErrorKind::ConnectionReset)
            .then_some(Close::Rst),
        b"sil" => {
            // Nothing may be in flight when the sockets vanish, or the retransmission would
            // draw an RST: wait for the client's ACK of the echo. The client closes after our
            // report, and has nothing unacknowledged (the echo acknowledged its request).
            let acked = (0..250).any(|_| {
                std::thread::sleep(Duration::from_millis(20));
                unacked(&conn) == 0
            });
            repair(&conn);
            acked.then_some(Close::Silent)
        }
        _ => None,
    };
    if let Some(how) = how {
        let _ = tx.send(Ended { peer_port, how });
    }
}

/// `TCP_REPAIR`: the socket is then closed without a FIN or RST (needs `CAP_NET_ADMIN`).
fn repair(conn: &TcpStream) {
    setsockopt(conn, sockopt::TcpRepair, &1).expect("TCP_REPAIR");
}

/// Segments sent and not yet acknowledged (`TCP_INFO`'s `tcpi_unacked`).
fn unacked(conn: &TcpStream) -> u32 {
    // SAFETY: tcp_info is plain old data; all zeroes is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = libc::socklen_t::try_from(std::mem::size_of::<libc::tcp_info>()).unwrap();
    // SAFETY: the pointer and length describe `info`, which outlives the call.
    let rc = unsafe {
        libc::getsockopt(
            conn.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&raw mut info).cast(),
            &raw mut len,
        )
    };
    assert_eq!(rc, 0, "TCP_INFO: {}", std::io::Error::last_os_error());
    info.tcpi_unacked
}

/// A TCP connection from `src_port` of netns `ns` to `dst`, bound with `SO_REUSEADDR` like a
/// client reusing its port. `Err` when the connection was not made within [`WAIT`].
pub fn connect_from(ns: &str, src_port: u16, dst: SocketAddr) -> std::io::Result<TcpStream> {
    in_ns(ns, || {
        let (family, local) = match dst.ip() {
            IpAddr::V4(_) => (AddressFamily::Inet, IpAddr::from(Ipv4Addr::UNSPECIFIED)),
            IpAddr::V6(_) => (AddressFamily::Inet6, IpAddr::from(Ipv6Addr::UNSPECIFIED)),
        };
        let fd = socket(family, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)?;
        setsockopt(&fd, sockopt::ReuseAddr, &true)?;
        // Linux bounds a blocking connect() by the send timeout.
        let wait = TimeVal::new(
            i64::try_from(WAIT.as_secs()).unwrap(),
            i64::from(WAIT.subsec_micros()),
        );
        setsockopt(&fd, sockopt::SendTimeout, &wait)?;
        bind(
            fd.as_raw_fd(),
            &SockaddrStorage::from(SocketAddr::new(local, src_port)),
        )?;
        connect(fd.as_raw_fd(), &SockaddrStorage::from(dst))?;
        Ok(TcpStream::from(fd))
    })
}

/// One session: connect from `src_port`, echo, end it as `close` says, and make sure the
/// server saw it end that way (`ended`: the server's reports). `Err` names the step that failed
/// (the connect fails when the SYN is dropped).
pub fn session(
    ns: &str,
    src_port: u16,
    dst: SocketAddr,
    close: Close,
    ended: &Receiver<Ended>,
) -> Result<(), String> {
    let mut s = connect_from(ns, src_port, dst).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(WAIT)).unwrap();
    let req = close.request();
    let mut buf = [0u8; 3];
    s.write_all(req).map_err(|e| format!("write: {e}"))?;
    s.read_exact(&mut buf).map_err(|e| format!("read: {e}"))?;
    if &buf != req {
        return Err(format!("echo {buf:?}"));
    }
    match close {
        Close::Rst => setsockopt(
            &s,
            sockopt::Linger,
            &libc::linger {
                l_onoff: 1,
                l_linger: 0,
            },
        )
        .map_err(|e| format!("SO_LINGER: {e}"))?,
        Close::Fin => {
            let mut rest = [0u8; 1];
            match s.read(&mut rest) {
                Ok(0) => {}
                other => return Err(format!("expected the server's FIN, got {other:?}")),
            }
        }
        // The server goes first (it waits until nothing is in flight), then this end.
        Close::Silent => {}
    }
    let silent = if close == Close::Silent {
        Some(s)
    } else {
        drop(s);
        None
    };
    let saw = server_saw(ended, src_port);
    if let Some(s) = silent {
        repair(&s);
    }
    if saw == close {
        Ok(())
    } else {
        Err(format!("the server saw {saw:?}"))
    }
}

/// Waits until the server reports the end of the connection from `peer_port`.
fn server_saw(rx: &Receiver<Ended>, peer_port: u16) -> Close {
    loop {
        let ended = rx
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("the server never saw the end of :{peer_port}"));
        if ended.peer_port == peer_port {
            return ended.how;
        }
    }
}

/// No socket of netns `ns` holds local port `port` any more (the client's side of a closed
/// session is gone, so the port can be bound again). Polls up to 5 s.
pub fn wait_port_free(ns: &str, port: u16) {
    let port_hex = format!("{port:04X}");
    let holds = |line: &str| {
        // "sl local_address rem_address st ...": local_address is "HEXADDR:HEXPORT".
        line.split_whitespace()
            .nth(1)
            .and_then(|local| local.rsplit(':').next())
            == Some(port_hex.as_str())
    };
    for _ in 0..250 {
        let busy = in_ns(ns, || {
            ["tcp", "tcp6"].iter().any(|t| {
                std::fs::read_to_string(format!("/proc/thread-self/net/{t}"))
                    .expect("read /proc/thread-self/net")
                    .lines()
                    .skip(1)
                    .any(holds)
            })
        });
        if !busy {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("local port {port} still in use in {ns}");
}
