//! Engine tests through the public API, the way the manager drives it.

mod named_ports;
mod scenarios;
mod table;
mod world;
