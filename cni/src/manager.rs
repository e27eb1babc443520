//! The manager calls the plugin makes, over `weft_api::client`.

use crate::error::CniError;
use std::fmt::Write;
use weft_api::client::Client;
use weft_api::delete_queue::{DeleteQueue, DeleteRequest};
use weft_api::{
    AllocateRequest, DeleteResponse, Endpoint, GcRequest, GcResponse, RegisterRequest,
    StatusResponse,
};

/// Percent-encodes a query value. Interface names may hold `&`, `#`, `%` or `?`.
#[must_use]
pub fn encode_query(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

fn selector(container_id: &str, ifname: &str) -> String {
    format!(
        "/v1/endpoints?container_id={}&ifname={}",
        encode_query(container_id),
        encode_query(ifname)
    )
}

/// `POST /v1/endpoints`.
pub async fn allocate(c: &Client, req: &AllocateRequest) -> Result<Endpoint, CniError> {
    Ok(c.post("/v1/endpoints", req).await?)
}

/// `POST /v1/endpoints/{id}/ready`: returns once the datapath enforces for the endpoint.
pub async fn ready(c: &Client, id: u32, req: &RegisterRequest) -> Result<Endpoint, CniError> {
    Ok(c.post(&format!("/v1/endpoints/{id}/ready"), req).await?)
}

/// `DELETE /v1/endpoints?container_id=..&ifname=..`.
pub async fn delete(
    c: &Client,
    container_id: &str,
    ifname: &str,
) -> Result<DeleteResponse, CniError> {
    Ok(c.delete(&selector(container_id, ifname)).await?)
}

/// What became of a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// The manager released the endpoint (its id, if there was one) and deletes the host veth.
    ByManager(Option<u32>),
    /// The manager was unreachable: the request waits in the delete queue.
    Queued,
}

/// Releases the endpoint, or, when the manager cannot be reached, leaves the request in the
/// durable delete queue next to its socket for the manager to complete at start (Cilium's
/// deletion queue). Fails ("try again later") only when the queue is full or unwritable.
pub async fn release_or_queue(
    c: &Client,
    container_id: &str,
    ifname: &str,
) -> Result<Released, CniError> {
    match delete(c, container_id, ifname).await {
        Ok(resp) => Ok(Released::ByManager(resp.deleted.map(|e| e.id))),
        Err(CniError::TryAgainLater { msg, .. }) => {
            let queue = DeleteQueue::for_socket(c.socket());
            queue
                .push(&DeleteRequest {
                    container_id: container_id.to_owned(),
                    ifname: ifname.to_owned(),
                })
                .map_err(|e| CniError::TryAgainLater {
                    msg: format!("{msg}; and the delete queue cannot take the request: {e}"),
                    details: String::new(),
                })?;
            tracing::warn!(queue = %queue.dir().display(), "manager unreachable; DEL queued for its next start");
            Ok(Released::Queued)
        }
        Err(e) => Err(e),
    }
}

/// `GET /v1/endpoints?container_id=..&ifname=..` (0 or 1 endpoint).
pub async fn find(c: &Client, container_id: &str, ifname: &str) -> Result<Vec<Endpoint>, CniError> {
    Ok(c.get(&selector(container_id, ifname)).await?)
}

/// `GET /v1/healthz` status code.
pub async fn healthz(c: &Client) -> Result<u16, CniError> {
    Ok(c.get_status("/v1/healthz").await?.0)
}

/// `GET /v1/status`.
pub async fn status(c: &Client) -> Result<StatusResponse, CniError> {
    Ok(c.get("/v1/status").await?)
}

/// `POST /v1/gc`.
pub async fn gc(c: &Client, req: &GcRequest) -> Result<GcResponse, CniError> {
    Ok(c.post("/v1/gc", req).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_is_encoded() {
        assert_eq!(encode_query("abc-1_2.3"), "abc-1_2.3");
        assert_eq!(encode_query("e&t h#%?"), "e%26t%20h%23%25%3F");
        assert_eq!(
            selector("c1", "eth0"),
            "/v1/endpoints?container_id=c1&ifname=eth0"
        );
    }
}
