//! What the watches of the API server show, and what of it reaches the manager. Every change
//! updates the [`View`]; the manager's side ([`Delivered`]) is then derived from the whole
//! view and the difference handed to [`Remote`], so a re-list after an outage converges by
//! the same path as a single event, and the rules live in one place:
//! - an identity counts only when the key of its labels points at its number (a number
//!   reserved by a node that then lost the race for the label set is never seen as in use);
//! - another node's pod addresses count only while its Node exists (a Node deleted takes its
//!   routes and its endpoints' ipcache entries, before their Pods are garbage-collected) and
//!   its identity is confirmed;
//! - this node's own objects are never delivered.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use super::{Change, EndpointObject, IdentityObject, KeyObject, Kind, Object, labels_hash};
use crate::cluster::watch::Remote;
use crate::kvstore::keys::{IpRecord, NodeRecord};
use weft_policy::labels::LabelSet;
use weft_policy::mapstate::Identity;

/// The watched objects.
#[derive(Debug, Clone, Default)]
pub struct View {
    identities: BTreeMap<Identity, IdentityObject>,
    keys: BTreeMap<String, KeyObject>,
    endpoints: BTreeMap<(String, String), EndpointObject>,
    nodes: BTreeMap<String, NodeRecord>,
    listed: BTreeSet<Kind>,
}

impl View {
    /// Applies one change; returns whether every kind is listed now and this change completed
    /// a listing (the moment the manager's `listed()` is due).
    pub fn apply(&mut self, change: Change) -> bool {
        match change {
            Change::Listed(kind, objects) => {
                match kind {
                    Kind::Identity => self.identities.clear(),
                    Kind::Key => self.keys.clear(),
                    Kind::Endpoint => self.endpoints.clear(),
                    Kind::Node => self.nodes.clear(),
                }
                for o in objects {
                    self.put(o);
                }
                self.listed.insert(kind);
                return self.synced();
            }
            Change::Put(o) => self.put(o),
            Change::Deleted(o) => match o {
                Object::Identity(i) => {
                    self.identities.remove(&i.number);
                }
                Object::Key(k) => {
                    self.keys.remove(&k.hash);
                }
                Object::Endpoint(e) => {
                    self.endpoints.remove(&(e.namespace, e.name));
                }
                Object::Node(n) => {
                    self.nodes.remove(&n.name);
                }
            },
            // What is known stays until the re-list says otherwise.
            Change::Broken(kind, _) => {
                self.listed.remove(&kind);
            }
        }
        false
    }

    fn put(&mut self, o: Object) {
        match o {
            Object::Identity(i) => {
                self.identities.insert(i.number, i);
            }
            Object::Key(k) => {
                self.keys.insert(k.hash.clone(), k);
            }
            Object::Endpoint(e) => {
                self.endpoints
                    .insert((e.namespace.clone(), e.name.clone()), e);
            }
            Object::Node(n) => {
                self.nodes.insert(n.name.clone(), n);
            }
        }
    }

    /// Is every kind listed (and not broken since)?
    #[must_use]
    pub fn synced(&self) -> bool {
        Kind::ALL.iter().all(|k| self.listed.contains(k))
    }

    /// The `WeftIdentity` objects.
    #[must_use]
    pub fn identities(&self) -> &BTreeMap<Identity, IdentityObject> {
        &self.identities
    }

    /// The `WeftIdentityKey` objects.
    #[must_use]
    pub fn keys(&self) -> &BTreeMap<String, KeyObject> {
        &self.keys
    }

    /// Numbers any `WeftEndpoint` uses.
    #[must_use]
    pub fn endpoint_identities(&self) -> BTreeSet<Identity> {
        self.endpoints.values().map(|e| e.identity).collect()
    }

    /// `node`'s `WeftEndpoint` objects.
    #[must_use]
    pub fn endpoints_of(&self, node: &str) -> BTreeMap<(String, String), EndpointObject> {
        self.endpoints
            .iter()
            .filter(|(_, e)| e.node == node)
            .map(|(k, e)| (k.clone(), e.clone()))
            .collect()
    }

    /// Names of the Nodes.
    pub fn node_names(&self) -> impl Iterator<Item = &str> {
        self.nodes.keys().map(String::as_str)
    }

    /// Does the key of `labels` give it `n`, with `WeftIdentity` `n` holding `labels`?
    #[must_use]
    pub fn agrees(&self, labels: &LabelSet, n: Identity) -> bool {
        self.keys
            .get(&labels_hash(labels))
            .is_some_and(|k| k.number == n && k.labels == *labels)
            && self.identities.get(&n).is_some_and(|i| i.labels == *labels)
    }

    /// What the manager should hold, seen from node `me`.
    #[must_use]
    pub fn derive(&self, me: &str) -> Delivered {
        let identities: BTreeMap<Identity, LabelSet> = self
            .identities
            .values()
            .filter(|i| {
                self.keys
                    .get(&labels_hash(&i.labels))
                    .is_some_and(|k| k.number == i.number && k.labels == i.labels)
            })
            .map(|i| (i.number, i.labels.clone()))
            .collect();
        let nodes: BTreeMap<String, NodeRecord> = self
            .nodes
            .iter()
            .filter(|(name, _)| *name != me)
            .map(|(n, r)| (n.clone(), r.clone()))
            .collect();
        let mut ips = BTreeMap::new();
        for e in self.endpoints.values() {
            if e.node == me || !nodes.contains_key(&e.node) {
                continue;
            }
            // The four watches are independent streams: a pod may arrive before its
            // identity's key. Until then its address stays unknown rather than resolving to
            // a number no selector knows.
            if !identities.contains_key(&e.identity) {
                continue;
            }
            for ip in &e.ips {
                ips.insert(
                    *ip,
                    IpRecord {
                        ip: *ip,
                        identity: e.identity,
                        node: e.node.clone(),
                        node_ip: e.node_ip,
                        named_ports: e.named_ports.clone(),
                    },
                );
            }
        }
        Delivered {
            identities,
            nodes,
            ips,
        }
    }
}

/// What the manager was given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Delivered {
    /// Confirmed identities.
    pub identities: BTreeMap<Identity, LabelSet>,
    /// Other nodes.
    pub nodes: BTreeMap<String, NodeRecord>,
    /// Other nodes' pod addresses.
    pub ips: BTreeMap<IpAddr, IpRecord>,
}

impl Delivered {
    /// Hands `remote` what changes from `self` to `new`: identities and nodes first (an
    /// address never resolves to a number no policy knows, nor lies behind a missing route),
    /// then addresses, then what left.
    pub fn update(&mut self, new: Delivered, remote: &dyn Remote) {
        for (id, labels) in &new.identities {
            if self.identities.get(id) != Some(labels) {
                remote.identity_put(*id, labels.clone());
            }
        }
        for (name, node) in &new.nodes {
            if self.nodes.get(name) != Some(node) {
                remote.node_put(node);
            }
        }
        for (ip, old) in &self.ips {
            match new.ips.get(ip) {
                None => remote.ip_deleted(old),
                // Moved to another node: the old owner lets go first.
                Some(r) if r.node != old.node => remote.ip_deleted(old),
                Some(_) => {}
            }
        }
        for (ip, r) in &new.ips {
            if self.ips.get(ip) != Some(r) {
                remote.ip_put(r);
            }
        }
        for (name, node) in &self.nodes {
            if !new.nodes.contains_key(name) {
                remote.node_deleted(node);
            }
        }
        for id in self.identities.keys() {
            if !new.identities.contains_key(id) {
                remote.identity_deleted(*id);
            }
        }
        *self = new;
    }
}
