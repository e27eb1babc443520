//! weft-manager: the node daemon. Every module is a folder named for what it holds
//! (docs/ARCHITECTURE.md, "Manager modules"); arrows are the only calls allowed between them:
//!
//! - [`daemon`] start-up in order, flags and file ([`daemon::config`]), Kubernetes mode,
//!   installing the CNI, the start-up refusals → everything below.
//! - [`http`] the REST API on the unix socket and its bounded accept loop → [`service`].
//! - [`service`] the operations (ADD/DEL, policy import, regeneration, verify, cluster sync)
//!   → `endpoint`, `node`, `policy_state`, `slots`, `datapath`, `store`, `prom`'s counters.
//! - [`endpoint`] the registry, IPAM pools, restore at start-up, the link reaper.
//! - [`node`] CIDR selection, the node's netlink plumbing (`hostnet`, `nodenet`), masquerade,
//!   the ipcache's owners.
//! - [`policy_state`] rules, identities and computed policy; [`slots`] which endpoints share
//!   policy entries → `store`.
//! - [`datapath`] the eBPF maps and programs, behind the `Datapath` seam with its fake.
//! - [`lb`] Service frontends and their backends → `datapath`.
//! - [`cluster`] the kvstore agent (other nodes, remote endpoints), [`kvstore`] etcd and its
//!   in-memory fake.
//! - [`prom`] Prometheus counters and `/metrics`.
//! - [`store`] sled; [`sys`] process-level helpers (allocator, clock, poison-proof locks, the
//!   synchronous netlink socket).

pub mod cluster;
pub mod crd;
pub mod daemon;
pub mod datapath;
pub mod endpoint;
pub mod http;
pub mod kvstore;
pub mod lb;
pub mod node;
pub mod policy_state;
pub mod prom;
pub mod service;
pub mod slots;
pub mod store;
pub mod sys;
