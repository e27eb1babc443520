//! The watchers: this Node, the pods on this node (field selector `spec.nodeName`), every
//! Namespace, the policy kinds (those of CRDs, Cilium's and `ClusterNetworkPolicy`, as dynamic
//! objects, so their CRDs need no generated types), and every Service and `EndpointSlice`
//! (`services`: their translation). A `ClusterNetworkPolicy`'s outcome is written to its
//! `status.conditions` (`status`: the writer).
//! kube-runtime's watcher resumes a dropped watch from the last resourceVersion (bookmarks keep
//! it fresh) and re-lists when the server answers 410 Gone; after a re-list, objects that were
//! not listed again are treated as deleted.

use crate::cache::ClusterCache;
use crate::policy::{PolicyKey, PolicyKind};
use crate::services::ServiceTable;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use weft_api::lb::{Backend, Frontend};
use weft_policy::labels::LabelSet;
use weft_policy::rule::Rule;

/// Where the watchers deliver what they learn: the manager.
pub trait Sink: Send + Sync + 'static {
    /// Pod `ns/name` on this node has these endpoint labels now (it arrived or changed).
    fn pod_labels(&self, ns: &str, name: &str, labels: &LabelSet);
    /// An object's rules, replacing its previous ones.
    fn policy_apply(&self, key: &PolicyKey, rules: Vec<Rule>) -> Result<(), String>;
    /// Several objects' rules at once (those of a list), each replacing its object's previous
    /// ones; returns the objects whose rules were refused, with why. The manager makes them one
    /// repository change and one regeneration; by default one [`Self::policy_apply`] each.
    fn policy_apply_all(
        &self,
        objects: Vec<(PolicyKey, Vec<Rule>)>,
    ) -> BTreeMap<PolicyKey, String> {
        apply_each(self, objects)
    }
    /// An object is gone: its rules go too.
    fn policy_delete(&self, key: &PolicyKey);
    /// Keys of cluster-sourced rules in the repository (also those from before a restart).
    fn policy_keys(&self) -> Vec<PolicyKey>;
    /// This node changed.
    fn node(&self, node: &Node);
    /// Service `name` (`namespace/name`) has these frontends now, each with its backends (none:
    /// left to kube-proxy); only when changed, never empty (that is [`Self::service_delete`]).
    fn service_apply(&self, name: &str, frontends: Vec<(Frontend, Vec<Backend>)>);
    /// Service `name` has no frontends any more: deleted, or headless, `ExternalName`...
    fn service_delete(&self, name: &str);
    /// Names of the Services the datapath has (also those from before a restart).
    fn service_names(&self) -> Vec<String>;
}

/// One [`Sink::policy_apply`] per object; the objects refused, with why.
pub fn apply_each<S: Sink + ?Sized>(
    sink: &S,
    objects: Vec<(PolicyKey, Vec<Rule>)>,
) -> BTreeMap<PolicyKey, String> {
    objects
        .into_iter()
        .filter_map(|(key, rules)| sink.policy_apply(&key, rules).err().map(|e| (key, e)))
        .collect()
}

/// Watch events and errors per resource, for `/metrics` and tests.
#[derive(Debug, Default)]
pub struct WatchStats {
    counts: std::sync::Mutex<BTreeMap<(String, String), u64>>,
    /// Re-lists (initial list included).
    pub lists: AtomicU64,
    /// `ClusterNetworkPolicy` status conditions written.
    pub status_writes: AtomicU64,
    /// Failed status writes (each retried with backoff).
    pub status_write_errors: AtomicU64,
}

impl WatchStats {
    fn count(&self, resource: &str, what: &str) {
        let mut g = self
            .counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *g.entry((resource.to_owned(), what.to_owned())).or_default() += 1;
    }

