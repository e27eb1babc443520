//! The manager's record of what one policy slot holds in the kernel (the diff base of its next
//! write), delta-encoded: each entry is stored as what changed from the one before it in key
//! order. A slot's entries are one identity's ports after another, so most entries are a flag
//! byte and a one-byte port step: ~2 bytes each, against 12 packed and 25–40 in a `BTreeMap` node
//! (~330 000 entries in today's pod mix: docs/BENCHMARKS.md, "Manager memory").
//!
//! The entries of one identity are a run that starts from a zeroed entry of that identity, and
//! the shadow keeps, per run, its identity, where its bytes end and its digest: a write of some
//! identities' entries (a one-rule change) decodes and re-encodes those runs only, copies the
//! others' bytes, and digests the slot from the runs' digests.

#[cfg(test)]
use super::encode::{Encoded, pairs};
use super::encode::{PolicyBlock, RunDigest, slot_digest};
use std::collections::BTreeSet;
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

// The flag byte: which fields differ from the previous entry of the run (the first is compared
// with a zeroed entry of the run's identity). The port step always follows, as a varint.
// NetworkPolicy entries never change rule or priority (both 0): tiers cost nothing where there
// are none.
const BYTE_FLAGS: [u8; 5] = [2, 4, 8, 16, 32];
const PRIORITY: u8 = 64;

/// One identity's entries in a shadow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    identity: u32,
    /// Where its bytes end (they start where the run before ends).
    end: u32,
    /// The digest of its entries ([`RunDigest`]).
    digest: u64,
}

/// A slot's installed entries, in key order.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Shadow {
    bytes: Box<[u8]>,
    runs: Box<[Run]>,
}

/// Builds a shadow run by run from entries in key order.
struct Packer<'a> {
    out: &'a mut Vec<u8>,
    runs: Vec<Run>,
    /// The open run's digest, and the entry before the next one.
    open: Option<(RunDigest, Entry)>,
}

impl<'a> Packer<'a> {
    fn new(scratch: &'a mut Vec<u8>, runs: usize) -> Self {
        scratch.clear();
        Self {
            out: scratch,
            runs: Vec::with_capacity(runs),
            open: None,
        }
    }

    fn push(&mut self, (b, v): (PolicyBlock, PolicyValue)) {
        let identity = b.key.identity;
        if self
            .open
            .as_ref()
            .is_some_and(|(_, prev)| prev.identity != identity)
        {
            self.close();
        }
        let (digest, prev) = self.open.get_or_insert_with(|| {
            let start = Entry {
                identity,
                ..Entry::default()
            };
            (RunDigest::new(), start)
        });
        digest.add(&b, v);
        let e = Entry {
            identity,
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
        // The flag byte first, set once the fields that follow it are known.
        let at = self.out.len();
        self.out.push(0);
        let mut flags = 0;
        for ((flag, now), before) in BYTE_FLAGS.iter().zip(e.bytes).zip(prev.bytes) {
            if now != before {
                flags |= flag;
                self.out.push(now);
            }
        }
        if e.priority != prev.priority {
            flags |= PRIORITY;
            self.out.extend(e.priority.to_le_bytes());
        }
        if let Some(byte) = self.out.get_mut(at) {
            *byte = flags;
        }
        // Ports are in network byte order: the next port's step is in the high byte.
        put_varint(
            self.out,
            u32::from(e.dport.wrapping_sub(prev.dport).swap_bytes()),
        );
        *prev = e;
    }

    /// Copies a run of another shadow (with its bytes) as it is.
    fn copy(&mut self, run: &Run, bytes: &[u8]) {
        self.close();
        self.out.extend_from_slice(bytes);
        self.runs.push(Run {
            end: self.end(),
            ..*run
        });
    }

    fn end(&self) -> u32 {
        // A slot's shadow is far below 4 GiB (the maps hold at most their max_entries).
        u32::try_from(self.out.len()).unwrap_or(u32::MAX)
    }

    fn close(&mut self) {
        if let Some((digest, prev)) = self.open.take() {
            self.runs.push(Run {
                identity: prev.identity,
                end: self.end(),
                digest: digest.finish(),
            });
        }
    }

    /// The shadow: an exact copy of the buffer's bytes.
    fn finish(mut self) -> Shadow {
        self.close();
        Shadow {
            bytes: Box::from(self.out.as_slice()),
            runs: self.runs.into_boxed_slice(),
        }
    }
}

impl Shadow {
    /// Encodes a slot's entries.
    #[cfg(test)]
    pub(crate) fn pack(encoded: &Encoded) -> Self {
        Self::pack_into(&mut Vec::new(), pairs(encoded))
    }

