//! `ClusterNetworkPolicy` against a local server replaying API server responses: objects
//! applied (one rule per ingress and egress rule), rejected (the previous version's rules
//! stay) and deleted; their `status.conditions` written with server-side apply on the status
//! subresource, only when they change; and a CRD that is not installed neither blocks the
//! initial sync nor stops the watch from following the objects once it is.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    reason = "an integration test crate: its helpers panic with context like its tests (clippy.toml's allow-*-in-tests covers only #[test] functions)"
)]

mod common;

use common::{Recorder, eventually, json, param, push, watch_with};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use weft_k8s::replay::{Replay, event, list};

/// A `ClusterNetworkPolicy` entry of the cache: name, tier, priority, rules, status.
type Row = (String, String, Option<i64>, Option<usize>, String);

const CNPS: &str = "/apis/policy.networking.k8s.io/v1beta1/clusternetworkpolicies";

/// The lists every watcher needs, empty; the node.
fn base() -> Replay {
    Replay::default()
        .list(
            "/api/v1/nodes",
            list("v1", "Node", "5", vec![json("node.json")]),
        )
        .list("/api/v1/pods", list("v1", "Pod", "100", Vec::new()))
        .list(
            "/api/v1/namespaces",
            list("v1", "Namespace", "10", Vec::new()),
        )
        .list(
            "/apis/networking.k8s.io/v1/networkpolicies",
            list("networking.k8s.io/v1", "NetworkPolicy", "20", Vec::new()),
        )
        .list("/api/v1/services", list("v1", "Service", "40", Vec::new()))
        .list(
            "/apis/discovery.k8s.io/v1/endpointslices",
            list("discovery.k8s.io/v1", "EndpointSlice", "41", Vec::new()),
        )
}

/// testdata's `ClusterNetworkPolicy` renamed, at `generation` and `rv`.
fn cnp(name: &str, generation: i64, rv: &str) -> Value {
    let mut o = json("clusternetworkpolicy.json");
    o["metadata"]["name"] = name.into();
    o["metadata"]["uid"] = format!("uid-{name}").into();
    o["metadata"]["generation"] = generation.into();
    o["metadata"]["resourceVersion"] = rv.into();
    o
}

fn status_path(name: &str) -> String {
    format!("{CNPS}/{name}/status")
}

