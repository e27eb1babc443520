//! Network configuration (stdin) and the CNI_* environment: never a panic; every refusal has
//! one of the spec's codes.
//! The body is `weft_fuzz::targets::netconf_cni_args` (replayed on stable by `tests/replay.rs`).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| weft_fuzz::targets::netconf_cni_args(data));
