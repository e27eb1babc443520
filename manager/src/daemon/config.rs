//! weft-manager's settings: command-line flags over a TOML file over defaults.
//!
//! Every setting is declared once, as a field of [`Cli`]: clap reads it as a flag
//! (`--state-dir`) and serde as a key of the `--config` file (`state_dir`). The file is read
//! into the same struct, the flags given are laid over it ([`overlay`]), and [`Config::resolve`]
//! applies the defaults and checks the combinations.

use clap::Parser;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Config failures.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {path}: {source}")]
    Read {
        /// Path.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// The file is not valid TOML for these keys.
    #[error("config {path}: {source} (see conf/manager.toml for the accepted keys)")]
    Parse {
        /// Path.
        path: String,
        /// The parser's error.
        source: toml::de::Error,
    },
    /// A value is out of range.
    #[error("{0}")]
    Invalid(String),
    /// The file's settings could not be combined with the flags (cannot happen: both are the
    /// same struct).
    #[error("combining the config file with the flags: {0}")]
    Overlay(#[source] serde_json::Error),
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// `weft-manager` flags, and the keys of its `--config` file (the flag's name with `_` for
/// `-`; `pod_cidrs` for `--pod-cidr`). A flag left out (`None`, or an empty list) leaves the
/// file's value.
#[derive(Debug, Parser, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[command(
    name = "weft-manager",
    version,
    about = "Weft node manager: IPAM, endpoints, identities, policy and the eBPF datapath"
)]
pub struct Cli {
    /// TOML config file; flags override it.
    #[arg(long)]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// State directory (the sled database lives inside) [default: /var/lib/weft].
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// API unix socket (mode 0600) [default: /run/weft/manager.sock].
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// bpffs directory for pinned maps [default: /sys/fs/bpf/weft].
    #[arg(long)]
    pub bpffs: Option<PathBuf>,
    /// This node's name [default: hostname].
    #[arg(long)]
    pub node_name: Option<String>,
    /// Kubernetes Node manifest (JSON or YAML) for the pod CIDRs.
    #[arg(long)]
    pub node_manifest: Option<PathBuf>,
    /// Pod CIDR used when the Node gives none (repeatable, one per family).
    #[arg(long = "pod-cidr")]
    pub pod_cidrs: Vec<String>,
    /// Log format.
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,
    /// Kubernetes mode: this Node, its pods, namespaces and network policies come from the API
    /// server (in-cluster service account, or --kubeconfig).
    #[arg(long, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub k8s: Option<bool>,
    /// kubeconfig for Kubernetes mode (implies --k8s) [default: in-cluster, then $KUBECONFIG].
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// In Kubernetes mode, also follow Cilium's namespaced and clusterwide network policies
    /// (cilium.io/v2; their CRDs must be installed: conf/k8s/) [default: true].
    #[arg(long)]
    pub k8s_cilium_policies: Option<bool>,
    /// In Kubernetes mode, also follow `ClusterNetworkPolicy` objects (policy.networking.k8s.io/v1beta1,
    /// admin and baseline tiers; their CRD is installed from conf/k8s/) and write their status
    /// [default: true].
    #[arg(long)]
    pub k8s_cluster_network_policies: Option<bool>,
    /// Once ready, copy weft-cni (beside this binary) into this CNI bin dir as `weft`.
    #[arg(long, requires = "install_cni_conf")]
    pub install_cni_bin: Option<PathBuf>,
    /// Once ready, write the conflist into this CNI conf dir. It stays when the manager stops
    /// (the runtime's CNI STATUS calls report the node's network not ready meanwhile).
    #[arg(long, requires = "install_cni_bin")]
    pub install_cni_conf: Option<PathBuf>,
    /// Remove the conflist on a graceful stop, as when Weft is being removed from the node
    /// (Cilium's `cni.uninstall`) [default: false].
    #[arg(long, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub cni_uninstall: Option<bool>,
    /// Cluster state store: `etcd` joins the nodes sharing it (identities, ipcache, routes);
    /// without it the manager is a single node.
    #[arg(long, value_enum)]
    pub kvstore: Option<KvstoreKind>,
    /// Where cluster-wide identities (and remote pods' addresses) are agreed, as Cilium's
    /// option of the same name: `crd` through the API server (Kubernetes mode, no etcd of
    /// Weft's own; docs/KUBERNETES.md), `kvstore` through etcd (`--kvstore etcd`)
    /// [default: kvstore with --kvstore, else single node].
    #[arg(long, value_enum)]
    pub identity_allocation_mode: Option<IdentityAllocationMode>,
    /// etcd client URLs, comma-separated (`http://10.0.0.5:2379`, `https://...` with TLS).
    #[arg(long, value_delimiter = ',')]
    pub kvstore_endpoints: Vec<String>,
    /// CA certificate (PEM) that signed etcd's server certificates.
    #[arg(long)]
    pub kvstore_ca: Option<PathBuf>,
    /// Client certificate (PEM) for etcd.
    #[arg(long)]
    pub kvstore_cert: Option<PathBuf>,
    /// Client key (PEM) for etcd.
    #[arg(long)]
    pub kvstore_key: Option<PathBuf>,
    /// Seconds other nodes keep this node's records after it stops renewing them [default: 15].
    #[arg(long)]
    pub kvstore_lease_ttl: Option<u64>,
    /// This node's underlay address, published for routing [default: the address of the
    /// default route's device, else of the first non-loopback device].
    #[arg(long)]
    pub node_ip: Option<std::net::IpAddr>,
    /// Pods reaching addresses outside every node's pod CIDRs and the non-masquerade CIDRs
    /// leave with the node's address (nftables table `inet weft`) [default: true].
    #[arg(long, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub masquerade: Option<bool>,
    /// Destinations that keep the pod's source address besides the nodes' pod CIDRs,
    /// comma-separated (e.g. a VPC range reachable without NAT).
    #[arg(long, value_delimiter = ',')]
    pub non_masquerade_cidrs: Vec<ipnet::IpNet>,
    /// Removes what Weft installed in the node's network stack outside its pinned maps (the
    /// masquerade table) and exits.
    #[arg(long)]
    #[serde(skip)]
    pub uninstall: bool,
    /// Also serve Prometheus metrics (`/metrics` and `/healthz` only, read-only) on this TCP
    /// address: IP:PORT, or :PORT for every IPv4 address [default: off; the `DaemonSet` uses :9962].
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<String>,
    /// Seconds a label identity (and its policy slot) outlives its last endpoint, so a pod
    /// replaced by one with the same labels keeps the number and finds its policy written;
    /// 0 frees it with the endpoint [default: 60].
    #[arg(long, value_name = "SECS")]
    pub identity_grace_period: Option<u64>,
}

