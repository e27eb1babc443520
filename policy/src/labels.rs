//! Cilium's source-prefixed labels (`k8s:app=web`) and the sorted label set that keys identities.

use crate::sorted::Set;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// Well-known label sources (Cilium `pkg/labels`).
pub mod source {
    /// Labels derived from Kubernetes objects (pods, policies).
    pub const K8S: &str = "k8s";
    /// Matches any source; only meaningful in selectors and filters.
    pub const ANY: &str = "any";
    /// Labels of reserved identities (`reserved:host`, `reserved:world`).
    pub const RESERVED: &str = "reserved";
    /// Rule labels given without a source (`cilium policy import`).
    pub const UNSPEC: &str = "unspec";
}

/// Well-known label keys.
pub mod keys {
    /// The pod's namespace; always present on endpoints, set by the manager.
    pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
    /// Prefix Cilium uses to expose the labels of a pod's namespace on the pod.
    pub const NAMESPACE_LABELS_PREFIX: &str = "io.cilium.k8s.namespace.labels.";
    /// The namespace label Kubernetes (>= 1.21) sets on every namespace.
    pub const NAMESPACE_NAME: &str = "kubernetes.io/metadata.name";
    /// Derived rule label: the kind of object a rule came from.
    pub const POLICY_DERIVED_FROM: &str = "io.cilium.k8s.policy.derived-from";
    /// Derived rule label: the policy object's name.
    pub const POLICY_NAME: &str = "io.cilium.k8s.policy.name";
    /// Derived rule label: the policy object's namespace.
    pub const POLICY_NAMESPACE: &str = "io.cilium.k8s.policy.namespace";
    /// Derived rule label: the policy object's uid.
    pub const POLICY_UID: &str = "io.cilium.k8s.policy.uid";
}

/// Why a label string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    /// Empty key.
    #[error("label {0:?} has an empty key")]
    EmptyKey(String),
    /// Empty source before the `:`.
    #[error("label {0:?} has an empty source before ':'")]
    EmptySource(String),
    /// A key or value with a character labels cannot hold, or too long.
    #[error("label {0:?}: {1}")]
    BadChar(String, &'static str),
    /// A key the manager owns (the namespace labels) cannot be changed by users.
    #[error("label key {0:?} is set by Weft from the pod's namespace and cannot be changed")]
    Managed(String),
}

/// Longest label key accepted: a Kubernetes key is a 253-byte DNS prefix, `/`, a 63-byte name.
pub const MAX_KEY_LEN: usize = 317;
/// Longest label value accepted (Kubernetes allows 63; CNI labels may carry a bit more).
pub const MAX_VALUE_LEN: usize = 1024;

fn bad_char(c: char) -> bool {
    // Whitespace and control characters (NUL, newline, escape) would let a label inject lines
    // into weftctl's output and logs; ',' and '=' are the separators of `k=v,k=v` lists.
    c.is_whitespace() || c.is_control() || matches!(c, ',' | '=')
}

/// Checks a label key (with or without its `source:`): non-empty, at most [`MAX_KEY_LEN`]
/// bytes, no whitespace, control characters, ',' or '='.
pub fn check_key(key: &str) -> Result<(), LabelError> {
    if key.is_empty() {
        return Err(LabelError::EmptyKey(key.into()));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(LabelError::BadChar(
            key.chars().take(40).collect(),
            "key longer than 317 bytes",
        ));
    }
    if key.chars().any(bad_char) {
        return Err(LabelError::BadChar(
            key.into(),
            "keys cannot hold whitespace, control characters, ',' or '='",
        ));
    }
    Ok(())
}

/// Checks a label value: at most [`MAX_VALUE_LEN`] bytes, no whitespace, control characters
/// or ','.
pub fn check_value(value: &str) -> Result<(), LabelError> {
    if value.len() > MAX_VALUE_LEN {
        return Err(LabelError::BadChar(
            value.chars().take(40).collect(),
            "value longer than 1024 bytes",
        ));
    }
    if value.chars().any(|c| c != '=' && bad_char(c)) {
        return Err(LabelError::BadChar(
            value.into(),
            "values cannot hold whitespace, control characters or ','",
        ));
    }
    Ok(())
}

/// One label. Endpoint labels always carry a concrete source; `any` appears only in filters.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Label {
    /// Where the label comes from (`k8s`, `reserved`, `unspec`, ...).
    pub source: String,
    /// Key without the source.
    pub key: String,
    /// Value; may be empty.
    pub value: String,
}

impl Label {
    /// Builds a label from parts.
    #[must_use]
    pub fn new(source: &str, key: &str, value: &str) -> Self {
        Self {
            source: source.to_owned(),
            key: key.to_owned(),
            value: value.to_owned(),
        }
    }

