//! API request bodies and the names derived from them: decode or fail, never panic; accepted
//! ids and interface names are safe, derived host names always valid.
//! The body is `weft_fuzz::targets::api_decode` (replayed on stable by `tests/replay.rs`).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| weft_fuzz::targets::api_decode(data));
