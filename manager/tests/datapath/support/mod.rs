//! A private little network per test: a "node" netns holding two host veths whose peers are
//! `eth0` in two "pod" netns, routed through the node like Weft's pods. Never the host netns.
//! Everything (netns, veths via their netns, the bpffs pin dir) is removed in Drop, also on panic.

pub mod checks;
pub mod sessions;
pub mod traffic;

use std::fs::File;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use weft_manager::datapath::{DatapathConfig, EndpointDatapath};
use weft_testkit::require_root_and_tools;
pub use weft_testkit::sh;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// Runs `f` on a fresh thread that entered netns `ns` (sockets created there stay in that netns
/// wherever they are used later). The thread dies afterwards, so no thread keeps a wrong netns.
pub fn in_ns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            let file = File::open(format!("/run/netns/{ns}")).expect("open netns");
            nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            f()
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

pub struct Pod {
    pub ns: String,
    pub host_if: String,
    pub ip4: Ipv4Addr,
    pub ip6: Ipv6Addr,
    pub ep: EndpointDatapath,
}

pub struct World {
    pub node: String,
    pub pods: Vec<Pod>,
    pub pin_dir: PathBuf,
}

fn preflight() {
    require_root_and_tools(
        "the datapath tests (netns, veth, BPF)",
        &["ip", "ping", "nsenter", "tc"],
        "run scripts/setup",
    );
    assert!(
        std::fs::read_to_string("/proc/mounts")
            .unwrap()
            .contains(" /sys/fs/bpf bpf "),
        "bpffs is not mounted at /sys/fs/bpf: run scripts/setup"
    );
}

fn disable_dad(ns: &str) {
    for key in ["all", "default"] {
        sh(&[
            "nsenter",
            &format!("--net=/run/netns/{ns}"),
            "sysctl",
            "-qw",
            &format!("net.ipv6.conf.{key}.accept_dad=0"),
        ]);
    }
}

impl World {
    /// Node netns + two pods (index 0 and 1) with identities 1000 and 1001.
    pub fn new() -> Self {
        preflight();
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let tag = format!("{}{n}", pid % 100_000);
        let node = format!("wdpt{tag}-node");
        let mut world = World {
            node: node.clone(),
            pods: Vec::new(),
            pin_dir: PathBuf::from(format!("/sys/fs/bpf/wdp-test-{tag}")),
        };
        sh(&["ip", "netns", "add", &node]);
        disable_dad(&node);
        sh(&["ip", "-n", &node, "link", "set", "lo", "up"]);
        for key in ["net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"] {
            sh(&[
                "nsenter",
                &format!("--net=/run/netns/{node}"),
                "sysctl",
                "-qw",
                key,
            ]);
        }
        for i in 0..2u8 {
            world.add_pod(&tag, n, i);
        }
        world
    }

    fn add_pod(&mut self, tag: &str, n: u32, i: u8) {
        let node = self.node.clone();
        let world = self;
        let ns = format!("wdpt{tag}-p{i}");
        let host_if = format!("wt{tag}h{i}");
        assert!(host_if.len() <= 15, "{host_if} too long");
        let third = u8::try_from(n % 250).unwrap();
        let ip4 = Ipv4Addr::new(10, 213, third, 10 + i);
        let ip6: Ipv6Addr = format!("fd00:213:{third:x}::{:x}", 10 + i).parse().unwrap();
        sh(&["ip", "netns", "add", &ns]);
        world.pods.push(Pod {
            ns: ns.clone(),
            host_if: host_if.clone(),
            ip4,
            ip6,
            ep: EndpointDatapath {
                endpoint_id: 100 + u32::from(i),
                identity: 1000 + u32::from(i),
                // Each test endpoint has its own policy slot, numbered like the endpoint.
                policy_id: 100 + u32::from(i),
                host_ifindex: 0,
                host_ifname: host_if.clone(),
                ips: vec![ip4.into(), ip6.into()],
                pod_mac: [0; 6],
            },
        });
        disable_dad(&ns);
        // Pod: /32 and /128 with a link-scope gateway (169.254.1.1, fe80::1) on the host veth,
        // like Weft's pods; the node routes each pod IP to its host veth.
        for cmd in [
            format!("-n {node} link add {host_if} type veth peer name eth0 netns {ns}"),
            format!("-n {node} link set {host_if} up"),
            format!("-n {node} addr add 169.254.1.1/32 dev {host_if}"),
            format!("-n {node} addr add fe80::1/64 dev {host_if} nodad"),
            format!("-n {node} route add {ip4}/32 dev {host_if}"),
            format!("-n {node} -6 route add {ip6}/128 dev {host_if}"),
            format!("-n {ns} link set lo up"),
            format!("-n {ns} link set eth0 up"),
            format!("-n {ns} addr add {ip4}/32 dev eth0"),
            format!("-n {ns} addr add {ip6}/128 dev eth0 nodad"),
            format!("-n {ns} route add 169.254.1.1 dev eth0 scope link"),
            format!("-n {ns} route add default via 169.254.1.1 dev eth0"),
            format!("-n {ns} -6 route add default via fe80::1 dev eth0"),
        ] {
            let mut args = vec!["ip"];
            args.extend(cmd.split_whitespace());
            sh(&args);
        }
        let ifindex = in_ns(&node, || {
            nix::net::if_::if_nametoindex(host_if.as_str()).expect("ifindex")
        });
        let link: serde_json::Value =
            serde_json::from_str(&sh(&["ip", "-n", &ns, "-j", "link", "show", "eth0"])).unwrap();
        let mac_str = link[0]["address"].as_str().unwrap().to_owned();
        let pod = world.pods.last_mut().unwrap();
        pod.ep.host_ifindex = ifindex;
        pod.ep.pod_mac = mac_str.parse::<weft_api::MacAddr>().unwrap().octets();
    }

    pub fn config(&self) -> DatapathConfig {
        DatapathConfig {
            pin_dir: self.pin_dir.clone(),
            endpoints_max: 64,
            ipcache_max: 1024,
            policy_max: 16 * 1024,
            policy_lists_max: 16 * 1024,
            ct_max: 4096,
            frags_max: 256,
            metrics_max: 1024,
            events_bytes: 64 * 1024,
            lb_frontends_max: 256,
            lb_backends_max: 1024,
            lb_flows_max: 1024,
            event_channel: 1024,
        }
    }

    /// `tc filter show` output for the host veth of pod `i` in the given direction.
    pub fn tc_filters(&self, i: usize, dir: &str) -> String {
        sh(&[
            "nsenter",
            &format!("--net=/run/netns/{}", self.node),
            "tc",
            "filter",
            "show",
            "dev",
            &self.pods[i].host_if,
            dir,
        ])
    }
}

impl Drop for World {
    fn drop(&mut self) {
        // Best effort, and never panic in Drop: deleting the node netns deletes the host veths
        // (and with them the filters); the pod netns go next; then the pinned maps.
        let mut names = vec![self.node.clone()];
        names.extend(self.pods.iter().map(|p| p.ns.clone()));
        for ns in names {
            let _ = Command::new("ip").args(["netns", "del", &ns]).output();
        }
        let _ = std::fs::remove_dir_all(&self.pin_dir);
    }
}
