//! Direct routing between nodes (Cilium's auto-direct-node-routes): each remote node's pod
//! CIDRs via its node IP, in the node's network namespace. Weft marks its routes with its own
//! route protocol number and only ever replaces or deletes routes carrying it: a route some
//! other tool installed for the same prefix is left alone (and reported).

use futures::TryStreamExt;
use futures::future::BoxFuture;
use ipnet::IpNet;
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteProtocol};
use rtnetlink::RouteMessageBuilder;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::node::hostnet::{HostNetError, nl};

pub use crate::node::nodenet::WEFT_PROTO;

/// The routing seam.
pub trait RouteTable: Send + Sync {
    /// Routes `cidr` via `gateway`, unless a route Weft does not own holds the prefix.
    fn replace(&self, cidr: IpNet, gateway: IpAddr) -> BoxFuture<'_, Result<(), HostNetError>>;
    /// Removes Weft's route for `cidr` (missing is fine; another owner's is kept).
    fn remove(&self, cidr: IpNet) -> BoxFuture<'_, Result<(), HostNetError>>;
}

/// Routes over rtnetlink in the manager's namespace.
pub struct NetlinkRoutes {
    handle: rtnetlink::Handle,
}

impl NetlinkRoutes {
    /// Opens a netlink connection on the current runtime.
    pub fn new() -> Result<Self, HostNetError> {
        Ok(Self {
            handle: crate::node::hostnet::connect()?,
        })
    }

    /// The main-table route for exactly `cidr`, if any.
    async fn find(&self, cidr: IpNet) -> Result<Option<RouteMessage>, HostNetError> {
        let filter = match cidr {
            IpNet::V4(_) => RouteMessageBuilder::<Ipv4Addr>::new().build(),
            IpNet::V6(_) => RouteMessageBuilder::<Ipv6Addr>::new().build(),
        };
        let mut routes = self.handle.route().get(filter).execute();
        while let Some(r) = routes
            .try_next()
            .await
            .map_err(nl(format!("list routes for {cidr}")))?
        {
            if r.header.destination_prefix_length != cidr.prefix_len() || r.header.table != 254 {
                continue;
            }
            let dst = r.attributes.iter().find_map(|a| match a {
                RouteAttribute::Destination(RouteAddress::Inet(a)) => Some(IpAddr::V4(*a)),
                RouteAttribute::Destination(RouteAddress::Inet6(a)) => Some(IpAddr::V6(*a)),
                _ => None,
            });
            if dst == Some(cidr.network()) {
                return Ok(Some(r));
            }
        }
        Ok(None)
    }

    async fn do_replace(&self, cidr: IpNet, gateway: IpAddr) -> Result<(), HostNetError> {
        if let Some(existing) = self.find(cidr).await?
            && existing.header.protocol != RouteProtocol::Other(WEFT_PROTO)
        {
            tracing::warn!(%cidr, %gateway, "a route Weft does not own holds this prefix; not replacing it");
            return Ok(());
        }
        let route = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(cidr.network(), cidr.prefix_len())
            .and_then(|b| b.gateway(gateway))
            .map_err(|e| HostNetError::Route {
                cidr,
                source: Box::new(e),
            })?
            .protocol(RouteProtocol::Other(WEFT_PROTO))
            .build();
        self.handle
            .route()
            .add(route)
            .replace()
            .execute()
            .await
            .map_err(nl(format!("route {cidr} via {gateway}")))
    }

    async fn do_remove(&self, cidr: IpNet) -> Result<(), HostNetError> {
        let Some(existing) = self.find(cidr).await? else {
            return Ok(());
        };
        if existing.header.protocol != RouteProtocol::Other(WEFT_PROTO) {
            return Ok(());
        }
        self.handle
            .route()
            .del(existing)
            .execute()
            .await
            .map_err(nl(format!("delete route {cidr}")))
    }
}

impl RouteTable for NetlinkRoutes {
    fn replace(&self, cidr: IpNet, gateway: IpAddr) -> BoxFuture<'_, Result<(), HostNetError>> {
        Box::pin(self.do_replace(cidr, gateway))
    }

    fn remove(&self, cidr: IpNet) -> BoxFuture<'_, Result<(), HostNetError>> {
        Box::pin(self.do_remove(cidr))
    }
}

/// In-memory routes for unit tests: prefix → (gateway, owned by Weft).
#[derive(Default)]
pub struct FakeRoutes {
    /// The table.
    pub table: std::sync::Mutex<std::collections::BTreeMap<IpNet, (IpAddr, bool)>>,
}

impl RouteTable for FakeRoutes {
    fn replace(&self, cidr: IpNet, gateway: IpAddr) -> BoxFuture<'_, Result<(), HostNetError>> {
        let mut t = crate::sys::locks::lock(&self.table);
        if t.get(&cidr).is_none_or(|(_, ours)| *ours) {
            t.insert(cidr, (gateway, true));
        }
        Box::pin(async { Ok(()) })
    }

    fn remove(&self, cidr: IpNet) -> BoxFuture<'_, Result<(), HostNetError>> {
        let mut t = crate::sys::locks::lock(&self.table);
        if t.get(&cidr).is_some_and(|(_, ours)| *ours) {
            t.remove(&cidr);
        }
        Box::pin(async { Ok(()) })
    }
}
