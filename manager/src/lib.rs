//! weft-manager: node CIDRs, IPAM, endpoints, identities, policy and the eBPF datapath.
pub mod datapath;
