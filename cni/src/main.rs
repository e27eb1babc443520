//! weft-cni: the CNI plugin. Parses and validates everything first, then talks to weft-manager over
//! its unix socket and plumbs the pod's veth with netlink. See DESIGN.md §2.

// Input reaches these crates from the API, policy files and the CNI: no path may panic on it.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::indexing_slicing,
        clippy::panic
    )
)]

mod annotations;
mod cmd;
mod env;
mod error;
mod logging;
mod manager;
mod netconf;
mod netlink;
mod netns;
#[cfg(test)]
mod props;
mod result;
mod revert;
mod version;

use env::{CniEnv, Command};
use error::CniError;
use netconf::NetConf;
use std::io::{Read, Write};
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut stdin = Vec::new();
    // VERSION may come with nothing on stdin; a read error is then the same as empty input.
    let _ = std::io::stdin().read_to_end(&mut stdin);
    match run(&stdin) {
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

fn run(stdin: &[u8]) -> Result<Option<serde_json::Value>, CniError> {
    let t0 = std::time::Instant::now();
    let env = CniEnv::from_os_lookup(|k| std::env::var_os(k))?;
    if env.command == Command::Version {
        return Ok(Some(version::version_info(
            netconf::sniff_version(stdin).as_deref(),
        )));
    }
    let conf = NetConf::parse(stdin)?;
    logging::init(&conf);
    let span = tracing::info_span!(
        "cni",
        command = ?env.command,
        container_id = %env.container_id,
        ifname = %env.ifname
    );
    let _enter = span.enter();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .map_err(|e| CniError::netlink("building the runtime", e))?;
    tracing::debug!(
        us = t0.elapsed().as_micros(),
        "parsed, logging and runtime up"
    );
    rt.block_on(async {
        match env.command {
            Command::Add => {
                let result = cmd::add::run(&env, &conf).await?;
                let json = serde_json::to_value(result)
                    .map_err(|e| CniError::netlink("encoding the ADD result", e))?;
                Ok(Some(json))
            }
            Command::Del => cmd::del::run(&env, &conf).await.map(|()| None),
            Command::Check => cmd::check::run(&env, &conf).await.map(|()| None),
            Command::Status => cmd::status::status(&conf).await.map(|()| None),
            Command::Gc => cmd::status::gc(&conf).await.map(|()| None),
            Command::Version => unreachable!("handled before the config is parsed"),
        }
    })
}
