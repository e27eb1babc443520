//! Persistent state in sled. Every mutation is atomic and flushed before the caller replies, so
//! a kill -9 at any instant leaves either the old or the new state: one multi-tree transaction or
//! batch, except a large policy change, which [`rules`] writes in steps that a load completes or
//! discards.

use sled::Transactional;
use sled::transaction::{ConflictableTransactionError, TransactionError};
use std::collections::BTreeMap;
use std::path::Path;
use weft_api::Endpoint;
use weft_policy::identity::IdentityKey;

pub mod rules;

type FlushFuture = std::pin::Pin<Box<dyn Future<Output = sled::Result<usize>> + Send>>;

/// A flush under way ([`Store::begin_flush`]).
#[must_use = "the write is durable only once waited for"]
pub enum Flushing {
    /// Still writing.
    Pending(FlushFuture),
    /// Finished at the first poll: sled's I/O thread was done already, or the hand-off failed.
    Done(sled::Result<usize>),
}

impl Flushing {
    /// Blocks until everything staged before [`Store::begin_flush`] is on disk.
    pub fn wait(self) -> Result<(), StoreError> {
        match self {
            Self::Pending(write) => futures::executor::block_on(write)?,
            Self::Done(done) => done?,
        };
        Ok(())
    }
}

/// Store failures.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// sled refused to open the database.
    #[error(
        "cannot open state database {path}: {source} (another weft-manager may be running with the same --state-dir; if the database is corrupt see docs/OPERATIONS.md)"
    )]
    Open {
        /// Path.
        path: String,
        /// Cause.
        source: sled::Error,
    },
    /// A read or write failed.
    #[error("state database: {0}")]
    Sled(#[from] sled::Error),
    /// A stored record does not decode.
    #[error("state database record {key} is corrupt: {source}")]
    Corrupt {
        /// Which record.
        key: String,
        /// The decoder's error.
        source: serde_json::Error,
    },
    /// A stored key or number has the wrong size.
    #[error("state database record {key} is corrupt: {what} is not {len} bytes")]
    BadLength {
        /// Which record.
        key: String,
        /// What was read (`endpoint id`, ...).
        what: &'static str,
        /// The size it must have.
        len: usize,
    },
    /// A value could not be encoded for writing.
    #[error("state database: cannot encode {what}: {source}")]
    Encode {
        /// What was being written.
        what: &'static str,
        /// The encoder's error.
        source: serde_json::Error,
    },
}

/// JSON for a stored value; the store's types always encode, but an error beats a panic.
fn encode<T: serde::Serialize + ?Sized>(
    what: &'static str,
    value: &T,
) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(value).map_err(|source| StoreError::Encode { what, source })
}

/// A stored number's bytes, refused naming the record (`key()`) and `what` when they are not
/// `N` bytes long.
fn fixed<const N: usize>(
    bytes: &[u8],
    key: impl FnOnce() -> String,
    what: &'static str,
) -> Result<[u8; N], StoreError> {
    bytes.try_into().map_err(|_| StoreError::BadLength {
        key: key(),
        what,
        len: N,
    })
}

impl From<TransactionError<StoreError>> for StoreError {
    fn from(e: TransactionError<StoreError>) -> Self {
        match e {
            TransactionError::Abort(e) => e,
            TransactionError::Storage(e) => Self::Sled(e),
        }
    }
}

/// The sled database and its trees.
#[derive(Clone)]
pub struct Store {
    db: sled::Db,
    /// endpoint id (u32 BE) → Endpoint JSON.
    endpoints: sled::Tree,
    /// IP (text) → endpoint id (u32 BE): the IPAM allocations.
    ips: sled::Tree,
    /// Singletons: node CIDRs, counters, the policy repository.
    meta: sled::Tree,
    /// identity (u32 BE) → `IdentityKey` JSON.
    identities: sled::Tree,
    /// Policy rules, one record each so a change writes only what changed (`rules`).
    rules: sled::Tree,
    /// Policy slots (`crate::slots`): slot (u32 BE) → record JSON, plus [`SLOT_INPUTS`] → the
    /// digest of the policy inputs the records were written under (u64 BE).
    slots: sled::Tree,
}

/// Longer than a slot key, so it never collides with one.
const SLOT_INPUTS: &[u8] = b"inputs";

const NEXT_ENDPOINT_ID: &[u8] = b"next_endpoint_id";

/// sled's page cache.
const CACHE_BYTES: u64 = 2 * 1024 * 1024;

