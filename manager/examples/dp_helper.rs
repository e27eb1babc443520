//! Drives `weft_manager::datapath` from scripts (benchmarks, and `old-build` for
//! scripts/e2e/upgrade.sh), one operation per invocation: the attachments and pinned maps
//! outlive each run, exactly as they outlive the manager.
//! Run inside the netns that holds the interfaces (`nsenter --net=...`, which keeps bpffs).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    reason = "a benchmark driver run by scripts, not a production path: a failing step aborts the run with its message"
)]

use clap::{Parser, Subcommand};
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;
use weft_manager::datapath::{BpfDatapath, Datapath, DatapathConfig, EndpointDatapath};
use weft_policy::mapstate::{Direction, EndpointPolicy, PolicyEntry, Verdict, proto};

#[derive(Parser)]
struct Cli {
    /// bpffs pin directory.
    #[arg(long)]
    pin_dir: PathBuf,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Attach both programs to a host veth and write its endpoint entries.
    Attach {
        #[arg(long)]
        ifname: String,
        #[arg(long)]
        endpoint_id: u32,
        #[arg(long)]
        identity: u32,
        #[arg(long = "ip")]
        ips: Vec<IpAddr>,
    },
    /// Detach and remove every entry of the endpoint.
    Detach {
        #[arg(long)]
        ifname: String,
        #[arg(long)]
        endpoint_id: u32,
    },
    /// Install a policy: allow TCP `port` from/to `peer` plus `filler` unrelated entries.
    Policy {
        #[arg(long)]
        endpoint_id: u32,
        #[arg(long)]
        peer: u32,
        #[arg(long)]
        port: u16,
        #[arg(long, default_value_t = 999)]
        filler: u32,
        /// Enforce ingress (the allow entry is an ingress entry).
        #[arg(long)]
        ingress: bool,
        /// Enforce egress (the allow entry is an egress entry).
        #[arg(long)]
        egress: bool,
        /// Also an Admin tier in the enforced directions whose rules (`filler` of them, on
        /// other peers, and a last one for any peer) all pass: every new flow walks the Admin
        /// tier before the `NetworkPolicy` layer decides.
        #[arg(long)]
        admin_pass: bool,
    },
    /// Time attach/detach of `count` fresh veths in the current netns.
    AttachCost {
        #[arg(long, default_value_t = 50)]
        count: u32,
    },
    /// Plays an older build that computed some slots differently, while the manager is
    /// stopped: each `--extra SLOT:IDENTITY:PORT` adds a TCP ingress allow from IDENTITY to
    /// SLOT in a complete write (a new generation, the slot's record updated with it and the
    /// digest of what the slot then holds, as that build would have persisted it), and every
    /// slot record is stamped as written by that build's compiler.
    OldBuild {
        /// The manager's state dir.
        #[arg(long)]
        state_dir: PathBuf,
        /// `SLOT:IDENTITY:PORT`; IDENTITY must have no entry in SLOT yet.
        #[arg(long = "extra")]
        extra: Vec<String>,
        /// Which part of the compiler the older build had another version of.
        #[arg(long, value_enum)]
        older: Older,
    },
}

/// What the build `old-build` plays differed in.
#[derive(Clone, Copy, clap::ValueEnum)]
enum Older {
    /// The policy computation (same encoding).
    Policy,
    /// The map encoding.
    Encoding,
    /// A build from before slot records said which compiler wrote them.
    Unversioned,
}

