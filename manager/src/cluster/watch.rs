//! Every node's records, watched: list once (a consistent snapshot at a revision), apply the
//! difference to what is known, then watch from the next revision; when the watch breaks
//! (etcd restarted, network cut), list again. The same `apply` serves both, so an outage
//! converges by diffing the fresh listing against the last known state.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

use super::Cluster;
use crate::kvstore::identities::parse_labels;
use crate::kvstore::keys::{self, IpRecord, NodeRecord};
use crate::kvstore::{Event, KvError};
use weft_policy::labels::LabelSet;
use weft_policy::mapstate::Identity;

/// Where remote state lands (the manager; routes for nodes).
pub trait Remote: Send + Sync {
    /// A cluster identity exists.
    fn identity_put(&self, id: Identity, labels: LabelSet);
    /// A cluster identity was freed.
    fn identity_deleted(&self, id: Identity);
    /// Another node's endpoint address.
    fn ip_put(&self, record: &IpRecord);
    /// It went away (deleted, or its node's lease expired).
    fn ip_deleted(&self, record: &IpRecord);
    /// Another node joined or changed.
    fn node_put(&self, record: &NodeRecord);
    /// It left (its lease expired or it was removed).
    fn node_deleted(&self, record: &NodeRecord);
    /// A full listing was applied: whatever was kept only until the store could say is
    /// settled now.
    fn listed(&self);
}

impl Cluster {
    /// Applies one change of `key` (`None`: deleted).
    pub(crate) fn apply(
        &self,
        remote: &dyn Remote,
        key: &str,
        value: Option<&[u8]>,
    ) -> Result<(), KvError> {
        if let Some(n) = key.strip_prefix(keys::ID_BY_NUMBER) {
            let Ok(id) = n.parse::<Identity>() else {
                return Ok(());
            };
            match value {
                Some(v) => remote.identity_put(id, parse_labels(key, v)?),
                None => remote.identity_deleted(id),
            }
        } else if let Some(ip) = key.strip_prefix(keys::IPS) {
            let Ok(ip) = ip.parse::<IpAddr>() else {
                return Ok(());
            };
            let Some(v) = value else {
                let old = crate::sys::locks::lock(&self.ips).remove(&ip);
                if let Some(old) = old {
                    remote.ip_deleted(&old);
                }
                return Ok(());
            };
            let record: IpRecord =
                serde_json::from_slice(v).map_err(|source| KvError::Malformed {
                    key: key.into(),
                    source,
                })?;
            let mut ips = crate::sys::locks::lock(&self.ips);
            if record.node == self.node_name() {
                // Our own write echoed back; a record of another node we held is gone.
                if let Some(old) = ips.remove(&ip) {
                    drop(ips);
                    remote.ip_deleted(&old);
                }
                return Ok(());
            }
            let old = ips.insert(ip, record.clone());
            drop(ips);
            // The address moved to another node (its pod was recreated there before the old
            // node's record went): the old owner lets go first.
            if let Some(old) = old.filter(|o| o.node != record.node) {
                remote.ip_deleted(&old);
            }
            remote.ip_put(&record);
        } else if let Some(name) = key.strip_prefix(keys::NODES) {
            if name == self.node_name() {
                return Ok(());
            }
            let Some(v) = value else {
                let old = crate::sys::locks::lock(&self.nodes).remove(name);
                if let Some(old) = old {
                    remote.node_deleted(&old);
                }
                return Ok(());
            };
            let record: NodeRecord =
                serde_json::from_slice(v).map_err(|source| KvError::Malformed {
                    key: key.into(),
                    source,
                })?;
            crate::sys::locks::lock(&self.nodes).insert(name.into(), record.clone());
            remote.node_put(&record);
        }
        Ok(())
    }

    fn apply_logged(&self, remote: &dyn Remote, key: &str, value: Option<&[u8]>) {
        if let Err(e) = self.apply(remote, key, value) {
            tracing::warn!("ignoring a kvstore record: {e}");
        }
    }

    /// Lists everything and applies the difference to `known`; returns the listing's revision.
    pub(crate) fn resync(
        &self,
        remote: &dyn Remote,
        known: &mut BTreeMap<String, Vec<u8>>,
    ) -> Result<i64, KvError> {
        let (entries, revision) = self.kv.list(keys::ROOT)?;
        let now: BTreeMap<String, Vec<u8>> =
            entries.into_iter().map(|e| (e.key, e.value)).collect();
        for key in known.keys().filter(|k| !now.contains_key(*k)) {
            self.apply_logged(remote, key, None);
        }
        // Sorted: identities before the ip entries that use them.
        for (key, value) in &now {
            if known.get(key) != Some(value) {
                self.apply_logged(remote, key, Some(value));
            }
        }
        *known = now;
        self.set_connected(true);
        self.mark_synced();
        remote.listed();
        Ok(revision)
    }
}

