//! The two-step layout of the policy entries in the kernel (docs/DATAPATH.md, "Policy maps").
//! A slot's entries are, per (peer identity, direction with its layer) — a *pair* — a sorted
//! list of (proto, port block, value): the pair's *port list*. On a node most pairs have one of
//! a few hundred distinct lists (today's pod mix: ~55 000 pairs, ~420 lists), so the kernel holds
//! each distinct list once (`policy_lists`, an LPM trie keyed by list id, proto and port) and a
//! hash map from each pair to its list's id (`policy_pairs`).
//!
//! [`Lists`] is the manager's table of the lists the kernel holds, with how many pairs point at
//! each; [`Pairs::of`] cuts a slot's entries into pairs and lists, [`entries_of`] puts them back.
//! The kernel writes that use them are in `policy_maps`.

use super::encode::PolicyBlock;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use weft_ebpf::{self as abi, PolicyKey, PolicyListKey, PolicyPairKey, PolicyValue};

/// A pair of a slot: (peer identity, direction byte with its layer).
pub(crate) type Pair = (u32, u8);

/// One entry of a port list: a policy entry's protocol, port (network byte order) and prefix
/// length (the policy entry's, so the list entry's is [`ListEntry::list_prefix`]), and value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct ListEntry {
    pub(crate) proto: u8,
    pub(crate) dport: u16,
    pub(crate) prefix_len: u32,
    pub(crate) value: PolicyValue,
}

impl ListEntry {
    fn of(b: &PolicyBlock, value: PolicyValue) -> Self {
        Self {
            proto: b.key.proto,
            dport: b.key.dport,
            prefix_len: b.prefix_len,
            value,
        }
    }

    /// The prefix length of this entry in `policy_lists`.
    pub(crate) fn list_prefix(&self) -> u32 {
        self.prefix_len
            .saturating_sub(abi::POLICY_LIST_PREFIX_SHIFT)
    }

    /// This entry's key in list `id`.
    pub(crate) fn list_key(&self, id: u32) -> PolicyListKey {
        PolicyListKey {
            list_id: id,
            pad: 0,
            proto: self.proto,
            dport: self.dport,
        }
    }

    /// The entry a `policy_lists` key and value stand for.
    pub(crate) fn from_list(prefix_len: u32, key: PolicyListKey, value: PolicyValue) -> Self {
        Self {
            proto: key.proto,
            dport: key.dport,
            prefix_len: prefix_len + abi::POLICY_LIST_PREFIX_SHIFT,
            value,
        }
    }

    /// This entry as a policy entry of `slot` and `pair`.
    pub(crate) fn block(
        &self,
        slot: u32,
        (identity, direction): Pair,
    ) -> (PolicyBlock, PolicyValue) {
        let key = PolicyKey {
            policy_id: slot,
            identity,
            direction,
            proto: self.proto,
            dport: self.dport,
        };
        (
            PolicyBlock {
                key,
                prefix_len: self.prefix_len,
            },
            self.value,
        )
    }
}

/// A port list, sorted (the order of the policy entries it came from).
pub(crate) type List = Arc<[ListEntry]>;

/// The `policy_pairs` key of a pair of `slot`.
pub(crate) fn pair_key(slot: u32, (identity, direction): Pair) -> PolicyPairKey {
    PolicyPairKey {
        policy_id: slot,
        identity,
        direction,
        pad: [0; 3],
    }
}

/// Pairs of a slot (in key order) with their lists, in one vector of entries.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Pairs {
    entries: Vec<ListEntry>,
    /// Each pair and where its entries end.
    pairs: Vec<(Pair, usize)>,
}

impl Pairs {
    /// The pairs of a slot's entries (given in key order, as a shadow or the encoder yields
    /// them).
    pub(crate) fn of(entries: impl Iterator<Item = (PolicyBlock, PolicyValue)>) -> Self {
        let mut out = Self::default();
        for (b, v) in entries {
            let pair = (b.key.identity, b.key.direction);
            match out.pairs.last_mut() {
                Some((last, end)) if *last == pair => *end += 1,
                _ => out.pairs.push((pair, out.entries.len() + 1)),
            }
            out.entries.push(ListEntry::of(&b, v));
        }
        out
    }

