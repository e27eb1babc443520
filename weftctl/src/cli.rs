//! weftctl's command line.

use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Aligned columns.
    Table,
    /// JSON as the API returns it.
    Json,
}

/// weftctl command line.
#[derive(Debug, Parser)]
#[command(
    name = "weftctl",
    version,
    about = "Operate a Weft node through weft-manager's API"
)]
pub struct Cli {
    /// weft-manager's API socket.
    #[arg(long, global = true, default_value = "/run/weft/manager.sock")]
    pub socket: PathBuf,
    /// Output format.
    #[arg(short = 'o', long, global = true, value_enum, default_value = "table")]
    pub output: Output,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Top-level commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Node, CIDRs with their source, router IPs, pool usage, endpoint count.
    Status {
        /// Wait up to SECS for the manager to become ready.
        #[arg(long, value_name = "SECS")]
        wait: Option<u64>,
    },
    /// Endpoints.
    #[command(subcommand)]
    Endpoint(EndpointCmd),
    /// IP allocations.
    #[command(subcommand)]
    Ipam(IpamCmd),
    /// Network policy.
    #[command(subcommand)]
    Policy(PolicyCmd),
    /// Security identities.
    #[command(subcommand)]
    Identity(IdentityCmd),
    /// Cluster nodes (kvstore mode).
    #[command(subcommand)]
    Node(NodeCmd),
    /// Kubernetes Services the datapath translates (frontends and their backends).
    #[command(subcommand)]
    Service(ServiceCmd),
    /// eBPF maps.
    #[command(subcommand)]
    Map(MapCmd),
    /// Stream drop events (one line each; `-o json` for JSON lines).
    Monitor,
}

/// `weftctl policy ...`
#[derive(Debug, Subcommand)]
pub enum PolicyCmd {
    /// Import a Cilium (JSON/YAML) or Kubernetes `NetworkPolicy` file; prints the revision.
    Import {
        /// The policy file.
        file: PathBuf,
        /// Return only once every endpoint enforces the new revision.
        #[arg(long)]
        wait: bool,
    },
    /// Rules and revision.
    List,
    /// Delete rules by label, or all of them.
    Delete {
        /// Rules carrying this label (`k=v`); repeatable, all must match.
        #[arg(
            long = "labels",
            value_delimiter = ',',
            required_unless_present = "all"
        )]
        labels: Vec<String>,
        /// Every rule.
        #[arg(long, conflicts_with = "labels")]
        all: bool,
    },
    /// What the policy decides for a flow and which rule decided.
    Trace {
        /// Source: labels (`id=app2,k=v`), an endpoint id, or an IP.
        #[arg(long)]
        src: String,
        /// Destination: labels, an endpoint id, or an IP.
        #[arg(long)]
        dst: String,
        /// Destination port.
        #[arg(long = "dport", default_value_t = 0)]
        dport: u16,
        /// Protocol: tcp, udp, sctp, icmp, icmpv6.
        #[arg(long, default_value = "tcp")]
        proto: String,
    },
}

/// `weftctl identity ...`
#[derive(Debug, Subcommand)]
pub enum IdentityCmd {
    /// Every identity in use.
    List,
}

/// `weftctl node ...`
#[derive(Debug, Subcommand)]
pub enum NodeCmd {
    /// This node and every node the kvstore knows.
    List,
}

/// `weftctl service ...`
#[derive(Debug, Subcommand)]
pub enum ServiceCmd {
    /// Every Service frontend with its id and backends.
    List,
}

/// `weftctl map ...`
#[derive(Debug, Subcommand)]
pub enum MapCmd {
    /// The pinned maps with their sizes.
    List,
    /// Decoded entries of one map.
    Dump {
        /// Map name (see `map list`), or `policy`: every slot's policy entries, as the two
        /// policy maps (`policy_pairs`, `policy_lists`) hold them together.
        name: String,
    },
    /// Compare the endpoints, ipcache and policy maps with a from-scratch computation of the
    /// control plane's state; exits non-zero when they disagree.
    Verify,
}

/// `weftctl endpoint ...`
#[derive(Debug, Subcommand)]
pub enum EndpointCmd {
    /// Every endpoint.
    List,
    /// One endpoint.
    Get {
        /// Endpoint id.
        id: u32,
    },
    /// Change an endpoint's labels (new identity; policy follows).
    Labels {
        /// Endpoint id.
        id: u32,
        /// Add or replace `k=v`; repeatable.
        #[arg(long)]
        add: Vec<String>,
        /// Remove key `k`; repeatable.
        #[arg(long)]
        remove: Vec<String>,
    },
}

/// `weftctl ipam ...`
#[derive(Debug, Subcommand)]
pub enum IpamCmd {
    /// Every allocation.
    List,
}
