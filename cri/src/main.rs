//! weft-cri: drives a container runtime over the CRI gRPC API (runtime.v1) the way kubelet does,
//! for Weft's containerd end-to-end test and benchmark. crictl is not packaged here; this covers
//! the pod-sandbox calls those need. Output is JSON on stdout (or a bare id for `run`).

mod client;
mod cycle;
mod spec;

use clap::{Args, Parser, Subcommand};
use client::Cri;
use spec::PodSpec;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "weft-cri", version, about)]
struct Cli {
    /// containerd's gRPC socket (its `grpc.address`).
    #[arg(long, default_value = "/run/containerd/containerd.sock")]
    socket: PathBuf,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Args, Clone)]
struct PodArgs {
    /// Pod name (metadata.name).
    #[arg(long)]
    name: String,
    /// Pod namespace (metadata.namespace).
    #[arg(long, default_value = "default")]
    namespace: String,
    /// Pod uid (default: derived from namespace and name).
    #[arg(long, default_value = "")]
    uid: String,
    /// Sandbox label KEY=VALUE (repeatable).
    #[arg(long = "label", value_parser = spec::key_value)]
    labels: Vec<(String, String)>,
    /// Pod annotation KEY=VALUE (repeatable).
    #[arg(long = "annotation", value_parser = spec::key_value)]
    annotations: Vec<(String, String)>,
    /// Port mapping `[HOST_IP:]HOST_PORT:CONTAINER_PORT[/tcp|udp|sctp]` (repeatable).
    #[arg(long = "port", value_parser = spec::port)]
    ports: Vec<k8s_cri::v1::PortMapping>,
    /// cgroup parent of the sandbox (cgroupfs path, e.g. /weft-test).
    #[arg(long, default_value = "")]
    cgroup_parent: String,
}

impl PodArgs {
    fn spec(self) -> PodSpec {
        PodSpec {
            name: self.name,
            namespace: self.namespace,
            uid: self.uid,
            labels: self.labels,
            annotations: self.annotations,
            ports: self.ports,
            cgroup_parent: self.cgroup_parent,
        }
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// `RunPodSandbox`; prints the sandbox id.
    Run(PodArgs),
    /// `PodSandboxStatus` (verbose); prints {id,name,namespace,state,ip,netns,pid,...}.
    Status {
        /// Sandbox id.
        id: String,
    },
    /// `StopPodSandbox`.
    Stop {
        /// Sandbox id.
        id: String,
    },
    /// `RemovePodSandbox`.
    Remove {
        /// Sandbox id.
        id: String,
    },
    /// `ListPodSandbox`; prints a JSON array.
    List,
    /// Runs COUNT pods named NAME-i through run → status → stop → remove, PARALLEL at a time;
    /// prints per-pod latencies and medians. Exits 1 if any pod failed.
    Cycle {
        #[command(flatten)]
        pod: PodArgs,
        /// How many pods.
        #[arg(long, default_value_t = 10)]
        count: usize,
        /// How many at once.
        #[arg(long, default_value_t = 1)]
        parallel: usize,
    },
}

fn print(v: &impl serde::Serialize) -> Result<(), client::CriError> {
    let text = serde_json::to_string(v).map_err(|e| client::CriError::Output(e.to_string()))?;
    println!("{text}");
    Ok(())
}

async fn run(cli: Cli) -> Result<bool, client::CriError> {
    let mut cri = Cri::connect(&cli.socket).await?;
    match cli.cmd {
        Cmd::Run(pod) => println!("{}", cri.run(pod.spec().config()).await?),
        Cmd::Status { id } => print(&cri.status(&id).await?)?,
        Cmd::Stop { id } => cri.stop(&id).await?,
        Cmd::Remove { id } => cri.remove(&id).await?,
        Cmd::List => print(&cri.list().await?)?,
        Cmd::Cycle {
            pod,
            count,
            parallel,
        } => {
            let report = cycle::cycle(&cri, &pod.spec(), count, parallel).await;
            print(&report)?;
            return Ok(report.errors.is_empty());
        }
    }
    Ok(true)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("weft-cri: cannot build the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("weft-cri: {e}");
            ExitCode::FAILURE
        }
    }
}
