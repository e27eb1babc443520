//! Reading the tc filters of a host veth (`RTM_GETTFILTER` dump) with the id of the BPF
//! program each one runs, for re-adopt and `weftctl map verify`. aya only looks filters up by
//! name, which cannot tell an old program of the same name from the current one. The dump goes
//! through the synchronous socket of `crate::sys::netlink_sync`: the datapath seam is synchronous
//! (rtnetlink would need a runtime under the datapath lock).

use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::tc::{
    TcAttribute, TcFilterBpfOption, TcHandle, TcHeader, TcMessage, TcOption,
};
use std::fmt;

use crate::sys::netlink_sync::RouteSocket;

/// clsact hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    /// Packets the device receives (leaving the pod on a host veth).
    Ingress,
    /// Packets the device sends (entering the pod).
    Egress,
}

impl Direction {
    /// The clsact hook's parent handle (`TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_*)`).
    fn parent(self) -> TcHandle {
        TcHandle {
            major: TcHandle::CLSACT.major,
            minor: match self {
                Self::Ingress => TcHandle::MIN_INGRESS,
                Self::Egress => TcHandle::MIN_EGRESS,
            },
        }
    }
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Ingress => "ingress",
            Self::Egress => "egress",
        })
    }
}

/// One filter as the kernel lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Filter {
    /// tc priority (`pref`).
    pub(crate) priority: u16,
    /// Filter handle.
    pub(crate) handle: u32,
    /// Classifier kind (`bpf` for ours).
    pub(crate) kind: String,
    /// The BPF program's id (`cls_bpf` only).
    pub(crate) prog_id: Option<u32>,
}

/// The filter dumps of one datapath, on one reused socket.
pub(crate) struct Socket(RouteSocket);

impl Socket {
    pub(crate) fn open() -> std::io::Result<Self> {
        RouteSocket::open().map(Self)
    }

    /// What is wrong with Weft's filters on `ifindex` (pref 1, handle 1 on ingress and egress
    /// running `want` = [from-pod id, to-pod id]), one line per direction; empty when right.
    pub(crate) fn wrong(&mut self, ifindex: u32, want: [u32; 2]) -> std::io::Result<Vec<String>> {
        let mut out = Vec::new();
        for (direction, want) in [(Direction::Ingress, want[0]), (Direction::Egress, want[1])] {
            let filters = self.dump(ifindex, direction)?;
            let ours = filters
                .iter()
                .find(|f| f.priority == super::attach::PRIORITY && f.handle == 1);
            match ours.and_then(|f| f.prog_id) {
                Some(id) if id == want => {}
                found => out.push(format!(
                    "{direction}: Weft's filter (pref {}, handle 1) runs program {found:?}, not {want} (filters there: {filters:?})",
                    super::attach::PRIORITY
                )),
            }
        }
        Ok(out)
    }

    /// Every filter on `ifindex`'s clsact `direction`.
    pub(crate) fn dump(
        &mut self,
        ifindex: u32,
        direction: Direction,
    ) -> std::io::Result<Vec<Filter>> {
        let answer = self.0.dump(request(ifindex, direction))?;
        Ok(answer
            .iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewTrafficFilter(tc) => filter_of(tc),
                _ => None,
            })
            .collect())
    }
}

fn request(ifindex: u32, direction: Direction) -> RouteNetlinkMessage {
    RouteNetlinkMessage::GetTrafficFilter(TcMessage::from_parts(
        TcHeader {
            index: i32::try_from(ifindex).unwrap_or(0),
            parent: direction.parent(),
            ..TcHeader::default()
        },
        Vec::new(),
    ))
}