    /// Each pair with its list, in key order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (Pair, &[ListEntry])> + '_ {
        let mut start = 0;
        self.pairs.iter().map(move |&(pair, end)| {
            let list = self.entries.get(start..end).unwrap_or_default();
            start = end;
            (pair, list)
        })
    }
}

/// The pairs whose lists differ between `old` and `new`, in key order, each with its old and
/// new list (empty: the pair has none).
pub(crate) fn changed<'a>(
    old: &'a Pairs,
    new: &'a Pairs,
) -> impl Iterator<Item = (Pair, &'a [ListEntry], &'a [ListEntry])> + 'a {
    let (mut o, mut n) = (old.iter().peekable(), new.iter().peekable());
    std::iter::from_fn(move || {
        loop {
            let next = match (o.peek(), n.peek()) {
                (None, None) => return None,
                (Some(a), Some(b)) if a.0 == b.0 => {
                    let (pair, ol) = o.next()?;
                    let (_, nl) = n.next()?;
                    (pair, ol, nl)
                }
                (Some(a), Some(b)) if a.0 < b.0 => {
                    let (pair, ol) = o.next()?;
                    (pair, ol, &[][..])
                }
                (Some(_), None) => {
                    let (pair, ol) = o.next()?;
                    (pair, ol, &[][..])
                }
                _ => {
                    let (pair, nl) = n.next()?;
                    (pair, &[][..], nl)
                }
            };
            if next.1 != next.2 {
                return Some(next);
            }
        }
    })
}

/// The policy entries of `slot` that pairs (in key order) with their lists stand for, in key
/// order.
pub(crate) fn entries_of<'a>(
    slot: u32,
    pairs: impl Iterator<Item = (Pair, &'a [ListEntry])> + 'a,
) -> impl Iterator<Item = (PolicyBlock, PolicyValue)> + 'a {
    pairs.flat_map(move |(pair, list)| list.iter().map(move |e| e.block(slot, pair)))
}

/// What a pair points at while a write replaces `old` by `new` (add before delete): every entry
/// of both, `new`'s value where both have the key. A packet both lists allow is covered by no
/// deny block of either, so every block of this list that contains it allows it.
pub(crate) fn union(old: &[ListEntry], new: &[ListEntry]) -> Vec<ListEntry> {
    let key = |e: &ListEntry| (e.proto, e.dport, e.prefix_len);
    let mut out = Vec::with_capacity(old.len() + new.len());
    let (mut o, mut n) = (old.iter().peekable(), new.iter().peekable());
    loop {
        let next = match (o.peek(), n.peek()) {
            (Some(a), Some(b)) if key(a) < key(b) => o.next(),
            (Some(a), Some(b)) if key(a) == key(b) => {
                o.next();
                n.next()
            }
            (Some(_), None) => o.next(),
            (_, Some(_)) => n.next(),
            (None, None) => break,
        };
        out.extend(next.copied());
    }
    out
}

/// A list the kernel holds, and how many pairs point at it.
#[derive(Debug)]
struct Held {
    list: List,
    refs: u32,
}

/// The port lists the kernel holds, by id and by content. Ids are never handed out again
/// before the list's entries are deleted: a freed id is reused only by this table, after its
/// caller deleted them, and a table rebuilt from the kernel ([`Lists::rebuild`]) starts above
/// every id the kernel has.
///
/// A list no pair points at any more stays in the kernel, idle, until the caller takes the idle
/// lists to delete them ([`Lists::take_idle`], at the end of a batch of writes): a later write
/// that needs the same entries points at it again without writing them. A whole-policy change
/// points every pair of every slot at the union of its old and new lists and then at the new
/// one; the same unions recur from slot to slot, and are written once per batch instead of once
/// per slot.
#[derive(Debug, Default)]
pub(crate) struct Lists {
    ids: HashMap<List, u32, foldhash::fast::RandomState>,
    held: HashMap<u32, Held, foldhash::fast::RandomState>,
    free: Vec<u32>,
    /// The smallest id never handed out.
    next: u32,
    /// The held lists no pair points at.
    idle: BTreeSet<u32>,
    /// Entries of the held lists, idle ones included (what the kernel holds).
    entries: usize,
    /// Entries of the idle lists.
    idle_entries: usize,
}

