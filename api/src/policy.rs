//! Policy calls: import, delete, trace, identities and endpoint labels (`/v1/policies`,
//! `/v1/policy/trace`, `/v1/identities`, `/v1/endpoints/{id}/labels`), and the consistency
//! check `/v1/verify`.

use serde::{Deserialize, Serialize};
use std::net::IpAddr;

/// `PUT /v1/policies?file=NAME`, the import that sends the file's bytes as the body (as Cilium's
/// `PUT /policy` takes a policy): the path naming `file`, percent-encoded. What weftctl uses: a
/// large file is not encoded into a JSON string and decoded again on the way.
#[must_use]
pub fn import_file_path(file: &str) -> String {
    policies_path("file", file)
}

/// `DELETE /v1/policies?labels=...`: the path deleting the rules that carry every label of
/// `labels` (`k=v` or `source:k=v`), joined by `,` and percent-encoded (a `+`, `&` or `#` in a
/// label reaches the manager as written).
#[must_use]
pub fn delete_policies_path(labels: &[String]) -> String {
    policies_path("labels", &labels.join(","))
}

/// `/v1/policies?NAME=VALUE`, the value percent-encoded.
fn policies_path(name: &str, value: &str) -> String {
    let query = form_urlencoded::Serializer::new(String::new())
        .append_pair(name, value)
        .finish();
    format!("/v1/policies?{query}")
}

/// `POST /v1/policies`: the file's name (for error messages) and its text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImportRequest {
    /// The file's name as the operator gave it.
    pub file: String,
    /// Cilium JSON/YAML or a Kubernetes `NetworkPolicy`.
    pub content: String,
}

/// Answer to an import or delete.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImportResult {
    /// Repository revision after the change; every endpoint enforces it when this returns.
    pub revision: u64,
    /// Rules in the repository now.
    pub rules: usize,
    /// Endpoints whose maps changed.
    pub regenerated: usize,
    /// Wall time of the whole change, regeneration included.
    pub elapsed_ms: f64,
    /// What the file gets enforced with a caveat (e.g. a CIDR with host bits set: enforced as
    /// the network it names).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// One side of a trace: exactly one field set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TracePeerRequest {
    /// A local endpoint.
    #[serde(default)]
    pub endpoint: Option<u32>,
    /// Labels (`k=v`) that pick the local endpoints carrying all of them.
    #[serde(default)]
    pub labels: Vec<String>,
    /// An address, resolved as the datapath's ipcache would.
    #[serde(default)]
    pub ip: Option<IpAddr>,
}

/// `POST /v1/policy/trace`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceRequest {
    /// Source.
    pub src: TracePeerRequest,
    /// Destination.
    pub dst: TracePeerRequest,
    /// Destination port (0 for ICMP).
    #[serde(default)]
    pub port: u16,
    /// `tcp`, `udp`, `sctp`, `icmp`, `icmpv6` or a number.
    pub protocol: String,
}

/// The verdict and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceResult {
    /// `allow` or `deny`.
    pub verdict: String,
    /// Source identity.
    pub src_identity: u32,
    /// Destination identity.
    pub dst_identity: u32,
    /// The source's egress decision, when it is a local endpoint.
    pub egress: Option<String>,
    /// The destination's ingress decision, when it is a local endpoint.
    pub ingress: Option<String>,
}

/// One identity (`GET /v1/identities`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdentityInfo {
    /// Numeric id.
    pub id: u32,
    /// Labels, or `cidr:<prefix>` for CIDR identities, or `reserved:<name>`.
    pub labels: Vec<String>,
    /// Endpoints or rules holding it.
    pub references: u64,
    /// `local` (allocated on this node: CIDR and reserved identities, and every identity in
    /// single-node mode), or `kvstore` (numbered by the cluster).
    #[serde(default = "local_source")]
    pub source: String,
}

/// [`IdentityInfo::source`] of an identity numbered on this node.
#[must_use]
pub fn local_source() -> String {
    "local".into()
}

/// `POST /v1/endpoints/{id}/labels`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabelsRequest {
    /// Add or replace `k=v`.
    #[serde(default)]
    pub add: Vec<String>,
    /// Remove key `k`.
    #[serde(default)]
    pub remove: Vec<String>,
}

/// The label the Kubernetes watchers put on every rule they add, as `GET /v1/policies` shows
/// it, so `weftctl policy list` tells cluster rules from imported ones.
pub const CLUSTER_POLICY_LABEL: &str = "k8s:io.weft.policy.origin=cluster";

/// `GET /v1/verify`: where the kernel disagrees with the control plane (empty: consistent).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyReport {
    /// True when nothing disagrees.
    pub consistent: bool,
    /// Ready endpoints checked.
    pub endpoints: usize,
    /// Policy slots in use.
    pub slots: usize,
    /// Policy blocks expected in the kernel.
    pub policy_entries: usize,
    /// ipcache prefixes expected.
    pub ipcache_entries: usize,
    /// One line per disagreement (at most a few per endpoint).
    pub problems: Vec<String>,
}

#[cfg(test)]
mod path_tests {
    use super::{delete_policies_path, import_file_path};

    /// The query of `path` as the manager's `Query` extractor decodes it.
    fn query(path: &str) -> Vec<(String, String)> {
        let q = path.split_once('?').map_or("", |(_, q)| q);
        form_urlencoded::parse(q.as_bytes()).into_owned().collect()
    }

    #[test]
    fn names_and_labels_reach_the_manager_as_written() {
        let file = "dir with space/a&b=c+d#e%f?.yaml";
        assert_eq!(
            query(&import_file_path(file)),
            [("file".into(), file.into())]
        );
        let labels = vec!["name=c++".to_owned(), "k8s:a/b=x&y#z".to_owned()];
        assert_eq!(
            query(&delete_policies_path(&labels)),
            [("labels".into(), "name=c++,k8s:a/b=x&y#z".into())]
        );
    }
}
