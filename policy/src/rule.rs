//! The one internal rule model every policy format is translated into.
//!
//! Unlike the input formats, nothing here is implicit: "any peer" is an explicit
//! [`Entity::All`] peer, "all ports" is an empty port list, and whether a rule puts an
//! endpoint into default deny is a flag, so Cilium's and Kubernetes' different defaults are
//! resolved once, in the parsers.

use crate::labels::LabelSet;
use crate::mapstate::{Direction, Tier, TierAction, TierVerdict, proto};
use crate::selector::Selector;
use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Entities Weft supports (Cilium `pkg/policy/api/entity.go`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Entity {
    /// The local node (identity 1).
    Host,
    /// Outside the cluster: identity 2 and every CIDR identity.
    World,
    /// Inside the cluster: host, unmanaged and every endpoint identity.
    Cluster,
    /// Anything (identity 0).
    All,
}

impl Entity {
    /// Parses an entity name as written in policies.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "host" => Ok(Self::Host),
            "world" => Ok(Self::World),
            "cluster" => Ok(Self::Cluster),
            "all" => Ok(Self::All),
            "remote-node" | "init" | "health" | "unmanaged" | "none" | "kube-apiserver"
            | "ingress" | "world-ipv4" | "world-ipv6" => Err(format!(
                "not supported yet: entity {s:?} (supported: host, world, cluster, all)"
            )),
            _ => Err(format!(
                "unknown entity {s:?} (supported: host, world, cluster, all)"
            )),
        }
    }
}

impl fmt::Display for Entity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Host => "host",
            Self::World => "world",
            Self::Cluster => "cluster",
            Self::All => "all",
        })
    }
}

/// A CIDR peer with carved-out sub-prefixes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct CidrSelector {
    /// The allowed prefix (host bits cleared).
    pub cidr: IpNet,
    /// Sub-prefixes that are not part of the peer (sorted, deduplicated).
    pub except: Vec<IpNet>,
    /// Kubernetes `ipBlock` semantics: also matches managed pods whose address lies in the
    /// block (by IP, not by identity). Cilium's CIDR rules never match managed pods (`false`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub match_pods: bool,
}

impl CidrSelector {
    /// True when `prefix` (the prefix of a CIDR identity) lies inside this peer: contained in
    /// `cidr` and in none of the `except` prefixes.
    #[must_use]
    pub fn covers(&self, prefix: &IpNet) -> bool {
        self.cidr.contains(prefix) && !self.except.iter().any(|e| e.contains(prefix))
    }
}

/// A peer: something that resolves to a set of identities through the selector cache.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum PeerSelector {
    /// Endpoints whose labels match.
    Endpoints(Selector),
    /// Addresses inside a prefix.
    Cidr(CidrSelector),
    /// An entity.
    Entity(Entity),
}

impl fmt::Display for PeerSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Endpoints(s) => write!(f, "endpoints({s})"),
            Self::Cidr(c) => {
                let kind = if c.match_pods { "ipblock" } else { "cidr" };
                if c.except.is_empty() {
                    write!(f, "{kind}({})", c.cidr)
                } else {
                    let ex: Vec<String> = c.except.iter().map(ToString::to_string).collect();
                    write!(f, "{kind}({} except {})", c.cidr, ex.join(","))
                }
            }
            Self::Entity(e) => write!(f, "entity({e})"),
        }
    }
}

/// One protocol and destination port range. `proto == 0` only ever comes with all ports,
/// as the map-state contract requires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PortProto {
    /// IP protocol number, 0 = any.
    pub proto: u8,
    /// First port (inclusive).
    pub lo: u16,
    /// Last port (inclusive).
    pub hi: u16,
}

impl PortProto {
    /// Any protocol, any port.
    pub const ANY: Self = Self {
        proto: proto::ANY,
        lo: 0,
        hi: u16::MAX,
    };

    /// True when a packet with that protocol and destination port falls in here.
    #[must_use]
    pub fn matches(&self, proto: u8, port: u16) -> bool {
        (self.proto == proto::ANY || self.proto == proto) && (self.lo..=self.hi).contains(&port)
    }
}

/// How a rule affects the enforcement of the endpoints it selects, per direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Enforcement {
    /// The rule says nothing about this direction.
    NotApplied,
    /// Selected endpoints are enforced with default deny (the normal case).
    DefaultDeny,
    /// Selected endpoints are enforced but keep default allow, so only the rule's denies bite
    /// (Cilium `enableDefaultDeny: false`).
    DefaultAllow,
}

impl Enforcement {
    /// The mode of a direction that has entries (or not), with Cilium's default deny flag.
    #[must_use]
    pub fn from_flags(applies: bool, default_deny: bool) -> Self {
        match (applies, default_deny) {
            (false, _) => Self::NotApplied,
            (true, true) => Self::DefaultDeny,
            (true, false) => Self::DefaultAllow,
        }
    }
}

