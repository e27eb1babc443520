//! The kube client: from a kubeconfig file, or inferred (in-cluster service account when
//! running in a pod, else `$KUBECONFIG` / `~/.kube/config`), plus the two Node calls the
//! manager makes outside the watchers.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use std::path::Path;

/// Why no client could be built, or a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The kubeconfig file is unreadable or invalid.
    #[error(
        "kubeconfig {path}: {detail} (pass a valid file to --kubeconfig, or run in a pod with a service account)"
    )]
    Kubeconfig {
        /// Path.
        path: String,
        /// What went wrong.
        detail: String,
    },
    /// No configuration could be inferred.
    #[error(
        "no Kubernetes configuration: {0} (run in a pod with a service account, or pass --kubeconfig PATH)"
    )]
    Infer(String),
    /// The client could not be built (e.g. TLS settings).
    #[error("cannot build the Kubernetes client: {0}")]
    Build(String),
    /// An API call failed.
    #[error("Kubernetes API: {what}: {source}")]
    Api {
        /// Which call.
        what: String,
        /// Cause.
        source: kube::Error,
    },
}

/// A client for `kubeconfig`, or the inferred configuration when `None`.
pub async fn client(kubeconfig: Option<&Path>) -> Result<Client, ClientError> {
    let config = match kubeconfig {
        Some(p) => {
            let err = |detail: String| ClientError::Kubeconfig {
                path: p.display().to_string(),
                detail,
            };
            let kc = Kubeconfig::read_from(p).map_err(|e| err(e.to_string()))?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|e| err(e.to_string()))?
        }
        None => Config::infer()
            .await
            .map_err(|e| ClientError::Infer(e.to_string()))?,
    };
    Client::try_from(config).map_err(|e| ClientError::Build(e.to_string()))
}

/// GET this node.
pub async fn fetch_node(client: &Client, name: &str) -> Result<Node, ClientError> {
    Api::<Node>::all(client.clone())
        .get(name)
        .await
        .map_err(|source| ClientError::Api {
            what: format!("get node {name}"),
            source,
        })
}

/// Merge-patches this node's annotations (see [`crate::node::annotation_patch`]).
pub async fn annotate_node(
    client: &Client,
    name: &str,
    patch: &serde_json::Value,
) -> Result<(), ClientError> {
    Api::<Node>::all(client.clone())
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map(|_| ())
        .map_err(|source| ClientError::Api {
            what: format!("annotate node {name}"),
            source,
        })
}
