//! Datapath lifecycle: manager exit and restart, detach, reconcile, map dumps, policy updates.

use super::*;

#[test]
fn survives_manager_exit_reopens_same_maps_and_detach_removes_everything() {
    let w = World::new();
    let dp = open_and_attach(&w);
    echo_servers(&w.pods[B].ns, 6000);
    echo_servers(&w.pods[B].ns, 6001);
    let p = policy(true, false, "ingress 1000 tcp 6000 allow");
    dp.apply_policy(101, &p, 1).unwrap();
    let map_id = |name: &str| {
        aya::maps::MapInfo::from_pin(w.pin_dir.join(name))
            .unwrap()
            .id()
    };
    let ids: Vec<u32> = ["endpoints", "ipcache", "policy_pairs", "policy_lists", "ct"]
        .iter()
        .map(|n| map_id(n))
        .collect();
    let old_prog = prog_id(&w.tc_filters(B, "egress"));
    drop(dp); // the manager exits
    assert!(
        w.tc_filters(B, "egress").contains("weft_to_pod"),
        "filter left attached"
    );
    let b_ip: IpAddr = w.pods[B].ip4.into();
    assert!(
        tcp_ok(&w.pods[A].ns, b_ip, 6000),
        "still allowed without a manager"
    );
    assert!(
        !tcp_ok(&w.pods[A].ns, b_ip, 6001),
        "still enforced without a manager"
    );

    let dp = BpfDatapath::open(w.config()).expect("reopen");
    let again: Vec<u32> = ["endpoints", "ipcache", "policy_pairs", "policy_lists", "ct"]
        .iter()
        .map(|n| map_id(n))
        .collect();
    assert_eq!(ids, again, "pinned maps are reused, not recreated");
    assert_eq!(dp.endpoint_ids().unwrap(), BTreeSet::from([100, 101]));
    // Re-adopt: replaces the program in place; the same policy diff is a no-op.
    in_ns(&w.node, || dp.attach_endpoint(&w.pods[B].ep)).unwrap();
    dp.apply_policy(101, &p, 1).unwrap();
    let filters = w.tc_filters(B, "egress");
    assert_eq!(
        filters.matches(" handle ").count(),
        1,
        "one filter after re-adopt: {filters}"
    );
    assert_ne!(
        prog_id(&filters),
        old_prog,
        "the re-opened manager's program replaced the old one"
    );
    assert!(
        !tcp_ok(&w.pods[A].ns, b_ip, 6001),
        "enforced after re-adopt"
    );
    assert!(tcp_ok(&w.pods[A].ns, b_ip, 6000));

    for map in ["endpoints", "ct", "metrics"] {
        let dump = dp.map_dump(map).unwrap();
        assert!(
            dump.iter().any(|e| e["endpoint_id"] == 101),
            "{map} has entries of 101 before detach"
        );
    }
    let slot_entries = |dp: &BpfDatapath| {
        dp.map_dump("policy")
            .unwrap()
            .iter()
            .filter(|e| e["policy_id"] == 101)
            .count()
    };
    assert!(slot_entries(&dp) > 0);
    in_ns(&w.node, || dp.detach_endpoint(&w.pods[B].ep)).unwrap();
    assert_endpoint_gone(&w, &dp, B);
    // The slot is the manager's to free (other endpoints may share it).
    assert!(slot_entries(&dp) > 0);
    dp.release_slot(101).unwrap();
    assert_eq!(slot_entries(&dp), 0);
    assert!(
        dp.map_dump("policy_lists").unwrap().is_empty(),
        "the slot's port lists went with it"
    );
    assert!(!dp.slot_generations().unwrap().contains_key(&101));
    assert!(
        tcp_ok(&w.pods[A].ns, b_ip, 6001),
        "no program, no enforcement"
    );
    // Endpoint A is untouched.
    assert!(
        dp.map_dump("endpoints")
            .unwrap()
            .iter()
            .any(|e| e["endpoint_id"] == 100)
    );
}

