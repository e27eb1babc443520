//! rtnetlink operations, one file per concern. Every function takes a `Handle` bound to the netns
//! it acts in.

pub mod host;
pub mod pod;
pub mod shaping;
pub mod veth;

use crate::error::CniError;
use rtnetlink::Handle;

/// A netlink connection in the calling thread's current netns, driven by the current runtime.
pub fn connect() -> Result<Handle, CniError> {
    let (conn, handle, _) = rtnetlink::new_connection()
        .map_err(|e| CniError::netlink("opening a netlink socket", e))?;
    tokio::spawn(conn);
    Ok(handle)
}

/// Runs netlink requests with their round trips overlapped, yet in list order: each future sends
/// its request on its first poll, `try_join_all` first-polls in list order, and the kernel handles
/// a socket's requests one by one as they are sent (`rtnetlink_rcv` runs in `sendmsg`). The first
/// error is returned; later requests may already have been applied, which the caller's revert
/// covers.
pub async fn pipeline(
    steps: Vec<futures::future::BoxFuture<'static, Result<(), CniError>>>,
) -> Result<(), CniError> {
    futures::future::try_join_all(steps).await.map(drop)
}

/// The positive errno of a kernel NACK, if that is what `e` is.
#[must_use]
pub fn errno(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) => m.code.map(|c| -c.get()),
        _ => None,
    }
}

/// The cause to report for `e`: a kernel NACK as the `io::Error` of its errno (`File exists
/// (os error 17)`), anything else as it is.
#[must_use]
pub fn cause(e: rtnetlink::Error) -> Box<dyn std::error::Error + Send + Sync> {
    match e {
        rtnetlink::Error::NetlinkError(m) => Box::new(m.to_io()),
        other => Box::new(other),
    }
}
