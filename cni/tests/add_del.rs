//! ADD/DEL/CHECK/GC against the real binary in private netns (root only; never skipped).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    reason = "an integration test crate: its helpers panic with context like its tests (clippy.toml's allow-*-in-tests covers only #[test] functions)"
)]

mod common;

use common::{World, ping, sh};
use serde_json::{Value, json};

fn keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().expect("object").keys().cloned().collect();
    k.sort();
    k
}

fn pod_ip(result: &Value, family: usize) -> String {
    let addr = result["ips"][family]["address"].as_str().expect("address");
    addr.split('/').next().expect("ip").to_owned()
}

fn assert_result_shape(version: &str, cid: &str, netns: &str, r: &Value) {
    assert_eq!(r["cniVersion"], version);
    let host = World::host_ifname(cid);
    assert_eq!(r["interfaces"][0]["name"], host.as_str());
    assert_eq!(r["interfaces"][1]["name"], "eth0");
    assert_eq!(r["interfaces"][1]["sandbox"], netns);
    assert!(r["interfaces"][0].get("sandbox").is_none(), "{r}");
    let (hmac, pmac) = weft_api::naming::veth_macs(cid, "eth0");
    assert_eq!(r["interfaces"][0]["mac"], hmac.to_string());
    assert_eq!(r["interfaces"][1]["mac"], pmac.to_string());
    let ip_keys = if version == "0.4.0" {
        vec!["address", "gateway", "interface", "version"]
    } else {
        vec!["address", "gateway", "interface"]
    };
    for (fam, ip) in r["ips"].as_array().expect("ips").iter().enumerate() {
        assert_eq!(keys(ip), ip_keys, "{version}: {ip}");
        assert_eq!(ip["interface"], 1);
        if version == "0.4.0" {
            assert_eq!(ip["version"], if fam == 0 { "4" } else { "6" });
        }
    }
    assert!(
        r["ips"][0]["address"].as_str().unwrap().ends_with("/32"),
        "{r}"
    );
    assert!(
        r["ips"][1]["address"].as_str().unwrap().ends_with("/128"),
        "{r}"
    );
    assert_eq!(r["ips"][0]["gateway"], "10.77.0.1");
    assert_eq!(r["ips"][1]["gateway"], "fd77::1");
    assert_eq!(
        r["routes"],
        json!([{"dst": "0.0.0.0/0", "gw": "10.77.0.1"}, {"dst": "::/0", "gw": "fd77::1"}])
    );
    assert_eq!(r["dns"]["nameservers"][0], "10.96.0.10");
    assert_eq!(
        r["interfaces"][1].get("mtu").is_some(),
        version == "1.1.0",
        "{r}"
    );
}

#[test]
fn add_gives_spec_results_and_connectivity_for_each_version() {
    let mut w = World::new("add");
    let mut results = Vec::new();
    for (i, version) in ["0.4.0", "1.0.0", "1.1.0"].into_iter().enumerate() {
        let netns = w.add_pod();
        let cid = format!("ctr-add-{i}");
        let out = w.run("ADD", &cid, &netns, &w.conf(version));
        out.expect_ok();
        let r = out.json();
        assert_result_shape(version, &cid, &netns, &r);
        let host = World::host_ifname(&cid);
        assert!(w.has_node_link(&host));

        // The pod end really has the MTU, MAC and name the result claims.
        let (_, pmac) = weft_api::naming::veth_macs(&cid, "eth0");
        let link = sh(&[
            "ip",
            "-n",
            w.pods.last().unwrap(),
            "-o",
            "link",
            "show",
            "eth0",
        ]);
        assert!(link.contains("mtu 1400"), "{link}");
        assert!(link.contains(&pmac.to_string()), "{link}");

        assert!(
            ping(&netns, "10.77.0.1"),
            "{version}: pod cannot ping the v4 router"
        );
        assert!(
            ping(&netns, "fd77::1"),
            "{version}: pod cannot ping the v6 router"
        );
        results.push((netns, r));
    }
    {
        let st = w.manager().state();
        assert_eq!(st.endpoints.len(), 3);
        assert!(
            st.endpoints
                .iter()
                .all(|e| e.state == weft_api::EndpointState::Ready)
        );
        assert_eq!(st.endpoints[0].pod_namespace.as_deref(), Some("default"));
        assert_eq!(st.endpoints[0].labels[0].key, "app");
    }

    // Pod to pod, both families, both directions.
    let (a_ns, a) = &results[0];
    let (b_ns, b) = &results[2];
    assert!(
        ping(a_ns, &pod_ip(b, 0)),
        "pod a cannot reach pod b over v4"
    );
    assert!(
        ping(a_ns, &pod_ip(b, 1)),
        "pod a cannot reach pod b over v6"
    );
    assert!(
        ping(b_ns, &pod_ip(a, 0)),
        "pod b cannot reach pod a over v4"
    );
    assert!(
        ping(b_ns, &pod_ip(a, 1)),
        "pod b cannot reach pod a over v6"
    );
}

