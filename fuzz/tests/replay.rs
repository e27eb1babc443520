//! Every fuzz target's body over the corpus kept in the tree (`fuzz/corpus/<target>/`) and every
//! input that once crashed it (`fuzz/regressions/<target>/`), on the stable toolchain: what
//! libFuzzer found stays fixed without nightly. A target without a kept corpus fails (the
//! corpus is what the next fuzzing run starts from).

use std::path::{Path, PathBuf};

// Without weft-manager (feature `manager`), map_keys would silently not be replayed.
#[cfg(not(feature = "manager"))]
compile_error!("build the replay with --features manager (scripts/test does)");

type Target = fn(&[u8]);

const TARGETS: &[(&str, Target)] = &[
    ("api_decode", weft_fuzz::targets::api_decode),
    ("cni_result", weft_fuzz::targets::cni_result),
    #[cfg(feature = "manager")]
    ("map_keys", weft_fuzz::targets::map_keys),
    ("netconf_cni_args", weft_fuzz::targets::netconf_cni_args),
    ("policy_parse", weft_fuzz::targets::policy_parse),
];

fn files(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = rd
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    out.sort();
    out
}

#[test]
fn every_target_replays_its_corpus_and_regressions() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut failures = Vec::new();
    for &(name, target) in TARGETS {
        let corpus = files(&root.join("corpus").join(name));
        let regressions = files(&root.join("regressions").join(name));
        assert!(
            !corpus.is_empty(),
            "fuzz/corpus/{name}/ is empty: seed it (scripts/fuzz keeps what a run finds)"
        );
        for path in corpus.iter().chain(&regressions) {
            let data = std::fs::read(path).unwrap();
            if std::panic::catch_unwind(|| target(&data)).is_err() {
                failures.push(path.display().to_string());
            }
        }
        eprintln!(
            "{name}: {} corpus inputs, {} regressions replayed",
            corpus.len(),
            regressions.len()
        );
    }
    assert!(failures.is_empty(), "inputs that panic: {failures:#?}");
}
