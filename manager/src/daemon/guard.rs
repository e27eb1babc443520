//! What the manager refuses at start, before it touches anything: directories other users
//! could write, a pin dir another manager holds, a socket path that is not a stale socket.
//! docs/OPERATIONS.md ("Trust model") explains each rule.

use nix::fcntl::{Flock, FlockArg};
use std::fs::File;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use tokio::net::UnixListener;
use weft_api::trust::{self, TrustError};

/// Start-up refusals; each says what to do.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    /// A directory on the way is not safe from other users.
    #[error("{what}: {source}")]
    Untrusted {
        /// Which setting.
        what: &'static str,
        /// Why.
        source: TrustError,
    },
    /// Another manager holds the pin dir.
    #[error(
        "another weft-manager already uses the pin dir {path} (it holds its lock): two managers on one datapath would delete each other's endpoints; stop it first, or give this one its own --bpffs"
    )]
    PinDirBusy {
        /// Pin dir.
        path: PathBuf,
    },
    /// The socket path is in use by a live manager.
    #[error(
        "{path} is the socket of a running weft-manager: stop it first, or pass another --socket"
    )]
    SocketInUse {
        /// Socket path.
        path: PathBuf,
    },
    /// The socket path names something that is not a socket.
    #[error(
        "--socket {path} exists and is {found}, not a stale socket: Weft removes only its own stale socket; choose another path"
    )]
    NotASocket {
        /// Socket path.
        path: PathBuf,
        /// What is there.
        found: &'static str,
    },
    /// A filesystem call failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// Path.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> GuardError + 'a {
    move |source| GuardError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

fn untrusted(what: &'static str) -> impl FnOnce(TrustError) -> GuardError {
    move |source| GuardError::Untrusted { what, source }
}

/// Creates `dir` (mode `mode`, parents 0755) unless it exists.
fn create_dir(dir: &Path, mode: u32, what: &'static str) -> Result<(), GuardError> {
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(parent)
            .map_err(io(what, parent))?;
    }
    match std::fs::DirBuilder::new().mode(mode).create(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(io(what, dir)(e)),
    }
}

/// The state dir: created 0700, inside a trusted chain; an existing one (and everything sled
/// keeps in it) loses its group/other bits, since the database holds every pod's identity.
pub fn secure_state_dir(dir: &Path) -> Result<(), GuardError> {
    const WHAT: &str = "--state-dir";
    create_dir(dir, 0o700, WHAT)?;
    trust::check_dir_chain(dir, trust::own_uid()).map_err(untrusted(WHAT))?;
    restrict(dir, 0)
}

fn restrict(path: &Path, depth: u8) -> Result<(), GuardError> {
    const WHAT: &str = "cannot restrict permissions of";
    let meta = std::fs::symlink_metadata(path).map_err(io(WHAT, path))?;
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    let mode = meta.permissions().mode() & 0o7777;
    let want = mode & 0o7700;
    if want != mode {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(want))
            .map_err(io(WHAT, path))?;
    }
    // sled keeps a flat dir with one level of blobs/; deeper trees are not ours.
    if meta.is_dir() && depth < 2 {
        for entry in std::fs::read_dir(path).map_err(io(WHAT, path))? {
            let entry = entry.map_err(io(WHAT, path))?;
            restrict(&entry.path(), depth + 1)?;
        }
    }
    Ok(())
}

/// Takes an exclusive, non-blocking `flock` on the pin dir itself (bpffs holds no regular
/// files, so the directory is the lock file). Held until the process exits, so a second manager
/// on the same maps is refused even after a crash leaves a stale socket behind.
pub fn lock_pin_dir(dir: &Path) -> Result<(), GuardError> {
    let file = File::open(dir).map_err(io("cannot open the pin dir", dir))?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => {
            // The kernel drops the lock when the process exits; nothing else may release it.
            Box::leak(Box::new(lock));
            Ok(())
        }
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Err(GuardError::PinDirBusy {
            path: dir.to_path_buf(),
        }),
        Err((_, errno)) => Err(io("cannot lock the pin dir", dir)(errno.into())),
    }
}

/// Checks the socket path before anything else is touched: its directory (created 0755 if
/// missing) must be safe from other users, and an existing path must be a stale socket.
/// Returns whether a stale socket is there.
pub fn check_socket(path: &Path) -> Result<bool, GuardError> {
    const WHAT: &str = "--socket";
    if let Some(dir) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_dir(dir, 0o755, "cannot create socket directory")?;
        trust::check_dir_chain(dir, trust::own_uid()).map_err(untrusted(WHAT))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(GuardError::SocketInUse {
                    path: path.to_path_buf(),
                });
            }
            Ok(true)
        }
        Ok(meta) => Err(GuardError::NotASocket {
            path: path.to_path_buf(),
            found: weft_api::trust::kind(&meta),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io("cannot inspect socket path", path)(e)),
    }
}

/// Binds the API socket (mode 0600) after [`check_socket`]; removes only a stale socket.
pub fn bind_socket(path: &Path) -> Result<UnixListener, GuardError> {
    if check_socket(path)? {
        std::fs::remove_file(path).map_err(io("cannot remove stale socket", path))?;
    }
    let listener = UnixListener::bind(path).map_err(io("cannot bind socket", path))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(io("cannot chmod socket", path))?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        d
    }

    #[tokio::test]
    async fn a_regular_file_at_the_socket_path_is_kept_and_refused() {
        let d = dir();
        let path = d.path().join("m.sock");
        std::fs::write(&path, b"precious").unwrap();
        let err = bind_socket(&path).unwrap_err();
        assert!(matches!(err, GuardError::NotASocket { .. }), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"precious");
    }

    #[tokio::test]
    async fn a_live_socket_is_refused_and_a_stale_one_replaced() {
        let d = dir();
        let path = d.path().join("m.sock");
        let live = std::os::unix::net::UnixListener::bind(&path).unwrap();
        assert!(matches!(
            bind_socket(&path),
            Err(GuardError::SocketInUse { .. })
        ));
        drop(live);
        bind_socket(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[tokio::test]
    async fn a_socket_dir_writable_by_others_is_refused() {
        let d = dir();
        let run = d.path().join("run");
        std::fs::create_dir(&run).unwrap();
        std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = bind_socket(&run.join("m.sock")).unwrap_err().to_string();
        assert!(err.contains("writable by other users"), "{err}");
        assert!(!run.join("m.sock").exists());
    }

    #[test]
    fn the_pin_dir_lock_is_exclusive() {
        let d = dir();
        lock_pin_dir(d.path()).unwrap();
        // flock locks belong to the open file description: a second open conflicts even in
        // this process, as a second manager's would.
        assert!(matches!(
            lock_pin_dir(d.path()),
            Err(GuardError::PinDirBusy { .. })
        ));
    }

    #[test]
    fn state_dir_and_its_files_become_private() {
        let d = dir();
        let state = d.path().join("state");
        std::fs::create_dir(&state).unwrap();
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(state.join("db"), b"x").unwrap();
        std::fs::set_permissions(state.join("db"), std::fs::Permissions::from_mode(0o644)).unwrap();
        secure_state_dir(&state).unwrap();
        let m = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(m(&state), 0o700);
        assert_eq!(m(&state.join("db")), 0o600);
    }
}
