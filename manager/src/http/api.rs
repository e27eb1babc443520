//! REST/JSON API under `/v1/` (documented in docs/API.md). Handlers only translate between
//! HTTP and [`Manager`] calls; errors become `ApiError` bodies with a status code here, once.

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use std::sync::Arc;
use weft_api::{
    AllocateRequest, ApiError, ApiErrorKind, GcRequest, ImportRequest, LabelsRequest,
    RegisterRequest, TraceRequest,
};

use crate::endpoint::EndpointError;
use crate::endpoint::ipam::IpamError;
use crate::service::{Manager, ManagerError};

type Shared = Arc<Manager>;

/// An error on its way to the client.
pub struct HttpError(StatusCode, ApiError);

impl HttpError {
    fn new(status: StatusCode, kind: ApiErrorKind, message: impl Into<String>) -> Self {
        Self(
            status,
            ApiError {
                kind,
                message: message.into(),
            },
        )
    }

    /// 400 `invalid`: the request itself is wrong; `message` says how to fix it.
    fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, ApiErrorKind::Invalid, message)
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        (self.0, axum::Json(self.1)).into_response()
    }
}

impl From<ManagerError> for HttpError {
    fn from(e: ManagerError) -> Self {
        let msg = e.to_string();
        match e {
            ManagerError::Endpoint(EndpointError::Ipam(IpamError::Exhausted { .. })) => Self::new(
                StatusCode::INSUFFICIENT_STORAGE,
                ApiErrorKind::PoolExhausted,
                msg,
            ),
            ManagerError::Endpoint(EndpointError::NotFound(_)) => {
                Self::new(StatusCode::NOT_FOUND, ApiErrorKind::NotFound, msg)
            }
            // Retryable: the CNI maps `busy` to "try again later" (code 11). The kvstore
            // being unreachable for a new identity is the same: retry once etcd is back.
            ManagerError::Endpoint(EndpointError::BeingDeleted(_))
            | ManagerError::KvstoreUnavailable { .. }
            | ManagerError::Policy(crate::policy_state::PolicyStateError::NeedsCluster(_)) => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, ApiErrorKind::Busy, msg)
            }
            ManagerError::Endpoint(
                EndpointError::WrongOwner { .. } | EndpointError::AlreadyReady { .. },
            ) => Self::new(StatusCode::CONFLICT, ApiErrorKind::Conflict, msg),
            ManagerError::Endpoint(EndpointError::Invalid(_) | EndpointError::Ipam(_))
            | ManagerError::Invalid(_)
            | ManagerError::ClusterIdentity(_) => Self::invalid(msg),
            ManagerError::NotReady => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, ApiErrorKind::NotReady, msg)
            }
            ManagerError::Endpoint(EndpointError::Store(_))
            | ManagerError::HostNet(_)
            | ManagerError::Datapath(_)
            | ManagerError::Policy(_) => Self::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                ApiErrorKind::Internal,
                msg,
            ),
        }
    }
}

type Reply = Result<Response, HttpError>;

#[expect(
    clippy::unnecessary_wraps,
    reason = "lets handlers end with `json(..)` like every other reply"
)]
fn json<T: serde::Serialize>(v: &T) -> Reply {
    Ok(axum::Json(v).into_response())
}

/// The request body as `T`; a body that does not decode is refused naming the field (`pod_mac:
/// "zz" is not a MAC address ...`).
fn body<T: DeserializeOwned>(bytes: &Bytes) -> Result<T, HttpError> {
    let bad = |e: &dyn std::fmt::Display| {
        HttpError::invalid(format!("request body is not valid JSON for this call: {e}"))
    };
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let v = serde_path_to_error::deserialize(&mut de).map_err(|e| bad(&e))?;
    de.end().map_err(|e| bad(&e))?;
    Ok(v)
}

