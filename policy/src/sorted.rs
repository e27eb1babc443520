//! Small sets kept as sorted vectors without duplicates ([`crate::labels::LabelSet`],
//! [`crate::selector::Selector`]): a `BTreeSet` allocates a node for eleven entries, and these
//! sets hold one or two. A sorted, deduplicated vector orders, compares and hashes as the
//! `BTreeSet` of the same items.

/// `items` sorted, without duplicates, and no spare capacity: the set of them.
pub(crate) fn set_of<T: Ord>(mut items: Vec<T>) -> Vec<T> {
    items.sort();
    items.dedup();
    items.shrink_to_fit();
    items
}

/// Adds `item` to the sorted `set` at its place, unless the set has it.
pub(crate) fn insert<T: Ord>(set: &mut Vec<T>, item: T) {
    if let Err(at) = set.binary_search(&item) {
        set.insert(at, item);
    }
}
