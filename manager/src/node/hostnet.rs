//! The node's own network plumbing, behind a seam: the `weft_host` device carrying the router
//! IPs, the node-CIDR routes, forwarding, and link look-ups/removal for cleanup.

use futures::TryStreamExt;
use futures::future::BoxFuture;
use ipnet::IpNet;
use netlink_packet_route::address::{AddressAttribute, AddressFlags};
use rtnetlink::{LinkUnspec, LinkVeth, RouteMessageBuilder};
use std::net::IpAddr;

pub(crate) use super::hostdev::nl;
pub use super::hostdev::{HOST_DEVICE, HOST_PEER, HostNetError};

/// Side effects on the node's network namespace.
pub trait HostNet: Send + Sync {
    /// Creates (or adopts) `weft_host` (and its peer `weft_net`) with the router IPs, routes each pod CIDR to it so an
    /// unassigned pod IP is dropped on the node, and enables IPv4/IPv6 forwarding.
    fn ensure_host_device<'a>(
        &'a self,
        routers: &'a [(IpAddr, IpNet)],
    ) -> BoxFuture<'a, Result<(), HostNetError>>;
    /// Every link's name → ifindex, from one dump (start-up validates all endpoints at once
    /// instead of one request per veth).
    fn link_indexes(
        &self,
    ) -> BoxFuture<'_, Result<std::collections::HashMap<String, u32>, HostNetError>>;
    /// Deletes `name`; a missing link is success (cleanup is idempotent).
    fn delete_link<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<(), HostNetError>>;
    /// Deletes the link with ifindex `index`, whatever it is called now; a missing link is
    /// success. The kernel does not reuse an ifindex soon, so this never takes a link created
    /// after `index` was read, even under the same name.
    fn delete_link_index(&self, index: u32) -> BoxFuture<'_, Result<(), HostNetError>>;
    /// The node netns's addresses and main-table routes, to refuse a pod CIDR that would take
    /// over one of them.
    fn node_view(&self) -> BoxFuture<'_, Result<crate::node::nodenet::NodeView, HostNetError>>;
    /// Sets `name` down, which makes the kernel drop every route through it; the link's ifindex,
    /// `None` when there is no such link.
    fn set_link_down<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<u32>, HostNetError>>;
}

/// The real implementation over rtnetlink, in the manager's network namespace.
pub struct NetlinkHostNet {
    handle: rtnetlink::Handle,
}

fn is_errno(e: &rtnetlink::Error, errno: i32) -> bool {
    matches!(e, rtnetlink::Error::NetlinkError(m) if m.raw_code().abs() == errno)
}

/// A netlink connection in the manager's namespace; its driver task runs on the current tokio
/// runtime.
pub(crate) fn connect() -> Result<rtnetlink::Handle, HostNetError> {
    let (conn, handle, _) = rtnetlink::new_connection().map_err(|source| HostNetError::Socket {
        op: "open netlink socket".into(),
        source,
    })?;
    tokio::spawn(conn);
    Ok(handle)
}

impl NetlinkHostNet {
    /// Opens a netlink connection (see [`connect`]).
    pub fn new() -> Result<Self, HostNetError> {
        Ok(Self { handle: connect()? })
    }

    async fn index(&self, name: &str) -> Result<Option<u32>, HostNetError> {
        let mut links = self.handle.link().get().match_name(name).execute();
        match links.try_next().await {
            Ok(Some(link)) => Ok(Some(link.header.index)),
            Ok(None) => Ok(None),
            Err(e) if is_errno(&e, libc::ENODEV) => Ok(None),
            Err(e) => Err(nl(format!("get link {name}"))(e)),
        }
    }

