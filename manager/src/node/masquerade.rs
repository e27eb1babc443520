//! Masquerade for traffic leaving the cluster (the ptp plugin's `ipMasq`, Cilium's
//! `enable-ipv4-masquerade` in iptables mode): a pod reaching an address outside every node's
//! pod CIDRs and outside the configured non-masquerade CIDRs leaves with the node's address;
//! pod↔pod traffic across nodes keeps its pod source, since the receiving node resolves the
//! sender's identity from it.
//!
//! Through nftables with the `nft` tool (docs/KVSTORE.md, "Masquerade", says why the tool and
//! not a library), in Weft's own table `inet weft`: every change rewrites the whole table in
//! one `nft -f` transaction (`table` / `delete table` / the new table), so a restart or a
//! retry is idempotent and no packet ever sees half a ruleset.

use ipnet::IpNet;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

/// Weft's nftables table (family `inet`).
pub const TABLE: &str = "weft";

/// Masquerade failures.
#[derive(Debug, thiserror::Error)]
pub enum MasqueradeError {
    /// `nft` refused the ruleset (its own message).
    #[error(
        "masquerade: nft failed: {0} (install nftables, or run weft-manager with --masquerade=false)"
    )]
    Nft(String),
    /// `nft` could not be run.
    #[error(
        "masquerade: nft failed: {what}: {source} (install nftables, or run weft-manager with --masquerade=false)"
    )]
    Run {
        /// The step (`cannot run nft`, `writing to nft`, ...).
        what: &'static str,
        /// Cause.
        source: std::io::Error,
    },
}

/// The nftables seam.
pub trait Nft: Send + Sync {
    /// Applies a script as one transaction (`nft -f -`).
    fn apply(&self, script: &str) -> Result<(), MasqueradeError>;
}

/// The real one: runs `nft -f -` in the manager's network namespace.
pub struct NftCommand;

impl Nft for NftCommand {
    fn apply(&self, script: &str) -> Result<(), MasqueradeError> {
        let mut child = Command::new("nft")
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| MasqueradeError::Run {
                what: "cannot run nft",
                source,
            })?;
        child
            .stdin
            .take()
            .ok_or_else(|| MasqueradeError::Nft("nft was started without a stdin pipe".into()))?
            .write_all(script.as_bytes())
            .map_err(|source| MasqueradeError::Run {
                what: "writing to nft",
                source,
            })?;
        let out = child
            .wait_with_output()
            .map_err(|source| MasqueradeError::Run {
                what: "waiting for nft",
                source,
            })?;
        if out.status.success() {
            Ok(())
        } else {
            Err(MasqueradeError::Nft(
                String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            ))
        }
    }
}

/// The script that makes table `inet weft` exactly: masquerade what `pod_cidrs` send to
/// anything outside `exempt`. Creating the table before deleting it makes the delete succeed
/// on a first install; the whole script is one transaction.
#[must_use]
pub fn script(pod_cidrs: &[IpNet], exempt: &BTreeSet<IpNet>) -> String {
    let mut s = format!("table inet {TABLE}\ndelete table inet {TABLE}\ntable inet {TABLE} {{\n");
    for (set, ty, v4) in [
        ("exempt4", "ipv4_addr", true),
        ("exempt6", "ipv6_addr", false),
    ] {
        let elems: Vec<String> = exempt
            .iter()
            .filter(|n| matches!(n, IpNet::V4(_)) == v4)
            .map(|n| n.trunc().to_string())
            .collect();
        let _ = write!(
            s,
            "  set {set} {{\n    type {ty}\n    flags interval\n    auto-merge\n"
        );
        if !elems.is_empty() {
            let _ = writeln!(s, "    elements = {{ {} }}", elems.join(", "));
        }
        s += "  }\n";
    }
    s += "  chain postrouting {\n    type nat hook postrouting priority srcnat; policy accept;\n";
    for cidr in pod_cidrs {
        let (fam, set) = match cidr {
            IpNet::V4(_) => ("ip", "exempt4"),
            IpNet::V6(_) => ("ip6", "exempt6"),
        };
        let _ = writeln!(
            s,
            "    {fam} saddr {} {fam} daddr != @{set} masquerade",
            cidr.trunc()
        );
    }
    s += "  }\n}\n";
    s
}