    /// Parses `src:key=value`, `key=value` or `key`; a missing source becomes `default_source`.
    ///
    /// The source separator only counts before the first `=`, so values may contain `:`.
    pub fn parse_with_source(s: &str, default_source: &str) -> Result<Self, LabelError> {
        let (kpart, value) = s.split_once('=').unwrap_or((s, ""));
        let (source, key) = match kpart.split_once(':') {
            Some(("", _)) => return Err(LabelError::EmptySource(s.into())),
            Some((src, key)) => (src, key),
            None => (default_source, kpart),
        };
        if key.is_empty() {
            return Err(LabelError::EmptyKey(s.into()));
        }
        check_key(source)?;
        check_key(key)?;
        check_value(value)?;
        Ok(Self::new(source, key, value))
    }

    /// Parses a label for use as a filter: no source means any source.
    pub fn parse_filter(s: &str) -> Result<Self, LabelError> {
        Self::parse_with_source(s, source::ANY)
    }

    /// True when `self`, used as a filter, matches `target` (`any` matches every source).
    #[must_use]
    pub fn matches(&self, target: &Label) -> bool {
        (self.source == source::ANY || self.source == target.source)
            && self.key == target.key
            && self.value == target.value
    }
}

impl fmt::Display for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.source, self.key)?;
        if !self.value.is_empty() {
            write!(f, "={}", self.value)?;
        }
        Ok(())
    }
}

impl Serialize for Label {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Label {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Label::parse_with_source(&s, source::UNSPEC).map_err(serde::de::Error::custom)
    }
}

/// A sorted, deduplicated set of labels: the key of a security identity.
///
/// A sorted vector, not a `BTreeSet`: a set holds a few labels, and a B-tree allocates a node
/// for eleven (~800 bytes for one label); every rule holds several sets (its labels, its
/// selectors'): with [`crate::selector::Selector`] made the same, the manager's steady RSS in
/// `bench-policy`'s today's mix (1000 rules) went from 31.0 to 29.0-29.5 MiB. Order, equality
/// and hash are a `BTreeSet`'s (both compare and hash as the sorted sequence), so content
/// hashes are unchanged.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LabelSet(Set<Label>);

impl LabelSet {
    /// The empty set.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Security labels of a pod: its CNI labels (source `k8s`, as Cilium gives pod labels) plus
    /// the namespace labels the manager owns.
    ///
    /// The namespace labels are set last and any user-supplied label with the same key is
    /// dropped: a pod must not be able to claim another namespace through `args.cni.labels`.
    #[must_use]
    pub fn for_pod<'a>(
        namespace: &str,
        labels: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Self {
        let ns_name_key = format!("{}{}", keys::NAMESPACE_LABELS_PREFIX, keys::NAMESPACE_NAME);
        let mut set: Self = labels
            .into_iter()
            .filter(|(k, _)| *k != keys::POD_NAMESPACE && *k != ns_name_key)
            .map(|(k, v)| Label::new(source::K8S, k, v))
            .collect();
        set.insert(Label::new(source::K8S, keys::POD_NAMESPACE, namespace));
        // Kubernetes labels every namespace with its name; Cilium exposes namespace labels on
        // pods under this prefix, which is what namespaceSelector translates to.
        set.insert(Label::new(source::K8S, &ns_name_key, namespace));
        set
    }

    /// Applies a user's label change (`weftctl endpoint labels --add k=v --remove k`) to a
    /// pod's security labels. User labels have source `k8s`, like pod labels; the namespace
    /// labels cannot be added or removed this way.
    pub fn with_user_changes<'a>(
        &self,
        add: &[(&'a str, &'a str)],
        remove: &[&'a str],
    ) -> Result<Self, LabelError> {
        let ns_name_key = format!("{}{}", keys::NAMESPACE_LABELS_PREFIX, keys::NAMESPACE_NAME);
        let managed = |k: &str| k == keys::POD_NAMESPACE || k == ns_name_key;
        // Users may name a key with its `k8s:` source; any other source, or a ':' left in the
        // key, would create a label no selector can name (or dodge the managed-key check).
        let bare = |k: &'a str| -> Result<&'a str, LabelError> {
            let key = k.strip_prefix("k8s:").unwrap_or(k);
            check_key(key)?;
            if key.contains(':') {
                return Err(LabelError::BadChar(
                    k.chars().take(80).collect(),
                    "only k8s labels can be changed: use key or k8s:key, with no other ':'",
                ));
            }
            if managed(key) {
                return Err(LabelError::Managed(k.to_owned()));
            }
            Ok(key)
        };
        let add: Vec<(&str, &str)> = add
            .iter()
            .map(|(k, v)| check_value(v).and_then(|()| Ok((bare(k)?, *v))))
            .collect::<Result<_, _>>()?;
        let remove: Vec<&str> = remove.iter().map(|k| bare(k)).collect::<Result<_, _>>()?;
        let mut out = self.clone();
        for k in remove {
            out.remove_key(source::K8S, k);
        }
        for (k, v) in add {
            out.insert(Label::new(source::K8S, k, v));
        }
        Ok(out)
    }

