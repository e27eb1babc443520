//! The policy kinds' event handler: objects translated into repository rules (replaced and
//! deleted with their object), their outcome kept in the cache, and for a
//! `ClusterNetworkPolicy` its status condition queued for writing.

use super::{Handler, Watchers};
use crate::cache::{PolicyStatus, TieredPolicy};
use crate::policy::{PolicyKey, PolicyKind, Translated, translate};
use crate::status::Outcome;
use kube::Resource;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use weft_policy::rule::Rule;

/// One policy kind. Remembers each object's last applied version so a re-list does not
/// re-import unchanged objects: its resourceVersion, or for a `ClusterNetworkPolicy` its uid
/// and generation (its status writes move the resourceVersion, not the generation).
pub(super) struct Policies {
    kind: PolicyKind,
    applied: BTreeMap<PolicyKey, String>,
}

impl Policies {
    pub(super) fn new(kind: PolicyKind) -> Self {
        Self {
            kind,
            applied: BTreeMap::new(),
        }
    }

    fn version(&self, meta: &kube::api::ObjectMeta) -> String {
        match (self.kind, meta.generation) {
            (PolicyKind::ClusterNetworkPolicy, Some(g)) => {
                format!("{}/{g}", meta.uid.as_deref().unwrap_or_default())
            }
            _ => meta.resource_version.clone().unwrap_or_default(),
        }
    }

    /// Translates and delivers one object: its outcome, or why it was rejected.
    fn deliver(
        &mut self,
        w: &Watchers,
        value: &Value,
        version: String,
    ) -> Result<Delivered, String> {
        let t = translate(self.kind, value)?;
        if self.is_new(&t, &version) && !t.rules.is_empty() {
            w.sink
                .policy_apply(&t.key, t.rules.clone())
                .map_err(|e| format!("{}: {e}", t.key))?;
        }
        Ok(self.delivered(w, t, version))
    }

    /// Whether the object's rules differ from those last applied (by its version).
    fn is_new(&self, t: &Translated, version: &str) -> bool {
        self.applied.get(&t.key).map(String::as_str) != Some(version)
    }

    /// Records an object whose rules (when new and not empty) are in force: an object without
    /// rules has its previous ones deleted, and what was not enforced is logged once per version.
    fn delivered(&mut self, w: &Watchers, t: Translated, version: String) -> Delivered {
        if self.is_new(&t, &version) {
            if t.rules.is_empty() {
                // A ClusterNetworkPolicy without rules: nothing of it is in force.
                w.sink.policy_delete(&t.key);
            }
            self.applied.insert(t.key.clone(), version);
            for n in &t.not_enforced {
                tracing::warn!(key = %t.key, "policy rule not enforced (fails closed): {n}");
            }
            for n in &t.warnings {
                tracing::warn!(key = %t.key, "policy warning: {n}");
            }
            if !t.not_enforced.is_empty() {
                w.stats.count(self.kind.as_str(), "partial");
            }
        }
        Delivered {
            rules: t.rules.len(),
            key: t.key,
            not_enforced: t.not_enforced,
            warnings: t.warnings,
        }
    }

    /// Keeps an object's outcome: its status in the cache, and for a `ClusterNetworkPolicy`
    /// its tier entry and the status condition to write.
    fn record(&self, w: &Watchers, value: &Value, delivered: Result<Delivered, String>) {
        let outcome = match delivered {
            Ok(d) => {
                let status = (!d.not_enforced.is_empty() || !d.warnings.is_empty()).then(|| {
                    PolicyStatus::Partial {
                        not_enforced: d.not_enforced.clone(),
                        warnings: d.warnings.clone(),
                    }
                });
                w.cache.set_policy_status(&d.key, status);
                Some((
                    d.key,
                    Some(d.rules),
                    Outcome::Accepted {
                        not_enforced: d.not_enforced,
                        warnings: d.warnings,
                    },
                ))
            }
            Err(e) => {
                // The object's previous rules, if any, stay in force (as in Cilium): without its
                // selector there is no telling which pods to isolate.
                w.stats.count(self.kind.as_str(), "rejected");
                tracing::warn!(kind = self.kind.as_str(), "policy rejected: {e}");
                PolicyKey::of(self.kind, value).ok().map(|key| {
                    w.cache
                        .set_policy_status(&key, Some(PolicyStatus::Rejected(e.clone())));
                    (key, None, Outcome::Rejected(e))
                })
            }
        };
        if self.kind == PolicyKind::ClusterNetworkPolicy
            && let Some((key, rules, outcome)) = outcome
        {
            w.cache
                .set_tiered(TieredPolicy::of(&key.name, value, rules, &outcome));
            w.status.request(self.kind, &key.name, value, &outcome);
        }
    }