    /// Encodes entries given in key order through `scratch` (cleared first), and keeps an
    /// exact copy of its bytes: a writer that keeps one buffer packs every slot into pages it
    /// already has, where a buffer per write faulted fresh pages in and gave them back.
    pub(crate) fn pack_into(
        scratch: &mut Vec<u8>,
        entries: impl Iterator<Item = (PolicyBlock, PolicyValue)>,
    ) -> Self {
        let mut packer = Packer::new(scratch, 0);
        entries.for_each(|e| packer.push(e));
        packer.finish()
    }

    /// The digest of the slot with enforcement and tier `flags` ([`slot_digest`]).
    pub(crate) fn digest(&self, flags: u32) -> u64 {
        slot_digest(flags, self.runs.iter().map(|r| r.digest))
    }

    /// The entries of `slot` as they were packed.
    #[cfg(test)]
    pub(crate) fn unpack(&self, slot: u32) -> Encoded {
        self.iter(slot).collect()
    }

    /// The entries of `slot`, in key order, without building a map.
    pub(crate) fn iter(&self, slot: u32) -> impl Iterator<Item = (PolicyBlock, PolicyValue)> + '_ {
        self.runs_with_bytes()
            .flat_map(move |(run, bytes)| run_entries(slot, run.identity, bytes))
    }

    /// The entries of `slot` whose peer identity is one of `identities`, in key order: only
    /// their runs are decoded.
    pub(crate) fn iter_identities<'a>(
        &'a self,
        slot: u32,
        identities: &'a BTreeSet<u32>,
    ) -> impl Iterator<Item = (PolicyBlock, PolicyValue)> + 'a {
        self.runs_with_bytes()
            .filter(|(run, _)| identities.contains(&run.identity))
            .flat_map(move |(run, bytes)| run_entries(slot, run.identity, bytes))
    }

    /// Each run with its bytes.
    fn runs_with_bytes(&self) -> impl Iterator<Item = (&Run, &[u8])> + '_ {
        let mut start = 0;
        self.runs.iter().map(move |run| {
            let bytes = self
                .bytes
                .get(start as usize..run.end as usize)
                .unwrap_or_default();
            start = run.end;
            (run, bytes)
        })
    }

    /// For a write of some identities' entries: the slot once `new` (in key order) replaced the
    /// entries of `identities`, packed through `scratch`. Only the runs of `identities` and of
    /// the identities in `new` are decoded; the others' bytes are copied.
    pub(crate) fn replacing(
        &self,
        slot: u32,
        identities: &BTreeSet<u32>,
        new: &[(PolicyBlock, PolicyValue)],
        scratch: &mut Vec<u8>,
    ) -> Self {
        let mut packer = Packer::new(scratch, self.runs.len() + 1);
        let mut new = new.iter().copied().peekable();
        for (run, bytes) in self.runs_with_bytes() {
            while let Some(e) = new.next_if(|(b, _)| b.key.identity < run.identity) {
                packer.push(e);
            }
            let replaced = identities.contains(&run.identity);
            let has_new = new
                .peek()
                .is_some_and(|(b, _)| b.key.identity == run.identity);
            if !replaced && !has_new {
                packer.copy(run, bytes);
                continue;
            }
            // The run's entries: none kept when replaced, else kept under `new`'s.
            let mut kept = (!replaced)
                .then(|| run_entries(slot, run.identity, bytes))
                .into_iter()
                .flatten()
                .peekable();
            loop {
                let next_new = new.peek().filter(|(b, _)| b.key.identity == run.identity);
                match (kept.peek(), next_new) {
                    (Some(k), Some(n)) if k.0 < n.0 => packer.push(*k),
                    (Some(k), Some(n)) if k.0 == n.0 => {
                        kept.next();
                        continue;
                    }
                    (Some(k), None) => packer.push(*k),
                    (_, Some(n)) => {
                        packer.push(*n);
                        new.next();
                        continue;
                    }
                    (None, None) => break,
                }
                kept.next();
            }
        }
        new.for_each(|e| packer.push(e));
        packer.finish()
    }

    /// The keys of `slot`'s entries, in key order.
    #[cfg(test)]
    pub(crate) fn blocks(&self, slot: u32) -> impl Iterator<Item = PolicyBlock> + '_ {
        self.iter(slot).map(|(b, _)| b)
    }
}

