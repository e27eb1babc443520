//! Minimal HTTP/1.1 client for the manager's unix socket.
//!
//! Used by the CNI plugin and weftctl. It runs on whatever tokio runtime the caller built; the
//! CNI builds a `current_thread` one just for its few calls. One keep-alive connection serves a
//! client's successive calls (the CNI's ADD makes two): a second connect costs a manager accept,
//! admission and a new connection task on the ADD's critical path.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use tokio::net::UnixStream;

use crate::{ApiError, ApiErrorKind};

/// Why a call to the manager failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The socket could not be reached (missing, refused, permission).
    #[error("cannot reach weft-manager at {path}: {source} (is weft-manager running?)")]
    Unreachable {
        /// Socket path.
        path: PathBuf,
        /// Underlying error.
        source: std::io::Error,
    },
    /// The connection broke mid-request.
    #[error("talking to weft-manager at {path}: {source}")]
    Transport {
        /// Socket path.
        path: PathBuf,
        /// What happened.
        source: hyper::Error,
    },
    /// The manager answered with an error status.
    #[error("{}", .body.message)]
    Api {
        /// HTTP status.
        status: u16,
        /// The error body.
        body: ApiError,
    },
    /// The request could not be built (e.g. a path too long for a URI); nothing was sent.
    #[error("cannot build a request for {path:?}: {source}")]
    BadRequest {
        /// The path (first 80 characters).
        path: String,
        /// Why.
        source: hyper::http::Error,
    },
    /// The request body could not be encoded as JSON; nothing was sent.
    #[error("cannot encode the request as JSON: {0}")]
    Encode(#[source] serde_json::Error),
    /// The request body is larger than the manager accepts; nothing was sent.
    #[error(
        "the request is {size} bytes; weft-manager accepts at most {limit} bytes per request: split it (e.g. import the policy file in parts)"
    )]
    TooLarge {
        /// Body size.
        size: usize,
        /// [`crate::MAX_REQUEST_BODY`].
        limit: usize,
    },
    /// The manager's answer could not be decoded.
    #[error("unexpected answer from weft-manager ({status}): {source}")]
    Decode {
        /// HTTP status.
        status: u16,
        /// What failed to parse.
        source: serde_json::Error,
    },
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// A client bound to one socket path. It keeps the connection of its last call open for the
/// next one; a clone starts without one.
#[derive(Debug)]
pub struct Client {
    socket: PathBuf,
    idle: Mutex<Option<Sender>>,
}

impl Clone for Client {
    fn clone(&self) -> Self {
        Self::new(self.socket.clone())
    }
}