    /// An object as JSON and the version it is remembered by.
    fn value_of<K: Resource + serde::Serialize>(&self, obj: &K) -> Option<(Value, String)> {
        let version = self.version(obj.meta());
        match serde_json::to_value(obj) {
            Ok(v) => Some((v, version)),
            Err(e) => {
                tracing::error!(kind = self.kind.as_str(), "cannot serialise object: {e}");
                None
            }
        }
    }
}

/// What [`Policies::deliver`] made of an object.
struct Delivered {
    key: PolicyKey,
    rules: usize,
    not_enforced: Vec<String>,
    warnings: Vec<String>,
}

impl<K: Resource + serde::Serialize + Clone> Handler<K> for Policies {
    fn name(&self) -> &'static str {
        self.kind.as_str()
    }
    fn apply(&mut self, w: &Watchers, obj: K) {
        let Some((value, version)) = self.value_of(&obj) else {
            return;
        };
        let delivered = self.deliver(w, &value, version);
        self.record(w, &value, delivered);
    }
    /// Every listed object translated first, then the changed ones' rules delivered together:
    /// one repository change and one regeneration for a list of a thousand objects (a restart's
    /// re-list), not a thousand.
    fn apply_listed(&mut self, w: &Watchers, listed: &[K]) {
        let staged: Vec<_> = listed
            .iter()
            .filter_map(|obj| self.value_of(obj))
            .map(|(value, version)| {
                let t = translate(self.kind, &value);
                (value, version, t)
            })
            .collect();
        let batch: Vec<(PolicyKey, Vec<Rule>)> = staged
            .iter()
            .filter_map(|(_, version, t)| t.as_ref().ok().map(|t| (version, t)))
            .filter(|(version, t)| self.is_new(t, version) && !t.rules.is_empty())
            .map(|(_, t)| (t.key.clone(), t.rules.clone()))
            .collect();
        let refused = if batch.is_empty() {
            BTreeMap::new()
        } else {
            w.sink.policy_apply_all(batch)
        };
        for (value, version, t) in staged {
            let delivered = t.and_then(|t| match refused.get(&t.key) {
                Some(e) => Err(format!("{}: {e}", t.key)),
                None => Ok(self.delivered(w, t, version)),
            });
            self.record(w, &value, delivered);
        }
    }
    fn delete(&mut self, w: &Watchers, obj: K) {
        let Ok(value) = serde_json::to_value(&obj) else {
            return;
        };
        if let Ok(key) = PolicyKey::of(self.kind, &value) {
            self.applied.remove(&key);
            w.cache.set_policy_status(&key, None);
            if self.kind == PolicyKind::ClusterNetworkPolicy {
                w.cache.remove_tiered(&key.name);
                w.status.forget(&key.name);
            }
            w.sink.policy_delete(&key);
        }
    }
    fn relisted(&mut self, w: &Watchers, listed: &[K]) {
        let keep: BTreeSet<PolicyKey> = listed
            .iter()
            .filter_map(|o| PolicyKey::of(self.kind, &serde_json::to_value(o).ok()?).ok())
            .collect();
        for key in w.sink.policy_keys() {
            if key.kind == self.kind && !keep.contains(&key) {
                tracing::info!(%key, "policy object gone while not watched: deleting its rules");
                self.applied.remove(&key);
                w.sink.policy_delete(&key);
            }
        }
        if self.kind == PolicyKind::ClusterNetworkPolicy {
            w.cache
                .retain_tiered(|name| keep.iter().any(|k| k.name == name));
        }
        self.applied.retain(|k, _| keep.contains(k));
    }
}
