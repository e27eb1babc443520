//! The API socket's accept loop, bounded so that no client can starve the others.
//!
//! A client that opens connections and never finishes a request header would otherwise hold a
//! task and its buffers each, until the API stalls and memory grows without limit. So: every
//! request header must arrive within [`Limits::header_timeout`] (idle keep-alive connections
//! included), one process (by `SO_PEERCRED` pid) holds at most [`Limits::per_process`]
//! connections, all non-root processes together at most [`Limits::non_root`], and everyone at
//! most [`Limits::total`]. The CNI plugin is a fresh root process per call: a flood from one
//! process, or from unprivileged users, leaves it slots. Connections over a limit are closed
//! at once, so the listen backlog never fills.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{UnixListener, UnixStream};

/// Connection limits of the API socket.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// All connections.
    pub total: usize,
    /// Connections from all processes not running as root.
    pub non_root: usize,
    /// Connections from one process.
    pub per_process: usize,
    /// Time to send a request's header, and to start the next one on a kept-alive connection.
    pub header_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            total: 1024,
            non_root: 256,
            per_process: 64,
            header_timeout: Duration::from_secs(10),
        }
    }
}

#[derive(Default)]
struct Counts {
    total: usize,
    non_root: usize,
    by_pid: HashMap<i32, usize>,
}

/// Who holds a slot; releasing it on drop keeps the counts right whatever ends the connection.
struct Slot {
    counts: Arc<Mutex<Counts>>,
    pid: Option<i32>,
    root: bool,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        c.total -= 1;
        if !self.root {
            c.non_root -= 1;
        }
        if let Some(pid) = self.pid
            && let Some(n) = c.by_pid.get_mut(&pid)
        {
            *n -= 1;
            if *n == 0 {
                c.by_pid.remove(&pid);
            }
        }
    }
}

/// A slot for the peer of `stream`, or why it is refused.
fn admit(
    counts: &Arc<Mutex<Counts>>,
    limits: &Limits,
    stream: &UnixStream,
) -> Result<Slot, &'static str> {
    let cred = stream.peer_cred().ok();
    let pid = cred.as_ref().and_then(tokio::net::unix::UCred::pid);
    // Unknown credentials count as non-root: they get the smaller share.
    let root = cred.is_some_and(|c| c.uid() == 0);
    admit_peer(counts, limits, pid, root)
}

fn admit_peer(
    counts: &Arc<Mutex<Counts>>,
    limits: &Limits,
    pid: Option<i32>,
    root: bool,
) -> Result<Slot, &'static str> {
    let mut c = counts.lock().unwrap_or_else(PoisonError::into_inner);
    if c.total >= limits.total {
        return Err("too many connections");
    }
    if !root && c.non_root >= limits.non_root {
        return Err("too many connections from non-root processes");
    }
    if let Some(pid) = pid
        && c.by_pid.get(&pid).copied().unwrap_or(0) >= limits.per_process
    {
        return Err("too many connections from one process");
    }
    c.total += 1;
    if !root {
        c.non_root += 1;
    }
    if let Some(pid) = pid {
        *c.by_pid.entry(pid).or_insert(0) += 1;
    }
    Ok(Slot {
        counts: counts.clone(),
        pid,
        root,
    })
}

