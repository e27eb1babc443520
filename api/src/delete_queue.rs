//! The durable delete queue (Cilium's `deletion_queue.go`): a DEL that cannot reach the manager
//! leaves a request here and succeeds; the manager drains the queue at start, before serving.
//!
//! Layout: `<dir of the manager socket>/delete-queue/`, one `<host ifname>.json` file per
//! (container id, ifname), written to a temp name and renamed so a reader never sees half a
//! request. Writers and the draining manager serialise on an `flock` of `.lock` in that dir.
//! The queue is bounded: when full, the DEL fails with "try again later" so the runtime retries.
//!
//! A queued request deletes a pod, so the queue trusts nothing it did not make: the dir is
//! created 0700 and must stay owned by the queue's user with no group/other bits, inside a
//! chain of directories no other user can write (see [`crate::trust`]); files are created with
//! `O_EXCL|O_NOFOLLOW` and read with `O_NOFOLLOW`, and a request not owned by that user is
//! moved aside unread.

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::naming;
use crate::trust::{self, TrustError};

/// Most requests the queue holds.
pub const MAX_ENTRIES: usize = 1024;

/// One queued DEL.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteRequest {
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
}

/// Queue failures.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// The queue holds [`MAX_ENTRIES`] requests already.
    #[error("delete queue {dir} is full ({MAX_ENTRIES} requests): start weft-manager so it drains")]
    Full {
        /// Queue dir.
        dir: PathBuf,
    },
    /// The queue dir (or a dir above it) could be written by another user.
    #[error("delete queue: {0}")]
    Untrusted(#[from] TrustError),
    /// Filesystem failure.
    #[error("delete queue {path}: {source}")]
    Io {
        /// Path involved.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> QueueError + '_ {
    move |source| QueueError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The queue next to a manager socket.
#[derive(Debug, Clone)]
pub struct DeleteQueue {
    dir: PathBuf,
    /// Who must own the dir and every request in it.
    owner: u32,
}

impl DeleteQueue {
    /// The queue belonging to the manager listening on `socket`.
    #[must_use]
    pub fn for_socket(socket: &Path) -> Self {
        let run_dir = socket.parent().unwrap_or_else(|| Path::new("/run/weft"));
        Self {
            dir: run_dir.join("delete-queue"),
            owner: trust::own_uid(),
        }
    }

    /// The same queue, trusting files owned by `uid` only (tests use it to play another user).
    #[must_use]
    pub fn owned_by(mut self, uid: u32) -> Self {
        self.owner = uid;
        self
    }

    /// Creates the dir (0700) or checks an existing one: owned by the queue's user, private,
    /// and inside directories no other user can write. The manager refuses to start otherwise.
    pub fn ensure_trusted(&self) -> Result<(), QueueError> {
        Ok(trust::ensure_private_dir(&self.dir, self.owner)?)
    }

    /// The queue directory.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn lock(&self) -> Result<Flock<File>, QueueError> {
        if let Some(run_dir) = self.dir.parent() {
            fs::create_dir_all(run_dir).map_err(io(run_dir))?;
        }
        self.ensure_trusted()?;
        let path = self.dir.join(".lock");
        let file = trust::open_lock_file(&path)?;
        Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, errno)| QueueError::Io {
            path,
            source: std::io::Error::from(errno),
        })
    }

    fn entries(&self) -> Result<Vec<PathBuf>, QueueError> {
        let mut out: Vec<PathBuf> = fs::read_dir(&self.dir)
            .map_err(io(&self.dir))?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .collect();
        out.sort();
        Ok(out)
    }

    /// Appends a request (a repeat for the same pair replaces the earlier one).
    pub fn push(&self, req: &DeleteRequest) -> Result<(), QueueError> {
        let _lock = self.lock()?;
        let name = format!(
            "{}.json",
            naming::host_ifname(&req.container_id, &req.ifname)
        );
        let path = self.dir.join(&name);
        if !path.exists() && self.entries()?.len() >= MAX_ENTRIES {
            return Err(QueueError::Full {
                dir: self.dir.clone(),
            });
        }
        let tmp = self.dir.join(format!(".{name}.tmp"));
        // A leftover from a crash: unlink never follows a symlink, and the O_EXCL create below
        // refuses anything that reappears.
        match fs::remove_file(&tmp) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(&tmp)(e)),
        }
        let mut f = trust::create_new_private(&tmp)?;
        let bytes = serde_json::to_vec(req).map_err(|e| io(&tmp)(std::io::Error::other(e)))?;
        f.write_all(&bytes).map_err(io(&tmp))?;
        // The DEL reports success only once the request is on disk.
        f.sync_all().map_err(io(&tmp))?;
        fs::rename(&tmp, &path).map_err(io(&path))?;
        Ok(())
    }

    /// Removes and returns the request for (container id, ifname), if one is queued: the
    /// manager applies it before allocating for the same pair, so a DEL queued before an ADD
    /// can never remove what that ADD creates.
    pub fn take(&self, container_id: &str, ifname: &str) -> Result<bool, QueueError> {
        let path = self.dir.join(format!(
            "{}.json",
            naming::host_ifname(container_id, ifname)
        ));
        if !path.exists() {
            return Ok(false);
        }
        let _lock = self.lock()?;
        match fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io(&path)(e)),
        }
    }

    /// Hands every queued request to `handle`, removing each one `handle` accepts. Requests that
    /// do not parse are moved aside (`.bad`) and reported in the returned list.
    pub fn drain(
        &self,
        mut handle: impl FnMut(&DeleteRequest) -> bool,
    ) -> Result<DrainReport, QueueError> {
        let _lock = self.lock()?;
        let mut report = DrainReport::default();
        for path in self.entries()? {
            let parsed = self.read_request(&path);
            let Some(req) = parsed else {
                let bad = path.with_extension("bad");
                fs::rename(&path, &bad).map_err(io(&path))?;
                report.corrupt.push(bad);
                continue;
            };
            if handle(&req) {
                fs::remove_file(&path).map_err(io(&path))?;
                report.done.push(req);
            } else {
                report.kept += 1;
            }
        }
        Ok(report)
    }

    /// A request written by the queue's user, or None (a symlink, another user's file, or not
    /// a request): never followed, never trusted.
    fn read_request(&self, path: &Path) -> Option<DeleteRequest> {
        use std::io::Read;
        let mut file = trust::open_owned_regular(path, self.owner).ok()?;
        let mut bytes = Vec::new();
        // Requests are ~100 bytes; a large file is not one.
        (&mut file).take(64 * 1024).read_to_end(&mut bytes).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// The requests waiting that parse and are trusted, left in the queue (a later
    /// [`Self::drain`] completes them).
    pub fn pending(&self) -> Result<Vec<DeleteRequest>, QueueError> {
        if !self.dir.exists() {
            return Ok(Vec::new());
        }
        let _lock = self.lock()?;
        Ok(self
            .entries()?
            .iter()
            .filter_map(|path| self.read_request(path))
            .collect())
    }

    /// Requests waiting.
    pub fn len(&self) -> Result<usize, QueueError> {
        if !self.dir.exists() {
            return Ok(0);
        }
        Ok(self.entries()?.len())
    }

    /// True when nothing waits.
    pub fn is_empty(&self) -> Result<bool, QueueError> {
        Ok(self.len()? == 0)
    }
}

