//! Identity labels from pod annotations. A CRI runtime gives CNI the pod's annotations (never its
//! labels) when the conflist declares the `io.kubernetes.cri.pod-annotations` capability, so a pod
//! without a Kubernetes API server carries its labels as `weft.io/label.<key>: <value>`.
//!
//! Precedence: `args.cni.labels` wins over an annotation with the same key. args come from the
//! runtime or the operator's conflist; annotations from whoever wrote the pod spec, which must not
//! override what the node's configuration pins. The losing annotation is logged, not an error.

use crate::error::CniError;
use std::collections::BTreeMap;
use weft_api::Label;

/// The runtimeConfig key containerd (and CRI-O) fill with the pod's annotations.
pub const CAPABILITY: &str = "io.kubernetes.cri.pod-annotations";
/// Annotations under this prefix become identity labels: `weft.io/label.app: web` → `app=web`.
pub const LABEL_PREFIX: &str = "weft.io/label.";

/// The pod annotations Kubernetes uses for a pod's rate limits (bits per second, a quantity:
/// `10M`). containerd's `bandwidth` capability turns the same annotations into
/// `runtimeConfig.bandwidth`.
pub const INGRESS_BANDWIDTH: &str = "kubernetes.io/ingress-bandwidth";
/// See [`INGRESS_BANDWIDTH`].
pub const EGRESS_BANDWIDTH: &str = "kubernetes.io/egress-bandwidth";
/// The smallest rate Kubernetes accepts for the bandwidth annotations (1 kbit/s).
pub const MIN_RATE_BITS: u64 = 1_000;
/// The largest (1 Pbit/s).
pub const MAX_RATE_BITS: u64 = 1_000_000_000_000_000;

/// A pod's rate limits in bits per second (`None`: unlimited).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bandwidth {
    /// Traffic to the pod.
    pub ingress: Option<u64>,
    /// Traffic from the pod.
    pub egress: Option<u64>,
}

/// The pod's limits: `runtimeConfig.bandwidth` (the `bandwidth` capability: the runtime's own
/// reading of the annotations) where it gives a rate, else the annotations themselves (the
/// `io.kubernetes.cri.pod-annotations` capability). A rate outside Kubernetes' bounds or an
/// unreadable quantity is an error naming where it came from.
pub fn bandwidth(
    annotations: &BTreeMap<String, String>,
    runtime: (Option<u64>, Option<u64>),
) -> Result<Bandwidth, CniError> {
    let one = |from_runtime: Option<u64>, field: &str, annotation: &str| match (
        from_runtime.filter(|r| *r > 0),
        annotations.get(annotation),
    ) {
        (Some(bits), _) if (MIN_RATE_BITS..=MAX_RATE_BITS).contains(&bits) => Ok(Some(bits)),
        (Some(bits), _) => Err(CniError::InvalidConfig(format!(
            "runtimeConfig.bandwidth.{field}: {bits} bit/s is outside 1k..1P (Kubernetes' bounds)"
        ))),
        (None, Some(q)) => parse_rate(q)
            .map(Some)
            .map_err(|e| CniError::InvalidConfig(format!("pod annotation {annotation}: {e}"))),
        (None, None) => Ok(None),
    };
    Ok(Bandwidth {
        ingress: one(runtime.0, "ingressRate", INGRESS_BANDWIDTH)?,
        egress: one(runtime.1, "egressRate", EGRESS_BANDWIDTH)?,
    })
}

#[allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss,
    reason = "the bounds 1e3 and 1e15 are exact in f64, and the value is checked against them first"
)]
fn check_bounds(bits: f64, what: impl Fn() -> String) -> Result<u64, CniError> {
    if (MIN_RATE_BITS as f64..=MAX_RATE_BITS as f64).contains(&bits) {
        Ok(bits.round() as u64)
    } else {
        Err(CniError::InvalidConfig(format!(
            "{}: {bits} bit/s is outside 1k..1P (Kubernetes' bounds)",
            what()
        )))
    }
}

/// Parses a Kubernetes bandwidth quantity (`10M`, `1Gi`, `500k`, `1e6`) into bits per second,
/// within Kubernetes' bounds (1 kbit/s to 1 Pbit/s).
pub fn parse_rate(q: &str) -> Result<u64, String> {
    let bad = || format!("{q:?} is not a quantity (e.g. 10M, 1Gi)");
    let t = q.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    let multiplier: f64 = match suffix {
        "" => 1.0,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        s if s.starts_with(['e', 'E']) => s
            .get(1..)
            .and_then(|e| e.parse::<i32>().ok())
            .map(|e| 10f64.powi(e))
            .ok_or_else(bad)?,
        _ => return Err(bad()),
    };
    let value: f64 = num.parse().map_err(|_| bad())?;
    check_bounds(value * multiplier, || format!("{q:?}")).map_err(|e| e.to_string())
}

