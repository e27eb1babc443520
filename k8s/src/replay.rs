//! Test support (feature `replay`): a local HTTP server that plays a Kubernetes API server from
//! recorded responses, so the real kube client and watchers run against it. Per resource path,
//! list responses are served in order (the last one again when they run out); watch responses
//! in order, each a list of events that ends by closing the connection (a dropped watch) or
//! by hanging (a healthy idle watch); with no watch response left, watches hang. GETs of single
//! objects come from a map; PATCH bodies are recorded. Every request is logged. Events can
//! also be pushed into the hanging watches of a path while the server runs ([`Replay::push`],
//! or `POST /replay/push?path=...` from a script, which answers how many watches took the event
//! and when, `pushed_unix_us`), and a whole script can come from JSON
//! ([`Replay::from_script`]: the `weft-k8s-replay` binary of the end-to-end test).

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::response::Response;
use futures::StreamExt;
use serde_json::{Value, json};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

/// How a recorded watch response ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchEnd {
    /// The server closes the stream after the events (a dropped watch).
    Close,
    /// The stream stays open after the events.
    Hang,
}

#[derive(Default)]
struct Resource {
    lists: VecDeque<Value>,
    last_list: Option<Value>,
    watches: VecDeque<(Vec<Value>, WatchEnd)>,
    live: Option<tokio::sync::broadcast::Sender<Value>>,
}

impl Resource {
    fn live(&mut self) -> &tokio::sync::broadcast::Sender<Value> {
        self.live
            .get_or_insert_with(|| tokio::sync::broadcast::channel(1024).0)
    }
}

/// A script that is not what [`Replay::from_script`] takes.
#[derive(Debug, thiserror::Error)]
#[error("replay script: {0}")]
pub struct ScriptError(String);

#[derive(Default)]
struct Inner {
    resources: HashMap<String, Resource>,
    objects: HashMap<String, Value>,
    log: Vec<String>,
    patches: Vec<(String, Value)>,
}

/// The script and what happened; cheap to clone.
#[derive(Clone, Default)]
pub struct Replay {
    inner: Arc<Mutex<Inner>>,
}

/// A `kind: List` response as the API server sends it.
#[must_use]
pub fn list(api_version: &str, kind: &str, resource_version: &str, items: Vec<Value>) -> Value {
    json!({
        "apiVersion": api_version,
        "kind": format!("{kind}List"),
        "metadata": {"resourceVersion": resource_version},
        "items": Value::Array(items),
    })
}

/// A watch event (`ADDED`, `MODIFIED`, `DELETED`).
#[must_use]
pub fn event(kind: &str, object: Value) -> Value {
    let mut map = serde_json::Map::new();
    map.insert("type".into(), kind.into());
    map.insert("object".into(), object);
    Value::Object(map)
}

/// A `BOOKMARK` event carrying only a resourceVersion.
#[must_use]
pub fn bookmark(api_version: &str, kind: &str, resource_version: &str) -> Value {
    json!({"type": "BOOKMARK", "object": {
        "apiVersion": api_version, "kind": kind,
        "metadata": {"resourceVersion": resource_version}
    }})
}

/// The `ERROR` event an API server sends when a watch's resourceVersion is too old.
#[must_use]
pub fn gone(resource_version: &str) -> Value {
    json!({"type": "ERROR", "object": {
        "apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
        "message": format!("too old resource version: {resource_version}"),
        "reason": "Expired", "code": 410
    }})
}

impl Replay {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Queues a list response for `path` (e.g. `/api/v1/pods`).
    #[must_use]
    pub fn list(self, path: &str, body: Value) -> Self {
        self.lock()
            .resources
            .entry(path.into())
            .or_default()
            .lists
            .push_back(body);
        self
    }

    /// Queues a watch response for `path`.
    #[must_use]
    pub fn watch(self, path: &str, events: Vec<Value>, end: WatchEnd) -> Self {
        self.lock()
            .resources
            .entry(path.into())
            .or_default()
            .watches
            .push_back((events, end));
        self
    }

    /// Serves `body` for GET (and as the answer to PATCH) of `path`.
    #[must_use]
    pub fn object(self, path: &str, body: Value) -> Self {
        self.lock().objects.insert(path.into(), body);
        self
    }

