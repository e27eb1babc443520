//! The manager's record of what one policy slot holds in the kernel (the diff base of its next
//! write), delta-encoded: each entry is stored as what changed from the one before it in key
//! order. A slot's entries are one identity's ports after another, so most entries are a flag
//! byte and a one-byte port step: ~2 bytes each, against 12 packed and 25–40 in a `BTreeMap` node
//! (~330 000 entries in today's pod mix: docs/BENCHMARKS.md, "Manager memory"). A write
//! decodes its one slot, diffs, and encodes what reached the kernel.

use super::encode::{Encoded, PolicyBlock};
use std::collections::BTreeMap;
use weft_ebpf::{self as abi, PolicyKey, PolicyValue};

/// One entry without its slot id (the shadow's key) and with a one-byte prefix length (the
/// trie's keys have 96 bits of data: the kernel refuses longer prefixes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Entry {
    identity: u32,
    dport: u16,
    /// A tier entry's priority (0 in the `NetworkPolicy` layer).
    priority: u16,
    /// direction, proto, prefix length, verdict, rule: in the order of [`BYTE_FLAGS`].
    bytes: [u8; 5],
}

const _: () = assert!(abi::POLICY_FULL_PREFIX <= u8::MAX as u32);

// The flag byte: which fields differ from the previous entry (the first is compared with
// all zeros). The port step always follows, as a varint. NetworkPolicy entries never change
// rule or priority (both 0): tiers cost nothing where there are none.
const IDENTITY: u8 = 1;
const BYTE_FLAGS: [u8; 5] = [2, 4, 8, 16, 32];
const PRIORITY: u8 = 64;

/// A slot's installed entries, in key order.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Shadow(Box<[u8]>);

impl Shadow {
    /// Encodes a slot's entries.
    pub(crate) fn pack(encoded: &Encoded) -> Self {
        Self::pack_sorted(encoded.iter().map(|(b, v)| (*b, *v)), encoded.len())
    }

    /// Encodes entries given in key order (`hint`: about how many).
    fn pack_sorted(entries: impl Iterator<Item = (PolicyBlock, PolicyValue)>, hint: usize) -> Self {
        let mut out = Vec::with_capacity(hint * 4);
        let mut prev = Entry::default();
        for (b, v) in entries {
            let e = Entry {
                identity: b.key.identity,
                dport: b.key.dport,
                priority: v.priority,
                // Never saturates: see `Entry`.
                bytes: [
                    b.key.direction,
                    b.key.proto,
                    u8::try_from(b.prefix_len).unwrap_or(u8::MAX),
                    v.verdict,
                    v.rule,
                ],
            };
            let changed = BYTE_FLAGS.iter().zip(e.bytes).zip(prev.bytes);
            let mut flags = if e.identity == prev.identity {
                0
            } else {
                IDENTITY
            };
            if e.priority != prev.priority {
                flags |= PRIORITY;
            }
            for ((flag, now), before) in changed.clone() {
                if now != before {
                    flags |= flag;
                }
            }
            out.push(flags);
            if flags & IDENTITY != 0 {
                // Keys ascend, so the step is small; wrapping keeps any order exact.
                put_varint(&mut out, e.identity.wrapping_sub(prev.identity));
            }
            out.extend(
                changed
                    .filter(|&((flag, _), _)| flags & flag != 0)
                    .map(|((_, now), _)| now),
            );
            if flags & PRIORITY != 0 {
                out.extend(e.priority.to_le_bytes());
            }
            // Ports are in network byte order: the next port's step is in the high byte.
            put_varint(
                &mut out,
                u32::from(e.dport.wrapping_sub(prev.dport).swap_bytes()),
            );
            prev = e;
        }
        Self(out.into_boxed_slice())
    }

    /// The entries of `slot` as they were packed.
    pub(crate) fn unpack(&self, slot: u32) -> Encoded {
        self.iter(slot).collect()
    }

