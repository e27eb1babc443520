//! A `ClusterNetworkPolicy`'s `status.conditions` as Weft reports it: one condition of type
//! [`CONDITION_TYPE`], `True` when the object is in force (reason `Accepted`, or
//! `PartiallyEnforced` with what fails closed in the message) and `False` when it was rejected
//! (reason `Rejected`, the parser's message: the field and the fix). network-policy-api v0.3.0
//! leaves the conditions to each implementation ("Currently there are no rules as to what these
//! conditions should display"); `Accepted` is the type its implementations commonly use.
//!
//! Written with server-side apply on the status subresource ([`apply_body`]), so conditions
//! other writers own stay; and only when it changes ([`wanted`] compares with the object as the
//! watch delivered it, `lastTransitionTime` aside, which moves only when the status does).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde_json::{Value, json};

/// The condition type Weft owns.
pub const CONDITION_TYPE: &str = "Accepted";

/// The field manager of the status writes.
pub const FIELD_MANAGER: &str = "weft-manager";

/// The CRD's limit on a condition's message.
const MAX_MESSAGE: usize = 32_768;

/// What became of one version of an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// In force; `not_enforced` parts fail closed, `warnings` are enforced with a caveat.
    Accepted {
        /// Parts that fail closed.
        not_enforced: Vec<String>,
        /// Parts enforced with a caveat.
        warnings: Vec<String>,
    },
    /// Refused whole (its previous rules, if any, stay in force).
    Rejected(String),
}

impl Outcome {
    /// `(status, reason, message)` of the condition.
    fn condition(&self) -> (&'static str, &'static str, String) {
        match self {
            Self::Rejected(e) => (
                "False",
                "Rejected",
                format!("rejected: {e} (the policy's previous version, if any, stays in force)"),
            ),
            Self::Accepted {
                not_enforced,
                warnings,
            } => {
                let mut parts = Vec::new();
                if !not_enforced.is_empty() {
                    parts.push(format!(
                        "not enforced (fails closed): {}",
                        not_enforced.join("; ")
                    ));
                }
                if !warnings.is_empty() {
                    parts.push(format!("warnings: {}", warnings.join("; ")));
                }
                let reason = if not_enforced.is_empty() {
                    "Accepted"
                } else {
                    "PartiallyEnforced"
                };
                let message = if parts.is_empty() {
                    "in force".to_owned()
                } else {
                    format!("in force; {}", parts.join("; "))
                };
                ("True", reason, message)
            }
        }
    }
}

/// Cuts `s` to the CRD's limit, on a character boundary.
fn bounded(mut s: String) -> String {
    if s.len() > MAX_MESSAGE {
        let mut end = MAX_MESSAGE - 3;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str("...");
    }
    s
}

/// The condition `obj` should carry after `outcome`, or `None` when its current one (as the
/// watch delivered it) already says so. `now`: the transition time when the status changes.
#[must_use]
pub fn wanted(obj: &Value, outcome: &Outcome, now: Time) -> Option<Condition> {
    let (status, reason, message) = outcome.condition();
    let message = bounded(message);
    let generation = obj.pointer("/metadata/generation").and_then(Value::as_i64);
    let current = obj
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(CONDITION_TYPE));
    let field = |name: &str| current.and_then(|c| c.get(name));
    let same = field("status").and_then(Value::as_str) == Some(status)
        && field("reason").and_then(Value::as_str) == Some(reason)
        && field("message").and_then(Value::as_str) == Some(message.as_str())
        && field("observedGeneration").and_then(Value::as_i64) == generation;
    if same {
        return None;
    }
    // The transition time moves only when the status does.
    let kept = field("status")
        .and_then(Value::as_str)
        .filter(|s| *s == status)
        .and_then(|_| field("lastTransitionTime"))
        .and_then(|t| serde_json::from_value::<Time>(t.clone()).ok());
    Some(Condition {
        last_transition_time: kept.unwrap_or(now),
        message,
        observed_generation: generation,
        reason: reason.to_owned(),
        status: status.to_owned(),
        type_: CONDITION_TYPE.to_owned(),
    })
}

