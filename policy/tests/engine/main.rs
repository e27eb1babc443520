//! Engine tests through the public API, the way the manager drives it.

mod scenarios;
mod table;
mod world;
