use super::*;
use crate::datapath::{FakeCall, FakeDatapath};
use weft_api::lb::LbProto;

fn fe(addr: &str, port: u16) -> Frontend {
    Frontend {
        addr: addr.parse().unwrap(),
        port,
        proto: LbProto::Tcp,
    }
}

fn be(addr: &str, port: u16) -> Backend {
    Backend {
        addr: addr.parse().unwrap(),
        port,
    }
}

fn lb_calls(dp: &FakeDatapath) -> Vec<FakeCall> {
    dp.calls()
        .into_iter()
        .filter(|c| matches!(c, FakeCall::LbUpsert(..) | FakeCall::LbRemove(..)))
        .collect()
}

#[test]
fn a_service_writes_each_frontend_once_and_follows_its_backends() {
    let dp = Arc::new(FakeDatapath::default());
    let lb = Services::new(dp.clone(), 16);
    let web = fe("10.96.0.10", 80);
    let dns = fe("10.96.0.10", 53);
    lb.apply("x/a", &[(web, vec![be("10.0.0.5", 8080)]), (dns, vec![])])
        .unwrap();
    // The same again writes nothing.
    lb.apply("x/a", &[(web, vec![be("10.0.0.5", 8080)]), (dns, vec![])])
        .unwrap();
    // A second backend, and the port without one gone.
    lb.apply(
        "x/a",
        &[(web, vec![be("10.0.0.5", 8080), be("10.0.0.6", 8080)])],
    )
    .unwrap();
    assert_eq!(
        lb_calls(&dp),
        vec![
            FakeCall::LbUpsert(1, web, 1),
            FakeCall::LbUpsert(2, dns, 0),
            FakeCall::LbRemove(2),
            FakeCall::LbUpsert(1, web, 2),
        ]
    );
    let table = dp.lb_frontends().unwrap();
    assert_eq!(table.len(), 1);
    assert_eq!(table[&1].1.len(), 2);
    lb.delete("x/a").unwrap();
    assert!(dp.lb_frontends().unwrap().is_empty());
    assert!(lb.names().is_empty());
    assert!(lb.list().is_empty());
}

#[test]
fn a_restart_keeps_frontend_ids_and_sweeps_what_no_service_claims() {
    let dp = Arc::new(FakeDatapath::default());
    let first = Services::new(dp.clone(), 16);
    let web = fe("10.96.0.10", 80);
    let gone = fe("10.96.0.11", 80);
    first
        .apply("x/a", &[(web, vec![be("10.0.0.5", 8080)])])
        .unwrap();
    first
        .apply("x/b", &[(gone, vec![be("10.0.0.7", 8080)])])
        .unwrap();
    drop(first);

    let lb = Services::new(dp.clone(), 16);
    assert_eq!(lb.restore().unwrap(), 2);
    let listed = lb.list();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].name, "(restored)");
    // x/a claims its frontend again: same id, nothing rewritten (same backends) except the
    // owner; a new frontend gets a fresh id.
    let api = fe("10.96.0.12", 443);
    lb.apply(
        "x/a",
        &[
            (web, vec![be("10.0.0.5", 8080)]),
            (api, vec![be("10.0.0.5", 8443)]),
        ],
    )
    .unwrap();
    let ids: BTreeMap<Frontend, u32> = lb
        .list()
        .into_iter()
        .flat_map(|s| s.frontends)
        .map(|f| (f.frontend, f.id))
        .collect();
    assert_eq!(ids[&web], 1);
    assert_eq!(ids[&gone], 2);
    assert_eq!(ids[&api], 3);
    assert_eq!(lb.sweep_unclaimed().unwrap(), 1);
    let left: Vec<u32> = dp.lb_frontends().unwrap().keys().copied().collect();
    assert_eq!(left, vec![1, 3]);
    assert_eq!(lb.names(), vec!["x/a".to_owned()]);
}

#[test]
fn a_frontend_moved_to_another_service_stays_when_the_first_goes() {
    let dp = Arc::new(FakeDatapath::default());
    let lb = Services::new(dp.clone(), 16);
    let web = fe("10.96.0.10", 80);
    lb.apply("x/a", &[(web, vec![be("10.0.0.5", 8080)])])
        .unwrap();
    lb.apply("x/b", &[(web, vec![be("10.0.0.6", 8080)])])
        .unwrap();
    lb.delete("x/a").unwrap();
    let table = dp.lb_frontends().unwrap();
    assert_eq!(table[&1].1, vec![be("10.0.0.6", 8080)]);
}

#[test]
fn ids_run_out_with_a_clear_error_and_nothing_written() {
    let dp = Arc::new(FakeDatapath::default());
    let lb = Services::new(dp.clone(), 1);
    lb.apply("x/a", &[(fe("10.96.0.10", 80), vec![])]).unwrap();
    let err = lb
        .apply("x/b", &[(fe("10.96.0.11", 80), vec![])])
        .unwrap_err();
    assert!(matches!(err, LbError::IdsExhausted(1)), "{err}");
    assert_eq!(dp.lb_frontends().unwrap().len(), 1);
    assert_eq!(lb.names(), vec!["x/a".to_owned()]);
}
