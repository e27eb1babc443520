//! The network configuration on stdin, decoded and validated before anything is touched.

use crate::error::CniError;
use crate::version::SpecVersion;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use weft_api::{Attachment, Label};

/// Where weft-manager listens unless the config says otherwise (docs/ARCHITECTURE.md, "Contract").
pub const DEFAULT_SOCKET: &str = "/run/weft/manager.sock";
/// Default MTU of both veth ends.
pub const DEFAULT_MTU: u32 = 1500;

/// `dns` as the spec defines it; passed through to the result unchanged.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dns {
    /// Name servers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    /// Local domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// Search domains.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    /// Resolver options.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
struct RawArgs {
    #[serde(default)]
    cni: Option<RawCniArgs>,
}

/// `runtimeConfig`: only the capabilities Weft declares are read.
#[derive(Debug, Default, Deserialize)]
struct RawRuntimeConfig {
    /// containerd sends `null` for a pod without annotations.
    #[serde(rename = "io.kubernetes.cri.pod-annotations", default)]
    pod_annotations: Option<std::collections::BTreeMap<String, String>>,
    /// The `bandwidth` capability (bits per second; bursts are Weft's own, see `shaping`).
    #[serde(default)]
    bandwidth: Option<RawBandwidth>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawBandwidth {
    ingress_rate: Option<u64>,
    egress_rate: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
struct RawCniArgs {
    #[serde(default)]
    labels: Vec<Label>,
}

/// Unknown keys are ignored: conflists carry keys for other plugins and runtimes.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawNetConf {
    cni_version: Option<String>,
    name: Option<String>,
    #[serde(rename = "type")]
    plugin_type: Option<String>,
    socket: Option<PathBuf>,
    mtu: Option<u32>,
    log_file: Option<PathBuf>,
    log_level: Option<String>,
    dns: Option<Dns>,
    args: Option<RawArgs>,
    runtime_config: Option<RawRuntimeConfig>,
    prev_result: Option<serde_json::Value>,
    #[serde(rename = "cni.dev/valid-attachments")]
    valid_attachments: Option<Vec<Attachment>>,
}

/// A validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct NetConf {
    /// `cniVersion` as given (echoed in results).
    pub cni_version: String,
    /// Parsed version.
    pub version: SpecVersion,
    /// Network name.
    pub name: String,
    /// Manager socket.
    pub socket: PathBuf,
    /// MTU for both veth ends.
    pub mtu: u32,
    /// Append logs here instead of stderr.
    pub log_file: Option<PathBuf>,
    /// `error`, `warn`, `info`, `debug` or `trace`.
    pub log_level: tracing::Level,
    /// DNS for the result.
    pub dns: Option<Dns>,
    /// `args.cni.labels`.
    pub labels: Vec<Label>,
    /// Labels from `weft.io/label.*` pod annotations (see `annotations`; `labels` wins).
    pub annotation_labels: Vec<Label>,
    /// Rate limits from `runtimeConfig.bandwidth` or the pod's bandwidth annotations.
    pub bandwidth: crate::annotations::Bandwidth,
    /// `prevResult` (CHECK, DEL), raw: it may be in any supported version's format.
    pub prev_result: Option<serde_json::Value>,
    /// `cni.dev/valid-attachments` (GC).
    pub valid_attachments: Option<Vec<Attachment>>,
}

fn invalid(msg: impl Into<String>) -> CniError {
    CniError::InvalidConfig(msg.into())
}

fn parse_level(s: &str) -> Result<tracing::Level, CniError> {
    Ok(match s.to_ascii_lowercase().as_str() {
        "error" => tracing::Level::ERROR,
        "warn" | "warning" => tracing::Level::WARN,
        "info" => tracing::Level::INFO,
        "debug" => tracing::Level::DEBUG,
        "trace" => tracing::Level::TRACE,
        _ => {
            return Err(invalid(format!(
                "logLevel {s:?} is not one of error, warn, info, debug, trace"
            )));
        }
    })
}

/// Best effort `cniVersion` of whatever is on stdin, for error objects and VERSION.
#[must_use]
pub fn sniff_version(stdin: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(stdin).ok()?;
    v.get("cniVersion")?.as_str().map(str::to_owned)
}

/// Most labels accepted in `args.cni.labels` (the manager's limit too).
pub const MAX_LABELS: usize = 256;