/// What a drain did.
#[derive(Debug, Default)]
pub struct DrainReport {
    /// Requests handled and removed.
    pub done: Vec<DeleteRequest>,
    /// Requests the handler could not complete (left for the next drain).
    pub kept: usize,
    /// Files that did not parse, moved aside.
    pub corrupt: Vec<PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue() -> (tempdir::Dir, DeleteQueue) {
        let d = tempdir::Dir::new();
        let q = DeleteQueue::for_socket(&d.0.join("manager.sock"));
        (d, q)
    }

    mod tempdir {
        pub struct Dir(pub std::path::PathBuf);
        impl Dir {
            pub fn new() -> Self {
                let p = std::env::temp_dir().join(format!(
                    "weft-dq-{}-{:?}",
                    std::process::id(),
                    std::thread::current().id()
                ));
                let _ = std::fs::remove_dir_all(&p);
                std::fs::create_dir_all(&p).unwrap();
                // Whatever the umask, the run dir must not be writable by others.
                std::fs::set_permissions(
                    &p,
                    <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755),
                )
                .unwrap();
                Self(p)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    fn req(c: &str) -> DeleteRequest {
        DeleteRequest {
            container_id: c.into(),
            ifname: "eth0".into(),
        }
    }

    #[test]
    fn push_then_drain_round_trips_and_dedups() {
        let (_d, q) = queue();
        q.push(&req("a")).unwrap();
        q.push(&req("a")).unwrap();
        q.push(&req("b")).unwrap();
        assert_eq!(q.len().unwrap(), 2);
        let mut seen = vec![];
        let r = q
            .drain(|r| {
                seen.push(r.container_id.clone());
                r.container_id == "a"
            })
            .unwrap();
        assert_eq!(r.done, vec![req("a")]);
        assert_eq!(r.kept, 1);
        assert_eq!(seen.len(), 2);
        assert_eq!(q.len().unwrap(), 1, "b stays for the next drain");
    }