/// The conditions of the status patches so far, by object name, in order.
fn conditions(replay: &Replay) -> Vec<(String, Value)> {
    replay
        .patches()
        .into_iter()
        .filter_map(|(path, body)| {
            let name = path
                .strip_prefix(&format!("{CNPS}/"))?
                .strip_suffix("/status")?;
            Some((name.to_owned(), body["status"]["conditions"].clone()))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(
    clippy::too_many_lines,
    reason = "one scripted watch session, its steps in order"
)]
async fn cluster_network_policies_apply_reject_delete_and_report_status() {
    let ok = cnp("a-ok", 1, "300");
    let mut nodes = cnp("b-nodes", 4, "301");
    nodes["spec"]["egress"][0]["to"][0] = json!({"nodes": {}});
    // Already carries the condition Weft would write: no write.
    let mut current = cnp("c-current", 2, "302");
    current["status"] = json!({"conditions": [
        {"type": "Programmed", "status": "True", "reason": "Other", "message": "another writer",
         "lastTransitionTime": "2026-01-01T00:00:00Z"},
        {"type": "Accepted", "status": "True", "reason": "Accepted", "message": "in force",
         "observedGeneration": 2, "lastTransitionTime": "2026-01-01T00:00:00Z"}]});
    // No rules: nothing in force, accepted.
    let mut empty = cnp("d-empty", 1, "303");
    empty["spec"]
        .as_object_mut()
        .unwrap()
        .retain(|k, _| k != "ingress" && k != "egress");
    let mut replay = base().list(
        CNPS,
        list(
            "policy.networking.k8s.io/v1beta1",
            "ClusterNetworkPolicy",
            "310",
            vec![ok.clone(), nodes.clone(), current.clone(), empty.clone()],
        ),
    );
    for o in [&ok, &nodes, &current, &empty] {
        let name = o["metadata"]["name"].as_str().unwrap();
        replay = replay.object(&status_path(name), o.clone());
    }
    let rec = Arc::new(Recorder::default());
    let (w, _tasks) = watch_with(&replay, rec.clone(), true).await;
    w.wait_synced(Duration::from_secs(30)).await.unwrap();
    assert!(w.problems().is_empty(), "{:?}", w.problems());
    let state = || {
        format!(
            "requests: {:#?}\nevents: {:#?}\npatches: {:#?}",
            replay.log(),
            rec.events(),
            replay.patches()
        )
    };

    // Rules: a-ok's two, one per rule, in the Admin tier; none of b-nodes; d-empty has none.
    let ev = rec.events();
    assert!(
        ev.contains(&"apply ClusterNetworkPolicy a-ok rules=2".to_owned()),
        "{ev:#?}"
    );
    assert!(
        ev.contains(&"apply ClusterNetworkPolicy c-current rules=2".to_owned()),
        "{ev:#?}"
    );
    assert!(
        !ev.iter()
            .any(|e| e.contains("apply ClusterNetworkPolicy b-nodes")),
        "{ev:#?}"
    );
    assert!(
        !ev.iter()
            .any(|e| e.contains("apply ClusterNetworkPolicy d-empty")),
        "{ev:#?}"
    );
    let rules = rec.rules.lock().unwrap().clone();
    let a_ok = rules
        .iter()
        .find(|(k, _)| k.name == "a-ok")
        .map(|(_, r)| r.clone())
        .unwrap();
    let tiers: Vec<String> = a_ok
        .iter()
        .map(|r| serde_json::to_string(r.tier.as_ref().unwrap()).unwrap())
        .collect();
    assert_eq!(
        tiers,
        [
            r#"{"tier":"admin","priority":10,"direction":"ingress","index":0,"action":"Accept","name":"monitoring-always"}"#,
            r#"{"tier":"admin","priority":10,"direction":"egress","index":0,"action":"Deny","name":"no-metadata"}"#,
        ]
    );
    let rejected = w.cache.rejected();
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert_eq!(rejected[0].object, "ClusterNetworkPolicy b-nodes");
    let tiered: Vec<Row> = w
        .cache
        .tiered()
        .into_iter()
        .map(|p| (p.name, p.tier, p.priority, p.rules, p.status))
        .collect();
    let row = |n: &str, r: Option<usize>, s: &str| {
        (n.to_owned(), "Admin".to_owned(), Some(10), r, s.to_owned())
    };
    assert_eq!(
        tiered,
        [
            row("a-ok", Some(2), "Accepted"),
            row("b-nodes", None, "Rejected"),
            row("c-current", Some(2), "Accepted"),
            row("d-empty", Some(0), "Accepted"),
        ]
    );

    // Status: written for a-ok, b-nodes and d-empty, with server-side apply; not for c-current.
    eventually(
        "three status writes",
        || conditions(&replay).len() >= 3,
        state,
    )
    .await;
    let written = conditions(&replay);
    let names: Vec<&str> = written.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["a-ok", "b-nodes", "d-empty"], "{}", state());
    let cond = |name: &str| {
        let (_, c) = written.iter().find(|(n, _)| n == name).unwrap();
        assert_eq!(c.as_array().unwrap().len(), 1, "{c}");
        c[0].clone()
    };
    let c = cond("a-ok");
    assert_eq!(
        (
            &c["type"],
            &c["status"],
            &c["reason"],
            &c["observedGeneration"]
        ),
        (
            &json!("Accepted"),
            &json!("True"),
            &json!("Accepted"),
            &json!(1)
        ),
        "{c}"
    );
    let c = cond("b-nodes");
    assert_eq!(
        (&c["status"], &c["reason"], &c["observedGeneration"]),
        (&json!("False"), &json!("Rejected"), &json!(4)),
        "{c}"
    );
    let msg = c["message"].as_str().unwrap();
    assert!(
        msg.contains("spec.egress[0].to[0].nodes: not supported yet: nodes peers"),
        "{msg}"
    );
    assert!(c["lastTransitionTime"].is_string(), "{c}");
    for line in replay.log().iter().filter(|l| l.starts_with("PATCH ")) {
        assert_eq!(param(line, "fieldManager"), Some("weft-manager"), "{line}");
        assert_eq!(param(line, "force"), Some("true"), "{line}");
    }

    // The API server's echo of a-ok's written status (new resourceVersion, same generation):
    // neither re-applied nor written again. Then d-empty gets a rule (generation 2): applied
    // and written, which shows the echo was handled (one stream, in order; writes of one batch
    // go in name order, so a stray a-ok write would come first).
    let mut echo = ok.clone();
    echo["metadata"]["resourceVersion"] = "320".into();
    echo["status"] = json!({"conditions": [cond("a-ok")]});
    push(&replay, CNPS, &event("MODIFIED", echo)).await;
    let mut grown = empty.clone();
    grown["metadata"]["generation"] = 2.into();
    grown["metadata"]["resourceVersion"] = "321".into();
    grown["spec"]["egress"] = ok["spec"]["egress"].clone();
    push(&replay, CNPS, &event("MODIFIED", grown)).await;
    eventually(
        "d-empty's second write",
        || conditions(&replay).len() >= 4,
        state,
    )
    .await;
    let written = conditions(&replay);
    assert_eq!(written.len(), 4, "{}", state());
    assert_eq!(written[3].0, "d-empty", "{}", state());
    assert_eq!(written[3].1[0]["observedGeneration"], 2);
    let ev = rec.events();
    assert_eq!(
        ev.iter()
            .filter(|e| *e == "apply ClusterNetworkPolicy a-ok rules=2")
            .count(),
        1,
        "{ev:#?}"
    );
    assert!(
        ev.contains(&"apply ClusterNetworkPolicy d-empty rules=1".to_owned()),
        "{ev:#?}"
    );

    // Deleted: its rules go, and so does its entry.
    push(&replay, CNPS, &event("DELETED", ok)).await;
    eventually(
        "a-ok's rules deleted",
        || {
            rec.events()
                .contains(&"delete ClusterNetworkPolicy a-ok".to_owned())
        },
        state,
    )
    .await;
    assert!(!w.cache.tiered().iter().any(|p| p.name == "a-ok"));
    assert_eq!(
        w.stats
            .status_writes
            .load(std::sync::atomic::Ordering::Relaxed),
        4
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_crd_neither_blocks_the_sync_nor_stops_the_watch() {
    // No list for the kind: the API server answers 404, as without the CRD.
    let replay = base();
    let rec = Arc::new(Recorder::default());
    let (w, _tasks) = watch_with(&replay, rec.clone(), true).await;
    w.wait_synced(Duration::from_secs(30)).await.unwrap();
    assert_eq!(
        w.problems(),
        ["ClusterNetworkPolicy: its CRD is not installed, these objects are not followed"]
    );
    assert!(rec.events().contains(&"node worker-1".to_owned()));
    // The CRD is installed and an object created: the retried list finds it.
    let _ = replay.clone().list(
        CNPS,
        list(
            "policy.networking.k8s.io/v1beta1",
            "ClusterNetworkPolicy",
            "400",
            vec![cnp("late", 1, "399")],
        ),
    );
    let state = || format!("requests: {:#?}\nevents: {:#?}", replay.log(), rec.events());
    eventually(
        "the object applied once the CRD is there",
        || {
            rec.events()
                .contains(&"apply ClusterNetworkPolicy late rules=2".to_owned())
        },
        state,
    )
    .await;
    eventually("the problem cleared", || w.problems().is_empty(), state).await;
}
