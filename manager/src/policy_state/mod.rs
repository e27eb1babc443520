//! The manager's policy side: identities (persisted in sled so ids survive restarts), the rule
//! repository (persisted), the selector cache and the CIDR identities the rules reference.
//! Pure bookkeeping over `weft-policy`; the service decides what to regenerate and programs the
//! datapath.

use ipnet::IpNet;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use weft_policy::cidr::CidrReferences;
use weft_policy::compute::{ComputeOptions, compute_with_ports};
use weft_policy::identity::{IdentityAllocator, IdentityError, IdentityKey, IdentityStore};
use weft_policy::labels::LabelSet;
use weft_policy::mapstate::{EndpointPolicy, Identity};
use weft_policy::repository::{RepoChange, Repository};
use weft_policy::rule::NamedPorts;
use weft_policy::rule::{PeerSelector, Rule};
use weft_policy::selectorcache::SelectorCache;

use crate::store::Store;

mod error;
mod ports;
mod records;

pub use error::PolicyStateError;
use records::RuleRecords;

/// Whose named ports.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PortOwner {
    /// An endpoint of this node, by endpoint id.
    Local(u32),
    /// An endpoint address of another node (kvstore).
    Remote {
        /// The node publishing it.
        node: String,
        /// The address.
        ip: IpAddr,
    },
}

/// What an identity or repository change means for the datapath.
#[derive(Debug, Default)]
pub struct Effects {
    /// Peer selectors whose identity sets changed: regenerate endpoints that use them.
    pub changed: BTreeSet<PeerSelector>,
    /// The identities that entered or left those sets: only their entries change.
    pub identities: BTreeSet<Identity>,
    /// CIDR identities to insert into the ipcache.
    pub ipcache_add: Vec<(IpNet, Identity)>,
    /// CIDR prefixes to remove from the ipcache.
    pub ipcache_remove: Vec<IpNet>,
}

/// Identities, rules and the selector cache.
pub struct PolicyState {
    store: Store,
    alloc: IdentityAllocator,
    repo: Repository,
    cache: SelectorCache,
    cidrs: CidrReferences,
    options: ComputeOptions,
    records: RuleRecords,
    /// Label identities other nodes use (from the kvstore), by number.
    remote: BTreeMap<Identity, LabelSet>,
    /// Kvstore mode: label identities are numbered by the cluster, never locally.
    cluster_ids: bool,
    /// Remote identities restored from disk that no kvstore listing has confirmed yet.
    unconfirmed: BTreeSet<Identity>,
    /// How long a label identity outlives its last endpoint (0: freed with it).
    identity_grace_ms: u64,
    /// Named container ports of every endpoint the node knows, local and remote (egress
    /// rules' names resolve against their union per identity).
    ports: weft_policy::peerports::PeerPorts<PortOwner>,
}

/// Store meta key of the remote identities (kvstore mode): a restart with etcd unreachable
/// still selects remote pods by their labels.
const REMOTE_IDENTITIES: &str = "remote_identities";