    /// The entries of `slot`, in key order, without building a map.
    pub(crate) fn iter(&self, slot: u32) -> impl Iterator<Item = (PolicyBlock, PolicyValue)> + '_ {
        self.entries().map(move |e| {
            let [.., verdict, rule] = e.bytes;
            let value = PolicyValue {
                verdict,
                rule,
                priority: e.priority,
            };
            (block(slot, &e), value)
        })
    }

    /// These entries with `changes` applied (`Some`: the entry's new value, `None`: removed),
    /// in one pass over both: a write changing a few entries of a large slot never decodes the
    /// slot into a map (docs/BENCHMARKS.md, "one-rule change").
    pub(crate) fn merged(
        &self,
        slot: u32,
        changes: &BTreeMap<PolicyBlock, Option<PolicyValue>>,
    ) -> Self {
        self.merged_with(slot, changes, |_| {})
    }

    /// [`Self::merged`], showing `each` every entry of the result in key order.
    pub(crate) fn merged_with(
        &self,
        slot: u32,
        changes: &BTreeMap<PolicyBlock, Option<PolicyValue>>,
        each: impl FnMut(&(PolicyBlock, PolicyValue)),
    ) -> Self {
        let mut base = self.iter(slot).peekable();
        let mut changes = changes.iter().peekable();
        let merged = std::iter::from_fn(move || {
            loop {
                let Some(&(&key, &change)) = changes.peek() else {
                    return base.next();
                };
                match base.peek() {
                    Some((b, _)) if *b < key => return base.next(),
                    Some((b, _)) if *b == key => {
                        base.next();
                    }
                    _ => {}
                }
                changes.next();
                if let Some(verdict) = change {
                    return Some((key, verdict));
                }
            }
        });
        Self::pack_sorted(merged.inspect(each), self.0.len() / 2)
    }

    /// The keys of `slot`'s entries, in key order.
    pub(crate) fn blocks(&self, slot: u32) -> impl Iterator<Item = PolicyBlock> + '_ {
        self.iter(slot).map(|(b, _)| b)
    }

    fn entries(&self) -> impl Iterator<Item = Entry> + '_ {
        let mut bytes = self.0.iter().copied();
        let mut prev = Entry::default();
        std::iter::from_fn(move || {
            let flags = bytes.next()?;
            let mut e = prev;
            if flags & IDENTITY != 0 {
                e.identity = prev.identity.wrapping_add(get_varint(&mut bytes));
            }
            for (flag, field) in BYTE_FLAGS.iter().zip(&mut e.bytes) {
                if flags & flag != 0 {
                    *field = bytes.next().unwrap_or_default();
                }
            }
            if flags & PRIORITY != 0 {
                let lo = bytes.next().unwrap_or_default();
                let hi = bytes.next().unwrap_or_default();
                e.priority = u16::from_le_bytes([lo, hi]);
            }
            // The step was a u16: truncating gives it back.
            #[allow(clippy::cast_possible_truncation)]
            let step = (get_varint(&mut bytes) as u16).swap_bytes();
            e.dport = prev.dport.wrapping_add(step);
            prev = e;
            Some(e)
        })
    }
}

fn block(slot: u32, e: &Entry) -> PolicyBlock {
    let [direction, proto, prefix_len, ..] = e.bytes;
    PolicyBlock {
        key: PolicyKey {
            policy_id: slot,
            identity: e.identity,
            direction,
            proto,
            dport: e.dport,
        },
        prefix_len: u32::from(prefix_len),
    }
}