/// Cluster state backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum KvstoreKind {
    /// etcd v3 (3.4 or later).
    Etcd,
}

/// `--identity-allocation-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum IdentityAllocationMode {
    /// `WeftIdentity` objects in the API server (needs Kubernetes mode).
    Crd,
    /// The etcd kvstore (needs `--kvstore etcd`).
    Kvstore,
}

/// Kvstore settings, when enabled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvstoreConfig {
    /// etcd client URLs.
    pub endpoints: Vec<String>,
    /// TLS material.
    pub tls: crate::kvstore::etcd::TlsFiles,
    /// Lease time-to-live in seconds.
    pub lease_ttl_s: u64,
}

/// The resolved settings.
// Four independent switches of the command line (masquerade, Kubernetes-mode ones, CRD mode):
// flags, not states of one thing.
#[allow(clippy::struct_excessive_bools)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// State directory.
    pub state_dir: PathBuf,
    /// API socket.
    pub socket: PathBuf,
    /// bpffs pin directory.
    pub bpffs: PathBuf,
    /// Node name.
    pub node_name: String,
    /// Whether `--node-name` (or `node_name` in the file) was given, not the hostname default.
    pub node_name_given: bool,
    /// Node manifest, if any.
    pub node_manifest: Option<PathBuf>,
    /// Fallback pod CIDRs.
    pub pod_cidrs: Vec<String>,
    /// Log format.
    pub log_format: LogFormat,
    /// Kubernetes mode (`None`: off).
    pub k8s: Option<K8sSettings>,
    /// Install the CNI plugin and conflist once ready.
    pub cni_install: Option<crate::daemon::cni_install::CniInstall>,
    /// Kvstore mode, if enabled.
    pub kvstore: Option<KvstoreConfig>,
    /// CRD mode: identities and remote pods through the API server.
    pub crd_identities: bool,
    /// Underlay address given on the command line.
    pub node_ip: Option<std::net::IpAddr>,
    /// Masquerade traffic leaving the cluster.
    pub masquerade: bool,
    /// Destinations exempt from masquerade besides the nodes' pod CIDRs.
    pub non_masquerade_cidrs: Vec<ipnet::IpNet>,
    /// `--uninstall`: remove and exit.
    pub uninstall: bool,
    /// TCP address serving `/metrics` (off when `None`).
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// How long an identity without endpoints is kept (`--identity-grace-period`).
    pub identity_grace: std::time::Duration,
}

