//! Kubernetes mode (`--k8s`): the manager as a node agent of a cluster. At start it reads this
//! Node from the API server (its pod CIDRs, by the priority of docs/ARCHITECTURE.md, "Pod CIDRs"), then runs weft-k8s's
//! watchers into the manager: pod and namespace labels become endpoint labels (a change is an
//! identity change, like `weftctl endpoint labels`), policy objects become repository rules
//! replaced and deleted with their object. Ready only after the initial lists are in: until
//! then the API serves (status says what it waits for) but refuses CNI ADDs, and a list that
//! fails (an RBAC denial, an unreachable API server) is retried and reported, never a reason to
//! exit — a restart would not fix it, and a crash loop hides the reason.

use crate::daemon::config::K8sSettings;
use crate::node::{ChosenCidr, NodeManifest};
use crate::service::{Manager, ManagerError};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use weft_api::lb::{Backend, Frontend};
use weft_api::{AllocateRequest, Endpoint};
use weft_k8s::k8s_openapi::api::core::v1::Node;
use weft_k8s::kube::Client;
use weft_k8s::policy::PolicyKey;
use weft_k8s::watch::{Sink, Watchers, apply_each};
use weft_policy::labels::LabelSet;
use weft_policy::rule::Rule;

/// How long a CNI ADD waits for a pod the pod watch has not delivered yet. The kubelet only
/// runs the ADD for a pod bound to this node, the event our watch also receives, so the wait
/// is normally zero; it is bounded so a slow or unreachable API server delays pod creation by
/// at most this, rather than failing it. Past it the endpoint starts with the namespace-only
/// labels (plus any CNI labels) and is corrected, with a new identity, when the pod arrives.
pub const POD_WAIT: Duration = Duration::from_secs(5);

/// How often an incomplete initial sync is logged (status shows it all along).
pub const SYNC_REPORT: Duration = Duration::from_secs(30);

/// How often the watchers' problems (a failing watch, a missing CRD) are copied into status.
const PROBLEMS_REFRESH: Duration = Duration::from_secs(2);

/// Kubernetes-mode failures at start.
#[derive(Debug, thiserror::Error)]
pub enum K8sError {
    /// Client or API call.
    #[error(transparent)]
    Client(#[from] weft_k8s::client::ClientError),
}

/// The connection made before the node's CIDRs are chosen.
pub struct Connected {
    /// Client.
    pub client: Client,
    /// This node as the API server has it.
    pub node: Node,
    settings: K8sSettings,
}

/// Connects and reads this node.
pub async fn connect(settings: &K8sSettings, node_name: &str) -> Result<Connected, K8sError> {
    let client = weft_k8s::client::client(settings.kubeconfig.as_deref()).await?;
    let node = weft_k8s::client::fetch_node(&client, node_name).await?;
    Ok(Connected {
        client,
        node,
        settings: settings.clone(),
    })
}

/// This node as the manager's CIDR selection reads it.
#[must_use]
pub fn manifest(node: &Node) -> NodeManifest {
    serde_json::from_value(weft_k8s::node::manifest_json(node)).unwrap_or_default()
}

/// Writes the CIDRs back as annotations and starts the watchers; [`become_ready`] then waits
/// for their initial lists.
pub async fn start(
    manager: &Arc<Manager>,
    conn: Connected,
    node_name: &str,
    cidrs: &[ChosenCidr],
) -> Arc<Watchers> {
    let routers: Vec<_> = cidrs.iter().map(|c| (c.cidr, c.router_ip())).collect();
    let patch = weft_k8s::node::annotation_patch(&routers);
    if let Err(e) = weft_k8s::client::annotate_node(&conn.client, node_name, &patch).await {
        // Not fatal: nothing on this node depends on it; other agents read it.
        tracing::warn!("{e}");
    }
    let sink = Arc::new(ManagerSink {
        manager: Arc::downgrade(manager),
        cidrs: cidrs.to_vec(),
    });
    let watchers = Watchers::new(conn.client, node_name, sink);
    manager.set_k8s_cache(watchers.cache.clone());
    manager.prom().set_watch_stats(watchers.stats.clone());
    // The tasks run until the runtime stops.
    drop(watchers.spawn(weft_k8s::watch::Optional {
        cilium: conn.settings.cilium_policies,
        cluster_network_policies: conn.settings.cluster_network_policies,
    }));
    watchers
}

/// Waits for every watcher's initial list, however long it takes, then declares the manager
/// ready. Meanwhile status carries the resources still missing with their last error (e.g.
/// `403 Forbidden` from a `ClusterRole` without `list`), logged every [`SYNC_REPORT`]. Afterwards
/// status keeps showing the watchers' problems (a failing watch, a CRD not installed).
pub async fn become_ready(manager: &Arc<Manager>, watchers: Arc<Watchers>) {
    let t0 = Instant::now();
    let mut next_report = SYNC_REPORT;
    while watchers.wait_synced(PROBLEMS_REFRESH).await.is_err() {
        let problems = watchers.problems();
        manager.set_warnings(problems.clone());
        if t0.elapsed() >= next_report {
            tracing::error!(
                waiting_s = t0.elapsed().as_secs(),
                ?problems,
                "Kubernetes: initial lists not complete, not ready until they are (is the API server reachable, and does the ClusterRole of conf/k8s/01-rbac.yaml allow list and watch on them?)"
            );
            next_report += SYNC_REPORT;
        }
    }
    let ms = t0.elapsed().as_secs_f64() * 1000.0;
    manager.record_phase("k8s-sync", ms);
    // Every Service is known now: frontends left from before a restart that none claimed go.
    match manager.lb().sweep_unclaimed() {
        Ok(0) => {}
        Ok(n) => tracing::info!(
            frontends = n,
            "Service frontends of deleted Services removed"
        ),
        Err(e) => tracing::error!("Service frontends from before the restart not removed: {e}"),
    }
    manager.set_warnings(watchers.problems());
    manager.set_ready();
    tracing::info!(ms, "Kubernetes caches synced; weft-manager ready");
    let weak = Arc::downgrade(manager);
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(PROBLEMS_REFRESH).await;
            let Some(m) = weak.upgrade() else { return };
            m.set_warnings(watchers.problems());
        }
    });
}