/// What [`Lists::acquire`] gave: the list's id, and whether its entries must be written (a list
/// the kernel does not hold yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Acquired {
    pub(crate) id: u32,
    pub(crate) fresh: bool,
}

impl Lists {
    /// The table of the lists `lists` (id → entries, as read from the kernel) with the pairs
    /// `pointing` at them (id of each pair). Lists no pair points at are returned apart (the
    /// caller deletes their entries), as are the ids pairs point at that hold no list (such a pair
    /// is deleted: it matches nothing).
    pub(crate) fn rebuild(
        lists: &BTreeMap<u32, Vec<ListEntry>>,
        pointing: impl Iterator<Item = u32>,
    ) -> (Self, Rebuilt) {
        let mut refs: HashMap<u32, u32> = HashMap::new();
        for id in pointing {
            *refs.entry(id).or_default() += 1;
        }
        let next = lists
            .keys()
            .chain(refs.keys())
            .max()
            .map_or(1, |max| max.saturating_add(1));
        let mut table = Self {
            next,
            ..Self::default()
        };
        let mut rebuilt = Rebuilt::default();
        for (&id, entries) in lists {
            let Some(&n) = refs.get(&id) else {
                rebuilt.unreferenced.push((id, entries.clone()));
                continue;
            };
            let mut sorted = entries.clone();
            sorted.sort_unstable();
            let list: List = sorted.into();
            // Two ids with the same entries (not written by this table): both stay held, the
            // first is the one new pairs get.
            table.ids.entry(Arc::clone(&list)).or_insert(id);
            table.entries += list.len();
            table.held.insert(id, Held { list, refs: n });
        }
        rebuilt.dangling = refs
            .keys()
            .filter(|id| !table.held.contains_key(id))
            .copied()
            .collect();
        (table, rebuilt)
    }

    /// The id of a list the kernel holds with exactly these entries.
    pub(crate) fn id_of(&self, entries: &[ListEntry]) -> Option<u32> {
        self.ids.get(entries).copied()
    }

    /// The entries of list `id`.
    #[cfg(test)]
    fn get(&self, id: u32) -> Option<&[ListEntry]> {
        self.held.get(&id).map(|h| &*h.list)
    }

    /// One more pair points at a list with these entries (not empty): the held one, or a new
    /// id whose entries the caller writes before pointing a pair at it.
    pub(crate) fn acquire(&mut self, entries: &[ListEntry]) -> Acquired {
        if let Some(&id) = self.ids.get(entries)
            && let Some(h) = self.held.get_mut(&id)
        {
            if h.refs == 0 && self.idle.remove(&id) {
                self.idle_entries = self.idle_entries.saturating_sub(h.list.len());
            }
            h.refs += 1;
            return Acquired { id, fresh: false };
        }
        let id = self.free.pop().unwrap_or_else(|| {
            let id = self.next;
            self.next = self.next.saturating_add(1);
            id
        });
        let list: List = entries.into();
        self.entries += list.len();
        self.ids.insert(Arc::clone(&list), id);
        self.held.insert(id, Held { list, refs: 1 });
        Acquired { id, fresh: true }
    }

    /// One pair fewer points at list `id`. When none is left the list becomes idle: the kernel
    /// keeps its entries until [`Self::take_idle`].
    pub(crate) fn release(&mut self, id: u32) {
        let Some(h) = self.held.get_mut(&id) else {
            return;
        };
        h.refs = h.refs.saturating_sub(1);
        if h.refs == 0 && self.idle.insert(id) {
            self.idle_entries += h.list.len();
        }
    }

    /// How many entries the idle lists have, and the held lists in all (idle ones included).
    pub(crate) fn entries(&self) -> (usize, usize) {
        (self.idle_entries, self.entries)
    }

