//! Host-side configuration in the node netns: a host route and a permanent neighbour per pod IP.

use super::describe;
use crate::error::CniError;
use netlink_packet_route::route::RouteScope;
use rtnetlink::{Handle, RouteMessageBuilder};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use weft_api::IpConfig;

/// `/32` (`/128`) route to each pod IP via the host veth, and pod IP → pod MAC (no ARP/NDP).
///
/// Both are `replace`: the manager gave us the address, so any stale entry for it (a veth the
/// kernel is still tearing down) must yield.
pub async fn configure(
    handle: &Handle,
    index: u32,
    ips: &[IpConfig],
    pod_mac: [u8; 6],
) -> Result<(), CniError> {
    for ip in ips {
        let route = match ip.address {
            IpAddr::V4(a) => RouteMessageBuilder::<Ipv4Addr>::new()
                .destination_prefix(a, 32)
                .output_interface(index)
                .scope(RouteScope::Link)
                .build(),
            IpAddr::V6(a) => RouteMessageBuilder::<Ipv6Addr>::new()
                .destination_prefix(a, 128)
                .output_interface(index)
                .build(),
        };
        handle
            .route()
            .add(route)
            .replace()
            .execute()
            .await
            .map_err(|e| {
                CniError::netlink(
                    format!("adding the host route to {}", ip.address),
                    describe(&e),
                )
            })?;
        handle
            .neighbours()
            .add(index, ip.address)
            .link_layer_address(&pod_mac)
            .replace()
            .execute()
            .await
            .map_err(|e| {
                CniError::netlink(
                    format!("adding the host neighbour {}", ip.address),
                    describe(&e),
                )
            })?;
    }
    Ok(())
}
