//! Cluster-wide identities through the API server, without multi-object transactions.
//!
//! Allocation of a label set L (hash h):
//! 1. `WeftIdentityKey` h exists → its number (after a touch that moves its resourceVersion,
//!    so a collector that judged it unused cannot delete it; and after making sure
//!    `WeftIdentity` n exists, re-creating it if it was deleted).
//! 2. Otherwise reserve a number: create `WeftIdentity` n for the next free n (409: another
//!    node took it; try the next one).
//! 3. Then claim the label set: create `WeftIdentityKey` h → n. 409: another node was first;
//!    delete the reserved number and use theirs (step 1 again).
//!
//! The key is the single point of agreement, so a label set never has two numbers in use:
//! only a key's number is ever handed out, and other nodes believe a `WeftIdentity` only when
//! the key of its labels points at it (`view.rs`). A crash between 2 and 3 leaves a number
//! without a key: never used, collected after the grace period ([`Collector`]).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::view::View;
use super::{Api, CrdError, labels_hash};
use crate::kvstore::identities::ClusterIdentityError;
use weft_policy::labels::LabelSet;
use weft_policy::mapstate::Identity;

/// How often allocation starts over when other nodes keep winning.
const ATTEMPTS: usize = 16;

fn conflict(labels: &LabelSet, local: Identity, cluster: Identity) -> ClusterIdentityError {
    ClusterIdentityError::Conflict {
        labels: labels.to_string(),
        local,
        cluster,
    }
}

/// A key whose hash is another label set's.
fn collision(labels: &LabelSet, other: &LabelSet) -> ClusterIdentityError {
    ClusterIdentityError::Crd(CrdError::Malformed {
        what: format!("WeftIdentityKey {}", labels_hash(labels)),
        detail: format!("it holds {other}, not {labels} (a hash collision or a hand edit)"),
    })
}

/// The number of `labels`, allocating it cluster-wide if nobody has yet.
pub fn allocate(
    api: &dyn Api,
    labels: &LabelSet,
    node: &str,
) -> Result<Identity, ClusterIdentityError> {
    let hash = labels_hash(labels);
    for _ in 0..ATTEMPTS {
        if let Some(key) = api.get_key(&hash)? {
            if key.labels != *labels {
                return Err(collision(labels, &key.labels));
            }
            if !api.touch_key(&hash, node)? {
                continue; // collected just now: start over
            }
            ensure_number(api, labels, key.number)?;
            return Ok(key.number);
        }
        let used: BTreeSet<Identity> = api
            .list_identities()?
            .into_iter()
            .map(|o| o.number)
            .collect();
        let Some(n) = crate::kvstore::identities::next_free(&used) else {
            break;
        };
        if !api.create_identity(n, labels)? {
            continue; // another node reserved n first
        }
        if api.create_key(labels, n)? {
            return Ok(n);
        }
        // Another node claimed the label set first: give the number back, take theirs.
        if let Some(mine) = api.get_identity(n)?
            && mine.labels == *labels
        {
            api.delete_identity(n, &mine.meta)?;
        }
    }
    Err(ClusterIdentityError::Exhausted(labels.to_string()))
}

/// `WeftIdentity` `n` exists with `labels`, re-created if it was deleted.
fn ensure_number(
    api: &dyn Api,
    labels: &LabelSet,
    n: Identity,
) -> Result<(), ClusterIdentityError> {
    for _ in 0..2 {
        match api.get_identity(n)? {
            Some(o) if o.labels == *labels => return Ok(()),
            Some(o) => {
                return Err(ClusterIdentityError::Crd(CrdError::Malformed {
                    what: format!("WeftIdentity {n}"),
                    detail: format!(
                        "it holds {}, while WeftIdentityKey {} gives {n} to {labels}",
                        o.labels,
                        labels_hash(labels)
                    ),
                }));
            }
            None if api.create_identity(n, labels)? => {
                tracing::info!(identity = n, %labels, "WeftIdentity re-created (it was deleted while in use)");
                return Ok(());
            }
            None => {} // created meanwhile: check whose it is
        }
    }
    Ok(())
}

