//! The policy map encoding: for any entries, a lookup in the encoded LPM blocks gives the
//! verdict of the entries themselves (deny wins; exact identity or identity 0).
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::collections::BTreeMap;
use weft_manager::datapath::{encode_entries, lookup_encoded};
use weft_policy::mapstate::{Direction, PolicyEntry, Verdict};

fn naive(
    entries: &BTreeMap<PolicyEntry, Verdict>,
    identity: u32,
    d: Direction,
    proto: u8,
    port: u16,
) -> Option<Verdict> {
    let mut out = None;
    for (e, v) in entries {
        if e.matches(d, identity, proto, port) {
            if *v == Verdict::Deny {
                return Some(Verdict::Deny);
            }
            out = Some(Verdict::Allow);
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let mut entries = BTreeMap::new();
    for c in data.chunks_exact(7).take(64) {
        let proto = [0u8, 6, 17][usize::from(c[1] % 3)];
        let (a, b) = (
            u16::from_be_bytes([c[2], c[3]]),
            u16::from_be_bytes([c[4], c[5]]),
        );
        let (lo, hi) = if proto == 0 {
            (0, 65535)
        } else {
            (a.min(b), a.max(b))
        };
        let entry = PolicyEntry {
            direction: if c[0] & 1 == 0 {
                Direction::Ingress
            } else {
                Direction::Egress
            },
            identity: u32::from(c[0] >> 5),
            proto,
            port_lo: lo,
            port_hi: hi,
        };
        entries.insert(
            entry,
            if c[6] & 1 == 0 {
                Verdict::Allow
            } else {
                Verdict::Deny
            },
        );
    }
    let encoded = encode_entries(1, &entries);
    for c in data.chunks_exact(4).take(32) {
        let d = if c[0] & 1 == 0 {
            Direction::Ingress
        } else {
            Direction::Egress
        };
        let identity = u32::from(c[0] >> 5);
        let proto = [6u8, 17][usize::from(c[1] & 1)];
        let port = u16::from_be_bytes([c[2], c[3]]);
        assert_eq!(
            lookup_encoded(&encoded, identity, d, proto, port),
            naive(&entries, identity, d, proto, port),
            "identity {identity} {d:?} proto {proto} port {port}"
        );
    }
});