/// Default of `--identity-grace-period`, in seconds.
pub const DEFAULT_IDENTITY_GRACE_S: u64 = 60;

/// Kubernetes mode's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct K8sSettings {
    /// kubeconfig (`None`: in-cluster config, then `$KUBECONFIG` / `~/.kube/config`).
    pub kubeconfig: Option<PathBuf>,
    /// Follow the cilium.io/v2 policy kinds too.
    pub cilium_policies: bool,
    /// Follow `ClusterNetworkPolicy` too.
    pub cluster_network_policies: bool,
}

fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".into())
}

impl Config {
    /// Lays the flags over the file named by `--config`, then applies the defaults.
    pub fn resolve(cli: Cli) -> Result<Self, ConfigError> {
        let uninstall = cli.uninstall;
        let s = match &cli.config {
            Some(path) => overlay(&load_file(path)?, cli)?,
            None => cli,
        };
        let kvstore = kvstore_config(&s)?;
        let node_name_given = s.node_name.is_some();
        let mut config = Self {
            state_dir: s.state_dir.unwrap_or_else(|| "/var/lib/weft".into()),
            socket: s.socket.unwrap_or_else(|| "/run/weft/manager.sock".into()),
            bpffs: s.bpffs.unwrap_or_else(|| "/sys/fs/bpf/weft".into()),
            node_name: s.node_name.unwrap_or_else(hostname),
            node_name_given,
            node_manifest: s.node_manifest,
            pod_cidrs: s.pod_cidrs,
            log_format: s.log_format.unwrap_or_default(),
            k8s: None,
            cni_install: None,
            crd_identities: false,
            kvstore,
            node_ip: s.node_ip,
            masquerade: s.masquerade.unwrap_or(true),
            non_masquerade_cidrs: s.non_masquerade_cidrs,
            uninstall,
            metrics_listen: s
                .metrics_listen
                .map(|a| crate::prom::server::parse_listen(&a))
                .transpose()
                .map_err(|e| ConfigError::Invalid(e.to_string()))?,
            identity_grace: std::time::Duration::from_secs(
                s.identity_grace_period.unwrap_or(DEFAULT_IDENTITY_GRACE_S),
            ),
        };
        match (s.install_cni_bin, s.install_cni_conf) {
            (Some(bin_dir), Some(conf_dir)) => {
                config.cni_install = Some(crate::daemon::cni_install::CniInstall {
                    bin_dir,
                    conf_dir,
                    uninstall_on_stop: s.cni_uninstall.unwrap_or(false),
                });
            }
            (None, None) => {}
            _ => {
                return Err(ConfigError::Invalid(
                    "install_cni_bin and install_cni_conf go together: set both or neither".into(),
                ));
            }
        }
        if s.k8s == Some(true) || s.kubeconfig.is_some() {
            config.k8s = Some(K8sSettings {
                kubeconfig: s.kubeconfig,
                cilium_policies: s.k8s_cilium_policies.unwrap_or(true),
                cluster_network_policies: s.k8s_cluster_network_policies.unwrap_or(true),
            });
        }
        config.crd_identities = identity_mode(
            s.identity_allocation_mode,
            config.k8s.is_some(),
            config.kvstore.is_some(),
        )?;
        if config.node_name.is_empty() {
            return Err(ConfigError::Invalid("--node-name must not be empty".into()));
        }
        Ok(config)
    }
}

/// `flags` over `file`: every setting the flags give (not `None`, not an empty list) replaces
/// the file's.
fn overlay(file: &Cli, flags: Cli) -> Result<Cli, ConfigError> {
    let encode = |c: &Cli| serde_json::to_value(c).map_err(ConfigError::Overlay);
    let (mut merged, given) = (encode(file)?, encode(&flags)?);
    if let (serde_json::Value::Object(merged), serde_json::Value::Object(given)) =
        (&mut merged, given)
    {
        for (key, value) in given {
            let unset = match &value {
                serde_json::Value::Null => true,
                serde_json::Value::Array(a) => a.is_empty(),
                _ => false,
            };
            if !unset {
                merged.insert(key, value);
            }
        }
    }
    let mut out: Cli = serde_json::from_value(merged).map_err(ConfigError::Overlay)?;
    out.config = flags.config;
    out.uninstall = flags.uninstall;
    Ok(out)
}