impl PolicyState {
    /// Restores identities and rules from `store`. `endpoint_labels` are the label sets of the
    /// endpoints that still exist: each re-takes its reference, so their ids stay the same;
    /// identities nobody uses any more are released.
    pub fn restore<'a>(
        store: Store,
        endpoint_labels: impl IntoIterator<Item = &'a LabelSet>,
    ) -> Result<(Self, Effects), PolicyStateError> {
        Self::restore_with_grace(store, endpoint_labels, 0, 0)
    }

    /// [`Self::restore`] with an identity grace period ([`Self::set_identity_grace_ms`]): label
    /// identities no endpoint uses any more are kept idle from `now_ms` instead of released, so
    /// a restart changes no identity (and trusts the policy slots written for them).
    pub fn restore_with_grace<'a>(
        store: Store,
        endpoint_labels: impl IntoIterator<Item = &'a LabelSet>,
        grace_ms: u64,
        now_ms: u64,
    ) -> Result<(Self, Effects), PolicyStateError> {
        let mut alloc = IdentityAllocator::restore(store.load_identities()?)?;
        let (records, repo) = RuleRecords::load(&store)?;
        let mut ids = store.clone();
        for labels in endpoint_labels {
            alloc.acquire(&mut ids, &IdentityKey::Labels(labels.clone()))?;
        }
        let mut cache = SelectorCache::build(&alloc, &repo);
        let mut cidrs = CidrReferences::new();
        let sync = cidrs.sync(&repo.cidr_prefixes(), &mut alloc, &mut ids, &mut cache)?;
        if grace_ms > 0 {
            alloc.idle_unused_labels(now_ms);
        }
        for id in alloc.release_unused(&mut ids)? {
            cache.identity_removed(id);
        }
        let effects = Effects {
            changed: sync.changed,
            identities: sync.identities,
            ipcache_add: cidrs.held().iter().map(|(p, id)| (*p, *id)).collect(),
            ipcache_remove: Vec::new(),
        };
        Ok((
            Self {
                store,
                alloc,
                repo,
                cache,
                cidrs,
                options: ComputeOptions::default(),
                records,
                remote: BTreeMap::new(),
                cluster_ids: false,
                unconfirmed: BTreeSet::new(),
                identity_grace_ms: grace_ms,
                ports: weft_policy::peerports::PeerPorts::new(),
            },
            effects,
        ))
    }

    /// The store the policy state persists into.
    #[must_use]
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// A digest of everything a policy is computed from besides the endpoint's own labels and
    /// named ports: the repository revision, every identity this node allocated and every
    /// remote one, and the named ports of every identity's pods. Stable across builds (persisted by `crate::slots`): FNV-1a over JSON.
    /// The code that computes and encodes policy is not in it: each slot record carries its
    /// own versions of that (`crate::slots::Compiler`).
    #[must_use]
    pub fn inputs_digest(&self) -> u64 {
        let mut h = weft_api::fnv::Fnv64::new();
        h.feed(&self.repo.revision().to_le_bytes());
        for (id, key) in self.alloc.iter() {
            h.feed(&id.to_le_bytes());
            // Identity keys always encode; an empty encoding would only make trust less likely.
            h.feed(&serde_json::to_vec(key).unwrap_or_default());
        }
        h.feed(b"remote");
        for (id, labels) in &self.remote {
            h.feed(&id.to_le_bytes());
            h.feed(&serde_json::to_vec(&IdentityKey::Labels(labels.clone())).unwrap_or_default());
        }
        self.feed_ports(&mut h);
        h.finish()
    }

    /// The repository.
    #[must_use]
    pub fn repo(&self) -> &Repository {
        &self.repo
    }

    /// The selector cache.
    #[must_use]
    pub fn cache(&self) -> &SelectorCache {
        &self.cache
    }

    /// A selector cache built from scratch from the identities — this node's and the other
    /// nodes' it does not hold itself, as [`Self::remote_identity_added`] gives them to the
    /// live cache — and the repository (what the incrementally maintained one must equal;
    /// `weftctl map verify` compares against it).
    #[must_use]
    pub fn fresh_cache(&self) -> SelectorCache {
        let mut cache = SelectorCache::new();
        for (id, key) in self.alloc.iter() {
            cache.identity_added(id, key);
        }
        for (&id, labels) in &self.remote {
            if self.alloc.key_of(id).is_none() {
                cache.identity_added(id, &IdentityKey::Labels(labels.clone()));
            }
        }
        cache.sync(&self.repo);
        for (id, ports) in self.ports.unions() {
            cache.set_named_ports(id, ports);
        }
        cache
    }

    /// Options of the computation.
    #[must_use]
    pub fn options(&self) -> &ComputeOptions {
        &self.options
    }

    /// Every identity with what it stands for, and its reference count.
    pub fn identities(&self) -> impl Iterator<Item = (Identity, &IdentityKey, u64)> {
        self.alloc
            .iter()
            .map(|(id, key)| (id, key, self.alloc.refcount(id).unwrap_or(0)))
    }

    /// Switches to kvstore numbering: a label set this node does not know yet is acquired only
    /// with the number the cluster gave it ([`Self::acquire_as`]).
    /// Turning it on brings back the remote identities of the last run (persisted as they
    /// arrived), unconfirmed until the first kvstore listing ([`Self::drop_unconfirmed_remote`]).
    pub fn set_cluster_ids(&mut self, on: bool) {
        self.cluster_ids = on;
        if !on {
            return;
        }
        let saved: BTreeMap<Identity, LabelSet> = match self.store.get_meta(REMOTE_IDENTITIES) {
            Ok(saved) => saved.unwrap_or_default(),
            Err(e) => {
                tracing::warn!("remote identities of the last run unreadable, ignored: {e}");
                BTreeMap::new()
            }
        };
        for (id, labels) in saved {
            if self.remote.contains_key(&id) {
                continue;
            }
            // The caller regenerates everything after this (start-up).
            let _ = self.remote_identity_added(id, labels);
            self.unconfirmed.insert(id);
        }
    }

    /// The first kvstore listing is applied: restored remote identities it did not confirm
    /// were freed while this node was away.
    pub fn drop_unconfirmed_remote(&mut self) -> Effects {
        let mut effects = Effects::default();
        for id in std::mem::take(&mut self.unconfirmed) {
            let e = self.remote_identity_removed(id);
            effects.changed.extend(e.changed);
            effects.identities.extend(e.identities);
        }
        effects
    }

    fn persist_remote(&self) {
        if let Err(e) = self.store.put_meta(REMOTE_IDENTITIES, &self.remote) {
            tracing::warn!("persisting remote identities: {e}");
        }
    }

    /// The local number of `labels`, if this node holds it.
    #[must_use]
    pub fn local_id(&self, labels: &LabelSet) -> Option<Identity> {
        self.alloc.lookup(&IdentityKey::Labels(labels.clone()))
    }

    /// Takes a reference on the identity of `labels` (allocating and persisting it if new).
    pub fn acquire(&mut self, labels: &LabelSet) -> Result<(Identity, Effects), PolicyStateError> {
        if self.cluster_ids && self.local_id(labels).is_none() {
            return Err(PolicyStateError::NeedsCluster(labels.to_string()));
        }
        self.acquire_as(labels, None)
    }

    /// [`Self::acquire`] with the number the cluster chose (`Some`), or a local one (`None`).
    pub fn acquire_as(
        &mut self,
        labels: &LabelSet,
        cluster_id: Option<Identity>,
    ) -> Result<(Identity, Effects), PolicyStateError> {
        let key = IdentityKey::Labels(labels.clone());
        let mut ids = self.store.clone();
        let got = match cluster_id {
            Some(id) => self.alloc.acquire_as(&mut ids, &key, id)?,
            None => self.alloc.acquire(&mut ids, &key)?,
        };
        let mut effects = Effects::default();
        if got.new && self.remote.get(&got.id) != Some(labels) {
            effects.changed = self.cache.identity_added(got.id, &key);
            effects.identities.insert(got.id);
        }
        Ok((got.id, effects))
    }

    /// Keeps a label identity that loses its last endpoint for `ms` (idle: same number, still
    /// selected, still published to the kvstore) before freeing it; 0 frees it at once.
    pub fn set_identity_grace_ms(&mut self, ms: u64) {
        self.identity_grace_ms = ms;
    }

    /// See [`Self::set_identity_grace_ms`].
    #[must_use]
    pub fn identity_grace_ms(&self) -> u64 {
        self.identity_grace_ms
    }

    /// Drops a reference. With its last one a label identity becomes idle for the grace period
    /// (nothing changes for policy: a replacement pod with the same labels gets the same number
    /// back); without a grace period, and for CIDR identities, it is freed (and forgotten on
    /// disk) at once.
    pub fn release(&mut self, id: Identity) -> Result<Effects, PolicyStateError> {
        self.release_at(id, crate::sys::clock::now_ms())
    }

    /// [`Self::release`] at `now_ms`.
    pub fn release_at(&mut self, id: Identity, now_ms: u64) -> Result<Effects, PolicyStateError> {
        let labels = matches!(self.alloc.key_of(id), Some(IdentityKey::Labels(_)));
        if self.identity_grace_ms > 0 && labels {
            return match self.alloc.release_to_idle(id, now_ms) {
                Ok(_) | Err(IdentityError::NotAllocated(_)) => Ok(Effects::default()),
                Err(e) => Err(e.into()),
            };
        }
        let mut ids = self.store.clone();
        match self.alloc.release(&mut ids, id) {
            Ok(true) => Ok(self.forgotten(id)),
            Ok(false) | Err(IdentityError::NotAllocated(_)) => Ok(Effects::default()),
            Err(e) => Err(e.into()),
        }
    }

    /// Frees the label identities idle for the whole grace period at `now_ms` (housekeeping).
    pub fn collect_idle_identities(&mut self, now_ms: u64) -> Result<Effects, PolicyStateError> {
        let mut ids = self.store.clone();
        let mut effects = Effects::default();
        for id in self
            .alloc
            .collect_idle(&mut ids, now_ms, self.identity_grace_ms)?
        {
            let e = self.forgotten(id);
            effects.changed.extend(e.changed);
            effects.identities.extend(e.identities);
        }
        Ok(effects)
    }

    /// What the selector cache loses with a freed local identity.
    fn forgotten(&mut self, id: Identity) -> Effects {
        let mut effects = Effects::default();
        if !self.remote.contains_key(&id) {
            // (A remote one stays: other nodes still use it.)
            effects.changed = self.cache.identity_removed(id);
            effects.identities.insert(id);
        }
        effects
    }

    /// A label identity other nodes use (kvstore): the selector cache learns it, so local
    /// rules select remote pods by their labels.
    pub fn remote_identity_added(&mut self, id: Identity, labels: LabelSet) -> Effects {
        let mut effects = Effects::default();
        self.unconfirmed.remove(&id);
        if self.remote.get(&id) == Some(&labels) {
            return effects;
        }
        let key = IdentityKey::Labels(labels.clone());
        self.remote.insert(id, labels);
        self.persist_remote();
        if let Some(local) = self.alloc.key_of(id) {
            if *local != key {
                tracing::error!(
                    identity = id,
                    "the kvstore has other labels for a number this node uses"
                );
            }
            return effects;
        }
        effects.changed = self.cache.identity_added(id, &key);
        effects.identities.insert(id);
        effects
    }

    /// A remote identity was freed in the cluster.
    pub fn remote_identity_removed(&mut self, id: Identity) -> Effects {
        let mut effects = Effects::default();
        self.unconfirmed.remove(&id);
        if self.remote.remove(&id).is_none() {
            return effects;
        }
        self.persist_remote();
        if self.alloc.key_of(id).is_some() {
            return effects;
        }
        effects.changed = self.cache.identity_removed(id);
        effects.identities.insert(id);
        effects
    }

    /// Whether `id` is known from the kvstore.
    #[must_use]
    pub fn is_remote(&self, id: Identity) -> bool {
        self.remote.contains_key(&id)
    }

    /// Identities only other nodes use (not held here).
    pub fn remote_only(&self) -> impl Iterator<Item = (Identity, &LabelSet)> {
        self.remote
            .iter()
            .filter(|(id, _)| self.alloc.key_of(**id).is_none())
            .map(|(id, l)| (*id, l))
    }

    /// Label identities this node holds references on, idle ones included, for publishing:
    /// the cluster keeps an idle number for this node, so a pod coming back with the same
    /// labels never finds it freed or given to other labels meanwhile.
    pub fn held_labels(&self) -> impl Iterator<Item = (Identity, &LabelSet)> {
        self.alloc.iter().filter_map(|(id, key)| match key {
            IdentityKey::Labels(l)
                if self.alloc.refcount(id).unwrap_or(0) > 0 || self.alloc.is_idle(id) =>
            {
                Some((id, l))
            }
            _ => None,
        })
    }

    /// What a local identity (label set or CIDR) stands for; `None` once freed.
    #[must_use]
    pub fn identity_key(&self, id: Identity) -> Option<&IdentityKey> {
        self.alloc.key_of(id)
    }

    /// Whether `id` is a label identity kept without endpoints for the grace period.
    #[must_use]
    pub fn is_idle(&self, id: Identity) -> bool {
        self.alloc.is_idle(id)
    }

    /// Adds rules (same labels replace) and persists the repository.
    pub fn add_rules(
        &mut self,
        rules: Vec<Rule>,
    ) -> Result<(RepoChange, Effects), PolicyStateError> {
        let change = self.repo.add(rules);
        self.after_repo_change(change)
    }

    /// Adds an imported file's rules as [`weft_policy::parse::memo::ParseMemo`] gave them:
    /// rules seen before are taken from the repository, not parsed or compared again.
    pub fn add_pieces(
        &mut self,
        pieces: Vec<weft_policy::parse::memo::Piece<'_>>,
    ) -> Result<(RepoChange, Effects), PolicyStateError> {
        let incoming = weft_policy::parse::memo::incoming(pieces, &self.repo)
            .map_err(PolicyStateError::Reparse)?;
        let change = self.repo.add_reusing(incoming);
        self.after_repo_change(change)
    }

    /// Deletes rules whose labels contain `filter` (all rules for an empty filter + `all`).
    pub fn delete_rules(
        &mut self,
        filter: &[weft_policy::labels::Label],
        all: bool,
    ) -> Result<(RepoChange, Effects), PolicyStateError> {
        let change = if all {
            self.repo.delete_all()
        } else {
            self.repo.delete(filter)
        };
        self.after_repo_change(change)
    }

    fn after_repo_change(
        &mut self,
        change: RepoChange,
    ) -> Result<(RepoChange, Effects), PolicyStateError> {
        let mut effects = Effects::default();
        // Also when every rule was replaced by an identical one: the revision moved and must
        // survive a restart.
        self.records.persist(&self.store, &change, &self.repo)?;
        if change.is_empty() {
            return Ok((change, effects));
        }
        self.cache.sync_change(&self.repo, &change);
        let mut ids = self.store.clone();
        let sync = self.cidrs.sync(
            &self.repo.cidr_prefixes(),
            &mut self.alloc,
            &mut ids,
            &mut self.cache,
        )?;
        effects.changed = sync.changed;
        effects.identities = sync.identities;
        effects.ipcache_add = sync.added;
        effects.ipcache_remove = sync.released.into_iter().map(|(p, _)| p).collect();
        Ok((change, effects))
    }

    /// The policy an endpoint with `labels` must enforce now.
    #[must_use]
    pub fn compute(&self, labels: &LabelSet, named: &NamedPorts) -> EndpointPolicy {
        compute_with_ports(labels, named, &self.repo, &self.cache, &self.options)
    }

    /// CIDR identities currently referenced (for the ipcache at start).
    #[must_use]
    pub fn cidr_identities(&self) -> BTreeMap<IpNet, Identity> {
        self.cidrs.held().clone()
    }
}

