//! The manager as a metrics source (`crate::prom::Source`): the state a scrape reports, read at
//! once under the state lock, so that `prom` turns it into families without reaching into the
//! manager.

use std::collections::BTreeMap;
use weft_api::EndpointState;

use super::Manager;
use crate::prom::{K8sPolicies, Metrics, Snapshot, Source};

/// Policy kinds always exported (with 0 when there are none), so that a dashboard's series exist.
const POLICY_KINDS: [&str; 4] = [
    "NetworkPolicy",
    "CiliumNetworkPolicy",
    "CiliumClusterwideNetworkPolicy",
    "ClusterNetworkPolicy",
];

/// `ClusterNetworkPolicy` tiers and statuses always exported (tier `invalid`: not Admin or
/// Baseline, so rejected).
const CNP_TIERS: [&str; 2] = ["Admin", "Baseline"];
const CNP_STATUSES: [&str; 3] = ["Accepted", "PartiallyEnforced", "Rejected"];

impl Source for Manager {
    fn metrics(&self) -> &Metrics {
        self.prom()
    }

    fn snapshot(&self) -> Snapshot {
        let (endpoint_states, identity_kinds) = self.endpoints_and_identities();
        Snapshot {
            endpoint_states,
            identity_kinds,
            status: self.status(),
            datapath_rows: match self.datapath().map_dump(weft_ebpf::map_names::METRICS) {
                Ok(rows) => rows,
                Err(e) => {
                    tracing::debug!("metrics scrape: datapath counters not read: {e}");
                    Vec::new()
                }
            },
            k8s_policies: self.k8s_policies(),
        }
    }

    fn is_ready(&self) -> bool {
        Manager::is_ready(self)
    }
}

impl Manager {
    /// Endpoints by state and identities by kind.
    fn endpoints_and_identities(
        &self,
    ) -> (BTreeMap<&'static str, i64>, BTreeMap<&'static str, i64>) {
        let st = self.state();
        let mut states: BTreeMap<&'static str, i64> =
            [("allocated", 0), ("ready", 0), ("deleting", 0)]
                .into_iter()
                .collect();
        for ep in st.reg.list() {
            let s = match ep.state {
                EndpointState::Allocated => "allocated",
                EndpointState::Ready => "ready",
                EndpointState::Deleting => "deleting",
            };
            *states.entry(s).or_default() += 1;
        }
        let mut kinds: BTreeMap<&'static str, i64> = [("reserved", 2), ("local", 0), ("cidr", 0)]
            .into_iter()
            .collect();
        for (_, key, _) in st.pol.identities() {
            let k = match key {
                weft_policy::identity::IdentityKey::Labels(_) => "local",
                weft_policy::identity::IdentityKey::Cidr(_) => "cidr",
            };
            *kinds.entry(k).or_default() += 1;
        }
        kinds.insert(
            "remote",
            i64::try_from(st.pol.remote_only().count()).unwrap_or(i64::MAX),
        );
        (states, kinds)
    }

    /// Kubernetes mode: rejected and partially enforced policy objects by kind.
    fn k8s_policies(&self) -> Option<K8sPolicies> {
        let cache = self.k8s_cache()?;
        let zero: BTreeMap<String, i64> =
            POLICY_KINDS.iter().map(|k| ((*k).to_owned(), 0)).collect();
        let mut out = K8sPolicies {
            rejected: zero.clone(),
            partially_enforced: zero,
            cluster_network_policies: CNP_TIERS
                .iter()
                .flat_map(|t| {
                    CNP_STATUSES
                        .iter()
                        .map(|s| (((*t).to_owned(), (*s).to_owned()), 0))
                })
                .collect(),
        };
        for p in cache.tiered() {
            let tier = if CNP_TIERS.contains(&p.tier.as_str()) {
                p.tier
            } else {
                "invalid".to_owned()
            };
            *out.cluster_network_policies
                .entry((tier, p.status))
                .or_default() += 1;
        }
        let kind_of = |object: &str| {
            object
                .split_whitespace()
                .next()
                .unwrap_or("unknown")
                .to_owned()
        };
        for r in cache.rejected() {
            *out.rejected.entry(kind_of(&r.object)).or_default() += 1;
        }
        for p in cache
            .partial()
            .iter()
            .filter(|p| !p.not_enforced.is_empty())
        {
            *out.partially_enforced
                .entry(kind_of(&p.object))
                .or_default() += 1;
        }
        Some(out)
    }
}
