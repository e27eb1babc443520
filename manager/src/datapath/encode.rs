//! Encoding an [`EndpointPolicy`] into `policy` LPM trie entries, and diffing two encodings.
//!
//! Key = {policy slot, identity, direction | proto | dport(be)}; the first three are always in
//! the prefix (72 bits). A wildcard protocol stops the prefix there (all protocols, all ports);
//! otherwise the 8 proto bits follow and a port range becomes aligned power-of-two blocks, each a
//! prefix over the high bits of the big-endian port. The datapath looks up the packet's exact
//! identity and identity 0, each with a full-length key.
//!
//! Deny beats allow: an LPM lookup returns only the longest matching block, so a narrow allow
//! inside a broad deny would win. Aligned blocks are either nested or disjoint, so the encoder
//! stores every block that lies inside a deny block of the same (slot, identity, direction)
//! as a deny. Then, per identity, the longest match is deny exactly when some deny covers the
//! packet; across the two identities the datapath lets a deny from either win.

use std::collections::{BTreeMap, HashMap};
use weft_ebpf::{self as abi, PolicyKey};
use weft_policy::mapstate::{Direction, EndpointPolicy, PolicyEntry, Verdict};

/// Version of what this module makes of a computed policy: the `policy` trie entries (key
/// layout, port blocks, deny carving, verdict values), the enforcement flag bits and the slot
/// [`digest`]. A restarted manager trusts nothing in slots written under another version
/// (`crate::slots::Compiler`). Bump it with any change to them, and with any change to how
/// the datapath's C code reads the `policy` map; the test
/// `a_change_of_the_encoding_comes_with_a_new_encoding_version` (encode/tests.rs) fails on a
/// change of the encoding without a new line in [`POLICY_ENCODING_GOLDENS`].
pub const POLICY_ENCODING_VERSION: u32 = 1;

/// `(version, digest of the golden corpus encoded by that version)`, oldest first; the last
/// line is [`POLICY_ENCODING_VERSION`]'s. Append a line with each bump; never edit a past one.
pub const POLICY_ENCODING_GOLDENS: &[(u32, u64)] = &[(1, 0xe8d7_f464_341e_0eaa)];

/// One LPM entry of the `policy` map: prefix length and key data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PolicyBlock {
    /// Key data (dport in network byte order). First, so blocks sort by slot, then
    /// identity: one identity's blocks are a contiguous range.
    pub key: PolicyKey,
    /// Bits of `key` that must match (72, 80 or 80 + port prefix).
    pub prefix_len: u32,
}

/// Encoded policy of a slot: block → `VERDICT_ALLOW` or `VERDICT_DENY`.
pub type Encoded = BTreeMap<PolicyBlock, u8>;

pub(crate) fn dir_byte(d: Direction) -> u8 {
    match d {
        Direction::Ingress => abi::DIR_INGRESS,
        Direction::Egress => abi::DIR_EGRESS,
    }
}

/// Splits `[lo, hi]` into aligned blocks `(start, log2 size)`, largest first from `lo`.
#[cfg(test)]
pub(crate) fn port_blocks(lo: u16, hi: u16) -> Vec<(u16, u32)> {
    port_block_iter(lo, hi).collect()
}

/// [`port_blocks`] without a vector: most entries are one port, one block.
fn port_block_iter(lo: u16, hi: u16) -> impl Iterator<Item = (u16, u32)> {
    let (mut start, end) = (u32::from(lo), u32::from(hi));
    std::iter::from_fn(move || {
        if start > end {
            return None;
        }
        let mut bits = start.trailing_zeros().min(16);
        while start + (1 << bits) - 1 > end {
            bits -= 1;
        }
        // start <= end <= 65535: the conversion cannot fail; stopping is the safe answer anyway.
        let port = u16::try_from(start).ok()?;
        start += 1 << bits;
        Some((port, bits))
    })
}

/// The 24 variable bits (proto, port) of a key and how many of them the block fixes.
fn variable_bits(b: &PolicyBlock) -> (u32, u32) {
    let bits = (u32::from(b.key.proto) << 16) | u32::from(u16::from_be(b.key.dport));
    (bits, b.prefix_len - abi::POLICY_FIXED_PREFIX)
}

