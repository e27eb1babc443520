//! Reading the tc filters of a host veth (`RTM_GETTFILTER` dump) with the id of the BPF
//! program each one runs, for re-adopt and `weftctl map verify`. aya only looks filters up by
//! name, which cannot tell an old program of the same name from the current one. The messages
//! are netlink-packet-route's; only the socket is ours, because the datapath seam is
//! synchronous (rtnetlink would need a runtime under the datapath lock).

use netlink_packet_core::{
    NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::tc::{
    TcAttribute, TcFilterBpfOption, TcHandle, TcHeader, TcMessage, TcOption,
};
use std::fmt;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

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

/// A `NETLINK_ROUTE` socket, reused for every dump.
pub(crate) struct Socket {
    fd: OwnedFd,
    seq: u32,
}

impl Socket {
    pub(crate) fn open() -> std::io::Result<Self> {
        // SAFETY: plain socket(2); the fd is owned right away.
        let raw = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: raw is a fresh fd nobody else owns.
        Ok(Self {
            fd: unsafe { OwnedFd::from_raw_fd(raw) },
            seq: 0,
        })
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
        self.seq = self.seq.wrapping_add(1);
        let req = request(self.seq, ifindex, direction);
        // SAFETY: send(2) of a buffer we own, on our socket (kernel as destination: no addr).
        let sent = unsafe { libc::send(self.fd.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) };
        if sent < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut out = Vec::new();
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            // SAFETY: recv(2) into a buffer we own, bounded by its length.
            let n =
                unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            let n = usize::try_from(n).unwrap_or(0);
            if parse(buf.get(..n).unwrap_or_default(), self.seq, &mut out)? {
                return Ok(out);
            }
        }
    }
}

fn request(seq: u32, ifindex: u32, direction: Direction) -> Vec<u8> {
    let tc = TcMessage::from_parts(
        TcHeader {
            index: i32::try_from(ifindex).unwrap_or(0),
            parent: direction.parent(),
            ..TcHeader::default()
        },
        Vec::new(),
    );
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    header.sequence_number = seq;
    let mut msg = NetlinkMessage::new(
        header,
        NetlinkPayload::InnerMessage(RouteNetlinkMessage::GetTrafficFilter(tc)),
    );
    msg.finalize();
    let mut b = vec![0u8; msg.buffer_len()];
    msg.serialize(&mut b);
    b
}

fn malformed(what: impl fmt::Display) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("netlink: {what}"))
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

/// Appends the filters of one datagram of the answer to `seq`; true when the dump is done.
fn parse(mut b: &[u8], seq: u32, out: &mut Vec<Filter>) -> std::io::Result<bool> {
    while !b.is_empty() {
        let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(b).map_err(malformed)?;
        let len = usize::try_from(msg.header.length).unwrap_or(0);
        if len == 0 {
            return Err(malformed("zero-length message"));
        }
        // Messages are 4-byte aligned within a datagram.
        b = b.get(len.next_multiple_of(4)..).unwrap_or(&[]);
        if msg.header.sequence_number != seq {
            continue;
        }
        match msg.payload {
            NetlinkPayload::Done(_) => return Ok(true),
            NetlinkPayload::Error(e) => {
                return match e.code {
                    None => Ok(true),
                    Some(_) => Err(e.to_io()),
                };
            }
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewTrafficFilter(tc)) => {
                out.extend(filter_of(&tc));
            }
            _ => {}
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    // The wire format, written out by hand so the tests check the crate's parsing too.
    const NLMSG_HDR: usize = 16;
    const NLMSG_ERROR: u16 = 2;
    const NLMSG_DONE: u16 = 3;
    const RTM_NEWTFILTER: u16 = 44;
    const TCA_KIND: u16 = 1;
    const TCA_OPTIONS: u16 = 2;
    const TCA_BPF_ID: u16 = 11;

    const fn align4(n: usize) -> usize {
        (n + 3) & !3
    }

    fn attr(kind: u16, payload: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&u16::try_from(4 + payload.len()).unwrap().to_ne_bytes());
        b.extend_from_slice(&kind.to_ne_bytes());
        b.extend_from_slice(payload);
        b.resize(align4(b.len()), 0);
        b
    }

    fn message(kind: u16, seq: u32, body: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&u32::try_from(NLMSG_HDR + body.len()).unwrap().to_ne_bytes());
        b.extend_from_slice(&kind.to_ne_bytes());
        b.extend_from_slice(&2u16.to_ne_bytes());
        b.extend_from_slice(&seq.to_ne_bytes());
        b.extend_from_slice(&0u32.to_ne_bytes());
        b.extend_from_slice(body);
        b.resize(align4(b.len()), 0);
        b
    }

    fn filter(handle: u32, pref: u16, prog: Option<u32>) -> Vec<u8> {
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
        message(RTM_NEWTFILTER, 5, &body)
    }

    #[test]
    fn a_dump_yields_each_filter_with_its_program_id() {
        let mut b = filter(0, 1, None); // chain head
        b.extend(filter(1, 1, Some(4242)));
        b.extend(filter(2, 9, Some(7)));
        let mut out = Vec::new();
        assert!(!parse(&b, 5, &mut out).unwrap(), "no DONE yet");
        assert_eq!(
            out,
            vec![
                Filter {
                    priority: 1,
                    handle: 1,
                    kind: "bpf".into(),
                    prog_id: Some(4242)
                },
                Filter {
                    priority: 9,
                    handle: 2,
                    kind: "bpf".into(),
                    prog_id: Some(7)
                },
            ]
        );
        assert!(parse(&message(NLMSG_DONE, 5, &[0; 4]), 5, &mut out).unwrap());
    }

    #[test]
    fn the_request_is_a_dump_of_one_clsact_hook() {
        let b = request(9, 7, Direction::Egress);
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

    #[test]
    fn errors_and_other_sequences() {
        let mut out = Vec::new();
        let err = parse(
            &message(NLMSG_ERROR, 5, &(-19i32).to_ne_bytes()),
            5,
            &mut out,
        )
        .unwrap_err();
        assert_eq!(err.raw_os_error(), Some(19));
        // A late answer to an earlier request is skipped.
        assert!(!parse(&filter(1, 1, Some(1)), 4, &mut out).unwrap());
        assert!(out.is_empty());
        let mut cut = filter(1, 1, Some(1));
        cut.truncate(30);
        cut[0] = 200;
        assert!(parse(&cut, 5, &mut out).is_err());
    }
}
