//! The policy map encoding: for any entries, a lookup in the encoded LPM blocks gives the
//! verdict of the entries themselves (deny wins; exact identity or identity 0).
//! The body is `weft_fuzz::targets::map_keys` (replayed on stable by `tests/replay.rs`).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| weft_fuzz::targets::map_keys(data));
