//! Reading the tc filters of a host veth (`RTM_GETTFILTER` dump) with the id of the BPF
//! program each one runs, for `weftctl map verify`. aya only looks filters up by name, which
//! cannot tell an old program of the same name from the current one.

use std::fmt;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const RTM_NEWTFILTER: u16 = 44;
const RTM_GETTFILTER: u16 = 46;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_DUMP: u16 = 0x300;
const TCA_KIND: u16 = 1;
const TCA_OPTIONS: u16 = 2;
const TCA_BPF_ID: u16 = 11;
const NLA_TYPE_MASK: u16 = 0x3fff;
const NLMSG_HDR: usize = 16;
const TCMSG: usize = 20;

/// clsact hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    /// Packets the device receives (leaving the pod on a host veth).
    Ingress,
    /// Packets the device sends (entering the pod).
    Egress,
}

impl Direction {
    /// `TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_INGRESS | TC_H_MIN_EGRESS)`.
    fn parent(self) -> u32 {
        match self {
            Self::Ingress => 0xffff_fff2,
            Self::Egress => 0xffff_fff3,
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
    let len = NLMSG_HDR + TCMSG;
    let mut b = Vec::with_capacity(len);
    b.extend_from_slice(&u32::try_from(len).unwrap_or(0).to_ne_bytes());
    b.extend_from_slice(&RTM_GETTFILTER.to_ne_bytes());
    b.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    b.extend_from_slice(&seq.to_ne_bytes());
    b.extend_from_slice(&0u32.to_ne_bytes()); // pid: the kernel
    // struct tcmsg: family, pad1, pad2, ifindex, handle, parent, info.
    b.extend_from_slice(&[0u8; 4]);
    b.extend_from_slice(&ifindex.to_ne_bytes());
    b.extend_from_slice(&0u32.to_ne_bytes());
    b.extend_from_slice(&direction.parent().to_ne_bytes());
    b.extend_from_slice(&0u32.to_ne_bytes());
    b
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// Netlink attributes in `b`: (type without flags, payload).
fn attrs(b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    let mut at = 0;
    std::iter::from_fn(move || {
        let len = usize::from(u16_at(b, at)?);
        let kind = u16_at(b, at + 2)? & NLA_TYPE_MASK;
        let payload = b.get(at + 4..at + len.max(4))?;
        at += align4(len.max(4));
        Some((kind, payload))
    })
}

fn malformed(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("netlink: {what}"))
}

/// Appends the filters of one datagram of the answer to `seq`; true when the dump is done.
fn parse(mut b: &[u8], seq: u32, out: &mut Vec<Filter>) -> std::io::Result<bool> {
    while b.len() >= NLMSG_HDR {
        let len = u32_at(b, 0)
            .and_then(|l| usize::try_from(l).ok())
            .unwrap_or(0);
        if len < NLMSG_HDR || len > b.len() {
            return Err(malformed("truncated message"));
        }
        let kind = u16_at(b, 4).unwrap_or(0);
        let msg_seq = u32_at(b, 8).unwrap_or(0);
        let body = b.get(NLMSG_HDR..len).unwrap_or_default();
        b = b.get(align4(len)..).unwrap_or(&[]);
        if msg_seq != seq {
            continue;
        }
        match kind {
            NLMSG_DONE => return Ok(true),
            NLMSG_ERROR => {
                let errno = u32_at(body, 0).map_or(0, u32::cast_signed);
                if errno == 0 {
                    return Ok(true);
                }
                return Err(std::io::Error::from_raw_os_error(-errno));
            }
            RTM_NEWTFILTER if body.len() >= TCMSG => {
                let handle = u32_at(body, 8).unwrap_or(0);
                let info = u32_at(body, 16).unwrap_or(0);
                let mut filter = Filter {
                    priority: u16::try_from(info >> 16).unwrap_or(0),
                    handle,
                    kind: String::new(),
                    prog_id: None,
                };
                for (t, payload) in attrs(body.get(TCMSG..).unwrap_or_default()) {
                    match t {
                        TCA_KIND => {
                            let name = payload.split(|&c| c == 0).next().unwrap_or_default();
                            filter.kind = String::from_utf8_lossy(name).into_owned();
                        }
                        TCA_OPTIONS => {
                            filter.prog_id = attrs(payload)
                                .find(|(t, _)| *t == TCA_BPF_ID)
                                .and_then(|(_, p)| u32_at(p, 0));
                        }
                        _ => {}
                    }
                }
                // The dump also lists each priority's chain head (handle 0, no options).
                if handle != 0 {
                    out.push(filter);
                }
            }
            _ => {}
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

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
