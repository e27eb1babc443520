//! An in-memory [`Api`] with the API server's semantics where the protocol relies on them:
//! create fails on an existing name (409), deletes are guarded by uid and resourceVersion
//! preconditions, every write moves a global resourceVersion, and watches see every change.
//! [`MemApi::set_down`] makes every call fail as an unreachable API server would, and breaks
//! the watches; [`MemApi::relist`] is their recovery (kube-runtime's watcher lists every kind
//! again after its backoff), so a test decides which changes a broken watch missed.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};

use super::{
    Api, Change, CrdError, EndpointObject, IdentityObject, KeyObject, Kind, Meta, Object,
    labels_hash,
};
use crate::kvstore::keys::NodeRecord;
use weft_policy::labels::LabelSet;
use weft_policy::mapstate::Identity;

#[derive(Default)]
struct Inner {
    identities: BTreeMap<Identity, IdentityObject>,
    keys: BTreeMap<String, KeyObject>,
    endpoints: BTreeMap<(String, String), EndpointObject>,
    nodes: BTreeMap<String, NodeRecord>,
    version: u64,
    watchers: Vec<Sender<Change>>,
}

impl Inner {
    fn meta(&mut self, uid: Option<&str>) -> Meta {
        self.version += 1;
        Meta {
            uid: uid.map_or_else(|| format!("uid-{}", self.version), str::to_owned),
            resource_version: self.version.to_string(),
        }
    }

    fn emit(&mut self, make: impl Fn() -> Change) {
        self.watchers.retain(|tx| tx.send(make()).is_ok());
    }

    fn listing(&self, kind: Kind) -> Vec<Object> {
        match kind {
            Kind::Identity => self
                .identities
                .values()
                .cloned()
                .map(Object::Identity)
                .collect(),
            Kind::Key => self.keys.values().cloned().map(Object::Key).collect(),
            Kind::Endpoint => self
                .endpoints
                .values()
                .cloned()
                .map(Object::Endpoint)
                .collect(),
            Kind::Node => self.nodes.values().cloned().map(Object::Node).collect(),
        }
    }
}

/// The fake API server.
#[derive(Default)]
pub struct MemApi {
    inner: Mutex<Inner>,
    down: AtomicBool,
}

impl MemApi {
    /// An empty cluster.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Inner>, CrdError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(CrdError::Unavailable("injected outage".into()));
        }
        Ok(crate::sys::locks::lock(&self.inner))
    }

    fn raw(&self) -> std::sync::MutexGuard<'_, Inner> {
        crate::sys::locks::lock(&self.inner)
    }

    /// Simulates the API server going away (`true`: calls fail, watches break) and coming
    /// back.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
        if down {
            let mut inner = self.raw();
            for kind in Kind::ALL {
                inner.emit(|| Change::Broken(kind, "injected outage".into()));
            }
        }
    }

    /// The watches recover: every kind listed again.
    pub fn relist(&self) {
        let mut inner = self.raw();
        for kind in Kind::ALL {
            let all = inner.listing(kind);
            inner.emit(|| Change::Listed(kind, all.clone()));
        }
    }

    /// A Node object appears or changes (the kubelet registered it).
    pub fn put_node(&self, node: NodeRecord) {
        let mut inner = self.raw();
        inner.nodes.insert(node.name.clone(), node.clone());
        inner.emit(move || Change::Put(Object::Node(node.clone())));
    }

    /// A Node object is deleted.
    pub fn delete_node(&self, name: &str) {
        let mut inner = self.raw();
        if let Some(old) = inner.nodes.remove(name) {
            inner.emit(|| Change::Deleted(Object::Node(old.clone())));
        }
    }

    /// Deletes an identity and its key by hand (`kubectl delete`), whatever their versions.
    pub fn delete_by_hand(&self, number: Identity) {
        let mut inner = self.raw();
        if let Some(old) = inner.identities.remove(&number) {
            inner.emit(|| Change::Deleted(Object::Identity(old.clone())));
            if let Some(k) = inner.keys.remove(&labels_hash(&old.labels)) {
                inner.emit(|| Change::Deleted(Object::Key(k.clone())));
            }
        }
    }

    /// The identities (number → labels).
    #[must_use]
    pub fn identities(&self) -> BTreeMap<Identity, LabelSet> {
        self.raw()
            .identities
            .iter()
            .map(|(n, o)| (*n, o.labels.clone()))
            .collect()
    }

    /// The keys (hash → number).
    #[must_use]
    pub fn keys(&self) -> BTreeMap<String, Identity> {
        self.raw()
            .keys
            .iter()
            .map(|(h, k)| (h.clone(), k.number))
            .collect()
    }

    /// The endpoints.
    #[must_use]
    pub fn endpoints(&self) -> Vec<EndpointObject> {
        self.raw().endpoints.values().cloned().collect()
    }
}