    /// Parses a comma-separated or whitespace-separated list, e.g. `k8s:app=web,tier=db`.
    pub fn parse_list(s: &str, default_source: &str) -> Result<Self, LabelError> {
        s.split([',', ' ', '\n', '\t'])
            .filter(|p| !p.is_empty())
            .map(|p| Label::parse_with_source(p, default_source))
            .collect()
    }

    /// Adds a label, replacing one with the same source and key.
    pub fn insert(&mut self, label: Label) {
        self.0
            .retain(|l| !(l.source == label.source && l.key == label.key));
        self.0.insert(label);
    }

    /// Removes every label with that key (any source when `source` is `any`).
    pub fn remove_key(&mut self, source: &str, key: &str) -> bool {
        let before = self.0.len();
        self.0
            .retain(|l| !(l.key == key && (source == source::ANY || l.source == source)));
        before != self.0.len()
    }

    /// Values of `key` in this set; `source` may be `any`.
    pub fn values_of<'a>(&'a self, source: &'a str, key: &'a str) -> impl Iterator<Item = &'a str> {
        self.0
            .iter()
            .filter(move |l| l.key == key && (source == source::ANY || l.source == source))
            .map(|l| l.value.as_str())
    }

    /// True when every filter label matches some label of this set (Cilium's subset match).
    #[must_use]
    pub fn contains_all<'a>(&self, filter: impl IntoIterator<Item = &'a Label>) -> bool {
        filter
            .into_iter()
            .all(|f| self.0.iter().any(|l| f.matches(l)))
    }
}

/// The labels, read-only: in sorted order (`iter`), `len`, `is_empty`, `contains`. Changes go
/// through [`LabelSet::insert`] and [`LabelSet::remove_key`], which keep one label per key and
/// source.
impl std::ops::Deref for LabelSet {
    type Target = Set<Label>;
    fn deref(&self) -> &Set<Label> {
        &self.0
    }
}

impl FromIterator<Label> for LabelSet {
    fn from_iter<T: IntoIterator<Item = Label>>(iter: T) -> Self {
        let mut set = Self::new();
        for l in iter {
            set.insert(l);
        }
        set.0.shrink_to_fit();
        set
    }
}

