//! The fuzz targets' bodies, one function each: `fuzz_targets/` hands them libFuzzer's input,
//! `tests/replay.rs` every file of the kept corpus (`corpus/<target>/`) and of `regressions/`
//! on the stable toolchain. Each panics when its property fails.

use std::os::unix::ffi::OsStringExt;

#[cfg(feature = "manager")]
pub use manager::map_keys;

/// `api_decode`: API request bodies and the names derived from them: decode or fail, never
/// panic; accepted ids and interface names are safe, derived host names always valid.
pub fn api_decode(data: &[u8]) {
    use weft_api::naming::{container_id_problem, host_ifname, ifname_problem};
    use weft_api::{AllocateRequest, Endpoint, GcRequest, RegisterRequest};

    if let Ok(r) = serde_json::from_slice::<AllocateRequest>(data) {
        if container_id_problem(&r.container_id).is_none() {
            assert!(r.container_id.len() <= weft_api::naming::MAX_CONTAINER_ID_LEN);
        }
        let _ = ifname_problem(&r.ifname);
        assert!(ifname_problem(&host_ifname(&r.container_id, &r.ifname)).is_none());
        for l in &r.labels {
            let _ = weft_policy::labels::check_key(&l.key);
            let _ = weft_policy::labels::check_value(&l.value);
        }
    }
    let _ = serde_json::from_slice::<RegisterRequest>(data);
    let _ = serde_json::from_slice::<GcRequest>(data);
    let _ = serde_json::from_slice::<Endpoint>(data);
}

/// `cni_result`: CNI results (prevResult comes back from the runtime): whatever decodes
/// re-encodes to the same value.
pub fn cni_result(data: &[u8]) {
    use weft_cni::result::CniResult;

    if let Ok(r) = serde_json::from_slice::<CniResult>(data) {
        let text = serde_json::to_vec(&r).expect("a decoded result encodes");
        let back: CniResult = serde_json::from_slice(&text).expect("an encoded result decodes");
        assert_eq!(back, r);
    }
}

/// The targets over weft-manager's code (feature `manager`: see Cargo.toml).
#[cfg(feature = "manager")]
mod manager {
    use std::collections::BTreeMap;
    use weft_policy::mapstate::{Direction, PolicyEntry, Verdict};

    fn naive(
        entries: &BTreeMap<PolicyEntry, Verdict>,
        identity: u32,
        d: Direction,
        proto: u8,
        port: u16,
    ) -> Option<Verdict> {
        let mut out = None;
        for (e, v) in entries {
            if e.matches(d, identity, proto, port) {
                if *v == Verdict::Deny {
                    return Some(Verdict::Deny);
                }
                out = Some(Verdict::Allow);
            }
        }
        out
    }

    /// `map_keys`: the policy map encoding (NetworkPolicy layer): for any entries, a lookup in
    /// the encoded LPM blocks gives the verdict of the entries themselves (deny wins; exact
    /// identity or identity 0).
    pub fn map_keys(data: &[u8]) {
        use weft_manager::datapath::{Peer, encode_entries, policy_layer};

        let mut entries = BTreeMap::new();
        for c in data.chunks_exact(7).take(64) {
            let proto = [0u8, 6, 17][usize::from(c[1] % 3)];
            let (a, b) = (
                u16::from_be_bytes([c[2], c[3]]),
                u16::from_be_bytes([c[4], c[5]]),
            );
            let (lo, hi) = if proto == 0 {
                (0, 65535)
            } else {
                (a.min(b), a.max(b))
            };
            let direction = if c[0] & 1 == 0 {
                Direction::Ingress
            } else {
                Direction::Egress
            };
            let entry = PolicyEntry::new(direction, u32::from(c[0] >> 5), proto, lo, hi);
            entries.insert(
                entry,
                if c[6] & 1 == 0 {
                    Verdict::Allow
                } else {
                    Verdict::Deny
                },
            );
        }
        let encoded = encode_entries(1, &entries);
        for c in data.chunks_exact(4).take(32) {
            let d = if c[0] & 1 == 0 {
                Direction::Ingress
            } else {
                Direction::Egress
            };
            let identity = u32::from(c[0] >> 5);
            let proto = [6u8, 17][usize::from(c[1] & 1)];
            let port = u16::from_be_bytes([c[2], c[3]]);
            assert_eq!(
                policy_layer(&encoded, Peer::identity(identity), d, proto, port),
                naive(&entries, identity, d, proto, port),
                "identity {identity} {d:?} proto {proto} port {port}"
            );
        }
    }
}

/// `netconf_cni_args`: network configuration (stdin) and the `CNI_*` environment: never a
/// panic; every refusal has one of the spec's codes.
pub fn netconf_cni_args(data: &[u8]) {
    use weft_cni::env::{CniEnv, parse_cni_args};
    use weft_cni::netconf::NetConf;

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
}

/// `policy_parse`: policy files (Cilium JSON, CiliumNetworkPolicy / NetworkPolicy YAML): parse
/// or fail, never panic; accepted labels never carry control characters.
pub fn policy_parse(data: &[u8]) {
    use weft_policy::labels::Label;
    use weft_policy::parse::parse_policy_file;

    let text = String::from_utf8_lossy(data);
    let _ = parse_policy_file("p.json", &text);
    let _ = parse_policy_file("p.yaml", &text);
    if let Ok(l) = Label::parse_with_source(&text, "k8s") {
        assert!(!l.to_string().chars().any(char::is_control));
    }
}