    async fn ensure(&self, routers: &[(IpAddr, IpNet)]) -> Result<(), HostNetError> {
        let index = if let Some(i) = self.index(HOST_DEVICE).await? {
            i
        } else {
            match self
                .handle
                .link()
                .add(LinkVeth::new(HOST_DEVICE, HOST_PEER).build())
                .execute()
                .await
            {
                Ok(()) => {}
                Err(e) if is_errno(&e, libc::EEXIST) => {}
                Err(e) => return Err(nl(format!("create {HOST_DEVICE}"))(e)),
            }
            self.index(HOST_DEVICE)
                .await?
                .ok_or(HostNetError::Vanished)?
        };
        let peer = self.index(HOST_PEER).await?;
        for idx in std::iter::once(index).chain(peer) {
            self.handle
                .link()
                .set(LinkUnspec::new_with_index(idx).up().build())
                .execute()
                .await
                .map_err(nl(format!("set {HOST_DEVICE} up")))?;
        }
        // One dump of the main table serves the existence check below and remove_stale (the
        // routes added in between are the routers', which remove_stale keeps anyway).
        let main_table = crate::node::nodenet::main_routes(&self.handle).await?;
        for (router, cidr) in routers {
            let host_len = if router.is_ipv4() { 32 } else { 128 };
            let mut req = self
                .handle
                .address()
                .add(index, *router, host_len)
                .replace();
            if router.is_ipv6() {
                // Without NODAD the router address stays "tentative" for ~1 s and the first
                // pods cannot reach their gateway.
                req.message_mut()
                    .attributes
                    .push(AddressAttribute::Flags(AddressFlags::Nodad));
            }
            req.execute()
                .await
                .map_err(nl(format!("add {router} to {HOST_DEVICE}")))?;
            let route = RouteMessageBuilder::<IpAddr>::new()
                .destination_prefix(cidr.network(), cidr.prefix_len())
                .map_err(|e| HostNetError::Route {
                    cidr: *cidr,
                    source: Box::new(e),
                })?
                .output_interface(index)
                .build();
            if main_table
                .iter()
                .any(|(dest, oif, _)| dest == cidr && *oif == Some(index))
            {
                continue;
            }
            // Never `replace`: a route Weft does not own must stay as it is.
            match self.handle.route().add(route).execute().await {
                Ok(()) => {}
                Err(e) if is_errno(&e, libc::EEXIST) => self.owns_route(*cidr, index).await?,
                Err(e) => return Err(nl(format!("route {cidr} dev {HOST_DEVICE}"))(e)),
            }
        }
        self.remove_stale(index, routers, main_table).await?;
        // /proc/sys/net is per network namespace: this enables forwarding only where the
        // manager runs (the node's namespace).
        for path in [
            "/proc/sys/net/ipv4/ip_forward",
            "/proc/sys/net/ipv6/conf/all/forwarding",
        ] {
            std::fs::write(path, b"1").map_err(|source| HostNetError::Sysctl {
                path: path.into(),
                source,
            })?;
        }
        Ok(())
    }

    /// An existing route for `cidr` is accepted only when it already points at `weft_host`.
    async fn owns_route(&self, cidr: IpNet, index: u32) -> Result<(), HostNetError> {
        let routes = crate::node::nodenet::main_routes(&self.handle).await?;
        if routes
            .iter()
            .any(|(dest, oif, _)| *dest == cidr && *oif == Some(index))
        {
            return Ok(());
        }
        Err(HostNetError::RouteTaken { cidr })
    }

    /// After a CIDR change, the old router IPs and pod-CIDR routes leave `weft_host`.
    /// IPv6 link-local addresses and routes are the kernel's and stay.
    async fn remove_stale(
        &self,
        index: u32,
        routers: &[(IpAddr, IpNet)],
        main_table: Vec<(
            IpNet,
            Option<u32>,
            netlink_packet_route::route::RouteMessage,
        )>,
    ) -> Result<(), HostNetError> {
        let is_link_local =
            |ip: IpAddr| matches!(ip, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80);
        let addrs: Vec<_> = self
            .handle
            .address()
            .get()
            .set_link_index_filter(index)
            .execute()
            .try_collect()
            .await
            .map_err(nl(format!("list addresses of {HOST_DEVICE}")))?;
        for m in addrs {
            let ip = m.attributes.iter().find_map(|a| match a {
                AddressAttribute::Address(ip) => Some(*ip),
                _ => None,
            });
            let Some(ip) = ip else { continue };
            if is_link_local(ip) || routers.iter().any(|(r, _)| *r == ip) {
                continue;
            }
            tracing::info!(address = %ip, "removing a stale router IP from {HOST_DEVICE}");
            self.handle
                .address()
                .del(m)
                .execute()
                .await
                .map_err(nl(format!("remove {ip} from {HOST_DEVICE}")))?;
        }
        for (dest, oif, msg) in main_table {
            if oif != Some(index)
                || is_link_local(dest.network())
                || routers.iter().any(|(_, c)| *c == dest)
            {
                continue;
            }
            tracing::info!(route = %dest, "removing a stale pod-CIDR route from {HOST_DEVICE}");
            match self.handle.route().del(msg).execute().await {
                Ok(()) => {}
                Err(e) if is_errno(&e, libc::ESRCH) => {}
                Err(e) => return Err(nl(format!("remove route {dest}"))(e)),
            }
        }
        Ok(())
    }

    async fn down(&self, name: &str) -> Result<Option<u32>, HostNetError> {
        let Some(index) = self.index(name).await? else {
            return Ok(None);
        };
        match self
            .handle
            .link()
            .set(LinkUnspec::new_with_index(index).down().build())
            .execute()
            .await
        {
            Ok(()) => Ok(Some(index)),
            Err(e) if is_errno(&e, libc::ENODEV) => Ok(None),
            Err(e) => Err(nl(format!("set link {name} down"))(e)),
        }
    }

    async fn indexes(&self) -> Result<std::collections::HashMap<String, u32>, HostNetError> {
        let mut links = self.handle.link().get().execute();
        let mut out = std::collections::HashMap::new();
        while let Some(link) = links.try_next().await.map_err(nl("list links"))? {
            for attr in &link.attributes {
                if let netlink_packet_route::link::LinkAttribute::IfName(name) = attr {
                    out.insert(name.clone(), link.header.index);
                }
            }
        }
        Ok(out)
    }

    async fn delete(&self, name: &str) -> Result<(), HostNetError> {
        let Some(index) = self.index(name).await? else {
            return Ok(());
        };
        self.delete_index(index, name).await
    }

