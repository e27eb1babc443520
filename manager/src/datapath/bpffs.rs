//! Making sure the pin directory is on a bpffs.

use super::error::DatapathError;
use std::path::Path;

fn is_bpffs(path: &Path) -> Result<bool, nix::Error> {
    let st = nix::sys::statfs::statfs(path)?;
    Ok(st.filesystem_type() == nix::sys::statfs::BPF_FS_MAGIC)
}

/// Creates `dir` and mounts a bpffs on it unless it already lies on one (e.g. under
/// /sys/fs/bpf). Each bpffs mount is a separate instance, so an existing mount is always reused
/// rather than stacking a new one that would hide the pins below it.
pub(crate) fn ensure(dir: &Path) -> Result<(), DatapathError> {
    let err = |source: std::io::Error| DatapathError::Bpffs {
        path: dir.to_owned(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(err)?;
    if is_bpffs(dir).map_err(|e| err(e.into()))? {
        return Ok(());
    }
    nix::mount::mount(
        Some("bpf"),
        dir,
        Some("bpf"),
        nix::mount::MsFlags::empty(),
        Some("mode=0700"),
    )
    .map_err(|e| err(e.into()))
}
