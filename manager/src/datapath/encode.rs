//! Encoding an [`EndpointPolicy`] into policy entries. The kernel holds them in two steps
//! (module `lists`: a pair's entries in a shared port list); the encoding and the digests are
//! of the entries.
//!
//! Key = {policy slot, identity, direction | proto | dport(be)}; the first three are always in
//! the prefix (72 bits). A wildcard protocol stops the prefix there (all protocols, all ports);
//! otherwise the 8 proto bits follow and a port range becomes aligned power-of-two blocks, each a
//! prefix over the high bits of the big-endian port. The datapath looks up the packet's exact
//! identity and identity 0, each with a full-length key.
//!
//! `NetworkPolicy` layer: deny beats allow. An LPM lookup returns only the longest matching
//! block, so a narrow allow inside a broad deny would win. Aligned blocks are either nested or
//! disjoint, so the encoder stores every block that lies inside a deny block of the same (slot,
//! identity, direction) as a deny. Then, per identity, the longest match is deny exactly when
//! some deny covers the packet; across the two identities the datapath lets a deny from either
//! win.
//!
//! `ClusterNetworkPolicy` tiers: the direction byte carries the tier (`abi::policy_direction`),
//! the value the action and the rule's precedence (priority, rule index). The computation made
//! a tier's entries disjoint per identity and protocol, so they are encoded as they are; the
//! datapath takes the entry of smallest precedence across the identities a packet matches.
//! [`lookup`] is the userspace mirror of the datapath's decision.

use std::collections::BTreeMap;
use weft_ebpf::{self as abi, PolicyKey, PolicyValue};
use weft_policy::mapstate::{
    Direction, EndpointPolicy, PolicyEntry, Tier, TierAction, TierFlags, TierVerdict, Verdict,
};

pub mod lookup;

/// Version of what this module makes of a computed policy: the policy entries (key layout, the
/// two maps' keys, port blocks, deny carving, verdict values), the enforcement flag bits and
/// the slot [`digest`]. A restarted manager trusts nothing in slots written under another version
/// (`crate::slots::Compiler`). Bump it with any change to them, and with any change to how
/// the datapath's C code reads the policy maps; the test
/// `a_change_of_the_encoding_comes_with_a_new_encoding_version` (encode/tests.rs) fails on a
/// change of the encoding without a new line in [`POLICY_ENCODING_GOLDENS`].
pub const POLICY_ENCODING_VERSION: u32 =
    if SPLIT_ANY_PROTOCOL && !cfg!(feature = "upgrade-test-unstamped") {
        UPGRADE_TEST_ENCODING_VERSION
    } else {
        4
    };

/// The encoding version of a build with the feature `upgrade-test-encoding` (far above the
/// real ones, which count up from 1).
pub const UPGRADE_TEST_ENCODING_VERSION: u32 = 1002;

/// Feature `upgrade-test-encoding`, for the rolling-upgrade check only
/// (scripts/cluster/checks.d/upgrade.sh): an encoding that differs from the real one for the
/// same policy while deciding every packet the same. Each any-protocol block (prefix 72) is
/// stored as its two halves of the protocol byte (prefix 73, protocols 0-127 and 128-255). With
/// its own [`POLICY_ENCODING_VERSION`], a manager of this build reads back and rewrites every
/// slot the real encoding wrote, and the real one every slot this one wrote. Feature
/// `upgrade-test-unstamped` is the same encoding under the real version: the build that trusts
/// slots it did not write, which the upgrade check must catch.
const SPLIT_ANY_PROTOCOL: bool = cfg!(feature = "upgrade-test-encoding");

/// `(version, digest of the golden corpus encoded by that version)`, oldest first; the last
/// line is [`POLICY_ENCODING_VERSION`]'s. Append a line with each bump; never edit a past one.
pub const POLICY_ENCODING_GOLDENS: &[(u32, u64)] = &[
    (1, 0xe8d7_f464_341e_0eaa),
    // ClusterNetworkPolicy tiers: the tier in the key's direction byte, action and precedence
    // in the value, the tier flags in the entry flags and the slot digest.
    (2, 0xbe9e_4995_400d_3d77),
    // The slot digest over the digests of its identities' blocks (a one-rule change re-digests
    // the identities it touches only).
    (3, 0x3b27_1036_81b1_fb36),
    // Two-step lookup: the entries of a (slot, identity, direction) pair in a shared port list
    // (`policy_pairs`, `policy_lists`) instead of one trie of every entry.
    (4, 0xa8e8_0dcc_3b59_37fd),
];