/// A port given by name (Kubernetes `port: http`), resolved against pods' container ports when
/// the policy is computed: in an ingress rule against the selected pod's own ports (Cilium's
/// ingress resolution), in an egress rule against the destination's, per destination identity
/// (the union over that identity's pods, [`crate::selectorcache::SelectorCache::set_named_ports`]).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NamedPort {
    /// IP protocol number (TCP, UDP or SCTP).
    pub proto: u8,
    /// The container port's name.
    pub name: String,
}

/// An endpoint's named ports: (name, protocol) → port number (its pod's container ports).
pub type NamedPorts = std::collections::BTreeMap<(String, u8), u16>;

/// The named ports of every pod of one identity: (name, protocol) → the numbers its pods give
/// that name (several when replicas differ).
pub type IdentityPorts = std::collections::BTreeMap<(String, u8), std::collections::BTreeSet<u16>>;

/// Peers and ports of one ingress/egress (allow or deny) section entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PeerRule {
    /// Who: an empty list selects no peer (Cilium's `ingress: [{}]`).
    pub peers: Vec<PeerSelector>,
    /// What: an empty list (and no `named_ports`) means every protocol and port.
    pub ports: Vec<PortProto>,
    /// Ports by name; a name the endpoint's pod does not have matches nothing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub named_ports: Vec<NamedPort>,
}

impl PeerRule {
    /// A rule entry with numeric ports only.
    #[must_use]
    pub fn new(peers: Vec<PeerSelector>, ports: Vec<PortProto>) -> Self {
        Self {
            peers,
            ports,
            named_ports: Vec::new(),
        }
    }

    /// True when the entry restricts nothing by port.
    #[must_use]
    pub fn all_ports(&self) -> bool {
        self.ports.is_empty() && self.named_ports.is_empty()
    }

    /// The entry's numeric ports; `[ANY]` for an entry without ports (numeric or named).
    #[must_use]
    pub fn numeric_ports(&self) -> Vec<PortProto> {
        if self.all_ports() {
            vec![PortProto::ANY]
        } else {
            self.ports.clone()
        }
    }

    /// The numbers the entry's names resolve to on a destination identity whose pods have
    /// these named ports (egress).
    pub fn destination_ports<'a>(
        &'a self,
        named: &'a IdentityPorts,
    ) -> impl Iterator<Item = PortProto> + 'a {
        self.named_ports.iter().flat_map(move |n| {
            named
                .get(&(n.name.clone(), n.proto))
                .into_iter()
                .flatten()
                .map(move |&port| PortProto {
                    proto: n.proto,
                    lo: port,
                    hi: port,
                })
        })
    }

    /// The entry's ports for an endpoint with these named ports: numeric ones plus the names
    /// it resolves; `[ANY]` for an entry without ports.
    #[must_use]
    pub fn resolved_ports(&self, named: &NamedPorts) -> Vec<PortProto> {
        if self.all_ports() {
            return vec![PortProto::ANY];
        }
        let mut out = self.ports.clone();
        out.extend(self.named_ports.iter().filter_map(|n| {
            let port = *named.get(&(n.name.clone(), n.proto))?;
            Some(PortProto {
                proto: n.proto,
                lo: port,
                hi: port,
            })
        }));
        out
    }
}

/// Where a `ClusterNetworkPolicy` rule stands: one rule (one entry of the object's `ingress` or
/// `egress` list) becomes one [`Rule`] whose only entry is in the matching allow section
/// (`ingress` or `egress`) whatever its action, with both enforcement modes
/// [`Enforcement::NotApplied`]: the `NetworkPolicy` layer never sees it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TierRule {
    /// Admin or Baseline.
    pub tier: Tier,
    /// The object's `spec.priority` (0..=1000; lower first).
    pub priority: u16,
    /// The rule's direction.
    pub direction: Direction,
    /// The rule's index in its direction's list (lower first).
    pub index: u8,
    /// Accept, Deny or Pass.
    pub action: TierAction,
    /// The rule's `name` (may be empty).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
}

impl TierRule {
    /// The verdict its entries carry.
    #[must_use]
    pub fn verdict(&self) -> TierVerdict {
        TierVerdict {
            priority: self.priority,
            rule: self.index,
            action: self.action,
        }
    }
}

