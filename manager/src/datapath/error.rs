//! Errors of the datapath module.

use std::path::PathBuf;

/// What can go wrong talking to the eBPF datapath.
#[derive(Debug, thiserror::Error)]
pub enum DatapathError {
    /// bpffs could not be checked, created or mounted.
    #[error("bpffs at {path}: {source}")]
    Bpffs {
        /// The pin directory.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// Loading the object (or reusing its pinned maps) failed.
    #[error("loading the eBPF object: {0}")]
    Load(#[from] Box<aya::EbpfError>),
    /// A program failed to load, attach or detach.
    #[error("program {program} on {ifname}: {source}")]
    Program {
        /// Program name.
        program: &'static str,
        /// Interface.
        ifname: String,
        /// Cause.
        source: Box<aya::programs::ProgramError>,
    },
    /// A map operation failed.
    #[error("map {map}: {source}")]
    Map {
        /// Map name.
        map: &'static str,
        /// Cause.
        source: Box<aya::maps::MapError>,
    },
    /// A batch map syscall failed (aya has no batch API; see `batch.rs`).
    #[error("map {map}: {source}")]
    Syscall {
        /// Map name.
        map: &'static str,
        /// Cause.
        source: std::io::Error,
    },
    /// The object lacks a map or program the manager needs (built from a different source).
    #[error("the eBPF object has no {0}")]
    Missing(&'static str),
    /// An unknown map name was asked for.
    #[error("no map named {0}")]
    UnknownMap(String),
    /// The request is invalid (e.g. an endpoint without an interface name).
    #[error("invalid request: {0}")]
    Invalid(String),
}

impl DatapathError {
    pub(crate) fn map(map: &'static str) -> impl FnOnce(aya::maps::MapError) -> Self {
        move |e| Self::Map {
            map,
            source: Box::new(e),
        }
    }
}
