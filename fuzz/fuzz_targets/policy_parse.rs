//! Policy files (Cilium JSON, CiliumNetworkPolicy / NetworkPolicy YAML): parse or fail, never
//! panic; accepted labels never carry control characters.
//! The body is `weft_fuzz::targets::policy_parse` (replayed on stable by `tests/replay.rs`).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| weft_fuzz::targets::policy_parse(data));
