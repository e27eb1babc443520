//! The CNI result (SPEC "Success"), in the format of the requested version.

use crate::netconf::Dns;
use crate::version::SpecVersion;
use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use weft_api::IpConfig;

/// One entry of `interfaces`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interface {
    /// Interface name.
    pub name: String,
    /// MAC.
    #[serde(default)]
    pub mac: String,
    /// MTU (1.1.0 and later).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// Netns path, for interfaces inside the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
}

/// One entry of `ips`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpEntry {
    /// `"4"` or `"6"`, only before 1.0.0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// CIDR notation: `10.0.1.5/32`.
    pub address: String,
    /// Gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
    /// Index into `interfaces`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<usize>,
}

/// One entry of `routes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    /// Destination CIDR.
    pub dst: String,
    /// Next hop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<IpAddr>,
}

/// The whole result; also reads a `prevResult` of any supported version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CniResult {
    /// Version of this result's format.
    pub cni_version: String,
    /// Host veth, then the pod interface.
    #[serde(default)]
    pub interfaces: Vec<Interface>,
    /// Addresses.
    #[serde(default)]
    pub ips: Vec<IpEntry>,
    /// Routes in the pod.
    #[serde(default)]
    pub routes: Vec<Route>,
    /// DNS from the netconf.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<Dns>,
}

/// What ADD plumbed, for [`CniResult::build`].
#[derive(Debug, Clone)]
pub struct Plumbed<'a> {
    /// Host veth name and MAC.
    pub host: (&'a str, &'a str),
    /// Pod interface name and MAC.
    pub pod: (&'a str, &'a str),
    /// Pod netns path.
    pub sandbox: &'a str,
    /// MTU of both ends.
    pub mtu: u32,
    /// Addresses with their gateways.
    pub ips: &'a [IpConfig],
}

/// The pod's prefix for an address: Weft hands out single addresses routed through the gateway.
#[must_use]
pub fn host_prefix(addr: IpAddr) -> String {
    match addr {
        IpAddr::V4(a) => format!("{a}/32"),
        IpAddr::V6(a) => format!("{a}/128"),
    }
}

impl CniResult {
    /// Builds the result in `version`'s format.
    #[must_use]
    pub fn build(
        cni_version: &str,
        version: SpecVersion,
        p: &Plumbed<'_>,
        dns: Option<Dns>,
    ) -> Self {
        let mtu = version.interfaces_have_mtu().then_some(p.mtu);
        let interfaces = vec![
            Interface {
                name: p.host.0.to_owned(),
                mac: p.host.1.to_owned(),
                mtu,
                sandbox: None,
            },
            Interface {
                name: p.pod.0.to_owned(),
                mac: p.pod.1.to_owned(),
                mtu,
                sandbox: Some(p.sandbox.to_owned()),
            },
        ];
        let ips = p
            .ips
            .iter()
            .map(|ip| IpEntry {
                version: version
                    .ips_have_version()
                    .then(|| if ip.address.is_ipv4() { "4" } else { "6" }.to_owned()),
                address: host_prefix(ip.address),
                gateway: Some(ip.gateway),
                interface: Some(1),
            })
            .collect();
        let routes = p
            .ips
            .iter()
            .map(|ip| Route {
                dst: if ip.address.is_ipv4() {
                    "0.0.0.0/0"
                } else {
                    "::/0"
                }
                .to_owned(),
                gw: Some(ip.gateway),
            })
            .collect();
        Self {
            cni_version: cni_version.to_owned(),
            interfaces,
            ips,
            routes,
            dns,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn sample(v: &str) -> Value {
        let ips = [
            IpConfig {
                address: "10.0.1.5".parse().unwrap(),
                gateway: "10.0.1.1".parse().unwrap(),
            },
            IpConfig {
                address: "fd00::5".parse().unwrap(),
                gateway: "fd00::1".parse().unwrap(),
            },
        ];
        let p = Plumbed {
            host: ("weft0123456789a", "02:00:00:00:00:01"),
            pod: ("eth0", "02:00:00:00:00:02"),
            sandbox: "/var/run/netns/p",
            mtu: 1400,
            ips: &ips,
        };
        let dns = Dns {
            nameservers: vec!["10.96.0.10".into()],
            ..Dns::default()
        };
        serde_json::to_value(CniResult::build(
            v,
            SpecVersion::parse(v).unwrap(),
            &p,
            Some(dns),
        ))
        .unwrap()
    }

    fn keys(v: &Value) -> Vec<&str> {
        let mut k: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        k.sort_unstable();
        k
    }

    #[test]
    fn v040_ips_carry_version() {
        let r = sample("0.4.0");
        assert_eq!(r["cniVersion"], "0.4.0");
        assert_eq!(
            keys(&r),
            ["cniVersion", "dns", "interfaces", "ips", "routes"]
        );
        assert_eq!(
            keys(&r["ips"][0]),
            ["address", "gateway", "interface", "version"]
        );
        assert_eq!(r["ips"][0]["version"], "4");
        assert_eq!(r["ips"][1]["version"], "6");
        assert_eq!(keys(&r["interfaces"][0]), ["mac", "name"]);
        assert_eq!(keys(&r["interfaces"][1]), ["mac", "name", "sandbox"]);
    }

    #[test]
    fn v100_ips_have_no_version() {
        let r = sample("1.0.0");
        assert_eq!(keys(&r["ips"][0]), ["address", "gateway", "interface"]);
        assert_eq!(r["ips"][0]["address"], "10.0.1.5/32");
        assert_eq!(r["ips"][1]["address"], "fd00::5/128");
        assert_eq!(r["ips"][0]["interface"], 1);
        assert_eq!(r["interfaces"][1]["sandbox"], "/var/run/netns/p");
        assert_eq!(keys(&r["interfaces"][1]), ["mac", "name", "sandbox"]);
        assert_eq!(
            r["routes"][0],
            serde_json::json!({"dst": "0.0.0.0/0", "gw": "10.0.1.1"})
        );
        assert_eq!(
            r["routes"][1],
            serde_json::json!({"dst": "::/0", "gw": "fd00::1"})
        );
        assert_eq!(r["dns"]["nameservers"][0], "10.96.0.10");
    }

    #[test]
    fn v110_interfaces_have_mtu() {
        let r = sample("1.1.0");
        assert_eq!(keys(&r["ips"][0]), ["address", "gateway", "interface"]);
        assert_eq!(keys(&r["interfaces"][1]), ["mac", "mtu", "name", "sandbox"]);
        assert_eq!(r["interfaces"][0]["mtu"], 1400);
    }

    #[test]
    fn reads_back_any_version() {
        for v in ["0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
            let r: CniResult = serde_json::from_value(sample(v)).unwrap();
            assert_eq!(r.ips.len(), 2);
            assert_eq!(r.interfaces[1].name, "eth0");
        }
    }
}
