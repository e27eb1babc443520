//! Small sets kept as sorted vectors without duplicates ([`Set`]: the labels of a
//! [`crate::labels::LabelSet`], the requirements of a [`crate::selector::Selector`], the values
//! of a requirement): a `BTreeSet` allocates a node for eleven entries, and these sets hold one
//! or two. A sorted, deduplicated vector orders, compares and hashes as the `BTreeSet` of the
//! same items.

/// `items` sorted, without duplicates, and no spare capacity: the set of them.
fn set_of<T: Ord>(mut items: Vec<T>) -> Vec<T> {
    items.sort();
    items.dedup();
    items.shrink_to_fit();
    items
}

/// A small set as a sorted vector without duplicates. Orders, compares, hashes and serializes
/// as the `BTreeSet` of the same items, which it replaced.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(transparent)]
pub struct Set<T: Ord>(Vec<T>);

impl<T: Ord> Set<T> {
    /// Whether the set holds `item`.
    pub fn contains<Q>(&self, item: &Q) -> bool
    where
        T: std::borrow::Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.0.binary_search_by(|x| x.borrow().cmp(item)).is_ok()
    }

    /// The items, in order.
    pub fn iter(&self) -> std::slice::Iter<'_, T> {
        self.0.iter()
    }

    /// How many items.
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True without items.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Adds `item` at its place, unless the set has it.
    pub fn insert(&mut self, item: T) {
        if let Err(at) = self.0.binary_search(&item) {
            self.0.insert(at, item);
        }
    }

    /// Keeps the items for which `keep` is true.
    pub fn retain(&mut self, keep: impl FnMut(&T) -> bool) {
        self.0.retain(keep);
    }

    /// Gives back the spare capacity (a set built by [`Self::insert`]s).
    pub fn shrink_to_fit(&mut self) {
        self.0.shrink_to_fit();
    }
}

impl<T: Ord> Default for Set<T> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<T: Ord> FromIterator<T> for Set<T> {
    fn from_iter<I: IntoIterator<Item = T>>(items: I) -> Self {
        Self(set_of(items.into_iter().collect()))
    }
}

impl<T: Ord, const N: usize> From<[T; N]> for Set<T> {
    fn from(items: [T; N]) -> Self {
        items.into_iter().collect()
    }
}

impl<'a, T: Ord> IntoIterator for &'a Set<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl<'de, T: Ord + serde::Deserialize<'de>> serde::Deserialize<'de> for Set<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Vec::<T>::deserialize(d).map(|v| Self(set_of(v)))
    }
}

#[cfg(test)]
mod tests {
    use super::Set;
    use std::collections::BTreeSet;

    proptest::proptest! {
        /// A set orders, compares, hashes and serializes as the `BTreeSet` of the same items,
        /// and holds what the `BTreeSet` holds.
        #[test]
        fn a_set_is_its_btree_set_in_order_equality_hash_and_form(
            a in proptest::collection::vec("[a-c]{0,2}", 0..6),
            b in proptest::collection::vec("[a-c]{0,2}", 0..6),
            probe in "[a-c]{0,2}",
        ) {
            let (sa, sb): (Set<String>, Set<String>) =
                (a.iter().cloned().collect(), b.iter().cloned().collect());
            let (ta, tb): (BTreeSet<String>, BTreeSet<String>) =
                (a.into_iter().collect(), b.into_iter().collect());
            proptest::prop_assert!(sa.iter().eq(ta.iter()));
            proptest::prop_assert_eq!(sa.len(), ta.len());
            proptest::prop_assert_eq!(sa.contains(probe.as_str()), ta.contains(probe.as_str()));
            proptest::prop_assert_eq!(sa.cmp(&sb), ta.cmp(&tb));
            proptest::prop_assert_eq!(sa == sb, ta == tb);
            proptest::prop_assert_eq!(crate::rule::hash_of(&sa), crate::rule::hash_of(&ta));
            let json = serde_json::to_string(&sa).unwrap();
            proptest::prop_assert_eq!(&json, &serde_json::to_string(&ta).unwrap());
            proptest::prop_assert_eq!(serde_json::from_str::<Set<String>>(&json).unwrap(), sa.clone());
            // A serialized form out of order or with repeats (written by hand) reads as the set.
            let shuffled: Vec<&String> = ta.iter().rev().chain(ta.iter()).collect();
            let read: Set<String> = serde_json::from_str(&serde_json::to_string(&shuffled).unwrap()).unwrap();
            proptest::prop_assert_eq!(read, sa);
        }
    }
}
