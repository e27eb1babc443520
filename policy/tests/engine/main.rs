//! Engine tests through the public API, the way the manager drives it.

mod ipblock;
mod named_ports;
mod scenarios;
mod table;
mod world;
