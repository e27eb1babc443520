//! An in-memory [`Kv`] with etcd's semantics where Weft relies on them: revisions, guarded
//! transactions, leases whose expiry deletes their keys, and prefix watches replayed from a
//! revision. Leases expire only when a test says so ([`MemKv::expire`]); [`MemKv::set_down`]
//! makes every call fail as an unreachable etcd would.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Sender, channel};

use super::{Compare, Entry, Event, Kv, KvError, LeaseId, Op, WatchReceiver};

#[derive(Default)]
struct Inner {
    keys: BTreeMap<String, (Vec<u8>, i64, Option<LeaseId>)>,
    revision: i64,
    history: Vec<(i64, Event)>,
    leases: BTreeSet<LeaseId>,
    next_lease: LeaseId,
    watchers: Vec<(String, Sender<Result<Event, KvError>>)>,
}

impl Inner {
    fn emit(&mut self, event: Event) {
        self.revision += 1;
        let key = match &event {
            Event::Put(k, _) | Event::Delete(k) => k.clone(),
        };
        self.watchers
            .retain(|(prefix, tx)| !key.starts_with(prefix) || tx.send(Ok(event.clone())).is_ok());
        self.history.push((self.revision, event));
    }

    fn holds(&self, c: &Compare) -> bool {
        match c {
            Compare::Absent(k) => !self.keys.contains_key(k),
            Compare::ValueIs(k, v) => self.keys.get(k).is_some_and(|e| &e.0 == v),
            Compare::ModRevisionIs(k, r) => self.keys.get(k).map_or(0, |e| e.1) == *r,
        }
    }
}

/// The fake store.
#[derive(Default)]
pub struct MemKv {
    inner: Mutex<Inner>,
    down: AtomicBool,
}

impl MemKv {
    /// An empty store.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Inner>, KvError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(KvError::Unavailable("injected outage".into()));
        }
        Ok(crate::sys::locks::lock(&self.inner))
    }

    /// Simulates etcd going away (`true`) and coming back; watches break on the way down.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
        if down {
            let mut inner = crate::sys::locks::lock(&self.inner);
            for (_, tx) in inner.watchers.drain(..) {
                let _ = tx.send(Err(KvError::Unavailable("injected outage".into())));
            }
        }
    }

    /// Expires a lease now, deleting its keys.
    pub fn expire(&self, lease: LeaseId) {
        let mut inner = crate::sys::locks::lock(&self.inner);
        inner.leases.remove(&lease);
        let doomed: Vec<String> = inner
            .keys
            .iter()
            .filter(|(_, v)| v.2 == Some(lease))
            .map(|(k, _)| k.clone())
            .collect();
        for k in doomed {
            inner.keys.remove(&k);
            inner.emit(Event::Delete(k));
        }
    }

    /// Every key and value, for assertions.
    #[must_use]
    pub fn dump(&self) -> BTreeMap<String, String> {
        let inner = crate::sys::locks::lock(&self.inner);
        inner
            .keys
            .iter()
            .map(|(k, v)| (k.clone(), String::from_utf8_lossy(&v.0).into_owned()))
            .collect()
    }
}

impl Kv for MemKv {
    fn get(&self, key: &str) -> Result<Option<Entry>, KvError> {
        let inner = self.lock()?;
        Ok(inner.keys.get(key).map(|(v, rev, _)| Entry {
            key: key.into(),
            value: v.clone(),
            mod_revision: *rev,
        }))
    }

    fn list(&self, prefix: &str) -> Result<(Vec<Entry>, i64), KvError> {
        let inner = self.lock()?;
        let entries = inner
            .keys
            .range(prefix.to_owned()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, (v, rev, _))| Entry {
                key: k.clone(),
                value: v.clone(),
                mod_revision: *rev,
            })
            .collect();
        Ok((entries, inner.revision))
    }

    fn txn(&self, when: &[Compare], ops: &[Op]) -> Result<bool, KvError> {
        let mut inner = self.lock()?;
        if !when.iter().all(|c| inner.holds(c)) {
            return Ok(false);
        }
        for op in ops {
            if let Op::Put {
                lease: Some(lease), ..
            } = op
                && !inner.leases.contains(lease)
            {
                return Err(KvError::LeaseNotFound(None));
            }
        }
        for op in ops {
            match op {
                Op::Put { key, value, lease } => {
                    let rev = inner.revision + 1;
                    inner.keys.insert(key.clone(), (value.clone(), rev, *lease));
                    inner.emit(Event::Put(key.clone(), value.clone()));
                }
                Op::Delete(key) => {
                    if inner.keys.remove(key).is_some() {
                        inner.emit(Event::Delete(key.clone()));
                    }
                }
            }
        }
        Ok(true)
    }

    fn grant_lease(&self, _ttl_s: i64) -> Result<LeaseId, KvError> {
        let mut inner = self.lock()?;
        inner.next_lease += 1;
        let id = inner.next_lease;
        inner.leases.insert(id);
        Ok(id)
    }

    fn keep_alive(&self, lease: LeaseId) -> Result<bool, KvError> {
        Ok(self.lock()?.leases.contains(&lease))
    }

    fn revoke(&self, lease: LeaseId) -> Result<(), KvError> {
        drop(self.lock()?);
        self.expire(lease);
        Ok(())
    }

    fn watch(&self, prefix: &str, from_revision: i64) -> Result<WatchReceiver, KvError> {
        let mut inner = self.lock()?;
        let (tx, rx) = channel();
        for (rev, event) in &inner.history {
            let key = match event {
                Event::Put(k, _) | Event::Delete(k) => k,
            };
            if *rev >= from_revision && key.starts_with(prefix) {
                let _ = tx.send(Ok(event.clone()));
            }
        }
        inner.watchers.push((prefix.into(), tx));
        Ok(rx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guarded_txn_lease_expiry_and_watch_replay() {
        let kv = MemKv::new();
        assert!(
            kv.txn(
                &[Compare::Absent("a".into())],
                &[Op::Put {
                    key: "a".into(),
                    value: b"1".to_vec(),
                    lease: None
                }]
            )
            .unwrap()
        );
        assert!(
            !kv.txn(&[Compare::Absent("a".into())], &[Op::Delete("a".into())])
                .unwrap()
        );
        let (_, rev) = kv.list("").unwrap();
        let lease = kv.grant_lease(10).unwrap();
        kv.put("p/x", b"2", Some(lease)).unwrap();
        let rx = kv.watch("p/", rev + 1).unwrap();
        kv.expire(lease);
        assert_eq!(
            rx.try_recv().unwrap().unwrap(),
            Event::Put("p/x".into(), b"2".to_vec())
        );
        assert_eq!(rx.try_recv().unwrap().unwrap(), Event::Delete("p/x".into()));
        assert!(!kv.keep_alive(lease).unwrap());
        kv.set_down(true);
        assert!(matches!(kv.get("a"), Err(KvError::Unavailable(_))));
        assert!(rx.try_recv().unwrap().is_err(), "the watch broke");
    }
}
