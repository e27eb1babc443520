//! Entering a network namespace, only ever through an RAII guard on a dedicated thread.
//!
//! `setns(CLONE_NEWNET)` switches the calling *thread*. A netlink socket stays bound to the netns
//! it was created in, so the pod side opens its own socket after entering. The thread is spawned
//! for one job and never reused, so a failed restore cannot leak the pod netns into later work.

use crate::error::CniError;
use nix::sched::{CloneFlags, setns};
use std::fs::File;
use std::marker::PhantomData;
use std::os::fd::AsFd;

/// While alive, the current thread is in another netns; Drop puts it back.
pub struct NetnsGuard {
    original: File,
    // A raw pointer makes the guard !Send: the restore must happen on the thread that entered.
    _not_send: PhantomData<*const ()>,
}

impl NetnsGuard {
    /// Moves the current thread into `target`.
    pub fn enter(target: impl AsFd) -> Result<Self, CniError> {
        // thread-self, not self: /proc/self/ns/net is the main thread's netns, which differs from
        // this thread's if anything else ever entered a netns.
        let original = File::open("/proc/thread-self/ns/net")
            .map_err(|e| CniError::netlink("opening /proc/thread-self/ns/net", e))?;
        setns(target, CloneFlags::CLONE_NEWNET)
            .map_err(|e| CniError::netlink("entering the pod netns", e))?;
        Ok(Self {
            original,
            _not_send: PhantomData,
        })
    }
}

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        if let Err(e) = setns(self.original.as_fd(), CloneFlags::CLONE_NEWNET) {
            // The thread is stuck in the pod netns: it must not run anything else. Unwinding ends
            // it (the spawner sees a dead thread); during an unwind already, abort.
            if std::thread::panicking() {
                std::process::abort();
            }
            panic!("cannot restore the original netns ({e}); killing this thread");
        }
    }
}

/// Runs `job` on a fresh thread inside the netns `netns`; resolves when the thread is done.
pub async fn run_in_netns<T, F>(netns: File, job: F) -> Result<T, CniError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, CniError> + Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("weft-netns".into())
        .spawn(move || {
            let result = NetnsGuard::enter(&netns).and_then(|guard| {
                let r = job();
                // Restore before reporting: if restoring panics, tx is dropped unsent.
                drop(guard);
                r
            });
            let _ = tx.send(result);
        })
        .map_err(|e| CniError::netlink("spawning the netns thread", e))?;
    let result = rx.await.map_err(|_| {
        CniError::netlink(
            "pod netns thread",
            "died before reporting (panic, or netns restore failed)",
        )
    })?;
    // The thread has sent its result and is ending; joining only reaps it.
    let _ = spawned.join();
    result
}