    /// `(resource, event or "error") → count`.
    #[must_use]
    pub fn snapshot(&self) -> BTreeMap<(String, String), u64> {
        self.counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// Everything the watchers share.
pub struct Watchers {
    /// Pods and namespaces.
    pub cache: Arc<ClusterCache>,
    /// Counters.
    pub stats: Arc<WatchStats>,
    sink: Arc<dyn Sink>,
    client: Client,
    node_name: String,
    /// Resources whose first list completed, and those started.
    synced: std::sync::Mutex<(BTreeSet<&'static str>, Vec<&'static str>)>,
    synced_changed: tokio::sync::Notify,
    /// Per resource: its last error while it has not recovered, or that its CRD is missing.
    health: std::sync::Mutex<BTreeMap<&'static str, Health>>,
    /// Services and `EndpointSlices` (two watchers write it).
    services: std::sync::Mutex<ServiceTable>,
    /// `ClusterNetworkPolicy` status conditions waiting to be written.
    status: Arc<status::StatusQueue>,
}

mod backoff;
mod policies;
mod services;
mod status;

use backoff::ListRetryBackoff;
pub use backoff::{RETRY_MAX, retry_backoff};

/// Which optional kinds to watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Optional {
    /// cilium.io/v2 `CiliumNetworkPolicy` and `CiliumClusterwideNetworkPolicy`.
    pub cilium: bool,
    /// policy.networking.k8s.io/v1beta1 `ClusterNetworkPolicy` (and its status).
    pub cluster_network_policies: bool,
}

/// A CRD a watched kind needs, and how to install it (for the log line when it is missing).
#[derive(Debug, Clone, Copy)]
struct Crd {
    name: &'static str,
    install: &'static str,
}

/// A resource's trouble, for [`Watchers::problems`].
#[derive(Debug, Clone, PartialEq, Eq)]
enum Health {
    /// The last list or watch failed with this error (cleared by the next event).
    Failing(String),
    /// The API server does not serve the resource (404): its CRD is not installed.
    Absent,
}

/// What one resource's event loop does with its objects.
trait Handler<K: Clone>: Send {
    fn name(&self) -> &'static str;
    fn apply(&mut self, w: &Watchers, obj: K);
    /// The objects of a (re-)list, before [`Self::relisted`]; by default each applied alone.
    fn apply_listed(&mut self, w: &Watchers, listed: &[K]) {
        for obj in listed {
            self.apply(w, obj.clone());
        }
    }
    fn delete(&mut self, w: &Watchers, obj: K);
    /// After a (re-)list: `listed` are the objects seen in it.
    fn relisted(&mut self, w: &Watchers, listed: &[K]);
}

/// Whether `e` says the API server does not serve the resource at all (its CRD is missing):
/// the list, or a watch after the CRD was deleted, answered 404.
fn not_served(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => s.code == 404,
        _ => false,
    }
}