fn old_build(dp: &BpfDatapath, state_dir: &std::path::Path, extra: &[String], older: Older) {
    use weft_manager::slots::{Compiler, Record};
    let store = weft_manager::store::Store::open(state_dir).expect("open the state db");
    let (mut records, inputs) = store.load_slots::<Record>().expect("read the slot records");
    let generations = dp.slot_generations().expect("read policy_gen");
    let first = generations
        .values()
        .chain(records.values().map(|r| &r.generation))
        .copied()
        .max()
        .unwrap_or(0)
        + 1;
    for (next, spec) in (first..).zip(extra) {
        let parts: Vec<u32> = spec
            .split(':')
            .map(|p| p.parse().expect("--extra SLOT:IDENTITY:PORT, numbers"))
            .collect();
        let [slot, identity, port] = parts[..] else {
            panic!("--extra {spec}: expected SLOT:IDENTITY:PORT");
        };
        let port = u16::try_from(port).expect("a port number");
        let record = records
            .get_mut(&slot)
            .unwrap_or_else(|| panic!("slot {slot} has no record"));
        let entry = PolicyEntry::new(Direction::Ingress, identity, proto::TCP, port, port);
        let digest = dp
            .apply_policy_identities(
                slot,
                &[identity].into(),
                &[(entry, Verdict::Allow)].into(),
                next,
            )
            .expect("write the slot");
        record.generation = next;
        record.digest = digest;
        println!("slot {slot}: + allow identity {identity} tcp/{port}, generation {next}");
    }
    let c = Compiler::CURRENT;
    let stamp = match older {
        Older::Policy => Some(Compiler {
            policy: c.policy.checked_sub(1).unwrap_or(c.policy + 1),
            ..c
        }),
        Older::Encoding => Some(Compiler {
            encoding: c.encoding.checked_sub(1).unwrap_or(c.encoding + 1),
            ..c
        }),
        Older::Unversioned => None,
    };
    for record in records.values_mut() {
        record.compiler = stamp;
    }
    let put: Vec<(u32, &Record)> = records.iter().map(|(s, r)| (*s, r)).collect();
    store
        .write_slots(&put, &[], inputs)
        .expect("write the slot records");
    store.flush().expect("flush the state db");
    println!(
        "{} slot records stamped {}",
        put.len(),
        stamp.map_or_else(|| "unversioned".to_owned(), |c| c.to_string())
    );
}

fn endpoint(ifname: &str, endpoint_id: u32, identity: u32, ips: Vec<IpAddr>) -> EndpointDatapath {
    let host_ifindex = nix::net::if_::if_nametoindex(ifname).expect("interface exists");
    EndpointDatapath {
        endpoint_id,
        identity,
        policy_id: endpoint_id,
        host_ifindex,
        host_ifname: ifname.to_owned(),
        ips,
        pod_mac: [0; 6],
    }
}

fn policy(peer: u32, port: u16, filler: u32, ingress: bool, egress: bool) -> EndpointPolicy {
    let mut p = EndpointPolicy {
        ingress_enforced: ingress,
        egress_enforced: egress,
        ..Default::default()
    };
    for (enforced, direction) in [(ingress, Direction::Ingress), (egress, Direction::Egress)] {
        if !enforced {
            continue;
        }
        let allow = PolicyEntry::new(direction, peer, proto::TCP, port, port);
        p.entries.insert(allow, Verdict::Allow);
        for i in 0..filler {
            let lo = u16::try_from(1000 + i % 5000).unwrap();
            let proto = if i % 2 == 0 { proto::TCP } else { proto::UDP };
            let hi = lo + u16::try_from(i % 7).unwrap();
            let entry = PolicyEntry::new(direction, 10_000 + i, proto, lo, hi);
            p.entries.insert(entry, Verdict::Allow);
        }
    }
    p
}

fn median_us(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[v.len() * 9 / 10])
}

/// Admin-tier Pass rules over `p`'s enforced directions: one per filler identity (TCP, their
/// filler port) and a last one for any peer and protocol.
fn add_admin_pass(p: &mut EndpointPolicy, filler: u32) {
    use weft_policy::mapstate::{Tier, TierAction, TierVerdict};
    let pass = |rule: u32| {
        Verdict::Tier(TierVerdict {
            priority: 1000,
            rule: u8::try_from(rule.min(255)).unwrap(),
            action: TierAction::Pass,
        })
    };
    let dirs: Vec<Direction> = [
        (p.ingress_enforced, Direction::Ingress),
        (p.egress_enforced, Direction::Egress),
    ]
    .into_iter()
    .filter_map(|(on, d)| on.then_some(d))
    .collect();
    for direction in dirs {
        for i in 0..filler {
            let port = u16::try_from(1000 + i % 5000).unwrap();
            let e = PolicyEntry::new(direction, 10_000 + i, proto::TCP, port, port);
            p.entries.insert(e.in_tier(Tier::Admin), pass(i));
        }
        let any = PolicyEntry::new(direction, 0, proto::ANY, 0, u16::MAX);
        p.entries.insert(any.in_tier(Tier::Admin), pass(filler));
        p.tiers.set(Tier::Admin, direction, true);
    }
}