    /// On a blocking thread with a socket of its own: the kernel runs a veth's teardown (~20 ms
    /// of reference and RCU waits, after it has dropped the rtnl lock) inside the sender's
    /// `sendmsg`. On the shared connection that stalled a tokio worker and every other netlink
    /// request of the manager behind it: an ADD's allocation waited up to 50 ms.
    async fn delete_index(&self, index: u32, what: &str) -> Result<(), HostNetError> {
        tokio::task::spawn_blocking(move || delete_link_blocking(index))
            .await
            .map_err(|source| HostNetError::Join {
                what: what.to_owned(),
                source,
            })?
            .map_err(|source| HostNetError::Socket {
                op: format!("delete link {what}"),
                source,
            })
    }
}

/// `RTM_DELLINK` of ifindex `index` on a fresh socket, waiting for the kernel's answer; a
/// missing link is success.
fn delete_link_blocking(index: u32) -> std::io::Result<()> {
    use netlink_packet_route::RouteNetlinkMessage;
    use netlink_packet_route::link::LinkMessage;

    let mut link = LinkMessage::default();
    link.header.index = index;
    match crate::sys::netlink_sync::RouteSocket::open()?.ack(RouteNetlinkMessage::DelLink(link)) {
        Err(e) if e.raw_os_error() == Some(libc::ENODEV) => Ok(()),
        done => done,
    }
}

impl HostNet for NetlinkHostNet {
    fn ensure_host_device<'a>(
        &'a self,
        routers: &'a [(IpAddr, IpNet)],
    ) -> BoxFuture<'a, Result<(), HostNetError>> {
        Box::pin(self.ensure(routers))
    }

    fn link_indexes(
        &self,
    ) -> BoxFuture<'_, Result<std::collections::HashMap<String, u32>, HostNetError>> {
        Box::pin(self.indexes())
    }

    fn delete_link<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<(), HostNetError>> {
        Box::pin(self.delete(name))
    }

    fn delete_link_index(&self, index: u32) -> BoxFuture<'_, Result<(), HostNetError>> {
        Box::pin(async move { self.delete_index(index, &format!("#{index}")).await })
    }

    fn node_view(&self) -> BoxFuture<'_, Result<crate::node::nodenet::NodeView, HostNetError>> {
        Box::pin(crate::node::nodenet::read(&self.handle))
    }

    fn set_link_down<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<u32>, HostNetError>> {
        Box::pin(self.down(name))
    }
}

/// An in-memory stand-in for unit tests: links are names with indexes.
#[derive(Default)]
pub struct FakeHostNet {
    /// Existing links.
    pub links: std::sync::Mutex<std::collections::BTreeMap<String, u32>>,
    /// Router IPs ensured.
    pub routers: std::sync::Mutex<Vec<(IpAddr, IpNet)>>,
    /// What `node_view` reports.
    pub view: std::sync::Mutex<crate::node::nodenet::NodeView>,
    /// Links set down.
    pub down: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

impl HostNet for FakeHostNet {
    fn ensure_host_device<'a>(
        &'a self,
        routers: &'a [(IpAddr, IpNet)],
    ) -> BoxFuture<'a, Result<(), HostNetError>> {
        *crate::sys::locks::lock(&self.routers) = routers.to_vec();
        let mut links = crate::sys::locks::lock(&self.links);
        let next = u32::try_from(links.len()).unwrap_or(u32::MAX) + 1;
        links.entry(HOST_DEVICE.into()).or_insert(next);
        Box::pin(async { Ok(()) })
    }

    fn link_indexes(
        &self,
    ) -> BoxFuture<'_, Result<std::collections::HashMap<String, u32>, HostNetError>> {
        let all = crate::sys::locks::lock(&self.links)
            .iter()
            .map(|(n, i)| (n.clone(), *i))
            .collect();
        Box::pin(async move { Ok(all) })
    }

    fn delete_link<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<(), HostNetError>> {
        crate::sys::locks::lock(&self.links).remove(name);
        crate::sys::locks::lock(&self.down).remove(name);
        Box::pin(async { Ok(()) })
    }

    fn delete_link_index(&self, index: u32) -> BoxFuture<'_, Result<(), HostNetError>> {
        let mut links = crate::sys::locks::lock(&self.links);
        let named: Vec<String> = links
            .iter()
            .filter(|(_, i)| **i == index)
            .map(|(n, _)| n.clone())
            .collect();
        for name in named {
            links.remove(&name);
            crate::sys::locks::lock(&self.down).remove(&name);
        }
        Box::pin(async { Ok(()) })
    }

    fn node_view(&self) -> BoxFuture<'_, Result<crate::node::nodenet::NodeView, HostNetError>> {
        let view = crate::sys::locks::lock(&self.view).clone();
        Box::pin(async move { Ok(view) })
    }

    fn set_link_down<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<u32>, HostNetError>> {
        let index = crate::sys::locks::lock(&self.links).get(name).copied();
        if index.is_some() {
            crate::sys::locks::lock(&self.down).insert(name.to_owned());
        }
        Box::pin(async move { Ok(index) })
    }
}
