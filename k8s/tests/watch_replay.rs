//! The watch layer against a local server replaying recorded API server responses: the real
//! kube client and kube-runtime watchers, with a dropped watch (resumed from the bookmark's
//! resourceVersion, no re-list), a 410 Gone (re-list, and what vanished is dropped), namespace
//! label changes reaching pods, policy objects applied, rejected and deleted, and Services with
//! their `EndpointSlices` translated into frontends and backends.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    reason = "an integration test crate: its helpers panic with context like its tests (clippy.toml's allow-*-in-tests covers only #[test] functions)"
)]

mod common;

use common::{Recorder, eventually, json, param, push, testdata, watch};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use weft_k8s::replay::{Replay, WatchEnd, event, gone, list};
use weft_k8s::watch::{Optional, Sink, Watchers};

fn script() -> Replay {
    let web = json("pod-web.json");
    let mut old = web.clone();
    old["metadata"]["name"] = "old-1".into();
    let mut web_db = web.clone();
    web_db["metadata"]["labels"]["tier"] = "db".into();
    let recorded: Vec<Value> = std::fs::read_to_string(testdata("watch-pods.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ns = json("namespace-prod.json");
    let mut ns_billing = ns.clone();
    ns_billing["metadata"]["labels"]["team"] = "billing".into();
    let np_named = json("networkpolicy-ns-expr-named-port.json");
    let mut np_ok = np_named.clone();
    np_ok["metadata"]["name"] = "allow-payments-8080".into();
    np_ok["spec"]["ingress"][0]["ports"][0]["port"] = 8080.into();
    let mut np_bad = np_named.clone();
    np_bad["metadata"]["name"] = "bad-port".into();
    np_bad["spec"]["ingress"][0]["ports"][0]["port"] = 70000.into();
    let mut np_bad_selector = np_named.clone();
    np_bad_selector["metadata"]["name"] = "bad-selector".into();
    np_bad_selector["spec"]["podSelector"] = serde_json::json!({"matchExpressions": [{"key": "app", "operator": "Equals", "values": ["x"]}]});
    let mut np_refused = np_named.clone();
    np_refused["metadata"]["name"] = "refused-by-sink".into();
    Replay::default()
        .list(
            "/api/v1/nodes",
            list("v1", "Node", "5", vec![json("node.json")]),
        )
        .list("/api/v1/pods", list("v1", "Pod", "100", vec![web, old]))
        .watch("/api/v1/pods", recorded, WatchEnd::Close)
        .watch("/api/v1/pods", vec![gone("105")], WatchEnd::Close)
        .list("/api/v1/pods", list("v1", "Pod", "200", vec![web_db]))
        .list(
            "/api/v1/namespaces",
            list("v1", "Namespace", "10", vec![ns]),
        )
        .watch(
            "/api/v1/namespaces",
            vec![event("MODIFIED", ns_billing)],
            WatchEnd::Hang,
        )
        .list(
            "/apis/networking.k8s.io/v1/networkpolicies",
            list(
                "networking.k8s.io/v1",
                "NetworkPolicy",
                "20",
                vec![np_ok.clone(), np_named, np_bad, np_bad_selector, np_refused],
            ),
        )
        .watch(
            "/apis/networking.k8s.io/v1/networkpolicies",
            vec![event("DELETED", np_ok)],
            WatchEnd::Hang,
        )
        .list(SERVICES, list("v1", "Service", "40", Vec::new()))
        .list(
            SLICES,
            list("discovery.k8s.io/v1", "EndpointSlice", "41", Vec::new()),
        )
        .list(
            "/apis/cilium.io/v2/ciliumnetworkpolicies",
            list(
                "cilium.io/v2",
                "CiliumNetworkPolicy",
                "30",
                vec![json("cnp.json")],
            ),
        )
        .list(
            "/apis/cilium.io/v2/ciliumclusterwidenetworkpolicies",
            list(
                "cilium.io/v2",
                "CiliumClusterwideNetworkPolicy",
                "31",
                vec![json("ccnp.json")],
            ),
        )
}

const SERVICES: &str = "/api/v1/services";
const SLICES: &str = "/apis/discovery.k8s.io/v1/endpointslices";

/// list → watch from the list's version → (dropped) watch from the bookmark's version, no
/// re-list → 410 Gone → re-list → watch from the new list's version.
fn check_pod_requests(p: &[String]) {
    let is_watch = |l: &str| param(l, "watch") == Some("true");
    assert!(!is_watch(&p[0]), "{p:#?}");
    assert_eq!(
        param(&p[0], "fieldSelector"),
        Some("spec.nodeName%3Dworker-1"),
        "{p:#?}"
    );
    assert!(
        is_watch(&p[1]) && param(&p[1], "resourceVersion") == Some("100"),
        "{p:#?}"
    );
    assert_eq!(param(&p[1], "allowWatchBookmarks"), Some("true"), "{p:#?}");
    assert!(
        is_watch(&p[2]) && param(&p[2], "resourceVersion") == Some("105"),
        "{p:#?}"
    );
    assert!(
        !is_watch(&p[3]),
        "after 410 Gone the watcher re-lists: {p:#?}"
    );
    assert!(
        is_watch(&p[4]) && param(&p[4], "resourceVersion") == Some("200"),
        "{p:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(
    clippy::too_many_lines,
    reason = "one scripted watch session, its steps in order"
)]
async fn watchers_resume_relist_and_deliver() {
    let replay = script();
    let url = replay.serve().await.unwrap();
    let dir = std::env::temp_dir().join(format!("weft-k8s-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, Replay::kubeconfig(&url)).unwrap();
    let client = weft_k8s::client::client(Some(&kubeconfig)).await.unwrap();
    std::fs::remove_dir_all(&dir).unwrap();

    let rec = Arc::new(Recorder::default());
    let w = Watchers::new(client, "worker-1", rec.clone());
    let _tasks = w.spawn(Optional {
        cilium: true,
        cluster_network_policies: false,
    });
    w.wait_synced(Duration::from_secs(30)).await.unwrap();

    let pod_requests = || -> Vec<String> {
        replay
            .log()
            .into_iter()
            .filter(|l| l.starts_with("GET /api/v1/pods?"))
            .collect()
    };
    let state = || format!("requests: {:#?}\nevents: {:#?}", replay.log(), rec.events());
    eventually(
        "pods re-listed after 410 and watched again",
        || pod_requests().len() >= 5,
        state,
    )
    .await;

    check_pod_requests(&pod_requests());

    let web = "pod prod/web-5d8f7c9b6d-x7k2p";
    let ev = rec.events();
    let tiers: Vec<&str> = ev
        .iter()
        .filter(|e| e.starts_with(web))
        .filter_map(|e| e.split(',').find_map(|l| l.strip_prefix("k8s:tier=")))
        .collect();
    assert!(tiers.starts_with(&["frontend"]), "{ev:#?}");
    assert!(tiers.contains(&"backend"), "{ev:#?}");
    assert_eq!(tiers.last(), Some(&"db"), "{ev:#?}");
    assert!(
        ev.iter()
            .any(|e| e.starts_with(web)
                && e.contains("k8s:io.cilium.k8s.namespace.labels.team=billing")),
        "namespace label change reaches the pod: {ev:#?}"
    );
    assert!(
        !ev.iter().any(|e| e.contains("pod-template-hash")),
        "{ev:#?}"
    );
    // What the re-list no longer has is gone from the cache; the deleted pod too.
    assert!(w.cache.labels("prod", "old-1").is_none());
    assert!(w.cache.labels("prod", "db-0").is_none());
    assert!(w.cache.labels("prod", "web-5d8f7c9b6d-x7k2p").is_some());

    assert!(ev.contains(&"node worker-1".to_owned()), "{ev:#?}");
    // The list's objects reach the sink together (one repository change in the manager), the
    // one whose selector cannot be read left out.
    let list = "list NetworkPolicy prod/allow-payments-8080, NetworkPolicy prod/allow-payments-http, \
                NetworkPolicy prod/bad-port, NetworkPolicy prod/refused-by-sink";
    let at = ev.iter().position(|e| e == list);
    assert!(at.is_some(), "{list}: {ev:#?}");
    assert!(
        ev[..at.unwrap()]
            .iter()
            .all(|e| !e.starts_with("apply NetworkPolicy ")),
        "nothing of the list is applied before it is complete: {ev:#?}"
    );
    for applied in [
        "apply NetworkPolicy prod/allow-payments-8080 rules=1",
        "apply NetworkPolicy prod/allow-payments-http rules=1",
        "apply CiliumNetworkPolicy prod/web-from-frontend rules=1",
        "apply CiliumClusterwideNetworkPolicy deny-to-metadata rules=1",
    ] {
        assert!(ev.contains(&applied.to_owned()), "{applied}: {ev:#?}");
    }
    eventually(
        "the deleted NetworkPolicy's rules deleted",
        || {
            rec.events()
                .contains(&"delete NetworkPolicy prod/allow-payments-8080".to_owned())
        },
        state,
    )
    .await;
    // A rule that cannot be expressed is left out, and the object still isolates its pods; an
    // object whose selector cannot be read is rejected.
    assert!(
        ev.contains(&"apply NetworkPolicy prod/bad-port rules=1".to_owned()),
        "{ev:#?}"
    );
    let partial = w.cache.partial();
    assert_eq!(partial.len(), 1, "{partial:?}");
    assert_eq!(partial[0].object, "NetworkPolicy prod/bad-port");
    assert!(
        partial[0].not_enforced[0].contains("70000\" is not a port number"),
        "{partial:?}"
    );
    // Refused by the sink: rejected like an object that does not translate.
    let rejected = w.cache.rejected();
    assert_eq!(rejected.len(), 2, "{rejected:?}");
    assert_eq!(rejected[0].object, "NetworkPolicy prod/bad-selector");
    assert!(
        rejected[0].error.contains("unknown operator \"Equals\""),
        "{rejected:?}"
    );
    assert_eq!(rejected[1].object, "NetworkPolicy prod/refused-by-sink");
    assert!(
        rejected[1].error.contains("refused by the sink"),
        "{rejected:?}"
    );
    let counts = w.stats.snapshot();
    assert_eq!(
        counts.get(&("NetworkPolicy".into(), "rejected".into())),
        Some(&2),
        "{counts:?}"
    );
    assert_eq!(
        counts.get(&("NetworkPolicy".into(), "partial".into())),
        Some(&1),
        "{counts:?}"
    );
    assert!(
        counts
            .get(&("pods".into(), "error".into()))
            .copied()
            .unwrap_or(0)
            >= 1,
        "the 410 is counted: {counts:?}"
    );
}

/// testdata/k8s/services.json's items of `kind`.
fn items(kind: &str) -> Vec<Value> {
    json("services.json")["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["kind"] == kind)
        .cloned()
        .collect()
}

/// Services of other proxies, and slices of headless Services and of no Service, are not
/// listed (kube-proxy's selectors).
fn check_service_selectors(log: &[String]) {
    let selector = |path: &str| {
        log.iter()
            .find(|l| l.starts_with(&format!("GET {path}?")))
            .and_then(|l| param(l, "labelSelector"))
            .map(str::to_owned)
    };
    assert_eq!(
        selector(SERVICES).as_deref(),
        Some("%21service.kubernetes.io%2Fservice-proxy-name"),
        "{log:#?}"
    );
    assert_eq!(
        selector(SLICES).as_deref(),
        Some(
            "kubernetes.io%2Fservice-name%2C%21service.kubernetes.io%2Fheadless%2C%21service.kubernetes.io%2Fservice-proxy-name"
        ),
        "{log:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_and_slices_deliver_frontends_and_their_changes() {
    let slices = items("EndpointSlice");
    let services = items("Service");
    let replay = Replay::default()
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
        .list(SERVICES, list("v1", "Service", "4100", services.clone()))
        .list(
            SLICES,
            list(
                "discovery.k8s.io/v1",
                "EndpointSlice",
                "4200",
                slices.clone(),
            ),
        );
    // The manager had prod/web and prod/stale before a restart.
    let rec = Arc::new(Recorder::default());
    rec.services
        .lock()
        .unwrap()
        .extend(["prod/web".to_owned(), "prod/stale".to_owned()]);
    let (w, _tasks) = watch(&replay, rec.clone()).await;
    w.wait_synced(Duration::from_secs(30)).await.unwrap();

    let web = "service prod/web: Tcp 10.96.0.10:80 -> 10.0.16.5:8080,10.0.17.8:8080,10.0.17.9:8080; \
               Tcp 10.96.0.10:9090 -> 10.0.16.5:9102,10.0.17.8:9102,10.0.17.9:9102";
    let services_of = |ev: Vec<String>| -> Vec<String> {
        ev.into_iter()
            .filter(|e| e.starts_with("service "))
            .collect()
    };
    // Both lists first, then every Service at once: none delivered without its slices.
    assert_eq!(
        services_of(rec.events()),
        [
            "service prod/api: Tcp 10.96.0.11:80 -> 10.0.16.20:8080",
            "service prod/cache: Tcp 10.96.0.12:6379 -> 10.0.16.50:6379",
            "service prod/dns: Udp 10.96.0.53:53 -> 10.0.16.40:5353; Tcp 10.96.0.53:53 -> 10.0.16.40:5353; \
             Udp [fd00:10:96::35]:53 -> [fd00:10:16::28]:5353; Tcp [fd00:10:96::35]:53 -> [fd00:10:16::28]:5353",
            "service prod/shop: Tcp 10.96.0.13:443 -> 10.0.17.60:8443",
            web,
            "service delete prod/stale",
        ]
    );
    check_service_selectors(&replay.log());

    // 10.0.16.6 becomes ready: prod/web gets it, and nothing else is delivered.
    let before = services_of(rec.events()).len();
    let mut web_slice = slices
        .iter()
        .find(|s| s["metadata"]["name"] == "web-7xk2p")
        .unwrap()
        .clone();
    web_slice["metadata"]["resourceVersion"] = "4201".into();
    web_slice["endpoints"][2]["conditions"] =
        serde_json::json!({"ready": true, "serving": true, "terminating": false});
    push(&replay, SLICES, &event("MODIFIED", web_slice)).await;
    let state = || format!("events: {:#?}", rec.events());
    eventually(
        "the slice change delivered",
        || services_of(rec.events()).len() > before,
        state,
    )
    .await;
    assert_eq!(
        services_of(rec.events())[before..],
        [
            "service prod/web: Tcp 10.96.0.10:80 -> 10.0.16.5:8080,10.0.16.6:8080,10.0.17.8:8080,10.0.17.9:8080; \
             Tcp 10.96.0.10:9090 -> 10.0.16.5:9102,10.0.16.6:9102,10.0.17.8:9102,10.0.17.9:9102"
        ]
    );

    // A deleted Service is deleted.
    let api = services
        .iter()
        .find(|s| s["metadata"]["name"] == "api")
        .unwrap()
        .clone();
    push(&replay, SERVICES, &event("DELETED", api)).await;
    eventually(
        "the Service deletion delivered",
        || rec.events().last().map(String::as_str) == Some("service delete prod/api"),
        state,
    )
    .await;
    assert_eq!(
        rec.service_names(),
        ["prod/cache", "prod/dns", "prod/shop", "prod/web"]
    );
}