impl Store {
    /// Opens (or creates) the database under `dir`.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        let path = dir.join("db");
        // sled's default page cache is 1 GiB. The manager reads the store back only at start
        // (and a few small keys per endpoint); every other access is a write. A small cache
        // keeps the resident size down (docs/BENCHMARKS.md, "Manager memory"); a miss is a
        // read from the OS page cache.
        let db = sled::Config::new()
            .path(&path)
            .cache_capacity(CACHE_BYTES)
            .open()
            .map_err(|source| StoreError::Open {
                path: path.display().to_string(),
                source,
            })?;
        Self::from_db(db)
    }

    /// A throw-away in-memory database for unit tests.
    pub fn temporary() -> Result<Self, StoreError> {
        Self::from_db(sled::Config::new().temporary(true).open()?)
    }

    fn from_db(db: sled::Db) -> Result<Self, StoreError> {
        Ok(Self {
            endpoints: db.open_tree("endpoints")?,
            ips: db.open_tree("ips")?,
            meta: db.open_tree("meta")?,
            identities: db.open_tree("identities")?,
            rules: db.open_tree("rules")?,
            slots: db.open_tree("slots")?,
            db,
        })
    }

    /// Reads a JSON singleton from the meta tree.
    pub fn get_meta<T: serde::de::DeserializeOwned>(
        &self,
        key: &str,
    ) -> Result<Option<T>, StoreError> {
        self.meta
            .get(key)?
            .map(|v| {
                serde_json::from_slice(&v).map_err(|source| StoreError::Corrupt {
                    key: key.into(),
                    source,
                })
            })
            .transpose()
    }

    /// Writes a JSON singleton to the meta tree and flushes.
    pub fn put_meta<T: serde::Serialize>(&self, key: &str, value: &T) -> Result<(), StoreError> {
        let bytes = encode("a meta value", value)?;
        self.meta.insert(key, bytes)?;
        self.db.flush()?;
        Ok(())
    }

    /// Removes a meta record.
    pub fn remove_meta(&self, key: &str) -> Result<(), StoreError> {
        self.meta.remove(key)?;
        self.db.flush()?;
        Ok(())
    }

    /// Every slot record (undecodable ones are skipped: the slot is then not trusted) and the
    /// inputs digest they were written under.
    pub fn load_slots<T: serde::de::DeserializeOwned>(
        &self,
    ) -> Result<(BTreeMap<u32, T>, Option<u64>), StoreError> {
        let mut out = BTreeMap::new();
        let mut inputs = None;
        for item in &self.slots {
            let (k, v) = item?;
            if k.as_ref() == SLOT_INPUTS {
                inputs = v.as_ref().try_into().ok().map(u64::from_be_bytes);
            } else if let (Ok(key), Ok(record)) = (
                <[u8; 4]>::try_from(k.as_ref()),
                serde_json::from_slice::<T>(&v),
            ) {
                out.insert(u32::from_be_bytes(key), record);
            }
        }
        Ok((out, inputs))
    }

    /// Writes and removes slot records and sets (or, with `None`, removes) the inputs digest,
    /// atomically; not flushed (a lost record only costs a read-back at restart): the caller
    /// flushes when it must ([`Self::flush`]).
    pub fn write_slots<T: serde::Serialize>(
        &self,
        put: &[(u32, &T)],
        remove: &[u32],
        inputs: Option<u64>,
    ) -> Result<(), StoreError> {
        let mut batch = sled::Batch::default();
        for slot in remove {
            batch.remove(&slot.to_be_bytes());
        }
        for (slot, record) in put {
            let json = encode("policy slot record", record)?;
            batch.insert(&slot.to_be_bytes(), json);
        }
        match inputs {
            Some(d) => batch.insert(SLOT_INPUTS, &d.to_be_bytes()),
            None => batch.remove(SLOT_INPUTS),
        }
        self.slots.apply_batch(batch)?;
        Ok(())
    }

    /// Makes every write so far durable (fsync).
    pub fn flush(&self) -> Result<(), StoreError> {
        self.db.flush()?;
        Ok(())
    }

    /// Starts writing everything staged so far to disk on sled's I/O thread and returns at
    /// once: the caller does other work during the write and [`Flushing::wait`]s for it.
    pub fn begin_flush(&self) -> Flushing {
        let db = self.db.clone();
        let mut write: FlushFuture = Box::pin(async move { db.flush_async().await });
        // sled hands the flush to its I/O thread when the future is first polled: poll it
        // now, so the disk works while the caller does.
        let poll = write
            .as_mut()
            .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()));
        match poll {
            std::task::Poll::Ready(done) => Flushing::Done(done),
            std::task::Poll::Pending => Flushing::Pending(write),
        }
    }

    /// The next endpoint id to hand out.
    pub fn next_endpoint_id(&self) -> Result<u32, StoreError> {
        Ok(self
            .meta
            .get(NEXT_ENDPOINT_ID)?
            .and_then(|v| v.as_ref().try_into().ok().map(u32::from_be_bytes))
            .unwrap_or(1))
    }

    /// Every endpoint and the IP allocations that reference it.
    pub fn load_endpoints(&self) -> Result<Vec<Endpoint>, StoreError> {
        self.endpoints
            .iter()
            .map(|kv| {
                let (k, v) = kv?;
                serde_json::from_slice(&v).map_err(|source| StoreError::Corrupt {
                    key: format!("endpoints/{k:?}"),
                    source,
                })
            })
            .collect()
    }

    /// IP allocations as (ip text, endpoint id).
    pub fn load_ips(&self) -> Result<Vec<(String, u32)>, StoreError> {
        self.ips
            .iter()
            .map(|kv| {
                let (k, v) = kv?;
                let id = u32::from_be_bytes(fixed(
                    &v,
                    || format!("ips/{}", String::from_utf8_lossy(&k)),
                    "the endpoint id",
                )?);
                Ok((String::from_utf8_lossy(&k).into_owned(), id))
            })
            .collect()
    }

    /// Writes `ep` and its IP allocations in one transaction; `next_id` advances the id counter.
    pub fn put_endpoint(&self, ep: &Endpoint, next_id: Option<u32>) -> Result<(), StoreError> {
        self.stage_endpoint(ep, next_id)?;
        self.db.flush()?;
        Ok(())
    }

    /// [`Self::put_endpoint`] without the flush: durable once the next flush of any write ends.
    pub fn stage_endpoint(&self, ep: &Endpoint, next_id: Option<u32>) -> Result<(), StoreError> {
        let value = encode("an endpoint", ep)?;
        (&self.endpoints, &self.ips, &self.meta).transaction(|(eps, ips, meta)| {
            eps.insert(&ep.id.to_be_bytes(), value.as_slice())?;
            for ip in &ep.ips {
                ips.insert(ip.address.to_string().as_bytes(), &ep.id.to_be_bytes())?;
            }
            if let Some(n) = next_id {
                meta.insert(NEXT_ENDPOINT_ID, &n.to_be_bytes())?;
            }
            Ok::<_, ConflictableTransactionError<StoreError>>(())
        })?;
        Ok(())
    }

    /// Removes `ep` and releases its IPs in one transaction.
    pub fn remove_endpoint(&self, ep: &Endpoint) -> Result<(), StoreError> {
        (&self.endpoints, &self.ips).transaction(|(eps, ips)| {
            eps.remove(&ep.id.to_be_bytes())?;
            for ip in &ep.ips {
                let key = ip.address.to_string();
                // Only release an allocation this endpoint owns.
                if ips.get(key.as_bytes())?.as_deref() == Some(&ep.id.to_be_bytes()[..]) {
                    ips.remove(key.as_bytes())?;
                }
            }
            Ok::<_, ConflictableTransactionError<StoreError>>(())
        })?;
        self.db.flush()?;
        Ok(())
    }

    /// Every persisted identity.
    pub fn load_identities(&self) -> Result<Vec<(u32, IdentityKey)>, StoreError> {
        self.identities
            .iter()
            .map(|kv| {
                let (k, v) = kv?;
                let id = u32::from_be_bytes(fixed(&k, || format!("identities/{k:?}"), "the id")?);
                let key = serde_json::from_slice(&v).map_err(|source| StoreError::Corrupt {
                    key: format!("identities/{k:?}"),
                    source,
                })?;
                Ok((id, key))
            })
            .collect()
    }

    /// Persists an identity (flushed: it must exist on disk before the id is used anywhere).
    pub fn put_identity(&self, id: u32, key: &IdentityKey) -> Result<(), StoreError> {
        let value = encode("an identity", key)?;
        self.identities.insert(id.to_be_bytes(), value)?;
        self.db.flush()?;
        Ok(())
    }

    /// Forgets a released identity.
    pub fn remove_identity(&self, id: u32) -> Result<(), StoreError> {
        self.identities.remove(id.to_be_bytes())?;
        self.db.flush()?;
        Ok(())
    }

    /// Removes an IP allocation that no endpoint owns (found at restore).
    pub fn remove_ip(&self, ip: &str) -> Result<(), StoreError> {
        self.ips.remove(ip.as_bytes())?;
        self.db.flush()?;
        Ok(())
    }
}
