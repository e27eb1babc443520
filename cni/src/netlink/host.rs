//! Host-side configuration in the node netns: a host route and a permanent neighbour per pod IP.

use super::{cause, pipeline};
use crate::error::CniError;
use futures::future::BoxFuture;
use netlink_packet_route::route::RouteScope;
use rtnetlink::{Handle, LinkUnspec, RouteMessageBuilder};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use weft_api::IpConfig;
use weft_api::MacAddr;

/// The host veth up, then a `/32` (`/128`) route to each pod IP via it, and pod IP → pod MAC
/// (no ARP/NDP). The pod-side thread creates the pair with the host end down (the kernel cannot
/// report that end's flags to a socket in the pod netns), and a route through a down link is
/// refused (ENETDOWN): the list order is the order they reach the kernel ([`pipeline`]).
///
/// Both are `replace`: the manager gave us the address, so any stale entry for it (a veth the
/// kernel is still tearing down) must yield.
pub async fn configure(
    handle: &Handle,
    index: u32,
    ips: &[IpConfig],
    pod_mac: MacAddr,
) -> Result<(), CniError> {
    let mut steps: Vec<BoxFuture<'static, Result<(), CniError>>> = Vec::new();
    let up = handle
        .link()
        .set(LinkUnspec::new_with_index(index).up().build());
    steps.push(Box::pin(async move {
        up.execute()
            .await
            .map_err(|e| CniError::netlink("bringing the host veth up", cause(e)))
    }));
    for ip in ips {
        let addr = ip.address;
        let route = match addr {
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
        let req = handle.route().add(route).replace();
        steps.push(Box::pin(async move {
            req.execute().await.map_err(|e| {
                CniError::netlink(format!("adding the host route to {addr}"), cause(e))
            })
        }));
        let req = handle
            .neighbours()
            .add(index, addr)
            .link_layer_address(&pod_mac.octets())
            .replace();
        steps.push(Box::pin(async move {
            req.execute().await.map_err(|e| {
                CniError::netlink(format!("adding the host neighbour {addr}"), cause(e))
            })
        }));
    }
    pipeline(steps).await
}
