//! What the node's network namespace already holds, and whether a pod CIDR may be routed to
//! `weft_host` without taking over an address or route that is not Weft's.
//!
//! Rules (docs/OPERATIONS.md, "Trust model"): a pod CIDR is refused when it contains an address
//! of a non-Weft interface (the node's own LAN address would move behind `weft_host`) or when a
//! non-Weft route of the main table is equal to or inside it (Weft's route would replace or
//! shadow it). A broader route around the CIDR (e.g. `10.0.0.0/8 via eth0` around
//! `10.244.1.0/24`) is fine: the more specific pod route wins only for pod addresses. Default
//! routes never conflict: the pod CIDR is always more specific.

use futures::TryStreamExt;
use ipnet::IpNet;
use netlink_packet_route::address::AddressAttribute;
use netlink_packet_route::link::LinkAttribute;
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteProtocol};
use rtnetlink::RouteMessageBuilder;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::node::hostdev::{HOST_DEVICE, HOST_PEER, HostNetError, nl};

/// `RT_TABLE_MAIN`.
const MAIN_TABLE: u8 = 254;

/// An address configured on an interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAddr {
    /// Address with its prefix.
    pub addr: IpNet,
    /// Interface name.
    pub link: String,
}

/// A route of the main table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRoute {
    /// Destination.
    pub dest: IpNet,
    /// Output interface name, if the route has one.
    pub link: Option<String>,
}

/// The node netns's addresses and main-table routes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeView {
    /// Every address.
    pub addrs: Vec<NodeAddr>,
    /// Every main-table route.
    pub routes: Vec<NodeRoute>,
    /// The destinations of Weft's own routes ([`WEFT_PROTO`]): other nodes' pod CIDRs, as the
    /// last run left them.
    pub weft_routes: Vec<IpNet>,
}

/// Route protocol number of Weft's routes to other nodes (`ip route show proto 196`).
pub const WEFT_PROTO: u8 = 196;

/// Interfaces whose addresses and routes Weft made: `weft_host`/`weft_net` and host veths.
#[must_use]
pub fn is_weft_link(name: &str) -> bool {
    name == HOST_DEVICE
        || name == HOST_PEER
        || name.starts_with(weft_api::naming::HOST_IFNAME_PREFIX)
}

fn overlaps(a: IpNet, b: IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// Why a pod CIDR would take over something of the node's.
#[must_use]
pub fn conflict(cidr: IpNet, view: &NodeView) -> Option<String> {
    for a in &view.addrs {
        if !is_weft_link(&a.link) && cidr.contains(&a.addr.addr()) {
            return Some(format!(
                "pod CIDR {cidr} contains {} on {}: the node's own address would move behind {HOST_DEVICE}; choose a pod CIDR outside the node's networks",
                a.addr, a.link
            ));
        }
    }
    for r in &view.routes {
        let ours = r.link.as_deref().is_some_and(is_weft_link);
        if ours || r.dest.prefix_len() == 0 || !overlaps(cidr, r.dest) {
            continue;
        }
        if cidr.contains(&r.dest) {
            return Some(format!(
                "pod CIDR {cidr} covers the node's route {} dev {}: Weft would replace or shadow a route it does not own; choose a pod CIDR that no route of the node uses",
                r.dest,
                r.link.as_deref().unwrap_or("(none)")
            ));
        }
    }
    None
}

fn dest_of(m: &RouteMessage) -> Option<IpNet> {
    let len = m.header.destination_prefix_length;
    let addr = m.attributes.iter().find_map(|a| match a {
        RouteAttribute::Destination(RouteAddress::Inet(v4)) => Some(IpAddr::V4(*v4)),
        RouteAttribute::Destination(RouteAddress::Inet6(v6)) => Some(IpAddr::V6(*v6)),
        _ => None,
    });
    match addr {
        Some(a) => IpNet::new(a, len).ok(),
        // No destination attribute: the default route of that family.
        None => match m.header.address_family {
            netlink_packet_route::AddressFamily::Inet => {
                IpNet::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0).ok()
            }
            netlink_packet_route::AddressFamily::Inet6 => {
                IpNet::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0).ok()
            }
            _ => None,
        },
    }
}

fn oif_of(m: &RouteMessage) -> Option<u32> {
    m.attributes.iter().find_map(|a| match a {
        RouteAttribute::Oif(i) => Some(*i),
        _ => None,
    })
}

fn is_main(m: &RouteMessage) -> bool {
    let attr = m.attributes.iter().find_map(|a| match a {
        RouteAttribute::Table(t) => Some(*t),
        _ => None,
    });
    attr.map_or(m.header.table == MAIN_TABLE, |t| t == u32::from(MAIN_TABLE))
}

