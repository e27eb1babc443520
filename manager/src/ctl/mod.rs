//! weftctl: the operator CLI over the manager's API.

mod render;
pub mod table;

use clap::{Parser, Subcommand, ValueEnum};
use serde_json::Value;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use weft_api::client::{Client, ClientError};
use weft_api::{Allocation, Endpoint, StatusResponse};

use crate::service::policy_api::{TracePeerRequest, TraceRequest};
use crate::service::{ImportResult, TraceResult};

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

/// `weftctl map ...`
#[derive(Debug, Subcommand)]
pub enum MapCmd {
    /// The pinned maps with their sizes.
    List,
    /// Decoded entries of one map.
    Dump {
        /// Map name (see `map list`).
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

/// weftctl failures.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    /// The API call failed.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// A local problem (file unreadable, ...).
    #[error("{0}")]
    Local(String),
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

fn print<T: serde::Serialize>(
    output: Output,
    value: &T,
    table: impl FnOnce(&T) -> String,
) -> Result<(), CtlError> {
    match output {
        Output::Json => println!(
            "{}",
            serde_json::to_string_pretty(value)
                .map_err(|e| CtlError::Local(format!("encoding the output as JSON: {e}")))?
        ),
        Output::Table => {
            let text = table(value);
            if !text.is_empty() {
                println!("{}", text.trim_end_matches('\n'));
            }
        }
    }
    Ok(())
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
            let kv: Value = client.get("/v1/kvstore").await?;
            match cli.output {
                Output::Json => {
                    let mut v = serde_json::to_value(&s)
                        .map_err(|e| CtlError::Local(format!("encoding the status: {e}")))?;
                    if let Value::Object(fields) = &mut v {
                        fields.insert("kvstore".into(), kv);
                    }
                    print(cli.output, &v, |_| String::new())?;
                }
                Output::Table => {
                    print(cli.output, &s, render::status_table)?;
                    print!("{}", render::kvstore_line(&kv));
                }
            }
        }
        Command::Endpoint(EndpointCmd::List) => {
            let eps: Vec<Endpoint> = client.get("/v1/endpoints").await?;
            print(cli.output, &eps, |e| render::endpoint_table(e))?;
        }
        Command::Endpoint(EndpointCmd::Get { id }) => {
            let ep: Endpoint = client.get(&format!("/v1/endpoints/{id}")).await?;
            print(cli.output, &ep, |e| {
                render::endpoint_table(std::slice::from_ref(e))
            })?;
        }
        Command::Ipam(IpamCmd::List) => {
            let allocs: Vec<Allocation> = client.get("/v1/ipam").await?;
            print(cli.output, &allocs, |a| render::ipam_table(a))?;
        }
        Command::Endpoint(EndpointCmd::Labels { id, add, remove }) => {
            let body = serde_json::json!({"add": add, "remove": remove});
            let ep: Endpoint = client
                .post(&format!("/v1/endpoints/{id}/labels"), &body)
                .await?;
            print(cli.output, &ep, |e| {
                render::endpoint_table(std::slice::from_ref(e))
            })?;
        }
        Command::Policy(cmd) => policy(&client, cli.output, cmd).await?,
        Command::Identity(IdentityCmd::List) => {
            let v: Value = client.get("/v1/identities").await?;
            print(cli.output, &v, render::identity_table)?;
        }
        Command::Node(NodeCmd::List) => {
            let v: Value = client.get("/v1/nodes").await?;
            print(cli.output, &v, render::node_table)?;
        }
        Command::Map(MapCmd::List) => {
            let v: Value = client.get("/v1/maps").await?;
            print(cli.output, &v, render::map_list_table)?;
        }
        Command::Map(MapCmd::Dump { name }) => {
            let v: Value = client.get(&format!("/v1/maps/{name}")).await?;
            print(cli.output, &v, render::map_dump_lines)?;
        }
        Command::Map(MapCmd::Verify) => {
            let v: Value = client.get("/v1/verify").await?;
            print(cli.output, &v, |v| {
                let problems: Vec<&str> = v["problems"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect();
                let head = format!(
                    "{} endpoints, {} policy slots, {} policy blocks, {} ipcache prefixes: {}",
                    v["endpoints"],
                    v["slots"],
                    v["policy_entries"],
                    v["ipcache_entries"],
                    if problems.is_empty() {
                        "consistent"
                    } else {
                        "INCONSISTENT"
                    }
                );
                std::iter::once(head)
                    .chain(problems.iter().map(|p| format!("  {}", p.escape_debug())))
                    .collect::<Vec<_>>()
                    .join("\n")
            })?;
            if v.get("consistent") != Some(&Value::Bool(true)) {
                return Err(CtlError::Local(
                    "the kernel maps disagree with the control plane (see above)".into(),
                ));
            }
        }
        Command::Monitor => monitor(&client, cli.output).await?,
    }
    Ok(())
}

/// `ep:ID`/`ID` → endpoint, an IP → ip, otherwise comma-separated labels.
fn trace_peer(s: &str) -> TracePeerRequest {
    let s = s.trim();
    if let Ok(ip) = s.parse() {
        return TracePeerRequest {
            ip: Some(ip),
            ..TracePeerRequest::default()
        };
    }
    if let Ok(id) = s.trim_start_matches("ep:").parse() {
        return TracePeerRequest {
            endpoint: Some(id),
            ..TracePeerRequest::default()
        };
    }
    TracePeerRequest {
        labels: s
            .split(',')
            .filter(|p| !p.is_empty())
            .map(str::to_owned)
            .collect(),
        ..TracePeerRequest::default()
    }
}

async fn policy(client: &Client, output: Output, cmd: PolicyCmd) -> Result<(), CtlError> {
    match cmd {
        PolicyCmd::Import { file, wait } => {
            let content = std::fs::read_to_string(&file)
                .map_err(|e| CtlError::Local(format!("cannot read {}: {e}", file.display())))?;
            let name = file.display().to_string();
            let body = serde_json::json!({"file": name, "content": content});
            let r: ImportResult = client.post("/v1/policies", &body).await?;
            if wait {
                wait_revision(client, r.revision).await?;
            }
            match output {
                Output::Json => print(output, &r, |_| String::new())?,
                Output::Table => {
                    println!(
                        "revision {} ({} rules; {} endpoints regenerated in {:.2} ms)",
                        r.revision, r.rules, r.regenerated, r.elapsed_ms
                    );
                    for w in &r.warnings {
                        eprintln!("warning: {w}");
                    }
                }
            }
        }
        PolicyCmd::List => {
            let v: Value = client.get("/v1/policies").await?;
            print(output, &v, render::policy_table)?;
        }
        PolicyCmd::Delete { labels, all } => {
            let path = if all {
                "/v1/policies?all=true".to_string()
            } else {
                format!("/v1/policies?labels={}", labels.join(","))
            };
            let r: ImportResult = client.delete(&path).await?;
            match output {
                Output::Json => print(output, &r, |_| String::new())?,
                Output::Table => println!("revision {} ({} rules left)", r.revision, r.rules),
            }
        }
        PolicyCmd::Trace {
            src,
            dst,
            dport,
            proto,
        } => {
            let req = TraceRequest {
                src: trace_peer(&src),
                dst: trace_peer(&dst),
                port: dport,
                protocol: proto,
            };
            let t: TraceResult = client.post("/v1/policy/trace", &req).await?;
            print(output, &t, |t| {
                format!(
                    "verdict: {}\nsource identity {} egress: {}\ndestination identity {} ingress: {}\n",
                    t.verdict.to_uppercase(),
                    t.src_identity,
                    t.egress.as_deref().unwrap_or("not a local endpoint"),
                    t.dst_identity,
                    t.ingress.as_deref().unwrap_or("not a local endpoint"),
                )
            })?;
        }
    }
    Ok(())
}

/// Polls until every ready endpoint reports `revision` or later.
async fn wait_revision(client: &Client, revision: u64) -> Result<(), CtlError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let eps: Vec<Endpoint> = client.get("/v1/endpoints").await?;
        let behind = eps
            .iter()
            .filter(|e| e.state == weft_api::EndpointState::Ready && e.policy_revision < revision)
            .count();
        if behind == 0 {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(CtlError::Local(format!(
                "{behind} endpoint(s) still below revision {revision} after 30 s"
            )));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn monitor(client: &Client, output: Output) -> Result<(), CtlError> {
    use std::io::Write;
    let mut pending = Vec::new();
    client
        .stream("/v1/monitor", |chunk| {
            pending.extend_from_slice(chunk);
            while let Some(pos) = pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = pending.drain(..=pos).collect();
                let text =
                    String::from_utf8_lossy(line.strip_suffix(b"\n").unwrap_or(&line)).into_owned();
                let out = match output {
                    Output::Json => text,
                    Output::Table => serde_json::from_str::<Value>(&text)
                        .map_or(text, |v| render::event_line(&v)),
                };
                let mut stdout = std::io::stdout().lock();
                if writeln!(stdout, "{out}")
                    .and_then(|()| stdout.flush())
                    .is_err()
                {
                    return false;
                }
            }
            true
        })
        .await?;
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
        // The manager binds its socket once restored (ready then, except in Kubernetes mode,
        // where healthz answers 503 until the initial lists are in), so until then a probe is a
        // failed connect() or a 503: cheap enough to poll often, and the poll interval is added
        // to every measured restart (bench-restart times `status --wait`).
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