    /// A replay from JSON: `{"lists": {path: [body, ...]}, "watches": {path: [{"events":
    /// [...], "end": "close" | "hang"}, ...]}, "objects": {path: body}}`, every key optional.
    pub fn from_script(script: &Value) -> Result<Self, ScriptError> {
        let section = |name: &str| -> Result<Vec<(String, Value)>, ScriptError> {
            match script.get(name) {
                None => Ok(Vec::new()),
                Some(Value::Object(m)) => {
                    Ok(m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                }
                Some(_) => Err(ScriptError(format!(
                    "{name} must be an object keyed by path"
                ))),
            }
        };
        let mut r = Self::default();
        for (path, bodies) in section("lists")? {
            let Value::Array(bodies) = bodies else {
                return Err(ScriptError(format!(
                    "lists.{path} must be an array of bodies"
                )));
            };
            for b in bodies {
                r = r.list(&path, b);
            }
        }
        for (path, watches) in section("watches")? {
            let Value::Array(watches) = watches else {
                return Err(ScriptError(format!("watches.{path} must be an array")));
            };
            for w in watches {
                let events = match w.get("events") {
                    Some(Value::Array(e)) => e.clone(),
                    _ => {
                        return Err(ScriptError(format!(
                            "watches.{path}[]: events must be an array"
                        )));
                    }
                };
                let end = match w.get("end").and_then(Value::as_str) {
                    Some("close") => WatchEnd::Close,
                    Some("hang") | None => WatchEnd::Hang,
                    Some(other) => {
                        return Err(ScriptError(format!(
                            "watches.{path}[]: end {other:?} (expected close or hang)"
                        )));
                    }
                };
                r = r.watch(&path, events, end);
            }
        }
        for (path, body) in section("objects")? {
            r = r.object(&path, body);
        }
        Ok(r)
    }

    /// Sends `event` to every open (hanging) watch of `path`; returns how many got it.
    #[must_use]
    pub fn push(&self, path: &str, event: Value) -> usize {
        let mut g = self.lock();
        let tx = g.resources.entry(path.into()).or_default().live().clone();
        drop(g);
        tx.send(event).unwrap_or(0)
    }

    /// Every request so far: `METHOD path?query`.
    #[must_use]
    pub fn log(&self) -> Vec<String> {
        self.lock().log.clone()
    }

    /// PATCH bodies so far, with their paths.
    #[must_use]
    pub fn patches(&self) -> Vec<(String, Value)> {
        self.lock().patches.clone()
    }

    /// Starts serving on 127.0.0.1; returns the server's URL.
    pub async fn serve(&self) -> std::io::Result<String> {
        self.serve_on("127.0.0.1:0").await
    }

    /// Starts serving on `addr`; returns the server's URL.
    pub async fn serve_on(&self, addr: &str) -> std::io::Result<String> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let url = format!("http://{}", listener.local_addr()?);
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(self.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(url)
    }

    /// A kubeconfig for the server at `url`.
    #[must_use]
    pub fn kubeconfig(url: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: replay\n  cluster:\n    server: {url}\ncontexts:\n- name: replay\n  context:\n    cluster: replay\n    user: replay\ncurrent-context: replay\nusers:\n- name: replay\n  user:\n    token: replay-token\n"
        )
    }
}

fn json_response(status: StatusCode, v: &Value) -> Response {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::from(v.to_string()))
        .unwrap_or_default()
}

async fn handle(State(r): State<Replay>, req: Request) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    r.lock().log.push(format!("{method} {path}?{query}"));
    if method == Method::POST && path == "/replay/push" {
        let target = query
            .split('&')
            .find_map(|p| p.strip_prefix("path="))
            .unwrap_or_default()
            .to_owned();
        let bytes = axum::body::to_bytes(req.into_body(), 1 << 20)
            .await
            .unwrap_or_default();
        let Ok(event) = serde_json::from_slice::<Value>(&bytes) else {
            return json_response(
                StatusCode::BAD_REQUEST,
                &json!({"error": "body is not JSON"}),
            );
        };
        // The wall clock when the event enters the watches (a benchmark times from it what a
        // watcher does with the event, without its own curl's start-up).
        let pushed_unix_us = unix_micros();
        let n = r.push(&target, event);
        // No open watch to take it (the client is between watches): the caller retries.
        let status = if n == 0 {
            StatusCode::CONFLICT
        } else {
            StatusCode::OK
        };
        return json_response(
            status,
            &json!({"delivered": n, "pushed_unix_us": pushed_unix_us}),
        );
    }
    if method == Method::PATCH {
        let bytes = axum::body::to_bytes(req.into_body(), 1 << 20)
            .await
            .unwrap_or_default();
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let mut g = r.lock();
        g.patches.push((path.clone(), body));
        return match g.objects.get(&path) {
            Some(v) => json_response(StatusCode::OK, v),
            None => json_response(StatusCode::NOT_FOUND, &not_found(&path)),
        };
    }
    let watch = query
        .split('&')
        .any(|p| p == "watch=true" || p == "watch=1");
    let mut g = r.lock();
    if let Some(v) = g.objects.get(&path) {
        return json_response(StatusCode::OK, v);
    }
    let res = g.resources.entry(path.clone()).or_default();
    if !watch {
        let body = match res.lists.pop_front() {
            Some(b) => {
                res.last_list = Some(b.clone());
                b
            }
            None => match &res.last_list {
                Some(b) => b.clone(),
                None => return json_response(StatusCode::NOT_FOUND, &not_found(&path)),
            },
        };
        return json_response(StatusCode::OK, &body);
    }
    let (events, end) = res
        .watches
        .pop_front()
        .unwrap_or((Vec::new(), WatchEnd::Hang));
    let live = res.live().subscribe();
    drop(g);
    let lines = futures::stream::iter(
        events
            .into_iter()
            .map(|e| Ok::<_, std::convert::Infallible>(format!("{e}\n"))),
    );
    let pushed = futures::stream::unfold(live, |mut rx| async move {
        loop {
            match rx.recv().await {
                Ok(e) => return Some((Ok(format!("{e}\n")), rx)),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
            }
        }
    });
    let body = match end {
        WatchEnd::Close => Body::from_stream(lines),
        WatchEnd::Hang => Body::from_stream(lines.chain(pushed)),
    };
    Response::builder()
        .header("content-type", "application/json")
        .body(body)
        .unwrap_or_default()
}

/// Microseconds since the Unix epoch (0 for a clock before it).
fn unix_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

fn not_found(path: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
        "message": format!("{path} not found"), "reason": "NotFound", "code": 404})
}