impl Api for MemApi {
    fn list_identities(&self) -> Result<Vec<IdentityObject>, CrdError> {
        Ok(self.lock()?.identities.values().cloned().collect())
    }

    fn get_identity(&self, number: Identity) -> Result<Option<IdentityObject>, CrdError> {
        Ok(self.lock()?.identities.get(&number).cloned())
    }

    fn create_identity(&self, number: Identity, labels: &LabelSet) -> Result<bool, CrdError> {
        let mut inner = self.lock()?;
        if inner.identities.contains_key(&number) {
            return Ok(false);
        }
        let obj = IdentityObject {
            number,
            labels: labels.clone(),
            meta: inner.meta(None),
        };
        inner.identities.insert(number, obj.clone());
        inner.emit(|| Change::Put(Object::Identity(obj.clone())));
        Ok(true)
    }

    fn delete_identity(&self, number: Identity, meta: &Meta) -> Result<bool, CrdError> {
        let mut inner = self.lock()?;
        if inner.identities.get(&number).map(|o| &o.meta) != Some(meta) {
            return Ok(false);
        }
        let old = inner.identities.remove(&number);
        inner.version += 1;
        if let Some(old) = old {
            inner.emit(|| Change::Deleted(Object::Identity(old.clone())));
        }
        Ok(true)
    }

    fn get_key(&self, hash: &str) -> Result<Option<KeyObject>, CrdError> {
        Ok(self.lock()?.keys.get(hash).cloned())
    }

    fn create_key(&self, labels: &LabelSet, number: Identity) -> Result<bool, CrdError> {
        let mut inner = self.lock()?;
        let hash = labels_hash(labels);
        if inner.keys.contains_key(&hash) {
            return Ok(false);
        }
        let obj = KeyObject {
            hash: hash.clone(),
            number,
            labels: labels.clone(),
            meta: inner.meta(None),
        };
        inner.keys.insert(hash, obj.clone());
        inner.emit(|| Change::Put(Object::Key(obj.clone())));
        Ok(true)
    }

    fn touch_key(&self, hash: &str, _node: &str) -> Result<bool, CrdError> {
        let mut inner = self.lock()?;
        let Some(uid) = inner.keys.get(hash).map(|k| k.meta.uid.clone()) else {
            return Ok(false);
        };
        let meta = inner.meta(Some(&uid));
        let Some(k) = inner.keys.get_mut(hash) else {
            return Ok(false);
        };
        k.meta = meta;
        let obj = k.clone();
        inner.emit(|| Change::Put(Object::Key(obj.clone())));
        Ok(true)
    }

    fn delete_key(&self, hash: &str, meta: &Meta) -> Result<bool, CrdError> {
        let mut inner = self.lock()?;
        if inner.keys.get(hash).map(|k| &k.meta) != Some(meta) {
            return Ok(false);
        }
        let old = inner.keys.remove(hash);
        inner.version += 1;
        if let Some(old) = old {
            inner.emit(|| Change::Deleted(Object::Key(old.clone())));
        }
        Ok(true)
    }

    fn apply_endpoint(&self, ep: &EndpointObject) -> Result<(), CrdError> {
        let mut inner = self.lock()?;
        inner.version += 1;
        inner
            .endpoints
            .insert((ep.namespace.clone(), ep.name.clone()), ep.clone());
        inner.emit(|| Change::Put(Object::Endpoint(ep.clone())));
        Ok(())
    }

    fn delete_endpoint(&self, ep: &EndpointObject) -> Result<(), CrdError> {
        let mut inner = self.lock()?;
        let id = (ep.namespace.clone(), ep.name.clone());
        let ours = inner
            .endpoints
            .get(&id)
            .is_some_and(|cur| cur.node == ep.node && cur.pod_uid == ep.pod_uid);
        if ours && let Some(old) = inner.endpoints.remove(&id) {
            inner.version += 1;
            inner.emit(|| Change::Deleted(Object::Endpoint(old.clone())));
        }
        Ok(())
    }

    fn watch(&self) -> Result<Receiver<Change>, CrdError> {
        let (tx, rx) = channel();
        let mut inner = self.raw();
        if !self.down.load(Ordering::SeqCst) {
            for kind in Kind::ALL {
                let _ = tx.send(Change::Listed(kind, inner.listing(kind)));
            }
        }
        inner.watchers.push(tx);
        Ok(rx)
    }
}
