//! The ipcache's owners: who wants each prefix, and what the kernel map must show for it.
//!
//! Several sources can want the same prefix at once: a local endpoint's `/32`, a remote node's
//! endpoint (from the cluster store), a CIDR rule's `/32`, the node's router address. The map
//! has room for one identity per prefix, so it holds the winner by a fixed precedence (as
//! Cilium's ipcache does with its resource sources); removing one source restores the next
//! and never deletes a prefix another source still wants. Writing to the map straight from
//! each source lets the last writer win and the first remover erase someone else's entry
//! (issue #13: releasing a `/32` CIDR identity erased a pod's own entry).
//!
//! An endpoint's entry also carries the identity of the longest CIDR-rule prefix containing
//! its address (`cidr_identity`): Kubernetes `ipBlock` peers match pods by IP, and the
//! datapath needs that identity to tell whether a pod's address lies in such a block
//! (docs/POLICY.md, "ipBlock and pod IPs").
//!
//! Pure bookkeeping: sources change owners, then [`Ipcache::pending`] gives the map writes that
//! make the kernel show the desired state, computed as a diff against what was last written.

use ipnet::IpNet;
use std::collections::BTreeMap;
use weft_policy::mapstate::Identity;

/// The node name of [`Source::restored_remote`]: empty, which no real node name can be
/// (`kvstore::keys::check_node_name`).
pub const RESTORED_REMOTE: &str = "";

/// A source of ipcache entries, in precedence order: earlier variants win.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Source {
    /// The node itself: router IPs (`host`) and the `world` defaults.
    Node,
    /// An endpoint of this node, by endpoint id.
    LocalEndpoint(u32),
    /// An endpoint of another node, by node name (cluster store).
    RemoteEndpoint(String),
    /// A CIDR identity referenced by the policy repository.
    Cidr,
}

impl Source {
    /// Kvstore mode, restart before the first listing: a host entry of the kernel map that no
    /// source claims, kept as a remote endpoint's (of node [`RESTORED_REMOTE`]) until the
    /// listing says whose it is.
    #[must_use]
    pub fn restored_remote() -> Self {
        Self::RemoteEndpoint(RESTORED_REMOTE.to_owned())
    }

    fn is_endpoint(&self) -> bool {
        matches!(self, Self::LocalEndpoint(_) | Self::RemoteEndpoint(_))
    }
}

/// What the kernel map holds for a prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Value {
    /// The winner's identity.
    pub identity: Identity,
    /// For an endpoint's address: the identity of the longest CIDR-rule prefix containing it
    /// (0 when none).
    pub cidr_identity: Identity,
}

/// A map write that brings the kernel closer to the desired state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// Map the prefix to this value.
    Upsert(IpNet, Value),
    /// No source wants the prefix any more.
    Remove(IpNet),
}

/// Every prefix's owners, and what was last written to the kernel.
#[derive(Debug, Clone, Default)]
pub struct Ipcache {
    owners: BTreeMap<IpNet, BTreeMap<Source, Identity>>,
    written: BTreeMap<IpNet, Value>,
}

impl Ipcache {
    /// No owners, nothing written.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// `source` wants `prefix` mapped to `identity` (replacing what it wanted before).
    pub fn set(&mut self, prefix: IpNet, source: Source, identity: Identity) {
        self.owners
            .entry(prefix.trunc())
            .or_default()
            .insert(source, identity);
    }

    /// `source` no longer wants `prefix` (a prefix it does not own is fine).
    pub fn unset(&mut self, prefix: IpNet, source: &Source) {
        let prefix = prefix.trunc();
        if let Some(owners) = self.owners.get_mut(&prefix) {
            owners.remove(source);
            if owners.is_empty() {
                self.owners.remove(&prefix);
            }
        }
    }

    /// Makes `source` own exactly `wanted` (prefix → identity). Used for a whole remote node
    /// or the CIDR set.
    pub fn replace_source(&mut self, source: &Source, wanted: &BTreeMap<IpNet, Identity>) {
        let held: Vec<IpNet> = self
            .owners
            .iter()
            .filter(|(p, o)| o.contains_key(source) && !wanted.contains_key(p))
            .map(|(p, _)| *p)
            .collect();
        for p in held {
            self.unset(p, source);
        }
        for (p, id) in wanted {
            self.set(*p, source.clone(), *id);
        }
    }

