//! The CNI half of the hostile-input table (issue #14): the real `weft-cni` binary under bad
//! environments and network configurations. Each case asserts the exact CNI error code, a
//! message naming the problem, a JSON error object on stdout (never a panic), and that nothing
//! changed: no link appeared or vanished in this netns, nothing was created next to the socket
//! (no delete queue), and planted files are left as they were. Needs no root; as root, the
//! files an attacker plants are handed to an unprivileged uid, as a real attacker's would be.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    reason = "an integration test crate: its helpers panic with context like its tests (clippy.toml's allow-*-in-tests covers only #[test] functions)"
)]

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The plugin under test: this build's, or `$WEFT_BIN_DIR/weft-cni` (docs/SECURITY.md runs the
/// table against the binaries from before the fixes that way).
fn bin() -> PathBuf {
    std::env::var_os("WEFT_BIN_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_weft-cni")),
        |d| PathBuf::from(d).join("weft-cni"),
    )
}
/// `nobody`: the attacker's uid when the test runs as root.
const ATTACKER: u32 = 65534;

struct Dir(PathBuf);
impl Dir {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("weft-cni-hostile-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }
}
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn links() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/sys/class/net")
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn tree(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for e in walk(dir) {
        let data = std::fs::read(&e).unwrap_or_default();
        out.push((e, data));
    }
    out.sort();
    out
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let meta = std::fs::symlink_metadata(&p).unwrap();
        if meta.is_dir() {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out
}

struct Case {
    name: &'static str,
    env: Vec<(&'static str, OsString)>,
    stdin: Vec<u8>,
    code: u64,
    says: &'static str,
}

fn netconf(socket: &Path, extra: &serde_json::Value) -> Vec<u8> {
    let mut v = serde_json::json!({
        "cniVersion": "1.1.0", "name": "weft", "type": "weft",
        "socket": socket,
    });
    for (k, val) in extra.as_object().unwrap() {
        v[k] = val.clone();
    }
    v.to_string().into_bytes()
}

fn add_env(over: &[(&'static str, OsString)]) -> Vec<(&'static str, OsString)> {
    let mut v: Vec<(&'static str, OsString)> = vec![
        ("CNI_COMMAND", "ADD".into()),
        ("CNI_CONTAINERID", "c1".into()),
        ("CNI_IFNAME", "eth0".into()),
        ("CNI_NETNS", "/proc/self/ns/net".into()),
        ("CNI_PATH", "/opt/cni/bin".into()),
    ];
    for (k, val) in over {
        v.retain(|(kk, _)| kk != k);
        v.push((k, val.clone()));
    }
    v
}

fn run(c: &Case) -> (Option<i32>, serde_json::Value, String) {
    let mut cmd = Command::new(bin());
    cmd.env_clear();
    for (k, v) in &c.env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let _ = child.stdin.take().unwrap().write_all(&c.stdin);
    let out = child.wait_with_output().unwrap();
    let json = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (
        out.status.code(),
        json,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
#[expect(clippy::too_many_lines, reason = "one table, one entry per case")]
fn hostile_cni_inputs_get_their_exact_error_and_change_nothing() {
    let d = Dir::new("table");
    // The socket's dir is where a DEL would queue: it must stay empty.
    let run_dir = d.0.join("run");
    std::fs::create_dir(&run_dir).unwrap();
    let sock = run_dir.join("manager.sock");
    let nc = |extra: serde_json::Value| netconf(&sock, &extra);
    let plain = nc(serde_json::json!({}));
    let huge = "a".repeat(100_000);
    let regular = d.0.join("regular");
    std::fs::write(&regular, b"not a netns").unwrap();

    let cases = vec![
        Case {
            name: "ADD with a 100 KB container id",
            env: add_env(&[("CNI_CONTAINERID", huge.clone().into())]),
            stdin: plain.clone(),
            code: 4,
            says: "CNI_CONTAINERID is 100000 bytes long",
        },
        Case {
            name: "DEL with a 100 KB container id",
            env: add_env(&[
                ("CNI_COMMAND", "DEL".into()),
                ("CNI_CONTAINERID", huge.clone().into()),
            ]),
            stdin: plain.clone(),
            code: 4,
            says: "CNI_CONTAINERID is 100000 bytes long",
        },
        Case {
            name: "DEL with a 200-byte container id",
            env: add_env(&[
                ("CNI_COMMAND", "DEL".into()),
                ("CNI_CONTAINERID", "b".repeat(200).into()),
            ]),
            stdin: plain.clone(),
            code: 4,
            says: "at most 128",
        },
        Case {
            name: "container id not UTF-8",
            env: add_env(&[("CNI_CONTAINERID", OsString::from_vec(vec![b'c', 0xff]))]),
            stdin: plain.clone(),
            code: 4,
            says: "CNI_CONTAINERID is not valid UTF-8",
        },
        Case {
            name: "container id with /",
            env: add_env(&[("CNI_CONTAINERID", "a/../../b".into())]),
            stdin: plain.clone(),
            code: 4,
            says: "CNI_CONTAINERID",
        },
        Case {
            name: "ifname traversal",
            env: add_env(&[("CNI_IFNAME", "../../x".into())]),
            stdin: plain.clone(),
            code: 4,
            says: "CNI_IFNAME",
        },
        Case {
            name: "ifname with newline",
            env: add_env(&[("CNI_IFNAME", "eth\n0".into())]),
            stdin: plain.clone(),
            code: 4,
            says: "CNI_IFNAME",
        },
        Case {
            name: "CNI_NETNS is the plugin's own",
            env: add_env(&[]),
            stdin: plain.clone(),
            code: 4,
            says: "own network namespace",
        },
        Case {
            name: "CNI_NETNS is a regular file",
            env: add_env(&[("CNI_NETNS", regular.clone().into())]),
            stdin: plain.clone(),
            code: 4,
            says: "not a network namespace",
        },
        Case {
            name: "CNI_NETNS is a directory",
            env: add_env(&[("CNI_NETNS", "/etc".into())]),
            stdin: plain.clone(),
            code: 4,
            says: "not a network namespace",
        },
        Case {
            name: "CNI_NETNS missing",
            env: add_env(&[("CNI_NETNS", "/nonexistent/ns".into())]),
            stdin: plain.clone(),
            code: 4,
            says: "does not exist",
        },
        Case {
            name: "CHECK on the plugin's own netns",
            env: add_env(&[("CNI_COMMAND", "CHECK".into())]),
            stdin: nc(
                serde_json::json!({"prevResult": {"cniVersion": "1.1.0", "interfaces": [{"name": "eth0", "mac": "02:00:00:00:00:02", "sandbox": "/proc/self/ns/net"}], "ips": [{"address": "10.0.1.5/32", "gateway": "10.0.1.1", "interface": 0}]}}),
            ),
            code: 4,
            says: "own network namespace",
        },
        Case {
            name: "unknown command",
            env: add_env(&[("CNI_COMMAND", "FROB".into())]),
            stdin: plain.clone(),
            code: 4,
            says: "unknown CNI_COMMAND",
        },
        Case {
            name: "CNI_ARGS unknown key",
            env: add_env(&[("CNI_ARGS", "EVIL=1".into())]),
            stdin: plain.clone(),
            code: 4,
            says: "unknown keys",
        },
        Case {
            name: "CNI_ARGS not K=V",
            env: add_env(&[("CNI_ARGS", "K8S_POD_NAME".into())]),
            stdin: plain.clone(),
            code: 4,
            says: "not K=V",
        },
        Case {
            name: "CNI_ARGS huge",
            env: add_env(&[(
                "CNI_ARGS",
                format!("K8S_POD_NAME={}", "a".repeat(70_000)).into(),
            )]),
            stdin: plain.clone(),
            code: 4,
            says: "at most 65536",
        },
        Case {
            name: "netconf not JSON",
            env: add_env(&[]),
            stdin: b"{\"cniVersion\":".to_vec(),
            code: 6,
            says: "decode",
        },
        Case {
            name: "netconf an array",
            env: add_env(&[]),
            stdin: b"[1]".to_vec(),
            code: 6,
            says: "JSON object",
        },
        Case {
            name: "netconf wrong type",
            env: add_env(&[]),
            stdin: nc(serde_json::json!({"type": "bridge"})),
            code: 7,
            says: "type must be",
        },
        Case {
            name: "netconf relative socket",
            env: add_env(&[]),
            stdin: nc(serde_json::json!({"socket": "run/x.sock"})),
            code: 7,
            says: "absolute",
        },
        Case {
            name: "netconf mtu 0",
            env: add_env(&[]),
            stdin: nc(serde_json::json!({"mtu": 0})),
            code: 7,
            says: "mtu",
        },
        Case {
            name: "netconf label with newline",
            env: add_env(&[]),
            stdin: nc(
                serde_json::json!({"args": {"cni": {"labels": [{"key": "app", "value": "a\nINJECTED"}]}}}),
            ),
            code: 7,
            says: "control characters",
        },
        Case {
            name: "netconf label key NUL",
            env: add_env(&[]),
            stdin: nc(
                serde_json::json!({"args": {"cni": {"labels": [{"key": "a\u{0}", "value": "x"}]}}}),
            ),
            code: 7,
            says: "control characters",
        },
        Case {
            name: "netconf 300 labels",
            env: add_env(&[]),
            stdin: nc(
                serde_json::json!({"args": {"cni": {"labels": (0..300).map(|i| serde_json::json!({"key": format!("k{i}"), "value": "v"})).collect::<Vec<_>>()}}}),
            ),
            code: 7,
            says: "at most 256",
        },
        Case {
            name: "netconf unsupported version",
            env: add_env(&[]),
            stdin: nc(serde_json::json!({"cniVersion": "9.9.9"})),
            code: 1,
            says: "9.9.9",
        },
    ];
    assert!(cases.len() >= 20);
    let mut failures = Vec::new();
    for c in &cases {
        let links_before = links();
        let files_before = tree(&d.0);
        let (status, json, stderr) = run(c);
        let code = json["code"].as_u64();
        let msg = json["msg"].as_str().unwrap_or("");
        if status == Some(101) || stderr.contains("panicked") {
            failures.push(format!("{}: panicked: {stderr}", c.name));
        }
        if status == Some(0)
            || code != Some(c.code)
            || !msg.to_lowercase().contains(&c.says.to_lowercase())
        {
            failures.push(format!(
                "{}: exit {status:?}, got code {code:?} {msg:?}, want {} containing {:?}",
                c.name, c.code, c.says
            ));
        }
        if msg.len() > 600 {
            failures.push(format!(
                "{}: message echoes unbounded input ({} bytes)",
                c.name,
                msg.len()
            ));
        }
        if links() != links_before {
            failures.push(format!("{}: links of this netns changed", c.name));
        }
        if tree(&d.0) != files_before {
            failures.push(format!("{}: files changed", c.name));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// Whether this test runs as root (then planted files are handed to [`ATTACKER`]).
fn is_root() -> bool {
    nix_uid() == 0
}

fn nix_uid() -> u32 {
    // /proc/self/status: "Uid:\treal\teffective..."
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|u| u.parse().ok())
        .unwrap()
}

#[test]
fn a_planted_log_file_is_never_followed_or_appended() {
    let d = Dir::new("log");
    let victim = d.0.join("victim");
    std::fs::write(&victim, b"root only").unwrap();
    let link = d.0.join("weft.log");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let foreign = d.0.join("foreign.log");
    std::fs::write(&foreign, b"someone else's").unwrap();
    if is_root() {
        std::os::unix::fs::lchown(&link, Some(ATTACKER), Some(ATTACKER)).unwrap();
        std::os::unix::fs::lchown(&foreign, Some(ATTACKER), Some(ATTACKER)).unwrap();
    }
    let sock = d.0.join("run/manager.sock");
    let mut logs = vec![link.clone()];
    if is_root() {
        // A file another user owns: only meaningful when the plugin is root.
        logs.push(foreign.clone());
    }
    for log in logs {
        let c = Case {
            name: "STATUS with a planted logFile",
            env: vec![("CNI_COMMAND", "STATUS".into())],
            stdin: netconf(
                &sock,
                &serde_json::json!({"logFile": log, "logLevel": "debug"}),
            ),
            code: 50,
            says: "",
        };
        let (status, json, stderr) = run(&c);
        assert_ne!(status, Some(0));
        assert_eq!(json["code"].as_u64(), Some(50), "{json} {stderr}");
        assert!(
            stderr.contains("logFile"),
            "the refusal is logged to stderr: {stderr}"
        );
    }
    assert_eq!(std::fs::read(&victim).unwrap(), b"root only");
    assert_eq!(std::fs::read(&foreign).unwrap(), b"someone else's");
}
