//! The policy trie as the batch calls see it: its key, and reading it back, now or ahead of
//! the first use. A start that will read slots back ([`super::Datapath::begin_read_back`])
//! dumps the trie on a thread of its own while it restores everything else, and the first slot
//! load or write takes the result. Nothing writes the trie while it is read: a write waits for
//! the dump first (`Maps::ensure_loaded`), since the kernel's walk restarts from the trie's
//! first key when the key it stopped at is gone.

use super::batch;
use super::encode::PolicyBlock;
use super::error::DatapathError;
use aya::maps::lpm_trie::Key;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::thread::JoinHandle;
use weft_ebpf::{self as abi, map_names as names};

/// The policy trie's key as the kernel lays it out (`struct bpf_lpm_trie_key` + data), for
/// batch calls; aya's `Key` is the same bytes but has no `Default`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct LpmKey {
    pub(crate) prefix_len: u32,
    pub(crate) data: abi::PolicyKey,
}

impl LpmKey {
    pub(crate) fn of(b: &PolicyBlock) -> Self {
        Self {
            prefix_len: b.prefix_len,
            data: b.key,
        }
    }
}

const _: () = assert!(std::mem::size_of::<LpmKey>() == std::mem::size_of::<Key<abi::PolicyKey>>());

/// A failed call on the policy trie.
pub(crate) fn policy_error(source: io::Error) -> DatapathError {
    DatapathError::Syscall {
        map: names::POLICY,
        source,
    }
}

/// The policy entries of the slots `keep` selects, sorted, from a dump of the trie.
pub(crate) fn policy_blocks(
    entries: io::Result<Entries>,
    keep: impl Fn(u32) -> bool,
) -> Result<Vec<(PolicyBlock, abi::PolicyValue)>, DatapathError> {
    let entries = entries.map_err(policy_error)?;
    // The trie hands entries back in its own order: sorted once here, each slot's run is
    // packed (or collected) as it is.
    let mut blocks: Vec<(PolicyBlock, abi::PolicyValue)> = entries
        .into_iter()
        .filter(|(key, _)| keep(key.data.policy_id))
        .map(|(key, value)| {
            let block = PolicyBlock {
                key: key.data,
                prefix_len: key.prefix_len,
            };
            (block, value)
        })
        .collect();
    blocks.sort_unstable();
    Ok(blocks)
}

/// Blocks in key order, by slot: each slot with its blocks.
pub(crate) fn by_slot(
    blocks: &[(PolicyBlock, abi::PolicyValue)],
) -> impl Iterator<Item = (u32, &[(PolicyBlock, abi::PolicyValue)])> {
    blocks
        .chunk_by(|a, b| a.0.key.policy_id == b.0.key.policy_id)
        .filter_map(|run| run.first().map(|first| (first.0.key.policy_id, run)))
}

/// Every entry of the policy trie with its value, in the kernel's order.
pub(crate) type Entries = Vec<(LpmKey, abi::PolicyValue)>;

/// A dump of the policy trie running on its own thread.
pub(crate) struct PendingRead {
    handle: JoinHandle<io::Result<Entries>>,
}

impl PendingRead {
    /// Starts dumping the trie behind `fd` (a duplicate of it: the thread borrows nothing from
    /// the caller's maps).
    pub(crate) fn start(fd: BorrowedFd<'_>) -> io::Result<Self> {
        let fd = fd.try_clone_to_owned()?;
        let handle = std::thread::Builder::new()
            .name("weft-readback".into())
            .spawn(move || batch::lookup_all(fd.as_fd()))?;
        Ok(Self { handle })
    }

    /// Waits for the dump and returns what it read.
    pub(crate) fn finish(self) -> io::Result<Entries> {
        match self.handle.join() {
            Ok(read) => read,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}
