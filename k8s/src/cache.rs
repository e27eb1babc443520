//! What the watchers know: this node's pods and every namespace's labels, and the status of
//! each policy object. The CNI ADD path reads endpoint labels from here, waiting a bounded
//! time for a pod the watch has not delivered yet.

use crate::labels::endpoint_labels;
use crate::policy::PolicyKey;
use k8s_openapi::api::core::v1::Pod;
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::Notify;
use weft_policy::labels::LabelSet;

type PodId = (String, String);

#[derive(Default)]
struct Inner {
    pods: HashMap<PodId, Pod>,
    namespaces: HashMap<String, BTreeMap<String, String>>,
    statuses: BTreeMap<PolicyKey, PolicyStatus>,
    tiered: BTreeMap<String, TieredPolicy>,
}

/// Shared between the watchers (writers) and the manager (readers).
#[derive(Default)]
pub struct ClusterCache {
    inner: Mutex<Inner>,
    changed: Notify,
}

/// How much of a policy object is in force, when not all of it as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicyStatus {
    /// Refused whole: it could not be read far enough to know which pods it selects (its
    /// previous rules, if any, stay in force).
    Rejected(String),
    /// In force except `not_enforced` (each left out: allows nothing, or a deny widened to its
    /// whole direction, so its pods fail closed); `warnings` are enforced with a caveat.
    Partial {
        /// What was left out, and what that means.
        not_enforced: Vec<String>,
        /// What is enforced with a caveat (e.g. a CIDR with host bits set, masked).
        warnings: Vec<String>,
    },
}

/// A policy object in force except some of its rules, or with warnings.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Partial {
    /// `NetworkPolicy ns/name` etc.
    pub object: String,
    /// Parts left out.
    pub not_enforced: Vec<String>,
    /// Parts enforced with a caveat.
    pub warnings: Vec<String>,
}

/// A `ClusterNetworkPolicy` as the manager took it: its tier and priority as written, and
/// whether it is in force (its status condition says the same).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TieredPolicy {
    /// The object's name.
    pub name: String,
    /// `spec.tier` as written (`Admin`, `Baseline`; anything else was rejected).
    pub tier: String,
    /// `spec.priority` as written, when a number.
    pub priority: Option<i64>,
    /// Rules in force (one per ingress and egress rule); `None` when rejected.
    pub rules: Option<usize>,
    /// The condition's reason: `Accepted`, `PartiallyEnforced` or `Rejected`.
    pub status: String,
    /// What is not enforced, or why it was rejected (empty when accepted whole).
    pub message: String,
}

impl TieredPolicy {
    /// The entry of object `obj` named `name`, after `outcome`; `rules`: how many it has in force.
    #[must_use]
    pub fn of(
        name: &str,
        obj: &serde_json::Value,
        rules: Option<usize>,
        outcome: &crate::status::Outcome,
    ) -> Self {
        use crate::status::Outcome;
        let spec = obj.get("spec");
        let (status, message) = match outcome {
            Outcome::Rejected(e) => ("Rejected", e.clone()),
            Outcome::Accepted {
                not_enforced,
                warnings,
            } if not_enforced.is_empty() => ("Accepted", warnings.join("; ")),
            Outcome::Accepted { not_enforced, .. } => {
                ("PartiallyEnforced", not_enforced.join("; "))
            }
        };
        Self {
            name: name.to_owned(),
            tier: spec
                .and_then(|s| s.get("tier"))
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            priority: spec
                .and_then(|s| s.get("priority"))
                .and_then(serde_json::Value::as_i64),
            rules,
            status: status.to_owned(),
            message,
        }
    }
}

/// A policy object the manager refused, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Rejected {
    /// `NetworkPolicy ns/name` etc.
    pub object: String,
    /// The parser's message.
    pub error: String,
}

