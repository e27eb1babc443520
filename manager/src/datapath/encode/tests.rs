use super::*;
use weft_policy::mapstate::PolicyEntry;

/// The contract's semantics, evaluated directly on the entries.
fn naive(p: &EndpointPolicy, identity: u32, d: Direction, proto: u8, port: u16) -> Option<Verdict> {
    let matching: Vec<Verdict> = p
        .entries
        .iter()
        .filter(|(e, _)| {
            e.direction == d
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
        lookup_encoded(&enc, 300, Direction::Ingress, 6, 80),
        Some(Verdict::Deny)
    );
    assert_eq!(
        lookup_encoded(&enc, 300, Direction::Ingress, 6, 8080),
        Some(Verdict::Allow)
    );
    assert_eq!(lookup_encoded(&enc, 300, Direction::Egress, 6, 8080), None);
    assert_eq!(lookup_encoded(&enc, 301, Direction::Ingress, 6, 8080), None);
}

#[test]
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
        lookup_encoded(&enc, 300, Direction::Egress, 6, 443),
        Some(Verdict::Allow)
    );
    assert_eq!(
        lookup_encoded(&enc, 300, Direction::Egress, 17, 53),
        Some(Verdict::Deny)
    );
    assert_eq!(
        lookup_encoded(&enc, 300, Direction::Egress, 1, 8),
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
                            lookup_encoded(&enc, id, d, proto, port),
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
fn diff_upserts_changed_and_new_then_removes_stale() {
    let mut a = EndpointPolicy::default();
    a.entries.insert(
        PolicyEntry::new(Direction::Ingress, 300, 6, 80, 80),
        Verdict::Allow,
    );
    a.entries.insert(
        PolicyEntry::new(Direction::Ingress, 300, 6, 443, 443),
        Verdict::Allow,
    );
    let mut b = a.clone();
    b.entries
        .remove(&PolicyEntry::new(Direction::Ingress, 300, 6, 443, 443));
    b.entries.insert(
        PolicyEntry::new(Direction::Ingress, 300, 6, 80, 80),
        Verdict::Deny,
    );
    b.entries.insert(
        PolicyEntry::new(Direction::Ingress, 301, 17, 53, 53),
        Verdict::Allow,
    );
    let (ea, eb) = (encode_policy(1, &a), encode_policy(1, &b));
    let (upserts, removes) = diff(&ea, &eb);
    assert_eq!(upserts.len(), 2);
    assert!(
        upserts
            .iter()
            .any(|(blk, v)| blk.key.identity == 301 && *v == abi::VERDICT_ALLOW)
    );
    assert!(
        upserts
            .iter()
            .any(|(blk, v)| u16::from_be(blk.key.dport) == 80 && *v == abi::VERDICT_DENY)
    );
    assert_eq!(removes.len(), 1);
    assert_eq!(u16::from_be(removes[0].key.dport), 443);
    assert_eq!(diff(&eb, &eb), (vec![], vec![]));
}

#[test]
fn diff_matches_a_lookup_per_block_on_random_maps() {
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut random_map = |n: usize| -> Encoded {
        (0..n)
            .map(|_| {
                let r = next();
                let block = PolicyBlock {
                    key: PolicyKey {
                        policy_id: 7,
                        identity: (r % 5) as u32,
                        direction: ((r >> 8) % 2) as u8,
                        proto: 6,
                        dport: ((r >> 16) % 8) as u16,
                    },
                    prefix_len: abi::POLICY_FULL_PREFIX,
                };
                (block, 1 + ((r >> 32) % 2) as u8)
            })
            .collect()
    };
    for round in 0..200 {
        let (old, new) = (random_map(round % 40), random_map((round * 7) % 40));
        let want_upserts: Vec<(PolicyBlock, u8)> = new
            .iter()
            .filter(|(b, v)| old.get(b) != Some(v))
            .map(|(b, v)| (*b, *v))
            .collect();
        let want_removes: Vec<PolicyBlock> = old
            .keys()
            .filter(|b| !new.contains_key(b))
            .copied()
            .collect();
        assert_eq!(
            diff(&old, &new),
            (want_upserts, want_removes),
            "round {round}"
        );
    }
}

#[test]
fn a_slot_digest_keeps_its_value_across_versions() {
    // Persisted per slot (`crate::slots`): another value makes a restarted manager rewrite
    // every slot instead of trusting it.
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
    let encoded: Encoded = [(block, abi::VERDICT_ALLOW)].into_iter().collect();
    assert_eq!(abi::VERDICT_ALLOW, 1);
    assert_eq!(digest(&encoded, 1), 0xe449_a923_1c4d_ff08);
    assert_eq!(digest(&Encoded::new(), 3), 0xed20_2287_f403_d086);
}

/// Enforcement flags (ingress, egress) and entries of one computed policy.
type EncodingCase = (bool, bool, Vec<(PolicyEntry, Verdict)>);

/// Fixed computed policies: any protocol, single ports, unaligned ranges, the whole range,
/// ICMP types, an any-identity entry, by-IP identities, denies covering allows, both
/// directions, every enforcement combination.
fn encoding_corpus() -> Vec<EncodingCase> {
    use weft_policy::mapstate::proto::{ANY, ICMP, SCTP, TCP, UDP};
    use weft_policy::mapstate::reserved;
    let (i, e) = (Direction::Ingress, Direction::Egress);
    vec![
        (false, false, vec![]),
        (true, false, vec![]),
        (
            false,
            true,
            vec![(PolicyEntry::new(e, 0, ANY, 0, 65535), Verdict::Allow)],
        ),
        (
            true,
            true,
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
    for (ingress, egress, entries) in encoding_corpus() {
        let p = EndpointPolicy {
            ingress_enforced: ingress,
            egress_enforced: egress,
            entries: entries.into_iter().collect(),
        };
        for (b, v) in &encode_policy(7, &p) {
            h.feed(&b.prefix_len.to_le_bytes());
            h.feed(&kernel_key_bytes(&b.key));
            h.feed(&[*v]);
        }
        h.feed(&enforcement_flags(&p).to_le_bytes());
        h.feed(&policy_digest(&p).to_le_bytes());
    }
    let got = h.finish();
    let (last_version, last_golden) = *POLICY_ENCODING_GOLDENS.last().unwrap();
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
