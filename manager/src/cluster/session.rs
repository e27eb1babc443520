//! This node's side of the kvstore: a lease kept alive, and under it the node record, the
//! node's endpoint IPs and its identity references, reconciled against what it last wrote.
//! A new lease (the old one expired during an outage) means nothing is known to be written,
//! so everything is published again.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Cluster;
use crate::kvstore::identities::{self, ClusterIdentityError};
use crate::kvstore::keys::{self, IpRecord};
use crate::kvstore::{KvError, LeaseId};
use weft_policy::labels::LabelSet;
use weft_policy::mapstate::Identity;

/// What this node should have in the store now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Desired {
    /// Endpoint addresses.
    pub ips: Vec<IpRecord>,
    /// Label identities with local references.
    pub refs: BTreeMap<LabelSet, Identity>,
    /// The node's pods (CRD mode publishes them as `WeftEndpoint` objects; kvstore mode
    /// publishes `ips`).
    pub pods: Vec<PodRecord>,
    /// `pods` holds every pod of this node: the pod watch has listed (a pod's uid comes from
    /// it). Until then a pod missing from `pods` may only be unknown yet, so CRD mode deletes
    /// none of the `WeftEndpoint` objects it published: after a restart they stay, and other
    /// nodes keep the pods' addresses and identities, until the list says which pods are gone.
    pub pods_listed: bool,
}

/// One pod of this node, as CRD mode publishes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRecord {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The Pod's uid (owner of its `WeftEndpoint`).
    pub uid: String,
    /// Addresses.
    pub ips: Vec<std::net::IpAddr>,
    /// Identity.
    pub identity: Identity,
    /// Named container ports.
    pub named_ports: Vec<crate::kvstore::keys::NamedPortRecord>,
}

/// The manager's state as the session publishes it.
pub trait Local: Send + Sync {
    /// What should be published.
    fn desired(&self) -> Desired;
}

/// What was written under the current lease.
#[derive(Default)]
pub(crate) struct Published {
    node: bool,
    ips: BTreeMap<String, Vec<u8>>,
    refs: BTreeMap<LabelSet, Identity>,
}

impl Cluster {
    /// One reconciliation of `desired` against `published` under `lease`. Identity references
    /// go first, so other nodes know a number before they see addresses using it.
    pub(crate) fn publish(
        &self,
        lease: LeaseId,
        desired: &Desired,
        published: &mut Published,
    ) -> Result<(), KvError> {
        let kv = &*self.kv;
        if !published.node {
            let record =
                serde_json::to_vec(&self.config.node).map_err(|source| KvError::Encode {
                    what: "the node record".into(),
                    source,
                })?;
            kv.put(&keys::node(&self.config.node.name), &record, Some(lease))?;
            published.node = true;
        }
        for (labels, id) in &desired.refs {
            if published.refs.get(labels) == Some(id) {
                continue;
            }
            match identities::publish_ref(kv, labels, *id, self.node_name(), lease) {
                Ok(()) => {}
                Err(ClusterIdentityError::Kv(e)) => return Err(e),
                // Recorded as published all the same: retrying cannot fix it, the log says how.
                Err(e) => tracing::error!("{e}"),
            }
            published.refs.insert(labels.clone(), *id);
        }
        let gone: Vec<LabelSet> = published
            .refs
            .keys()
            .filter(|l| !desired.refs.contains_key(*l))
            .cloned()
            .collect();
        for labels in gone {
            identities::release_ref(kv, &labels, self.node_name())?;
            published.refs.remove(&labels);
        }
        let want: BTreeMap<String, Vec<u8>> = desired
            .ips
            .iter()
            .map(|r| {
                serde_json::to_vec(r)
                    .map(|v| (keys::ip(r.ip), v))
                    .map_err(|source| KvError::Encode {
                        what: "an ip record".into(),
                        source,
                    })
            })
            .collect::<Result<_, _>>()?;
        for (key, value) in &want {
            if published.ips.get(key) != Some(value) {
                kv.put(key, value, Some(lease))?;
                published.ips.insert(key.clone(), value.clone());
            }
        }
        let stale: Vec<String> = published
            .ips
            .keys()
            .filter(|k| !want.contains_key(*k))
            .cloned()
            .collect();
        for key in stale {
            kv.delete(&key)?;
            published.ips.remove(&key);
        }
        Ok(())
    }
}

/// Runs the session until the cluster is stopped: lease, keep-alive, publishing, collection.
pub fn spawn(
    cluster: Arc<Cluster>,
    local: Arc<dyn Local>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("weft-kv-session".into())
        .spawn(move || run(&cluster, &*local))
}

