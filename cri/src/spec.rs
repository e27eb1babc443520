//! Command-line pod descriptions turned into a `PodSandboxConfig`, the way kubelet fills it.

use k8s_cri::v1::{
    LinuxPodSandboxConfig, LinuxSandboxSecurityContext, NamespaceMode, NamespaceOption,
    PodSandboxConfig, PodSandboxMetadata, PortMapping, Protocol,
};
use std::collections::HashMap;

/// A flag value that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    /// `--label`/`--annotation` without `=`.
    #[error("{0:?} is not KEY=VALUE")]
    NotKeyValue(String),
    /// `--port` in a bad shape.
    #[error("port mapping {0:?}: {1} (expected [HOST_IP:]HOST_PORT:CONTAINER_PORT[/tcp|udp|sctp])")]
    Port(String, &'static str),
}

/// `KEY=VALUE`.
pub fn key_value(s: &str) -> Result<(String, String), SpecError> {
    let (k, v) = s
        .split_once('=')
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| SpecError::NotKeyValue(s.to_owned()))?;
    Ok((k.to_owned(), v.to_owned()))
}

/// `[HOST_IP:]HOST_PORT:CONTAINER_PORT[/PROTO]` (IPv4 host IPs only: the tests use IPv4).
pub fn port(s: &str) -> Result<PortMapping, SpecError> {
    let err = |why| SpecError::Port(s.to_owned(), why);
    let (rest, proto) = match s.split_once('/') {
        None => (s, Protocol::Tcp),
        Some((r, "tcp")) => (r, Protocol::Tcp),
        Some((r, "udp")) => (r, Protocol::Udp),
        Some((r, "sctp")) => (r, Protocol::Sctp),
        Some(_) => return Err(err("unknown protocol")),
    };
    let parts: Vec<&str> = rest.split(':').collect();
    let (host_ip, host, container) = match parts.as_slice() {
        [h, c] => ("", *h, *c),
        [ip, h, c] => (*ip, *h, *c),
        _ => return Err(err("wrong number of ':'")),
    };
    if !host_ip.is_empty() && host_ip.parse::<std::net::Ipv4Addr>().is_err() {
        return Err(err("host IP is not an IPv4 address"));
    }
    let num = |p: &str| {
        p.parse::<u16>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or(err("port is not 1-65535"))
    };
    Ok(PortMapping {
        protocol: proto.into(),
        container_port: i32::from(num(container)?),
        host_port: i32::from(num(host)?),
        host_ip: host_ip.to_owned(),
    })
}

/// What a pod is made of on the command line.
#[derive(Debug, Clone, Default)]
pub struct PodSpec {
    /// Metadata name.
    pub name: String,
    /// Metadata namespace.
    pub namespace: String,
    /// Metadata uid (a stable one is derived from namespace/name if empty).
    pub uid: String,
    /// Sandbox labels (containerd does not pass these to CNI).
    pub labels: Vec<(String, String)>,
    /// Sandbox annotations (passed to CNI under `io.kubernetes.cri.pod-annotations`).
    pub annotations: Vec<(String, String)>,
    /// Port mappings (passed to CNI under `portMappings`).
    pub ports: Vec<PortMapping>,
    /// cgroup parent (the tests keep every sandbox cgroup under one directory of their own).
    pub cgroup_parent: String,
}

impl PodSpec {
    /// The `RunPodSandbox` config kubelet would send for this pod.
    #[must_use]
    pub fn config(&self) -> PodSandboxConfig {
        let uid = if self.uid.is_empty() {
            format!("uid-{}-{}", self.namespace, self.name)
        } else {
            self.uid.clone()
        };
        PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: self.name.clone(),
                uid,
                namespace: self.namespace.clone(),
                attempt: 0,
            }),
            hostname: self.name.clone(),
            port_mappings: self.ports.clone(),
            labels: self.labels.iter().cloned().collect::<HashMap<_, _>>(),
            annotations: self.annotations.iter().cloned().collect::<HashMap<_, _>>(),
            linux: Some(LinuxPodSandboxConfig {
                cgroup_parent: self.cgroup_parent.clone(),
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(NamespaceOption {
                        network: NamespaceMode::Pod.into(),
                        pid: NamespaceMode::Pod.into(),
                        ipc: NamespaceMode::Pod.into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_values() {
        assert_eq!(
            key_value("weft.io/label.app=web").unwrap(),
            ("weft.io/label.app".into(), "web".into())
        );
        assert_eq!(key_value("a=").unwrap(), ("a".into(), String::new()));
        assert!(key_value("novalue").is_err());
        assert!(key_value("=x").is_err());
    }

    #[test]
    fn ports() {
        let p = port("10.0.0.1:8080:80/udp").unwrap();
        assert_eq!(
            (p.host_ip.as_str(), p.host_port, p.container_port),
            ("10.0.0.1", 8080, 80)
        );
        assert_eq!(p.protocol, i32::from(Protocol::Udp));
        let p = port("8080:80").unwrap();
        assert_eq!(p.protocol, i32::from(Protocol::Tcp));
        assert!(p.host_ip.is_empty());
        for bad in [
            "80", "a:80", "0:80", "1:2:3:4", "x:1:2", "1:2/icmp", "70000:1",
        ] {
            assert!(port(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn config_like_kubelet() {
        let c = PodSpec {
            name: "web".into(),
            namespace: "prod".into(),
            annotations: vec![("weft.io/label.app".into(), "web".into())],
            cgroup_parent: "/wt1".into(),
            ..Default::default()
        }
        .config();
        let m = c.metadata.unwrap();
        assert_eq!((m.name.as_str(), m.uid.as_str()), ("web", "uid-prod-web"));
        assert_eq!(c.annotations["weft.io/label.app"], "web");
        assert_eq!(c.linux.unwrap().cgroup_parent, "/wt1");
    }
}
