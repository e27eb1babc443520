//! Prometheus metrics (`GET /metrics` on the API socket and on `--metrics-listen`), with the
//! `prometheus-client` crate, in the `OpenMetrics` text format Prometheus scrapes.
//!
//! Two kinds of family. Events (regenerations, policy changes, API requests) are counted as
//! they happen, through the [`Metrics`] handle the manager owns. Everything that is a state
//! (endpoints, identities, IPAM, the revision, the datapath's per-CPU counters, the watchers'
//! counts) is read from the real state at scrape time ([`scrape`]): a gauge kept up to date by
//! hand drifts the first time some path forgets it; one read at scrape time cannot. Names follow
//! Cilium's (`cilium_drop_count_total` → `weft_drop_count_total`). The family list is in
//! docs/OPERATIONS.md, "Metrics".

mod scrape;
pub mod server;
#[cfg(test)]
mod tests;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use std::collections::BTreeMap;

/// The Content-Type of a scrape: `OpenMetrics` 1.0 text, which Prometheus parses natively.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ApiRequest {
    method: String,
    /// The route template (`/v1/endpoints/{id}`), never the raw path: bounded cardinality.
    route: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ApiRoute {
    method: String,
    route: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn api_histogram() -> Histogram {
    // 100 µs .. ~3 s.
    Histogram::new(exponential_buckets(0.000_1, 2.0, 16))
}

/// The event-driven families, incremented by the service and the API as things happen.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    regenerations: Family<Outcome, Counter>,
    regeneration_seconds: Histogram,
    policy_changes: Family<Outcome, Counter>,
    policy_delay_seconds: Histogram,
    api_requests: Family<ApiRequest, Counter>,
    api_seconds: HistogramFamily<ApiRoute>,
    /// Kubernetes mode: the watchers' event and error counts, read at scrape time.
    watch_stats: OnceLock<Arc<weft_k8s::watch::WatchStats>>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("weft");
        let regenerations = Family::<Outcome, Counter>::default();
        registry.register(
            "endpoint_regenerations",
            "Endpoint policy regenerations that reached the datapath, by outcome",
            regenerations.clone(),
        );
        // 50 µs .. ~0.8 s: a regeneration is a map diff, normally well under a millisecond.
        let regeneration_seconds = Histogram::new(exponential_buckets(0.000_05, 2.0, 15));
        registry.register(
            "endpoint_regeneration_time_stats_seconds",
            "Time to write one endpoint's regenerated policy to the datapath",
            regeneration_seconds.clone(),
        );
        let policy_changes = Family::<Outcome, Counter>::default();
        registry.register(
            "policy_change",
            "Policy repository changes (imports, deletes, cluster objects), by outcome",
            policy_changes.clone(),
        );
        // 500 µs .. ~8 s.
        let policy_delay_seconds = Histogram::new(exponential_buckets(0.000_5, 2.0, 15));
        registry.register(
            "policy_implementation_delay",
            "Seconds from a policy change's request to every endpoint enforcing the new revision",
            policy_delay_seconds.clone(),
        );
        let api_requests = Family::<ApiRequest, Counter>::default();
        registry.register(
            "api_requests",
            "API requests on the unix socket, by method, route template and status",
            api_requests.clone(),
        );
        let api_seconds: HistogramFamily<ApiRoute> = Family::new_with_constructor(api_histogram);
        registry.register(
            "api_process_time_seconds",
            "Time to answer an API request (to the response head for streams), by route",
            api_seconds.clone(),
        );
        Self {
            registry,
            regenerations,
            regeneration_seconds,
            policy_changes,
            policy_delay_seconds,
            api_requests,
            api_seconds,
            watch_stats: OnceLock::new(),
        }
    }
}

impl Metrics {
    /// One endpoint's maps were rewritten in `took`.
    pub fn regenerated(&self, took: Duration) {
        self.regenerations
            .get_or_create(&Outcome { outcome: "success" })
            .inc();
        self.regeneration_seconds.observe(took.as_secs_f64());
    }

    /// Writing one endpoint's regenerated policy failed.
    pub fn regeneration_failed(&self) {
        self.regenerations
            .get_or_create(&Outcome { outcome: "failure" })
            .inc();
    }