fn run(cluster: &Cluster, local: &dyn Local) {
    let ttl = cluster.config.lease_ttl_s;
    let keepalive_every = Duration::from_secs(u64::try_from(ttl / 3).unwrap_or(1).max(1));
    let mut published = Published::default();
    let mut last_keepalive = Instant::now();
    let mut last_gc = Instant::now();
    while !cluster.stopped() {
        let lease = if let Some(l) = cluster.lease() {
            l
        } else {
            match cluster.kv.grant_lease(ttl) {
                Ok(l) => {
                    *crate::sys::locks::lock(&cluster.lease) = Some(l);
                    published = Published::default();
                    last_keepalive = Instant::now();
                    tracing::info!(lease = l, ttl_s = ttl, "kvstore lease granted");
                    l
                }
                Err(e) => {
                    tracing::debug!("kvstore lease: {e}");
                    cluster.set_connected(false);
                    cluster.wait(Duration::from_secs(1));
                    continue;
                }
            }
        };
        if last_keepalive.elapsed() >= keepalive_every {
            match cluster.kv.keep_alive(lease) {
                Ok(true) => last_keepalive = Instant::now(),
                Ok(false) => {
                    tracing::warn!(lease, "kvstore lease expired; publishing everything again");
                    *crate::sys::locks::lock(&cluster.lease) = None;
                    continue;
                }
                Err(e) => {
                    tracing::debug!("kvstore keep-alive: {e}");
                    cluster.set_connected(false);
                    cluster.wait(Duration::from_secs(1));
                    continue;
                }
            }
        }
        match cluster.publish(lease, &local.desired(), &mut published) {
            Ok(()) => cluster.set_connected(true),
            Err(e) => {
                tracing::debug!("kvstore publish: {e}");
                if matches!(e, KvError::LeaseNotFound(_)) {
                    *crate::sys::locks::lock(&cluster.lease) = None;
                }
                cluster.set_connected(!e.is_unavailable());
            }
        }
        if last_gc.elapsed() >= cluster.config.gc_interval {
            last_gc = Instant::now();
            match identities::collect_all(&*cluster.kv) {
                Ok(0) => {}
                Ok(n) => tracing::info!(freed = n, "unreferenced cluster identities collected"),
                Err(e) => tracing::debug!("identity collection: {e}"),
            }
        }
        cluster.wait(Duration::from_secs(1).min(keepalive_every));
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::cluster::ClusterConfig;
    use crate::kvstore::Kv;
    use crate::kvstore::keys::NodeRecord;
    use crate::kvstore::mem::MemKv;

    pub(crate) fn cluster(kv: Arc<MemKv>, name: &str, ip: &str) -> Cluster {
        Cluster::new(
            kv,
            ClusterConfig {
                node: NodeRecord {
                    name: name.into(),
                    node_ip: ip.parse().unwrap(),
                    pod_cidrs: vec!["10.1.0.0/24".parse().unwrap()],
                    router_ips: vec!["10.1.0.1".parse().unwrap()],
                },
                lease_ttl_s: 10,
                gc_interval: Duration::from_secs(30),
            },
        )
    }

    #[test]
    fn publishes_refs_and_ips_then_withdraws_them() {
        let kv = Arc::new(MemKv::new());
        let c = cluster(kv.clone(), "a", "192.0.2.1");
        let lease = kv.grant_lease(10).unwrap();
        let web = LabelSet::for_pod("default", [("app", "web")]);
        let id = c.allocate_identity(&web).unwrap();
        let mut desired = Desired::default();
        desired.refs.insert(web.clone(), id);
        desired.ips.push(IpRecord {
            ip: "10.1.0.5".parse().unwrap(),
            identity: id,
            node: "a".into(),
            node_ip: "192.0.2.1".parse().unwrap(),
            named_ports: Vec::new(),
        });
        let mut published = Published::default();
        c.publish(lease, &desired, &mut published).unwrap();
        let dump = kv.dump();
        assert!(dump.contains_key("weft/state/nodes/v1/a"));
        assert!(dump.contains_key("weft/state/ip/v1/default/10.1.0.5"));
        assert!(dump.contains_key(&keys::id_ref(&web, "a")));
        c.publish(lease, &Desired::default(), &mut published)
            .unwrap();
        let dump = kv.dump();
        assert_eq!(
            dump.keys().collect::<Vec<_>>(),
            ["weft/state/nodes/v1/a"],
            "the last reference freed the identity; the address is gone"
        );
        kv.expire(lease);
        assert!(kv.dump().is_empty());
    }
}
