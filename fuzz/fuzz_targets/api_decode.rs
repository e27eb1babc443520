//! API request bodies and the names derived from them: decode or fail, never panic; accepted
//! ids and interface names are safe, derived host names always valid.
#![no_main]
use libfuzzer_sys::fuzz_target;
use weft_api::naming::{container_id_problem, host_ifname, ifname_problem};
use weft_api::{AllocateRequest, Endpoint, GcRequest, RegisterRequest};

fuzz_target!(|data: &[u8]| {
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
});
