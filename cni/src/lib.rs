//! weft-cni: the CNI plugin. Parses and validates everything first, then talks to weft-manager
//! over its unix socket and plumbs the pod's veth with netlink (docs/ARCHITECTURE.md, "ADD"
//! and "DEL"). The binary (`main.rs`) is [`run`] plus printing; the library is what the fuzz
//! targets and property tests import.
#![warn(missing_docs)]

pub mod annotations;
pub mod cmd;
pub mod env;
pub mod error;
pub mod logging;
pub mod manager;
pub mod netconf;
pub mod netlink;
pub mod netns;
pub mod result;
pub mod revert;
pub mod version;

use env::{CniEnv, Command};
use error::CniError;
use netconf::NetConf;

/// Runs the command the environment names on the network configuration in `stdin`: the JSON
/// to print on success (`None` for commands that print nothing), or the error to report.
pub fn run(stdin: &[u8]) -> Result<Option<serde_json::Value>, CniError> {
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