/// CNI ADD in Kubernetes mode: the endpoint's labels come from its pod (bounded wait, see
/// [`POD_WAIT`]); outside it, from the request.
pub async fn allocate(m: &Arc<Manager>, req: &AllocateRequest) -> Result<Endpoint, ManagerError> {
    let (Some(cache), Some(ns), Some(name)) = (
        m.k8s_cache().cloned(),
        req.pod_namespace.as_deref(),
        req.pod_name.as_deref(),
    ) else {
        return m.allocate(req);
    };
    let labels = cache.wait_labels(ns, name, POD_WAIT).await;
    if labels.is_none() {
        tracing::warn!(
            pod = %format!("{ns}/{name}"),
            "pod not in the watch cache after {POD_WAIT:?}: namespace-only labels until it arrives"
        );
    }
    let missed = labels.is_none();
    let ep = m.allocate_with_labels(req, labels)?;
    // The pod may have arrived between the wait and the allocation; its event found no
    // endpoint to correct then, so correct it here.
    if missed && let Some(l) = cache.labels(ns, name) {
        return m.replace_labels(ep.id, &l);
    }
    Ok(ep)
}

struct ManagerSink {
    manager: std::sync::Weak<Manager>,
    cidrs: Vec<ChosenCidr>,
}

impl Sink for ManagerSink {
    fn pod_labels(&self, ns: &str, name: &str, labels: &LabelSet) {
        let Some(m) = self.manager.upgrade() else {
            return;
        };
        let mine = m.endpoints().into_iter().filter(|ep| {
            ep.pod_namespace.as_deref() == Some(ns) && ep.pod_name.as_deref() == Some(name)
        });
        for ep in mine {
            if crate::service::from_api_labels(&ep.labels) == *labels {
                // Same identity; its named ports may be new (the ADD did not wait for the pod).
                match m.refresh_endpoint(ep.id) {
                    Ok(true) => tracing::info!(
                        endpoint_id = ep.id,
                        pod = %format!("{ns}/{name}"),
                        "endpoint policy follows the pod's named ports"
                    ),
                    Ok(false) => {}
                    Err(e) => tracing::warn!(endpoint_id = ep.id, "pod change not applied: {e}"),
                }
                continue;
            }
            match m.replace_labels(ep.id, labels) {
                Ok(ep) => tracing::info!(
                    endpoint_id = ep.id,
                    identity = ep.identity,
                    pod = %format!("{ns}/{name}"),
                    "endpoint labels follow the pod"
                ),
                Err(e) => tracing::warn!(endpoint_id = ep.id, "pod label change not applied: {e}"),
            }
        }
    }