/// One listed filter, or `None` for a priority's chain head (handle 0, no options), which the
/// dump lists beside the filters.
fn filter_of(tc: &TcMessage) -> Option<Filter> {
    let handle = u32::from(tc.header.handle);
    if handle == 0 {
        return None;
    }
    let mut filter = Filter {
        priority: u16::try_from(tc.header.info >> 16).unwrap_or(0),
        handle,
        kind: String::new(),
        prog_id: None,
    };
    for attr in &tc.attributes {
        match attr {
            TcAttribute::Kind(kind) => filter.kind.clone_from(kind),
            TcAttribute::Options(options) => {
                filter.prog_id = options.iter().find_map(|o| match o {
                    TcOption::Bpf(TcFilterBpfOption::ProgId(id)) => Some(*id),
                    _ => None,
                });
            }
            _ => {}
        }
    }
    Some(filter)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::netlink_sync::tests::{NLMSG_HDR, align4, message};
    use netlink_packet_core::NetlinkMessage;

    const RTM_NEWTFILTER: u16 = 44;
    const TCA_KIND: u16 = 1;
    const TCA_OPTIONS: u16 = 2;
    const TCA_BPF_ID: u16 = 11;

    fn attr(kind: u16, payload: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&u16::try_from(4 + payload.len()).unwrap().to_ne_bytes());
        b.extend_from_slice(&kind.to_ne_bytes());
        b.extend_from_slice(payload);
        b.resize(align4(b.len()), 0);
        b
    }

    fn filter(handle: u32, pref: u16, prog: Option<u32>) -> Option<Filter> {
        let mut body = vec![0u8; 4];
        body.extend_from_slice(&7u32.to_ne_bytes());
        body.extend_from_slice(&handle.to_ne_bytes());
        body.extend_from_slice(&0xffff_fff2u32.to_ne_bytes());
        body.extend_from_slice(&((u32::from(pref) << 16) | 0x0300).to_ne_bytes());
        body.extend(attr(TCA_KIND, b"bpf\0"));
        if let Some(id) = prog {
            let mut opts = attr(7, b"weft_from_pod\0"); // TCA_BPF_NAME
            opts.extend(attr(TCA_BPF_ID, &id.to_ne_bytes()));
            body.extend(attr(TCA_OPTIONS | 0x8000, &opts));
        }
        let b = message(RTM_NEWTFILTER, 5, &body);
        match NetlinkMessage::<RouteNetlinkMessage>::deserialize(&b)
            .unwrap()
            .payload
        {
            netlink_packet_core::NetlinkPayload::InnerMessage(
                RouteNetlinkMessage::NewTrafficFilter(tc),
            ) => filter_of(&tc),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_listed_filter_carries_its_program_id_and_chain_heads_are_skipped() {
        assert_eq!(filter(0, 1, None), None, "chain head");
        assert_eq!(
            filter(1, 1, Some(4242)),
            Some(Filter {
                priority: 1,
                handle: 1,
                kind: "bpf".into(),
                prog_id: Some(4242)
            })
        );
        assert_eq!(
            filter(2, 9, Some(7)),
            Some(Filter {
                priority: 9,
                handle: 2,
                kind: "bpf".into(),
                prog_id: Some(7)
            })
        );
    }

    #[test]
    fn the_request_is_a_dump_of_one_clsact_hook() {
        let b = crate::sys::netlink_sync::encode(
            request(7, Direction::Egress),
            netlink_packet_core::NLM_F_REQUEST | netlink_packet_core::NLM_F_DUMP,
            9,
        );
        let u16_at = |at: usize| u16::from_ne_bytes([b[at], b[at + 1]]);
        let u32_at = |at: usize| u32::from_ne_bytes(b[at..at + 4].try_into().unwrap());
        assert_eq!(b.len(), NLMSG_HDR + 20);
        assert_eq!(u32_at(0) as usize, b.len());
        assert_eq!(u16_at(4), 46, "RTM_GETTFILTER");
        assert_eq!(u16_at(6), 0x301, "NLM_F_REQUEST | NLM_F_DUMP");
        assert_eq!(u32_at(8), 9);
        assert_eq!(u32_at(NLMSG_HDR + 4), 7, "ifindex");
        assert_eq!(u32_at(NLMSG_HDR + 12), 0xffff_fff3, "clsact egress");
    }
}
