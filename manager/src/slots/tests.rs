use super::*;

fn key(identity: Identity) -> SlotKey {
    SlotKey::new(identity, &NamedPorts::new())
}

/// [`SlotTable::restore`], checking that [`SlotTable::read_back_ahead`] foretold whether it
/// reads slots back.
fn restore(store: &Store, kernel: &BTreeMap<u32, u64>, inputs: u64) -> (SlotTable, Restored) {
    let ahead = SlotTable::read_back_ahead(store, kernel).unwrap();
    let (table, restored) = SlotTable::restore(store.clone(), kernel, inputs).unwrap();
    assert_eq!(
        ahead,
        !restored.untrusted.is_empty(),
        "read_back_ahead foretells the read-back: {restored:?}"
    );
    (table, restored)
}

const ENFORCED: Enforcement = Enforcement {
    ingress: true,
    egress: false,
    tiers: weft_policy::mapstate::TierFlags {
        admin_ingress: false,
        admin_egress: false,
        baseline_ingress: false,
        baseline_egress: false,
    },
};

#[test]
fn same_key_shares_a_slot_and_named_ports_split_it() {
    let mut t = SlotTable::new(Store::temporary().unwrap());
    let (a, created) = t.ensure(key(300));
    assert!(created);
    assert_eq!(t.ensure(key(300)), (a, false));
    let mut named = NamedPorts::new();
    named.insert(("http".into(), 6), 8080);
    let (b, created) = t.ensure(SlotKey::new(300, &named));
    assert!(created && b != a);
    assert_ne!(t.ensure(key(301)).0, a);
}

#[test]
fn members_are_counted_and_the_last_one_leaves_it_unused() {
    let mut t = SlotTable::new(Store::temporary().unwrap());
    let (a, _) = t.ensure(key(300));
    assert_eq!(t.join(1, a), None);
    assert_eq!(t.join(2, a), None);
    assert_eq!(t.members(a), vec![1, 2]);
    assert_eq!(t.leave(1), Some(a));
    assert!(!t.is_unused(a));
    let (b, _) = t.ensure(key(301));
    // Moving to another slot reports the one left.
    assert_eq!(t.join(2, b), Some(a));
    assert!(t.is_unused(a));
    assert_eq!(t.unused(), vec![a]);
    t.remove(a);
    assert_eq!(t.find(&key(300)), None);
    // A freed id is reused.
    assert_eq!(t.ensure(key(302)).0, a);
}

#[test]
#[expect(
    clippy::many_single_char_names,
    reason = "slots a, b, c of the table t"
)]
fn restore_trusts_only_matching_complete_generations() {
    let store = Store::temporary().unwrap();
    let mut t = SlotTable::new(store.clone());
    let (a, _) = t.ensure(key(300));
    let (b, _) = t.ensure(key(301));
    let (c, _) = t.ensure(key(302));
    let mut kernel = BTreeMap::new();
    for slot in [a, b, c] {
        let generation = t.begin_write(slot, true);
        t.written(slot, generation, 7, Some(ENFORCED));
        kernel.insert(slot, generation);
    }
    t.persist(Some(42)).unwrap();
    // b: a write started after the records were persisted and did not finish.
    kernel.insert(b, 0);
    // c: a later write finished in the kernel, but its record never reached the store.
    *kernel.get_mut(&c).unwrap() += 10;
    // d: a slot the kernel has and no record describes.
    kernel.insert(9, 5);
    let (r, restored) = restore(&store, &kernel, 42);
    assert_eq!(restored.trusted, BTreeSet::from([a]));
    assert_eq!(restored.untrusted, BTreeSet::from([b, c, 9]));
    assert!(restored.inputs_unchanged);
    assert!(r.trusted(a) && !r.trusted(b));
    assert_eq!(r.digest(a), Some(7));
    assert_eq!(r.digest(c), None);
    assert_eq!(r.find(&key(300)), Some(a));
    assert_eq!(r.key(9), None);
    // New generations are above every one seen, in the store or in the kernel.
    let mut r = r;
    assert!(r.begin_write(a, true) > kernel[&c]);
    // Other inputs: nothing is trusted without recompute.
    let (_, restored) = restore(&store, &kernel, 43);
    assert!(!restored.inputs_unchanged);
}

#[test]
fn a_failed_write_is_never_persisted_as_complete() {
    let store = Store::temporary().unwrap();
    let mut t = SlotTable::new(store.clone());
    let (a, _) = t.ensure(key(300));
    let g1 = t.begin_write(a, true);
    t.written(a, g1, 1, Some(ENFORCED));
    t.persist(Some(1)).unwrap();
    // A second write starts and fails: no `written`.
    let _g2 = t.begin_write(a, false);
    t.persist(None).unwrap();
    let kernel = BTreeMap::from([(a, g1)]);
    let (_, restored) = restore(&store, &kernel, 1);
    assert!(
        restored.trusted.is_empty(),
        "record removed, slot untrusted"
    );
    assert!(
        !restored.inputs_unchanged,
        "inputs cleared by persist(None)"
    );
}