/// The script that removes Weft's table (missing is fine).
#[must_use]
pub fn delete_script() -> String {
    format!("table inet {TABLE}\ndelete table inet {TABLE}\n")
}

/// The entry of [`Masquerader`]'s remote CIDRs kept from the last run (not a node name: those
/// are DNS labels).
const KEPT: &str = "(kept from the last run)";

/// This node's masquerade rules, kept in step with the node registry.
pub struct Masquerader {
    nft: Arc<dyn Nft>,
    own: Vec<IpNet>,
    configured: Vec<IpNet>,
    /// Remote nodes' pod CIDRs, by node name.
    remote: Mutex<BTreeMap<String, Vec<IpNet>>>,
    /// The script last applied: an unchanged registry writes nothing.
    applied: Mutex<Option<String>>,
}

impl Masquerader {
    /// Rules for pods in `own` (this node's pod CIDRs), never masquerading towards
    /// `configured` (the `--non-masquerade-cidrs`), nor any node's pod CIDRs.
    #[must_use]
    pub fn new(nft: Arc<dyn Nft>, own: Vec<IpNet>, configured: Vec<IpNet>) -> Self {
        Self {
            nft,
            own,
            configured,
            remote: Mutex::new(BTreeMap::new()),
            applied: Mutex::new(None),
        }
    }

    /// Installs (or re-installs, on restart) the table. `kept`: other nodes' pod CIDRs the
    /// last run routed (its routes outlive it), exempted until the cluster's first listing says
    /// which nodes exist ([`Self::drop_kept`]): without them, a connection a pod opens to
    /// another node's pod during a restart would leave with the node's address and meet the
    /// other node's policy as the node, not as the pod.
    pub fn install(&self, kept: &[IpNet]) -> Result<(), MasqueradeError> {
        if !kept.is_empty() {
            crate::sys::locks::lock(&self.remote).insert(KEPT.to_owned(), kept.to_vec());
        }
        self.sync()
    }

    /// The cluster's nodes are listed: the CIDRs kept from the last run give way to them.
    pub fn drop_kept(&self) -> Result<(), MasqueradeError> {
        if crate::sys::locks::lock(&self.remote).remove(KEPT).is_none() {
            return Ok(());
        }
        self.sync()
    }

    /// A node joined or changed.
    pub fn node_put(&self, name: &str, pod_cidrs: &[IpNet]) -> Result<(), MasqueradeError> {
        crate::sys::locks::lock(&self.remote).insert(name.to_owned(), pod_cidrs.to_vec());
        self.sync()
    }

    /// A node left.
    pub fn node_deleted(&self, name: &str) -> Result<(), MasqueradeError> {
        crate::sys::locks::lock(&self.remote).remove(name);
        self.sync()
    }

    /// Every destination that keeps the pod's source.
    #[must_use]
    pub fn exempt(&self) -> BTreeSet<IpNet> {
        let remote = crate::sys::locks::lock(&self.remote);
        self.own
            .iter()
            .chain(&self.configured)
            .chain(remote.values().flatten())
            .map(IpNet::trunc)
            .collect()
    }

    fn sync(&self) -> Result<(), MasqueradeError> {
        let mut applied = crate::sys::locks::lock(&self.applied);
        let want = script(&self.own, &self.exempt());
        if applied.as_deref() == Some(want.as_str()) {
            return Ok(());
        }
        self.nft.apply(&want)?;
        *applied = Some(want);
        Ok(())
    }
}

