//! The selector cache: for every distinct peer selector in the repository, the identities it
//! currently matches, kept up to date incrementally as identities come and go (Cilium
//! `pkg/policy/selectorcache.go`).

use crate::identity::{IdentityAllocator, IdentityKey};
use crate::labels::{Label, LabelSet, source};
use crate::mapstate::{Identity, reserved};
use crate::repository::{RepoChange, Repository};
use crate::rule::{Entity, IdentityPorts, PeerSelector};
use ipnet::IpNet;
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

/// What the cache knows about one identity.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Known {
    /// Host, world, unmanaged: matched by entities or by selectors naming `reserved:` labels.
    Reserved(LabelSet),
    /// An endpoint identity.
    Labels(LabelSet),
    /// A CIDR identity.
    Cidr(IpNet),
}

/// Peer selector → matching identities; and the named ports of each identity's pods, which
/// egress rules' `port: name` resolve against (Cilium keeps them with the ipcache's metadata
/// of each address; here they are an input per identity, kept by the manager).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectorCache {
    universe: BTreeMap<Identity, Known>,
    entries: BTreeMap<PeerSelector, BTreeSet<Identity>>,
    world_labels: LabelSet,
    ports: BTreeMap<Identity, IdentityPorts>,
}

impl Default for SelectorCache {
    fn default() -> Self {
        Self::new()
    }
}

fn reserved_labels(name: &str) -> LabelSet {
    std::iter::once(Label::new(source::RESERVED, name, "")).collect()
}

impl SelectorCache {
    /// A cache that knows the reserved identities (host, world, unmanaged) and nothing else.
    #[must_use]
    pub fn new() -> Self {
        let universe = [
            (reserved::HOST, "host"),
            (reserved::WORLD, "world"),
            (reserved::UNMANAGED, "unmanaged"),
        ]
        .into_iter()
        .map(|(id, name)| (id, Known::Reserved(reserved_labels(name))))
        .collect();
        Self {
            universe,
            entries: BTreeMap::new(),
            world_labels: reserved_labels("world"),
            ports: BTreeMap::new(),
        }
    }

    /// A cache primed with every identity of `allocator` and every selector of `repo`.
    #[must_use]
    pub fn build(allocator: &IdentityAllocator, repo: &Repository) -> Self {
        let mut c = Self::new();
        for (id, key) in allocator.iter() {
            c.identity_added(id, key);
        }
        c.sync(repo);
        c
    }

    fn matches(&self, peer: &PeerSelector, id: Identity, known: &Known) -> bool {
        match (peer, known) {
            // As in Cilium, reserved identities are matched by their labels (`reserved:host`)
            // like any other; a CIDR identity carries `reserved:world`.
            (PeerSelector::Endpoints(s), Known::Labels(l) | Known::Reserved(l)) => s.matches(l),
            (PeerSelector::Endpoints(s), Known::Cidr(_)) => s.matches(&self.world_labels),
            (PeerSelector::Cidr(c), Known::Cidr(p)) => c.covers(p),
            // The ipcache maps 0.0.0.0/0 and ::/0 to world itself.
            (PeerSelector::Cidr(c), Known::Reserved(_)) => {
                id == reserved::WORLD && c.cidr.prefix_len() == 0
            }
            (PeerSelector::Cidr(_), Known::Labels(_)) => false,
            (PeerSelector::Entity(e), k) => match e {
                Entity::Host => id == reserved::HOST,
                Entity::World => id == reserved::WORLD || matches!(k, Known::Cidr(_)),
                // Cilium: host, remote nodes, init, health, unmanaged and every cluster endpoint.
                Entity::Cluster => {
                    matches!(k, Known::Labels(_))
                        || id == reserved::HOST
                        || id == reserved::UNMANAGED
                }
                // Resolved to the wildcard identity 0, never to a concrete identity.
                Entity::All => false,
            },
        }
    }

    /// Cilium turns the wildcard selector `{}` into an L3 wildcard (identity 0): it matches
    /// every identity, present and future, host and world included.
    #[must_use]
    pub fn is_wildcard(peer: &PeerSelector) -> bool {
        match peer {
            PeerSelector::Entity(Entity::All) => true,
            PeerSelector::Endpoints(s) => s.is_wildcard(),
            _ => false,
        }
    }

    fn compute(&self, peer: &PeerSelector) -> BTreeSet<Identity> {
        if Self::is_wildcard(peer) {
            return BTreeSet::from([reserved::ANY]);
        }
        self.universe
            .iter()
            .filter(|(id, k)| self.matches(peer, **id, k))
            .map(|(id, _)| *id)
            .collect()
    }

    /// Tracks exactly the selectors of `repo`; returns the newly tracked ones.
    pub fn sync(&mut self, repo: &Repository) -> BTreeSet<PeerSelector> {
        let wanted = repo.peer_selectors();
        self.entries.retain(|p, _| wanted.contains(p));
        let mut added = BTreeSet::new();
        for p in wanted {
            if !self.entries.contains_key(p) {
                let ids = self.compute(p);
                self.entries.insert(p.clone(), ids);
                added.insert(p.clone());
            }
        }
        added
    }

