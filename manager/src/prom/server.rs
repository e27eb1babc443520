//! `--metrics-listen ADDR`: a TCP listener for Prometheus that serves `/metrics` and `/healthz`
//! and nothing else. The API (which can create endpoints and change policy) stays on the unix
//! socket, whose mode keeps it to root; this port is reachable by anyone who can reach the
//! node, so it only ever reads. Bounded like the socket: a fixed number of connections, each
//! request header within a deadline, over-limit connections closed at once.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;

use super::Source;

/// Connections served at once; a scraper needs one.
const MAX_CONNECTIONS: usize = 64;
/// Time to send a request header (and, kept alive, the next one).
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// A bad `--metrics-listen` or a failed bind.
#[derive(Debug, thiserror::Error)]
pub enum ListenAddrError {
    /// Not an address.
    #[error(
        "--metrics-listen {0:?} is not an address to listen on: use IP:PORT (127.0.0.1:9962, [::1]:9962, 0.0.0.0:9962) or :PORT for every IPv4 address"
    )]
    Invalid(String),
    /// The bind failed.
    #[error(
        "--metrics-listen {addr}: cannot listen: {source} (another process may hold the port: pick another, or leave --metrics-listen off)"
    )]
    Bind {
        /// Address.
        addr: SocketAddr,
        /// Cause.
        source: std::io::Error,
    },
}

/// Parses `--metrics-listen`: `IP:PORT`, `[IPv6]:PORT`, or `:PORT` (every IPv4 address, as
/// Cilium's `--prometheus-serve-addr=:9962`).
pub fn parse_listen(s: &str) -> Result<SocketAddr, ListenAddrError> {
    let bad = || ListenAddrError::Invalid(s.to_owned());
    if let Some(port) = s.strip_prefix(':') {
        let port: u16 = port.parse().map_err(|_| bad())?;
        return Ok(SocketAddr::from(([0, 0, 0, 0], port)));
    }
    s.parse().map_err(|_| bad())
}

/// Binds the listener (before start-up changes anything, so a taken port fails fast).
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, ListenAddrError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ListenAddrError::Bind { addr, source })
}

/// The routes of the metrics port: read-only.
pub fn router<S: Source>(manager: Arc<S>) -> Router {
    Router::new()
        .route("/metrics", get(super::handler::<S>))
        .route("/healthz", get(healthz::<S>))
        .fallback(|| async {
            (
                StatusCode::NOT_FOUND,
                "this port serves only /metrics and /healthz; the API is on the manager's unix socket\n",
            )
        })
        .with_state(manager)
}

async fn healthz<S: Source>(
    axum::extract::State(m): axum::extract::State<Arc<S>>,
) -> impl IntoResponse {
    if m.is_ready() {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting\n")
    }
}

/// Serves the metrics routes on `listener` until the task is dropped.
pub async fn serve_tcp<S: Source>(listener: TcpListener, manager: Arc<S>) {
    let app = router(manager);
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut refused: u64 = 0;
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::warn!("accepting a metrics connection: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            refused += 1;
            if refused.is_power_of_two() {
                tracing::warn!(
                    refused,
                    "metrics connection closed: {MAX_CONNECTIONS} already open"
                );
            }
            continue;
        };
        crate::http::listener::spawn_connection(stream, &app, slot, HEADER_TIMEOUT, "metrics");
    }
}
