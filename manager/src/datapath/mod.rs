//! The eBPF datapath seen from the manager: attach per-endpoint programs, keep the endpoint,
//! ipcache and policy maps in sync, read drop events.
//!
//! [`Datapath`] is the seam: [`BpfDatapath`] talks to the kernel (root, bpffs), [`FakeDatapath`]
//! records calls in memory so the rest of the manager is unit-tested without privileges.
//! Map encodings and the attach mode are described in `docs/DATAPATH.md`.

mod attach;
mod batch;
mod bpf;
mod bpffs;
mod dump;
mod encode;
mod error;
mod events;
mod fake;
mod lb;
mod lists;
mod policy_maps;
mod progpin;
mod seam;
mod shadow;
mod state;
mod tcfilter;
mod trie;
mod types;

pub use bpf::BpfDatapath;
pub use seam::{Datapath, PROGRAMS_LOADED, PROGRAMS_REUSED};

pub(crate) use bpffs::ensure as ensure_bpffs;
pub use encode::Encoded;
pub use encode::lookup::{Decision, Peer, lookup_encoded, policy_layer, tier_entry};
pub use encode::{
    POLICY_ENCODING_GOLDENS, POLICY_ENCODING_VERSION, PolicyBlock, digest, encode_entries,
    encode_policy, policy_digest,
};
pub use error::DatapathError;
pub use fake::{FakeCall, FakeDatapath};
pub use types::{
    DatapathConfig, DropEvent, EndpointDatapath, KernelEndpoint, KernelState, LbTable, MapSummary,
    SlotFlags, TierRule, drop_reason_name,
};

#[cfg(test)]
mod tests;