/// Serves one admitted connection on its own task; `slot` is held until the connection ends,
/// so the caller's limit counts it. The header timeout bounds a client that never finishes.
pub(crate) fn spawn_connection<S, T>(
    stream: S,
    app: &axum::Router,
    slot: T,
    header_timeout: Duration,
    what: &'static str,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    T: Send + 'static,
{
    let service = TowerToHyperService::new(app.clone());
    tokio::spawn(async move {
        let _slot = slot;
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(header_timeout)
            .serve_connection(TokioIo::new(stream), service);
        if let Err(e) = conn.await {
            tracing::debug!("{what} connection ended: {e}");
        }
    });
}

/// Serves `app` on `listener` until `shutdown` resolves; then waits up to 5 s for requests in
/// flight.
pub async fn serve(
    listener: UnixListener,
    app: axum::Router,
    limits: Limits,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let counts = Arc::new(Mutex::new(Counts::default()));
    let mut shutdown = std::pin::pin!(shutdown);
    let mut refused: u64 = 0;
    loop {
        let stream = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!("accepting an API connection: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let slot = match admit(&counts, &limits, &stream) {
            Ok(slot) => slot,
            Err(why) => {
                refused += 1;
                if refused.is_power_of_two() {
                    tracing::warn!(refused, "API connection closed: {why}");
                }
                continue;
            }
        };
        spawn_connection(stream, &app, slot, limits.header_timeout, "API");
    }
    for _ in 0..50 {
        if counts.lock().unwrap_or_else(PoisonError::into_inner).total == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn server(limits: Limits) -> (tempfile::TempDir, std::path::PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("api.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let app = axum::Router::new().route("/ok", axum::routing::get(|| async { "ok" }));
        tokio::spawn(serve(listener, app, limits, std::future::pending()));
        (d, path)
    }

    /// Reads until the server closes; false if it has not within `secs`.
    async fn closed_within(s: &mut UnixStream, secs: u64) -> bool {
        let mut buf = [0u8; 256];
        let read = async {
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(secs), read)
            .await
            .is_ok()
    }

    async fn get_ok(path: &std::path::Path) -> bool {
        let client = weft_api::client::Client::new(path);
        matches!(client.get_status("/ok").await, Ok((200, _)))
    }

    #[test]
    fn one_process_or_unprivileged_users_cannot_take_every_slot() {
        let limits = Limits {
            total: 10,
            non_root: 4,
            per_process: 3,
            header_timeout: Duration::from_secs(1),
        };
        let counts = Arc::new(Mutex::new(Counts::default()));
        let a: Vec<_> = (0..3)
            .map(|_| admit_peer(&counts, &limits, Some(100), true).unwrap())
            .collect();
        assert_eq!(
            admit_peer(&counts, &limits, Some(100), true).err(),
            Some("too many connections from one process")
        );
        // A CNI call is another root process: admitted.
        let cni = admit_peer(&counts, &limits, Some(101), true).unwrap();
        let users: Vec<_> = (0..4)
            .map(|i| admit_peer(&counts, &limits, Some(200 + i), false).unwrap())
            .collect();
        assert_eq!(
            admit_peer(&counts, &limits, Some(300), false).err(),
            Some("too many connections from non-root processes")
        );
        let more_root: Vec<_> = (0..2)
            .map(|i| admit_peer(&counts, &limits, Some(400 + i), true).unwrap())
            .collect();
        assert_eq!(
            admit_peer(&counts, &limits, Some(500), true).err(),
            Some("too many connections")
        );
        drop((a, cni, users, more_root));
        let c = counts.lock().unwrap();
        assert_eq!((c.total, c.non_root, c.by_pid.len()), (0, 0, 0));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn half_sent_headers_and_idle_connections_are_dropped() {
        let limits = Limits {
            total: 1000,
            non_root: 1000,
            per_process: 8,
            header_timeout: Duration::from_millis(300),
        };
        let (_d, path) = server(limits);
        // This process floods with partial headers and idle connections: 8 are kept a while,
        // the rest closed at once.
        let mut held = Vec::new();
        for i in 0..40 {
            let mut s = UnixStream::connect(&path).await.unwrap();
            if i % 2 == 0 {
                // A refused connection may already be closed: EPIPE is fine.
                let _ = s.write_all(b"GET /ok HTTP/1.1\r\nHost: x\r\n").await;
            }
            held.push(s);
        }
        for s in &mut held {
            assert!(
                closed_within(s, 30).await,
                "a stalled connection stayed open"
            );
        }
        // Every slot came back: this process is served again.
        let mut ok = false;
        for _ in 0..50 {
            if get_ok(&path).await {
                ok = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(ok, "slots were not released");
    }
}