/// Whether CRD mode is on; every combination that cannot work is named with its fix.
fn identity_mode(
    mode: Option<IdentityAllocationMode>,
    k8s: bool,
    kvstore: bool,
) -> Result<bool, ConfigError> {
    match mode {
        Some(IdentityAllocationMode::Crd) if !k8s => Err(ConfigError::Invalid(
            "--identity-allocation-mode crd keeps identities in the Kubernetes API server: it needs Kubernetes mode (--k8s, or --kubeconfig PATH)".into(),
        )),
        Some(IdentityAllocationMode::Crd) if kvstore => Err(ConfigError::Invalid(
            "--identity-allocation-mode crd and --kvstore etcd are two ways to share identities: choose one (crd: the API server; kvstore: etcd, for larger clusters)".into(),
        )),
        Some(IdentityAllocationMode::Kvstore) if !kvstore => Err(ConfigError::Invalid(
            "--identity-allocation-mode kvstore needs --kvstore etcd --kvstore-endpoints URL (or use crd in Kubernetes mode)".into(),
        )),
        Some(IdentityAllocationMode::Crd) => Ok(true),
        Some(IdentityAllocationMode::Kvstore) | None => Ok(false),
    }
}

/// Resolves the kvstore settings; any of them without `--kvstore etcd` is a mistake worth naming.
fn kvstore_config(s: &Cli) -> Result<Option<KvstoreConfig>, ConfigError> {
    let endpoints = s.kvstore_endpoints.clone();
    let tls = crate::kvstore::etcd::TlsFiles {
        ca: s.kvstore_ca.clone(),
        cert: s.kvstore_cert.clone(),
        key: s.kvstore_key.clone(),
    };
    let ttl = s.kvstore_lease_ttl;
    if s.kvstore.is_none() {
        if !endpoints.is_empty() || tls.any() || ttl.is_some() {
            return Err(ConfigError::Invalid(
                "--kvstore-endpoints/--kvstore-ca/--kvstore-cert/--kvstore-key/--kvstore-lease-ttl need --kvstore etcd".into(),
            ));
        }
        return Ok(None);
    }
    if endpoints.is_empty() {
        return Err(ConfigError::Invalid(
            "--kvstore etcd needs --kvstore-endpoints URL[,URL] (e.g. http://10.0.0.5:2379)".into(),
        ));
    }
    for e in &endpoints {
        let scheme_ok = e.starts_with("http://") || e.starts_with("https://");
        if !scheme_ok || e.split_once("://").is_none_or(|(_, rest)| rest.is_empty()) {
            return Err(ConfigError::Invalid(format!(
                "kvstore endpoint {e:?} is not an http:// or https:// URL (e.g. http://10.0.0.5:2379)"
            )));
        }
        if tls.any() != e.starts_with("https://") {
            return Err(ConfigError::Invalid(format!(
                "kvstore endpoint {e:?}: use https:// URLs with --kvstore-ca/--kvstore-cert/--kvstore-key, and http:// without them"
            )));
        }
    }
    if tls.cert.is_some() != tls.key.is_some() {
        return Err(ConfigError::Invalid(
            "--kvstore-cert and --kvstore-key go together: give both or neither".into(),
        ));
    }
    let lease_ttl_s = ttl.unwrap_or(15);
    if !(2..=3600).contains(&lease_ttl_s) {
        return Err(ConfigError::Invalid(format!(
            "--kvstore-lease-ttl {lease_ttl_s} is out of range: use 2..=3600 seconds"
        )));
    }
    Ok(Some(KvstoreConfig {
        endpoints,
        tls,
        lease_ttl_s,
    }))
}

