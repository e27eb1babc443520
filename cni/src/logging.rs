//! tracing setup: `logFile` (append) or stderr. Never stdout: stdout carries the CNI result.

use crate::netconf::NetConf;
use std::fs::OpenOptions;
use std::sync::Mutex;

/// Installs the global subscriber for this process.
pub fn init(conf: &NetConf) {
    let builder = tracing_subscriber::fmt()
        .with_max_level(conf.log_level)
        .with_ansi(false)
        .with_target(false);
    let Some(path) = &conf.log_file else {
        builder.with_writer(std::io::stderr).init();
        return;
    };
    match OpenOptions::new().create(true).append(true).open(path) {
        Ok(file) => builder.with_writer(Mutex::new(file)).init(),
        Err(e) => {
            builder.with_writer(std::io::stderr).init();
            tracing::warn!(log_file = %path.display(), error = %e, "cannot open logFile; logging to stderr");
        }
    }
}
