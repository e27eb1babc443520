//! The seam: everything the manager asks of the datapath ([`Datapath`]), implemented by
//! `BpfDatapath` (the kernel) and `FakeDatapath` (in memory, for tests).

use std::collections::{BTreeMap, BTreeSet};
use weft_policy::mapstate::{EndpointPolicy, PolicyEntry, Verdict};

use super::error::DatapathError;
use super::types::{DropEvent, EndpointDatapath, KernelState, MapSummary, SlotFlags};

/// [`Datapath::programs`]: reused from the pins of an earlier manager (same object and maps).
pub const PROGRAMS_REUSED: &str = "reused";
/// [`Datapath::programs`]: loaded (and verified) by this process.
pub const PROGRAMS_LOADED: &str = "loaded";

/// Everything the manager asks of the datapath. Implementations are internally synchronised.
pub trait Datapath: Send + Sync {
    /// Attaches both programs to the endpoint's host veth (the attachment outlives the manager)
    /// and writes its `endpoints` entry, pointing at slot `ep.policy_id` with that slot's
    /// enforcement flags (write the slot first). Its ipcache entries are the manager's business
    /// (`crate::node::ipcache`: an address can have several owners). Calling it again for an attached
    /// endpoint atomically replaces the programs with the loaded ones and rewrites the entry:
    /// this is how a restarted manager re-adopts its endpoints. On error, entries already
    /// written stay: undo with [`Datapath::detach_endpoint`] (idempotent, tolerates a half-done
    /// attach).
    fn attach_endpoint(&self, ep: &EndpointDatapath) -> Result<(), DatapathError>;

    /// Re-adopts an endpoint a previous manager attached (restart). When this datapath reuses
    /// the programs that manager pinned, its filters already run them: an endpoint whose
    /// `endpoints` entry is exactly what [`Datapath::attach_endpoint`] would write is left
    /// alone (no netlink). Otherwise it is attached as by `attach_endpoint`. Returns whether
    /// it was (re-)attached.
    fn readopt_endpoint(&self, ep: &EndpointDatapath) -> Result<bool, DatapathError>;

    /// Pins freshly loaded programs so that the next start can reuse them; call it once every
    /// endpoint runs them (after re-adopting all of them). A no-op when they were reused or
    /// are pinned already.
    fn commit_programs(&self) -> Result<(), DatapathError>;

    /// How this run got its programs: [`PROGRAMS_REUSED`] from pins, or [`PROGRAMS_LOADED`] by
    /// this process (what `weftctl status` and the logs say).
    fn programs(&self) -> &'static str;

    /// Checks that each (endpoint id, host veth) has Weft's filter at (pref 1, handle 1) on
    /// ingress and egress running this datapath's programs. One line per problem.
    fn check_filters(&self, endpoints: &[(u32, String)]) -> Result<Vec<String>, DatapathError>;

    /// Detaches the programs (a missing veth counts as detached) and removes every map entry that
    /// refers to the endpoint by id: endpoints, ct and metrics. Its policy slot is the manager's
    /// (other endpoints may share it): see [`Datapath::release_slot`].
    fn detach_endpoint(&self, ep: &EndpointDatapath) -> Result<(), DatapathError>;

    /// Installs `policy` in policy slot `slot` by diff against what it holds: new and changed
    /// entries first, then the enforcement flags of every endpoint pointing at the slot, then
    /// stale entries are removed, so a packet allowed by both the old and the new policy is never
    /// dropped in between. The slot's `policy_gen` is 0 during the write and `generation` after
    /// it. Returns the digest ([`digest`]) of the slot's contents.
    fn apply_policy(
        &self,
        slot: u32,
        policy: &EndpointPolicy,
        generation: u64,
    ) -> Result<u64, DatapathError>;

    /// Like [`Datapath::apply_policy`] for the entries of some peer identities only: `entries`
    /// (all of them keyed by one of `identities`) replace those identities' entries in the slot;
    /// every other entry and the enforcement flags stay.
    fn apply_policy_identities(
        &self,
        slot: u32,
        identities: &BTreeSet<u32>,
        entries: &BTreeMap<PolicyEntry, Verdict>,
        generation: u64,
    ) -> Result<u64, DatapathError>;

    /// Points an attached endpoint at another (already written) slot: one update of its entry
    /// changes slot and enforcement flags together.
    fn switch_slot(&self, endpoint_id: u32, slot: u32) -> Result<(), DatapathError>;

