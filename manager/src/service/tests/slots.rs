//! Policy slots through the manager's operations, over the fake datapath: sharing by identity,
//! reference counting, the order of a label change's switch, and the restart's trust decision.

use super::support::{fake_manager_on, fake_manager_with_grace, ready_pod};
use crate::datapath::{FakeCall, FakeDatapath};
use crate::node::hostnet::FakeHostNet;
use crate::service::*;
use crate::store::Store;
use std::collections::BTreeSet;

const RULES: &str = r#"[{"labels":[{"key":"r","value":"1"}],"endpointSelector":{"matchLabels":{"id":"web"}},
  "ingress":[{"fromEndpoints":[{"matchLabels":{"id":"db"}}],"toPorts":[{"ports":[{"port":"80","protocol":"TCP"}]}]}]},
 {"labels":[{"key":"r","value":"2"}],"endpointSelector":{"matchLabels":{"id":"db"}},
  "ingress":[{"fromEndpoints":[{"matchLabels":{"id":"web"}}],"toPorts":[{"ports":[{"port":"5432","protocol":"TCP"}]}]}]}]"#;

fn manager_on(store: &Store, dp: &Arc<FakeDatapath>) -> Manager {
    fake_manager_on(store, Arc::new(FakeHostNet::default()), dp.clone())
}

fn pod(m: &Manager, c: &str, app: &str) -> Endpoint {
    ready_pod(m, c, app)
}

fn assert_consistent(m: &Manager, step: &str) {
    let r = m.verify().unwrap();
    assert!(r.consistent, "{step}: {:?}", r.problems);
}

fn position(calls: &[FakeCall], call: &FakeCall) -> usize {
    calls
        .iter()
        .position(|c| c == call)
        .unwrap_or_else(|| panic!("{call:?} not in {calls:?}"))
}

#[test]
fn replicas_share_one_slot_and_the_last_one_frees_it() {
    let dp = Arc::new(FakeDatapath::default());
    let m = manager_on(&Store::temporary().unwrap(), &dp);
    m.import_policy("p.json", RULES).unwrap();
    let web: Vec<Endpoint> = (0..3).map(|i| pod(&m, &format!("w{i}"), "web")).collect();
    let db = pod(&m, "d", "db");
    let slot = dp.slot_of(web[0].id).unwrap();
    assert!(web.iter().all(|ep| dp.slot_of(ep.id) == Some(slot)));
    assert_ne!(dp.slot_of(db.id), Some(slot));
    assert_eq!(dp.slots().len(), 2, "one slot per identity");
    let writes = |calls: &[FakeCall]| {
        calls
            .iter()
            .filter(|c| matches!(c, FakeCall::ApplyPolicy(s) if *s == slot))
            .count()
    };
    assert_eq!(writes(&dp.calls()), 1, "replicas find their slot written");
    assert_consistent(&m, "shared");

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for (i, ep) in web.iter().enumerate() {
        dp.clear_calls();
        rt.block_on(m.delete(&ep.container_id, "eth0")).unwrap();
        let released = dp.calls().contains(&FakeCall::ReleaseSlot(slot));
        assert_eq!(
            released,
            i == web.len() - 1,
            "released only by the last user"
        );
        assert_consistent(&m, "after a delete");
    }
    assert_eq!(dp.slots().len(), 1);
}

#[test]
fn a_label_change_writes_the_new_slot_switches_then_releases_the_old() {
    let dp = Arc::new(FakeDatapath::default());
    let m = manager_on(&Store::temporary().unwrap(), &dp);
    m.import_policy("p.json", RULES).unwrap();
    let a = pod(&m, "a", "web");
    let b = pod(&m, "b", "web");
    let _db = pod(&m, "d", "db");
    let old = dp.slot_of(a.id).unwrap();

    dp.clear_calls();
    m.set_labels(a.id, &["id=db".into()], &[]).unwrap();
    let new = dp.slot_of(a.id).unwrap();
    assert_ne!(new, old);
    assert_eq!(dp.slot_of(b.id), Some(old), "the replica stays");
    assert!(!dp.calls().contains(&FakeCall::ReleaseSlot(old)));
    assert_consistent(&m, "first replica moved");

    // The other replica moves into a new identity: its slot is written before the endpoint's
    // entry points at it, and the old slot goes after.
    dp.clear_calls();
    m.set_labels(b.id, &["id=cache".into()], &[]).unwrap();
    let calls = dp.calls();
    let slot = dp.slot_of(b.id).unwrap();
    let write = position(&calls, &FakeCall::ApplyPolicy(slot));
    let switch = position(&calls, &FakeCall::Attach(b.id));
    let release = position(&calls, &FakeCall::ReleaseSlot(old));
    assert!(write < switch && switch < release, "{calls:?}");
    assert!(!dp.slots().contains(&old));
    assert_consistent(&m, "last replica moved");
}

