//! CNI results (prevResult comes back from the runtime): whatever decodes re-encodes to the
//! same value.
//! The body is `weft_fuzz::targets::cni_result` (replayed on stable by `tests/replay.rs`).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| weft_fuzz::targets::cni_result(data));