    /// Gives a slot nobody points at its enforcement flags: those of its last whole write, kept
    /// by the manager. A restarted datapath learns a slot's flags from its members' `endpoints`
    /// entries, the only place the kernel has them, so a slot kept idle across a restart has
    /// none until told; the next endpoint pointed at it gets them. Flags the kernel's entries
    /// gave it already are kept.
    fn restore_slot_flags(&self, slot: u32, flags: SlotFlags);

    /// Removes every entry of a slot no endpoint points at any more, then its generation.
    fn release_slot(&self, slot: u32) -> Result<(), DatapathError>;

    /// Ends a batch of policy writes: deletes what the writes kept in the kernel for the next
    /// ones and nothing uses any more (port lists no pair points at). Call it once a
    /// regeneration has written every slot it had to.
    fn end_policy_writes(&self) -> Result<(), DatapathError>;

    /// The `policy_gen` map: every slot that may have entries, with the generation of its last
    /// complete write (0: a write did not finish).
    fn slot_generations(&self) -> Result<BTreeMap<u32, u64>, DatapathError>;

    /// Reads back the entries of `slots` from the kernel (one dump of the policy maps) as the
    /// base of their next diff. Slots left by a previous run and not loaded here are read back
    /// the first time one of them is written; with a read-back begun ahead
    /// ([`Self::begin_read_back`]), the first write of the policy takes what it read for every
    /// such slot.
    fn load_slots(&self, slots: &BTreeSet<u32>) -> Result<(), DatapathError>;

    /// Starts reading the policy maps back in the background, for a start that knows early it will
    /// read slots back: the first write of the policy waits for it (the maps are not written
    /// while they are read) and loads every slot not loaded yet from what it read. Does nothing
    /// when no slot of a previous run is left to read.
    fn begin_read_back(&self) -> Result<(), DatapathError>;

    /// Maps a prefix to an identity in the ipcache.
    fn upsert_ipcache(
        &self,
        prefix: ipnet::IpNet,
        value: crate::node::ipcache::Value,
    ) -> Result<(), DatapathError>;

    /// Everything the ipcache map holds (restart read-back).
    fn ipcache_entries(
        &self,
    ) -> Result<BTreeMap<ipnet::IpNet, crate::node::ipcache::Value>, DatapathError>;

    /// Removes an ipcache prefix (missing is fine).
    fn remove_ipcache(&self, prefix: ipnet::IpNet) -> Result<(), DatapathError>;

    /// Everything the endpoints, policy and ipcache maps hold, read from the kernel.
    fn kernel_state(&self) -> Result<KernelState, DatapathError>;

    /// Endpoint ids present in the `endpoints` map (what survived in the kernel).
    fn endpoint_ids(&self) -> Result<BTreeSet<u32>, DatapathError>;

    /// Endpoint id → the policy slot its `endpoints` entry points at.
    fn endpoint_slots(&self) -> Result<BTreeMap<u32, u32>, DatapathError>;

    /// Removes every entry of endpoints not in `keep` from endpoints, ct and metrics
    /// (restart reconciliation; the manager reconciles the ipcache itself). Returns the endpoint ids that were removed.
    fn reconcile(&self, keep: &BTreeSet<u32>) -> Result<BTreeSet<u32>, DatapathError>;

    /// One line per map: name, type, entries, max entries.
    fn map_list(&self) -> Vec<MapSummary>;

    /// Decoded entries of one map (IPs, identities, ports, verdicts as JSON).
    fn map_dump(&self, name: &str) -> Result<Vec<serde_json::Value>, DatapathError>;

    /// Writes Service frontend `id`: `backends` (in this order: their slots), the frontend for
    /// the replies of its flows, then its entry with the new number of backends, so that a
    /// packet never meets a slot not written yet; `previous` is how many backends the last
    /// write gave it (slots beyond the new number go). With no backends the frontend has no
    /// entry: its packets are left to kube-proxy.
    fn lb_upsert(
        &self,
        id: u32,
        frontend: &weft_api::lb::Frontend,
        backends: &[weft_api::lb::Backend],
        previous: usize,
    ) -> Result<(), DatapathError>;

    /// Removes Service frontend `id` (entry, `previous` backends, reverse entry).
    fn lb_remove(
        &self,
        id: u32,
        frontend: &weft_api::lb::Frontend,
        previous: usize,
    ) -> Result<(), DatapathError>;

    /// Every Service frontend the maps hold, by id, with its backends (restart read-back).
    fn lb_frontends(&self) -> Result<super::LbTable, DatapathError>;

    /// Drop events from now on.
    fn subscribe_events(&self) -> tokio::sync::broadcast::Receiver<DropEvent>;
}
