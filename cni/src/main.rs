//! weft-cni: the CNI plugin binary. Everything it does is in the library ([`weft_cni::run`]);
//! this prints the result or the spec's error object on stdout and sets the exit status, the
//! one place where failures become CNI error codes.

use std::io::{Read, Write};
use std::process::ExitCode;
use weft_cni::{netconf, version};

fn main() -> ExitCode {
    let mut stdin = Vec::new();
    // VERSION may come with nothing on stdin; a read error is then the same as empty input.
    let _ = std::io::stdin().read_to_end(&mut stdin);
    match weft_cni::run(&stdin) {
        Ok(out) => {
            if let Some(v) = out {
                print_json(&v);
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            let requested =
                netconf::sniff_version(&stdin).filter(|v| version::SUPPORTED.contains(&v.as_str()));
            tracing::error!(code = e.code(), error = %e, "failed");
            print_json(&e.to_json(requested.as_deref().unwrap_or(version::LATEST)));
            ExitCode::FAILURE
        }
    }
}

fn print_json(v: &serde_json::Value) {
    let mut out = std::io::stdout().lock();
    // Nothing useful can be done if the runtime closed our stdout.
    let _ = serde_json::to_writer(&mut out, v);
    let _ = out.write_all(b"\n");
    let _ = out.flush();
}
