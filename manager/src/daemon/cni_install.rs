//! Installing Weft as the node's CNI (`--install-cni-bin DIR --install-cni-conf DIR`, the
//! `DaemonSet`'s mode): `weft-cni` is copied into the CNI bin dir as `weft`, and the conflist is
//! written into the CNI conf dir only once the manager is ready, because the runtime reports
//! the node's network ready as soon as a conflist loads and the kubelet would schedule pods onto
//! a node whose manager cannot serve them yet.
//!
//! The conflist says `cniVersion` 1.1.0, so runtimes that call CNI STATUS (containerd 2.x asks
//! every few seconds for the kubelet's runtime status) learn from `weft-cni STATUS` whether the
//! manager is up and ready: while it is stopped or restarting the node's network is reported
//! not ready, with the plugin's reason. The conflist therefore stays when the manager stops (an
//! upgrade or a restart leaves the node's CNI configuration in place, as Cilium does by
//! default); `--cni-uninstall` removes it on a graceful stop, for taking Weft off a node (Cilium's
//! `cni.uninstall`). The binary always stays, for pending DELs.
//! Both files are written to a temporary name and renamed, so the runtime never reads half.

use std::path::{Path, PathBuf};

/// The conflist's file name: sorted first among typical CNI configs.
pub const CONFLIST: &str = "05-weft.conflist";

/// Where to install.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniInstall {
    /// CNI bin dir (e.g. /opt/cni/bin).
    pub bin_dir: PathBuf,
    /// CNI conf dir (e.g. /etc/cni/net.d).
    pub conf_dir: PathBuf,
    /// Remove the conflist on a graceful stop (`--cni-uninstall`).
    pub uninstall_on_stop: bool,
}

/// Install failures.
#[derive(Debug, thiserror::Error)]
#[error(
    "installing the CNI plugin: {what} {path}: {source} (check the host mounts of the CNI bin and conf dirs)"
)]
pub struct InstallError {
    what: &'static str,
    path: String,
    source: std::io::Error,
}

fn err(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> InstallError {
    let path = path.display().to_string();
    move |source| InstallError { what, path, source }
}

/// The conflist for a manager listening on `socket`.
#[must_use]
pub fn conflist(socket: &Path) -> String {
    let v = serde_json::json!({
        "cniVersion": "1.1.0",
        "name": "weft",
        "plugins": [{
            "type": "weft",
            "socket": socket.display().to_string(),
            "logLevel": "info"
        }]
    });
    serde_json::to_string_pretty(&v).unwrap_or_default() + "\n"
}

fn write_atomically(
    dest: &Path,
    write: impl FnOnce(&Path) -> std::io::Result<()>,
) -> Result<(), InstallError> {
    let tmp = dest.with_extension("weft-tmp");
    write(&tmp).map_err(err("cannot write", &tmp))?;
    std::fs::rename(&tmp, dest).map_err(err("cannot rename into place", dest))
}

impl CniInstall {
    /// Copies `plugin` (the `weft-cni` binary) in as `weft` and writes the conflist.
    pub fn install(&self, plugin: &Path, socket: &Path) -> Result<PathBuf, InstallError> {
        use std::os::unix::fs::PermissionsExt;
        let bin = self.bin_dir.join("weft");
        write_atomically(&bin, |tmp| {
            std::fs::copy(plugin, tmp)?;
            std::fs::set_permissions(tmp, std::fs::Permissions::from_mode(0o755))
        })?;
        let conf = self.conf_dir.join(CONFLIST);
        write_atomically(&conf, |tmp| std::fs::write(tmp, conflist(socket)))?;
        tracing::info!(bin = %bin.display(), conf = %conf.display(), "CNI plugin installed");
        Ok(conf)
    }

    /// At a graceful stop: removes the conflist with `--cni-uninstall`, else leaves it for the
    /// runtime's STATUS calls to report the manager gone.
    pub fn stopped(&self) {
        if self.uninstall_on_stop {
            self.uninstall();
        } else {
            tracing::info!(
                conf = %self.conf_dir.join(CONFLIST).display(),
                "CNI conflist kept: the runtime's CNI STATUS reports this node's network not ready until the manager is back"
            );
        }
    }

    /// Removes the conflist (the binary stays: pods' DELs still need it).
    pub fn uninstall(&self) {
        let conf = self.conf_dir.join(CONFLIST);
        match std::fs::remove_file(&conf) {
            Ok(()) => tracing::info!(conf = %conf.display(), "CNI conflist removed"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(conf = %conf.display(), "cannot remove CNI conflist: {e}"),
        }
    }
}

/// `weft-cni` next to the running `weft-manager` (both ship in one image or directory).
pub fn plugin_beside_manager() -> std::io::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    Ok(exe.with_file_name("weft-cni"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn installs_binary_and_conflist_then_removes_the_conflist() {
        let dir = tempfile::tempdir().unwrap();
        let (bin, conf) = (dir.path().join("bin"), dir.path().join("net.d"));
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::create_dir_all(&conf).unwrap();
        let plugin = dir.path().join("weft-cni");
        std::fs::write(&plugin, b"#!plugin").unwrap();
        let i = CniInstall {
            bin_dir: bin.clone(),
            conf_dir: conf.clone(),
            uninstall_on_stop: true,
        };
        let written = i
            .install(&plugin, Path::new("/run/weft/manager.sock"))
            .unwrap();
        assert_eq!(std::fs::read(bin.join("weft")).unwrap(), b"#!plugin");
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&written).unwrap()).unwrap();
        assert_eq!(v["cniVersion"], "1.1.0", "STATUS needs 1.1.0");
        assert_eq!(v["plugins"][0]["type"], "weft");
        assert_eq!(v["plugins"][0]["socket"], "/run/weft/manager.sock");
        assert_eq!(
            std::fs::read_dir(&conf).unwrap().count(),
            1,
            "no temporary file left"
        );
        i.stopped();
        assert!(!written.exists());
        assert!(bin.join("weft").exists());
    }

    #[test]
    fn by_default_a_stop_keeps_the_conflist() {
        let dir = tempfile::tempdir().unwrap();
        let plugin = dir.path().join("weft-cni");
        std::fs::write(&plugin, b"x").unwrap();
        let i = CniInstall {
            bin_dir: dir.path().into(),
            conf_dir: dir.path().into(),
            uninstall_on_stop: false,
        };
        let written = i.install(&plugin, Path::new("/s")).unwrap();
        i.stopped();
        assert!(
            written.exists(),
            "STATUS, not the file's absence, tells the runtime"
        );
    }

    #[test]
    fn a_missing_dir_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let plugin = dir.path().join("weft-cni");
        std::fs::write(&plugin, b"x").unwrap();
        let i = CniInstall {
            bin_dir: dir.path().join("nope"),
            conf_dir: dir.path().into(),
            uninstall_on_stop: false,
        };
        let e = i.install(&plugin, Path::new("/s")).unwrap_err().to_string();
        assert!(e.contains("nope") && e.contains("host mounts"), "{e}");
        assert!(
            !dir.path().join(CONFLIST).exists(),
            "no conflist without the binary"
        );
    }
}
