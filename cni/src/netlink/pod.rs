//! Pod-side configuration: runs inside the pod netns on its own netlink socket.

use super::{cause, pipeline};
use crate::error::CniError;
use futures::future::BoxFuture;
use netlink_packet_route::address::{AddressAttribute, AddressFlags};
use netlink_packet_route::route::RouteScope;
use rtnetlink::{Handle, LinkUnspec, RouteMessageBuilder};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use weft_api::IpConfig;
use weft_api::MacAddr;

/// Every netns has its loopback at ifindex 1 (`LOOPBACK_IFINDEX`, `include/net/net_namespace.h`),
/// so no lookup is needed to bring it up.
const LOOPBACK_IFINDEX: u32 = 1;

fn fail(what: String) -> impl FnOnce(rtnetlink::Error) -> CniError {
    move |e| CniError::netlink(what, cause(e))
}

/// `lo` (and the interface, when `bring_up`) up, addresses, routes via the gateway and a
/// permanent neighbour for it.
///
/// Order matters and is the order of the list: routes need the link up (ENETDOWN otherwise), and
/// the default route's gateway must be reachable when it is added, so the link-scope route to the
/// gateway goes first. [`pipeline`] keeps that order.
pub async fn configure(
    handle: &Handle,
    index: u32,
    ips: &[IpConfig],
    host_mac: MacAddr,
    bring_up: bool,
) -> Result<(), CniError> {
    let mut steps: Vec<BoxFuture<'static, Result<(), CniError>>> = Vec::new();
    let mut links = vec![(LOOPBACK_IFINDEX, "lo")];
    if bring_up {
        links.push((index, "the pod interface"));
    }
    for (i, what) in links {
        let req = handle
            .link()
            .set(LinkUnspec::new_with_index(i).up().build());
        let err = fail(format!("bringing {what} up"));
        steps.push(Box::pin(async move { req.execute().await.map_err(err) }));
    }
    for ip in ips {
        let prefix = if ip.address.is_ipv4() { 32 } else { 128 };
        let mut add = handle.address().add(index, ip.address, prefix);
        if ip.address.is_ipv6() {
            // No DAD: the address is ours by allocation, and DAD would keep it tentative (unusable)
            // for about a second.
            add.message_mut()
                .attributes
                .push(AddressAttribute::Flags(AddressFlags::Nodad));
        }
        let err = fail(format!("adding {}/{prefix}", ip.address));
        steps.push(Box::pin(async move { add.execute().await.map_err(err) }));

        let gw = ip.gateway;
        let (to_gw, default) = routes(index, gw);
        let req = handle.route().add(to_gw);
        let err = fail(format!("adding the route to gateway {gw}"));
        steps.push(Box::pin(async move { req.execute().await.map_err(err) }));
        let req = handle.route().add(default);
        let err = fail(format!("adding the default route via {gw}"));
        steps.push(Box::pin(async move { req.execute().await.map_err(err) }));

        let req = handle
            .neighbours()
            .add(index, gw)
            .link_layer_address(&host_mac.octets());
        let err = fail(format!("adding neighbour {gw}"));
        steps.push(Box::pin(async move { req.execute().await.map_err(err) }));
    }
    pipeline(steps).await
}

/// The link-scope route to the gateway and the default route via it.
fn routes(
    index: u32,
    gateway: IpAddr,
) -> (
    netlink_packet_route::route::RouteMessage,
    netlink_packet_route::route::RouteMessage,
) {
    match gateway {
        IpAddr::V4(gw) => (
            RouteMessageBuilder::<Ipv4Addr>::new()
                .destination_prefix(gw, 32)
                .output_interface(index)
                .scope(RouteScope::Link)
                .build(),
            RouteMessageBuilder::<Ipv4Addr>::new()
                .destination_prefix(Ipv4Addr::UNSPECIFIED, 0)
                .gateway(gw)
                .output_interface(index)
                .build(),
        ),
        IpAddr::V6(gw) => (
            RouteMessageBuilder::<Ipv6Addr>::new()
                .destination_prefix(gw, 128)
                .output_interface(index)
                .build(),
            RouteMessageBuilder::<Ipv6Addr>::new()
                .destination_prefix(Ipv6Addr::UNSPECIFIED, 0)
                .gateway(gw)
                .output_interface(index)
                .build(),
        ),
    }
}
