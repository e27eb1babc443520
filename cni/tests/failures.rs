//! Failure paths of the real binary: every failed ADD leaves the node netns exactly as it was and
//! the IP released. Root only; never skipped.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    reason = "an integration test crate: its helpers panic with context like its tests (clippy.toml's allow-*-in-tests covers only #[test] functions)"
)]

mod common;

use common::{World, sh};
use serde_json::json;

fn pod_has_eth0(w: &World) -> bool {
    sh(&["ip", "-n", w.pods.last().unwrap(), "-o", "link", "show"]).contains(" eth0")
}

#[test]
fn ifname_exists_releases_ip_and_leaves_no_veth() {
    let mut w = World::new("exists");
    let netns = w.add_pod();
    // Something already owns eth0 in the pod.
    sh(&[
        "ip",
        "-n",
        w.pods.last().unwrap(),
        "link",
        "add",
        "eth0",
        "type",
        "veth",
        "peer",
        "name",
        "other0",
    ]);
    let before = w.snapshot();
    let v = w
        .run("ADD", "ctr-exists", &netns, &w.conf("1.0.0"))
        .expect_error(101);
    let msg = v["msg"].as_str().unwrap();
    assert!(
        msg.contains("eth0") && msg.contains("already exists"),
        "{v}"
    );
    assert_eq!(w.snapshot(), before, "failed ADD changed the node netns");
    assert!(!w.has_node_link(&World::host_ifname("ctr-exists")));
    let st = w.manager().state();
    assert!(
        st.endpoints.is_empty(),
        "IP not released: {:?}",
        st.endpoints
    );
    assert!(
        st.log
            .iter()
            .any(|l| l == "DELETE /v1/endpoints?container_id=ctr-exists&ifname=eth0"),
        "{:?}",
        st.log
    );
}

/// The veth is created while the manager allocates, so a taken host name is retried once the
/// allocation (which waits for any background deletion of it) is done. Still taken: the ADD
/// fails naming the link and releases the endpoint — a release is a DEL of this (container,
/// ifname), whose host veth that name is, so the leftover goes with it, as before.
#[test]
fn host_veth_name_still_taken_fails_and_releases() {
    let mut w = World::new("taken");
    let netns = w.add_pod();
    let stray = World::host_ifname("ctr-taken");
    w.in_node(&[
        "ip", "link", "add", &stray, "type", "veth", "peer", "name", "strayp",
    ]);
    let before = w.snapshot();
    let v = w
        .run("ADD", "ctr-taken", &netns, &w.conf("1.0.0"))
        .expect_error(101);
    let msg = v["msg"].as_str().unwrap();
    assert!(
        msg.contains(&stray) && msg.contains("already exists"),
        "{v}"
    );
    let after = w.snapshot();
    assert_eq!((after.routes, after.neigh), (before.routes, before.neigh));
    assert!(!pod_has_eth0(&w), "the pod end of a failed ADD is left");
    assert!(w.manager().state().endpoints.is_empty(), "IP not released");
}

#[test]
fn manager_missing_is_code_11_naming_the_socket() {
    let mut w = World::new("nomgr");
    let netns = w.add_pod();
    w.stop_manager();
    let before = w.snapshot();
    let v = w
        .run("ADD", "ctr-nomgr", &netns, &w.conf("1.0.0"))
        .expect_error(11);
    let sock = w.socket().display().to_string();
    assert!(v["msg"].as_str().unwrap().contains(&sock), "{v}");
    assert_eq!(w.snapshot(), before);
    assert!(!pod_has_eth0(&w));
}

#[test]
fn pool_exhausted_is_code_100_naming_the_pool() {
    let mut w = World::new("full");
    w.manager().state().v4_capacity = 1;
    let first = w.add_pod();
    w.run("ADD", "ctr-first", &first, &w.conf("1.0.0"))
        .expect_ok();
    let netns = w.add_pod();
    let before = w.snapshot();
    let v = w
        .run("ADD", "ctr-second", &netns, &w.conf("1.0.0"))
        .expect_error(100);
    assert!(v["msg"].as_str().unwrap().contains("10.77.0.0/24"), "{v}");
    assert_eq!(w.snapshot(), before);
    assert!(!pod_has_eth0(&w));
}

#[test]
fn manager_rejecting_register_reverts_everything() {
    let mut w = World::new("reject");
    let netns = w.add_pod();
    let before = w.snapshot();
    w.manager().state().reject_ready = true;
    let v = w
        .run("ADD", "ctr-reject", &netns, &w.conf("1.0.0"))
        .expect_error(103);
    assert!(v["msg"].as_str().unwrap().contains("conflict"), "{v}");
    assert_eq!(
        w.snapshot(),
        before,
        "failed ADD left links/routes/neighbours behind"
    );
    assert!(!pod_has_eth0(&w));
    assert!(w.manager().state().endpoints.is_empty(), "IP not released");
}

#[test]
fn plumbing_failing_after_register_releases_the_ready_endpoint() {
    let mut w = World::new("plumbfail");
    let netns = w.add_pod();
    let pod = w.pods.last().unwrap().clone();
    // The pod already has a default route: adding the ADD's one fails with "exists", after the
    // manager was asked to register (registration runs alongside the plumbing).
    sh(&["ip", "-n", &pod, "link", "set", "lo", "up"]);
    sh(&["ip", "-n", &pod, "route", "add", "default", "dev", "lo"]);
    let before = w.snapshot();
    let v = w
        .run("ADD", "ctr-plumbfail", &netns, &w.conf("1.0.0"))
        .expect_error(102);
    assert!(v["msg"].as_str().unwrap().contains("default route"), "{v}");
    let state = w.manager().state();
    assert!(
        state.log.iter().any(|l| l.ends_with("/ready?")),
        "register was not attempted: {:?}",
        state.log
    );
    assert!(state.endpoints.is_empty(), "ready endpoint not released");
    drop(state);
    assert_eq!(
        w.snapshot(),
        before,
        "failed ADD left links/routes/neighbours behind"
    );
    assert!(!pod_has_eth0(&w));
}