/// LEB128: seven bits a byte, low first, the high bit set on all but the last.
fn put_varint(out: &mut Vec<u8>, mut v: u32) {
    while v >= 0x80 {
        // Masked to seven bits: the cast keeps them.
        #[allow(clippy::cast_possible_truncation)]
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    #[allow(clippy::cast_possible_truncation)]
    out.push(v as u8);
}

fn get_varint(bytes: &mut impl Iterator<Item = u8>) -> u32 {
    let mut v = 0u32;
    let mut shift = 0;
    for b in bytes.by_ref() {
        v |= u32::from(b & 0x7f).wrapping_shl(shift);
        if b & 0x80 == 0 {
            break;
        }
        shift += 7;
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datapath::encode::encode_entries;
    use std::collections::BTreeMap;
    use weft_policy::mapstate::{Direction, PolicyEntry, Tier, TierAction, TierVerdict, Verdict};

    fn v(verdict: u8) -> PolicyValue {
        PolicyValue::verdict(verdict)
    }

    #[test]
    fn pack_then_unpack_gives_the_same_entries() {
        let mut entries = BTreeMap::new();
        for (i, (lo, hi)) in [(80, 80), (1000, 1999), (0, 65535), (53, 53)]
            .into_iter()
            .enumerate()
        {
            let identity = u32::try_from(i).unwrap() * 1000 + 7;
            let direction = if i % 2 == 0 {
                Direction::Ingress
            } else {
                Direction::Egress
            };
            entries.insert(
                PolicyEntry::new(direction, identity, 6, lo, hi),
                if i == 3 {
                    Verdict::Deny
                } else {
                    Verdict::Allow
                },
            );
        }
        entries.insert(
            PolicyEntry::new(Direction::Egress, 0, 0, 0, 65535),
            Verdict::Allow,
        );
        // Tier entries: their action and precedence come back too.
        for (n, (tier, identity, lo, hi)) in [
            (Tier::Admin, 7, 80, 80),
            (Tier::Admin, 7, 81, 90),
            (Tier::Baseline, 0, 0, 65535),
            (Tier::Admin, 2007, 443, 443),
        ]
        .into_iter()
        .enumerate()
        {
            let n = u8::try_from(n).unwrap();
            let action =
                [TierAction::Deny, TierAction::Pass, TierAction::Accept][usize::from(n % 3)];
            entries.insert(
                PolicyEntry::new(Direction::Ingress, identity, 6, lo, hi).in_tier(tier),
                Verdict::Tier(TierVerdict {
                    priority: 1000 - u16::from(n) * 300,
                    rule: n * 7,
                    action,
                }),
            );
        }
        let encoded = encode_entries(42, &entries);
        assert!(
            encoded.len() > entries.len(),
            "port ranges split into blocks"
        );
        let shadow = Shadow::pack(&encoded);
        assert_eq!(shadow.unpack(42), encoded);
        assert_eq!(Shadow::pack(&Encoded::new()).unpack(42), Encoded::new());
    }

    fn raw(identity: u32, direction: u8, proto: u8, dport: u16, prefix_len: u32) -> PolicyBlock {
        PolicyBlock {
            key: PolicyKey {
                policy_id: 9,
                identity,
                direction,
                proto,
                dport,
            },
            prefix_len,
        }
    }

    /// An allowed ingress TCP entry per identity and port.
    fn ports_of(identities: [u32; 3], ports: std::ops::Range<u16>) -> Encoded {
        identities
            .into_iter()
            .flat_map(|identity| ports.clone().map(move |port| (identity, port)))
            .map(|(identity, port)| {
                (
                    raw(identity, 0, 6, port.to_be(), abi::POLICY_FULL_PREFIX),
                    v(1),
                )
            })
            .collect()
    }

    #[test]
    fn extreme_fields_come_back_exactly() {
        let mut encoded = Encoded::new();
        for (i, (identity, dport)) in [
            (0, 0),
            (0, u16::MAX),
            (1, 1),
            (0x7f, 0x80),
            (0x3fff, 0x4000),
            (u32::MAX - 1, 0x8000),
            (u32::MAX, u16::MAX),
        ]
        .into_iter()
        .enumerate()
        {
            let i = u8::try_from(i).unwrap();
            let value = PolicyValue {
                verdict: i,
                rule: 255 - i,
                priority: u16::MAX - u16::from(i) * 0x1111,
            };
            encoded.insert(raw(identity, i % 2, 6 + i, dport, 72 + u32::from(i)), value);
        }
        let shadow = Shadow::pack(&encoded);
        assert_eq!(shadow.unpack(9), encoded);
        assert_eq!(
            shadow.blocks(9).collect::<Vec<_>>(),
            encoded.keys().copied().collect::<Vec<_>>()
        );
    }

    #[test]
    fn one_identitys_ports_cost_about_two_bytes_each() {
        let encoded = ports_of([256, 300, 70_000], 8000..8100);
        let shadow = Shadow::pack(&encoded);
        assert_eq!(shadow.unpack(9), encoded);
        assert!(
            shadow.0.len() <= encoded.len() * 2 + 20,
            "{} bytes",
            shadow.0.len()
        );
    }

    #[test]
    fn a_merge_equals_decoding_changing_and_encoding_again() {
        let encoded = ports_of([256, 300, 70_000], 8000..8050);
        let shadow = Shadow::pack(&encoded);
        let mut changes = BTreeMap::new();
        // A changed verdict, removals (first, middle and last entries), inserts before the
        // first, between two and after the last entry, and a removal of what is not there.
        changes.insert(
            raw(256, 0, 6, 8000u16.to_be(), abi::POLICY_FULL_PREFIX),
            Some(v(2)),
        );
        changes.insert(
            raw(256, 0, 6, 8001u16.to_be(), abi::POLICY_FULL_PREFIX),
            None,
        );
        changes.insert(
            raw(300, 0, 6, 8010u16.to_be(), abi::POLICY_FULL_PREFIX),
            None,
        );
        changes.insert(
            raw(70_000, 0, 6, 8049u16.to_be(), abi::POLICY_FULL_PREFIX),
            None,
        );
        changes.insert(
            raw(1, 1, 17, 53u16.to_be(), abi::POLICY_FULL_PREFIX),
            Some(v(1)),
        );
        changes.insert(raw(300, 1, 6, 0, 80), Some(v(2)));
        let tiered = PolicyValue {
            verdict: abi::VERDICT_TIER_PASS,
            rule: 3,
            priority: 999,
        };
        changes.insert(raw(300, 0x11, 6, 0, 80), Some(tiered));
        changes.insert(raw(u32::MAX, 1, 6, 0, 72), Some(v(1)));
        changes.insert(raw(5000, 0, 6, 0, 72), None);
        let mut expected = encoded.clone();
        for (block, change) in &changes {
            match change {
                Some(verdict) => {
                    expected.insert(*block, *verdict);
                }
                None => {
                    expected.remove(block);
                }
            }
        }
        let merged = shadow.merged(9, &changes);
        assert_eq!(merged.unpack(9), expected);
        assert_eq!(merged, Shadow::pack(&expected));
        assert_eq!(
            Shadow::default().merged(9, &changes).unpack(9),
            changes
                .iter()
                .filter_map(|(b, v)| v.map(|v| (*b, v)))
                .collect::<Encoded>()
        );
        assert_eq!(shadow.merged(9, &BTreeMap::new()), shadow);
    }
}
