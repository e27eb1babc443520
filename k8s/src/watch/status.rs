//! The `ClusterNetworkPolicy` status writer: the handler queues the condition an object should
//! carry (only when it differs from what the watch delivered, see [`crate::status::wanted`]);
//! one task writes them with server-side apply on the status subresource, the latest per
//! object, retrying failures with backoff until a newer one supersedes them or the object goes.

use super::WatchStats;
use crate::policy::PolicyKind;
use crate::status::{FIELD_MANAGER, Outcome, apply_body, wanted};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Apply bodies waiting, by object name.
#[derive(Default)]
pub(super) struct StatusQueue {
    pending: Mutex<BTreeMap<String, Value>>,
    changed: tokio::sync::Notify,
}

/// First and longest wait after a failed write.
const RETRY: (Duration, Duration) = (Duration::from_secs(1), Duration::from_mins(1));

impl StatusQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Value>> {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Queues the condition object `obj` (named `name`) should carry after `outcome`, if it
    /// does not already.
    pub(super) fn request(&self, kind: PolicyKind, name: &str, obj: &Value, outcome: &Outcome) {
        let Some(c) = wanted(obj, outcome, Time(k8s_openapi::jiff::Timestamp::now())) else {
            // Already says so; an older write still queued would only say something stale.
            self.lock().remove(name);
            return;
        };
        let body = apply_body(kind.api_version(), kind.as_str(), name, &c);
        self.lock().insert(name.to_owned(), body);
        self.changed.notify_one();
    }

    /// The object is gone: nothing to write.
    pub(super) fn forget(&self, name: &str) {
        self.lock().remove(name);
    }

    fn take(&self) -> BTreeMap<String, Value> {
        std::mem::take(&mut *self.lock())
    }

    /// Puts back a failed write unless a newer one came meanwhile.
    fn retry(&self, name: String, body: Value) {
        self.lock().entry(name).or_insert(body);
    }
}

/// Writes what `q` queues, until the runtime stops.
pub(super) async fn write(q: Arc<StatusQueue>, api: Api<DynamicObject>, stats: Arc<WatchStats>) {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut wait = RETRY.0;
    loop {
        let notified = q.changed.notified();
        let batch = q.take();
        if batch.is_empty() {
            notified.await;
            continue;
        }
        let mut failed = false;
        for (name, body) in batch {
            match api.patch_status(&name, &params, &Patch::Apply(&body)).await {
                Ok(_) => {
                    stats.status_writes.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(policy = %name, "ClusterNetworkPolicy status written");
                }
                // Deleted meanwhile: its deletion event follows.
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    stats.status_write_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        policy = %name,
                        retry_s = wait.as_secs(),
                        "ClusterNetworkPolicy status not written: {e} (does the ClusterRole of \
                         conf/k8s/01-rbac.yaml allow patch on clusternetworkpolicies/status?)"
                    );
                    q.retry(name, body);
                    failed = true;
                }
            }
        }
        if failed {
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(RETRY.1);
        } else {
            wait = RETRY.0;
        }
    }
}