async fn drive<K, H>(
    w: Arc<Watchers>,
    stream: impl Stream<Item = watcher::Result<watcher::Event<K>>>,
    mut h: H,
    crd: Option<Crd>,
) where
    K: Clone,
    H: Handler<K>,
{
    let mut stream = std::pin::pin!(stream);
    let mut listing: Option<Vec<K>> = None;
    while let Some(ev) = stream.next().await {
        let ev = match ev {
            Ok(ev) => {
                // `Init` only announces a list attempt: it proves nothing yet.
                if !matches!(ev, watcher::Event::Init) && w.set_health(h.name(), None) {
                    tracing::info!(resource = h.name(), "watch recovered");
                }
                ev
            }
            Err(e) => {
                w.stats.count(h.name(), "error");
                if let Some(crd) = crd.filter(|_| not_served(&e)) {
                    // No CRD, no objects of the kind: nothing to wait for. The watcher keeps
                    // retrying, so objects are followed once the CRD is installed.
                    if w.set_health(h.name(), Some(Health::Absent)) {
                        // Rules of the kind left from before (a restart, a deleted CRD) go.
                        h.relisted(&w, &[]);
                        tracing::warn!(
                            resource = h.name(),
                            "CRD {} is not installed: {} objects are not followed until it is \
                             ({})",
                            crd.name,
                            h.name(),
                            crd.install
                        );
                    }
                    w.lock_synced().0.insert(h.name());
                    w.synced_changed.notify_waiters();
                } else if w.set_health(h.name(), Some(Health::Failing(e.to_string()))) {
                    // Logged when the error changes; status shows it all along.
                    tracing::warn!(resource = h.name(), "watch: {e} (retrying with backoff)");
                }
                continue;
            }
        };
        match ev {
            watcher::Event::Init => {
                w.stats.lists.fetch_add(1, Ordering::Relaxed);
                listing = Some(Vec::new());
            }
            watcher::Event::InitApply(obj) => {
                // Applied when the list is complete: all at once (a policy kind makes the
                // whole list one repository change, not one per object).
                w.stats.count(h.name(), "list");
                listing.get_or_insert_default().push(obj);
            }
            watcher::Event::InitDone => {
                let listed = listing.take().unwrap_or_default();
                h.apply_listed(&w, &listed);
                h.relisted(&w, &listed);
                w.lock_synced().0.insert(h.name());
                w.synced_changed.notify_waiters();
                tracing::info!(resource = h.name(), objects = listed.len(), "listed");
            }
            watcher::Event::Apply(obj) => {
                w.stats.count(h.name(), "apply");
                h.apply(&w, obj);
            }
            watcher::Event::Delete(obj) => {
                w.stats.count(h.name(), "delete");
                h.delete(&w, obj);
            }
        }
    }
}

struct Pods;
impl Handler<Pod> for Pods {
    fn name(&self) -> &'static str {
        "pods"
    }
    fn apply(&mut self, w: &Watchers, pod: Pod) {
        if let Some(((ns, name), labels)) = w.cache.put_pod(pod) {
            w.sink.pod_labels(&ns, &name, &labels);
        }
    }
    fn delete(&mut self, w: &Watchers, pod: Pod) {
        // The endpoint goes with the CNI DEL; only the cache entry goes here.
        if let (Some(ns), Some(name)) = (&pod.metadata.namespace, &pod.metadata.name) {
            w.cache.remove_pod(ns, name);
        }
    }
    fn relisted(&mut self, w: &Watchers, listed: &[Pod]) {
        let keep: BTreeSet<(String, String)> = listed
            .iter()
            .filter_map(|p| Some((p.metadata.namespace.clone()?, p.metadata.name.clone()?)))
            .collect();
        for (ns, name) in w.cache.pod_ids() {
            if !keep.contains(&(ns.clone(), name.clone())) {
                w.cache.remove_pod(&ns, &name);
            }
        }
    }
}

struct Namespaces;
impl Namespaces {
    fn put(w: &Watchers, name: &str, labels: Option<BTreeMap<String, String>>) {
        for ((ns, pod), l) in w.cache.put_namespace(name, labels) {
            w.sink.pod_labels(&ns, &pod, &l);
        }
    }
}
impl Handler<Namespace> for Namespaces {
    fn name(&self) -> &'static str {
        "namespaces"
    }
    fn apply(&mut self, w: &Watchers, ns: Namespace) {
        if let Some(name) = &ns.metadata.name {
            Self::put(
                w,
                name,
                Some(ns.metadata.labels.clone().unwrap_or_default()),
            );
        }
    }
    fn delete(&mut self, w: &Watchers, ns: Namespace) {
        if let Some(name) = &ns.metadata.name {
            Self::put(w, name, None);
        }
    }
    fn relisted(&mut self, w: &Watchers, listed: &[Namespace]) {
        let keep: BTreeSet<&str> = listed
            .iter()
            .filter_map(|n| n.metadata.name.as_deref())
            .collect();
        for name in w.cache.namespace_names() {
            if !keep.contains(name.as_str()) {
                Self::put(w, &name, None);
            }
        }
    }
}