/// The API's routes over `manager`.
pub fn router(manager: Shared) -> Router {
    Router::new()
        .route("/v1/healthz", get(healthz))
        .route("/v1/status", get(status))
        .route(
            "/v1/endpoints",
            get(list_endpoints).post(allocate).delete(delete_endpoint),
        )
        .route("/v1/endpoints/{id}", get(get_endpoint))
        .route("/v1/endpoints/{id}/ready", post(register))
        .route("/v1/endpoints/{id}/labels", post(set_labels))
        .route("/v1/gc", post(gc))
        .route("/v1/ipam", get(ipam))
        .route(
            "/v1/policies",
            get(list_policies)
                .post(import_policy)
                .put(import_policy_file)
                .delete(delete_policy),
        )
        .route("/v1/policy/trace", post(trace))
        .route("/v1/identities", get(identities))
        .route("/v1/nodes", get(nodes))
        .route("/v1/services", get(services))
        .route("/v1/kvstore", get(kvstore))
        .route("/v1/maps", get(maps))
        .route("/v1/maps/{name}", get(map_dump))
        .route("/v1/verify", get(verify))
        .route("/v1/monitor", get(monitor))
        .route("/metrics", get(crate::prom::handler::<Manager>))
        .fallback(|| async {
            HttpError::new(
                StatusCode::NOT_FOUND,
                ApiErrorKind::NotFound,
                "no such API path; see docs/API.md",
            )
        })
        .layer(axum::extract::DefaultBodyLimit::max(
            weft_api::MAX_REQUEST_BODY,
        ))
        .layer(axum::middleware::map_response(json_errors))
        .layer(axum::middleware::from_fn_with_state(
            manager.prom().clone(),
            crate::prom::track_api,
        ))
        .with_state(manager)
}

/// axum's own rejections (bad path or query, wrong method, body too large, not UTF-8) answer
/// plain text or nothing; every error of this API is a `{kind, message}` body.
async fn json_errors(resp: Response) -> Response {
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return resp;
    }
    let text = axum::body::to_bytes(resp.into_body(), 4096)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        .unwrap_or_default();
    let (kind, default) = match status {
        StatusCode::METHOD_NOT_ALLOWED => (
            ApiErrorKind::MethodNotAllowed,
            "this path does not take that method; see docs/API.md",
        ),
        StatusCode::PAYLOAD_TOO_LARGE => (ApiErrorKind::TooLarge, ""),
        StatusCode::NOT_FOUND => (ApiErrorKind::NotFound, "no such API path; see docs/API.md"),
        s if s.is_client_error() => (ApiErrorKind::Invalid, "the request is malformed"),
        _ => (ApiErrorKind::Internal, "internal error"),
    };
    let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
        format!(
            "the request body is larger than the {} bytes weft-manager accepts; split it",
            weft_api::MAX_REQUEST_BODY
        )
    } else if text.is_empty() {
        default.to_owned()
    } else {
        text
    };
    HttpError::new(status, kind, message).into_response()
}

async fn healthz(State(m): State<Shared>) -> Response {
    if m.is_ready() {
        (
            StatusCode::OK,
            axum::Json(serde_json::json!({"status": "ready"})),
        )
            .into_response()
    } else {
        HttpError::from(ManagerError::NotReady).into_response()
    }
}

async fn status(State(m): State<Shared>) -> Reply {
    json(&m.status())
}

#[derive(Deserialize)]
struct OwnerQuery {
    container_id: Option<String>,
    ifname: Option<String>,
}

async fn list_endpoints(State(m): State<Shared>, Query(q): Query<OwnerQuery>) -> Reply {
    match (q.container_id, q.ifname) {
        (Some(c), Some(i)) => {
            crate::service::validate::owner(&c, &i)?;
            json(&m.find(&c, &i).into_iter().collect::<Vec<_>>())
        }
        (None, None) => json(&m.endpoints()),
        _ => Err(HttpError::invalid(
            "give both container_id and ifname, or neither",
        )),
    }
}

async fn allocate(State(m): State<Shared>, bytes: Bytes) -> Reply {
    // Kubernetes mode serves before its initial lists are in (status tells why it waits); a
    // pod started then would miss its policy: the CNI answers "try again later".
    if !m.is_ready() {
        return Err(ManagerError::NotReady.into());
    }
    let req: AllocateRequest = body(&bytes)?;
    m.settle_host_link(&req.container_id, &req.ifname).await;
    json(&crate::daemon::k8s::allocate(&m, &req).await?)
}

async fn get_endpoint(State(m): State<Shared>, Path(id): Path<u32>) -> Reply {
    match m.endpoint(id) {
        Some(ep) => json(&ep),
        None => Err(ManagerError::Endpoint(EndpointError::NotFound(id)).into()),
    }
}

async fn register(State(m): State<Shared>, Path(id): Path<u32>, bytes: Bytes) -> Reply {
    let req: RegisterRequest = body(&bytes)?;
    json(&m.register(id, &req)?)
}

async fn delete_endpoint(State(m): State<Shared>, Query(q): Query<OwnerQuery>) -> Reply {
    let (Some(c), Some(i)) = (q.container_id, q.ifname) else {
        return Err(HttpError::invalid(
            "DELETE /v1/endpoints needs container_id and ifname query parameters",
        ));
    };
    json(&m.delete(&c, &i).await?)
}

