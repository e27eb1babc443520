//! Policy files (Cilium JSON, CiliumNetworkPolicy / NetworkPolicy YAML): parse or fail, never
//! panic; accepted labels never carry control characters.
#![no_main]
use libfuzzer_sys::fuzz_target;
use weft_policy::labels::Label;
use weft_policy::parse::parse_policy_file;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = parse_policy_file("p.json", &text);
    let _ = parse_policy_file("p.yaml", &text);
    if let Ok(l) = Label::parse_with_source(&text, "k8s") {
        assert!(!l.to_string().chars().any(char::is_control));
    }
});
