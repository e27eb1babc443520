//! The policy maps as the batch calls see them: their keys, and reading both back, now or
//! ahead of the first use. A start that will read slots back ([`super::Datapath::begin_read_back`])
//! dumps them on a thread of its own while it restores everything else, and the first slot
//! load or write takes the result. Nothing writes them while they are read: a write waits for
//! the dump first (`Maps::ensure_loaded`), since the kernel's walk of the trie restarts from its
//! first key when the key it stopped at is gone.

use super::batch;
use super::error::DatapathError;
use super::lists::{ListEntry, Pair};
use aya::maps::lpm_trie::Key;
use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::thread::JoinHandle;
use weft_ebpf::{self as abi, map_names as names};

/// The `policy_lists` key as the kernel lays it out (`struct bpf_lpm_trie_key` + data), for
/// batch calls; aya's `Key` is the same bytes but has no `Default`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct LpmKey {
    pub(crate) prefix_len: u32,
    pub(crate) data: abi::PolicyListKey,
}

impl LpmKey {
    /// The key of `entry` in list `id`.
    pub(crate) fn of(id: u32, entry: &ListEntry) -> Self {
        Self {
            prefix_len: entry.list_prefix(),
            data: entry.list_key(id),
        }
    }
}

const _: () =
    assert!(std::mem::size_of::<LpmKey>() == std::mem::size_of::<Key<abi::PolicyListKey>>());

/// A failed call on one of the policy maps.
pub(crate) fn policy_error(map: &'static str) -> impl FnOnce(io::Error) -> DatapathError {
    move |source| DatapathError::Syscall { map, source }
}

/// Every pair of `policy_pairs` with its list id, and every entry of `policy_lists`, in the
/// kernel's order.
pub(crate) struct Dump {
    pub(crate) pairs: Vec<(abi::PolicyPairKey, u32)>,
    pub(crate) lists: Vec<(LpmKey, abi::PolicyValue)>,
}

impl Dump {
    /// Reads both maps (pairs first: a list a pair read points at was written before it).
    pub(crate) fn read(
        pairs: BorrowedFd<'_>,
        lists: BorrowedFd<'_>,
    ) -> Result<Self, DatapathError> {
        Ok(Self {
            pairs: batch::lookup_all(pairs).map_err(policy_error(names::POLICY_PAIRS))?,
            lists: batch::lookup_all(lists).map_err(policy_error(names::POLICY_LISTS))?,
        })
    }

    /// The lists' entries by id, each list sorted.
    pub(crate) fn lists(&self) -> BTreeMap<u32, Vec<ListEntry>> {
        let mut out: BTreeMap<u32, Vec<ListEntry>> = BTreeMap::new();
        for (key, value) in &self.lists {
            out.entry(key.data.list_id)
                .or_default()
                .push(ListEntry::from_list(key.prefix_len, key.data, *value));
        }
        for list in out.values_mut() {
            list.sort_unstable();
        }
        out
    }

    /// The pairs of the slots `keep` selects, by slot, each slot's in key order, with their
    /// list ids.
    pub(crate) fn pairs_by_slot(
        &self,
        keep: impl Fn(u32) -> bool,
    ) -> BTreeMap<u32, BTreeMap<Pair, u32>> {
        let mut out: BTreeMap<u32, BTreeMap<Pair, u32>> = BTreeMap::new();
        for (key, id) in &self.pairs {
            if keep(key.policy_id) {
                out.entry(key.policy_id)
                    .or_default()
                    .insert((key.identity, key.direction), *id);
            }
        }
        out
    }
}

/// A dump of the policy maps running on its own thread.
pub(crate) struct PendingRead {
    handle: JoinHandle<Result<Dump, DatapathError>>,
}

impl PendingRead {
    /// Starts dumping the maps behind `pairs` and `lists` (duplicates of them: the thread
    /// borrows nothing from the caller's maps).
    pub(crate) fn start(pairs: BorrowedFd<'_>, lists: BorrowedFd<'_>) -> io::Result<Self> {
        let fds: [OwnedFd; 2] = [pairs.try_clone_to_owned()?, lists.try_clone_to_owned()?];
        let handle = std::thread::Builder::new()
            .name("weft-readback".into())
            .spawn(move || {
                let [pairs, lists] = &fds;
                Dump::read(pairs.as_fd(), lists.as_fd())
            })?;
        Ok(Self { handle })
    }

    /// Waits for the dump and returns what it read.
    pub(crate) fn finish(self) -> Result<Dump, DatapathError> {
        match self.handle.join() {
            Ok(read) => read,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}