impl Client {
    /// Client for the socket at `socket`.
    #[must_use]
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        Self {
            socket: socket.into(),
            idle: Mutex::new(None),
        }
    }

    /// The socket path.
    #[must_use]
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// `GET path` → JSON.
    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.call(Method::GET, path, None::<&()>).await
    }

    /// `POST path` with a JSON body → JSON.
    pub async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ClientError> {
        self.call(Method::POST, path, Some(body)).await
    }

    /// `PUT path` with `body` sent as it is (`application/octet-stream`: a file's bytes, not
    /// wrapped in JSON) → JSON.
    pub async fn put_bytes<T: DeserializeOwned>(
        &self,
        path: &str,
        body: Vec<u8>,
    ) -> Result<T, ClientError> {
        self.call_raw(Method::PUT, path, Payload::Bytes(Bytes::from(body)))
            .await
    }

    /// `DELETE path` → JSON.
    pub async fn delete<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.call(Method::DELETE, path, None::<&()>).await
    }

    /// Raw status + body of `GET path` (for `healthz`, whose body is not the point).
    pub async fn get_status(&self, path: &str) -> Result<(u16, Bytes), ClientError> {
        self.raw(Method::GET, path, Payload::None).await
    }

    /// Streams the body of `GET path`, calling `on_chunk` for every chunk until the server ends it
    /// or `on_chunk` returns false (used by `weftctl monitor`).
    pub async fn stream(
        &self,
        path: &str,
        mut on_chunk: impl FnMut(&[u8]) -> bool,
    ) -> Result<(), ClientError> {
        let req = build_request(Method::GET, path, Payload::None)?;
        let mut sender = self.connect().await?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| self.transport(e))?;
        let status = resp.status();
        let mut body = resp.into_body();
        if !status.is_success() {
            let bytes = body
                .collect()
                .await
                .map_err(|e| self.transport(e))?
                .to_bytes();
            return Err(api_error(status, &bytes));
        }
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| self.transport(e))?;
            if let Some(data) = frame.data_ref()
                && !on_chunk(data)
            {
                break;
            }
        }
        Ok(())
    }

    async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<T, ClientError> {
        let payload = match body {
            Some(b) => Payload::Json(Bytes::from(
                serde_json::to_vec(b).map_err(ClientError::Encode)?,
            )),
            None => Payload::None,
        };
        self.call_raw(method, path, payload).await
    }

    async fn call_raw<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        payload: Payload,
    ) -> Result<T, ClientError> {
        let (status, bytes) = self.raw(method, path, payload).await?;
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if !status.is_success() {
            return Err(api_error(status, &bytes));
        }
        serde_json::from_slice(&bytes).map_err(|source| ClientError::Decode {
            status: status.as_u16(),
            source,
        })
    }

    async fn raw(
        &self,
        method: Method,
        path: &str,
        payload: Payload,
    ) -> Result<(u16, Bytes), ClientError> {
        let mut req = build_request(method, path, payload)?;
        if let Some(mut sender) = self.take_idle().await {
            match sender.try_send_request(req).await {
                Ok(resp) => return self.finish(sender, resp).await,
                // The manager closed the idle connection (its header timeout, a restart) before
                // the request went out: nothing was sent, so it is safe to send it again on a
                // fresh connection. Once sent, an error is reported, never retried.
                Err(mut e) => match e.take_message() {
                    Some(unsent) => req = unsent,
                    None => return Err(self.transport(e.into_error())),
                },
            }
        }
        let mut sender = self.connect().await?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| self.transport(e))?;
        self.finish(sender, resp).await
    }

    /// Reads the whole response, then keeps the connection for the next call.
    async fn finish(
        &self,
        sender: Sender,
        resp: hyper::Response<hyper::body::Incoming>,
    ) -> Result<(u16, Bytes), ClientError> {
        let status = resp.status().as_u16();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| self.transport(e))?
            .to_bytes();
        *self.idle.lock().unwrap_or_else(PoisonError::into_inner) = Some(sender);
        Ok((status, bytes))
    }

    /// The kept connection, if it is still open and ready for a request.
    async fn take_idle(&self) -> Option<Sender> {
        let mut sender = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()?;
        if sender.is_closed() {
            return None;
        }
        sender.ready().await.ok()?;
        Some(sender)
    }

    async fn connect(&self) -> Result<Sender, ClientError> {
        let stream =
            UnixStream::connect(&self.socket)
                .await
                .map_err(|source| ClientError::Unreachable {
                    path: self.socket.clone(),
                    source,
                })?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| self.transport(e))?;
        tokio::spawn(async move {
            // The connection ends when the client (or its kept sender) is dropped; its error is
            // reported by the request.
            let _ = conn.await;
        });
        Ok(sender)
    }

    fn transport(&self, source: hyper::Error) -> ClientError {
        ClientError::Transport {
            path: self.socket.clone(),
            source,
        }
    }
}

/// A request's body and what it is.
enum Payload {
    None,
    Json(Bytes),
    /// Bytes sent as they are.
    Bytes(Bytes),
}

/// A request for `path`; a path no URI can hold (too long, bad characters) is the caller's
/// input error, reported rather than a panic.
fn build_request(
    method: Method,
    path: &str,
    payload: Payload,
) -> Result<Request<Full<Bytes>>, ClientError> {
    let (content_type, payload) = match payload {
        Payload::None => (None, Bytes::new()),
        Payload::Json(b) => (Some("application/json"), b),
        Payload::Bytes(b) => (Some("application/octet-stream"), b),
    };
    if payload.len() > crate::MAX_REQUEST_BODY {
        return Err(ClientError::TooLarge {
            size: payload.len(),
            limit: crate::MAX_REQUEST_BODY,
        });
    }
    let mut builder = Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, "weft");
    if let Some(t) = content_type {
        builder = builder.header(hyper::header::CONTENT_TYPE, t);
    }
    builder
        .body(Full::new(payload))
        .map_err(|source| ClientError::BadRequest {
            path: path.chars().take(80).collect(),
            source,
        })
}

fn api_error(status: StatusCode, bytes: &[u8]) -> ClientError {
    match serde_json::from_slice::<ApiError>(bytes) {
        Ok(body) => ClientError::Api {
            status: status.as_u16(),
            body,
        },
        Err(_) => ClientError::Api {
            status: status.as_u16(),
            body: ApiError {
                kind: ApiErrorKind::Http,
                message: format!(
                    "weft-manager answered {status}: {}",
                    String::from_utf8_lossy(bytes)
                ),
            },
        },
    }
}
