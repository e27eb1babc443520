//! The veth pair, created in one request with each end born in its own netns.

use super::{cause, errno};
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
use weft_api::MacAddr;

/// What to create.
#[derive(Debug, Clone)]
pub struct VethSpec {
    /// Host-side name (node netns).
    pub host_name: String,
    /// Host-side MAC.
    pub host_mac: MacAddr,
    /// Pod-side name (`CNI_IFNAME`).
    pub pod_name: String,
    /// Pod-side MAC.
    pub pod_mac: MacAddr,
    /// MTU of both ends.
    pub mtu: u32,
    /// Pod netns path, for messages.
    pub netns_path: String,
}

/// Indexes of the new pair, as far as the kernel's echo carried them.
#[derive(Debug, Clone, Copy)]
pub struct Created {
    /// Host side ifindex (node netns).
    pub host_index: Option<u32>,
    /// Pod side ifindex (pod netns).
    pub pod_index: Option<u32>,
}

/// What a creation request did. `Taken`: the kernel refused (EEXIST) and created nothing, so
/// the taken link is someone else's and must not be deleted on revert.
#[derive(Debug, Clone, Copy)]
pub enum Made {
    /// The pair is new.
    Pair(Created),
    /// A link already has that name on this side.
    Taken(Side),
}

/// A side of the pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The host end, in the node netns (an earlier incarnation of this (container, ifname)
    /// whose deletion may still be running; see [`taken`]).
    Host,
    /// The pod end, `CNI_IFNAME` in the pod netns.
    Pod,
}

/// One end of the pair as the request describes it.
struct End<'a> {
    name: &'a str,
    mac: MacAddr,
}

impl VethSpec {
    /// (host end, pod end).
    fn ends(&self) -> (End<'_>, End<'_>) {
        (
            End {
                name: &self.host_name,
                mac: self.host_mac,
            },
            End {
                name: &self.pod_name,
                mac: self.pod_mac,
            },
        )
    }
}

/// Creates the pair from the node netns, the pod end born in the pod netns, the host end up.
pub async fn create(
    handle: &Handle,
    spec: &VethSpec,
    pod_netns: BorrowedFd<'_>,
) -> Result<Made, CniError> {
    let (host, pod) = spec.ends();
    Ok(
        match new_pair(handle, spec, &host, &pod, pod_netns).await? {
            Some((local, peer)) => Made::Pair(Created {
                host_index: Some(local),
                pod_index: peer,
            }),
            None if index_of(handle, &spec.host_name).await?.is_some() => Made::Taken(Side::Host),
            None => Made::Taken(Side::Pod),
        },
    )
}

/// The same pair, created from inside the pod netns (`handle` is bound there), the host end
/// born in `node` — the pod-side thread does this while the manager allocates. The pod end is
/// up; the host end is not (see `new_pair`), the host side brings it up.
pub async fn create_from_pod(
    handle: &Handle,
    spec: &VethSpec,
    node: BorrowedFd<'_>,
) -> Result<Made, CniError> {
    let (host, pod) = spec.ends();
    Ok(match new_pair(handle, spec, &pod, &host, node).await? {
        Some((local, peer)) => Made::Pair(Created {
            host_index: peer,
            pod_index: Some(local),
        }),
        None if index_of(handle, &spec.pod_name).await?.is_some() => Made::Taken(Side::Pod),
        None => Made::Taken(Side::Host),
    })
}

/// One request: `local` in the handle's netns (up), `peer` born in `peer_netns` (creating in one
/// netns and moving the peer costs 16–20 ms more, PLATFORM.md). `Ok(None)` on EEXIST, which
/// names no side; the callers tell which. Otherwise the local index and, when the echo carried
/// `IFLA_LINK`, the peer's.
///
/// `NLM_F_ECHO` makes the kernel send the new link back: its index and `IFLA_LINK` save a
/// lookup on each side. Kernels that ignore the flag get one `RTM_GETLINK` instead.
async fn new_pair(
    handle: &Handle,
    spec: &VethSpec,
    local: &End<'_>,
    peer: &End<'_>,
    peer_netns: BorrowedFd<'_>,
) -> Result<Option<(u32, Option<u32>)>, CniError> {
    let peer_msg = LinkMessageBuilder::<LinkUnspec>::new()
        .name(peer.name.to_owned())
        .address(peer.mac.octets().to_vec())
        .mtu(spec.mtu)
        // Not `.up()`: kernel 6.18 then answers ENOTCONN (it reports the peer's flag change to
        // our port id in the peer's netns, where our socket does not exist). That end is
        // brought up from its own netns instead.
        .setns_by_fd(peer_netns.as_raw_fd())
        .build();
    let msg = LinkMessageBuilder::<LinkUnspec>::new_with_info_kind(InfoKind::Veth)
        .name(local.name.to_owned())
        .address(local.mac.octets().to_vec())
        .mtu(spec.mtu)
        .up()
        .set_info_data(InfoData::Veth(InfoVeth::Peer(peer_msg)))
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
                    return Ok(None);
                }
                return Err(CniError::netlink(
                    format!("creating veth {} <-> {}", spec.host_name, spec.pod_name),
                    cause(e),
                ));
            }
            _ => {}
        }
    }
    let link = match echoed {
        Some(link) => link,
        None => lookup(handle, local.name).await?.ok_or_else(|| {
            CniError::netlink("creating the veth pair", format!("{} vanished", local.name))
        })?,
    };
    let peer_index = link.attributes.iter().find_map(|a| match a {
        LinkAttribute::Link(i) => Some(*i),
        _ => None,
    });
    Ok(Some((link.header.index, peer_index)))
}

/// The error for a name that is taken: on the pod side at once, on the host side once nothing
/// of ours can still be deleting it.
#[must_use]
pub fn taken(spec: &VethSpec, side: Side) -> CniError {
    CniError::InterfaceExists(match side {
        Side::Pod => format!(
            "interface {} already exists in netns {}",
            spec.pod_name, spec.netns_path
        ),
        Side::Host => format!(
            "host veth {} already exists (left over from an earlier ADD of this container?)",
            spec.host_name
        ),
    })
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
        Some(Err(e)) => Err(CniError::netlink(format!("looking up {name}"), cause(e))),
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
        Err(e) => Err(CniError::netlink(format!("deleting {name}"), cause(e))),
    }
}