/// Restarts a manager over the same store and fake kernel, the way the daemon does.
fn restart(store: &Store, dp: &Arc<FakeDatapath>) -> Manager {
    let m = manager_on(store, dp);
    dp.clear_calls();
    m.readopt().unwrap();
    m.reconcile_datapath().unwrap();
    m.regenerate_all().unwrap();
    m.reconcile_ipcache().unwrap();
    m
}

fn loaded(dp: &FakeDatapath) -> BTreeSet<u32> {
    dp.calls()
        .iter()
        .filter_map(|c| match c {
            FakeCall::LoadSlots(s) => Some(s.clone()),
            _ => None,
        })
        .flatten()
        .collect()
}

fn slot_writes(dp: &FakeDatapath) -> usize {
    dp.calls()
        .iter()
        .filter(|c| {
            matches!(
                c,
                FakeCall::ApplyPolicy(_) | FakeCall::ApplyPolicyIdentities(..)
            )
        })
        .count()
}

#[test]
fn a_restart_trusts_complete_slots_and_reads_back_the_others() {
    let store = Store::temporary().unwrap();
    let dp = Arc::new(FakeDatapath::default());
    let m = manager_on(&store, &dp);
    m.import_policy("p.json", RULES).unwrap();
    let web = pod(&m, "w", "web");
    let db = pod(&m, "d", "db");
    m.persist_slot_records();
    drop(m);

    // Nothing changed: no slot read back, none recomputed or written.
    let m = restart(&store, &dp);
    assert!(loaded(&dp).is_empty(), "{:?}", dp.calls());
    assert_eq!(slot_writes(&dp), 0, "{:?}", dp.calls());
    assert_consistent(&m, "trusted restart");
    drop(m);

    // The kernel's generation of one slot disagrees with its record (a write finished there
    // after the record was persisted, or the map was tampered with): that slot is read back
    // and rewritten, the other is still trusted.
    let web_slot = dp.slot_of(web.id).unwrap();
    dp.set_generation(web_slot, 999_999);
    let m = restart(&store, &dp);
    assert_eq!(loaded(&dp), BTreeSet::from([web_slot]));
    assert_eq!(
        dp.calls()
            .iter()
            .filter(|c| matches!(c, FakeCall::ApplyPolicy(_)))
            .collect::<Vec<_>>(),
        vec![&FakeCall::ApplyPolicy(web_slot)]
    );
    assert_consistent(&m, "one slot distrusted");
    m.persist_slot_records();
    drop(m);

    // A write that never finished (generation 0) is distrusted too.
    let db_slot = dp.slot_of(db.id).unwrap();
    dp.set_generation(db_slot, 0);
    let m = restart(&store, &dp);
    assert_eq!(loaded(&dp), BTreeSet::from([db_slot]));
    assert_consistent(&m, "unfinished write");
    m.persist_slot_records();
    drop(m);

    // The inputs changed while down (a rule removed from the store directly stands for any
    // change the previous run did not finish applying): every slot is recomputed, and only
    // those whose policy changed are written.
    {
        let (mut pol, _) = PolicyState::restore(
            store.clone(),
            &[from_api_labels(&web.labels), from_api_labels(&db.labels)],
        )
        .unwrap();
        let filter = [weft_policy::labels::Label::parse_filter("r=2").unwrap()];
        pol.delete_rules(&filter, false).unwrap();
    }
    let m = restart(&store, &dp);
    assert!(loaded(&dp).is_empty());
    assert_eq!(
        dp.calls()
            .iter()
            .filter(|c| matches!(c, FakeCall::ApplyPolicy(_)))
            .collect::<Vec<_>>(),
        vec![&FakeCall::ApplyPolicy(db_slot)],
        "only db's policy changed"
    );
    assert_consistent(&m, "inputs changed");
}

fn attached(dp: &FakeDatapath) -> BTreeSet<u32> {
    dp.calls()
        .iter()
        .filter_map(|c| match c {
            FakeCall::Attach(id) => Some(*id),
            _ => None,
        })
        .collect()
}

