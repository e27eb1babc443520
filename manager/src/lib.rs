//! weft-manager: node CIDRs, IPAM, endpoints, identities, policy and the eBPF datapath.
//!
//! Module map (DESIGN §1): `config` flags and file; `node` CIDR selection; `ipam` pools;
//! `store` sled; `endpoint` the registry; `hostnet` the node's netlink side effects;
//! `service` the operations; `api` HTTP; `daemon` start-up order and serving; `datapath` eBPF.

// Input reaches these crates from the API, policy files and the CNI: no path may panic on it.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::indexing_slicing,
        clippy::panic
    )
)]

pub mod allocator;
pub mod api;
pub mod clock;
pub mod cluster;
pub mod cni_install;
pub mod config;
pub mod ctl;
pub mod daemon;
pub mod datapath;
pub mod endpoint;
mod fnv;
pub mod guard;
pub mod hostnet;
pub mod ipam;
pub mod ipcache;
pub mod k8s;
pub mod kvstore;
pub mod link_reaper;
pub mod listener;
pub mod locks;
pub mod masquerade;
pub mod node;
pub mod nodenet;
pub mod policy_state;
pub mod prom;
pub mod restore;
pub mod service;
pub mod slots;
pub mod store;

#[cfg(test)]
mod hostile_tests;
