//! Undo stack for ADD: every step that changed something pushes its undo; success disarms it.
//!
//! Dropping an armed stack (an error return, `?`, or a panic) undoes everything in reverse order.
//! Drop cannot await, so the undo runs on a fresh thread with its own runtime and netlink socket;
//! threads inherit the spawner's netns, which is the node netns here.

use crate::error::CniError;
use crate::{manager, netlink};
use std::path::PathBuf;
use weft_api::client::Client;

/// One thing to undo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Undo {
    /// Release the endpoint and its IPs.
    Release {
        /// Container id.
        container_id: String,
        /// Interface name.
        ifname: String,
    },
    /// Delete the host veth (which takes the pod end, routes and neighbours along).
    DeleteLink(String),
}

/// Armed until [`RevertStack::disarm`].
#[derive(Debug)]
pub struct RevertStack {
    socket: PathBuf,
    undo: Vec<Undo>,
}

impl RevertStack {
    /// An empty stack; `socket` is the manager to release through.
    #[must_use]
    pub fn new(socket: PathBuf) -> Self {
        Self {
            socket,
            undo: Vec::new(),
        }
    }

    /// Records an undo step.
    pub fn push(&mut self, undo: Undo) {
        self.undo.push(undo);
    }

    /// Success: keep everything.
    pub fn disarm(mut self) {
        self.undo.clear();
    }

    async fn unwind(socket: PathBuf, undo: Vec<Undo>) {
        let client = Client::new(socket);
        let mut nl = None;
        for step in undo.into_iter().rev() {
            let result = match &step {
                Undo::Release {
                    container_id,
                    ifname,
                } => manager::delete(&client, container_id, ifname)
                    .await
                    .map(drop),
                Undo::DeleteLink(name) => {
                    if nl.is_none() {
                        nl = netlink::connect().ok();
                    }
                    match &nl {
                        Some(h) => netlink::veth::delete(h, name).await.map(drop),
                        None => Err(CniError::netlink("reverting", "no netlink socket")),
                    }
                }
            };
            match result {
                Ok(()) => tracing::info!(?step, "reverted"),
                Err(e) => tracing::error!(?step, error = %e, "revert failed"),
            }
        }
    }
}

impl Drop for RevertStack {
    fn drop(&mut self) {
        if self.undo.is_empty() {
            return;
        }
        let undo = std::mem::take(&mut self.undo);
        let socket = self.socket.clone();
        let run = move || match tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
        {
            Ok(rt) => rt.block_on(Self::unwind(socket, undo)),
            Err(e) => tracing::error!(error = %e, "cannot build a runtime to revert"),
        };
        // Joining blocks the caller's runtime on purpose: the process must not print its result
        // and exit before the revert is done.
        if let Err(e) = std::thread::Builder::new()
            .name("weft-revert".into())
            .spawn(run)
            .map(std::thread::JoinHandle::join)
        {
            tracing::error!(error = %e, "cannot spawn the revert thread");
        }
    }
}
