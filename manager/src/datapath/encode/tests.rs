use super::lookup::{Peer, lookup_encoded, policy_layer, tier_entry};
use super::*;
use std::collections::BTreeSet;
use weft_policy::mapstate::PolicyEntry;

/// The contract's semantics, evaluated directly on the entries.
fn naive(p: &EndpointPolicy, identity: u32, d: Direction, proto: u8, port: u16) -> Option<Verdict> {
    let matching: Vec<Verdict> = p
        .entries
        .iter()
        .filter(|(e, _)| {
            e.tier.is_policy()
                && e.direction == d
                && (e.identity == 0 || e.identity == identity)
                && (e.proto == 0 || (e.proto == proto && (e.port_lo..=e.port_hi).contains(&port)))
        })
        .map(|(_, v)| *v)
        .collect();
    if matching.contains(&Verdict::Deny) {
        Some(Verdict::Deny)
    } else if matching.is_empty() {
        None
    } else {
        Some(Verdict::Allow)
    }
}

#[test]
fn port_ranges_split_into_aligned_blocks() {
    assert_eq!(port_blocks(80, 80), vec![(80, 0)]);
    assert_eq!(port_blocks(0, 65535), vec![(0, 16)]);
    assert_eq!(port_blocks(8080, 8083), vec![(8080, 2)]);
    assert_eq!(port_blocks(1, 6), vec![(1, 0), (2, 1), (4, 1), (6, 0)]);
    assert_eq!(port_blocks(65535, 65535), vec![(65535, 0)]);
    for (lo, hi) in [(1, 65535), (1000, 2000), (3, 3), (0, 1), (1023, 1025)] {
        let blocks = port_blocks(lo, hi);
        let mut next = u32::from(lo);
        for (start, bits) in blocks {
            assert_eq!(u32::from(start), next, "contiguous");
            assert_eq!(u32::from(start) % (1 << bits), 0, "aligned");
            next += 1 << bits;
        }
        assert_eq!(next, u32::from(hi) + 1, "covers exactly {lo}-{hi}");
    }
}

#[test]
fn narrow_allow_inside_broad_deny_is_denied() {
    let mut p = EndpointPolicy::default();
    p.entries.insert(
        PolicyEntry::new(Direction::Ingress, 300, 6, 80, 80),
        Verdict::Allow,
    );
    p.entries.insert(
        PolicyEntry::new(Direction::Ingress, 300, 6, 0, 1023),
        Verdict::Deny,
    );
    p.entries.insert(
        PolicyEntry::new(Direction::Ingress, 300, 6, 8080, 8080),
        Verdict::Allow,
    );
    let enc = encode_policy(1, &p);
    assert_eq!(
        policy_layer(&enc, Peer::identity(300), Direction::Ingress, 6, 80),
        Some(Verdict::Deny)
    );
    assert_eq!(
        policy_layer(&enc, Peer::identity(300), Direction::Ingress, 6, 8080),
        Some(Verdict::Allow)
    );
    assert_eq!(
        policy_layer(&enc, Peer::identity(300), Direction::Egress, 6, 8080),
        None
    );
    assert_eq!(
        policy_layer(&enc, Peer::identity(301), Direction::Ingress, 6, 8080),
        None
    );
}

#[test]
#[cfg_attr(
    feature = "upgrade-test-encoding",
    ignore = "asserts the real encoding's blocks; the upgrade check's build splits any-protocol ones"
)]
fn any_identity_deny_beats_exact_allow_and_any_proto_covers_ports() {
    let mut p = EndpointPolicy::default();
    p.entries.insert(
        PolicyEntry::new(Direction::Egress, 300, 0, 0, 65535),
        Verdict::Allow,
    );
    p.entries.insert(
        PolicyEntry::new(Direction::Egress, 0, 17, 53, 53),
        Verdict::Deny,
    );
    let enc = encode_policy(1, &p);
    assert_eq!(enc.len(), 2, "one wildcard block + one port block: {enc:?}");
    assert_eq!(
        policy_layer(&enc, Peer::identity(300), Direction::Egress, 6, 443),
        Some(Verdict::Allow)
    );
    assert_eq!(
        policy_layer(&enc, Peer::identity(300), Direction::Egress, 17, 53),
        Some(Verdict::Deny)
    );
    assert_eq!(
        policy_layer(&enc, Peer::identity(300), Direction::Egress, 1, 8),
        Some(Verdict::Allow)
    );
}

