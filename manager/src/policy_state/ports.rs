//! Named ports of peer pods: egress rules' `port: name` resolve against the container ports of
//! the destination identity's pods, local ones (from the pod watch) and, in kvstore mode, other
//! nodes' (published with their ipcache records). Kept by owner; each change of an identity's
//! union reaches the selector cache and, through [`Effects`], the endpoints whose egress rules
//! name ports towards that identity.

use std::collections::BTreeSet;
use std::net::IpAddr;
use weft_policy::mapstate::Identity;
use weft_policy::rule::{NamedPorts, PeerSelector};

use super::{Effects, PolicyState, PortOwner};

impl PolicyState {
    /// `owner`, an endpoint with `identity`, has these named ports now (none: it is gone or has
    /// none). Returns what to regenerate: the entries of the identities whose ports changed, in
    /// the endpoints with an egress rule naming ports towards them.
    pub fn set_peer_ports(
        &mut self,
        owner: PortOwner,
        identity: Identity,
        ports: NamedPorts,
    ) -> Effects {
        let changed = self.ports.set(owner, identity, ports);
        self.ports_changed(changed)
    }

    /// `owner` is gone.
    pub fn remove_peer_ports(&mut self, owner: &PortOwner) -> Effects {
        let changed = self.ports.remove(owner);
        self.ports_changed(changed)
    }

    /// Node `node` publishes only the addresses `kept` now: its other remote owners are gone
    /// (a re-list; none are kept when its lease expired or it left).
    pub fn retain_node_ports(&mut self, node: &str, kept: impl Fn(&IpAddr) -> bool) -> Effects {
        let changed = self.ports.remove_where(
            |o| matches!(o, PortOwner::Remote { node: n, ip } if n == node && !kept(ip)),
        );
        self.ports_changed(changed)
    }

    /// The owners with named ports (for tests and verification).
    pub fn peer_port_owners(&self) -> impl Iterator<Item = (&PortOwner, Identity, &NamedPorts)> {
        self.ports.owners()
    }

    fn ports_changed(&mut self, identities: BTreeSet<Identity>) -> Effects {
        let mut effects = Effects::default();
        let mut matching: Vec<(Identity, BTreeSet<PeerSelector>)> = Vec::new();
        for id in identities {
            let selectors = self.cache.set_named_ports(id, self.ports.union(id));
            if !selectors.is_empty() {
                matching.push((id, selectors));
            }
        }
        if matching.is_empty() {
            return effects;
        }
        // Only selectors of egress entries with names resolve ports per destination.
        let named: BTreeSet<&PeerSelector> = self
            .repo
            .rules()
            .iter()
            .flat_map(|r| r.egress.iter().chain(&r.egress_deny))
            .filter(|pr| !pr.named_ports.is_empty())
            .flat_map(|pr| pr.peers.iter())
            .collect();
        for (id, selectors) in matching {
            let used: Vec<PeerSelector> = selectors
                .into_iter()
                .filter(|p| named.contains(p))
                .collect();
            if !used.is_empty() {
                effects.changed.extend(used);
                effects.identities.insert(id);
            }
        }
        effects
    }

    /// Feeds the named ports of every identity into a digest of the policy inputs (nothing
    /// when there are none: digests persisted before named ports mattered stay valid).
    pub(super) fn feed_ports(&self, h: &mut weft_api::fnv::Fnv64) {
        if self.cache.all_named_ports().is_empty() {
            return;
        }
        h.feed(b"ports");
        for (id, union) in self.cache.all_named_ports() {
            h.feed(&id.to_le_bytes());
            for ((name, proto), numbers) in union {
                h.feed(name.as_bytes());
                h.feed(&[0, *proto]);
                for n in numbers {
                    h.feed(&n.to_le_bytes());
                }
            }
        }
    }
}
