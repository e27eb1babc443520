//! The host device's names (`weft_host` and its peer `weft_net`) and the errors of the node's
//! netlink plumbing, shared by [`super::hostnet`] (the side effects) and [`super::nodenet`]
//! (what the netns already holds) so that neither imports the other for them.

use ipnet::IpNet;

/// The device that owns the router IPs.
pub const HOST_DEVICE: &str = "weft_host";
/// Its veth peer. This kernel has no `dummy` driver, so Weft uses Cilium's own layout
/// (`cilium_host` <-> `cilium_net`): a packet routed to an unassigned pod IP goes to
/// `weft_host`, finds no neighbour behind `weft_net` and is dropped on the node.
pub const HOST_PEER: &str = "weft_net";

/// Host plumbing failures.
#[derive(Debug, thiserror::Error)]
pub enum HostNetError {
    /// A netlink request failed.
    #[error("netlink: {op}: {source}")]
    Netlink {
        /// What was being done.
        op: String,
        /// Kernel's answer.
        source: rtnetlink::Error,
    },
    /// A request on the synchronous netlink socket failed (`crate::sys::netlink_sync`).
    #[error("netlink: {op}: {source}")]
    Socket {
        /// What was being done.
        op: String,
        /// The socket's or the kernel's error.
        source: std::io::Error,
    },
    /// A route message could not be built for a pod CIDR (rtnetlink's `InvalidRouteMessage`,
    /// which it does not export by name).
    #[error("netlink: route {cidr}: {source}")]
    Route {
        /// The CIDR.
        cidr: IpNet,
        /// Why.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// `weft_host` was created but is not there to be read back.
    #[error("netlink: create {HOST_DEVICE}: device vanished after creation")]
    Vanished,
    /// A route for a pod CIDR exists through another device.
    #[error(
        "netlink: route {cidr} dev {HOST_DEVICE}: a route for {cidr} through another device exists; Weft does not replace routes it does not own: remove it or choose another pod CIDR"
    )]
    RouteTaken {
        /// The pod CIDR.
        cidr: IpNet,
    },
    /// The blocking thread of a link deletion died.
    #[error("netlink: delete link {what}: {source}")]
    Join {
        /// The link.
        what: String,
        /// The thread's fate.
        source: tokio::task::JoinError,
    },
    /// A sysctl could not be written.
    #[error("cannot enable forwarding ({path}): {source}")]
    Sysctl {
        /// The /proc/sys path.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
}

pub(crate) fn nl(op: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> HostNetError {
    let op = op.into();
    move |source| HostNetError::Netlink { op, source }
}