impl IdentityStore for Store {
    fn save(
        &mut self,
        id: Identity,
        key: &IdentityKey,
    ) -> Result<(), weft_policy::identity::StoreError> {
        self.put_identity(id, key)
            .map_err(|e| weft_policy::identity::StoreError(e.to_string()))
    }

    fn remove(&mut self, id: Identity) -> Result<(), weft_policy::identity::StoreError> {
        self.remove_identity(id)
            .map_err(|e| weft_policy::identity::StoreError(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::records::LEGACY_REPO_KEY;
    use super::*;

    fn labels(app: &str) -> LabelSet {
        LabelSet::for_pod("default", [("app", app)])
    }

    /// One rule: app=db admits app=web.
    fn db_from_web() -> Vec<Rule> {
        weft_policy::parse::parse_policy_file(
            "t.json",
            r#"[{"labels":[{"key":"name","value":"r"}],"endpointSelector":{"matchLabels":{"app":"db"}},
                "ingress":[{"fromEndpoints":[{"matchLabels":{"app":"web"}}]}]}]"#,
        )
        .unwrap()
    }

    #[test]
    fn identities_survive_a_restart_with_the_same_ids() {
        let store = Store::temporary().unwrap();
        let (mut st, _) = PolicyState::restore(store.clone(), []).unwrap();
        let (a, _) = st.acquire(&labels("a")).unwrap();
        let (b, _) = st.acquire(&labels("b")).unwrap();
        assert!(a >= 256 && b >= 256 && a != b);
        drop(st);
        let la = labels("a");
        let (st, _) = PolicyState::restore(store.clone(), [&la]).unwrap();
        let ids: Vec<_> = st.identities().map(|(id, _, refs)| (id, refs)).collect();
        assert_eq!(ids, vec![(a, 1)], "b had no endpoint left and was released");
        assert_eq!(store.load_identities().unwrap().len(), 1);
    }

    #[test]
    fn a_released_identity_stays_idle_for_the_grace_period_then_leaves_the_selectors() {
        let store = Store::temporary().unwrap();
        let (mut st, _) = PolicyState::restore(store.clone(), []).unwrap();
        st.set_identity_grace_ms(60_000);
        st.add_rules(db_from_web()).unwrap();
        st.acquire(&labels("db")).unwrap();
        let (web, added) = st.acquire(&labels("web")).unwrap();
        assert!(!added.changed.is_empty(), "db's selector gained web");
        let released = st.release_at(web, 10_000).unwrap();
        assert!(released.changed.is_empty() && released.identities.is_empty());
        assert!(st.is_idle(web));
        assert_eq!(
            st.held_labels()
                .map(|(id, _)| id)
                .filter(|id| *id == web)
                .count(),
            1,
            "an idle identity stays published"
        );
        // The replacement pod gets the same number, and nobody is regenerated.
        let (again, effects) = st.acquire(&labels("web")).unwrap();
        assert_eq!(again, web);
        assert!(effects.changed.is_empty());
        st.release_at(web, 20_000).unwrap();
        assert!(
            st.collect_idle_identities(79_999)
                .unwrap()
                .changed
                .is_empty()
        );
        let gone = st.collect_idle_identities(80_000).unwrap();
        assert!(!gone.changed.is_empty(), "db's selector loses web");
        assert!(gone.identities.contains(&web));
        assert!(st.local_id(&labels("web")).is_none());
        assert_eq!(store.load_identities().unwrap().len(), 1, "only db on disk");
        // Without a grace period the last release frees at once.
        st.set_identity_grace_ms(0);
        let (web2, _) = st.acquire(&labels("web")).unwrap();
        assert!(!st.release_at(web2, 90_000).unwrap().changed.is_empty());
        assert!(st.local_id(&labels("web")).is_none());
    }

    #[test]
    fn remote_identities_enter_the_selector_cache_and_survive_local_release() {
        let store = Store::temporary().unwrap();
        let (mut st, _) = PolicyState::restore(store, []).unwrap();
        st.set_cluster_ids(true);
        assert!(matches!(
            st.acquire(&labels("web")),
            Err(PolicyStateError::NeedsCluster(_))
        ));
        st.add_rules(db_from_web()).unwrap();
        let e = st.remote_identity_added(300, labels("web"));
        assert_eq!(e.identities, [300].into());
        assert!(
            !e.changed.is_empty(),
            "the fromEndpoints selector gained the remote pod"
        );
        assert!(
            st.remote_identity_added(300, labels("web"))
                .changed
                .is_empty(),
            "idempotent"
        );
        let (id, e) = st.acquire_as(&labels("web"), Some(300)).unwrap();
        assert_eq!(id, 300);
        assert!(e.changed.is_empty(), "already selected");
        assert!(
            st.release(300).unwrap().changed.is_empty(),
            "still used remotely"
        );
        assert!(!st.remote_identity_removed(300).changed.is_empty());
    }

    #[test]
    fn remote_identities_survive_a_restart_until_a_listing_says_otherwise() {
        let store = Store::temporary().unwrap();
        let (mut st, _) = PolicyState::restore(store.clone(), []).unwrap();
        st.set_cluster_ids(true);
        st.remote_identity_added(300, labels("web"));
        st.remote_identity_added(301, labels("db"));
        drop(st);
        let (mut st, _) = PolicyState::restore(store.clone(), []).unwrap();
        assert!(!st.is_remote(300), "single-node mode ignores them");
        st.set_cluster_ids(true);
        assert!(st.is_remote(300) && st.is_remote(301));
        let rules = weft_policy::parse::parse_policy_file(
            "t.json",
            r#"[{"labels":[{"key":"name","value":"r"}],"endpointSelector":{"matchLabels":{"app":"x"}},
                "ingress":[{"fromEndpoints":[{"matchLabels":{"app":"db"}}]}]}]"#,
        )
        .unwrap();
        st.add_rules(rules).unwrap();
        // The listing has web again but db was freed meanwhile.
        assert!(
            st.remote_identity_added(300, labels("web"))
                .changed
                .is_empty()
        );
        let e = st.drop_unconfirmed_remote();
        assert_eq!(e.identities, [301].into());
        assert!(!e.changed.is_empty(), "the db selector lost it");
        assert!(st.drop_unconfirmed_remote().identities.is_empty());
        drop(st);
        let (mut st, _) = PolicyState::restore(store, []).unwrap();
        st.set_cluster_ids(true);
        assert!(st.is_remote(300) && !st.is_remote(301));
    }

    #[test]
    fn rules_persist_and_revision_moves() {
        let store = Store::temporary().unwrap();
        let (mut st, _) = PolicyState::restore(store.clone(), []).unwrap();
        let rules = weft_policy::parse::parse_policy_file(
            "t.json",
            r#"[{"labels":[{"key":"name","value":"r"}],"endpointSelector":{"matchLabels":{"app":"a"}},
                "egress":[{"toCIDR":["192.0.2.0/24"]}]}]"#,
        )
        .unwrap();
        let (change, effects) = st.add_rules(rules).unwrap();
        assert_eq!(change.revision, st.repo().revision());
        assert_eq!(effects.ipcache_add.len(), 1, "the CIDR got an identity");
        let (st2, eff2) = PolicyState::restore(store, []).unwrap();
        assert_eq!(st2.repo().revision(), change.revision);
        assert_eq!(
            eff2.ipcache_add, effects.ipcache_add,
            "same CIDR identity after restart"
        );
        assert!(
            st2.compute(&labels("a"), &NamedPorts::new())
                .egress_enforced
        );
    }

    #[test]
    fn each_rule_is_its_own_record_and_the_single_record_format_is_migrated() {
        let parse = |port: &str| {
            weft_policy::parse::parse_policy_file(
                "t.json",
                &format!(
                    r#"[{{"labels":[{{"key":"name","value":"a"}}],"endpointSelector":{{"matchLabels":{{"app":"a"}}}},"ingress":[{{}}]}},
                        {{"labels":[{{"key":"name","value":"b"}}],"endpointSelector":{{"matchLabels":{{"app":"b"}}}},
                          "ingress":[{{"toPorts":[{{"ports":[{{"port":"{port}","protocol":"TCP"}}]}}]}}]}}]"#
                ),
            )
            .unwrap()
        };
        let store = Store::temporary().unwrap();
        let mut legacy = Repository::new();
        legacy.add(parse("80"));
        store.put_meta(LEGACY_REPO_KEY, &legacy).unwrap();

        let (mut st, _) = PolicyState::restore(store.clone(), []).unwrap();
        assert_eq!(st.repo(), &legacy);
        assert!(
            store
                .get_meta::<Repository>(LEGACY_REPO_KEY)
                .unwrap()
                .is_none()
        );
        let stored = store.load_rules().unwrap().unwrap();
        assert_eq!(stored.rules.iter().map(|r| r.0).collect::<Vec<_>>(), [0, 1]);

        st.add_rules(parse("81")).unwrap();
        let stored = store.load_rules().unwrap().unwrap();
        assert_eq!(stored.revision, st.repo().revision());
        assert_eq!(
            stored.rules.iter().map(|r| r.0).collect::<Vec<_>>(),
            [0, 2],
            "the unchanged rule kept its record, the changed one got a new one"
        );
        let (again, _) = PolicyState::restore(store, []).unwrap();
        assert_eq!(
            again.repo(),
            st.repo(),
            "same rules, same order, same revision"
        );
    }

    #[test]
    fn records_that_lost_track_of_a_rule_are_rewritten_whole() {
        let store = Store::temporary().unwrap();
        let (mut st, _) = PolicyState::restore(store.clone(), []).unwrap();
        let rules = weft_policy::parse::parse_policy_file(
            "t.json",
            r#"[{"labels":[{"key":"name","value":"a"}],"endpointSelector":{},"ingress":[{}]},
                {"labels":[{"key":"name","value":"b"}],"endpointSelector":{},"egress":[{}]}]"#,
        )
        .unwrap();
        st.add_rules(rules).unwrap();
        st.records = RuleRecords::default(); // diverged from the store
        st.delete_rules(
            &[weft_policy::labels::Label::parse_filter("name=a").unwrap()],
            false,
        )
        .unwrap();
        let (again, _) = PolicyState::restore(store, []).unwrap();
        assert_eq!(
            again.repo(),
            st.repo(),
            "exactly rule b, at the same revision"
        );
    }
}