    /// [`Self::sync`] for a cache that tracked exactly the selectors of the repository before
    /// `change`: the added rules' selectors are tracked, the removed rules' ones dropped unless
    /// a remaining rule still uses them. A one-rule change costs that rule, not a walk and sort
    /// of every selector of the repository; a large removal takes the full [`Self::sync`].
    pub fn sync_change(
        &mut self,
        repo: &Repository,
        change: &RepoChange,
    ) -> BTreeSet<PeerSelector> {
        /// Above this many removed selectors one full sync is cheaper than a scan for each.
        const SCAN_LIMIT: usize = 16;
        let gone: Vec<&PeerSelector> = change
            .removed
            .iter()
            .flat_map(|r| r.peers())
            .filter(|p| self.entries.contains_key(*p))
            .collect();
        if gone.len() > SCAN_LIMIT {
            return self.sync(repo);
        }
        for p in gone {
            if !repo.rules().iter().flat_map(|r| r.peers()).any(|q| q == p) {
                self.entries.remove(p);
            }
        }
        let mut added = BTreeSet::new();
        for p in change.added.iter().flat_map(|r| r.peers()) {
            if !self.entries.contains_key(p) {
                let ids = self.compute(p);
                self.entries.insert(p.clone(), ids);
                added.insert(p.clone());
            }
        }
        added
    }

    /// Records a new identity; returns the tracked selectors whose identity set changed.
    pub fn identity_added(&mut self, id: Identity, key: &IdentityKey) -> BTreeSet<PeerSelector> {
        // Re-adding an id (e.g. after a restore) replaces what was known about it.
        let mut changed_before = self.identity_removed(id);
        let known = match key {
            IdentityKey::Labels(l) => Known::Labels(l.clone()),
            IdentityKey::Cidr(p) => Known::Cidr(*p),
        };
        let changed: Vec<PeerSelector> = self
            .entries
            .keys()
            .filter(|p| !Self::is_wildcard(p) && self.matches(p, id, &known))
            .cloned()
            .collect();
        self.universe.insert(id, known);
        for p in &changed {
            if let Some(entry) = self.entries.get_mut(p) {
                entry.insert(id);
            }
        }
        // A selector that lost and regained the id did not change.
        for p in changed {
            if !changed_before.remove(&p) {
                changed_before.insert(p);
            }
        }
        changed_before
    }

    /// Forgets an identity; returns the tracked selectors whose identity set changed.
    pub fn identity_removed(&mut self, id: Identity) -> BTreeSet<PeerSelector> {
        if self.universe.remove(&id).is_none() {
            return BTreeSet::new();
        }
        let mut changed = BTreeSet::new();
        for (p, ids) in &mut self.entries {
            if ids.remove(&id) {
                changed.insert(p.clone());
            }
        }
        changed
    }