/// True when `outer` contains `inner` (same slot, identity and direction assumed).
fn contains(outer: &PolicyBlock, inner: &PolicyBlock) -> bool {
    let ((ob, on), (ib, inn)) = (variable_bits(outer), variable_bits(inner));
    on <= inn && (on == 0 || (ob >> (24 - on)) == (ib >> (24 - on)))
}

/// Encodes the entries of `policy` for `policy_id` (the enforcement flags live in the
/// `endpoints` map, not here).
#[must_use]
pub fn encode_policy(policy_id: u32, policy: &EndpointPolicy) -> Encoded {
    encode_entries(policy_id, &policy.entries)
}

/// Encodes policy entries. The deny carving below only looks within one identity, so the
/// entries of some identities encode to exactly those identities' blocks of the whole policy.
#[must_use]
pub fn encode_entries(policy_id: u32, entries: &BTreeMap<PolicyEntry, Verdict>) -> Encoded {
    let mut out = Encoded::new();
    for (entry, verdict) in entries {
        let verdict = match verdict {
            Verdict::Allow => abi::VERDICT_ALLOW,
            Verdict::Deny => abi::VERDICT_DENY,
            // Placeholder so this branch compiles until the datapath's tier encoding merges
            // (wt/cnpdp): tier entries are not encoded here.
            Verdict::Tier(_) => continue,
        };
        let key = PolicyKey {
            policy_id,
            identity: entry.identity,
            direction: dir_byte(entry.direction),
            proto: entry.proto,
            dport: 0,
        };
        let mut add = |b: PolicyBlock| {
            let v = out.entry(b).or_insert(verdict);
            *v = (*v).max(verdict); // VERDICT_DENY > VERDICT_ALLOW
        };
        if entry.proto == 0 {
            // Any protocol: ports are meaningless (the contract says they must be "any").
            add(PolicyBlock {
                prefix_len: abi::POLICY_FIXED_PREFIX,
                key,
            });
        } else {
            for (start, bits) in port_block_iter(entry.port_lo, entry.port_hi) {
                add(PolicyBlock {
                    prefix_len: abi::POLICY_FULL_PREFIX - bits,
                    key: PolicyKey {
                        dport: start.to_be(),
                        ..key
                    },
                });
            }
        }
    }
    // Only a deny of the same identity and direction can cover an allow block: grouping them
    // keeps this pass linear in practice (a policy has thousands of allows, few denies each).
    let mut denies: HashMap<(u32, u8), Vec<PolicyBlock>> = HashMap::new();
    for (b, _) in out.iter().filter(|&(_, &v)| v == abi::VERDICT_DENY) {
        denies
            .entry((b.key.identity, b.key.direction))
            .or_default()
            .push(*b);
    }
    if denies.is_empty() {
        return out;
    }
    for (b, v) in &mut out {
        if *v == abi::VERDICT_ALLOW
            && denies
                .get(&(b.key.identity, b.key.direction))
                .is_some_and(|ds| ds.iter().any(|d| contains(d, b)))
        {
            *v = abi::VERDICT_DENY;
        }
    }
    out
}

/// Userspace mirror of the datapath's lookup (`policy_verdict` in `weft_tc.c`): the verdict for a
/// packet, or `None` when nothing matches (default deny when enforced). `port` is host order.
#[must_use]
pub fn lookup_encoded(
    encoded: &Encoded,
    identity: u32,
    direction: Direction,
    proto: u8,
    port: u16,
) -> Option<Verdict> {
    let longest = |id: u32| {
        encoded
            .iter()
            .filter(|(b, _)| {
                b.key.identity == id
                    && b.key.direction == dir_byte(direction)
                    && contains(
                        b,
                        &PolicyBlock {
                            prefix_len: abi::POLICY_FULL_PREFIX,
                            key: PolicyKey {
                                proto,
                                dport: port.to_be(),
                                ..b.key
                            },
                        },
                    )
            })
            .max_by_key(|(b, _)| b.prefix_len)
            .map(|(_, v)| *v)
    };
    let exact = longest(identity);
    if exact == Some(abi::VERDICT_DENY) {
        return Some(Verdict::Deny);
    }
    match longest(0).or(exact)? {
        abi::VERDICT_DENY => Some(Verdict::Deny),
        _ => Some(Verdict::Allow),
    }
}

