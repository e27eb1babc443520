//! Properties of everything the plugin decodes from its caller (stable-toolchain counterparts
//! of the fuzz targets in fuzz/): no input panics, every refusal is an error object with a
//! code the spec or docs/CNI.md defines, and results read back as they were written.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    reason = "an integration test crate: its helpers panic with context like its tests (clippy.toml's allow-*-in-tests covers only #[test] functions)"
)]

use proptest::prelude::*;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use weft_api::IpConfig;
use weft_cni::env::{CniEnv, parse_cni_args};
use weft_cni::netconf::NetConf;
use weft_cni::result::{CniResult, Plumbed};
use weft_cni::version::SpecVersion;

const CODES: [u32; 5] = [1, 4, 6, 7, 11];

proptest! {
    #[test]
    fn cni_args_never_panic_and_accepted_values_are_kept(raw in ".{0,200}") {
        if let Ok(args) = parse_cni_args(&raw)
            && let Some(name) = args.pod_name
        {
            let needle = format!("K8S_POD_NAME={name}");
            prop_assert!(raw.contains(&needle));
        }
    }

    #[test]
    fn netconf_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        if let Err(e) = NetConf::parse(&bytes) {
            prop_assert!(CODES.contains(&e.code()), "code {}", e.code());
            let obj = e.to_json("1.1.0");
            prop_assert!(obj["msg"].is_string());
        }
    }

    #[test]
    fn netconf_fields_of_any_value_never_panic(
        version in prop_oneof![Just("1.1.0".to_owned()), Just("0.4.0".to_owned()), ".{0,8}"],
        name in ".{0,20}",
        mtu in any::<i64>(),
        key in ".{0,12}",
        value in ".{0,12}",
        log_level in ".{0,8}",
    ) {
        let conf = serde_json::json!({
            "cniVersion": version, "name": name, "type": "weft", "mtu": mtu,
            "logLevel": log_level,
            "args": {"cni": {"labels": [{"key": key, "value": value}]}},
        });
        match NetConf::parse(conf.to_string().as_bytes()) {
            Ok(c) => {
                prop_assert!((68..=65535).contains(&c.mtu));
                prop_assert!(c.labels.iter().all(|l| !l.key.chars().any(char::is_control)
                    && !l.value.chars().any(char::is_control)));
            }
            Err(e) => prop_assert!(CODES.contains(&e.code())),
        }
    }

    #[test]
    fn any_environment_is_parsed_or_refused_with_code_4(
        command in prop_oneof![Just("ADD"), Just("DEL"), Just("CHECK"), Just("VERSION"), Just("X")],
        id in proptest::collection::vec(any::<u8>(), 0..300),
        ifname in proptest::collection::vec(any::<u8>(), 0..20),
        args in ".{0,60}",
    ) {
        use std::os::unix::ffi::OsStringExt;
        let got = CniEnv::from_os_lookup(|k| match k {
            "CNI_COMMAND" => Some(command.into()),
            "CNI_CONTAINERID" => Some(std::ffi::OsString::from_vec(id.clone())),
            "CNI_IFNAME" => Some(std::ffi::OsString::from_vec(ifname.clone())),
            "CNI_NETNS" => Some("/proc/self/ns/net".into()),
            "CNI_ARGS" => Some(args.clone().into()),
            _ => None,
        });
        match got {
            Ok(env) => {
                prop_assert!(env.container_id.len() <= weft_api::naming::MAX_CONTAINER_ID_LEN);
                prop_assert!(env.ifname.len() <= weft_api::naming::MAX_IFNAME_LEN);
            }
            Err(e) => prop_assert_eq!(e.code(), 4),
        }
    }

    #[test]
    fn results_read_back_as_written_in_every_version(
        v4 in any::<u32>(), v6 in any::<u128>(), mtu in 68u32..65535,
        version in prop_oneof![Just("0.3.1"), Just("0.4.0"), Just("1.0.0"), Just("1.1.0")],
    ) {
        let ips = [
            IpConfig { address: IpAddr::V4(Ipv4Addr::from(v4)), gateway: IpAddr::V4(Ipv4Addr::from(v4 ^ 1)) },
            IpConfig { address: IpAddr::V6(Ipv6Addr::from(v6)), gateway: IpAddr::V6(Ipv6Addr::from(v6 ^ 1)) },
        ];
        let p = Plumbed {
            host: ("weft0123456789a", "02:00:00:00:00:01"),
            pod: ("eth0", "02:00:00:00:00:02"),
            sandbox: "/var/run/netns/p",
            mtu,
            ips: &ips,
        };
        let built = CniResult::build(version, SpecVersion::parse(version).unwrap(), &p, None);
        let text = serde_json::to_string(&built).unwrap();
        let back: CniResult = serde_json::from_str(&text).unwrap();
        prop_assert_eq!(back, built);
    }
}
