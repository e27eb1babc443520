//! The decoding code of weft-cni (a binary crate) and the manager's policy encoder, compiled
//! from their own sources so the fuzz targets exercise exactly what ships.
#![allow(dead_code, unused_imports, clippy::all, clippy::pedantic)]

#[path = "../../cni/src/env.rs"]
pub mod env;
#[path = "../../cni/src/error.rs"]
pub mod error;
#[path = "../../cni/src/netconf.rs"]
pub mod netconf;
#[path = "../../cni/src/result.rs"]
pub mod result;
#[path = "../../cni/src/version.rs"]
pub mod version;

#[path = "../../manager/src/datapath/encode.rs"]
pub mod encode;
