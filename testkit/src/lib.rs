//! What the privileged integration tests of `weft-cni` and `weft-manager` share: running
//! commands and refusing (never skipping) when the machine cannot run them for real.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    reason = "test support: a step that cannot run fails the calling test by panicking"
)]

use std::process::Command;

/// Runs a command, panicking with its output when it fails.
#[allow(
    clippy::must_use_candidate,
    reason = "most callers run it for its effect and ignore the output"
)]
pub fn sh(args: &[&str]) -> String {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Panics unless the test runs as root and every tool is on `PATH`; `why` says what needs
/// root, `fix` how to get the tools.
pub fn require_root_and_tools(why: &str, tools: &[&str], fix: &str) {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .expect("Uid line");
    assert!(
        euid == "0",
        "{why} need root: run them as root (CI does); they never skip"
    );
    for tool in tools {
        let found = std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()));
        assert!(found, "`{tool}` is missing: {fix}");
    }
}
