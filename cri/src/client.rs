//! The CRI `RuntimeService` over containerd's unix socket: one tonic channel, the sandbox calls the
//! tests need, and the netns path dug out of containerd's verbose status.

use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    ListPodSandboxRequest, PodSandboxConfig, PodSandboxStatusRequest, RemovePodSandboxRequest,
    RunPodSandboxRequest, StopPodSandboxRequest,
};
use std::path::{Path, PathBuf};
use tonic::transport::{Channel, Endpoint, Uri};

/// What can go wrong talking to the runtime.
#[derive(Debug, thiserror::Error)]
pub enum CriError {
    /// The socket could not be reached.
    #[error("cannot connect to {path}: {source} (is containerd running with this grpc address?)")]
    Connect {
        /// The socket.
        path: PathBuf,
        /// Why.
        source: tonic::transport::Error,
    },
    /// The runtime answered with an error.
    #[error("{call}: {status}")]
    Call {
        /// The RPC.
        call: &'static str,
        /// The runtime's status (code and message).
        status: Box<tonic::Status>,
    },
    /// The runtime answered without a field the call must return.
    #[error("{0}: the runtime's answer has no status")]
    NoStatus(&'static str),
    /// The answer could not be written out as JSON.
    #[error("encoding the output as JSON: {0}")]
    Output(String),
}

fn call(call: &'static str) -> impl Fn(tonic::Status) -> CriError {
    move |status| CriError::Call {
        call,
        status: Box::new(status),
    }
}

/// A sandbox as the tests see it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SandboxView {
    /// Sandbox id.
    pub id: String,
    /// Metadata name.
    pub name: String,
    /// Metadata namespace.
    pub namespace: String,
    /// `SANDBOX_READY` or `SANDBOX_NOTREADY`.
    pub state: String,
    /// The pod IP the runtime got from CNI (empty when not ready).
    pub ip: String,
    /// Further pod IPs (dual stack).
    pub additional_ips: Vec<String>,
    /// The network namespace path the runtime gave CNI (verbose status only).
    pub netns: Option<String>,
    /// The sandbox (pause) process id (verbose status only).
    pub pid: Option<u64>,
}

/// A connected `RuntimeService` client.
#[derive(Clone)]
pub struct Cri {
    inner: RuntimeServiceClient<Channel>,
}

impl Cri {
    /// Connects to containerd's CRI socket.
    pub async fn connect(path: &Path) -> Result<Self, CriError> {
        let socket = path.to_owned();
        // The URI is ignored: the connector always dials the unix socket.
        let channel = Endpoint::from_static("http://[::]:50051")
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let socket = socket.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(socket).await?;
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                }
            }))
            .await
            .map_err(|source| CriError::Connect {
                path: path.to_owned(),
                source,
            })?;
        Ok(Self {
            inner: RuntimeServiceClient::new(channel),
        })
    }

    /// `RunPodSandbox`: returns the sandbox id.
    pub async fn run(&mut self, config: PodSandboxConfig) -> Result<String, CriError> {
        let r = self
            .inner
            .run_pod_sandbox(RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: String::new(),
            })
            .await
            .map_err(call("RunPodSandbox"))?;
        Ok(r.into_inner().pod_sandbox_id)
    }

    /// `StopPodSandbox` (containerd: CNI DEL with the netns and prevResult).
    pub async fn stop(&mut self, id: &str) -> Result<(), CriError> {
        self.inner
            .stop_pod_sandbox(StopPodSandboxRequest {
                pod_sandbox_id: id.to_owned(),
            })
            .await
            .map_err(call("StopPodSandbox"))?;
        Ok(())
    }

    /// `RemovePodSandbox` (containerd: a second DEL without netns or prevResult).
    pub async fn remove(&mut self, id: &str) -> Result<(), CriError> {
        self.inner
            .remove_pod_sandbox(RemovePodSandboxRequest {
                pod_sandbox_id: id.to_owned(),
            })
            .await
            .map_err(call("RemovePodSandbox"))?;
        Ok(())
    }

    /// `PodSandboxStatus`, verbose (containerd's info carries the netns path and pid).
    pub async fn status(&mut self, id: &str) -> Result<SandboxView, CriError> {
        let r = self
            .inner
            .pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: id.to_owned(),
                verbose: true,
            })
            .await
            .map_err(call("PodSandboxStatus"))?
            .into_inner();
        let s = r.status.ok_or(CriError::NoStatus("PodSandboxStatus"))?;
        let meta = s.metadata.unwrap_or_default();
        let net = s.network.unwrap_or_default();
        let info = r
            .info
            .get("info")
            .and_then(|i| serde_json::from_str::<serde_json::Value>(i).ok());
        Ok(SandboxView {
            id: s.id,
            name: meta.name,
            namespace: meta.namespace,
            state: state_name(s.state),
            ip: net.ip,
            additional_ips: net.additional_ips.into_iter().map(|i| i.ip).collect(),
            netns: info.as_ref().and_then(netns_of),
            pid: info
                .as_ref()
                .and_then(|i| i.get("pid"))
                .and_then(serde_json::Value::as_u64),
        })
    }

    /// `ListPodSandbox` (all of them; the scripts filter).
    pub async fn list(&mut self) -> Result<Vec<SandboxView>, CriError> {
        let r = self
            .inner
            .list_pod_sandbox(ListPodSandboxRequest { filter: None })
            .await
            .map_err(call("ListPodSandbox"))?
            .into_inner();
        Ok(r.items
            .into_iter()
            .map(|s| {
                let meta = s.metadata.unwrap_or_default();
                SandboxView {
                    id: s.id,
                    name: meta.name,
                    namespace: meta.namespace,
                    state: state_name(s.state),
                    ip: String::new(),
                    additional_ips: Vec::new(),
                    netns: None,
                    pid: None,
                }
            })
            .collect())
    }
}

fn state_name(state: i32) -> String {
    k8s_cri::v1::PodSandboxState::try_from(state).map_or_else(
        |_| format!("UNKNOWN({state})"),
        |s| s.as_str_name().to_owned(),
    )
}

/// containerd's verbose info: `runtimeSpec.linux.namespaces[type=network].path`.
fn netns_of(info: &serde_json::Value) -> Option<String> {
    info.pointer("/runtimeSpec/linux/namespaces")?
        .as_array()?
        .iter()
        .find(|ns| ns.get("type").and_then(serde_json::Value::as_str) == Some("network"))?
        .get("path")?
        .as_str()
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn netns_from_containerd_info() {
        let info = json!({"pid": 42, "runtimeSpec": {"linux": {"namespaces": [
            {"type": "pid"}, {"type": "network", "path": "/run/x/netns/cni-1"}]}}});
        assert_eq!(netns_of(&info).as_deref(), Some("/run/x/netns/cni-1"));
        assert_eq!(netns_of(&json!({"pid": 1})), None);
    }

    #[test]
    fn state_names() {
        assert_eq!(state_name(0), "SANDBOX_READY");
        assert_eq!(state_name(1), "SANDBOX_NOTREADY");
        assert_eq!(state_name(9), "UNKNOWN(9)");
    }
}
