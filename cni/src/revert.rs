//! Undo stack for ADD: every step that changed something pushes its undo; success disarms it.
//!
//! Dropping an armed stack (an error return, `?`, or a panic) undoes everything in reverse order,
//! so no failure path can forget a step (ptp's deferred `if err != nil` cleanup leaks the IP on
//! two of its paths).

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

/// Carries out undo steps, already in the order to run them.
pub trait Unwinder {
    /// Runs every step, best effort, logging failures.
    fn unwind(self, steps: Vec<Undo>);
}

/// Armed until [`RevertStack::disarm`].
#[derive(Debug)]
pub struct RevertStack<U: Unwinder> {
    unwinder: Option<U>,
    undo: Vec<Undo>,
}

impl<U: Unwinder> RevertStack<U> {
    /// An empty stack.
    pub fn new(unwinder: U) -> Self {
        Self {
            unwinder: Some(unwinder),
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
}

impl<U: Unwinder> Drop for RevertStack<U> {
    fn drop(&mut self) {
        if self.undo.is_empty() {
            return;
        }
        let mut steps = std::mem::take(&mut self.undo);
        steps.reverse();
        if let Some(u) = self.unwinder.take() {
            u.unwind(steps);
        }
    }
}

/// The real unwinder: the manager for releases, netlink in the node netns for links.
///
/// Drop cannot await, so it runs on a fresh thread with its own runtime; a new thread starts in
/// its spawner's netns, the node netns here.
#[derive(Debug)]
pub struct Node {
    /// Manager socket.
    pub socket: PathBuf,
}

impl Unwinder for Node {
    fn unwind(self, steps: Vec<Undo>) {
        let run = move || match tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
        {
            Ok(rt) => rt.block_on(unwind(self.socket, steps)),
            Err(e) => tracing::error!(error = %e, "cannot build a runtime to revert"),
        };
        // Joining blocks the caller's runtime on purpose: the process must not report and exit
        // before the revert is done.
        if let Err(e) = std::thread::Builder::new()
            .name("weft-revert".into())
            .spawn(run)
            .map(std::thread::JoinHandle::join)
        {
            tracing::error!(error = %e, "cannot spawn the revert thread");
        }
    }
}

async fn unwind(socket: PathBuf, steps: Vec<Undo>) {
    let client = Client::new(socket);
    let mut nl = None;
    for step in steps {
        let result = match &step {
            Undo::Release {
                container_id,
                ifname,
            } => manager::release_or_queue(&client, container_id, ifname)
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Record(Arc<Mutex<Vec<Vec<Undo>>>>);

    impl Unwinder for Record {
        fn unwind(self, steps: Vec<Undo>) {
            self.0.lock().unwrap().push(steps);
        }
    }

    fn steps() -> (Undo, Undo) {
        (
            Undo::Release {
                container_id: "c".into(),
                ifname: "eth0".into(),
            },
            Undo::DeleteLink("weftx".into()),
        )
    }

    #[test]
    fn dropped_armed_unwinds_in_reverse() {
        let rec = Record::default();
        let (release, link) = steps();
        {
            let mut s = RevertStack::new(rec.clone());
            s.push(release.clone());
            s.push(link.clone());
        }
        assert_eq!(*rec.0.lock().unwrap(), vec![vec![link, release]]);
    }

    #[test]
    fn disarmed_does_nothing() {
        let rec = Record::default();
        let mut s = RevertStack::new(rec.clone());
        s.push(steps().0);
        s.disarm();
        assert!(rec.0.lock().unwrap().is_empty());
    }

    #[test]
    fn empty_stack_calls_nothing() {
        let rec = Record::default();
        drop(RevertStack::new(rec.clone()));
        assert!(rec.0.lock().unwrap().is_empty());
    }

    #[test]
    fn panic_unwinds_too() {
        let rec = Record::default();
        let r2 = rec.clone();
        let res = std::panic::catch_unwind(move || {
            let mut s = RevertStack::new(r2);
            s.push(steps().0);
            panic!("boom");
        });
        assert!(res.is_err());
        assert_eq!(rec.0.lock().unwrap().len(), 1);
    }
}
