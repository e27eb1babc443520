//! Properties of the shared wire types and naming (stable counterparts of
//! `fuzz/fuzz_targets/api_decode.rs`).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    reason = "an integration test crate: its helpers panic with context like its tests (clippy.toml's allow-*-in-tests covers only #[test] functions)"
)]

use proptest::prelude::*;
use weft_api::naming::{container_id_problem, host_ifname, ifname_problem};
use weft_api::{AllocateRequest, Endpoint, RegisterRequest};

proptest! {
    #[test]
    fn any_body_decodes_or_fails_cleanly(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = serde_json::from_slice::<AllocateRequest>(&bytes);
        let _ = serde_json::from_slice::<RegisterRequest>(&bytes);
        let _ = serde_json::from_slice::<Endpoint>(&bytes);
    }

    #[test]
    fn allocate_requests_round_trip(id in ".{0,80}", ifname in ".{0,16}", netns in ".{0,40}") {
        let r = AllocateRequest { container_id: id, ifname, netns, pod_namespace: None, pod_name: None, labels: vec![] };
        let back: AllocateRequest = serde_json::from_slice(&serde_json::to_vec(&r).unwrap()).unwrap();
        prop_assert_eq!(back, r);
    }

    #[test]
    fn accepted_ids_and_ifnames_are_safe_names(id in ".{0,200}", ifname in ".{0,20}") {
        if container_id_problem(&id).is_none() {
            prop_assert!(id.len() <= 128);
            prop_assert!(id.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b)));
        }
        if ifname_problem(&ifname).is_none() {
            prop_assert!(!ifname.contains('/') && ifname.len() <= 15 && ifname != "..");
        }
        // Whatever the input, the host veth name is a valid 15-byte interface name.
        let h = host_ifname(&id, &ifname);
        prop_assert!(ifname_problem(&h).is_none());
    }
}
