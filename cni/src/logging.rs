//! tracing setup: `logFile` (append) or stderr. Never stdout: stdout carries the CNI result.

use crate::netconf::NetConf;
use std::sync::Mutex;
use weft_api::trust;

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
    // The plugin runs as root: a planted symlink or another user's file at `logFile` would make
    // root append to whatever it names. Neither is followed nor used; stderr gets the logs.
    match trust::open_append_owned(path, trust::own_uid()) {
        Ok(file) => builder.with_writer(Mutex::new(file)).init(),
        Err(e) => {
            builder.with_writer(std::io::stderr).init();
            tracing::warn!(log_file = %path.display(), error = %e, "refusing or unable to open logFile (it must be a regular file owned by root, not a symlink); logging to stderr");
        }
    }
}