struct ThisNode;
impl Handler<Node> for ThisNode {
    fn name(&self) -> &'static str {
        "nodes"
    }
    fn apply(&mut self, w: &Watchers, node: Node) {
        w.sink.node(&node);
    }
    fn delete(&mut self, _: &Watchers, _: Node) {
        tracing::warn!("this node's Node object was deleted; keeping the CIDRs in use");
    }
    fn relisted(&mut self, _: &Watchers, _: &[Node]) {}
}

/// The name of the CRD that serves a policy kind of a CRD.
#[must_use]
pub fn policy_crd(kind: PolicyKind) -> &'static str {
    match kind {
        PolicyKind::CiliumClusterwideNetworkPolicy => "ciliumclusterwidenetworkpolicies.cilium.io",
        PolicyKind::ClusterNetworkPolicy => "clusternetworkpolicies.policy.networking.k8s.io",
        _ => "ciliumnetworkpolicies.cilium.io",
    }
}

/// A policy kind of a CRD (Cilium's, `ClusterNetworkPolicy`) as a dynamic resource.
#[must_use]
pub fn policy_resource(kind: PolicyKind) -> ApiResource {
    let (group, version) = kind
        .api_version()
        .split_once('/')
        .unwrap_or(("", kind.api_version()));
    let plural = match kind {
        PolicyKind::CiliumClusterwideNetworkPolicy => "ciliumclusterwidenetworkpolicies",
        PolicyKind::ClusterNetworkPolicy => "clusternetworkpolicies",
        _ => "ciliumnetworkpolicies",
    };
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(group, version, kind.as_str()),
        plural,
    )
}

fn stream<K>(
    api: Api<K>,
    cfg: watcher::Config,
) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    watcher(api, cfg).backoff(ListRetryBackoff::new())
}

impl Watchers {
    /// Watchers for `node_name`, delivering to `sink`.
    #[must_use]
    pub fn new(client: Client, node_name: &str, sink: Arc<dyn Sink>) -> Arc<Self> {
        Arc::new(Self {
            cache: Arc::default(),
            stats: Arc::default(),
            sink,
            client,
            node_name: node_name.to_owned(),
            synced: std::sync::Mutex::default(),
            synced_changed: tokio::sync::Notify::new(),
            health: std::sync::Mutex::default(),
            services: std::sync::Mutex::default(),
            status: Arc::default(),
        })
    }

    /// Records a resource's trouble (`None`: healthy); true when it changed.
    fn set_health(&self, resource: &'static str, h: Option<Health>) -> bool {
        let mut g = self
            .health
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let changed = g.get(resource) != h.as_ref();
        match h {
            Some(h) => g.insert(resource, h),
            None => g.remove(resource),
        };
        changed
    }

    /// What keeps the watchers from a complete, current view, one line per resource: an
    /// initial list not done yet (with the last error, e.g. an RBAC denial), a failing watch,
    /// a kind whose CRD is not installed. Empty when all is well.
    #[must_use]
    pub fn problems(&self) -> Vec<String> {
        let health = self
            .health
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let (synced, started) = {
            let g = self.lock_synced();
            (g.0.clone(), g.1.clone())
        };
        started
            .iter()
            .filter_map(|r| match (health.get(r), synced.contains(r)) {
                (Some(Health::Absent), _) => Some(format!(
                    "{r}: its CRD is not installed, these objects are not followed"
                )),
                (Some(Health::Failing(e)), false) => {
                    Some(format!("{r}: initial list not complete: {e}"))
                }
                (None, false) => Some(format!("{r}: initial list not complete")),
                (Some(Health::Failing(e)), true) => Some(format!("{r}: watch failing: {e}")),
                (None, true) => None,
            })
            .collect()
    }

    fn lock_synced(
        &self,
    ) -> std::sync::MutexGuard<'_, (BTreeSet<&'static str>, Vec<&'static str>)> {
        self.synced
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn missing(&self) -> Vec<String> {
        let g = self.lock_synced();
        g.1.iter()
            .filter(|n| !g.0.contains(*n))
            .map(ToString::to_string)
            .collect()
    }

