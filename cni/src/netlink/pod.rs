//! Pod-side configuration: runs inside the pod netns on its own netlink socket.

use super::describe;
use crate::error::CniError;
use netlink_packet_route::address::{AddressAttribute, AddressFlags};
use netlink_packet_route::route::RouteScope;
use rtnetlink::{Handle, LinkUnspec, RouteMessageBuilder};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use weft_api::IpConfig;

/// Every netns has its loopback at ifindex 1 (`LOOPBACK_IFINDEX`, `include/net/net_namespace.h`),
/// so no lookup is needed to bring it up.
const LOOPBACK_IFINDEX: u32 = 1;

fn fail(what: String) -> impl FnOnce(rtnetlink::Error) -> CniError {
    move |e| CniError::netlink(what, describe(&e))
}

/// `lo` and the interface up, addresses, routes via the gateway and a permanent neighbour for it.
///
/// Order matters: routes need the link up (ENETDOWN otherwise), and the default route's gateway
/// must be reachable when it is added, so the link-scope route to the gateway goes first.
pub async fn configure(
    handle: &Handle,
    index: u32,
    ips: &[IpConfig],
    host_mac: [u8; 6],
) -> Result<(), CniError> {
    handle
        .link()
        .set(LinkUnspec::new_with_index(LOOPBACK_IFINDEX).up().build())
        .execute()
        .await
        .map_err(fail("bringing lo up".into()))?;
    handle
        .link()
        .set(LinkUnspec::new_with_index(index).up().build())
        .execute()
        .await
        .map_err(fail("bringing the pod interface up".into()))?;
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
        add.execute()
            .await
            .map_err(fail(format!("adding {}/{prefix}", ip.address)))?;
        add_routes(handle, index, ip.gateway).await?;
        handle
            .neighbours()
            .add(index, ip.gateway)
            .link_layer_address(&host_mac)
            .execute()
            .await
            .map_err(fail(format!("adding neighbour {}", ip.gateway)))?;
    }
    Ok(())
}

async fn add_routes(handle: &Handle, index: u32, gateway: IpAddr) -> Result<(), CniError> {
    let (to_gw, default) = match gateway {
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
    };
    handle
        .route()
        .add(to_gw)
        .execute()
        .await
        .map_err(fail(format!("adding the route to gateway {gateway}")))?;
    handle
        .route()
        .add(default)
        .execute()
        .await
        .map_err(fail(format!("adding the default route via {gateway}")))
}
