//! weft-manager: node CIDRs, IPAM, endpoints, identities, policy and the eBPF datapath.
//!
//! Module map (docs/ARCHITECTURE.md, "Manager modules"): `config` flags and file; `node` CIDR selection; `ipam` pools;
//! `store` sled; `endpoint` the registry; `hostnet` the node's netlink side effects;
//! `service` the operations; `api` HTTP; `daemon` start-up order and serving; `datapath` eBPF.

pub mod allocator;
pub mod api;
pub mod clock;
pub mod cluster;
pub mod cni_install;
pub mod config;
pub mod daemon;
pub mod datapath;
pub mod endpoint;
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
mod netlink_sync;
pub mod node;
pub mod nodenet;
pub mod policy_state;
pub mod prom;
pub mod restore;
pub mod service;
pub mod slots;
pub mod store;