/// One LPM entry of the `policy` map: prefix length and key data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PolicyBlock {
    /// Key data (dport in network byte order). First, so blocks sort by slot, then
    /// identity: one identity's blocks are a contiguous range.
    pub key: PolicyKey,
    /// Bits of `key` that must match (72, 80 or 80 + port prefix).
    pub prefix_len: u32,
}

impl PolicyBlock {
    const fn new(key: PolicyKey, prefix_len: u32) -> Self {
        Self { key, prefix_len }
    }
}

/// Encoded policy of a slot: block → value (`VERDICT_ALLOW` or `VERDICT_DENY` in the
/// `NetworkPolicy` layer; a tier action with its rule's precedence in the tiers).
pub type Encoded = BTreeMap<PolicyBlock, PolicyValue>;

pub(crate) fn dir_byte(d: Direction) -> u8 {
    match d {
        Direction::Ingress => abi::DIR_INGRESS,
        Direction::Egress => abi::DIR_EGRESS,
    }
}

/// The `TIER_*` code of a layer.
pub(crate) fn tier_byte(t: Tier) -> u8 {
    match t {
        Tier::Policy => abi::TIER_POLICY,
        Tier::Admin => abi::TIER_ADMIN,
        Tier::Baseline => abi::TIER_BASELINE,
    }
}

/// The layer of a `TIER_*` code (`None`: no layer this build knows).
pub(crate) fn tier_of(code: u8) -> Option<Tier> {
    match code {
        abi::TIER_POLICY => Some(Tier::Policy),
        abi::TIER_ADMIN => Some(Tier::Admin),
        abi::TIER_BASELINE => Some(Tier::Baseline),
        _ => None,
    }
}

/// The value of a tier entry: its action and precedence.
pub(crate) fn tier_value(t: TierVerdict) -> PolicyValue {
    PolicyValue {
        verdict: match t.action {
            TierAction::Deny => abi::VERDICT_TIER_DENY,
            TierAction::Pass => abi::VERDICT_TIER_PASS,
            TierAction::Accept => abi::VERDICT_TIER_ACCEPT,
        },
        rule: t.rule,
        priority: t.priority,
    }
}

/// The tier verdict a value stands for (`None`: not a tier value).
pub(crate) fn tier_verdict(v: PolicyValue) -> Option<TierVerdict> {
    let action = match v.verdict {
        abi::VERDICT_TIER_DENY => TierAction::Deny,
        abi::VERDICT_TIER_PASS => TierAction::Pass,
        abi::VERDICT_TIER_ACCEPT => TierAction::Accept,
        _ => return None,
    };
    Some(TierVerdict {
        priority: v.priority,
        rule: v.rule,
        action,
    })
}

/// The value of an entry of `tier`. The contract gives `NetworkPolicy` entries allow or deny
/// and tier entries a [`Verdict::Tier`]; an entry breaking it is encoded fail-closed where it
/// could let something through: a tier verdict in the `NetworkPolicy` layer as allow (accept) or
/// deny (deny, pass: a pass has no meaning there), an allow or deny in a tier as the last rule
/// of the lowest priority.
fn value_of(tier: Tier, verdict: Verdict) -> PolicyValue {
    match (tier, verdict) {
        (Tier::Policy, Verdict::Allow) => PolicyValue::verdict(abi::VERDICT_ALLOW),
        (Tier::Policy, Verdict::Deny) => PolicyValue::verdict(abi::VERDICT_DENY),
        (Tier::Policy, Verdict::Tier(t)) => PolicyValue::verdict(match t.action {
            TierAction::Accept => abi::VERDICT_ALLOW,
            TierAction::Deny | TierAction::Pass => abi::VERDICT_DENY,
        }),
        (Tier::Admin | Tier::Baseline, Verdict::Tier(t)) => tier_value(t),
        (Tier::Admin | Tier::Baseline, Verdict::Allow | Verdict::Deny) => tier_value(TierVerdict {
            priority: u16::MAX,
            rule: u8::MAX,
            action: if verdict == Verdict::Allow {
                TierAction::Accept
            } else {
                TierAction::Deny
            },
        }),
    }
}

/// True for a value of the `NetworkPolicy` layer.
fn is_policy_layer(v: PolicyValue) -> bool {
    v.verdict == abi::VERDICT_ALLOW || v.verdict == abi::VERDICT_DENY
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
    encode_entries_as(policy_id, entries, SPLIT_ANY_PROTOCOL)
}

/// [`encode_entries`] as a vector in key order (what a slot write diffs and packs: no tree to
/// build and free per write).
pub(crate) fn encode_sorted(
    policy_id: u32,
    entries: &BTreeMap<PolicyEntry, Verdict>,
) -> Vec<(PolicyBlock, PolicyValue)> {
    encode_sorted_as(policy_id, entries, SPLIT_ANY_PROTOCOL)
}