#[test]
fn maps_are_listed_and_decoded_and_reconcile_removes_stale_endpoints() {
    let w = World::new();
    let dp = open_and_attach(&w);
    let list = dp.map_list();
    let names: Vec<&str> = list.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "endpoints",
            "ipcache",
            "policy_pairs",
            "policy_lists",
            "policy_gen",
            "ct",
            "frags",
            "metrics",
            "events",
            "lb_services",
            "lb_backends",
            "lb_revnat",
            "lb_flows"
        ]
    );
    // A Service frontend: written, dumped decoded, read back, removed.
    let fe = weft_api::lb::Frontend {
        addr: "10.96.0.10".parse().unwrap(),
        port: 80,
        proto: weft_api::lb::LbProto::Tcp,
    };
    let be = weft_api::lb::Backend {
        addr: w.pods[A].ip4.into(),
        port: 8080,
    };
    dp.lb_upsert(7, &fe, &[be], 0).unwrap();
    let services = dp.map_dump("lb_services").unwrap();
    assert_eq!(services.len(), 1, "{services:?}");
    assert_eq!(services[0]["frontend"], "10.96.0.10");
    assert_eq!(services[0]["port"], 80);
    assert_eq!(services[0]["id"], 7);
    assert_eq!(services[0]["backends"], 1);
    let backends = dp.map_dump("lb_backends").unwrap();
    assert_eq!(backends[0]["backend"], w.pods[A].ip4.to_string());
    assert_eq!(backends[0]["port"], 8080);
    assert_eq!(dp.lb_frontends().unwrap()[&7], (fe, vec![be]));
    dp.lb_remove(7, &fe, 1).unwrap();
    assert!(dp.lb_frontends().unwrap().is_empty());
    assert!(dp.map_dump("lb_backends").unwrap().is_empty());
    let ep = list.iter().find(|m| m.name == "endpoints").unwrap();
    assert_eq!((ep.entries, ep.max_entries), (2, 64));
    let ipcache = dp.map_dump("ipcache").unwrap();
    for (prefix, id) in [
        ("0.0.0.0/0", 2),
        ("::/0", 2),
        (&*format!("{}/32", w.pods[A].ip4), ID_A),
    ] {
        assert!(
            ipcache
                .iter()
                .any(|e| e["prefix"] == prefix && e["identity"] == id),
            "{prefix}: {ipcache:#?}"
        );
    }
    dp.upsert_ipcache("192.0.2.0/24".parse().unwrap(), identity(1 << 24))
        .unwrap();
    assert!(
        dp.map_dump("ipcache")
            .unwrap()
            .iter()
            .any(|e| e["prefix"] == "192.0.2.0/24")
    );
    dp.remove_ipcache("192.0.2.0/24".parse().unwrap()).unwrap();
    assert!(
        !dp.map_dump("ipcache")
            .unwrap()
            .iter()
            .any(|e| e["prefix"] == "192.0.2.0/24")
    );
    dp.apply_policy(101, &policy(true, false, "ingress 0 tcp 80-83 allow"), 1)
        .unwrap();
    let pol = dp.map_dump("policy").unwrap();
    assert_eq!(pol.len(), 1, "80-83 is one aligned block: {pol:#?}");
    assert_eq!(
        (pol[0]["port_lo"].as_u64(), pol[0]["port_hi"].as_u64()),
        (Some(80), Some(83))
    );
    assert_eq!(pol[0]["verdict"], "allow");
    let removed = in_ns(&w.node, || dp.reconcile(&BTreeSet::from([100]))).unwrap();
    assert_eq!(removed, BTreeSet::from([101]));
    assert_eq!(dp.endpoint_ids().unwrap(), BTreeSet::from([100]));
    // Slots are the manager's: it releases the ones nobody uses any more.
    dp.release_slot(101).unwrap();
    assert!(dp.map_dump("policy").unwrap().is_empty());
    assert!(!w.tc_filters(B, "egress").contains("weft"));
}