    #[test]
    fn pending_lists_without_removing() {
        let (_d, q) = queue();
        assert!(q.pending().unwrap().is_empty());
        q.push(&req("a")).unwrap();
        q.push(&req("b")).unwrap();
        let mut ids: Vec<String> = q
            .pending()
            .unwrap()
            .into_iter()
            .map(|r| r.container_id)
            .collect();
        ids.sort();
        assert_eq!(ids, ["a", "b"]);
        assert_eq!(q.len().unwrap(), 2, "still queued");
    }

    #[test]
    fn take_removes_only_that_pair() {
        let (_d, q) = queue();
        q.push(&req("a")).unwrap();
        q.push(&req("b")).unwrap();
        assert!(q.take("a", "eth0").unwrap());
        assert!(!q.take("a", "eth0").unwrap());
        assert_eq!(q.len().unwrap(), 1);
    }

    #[test]
    fn corrupt_entries_are_moved_aside() {
        let (_d, q) = queue();
        q.push(&req("a")).unwrap();
        std::fs::write(q.dir().join("zzz.json"), b"{nope").unwrap();
        let r = q.drain(|_| true).unwrap();
        assert_eq!(r.done.len(), 1);
        assert_eq!(r.corrupt.len(), 1);
        assert!(q.is_empty().unwrap());
    }

    #[test]
    fn a_full_queue_refuses_new_requests() {
        let (_d, q) = queue();
        q.ensure_trusted().unwrap();
        for i in 0..MAX_ENTRIES {
            std::fs::write(q.dir().join(format!("f{i}.json")), b"{}").unwrap();
        }
        assert!(matches!(q.push(&req("x")), Err(QueueError::Full { .. })));
    }

    #[test]
    fn a_planted_tmp_symlink_is_not_followed() {
        let (d, q) = queue();
        q.ensure_trusted().unwrap();
        let victim = d.0.join("victim");
        std::fs::write(&victim, b"root only").unwrap();
        let name = naming::host_ifname("a", "eth0");
        std::os::unix::fs::symlink(&victim, q.dir().join(format!(".{name}.json.tmp"))).unwrap();
        q.push(&req("a")).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"root only");
        assert_eq!(q.len().unwrap(), 1);
    }

    #[test]
    fn requests_of_another_owner_or_symlinks_are_moved_aside_unread() {
        let (d, q) = queue();
        q.push(&req("a")).unwrap();
        let forged_target = d.0.join("forged");
        std::fs::write(&forged_target, serde_json::to_vec(&req("b")).unwrap()).unwrap();
        std::os::unix::fs::symlink(&forged_target, q.dir().join("zz-link.json")).unwrap();
        // Played as another user: our own files now look foreign.
        let foreign = q.clone().owned_by(trust::own_uid() + 1);
        // The dir itself is not that user's: refused outright.
        assert!(matches!(
            foreign.drain(|_| true),
            Err(QueueError::Untrusted(TrustError::Owner { .. }))
        ));
        let r = q.drain(|_| true).unwrap();
        assert_eq!(
            r.done,
            vec![req("a")],
            "the symlinked request is never handled"
        );
        assert_eq!(r.corrupt.len(), 1);
    }

    #[test]
    fn a_queue_dir_open_to_others_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let (d, q) = queue();
        q.ensure_trusted().unwrap();
        std::fs::set_permissions(q.dir(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = q.push(&req("a")).unwrap_err().to_string();
        assert!(err.contains("must be private"), "{err}");
        std::fs::set_permissions(q.dir(), std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::set_permissions(&d.0, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = q.push(&req("a")).unwrap_err().to_string();
        assert!(err.contains("writable by other users"), "{err}");
        assert!(q.is_empty().unwrap());
    }
}