#[test]
fn del_removes_veth_releases_and_is_idempotent() {
    let mut w = World::new("del");
    let before = w.snapshot();
    let netns = w.add_pod();
    let conf = w.conf("1.0.0");
    let add = w.run("ADD", "ctr-del", &netns, &conf);
    add.expect_ok();
    let host = World::host_ifname("ctr-del");
    assert!(w.has_node_link(&host));
    // Logs went to logFile, not stdout (stdout is parsed as one JSON document below).
    let log = std::fs::read_to_string(w.dir.join("cni.log")).expect("logFile written");
    assert!(
        log.contains("ctr-del") && log.contains("allocated"),
        "{log}"
    );
    assert!(add.stderr.is_empty(), "{add:?}");

    let mut del_conf = conf.clone();
    del_conf["prevResult"] = add.json();
    let out = w.run("DEL", "ctr-del", &netns, &del_conf);
    out.expect_ok();
    assert!(out.stdout.trim().is_empty(), "DEL prints nothing: {out:?}");
    assert!(!w.has_node_link(&host), "host veth survived DEL");
    assert!(w.manager().state().endpoints.is_empty(), "IP not released");
    assert!(
        w.manager()
            .state()
            .log
            .contains(&"DELETE /v1/endpoints?container_id=ctr-del&ifname=eth0".to_owned())
    );
    assert_eq!(w.snapshot(), before, "DEL left something in the node netns");
    assert!(!sh(&["ip", "-n", w.pods.last().unwrap(), "link"]).contains("eth0"));

    // Second DEL (same args), then containerd's RemovePodSandbox DEL: no netns, no prevResult.
    w.run("DEL", "ctr-del", &netns, &del_conf).expect_ok();
    w.run("DEL", "ctr-del", "", &conf).expect_ok();
    // A DEL for a container that never existed is fine too.
    w.run("DEL", "never-added", "", &conf).expect_ok();
}

#[test]
fn stale_del_does_not_free_another_containers_ip() {
    let mut w = World::new("stale");
    let netns = w.add_pod();
    let conf = w.conf("1.0.0");
    w.run("ADD", "ctr-live", &netns, &conf).expect_ok();
    w.run("DEL", "ctr-gone", "", &conf).expect_ok();
    assert_eq!(w.manager().state().endpoints.len(), 1);
    assert!(w.has_node_link(&World::host_ifname("ctr-live")));
    assert!(ping(&netns, "10.77.0.1"));
}

#[test]
fn duplicate_add_of_a_ready_endpoint_fails_without_releasing() {
    let mut w = World::new("dup");
    let netns = w.add_pod();
    let conf = w.conf("1.0.0");
    w.run("ADD", "ctr-dup", &netns, &conf).expect_ok();
    let v = w.run("ADD", "ctr-dup", &netns, &conf).expect_error(101);
    assert!(v["msg"].as_str().unwrap().contains("ready"), "{v}");
    assert_eq!(
        w.manager().state().endpoints.len(),
        1,
        "the live pod lost its IP"
    );
    assert!(w.has_node_link(&World::host_ifname("ctr-dup")));
    assert!(ping(&netns, "10.77.0.1"));
}

#[test]
fn check_passes_then_reports_a_missing_route() {
    let mut w = World::new("check");
    let netns = w.add_pod();
    let conf = w.conf("1.0.0");
    let add = w.run("ADD", "ctr-check", &netns, &conf);
    add.expect_ok();
    let mut check_conf = conf.clone();
    check_conf["prevResult"] = add.json();
    let out = w.run("CHECK", "ctr-check", &netns, &check_conf);
    out.expect_ok();
    assert!(out.stdout.trim().is_empty(), "{out:?}");

    w.run("CHECK", "ctr-check", &netns, &conf).expect_error(7);

    sh(&[
        "ip",
        "-n",
        w.pods.last().unwrap(),
        "-6",
        "route",
        "del",
        "default",
    ]);
    let v = w
        .run("CHECK", "ctr-check", &netns, &check_conf)
        .expect_error(104);
    assert!(v["msg"].as_str().unwrap().contains("fd77::1"), "{v}");

    // The manager forgetting the endpoint is a mismatch too.
    w.manager().state().endpoints.clear();
    let v = w
        .run("CHECK", "ctr-check", &netns, &check_conf)
        .expect_error(104);
    assert!(v["msg"].as_str().unwrap().contains("no endpoint"), "{v}");
}

#[test]
fn gc_sends_valid_attachments_and_prints_nothing() {
    let mut w = World::new("gc");
    let conf = w.conf("1.1.0");
    for cid in ["ctr-keep", "ctr-drop"] {
        let netns = w.add_pod();
        w.run("ADD", cid, &netns, &conf).expect_ok();
    }
    let mut gc_conf = conf.clone();
    gc_conf["cni.dev/valid-attachments"] = json!([{"containerID": "ctr-keep", "ifname": "eth0"}]);
    let out = w.cni(&[("CNI_COMMAND", "GC")], &gc_conf.to_string());
    out.expect_ok();
    assert!(out.stdout.trim().is_empty(), "{out:?}");
    let st = w.manager().state();
    assert_eq!(st.endpoints.len(), 1);
    assert_eq!(st.endpoints[0].container_id, "ctr-keep");
}

#[test]
fn parallel_adds_and_dels_in_one_node() {
    let mut w = World::new("par");
    let conf = w.conf("1.0.0");
    let pods: Vec<(String, String)> = (0..8)
        .map(|i| (format!("ctr-par-{i}"), w.add_pod()))
        .collect();
    let before = w.snapshot();
    std::thread::scope(|s| {
        for (cid, netns) in &pods {
            let (w, conf) = (&w, &conf);
            s.spawn(move || w.run("ADD", cid, netns, conf).expect_ok().json());
        }
    });
    assert_eq!(w.manager().state().endpoints.len(), 8);
    for (cid, netns) in &pods {
        assert!(w.has_node_link(&World::host_ifname(cid)), "{cid}");
        assert!(ping(netns, "10.77.0.1"), "{cid} cannot reach the router");
    }
    std::thread::scope(|s| {
        for (cid, netns) in &pods {
            let (w, conf) = (&w, &conf);
            s.spawn(move || w.run("DEL", cid, netns, conf).expect_ok().code);
        }
    });
    assert!(w.manager().state().endpoints.is_empty());
    assert_eq!(w.snapshot(), before, "parallel DEL left something behind");
}