    /// A policy change finished (`ok`) or failed; `since_request` is from its request's start
    /// to every endpoint enforcing the new revision (Cilium's `policy_implementation_delay`).
    pub fn policy_changed(&self, since_request: Duration, ok: bool) {
        let outcome = if ok { "success" } else { "failure" };
        self.policy_changes
            .get_or_create(&Outcome { outcome })
            .inc();
        if ok {
            self.policy_delay_seconds
                .observe(since_request.as_secs_f64());
        }
    }

    /// An API request was answered.
    pub fn api_request(&self, method: &str, route: &str, status: u16, took: Duration) {
        self.api_requests
            .get_or_create(&ApiRequest {
                method: method.to_owned(),
                route: route.to_owned(),
                status: status.to_string(),
            })
            .inc();
        self.api_seconds
            .get_or_create(&ApiRoute {
                method: method.to_owned(),
                route: route.to_owned(),
            })
            .observe(took.as_secs_f64());
    }

    /// Kubernetes mode: export these watchers' counts.
    pub fn set_watch_stats(&self, stats: Arc<weft_k8s::watch::WatchStats>) {
        let _ = self.watch_stats.set(stats);
    }
}

/// What a scrape reads from the manager's state, taken at once by the state's owner
/// (`crate::service` implements [`Source`]), so that this module never reaches into the
/// manager: it only turns a snapshot into families.
#[derive(Debug)]
pub struct Snapshot {
    /// Endpoints by state (`allocated`, `ready`, `deleting`).
    pub endpoint_states: BTreeMap<&'static str, i64>,
    /// Identities in use by kind (`reserved`, `local`, `cidr`, `remote`).
    pub identity_kinds: BTreeMap<&'static str, i64>,
    /// What `/v1/status` answers now (the policy revision, the pools, the restore phases).
    pub status: weft_api::StatusResponse,
    /// The rows of the datapath's metrics map (empty when it could not be read).
    pub datapath_rows: Vec<serde_json::Value>,
    /// Kubernetes mode: cluster policy objects by kind.
    pub k8s_policies: Option<K8sPolicies>,
}

/// Cluster policy objects by kind (Kubernetes mode).
#[derive(Debug, Default)]
pub struct K8sPolicies {
    /// Objects whose current version was rejected.
    pub rejected: BTreeMap<String, i64>,
    /// Objects in force except rules that fail closed.
    pub partially_enforced: BTreeMap<String, i64>,
    /// `ClusterNetworkPolicy` objects by (tier, status: `Accepted`, `PartiallyEnforced`,
    /// `Rejected`).
    pub cluster_network_policies: BTreeMap<(String, String), i64>,
}

/// The manager as `/metrics` and `/healthz` see it.
pub trait Source: Send + Sync + 'static {
    /// The event families it counts into.
    fn metrics(&self) -> &Metrics;
    /// Its state now.
    fn snapshot(&self) -> Snapshot;
    /// Whether start-up has finished.
    fn is_ready(&self) -> bool;
}

/// The whole exposition: the event families and the state `src` has now.
#[must_use]
pub fn render<S: Source + ?Sized>(src: &S) -> String {
    let metrics = src.metrics();
    let mut out = String::new();
    let now = scrape::collect(&src.snapshot(), metrics.watch_stats.get().map(Arc::as_ref));
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode_registry(&mut out, &metrics.registry);
    let _ = prometheus_client::encoding::text::encode_registry(&mut out, &now);
    let _ = prometheus_client::encoding::text::encode_eof(&mut out);
    out
}

/// `GET /metrics`.
pub async fn handler<S: Source>(
    axum::extract::State(m): axum::extract::State<Arc<S>>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let body = tokio::task::spawn_blocking(move || render(m.as_ref()))
        .await
        .unwrap_or_default();
    ([(axum::http::header::CONTENT_TYPE, CONTENT_TYPE)], body).into_response()
}

/// Middleware counting every API request by its route template (axum's `MatchedPath`; a path
/// no route matched counts as `unmatched`), method and status.
pub async fn track_api(
    axum::extract::State(metrics): axum::extract::State<Arc<Metrics>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or("unmatched", axum::extract::MatchedPath::as_str)
        .to_owned();
    // Any token is a valid HTTP method: unknown ones share one label value.
    let method = match req.method().as_str() {
        m @ ("GET" | "POST" | "DELETE" | "PUT" | "PATCH" | "HEAD" | "OPTIONS") => m,
        _ => "other",
    }
    .to_owned();
    let t0 = std::time::Instant::now();
    let resp = next.run(req).await;
    metrics.api_request(&method, &route, resp.status().as_u16(), t0.elapsed());
    resp
}