/// Runs the watcher until the cluster is stopped.
pub fn spawn(
    cluster: Arc<Cluster>,
    remote: Arc<dyn Remote>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("weft-kv-watch".into())
        .spawn(move || run(&cluster, &*remote))
}

fn run(cluster: &Cluster, remote: &dyn Remote) {
    let mut known = BTreeMap::new();
    while !cluster.stopped() {
        let watch = cluster
            .resync(remote, &mut known)
            .and_then(|rev| cluster.kv.watch(keys::ROOT, rev + 1));
        let rx = match watch {
            Ok(rx) => rx,
            Err(e) => {
                tracing::debug!("kvstore watch: {e}");
                cluster.set_connected(false);
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
        };
        loop {
            match rx.recv_timeout(Duration::from_secs(1)) {
                Ok(Ok(event)) => {
                    let (key, value) = match &event {
                        Event::Put(k, v) => (k, Some(v.as_slice())),
                        Event::Delete(k) => (k, None),
                    };
                    cluster.apply_logged(remote, key, value);
                    match value {
                        Some(v) => known.insert(key.clone(), v.to_vec()),
                        None => known.remove(key),
                    };
                }
                Ok(Err(e)) => {
                    tracing::debug!("kvstore watch broke: {e}");
                    cluster.set_connected(false);
                    std::thread::sleep(Duration::from_millis(500));
                    break;
                }
                Err(RecvTimeoutError::Timeout) if !cluster.stopped() => {}
                Err(_) => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::session::{Desired, Published};
    use crate::kvstore::Kv;
    use crate::kvstore::mem::MemKv;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Log(Mutex<Vec<String>>);

    impl Remote for Log {
        fn identity_put(&self, id: Identity, labels: LabelSet) {
            self.0.lock().unwrap().push(format!("id+ {id} {labels}"));
        }
        fn identity_deleted(&self, id: Identity) {
            self.0.lock().unwrap().push(format!("id- {id}"));
        }
        fn ip_put(&self, r: &IpRecord) {
            self.0
                .lock()
                .unwrap()
                .push(format!("ip+ {} {} {}", r.ip, r.identity, r.node));
        }
        fn ip_deleted(&self, r: &IpRecord) {
            self.0.lock().unwrap().push(format!("ip- {}", r.ip));
        }
        fn node_put(&self, r: &NodeRecord) {
            self.0.lock().unwrap().push(format!("node+ {}", r.name));
        }
        fn node_deleted(&self, r: &NodeRecord) {
            self.0.lock().unwrap().push(format!("node- {}", r.name));
        }
        fn listed(&self) {
            self.0.lock().unwrap().push("listed".into());
        }
    }

    #[test]
    fn another_nodes_records_arrive_and_leave_with_its_lease() {
        let kv = Arc::new(MemKv::new());
        let a = crate::cluster::session::tests::cluster(kv.clone(), "a", "192.0.2.1");
        let b = crate::cluster::session::tests::cluster(kv.clone(), "b", "192.0.2.2");
        let web = LabelSet::for_pod("default", [("app", "web")]);
        let id = a.allocate_identity(&web).unwrap();
        let lease = kv.grant_lease(10).unwrap();
        let mut desired = Desired::default();
        desired.refs.insert(web.clone(), id);
        desired.ips.push(IpRecord {
            ip: "10.1.0.5".parse().unwrap(),
            identity: id,
            node: "a".into(),
            node_ip: "192.0.2.1".parse().unwrap(),
            named_ports: Vec::new(),
        });
        a.publish(lease, &desired, &mut Published::default())
            .unwrap();

        let log = Log::default();
        let mut known = BTreeMap::new();
        let rev = b.resync(&log, &mut known).unwrap();
        assert_eq!(
            *log.0.lock().unwrap(),
            [
                format!("id+ {id} {web}"),
                format!("ip+ 10.1.0.5 {id} a"),
                "node+ a".into(),
                "listed".into()
            ]
        );
        assert_eq!(b.nodes().len(), 1);
        log.0.lock().unwrap().clear();

        let rx = kv.watch(keys::ROOT, rev + 1).unwrap();
        kv.expire(lease);
        kv.txn(&[], &[]).unwrap();
        for ev in rx.try_iter() {
            let (k, v) = match ev.unwrap() {
                Event::Put(k, v) => (k, Some(v)),
                Event::Delete(k) => (k, None),
            };
            b.apply(&log, &k, v.as_deref()).unwrap();
        }
        let got = log.0.lock().unwrap().clone();
        assert!(
            got.contains(&"ip- 10.1.0.5".to_string()) && got.contains(&"node- a".to_string()),
            "{got:?}"
        );
        assert!(b.nodes().is_empty() && b.remote_ips().is_empty());
    }
}