/// [`encode_entries`], with any-protocol blocks split in two when `split_any_protocol` (the
/// encoding of feature `upgrade-test-encoding`).
fn encode_entries_as(
    policy_id: u32,
    entries: &BTreeMap<PolicyEntry, Verdict>,
    split_any_protocol: bool,
) -> Encoded {
    encode_sorted_as(policy_id, entries, split_any_protocol)
        .into_iter()
        .collect()
}

/// [`encode_sorted`], with any-protocol blocks split as [`encode_entries_as`] says.
fn encode_sorted_as(
    policy_id: u32,
    entries: &BTreeMap<PolicyEntry, Verdict>,
    split_any_protocol: bool,
) -> Vec<(PolicyBlock, PolicyValue)> {
    // Blocks are gathered in a vector and sorted once: thousands of entries per slot, each a
    // search and insert into a tree otherwise.
    let mut blocks: Vec<(PolicyBlock, PolicyValue)> = Vec::with_capacity(entries.len());
    for (entry, verdict) in entries {
        let value = value_of(entry.tier, *verdict);
        let key = PolicyKey {
            policy_id,
            identity: entry.identity,
            direction: abi::policy_direction(dir_byte(entry.direction), tier_byte(entry.tier)),
            proto: entry.proto,
            dport: 0,
        };
        if entry.proto == 0 && split_any_protocol {
            // The upgrade check's encoding: the two halves of the protocol byte.
            for proto in [0, 0x80] {
                let key = PolicyKey { proto, ..key };
                blocks.push((PolicyBlock::new(key, abi::POLICY_FIXED_PREFIX + 1), value));
            }
        } else if entry.proto == 0 {
            // Any protocol: ports are meaningless (the contract says they must be "any").
            blocks.push((PolicyBlock::new(key, abi::POLICY_FIXED_PREFIX), value));
        } else {
            for (start, bits) in port_block_iter(entry.port_lo, entry.port_hi) {
                let key = PolicyKey {
                    dport: start.to_be(),
                    ..key
                };
                blocks.push((PolicyBlock::new(key, abi::POLICY_FULL_PREFIX - bits), value));
            }
        }
    }
    // Blocks several entries give are folded whatever their order (deny over allow; the
    // smaller precedence, which includes the whole value): an unstable sort is enough.
    blocks.sort_unstable_by_key(|&(b, _)| b);
    blocks.dedup_by(|later, kept| {
        let same = later.0 == kept.0;
        if same {
            kept.1 = if is_policy_layer(later.1) {
                // VERDICT_DENY > VERDICT_ALLOW: deny wins.
                kept.1.max(later.1)
            } else {
                // Disjoint by contract; were two the same block, the first in precedence.
                std::cmp::min_by_key(kept.1, later.1, PolicyValue::precedence)
            };
        }
        same
    });
    // Only a deny of the same identity and direction can cover an allow block, and one
    // identity's blocks in one direction are a contiguous run of the sorted blocks (a policy
    // has thousands of allows, few denies each). Tier values are neither: the carving is the
    // NetworkPolicy layer's alone.
    let mut denies: Vec<PolicyBlock> = Vec::new();
    for run in blocks.chunk_by_mut(|a, b| {
        (a.0.key.identity, a.0.key.direction) == (b.0.key.identity, b.0.key.direction)
    }) {
        denies.clear();
        denies.extend(
            run.iter()
                .filter(|(_, v)| v.verdict == abi::VERDICT_DENY)
                .map(|(b, _)| *b),
        );
        if denies.is_empty() {
            continue;
        }
        for (b, v) in run.iter_mut() {
            if v.verdict == abi::VERDICT_ALLOW && denies.iter().any(|d| contains(d, b)) {
                *v = PolicyValue::verdict(abi::VERDICT_DENY);
            }
        }
    }
    blocks
}

/// A digest of a slot's contents (its blocks and its enforcement and tier flags) that stays the
/// same across builds (it is persisted): FNV-1a over the flags and, one identity after the
/// other in key order, the digest of that identity's blocks ([`RunDigest`]). A write of some
/// identities' entries re-digests those identities only (`super::shadow`).
#[must_use]
pub fn digest(encoded: &Encoded, flags: u32) -> u64 {
    digest_sorted(pairs(encoded), flags)
}

