//! Engine tests through the public API, the way the manager drives it.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    reason = "an integration test crate: its helpers panic with context like its tests (clippy.toml's allow-*-in-tests covers only #[test] functions)"
)]

mod ipblock;
mod named_ports;
mod scenarios;
mod table;
mod tiers;
mod world;
