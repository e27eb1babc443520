//! The fuzz targets' bodies as library functions (`targets`), so that the libFuzzer binaries in
//! `fuzz_targets/` and the stable replay test (`tests/replay.rs`) run exactly the same code.
pub mod targets;