impl fmt::Display for LabelSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, l) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{l}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_forms() {
        let cases = [
            ("k8s:app=web", "k8s", "app", "web"),
            ("app=web", "dflt", "app", "web"),
            ("app", "dflt", "app", ""),
            ("k8s:app", "k8s", "app", ""),
            ("url=http://x", "dflt", "url", "http://x"),
            (
                "k8s:io.kubernetes.pod.namespace=default",
                "k8s",
                "io.kubernetes.pod.namespace",
                "default",
            ),
        ];
        for (s, src, k, v) in cases {
            let l = Label::parse_with_source(s, "dflt").unwrap();
            assert_eq!(
                (l.source.as_str(), l.key.as_str(), l.value.as_str()),
                (src, k, v),
                "{s}"
            );
        }
        assert!(Label::parse_with_source("=x", "d").is_err());
        assert!(Label::parse_with_source(":k=x", "d").is_err());
    }

    #[test]
    fn display_roundtrip() {
        let l = Label::parse_with_source("k8s:app=web", "x").unwrap();
        assert_eq!(l.to_string(), "k8s:app=web");
        let j = serde_json::to_string(&l).unwrap();
        assert_eq!(serde_json::from_str::<Label>(&j).unwrap(), l);
    }

    #[test]
    fn set_is_sorted_and_dedup_by_key() {
        let s: LabelSet = ["k8s:b=1", "k8s:a=1", "k8s:b=2"]
            .iter()
            .map(|x| Label::parse_with_source(x, "k8s").unwrap())
            .collect();
        assert_eq!(s.to_string(), "k8s:a=1,k8s:b=2");
    }

    #[test]
    fn pod_labels_cannot_spoof_namespace() {
        let s = LabelSet::for_pod(
            "prod",
            [
                ("app", "web"),
                ("io.kubernetes.pod.namespace", "kube-system"),
            ],
        );
        assert_eq!(
            s.values_of("k8s", keys::POD_NAMESPACE).collect::<Vec<_>>(),
            ["prod"]
        );
        assert!(s.contains(&Label::new("k8s", "app", "web")));
        assert_eq!(s.len(), 3);
    }

    #[test]
    fn user_changes_keep_namespace() {
        let s = LabelSet::for_pod("prod", [("app", "web"), ("tier", "front")]);
        let t = s.with_user_changes(&[("app", "api")], &["tier"]).unwrap();
        assert_eq!(
            t.to_string(),
            "k8s:app=api,k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name=prod,k8s:io.kubernetes.pod.namespace=prod"
        );
        assert_eq!(
            s.with_user_changes(&[], &["io.kubernetes.pod.namespace"]),
            Err(LabelError::Managed("io.kubernetes.pod.namespace".into()))
        );
        assert!(s.with_user_changes(&[("", "x")], &[]).is_err());
    }

    #[test]
    fn filter_any_source() {
        let s = LabelSet::for_pod("ns", [("app", "web")]);
        assert!(s.contains_all(&[Label::parse_filter("app=web").unwrap()]));
        assert!(s.contains_all(&[Label::parse_filter("k8s:app=web").unwrap()]));
        assert!(!s.contains_all(&[Label::parse_filter("unspec:app=web").unwrap()]));
        assert!(!s.contains_all(&[Label::parse_filter("app=db").unwrap()]));
    }

    #[test]
    fn hostile_characters_are_refused_in_keys_and_values() {
        for bad in [
            "a b=c",
            "a\0=b",
            "a=b\nINJECTED",
            "a\n=b",
            "k=v,w",
            "a\x1b[2J=b",
            "",
        ] {
            assert!(Label::parse_with_source(bad, "k8s").is_err(), "{bad:?}");
        }
        assert!(Label::parse_with_source(&"k".repeat(318), "k8s").is_err());
        assert!(Label::parse_with_source("app.kubernetes.io/name=a=b", "k8s").is_ok());
        let set = LabelSet::new();
        assert!(set.with_user_changes(&[("\0", "x")], &[]).is_err());
        assert!(set.with_user_changes(&[("a", "two words")], &[]).is_err());
        assert!(set.with_user_changes(&[("a", "ok")], &["bad key"]).is_err());
        // The managed namespace label cannot be reached through its source prefix either.
        let pod = LabelSet::for_pod("ns1", [("app", "web")]);
        for k in [
            "k8s:io.kubernetes.pod.namespace",
            "io.kubernetes.pod.namespace",
        ] {
            assert!(matches!(
                pod.with_user_changes(&[(k, "kube-system")], &[]),
                Err(LabelError::Managed(_))
            ));
            assert!(pod.with_user_changes(&[], &[k]).is_err());
        }
        assert!(
            pod.with_user_changes(&[("reserved:host", "")], &[])
                .is_err()
        );
        let changed = pod.with_user_changes(&[("k8s:tier", "db")], &[]).unwrap();
        assert_eq!(
            changed,
            pod.with_user_changes(&[("tier", "db")], &[]).unwrap()
        );
    }

    proptest::proptest! {
        /// The sorted vector orders, compares, hashes and serializes as the `BTreeSet` it
        /// replaced: identities' and rules' hashes and stored records are unchanged.
        #[test]
        fn a_label_set_is_its_btree_set_in_order_equality_hash_and_form(
            a in proptest::collection::vec((0..3u8, 0..4u8, 0..3u8), 0..6),
            b in proptest::collection::vec((0..3u8, 0..4u8, 0..3u8), 0..6),
        ) {
            use std::collections::BTreeSet;
            let set = |v: &[(u8, u8, u8)]| -> LabelSet {
                v.iter()
                    .map(|(s, k, x)| Label::new(&format!("s{s}"), &format!("k{k}"), &format!("v{x}")))
                    .collect()
            };
            let (a, b) = (set(&a), set(&b));
            let tree = |s: &LabelSet| -> BTreeSet<Label> { s.iter().cloned().collect() };
            let (ta, tb) = (tree(&a), tree(&b));
            proptest::prop_assert!(a.iter().eq(ta.iter()));
            proptest::prop_assert_eq!(a.cmp(&b), ta.cmp(&tb));
            proptest::prop_assert_eq!(a == b, ta == tb);
            proptest::prop_assert_eq!(crate::rule::hash_of(&a), crate::rule::hash_of(&ta));
            let json = serde_json::to_string(&a).unwrap();
            proptest::prop_assert_eq!(&json, &serde_json::to_string(&ta).unwrap());
            proptest::prop_assert_eq!(serde_json::from_str::<LabelSet>(&json).unwrap(), a);
        }
    }
}
