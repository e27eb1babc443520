//! The one synchronous `NETLINK_ROUTE` socket (netlink-sys), for the callers that must not need
//! a runtime: the datapath seam is synchronous (its tc filter dumps run under the datapath lock),
//! and a veth's deletion blocks its sender for ~20 ms in the kernel, so it runs on a blocking
//! thread with a socket of its own. The messages are netlink-packet-route's; this file only
//! sends a request and collects its answer.

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};
use std::io;

/// The largest datagram the kernel sends a dump in (`netlink_dump` caps its skb at 32 KiB).
const DATAGRAM: usize = 32 * 1024;

/// A `NETLINK_ROUTE` socket in the netns of the thread that opened it, reused across requests.
pub(crate) struct RouteSocket {
    socket: Socket,
    seq: u32,
    buf: Vec<u8>,
}

impl RouteSocket {
    pub(crate) fn open() -> io::Result<Self> {
        let mut socket = Socket::new(NETLINK_ROUTE)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        Ok(Self {
            socket,
            seq: 0,
            buf: Vec::with_capacity(DATAGRAM),
        })
    }

    /// Every message of the answer to a dump of `msg`.
    pub(crate) fn dump(
        &mut self,
        msg: RouteNetlinkMessage,
    ) -> io::Result<Vec<RouteNetlinkMessage>> {
        self.request(msg, NLM_F_REQUEST | NLM_F_DUMP)
    }

    /// Sends `msg` asking for an acknowledgement; the kernel's refusal is the error, with its
    /// errno (`raw_os_error`).
    pub(crate) fn ack(&mut self, msg: RouteNetlinkMessage) -> io::Result<()> {
        self.request(msg, NLM_F_REQUEST | NLM_F_ACK).map(drop)
    }

    fn request(
        &mut self,
        msg: RouteNetlinkMessage,
        flags: u16,
    ) -> io::Result<Vec<RouteNetlinkMessage>> {
        self.seq = self.seq.wrapping_add(1);
        self.socket.send(&encode(msg, flags, self.seq), 0)?;
        let mut out = Vec::new();
        loop {
            self.buf.clear();
            match self.socket.recv(&mut self.buf, 0) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            if parse(&self.buf, self.seq, &mut out)? {
                return Ok(out);
            }
        }
    }
}

/// `msg` as one netlink datagram with `flags` and sequence number `seq`.
pub(crate) fn encode(msg: RouteNetlinkMessage, flags: u16, seq: u32) -> Vec<u8> {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    header.sequence_number = seq;
    let mut msg = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(msg));
    msg.finalize();
    let mut b = vec![0u8; msg.buffer_len()];
    msg.serialize(&mut b);
    b
}

fn malformed(what: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("netlink: {what}"))
}

/// Appends the messages of one datagram of the answer to `seq` to `out`; true when the answer
/// is complete (`NLMSG_DONE`, or the acknowledgement). A kernel refusal is its errno.
fn parse(mut b: &[u8], seq: u32, out: &mut Vec<RouteNetlinkMessage>) -> io::Result<bool> {
    while !b.is_empty() {
        let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(b).map_err(malformed)?;
        let len = usize::try_from(msg.header.length).unwrap_or(0);
        if len == 0 {
            return Err(malformed("zero-length message"));
        }
        // Messages are 4-byte aligned within a datagram.
        b = b.get(len.next_multiple_of(4)..).unwrap_or(&[]);
        if msg.header.sequence_number != seq {
            continue; // a late answer to an earlier request
        }
        match msg.payload {
            NetlinkPayload::Done(_) => return Ok(true),
            NetlinkPayload::Error(e) => {
                return match e.code {
                    None => Ok(true),
                    Some(_) => Err(e.to_io()),
                };
            }
            NetlinkPayload::InnerMessage(m) => out.push(m),
            _ => {}
        }
    }
    Ok(false)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    // The wire format, written out by hand so the tests check the crate's parsing too.
    pub(crate) const NLMSG_HDR: usize = 16;
    const NLMSG_ERROR: u16 = 2;
    const NLMSG_DONE: u16 = 3;
    const RTM_NEWLINK: u16 = 16;

    pub(crate) const fn align4(n: usize) -> usize {
        (n + 3) & !3
    }

    pub(crate) fn message(kind: u16, seq: u32, body: &[u8]) -> Vec<u8> {
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

    fn link(index: u32) -> Vec<u8> {
        let mut body = vec![0u8; 4];
        body.extend_from_slice(&index.to_ne_bytes());
        body.extend_from_slice(&[0; 8]);
        message(RTM_NEWLINK, 5, &body)
    }

    #[test]
    fn a_dump_collects_its_messages_until_done() {
        let mut b = link(3);
        b.extend(link(4));
        let mut out = Vec::new();
        assert!(!parse(&b, 5, &mut out).unwrap(), "no DONE yet");
        let indexes: Vec<u32> = out
            .iter()
            .map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => l.header.index,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(indexes, [3, 4]);
        assert!(parse(&message(NLMSG_DONE, 5, &[0; 4]), 5, &mut out).unwrap());
    }

    #[test]
    fn an_ack_ends_the_answer_and_a_refusal_is_its_errno() {
        let mut out = Vec::new();
        assert!(parse(&message(NLMSG_ERROR, 5, &[0; 20]), 5, &mut out).unwrap());
        let err = parse(
            &message(NLMSG_ERROR, 5, &(-19i32).to_ne_bytes()),
            5,
            &mut out,
        )
        .unwrap_err();
        assert_eq!(err.raw_os_error(), Some(19));
    }

    #[test]
    fn other_sequences_are_skipped_and_garbage_is_refused() {
        let mut out = Vec::new();
        assert!(!parse(&link(1), 4, &mut out).unwrap());
        assert!(out.is_empty());
        let mut cut = link(1);
        cut.truncate(30);
        cut[0] = 200;
        assert!(parse(&cut, 5, &mut out).is_err());
    }

    #[test]
    fn a_request_is_one_datagram_with_its_flags_and_sequence() {
        let msg = RouteNetlinkMessage::GetLink(netlink_packet_route::link::LinkMessage::default());
        let b = encode(msg, NLM_F_REQUEST | NLM_F_DUMP, 9);
        let u16_at = |at: usize| u16::from_ne_bytes([b[at], b[at + 1]]);
        let u32_at = |at: usize| u32::from_ne_bytes(b[at..at + 4].try_into().unwrap());
        assert_eq!(u32_at(0) as usize, b.len());
        assert_eq!(u16_at(4), 18, "RTM_GETLINK");
        assert_eq!(u16_at(6), 0x301, "NLM_F_REQUEST | NLM_F_DUMP");
        assert_eq!(u32_at(8), 9);
    }
}
