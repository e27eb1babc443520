//! Endpoint labels on the wire (`{"key": "k8s:app", "value": "web"}`: the source is part of
//! the key) and as the policy engine's `LabelSet`.

use weft_policy::labels::{Label, LabelSet};

/// Security labels as the API shows them.
#[must_use]
pub fn to_api_labels(set: &LabelSet) -> Vec<weft_api::Label> {
    set.iter()
        .map(|l| weft_api::Label {
            key: format!("{}:{}", l.source, l.key),
            value: l.value.clone(),
        })
        .collect()
}

/// The reverse of [`to_api_labels`]; a key without a source gets `k8s`, as pod labels do.
#[must_use]
pub fn from_api_labels(labels: &[weft_api::Label]) -> LabelSet {
    labels
        .iter()
        .map(|l| match l.key.split_once(':') {
            Some((source, key)) => Label::new(source, key, &l.value),
            None => Label::new("k8s", &l.key, &l.value),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_keeps_sources() {
        let set = LabelSet::for_pod("ns1", [("app", "web")]);
        let api = to_api_labels(&set);
        assert!(api.iter().any(|l| l.key == "k8s:app" && l.value == "web"));
        assert_eq!(from_api_labels(&api), set);
    }
}