/// The [`digest`] of blocks given in key order.
fn digest_sorted(blocks: impl Iterator<Item = (PolicyBlock, PolicyValue)>, flags: u32) -> u64 {
    let mut runs: Vec<(u32, RunDigest)> = Vec::new();
    for (b, v) in blocks {
        let identity = b.key.identity;
        if runs.last().is_none_or(|(id, _)| *id != identity) {
            runs.push((identity, RunDigest::new()));
        }
        if let Some((_, run)) = runs.last_mut() {
            run.add(&b, v);
        }
    }
    slot_digest(flags, runs.iter().map(|(_, run)| run.finish()))
}

/// An [`Encoded`]'s entries by value, in key order.
pub(crate) fn pairs(encoded: &Encoded) -> impl Iterator<Item = (PolicyBlock, PolicyValue)> + '_ {
    encoded.iter().map(|(b, v)| (*b, *v))
}

/// The [`digest`] of a slot from its flags and its identities' digests, in identity order.
pub(crate) fn slot_digest(flags: u32, runs: impl Iterator<Item = u64>) -> u64 {
    let mut h = weft_api::fnv::Fnv64::new();
    h.feed(&flags.to_le_bytes());
    for run in runs {
        h.feed(&run.to_le_bytes());
    }
    h.finish()
}

/// The digest of one identity's blocks of a slot, fed one block at a time in key order:
/// FNV-1a over each block's prefix length, key bytes (without the slot) and value.
pub(crate) struct RunDigest(weft_api::fnv::Fnv64);

impl RunDigest {
    pub(crate) fn new() -> Self {
        Self(weft_api::fnv::Fnv64::new())
    }

    fn feed(&mut self, bytes: &[u8]) {
        self.0.feed(bytes);
    }

    pub(crate) fn add(&mut self, b: &PolicyBlock, v: PolicyValue) {
        self.feed(&b.prefix_len.to_le_bytes());
        self.feed(&b.key.identity.to_le_bytes());
        self.feed(&[b.key.direction, b.key.proto]);
        self.feed(&b.key.dport.to_le_bytes());
        self.feed(&[v.verdict]);
        // Only a tier value has a precedence; the verdict says whether one follows, and a
        // NetworkPolicy entry digests without it.
        if !is_policy_layer(v) {
            self.feed(&[v.rule]);
            self.feed(&v.priority.to_le_bytes());
        }
    }

    pub(crate) fn finish(&self) -> u64 {
        self.0.finish()
    }
}

/// The [`digest`] a slot holding `policy` has.
#[must_use]
pub fn policy_digest(policy: &EndpointPolicy) -> u64 {
    // The sorted vector, not a map: every whole computation and restore digests its slots.
    let blocks = encode_sorted(0, &policy.entries);
    digest_sorted(blocks.into_iter(), enforcement_flags(policy))
}

/// The `endpoints` entry's policy bits of `policy`: enforcement and tier flags.
pub(crate) fn enforcement_flags(policy: &EndpointPolicy) -> u32 {
    flag_bits(
        policy.ingress_enforced,
        policy.egress_enforced,
        policy.tiers,
    )
}

/// Every bit of an `endpoints` entry's flags that is the slot's (not the endpoint's own).
pub(crate) const SLOT_FLAGS: u32 = abi::EP_INGRESS_ENFORCED
    | abi::EP_EGRESS_ENFORCED
    | abi::EP_ADMIN_INGRESS
    | abi::EP_ADMIN_EGRESS
    | abi::EP_BASELINE_INGRESS
    | abi::EP_BASELINE_EGRESS;

/// The `endpoints` entry's policy bits.
pub(crate) fn flag_bits(ingress: bool, egress: bool, tiers: TierFlags) -> u32 {
    [
        (ingress, abi::EP_INGRESS_ENFORCED),
        (egress, abi::EP_EGRESS_ENFORCED),
        (tiers.admin_ingress, abi::EP_ADMIN_INGRESS),
        (tiers.admin_egress, abi::EP_ADMIN_EGRESS),
        (tiers.baseline_ingress, abi::EP_BASELINE_INGRESS),
        (tiers.baseline_egress, abi::EP_BASELINE_EGRESS),
    ]
    .into_iter()
    .filter(|(on, _)| *on)
    .fold(0, |flags, (_, bit)| flags | bit)
}

/// The tier flags an `endpoints` entry's flags hold.
pub(crate) fn tier_flags(flags: u32) -> TierFlags {
    TierFlags {
        admin_ingress: flags & abi::EP_ADMIN_INGRESS != 0,
        admin_egress: flags & abi::EP_ADMIN_EGRESS != 0,
        baseline_ingress: flags & abi::EP_BASELINE_INGRESS != 0,
        baseline_egress: flags & abi::EP_BASELINE_EGRESS != 0,
    }
}

#[cfg(test)]
mod tests;
