//! weftctl: the operator CLI over the manager's API.

pub mod table;

use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use weft_api::client::{Client, ClientError};
use weft_api::{Allocation, Endpoint, StatusResponse};

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
}

/// `weftctl ipam ...`
#[derive(Debug, Subcommand)]
pub enum IpamCmd {
    /// Every allocation.
    List,
}

/// weftctl failures.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    /// The API call failed.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// `status --wait` ran out of time.
    #[error("weft-manager at {socket} not ready after {secs} s: {last}")]
    NotReady {
        /// Socket.
        socket: String,
        /// Seconds waited.
        secs: u64,
        /// Last error seen.
        last: String,
    },
}

fn print<T: serde::Serialize>(output: Output, value: &T, table: impl FnOnce(&T) -> String) {
    match output {
        Output::Json => println!(
            "{}",
            serde_json::to_string_pretty(value).expect("API types serialize")
        ),
        Output::Table => print!("{}", table(value)),
    }
}

/// Runs one command.
pub async fn run(cli: Cli) -> Result<(), CtlError> {
    let client = Client::new(&cli.socket);
    match cli.command {
        Command::Status { wait } => {
            if let Some(secs) = wait {
                wait_ready(&client, secs).await?;
            }
            let s: StatusResponse = client.get("/v1/status").await?;
            print(cli.output, &s, status_table);
        }
        Command::Endpoint(EndpointCmd::List) => {
            let eps: Vec<Endpoint> = client.get("/v1/endpoints").await?;
            print(cli.output, &eps, |e| endpoint_table(e));
        }
        Command::Endpoint(EndpointCmd::Get { id }) => {
            let ep: Endpoint = client.get(&format!("/v1/endpoints/{id}")).await?;
            print(cli.output, &ep, |e| endpoint_table(std::slice::from_ref(e)));
        }
        Command::Ipam(IpamCmd::List) => {
            let allocs: Vec<Allocation> = client.get("/v1/ipam").await?;
            print(cli.output, &allocs, |a| ipam_table(a));
        }
    }
    Ok(())
}

async fn wait_ready(client: &Client, secs: u64) -> Result<(), CtlError> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let last = match client.get_status("/v1/healthz").await {
            Ok((200, _)) => return Ok(()),
            Ok((code, body)) => format!(
                "healthz answered {code}: {}",
                String::from_utf8_lossy(&body)
            ),
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            return Err(CtlError::NotReady {
                socket: client.socket().display().to_string(),
                secs,
                last,
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn status_table(s: &StatusResponse) -> String {
    let mut out = format!(
        "Node:       {}\nReady:      {}\nEndpoints:  {}\nPolicy rev: {}\nVersion:    {}\n\n",
        s.node_name, s.ready, s.endpoints, s.policy_revision, s.version
    );
    let rows: Vec<Vec<String>> = s
        .pools
        .iter()
        .map(|p| {
            vec![
                p.cidr.clone(),
                match &p.source_detail {
                    Some(d) if *d != p.source.to_string() => format!("{} ({d})", p.source),
                    _ => p.source.to_string(),
                },
                p.router_ip.to_string(),
                format!("{}/{}", p.used, p.capacity),
            ]
        })
        .collect();
    out.push_str(&table::render(&["CIDR", "SOURCE", "ROUTER", "USED"], &rows));
    out
}

fn endpoint_table(eps: &[Endpoint]) -> String {
    let rows: Vec<Vec<String>> = eps
        .iter()
        .map(|e| {
            vec![
                e.id.to_string(),
                format!("{:?}", e.state).to_lowercase(),
                e.ips
                    .iter()
                    .map(|i| i.address.to_string())
                    .collect::<Vec<_>>()
                    .join(","),
                e.host_ifname.clone(),
                e.identity.to_string(),
                match (&e.pod_namespace, &e.pod_name) {
                    (Some(ns), Some(n)) => format!("{ns}/{n}"),
                    _ => "-".into(),
                },
                e.container_id.chars().take(12).collect(),
                e.labels
                    .iter()
                    .map(|l| format!("{}={}", l.key, l.value))
                    .collect::<Vec<_>>()
                    .join(","),
            ]
        })
        .collect();
    table::render(
        &[
            "ID",
            "STATE",
            "IPS",
            "HOST-IF",
            "IDENTITY",
            "POD",
            "CONTAINER",
            "LABELS",
        ],
        &rows,
    )
}

fn ipam_table(allocs: &[Allocation]) -> String {
    let rows: Vec<Vec<String>> = allocs
        .iter()
        .map(|a| {
            vec![
                a.address.to_string(),
                a.pool.clone(),
                a.endpoint_id.to_string(),
                a.container_id.chars().take(12).collect(),
                a.ifname.clone(),
            ]
        })
        .collect();
    table::render(
        &["ADDRESS", "POOL", "ENDPOINT", "CONTAINER", "IFNAME"],
        &rows,
    )
}
