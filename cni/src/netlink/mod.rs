//! rtnetlink operations, one file per concern. Every function takes a `Handle` bound to the netns
//! it acts in.

pub mod host;
pub mod pod;
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

/// The positive errno of a kernel NACK, if that is what `e` is.
#[must_use]
pub fn errno(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) => m.code.map(|c| -c.get()),
        _ => None,
    }
}

/// A kernel error message as text (`File exists (os error 17)`), falling back to Debug.
#[must_use]
pub fn describe(e: &rtnetlink::Error) -> String {
    match e {
        rtnetlink::Error::NetlinkError(m) => m.to_io().to_string(),
        other => other.to_string(),
    }
}
