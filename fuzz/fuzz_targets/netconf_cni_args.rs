//! Network configuration (stdin) and the CNI_* environment: never a panic; every refusal has
//! one of the spec's codes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::os::unix::ffi::OsStringExt;
use weft_cni::env::{CniEnv, parse_cni_args};
use weft_cni::netconf::NetConf;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = NetConf::parse(data) {
        assert!([1, 4, 6, 7].contains(&e.code()), "code {}", e.code());
        let _ = e.to_json("1.1.0");
    }
    // The same bytes as CNI_ARGS, and split into the per-container variables.
    let _ = parse_cni_args(&String::from_utf8_lossy(data));
    let mut parts = data.splitn(3, |b| *b == 0);
    let id = parts.next().unwrap_or_default().to_vec();
    let ifname = parts.next().unwrap_or_default().to_vec();
    let args = parts.next().unwrap_or_default().to_vec();
    let got = CniEnv::from_os_lookup(|k| match k {
        "CNI_COMMAND" => Some("DEL".into()),
        "CNI_CONTAINERID" => Some(std::ffi::OsString::from_vec(id.clone())),
        "CNI_IFNAME" => Some(std::ffi::OsString::from_vec(ifname.clone())),
        "CNI_ARGS" => Some(std::ffi::OsString::from_vec(args.clone())),
        _ => None,
    });
    if let Err(e) = got {
        assert_eq!(e.code(), 4);
    }
});