/// The entries of one run of `identity` (its bytes), as blocks of `slot`.
fn run_entries(
    slot: u32,
    identity: u32,
    bytes: &[u8],
) -> impl Iterator<Item = (PolicyBlock, PolicyValue)> + '_ {
    entries(bytes, identity).map(move |e| {
        let [.., verdict, rule] = e.bytes;
        let value = PolicyValue {
            verdict,
            rule,
            priority: e.priority,
        };
        (block(slot, &e), value)
    })
}

/// The entries of one run's bytes.
fn entries(bytes: &[u8], identity: u32) -> impl Iterator<Item = Entry> + '_ {
    let mut bytes = bytes.iter().copied();
    let mut prev = Entry {
        identity,
        ..Entry::default()
    };
    std::iter::from_fn(move || {
        let flags = bytes.next()?;
        let mut e = prev;
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
    use crate::datapath::encode::{digest, encode_entries};
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
            shadow.bytes.len() <= encoded.len() * 2 + 20,
            "{} bytes",
            shadow.bytes.len()
        );
    }

    #[test]
    fn replacing_some_identities_equals_packing_the_result() {
        let base = ports_of([256, 300, 70_000], 8000..8040);
        let shadow = Shadow::pack(&base);
        let identities = BTreeSet::from([300, 5000, 70_000]);
        // 300 keeps some ports, changes one verdict and gains others; 70 000 loses all of its
        // entries; 5 000 (absent before) gains one; 256 is not among the identities, and an
        // entry of it in `new` is added to its others.
        let mut new: Encoded = ports_of([300, 300, 300], 8020..8060);
        new.insert(
            raw(300, 0, 6, 8021u16.to_be(), abi::POLICY_FULL_PREFIX),
            v(2),
        );
        new.insert(
            raw(5000, 1, 17, 53u16.to_be(), abi::POLICY_FULL_PREFIX),
            v(1),
        );
        new.insert(raw(256, 1, 6, 7u16.to_be(), abi::POLICY_FULL_PREFIX), v(1));
        let mut scratch = vec![0xaa; 3];
        let sorted: Vec<(PolicyBlock, PolicyValue)> = pairs(&new).collect();
        let after = shadow.replacing(9, &identities, &sorted, &mut scratch);
        // The entries of the other identities, then `new`'s (which win on a key of both).
        let mut want: Encoded = base
            .iter()
            .filter(|(b, _)| !identities.contains(&b.key.identity))
            .map(|(b, v)| (*b, *v))
            .collect();
        want.extend(new.iter().map(|(b, v)| (*b, *v)));
        assert_eq!(after.unpack(9), want);
        // The same bytes, runs and run digests: the copied runs are what packing gives.
        assert_eq!(after, Shadow::pack(&want));
        assert!(after.unpack(9).keys().all(|b| b.key.identity != 70_000));
        assert_eq!(after.unpack(9).len(), 40 + 1 + 40 + 1);
        assert_eq!(after.digest(3), digest(&after.unpack(9), 3));
        // The scratch buffer's earlier bytes are not in the result.
        assert_eq!(
            Shadow::pack_into(&mut scratch, std::iter::empty()),
            Shadow::default()
        );
    }

    #[test]
    fn the_digest_from_the_runs_is_the_digest_of_the_entries() {
        let encoded = ports_of([256, 300, 70_000], 8000..8010);
        let shadow = Shadow::pack(&encoded);
        assert_eq!(shadow.digest(5), digest(&encoded, 5));
        assert_ne!(shadow.digest(5), shadow.digest(4));
        assert_eq!(Shadow::default().digest(5), digest(&Encoded::new(), 5));
        // Moving one entry from one identity to the next changes the digest.
        let mut moved = encoded.clone();
        moved.remove(&raw(300, 0, 6, 8009u16.to_be(), abi::POLICY_FULL_PREFIX));
        moved.insert(
            raw(70_000, 0, 6, 9u16.to_be(), abi::POLICY_FULL_PREFIX),
            v(1),
        );
        assert_ne!(Shadow::pack(&moved).digest(5), shadow.digest(5));
        assert_eq!(Shadow::pack(&moved).digest(5), digest(&moved, 5));
    }
}