async fn gc(State(m): State<Shared>, bytes: Bytes) -> Reply {
    let req: GcRequest = body(&bytes)?;
    json(
        &m.gc(&req.valid_attachments, crate::sys::clock::now_ms())
            .await?,
    )
}

async fn ipam(State(m): State<Shared>) -> Reply {
    json(&m.allocations())
}

async fn import_policy(State(m): State<Shared>, bytes: Bytes) -> Reply {
    let req: ImportRequest = body(&bytes)?;
    json(&m.import_policy(&req.file, &req.content)?)
}

#[derive(Deserialize)]
struct ImportFileQuery {
    file: Option<String>,
}

/// `PUT /v1/policies?file=NAME`: the file's bytes are the body, as Cilium's `PUT /policy`
/// takes them (`weft_api::policy::import_file_path`).
async fn import_policy_file(
    State(m): State<Shared>,
    query: Result<Query<ImportFileQuery>, QueryRejection>,
    bytes: Bytes,
) -> Reply {
    let Query(q) = query.map_err(|e| {
        HttpError::invalid(format!(
            "the query does not decode ({e}): give the file's name as ?file=NAME, percent-encoded"
        ))
    })?;
    let file = q.file.filter(|f| !f.is_empty()).ok_or_else(|| {
        HttpError::invalid(
            "no file name: give it as ?file=NAME (percent-encoded); it names the file in errors",
        )
    })?;
    let text = std::str::from_utf8(&bytes).map_err(|e| {
        HttpError::invalid(format!(
            "{file}: not UTF-8 text ({e}): a policy file is JSON or YAML; convert it to UTF-8"
        ))
    })?;
    json(&m.import_policy(&file, text)?)
}

async fn list_policies(State(m): State<Shared>) -> Reply {
    json(&m.policies())
}

#[derive(Deserialize)]
struct DeletePolicyQuery {
    /// Comma-separated `k=v` labels.
    labels: Option<String>,
    #[serde(default)]
    all: bool,
}

async fn delete_policy(State(m): State<Shared>, Query(q): Query<DeletePolicyQuery>) -> Reply {
    let filter: Vec<String> = q
        .labels
        .unwrap_or_default()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    json(&m.delete_policy(&filter, q.all)?)
}

async fn trace(State(m): State<Shared>, bytes: Bytes) -> Reply {
    let req: TraceRequest = body(&bytes)?;
    json(&m.trace(&req)?)
}

async fn identities(State(m): State<Shared>) -> Reply {
    json(&m.identities())
}

async fn nodes(State(m): State<Shared>) -> Reply {
    json(&m.nodes())
}

async fn services(State(m): State<Shared>) -> Reply {
    json(&m.lb().list())
}

async fn kvstore(State(m): State<Shared>) -> Reply {
    json(&m.kvstore_status())
}

async fn set_labels(State(m): State<Shared>, Path(id): Path<u32>, bytes: Bytes) -> Reply {
    let req: LabelsRequest = body(&bytes)?;
    json(&m.set_labels(id, &req.add, &req.remove)?)
}

async fn maps(State(m): State<Shared>) -> Reply {
    json(&m.datapath().map_list())
}

async fn map_dump(State(m): State<Shared>, Path(name): Path<String>) -> Reply {
    m.datapath()
        .map_dump(&name)
        .map_err(|e| HttpError::new(StatusCode::NOT_FOUND, ApiErrorKind::NotFound, e.to_string()))
        .and_then(|v| json(&v))
}

async fn verify(State(m): State<Shared>) -> Reply {
    json(&m.verify()?)
}

/// Streams drop events as JSON lines until the client goes away.
async fn monitor(State(m): State<Shared>) -> Response {
    let rx = m.datapath().subscribe_events();
    let stream = futures::stream::unfold((rx, m), |(mut rx, m)| async move {
        loop {
            match rx.recv().await {
                Ok(mut ev) => {
                    m.name_tier_drop(&mut ev);
                    let Ok(mut line) = serde_json::to_vec(&ev) else {
                        tracing::warn!("a drop event could not be encoded; skipped");
                        continue;
                    };
                    line.push(b'\n');
                    return Some((
                        Ok::<_, std::convert::Infallible>(Bytes::from(line)),
                        (rx, m),
                    ));
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(missed = n, "monitor client too slow; events skipped");
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
            }
        }
    });
    (
        [(axum::http::header::CONTENT_TYPE, "application/x-ndjson")],
        axum::body::Body::from_stream(stream),
    )
        .into_response()
}

#[cfg(test)]
mod tests;
