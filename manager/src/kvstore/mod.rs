//! The cluster's shared state store, behind a seam (`Kv`): etcd in production (`etcd.rs`), an
//! in-memory fake in tests (`mem.rs`). The operations are the few etcd primitives the cluster
//! logic needs: get, prefix list with its revision, guarded transactions, leases, and a prefix
//! watch from a revision. They are synchronous on purpose: callers are the manager's blocking
//! code paths and the cluster threads, and every call is bounded by the backend's timeout.
//! Key layout: `keys.rs` and docs/KVSTORE.md.

pub mod etcd;
pub mod identities;
pub mod keys;
pub mod mem;

use std::sync::mpsc::Receiver;

/// A lease id (etcd's `int64`).
pub type LeaseId = i64;

/// Store failures.
#[derive(Debug, thiserror::Error)]
pub enum KvError {
    /// The store did not answer in time, or its stream ended (etcd down, network cut).
    #[error("kvstore unreachable: {0}")]
    Unavailable(String),
    /// The etcd client could not reach the store.
    #[error("kvstore unreachable: {0}")]
    Unreachable(#[source] etcd_client::Error),
    /// The lease a request names no longer exists: it expired (this node stopped renewing it
    /// for longer than its time-to-live) or was revoked.
    #[error("kvstore: lease not found (expired or revoked)")]
    LeaseNotFound(#[source] Option<etcd_client::Error>),
    /// The store refused the request.
    #[error("kvstore: {0}")]
    Refused(#[source] etcd_client::Error),
    /// A TLS file could not be read.
    #[error("kvstore: cannot read --kvstore-{what} {}: {source}", .path.display())]
    TlsFile {
        /// Which option (`ca`, `cert`, `key`).
        what: &'static str,
        /// The file.
        path: std::path::PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// A client certificate without its key, or the other way round.
    #[error("--kvstore-cert and --kvstore-key go together: give both or neither")]
    TlsPair,
    /// The etcd client's runtime could not be started.
    #[error("kvstore: cannot start the etcd client runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// A value in the store is not what Weft writes there.
    #[error("kvstore: malformed value at {key}: {source}")]
    Malformed {
        /// The key.
        key: String,
        /// The decoder's error.
        source: serde_json::Error,
    },
    /// An identity key's value is not a number.
    #[error("kvstore: malformed value at {key}: not an identity number")]
    NotANumber {
        /// The key.
        key: String,
    },
    /// A record could not be encoded for writing.
    #[error("kvstore: encoding {what}: {source}")]
    Encode {
        /// What was being written.
        what: String,
        /// The encoder's error.
        source: serde_json::Error,
    },
}

impl KvError {
    /// The store could not be reached: retry later; nothing was refused.
    #[must_use]
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Self::Unavailable(_) | Self::Unreachable(_))
    }
}

/// One stored key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Key.
    pub key: String,
    /// Value.
    pub value: Vec<u8>,
    /// Revision of its last change.
    pub mod_revision: i64,
}

/// A condition of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Compare {
    /// The key does not exist.
    Absent(String),
    /// The key exists with exactly this value.
    ValueIs(String, Vec<u8>),
    /// The key was last changed at this revision (0 = absent).
    ModRevisionIs(String, i64),
}

/// A write of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Put, optionally attached to a lease (deleted when it expires).
    Put {
        /// Key.
        key: String,
        /// Value.
        value: Vec<u8>,
        /// Lease.
        lease: Option<LeaseId>,
    },
    /// Delete the key (missing is fine).
    Delete(String),
}

/// A change seen by a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Created or changed.
    Put(String, Vec<u8>),
    /// Deleted (or its lease expired).
    Delete(String),
}

/// What a watch delivers: events in revision order, then an error when it breaks (the caller
/// lists again and re-watches).
pub type WatchReceiver = Receiver<Result<Event, KvError>>;

/// The store seam.
pub trait Kv: Send + Sync {
    /// One key.
    fn get(&self, key: &str) -> Result<Option<Entry>, KvError>;
    /// Every key under `prefix`, and the store revision the listing is consistent at.
    fn list(&self, prefix: &str) -> Result<(Vec<Entry>, i64), KvError>;
    /// Applies `ops` atomically if every comparison holds; returns whether they held.
    fn txn(&self, when: &[Compare], ops: &[Op]) -> Result<bool, KvError>;
    /// A lease of `ttl_s` seconds.
    fn grant_lease(&self, ttl_s: i64) -> Result<LeaseId, KvError>;
    /// Refreshes a lease; `false` when it no longer exists (expired).
    fn keep_alive(&self, lease: LeaseId) -> Result<bool, KvError>;
    /// Revokes a lease, deleting its keys.
    fn revoke(&self, lease: LeaseId) -> Result<(), KvError>;
    /// Changes under `prefix` from `from_revision` on.
    fn watch(&self, prefix: &str, from_revision: i64) -> Result<WatchReceiver, KvError>;

    /// Unconditional put.
    fn put(&self, key: &str, value: &[u8], lease: Option<LeaseId>) -> Result<(), KvError> {
        self.txn(
            &[],
            &[Op::Put {
                key: key.into(),
                value: value.to_vec(),
                lease,
            }],
        )
        .map(|_| ())
    }

    /// Unconditional delete.
    fn delete(&self, key: &str) -> Result<(), KvError> {
        self.txn(&[], &[Op::Delete(key.into())]).map(|_| ())
    }
}
