//! Cluster-wide identities in the kvstore, after Cilium's kvstore allocator: a master key per
//! label set (`key/<labels>` → n) and per number (`id/<n>` → labels), created together by one
//! create-if-absent transaction, plus one reference per node (`value/<labels>/<node>` → n)
//! under that node's lease. Every node asking for a label set gets the number of the master
//! key, so the number is the same everywhere.
//!
//! Freeing without a lock: a node publishing a reference rewrites the master key in the same
//! transaction (moving its mod revision), and the collector deletes both master keys only if
//! that revision is still the one it read before listing the references and finding none.
//! A reference published in between makes the delete fail; one published after it finds no
//! master key and creates the identity again.

use weft_policy::labels::LabelSet;
use weft_policy::mapstate::{Identity, reserved};

use super::keys;
use super::{Compare, Kv, KvError, LeaseId, Op};

/// Label identities live in 256..2^24 (CIDR identities, node-local, above).
const LAST_LABEL_ID: Identity = reserved::FIRST_CIDR - 1;

/// How often allocation retries when another node takes the candidate number first.
const ATTEMPTS: usize = 16;

/// Identity failures that are not store failures.
#[derive(Debug, thiserror::Error)]
pub enum ClusterIdentityError {
    /// The store failed.
    #[error(transparent)]
    Kv(#[from] KvError),
    /// The cluster has another number for a label set than this node (e.g. etcd's data was
    /// replaced while this node kept its own).
    #[error(
        "identity conflict for {labels}: this node uses {local}, the kvstore says {cluster}; restart the pods with these labels (or the manager with an empty state dir) to take the cluster's number"
    )]
    Conflict {
        /// The labels.
        labels: String,
        /// This node's number.
        local: Identity,
        /// The kvstore's.
        cluster: Identity,
    },
    /// Every number is taken, or other nodes kept winning the race.
    #[error("cannot allocate an identity for {0}: no free number after {ATTEMPTS} attempts")]
    Exhausted(String),
    /// CRD mode: the API server failed.
    #[error(transparent)]
    Crd(#[from] crate::crd::CrdError),
}

impl ClusterIdentityError {
    /// The store could not be reached: retry later; nothing was refused.
    #[must_use]
    pub fn is_unavailable(&self) -> bool {
        match self {
            Self::Kv(e) => e.is_unavailable(),
            Self::Crd(e) => e.is_unavailable(),
            Self::Conflict { .. } | Self::Exhausted(_) => false,
        }
    }
}

fn parse_id(key: &str, value: &[u8]) -> Result<Identity, KvError> {
    std::str::from_utf8(value)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| KvError::NotANumber { key: key.into() })
}

/// The label set stored at `id/<n>`.
pub fn parse_labels(key: &str, value: &[u8]) -> Result<LabelSet, KvError> {
    serde_json::from_slice(value).map_err(|source| KvError::Malformed {
        key: key.into(),
        source,
    })
}

/// The number of `labels`, allocating it cluster-wide if nobody has yet.
pub fn allocate(kv: &dyn Kv, labels: &LabelSet) -> Result<Identity, ClusterIdentityError> {
    let master = keys::id_by_labels(labels);
    let labels_json = serde_json::to_vec(labels).map_err(|source| KvError::Encode {
        what: format!("the labels {labels}"),
        source,
    })?;
    for _ in 0..ATTEMPTS {
        if let Some(e) = kv.get(&master)? {
            return Ok(parse_id(&master, &e.value)?);
        }
        let (taken, _) = kv.list(keys::ID_BY_NUMBER)?;
        let used: std::collections::BTreeSet<Identity> = taken
            .iter()
            .filter_map(|e| e.key[keys::ID_BY_NUMBER.len()..].parse().ok())
            .collect();
        let Some(n) = next_free(&used) else { break };
        let number = keys::id_by_number(n);
        let created = kv.txn(
            &[
                Compare::Absent(master.clone()),
                Compare::Absent(number.clone()),
            ],
            &[
                Op::Put {
                    key: master.clone(),
                    value: n.to_string().into_bytes(),
                    lease: None,
                },
                Op::Put {
                    key: number,
                    value: labels_json.clone(),
                    lease: None,
                },
            ],
        )?;
        if created {
            return Ok(n);
        }
    }
    Err(ClusterIdentityError::Exhausted(labels.to_string()))
}

/// Publishes this node's reference to (`labels`, `id`) under `lease`; re-creates the master
/// keys when they are gone (collected while this node was cut off, or etcd lost its data).
pub fn publish_ref(
    kv: &dyn Kv,
    labels: &LabelSet,
    id: Identity,
    node: &str,
    lease: LeaseId,
) -> Result<(), ClusterIdentityError> {
    let master = keys::id_by_labels(labels);
    let value = id.to_string().into_bytes();
    let writes = [
        Op::Put {
            key: master.clone(),
            value: value.clone(),
            lease: None,
        },
        Op::Put {
            key: keys::id_ref(labels, node),
            value: value.clone(),
            lease: Some(lease),
        },
    ];
    if kv.txn(&[Compare::ValueIs(master.clone(), value.clone())], &writes)? {
        return Ok(());
    }
    if let Some(e) = kv.get(&master)? {
        return Err(ClusterIdentityError::Conflict {
            labels: labels.to_string(),
            local: id,
            cluster: parse_id(&master, &e.value)?,
        });
    }
    let number = keys::id_by_number(id);
    let labels_json = serde_json::to_vec(labels).map_err(|source| KvError::Encode {
        what: format!("the labels {labels}"),
        source,
    })?;
    let mut all = writes.to_vec();
    all.push(Op::Put {
        key: number.clone(),
        value: labels_json.clone(),
        lease: None,
    });
    if kv.txn(
        &[
            Compare::Absent(master.clone()),
            Compare::Absent(number.clone()),
        ],
        &all,
    )? || kv.txn(
        &[
            Compare::Absent(master.clone()),
            Compare::ValueIs(number.clone(), labels_json),
        ],
        &all,
    )? {
        return Ok(());
    }
    match kv.get(&master)? {
        Some(e) => Err(ClusterIdentityError::Conflict {
            labels: labels.to_string(),
            local: id,
            cluster: parse_id(&master, &e.value)?,
        }),
        None => Err(ClusterIdentityError::Conflict {
            labels: labels.to_string(),
            local: id,
            cluster: 0,
        }),
    }
}