#[test]
fn policy_updates_never_drop_what_both_versions_allow() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let w = World::new();
    let dp = open_and_attach(&w);
    let exact = policy(true, false, "ingress 1000 udp 6000 allow");
    // 5952-6015 is one aligned /90 block: switching removes the /96 block and adds another.
    let range = policy(
        true,
        false,
        "ingress 1000 udp 5952-6015 allow; ingress 0 udp 7000 deny",
    );
    dp.apply_policy(101, &exact, 1).unwrap();
    let mut rx = dp.subscribe_events();
    let (stop, sent) = (AtomicBool::new(false), AtomicU64::new(0));
    let dst = std::net::SocketAddr::new(w.pods[B].ip4.into(), 6000);
    std::thread::scope(|s| {
        // Every datagram comes from a fresh socket, i.e. a new flow that needs a policy lookup.
        s.spawn(|| {
            in_ns(&w.pods[A].ns, || {
                while !stop.load(Ordering::Relaxed) {
                    let sock = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
                    let _ = sock.send_to(b"x", dst);
                    sent.fetch_add(1, Ordering::Relaxed);
                }
            });
        });
        // Keep swapping while 20 000 new flows go through.
        let mut swaps = 0u32;
        while sent.load(Ordering::Relaxed) < 20_000 {
            let next = if swaps.is_multiple_of(2) {
                &range
            } else {
                &exact
            };
            dp.apply_policy(101, next, 1).unwrap();
            swaps += 1;
        }
        assert!(
            swaps > 100,
            "only {swaps} policy swaps happened during the stream"
        );
        stop.store(true, Ordering::Relaxed);
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    let mut drops = Vec::new();
    while let Ok(ev) = rx.try_recv() {
        if ev.dst_port == 6000 {
            drops.push(ev.to_string());
        }
    }
    assert!(
        drops.is_empty(),
        "allowed by both versions, yet dropped: {drops:#?}"
    );
    // The stream really went through the policy: its flows are in ct as policy-allowed.
    let ct = dp.map_dump("ct").unwrap();
    assert!(
        ct.iter().any(|e| e["endpoint_id"] == 101
            && e["dport"] == 6000
            && e["reason"] == "allow-policy")
    );
}

#[test]
fn open_mounts_a_bpffs_when_the_pin_dir_is_not_on_one() {
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = nix::mount::umount(&self.0);
        }
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("pins");
    let _unmount = Unmount(dir.clone());
    let config = weft_manager::datapath::DatapathConfig {
        pin_dir: dir.clone(),
        ..World::new().config()
    };
    let dp = BpfDatapath::open(config).expect("open on a plain directory");
    let magic = nix::sys::statfs::statfs(&dir).unwrap().filesystem_type().0;
    assert_eq!(
        magic,
        0xcafe_4a11,
        "a bpffs is mounted on {}",
        dir.display()
    );
    assert!(
        dir.join("policy_pairs").exists() && dir.join("ct").exists(),
        "maps pinned there"
    );
    drop(dp);
}

