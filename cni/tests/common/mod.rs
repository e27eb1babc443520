//! Privileged test world: a private "node" netns set up the way weft-manager would, pod netns,
//! a fake manager, and the real `weft-cni` run under `nsenter` in the node netns. Everything is
//! removed on Drop, panics included. The host netns is never touched.

#![allow(
    dead_code,
    reason = "each test binary uses a different subset of the helpers"
)]

pub mod fake_manager;

use fake_manager::FakeManager;
use serde_json::{Value, json};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use weft_testkit::require_root_and_tools;
pub use weft_testkit::sh;

pub const BIN: &str = env!("CARGO_BIN_EXE_weft-cni");

/// Panics (never skips) when the test cannot run for real.
fn preflight() {
    require_root_and_tools(
        "privileged weft-cni tests",
        &["ip", "nsenter", "ping"],
        "apt: iproute2, util-linux, iputils-ping (scripts/setup)",
    );
}

/// Whether a command succeeds (for pings).
pub fn succeeds(args: &[&str]) -> bool {
    Command::new(args[0])
        .args(&args[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// What one plugin run printed and returned.
#[derive(Debug)]
pub struct Output {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self:?}"))
    }

    /// Asserts failure with CNI error `code` and returns the error object.
    pub fn expect_error(&self, code: u64) -> Value {
        assert_ne!(
            self.code, 0,
            "expected CNI error {code}, got success: {self:?}"
        );
        let v = self.json();
        assert_eq!(v["code"], code, "wrong CNI error code: {self:?}");
        assert!(v["msg"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert!(v["cniVersion"].is_string(), "{v}");
        v
    }

    pub fn expect_ok(&self) -> &Self {
        assert_eq!(self.code, 0, "plugin failed: {self:?}");
        self
    }
}

/// A snapshot of the node netns: links, routes (v4 and v6) and neighbours.
#[derive(Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub links: Vec<String>,
    pub routes: String,
    pub neigh: String,
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// One test's private world.
pub struct World {
    pub node: String,
    pub pods: Vec<String>,
    pub dir: PathBuf,
    pub manager: Option<FakeManager>,
}

impl World {
    /// A node netns with `weft_host` (router IPs, node CIDR routes, forwarding) and a fake manager.
    pub fn new(tag: &str) -> Self {
        preflight();
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let base = format!("wcni-{}-{n}-{tag}", std::process::id());
        let dir = std::env::temp_dir().join(&base);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let node = format!("{base}-node");
        // The world exists (and will be cleaned) before anything is created in it.
        let mut w = Self {
            node: node.clone(),
            pods: Vec::new(),
            dir,
            manager: None,
        };
        sh(&["ip", "netns", "add", &node]);
        // weft-manager uses a dummy device. This test kernel may lack the dummy driver; ifb is
        // the stand-in: also NOARP (no DAD on its addresses) and a sink for routed packets.
        if !succeeds(&[
            "ip",
            "-n",
            &node,
            "link",
            "add",
            "weft_host",
            "type",
            "dummy",
        ]) {
            sh(&["ip", "-n", &node, "link", "add", "weft_host", "type", "ifb"]);
        }
        for cmd in [
            "link set lo up",
            "link set weft_host up",
            "addr add 10.77.0.1/32 dev weft_host",
            "addr add fd77::1/128 dev weft_host nodad",
            "route add 10.77.0.0/24 dev weft_host",
            "-6 route add fd77::/64 dev weft_host",
        ] {
            let mut args = vec!["ip", "-n", &node];
            args.extend(cmd.split(' '));
            sh(&args);
        }
        // /proc/sys/net shows the netns of the process reading it: write from inside the node.
        w.in_node(&[
            "sh",
            "-c",
            "echo 1 > /proc/sys/net/ipv4/ip_forward && echo 1 > /proc/sys/net/ipv6/conf/all/forwarding",
        ]);
        w.manager = Some(FakeManager::start(&w.dir.join("manager.sock"), &node));
        w
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join("manager.sock")
    }

    pub fn manager(&self) -> &FakeManager {
        self.manager.as_ref().expect("manager running")
    }

    /// Stops the fake manager: its socket disappears.
    pub fn stop_manager(&mut self) {
        self.manager = None;
    }

    /// A new empty pod netns; returns its path.
    pub fn add_pod(&mut self) -> String {
        let name = format!(
            "{}-pod{}",
            self.node.trim_end_matches("-node"),
            self.pods.len()
        );
        sh(&["ip", "netns", "add", &name]);
        self.pods.push(name.clone());
        format!("/run/netns/{name}")
    }

    pub fn in_node(&self, args: &[&str]) -> String {
        let net = format!("--net=/run/netns/{}", self.node);
        let mut a = vec!["nsenter", net.as_str()];
        a.extend_from_slice(args);
        sh(&a)
    }

    pub fn node_links(&self) -> Vec<String> {
        sh(&["ip", "-n", &self.node, "-o", "link", "show"])
            .lines()
            .filter_map(|l| l.split(':').nth(1))
            .map(|n| n.trim().split('@').next().unwrap_or("").to_owned())
            .collect()
    }

    pub fn has_node_link(&self, name: &str) -> bool {
        self.node_links().iter().any(|l| l == name)
    }

    pub fn snapshot(&self) -> Snapshot {
        let mut links = self.node_links();
        links.sort();
        Snapshot {
            links,
            routes: sh(&["ip", "-n", &self.node, "route", "show"])
                + &sh(&["ip", "-n", &self.node, "-6", "route", "show"]),
            neigh: sh(&["ip", "-n", &self.node, "neigh", "show", "nud", "permanent"]),
        }
    }

    /// The standard netconf for `version`, pointing at this world's manager.
    pub fn conf(&self, version: &str) -> Value {
        json!({
            "cniVersion": version,
            "name": "weft-test",
            "type": "weft",
            "socket": self.socket(),
            "mtu": 1400,
            "logLevel": "debug",
            "logFile": self.dir.join("cni.log"),
            "dns": {"nameservers": ["10.96.0.10"]},
            "args": {"cni": {"labels": [{"key": "app", "value": "web"}]}},
        })
    }

    /// Runs weft-cni in the node netns with `env` (CNI_* pairs) and `conf` on stdin.
    pub fn cni(&self, env: &[(&str, &str)], stdin: &str) -> Output {
        let mut child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", self.node))
            .arg(BIN)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("CNI_PATH", "/usr/lib/cni")
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn weft-cni");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(stdin.as_bytes())
            .expect("write stdin");
        let out = child.wait_with_output().expect("wait weft-cni");
        Output {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// `CNI_COMMAND=cmd` for container `cid` in `netns` on eth0.
    pub fn run(&self, cmd: &str, cid: &str, netns: &str, conf: &Value) -> Output {
        self.cni(
            &[
                ("CNI_COMMAND", cmd),
                ("CNI_CONTAINERID", cid),
                ("CNI_NETNS", netns),
                ("CNI_IFNAME", "eth0"),
                (
                    "CNI_ARGS",
                    "K8S_POD_NAME=p;IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_UID=u",
                ),
            ],
            &conf.to_string(),
        )
    }

    pub fn host_ifname(cid: &str) -> String {
        weft_api::naming::host_ifname(cid, "eth0")
    }
}

impl Drop for World {
    fn drop(&mut self) {
        self.manager = None;
        for pod in &self.pods {
            let _ = Command::new("ip").args(["netns", "del", pod]).status();
        }
        // Deleting the node netns deletes every host veth in it (and so their pod ends).
        let _ = Command::new("ip")
            .args(["netns", "del", &self.node])
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `ping` from inside `netns` (a /run/netns path).
pub fn ping(netns: &str, dst: &str) -> bool {
    let net = format!("--net={netns}");
    succeeds(&["nsenter", &net, "ping", "-c", "1", "-W", "2", dst])
}

pub fn netns_arg(path: &Path) -> String {
    format!("--net={}", path.display())
}