    /// Identities a peer matches now. Untracked selectors are computed on the fly.
    #[must_use]
    pub fn identities(&self, peer: &PeerSelector) -> Cow<'_, BTreeSet<Identity>> {
        match self.entries.get(peer) {
            Some(ids) => Cow::Borrowed(ids),
            None => Cow::Owned(self.compute(peer)),
        }
    }

    /// Whether a peer matches one identity (used by trace).
    #[must_use]
    pub fn peer_matches(&self, peer: &PeerSelector, id: Identity) -> bool {
        if Self::is_wildcard(peer) {
            return true;
        }
        self.universe
            .get(&id)
            .is_some_and(|k| self.matches(peer, id, k))
    }

    /// Tracked selectors.
    pub fn selectors(&self) -> impl Iterator<Item = (&PeerSelector, &BTreeSet<Identity>)> {
        self.entries.iter()
    }

    /// Sets the named ports of identity `id`'s pods (empty: none). Returns the tracked
    /// selectors matching `id` when they changed: the entries of `id` in the policies of their
    /// users' endpoints may change (egress rules' names).
    pub fn set_named_ports(
        &mut self,
        id: Identity,
        ports: IdentityPorts,
    ) -> BTreeSet<PeerSelector> {
        let unchanged = self
            .ports
            .get(&id)
            .map_or(ports.is_empty(), |old| *old == ports);
        if unchanged {
            return BTreeSet::new();
        }
        if ports.is_empty() {
            self.ports.remove(&id);
        } else {
            self.ports.insert(id, ports);
        }
        self.entries
            .keys()
            .filter(|p| self.peer_matches(p, id))
            .cloned()
            .collect()
    }

    /// The named ports of identity `id`'s pods, if any.
    #[must_use]
    pub fn named_ports(&self, id: Identity) -> Option<&IdentityPorts> {
        self.ports.get(&id)
    }

    /// Every identity with named ports.
    #[must_use]
    pub fn all_named_ports(&self) -> &BTreeMap<Identity, IdentityPorts> {
        &self.ports
    }

    /// Labels of an endpoint identity, if known.
    #[must_use]
    pub fn labels_of(&self, id: Identity) -> Option<&LabelSet> {
        match self.universe.get(&id)? {
            Known::Labels(l) | Known::Reserved(l) => Some(l),
            Known::Cidr(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rule::{CidrSelector, Rule};
    use crate::selector::Selector;

    fn ep(app: &str) -> IdentityKey {
        IdentityKey::Labels(LabelSet::for_pod("default", [("app", app)]))
    }

    fn sel(app: &str) -> PeerSelector {
        let mut s = Selector::all();
        s.add_match("app", app);
        PeerSelector::Endpoints(s)
    }

    fn repo_with(peers: Vec<PeerSelector>) -> Repository {
        let mut r = Rule::new(Selector::all(), LabelSet::new());
        r.ingress.push(crate::rule::PeerRule::new(peers, vec![]));
        let mut repo = Repository::new();
        repo.add(vec![r]);
        repo
    }

    #[test]
    fn incremental_updates() {
        let cidr = PeerSelector::Cidr(CidrSelector {
            cidr: "10.0.0.0/8".parse().unwrap(),
            except: vec!["10.1.0.0/16".parse().unwrap()],
            match_pods: false,
        });
        let world = PeerSelector::Entity(Entity::World);
        let cluster = PeerSelector::Entity(Entity::Cluster);
        let repo = repo_with(vec![
            sel("web"),
            cidr.clone(),
            world.clone(),
            cluster.clone(),
        ]);
        let mut c = SelectorCache::new();
        assert_eq!(c.sync(&repo).len(), 4);
        assert_eq!(*c.identities(&world), BTreeSet::from([2]));
        assert_eq!(*c.identities(&cluster), BTreeSet::from([1, 3]));

        let ch = c.identity_added(256, &ep("web"));
        assert_eq!(ch, BTreeSet::from([sel("web"), cluster.clone()]));
        assert!(c.identity_added(257, &ep("db")).contains(&cluster));
        assert_eq!(*c.identities(&sel("web")), BTreeSet::from([256]));

        let inside = 1 << 24;
        let ch = c.identity_added(inside, &IdentityKey::Cidr("10.2.0.0/16".parse().unwrap()));
        assert_eq!(ch, BTreeSet::from([cidr.clone(), world.clone()]));
        let ch = c.identity_added(
            inside + 1,
            &IdentityKey::Cidr("10.1.0.0/16".parse().unwrap()),
        );
        assert_eq!(ch, BTreeSet::from([world.clone()]), "except carves it out");

        let ch = c.identity_removed(256);
        assert_eq!(ch, BTreeSet::from([sel("web"), cluster.clone()]));
        assert!(c.identities(&sel("web")).is_empty());
        assert!(c.identity_removed(9999).is_empty());
    }

    #[test]
    fn wildcard_and_reserved() {
        let mut c = SelectorCache::new();
        c.identity_added(256, &ep("web"));
        let all_eps = PeerSelector::Endpoints(Selector::all());
        assert_eq!(*c.identities(&all_eps), BTreeSet::from([0]));
        let mut not_db = Selector::all();
        not_db.add(crate::selector::Requirement::new(
            "app",
            crate::selector::Operator::NotIn(crate::sorted::Set::from(["db".to_owned()])),
        ));
        // Reserved identities have labels too, and match like any other (Cilium).
        assert_eq!(
            *c.identities(&PeerSelector::Endpoints(not_db)),
            BTreeSet::from([1, 2, 3, 256])
        );
        let mut host = Selector::all();
        host.add_match("reserved:host", "");
        assert_eq!(
            *c.identities(&PeerSelector::Endpoints(host)),
            BTreeSet::from([1])
        );
        assert_eq!(
            *c.identities(&PeerSelector::Entity(Entity::All)),
            BTreeSet::from([0])
        );
    }

    #[test]
    fn re_adding_an_identity_reports_only_real_changes() {
        let repo = repo_with(vec![sel("web"), sel("db")]);
        let mut c = SelectorCache::new();
        c.sync(&repo);
        c.identity_added(256, &ep("web"));
        assert!(c.identity_added(256, &ep("web")).is_empty());
        assert_eq!(
            c.identity_added(256, &ep("db")),
            BTreeSet::from([sel("web"), sel("db")])
        );
        assert!(c.identities(&sel("web")).is_empty());
    }

    #[test]
    fn sync_drops_unused() {
        let mut c = SelectorCache::new();
        c.sync(&repo_with(vec![sel("a")]));
        c.sync(&repo_with(vec![sel("b")]));
        assert_eq!(
            c.selectors().map(|(p, _)| p.clone()).collect::<Vec<_>>(),
            vec![sel("b")]
        );
    }
}