    /// Every prefix `source` owns, with the identity it wants.
    pub fn owned_by<'a>(
        &'a self,
        source: &'a Source,
    ) -> impl Iterator<Item = (IpNet, Identity)> + 'a {
        self.owners
            .iter()
            .filter_map(move |(p, o)| o.get(source).map(|id| (*p, *id)))
    }

    /// Every (prefix, owner, identity).
    pub fn all_owners(&self) -> impl Iterator<Item = (IpNet, &Source, Identity)> + '_ {
        self.owners
            .iter()
            .flat_map(|(p, o)| o.iter().map(move |(s, id)| (*p, s, *id)))
    }

    /// What the kernel map must hold.
    #[must_use]
    pub fn desired(&self) -> BTreeMap<IpNet, Value> {
        self.owners
            .keys()
            .filter_map(|p| self.value(p).map(|v| (*p, v)))
            .collect()
    }

    /// The writes that turn what was written into [`Self::desired`]: upserts first (new and
    /// changed prefixes), removals last, so an address never falls back to a shorter prefix
    /// while its replacement is on its way. Records them as written: the caller applies them
    /// all or calls [`Self::forget_written`] on failure.
    pub fn pending(&mut self) -> Vec<Write> {
        let desired = self.desired();
        let mut writes: Vec<Write> = desired
            .iter()
            .filter(|(p, v)| self.written.get(p) != Some(v))
            .map(|(p, v)| Write::Upsert(*p, *v))
            .collect();
        writes.extend(
            self.written
                .keys()
                .filter(|p| !desired.contains_key(p))
                .map(|p| Write::Remove(*p)),
        );
        self.written = desired;
        writes
    }

    /// What the kernel holds, as read back (restart): the next [`Self::pending`] diffs against
    /// it, so stale entries are removed and wrong ones rewritten.
    pub fn set_written(&mut self, kernel: BTreeMap<IpNet, Value>) {
        self.written = kernel;
    }

    /// A write failed half-way: the kernel state is unknown, so the next [`Self::pending`]
    /// rewrites every desired prefix (in-place upserts; nothing is deleted first).
    pub fn forget_written(&mut self) {
        self.written.clear();
    }

    /// The winning source and its identity for exactly this prefix.
    #[must_use]
    pub fn winner(&self, prefix: &IpNet) -> Option<(&Source, Identity)> {
        self.owners
            .get(&prefix.trunc())
            .and_then(|o| o.iter().next().map(|(s, id)| (s, *id)))
    }

    /// Longest-prefix match of an address over the desired state, as the datapath resolves it.
    #[must_use]
    pub fn resolve(&self, ip: std::net::IpAddr) -> Option<(IpNet, Value)> {
        let host = IpNet::from(ip);
        (0..=host.max_prefix_len()).rev().find_map(|len| {
            let p = IpNet::new(ip, len).ok()?.trunc();
            self.winner(&p)?;
            let v = self.value(&p)?;
            Some((p, v))
        })
    }

    /// What the kernel map must hold for exactly this prefix.
    #[must_use]
    pub fn value(&self, p: &IpNet) -> Option<Value> {
        let (source, identity) = self.winner(p)?;
        let cidr_identity = if source.is_endpoint() {
            self.longest_cidr(p).map_or(0, |(_, id)| id)
        } else {
            0
        };
        Some(Value {
            identity,
            cidr_identity,
        })
    }

    /// The longest prefix containing `p` (or `p` itself) that a CIDR rule owns.
    fn longest_cidr(&self, p: &IpNet) -> Option<(IpNet, Identity)> {
        (0..=p.prefix_len()).rev().find_map(|len| {
            let q = IpNet::new(p.addr(), len).ok()?.trunc();
            self.owners
                .get(&q)
                .and_then(|o| o.get(&Source::Cidr))
                .map(|id| (q, *id))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn v(identity: Identity) -> Value {
        Value {
            identity,
            cidr_identity: 0,
        }
    }

    #[test]
    fn removing_a_cidr_owner_keeps_the_endpoint_entry() {
        // The issue #13 reproduction: a /32 CIDR identity equal to a pod IP comes and goes.
        let mut c = Ipcache::new();
        let pod = p("10.0.70.6/32");
        c.set(pod, Source::LocalEndpoint(3), 300);
        assert_eq!(c.pending(), vec![Write::Upsert(pod, v(300))]);
        c.set(pod, Source::Cidr, 16_777_217);
        assert_eq!(
            c.pending(),
            vec![Write::Upsert(
                pod,
                Value {
                    identity: 300,
                    cidr_identity: 16_777_217
                }
            )],
            "the endpoint wins; its address now lies in a CIDR-rule prefix"
        );
        c.unset(pod, &Source::Cidr);
        assert_eq!(c.pending(), vec![Write::Upsert(pod, v(300))]);
        assert_eq!(c.desired(), BTreeMap::from([(pod, v(300))]));
    }

    #[test]
    fn removing_the_winner_restores_the_next_owner() {
        let mut c = Ipcache::new();
        let ip = p("10.0.1.5/32");
        c.set(ip, Source::Cidr, 16_777_300);
        c.set(ip, Source::RemoteEndpoint("b".into()), 400);
        c.set(ip, Source::LocalEndpoint(1), 256);
        assert_eq!(c.winner(&ip), Some((&Source::LocalEndpoint(1), 256)));
        c.pending();
        c.unset(ip, &Source::LocalEndpoint(1));
        assert_eq!(
            c.pending(),
            vec![Write::Upsert(
                ip,
                Value {
                    identity: 400,
                    cidr_identity: 16_777_300
                }
            )]
        );
        c.unset(ip, &Source::RemoteEndpoint("b".into()));
        assert_eq!(c.pending(), vec![Write::Upsert(ip, v(16_777_300))]);
        c.unset(ip, &Source::Cidr);
        assert_eq!(c.pending(), vec![Write::Remove(ip)]);
        c.unset(ip, &Source::Cidr);
        assert_eq!(c.pending(), vec![], "idempotent");
    }

    #[test]
    fn a_lower_owner_changing_its_identity_writes_nothing() {
        let mut c = Ipcache::new();
        let ip = p("10.0.1.5/32");
        c.set(ip, Source::LocalEndpoint(1), 256);
        c.set(ip, Source::RemoteEndpoint("b".into()), 400);
        c.pending();
        c.set(ip, Source::RemoteEndpoint("b".into()), 401);
        assert_eq!(c.pending(), vec![]);
        c.set(ip, Source::LocalEndpoint(1), 257);
        assert_eq!(c.pending(), vec![Write::Upsert(ip, v(257))]);
    }

    #[test]
    fn replace_source_adds_changes_and_drops() {
        let mut c = Ipcache::new();
        let node = Source::RemoteEndpoint("b".into());
        let (a, b, l) = (p("10.1.0.2/32"), p("10.1.0.3/32"), p("10.1.0.4/32"));
        c.set(l, Source::LocalEndpoint(9), 260);
        c.pending();
        c.replace_source(&node, &BTreeMap::from([(a, 300), (b, 301), (l, 302)]));
        assert_eq!(
            c.pending(),
            vec![Write::Upsert(a, v(300)), Write::Upsert(b, v(301))]
        );
        c.replace_source(&node, &BTreeMap::from([(a, 310)]));
        assert_eq!(
            c.pending(),
            vec![Write::Upsert(a, v(310)), Write::Remove(b)]
        );
        assert_eq!(c.winner(&l), Some((&Source::LocalEndpoint(9), 260)));
        assert_eq!(c.owned_by(&node).count(), 1);
    }

    #[test]
    fn endpoint_entries_carry_the_longest_covering_cidr() {
        let mut c = Ipcache::new();
        let (pod_a, pod_b) = (p("10.0.70.5/32"), p("10.0.70.6/32"));
        c.set(pod_a, Source::LocalEndpoint(1), 256);
        c.set(pod_b, Source::LocalEndpoint(2), 256);
        c.set(p("10.0.70.0/24"), Source::Cidr, 16_777_217);
        c.set(pod_b, Source::Cidr, 16_777_218);
        let d = c.desired();
        assert_eq!(d[&pod_a].cidr_identity, 16_777_217);
        assert_eq!(d[&pod_b].cidr_identity, 16_777_218);
        assert_eq!(d[&p("10.0.70.0/24")], v(16_777_217));
        let (prefix, value) = c.resolve("10.0.70.9".parse().unwrap()).unwrap();
        assert_eq!((prefix, value), (p("10.0.70.0/24"), v(16_777_217)));
        assert_eq!(
            c.resolve("10.0.70.6".parse().unwrap()).unwrap().1.identity,
            256
        );
        assert_eq!(c.resolve("10.9.0.1".parse().unwrap()), None);
    }

    #[test]
    fn the_by_ip_bit_is_the_datapaths() {
        assert_eq!(
            weft_policy::mapstate::reserved::BY_IP,
            weft_ebpf::IDENTITY_BY_IP
        );
    }

    #[test]
    fn read_back_state_is_diffed() {
        let mut c = Ipcache::new();
        c.set(p("10.0.0.1/32"), Source::LocalEndpoint(1), 256);
        c.set(p("0.0.0.0/0"), Source::Node, 2);
        c.set_written(BTreeMap::from([
            (p("0.0.0.0/0"), v(2)),
            (p("10.0.0.1/32"), v(999)),
            (p("10.0.0.99/32"), v(300)),
        ]));
        assert_eq!(
            c.pending(),
            vec![
                Write::Upsert(p("10.0.0.1/32"), v(256)),
                Write::Remove(p("10.0.0.99/32"))
            ]
        );
    }
}