/// Removes Weft's table (`weft-manager --uninstall`).
pub fn uninstall(nft: &dyn Nft) -> Result<(), MasqueradeError> {
    nft.apply(&delete_script())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct FakeNft(Mutex<Vec<String>>);

    impl Nft for FakeNft {
        fn apply(&self, script: &str) -> Result<(), MasqueradeError> {
            self.0.lock().unwrap().push(script.to_owned());
            Ok(())
        }
    }

    fn n(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn the_table_masquerades_own_pods_to_everything_but_pod_cidrs_and_exemptions() {
        let s = script(
            &[n("10.21.0.0/24"), n("fd00:21::/64")],
            &[n("10.21.0.0/24"), n("10.22.0.0/24"), n("fd00:21::/64")].into(),
        );
        assert!(s.starts_with("table inet weft\ndelete table inet weft\n"));
        assert!(s.contains("elements = { 10.21.0.0/24, 10.22.0.0/24 }"));
        assert!(s.contains("elements = { fd00:21::/64 }"));
        assert!(s.contains("ip saddr 10.21.0.0/24 ip daddr != @exempt4 masquerade"));
        assert!(s.contains("ip6 saddr fd00:21::/64 ip6 daddr != @exempt6 masquerade"));
        assert!(s.contains("type nat hook postrouting priority srcnat"));
    }

    #[test]
    fn nodes_coming_and_going_rewrite_the_table_only_when_it_changes() {
        let nft = Arc::new(FakeNft::default());
        let m = Masquerader::new(
            nft.clone(),
            vec![n("10.21.0.0/24")],
            vec![n("192.168.0.0/16")],
        );
        m.install(&[]).unwrap();
        m.install(&[]).unwrap();
        assert_eq!(nft.0.lock().unwrap().len(), 1, "idempotent");
        m.node_put("b", &[n("10.22.0.0/24")]).unwrap();
        assert!(nft.0.lock().unwrap()[1].contains("10.21.0.0/24, 10.22.0.0/24, 192.168.0.0/16"));
        m.node_put("b", &[n("10.22.0.0/24")]).unwrap();
        assert_eq!(nft.0.lock().unwrap().len(), 2);
        m.node_deleted("b").unwrap();
        assert_eq!(m.exempt(), [n("10.21.0.0/24"), n("192.168.0.0/16")].into());
        let scripts = nft.0.lock().unwrap();
        assert_eq!(scripts[2], scripts[0], "back to the table of a lone node");
    }

    #[test]
    fn a_restart_exempts_the_routed_cidrs_until_the_nodes_are_listed() {
        let nft = Arc::new(FakeNft::default());
        let m = Masquerader::new(nft.clone(), vec![n("10.21.0.0/24")], Vec::new());
        // The last run routed two other nodes' pod CIDRs: exempt from the first table on.
        m.install(&[n("10.22.0.0/24"), n("10.23.0.0/24")]).unwrap();
        assert!(nft.0.lock().unwrap()[0].contains("10.21.0.0/24, 10.22.0.0/24, 10.23.0.0/24"));
        // The listing knows only one of them: once listed, the other goes.
        m.node_put("b", &[n("10.22.0.0/24")]).unwrap();
        assert_eq!(nft.0.lock().unwrap().len(), 1, "nothing new to exempt");
        m.drop_kept().unwrap();
        assert_eq!(m.exempt(), [n("10.21.0.0/24"), n("10.22.0.0/24")].into());
        assert!(nft.0.lock().unwrap()[1].contains("elements = { 10.21.0.0/24, 10.22.0.0/24 }"));
        m.drop_kept().unwrap();
        assert_eq!(nft.0.lock().unwrap().len(), 2, "dropped once");
    }

    #[test]
    fn uninstall_deletes_the_table() {
        let nft = FakeNft::default();
        uninstall(&nft).unwrap();
        assert_eq!(
            nft.0.lock().unwrap()[0],
            "table inet weft\ndelete table inet weft\n"
        );
    }
}
