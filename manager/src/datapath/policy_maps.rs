//! Policy slots in the kernel: writing a slot's entries as pairs and port lists (module
//! `lists`), releasing a slot, and reading the maps back. The manager keeps each slot's entries
//! as a shadow (module `shadow`) and diffs entries, as before the two-step layout; a write turns
//! the pairs whose entries changed into pointer switches and the lists they need.

use super::batch;
use super::encode::{PolicyBlock, encode_sorted, enforcement_flags};
use super::error::DatapathError;
use super::lists::{ListEntry, Lists, Pair, Pairs, changed, entries_of, pair_key, union};
use super::shadow::Shadow;
use super::state::Maps;
use super::trie::{Dump, LpmKey, PendingRead, policy_error};
use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::{AsFd, BorrowedFd};
use weft_ebpf::{self as abi, map_names as names};
use weft_policy::mapstate::{EndpointPolicy, PolicyEntry, Verdict};

/// A key of the one policy trie of builds before the two-step lookup, as the kernel lays it out.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct LegacyKey {
    prefix_len: u32,
    data: abi::PolicyKey,
}

/// One step of a write, in the order it reaches the kernel: the entries of new lists, the pairs
/// pointed at their lists, the pairs deleted, then the lists no pair points at any more.
#[derive(Default)]
struct Step {
    lists: Vec<(u32, Vec<ListEntry>)>,
    point: Vec<(abi::PolicyPairKey, u32)>,
    unpoint: Vec<abi::PolicyPairKey>,
    released: Vec<u32>,
}

impl Step {
    /// Points a pair at a list of `entries` (held, or new and written first); returns its id.
    fn point(&mut self, lists: &mut Lists, key: abi::PolicyPairKey, entries: &[ListEntry]) -> u32 {
        let got = lists.acquire(entries);
        if got.fresh {
            self.lists.push((got.id, entries.to_vec()));
        }
        self.point.push((key, got.id));
        got.id
    }
}

/// The policy entries of the slots `keep` selects that a dump holds, in key order. A pair
/// whose list is missing stands for nothing (the datapath matches nothing for it).
pub(crate) fn expand(
    dump: &Dump,
    keep: impl Fn(u32) -> bool,
) -> Vec<(PolicyBlock, abi::PolicyValue)> {
    let lists = dump.lists();
    dump.pairs_by_slot(keep)
        .iter()
        .flat_map(|(slot, pairs)| slot_entries(*slot, pairs, &lists))
        .collect()
}

/// The entries of `slot` its pairs (with their list ids) stand for, with `lists` read from the
/// same dump; a pair whose list is missing stands for nothing.
fn slot_entries<'a>(
    slot: u32,
    pairs: &'a BTreeMap<Pair, u32>,
    lists: &'a BTreeMap<u32, Vec<ListEntry>>,
) -> impl Iterator<Item = (PolicyBlock, abi::PolicyValue)> + 'a {
    let present = pairs
        .iter()
        .filter_map(|(pair, id)| lists.get(id).map(|l| (*pair, l.as_slice())));
    entries_of(slot, present)
}

