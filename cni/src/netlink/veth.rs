//! The veth pair, created in one request with the peer born inside the pod netns.

use super::{describe, errno};
use crate::error::CniError;
use futures::StreamExt;
use netlink_packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_ECHO, NLM_F_EXCL, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::link::{InfoData, InfoKind, InfoVeth, LinkAttribute, LinkMessage};
use nix::errno::Errno;
use rtnetlink::{Handle, LinkMessageBuilder, LinkUnspec};
use std::os::fd::{AsRawFd, BorrowedFd};

/// What to create.
#[derive(Debug)]
pub struct VethSpec<'a> {
    /// Host-side name (node netns).
    pub host_name: &'a str,
    /// Host-side MAC.
    pub host_mac: [u8; 6],
    /// Pod-side name (`CNI_IFNAME`).
    pub pod_name: &'a str,
    /// Pod-side MAC.
    pub pod_mac: [u8; 6],
    /// MTU of both ends.
    pub mtu: u32,
    /// The pod netns.
    pub netns: BorrowedFd<'a>,
    /// Pod netns path, for messages.
    pub netns_path: &'a str,
}

/// Indexes of the new pair.
#[derive(Debug, Clone, Copy)]
pub struct Created {
    /// Host side ifindex (node netns).
    pub host_index: u32,
    /// Pod side ifindex (pod netns), when the kernel's echo carried it.
    pub pod_index: Option<u32>,
}

/// Creates the pair, MACs and MTU set, host end up: one request (creating in the node netns and
/// moving the peer costs 16–20 ms more, PLATFORM.md).
///
/// `NLM_F_ECHO` makes the kernel send the new host link back: its index and `IFLA_LINK` (the
/// peer's index inside the pod netns) save a lookup on each side. Kernels that ignore the flag
/// get one `RTM_GETLINK` instead.
pub async fn create(handle: &Handle, spec: &VethSpec<'_>) -> Result<Created, CniError> {
    let peer = LinkMessageBuilder::<LinkUnspec>::new()
        .name(spec.pod_name.to_owned())
        .address(spec.pod_mac.to_vec())
        .mtu(spec.mtu)
        // Not `.up()`: kernel 6.18 then answers ENOTCONN (it reports the peer's flag change to
        // our port id in the pod netns, where our socket does not exist). The pod side brings it
        // up from inside the netns instead.
        .setns_by_fd(spec.netns.as_raw_fd())
        .build();
    let msg = LinkMessageBuilder::<LinkUnspec>::new_with_info_kind(InfoKind::Veth)
        .name(spec.host_name.to_owned())
        .address(spec.host_mac.to_vec())
        .mtu(spec.mtu)
        .up()
        .set_info_data(InfoData::Veth(InfoVeth::Peer(peer)))
        .build();
    let mut req = NetlinkMessage::from(RouteNetlinkMessage::NewLink(msg));
    req.header.flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL | NLM_F_ECHO;
    let mut responses = handle
        .clone()
        .request(req)
        .map_err(|e| CniError::netlink("creating the veth pair", e))?;
    let mut echoed = None;
    while let Some(msg) = responses.next().await {
        match msg.payload {
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(link)) => echoed = Some(link),
            NetlinkPayload::Error(e) if e.code.is_some() => {
                let e = rtnetlink::Error::NetlinkError(e);
                if errno(&e) == Some(Errno::EEXIST as i32) {
                    return Err(exists(handle, spec).await);
                }
                return Err(CniError::netlink(
                    format!("creating veth {} <-> {}", spec.host_name, spec.pod_name),
                    describe(&e),
                ));
            }
            _ => {}
        }
    }
    let link = match echoed {
        Some(link) => link,
        None => lookup(handle, spec.host_name).await?.ok_or_else(|| {
            CniError::netlink(
                "creating the veth pair",
                format!("{} vanished", spec.host_name),
            )
        })?,
    };
    Ok(Created {
        host_index: link.header.index,
        pod_index: link.attributes.iter().find_map(|a| match a {
            LinkAttribute::Link(i) => Some(*i),
            _ => None,
        }),
    })
}

/// EEXIST names no side: tell the caller which one is taken.
async fn exists(handle: &Handle, spec: &VethSpec<'_>) -> CniError {
    match index_of(handle, spec.host_name).await {
        Ok(Some(_)) => CniError::InterfaceExists(format!(
            "host veth {} already exists (left over from an earlier ADD of this container?)",
            spec.host_name
        )),
        _ => CniError::InterfaceExists(format!(
            "interface {} already exists in netns {}",
            spec.pod_name, spec.netns_path
        )),
    }
}

/// Index of the link called `name` in the handle's netns, `None` if there is none.
pub async fn index_of(handle: &Handle, name: &str) -> Result<Option<u32>, CniError> {
    Ok(lookup(handle, name).await?.map(|l| l.header.index))
}

async fn lookup(handle: &Handle, name: &str) -> Result<Option<LinkMessage>, CniError> {
    let mut links = handle.link().get().match_name(name.to_owned()).execute();
    match links.next().await {
        Some(Ok(link)) => Ok(Some(link)),
        Some(Err(e)) if errno(&e) == Some(Errno::ENODEV as i32) => Ok(None),
        Some(Err(e)) => Err(CniError::netlink(
            format!("looking up {name}"),
            describe(&e),
        )),
        None => Ok(None),
    }
}

/// Deletes the link called `name`; a missing link is success. Returns whether it existed.
///
/// Deleting one end of a veth deletes both, with the routes and neighbours on them.
pub async fn delete(handle: &Handle, name: &str) -> Result<bool, CniError> {
    let msg = LinkUnspec::new_with_name(name).build();
    match handle.link().del_with_message(msg).execute().await {
        Ok(()) => Ok(true),
        Err(e) if errno(&e) == Some(Errno::ENODEV as i32) => Ok(false),
        Err(e) => Err(CniError::netlink(format!("deleting {name}"), describe(&e))),
    }
}