/// A digest of a slot's contents (its blocks and enforcement flags) that stays the same across
/// builds (it is persisted): FNV-1a over the key bytes, prefix lengths and verdicts, in order.
#[must_use]
pub fn digest(encoded: &Encoded, flags: u32) -> u64 {
    digest_sorted(encoded.iter().map(|(b, v)| (*b, *v)), flags)
}

/// The [`digest`] of entries given in key order.
fn digest_sorted(entries: impl Iterator<Item = (PolicyBlock, u8)>, flags: u32) -> u64 {
    let mut d = Digest::new(flags);
    for (b, v) in entries {
        d.add(&b, v);
    }
    d.finish()
}

/// A [`digest`] fed one entry at a time, in key order (a write digests the slot while it
/// packs its shadow, in the same pass).
pub(crate) struct Digest(weft_api::fnv::Fnv64);

impl Digest {
    pub(crate) fn new(flags: u32) -> Self {
        let mut h = weft_api::fnv::Fnv64::new();
        h.feed(&flags.to_le_bytes());
        Self(h)
    }

    fn feed(&mut self, bytes: &[u8]) {
        self.0.feed(bytes);
    }

    pub(crate) fn add(&mut self, b: &PolicyBlock, verdict: u8) {
        self.feed(&b.prefix_len.to_le_bytes());
        self.feed(&b.key.identity.to_le_bytes());
        self.feed(&[b.key.direction, b.key.proto]);
        self.feed(&b.key.dport.to_le_bytes());
        self.feed(&[verdict]);
    }

    pub(crate) fn finish(&self) -> u64 {
        self.0.finish()
    }
}

/// The [`digest`] a slot holding `policy` has.
#[must_use]
pub fn policy_digest(policy: &EndpointPolicy) -> u64 {
    digest(&encode_policy(0, policy), enforcement_flags(policy))
}

/// The `endpoints` entry's enforcement bits of `policy`.
pub(crate) fn enforcement_flags(policy: &EndpointPolicy) -> u32 {
    flag_bits(policy.ingress_enforced, policy.egress_enforced)
}

/// The `endpoints` entry's enforcement bits.
pub(crate) fn flag_bits(ingress: bool, egress: bool) -> u32 {
    let mut flags = 0;
    if ingress {
        flags |= abi::EP_INGRESS_ENFORCED;
    }
    if egress {
        flags |= abi::EP_EGRESS_ENFORCED;
    }
    flags
}

/// What to change to go from `old` to `new`: upserts (new or changed) to write first, then the
/// stale blocks to remove.
#[must_use]
pub(crate) fn diff(old: &Encoded, new: &Encoded) -> (Vec<(PolicyBlock, u8)>, Vec<PolicyBlock>) {
    // Both maps iterate in key order: one merge pass instead of a lookup per block.
    let (mut upserts, mut removes) = (Vec::new(), Vec::new());
    let (mut o, mut n) = (old.iter().peekable(), new.iter().peekable());
    loop {
        match (o.peek(), n.peek()) {
            (None, None) => break,
            (Some(&(ob, _)), None) => {
                removes.push(*ob);
                o.next();
            }
            (None, Some(&(nb, nv))) => {
                upserts.push((*nb, *nv));
                n.next();
            }
            (Some(&(ob, ov)), Some(&(nb, nv))) => match ob.cmp(nb) {
                std::cmp::Ordering::Less => {
                    removes.push(*ob);
                    o.next();
                }
                std::cmp::Ordering::Greater => {
                    upserts.push((*nb, *nv));
                    n.next();
                }
                std::cmp::Ordering::Equal => {
                    if ov != nv {
                        upserts.push((*nb, *nv));
                    }
                    o.next();
                    n.next();
                }
            },
        }
    }
    (upserts, removes)
}

#[cfg(test)]
mod tests;