/// The server-side apply body that sets `condition` on object `name` of `api_version`/`kind`.
#[must_use]
pub fn apply_body(api_version: &str, kind: &str, name: &str, condition: &Condition) -> Value {
    json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": name},
        "status": {"conditions": [condition]},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Time {
        serde_json::from_value(json!(s)).unwrap()
    }

    fn obj(conditions: &Value) -> Value {
        json!({"metadata": {"name": "a", "generation": 3}, "status": {"conditions": conditions}})
    }

    const NOW: &str = "2026-11-26T15:00:00Z";

    #[test]
    fn accepted_rejected_and_partial_conditions() {
        let o = obj(&json!([]));
        let ok = Outcome::Accepted {
            not_enforced: vec![],
            warnings: vec![],
        };
        let c = wanted(&o, &ok, t(NOW)).unwrap();
        assert_eq!(
            (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
            ("Accepted", "True", "Accepted")
        );
        assert_eq!(c.message, "in force");
        assert_eq!(c.observed_generation, Some(3));
        let c = wanted(&o, &Outcome::Rejected("spec.tier: missing".into()), t(NOW)).unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "Rejected")
        );
        assert!(c.message.contains("spec.tier: missing"), "{}", c.message);
        let c = wanted(
            &o,
            &Outcome::Accepted {
                not_enforced: vec!["spec.egress[0].to[0]: x".into()],
                warnings: vec!["w".into()],
            },
            t(NOW),
        )
        .unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", "PartiallyEnforced")
        );
        assert_eq!(
            c.message,
            "in force; not enforced (fails closed): spec.egress[0].to[0]: x; warnings: w"
        );
    }

    #[test]
    fn written_only_when_it_changes_and_the_transition_time_follows_the_status() {
        let ok = Outcome::Accepted {
            not_enforced: vec![],
            warnings: vec![],
        };
        let current = json!({"type": "Accepted", "status": "True", "reason": "Accepted",
            "message": "in force", "observedGeneration": 3,
            "lastTransitionTime": "2026-01-01T00:00:00Z"});
        let other = json!({"type": "Programmed", "status": "True", "reason": "X", "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z"});
        assert_eq!(wanted(&obj(&json!([other, current])), &ok, t(NOW)), None);
        // A new generation: written, the status did not change so neither does its time.
        let mut newer = obj(&json!([current]));
        newer["metadata"]["generation"] = 4.into();
        let c = wanted(&newer, &ok, t(NOW)).unwrap();
        assert_eq!(c.observed_generation, Some(4));
        assert_eq!(c.last_transition_time, t("2026-01-01T00:00:00Z"));
        // Rejected now: the time is now.
        let c = wanted(&newer, &Outcome::Rejected("e".into()), t(NOW)).unwrap();
        assert_eq!(c.last_transition_time, t(NOW));
        // No status at all.
        let bare = json!({"metadata": {"name": "a"}});
        assert!(wanted(&bare, &ok, t(NOW)).is_some());
    }

    #[test]
    fn a_long_message_is_cut_to_the_crd_limit() {
        let c = wanted(
            &obj(&json!([])),
            &Outcome::Rejected("é".repeat(40_000)),
            t(NOW),
        )
        .unwrap();
        assert!(c.message.len() <= MAX_MESSAGE && c.message.ends_with("..."));
    }

    #[test]
    fn the_apply_body_names_the_object_and_carries_the_condition() {
        let c = wanted(&obj(&json!([])), &Outcome::Rejected("e".into()), t(NOW)).unwrap();
        let b = apply_body(
            "policy.networking.k8s.io/v1beta1",
            "ClusterNetworkPolicy",
            "a",
            &c,
        );
        assert_eq!(b["metadata"]["name"], "a");
        assert_eq!(b["kind"], "ClusterNetworkPolicy");
        let cond = &b["status"]["conditions"][0];
        assert_eq!(cond["type"], "Accepted");
        assert_eq!(cond["status"], "False");
        assert_eq!(cond["lastTransitionTime"], NOW);
        assert_eq!(cond["observedGeneration"], 3);
    }
}