fn ip(args: &str) {
    let ok = Command::new("ip")
        .args(args.split_whitespace())
        .status()
        .expect("run ip")
        .success();
    assert!(ok, "ip {args} failed");
}

fn attach_cost(dp: &BpfDatapath, count: u32) {
    let (mut attach, mut detach) = (Vec::new(), Vec::new());
    for i in 0..count {
        let name = format!("wbench{i}");
        ip(&format!("link add {name} type veth peer name {name}p"));
        ip(&format!("link set {name} up"));
        let ep = endpoint(
            &name,
            50_000 + i,
            300,
            vec![IpAddr::from([10, 250, 0, u8::try_from(i % 250).unwrap()])],
        );
        let t = Instant::now();
        dp.attach_endpoint(&ep).expect("attach");
        attach.push(t.elapsed().as_secs_f64() * 1e6);
        let t = Instant::now();
        dp.detach_endpoint(&ep).expect("detach");
        detach.push(t.elapsed().as_secs_f64() * 1e6);
        ip(&format!("link del {name}"));
    }
    let (am, ap) = median_us(attach);
    let (dm, dp90) = median_us(detach);
    println!(
        "attach_endpoint (clsact + 2 netlink cls_bpf filters + map writes): median {am:.0} us, p90 {ap:.0} us (n={count})"
    );
    println!(
        "detach_endpoint (2 filters + every map entry of the endpoint):      median {dm:.0} us, p90 {dp90:.0} us (n={count})"
    );
}

fn main() {
    let cli = Cli::parse();
    let dp = BpfDatapath::open(DatapathConfig {
        pin_dir: cli.pin_dir,
        ..Default::default()
    })
    .expect("open datapath");
    match cli.cmd {
        Cmd::Attach {
            ifname,
            endpoint_id,
            identity,
            ips,
        } => {
            dp.attach_endpoint(&endpoint(&ifname, endpoint_id, identity, ips.clone()))
                .expect("attach");
            // Since the ipcache owner table (issue #13) the manager, not attach, maps an
            // endpoint's addresses to its identity: without it peers are "world".
            for ip in ips {
                let value = weft_manager::node::ipcache::Value {
                    identity,
                    cidr_identity: 0,
                };
                dp.upsert_ipcache(ipnet::IpNet::from(ip), value)
                    .expect("ipcache");
            }
        }
        Cmd::Detach {
            ifname,
            endpoint_id,
        } => {
            let ep = EndpointDatapath {
                endpoint_id,
                identity: 0,
                policy_id: endpoint_id,
                host_ifindex: nix::net::if_::if_nametoindex(ifname.as_str()).unwrap_or(0),
                host_ifname: ifname,
                ips: Vec::new(),
                pod_mac: [0; 6],
            };
            dp.detach_endpoint(&ep).expect("detach");
        }
        Cmd::Policy {
            endpoint_id,
            peer,
            port,
            filler,
            ingress,
            egress,
            admin_pass,
        } => {
            let mut p = policy(peer, port, filler, ingress, egress);
            if admin_pass {
                add_admin_pass(&mut p, filler);
            }
            let t = Instant::now();
            dp.apply_policy(endpoint_id, &p, 1).expect("apply policy");
            eprintln!(
                "apply_policy: {} entries in {:.0} us",
                p.entries.len(),
                t.elapsed().as_secs_f64() * 1e6
            );
        }
        Cmd::AttachCost { count } => attach_cost(&dp, count),
        Cmd::OldBuild {
            state_dir,
            extra,
            older,
        } => old_build(&dp, &state_dir, &extra, older),
    }
}