    /// Drops the idle lists from the table and returns them: the caller deletes their entries
    /// from the kernel (then their ids may be handed out again).
    pub(crate) fn take_idle(&mut self) -> Vec<(u32, List)> {
        let mut out = Vec::with_capacity(self.idle.len());
        for id in std::mem::take(&mut self.idle) {
            let Some(h) = self.held.remove(&id) else {
                continue;
            };
            if self.ids.get(&h.list) == Some(&id) {
                self.ids.remove(&h.list);
            }
            self.entries = self.entries.saturating_sub(h.list.len());
            self.free.push(id);
            out.push((id, h.list));
        }
        self.idle_entries = 0;
        out
    }

    /// How many lists, and how many entries in all, the table holds.
    #[cfg(test)]
    fn size(&self) -> (usize, usize) {
        (
            self.held.len(),
            self.held.values().map(|h| h.list.len()).sum(),
        )
    }
}

/// What [`Lists::rebuild`] found that no write of this table left: lists no pair points at (a
/// write or a release cut short), and ids pairs point at with no list.
#[derive(Debug, Default)]
pub(crate) struct Rebuilt {
    pub(crate) unreferenced: Vec<(u32, Vec<ListEntry>)>,
    pub(crate) dangling: Vec<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(dport: u16, verdict: u8) -> ListEntry {
        ListEntry {
            proto: 6,
            dport: dport.to_be(),
            prefix_len: abi::POLICY_FULL_PREFIX,
            value: PolicyValue::verdict(verdict),
        }
    }

    fn block(identity: u32, direction: u8, dport: u16, verdict: u8) -> (PolicyBlock, PolicyValue) {
        e(dport, verdict).block(7, (identity, direction))
    }

    #[test]
    fn a_slot_cut_into_pairs_and_put_back_is_the_same() {
        let entries = vec![
            block(0, 0, 53, 1),
            block(0, 1, 80, 1),
            block(300, 0, 80, 1),
            block(300, 0, 443, 2),
            block(300, 0x11, 22, 4),
            block(70_000, 1, 80, 1),
        ];
        let pairs = Pairs::of(entries.iter().copied());
        assert_eq!(
            pairs.iter().map(|(p, _)| p).collect::<Vec<_>>(),
            [(0, 0), (0, 1), (300, 0), (300, 0x11), (70_000, 1)]
        );
        let back: Vec<_> = entries_of(7, pairs.iter()).collect();
        assert_eq!(back, entries);
        assert_eq!(Pairs::of(std::iter::empty()).iter().count(), 0);
    }

    #[test]
    fn the_changed_pairs_are_those_whose_lists_differ() {
        let old = Pairs::of(
            [
                block(1, 0, 80, 1),
                block(2, 0, 80, 1),
                block(3, 0, 80, 1),
                block(3, 0, 443, 1),
                block(5, 0, 22, 1),
            ]
            .into_iter(),
        );
        let new = Pairs::of(
            [
                block(0, 0, 53, 1),
                block(2, 0, 80, 1),
                block(3, 0, 80, 2),
                block(3, 0, 443, 1),
                block(4, 0, 80, 1),
            ]
            .into_iter(),
        );
        let got: Vec<(Pair, usize, usize)> = changed(&old, &new)
            .map(|(p, o, n)| (p, o.len(), n.len()))
            .collect();
        // 0 and 4 are new, 1 and 5 gone, 3 changed a value; 2 is the same.
        assert_eq!(
            got,
            [
                ((0, 0), 0, 1),
                ((1, 0), 1, 0),
                ((3, 0), 2, 2),
                ((4, 0), 0, 1),
                ((5, 0), 1, 0)
            ]
        );
        assert_eq!(changed(&new, &new).count(), 0);
    }

    #[test]
    fn a_list_entry_keeps_its_prefix_through_the_list_key() {
        let any_proto = ListEntry {
            proto: 0,
            dport: 0,
            prefix_len: abi::POLICY_FIXED_PREFIX,
            value: PolicyValue::verdict(1),
        };
        for entry in [e(8080, 2), any_proto] {
            let key = entry.list_key(9);
            assert_eq!(
                ListEntry::from_list(entry.list_prefix(), key, entry.value),
                entry
            );
        }
        assert_eq!(any_proto.list_prefix(), abi::POLICY_LIST_FIXED_PREFIX);
        assert_eq!(e(1, 1).list_prefix(), abi::POLICY_LIST_FULL_PREFIX);
    }