fn load_file(path: &Path) -> Result<Cli, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })?;
    toml::from_str(&text).map_err(|source| ConfigError::Parse {
        path: path.display().to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_file_override_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("m.toml");
        std::fs::write(
            &file,
            "state_dir = \"/f/state\"\nsocket = \"/f/sock\"\npod_cidrs = [\"10.1.0.0/24\"]\nlog_format = \"json\"\n",
        )
        .unwrap();
        let cli = Cli::parse_from([
            "weft-manager",
            "--config",
            file.to_str().unwrap(),
            "--socket",
            "/c/sock",
        ]);
        let c = Config::resolve(cli).unwrap();
        assert_eq!(c.socket, PathBuf::from("/c/sock"));
        assert_eq!(c.state_dir, PathBuf::from("/f/state"));
        assert_eq!(c.bpffs, PathBuf::from("/sys/fs/bpf/weft"));
        assert_eq!(c.pod_cidrs, vec!["10.1.0.0/24".to_string()]);
        assert_eq!(c.log_format, LogFormat::Json);
    }

    #[test]
    fn k8s_mode_from_file_or_kubeconfig_flag() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("m.toml");
        std::fs::write(
            &file,
            "k8s = true\nk8s_cilium_policies = false\nk8s_cluster_network_policies = false\n",
        )
        .unwrap();
        let cli = Cli::parse_from(["weft-manager", "--config", file.to_str().unwrap()]);
        let k = Config::resolve(cli).unwrap().k8s.unwrap();
        assert_eq!(
            (k.kubeconfig, k.cilium_policies, k.cluster_network_policies),
            (None, false, false)
        );
        let cli = Cli::parse_from(["weft-manager", "--kubeconfig", "/k/config"]);
        let k = Config::resolve(cli).unwrap().k8s.unwrap();
        assert_eq!(k.kubeconfig, Some(PathBuf::from("/k/config")));
        assert!(k.cilium_policies && k.cluster_network_policies);
        let cli = Cli::parse_from(["weft-manager"]);
        assert_eq!(Config::resolve(cli).unwrap().k8s, None);
    }

    #[test]
    fn masquerade_is_on_unless_turned_off() {
        let c = Config::resolve(Cli::parse_from(["weft-manager"])).unwrap();
        assert!(c.masquerade && c.non_masquerade_cidrs.is_empty());
        for (args, on) in [
            (vec!["--masquerade=false"], false),
            (vec!["--masquerade", "false"], false),
            (vec!["--masquerade"], true),
        ] {
            let cli = Cli::parse_from(std::iter::once("weft-manager").chain(args));
            assert_eq!(Config::resolve(cli).unwrap().masquerade, on);
        }
        let c = Config::resolve(Cli::parse_from([
            "weft-manager",
            "--non-masquerade-cidrs",
            "192.168.0.0/16,fd00::/8",
        ]))
        .unwrap();
        assert_eq!(c.non_masquerade_cidrs.len(), 2);
        assert!(
            Cli::try_parse_from(["weft-manager", "--non-masquerade-cidrs", "10.0.0.0/33"]).is_err()
        );
    }

    #[test]
    fn identity_grace_period_defaults_to_a_minute_and_zero_turns_it_off() {
        let secs = |args: &[&str]| {
            let mut all = vec!["weft-manager"];
            all.extend_from_slice(args);
            Config::resolve(Cli::parse_from(all))
                .unwrap()
                .identity_grace
                .as_secs()
        };
        assert_eq!(secs(&[]), DEFAULT_IDENTITY_GRACE_S);
        assert_eq!(secs(&["--identity-grace-period", "0"]), 0);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("m.toml");
        std::fs::write(&file, "identity_grace_period = 5\n").unwrap();
        let path = file.to_str().unwrap();
        assert_eq!(secs(&["--config", path]), 5);
        assert_eq!(secs(&["--config", path, "--identity-grace-period", "7"]), 7);
        assert!(Cli::try_parse_from(["weft-manager", "--identity-grace-period", "-1"]).is_err());
    }

    #[test]
    fn a_flag_set_to_false_overrides_the_file_and_a_missing_flag_keeps_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("m.toml");
        std::fs::write(
            &file,
            "masquerade = true\nk8s = true\nkvstore_endpoints = [\"http://a:1\"]\nkvstore = \"etcd\"\n",
        )
        .unwrap();
        let path = file.to_str().unwrap();
        let c = Config::resolve(Cli::parse_from([
            "weft-manager",
            "--config",
            path,
            "--masquerade=false",
        ]))
        .unwrap();
        assert!(!c.masquerade, "--masquerade=false beats the file's true");
        assert!(c.k8s.is_some(), "k8s = true stays without --k8s");
        assert_eq!(c.kvstore.unwrap().endpoints, ["http://a:1"]);
        let c = Config::resolve(Cli::parse_from([
            "weft-manager",
            "--config",
            path,
            "--k8s=false",
            "--kvstore-endpoints",
            "http://b:2",
        ]))
        .unwrap();
        assert!(c.k8s.is_none(), "--k8s=false beats the file");
        assert_eq!(c.kvstore.unwrap().endpoints, ["http://b:2"]);
    }

    #[test]
    fn flag_only_settings_are_not_keys_of_the_file() {
        let dir = tempfile::tempdir().unwrap();
        for key in ["config = \"/x.toml\"", "uninstall = true"] {
            let file = dir.path().join("m.toml");
            std::fs::write(&file, format!("{key}\n")).unwrap();
            let cli = Cli::parse_from(["weft-manager", "--config", file.to_str().unwrap()]);
            assert!(
                matches!(Config::resolve(cli), Err(ConfigError::Parse { .. })),
                "{key}"
            );
        }
    }

    #[test]
    fn unknown_key_is_rejected_with_the_file_name() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("m.toml");
        std::fs::write(&file, "pod_cidr = \"10.1.0.0/24\"\n").unwrap();
        let cli = Cli::parse_from(["weft-manager", "--config", file.to_str().unwrap()]);
        let err = Config::resolve(cli).unwrap_err().to_string();
        assert!(err.contains("m.toml") && err.contains("pod_cidr"), "{err}");
    }

    #[test]
    fn identity_allocation_mode_resolves_and_bad_combinations_are_named() {
        let on = |args: &[&str]| {
            let mut full = vec!["weft-manager"];
            full.extend(args);
            Config::resolve(Cli::parse_from(full)).map(|c| c.crd_identities)
        };
        assert!(on(&["--k8s", "true", "--identity-allocation-mode", "crd"]).unwrap());
        assert!(!on(&["--k8s", "true"]).unwrap(), "off unless asked for");
        assert!(
            !on(&[
                "--identity-allocation-mode",
                "kvstore",
                "--kvstore",
                "etcd",
                "--kvstore-endpoints",
                "http://a:1"
            ])
            .unwrap()
        );
        for (args, needle) in [
            (
                vec!["--identity-allocation-mode", "crd"],
                "needs Kubernetes mode",
            ),
            (
                vec![
                    "--k8s",
                    "true",
                    "--identity-allocation-mode",
                    "crd",
                    "--kvstore",
                    "etcd",
                    "--kvstore-endpoints",
                    "http://a:1",
                ],
                "choose one",
            ),
            (
                vec!["--identity-allocation-mode", "kvstore"],
                "needs --kvstore etcd",
            ),
        ] {
            let err = on(&args).unwrap_err().to_string();
            assert!(err.contains(needle), "{args:?}: {err}");
        }
    }

    #[test]
    fn kvstore_flags_resolve_and_bad_combinations_are_named() {
        let c = Config::resolve(Cli::parse_from([
            "weft-manager",
            "--kvstore",
            "etcd",
            "--kvstore-endpoints",
            "http://10.0.0.5:2379,http://10.0.0.6:2379",
        ]))
        .unwrap();
        let kv = c.kvstore.unwrap();
        assert_eq!(kv.endpoints.len(), 2);
        assert_eq!(kv.lease_ttl_s, 15);
        assert!(
            Config::resolve(Cli::parse_from(["weft-manager"]))
                .unwrap()
                .kvstore
                .is_none()
        );
        for (args, needle) in [
            (vec!["--kvstore", "etcd"], "needs --kvstore-endpoints"),
            (
                vec!["--kvstore-endpoints", "http://a:1"],
                "need --kvstore etcd",
            ),
            (
                vec!["--kvstore", "etcd", "--kvstore-endpoints", "10.0.0.5:2379"],
                "not an http",
            ),
            (
                vec![
                    "--kvstore",
                    "etcd",
                    "--kvstore-endpoints",
                    "http://a:1",
                    "--kvstore-ca",
                    "/ca.pem",
                ],
                "use https://",
            ),
            (
                vec![
                    "--kvstore",
                    "etcd",
                    "--kvstore-endpoints",
                    "https://a:1",
                    "--kvstore-cert",
                    "/c.pem",
                ],
                "go together",
            ),
        ] {
            let mut full = vec!["weft-manager"];
            full.extend(args);
            let err = Config::resolve(Cli::parse_from(full))
                .unwrap_err()
                .to_string();
            assert!(err.contains(needle), "{err}");
        }
    }

    #[test]
    fn shipped_example_config_parses() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../conf/manager.toml");
        load_file(&path).unwrap();
    }
}