/// Env overrides, stdin, expected CNI code.
type Case<'a> = (Vec<(&'a str, &'a str)>, String, u64);

#[test]
fn bad_env_and_netconf_fail_with_their_codes_and_touch_nothing() {
    let mut w = World::new("bad");
    let netns = w.add_pod();
    let good = w.conf("1.0.0");
    let before = w.snapshot();
    let env = |over: &[(&'static str, &'static str)]| {
        let mut e = vec![
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "ctr-bad"),
            ("CNI_IFNAME", "eth0"),
        ];
        e.retain(|(k, _)| !over.iter().any(|(o, _)| o == k));
        e.extend_from_slice(over);
        e
    };
    let with = |k: &str, v: serde_json::Value| {
        let mut c = good.clone();
        c[k] = v;
        c.to_string()
    };
    let cases: Vec<Case<'_>> = vec![
        (env(&[("CNI_COMMAND", "FROB")]), good.to_string(), 4),
        (env(&[("CNI_CONTAINERID", "bad/id")]), good.to_string(), 4),
        (
            env(&[("CNI_IFNAME", "way-too-long-name0")]),
            good.to_string(),
            4,
        ),
        (
            env(&[("CNI_NETNS", "/run/netns/does-not-exist")]),
            good.to_string(),
            4,
        ),
        (env(&[("CNI_ARGS", "FOO=bar")]), good.to_string(), 4),
        (env(&[]), "{not json".into(), 6),
        (env(&[]), with("type", json!("ptp")), 7),
        (env(&[]), with("mtu", json!(-5)), 7),
        (env(&[]), with("cniVersion", json!("0.1.0")), 1),
    ];
    for (mut e, stdin, code) in cases {
        if !e.iter().any(|(k, _)| *k == "CNI_NETNS") {
            e.push(("CNI_NETNS", &netns));
        }
        let out = w.cni(&e, &stdin);
        out.expect_error(code);
        assert_eq!(w.snapshot(), before, "{e:?} {stdin}");
        assert!(!pod_has_eth0(&w));
    }
    assert!(
        w.manager().state().log.is_empty(),
        "a bad input reached the manager"
    );
}

#[test]
fn del_with_manager_down_deletes_the_veth_and_queues_the_release() {
    let mut w = World::new("deldown");
    let netns = w.add_pod();
    let conf = w.conf("1.0.0");
    w.run("ADD", "ctr-deldown", &netns, &conf).expect_ok();
    assert!(w.has_node_link(&World::host_ifname("ctr-deldown")));
    w.stop_manager();
    w.run("DEL", "ctr-deldown", &netns, &conf).expect_ok();
    assert!(!w.has_node_link(&World::host_ifname("ctr-deldown")));
    let queue = weft_api::delete_queue::DeleteQueue::for_socket(&w.socket());
    let mut queued = Vec::new();
    queue
        .drain(|r| {
            queued.push((r.container_id.clone(), r.ifname.clone()));
            true
        })
        .unwrap();
    assert_eq!(
        queued,
        vec![("ctr-deldown".to_string(), "eth0".to_string())]
    );
}

#[test]
fn del_with_manager_down_and_a_full_queue_reports_11() {
    let mut w = World::new("delfull");
    let netns = w.add_pod();
    let conf = w.conf("1.0.0");
    w.stop_manager();
    let queue = weft_api::delete_queue::DeleteQueue::for_socket(&w.socket());
    std::fs::create_dir_all(queue.dir()).unwrap();
    for i in 0..weft_api::delete_queue::MAX_ENTRIES {
        std::fs::write(queue.dir().join(format!("filler{i}.json")), b"{}").unwrap();
    }
    let v = w.run("DEL", "ctr-delfull", &netns, &conf).expect_error(11);
    let msg = v["msg"].as_str().unwrap();
    assert!(msg.contains(&w.socket().display().to_string()), "{v}");
    assert!(msg.contains("full"), "{v}");
}

#[test]
fn status_reports_0_50_and_51() {
    let mut w = World::new("status");
    let status = |w: &World, version: &str| {
        w.cni(&[("CNI_COMMAND", "STATUS")], &w.conf(version).to_string())
    };
    let out = status(&w, "1.1.0");
    out.expect_ok();
    assert!(out.stdout.trim().is_empty());
    status(&w, "1.0.0").expect_error(1);

    w.manager().state().healthy = false;
    status(&w, "1.1.0").expect_error(50);
    w.manager().state().healthy = true;

    w.manager().state().v4_capacity = 0;
    let v = status(&w, "1.1.0").expect_error(51);
    assert!(v["msg"].as_str().unwrap().contains("10.77.0.0/24"), "{v}");

    w.stop_manager();
    let v = status(&w, "1.1.0").expect_error(50);
    assert!(
        v["msg"]
            .as_str()
            .unwrap()
            .contains(&w.socket().display().to_string()),
        "{v}"
    );
}

#[test]
fn version_lists_supported_versions() {
    let w = World::new("version");
    let out = w.cni(&[("CNI_COMMAND", "VERSION")], r#"{"cniVersion": "0.4.0"}"#);
    out.expect_ok();
    let v = out.json();
    assert_eq!(v["cniVersion"], "0.4.0");
    assert_eq!(
        v["supportedVersions"],
        json!(["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"])
    );
    let out = w.cni(&[("CNI_COMMAND", "VERSION")], "");
    assert_eq!(out.expect_ok().json()["cniVersion"], "1.1.0");
}