impl Maps {
    fn pairs_fd(&self) -> BorrowedFd<'_> {
        use aya::maps::IterableMap;
        self.policy_pairs.map().fd().as_fd()
    }

    fn lists_fd(&self) -> BorrowedFd<'_> {
        use aya::maps::IterableMap;
        self.policy_lists.map().fd().as_fd()
    }

    /// Every policy entry in the kernel of the slots `keep` accepts, in key order (so each
    /// slot's entries are together).
    pub(crate) fn kernel_policy(
        &self,
        keep: impl Fn(u32) -> bool,
    ) -> Result<Vec<(PolicyBlock, abi::PolicyValue)>, DatapathError> {
        let dump = Dump::read(self.pairs_fd(), self.lists_fd())?;
        Ok(expand(&dump, keep))
    }

    /// Starts reading the policy maps back on a thread of its own (module `trie`); a dump
    /// already under way is left to finish.
    pub(crate) fn begin_read_back(&mut self) -> Result<(), DatapathError> {
        if self.pending.is_none() && !self.unloaded.is_empty() {
            let pending = PendingRead::start(self.pairs_fd(), self.lists_fd())
                .map_err(policy_error(names::POLICY_PAIRS))?;
            self.pending = Some(pending);
        }
        Ok(())
    }

    /// Reads back the entries of the not yet loaded slots among `slots` (one dump of the maps).
    /// With a dump begun ahead ([`Self::begin_read_back`]) under way, that dump reads them,
    /// and the first write of the maps takes it ([`Self::ensure_loaded`]).
    pub(crate) fn load_slots(&mut self, slots: &BTreeSet<u32>) -> Result<(), DatapathError> {
        if self.pending.is_some() {
            return Ok(());
        }
        self.read_slots(slots)
    }

    /// Loads the not yet loaded slots among `slots` from the dump begun ahead (waited for), or
    /// from one dump now, and the table of port lists when it is not known; a dump begun ahead
    /// is always taken, even when none is wanted.
    fn read_slots(&mut self, slots: &BTreeSet<u32>) -> Result<(), DatapathError> {
        let wanted: BTreeSet<u32> = slots.intersection(&self.unloaded).copied().collect();
        if wanted.is_empty() && self.pending.is_none() && self.lists.is_some() {
            return Ok(());
        }
        let t0 = std::time::Instant::now();
        // A dump begun ahead read the maps as they are: nothing wrote them since.
        let dump = match self.pending.take() {
            Some(pending) => pending.finish()?,
            None => Dump::read(self.pairs_fd(), self.lists_fd())?,
        };
        let lists = dump.lists();
        if self.lists.is_none() {
            self.rebuild_lists(&dump, &lists)?;
        }
        // A slot with no pair left holds nothing; the others hold what was read.
        for slot in &wanted {
            self.installed.insert(*slot, Shadow::default());
            self.unloaded.remove(slot);
        }
        for (slot, pairs) in dump.pairs_by_slot(|slot| wanted.contains(&slot)) {
            let entries = slot_entries(slot, &pairs, &lists);
            let shadow = Shadow::pack_into(&mut self.scratch, entries);
            self.installed.insert(slot, shadow);
        }
        tracing::info!(
            slots = wanted.len(),
            pairs = dump.pairs.len(),
            lists = lists.len(),
            ms = t0.elapsed().as_secs_f64() * 1000.0,
            "policy slots read back"
        );
        Ok(())
    }

    /// The table of port lists from a dump of the maps. What no complete write left is
    /// deleted: lists no pair points at, and pairs pointing at no list.
    fn rebuild_lists(
        &mut self,
        dump: &Dump,
        lists: &BTreeMap<u32, Vec<ListEntry>>,
    ) -> Result<(), DatapathError> {
        let (table, rebuilt) = Lists::rebuild(lists, dump.pairs.iter().map(|(_, id)| *id));
        let dangling: Vec<abi::PolicyPairKey> = dump
            .pairs
            .iter()
            .filter(|(_, id)| rebuilt.dangling.contains(id))
            .map(|(key, _)| *key)
            .collect();
        batch::delete(self.pairs_fd(), &dangling).map_err(policy_error(names::POLICY_PAIRS))?;
        let unreferenced: Vec<LpmKey> = rebuilt
            .unreferenced
            .iter()
            .flat_map(|(id, list)| list.iter().map(|e| LpmKey::of(*id, e)))
            .collect();
        batch::delete(self.lists_fd(), &unreferenced).map_err(policy_error(names::POLICY_LISTS))?;
        if !dangling.is_empty() || !unreferenced.is_empty() {
            tracing::info!(
                pairs = dangling.len(),
                list_entries = unreferenced.len(),
                "policy entries no complete write left, deleted"
            );
        }
        self.lists = Some(table);
        Ok(())
    }

    /// Before writing a slot: its entries must be known (a trusted slot's are read back now,
    /// together with every other unloaded slot: one dump instead of one per slot), and the
    /// port lists the kernel holds. A dump begun ahead is taken first, whatever the slot: the
    /// maps are not written while they are read, and every unloaded slot is loaded from it.
    fn ensure_loaded(&mut self, slot: u32) -> Result<(), DatapathError> {
        if self.pending.is_some() || self.unloaded.contains(&slot) {
            let all = self.unloaded.clone();
            self.read_slots(&all)
        } else if self.lists.is_none() {
            self.read_slots(&BTreeSet::new())
        } else {
            Ok(())
        }
    }

    fn set_generation(&mut self, slot: u32, generation: u64) -> Result<(), DatapathError> {
        self.policy_gen
            .insert(slot, generation, 0)
            .map_err(DatapathError::map(names::POLICY_GEN))
    }

    pub(crate) fn apply(
        &mut self,
        slot: u32,
        policy: &EndpointPolicy,
        generation: u64,
    ) -> Result<u64, DatapathError> {
        self.ensure_loaded(slot)?;
        let new = encode_sorted(slot, &policy.entries);
        let flags = enforcement_flags(policy);
        let base = self.installed.remove(&slot).unwrap_or_default();
        let old_pairs = Pairs::of(base.iter(slot));
        let new_pairs = Pairs::of(new.iter().copied());
        let after = Shadow::pack_into(&mut self.scratch, new.into_iter());
        let complete = (after.digest(flags), after);
        let written = self.write_pairs(slot, &old_pairs, &new_pairs, Some(flags), generation);
        self.settle(slot, written, complete)
    }

    /// Replaces the entries of `identities` only; the rest of the slot's policy and its
    /// enforcement flags stay as they are.
    pub(crate) fn apply_identities(
        &mut self,
        slot: u32,
        identities: &BTreeSet<u32>,
        entries: &BTreeMap<PolicyEntry, Verdict>,
        generation: u64,
    ) -> Result<u64, DatapathError> {
        self.ensure_loaded(slot)?;
        let new = encode_sorted(slot, entries);
        let base = self.installed.remove(&slot).unwrap_or_default();
        let flags = self.slot_flags.get(&slot).copied().unwrap_or(0);
        let after = base.replacing(slot, identities, &new, &mut self.scratch);
        // The pairs of every identity whose entries may differ: those replaced, and any other
        // that `entries` adds to (none when the caller keeps to its contract). `new` is in key
        // order: each identity's entries are together.
        let mut others = BTreeSet::new();
        let mut last = None;
        for (b, _) in &new {
            let id = b.key.identity;
            if last != Some(id) && !identities.contains(&id) {
                others.insert(id);
            }
            last = Some(id);
        }
        let old_pairs;
        let new_pairs;
        if others.is_empty() {
            // The replaced identities' entries in the slot are now exactly `new`.
            old_pairs = Pairs::of(base.iter_identities(slot, identities));
            new_pairs = Pairs::of(new.iter().copied());
        } else {
            let touched: BTreeSet<u32> = identities.union(&others).copied().collect();
            old_pairs = Pairs::of(base.iter_identities(slot, &touched));
            new_pairs = Pairs::of(after.iter_identities(slot, &touched));
        }
        let complete = (after.digest(flags), after);
        let written = self.write_pairs(slot, &old_pairs, &new_pairs, None, generation);
        self.settle(slot, written, complete)
    }

    /// After a write of `slot`: `complete` (the slot's shadow and digest once the whole write is
    /// in, computed by the caller) is recorded in `installed` and the digest returned. A write
    /// that failed half-way leaves the slot to be read back, and the port lists too, before
    /// its next write.
    fn settle(
        &mut self,
        slot: u32,
        written: Result<(), DatapathError>,
        (digest, after): (u64, Shadow),
    ) -> Result<u64, DatapathError> {
        match written {
            Ok(()) => {
                self.installed.insert(slot, after);
                Ok(digest)
            }
            Err(error) => {
                self.unloaded.insert(slot);
                self.lists = None;
                Err(error)
            }
        }
    }

    /// Points the pairs of `slot` whose entries differ between `old` and `new` (each the pairs
    /// of the same identities, from the slot's shadow before and after the write) at their new
    /// lists, add before delete (Cilium #46927): first each at the union of its old and new entries, then
    /// (after the flags) at its new entries, or deleted. A packet both allow is never dropped in
    /// between: no deny block of either covers it. The flags between the two steps: a tier's
    /// flag turns on once its entries are in, and off before they go. The slot's generation is
    /// 0 while it is written and `generation` once it is complete.
    fn write_pairs(
        &mut self,
        slot: u32,
        old: &Pairs,
        new: &Pairs,
        flags: Option<u32>,
        generation: u64,
    ) -> Result<(), DatapathError> {
        self.set_generation(slot, 0)?;
        let lists = self.lists.as_mut().ok_or(DatapathError::Invalid(
            "the port lists were not read before a write".into(),
        ))?;
        let (mut first, mut second) = (Step::default(), Vec::new());
        for (pair, o, n) in changed(old, new) {
            let held = if o.is_empty() {
                None
            } else {
                Some(lists.id_of(o).ok_or_else(|| {
                    DatapathError::Invalid(format!(
                        "slot {slot}: no port list holds the entries of identity {} direction {}",
                        pair.0, pair.1
                    ))
                })?)
            };
            let both = union(o, n);
            let now = match held {
                Some(id) if both == o => id,
                _ => {
                    first.released.extend(held);
                    first.point(lists, pair_key(slot, pair), &both)
                }
            };
            if both != n {
                second.push((pair, n, now));
            }
        }
        self.make_room()?;
        self.run(first)?;
        if let Some(flags) = flags {
            self.set_slot_flags(slot, flags)?;
        }
        let mut last = Step::default();
        let lists = self.lists.as_mut().ok_or(DatapathError::Invalid(
            "the port lists were dropped during a write".into(),
        ))?;
        for (pair, n, now) in second {
            if n.is_empty() {
                last.unpoint.push(pair_key(slot, pair));
            } else {
                last.point(lists, pair_key(slot, pair), n);
            }
            last.released.push(now);
        }
        self.make_room()?;
        self.run(last)?;
        self.set_generation(slot, generation)
    }

    /// Sends one step to the kernel. The released lists are let go of only after the pairs
    /// moved: a freed id is handed out again only once its entries are deleted.
    fn run(&mut self, step: Step) -> Result<(), DatapathError> {
        let (keys, values): (Vec<LpmKey>, Vec<abi::PolicyValue>) = step
            .lists
            .iter()
            .flat_map(|(id, list)| list.iter().map(move |e| (LpmKey::of(*id, e), e.value)))
            .unzip();
        batch::update(self.lists_fd(), &keys, &values)
            .map_err(policy_error(names::POLICY_LISTS))?;
        let (keys, ids): (Vec<abi::PolicyPairKey>, Vec<u32>) = step.point.into_iter().unzip();
        batch::update(self.pairs_fd(), &keys, &ids).map_err(policy_error(names::POLICY_PAIRS))?;
        batch::delete(self.pairs_fd(), &step.unpoint).map_err(policy_error(names::POLICY_PAIRS))?;
        if let Some(lists) = self.lists.as_mut() {
            for id in step.released {
                lists.release(id);
            }
        }
        Ok(())
    }

    /// Deletes the lists no pair points at any more (idle since a write or a release moved the
    /// last pair away): at the end of a batch of writes, or during one when the idle lists take
    /// room a write needs. A failed delete leaves the table to be read again (the read-back
    /// deletes what is left).
    pub(crate) fn collect_lists(&mut self) -> Result<(), DatapathError> {
        let Some(lists) = self.lists.as_mut() else {
            return Ok(());
        };
        if lists.entries().0 == 0 {
            return Ok(());
        }
        let gone: Vec<LpmKey> = lists
            .take_idle()
            .iter()
            .flat_map(|(id, list)| list.iter().map(|e| LpmKey::of(*id, e)))
            .collect();
        let deleted =
            batch::delete(self.lists_fd(), &gone).map_err(policy_error(names::POLICY_LISTS));
        if deleted.is_err() {
            self.lists = None;
        }
        deleted
    }

    /// Before a step's lists are written (counted in the table already): collects the idle
    /// lists when all of them would not fit in the map, or when the idle ones alone take a
    /// quarter of it.
    fn make_room(&mut self) -> Result<(), DatapathError> {
        let Some(lists) = self.lists.as_ref() else {
            return Ok(());
        };
        let (idle, all) = lists.entries();
        if idle > 0 && (all > self.lists_max || idle > self.lists_max / 4) {
            self.collect_lists()?;
        }
        Ok(())
    }

    /// Copies the entries of the one policy trie of builds before the two-step lookup (still
    /// pinned at `legacy` after an upgrade from one) into the two maps, for every slot with a
    /// generation, keeping that generation. The programs this process attaches read only the
    /// two maps; until the restore rewrites each slot (another encoding wrote it: none is
    /// trusted), they find what the earlier programs found. The trie stays with the earlier
    /// programs until every endpoint runs these (`commit_programs` unpins it).
    pub(crate) fn migrate_legacy(&mut self, legacy: &std::path::Path) -> Result<(), DatapathError> {
        let t0 = std::time::Instant::now();
        let map = aya::maps::MapData::from_pin(legacy).map_err(|e| DatapathError::Bpffs {
            path: legacy.to_path_buf(),
            source: std::io::Error::other(e),
        })?;
        let entries: Vec<(LegacyKey, abi::PolicyValue)> =
            batch::lookup_all(map.fd().as_fd()).map_err(policy_error(names::LEGACY_POLICY))?;
        let generations = self.generations()?;
        let mut blocks: Vec<(PolicyBlock, abi::PolicyValue)> = entries
            .into_iter()
            .filter(|(k, _)| generations.contains_key(&k.data.policy_id))
            .map(|(k, v)| {
                let block = PolicyBlock {
                    key: k.data,
                    prefix_len: k.prefix_len,
                };
                (block, v)
            })
            .collect();
        blocks.sort_unstable();
        let slots: BTreeSet<u32> = blocks.iter().map(|(b, _)| b.key.policy_id).collect();
        // What a copy cut short left is the base of this one.
        self.read_slots(&slots)?;
        for run in blocks.chunk_by(|a, b| a.0.key.policy_id == b.0.key.policy_id) {
            let Some(slot) = run.first().map(|(b, _)| b.key.policy_id) else {
                continue;
            };
            let base = self.installed.remove(&slot).unwrap_or_default();
            let old = Pairs::of(base.iter(slot));
            let new = Pairs::of(run.iter().copied());
            let after = Shadow::pack_into(&mut self.scratch, run.iter().copied());
            let generation = generations.get(&slot).copied().unwrap_or(0);
            let written = self.write_pairs(slot, &old, &new, None, generation);
            self.settle(slot, written, (0, after))?;
        }
        self.collect_lists()?;
        tracing::info!(
            slots = slots.len(),
            entries = blocks.len(),
            ms = t0.elapsed().as_secs_f64() * 1000.0,
            "copied the earlier builds' policy trie into the policy maps"
        );
        Ok(())
    }

    /// Removes a slot's pairs (and the lists no pair points at any more), then its generation
    /// (the key stays while entries may remain).
    pub(crate) fn release_slot(&mut self, slot: u32) -> Result<(), DatapathError> {
        self.ensure_loaded(slot)?;
        self.set_generation(slot, 0)?;
        let pairs = self
            .installed
            .get(&slot)
            .map(|s| Pairs::of(s.iter(slot)))
            .unwrap_or_default();
        let mut step = Step::default();
        if let Some(lists) = self.lists.as_ref() {
            for (pair, list) in pairs.iter() {
                step.unpoint.push(pair_key(slot, pair));
                step.released.extend(lists.id_of(list));
            }
        }
        if let Err(error) = self.run(step) {
            self.installed.remove(&slot);
            self.unloaded.insert(slot);
            self.lists = None;
            return Err(error);
        }
        self.installed.remove(&slot);
        self.slot_flags.remove(&slot);
        self.collect_lists()?;
        super::state::ignore_missing(self.policy_gen.remove(&slot))
            .map_err(DatapathError::map(names::POLICY_GEN))
    }
}
