//! Compiles the C datapath with clang-19 for the BPF target, and a host program that prints the C
//! layout of the shared map structs plus the shared constants as Rust (`layout.rs` in `OUT_DIR`).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    reason = "a build script fails by panicking; cargo shows the message"
)]

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn clang() -> String {
    let clang = env::var("WEFT_CLANG").unwrap_or_else(|_| "clang-19".to_owned());
    match Command::new(&clang).arg("--version").output() {
        Ok(out) if out.status.success() => clang,
        _ => panic!(
            "`{clang}` not found: the eBPF datapath needs clang-19 (run scripts/setup), \
             or set WEFT_CLANG to another clang with the BPF target"
        ),
    }
}

/// Debian keeps `asm/types.h` (pulled in by `linux/types.h`) in a multiarch directory that the BPF
/// target does not search by itself.
fn multiarch_include() -> Option<PathBuf> {
    let out = Command::new("gcc").arg("-print-multiarch").output().ok()?;
    let triple = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    let dir = Path::new("/usr/include").join(triple);
    dir.is_dir().then_some(dir)
}

fn run(cmd: &mut Command) -> Vec<u8> {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    let include = manifest.join("include");
    for p in ["weft_tc.c", "include", "layout"] {
        println!("cargo:rerun-if-changed={}", manifest.join(p).display());
    }
    println!("cargo:rerun-if-env-changed=WEFT_CLANG");
    let clang = clang();

    let mut bpf = Command::new(&clang);
    bpf.args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror", "-c"])
        .arg("-I")
        .arg(&include);
    if let Some(dir) = multiarch_include() {
        bpf.arg("-idirafter").arg(dir);
    }
    bpf.arg(manifest.join("weft_tc.c"))
        .arg("-o")
        .arg(out_dir.join("weft_tc.o"));
    run(&mut bpf);

    let layout_bin = out_dir.join("layout");
    run(Command::new(&clang)
        .args(["-O0", "-Wall", "-Werror", "-I"])
        .arg(&include)
        .arg(manifest.join("layout/layout.c"))
        .arg("-o")
        .arg(&layout_bin));
    let rust = run(&mut Command::new(&layout_bin));
    std::fs::write(out_dir.join("layout.rs"), rust).expect("write layout.rs");
}
