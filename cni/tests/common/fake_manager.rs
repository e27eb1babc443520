//! A fake weft-manager on a unix socket: the API of docs/API.md with an in-memory allocator over
//! `10.77.0.0/24` and `fd77::/64` (router `.1` / `::1`). It records every request for assertions.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use weft_api::{
    AllocateRequest, ApiError, ApiErrorKind, CidrSource, DeleteResponse, Endpoint, EndpointState,
    GcRequest, GcResponse, IpConfig, PoolStatus, RegisterRequest, StatusResponse,
};

pub const V4_POOL: &str = "10.77.0.0/24";
pub const V6_POOL: &str = "fd77::/64";
pub const ROUTER_V4: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
pub const ROUTER_V6: Ipv6Addr = Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 1);

/// The fake's state, shared with the test.
#[derive(Debug)]
pub struct State {
    pub endpoints: Vec<Endpoint>,
    /// Addresses the v4 pool may hand out (253 by default: .2 to .254).
    pub v4_capacity: u64,
    /// `GET /v1/healthz` answers 200 when true, 503 otherwise.
    pub healthy: bool,
    /// `POST /v1/endpoints/{id}/ready` answers 409 when true.
    pub reject_ready: bool,
    /// "METHOD path?query" of every request, in order.
    pub log: Vec<String>,
    /// The node netns, where DELETE removes the host veth as the real manager does.
    node: String,
    next_id: u32,
}

impl State {
    fn v4_used(&self) -> u64 {
        self.endpoints.len() as u64
    }

    fn free_host(&self) -> Option<u8> {
        (2..=254u8).find(|h| {
            !self
                .endpoints
                .iter()
                .any(|e| e.ips[0].address == IpAddr::V4(Ipv4Addr::new(10, 77, 0, *h)))
        })
    }

    fn route(&mut self, method: &Method, path: &str, query: &str, body: &[u8]) -> Reply {
        self.log.push(format!("{method} {path}?{query}"));
        match (method.clone(), path) {
            (Method::GET, "/v1/healthz") => {
                if self.healthy {
                    ok(&serde_json::json!({"ok": true}))
                } else {
                    err(
                        StatusCode::SERVICE_UNAVAILABLE,
                        ApiErrorKind::NotReady,
                        "starting",
                    )
                }
            }
            (Method::GET, "/v1/status") => ok(&self.status()),
            (Method::POST, "/v1/endpoints") => match serde_json::from_slice(body) {
                Ok(req) => self.allocate(req),
                Err(_) => err(StatusCode::BAD_REQUEST, ApiErrorKind::Invalid, "bad body"),
            },
            (Method::POST, p) if p.starts_with("/v1/endpoints/") && p.ends_with("/ready") => {
                let id = p["/v1/endpoints/".len()..p.len() - "/ready".len()]
                    .parse()
                    .unwrap_or(0);
                match serde_json::from_slice(body) {
                    Ok(req) => self.register(id, &req),
                    Err(_) => err(StatusCode::BAD_REQUEST, ApiErrorKind::Invalid, "bad body"),
                }
            }
            (Method::DELETE, "/v1/endpoints") => {
                let (c, i) = selector(query);
                // The real manager sets the link down before answering and deletes it after.
                let host = weft_api::naming::host_ifname(&c, &i);
                let _ = std::process::Command::new("ip")
                    .args(["-n", &self.node, "link", "del", &host])
                    .stderr(std::process::Stdio::null())
                    .status();
                let pos = self
                    .endpoints
                    .iter()
                    .position(|e| e.container_id == c && e.ifname == i);
                ok(&DeleteResponse {
                    deleted: pos.map(|p| self.endpoints.remove(p)),
                })
            }
            (Method::GET, "/v1/endpoints") => {
                let (c, i) = selector(query);
                let found: Vec<&Endpoint> = self
                    .endpoints
                    .iter()
                    .filter(|e| e.container_id == c && e.ifname == i)
                    .collect();
                ok(&found)
            }
            (Method::POST, "/v1/gc") => match serde_json::from_slice(body) {
                Ok(req) => self.gc(&req),
                Err(_) => err(StatusCode::BAD_REQUEST, ApiErrorKind::Invalid, "bad body"),
            },
            _ => err(
                StatusCode::NOT_FOUND,
                ApiErrorKind::NotFound,
                "no such route",
            ),
        }
    }

    fn status(&self) -> StatusResponse {
        let pool = |cidr: &str, router: IpAddr| PoolStatus {
            cidr: cidr.into(),
            source: CidrSource::Config,
            source_detail: None,
            router_ip: router,
            used: self.v4_used(),
            capacity: self.v4_capacity,
        };
        StatusResponse {
            node_name: "test".into(),
            ready: self.healthy,
            pools: vec![
                pool(V4_POOL, ROUTER_V4.into()),
                pool(V6_POOL, ROUTER_V6.into()),
            ],
            endpoints: self.endpoints.len() as u64,
            policy_revision: 1,
            version: "fake".into(),
            restore_ms: Vec::new(),
            regenerations: 0,
            programs: None,
            warnings: Vec::new(),
        }
    }

