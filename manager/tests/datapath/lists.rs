//! The two-step policy layout on real maps: pairs pointing at shared port lists, releases,
//! writes that fail half-way, and what a crash can leave behind.

use super::*;
use aya::maps::lpm_trie::{Key, LpmTrie};
use aya::maps::{HashMap as BpfHash, Map, MapData};
use weft_ebpf as abi;

/// How many entries the raw map `name` holds.
fn raw_len(dp: &BpfDatapath, name: &str) -> usize {
    dp.map_dump(name).unwrap().len()
}

/// A world with both pods attached, servers on B's ports 6000 and 6001, and B's slot holding
/// `rules`: the datapath, B's IPv4 address and B's slot.
fn serving(w: &World, rules: &str) -> (BpfDatapath, IpAddr, u32) {
    let dp = open_and_attach(w);
    echo_servers(&w.pods[B].ns, 6000);
    echo_servers(&w.pods[B].ns, 6001);
    let slot = w.pods[B].ep.policy_id;
    dp.apply_policy(slot, &policy(true, false, rules), 1)
        .unwrap();
    (dp, w.pods[B].ip4.into(), slot)
}

/// A world with both pods attached to a datapath whose `policy_lists` holds 8 entries, and
/// servers on B's `ports`: the datapath, B's IPv4 address and B's slot.
fn eight_entries(w: &World, ports: [u16; 2]) -> (BpfDatapath, IpAddr, u32) {
    let config = weft_manager::datapath::DatapathConfig {
        policy_lists_max: 8,
        ..w.config()
    };
    let dp = open_and_attach_with(w, config);
    for port in ports {
        echo_servers(&w.pods[B].ns, port);
    }
    (dp, w.pods[B].ip4.into(), w.pods[B].ep.policy_id)
}

#[test]
fn slots_with_the_same_ports_share_one_list_until_the_last_lets_go() {
    let w = World::new();
    // Three peers with the same ports, in two slots: one list of two entries, six pairs.
    let rules = "ingress 1000 tcp 6000 allow; ingress 1000 udp 53 allow; \
                 ingress 1001 tcp 6000 allow; ingress 1001 udp 53 allow; \
                 ingress 1002 tcp 6000 allow; ingress 1002 udp 53 allow";
    let (dp, b_ip, slot) = serving(&w, rules);
    dp.apply_policy(900, &policy(true, false, rules), 1)
        .unwrap();
    assert_eq!(raw_len(&dp, "policy_pairs"), 6);
    assert_eq!(raw_len(&dp, "policy_lists"), 2, "one list for every pair");
    assert_eq!(
        raw_len(&dp, "policy"),
        12,
        "each slot's entries, as they stand for"
    );
    assert!(
        tcp_ok(&w.pods[A].ns, b_ip, 6000),
        "allowed through the list"
    );
    assert!(!tcp_ok(&w.pods[A].ns, b_ip, 6001), "a port not in it");

    // The other slot lets go: the list stays for this one.
    dp.release_slot(900).unwrap();
    assert_eq!(raw_len(&dp, "policy_lists"), 2);
    assert!(tcp_ok(&w.pods[A].ns, b_ip, 6000), "still allowed");

    // One peer of this slot gets another port: a list of its own; the others keep theirs.
    let changed = rules.replacen(
        "ingress 1000 tcp 6000 allow",
        "ingress 1000 tcp 6001 allow",
        1,
    );
    dp.apply_policy(slot, &policy(true, false, &changed), 2)
        .unwrap();
    assert_eq!(
        raw_len(&dp, "policy_lists"),
        7,
        "the union its pair went through (three entries) stays until the batch ends"
    );
    dp.end_policy_writes().unwrap();
    assert_eq!(raw_len(&dp, "policy_lists"), 4, "two lists of two entries");
    assert!(tcp_ok(&w.pods[A].ns, b_ip, 6001), "the new port");
    assert!(!tcp_ok(&w.pods[A].ns, b_ip, 6000), "the old one is gone");

    dp.release_slot(slot).unwrap();
    assert_eq!(raw_len(&dp, "policy_pairs"), 0);
    assert_eq!(
        raw_len(&dp, "policy_lists"),
        0,
        "no list outlives its last pair"
    );
}

#[test]
fn idle_lists_make_room_for_a_write_that_needs_it() {
    let w = World::new();
    let (dp, b_ip, slot) = eight_entries(&w, [6000, 6003]);
    let ports = |a: u16, b: u16| format!("ingress 1000 tcp {a} allow; ingress 1000 tcp {b} allow");
    dp.apply_policy(slot, &policy(true, false, &ports(6000, 6001)), 1)
        .unwrap();
    // Old list (2), union (4) and new list (2): the map is full, two of them idle.
    dp.apply_policy(slot, &policy(true, false, &ports(6002, 6003)), 2)
        .unwrap();
    assert_eq!(raw_len(&dp, "policy_lists"), 8);
    // Another union and list (6 entries) fit only once the idle ones are deleted.
    dp.apply_policy(slot, &policy(true, false, &ports(6003, 6004)), 3)
        .unwrap();
    assert!(
        tcp_ok(&w.pods[A].ns, b_ip, 6003),
        "allowed by the last write"
    );
    assert!(
        !tcp_ok(&w.pods[A].ns, b_ip, 6000),
        "allowed by none since the first"
    );
    dp.end_policy_writes().unwrap();
    assert_eq!(raw_len(&dp, "policy_lists"), 2);
    assert_eq!(raw_len(&dp, "policy_pairs"), 1);
}

