//! What each command asks the manager and how its answer is printed.

use serde_json::Value;
use std::time::{Duration, Instant};
use weft_api::client::{Client, ClientError};
use weft_api::{
    Allocation, Endpoint, ImportResult, LabelsRequest, StatusResponse, TracePeerRequest,
    TraceRequest, TraceResult, VerifyReport,
};

use crate::cli::{
    Cli, Command, EndpointCmd, IdentityCmd, IpamCmd, MapCmd, NodeCmd, Output, PolicyCmd, ServiceCmd,
};
use crate::render;

/// weftctl failures.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    /// The API call failed.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The policy file could not be read.
    #[error("cannot read {path}: {source}")]
    ReadFile {
        /// The file.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// An answer could not be printed as JSON.
    #[error("encoding the output as JSON: {0}")]
    Encode(#[from] serde_json::Error),
    /// `map verify` found the kernel maps disagreeing with the control plane.
    #[error("the kernel maps disagree with the control plane (see above)")]
    Inconsistent,
    /// `policy import --wait` ran out of time.
    #[error("{behind} endpoint(s) still below revision {revision} after {secs} s")]
    RevisionTimeout {
        /// Endpoints not there yet.
        behind: usize,
        /// The revision waited for.
        revision: u64,
        /// Seconds waited.
        secs: u64,
    },
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
        Output::Json => println!("{}", serde_json::to_string_pretty(value)?),
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
                    let mut v = serde_json::to_value(&s)?;
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
            let body = LabelsRequest { add, remove };
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
        Command::Service(ServiceCmd::List) => {
            let v: Value = client.get("/v1/services").await?;
            print(cli.output, &v, render::service_table)?;
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
            let r: VerifyReport = client.get("/v1/verify").await?;
            print(cli.output, &r, render::verify_lines)?;
            if !r.consistent {
                return Err(CtlError::Inconsistent);
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
            // The file's bytes as they are: the manager checks that they are UTF-8 text.
            let content = std::fs::read(&file).map_err(|source| CtlError::ReadFile {
                path: file.display().to_string(),
                source,
            })?;
            let path = weft_api::policy::import_file_path(&file.display().to_string());
            let r: ImportResult = client.put_bytes(&path, content).await?;
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
                weft_api::policy::delete_policies_path(&labels)
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
    const SECS: u64 = 30;
    let deadline = Instant::now() + Duration::from_secs(SECS);
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
            return Err(CtlError::RevisionTimeout {
                behind,
                revision,
                secs: SECS,
            });
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