#[test]
fn replacing_one_identitys_entries_leaves_the_rest_and_equals_a_full_apply() {
    let w = World::new();
    let dp = open_and_attach(&w);
    echo_servers(&w.pods[B].ns, 6000);
    echo_servers(&w.pods[B].ns, 6001);
    let before = policy(
        true,
        false,
        "ingress 1000 tcp 6000 allow; ingress 1000 tcp 5990-6010 allow; ingress 1000 tcp 6005 deny; \
         ingress 1005 udp 53 allow; ingress 0 tcp 7000 deny",
    );
    let after = policy(
        true,
        false,
        "ingress 1000 tcp 6001 allow; ingress 1005 udp 53 allow; ingress 0 tcp 7000 deny",
    );
    dp.apply_policy(101, &before, 1).unwrap();
    let b_ip: IpAddr = w.pods[B].ip4.into();
    assert!(tcp_ok(&w.pods[A].ns, b_ip, 6000));
    let only_a = after
        .entries
        .iter()
        .filter(|(e, _)| e.identity == ID_A)
        .map(|(e, v)| (*e, *v))
        .collect();
    dp.apply_policy_identities(101, &BTreeSet::from([ID_A]), &only_a, 1)
        .unwrap();
    assert!(
        tcp_ok(&w.pods[A].ns, b_ip, 6001),
        "the new entry is in force"
    );
    assert!(!tcp_ok(&w.pods[A].ns, b_ip, 6000), "the old ones are gone");
    let sliced = dp.map_dump("policy").unwrap();
    assert!(
        sliced.iter().any(|e| e["identity"] == 1005),
        "other identities untouched: {sliced:#?}"
    );
    dp.apply_policy(101, &after, 1).unwrap();
    assert_eq!(
        dp.map_dump("policy").unwrap(),
        sliced,
        "same map as applying the whole new policy"
    );
}

/// `n` single-port ingress allows: identities 2000.., 100 ports each.
fn port_rules(n: u32) -> String {
    (0..n)
        .map(|i| format!("ingress {} tcp {} allow", 2000 + i / 100, 1000 + i % 100))
        .collect::<Vec<_>>()
        .join("; ")
}

#[test]
fn a_reopened_datapath_reads_back_and_rewrites_policies_larger_than_one_batch() {
    let w = World::new();
    let dp = open_and_attach(&w);
    // 9000 single-port blocks: more than two batch chunks each way.
    let rules = port_rules;
    dp.apply_policy(101, &policy(true, false, &rules(9000)), 1)
        .unwrap();
    assert_eq!(dp.map_dump("policy").unwrap().len(), 9000);
    drop(dp);
    let dp = BpfDatapath::open(w.config()).expect("reopen");
    // Only a diff against the read-back state removes the 7000 entries the new policy lacks.
    dp.apply_policy(101, &policy(true, false, &rules(2000)), 1)
        .unwrap();
    let left = dp.map_dump("policy").unwrap();
    assert_eq!(left.len(), 2000);
    assert!(left.iter().all(|e| e["identity"].as_u64() < Some(2020)));
}

#[test]
fn a_read_back_begun_ahead_is_the_base_of_the_next_writes() {
    let w = World::new();
    // `(slot, n)`: writes `n` single-port allows into the slot.
    let write = |dp: &BpfDatapath, writes: &[(u32, u32)]| {
        for &(slot, n) in writes {
            dp.apply_policy(slot, &policy(true, false, &port_rules(n)), 1)
                .unwrap();
        }
        dp.map_dump("policy").unwrap().len()
    };
    // A restart that begins the read-back at once, as a start does when a slot is untrusted.
    let reopen = || {
        let dp = BpfDatapath::open(w.config()).expect("reopen");
        dp.begin_read_back().unwrap();
        dp
    };
    let dp = open_and_attach(&w);
    assert_eq!(write(&dp, &[(101, 9000), (102, 3000)]), 12_000);
    drop(dp);

    // Taken by the first write: only a diff against what it read removes the 7000 entries the
    // new policy lacks; 102 was read by the same dump.
    assert_eq!(write(&reopen(), &[(101, 2000), (102, 1000)]), 3000);

    // Asked for by a load, as a restart's re-adoption does: still taken by the first write.
    let dp = reopen();
    dp.load_slots(&BTreeSet::from([101])).unwrap();
    assert_eq!(write(&dp, &[(101, 100), (102, 10)]), 110);
    drop(dp);

    // The first write is of a slot the dump was not needed for (a new one): it waits for the
    // dump, and the slots the dump read are loaded from it.
    assert_eq!(write(&reopen(), &[(103, 5), (101, 1), (102, 1)]), 7);
}
