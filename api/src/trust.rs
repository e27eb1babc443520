//! Which directories Weft may trust with its socket, delete queue and pin-dir lock.
//!
//! Weft's files are written and read by root (the manager, the CNI plugin). A directory is
//! trusted when no other user can create, replace or rename entries in it: it is owned by root
//! (or by the user Weft runs as) and is writable by nobody else — or, like `/tmp`, carries the
//! sticky bit, so others cannot rename or remove what they do not own. Every ancestor must pass
//! too: a hostile user who may rename `/srv/x` can swap the whole subtree under it.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Why a path is not trusted.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    /// Owned by a user other than root or the one Weft runs as.
    #[error(
        "{path} is owned by uid {uid}, not by root (or uid {expected}): another user could plant or replace Weft's files there; chown it to root or choose a root-owned directory"
    )]
    Owner {
        /// Path checked.
        path: PathBuf,
        /// Its owner.
        uid: u32,
        /// The uid Weft runs as.
        expected: u32,
    },
    /// Writable by others without the sticky bit.
    #[error(
        "{path} (mode {mode:04o}) is writable by other users and has no sticky bit: they could replace Weft's files there; chmod go-w it (or +t), or choose a root-owned 0755 directory"
    )]
    Writable {
        /// Path checked.
        path: PathBuf,
        /// Its mode bits.
        mode: u32,
    },
    /// A private directory readable or writable by others.
    #[error(
        "{path} (mode {mode:04o}) must be private to root (0700): other users could read or plant requests; chmod 0700 it"
    )]
    NotPrivate {
        /// Path checked.
        path: PathBuf,
        /// Its mode bits.
        mode: u32,
    },
    /// A symlink, or not the kind of file expected.
    #[error("{path} is {found}, expected {expected}: refusing to follow or reuse it")]
    Kind {
        /// Path checked.
        path: PathBuf,
        /// What it is.
        found: &'static str,
        /// What it should be.
        expected: &'static str,
    },
    /// A filesystem call failed.
    #[error("{path}: {source}")]
    Io {
        /// Path.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TrustError + '_ {
    move |source| TrustError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The uid Weft's own files belong to: the effective uid of this process.
#[must_use]
pub fn own_uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// What kind of file `meta` describes, for error messages ("a symlink", "a directory", ...).
#[must_use]
pub fn kind(meta: &std::fs::Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_symlink() {
        "a symlink"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_file() {
        "a regular file"
    } else {
        "a special file"
    }
}

/// Checks that `dir` and each of its ancestors are owned by root or `uid` and not writable by
/// others unless sticky. `dir` itself must be a real directory, not a symlink.
pub fn check_dir_chain(dir: &Path, uid: u32) -> Result<(), TrustError> {
    let abs = if dir.is_absolute() {
        dir.to_path_buf()
    } else {
        std::env::current_dir().map_err(io(dir))?.join(dir)
    };
    let leaf = std::fs::symlink_metadata(&abs).map_err(io(&abs))?;
    if !leaf.is_dir() {
        return Err(TrustError::Kind {
            path: abs,
            found: kind(&leaf),
            expected: "a directory",
        });
    }
    for d in abs.ancestors() {
        // Ancestors may be symlinks (e.g. /var/run -> /run); their targets are what count.
        let meta = std::fs::metadata(d).map_err(io(d))?;
        let owner = meta.uid();
        if owner != 0 && owner != uid {
            return Err(TrustError::Owner {
                path: d.to_path_buf(),
                uid: owner,
                expected: uid,
            });
        }
        let mode = meta.mode() & 0o7777;
        if mode & 0o022 != 0 && mode & 0o1000 == 0 {
            return Err(TrustError::Writable {
                path: d.to_path_buf(),
                mode,
            });
        }
    }
    Ok(())
}

/// Creates (mode 0700) or checks a private directory: a real directory owned by `uid`, with no
/// group or other permissions, inside a trusted chain.
pub fn ensure_private_dir(dir: &Path, uid: u32) -> Result<(), TrustError> {
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        check_dir_chain(parent, uid)?;
    }
    match std::fs::DirBuilder::new()
        .mode(0o700)
        .create(dir)
        .map_err(io(dir))
    {
        Ok(()) => {}
        Err(TrustError::Io { source, .. })
            if source.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    check_private_dir(dir, uid)
}

/// Refuses `path` unless it is of the expected kind (`is_expected`) and owned by `uid`.
fn kind_and_owner(
    path: &Path,
    meta: &std::fs::Metadata,
    is_expected: bool,
    expected: &'static str,
    uid: u32,
) -> Result<(), TrustError> {
    if !is_expected {
        return Err(TrustError::Kind {
            path: path.to_path_buf(),
            found: kind(meta),
            expected,
        });
    }
    if meta.uid() != uid {
        return Err(TrustError::Owner {
            path: path.to_path_buf(),
            uid: meta.uid(),
            expected: uid,
        });
    }
    Ok(())
}

/// Checks an existing private directory (see [`ensure_private_dir`]).
pub fn check_private_dir(dir: &Path, uid: u32) -> Result<(), TrustError> {
    let meta = std::fs::symlink_metadata(dir).map_err(io(dir))?;
    kind_and_owner(dir, &meta, meta.is_dir(), "a directory", uid)?;
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(TrustError::NotPrivate {
            path: dir.to_path_buf(),
            mode,
        });
    }
    Ok(())
}

/// Opens an existing regular file for reading without following a symlink, and checks it is
/// owned by `uid`.
pub fn open_owned_regular(path: &Path, uid: u32) -> Result<File, TrustError> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc_o_nofollow())
        .open(path)
        .map_err(|e| nofollow_error(path, e))?;
    let meta = file.metadata().map_err(io(path))?;
    kind_and_owner(path, &meta, meta.is_file(), "a regular file", uid)?;
    Ok(file)
}

