//! Entering a network namespace, only ever through an RAII guard on a dedicated thread.
//!
//! `setns(CLONE_NEWNET)` switches the calling *thread*. A netlink socket stays bound to the netns
//! it was created in, so the pod side opens its own socket after entering. The thread is spawned
//! for one job and never reused, so a failed restore cannot leak the pod netns into later work.

use crate::error::CniError;
use nix::sched::{CloneFlags, setns};
use std::fs::File;
use std::marker::PhantomData;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use tokio::sync::oneshot;

/// `CLONE_NEWNET`, as `NS_GET_NSTYPE` reports a network namespace.
const CLONE_NEWNET: i32 = nix::sched::CloneFlags::CLONE_NEWNET.bits();

nix::ioctl_none!(
    /// `NS_GET_NSTYPE` = `_IO(0xb7, 0x3)`, include/uapi/linux/nsfs.h.
    ns_get_nstype,
    0xb7,
    0x3
);

/// Opens `CNI_NETNS` and checks it is a network namespace other than the plugin's own. A
/// regular file or directory (not a netns) and the node's own netns (by device and inode:
/// `/proc/self/ns/net`, `/proc/1/ns/net`, a bind mount of either) are refused with code 4,
/// before anything is touched: configuring the node as a pod would put `eth0`, the pod IP and
/// a default route on the node itself.
pub fn open_pod_netns(path: &Path) -> Result<File, CniError> {
    let shown = path.display();
    let file = File::open(path)
        .map_err(|e| CniError::InvalidEnv(format!("cannot open CNI_NETNS {shown}: {e}")))?;
    let fs = nix::sys::statfs::fstatfs(&file)
        .map_err(|e| CniError::InvalidEnv(format!("cannot inspect CNI_NETNS {shown}: {e}")))?;
    if fs.filesystem_type() != nix::sys::statfs::NSFS_MAGIC {
        return Err(CniError::InvalidEnv(format!(
            "CNI_NETNS {shown} is not a network namespace (a netns is /proc/PID/ns/net or a bind mount of one, e.g. /run/netns/NAME)"
        )));
    }
    // nsfs holds every namespace type: a UTS or mount namespace is not a pod's netns.
    // SAFETY: NS_GET_NSTYPE takes no argument and only reads the fd, which `file` keeps open.
    let nstype = unsafe { ns_get_nstype(file.as_raw_fd()) };
    if nstype != Ok(CLONE_NEWNET) {
        return Err(CniError::InvalidEnv(format!(
            "CNI_NETNS {shown} is a namespace but not a network namespace"
        )));
    }
    let own = std::fs::metadata("/proc/thread-self/ns/net")
        .map_err(|e| CniError::netlink("inspecting /proc/thread-self/ns/net", e))?;
    let target = file
        .metadata()
        .map_err(|e| CniError::InvalidEnv(format!("cannot inspect CNI_NETNS {shown}: {e}")))?;
    if (target.dev(), target.ino()) == (own.dev(), own.ino()) {
        return Err(CniError::InvalidEnv(format!(
            "CNI_NETNS {shown} is the plugin's own network namespace (the node's): refusing to configure the node as a pod"
        )));
    }
    Ok(file)
}

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
    #[allow(clippy::panic)] // Deliberate: a thread left in the pod netns must die (see below).
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
    spawn_in_netns(netns, move |_: oneshot::Receiver<()>| job())?
        .run(())
        .await
}

/// A job running on its own thread inside a netns, to be handed its input later: the thread's
/// start, the `setns` and whatever the job prepares before awaiting its input (a runtime, a
/// netlink socket) overlap the caller's work meanwhile. Dropped without [`Worker::run`], the
/// job sees its input channel closed and ends (restoring the thread's netns first, as always).
pub struct Worker<I, T> {
    input: oneshot::Sender<I>,
    output: oneshot::Receiver<Result<T, CniError>>,
    thread: std::thread::JoinHandle<()>,
}

/// Starts `job` on a fresh thread inside the netns `netns`; it gets its input's receiver.
pub fn spawn_in_netns<I, T, F>(netns: File, job: F) -> Result<Worker<I, T>, CniError>
where
    I: Send + 'static,
    T: Send + 'static,
    F: FnOnce(oneshot::Receiver<I>) -> Result<T, CniError> + Send + 'static,
{
    let (input, input_rx) = oneshot::channel();
    let (tx, output) = oneshot::channel();
    let thread = std::thread::Builder::new()
        .name("weft-netns".into())
        .spawn(move || {
            let result = NetnsGuard::enter(&netns).and_then(|guard| {
                let r = job(input_rx);
                // Restore before reporting: if restoring panics, tx is dropped unsent.
                drop(guard);
                r
            });
            let _ = tx.send(result);
        })
        .map_err(|e| CniError::netlink("spawning the netns thread", e))?;
    Ok(Worker {
        input,
        output,
        thread,
    })
}

impl<I, T> Worker<I, T> {
    /// The error of a job that ended before it was handed its input (e.g. `setns` refused),
    /// once the thread has reported it.
    pub async fn failure(&mut self) -> CniError {
        match (&mut self.output).await {
            Ok(Err(e)) => e,
            _ => CniError::netlink(
                "pod netns thread",
                "ended early without an error (panic, or netns restore failed)",
            ),
        }
    }

    /// Hands the job its input; resolves with its result once the thread is done.
    pub async fn run(self, input: I) -> Result<T, CniError> {
        // A job that failed before taking its input (setns refused) has dropped the receiver;
        // its error is in `output`.
        let _ = self.input.send(input);
        let result = self.output.await.map_err(|_| {
            CniError::netlink(
                "pod netns thread",
                "died before reporting (panic, or netns restore failed)",
            )
        })?;
        // The thread has sent its result and is ending; joining only reaps it.
        let _ = self.thread.join();
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plugins_own_netns_is_refused() {
        for p in ["/proc/self/ns/net", "/proc/thread-self/ns/net"] {
            let err = open_pod_netns(Path::new(p)).unwrap_err();
            assert_eq!(err.code(), 4, "{p}: {err}");
            assert!(err.to_string().contains("own network namespace"), "{err}");
        }
    }

    #[test]
    fn files_and_directories_are_not_netns() {
        for p in ["/etc", "/etc/hostname", "/proc/self/ns/uts"] {
            let err = open_pod_netns(Path::new(p)).unwrap_err();
            assert_eq!(err.code(), 4, "{p}: {err}");
        }
        let err = open_pod_netns(Path::new("/etc")).unwrap_err().to_string();
        assert!(err.contains("not a network namespace"), "{err}");
    }
}