    fn policy_apply(&self, key: &PolicyKey, rules: Vec<Rule>) -> Result<(), String> {
        let m = self.manager.upgrade().ok_or("manager stopped")?;
        let r = m
            .import_rules(&key.to_string(), rules, Instant::now())
            .map_err(|e| e.to_string())?;
        tracing::info!(%key, revision = r.revision, regenerated = r.regenerated, "cluster policy applied");
        Ok(())
    }

    /// One repository change for the whole list (its revision, one regeneration, one store
    /// flush): a re-list of a thousand `NetworkPolicy` objects after a restart is one import,
    /// not a thousand. When the change is refused, each object alone, so only the bad ones fail.
    fn policy_apply_all(
        &self,
        objects: Vec<(PolicyKey, Vec<Rule>)>,
    ) -> BTreeMap<PolicyKey, String> {
        let Some(m) = self.manager.upgrade() else {
            return objects
                .into_iter()
                .map(|(key, _)| (key, "manager stopped".to_owned()))
                .collect();
        };
        if objects.len() < 2 {
            return apply_each(self, objects);
        }
        let rules: Vec<Rule> = objects
            .iter()
            .flat_map(|(_, r)| r.iter().cloned())
            .collect();
        let what = format!("{} cluster objects (a list)", objects.len());
        match m.import_rules(&what, rules, Instant::now()) {
            Ok(r) => {
                tracing::info!(
                    objects = objects.len(),
                    revision = r.revision,
                    regenerated = r.regenerated,
                    elapsed_ms = r.elapsed_ms,
                    "cluster policies applied (one change for the list)"
                );
                BTreeMap::new()
            }
            Err(e) => {
                tracing::warn!(
                    objects = objects.len(),
                    "the list's policies as one change: {e}; applying them one by one"
                );
                apply_each(self, objects)
            }
        }
    }

    fn policy_delete(&self, key: &PolicyKey) {
        let Some(m) = self.manager.upgrade() else {
            return;
        };
        match m.delete_rules(&key.filter(), false, Instant::now()) {
            Ok(r) => tracing::info!(%key, revision = r.revision, "cluster policy deleted"),
            Err(e) => tracing::error!(%key, "cluster policy not deleted: {e}"),
        }
    }

    fn policy_keys(&self) -> Vec<PolicyKey> {
        let Some(m) = self.manager.upgrade() else {
            return Vec::new();
        };
        let mut keys: Vec<PolicyKey> = m.rules().iter().filter_map(PolicyKey::of_rule).collect();
        keys.sort();
        keys.dedup();
        keys
    }

    fn service_apply(&self, name: &str, frontends: Vec<(Frontend, Vec<Backend>)>) {
        let Some(m) = self.manager.upgrade() else {
            return;
        };
        match m.lb().apply(name, &frontends) {
            Ok(()) => tracing::debug!(service = name, frontends = frontends.len(), "Service"),
            // Its frontends stay as they were (kube-proxy's when it has none): logged, and
            // retried with the Service's next change.
            Err(e) => tracing::error!(service = name, "Service not translated: {e}"),
        }
    }

    fn service_delete(&self, name: &str) {
        let Some(m) = self.manager.upgrade() else {
            return;
        };
        if let Err(e) = m.lb().delete(name) {
            tracing::error!(service = name, "Service frontends not removed: {e}");
        }
    }

    fn service_names(&self) -> Vec<String> {
        self.manager
            .upgrade()
            .map(|m| m.lb().names())
            .unwrap_or_default()
    }

    fn node(&self, node: &Node) {
        let Ok(sel) = crate::node::select(&manifest(node), &[]) else {
            return;
        };
        let now: Vec<_> = sel.cidrs().into_iter().map(|c| c.cidr).collect();
        let used: Vec<_> = self.cidrs.iter().map(|c| c.cidr).collect();
        if !now.is_empty() && now != used {
            // Pod IPs in use come from the old CIDRs; switching needs a drained node.
            tracing::warn!(
                ?now,
                ?used,
                "this Node's pod CIDRs changed: restart the manager on a drained node to use them"
            );
        }
    }
}