    /// Waits until every started watcher has completed its first list. `Err`: the resources
    /// still missing at `timeout`.
    pub async fn wait_synced(&self, timeout: std::time::Duration) -> Result<(), Vec<String>> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.synced_changed.notified();
            let missing = self.missing();
            if missing.is_empty() {
                return Ok(());
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(missing);
            }
        }
    }

    /// `crd`: the CRD that serves the resource, when it may legitimately be absent.
    fn started<K, H>(
        self: &Arc<Self>,
        stream: impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static,
        h: H,
        crd: Option<Crd>,
    ) -> tokio::task::JoinHandle<()>
    where
        K: Clone + Send + 'static,
        H: Handler<K> + 'static,
    {
        self.lock_synced().1.push(h.name());
        tokio::spawn(drive(self.clone(), stream, h, crd))
    }

    /// Starts every watcher on the current tokio runtime; they run until the runtime stops.
    /// `optional`: which kinds of CRDs to watch as well (a CRD not installed is reported, not
    /// waited for).
    #[must_use]
    pub fn spawn(self: &Arc<Self>, optional: Optional) -> Vec<tokio::task::JoinHandle<()>> {
        let c = self.client.clone();
        let cfg = watcher::Config::default;
        let node_sel = format!("metadata.name={}", self.node_name);
        let pod_sel = format!("spec.nodeName={}", self.node_name);
        let mut tasks = vec![
            self.started(
                stream(Api::<Node>::all(c.clone()), cfg().fields(&node_sel)),
                ThisNode,
                None,
            ),
            self.started(
                stream(Api::<Pod>::all(c.clone()), cfg().fields(&pod_sel)),
                Pods,
                None,
            ),
            self.started(
                stream(Api::<Namespace>::all(c.clone()), cfg()),
                Namespaces,
                None,
            ),
            self.started(
                stream(Api::<NetworkPolicy>::all(c.clone()), cfg()),
                policies::Policies::new(PolicyKind::NetworkPolicy),
                None,
            ),
            self.started(
                stream(
                    Api::<Service>::all(c.clone()),
                    cfg().labels(&services::service_selector()),
                ),
                services::Services,
                None,
            ),
            self.started(
                stream(
                    Api::<EndpointSlice>::all(c.clone()),
                    cfg().labels(&services::slice_selector()),
                ),
                services::Slices,
                None,
            ),
        ];
        let mut crd_kinds = Vec::new();
        if optional.cilium {
            crd_kinds.extend([
                (
                    PolicyKind::CiliumNetworkPolicy,
                    "install conf/k8s/00-crds.yaml, or set k8s_cilium_policies = false",
                ),
                (
                    PolicyKind::CiliumClusterwideNetworkPolicy,
                    "install conf/k8s/00-crds.yaml, or set k8s_cilium_policies = false",
                ),
            ]);
        }
        if optional.cluster_network_policies {
            crd_kinds.push((
                PolicyKind::ClusterNetworkPolicy,
                "install sigs.k8s.io/network-policy-api v0.3.0's CRD from conf/k8s/, or set \
                 k8s_cluster_network_policies = false",
            ));
            let api = Api::<DynamicObject>::all_with(
                c.clone(),
                &policy_resource(PolicyKind::ClusterNetworkPolicy),
            );
            tasks.push(tokio::spawn(status::write(
                self.status.clone(),
                api,
                self.stats.clone(),
            )));
        }
        for (kind, install) in crd_kinds {
            let api = Api::<DynamicObject>::all_with(c.clone(), &policy_resource(kind));
            tasks.push(self.started(
                stream(api, cfg()),
                policies::Policies::new(kind),
                Some(Crd {
                    name: policy_crd(kind),
                    install,
                }),
            ));
        }
        tasks
    }
}
