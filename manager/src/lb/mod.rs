//! Service load-balancing: the frontends (a Service's `ClusterIP`, port and protocol) the
//! datapath translates to one of their backends before policy, by Service. Kubernetes mode
//! fills it from the Service and `EndpointSlice` watches (`weft_k8s::services`); every change
//! goes to the datapath's maps at once, frontend by frontend (docs/DATAPATH.md, "Services").
//!
//! Each frontend keeps its id (the reverse-translation index in conntrack) as long as it
//! exists, also across a restart: the ids are read back from the maps, so the replies of
//! connections opened before the restart still get their frontend's address. Frontends read
//! back stay in force, unclaimed, until a Service claims them again or the first complete view
//! of the Services ([`Services::sweep_unclaimed`]) shows they are gone.

use crate::datapath::{Datapath, DatapathError};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use weft_api::lb::{Backend, Frontend, FrontendInfo, ServiceInfo};

/// Service load-balancing failures.
#[derive(Debug, thiserror::Error)]
pub enum LbError {
    /// Writing the maps failed.
    #[error("service maps: {0}")]
    Datapath(#[from] DatapathError),
    /// Every frontend id is in use.
    #[error("no free frontend id (more than {0} Service frontends on this node's maps)")]
    IdsExhausted(u32),
}

#[derive(Debug, Clone)]
struct Entry {
    id: u32,
    backends: Vec<Backend>,
    /// The Service it belongs to; `None`: read back from the maps, not claimed since.
    owner: Option<String>,
}

#[derive(Default)]
struct Inner {
    frontends: BTreeMap<Frontend, Entry>,
    /// Service `namespace/name` → its frontends, in the order of its ports.
    services: BTreeMap<String, Vec<Frontend>>,
    used: BTreeSet<u32>,
}

/// The table, and the datapath it writes to.
pub struct Services {
    datapath: Arc<dyn Datapath>,
    inner: Mutex<Inner>,
    max_id: u32,
}

impl Services {
    /// An empty table over `datapath`; ids `1..=max_id` (the maps' capacity).
    #[must_use]
    pub fn new(datapath: Arc<dyn Datapath>, max_id: u32) -> Self {
        Self {
            datapath,
            inner: Mutex::default(),
            max_id,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Adopts the frontends the maps hold (a restart), unclaimed. Returns how many.
    pub fn restore(&self) -> Result<usize, LbError> {
        let table = self.datapath.lb_frontends()?;
        let mut g = self.lock();
        for (id, (frontend, backends)) in table {
            g.used.insert(id);
            g.frontends.insert(
                frontend,
                Entry {
                    id,
                    backends,
                    owner: None,
                },
            );
        }
        Ok(g.frontends.len())
    }

    fn free_id(&self, g: &Inner) -> Result<u32, LbError> {
        (1..=self.max_id)
            .find(|id| !g.used.contains(id))
            .ok_or(LbError::IdsExhausted(self.max_id))
    }

    fn remove(&self, g: &mut Inner, frontend: &Frontend) -> Result<(), LbError> {
        if let Some(e) = g.frontends.get(frontend) {
            self.datapath.lb_remove(e.id, frontend, e.backends.len())?;
            let id = e.id;
            g.frontends.remove(frontend);
            g.used.remove(&id);
        }
        Ok(())
    }

    /// Service `name` has these frontends now (none: it is gone). Its frontends that are no
    /// longer among them are removed; a frontend another Service had moves to this one.
    pub fn apply(&self, name: &str, frontends: &[(Frontend, Vec<Backend>)]) -> Result<(), LbError> {
        let mut g = self.lock();
        let new: BTreeSet<Frontend> = frontends.iter().map(|(f, _)| *f).collect();
        let old = g.services.get(name).cloned().unwrap_or_default();
        for f in old.iter().filter(|f| !new.contains(f)) {
            if g.frontends
                .get(f)
                .is_some_and(|e| e.owner.as_deref() == Some(name))
            {
                self.remove(&mut g, f)?;
            }
        }
        for (f, backends) in frontends {
            let (id, previous) = match g.frontends.get(f) {
                Some(e) if e.backends == *backends && e.owner.as_deref() == Some(name) => continue,
                Some(e) => {
                    if let Some(other) = e.owner.as_deref().filter(|o| *o != name) {
                        tracing::warn!(
                            frontend = %format!("{}:{}", f.addr, f.port),
                            from = other,
                            to = name,
                            "Service frontend claimed by another Service"
                        );
                    }
                    (e.id, e.backends.len())
                }
                None => (self.free_id(&g)?, 0),
            };
            self.datapath.lb_upsert(id, f, backends, previous)?;
            g.used.insert(id);
            g.frontends.insert(
                *f,
                Entry {
                    id,
                    backends: backends.clone(),
                    owner: Some(name.to_owned()),
                },
            );
        }
        if frontends.is_empty() {
            g.services.remove(name);
        } else {
            g.services
                .insert(name.to_owned(), frontends.iter().map(|(f, _)| *f).collect());
        }
        Ok(())
    }

    /// Service `name` is gone: its frontends go.
    pub fn delete(&self, name: &str) -> Result<(), LbError> {
        self.apply(name, &[])
    }

    /// The Services the table has.
    #[must_use]
    pub fn names(&self) -> Vec<String> {
        self.lock().services.keys().cloned().collect()
    }

    /// Removes the frontends read back at a restart that no Service claimed (call it once the
    /// Services are completely known). Returns how many went.
    pub fn sweep_unclaimed(&self) -> Result<usize, LbError> {
        let mut g = self.lock();
        let stale: Vec<Frontend> = g
            .frontends
            .iter()
            .filter(|(_, e)| e.owner.is_none())
            .map(|(f, _)| *f)
            .collect();
        for f in &stale {
            self.remove(&mut g, f)?;
        }
        Ok(stale.len())
    }

    /// Every Service with its frontends (`GET /v1/services`); frontends read back and not
    /// claimed yet are listed under the name `(restored)`.
    #[must_use]
    pub fn list(&self) -> Vec<ServiceInfo> {
        let g = self.lock();
        let info = |f: &Frontend| {
            g.frontends.get(f).map(|e| FrontendInfo {
                frontend: *f,
                id: e.id,
                backends: e.backends.clone(),
            })
        };
        let mut out: Vec<ServiceInfo> = g
            .services
            .iter()
            .map(|(name, fs)| ServiceInfo {
                name: name.clone(),
                frontends: fs.iter().filter_map(info).collect(),
            })
            .collect();
        let unclaimed: Vec<FrontendInfo> = g
            .frontends
            .iter()
            .filter(|(_, e)| e.owner.is_none())
            .filter_map(|(f, _)| info(f))
            .collect();
        if !unclaimed.is_empty() {
            out.push(ServiceInfo {
                name: "(restored)".to_owned(),
                frontends: unclaimed,
            });
        }
        out
    }
}

#[cfg(test)]
mod tests;