/// The manager's label rules, checked here too so a bad netconf is code 7 before anything is
/// reserved: no whitespace or control characters (they would inject lines into logs and
/// weftctl output), no ',' and no '=' in keys, keys ≤ 317 bytes, values ≤ 1024 bytes.
fn check_labels(labels: &[Label]) -> Result<(), CniError> {
    if labels.len() > MAX_LABELS {
        return Err(invalid(format!(
            "args.cni.labels has {} labels; at most {MAX_LABELS} are accepted",
            labels.len()
        )));
    }
    let bad = |c: char| c.is_whitespace() || c.is_control() || c == ',';
    for l in labels {
        let shown: String = l.key.chars().take(80).collect();
        if l.key.len() > 317 || l.key.chars().any(|c| bad(c) || c == '=') {
            return Err(invalid(format!(
                "args.cni.labels key {shown:?} is longer than 317 bytes or holds whitespace, control characters, ',' or '='"
            )));
        }
        if l.value.len() > 1024 || l.value.chars().any(bad) {
            return Err(invalid(format!(
                "args.cni.labels value of {shown:?} is longer than 1024 bytes or holds whitespace, control characters or ','"
            )));
        }
    }
    Ok(())
}

impl NetConf {
    /// Decodes (code 6 if stdin is not a JSON object) then validates (code 7 for a bad field,
    /// code 1 for an unsupported version).
    pub fn parse(stdin: &[u8]) -> Result<Self, CniError> {
        let value: serde_json::Value =
            serde_json::from_slice(stdin).map_err(|e| CniError::Decode(e.to_string()))?;
        if !value.is_object() {
            return Err(CniError::Decode("expected a JSON object".into()));
        }
        // The path names the offending field ("mtu: invalid type ..."), which serde alone omits.
        let raw: RawNetConf = serde_path_to_error::deserialize(value)
            .map_err(|e| invalid(format!("{}: {}", e.path(), e.inner())))?;

        let cni_version = raw
            .cni_version
            .ok_or_else(|| invalid("cniVersion is missing"))?;
        let version = SpecVersion::parse(&cni_version)?;
        let name = raw.name.ok_or_else(|| invalid("name is missing"))?;
        let mut chars = name.chars();
        if !(chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
            && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
        {
            return Err(invalid(format!(
                "name {name:?} has characters outside [a-zA-Z0-9_.-]"
            )));
        }
        match raw.plugin_type.as_deref() {
            Some("weft") => {}
            other => return Err(invalid(format!("type must be \"weft\", got {other:?}"))),
        }
        let socket = raw.socket.unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET));
        if !socket.is_absolute() {
            return Err(invalid(format!(
                "socket {} must be an absolute path",
                socket.display()
            )));
        }
        let mtu = raw.mtu.unwrap_or(DEFAULT_MTU);
        // 68: the IPv4 minimum (RFC 791); 65535: the largest a veth accepts.
        if !(68..=65535).contains(&mtu) {
            return Err(invalid(format!("mtu {mtu} is outside 68..=65535")));
        }
        if raw
            .log_file
            .as_ref()
            .is_some_and(|p| p.as_os_str().is_empty())
        {
            return Err(invalid("logFile is empty"));
        }
        let log_level = parse_level(raw.log_level.as_deref().unwrap_or("info"))?;
        let labels = raw
            .args
            .and_then(|a| a.cni)
            .map(|c| c.labels)
            .unwrap_or_default();
        if let Some(l) = labels.iter().find(|l| l.key.is_empty()) {
            return Err(invalid(format!(
                "args.cni.labels has an empty key (value {:?})",
                l.value
            )));
        }
        check_labels(&labels)?;
        let runtime = raw.runtime_config.unwrap_or_default();
        let pod_annotations = runtime.pod_annotations.unwrap_or_default();
        let annotation_labels = crate::annotations::labels(&pod_annotations)?;
        let rates = runtime
            .bandwidth
            .map_or((None, None), |b| (b.ingress_rate, b.egress_rate));
        let bandwidth = crate::annotations::bandwidth(&pod_annotations, rates)?;
        check_labels(&annotation_labels)?;
        Ok(Self {
            cni_version,
            version,
            name,
            socket,
            mtu,
            log_file: raw.log_file,
            log_level,
            dns: raw.dns,
            labels,
            annotation_labels,
            bandwidth,
            prev_result: raw.prev_result,
            valid_attachments: raw.valid_attachments,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: &serde_json::Value) -> Result<NetConf, CniError> {
        NetConf::parse(v.to_string().as_bytes())
    }

    fn base() -> serde_json::Value {
        json!({"cniVersion": "1.0.0", "name": "weft-net", "type": "weft"})
    }

    fn with(key: &str, val: serde_json::Value) -> serde_json::Value {
        let mut b = base();
        b[key] = val;
        b
    }

    #[test]
    fn defaults() {
        let c = parse(&base()).unwrap();
        assert_eq!(c.socket, PathBuf::from(DEFAULT_SOCKET));
        assert_eq!(c.mtu, 1500);
        assert_eq!(c.log_level, tracing::Level::INFO);
        assert!(c.labels.is_empty() && c.prev_result.is_none() && c.dns.is_none());
    }

    #[test]
    fn full_config() {
        let mut v = base();
        v["socket"] = json!("/tmp/m.sock");
        v["mtu"] = json!(9000);
        v["logLevel"] = json!("debug");
        v["logFile"] = json!("/tmp/weft.log");
        v["dns"] = json!({"nameservers": ["10.0.0.10"], "search": ["svc"]});
        v["args"] = json!({"cni": {"labels": [{"key": "app", "value": "web"}]}});
        v["runtimeConfig"] = json!({"portMappings": [], "whatever": 1,
            "io.kubernetes.cri.pod-annotations": {"weft.io/label.tier": "db", "other": "x"}});
        v["cni.dev/valid-attachments"] = json!([{"containerID": "c1", "ifname": "eth0"}]);
        v["someOtherPluginKey"] = json!(true);
        let c = parse(&v).unwrap();
        assert_eq!(c.mtu, 9000);
        assert_eq!(c.socket, PathBuf::from("/tmp/m.sock"));
        assert_eq!(c.labels[0].key, "app");
        assert_eq!(c.annotation_labels.len(), 1);
        assert_eq!(c.annotation_labels[0].key, "tier");
        assert_eq!(c.dns.unwrap().nameservers, vec!["10.0.0.10"]);
        assert_eq!(c.valid_attachments.unwrap()[0].container_id, "c1");
    }

    #[test]
    fn null_pod_annotations_are_none() {
        let v = with(
            "runtimeConfig",
            json!({"io.kubernetes.cri.pod-annotations": null, "bandwidth": null}),
        );
        assert!(parse(&v).unwrap().annotation_labels.is_empty());
    }

    #[test]
    fn decode_failures_are_code_6() {
        for raw in ["", "not json", "[1,2]", "\"x\"", "{\"cniVersion\": "] {
            assert_eq!(
                NetConf::parse(raw.as_bytes()).unwrap_err().code(),
                6,
                "{raw:?}"
            );
        }
    }

    #[test]
    fn bad_fields_are_code_7() {
        let mut no_version = base();
        no_version.as_object_mut().unwrap().remove("cniVersion");
        let mut no_name = base();
        no_name.as_object_mut().unwrap().remove("name");
        let mut no_type = base();
        no_type.as_object_mut().unwrap().remove("type");
        let cases = [
            no_version,
            no_name,
            no_type,
            with("type", json!("ptp")),
            with("name", json!("bad name")),
            with("mtu", json!("1500")),
            with("mtu", json!(10)),
            with("mtu", json!(70000)),
            with("socket", json!("relative.sock")),
            with("logLevel", json!("loud")),
            with("logFile", json!("")),
            with("dns", json!("8.8.8.8")),
            with(
                "args",
                json!({"cni": {"labels": [{"key": "", "value": "x"}]}}),
            ),
            with("args", json!({"cni": {"labels": {"app": "web"}}})),
            with(
                "runtimeConfig",
                json!({"io.kubernetes.cri.pod-annotations": {"weft.io/label.": "x"}}),
            ),
            with(
                "runtimeConfig",
                json!({"io.kubernetes.cri.pod-annotations": ["not", "a", "map"]}),
            ),
            with("cni.dev/valid-attachments", json!([{"ifname": "eth0"}])),
        ];
        for c in cases {
            assert_eq!(parse(&c).unwrap_err().code(), 7, "{c}");
        }
    }

    #[test]
    fn unsupported_version_is_code_1() {
        for v in ["0.2.0", "1.2.0", "2.0.0"] {
            assert_eq!(
                parse(&with("cniVersion", json!(v))).unwrap_err().code(),
                1,
                "{v}"
            );
        }
    }

    #[test]
    fn sniff() {
        assert_eq!(
            sniff_version(b"{\"cniVersion\":\"0.4.0\"}").as_deref(),
            Some("0.4.0")
        );
        assert_eq!(sniff_version(b"garbage"), None);
    }
}