    #[test]
    fn the_same_entries_share_one_list_until_the_last_pair_lets_go() {
        let mut lists = Lists::default();
        let web = [e(80, 1), e(443, 1)];
        let a = lists.acquire(&web);
        assert!(a.fresh);
        let b = lists.acquire(&web);
        assert_eq!(
            b,
            Acquired {
                id: a.id,
                fresh: false
            }
        );
        let dns = lists.acquire(&[e(53, 1)]);
        assert!(dns.fresh && dns.id != a.id);
        assert_eq!(lists.size(), (2, 3));
        assert_eq!(lists.entries(), (0, 3));
        lists.release(a.id);
        assert_eq!(lists.entries(), (0, 3), "one pair still points at it");
        lists.release(a.id);
        assert_eq!(lists.entries(), (2, 3), "idle, still in the kernel");
        assert_eq!(lists.id_of(&web), Some(a.id));
        assert_eq!(lists.take_idle(), vec![(a.id, web.to_vec().into())]);
        assert_eq!(lists.entries(), (0, 1));
        assert_eq!(lists.id_of(&web), None);
        // The freed id is handed out again, for other entries.
        let ssh = lists.acquire(&[e(22, 1)]);
        assert_eq!(
            ssh,
            Acquired {
                id: a.id,
                fresh: true
            }
        );
        assert_eq!(lists.get(ssh.id), Some(&[e(22, 1)][..]));
        lists.release(999);
        assert_eq!(
            lists.entries(),
            (0, 2),
            "an id it does not hold changes nothing"
        );
    }

    #[test]
    fn an_idle_list_is_pointed_at_again_without_a_write() {
        let mut lists = Lists::default();
        let union = [e(80, 1), e(443, 1), e(8080, 1)];
        // One slot's write: its pair goes through the union and lets go of it.
        let first = lists.acquire(&union);
        assert!(first.fresh);
        lists.release(first.id);
        assert_eq!(lists.entries(), (3, 3));
        // The next slot's write needs the same union: the kernel has it.
        assert_eq!(
            lists.acquire(&union),
            Acquired {
                id: first.id,
                fresh: false
            }
        );
        assert_eq!(lists.entries(), (0, 3), "held again, not idle");
        assert!(lists.take_idle().is_empty(), "a held list is not taken");
        lists.release(first.id);
        assert_eq!(lists.take_idle().len(), 1);
        assert_eq!(lists.size(), (0, 0));
    }

    #[test]
    fn a_rebuilt_table_counts_the_pairs_and_finds_what_no_write_left() {
        let read = BTreeMap::from([
            (4, vec![e(443, 1), e(80, 1)]),
            (9, vec![e(22, 1)]),
            (12, vec![e(53, 1)]),
        ]);
        let (mut lists, rebuilt) = Lists::rebuild(&read, [4, 4, 12, 30].into_iter());
        assert_eq!(rebuilt.unreferenced, vec![(9, vec![e(22, 1)])]);
        assert_eq!(rebuilt.dangling, vec![30]);
        // New ids start above every id the kernel had, the dangling one included.
        assert_eq!(lists.acquire(&[e(1, 1)]).id, 31);
        // Sorted as read back; counted once per pair.
        assert_eq!(lists.id_of(&[e(80, 1), e(443, 1)]), Some(4));
        assert_eq!(
            lists.entries(),
            (0, 4),
            "the unreferenced list is the caller's to delete"
        );
        lists.release(4);
        lists.release(4);
        assert_eq!(lists.take_idle().len(), 1);
        assert_eq!(
            lists.acquire(&[e(2, 1)]).id,
            4,
            "deleted, then handed out again"
        );
    }

    #[test]
    fn the_union_has_both_lists_entries_with_the_new_values() {
        let old = [e(22, 1), e(80, 2), e(443, 1)];
        let new = [e(80, 1), e(8080, 1)];
        assert_eq!(
            union(&old, &new),
            vec![e(22, 1), e(80, 1), e(8080, 1), e(443, 1)],
            "in the order of the ports' network byte order"
        );
        assert_eq!(union(&[], &new), new.to_vec());
        assert_eq!(union(&old, &[]), old.to_vec());
    }
}
