//! A small world of endpoints, identities and CIDRs driven the way the manager drives the
//! engine: parse → repository → CIDR identities → selector cache → compute.

use ipnet::IpNet;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use weft_policy::cidr::{CidrReferences, CidrSync};
use weft_policy::compute::{ComputeOptions, compute, compute_identities, has_wildcard_peer};
use weft_policy::identity::{IdentityAllocator, IdentityKey, MemoryStore};
use weft_policy::labels::LabelSet;
use weft_policy::mapstate::{Direction, EndpointPolicy, Identity, PolicyEntry, Verdict, reserved};
use weft_policy::parse::parse_policy_file;
use weft_policy::repository::Repository;
use weft_policy::rule::Rule;
use weft_policy::selectorcache::SelectorCache;
use weft_policy::trace::{DirectionTrace, Trace, TracePeer, trace};

pub struct World {
    pub alloc: IdentityAllocator,
    pub store: MemoryStore,
    pub cache: SelectorCache,
    pub repo: Repository,
    pub eps: BTreeMap<String, (Identity, LabelSet)>,
    pub opts: ComputeOptions,
    pub cidrs: CidrReferences,
}

/// (name, namespace, labels) of a test endpoint.
type EndpointSpec = (
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
);

/// Endpoints every test starts with.
pub const ENDPOINTS: &[EndpointSpec] = &[
    ("web", "default", &[("app", "web")]),
    ("db", "default", &[("app", "db"), ("tier", "backend")]),
    ("client", "default", &[("app", "client")]),
    ("prod-client", "prod", &[("app", "client")]),
    ("prom", "monitoring", &[("app", "prom")]),
];

impl World {
    pub fn new() -> Self {
        let mut w = Self {
            alloc: IdentityAllocator::new(),
            store: MemoryStore::default(),
            cache: SelectorCache::new(),
            repo: Repository::new(),
            eps: BTreeMap::new(),
            opts: ComputeOptions::default(),
            cidrs: CidrReferences::new(),
        };
        for (name, ns, labels) in ENDPOINTS {
            w.add_endpoint(name, LabelSet::for_pod(ns, labels.iter().copied()));
        }
        w
    }

    pub fn add_endpoint(&mut self, name: &str, labels: LabelSet) {
        let a = self
            .alloc
            .acquire(&mut self.store, &IdentityKey::Labels(labels.clone()))
            .unwrap();
        if a.new {
            self.cache
                .identity_added(a.id, &IdentityKey::Labels(labels.clone()));
        }
        self.eps.insert(name.to_owned(), (a.id, labels));
    }

    pub fn remove_endpoint(&mut self, name: &str) {
        let (id, _) = self.eps.remove(name).unwrap();
        if self.alloc.release(&mut self.store, id).unwrap() {
            self.cache.identity_removed(id);
        }
    }

    pub fn import(&mut self, text: &str) {
        let rules = parse_policy_file("test", text).unwrap_or_else(|e| panic!("{e}"));
        self.repo.add(rules);
        self.sync_cidrs();
        self.cache.sync(&self.repo);
    }

    /// Gives every prefix the repository uses a CIDR identity and frees unused ones (the
    /// manager's job after each import or delete).
    pub fn sync_cidrs(&mut self) -> CidrSync {
        let wanted = self.repo.cidr_prefixes();
        self.cidrs
            .sync(&wanted, &mut self.alloc, &mut self.store, &mut self.cache)
            .unwrap()
    }

    /// What the ipcache would say for an address: the longest CIDR identity prefix, else world.
    pub fn ip(&self, addr: &str) -> Identity {
        let a: IpAddr = addr.parse().unwrap();
        self.alloc
            .cidr_identities()
            .filter(|(p, _)| p.contains(&a))
            .max_by_key(|(p, _): &(IpNet, Identity)| p.prefix_len())
            .map_or(reserved::WORLD, |(_, id)| id)
    }

    /// A peer given as `ep:NAME`, `ip:ADDR`, `host` or `world`.
    pub fn peer(&self, spec: &str) -> (Identity, Option<&LabelSet>) {
        if let Some(name) = spec.strip_prefix("ep:") {
            let (id, l) = &self.eps[name];
            return (*id, Some(l));
        }
        if let Some(addr) = spec.strip_prefix("ip:") {
            return (self.ip(addr), None);
        }
        match spec {
            "host" => (reserved::HOST, None),
            "world" => (reserved::WORLD, None),
            other => panic!("bad peer {other}"),
        }
    }