#[test]
fn a_write_that_fails_half_way_is_read_back_before_the_next() {
    let w = World::new();
    let (dp, b_ip, slot) = eight_entries(&w, [6000, 6001]);
    // Twelve distinct ports for one peer: more list entries than the map holds.
    let many: String = (0..12)
        .map(|i| format!("ingress 1000 tcp {} allow", 7000 + i))
        .collect::<Vec<_>>()
        .join("; ");
    assert!(
        dp.apply_policy(slot, &policy(true, false, &many), 1)
            .is_err(),
        "the list map is full"
    );
    // The next write reads the maps back, deletes the list no pair points at, and writes.
    dp.apply_policy(slot, &policy(true, false, "ingress 1000 tcp 6000 allow"), 2)
        .unwrap();
    assert_eq!(
        raw_len(&dp, "policy_lists"),
        1,
        "nothing of the failed write left"
    );
    assert_eq!(raw_len(&dp, "policy_pairs"), 1);
    assert!(tcp_ok(&w.pods[A].ns, b_ip, 6000));
    assert!(!tcp_ok(&w.pods[A].ns, b_ip, 6001));
}

#[test]
fn what_a_crash_left_is_deleted_at_read_back() {
    let w = World::new();
    let (dp, b_ip, slot) = serving(&w, "ingress 1000 tcp 6000 allow");
    drop(dp);
    // A crash's leftovers: this slot's any-peer pair pointing at list 77 (whose entries never
    // made it), and list 55 that no pair points at (written before a crash, or half deleted).
    let pin = |name: &str| Map::from_map_data(MapData::from_pin(w.pin_dir.join(name)).unwrap());
    let mut pairs: BpfHash<MapData, abi::PolicyPairKey, u32> =
        BpfHash::try_from(pin("policy_pairs").unwrap()).unwrap();
    let orphan = abi::PolicyPairKey {
        policy_id: slot,
        identity: 0,
        direction: abi::DIR_INGRESS,
        pad: [0; 3],
    };
    pairs.insert(orphan, 77, 0).unwrap();
    let mut lists: LpmTrie<MapData, abi::PolicyListKey, abi::PolicyValue> =
        LpmTrie::try_from(pin("policy_lists").unwrap()).unwrap();
    let stray = abi::PolicyListKey {
        list_id: 55,
        pad: 0,
        proto: 6,
        dport: 6001u16.to_be(),
    };
    let allow = abi::PolicyValue::verdict(abi::VERDICT_ALLOW);
    lists
        .insert(&Key::new(abi::POLICY_LIST_FULL_PREFIX, stray), allow, 0)
        .unwrap();

    let dp = BpfDatapath::open(w.config()).unwrap();
    dp.load_slots(&BTreeSet::from([slot])).unwrap();
    // A write of another slot: the maps are read back and the leftovers deleted.
    dp.apply_policy(901, &policy(true, false, "ingress 1000 udp 53 allow"), 1)
        .unwrap();
    let pairs = dp.map_dump("policy_pairs").unwrap();
    assert!(
        pairs.iter().all(|p| p["list_id"] != 77),
        "the pair pointing at no list is gone: {pairs:?}"
    );
    assert!(
        dp.map_dump("policy_lists")
            .unwrap()
            .iter()
            .all(|e| e["list_id"] != 55),
        "the list no pair points at is gone"
    );
    // The slot allows exactly what it did.
    assert!(tcp_ok(&w.pods[A].ns, b_ip, 6000));
    assert!(!tcp_ok(&w.pods[A].ns, b_ip, 6001));
}

/// Runs bpftool, failing the test with its output.
fn bpftool(args: &[&str]) {
    let out = std::process::Command::new("bpftool")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "bpftool {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn an_upgrade_from_the_one_trie_finds_its_entries_before_any_write() {
    let w = World::new();
    let (dp, b_ip, slot) = serving(&w, "ingress 1000 udp 53 allow");
    drop(dp);
    // The node as a build before the two-step lookup left it: no pair or list map pinned, the
    // slot's entry (TCP 6000 from identity 1000) in the one `policy` trie.
    for name in ["policy_pairs", "policy_lists"] {
        std::fs::remove_file(w.pin_dir.join(name)).unwrap();
    }
    let legacy = w.pin_dir.join("policy");
    let legacy_path = legacy.to_str().unwrap();
    bpftool(&[
        "map",
        "create",
        legacy_path,
        "type",
        "lpm_trie",
        "key",
        "16",
        "value",
        "4",
        "entries",
        "1024",
        "name",
        "policy",
        "flags",
        "1",
    ]);
    let key = [
        "96", "0", "0", "0", // prefix length
        "101", "0", "0", "0", // slot
        "232", "3", "0", "0", // identity 1000
        "0", "6", "23", "112", // ingress, TCP, port 6000 (network order)
    ];
    assert_eq!(slot, 101, "the key above names slot 101");
    let mut args = vec!["map", "update", "pinned", legacy_path, "key"];
    args.extend(key);
    args.extend(["value", "1", "0", "0", "0"]);
    bpftool(&args);

    let dp = BpfDatapath::open(w.config()).unwrap();
    // Re-adopted with this build's programs, before the restore rewrites anything.
    for p in &w.pods {
        in_ns(&w.node, || dp.attach_endpoint(&p.ep)).unwrap();
    }
    assert!(
        tcp_ok(&w.pods[A].ns, b_ip, 6000),
        "the earlier build's entry is in force"
    );
    assert!(!tcp_ok(&w.pods[A].ns, b_ip, 6001));
    assert_eq!(raw_len(&dp, "policy"), 1);
    dp.commit_programs().unwrap();
    assert!(
        !legacy.exists(),
        "unpinned once every endpoint runs these programs"
    );
}
