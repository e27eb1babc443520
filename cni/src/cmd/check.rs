//! CHECK: the pod interface, its addresses and default routes match prevResult, the host veth
//! exists, and the manager has the endpoint ready with the same addresses.

use crate::env::CniEnv;
use crate::error::CniError;
use crate::netconf::NetConf;
use crate::netlink::{self, cause, veth};
use crate::result::CniResult;
use crate::{manager, netns};
use futures::TryStreamExt;
use netlink_packet_route::address::AddressAttribute;
use netlink_packet_route::route::{RouteAddress, RouteAttribute};
use rtnetlink::{Handle, RouteMessageBuilder};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use weft_api::EndpointState;
use weft_api::client::Client;
use weft_api::naming::host_ifname;

fn mismatch(msg: String) -> CniError {
    CniError::CheckMismatch(msg)
}

/// What prevResult says the pod must have.
struct Expected {
    ifname: String,
    addrs: Vec<(IpAddr, u8)>,
    default_gws: Vec<IpAddr>,
}

fn expected(env: &CniEnv, prev: &CniResult) -> Result<Expected, CniError> {
    let pod_if = prev
        .interfaces
        .iter()
        .position(|i| i.name == env.ifname && i.sandbox.is_some())
        .ok_or_else(|| {
            mismatch(format!(
                "prevResult has no interface {} in a sandbox",
                env.ifname
            ))
        })?;
    let mut addrs = Vec::new();
    for ip in prev.ips.iter().filter(|ip| ip.interface == Some(pod_if)) {
        let (a, p) = ip
            .address
            .split_once('/')
            .and_then(|(a, p)| Some((a.parse().ok()?, p.parse().ok()?)))
            .ok_or_else(|| CniError::Decode(format!("prevResult address {:?}", ip.address)))?;
        addrs.push((a, p));
    }
    let default_gws = prev
        .routes
        .iter()
        .filter(|r| r.dst == "0.0.0.0/0" || r.dst == "::/0")
        .filter_map(|r| r.gw)
        .collect();
    Ok(Expected {
        ifname: env.ifname.clone(),
        addrs,
        default_gws,
    })
}

/// Runs CHECK.
pub async fn run(env: &CniEnv, conf: &NetConf) -> Result<(), CniError> {
    let prev = conf
        .prev_result
        .clone()
        .ok_or_else(|| CniError::InvalidConfig("CHECK needs prevResult".into()))?;
    let prev: CniResult =
        serde_json::from_value(prev).map_err(|e| CniError::Decode(format!("prevResult: {e}")))?;
    let want = expected(env, &prev)?;
    let netns_path = super::netns_path(env)?;
    let netns = netns::open_pod_netns(netns_path)?;

    let client = Client::new(&conf.socket);
    let eps = manager::find(&client, &env.container_id, &env.ifname).await?;
    let ep = eps.first().ok_or_else(|| {
        mismatch(format!(
            "weft-manager has no endpoint for {} {}",
            env.container_id, env.ifname
        ))
    })?;
    if ep.state != EndpointState::Ready {
        return Err(mismatch(format!(
            "endpoint {} is {:?}, not ready",
            ep.id, ep.state
        )));
    }
    for (a, _) in &want.addrs {
        if !ep.ips.iter().any(|ip| ip.address == *a) {
            return Err(mismatch(format!(
                "weft-manager does not list {a} for endpoint {}",
                ep.id
            )));
        }
    }

    let host_name = host_ifname(&env.container_id, &env.ifname);
    if veth::index_of(&netlink::connect()?, &host_name)
        .await?
        .is_none()
    {
        return Err(mismatch(format!("host veth {host_name} is missing")));
    }
    netns::run_in_netns(netns, move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .map_err(|e| CniError::netlink("building the check runtime", e))?
            .block_on(async {
                let nl = netlink::connect()?;
                check_pod(&nl, &want).await
            })
    })
    .await
}

async fn check_pod(nl: &Handle, want: &Expected) -> Result<(), CniError> {
    let index = veth::index_of(nl, &want.ifname)
        .await?
        .ok_or_else(|| mismatch(format!("interface {} is missing in the netns", want.ifname)))?;
    let have: Vec<(IpAddr, u8)> = nl
        .address()
        .get()
        .set_link_index_filter(index)
        .execute()
        .map_ok(|m| {
            let prefix = m.header.prefix_len;
            m.attributes.into_iter().find_map(|a| match a {
                AddressAttribute::Address(ip) => Some((ip, prefix)),
                _ => None,
            })
        })
        .try_filter_map(|x| async move { Ok(x) })
        .try_collect()
        .await
        .map_err(|e| CniError::netlink("listing addresses", cause(e)))?;
    for (a, p) in &want.addrs {
        if !have.contains(&(*a, *p)) {
            return Err(mismatch(format!("{} lacks address {a}/{p}", want.ifname)));
        }
    }
    for gw in &want.default_gws {
        if !has_default_via(nl, index, *gw).await? {
            return Err(mismatch(format!(
                "no default route via {gw} on {}",
                want.ifname
            )));
        }
    }
    Ok(())
}

async fn has_default_via(nl: &Handle, index: u32, gw: IpAddr) -> Result<bool, CniError> {
    let filter = match gw {
        IpAddr::V4(_) => RouteMessageBuilder::<Ipv4Addr>::new().build(),
        IpAddr::V6(_) => RouteMessageBuilder::<Ipv6Addr>::new().build(),
    };
    let routes: Vec<_> = nl
        .route()
        .get(filter)
        .execute()
        .try_collect()
        .await
        .map_err(|e| CniError::netlink("listing routes", cause(e)))?;
    Ok(routes.iter().any(|r| {
        r.header.destination_prefix_length == 0
            && r.attributes.contains(&RouteAttribute::Oif(index))
            && r.attributes.iter().any(|a| match (a, gw) {
                (RouteAttribute::Gateway(RouteAddress::Inet(g)), IpAddr::V4(w)) => *g == w,
                (RouteAttribute::Gateway(RouteAddress::Inet6(g)), IpAddr::V6(w)) => *g == w,
                _ => false,
            })
    }))
}