/// Removes this node's reference, then frees the identity if no node refers to it any more.
pub fn release_ref(kv: &dyn Kv, labels: &LabelSet, node: &str) -> Result<bool, KvError> {
    kv.delete(&keys::id_ref(labels, node))?;
    collect(kv, labels)
}

/// Frees the identity of `labels` if it has no reference left; returns whether it did.
pub fn collect(kv: &dyn Kv, labels: &LabelSet) -> Result<bool, KvError> {
    let master = keys::id_by_labels(labels);
    let Some(e) = kv.get(&master)? else {
        return Ok(false);
    };
    collect_entry(kv, &master, &keys::id_refs(labels), &e)
}

fn collect_entry(
    kv: &dyn Kv,
    master: &str,
    refs_prefix: &str,
    e: &super::Entry,
) -> Result<bool, KvError> {
    let (refs, _) = kv.list(refs_prefix)?;
    if !refs.is_empty() {
        return Ok(false);
    }
    let id = parse_id(master, &e.value)?;
    kv.txn(
        &[Compare::ModRevisionIs(master.into(), e.mod_revision)],
        &[
            Op::Delete(master.into()),
            Op::Delete(keys::id_by_number(id)),
        ],
    )
}

/// Frees every identity without references (those of nodes whose lease expired); returns how
/// many. Any node may run it: each delete is guarded as in [`collect`].
pub fn collect_all(kv: &dyn Kv) -> Result<usize, KvError> {
    let (masters, _) = kv.list(keys::ID_BY_LABELS)?;
    let mut freed = 0;
    for e in &masters {
        let segment = &e.key[keys::ID_BY_LABELS.len()..];
        let refs = format!("{}{segment}/", keys::ID_REFS);
        if collect_entry(kv, &e.key, &refs, e)? {
            freed += 1;
        }
    }
    Ok(freed)
}

/// The number to try for a new label set: above the highest in use, else the lowest free one
/// (every backend hands numbers out in this order).
#[must_use]
pub fn next_free(used: &std::collections::BTreeSet<Identity>) -> Option<Identity> {
    let after = used.last().map_or(reserved::FIRST_ALLOCATED, |m| m + 1);
    if after <= LAST_LABEL_ID {
        Some(after)
    } else {
        (reserved::FIRST_ALLOCATED..=LAST_LABEL_ID).find(|n| !used.contains(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kvstore::mem::MemKv;

    fn l(app: &str) -> LabelSet {
        LabelSet::for_pod("default", [("app", app)])
    }

    #[test]
    fn same_number_for_every_node_and_freed_with_the_last_reference() {
        let kv = MemKv::new();
        let (la, lb) = (kv.grant_lease(10).unwrap(), kv.grant_lease(10).unwrap());
        let web_a = allocate(&kv, &l("web")).unwrap();
        publish_ref(&kv, &l("web"), web_a, "a", la).unwrap();
        let web_b = allocate(&kv, &l("web")).unwrap();
        publish_ref(&kv, &l("web"), web_b, "b", lb).unwrap();
        assert_eq!(web_a, web_b);
        assert_eq!(web_a, 256);
        assert_eq!(allocate(&kv, &l("db")).unwrap(), 257, "the next number");

        assert!(
            !release_ref(&kv, &l("web"), "a").unwrap(),
            "b still refers to it"
        );
        kv.expire(lb);
        assert_eq!(
            collect_all(&kv).unwrap(),
            2,
            "web (no refs left) and db (never referenced)"
        );
        assert!(kv.dump().is_empty(), "{:?}", kv.dump());
    }

    #[test]
    fn a_reference_racing_the_collector_keeps_the_identity() {
        let kv = MemKv::new();
        let lease = kv.grant_lease(10).unwrap();
        let id = allocate(&kv, &l("web")).unwrap();
        let master = keys::id_by_labels(&l("web"));
        let seen = kv.get(&master).unwrap().unwrap();
        publish_ref(&kv, &l("web"), id, "a", lease).unwrap();
        kv.delete(&keys::id_ref(&l("web"), "a")).unwrap();
        // The collector read the master key before the reference came and went: its guarded
        // delete must fail, since the master key moved.
        assert!(!collect_entry(&kv, &master, &keys::id_refs(&l("web")), &seen).unwrap());
        assert!(kv.get(&master).unwrap().is_some());
    }

    #[test]
    fn a_collected_identity_is_recreated_with_the_same_number_and_conflicts_are_reported() {
        let kv = MemKv::new();
        let lease = kv.grant_lease(10).unwrap();
        publish_ref(&kv, &l("web"), 300, "a", lease).unwrap();
        assert_eq!(allocate(&kv, &l("web")).unwrap(), 300);
        let err = publish_ref(&kv, &l("web"), 301, "b", lease).unwrap_err();
        assert!(
            matches!(err, ClusterIdentityError::Conflict { cluster: 300, .. }),
            "{err}"
        );
        let err = publish_ref(&kv, &l("db"), 300, "b", lease).unwrap_err();
        assert!(
            matches!(err, ClusterIdentityError::Conflict { .. }),
            "{err}"
        );
    }
}