/// Opens `path` for appending (created 0600 if missing) without following a symlink; an
/// existing file must be a regular file owned by `uid`. For log files a user may name.
pub fn open_append_owned(path: &Path, uid: u32) -> Result<File, TrustError> {
    let file = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc_o_nofollow())
        .open(path)
        .map_err(|e| nofollow_error(path, e))?;
    let meta = file.metadata().map_err(io(path))?;
    if !meta.is_file() {
        return Err(TrustError::Kind {
            path: path.to_path_buf(),
            found: kind(&meta),
            expected: "a regular file",
        });
    }
    if meta.uid() != uid && meta.uid() != 0 {
        return Err(TrustError::Owner {
            path: path.to_path_buf(),
            uid: meta.uid(),
            expected: uid,
        });
    }
    Ok(file)
}

/// Creates a new file 0600 with `O_EXCL|O_NOFOLLOW`: never reuses or follows what is there.
pub fn create_new_private(path: &Path) -> Result<File, TrustError> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc_o_nofollow())
        .open(path)
        .map_err(io(path))
}

/// Opens (creating 0600) a lock file without following a symlink.
pub fn open_lock_file(path: &Path) -> Result<File, TrustError> {
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc_o_nofollow())
        .open(path)
        .map_err(|e| nofollow_error(path, e))?;
    let meta = file.metadata().map_err(io(path))?;
    if !meta.is_file() {
        return Err(TrustError::Kind {
            path: path.to_path_buf(),
            found: kind(&meta),
            expected: "a regular file",
        });
    }
    Ok(file)
}

fn libc_o_nofollow() -> i32 {
    nix::fcntl::OFlag::O_NOFOLLOW.bits()
}

/// `O_NOFOLLOW` on a symlink fails with ELOOP: say what it was.
fn nofollow_error(path: &Path, e: std::io::Error) -> TrustError {
    if e.raw_os_error() == Some(nix::errno::Errno::ELOOP as i32) {
        TrustError::Kind {
            path: path.to_path_buf(),
            found: "a symlink",
            expected: "a regular file",
        }
    } else {
        TrustError::Io {
            path: path.to_path_buf(),
            source: e,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn tmp(tag: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("weft-trust-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::DirBuilder::new().mode(0o755).create(&p).unwrap();
        p
    }

    #[test]
    fn world_writable_without_sticky_is_refused_with_sticky_accepted() {
        let d = tmp("ww");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = check_dir_chain(d.join("x").parent().unwrap(), own_uid());
        assert!(matches!(err, Err(TrustError::Writable { .. })), "{err:?}");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777)).unwrap();
        check_dir_chain(&d, own_uid()).unwrap();
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn private_dir_must_be_0700_and_ours() {
        let d = tmp("priv");
        let q = d.join("q");
        ensure_private_dir(&q, own_uid()).unwrap();
        assert_eq!(
            std::fs::metadata(&q).unwrap().permissions().mode() & 0o777,
            0o700
        );
        std::fs::set_permissions(&q, std::fs::Permissions::from_mode(0o733)).unwrap();
        assert!(matches!(
            ensure_private_dir(&q, own_uid()),
            Err(TrustError::NotPrivate { .. })
        ));
        std::fs::set_permissions(&q, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(matches!(
            ensure_private_dir(&q, own_uid() + 1),
            Err(TrustError::Owner { .. })
        ));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn symlinks_are_never_followed() {
        let d = tmp("link");
        let target = d.join("target");
        std::fs::write(&target, b"precious").unwrap();
        let link = d.join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(create_new_private(&link).is_err());
        assert!(matches!(
            open_append_owned(&link, own_uid()),
            Err(TrustError::Kind {
                found: "a symlink",
                ..
            })
        ));
        assert!(open_owned_regular(&link, own_uid()).is_err());
        assert!(open_lock_file(&link).is_err());
        assert_eq!(std::fs::read(&target).unwrap(), b"precious");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