    fn allocate(&mut self, req: AllocateRequest) -> Reply {
        if let Some(e) = self
            .endpoints
            .iter()
            .find(|e| e.container_id == req.container_id && e.ifname == req.ifname)
        {
            return ok(e);
        }
        let host = match self.free_host() {
            Some(h) if self.v4_used() < self.v4_capacity => h,
            _ => {
                return err(
                    StatusCode::INSUFFICIENT_STORAGE,
                    ApiErrorKind::PoolExhausted,
                    &format!("pool {V4_POOL} is exhausted"),
                );
            }
        };
        self.next_id += 1;
        let ep = Endpoint {
            id: self.next_id,
            host_ifname: weft_api::naming::host_ifname(&req.container_id, &req.ifname),
            container_id: req.container_id,
            ifname: req.ifname,
            netns: req.netns,
            pod_namespace: req.pod_namespace,
            pod_name: req.pod_name,
            labels: req.labels,
            identity: 0,
            ips: vec![
                IpConfig {
                    address: Ipv4Addr::new(10, 77, 0, host).into(),
                    gateway: ROUTER_V4.into(),
                },
                IpConfig {
                    address: Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, u16::from(host)).into(),
                    gateway: ROUTER_V6.into(),
                },
            ],
            host_ifindex: None,
            host_mac: None,
            pod_mac: None,
            state: EndpointState::Allocated,
            policy_revision: 0,
            created_ms: 0,
        };
        self.endpoints.push(ep.clone());
        ok(&ep)
    }

    fn register(&mut self, id: u32, req: &RegisterRequest) -> Reply {
        let reject = self.reject_ready;
        let Some(ep) = self.endpoints.iter_mut().find(|e| e.id == id) else {
            return err(
                StatusCode::NOT_FOUND,
                ApiErrorKind::NotFound,
                "no such endpoint",
            );
        };
        if ep.container_id != req.container_id || reject {
            return err(
                StatusCode::CONFLICT,
                ApiErrorKind::Conflict,
                "other container",
            );
        }
        ep.host_ifindex = Some(req.host_ifindex);
        ep.host_mac = Some(req.host_mac);
        ep.pod_mac = Some(req.pod_mac);
        ep.state = EndpointState::Ready;
        ok(&*ep)
    }

    fn gc(&mut self, req: &GcRequest) -> Reply {
        let (keep, released): (Vec<Endpoint>, Vec<Endpoint>) = std::mem::take(&mut self.endpoints)
            .into_iter()
            .partition(|e| {
                req.valid_attachments
                    .iter()
                    .any(|a| a.container_id == e.container_id && a.ifname == e.ifname)
            });
        self.endpoints = keep;
        ok(&GcResponse { released })
    }
}

type Reply = (StatusCode, String);

fn selector(query: &str) -> (String, String) {
    let mut c = String::new();
    let mut i = String::new();
    for kv in query.split('&') {
        match kv.split_once('=') {
            Some(("container_id", v)) => c = decode(v),
            Some(("ifname", v)) => i = decode(v),
            _ => {}
        }
    }
    (c, i)
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).expect("percent escape"));
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).expect("utf8 query")
}

fn ok<T: Serialize + ?Sized>(v: &T) -> Reply {
    (StatusCode::OK, serde_json::to_string(v).expect("serialize"))
}

fn err(status: StatusCode, kind: ApiErrorKind, message: &str) -> Reply {
    let body = ApiError {
        kind,
        message: message.into(),
    };
    (status, serde_json::to_string(&body).expect("serialize"))
}

/// The running fake; stops and joins its thread on Drop.
pub struct FakeManager {
    pub socket: PathBuf,
    pub state: Arc<Mutex<State>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeManager {
    /// Listens on `socket` (the file must not exist); `node` is the node netns's name.
    pub fn start(socket: &Path, node: &str) -> Self {
        let state = Arc::new(Mutex::new(State {
            endpoints: Vec::new(),
            v4_capacity: 253,
            healthy: true,
            reject_ready: false,
            log: Vec::new(),
            node: node.to_owned(),
            next_id: 0,
        }));
        let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let path = socket.to_owned();
        let st = state.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .build()
                .expect("fake manager runtime");
            rt.block_on(async move {
                let listener =
                    tokio::net::UnixListener::bind(&path).expect("bind fake manager socket");
                ready_tx.send(()).expect("signal ready");
                loop {
                    tokio::select! {
                        _ = &mut stop_rx => break,
                        accepted = listener.accept() => {
                            let Ok((stream, _)) = accepted else { continue };
                            let st = st.clone();
                            tokio::spawn(async move {
                                let svc = service_fn(move |req| handle(st.clone(), req));
                                let _ = http1::Builder::new()
                                    .serve_connection(TokioIo::new(stream), svc)
                                    .await;
                            });
                        }
                    }
                }
            });
        });
        ready_rx.recv().expect("fake manager failed to start");
        Self {
            socket: socket.to_owned(),
            state,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    pub fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("fake manager state poisoned")
    }
}

async fn handle(
    state: Arc<Mutex<State>>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let method = req.method().clone();
    let uri = req.uri().clone();
    let body = req
        .into_body()
        .collect()
        .await
        .map(http_body_util::Collected::to_bytes)
        .unwrap_or_default();
    let (status, json) =
        state
            .lock()
            .expect("state")
            .route(&method, uri.path(), uri.query().unwrap_or(""), &body);
    Ok(Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(json)))
        .expect("response"))
}

impl Drop for FakeManager {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}