/// The labels named by `annotations`, sorted by key. Other annotations are ignored.
pub fn labels(annotations: &BTreeMap<String, String>) -> Result<Vec<Label>, CniError> {
    annotations
        .iter()
        .filter_map(|(k, v)| k.strip_prefix(LABEL_PREFIX).map(|key| (k, key, v)))
        .map(|(annotation, key, value)| {
            if key.is_empty() {
                return Err(CniError::InvalidConfig(format!(
                    "runtimeConfig.{CAPABILITY}: annotation {annotation:?} names no label key \
                     (write {LABEL_PREFIX}<key>: <value>)"
                )));
            }
            Ok(Label {
                key: key.to_owned(),
                value: value.clone(),
            })
        })
        .collect()
}

/// `args` plus every annotation label whose key `args` does not have; returns the merged set and
/// the annotation labels that lost to `args`.
#[must_use]
pub fn merge(args: &[Label], from_annotations: &[Label]) -> (Vec<Label>, Vec<Label>) {
    let mut merged = args.to_vec();
    let mut overridden = Vec::new();
    for l in from_annotations {
        if args.iter().any(|a| a.key == l.key) {
            overridden.push(l.clone());
        } else {
            merged.push(l.clone());
        }
    }
    (merged, overridden)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn label(k: &str, v: &str) -> Label {
        Label {
            key: k.into(),
            value: v.into(),
        }
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn quantities() {
        assert_eq!(parse_rate("10M"), Ok(10_000_000));
        assert_eq!(parse_rate("1Gi"), Ok(1 << 30));
        assert_eq!(parse_rate("500k"), Ok(500_000));
        assert_eq!(parse_rate("1.5M"), Ok(1_500_000));
        assert_eq!(parse_rate("1e6"), Ok(1_000_000));
        assert_eq!(parse_rate("2000"), Ok(2000));
        for bad in ["10", "2P", "10Mbps", "", "fast", "1e", "-5M"] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn runtime_config_wins_and_annotations_fill_in() {
        let a = map(&[(INGRESS_BANDWIDTH, "5M"), (EGRESS_BANDWIDTH, "1M")]);
        let b = bandwidth(&a, (Some(8_000_000), None)).unwrap();
        assert_eq!(
            b,
            Bandwidth {
                ingress: Some(8_000_000),
                egress: Some(1_000_000)
            }
        );
        assert_eq!(
            bandwidth(&map(&[]), (None, Some(0))).unwrap(),
            Bandwidth::default()
        );
        let e = bandwidth(&map(&[(EGRESS_BANDWIDTH, "lots")]), (None, None)).unwrap_err();
        assert!(e.to_string().contains(EGRESS_BANDWIDTH), "{e}");
        let e = bandwidth(&map(&[]), (Some(10), None)).unwrap_err();
        assert!(e.to_string().contains("ingressRate"), "{e}");
    }

    #[test]
    fn only_prefixed_annotations_become_labels() {
        let got = labels(&map(&[
            ("weft.io/label.app", "web"),
            ("weft.io/label.tier", ""),
            ("kubernetes.io/egress-bandwidth", "10M"),
            ("weft.io/labelx", "no"),
            ("io.kubernetes.cri.sandbox-id", "abc"),
        ]))
        .unwrap();
        assert_eq!(got, vec![label("app", "web"), label("tier", "")]);
        assert!(labels(&BTreeMap::new()).unwrap().is_empty());
    }

    #[test]
    fn empty_key_is_code_7_naming_the_annotation() {
        let e = labels(&map(&[("weft.io/label.", "x")])).unwrap_err();
        assert_eq!(e.code(), 7);
        assert!(e.to_string().contains("\"weft.io/label.\""), "{e}");
    }

    #[test]
    fn args_win_over_annotations() {
        let (merged, lost) = merge(
            &[label("app", "from-args")],
            &[label("app", "from-annotation"), label("tier", "db")],
        );
        assert_eq!(merged, vec![label("app", "from-args"), label("tier", "db")]);
        assert_eq!(lost, vec![label("app", "from-annotation")]);
        let (merged, lost) = merge(&[], &[label("a", "1")]);
        assert_eq!((merged, lost), (vec![label("a", "1")], vec![]));
    }
}
