//! Weft's policy engine: pure logic, no I/O.
#![warn(missing_docs)]

pub mod mapstate;
