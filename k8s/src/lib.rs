//! weft-k8s: Weft's Kubernetes mode. `labels`, `policy` and `node` translate API objects into
//! Weft's state (pure, unit-tested on `kubectl get -o json` output in testdata/k8s/); `cache`
//! holds what the watchers learnt; `watch` runs kube-runtime watchers into a [`watch::Sink`]
//! the manager implements; `services` translates Services and `EndpointSlices` into the
//! datapath's frontends and backends; `status` the `ClusterNetworkPolicy` status conditions;
//! `client` builds the kube client.

pub mod cache;
pub mod client;
pub mod labels;
pub mod node;
pub mod policy;
#[cfg(feature = "replay")]
pub mod replay;
pub mod services;
pub mod status;
pub mod watch;

pub use k8s_openapi;
pub use kube;

#[cfg(test)]
pub(crate) mod testdata {
    use std::path::PathBuf;

    pub fn dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/k8s")
    }

    pub fn json(name: &str) -> serde_json::Value {
        let text = std::fs::read_to_string(dir().join(name)).unwrap();
        serde_json::from_str(&text).unwrap()
    }

    pub fn load<T: serde::de::DeserializeOwned>(name: &str) -> T {
        serde_json::from_value(json(name)).unwrap()
    }
}
