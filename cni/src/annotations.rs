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

/// The pod annotation Kubernetes (and containerd's `bandwidth` capability) use for a pod's
/// egress rate limit.
pub const EGRESS_BANDWIDTH: &str = "kubernetes.io/egress-bandwidth";

/// ADD refuses a pod that asks for an egress rate limit: Weft cannot enforce it yet, and the
/// chained `bandwidth` plugin cannot either (it needs the host veth's ingress qdisc slot, which
/// Weft's clsact holds; it fails with "create ingress qdisc: file exists"). A clear error before
/// anything is created beats that one after Weft's ADD, or a limit silently not applied.
pub fn refuse_egress_bandwidth(egress: Option<&str>) -> Result<(), CniError> {
    match egress {
        None => Ok(()),
        Some(rate) => Err(CniError::InvalidConfig(format!(
            "not supported yet: egress bandwidth limits (pod annotation {EGRESS_BANDWIDTH}: \
             {rate:?}); Weft's tc programs hold the host veth's clsact/ingress slot the \
             `bandwidth` plugin needs for egress shaping. Remove the annotation; \
             kubernetes.io/ingress-bandwidth through the chained `bandwidth` plugin works"
        ))),
    }
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
    fn egress_bandwidth_is_refused_with_the_annotation_named() {
        assert!(refuse_egress_bandwidth(None).is_ok());
        let e = refuse_egress_bandwidth(Some("1M")).unwrap_err().to_string();
        assert!(
            e.contains("not supported yet") && e.contains(EGRESS_BANDWIDTH),
            "{e}"
        );
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