impl ClusterCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The endpoint labels of pod `ns/name`, if the cache has it.
    #[must_use]
    pub fn labels(&self, ns: &str, name: &str) -> Option<LabelSet> {
        let g = self.lock();
        let pod = g.pods.get(&(ns.to_owned(), name.to_owned()))?;
        Some(endpoint_labels(pod, g.namespaces.get(ns)))
    }

    /// The named container ports of pod `ns/name` (what ingress rules' `port: name` resolve
    /// to), if the cache has it.
    #[must_use]
    pub fn named_ports(&self, ns: &str, name: &str) -> Option<weft_policy::rule::NamedPorts> {
        let g = self.lock();
        let pod = g.pods.get(&(ns.to_owned(), name.to_owned()))?;
        Some(crate::labels::policy_named_ports(pod))
    }

    /// The uid of pod `ns/name`, if the cache has it (the owner of its `WeftEndpoint`).
    #[must_use]
    pub fn pod_uid(&self, ns: &str, name: &str) -> Option<String> {
        let g = self.lock();
        g.pods
            .get(&(ns.to_owned(), name.to_owned()))?
            .metadata
            .uid
            .clone()
    }

    /// Like [`Self::labels`], waiting up to `timeout` for the pod to arrive.
    pub async fn wait_labels(&self, ns: &str, name: &str, timeout: Duration) -> Option<LabelSet> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.changed.notified();
            if let Some(l) = self.labels(ns, name) {
                return Some(l);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return None;
            }
        }
    }

    /// Stores a pod; returns its endpoint labels.
    pub fn put_pod(&self, pod: Pod) -> Option<(PodId, LabelSet)> {
        let id = (pod.metadata.namespace.clone()?, pod.metadata.name.clone()?);
        let mut g = self.lock();
        let labels = endpoint_labels(&pod, g.namespaces.get(&id.0));
        g.pods.insert(id.clone(), pod);
        drop(g);
        self.changed.notify_waiters();
        Some((id, labels))
    }

    /// Forgets a pod.
    pub fn remove_pod(&self, ns: &str, name: &str) {
        self.lock().pods.remove(&(ns.to_owned(), name.to_owned()));
    }

    /// Pods in the cache.
    #[must_use]
    pub fn pod_ids(&self) -> Vec<PodId> {
        self.lock().pods.keys().cloned().collect()
    }

    /// Stores a namespace's labels (`None`: deleted); returns the new labels of the pods in it.
    pub fn put_namespace(
        &self,
        name: &str,
        labels: Option<BTreeMap<String, String>>,
    ) -> Vec<(PodId, LabelSet)> {
        let mut g = self.lock();
        match labels {
            Some(l) => g.namespaces.insert(name.to_owned(), l),
            None => g.namespaces.remove(name),
        };
        let ns = g.namespaces.get(name);
        let out = g
            .pods
            .iter()
            .filter(|((n, _), _)| n == name)
            .map(|(id, pod)| (id.clone(), endpoint_labels(pod, ns)))
            .collect();
        drop(g);
        self.changed.notify_waiters();
        out
    }

    /// Namespaces in the cache.
    #[must_use]
    pub fn namespace_names(&self) -> Vec<String> {
        self.lock().namespaces.keys().cloned().collect()
    }

    /// Records the outcome of translating a policy object (`None`: fully in force, or deleted).
    pub fn set_policy_status(&self, key: &PolicyKey, status: Option<PolicyStatus>) {
        let mut g = self.lock();
        match status {
            Some(s) => g.statuses.insert(key.clone(), s),
            None => g.statuses.remove(key),
        };
    }

    /// Records a `ClusterNetworkPolicy`'s entry, replacing its previous one.
    pub fn set_tiered(&self, p: TieredPolicy) {
        self.lock().tiered.insert(p.name.clone(), p);
    }

    /// Forgets a deleted `ClusterNetworkPolicy`.
    pub fn remove_tiered(&self, name: &str) {
        self.lock().tiered.remove(name);
    }

    /// Keeps the `ClusterNetworkPolicy` entries whose name passes `keep` (after a re-list).
    pub fn retain_tiered(&self, keep: impl Fn(&str) -> bool) {
        self.lock().tiered.retain(|name, _| keep(name));
    }

    /// Every `ClusterNetworkPolicy` seen, by name.
    #[must_use]
    pub fn tiered(&self) -> Vec<TieredPolicy> {
        self.lock().tiered.values().cloned().collect()
    }

    /// Policy objects the manager refused.
    #[must_use]
    pub fn rejected(&self) -> Vec<Rejected> {
        self.lock()
            .statuses
            .iter()
            .filter_map(|(k, s)| match s {
                PolicyStatus::Rejected(e) => Some(Rejected {
                    object: k.to_string(),
                    error: e.clone(),
                }),
                PolicyStatus::Partial { .. } => None,
            })
            .collect()
    }

    /// Policy objects in force except some parts, or with warnings.
    #[must_use]
    pub fn partial(&self) -> Vec<Partial> {
        self.lock()
            .statuses
            .iter()
            .filter_map(|(k, s)| match s {
                PolicyStatus::Partial {
                    not_enforced,
                    warnings,
                } => Some(Partial {
                    object: k.to_string(),
                    not_enforced: not_enforced.clone(),
                    warnings: warnings.clone(),
                }),
                PolicyStatus::Rejected(_) => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata;

    #[tokio::test]
    async fn a_waiting_add_gets_the_pod_when_it_arrives() {
        let cache = std::sync::Arc::new(ClusterCache::default());
        let c = cache.clone();
        let waiter = tokio::spawn(async move {
            c.wait_labels("prod", "web-5d8f7c9b6d-x7k2p", Duration::from_secs(30))
                .await
        });
        tokio::task::yield_now().await;
        cache.put_pod(testdata::load("pod-web.json"));
        let labels = waiter.await.unwrap().expect("pod arrived");
        assert!(labels.iter().any(|l| l.to_string() == "k8s:app=web"));
    }

    #[tokio::test]
    async fn an_unseen_pod_times_out() {
        let cache = ClusterCache::default();
        assert!(
            cache
                .wait_labels("prod", "nope", Duration::from_millis(1))
                .await
                .is_none()
        );
    }

    #[test]
    fn namespace_labels_reach_its_pods() {
        let cache = ClusterCache::default();
        cache.put_pod(testdata::load("pod-web.json"));
        let ns: k8s_openapi::api::core::v1::Namespace = testdata::load("namespace-prod.json");
        let changed = cache.put_namespace("prod", ns.metadata.labels);
        assert_eq!(changed.len(), 1);
        assert!(
            changed[0]
                .1
                .iter()
                .any(|l| l.to_string() == "k8s:io.cilium.k8s.namespace.labels.team=payments")
        );
        assert!(
            cache
                .put_namespace("other", Some(BTreeMap::new()))
                .is_empty()
        );
    }
}
