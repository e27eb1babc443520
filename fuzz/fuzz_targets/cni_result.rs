//! CNI results (prevResult comes back from the runtime): whatever decodes re-encodes to the
//! same value.
#![no_main]
use libfuzzer_sys::fuzz_target;
use weft_cni::result::CniResult;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = serde_json::from_slice::<CniResult>(data) {
        let text = serde_json::to_vec(&r).expect("a decoded result encodes");
        let back: CniResult = serde_json::from_slice(&text).expect("an encoded result decodes");
        assert_eq!(back, r);
    }
});