/// Program pins across restarts (docs/DATAPATH.md, "Program pins"): reused programs leave
/// endpoints whose entries are right alone; fresh ones are attached everywhere and pinned only
/// after the last endpoint.
#[test]
fn a_restart_reattaches_only_when_the_programs_are_new() {
    let store = Store::temporary().unwrap();
    let dp = Arc::new(FakeDatapath::default());
    let m = manager_on(&store, &dp);
    m.import_policy("p.json", RULES).unwrap();
    let eps: Vec<Endpoint> = ["w1", "w2", "d"]
        .iter()
        .map(|c| pod(&m, c, if c.starts_with('w') { "web" } else { "db" }))
        .collect();
    let ids: BTreeSet<u32> = eps.iter().map(|e| e.id).collect();
    m.persist_slot_records();
    drop(m);

    // Same object, same maps: no endpoint is re-attached.
    dp.restart_programs(true);
    let m = restart(&store, &dp);
    let kept: BTreeSet<u32> = dp
        .calls()
        .iter()
        .filter_map(|c| match c {
            FakeCall::ReadoptKept(id) => Some(*id),
            _ => None,
        })
        .collect();
    assert_eq!(kept, ids, "{:?}", dp.calls());
    assert!(attached(&dp).is_empty(), "{:?}", dp.calls());
    assert_eq!(m.status().programs.as_deref(), Some("reused"));
    assert_consistent(&m, "reused programs");
    drop(m);

    // Reused programs, but one endpoint's kernel entry is not what the manager would write
    // (here: it points at another slot): that one is attached again, the others are not.
    dp.restart_programs(true);
    dp.switch_slot(eps[0].id, 4242).unwrap();
    let m = restart(&store, &dp);
    assert_eq!(
        attached(&dp),
        BTreeSet::from([eps[0].id]),
        "{:?}",
        dp.calls()
    );
    assert_consistent(&m, "one entry differed");
    drop(m);

    // Freshly loaded programs (another object, missing or partial pins, other maps): every
    // endpoint is re-attached, and the programs are pinned after the last one.
    dp.restart_programs(false);
    let m = restart(&store, &dp);
    let calls = dp.calls();
    assert_eq!(attached(&dp), ids, "{calls:?}");
    let commit = position(&calls, &FakeCall::CommitPrograms);
    for id in &ids {
        assert!(
            position(&calls, &FakeCall::Attach(*id)) < commit,
            "{calls:?}"
        );
    }
    assert!(dp.programs_committed());
    assert_eq!(m.status().programs.as_deref(), Some("loaded"));
    drop(m);

    // A re-attach fails half-way: the programs are not pinned, so the next start loads them
    // afresh and re-attaches everything again.
    dp.restart_programs(false);
    dp.fail_attach(true);
    let m = manager_on(&store, &dp);
    dp.clear_calls();
    assert!(m.readopt().is_err());
    assert!(!dp.calls().contains(&FakeCall::CommitPrograms));
    assert!(!dp.programs_committed());
}

#[test]
fn verify_reports_a_filter_that_does_not_run_the_programs() {
    let dp = Arc::new(FakeDatapath::default());
    let m = manager_on(&Store::temporary().unwrap(), &dp);
    m.import_policy("p.json", RULES).unwrap();
    let web = pod(&m, "w", "web");
    assert_consistent(&m, "attached");
    dp.tamper_filter(web.id);
    let r = m.verify().unwrap();
    assert!(!r.consistent);
    assert!(
        r.problems
            .iter()
            .any(|p| p.contains(&format!("endpoint {}", web.id)) && p.contains("filter")),
        "{:?}",
        r.problems
    );
}