    /// The full policy, cross-checked against the per-identity computation the manager uses
    /// when only some identities changed: for every identity, from only the rules that can
    /// matter for it, the same entries.
    pub fn policy(&self, ep: &str) -> EndpointPolicy {
        let labels = &self.eps[ep].1;
        let full = compute(labels, &self.repo, &self.cache, &self.opts);
        let selecting: Vec<&Rule> = self.repo.selecting(labels).collect();
        for (id, _) in self.alloc.iter() {
            let relevant: Vec<&Rule> = selecting
                .iter()
                .copied()
                .filter(|r| {
                    has_wildcard_peer(r) || r.peers().any(|p| self.cache.peer_matches(p, id))
                })
                .collect();
            let slice = compute_identities(
                &relevant,
                &weft_policy::rule::NamedPorts::new(),
                &self.cache,
                &self.opts,
                &BTreeSet::from([id]),
            )
            .expect("not a reserved identity");
            let want: BTreeMap<PolicyEntry, Verdict> = full
                .entries
                .iter()
                .filter(|(e, _)| e.identity == id)
                .map(|(e, v)| (*e, *v))
                .collect();
            assert_eq!(slice, want, "entries of identity {id} for {ep}");
        }
        full
    }

    /// The map's verdict, cross-checked against trace and the deny invariant.
    pub fn verdict(&self, ep: &str, dir: Direction, peer: &str, proto: u8, port: u16) -> Verdict {
        let pol = self.policy(ep);
        assert!(
            pol.deny_shadowing_violations().is_empty(),
            "deny invariant broken: {:?}",
            pol.deny_shadowing_violations()
        );
        let (pid, _) = self.peer(peer);
        let map = pol.lookup(dir, pid, proto, port);
        let t = self.trace_dir(ep, dir, peer, proto, port);
        assert_eq!(
            t.verdict, map,
            "trace disagrees with the map for {ep} {dir:?} {peer}: {t:?}"
        );
        map
    }

    /// The verdict `ep` gives a flow with the pod `peer` at address `addr`, as the datapath
    /// decides it: the peer's identity first, and when that decided nothing the by-IP twin of
    /// the CIDR identity the address lies in (a Kubernetes ipBlock), cross-checked against
    /// trace given the same `cidr_identity`.
    pub fn verdict_by_ip(
        &self,
        ep: &str,
        dir: Direction,
        (peer, addr): (&str, &str),
        proto: u8,
        port: u16,
    ) -> Verdict {
        let cidr = match self.ip(addr) {
            reserved::WORLD => 0,
            id => id,
        };
        self.judged(&self.policy(ep), ep, dir, (peer, cidr), (proto, port))
            .0
    }

    /// `pol` (`ep`'s computed policy)'s verdict for the flow with `peer` whose address lies in
    /// the CIDR identity `cidr` (0: none), the datapath's decision
    /// ([`EndpointPolicy::lookup_peer`]: tiers, then the peer's identity, then its by-IP twin),
    /// cross-checked against trace given the same `cidr_identity`; with trace's side of it.
    pub fn judged(
        &self,
        pol: &EndpointPolicy,
        ep: &str,
        dir: Direction,
        (peer, cidr): (&str, Identity),
        (proto, port): (u8, u16),
    ) -> (Verdict, DirectionTrace) {
        let (pid, _) = self.peer(peer);
        let map = pol.lookup_peer(dir, (pid, cidr), proto, port);
        let (eid, el) = &self.eps[ep];
        let me = TracePeer {
            identity: *eid,
            labels: Some(el),
            named_ports: None,
            cidr_identity: 0,
        };
        let other = TracePeer {
            identity: pid,
            labels: None,
            named_ports: None,
            cidr_identity: cidr,
        };
        let t = match dir {
            Direction::Ingress => {
                trace(&self.repo, &self.cache, other, me, proto, port, &self.opts)
            }
            Direction::Egress => trace(&self.repo, &self.cache, me, other, proto, port, &self.opts),
        };
        let side = match dir {
            Direction::Ingress => t.ingress,
            Direction::Egress => t.egress,
        }
        .expect("the endpoint's side is traced");
        assert_eq!(
            side.verdict, map,
            "trace disagrees with the map for {ep} {dir:?} {peer} {proto}/{port}: {side:?}"
        );
        (map, side)
    }

    /// Trace of only `ep`'s side of the flow.
    pub fn trace_dir(&self, ep: &str, dir: Direction, peer: &str, proto: u8, port: u16) -> Trace {
        let (eid, el) = &self.eps[ep];
        let me = TracePeer {
            identity: *eid,
            labels: Some(el),
            named_ports: None,
            cidr_identity: 0,
        };
        let other = TracePeer {
            identity: self.peer(peer).0,
            labels: None,
            named_ports: None,
            cidr_identity: 0,
        };
        match dir {
            Direction::Ingress => {
                trace(&self.repo, &self.cache, other, me, proto, port, &self.opts)
            }
            Direction::Egress => trace(&self.repo, &self.cache, me, other, proto, port, &self.opts),
        }
    }
}