/// A rule: which endpoints it applies to and what it allows or denies per direction.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Rule {
    /// The endpoints the rule applies to.
    pub endpoint_selector: Selector,
    /// Ingress allow entries.
    pub ingress: Vec<PeerRule>,
    /// Ingress deny entries.
    pub ingress_deny: Vec<PeerRule>,
    /// Egress allow entries.
    pub egress: Vec<PeerRule>,
    /// Egress deny entries.
    pub egress_deny: Vec<PeerRule>,
    /// What the rule does to selected endpoints' ingress enforcement.
    pub ingress_mode: Enforcement,
    /// Same for egress.
    pub egress_mode: Enforcement,
    /// Rule labels (identify it for replace, delete and trace).
    pub labels: LabelSet,
    /// Free text.
    pub description: String,
    /// Set for a `ClusterNetworkPolicy` rule ([`TierRule`]); `None` for every other rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<TierRule>,
}

/// std's `SipHash` with fixed keys over `value`: stable within a build, equal values hash equal.
pub(crate) fn hash_of<T: std::hash::Hash + ?Sized>(value: &T) -> u64 {
    use std::hash::Hasher;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}

impl Rule {
    /// A 64-bit hash of the whole rule (std's `SipHash`, fixed keys): equal rules hash equal.
    /// Used to find a rule's identical twin without comparing every rule.
    #[must_use]
    pub fn content_hash(&self) -> u64 {
        hash_of(self)
    }

    /// A rule selecting `selector` with nothing in it; it applies in no direction.
    #[must_use]
    pub fn new(endpoint_selector: Selector, labels: LabelSet) -> Self {
        Self {
            endpoint_selector,
            ingress: Vec::new(),
            ingress_deny: Vec::new(),
            egress: Vec::new(),
            egress_deny: Vec::new(),
            ingress_mode: Enforcement::NotApplied,
            egress_mode: Enforcement::NotApplied,
            labels,
            description: String::new(),
            tier: None,
        }
    }

    /// The rule's entries of `dir` when it is a `ClusterNetworkPolicy` rule of `tier` with that
    /// direction (else nothing), with the verdict they carry.
    #[must_use]
    pub fn tier_section(&self, tier: Tier, dir: Direction) -> Option<(&[PeerRule], TierVerdict)> {
        let t = self.tier.as_ref()?;
        (t.tier == tier && t.direction == dir).then(|| (self.sections(dir).0, t.verdict()))
    }

    /// Allow and deny entries of one direction.
    #[must_use]
    pub fn sections(&self, dir: Direction) -> (&[PeerRule], &[PeerRule]) {
        match dir {
            Direction::Ingress => (&self.ingress, &self.ingress_deny),
            Direction::Egress => (&self.egress, &self.egress_deny),
        }
    }

    /// Whether the rule applies in `dir`.
    #[must_use]
    pub fn applies(&self, dir: Direction) -> bool {
        self.mode(dir) != Enforcement::NotApplied
    }

    /// The enforcement mode of `dir`.
    #[must_use]
    pub fn mode(&self, dir: Direction) -> Enforcement {
        match dir {
            Direction::Ingress => self.ingress_mode,
            Direction::Egress => self.egress_mode,
        }
    }

    /// Whether the rule asks for default deny in `dir` (only meaningful when it applies).
    #[must_use]
    pub fn default_deny(&self, dir: Direction) -> bool {
        self.mode(dir) == Enforcement::DefaultDeny
    }

    /// Every peer selector of the rule.
    pub fn peers(&self) -> impl Iterator<Item = &PeerSelector> {
        [
            &self.ingress,
            &self.ingress_deny,
            &self.egress,
            &self.egress_deny,
        ]
        .into_iter()
        .flatten()
        .flat_map(|p| p.peers.iter())
    }

    /// Mutable access to every peer selector (used to namespace Kubernetes rules).
    pub fn peers_mut(&mut self) -> impl Iterator<Item = &mut PeerSelector> {
        [
            &mut self.ingress,
            &mut self.ingress_deny,
            &mut self.egress,
            &mut self.egress_deny,
        ]
        .into_iter()
        .flatten()
        .flat_map(|p| p.peers.iter_mut())
    }

    /// Every CIDR prefix the rule references, `except` prefixes included: each needs a CIDR
    /// identity in the ipcache so longest-prefix match can tell them apart.
    ///
    /// `0.0.0.0/0` and `::/0` resolve to `world` (the ipcache's default entries), so they need
    /// no identity of their own, except as a Kubernetes ipBlock: that matches pods by address,
    /// through the identity of the longest CIDR-rule prefix containing the pod's address, and a
    /// pod outside every other rule's prefixes has only the /0 to be found in.
    pub fn cidr_prefixes(&self) -> impl Iterator<Item = IpNet> + '_ {
        self.peers().flat_map(|p| match p {
            PeerSelector::Cidr(c) => std::iter::once(c.cidr)
                .filter(|p| p.prefix_len() > 0 || c.match_pods)
                .chain(c.except.iter().copied().filter(|p| p.prefix_len() > 0))
                .collect(),
            _ => Vec::new(),
        })
    }
}