#[test]
fn a_pod_replaced_within_the_grace_period_finds_its_identity_and_slot_then_both_expire() {
    let dp = Arc::new(FakeDatapath::default());
    let m = manager_on(&Store::temporary().unwrap(), &dp);
    m.state().pol.set_identity_grace_ms(60_000);
    m.import_policy("p.json", RULES).unwrap();
    let db = pod(&m, "d", "db");
    let w0 = pod(&m, "w0", "web");
    let (web, slot) = (w0.identity, dp.slot_of(w0.id).unwrap());
    let db_slot = dp.slot_of(db.id).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();

    dp.clear_calls();
    rt.block_on(m.delete("w0", "eth0")).unwrap();
    assert!(
        !dp.calls().contains(&FakeCall::ReleaseSlot(slot)),
        "kept idle"
    );
    let touches = |calls: &[FakeCall], slot: u32| {
        calls.iter().any(|c| {
            matches!(c, FakeCall::ApplyPolicy(s) | FakeCall::ApplyPolicyIdentities(s, _) if *s == slot)
        })
    };
    assert!(!touches(&dp.calls(), db_slot), "db's peers did not change");
    let idle = m.identities().into_iter().find(|i| i.id == web).unwrap();
    assert_eq!(idle.references, 0);
    assert_consistent(&m, "an idle slot in the maps");

    dp.clear_calls();
    let w1 = pod(&m, "w1", "web");
    assert_eq!((w1.identity, dp.slot_of(w1.id)), (web, Some(slot)));
    assert!(
        !dp.calls()
            .iter()
            .any(|c| matches!(c, FakeCall::ApplyPolicy(_))),
        "nothing to write: {:?}",
        dp.calls()
    );
    assert_consistent(&m, "reused");

    // A change while the slot is idle is not applied to it; its next user rewrites it.
    rt.block_on(m.delete("w1", "eth0")).unwrap();
    m.delete_policy(&["r=1".into()], false).unwrap();
    dp.clear_calls();
    let w2 = pod(&m, "w2", "web");
    assert_eq!(dp.slot_of(w2.id), Some(slot));
    assert!(dp.calls().contains(&FakeCall::ApplyPolicy(slot)));
    assert_consistent(&m, "reused after a change");

    // Past the grace period: the slot goes, the number goes, db's policy loses web.
    rt.block_on(m.delete("w2", "eth0")).unwrap();
    let now = crate::sys::clock::now_ms();
    dp.clear_calls();
    m.collect_idle(now).unwrap();
    assert!(dp.calls().is_empty(), "not yet: {:?}", dp.calls());
    m.collect_idle(now + 60_000).unwrap();
    assert!(dp.calls().contains(&FakeCall::ReleaseSlot(slot)));
    assert!(
        touches(&dp.calls(), db_slot),
        "db loses web: {:?}",
        dp.calls()
    );
    assert!(m.identities().iter().all(|i| i.id != web));
    assert_eq!(dp.slots().len(), 1);
    assert_consistent(&m, "expired");
    let w3 = pod(&m, "w3", "web");
    assert_ne!(
        w3.identity, web,
        "a freed number is not handed out again soon"
    );
}

#[test]
fn a_restart_keeps_idle_identities_and_their_trusted_slots_without_reading_them_back() {
    let store = Store::temporary().unwrap();
    let dp = Arc::new(FakeDatapath::default());
    let with_grace = |grace_ms| {
        let m = fake_manager_with_grace(
            &store,
            Arc::new(FakeHostNet::default()),
            dp.clone(),
            grace_ms,
        );
        dp.clear_calls();
        m.readopt().unwrap();
        m.reconcile_datapath().unwrap();
        m.regenerate_all().unwrap();
        m
    };
    let m = with_grace(60_000);
    m.import_policy("p.json", RULES).unwrap();
    let _db = pod(&m, "d", "db");
    let w0 = pod(&m, "w0", "web");
    let slot = dp.slot_of(w0.id).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(m.delete("w0", "eth0")).unwrap();
    m.persist_slot_records();
    drop(m);

    // Nothing changed while down: the idle identity and its slot are as they were.
    let m = with_grace(60_000);
    assert!(loaded(&dp).is_empty(), "{:?}", dp.calls());
    assert_eq!(slot_writes(&dp), 0, "{:?}", dp.calls());
    assert!(dp.slots().contains(&slot));
    let idle = m.identities().into_iter().find(|i| i.id == w0.identity);
    assert_eq!(idle.map(|i| i.references), Some(0));
    assert_consistent(&m, "idle slot restored");
    dp.clear_calls();
    let w1 = pod(&m, "w1", "web");
    assert_eq!((w1.identity, dp.slot_of(w1.id)), (w0.identity, Some(slot)));
    assert_eq!(slot_writes(&dp), 0, "{:?}", dp.calls());
    assert_consistent(
        &m,
        "idle slot reused after a restart, with its enforcement flags",
    );
    rt.block_on(m.delete("w1", "eth0")).unwrap();
    m.persist_slot_records();
    drop(m);

    // Without a grace period the restart frees both: the slot is read back and released.
    let m = with_grace(0);
    assert_eq!(loaded(&dp), BTreeSet::from([slot]));
    assert!(!dp.slots().contains(&slot));
    assert!(m.identities().iter().all(|i| i.id != w0.identity));
    assert_consistent(&m, "no grace");
}
