//! The manager's record of what one policy slot holds in the kernel (the diff base of its next
//! write), packed: 12 bytes per entry in one allocation, against 25–40 bytes per entry in a
//! `BTreeMap` node (~330 000 entries in today's pod mix: docs/BENCHMARKS.md, "Manager
//! memory"). A write unpacks its one slot, diffs, and packs what reached the kernel.

use super::encode::{Encoded, PolicyBlock};
use weft_ebpf::{self as abi, PolicyKey};

/// One entry without its slot id (the shadow's key) and with a one-byte prefix length (the
/// trie's keys have 96 bits of data: the kernel refuses longer prefixes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Packed {
    identity: u32,
    dport: u16,
    direction: u8,
    proto: u8,
    prefix_len: u8,
    verdict: u8,
}

const _: () = assert!(abi::POLICY_FULL_PREFIX <= u8::MAX as u32);
const _: () = assert!(std::mem::size_of::<Packed>() == 12);

/// A slot's installed entries, in key order.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Shadow(Box<[Packed]>);

impl Shadow {
    /// Packs a slot's entries.
    pub(crate) fn pack(encoded: &Encoded) -> Self {
        Self(
            encoded
                .iter()
                .map(|(b, &verdict)| Packed {
                    identity: b.key.identity,
                    dport: b.key.dport,
                    direction: b.key.direction,
                    proto: b.key.proto,
                    // Never saturates: see `Packed`.
                    prefix_len: u8::try_from(b.prefix_len).unwrap_or(u8::MAX),
                    verdict,
                })
                .collect(),
        )
    }

    /// The entries of `slot` as they were packed.
    pub(crate) fn unpack(&self, slot: u32) -> Encoded {
        self.blocks(slot)
            .zip(self.0.iter().map(|p| p.verdict))
            .collect()
    }

    /// The keys of `slot`'s entries, in key order.
    pub(crate) fn blocks(&self, slot: u32) -> impl Iterator<Item = PolicyBlock> + '_ {
        self.0.iter().map(move |p| PolicyBlock {
            key: PolicyKey {
                policy_id: slot,
                identity: p.identity,
                direction: p.direction,
                proto: p.proto,
                dport: p.dport,
            },
            prefix_len: u32::from(p.prefix_len),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datapath::encode::encode_entries;
    use std::collections::BTreeMap;
    use weft_policy::mapstate::{Direction, PolicyEntry, Verdict};

    #[test]
    fn pack_then_unpack_gives_the_same_entries() {
        let mut entries = BTreeMap::new();
        for (i, (lo, hi)) in [(80, 80), (1000, 1999), (0, 65535), (53, 53)]
            .into_iter()
            .enumerate()
        {
            let identity = u32::try_from(i).unwrap() * 1000 + 7;
            entries.insert(
                PolicyEntry {
                    identity,
                    direction: if i % 2 == 0 {
                        Direction::Ingress
                    } else {
                        Direction::Egress
                    },
                    proto: 6,
                    port_lo: lo,
                    port_hi: hi,
                },
                if i == 3 {
                    Verdict::Deny
                } else {
                    Verdict::Allow
                },
            );
        }
        entries.insert(
            PolicyEntry {
                identity: 0,
                direction: Direction::Egress,
                proto: 0,
                port_lo: 0,
                port_hi: 65535,
            },
            Verdict::Allow,
        );
        let encoded = encode_entries(42, &entries);
        assert!(
            encoded.len() > entries.len(),
            "port ranges split into blocks"
        );
        let shadow = Shadow::pack(&encoded);
        assert_eq!(shadow.unpack(42), encoded);
        assert_eq!(Shadow::pack(&Encoded::new()).unpack(42), Encoded::new());
    }
}