/// This node uses `n` for `labels`: make the cluster agree again when its objects were
/// deleted (collected during a partition, or by hand). A key giving the labels another number
/// is a conflict the operator resolves (as in kvstore mode).
pub fn ensure(api: &dyn Api, labels: &LabelSet, n: Identity) -> Result<(), ClusterIdentityError> {
    let hash = labels_hash(labels);
    if let Some(key) = api.get_key(&hash)? {
        if key.labels != *labels {
            return Err(collision(labels, &key.labels));
        }
        if key.number != n {
            return Err(conflict(labels, n, key.number));
        }
        return ensure_number(api, labels, n);
    }
    ensure_number(api, labels, n)?;
    if api.create_key(labels, n)? {
        tracing::info!(identity = n, %labels, "WeftIdentityKey re-created (it was deleted while in use)");
        return Ok(());
    }
    match api.get_key(&hash)? {
        Some(key) if key.number == n => Ok(()),
        Some(key) => Err(conflict(labels, n, key.number)),
        None => Ok(()), // deleted again meanwhile: the next round tries again
    }
}

/// Collects identities nobody uses: a key (with its number) whose number no `WeftEndpoint`
/// and no local endpoint uses, and a number no key points at (a crash between reserving and
/// claiming, a lost race whose delete failed) that nobody uses. Either must have been seen
/// unused, at the same resourceVersion, for the whole grace period by this collector (its
/// own clock: no comparison with other machines' timestamps), and the delete is guarded by
/// that version, so a node that claimed the key meanwhile (touch) keeps it.
pub struct Collector {
    grace: Duration,
    /// Candidates: (key hash or `#number`, resourceVersion) → first seen unused.
    unused: BTreeMap<String, (String, Instant)>,
}

impl Collector {
    /// A collector with `grace`.
    #[must_use]
    pub fn new(grace: Duration) -> Self {
        Self {
            grace,
            unused: BTreeMap::new(),
        }
    }

    /// Is `name` at version `rv` a candidate whose grace has passed (at `now`)?
    fn ripe(&mut self, name: String, rv: &str, now: Instant, seen: &mut BTreeSet<String>) -> bool {
        seen.insert(name.clone());
        let e = self
            .unused
            .entry(name)
            .or_insert_with(|| (rv.to_owned(), now));
        if e.0 != rv {
            *e = (rv.to_owned(), now);
        }
        now.duration_since(e.1) >= self.grace
    }

    /// One pass over `view`; `local` are the numbers this node's endpoints hold. Returns how
    /// many objects were deleted.
    pub fn run(
        &mut self,
        api: &dyn Api,
        view: &View,
        local: &BTreeSet<Identity>,
        now: Instant,
    ) -> Result<usize, CrdError> {
        let mut in_use: BTreeSet<Identity> = view.endpoint_identities();
        in_use.extend(local);
        let mut seen = BTreeSet::new();
        let mut deleted = 0;
        for key in view.keys().values() {
            if in_use.contains(&key.number) {
                continue;
            }
            if !self.ripe(key.hash.clone(), &key.meta.resource_version, now, &mut seen) {
                continue;
            }
            if !api.delete_key(&key.hash, &key.meta)? {
                continue; // claimed (touched) or deleted meanwhile
            }
            deleted += 1;
            tracing::info!(identity = key.number, labels = %key.labels, "unused identity collected");
            if let Some(id) = view.identities().get(&key.number)
                && id.labels == key.labels
                && api.delete_identity(id.number, &id.meta)?
            {
                deleted += 1;
            }
        }
        for id in view.identities().values() {
            let claimed = view
                .keys()
                .get(&labels_hash(&id.labels))
                .is_some_and(|k| k.number == id.number && k.labels == id.labels);
            if claimed || in_use.contains(&id.number) {
                continue;
            }
            let name = format!("#{}", id.number);
            if self.ripe(name, &id.meta.resource_version, now, &mut seen)
                && api.delete_identity(id.number, &id.meta)?
            {
                deleted += 1;
                tracing::info!(identity = id.number, labels = %id.labels, "orphan WeftIdentity collected (no key claims it)");
            }
        }
        self.unused.retain(|name, _| seen.contains(name));
        Ok(deleted)
    }
}
