//! What the replay tests share: testdata, a [`Sink`] that records what it is told, polling,
//! and the watchers started against a replay server.

#![allow(dead_code, reason = "each test crate uses its part of these helpers")]

use serde_json::Value;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use weft_api::lb::{Backend, Frontend};
use weft_k8s::k8s_openapi::api::core::v1::Node;
use weft_k8s::policy::PolicyKey;
use weft_k8s::replay::Replay;
use weft_k8s::watch::{Optional, Sink, Watchers};
use weft_policy::labels::LabelSet;
use weft_policy::rule::Rule;

pub fn testdata(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/k8s")
        .join(name)
}

pub fn json(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(testdata(name)).unwrap()).unwrap()
}

#[derive(Default)]
pub struct Recorder {
    pub events: Mutex<Vec<String>>,
    pub keys: Mutex<BTreeSet<PolicyKey>>,
    pub services: Mutex<BTreeSet<String>>,
    /// Rules of each object, as last applied.
    pub rules: Mutex<std::collections::BTreeMap<PolicyKey, Vec<Rule>>>,
}

impl Recorder {
    pub fn events(&self) -> Vec<String> {
        self.events.lock().unwrap().clone()
    }
    fn push(&self, s: String) {
        self.events.lock().unwrap().push(s);
    }
}

impl Sink for Recorder {
    fn pod_labels(&self, ns: &str, name: &str, labels: &LabelSet) {
        let l: Vec<String> = labels.iter().map(ToString::to_string).collect();
        self.push(format!("pod {ns}/{name} {}", l.join(",")));
    }
    /// Refuses an object named `refused-*` (as a manager refusing its rules would).
    fn policy_apply(&self, key: &PolicyKey, rules: Vec<Rule>) -> Result<(), String> {
        if key.name.starts_with("refused-") {
            self.push(format!("refuse {key}"));
            return Err("refused by the sink".into());
        }
        self.keys.lock().unwrap().insert(key.clone());
        self.push(format!("apply {key} rules={}", rules.len()));
        self.rules.lock().unwrap().insert(key.clone(), rules);
        Ok(())
    }
    fn policy_apply_all(
        &self,
        objects: Vec<(PolicyKey, Vec<Rule>)>,
    ) -> std::collections::BTreeMap<PolicyKey, String> {
        let keys: Vec<String> = objects.iter().map(|(k, _)| k.to_string()).collect();
        self.push(format!("list {}", keys.join(", ")));
        weft_k8s::watch::apply_each(self, objects)
    }
    fn policy_delete(&self, key: &PolicyKey) {
        self.keys.lock().unwrap().remove(key);
        self.rules.lock().unwrap().remove(key);
        self.push(format!("delete {key}"));
    }
    fn policy_keys(&self) -> Vec<PolicyKey> {
        self.keys.lock().unwrap().iter().cloned().collect()
    }
    fn node(&self, node: &Node) {
        self.push(format!(
            "node {}",
            node.metadata.name.clone().unwrap_or_default()
        ));
    }
    fn service_apply(&self, name: &str, frontends: Vec<(Frontend, Vec<Backend>)>) {
        self.services.lock().unwrap().insert(name.to_owned());
        let f: Vec<String> = frontends
            .iter()
            .map(|(f, b)| {
                let b: Vec<String> = b
                    .iter()
                    .map(|b| SocketAddr::new(b.addr, b.port).to_string())
                    .collect();
                format!(
                    "{:?} {} -> {}",
                    f.proto,
                    SocketAddr::new(f.addr, f.port),
                    b.join(",")
                )
            })
            .collect();
        self.push(format!("service {name}: {}", f.join("; ")));
    }
    fn service_delete(&self, name: &str) {
        self.services.lock().unwrap().remove(name);
        self.push(format!("service delete {name}"));
    }
    fn service_names(&self) -> Vec<String> {
        self.services.lock().unwrap().iter().cloned().collect()
    }
}

/// Polls `cond` until it holds; panics with `what` and the state after a generous bound.
pub async fn eventually(what: &str, mut cond: impl FnMut() -> bool, state: impl Fn() -> String) {
    for _ in 0..600 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what} did not happen; state:\n{}", state());
}

pub fn param<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let q = line.split_once('?')?.1;
    q.split('&')
        .find_map(|p| p.strip_prefix(key)?.strip_prefix('='))
}

/// Starts the watchers (without the Cilium kinds) against `replay`, delivering to `rec`.
pub async fn watch(
    replay: &Replay,
    rec: Arc<Recorder>,
) -> (Arc<Watchers>, Vec<tokio::task::JoinHandle<()>>) {
    watch_with(replay, rec, false).await
}

/// [`watch`], with the `ClusterNetworkPolicy` watch (and status writer) if `cnp`.
pub async fn watch_with(
    replay: &Replay,
    rec: Arc<Recorder>,
    cnp: bool,
) -> (Arc<Watchers>, Vec<tokio::task::JoinHandle<()>>) {
    // Tests of one crate run in parallel in one process.
    static N: AtomicUsize = AtomicUsize::new(0);
    let url = replay.serve().await.unwrap();
    let dir = std::env::temp_dir().join(format!(
        "weft-k8s-replay-w-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, Replay::kubeconfig(&url)).unwrap();
    let client = weft_k8s::client::client(Some(&kubeconfig)).await.unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let w = Watchers::new(client, "worker-1", rec);
    let tasks = w.spawn(Optional {
        cilium: false,
        cluster_network_policies: cnp,
    });
    (w, tasks)
}

/// Pushes `event` into the open watch of `path`, waiting for the watcher to open it.
pub async fn push(replay: &Replay, path: &str, event: &Value) {
    eventually(
        &format!("a watch of {path} open"),
        || replay.push(path, event.clone()) > 0,
        || format!("{:#?}", replay.log()),
    )
    .await;
}