/// Tiny deterministic generator (no rand crate in the workspace).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, n: u32) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        u32::try_from(self.0 >> 33).unwrap() % n
    }
    fn port(&mut self) -> u16 {
        // Concentrate on a small window so ranges overlap often.
        u16::try_from(1000 + self.next(64)).unwrap()
    }
}

#[test]
fn encoding_matches_the_contract_on_random_policies() {
    let mut rng = Lcg(42);
    let protos = [0u8, 6, 17, 132];
    let ids = [0u32, 300, 301];
    for round in 0..300 {
        let mut p = EndpointPolicy::default();
        for _ in 0..=rng.next(8) {
            let proto = protos[rng.next(4) as usize];
            let (mut lo, mut hi) = (rng.port(), rng.port());
            if lo > hi {
                std::mem::swap(&mut lo, &mut hi);
            }
            if proto == 0 {
                (lo, hi) = (0, 65535);
            }
            let d = if rng.next(2) == 0 {
                Direction::Ingress
            } else {
                Direction::Egress
            };
            let v = if rng.next(3) == 0 {
                Verdict::Deny
            } else {
                Verdict::Allow
            };
            p.entries.insert(
                PolicyEntry::new(d, ids[rng.next(3) as usize], proto, lo, hi),
                v,
            );
        }
        let enc = encode_policy(7, &p);
        for &id in &ids[1..] {
            for d in [Direction::Ingress, Direction::Egress] {
                for &proto in &protos[1..] {
                    for port in 995..1070 {
                        assert_eq!(
                            policy_layer(&enc, Peer::identity(id), d, proto, port),
                            naive(&p, id, d, proto, port),
                            "round {round}: id {id} {d:?} proto {proto} port {port}\n{p:#?}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn a_slot_digest_keeps_its_value_across_versions() {
    // Persisted per slot (`crate::slots`): another value makes a restarted manager rewrite
    // every slot instead of trusting it. Changed in encoding version 3 (the digest over the
    // identities' digests); the empty slot's stayed.
    let block = PolicyBlock {
        key: abi::PolicyKey {
            policy_id: 7,
            identity: 256,
            direction: 0,
            proto: 6,
            dport: 80u16.to_be(),
        },
        prefix_len: 96,
    };
    let encoded: Encoded = [(block, PolicyValue::verdict(abi::VERDICT_ALLOW))]
        .into_iter()
        .collect();
    assert_eq!(abi::VERDICT_ALLOW, 1);
    assert_eq!(digest(&encoded, 1), 0x9036_98ad_3a82_5e56);
    assert_eq!(digest(&Encoded::new(), 3), 0xed20_2287_f403_d086);
}

/// Enforcement flags (ingress, egress), tier flags and entries of one computed policy.
type EncodingCase = (bool, bool, TierFlags, Vec<(PolicyEntry, Verdict)>);

fn tv(priority: u16, rule: u8, action: TierAction) -> Verdict {
    Verdict::Tier(TierVerdict {
        priority,
        rule,
        action,
    })
}

/// Fixed computed policies: any protocol, single ports, unaligned ranges, the whole range,
/// ICMP types, an any-identity entry, by-IP identities, denies covering allows, both
/// directions, every enforcement combination; both tiers with each action, any-protocol and
/// port entries, a by-IP identity, with and without the `NetworkPolicy` layer.
#[allow(clippy::too_many_lines, reason = "one line per corpus entry")]
fn encoding_corpus() -> Vec<EncodingCase> {
    use weft_policy::mapstate::proto::{ANY, ICMP, SCTP, TCP, UDP};
    use weft_policy::mapstate::reserved;
    let (i, e) = (Direction::Ingress, Direction::Egress);
    let none = TierFlags::default();
    let (admin, baseline) = (Tier::Admin, Tier::Baseline);
    vec![
        (false, false, none, vec![]),
        (true, false, none, vec![]),
        (
            false,
            true,
            none,
            vec![(PolicyEntry::new(e, 0, ANY, 0, 65535), Verdict::Allow)],
        ),
        (
            true,
            false,
            TierFlags {
                admin_ingress: true,
                baseline_egress: true,
                ..TierFlags::default()
            },
            vec![
                (PolicyEntry::new(i, 300, TCP, 80, 80), Verdict::Allow),
                (
                    PolicyEntry::new(i, 300, TCP, 80, 80).in_tier(admin),
                    tv(10, 0, TierAction::Deny),
                ),
                (
                    PolicyEntry::new(i, 300, TCP, 8000, 8080).in_tier(admin),
                    tv(10, 1, TierAction::Accept),
                ),
                (
                    PolicyEntry::new(i, 0, ANY, 0, 65535).in_tier(admin),
                    tv(20, 1, TierAction::Pass),
                ),
                (
                    PolicyEntry::new(i, reserved::by_ip(reserved::FIRST_CIDR + 1), UDP, 53, 53)
                        .in_tier(admin),
                    tv(5, 3, TierAction::Accept),
                ),
                (
                    PolicyEntry::new(e, 0, ANY, 0, 65535).in_tier(baseline),
                    tv(1000, 24, TierAction::Deny),
                ),
                (
                    PolicyEntry::new(e, 302, SCTP, 9000, 9000).in_tier(baseline),
                    tv(0, 0, TierAction::Accept),
                ),
            ],
        ),
        (
            true,
            true,
            none,
            vec![
                (PolicyEntry::new(i, 300, TCP, 80, 80), Verdict::Allow),
                (PolicyEntry::new(i, 300, TCP, 1, 1023), Verdict::Deny),
                (PolicyEntry::new(i, 300, TCP, 8000, 8080), Verdict::Allow),
                (PolicyEntry::new(i, 301, UDP, 53, 53), Verdict::Allow),
                (PolicyEntry::new(i, 301, ICMP, 8, 8), Verdict::Allow),
                (PolicyEntry::new(i, 0, SCTP, 9000, 9000), Verdict::Allow),
                (
                    PolicyEntry::new(i, reserved::HOST, ANY, 0, 65535),
                    Verdict::Allow,
                ),
                (
                    PolicyEntry::new(e, reserved::WORLD, TCP, 0, 65535),
                    Verdict::Allow,
                ),
                (PolicyEntry::new(e, 302, ANY, 0, 65535), Verdict::Deny),
                (PolicyEntry::new(e, 302, TCP, 443, 443), Verdict::Allow),
                (
                    PolicyEntry::new(
                        e,
                        reserved::by_ip(reserved::FIRST_CIDR + 1),
                        TCP,
                        32000,
                        32768,
                    ),
                    Verdict::Allow,
                ),
                (
                    PolicyEntry::new(e, reserved::FIRST_CIDR + 1, UDP, 65535, 65535),
                    Verdict::Allow,
                ),
            ],
        ),
    ]
}

/// A key's bytes as the kernel compares them (its `repr(C)` layout).
fn kernel_key_bytes(k: &abi::PolicyKey) -> Vec<u8> {
    use std::mem::{offset_of, size_of};
    let mut key = vec![0u8; size_of::<abi::PolicyKey>()];
    let mut put = |offset: usize, bytes: &[u8]| {
        key[offset..offset + bytes.len()].copy_from_slice(bytes);
    };
    put(
        offset_of!(abi::PolicyKey, policy_id),
        &k.policy_id.to_le_bytes(),
    );
    put(
        offset_of!(abi::PolicyKey, identity),
        &k.identity.to_le_bytes(),
    );
    put(offset_of!(abi::PolicyKey, direction), &[k.direction]);
    put(offset_of!(abi::PolicyKey, proto), &[k.proto]);
    // Already in network byte order: its bytes in memory are what the kernel compares.
    put(offset_of!(abi::PolicyKey, dport), &k.dport.to_ne_bytes());
    key
}

/// The golden corpus of [`POLICY_ENCODING_VERSION`] ([`encoding_corpus`]), encoded and
/// digested as the kernel sees it: the key's layout, each key's bytes, its prefix length and
/// verdict; with the flag bits and the slot digest. A change to any of them fails this test
/// until a line is appended to [`POLICY_ENCODING_GOLDENS`] and the version bumped.
#[test]
fn a_change_of_the_encoding_comes_with_a_new_encoding_version() {
    use std::mem::{offset_of, size_of};
    let mut h = weft_api::fnv::Fnv64::new();
    for n in [
        size_of::<abi::PolicyKey>(),
        offset_of!(abi::PolicyKey, policy_id),
        offset_of!(abi::PolicyKey, identity),
        offset_of!(abi::PolicyKey, direction),
        offset_of!(abi::PolicyKey, proto),
        offset_of!(abi::PolicyKey, dport),
    ] {
        h.feed(&u64::try_from(n).unwrap().to_le_bytes());
    }
    // The two-step layout in the kernel: pairs, then port lists (module `lists`).
    for n in [
        size_of::<abi::PolicyPairKey>(),
        offset_of!(abi::PolicyPairKey, policy_id),
        offset_of!(abi::PolicyPairKey, identity),
        offset_of!(abi::PolicyPairKey, direction),
        size_of::<abi::PolicyListKey>(),
        offset_of!(abi::PolicyListKey, list_id),
        offset_of!(abi::PolicyListKey, proto),
        offset_of!(abi::PolicyListKey, dport),
        abi::POLICY_LIST_PREFIX_SHIFT as usize,
    ] {
        h.feed(&u64::try_from(n).unwrap().to_le_bytes());
    }
    for n in [
        size_of::<abi::PolicyValue>(),
        offset_of!(abi::PolicyValue, verdict),
        offset_of!(abi::PolicyValue, rule),
        offset_of!(abi::PolicyValue, priority),
    ] {
        h.feed(&u64::try_from(n).unwrap().to_le_bytes());
    }
    for (ingress, egress, tiers, entries) in encoding_corpus() {
        let p = EndpointPolicy {
            ingress_enforced: ingress,
            egress_enforced: egress,
            tiers,
            entries: entries.into_iter().collect(),
        };
        for (b, v) in &encode_policy(7, &p) {
            h.feed(&b.prefix_len.to_le_bytes());
            h.feed(&kernel_key_bytes(&b.key));
            h.feed(&[v.verdict, v.rule]);
            h.feed(&v.priority.to_ne_bytes());
        }
        h.feed(&enforcement_flags(&p).to_le_bytes());
        h.feed(&policy_digest(&p).to_le_bytes());
    }
    let got = h.finish();
    let (last_version, last_golden) = *POLICY_ENCODING_GOLDENS.last().unwrap();
    if SPLIT_ANY_PROTOCOL && POLICY_ENCODING_VERSION == UPGRADE_TEST_ENCODING_VERSION {
        // The rolling-upgrade check's build: another encoding under a version of its own (the
        // unstamped build keeps the real version and fails below, as a build must that changes
        // the encoding without a bump).
        assert!(
            got != last_golden,
            "feature upgrade-test-encoding must encode the golden corpus differently"
        );
        assert!(
            POLICY_ENCODING_GOLDENS
                .iter()
                .all(|&(v, _)| v != POLICY_ENCODING_VERSION)
        );
        return;
    }
    assert_eq!(
        last_version, POLICY_ENCODING_VERSION,
        "POLICY_ENCODING_GOLDENS must end with the line of POLICY_ENCODING_VERSION"
    );
    for pair in POLICY_ENCODING_GOLDENS.windows(2) {
        assert!(
            pair[0].0 < pair[1].0 && pair[0].1 != pair[1].1,
            "POLICY_ENCODING_GOLDENS: versions increase and each digest is new"
        );
    }
    assert!(
        got == last_golden,
        "the policy map encoding or slot digest changed: the golden corpus digests to \
         {got:#018x}, version {POLICY_ENCODING_VERSION} gave {last_golden:#018x}. Bump \
         POLICY_ENCODING_VERSION to {next} and append `({next}, {got:#018x}),` to \
         POLICY_ENCODING_GOLDENS in manager/src/datapath/encode.rs, so a restart does not \
         trust what older builds wrote",
        next = POLICY_ENCODING_VERSION + 1,
    );
}

fn in_tier(
    tier: Tier,
    d: Direction,
    id: u32,
    proto: u8,
    (lo, hi): (u16, u16),
    v: Verdict,
) -> (PolicyEntry, Verdict) {
    (PolicyEntry::new(d, id, proto, lo, hi).in_tier(tier), v)
}

#[test]
#[cfg_attr(
    feature = "upgrade-test-encoding",
    ignore = "asserts the real encoding's blocks; the upgrade check's build splits any-protocol ones"
)]
#[allow(clippy::too_many_lines, reason = "one policy, checked entry by entry")]
fn tier_entries_carry_their_tier_in_the_key_and_precedence_in_the_value() {
    let mut p = EndpointPolicy {
        ingress_enforced: true,
        ..EndpointPolicy::default()
    };
    p.tiers.set(Tier::Admin, Direction::Ingress, true);
    p.tiers.set(Tier::Baseline, Direction::Egress, true);
    p.entries.extend([
        (
            PolicyEntry::new(Direction::Ingress, 300, 6, 80, 80),
            Verdict::Allow,
        ),
        in_tier(
            Tier::Admin,
            Direction::Ingress,
            300,
            6,
            (80, 80),
            tv(7, 2, TierAction::Pass),
        ),
        in_tier(
            Tier::Baseline,
            Direction::Egress,
            0,
            0,
            (0, 65535),
            tv(1000, 0, TierAction::Deny),
        ),
    ]);
    let enc = encode_policy(4, &p);
    let by_dir: BTreeMap<u8, PolicyValue> =
        enc.iter().map(|(b, v)| (b.key.direction, *v)).collect();
    assert_eq!(enc.len(), 3, "{enc:#?}");
    // The NetworkPolicy entry keeps the key and value it had before tiers.
    assert_eq!(
        by_dir[&abi::DIR_INGRESS],
        PolicyValue::verdict(abi::VERDICT_ALLOW)
    );
    assert_eq!(
        by_dir[&(abi::DIR_INGRESS | (abi::TIER_ADMIN << abi::POLICY_TIER_SHIFT))],
        PolicyValue {
            verdict: abi::VERDICT_TIER_PASS,
            rule: 2,
            priority: 7
        }
    );
    let baseline = abi::policy_direction(abi::DIR_EGRESS, abi::TIER_BASELINE);
    assert_eq!(baseline, 0x21);
    assert_eq!(
        by_dir[&baseline],
        PolicyValue {
            verdict: abi::VERDICT_TIER_DENY,
            rule: 0,
            priority: 1000
        }
    );
    assert_eq!(
        enforcement_flags(&p),
        abi::EP_INGRESS_ENFORCED | abi::EP_ADMIN_INGRESS | abi::EP_BASELINE_EGRESS
    );
    assert_eq!(tier_flags(enforcement_flags(&p)), p.tiers);
    // The slot digest covers the tier flags and every value byte.
    let mut other = p.clone();
    other.tiers.set(Tier::Admin, Direction::Egress, true);
    assert_ne!(policy_digest(&p), policy_digest(&other));
    let mut other = p.clone();
    other.entries.extend([in_tier(
        Tier::Admin,
        Direction::Ingress,
        300,
        6,
        (80, 80),
        tv(7, 3, TierAction::Pass),
    )]);
    assert_ne!(policy_digest(&p), policy_digest(&other));
    // Pass on 300's port 80 goes on to the NetworkPolicy layer, which allows it; egress is not
    // enforced: the Baseline tier denies.
    let d = lookup_encoded(
        &enc,
        enforcement_flags(&p),
        Peer::identity(300),
        Direction::Ingress,
        6,
        80,
    );
    assert_eq!(
        (d.verdict, d.reason, d.rule),
        (Verdict::Allow, abi::REASON_ALLOW_POLICY, None)
    );
    let d = lookup_encoded(
        &enc,
        enforcement_flags(&p),
        Peer::identity(300),
        Direction::Egress,
        17,
        53,
    );
    assert_eq!(
        (d.verdict, d.reason),
        (Verdict::Deny, abi::REASON_DROP_BASELINE_DENY)
    );
    assert_eq!(
        d.rule,
        Some((
            Tier::Baseline,
            TierVerdict {
                priority: 1000,
                rule: 0,
                action: TierAction::Deny
            }
        ))
    );
    // Without its flag a tier is not looked up.
    let d = lookup_encoded(
        &enc,
        abi::EP_INGRESS_ENFORCED,
        Peer::identity(300),
        Direction::Egress,
        17,
        53,
    );
    assert_eq!(
        (d.verdict, d.reason),
        (Verdict::Allow, abi::REASON_ALLOW_NOT_ENFORCED)
    );
}

#[test]
fn the_first_in_precedence_wins_across_exact_any_and_by_ip_identities() {
    use weft_policy::mapstate::reserved;
    let cidr = reserved::FIRST_CIDR + 4;
    let twin = reserved::by_ip(cidr);
    let ingress = Direction::Ingress;
    let mut p = EndpointPolicy::default();
    p.tiers.set(Tier::Admin, ingress, true);
    p.entries.extend([
        // Exact: accept at priority 10; any peer: deny at 10 but a later rule; by IP: pass at 9.
        in_tier(
            Tier::Admin,
            ingress,
            300,
            6,
            (80, 80),
            tv(10, 1, TierAction::Accept),
        ),
        in_tier(
            Tier::Admin,
            ingress,
            0,
            6,
            (80, 81),
            tv(10, 2, TierAction::Deny),
        ),
        in_tier(
            Tier::Admin,
            ingress,
            twin,
            0,
            (0, 65535),
            tv(9, 0, TierAction::Pass),
        ),
        // Same priority and rule: deny before pass before accept.
        in_tier(
            Tier::Admin,
            ingress,
            300,
            6,
            (90, 90),
            tv(3, 0, TierAction::Accept),
        ),
        in_tier(
            Tier::Admin,
            ingress,
            0,
            6,
            (90, 90),
            tv(3, 0, TierAction::Deny),
        ),
    ]);
    let enc = encode_policy(1, &p);
    let tier = |peer, port| tier_entry(&enc, Tier::Admin, peer, ingress, 6, port).map(|v| v.action);
    let pod = Peer {
        identity: 300,
        cidr_identity: cidr,
    };
    assert_eq!(tier(Peer::identity(300), 80), Some(TierAction::Accept));
    assert_eq!(
        tier(pod, 80),
        Some(TierAction::Pass),
        "by-IP at priority 9 comes first"
    );
    assert_eq!(tier(Peer::identity(301), 81), Some(TierAction::Deny));
    assert_eq!(tier(Peer::identity(300), 81), Some(TierAction::Deny));
    assert_eq!(tier(Peer::identity(300), 90), Some(TierAction::Deny));
    assert_eq!(tier(Peer::identity(300), 82), None);
    assert_eq!(tier(pod, 82), Some(TierAction::Pass));
    // A pass with nothing after it: allowed as not enforced.
    let d = lookup_encoded(&enc, enforcement_flags(&p), pod, ingress, 6, 80);
    assert_eq!(
        (d.verdict, d.reason),
        (Verdict::Allow, abi::REASON_ALLOW_NOT_ENFORCED)
    );
}

/// The contract's decision for a peer that may also have a by-IP twin: a tier's first entry
/// among those of its identity (0 included) and its twin; the `NetworkPolicy` layer on its
/// identity, then, when that decided nothing, on its twin. Without a twin it is
/// [`EndpointPolicy::lookup`].
fn reference(p: &EndpointPolicy, peer: Peer, d: Direction, proto: u8, port: u16) -> Verdict {
    let twin = (peer.cidr_identity != 0).then_some(peer.cidr_identity | abi::IDENTITY_BY_IP);
    let tier = |t: Tier| {
        let own = p.tier_entry(t, d, peer.identity, proto, port);
        let by_ip = twin.and_then(|tw| p.tier_entry(t, d, tw, proto, port));
        own.into_iter().chain(by_ip).min()
    };
    let final_action = |t: Tier| match tier(t)?.action {
        TierAction::Accept => Some(Verdict::Allow),
        TierAction::Deny => Some(Verdict::Deny),
        TierAction::Pass => None,
    };
    if let Some(v) = final_action(Tier::Admin) {
        return v;
    }
    let enforced = match d {
        Direction::Ingress => p.ingress_enforced,
        Direction::Egress => p.egress_enforced,
    };
    if enforced {
        let np = naive(p, peer.identity, d, proto, port)
            .or_else(|| twin.and_then(|tw| naive(p, tw, d, proto, port)));
        return np.unwrap_or(Verdict::Deny);
    }
    final_action(Tier::Baseline).unwrap_or(Verdict::Allow)
}

/// Random entries of one tier and direction, made disjoint per identity and protocol as the
/// computation does ([`weft_policy::compute::resolve_tier`]).
fn random_tier(
    rng: &mut Lcg,
    tier: Tier,
    d: Direction,
    ids: &[u32],
) -> Vec<(PolicyEntry, Verdict)> {
    let mut found = BTreeMap::new();
    for _ in 0..rng.next(6) {
        let proto = [0u8, 6, 17][rng.next(3) as usize];
        let (mut lo, mut hi) = (rng.port(), rng.port());
        if lo > hi {
            std::mem::swap(&mut lo, &mut hi);
        }
        if proto == 0 {
            (lo, hi) = (0, 65535);
        }
        let action = [TierAction::Deny, TierAction::Pass, TierAction::Accept][rng.next(3) as usize];
        let v = TierVerdict {
            priority: u16::try_from(rng.next(4)).unwrap() * 100,
            rule: u8::try_from(rng.next(3)).unwrap(),
            action,
        };
        let id = ids[rng.next(u32::try_from(ids.len()).unwrap()) as usize];
        found.insert(PolicyEntry::new(d, id, proto, lo, hi), v);
    }
    weft_policy::compute::resolve_tier(&found)
        .into_iter()
        .map(|(e, v)| (e.in_tier(tier), Verdict::Tier(v)))
        .collect()
}

#[test]
fn the_datapath_decision_matches_the_contract_on_random_tiered_policies() {
    use weft_policy::mapstate::reserved;
    let mut rng = Lcg(7);
    let cidr = reserved::FIRST_CIDR + 2;
    let twin = reserved::by_ip(cidr);
    let ids = [0u32, 300, 301, twin];
    let peers = [
        Peer::identity(300),
        Peer::identity(301),
        Peer {
            identity: 300,
            cidr_identity: cidr,
        },
    ];
    let mut decided = BTreeMap::new();
    for round in 0..400 {
        let mut p = EndpointPolicy {
            ingress_enforced: rng.next(2) == 0,
            egress_enforced: rng.next(3) == 0,
            ..EndpointPolicy::default()
        };
        for _ in 0..rng.next(4) {
            let d = [Direction::Ingress, Direction::Egress][rng.next(2) as usize];
            let proto = [0u8, 6, 17][rng.next(3) as usize];
            let (lo, hi) = if proto == 0 {
                (0, 65535)
            } else {
                let (a, b) = (rng.port(), rng.port());
                (a.min(b), a.max(b))
            };
            let v = if rng.next(3) == 0 {
                Verdict::Deny
            } else {
                Verdict::Allow
            };
            p.entries.insert(
                PolicyEntry::new(d, ids[rng.next(4) as usize], proto, lo, hi),
                v,
            );
        }
        for tier in Tier::CLUSTER {
            for d in [Direction::Ingress, Direction::Egress] {
                let entries = random_tier(&mut rng, tier, d, &ids);
                // Mostly set when there are entries; sometimes not (never looked up then).
                p.tiers
                    .set(tier, d, !entries.is_empty() && rng.next(8) != 0);
                p.entries.extend(entries);
            }
        }
        let enc = encode_policy(7, &p);
        let flags = enforcement_flags(&p);
        for peer in peers {
            for d in [Direction::Ingress, Direction::Egress] {
                for proto in [6u8, 17, 132] {
                    for port in 995..1070 {
                        let got = lookup_encoded(&enc, flags, peer, d, proto, port);
                        let want = reference(&p, peer, d, proto, port);
                        assert_eq!(
                            got.verdict, want,
                            "round {round}: {peer:?} {d:?} proto {proto} port {port}: {got:?}\n{p:#?}"
                        );
                        if peer.cidr_identity == 0 {
                            assert_eq!(want, p.lookup(d, peer.identity, proto, port));
                        }
                        *decided.entry(got.reason).or_insert(0u32) += 1;
                    }
                }
            }
        }
    }
    // Every layer decided something somewhere: the corpus exercises them all.
    for reason in [
        abi::REASON_ALLOW_ADMIN,
        abi::REASON_DROP_ADMIN_DENY,
        abi::REASON_ALLOW_POLICY,
        abi::REASON_DROP_POLICY_DENY,
        abi::REASON_DROP_POLICY_DEFAULT,
        abi::REASON_ALLOW_BASELINE,
        abi::REASON_DROP_BASELINE_DENY,
        abi::REASON_ALLOW_NOT_ENFORCED,
    ] {
        assert!(
            decided.get(&reason).copied().unwrap_or(0) > 0,
            "reason {reason} never decided: {decided:?}"
        );
    }
}

/// The rolling-upgrade check's encoding (feature `upgrade-test-encoding`: each any-protocol
/// block as its two halves of the protocol byte) writes other entries than the real one for
/// every policy with an any-protocol entry, and decides every packet the same: the upgrade
/// check's traffic must not see the difference, only `weftctl map verify` and the slot
/// records may.
#[test]
fn the_upgrade_test_encoding_differs_and_decides_the_same() {
    let mut differed = 0;
    for (ingress, egress, tiers, entries) in encoding_corpus() {
        let entries: BTreeMap<PolicyEntry, Verdict> = entries.into_iter().collect();
        let flags = enforcement_flags(&EndpointPolicy {
            ingress_enforced: ingress,
            egress_enforced: egress,
            tiers,
            entries: entries.clone(),
        });
        let real = encode_entries_as(7, &entries, false);
        let split = encode_entries_as(7, &entries, true);
        if entries.keys().any(|e| e.proto == 0) {
            assert_ne!(real, split, "an any-protocol entry is encoded differently");
            differed += 1;
        } else {
            assert_eq!(real, split);
        }
        let mut ids: BTreeSet<u32> = entries.keys().map(|e| e.identity).collect();
        ids.extend([0, 1, 2, 999]);
        for &identity in &ids {
            for cidr_identity in [0, 16_777_300] {
                let peer = Peer {
                    identity,
                    cidr_identity,
                };
                for d in [Direction::Ingress, Direction::Egress] {
                    for proto in [0, 1, 6, 17, 58, 127, 128, 132, 255] {
                        for port in [0, 1, 53, 79, 80, 443, 1024, 8080, 65535] {
                            assert_eq!(
                                lookup_encoded(&real, flags, peer, d, proto, port),
                                lookup_encoded(&split, flags, peer, d, proto, port),
                                "{peer:?} {d:?} proto {proto} port {port}"
                            );
                        }
                    }
                }
            }
        }
    }
    assert!(differed > 0, "the corpus has any-protocol entries");
}