#[test]
fn enforcement_survives_a_restart_and_only_a_whole_write_forgets_it() {
    let store = Store::temporary().unwrap();
    let mut t = SlotTable::new(store.clone());
    let (a, _) = t.ensure(key(300));
    let g = t.begin_write(a, true);
    t.written(a, g, 1, Some(ENFORCED));
    // A write of some identities' entries keeps the flags.
    let g = t.begin_write(a, false);
    t.written(a, g, 2, None);
    assert_eq!(t.enforcement(a), Some(ENFORCED));
    t.persist(Some(1)).unwrap();
    let kernel = BTreeMap::from([(a, g)]);
    let (r, restored) = restore(&store, &kernel, 1);
    assert_eq!(restored.trusted, BTreeSet::from([a]));
    assert_eq!(r.enforcement(a), Some(ENFORCED));

    // A whole write that fails leaves them unknown: never persisted as complete.
    let _ = t.begin_write(a, true);
    assert_eq!(t.enforcement(a), None);
    let g = t.begin_write(a, false);
    t.written(a, g, 3, None);
    t.persist(Some(1)).unwrap();
    let kernel = BTreeMap::from([(a, g)]);
    let (r, restored) = restore(&store, &kernel, 1);
    assert!(restored.trusted.is_empty(), "no record without flags");
    assert_eq!(r.enforcement(a), None);
}

/// The records as another build wrote them: the same records, each stamped `compiler`
/// (`None`: a build from before records said).
fn restamp(store: &Store, compiler: Option<Compiler>) {
    let (records, inputs) = store.load_slots::<Record>().unwrap();
    let records: Vec<(u32, Record)> = records
        .into_iter()
        .map(|(slot, rec)| (slot, Record { compiler, ..rec }))
        .collect();
    let refs: Vec<(u32, &Record)> = records.iter().map(|(s, r)| (*s, r)).collect();
    store.write_slots(&refs, &[], inputs).unwrap();
}

#[test]
fn slots_another_compiler_wrote_are_recomputed_and_another_encoding_is_read_back() {
    let store = Store::temporary().unwrap();
    let mut table = SlotTable::new(store.clone());
    let (a, _) = table.ensure(key(300));
    let (b, _) = table.ensure(key(301));
    let mut kernel = BTreeMap::new();
    for slot in [a, b] {
        let generation = table.begin_write(slot, true);
        table.written(slot, generation, 7, Some(ENFORCED));
        kernel.insert(slot, generation);
    }
    table.persist(Some(42)).unwrap();
    let (back, restored) = restore(&store, &kernel, 42);
    assert!(
        restored.other_compiler.is_empty(),
        "this build's own records"
    );
    assert!(restored.inputs_unchanged && back.trusted(a) && back.trusted(b));

    // Another policy computation, same encoding: the slots hold what it wrote completely (not
    // read back, its digest kept to compare with), but neither is taken as computed here,
    // although the inputs are unchanged.
    let this = Compiler::CURRENT;
    let other = Compiler {
        policy: this.policy + 1,
        ..this
    };
    restamp(&store, Some(other));
    let (mut back, restored) = restore(&store, &kernel, 42);
    assert_eq!(
        restored.other_compiler,
        BTreeMap::from([(a, Some(other)), (b, Some(other))])
    );
    assert!(restored.inputs_unchanged);
    assert_eq!(restored.trusted, BTreeSet::from([a, b]));
    assert!(restored.untrusted.is_empty());
    assert!(
        !back.trusted(a) && !back.trusted(b),
        "recomputed whatever the inputs"
    );
    assert_eq!(
        back.digest(a),
        Some(7),
        "compared with what the other build wrote"
    );
    assert_eq!(back.enforcement(a), Some(ENFORCED));
    // a: recomputed, same contents: its record now says this build computed it.
    // b: a write of some identities only: the rest is still the other build's.
    assert!(!back.needs_persist());
    back.computed(a);
    let generation = back.begin_write(b, false);
    back.written(b, generation, 8, None);
    kernel.insert(b, generation);
    assert!(back.needs_persist());
    back.persist(Some(42)).unwrap();
    let (back, restored) = restore(&store, &kernel, 42);
    assert_eq!(restored.other_compiler, BTreeMap::from([(b, Some(other))]));
    assert!(back.trusted(a) && !back.trusted(b));
    assert_eq!(back.digest(b), Some(8));

    // Another encoding, or a build that did not say: nothing it wrote is kept.
    for stamp in [
        Some(Compiler {
            encoding: this.encoding + 1,
            ..this
        }),
        None,
    ] {
        restamp(&store, stamp);
        let (back, restored) = restore(&store, &kernel, 42);
        assert_eq!(
            restored.other_compiler,
            BTreeMap::from([(a, stamp), (b, stamp)])
        );
        assert!(restored.trusted.is_empty(), "{stamp:?}");
        assert_eq!(restored.untrusted, BTreeSet::from([a, b]));
        assert_eq!((back.digest(a), back.enforcement(a)), (None, None));
        assert!(!back.trusted(a));
        assert_eq!(back.find(&key(300)), Some(a), "the keys are kept");
    }
}

#[test]
fn a_record_from_before_the_compiler_stamp_parses_as_unversioned() {
    let store = Store::temporary().unwrap();
    let old = serde_json::json!({
        "key": {"identity": 300, "ports": 0},
        "generation": 3,
        "digest": 7,
        "enforcement": {"ingress": true, "egress": false},
    });
    store.write_slots(&[(1, &old)], &[], Some(42)).unwrap();
    let (r, restored) = SlotTable::restore(store, &BTreeMap::from([(1, 3)]), 42).unwrap();
    assert_eq!(restored.other_compiler, BTreeMap::from([(1, None)]));
    assert_eq!(restored.untrusted, BTreeSet::from([1]));
    assert_eq!(r.find(&key(300)), Some(1));
}
