//! The families read from the manager's real state at each scrape (a [`Snapshot`] its owner
//! takes), into a registry built for that scrape alone (so a series whose object is gone simply
//! is not there next time).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use weft_k8s::watch::WatchStats;

use super::{K8sPolicies, Snapshot};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct State {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Kind {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TierStatus {
    tier: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Pool {
    family: &'static str,
    cidr: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub(super) struct Verdict {
    pub(super) reason: String,
    pub(super) direction: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Phase {
    phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WatchEvent {
    resource: String,
    r#type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Resource {
    resource: String,
}

/// `(drops, forwards)`: packets and bytes per (reason, direction), summed over endpoints
/// and CPUs, from the rows of `map dump metrics`.
pub(super) type Datapath = (BTreeMap<Verdict, (u64, u64)>, BTreeMap<Verdict, (u64, u64)>);

/// Splits the metrics map's rows into drops and forwards. The reasons named `allow-*` and
/// `pass-*` let the packet through; every other reason dropped it.
pub(super) fn datapath_counters(rows: &[serde_json::Value]) -> Datapath {
    let (mut drops, mut forwards) = (BTreeMap::new(), BTreeMap::new());
    for row in rows {
        let text = |k: &str| row.get(k).and_then(|v| v.as_str()).unwrap_or("unknown");
        let num = |k: &str| row.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
        let reason = text("reason");
        let key = Verdict {
            reason: reason.to_owned(),
            direction: text("direction").to_owned(),
        };
        let to = if reason.starts_with("allow-") || reason.starts_with("pass-") {
            &mut forwards
        } else {
            &mut drops
        };
        let e: &mut (u64, u64) = to.entry(key).or_default();
        e.0 += num("packets");
        e.1 += num("bytes");
    }
    (drops, forwards)
}

fn gauge<L>(reg: &mut Registry, name: &str, help: &str, values: impl IntoIterator<Item = (L, i64)>)
where
    L: EncodeLabelSet + Clone + std::hash::Hash + Eq + std::fmt::Debug + Send + Sync + 'static,
{
    let f = Family::<L, Gauge>::default();
    for (l, v) in values {
        f.get_or_create(&l).set(v);
    }
    reg.register(name, help, f);
}

fn counter<L>(
    reg: &mut Registry,
    name: &str,
    help: &str,
    values: impl IntoIterator<Item = (L, u64)>,
) where
    L: EncodeLabelSet + Clone + std::hash::Hash + Eq + std::fmt::Debug + Send + Sync + 'static,
{
    let f = Family::<L, Counter>::default();
    for (l, v) in values {
        f.get_or_create(&l).inc_by(v);
    }
    reg.register(name, help, f);
}

fn to_i64(n: impl TryInto<i64>) -> i64 {
    n.try_into().unwrap_or(i64::MAX)
}

/// Everything that is a state, as it is now.
pub(super) fn collect(now: &Snapshot, watch: Option<&WatchStats>) -> Registry {
    let mut reg = Registry::with_prefix("weft");
    gauge(
        &mut reg,
        "endpoint_state",
        "Endpoints by state (allocated: CNI ADD in progress; ready: enforcing; deleting)",
        now.endpoint_states
            .iter()
            .map(|(&state, &n)| (State { state }, n)),
    );
    gauge(
        &mut reg,
        "identity",
        "Security identities in use: reserved (host, world), local (label sets of this node's endpoints and selectors), cidr, remote (known only from other nodes, kvstore mode)",
        now.identity_kinds
            .iter()
            .map(|(&k, &n)| (Kind { kind: k.into() }, n)),
    );
    let status = &now.status;
    let revision = Gauge::<i64>::default();
    revision.set(to_i64(status.policy_revision));
    reg.register(
        "policy_max_revision",
        "The policy repository's revision (every ready endpoint enforces it once an import returns)",
        revision,
    );
    let pools = |f: fn(&weft_api::PoolStatus) -> u64| {
        status
            .pools
            .iter()
            .map(move |p| {
                let family = if p.cidr.contains(':') { "ipv6" } else { "ipv4" };
                let l = Pool {
                    family,
                    cidr: p.cidr.clone(),
                };
                (l, to_i64(f(p)))
            })
            .collect::<Vec<_>>()
    };
    gauge(
        &mut reg,
        "ipam_capacity",
        "Pod addresses the node's pool can hand out (network, broadcast and router excluded)",
        pools(|p| p.capacity),
    );
    gauge(
        &mut reg,
        "ipam_used",
        "Pod addresses allocated from the node's pool",
        pools(|p| p.used),
    );
    let restore = Family::<Phase, Gauge<f64, AtomicU64>>::default();
    for (phase, ms) in &status.restore_ms {
        restore
            .get_or_create(&Phase {
                phase: phase.clone(),
            })
            .set(ms / 1000.0);
    }
    reg.register(
        "restore_duration_seconds",
        "Duration of each phase of the last start-up (phase total: all of it)",
        restore,
    );
    datapath(&now.datapath_rows, &mut reg);
    if let Some(w) = watch {
        watchers(w, &mut reg);
    }
    if let Some(k8s) = &now.k8s_policies {
        k8s_policies(k8s, &mut reg);
    }
    reg
}

fn k8s_policies(k8s: &K8sPolicies, reg: &mut Registry) {
    gauge(
        reg,
        "k8s_policies_rejected",
        "Cluster policy objects whose current version was rejected (weftctl policy list shows why)",
        k8s.rejected
            .iter()
            .map(|(kind, &n)| (Kind { kind: kind.clone() }, n)),
    );
    gauge(
        reg,
        "k8s_cluster_network_policies",
        "ClusterNetworkPolicy objects by tier and status (Accepted, PartiallyEnforced, Rejected: weftctl policy list and the object's status.conditions say why)",
        k8s.cluster_network_policies
            .iter()
            .map(|((tier, status), &n)| {
                (
                    TierStatus {
                        tier: tier.clone(),
                        status: status.clone(),
                    },
                    n,
                )
            }),
    );
    gauge(
        reg,
        "k8s_policies_partially_enforced",
        "Cluster policy objects in force except rules Weft cannot express, which fail closed (weftctl policy list shows which)",
        k8s.partially_enforced
            .iter()
            .map(|(kind, &n)| (Kind { kind: kind.clone() }, n)),
    );
}

fn datapath(rows: &[serde_json::Value], reg: &mut Registry) {
    let (drops, forwards) = datapath_counters(rows);
    for (name, what, map) in [
        ("drop", "dropped", &drops),
        ("forward", "let through", &forwards),
    ] {
        counter(
            reg,
            &format!("{name}_count"),
            &format!(
                "Packets the datapath {what}, by reason and direction (from the endpoint's view)"
            ),
            map.iter().map(|(l, (p, _))| (l.clone(), *p)),
        );
        counter(
            reg,
            &format!("{name}_bytes"),
            &format!("Bytes the datapath {what}, by reason and direction"),
            map.iter().map(|(l, (_, b))| (l.clone(), *b)),
        );
    }
}

fn watchers(w: &WatchStats, reg: &mut Registry) {
    let counts = w.snapshot();
    counter(
        reg,
        "k8s_watch_events",
        "Kubernetes objects received, by resource and event (list: in a (re-)list; apply; delete)",
        counts
            .iter()
            .filter(|((_, t), _)| !matches!(t.as_str(), "error" | "rejected" | "partial"))
            .map(|((resource, t), n)| {
                (
                    WatchEvent {
                        resource: resource.clone(),
                        r#type: t.clone(),
                    },
                    *n,
                )
            }),
    );
    counter(
        reg,
        "k8s_watch_errors",
        "Kubernetes watch or list errors, by resource (each is retried with backoff)",
        counts
            .iter()
            .filter(|((_, t), _)| t == "error")
            .map(|((resource, _), n)| {
                (
                    Resource {
                        resource: resource.clone(),
                    },
                    *n,
                )
            }),
    );
    counter(
        reg,
        "k8s_policy_rejections",
        "Policy object versions the watchers rejected, by kind (each version once)",
        counts
            .iter()
            .filter(|((_, t), _)| t == "rejected")
            .map(|((kind, _), n)| (Kind { kind: kind.clone() }, *n)),
    );
    counter(
        reg,
        "k8s_policy_partial_applies",
        "Policy object versions applied with rules left out (those fail closed), by kind (each version once)",
        counts
            .iter()
            .filter(|((_, t), _)| t == "partial")
            .map(|((kind, _), n)| (Kind { kind: kind.clone() }, *n)),
    );
    for (name, help, n) in [
        (
            "k8s_policy_status_writes",
            "ClusterNetworkPolicy status conditions written (only when they change)",
            &w.status_writes,
        ),
        (
            "k8s_policy_status_write_errors",
            "ClusterNetworkPolicy status writes that failed (each retried with backoff)",
            &w.status_write_errors,
        ),
    ] {
        let c = Counter::<u64>::default();
        c.inc_by(n.load(std::sync::atomic::Ordering::Relaxed));
        reg.register(name, help, c);
    }
    let lists = Counter::<u64>::default();
    lists.inc_by(w.lists.load(std::sync::atomic::Ordering::Relaxed));
    reg.register(
        "k8s_watch_lists",
        "Full lists by the watchers (the initial ones and each re-list after 410 Gone)",
        lists,
    );
}