/// Main-table routes of both families, as raw messages (for deletion) with their destination.
pub(crate) async fn main_routes(
    handle: &rtnetlink::Handle,
) -> Result<Vec<(IpNet, Option<u32>, RouteMessage)>, HostNetError> {
    let mut out = Vec::new();
    for filter in [
        RouteMessageBuilder::<Ipv4Addr>::new().build(),
        RouteMessageBuilder::<Ipv6Addr>::new().build(),
    ] {
        let msgs: Vec<RouteMessage> = handle
            .route()
            .get(filter)
            .execute()
            .try_collect()
            .await
            .map_err(nl("list routes"))?;
        for m in msgs.into_iter().filter(is_main) {
            if let Some(dest) = dest_of(&m) {
                out.push((dest, oif_of(&m), m));
            }
        }
    }
    Ok(out)
}

/// Reads the node netns's addresses and main-table routes.
pub(crate) async fn read(handle: &rtnetlink::Handle) -> Result<NodeView, HostNetError> {
    let links: Vec<_> = handle
        .link()
        .get()
        .execute()
        .try_collect()
        .await
        .map_err(nl("list links"))?;
    let names: BTreeMap<u32, String> = links
        .iter()
        .filter_map(|l| {
            l.attributes.iter().find_map(|a| match a {
                LinkAttribute::IfName(n) => Some((l.header.index, n.clone())),
                _ => None,
            })
        })
        .collect();
    let name = |i: u32| {
        names
            .get(&i)
            .cloned()
            .unwrap_or_else(|| format!("ifindex {i}"))
    };
    let addrs: Vec<_> = handle
        .address()
        .get()
        .execute()
        .try_collect()
        .await
        .map_err(nl("list addresses"))?;
    let mut view = NodeView::default();
    for m in addrs {
        let ip = m.attributes.iter().find_map(|a| match a {
            AddressAttribute::Address(ip) => Some(*ip),
            _ => None,
        });
        if let Some(addr) = ip.and_then(|ip| IpNet::new(ip, m.header.prefix_len).ok()) {
            view.addrs.push(NodeAddr {
                addr,
                link: name(m.header.index),
            });
        }
    }
    for (dest, oif, m) in main_routes(handle).await? {
        if m.header.protocol == RouteProtocol::Other(WEFT_PROTO) {
            view.weft_routes.push(dest);
        }
        view.routes.push(NodeRoute {
            dest,
            link: oif.map(name),
        });
    }
    Ok(view)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view() -> NodeView {
        let n = |s: &str| s.parse::<IpNet>().unwrap();
        NodeView {
            addrs: vec![
                NodeAddr {
                    addr: n("192.168.1.10/24"),
                    link: "eth0".into(),
                },
                NodeAddr {
                    addr: n("10.9.0.1/32"),
                    link: HOST_DEVICE.into(),
                },
            ],
            routes: vec![
                NodeRoute {
                    dest: n("0.0.0.0/0"),
                    link: Some("eth0".into()),
                },
                NodeRoute {
                    dest: n("192.168.1.0/24"),
                    link: Some("eth0".into()),
                },
                NodeRoute {
                    dest: n("10.0.0.0/8"),
                    link: Some("eth0".into()),
                },
                NodeRoute {
                    dest: n("172.16.5.0/24"),
                    link: Some("eth1".into()),
                },
                NodeRoute {
                    dest: n("10.9.0.0/24"),
                    link: Some(HOST_DEVICE.into()),
                },
            ],
            weft_routes: Vec::new(),
        }
    }

    fn check(cidr: &str) -> Option<String> {
        conflict(cidr.parse().unwrap(), &view())
    }

    #[test]
    fn the_nodes_lan_is_refused() {
        let why = check("192.168.1.0/24").unwrap();
        assert!(why.contains("192.168.1.10/24 on eth0"), "{why}");
        assert!(check("192.168.0.0/16").is_some());
    }

    #[test]
    fn a_route_inside_the_cidr_is_refused() {
        let why = check("172.16.0.0/16").unwrap();
        assert!(why.contains("172.16.5.0/24 dev eth1"), "{why}");
        assert!(check("172.16.5.0/24").is_some());
    }

    #[test]
    fn broader_routes_default_routes_and_weft_routes_do_not_conflict() {
        assert_eq!(check("10.244.1.0/24"), None);
        assert_eq!(
            check("10.9.0.0/24"),
            None,
            "Weft's own route from a previous run"
        );
        assert_eq!(check("fd00:10::/64"), None);
    }
}
