//! Weft's policy engine: pure logic, no I/O.
//!
//! Flow for the manager: [`parse::parse_policy_file`] → [`repository::Repository::add`] →
//! [`cidr::CidrReferences::sync`] → [`selectorcache::SelectorCache::sync`] →
//! [`compute::compute`] per affected endpoint → [`diff::plan`] against what is installed.
//! [`trace::trace`] explains a single flow. Identities come from
//! [`identity::IdentityAllocator`]; every allocation or release is reported to the selector
//! cache, which says which selectors (and so which endpoints) changed. Pods' named ports, which
//! egress rules' `port: name` resolve against per destination identity, are kept by
//! [`peerports::PeerPorts`] and handed to the selector cache the same way. Cluster objects are
//! parsed failing closed ([`parse::parse_cluster_object`]). See `docs/POLICY.md`.
#![warn(missing_docs)]
pub mod cidr;
pub mod compiler;
pub mod compute;
pub mod diff;
pub mod identity;
pub mod labels;
pub mod mapstate;
pub mod parse;
pub mod peerports;
pub mod repository;
pub mod rule;
pub mod selector;
pub mod selectorcache;
pub mod sorted;
mod subjects;
pub mod trace;
