//! ADD: (allocate ∥ veth) → (pod side ∥ host side ∥ register) → result. Undone in reverse on
//! failure.

use crate::env::CniEnv;
use crate::error::CniError;
use crate::netconf::NetConf;
use crate::netlink::shaping::{self, Bucket};
use crate::netlink::veth::{Made, Side};
use crate::netlink::{self, veth};
use crate::result::{CniResult, Plumbed};
use crate::revert::{self, RevertStack, Undo};
use crate::{annotations, manager, netns};
use std::os::fd::{AsFd, BorrowedFd};
use weft_api::MacAddr;
use weft_api::client::Client;
use weft_api::naming::{host_ifname, veth_macs};
use weft_api::{AllocateRequest, EndpointState, IpConfig, RegisterRequest};

/// The endpoint's labels (`args.cni.labels` over `weft.io/label.*` annotations).
fn pod_labels(conf: &NetConf) -> Vec<weft_api::Label> {
    let (labels, overridden) = annotations::merge(&conf.labels, &conf.annotation_labels);
    if !overridden.is_empty() {
        tracing::warn!(
            ?overridden,
            "args.cni.labels win over these pod-annotation labels"
        );
    }
    labels
}

/// Asks the manager for the endpoint and its IPs.
async fn allocate(
    env: &CniEnv,
    conf: &NetConf,
    client: &Client,
    netns_str: &str,
) -> Result<weft_api::Endpoint, CniError> {
    let ep = manager::allocate(
        client,
        &AllocateRequest {
            container_id: env.container_id.clone(),
            ifname: env.ifname.clone(),
            netns: netns_str.to_owned(),
            pod_namespace: env.args.pod_namespace.clone(),
            pod_name: env.args.pod_name.clone(),
            labels: pod_labels(conf),
        },
    )
    .await?;
    let host_name = host_ifname(&env.container_id, &env.ifname);
    if ep.host_ifname != host_name {
        tracing::warn!(manager = %ep.host_ifname, cni = %host_name, "host veth names disagree");
    }
    // Allocation is idempotent: a ready endpoint means this ADD is a duplicate of one that
    // succeeded. Failing without undo keeps the running pod's IP.
    if ep.state == EndpointState::Ready {
        return Err(CniError::InterfaceExists(format!(
            "container {} already has a ready endpoint {} on {}; DEL it first",
            env.container_id, ep.id, env.ifname
        )));
    }
    Ok(ep)
}

/// Runs ADD and returns the result to print.
pub async fn run(env: &CniEnv, conf: &NetConf) -> Result<CniResult, CniError> {
    // Per-phase wall times, logged with `ready` (the ADD breakdown of docs/BENCHMARKS.md).
    let t0 = std::time::Instant::now();
    let netns_path = super::netns_path(env)?;
    let netns_str = netns_path.to_string_lossy().into_owned();
    let netns = netns::open_pod_netns(netns_path)?;
    let client = Client::new(&conf.socket);
    let host_name = host_ifname(&env.container_id, &env.ifname);
    let (host_mac, pod_mac) = veth_macs(&env.container_id, &env.ifname);
    let spec = veth::VethSpec {
        host_name: host_name.clone(),
        host_mac,
        pod_name: env.ifname.clone(),
        pod_mac,
        mtu: conf.mtu,
        netns_path: netns_str.clone(),
    };
    // The pod-side thread creates the pair from inside the pod netns while the manager
    // allocates (nothing in the pair depends on the IPs): the kernel's ~0.8 ms of veth creation
    // then overlaps the allocation's round trip and fsync, on the other CPU. It configures the
    // pod side once it is handed the IPs.
    let node = std::fs::File::open("/proc/thread-self/ns/net")
        .map_err(|e| CniError::netlink("opening the node netns", e))?;
    let pod_netns = netns
        .try_clone()
        .map_err(|e| CniError::netlink("duplicating the pod netns handle", e))?;
    let (created_tx, created_rx) = tokio::sync::oneshot::channel();
    let mut pod = {
        let spec = spec.clone();
        netns::spawn_in_netns(pod_netns, move |job| {
            pod_side(&spec, &node, created_tx, job)
        })?
    };
    let nl = netlink::connect()?;
    let allocating = async {
        let r = allocate(env, conf, &client, &netns_str).await;
        (r, t0.elapsed().as_micros())
    };
    let creating = async { (created_rx.await, t0.elapsed().as_micros()) };
    let ((allocated, allocate_us), (first_try, mut veth_us)) = futures::join!(allocating, creating);
    let first_try = match first_try {
        Ok(made) => made,
        Err(_) => Err(pod.failure().await),
    };
    let mut revert = RevertStack::new(revert::Node {
        socket: conf.socket.clone(),
    });
    let begun = take_begun(
        &mut revert,
        env,
        (allocated, first_try),
        (&nl, &spec, netns.as_fd()),
    )
    .await?;
    if !begun.pod_up {
        veth_us = t0.elapsed().as_micros();
    }
    let (ep, host_index) = (begun.ep, begun.host_index);
    let job = PodJob {
        index: begun.pod_index,
        bring_up: !begun.pod_up,
        ips: ep.ips.clone(),
        host_mac,
        egress_bits: conf.bandwidth.egress,
    };
    let host = host_side(&nl, host_index, &ep.ips, pod_mac, conf.bandwidth.ingress);
    let host_mac_s = host_mac.to_string();
    let pod_mac_s = pod_mac.to_string();
    let register = RegisterRequest {
        container_id: env.container_id.clone(),
        host_ifname: host_name.clone(),
        host_ifindex: host_index,
        host_mac,
        pod_mac,
    };
    let plumb = async {
        let done = both_sides(pod, job, host).await;
        (done, t0.elapsed().as_micros())
    };
    let plumb_us = plumb_and_register(plumb, manager::ready(&client, ep.id, &register)).await?;
    revert.disarm();
    // Cumulative µs since the ADD began, at the end of each phase.
    tracing::info!(
        endpoint = ep.id,
        host_ifname = %host_name,
        allocate_us,
        veth_us,
        plumb_us,
        ready_us = t0.elapsed().as_micros(),
        "ready"
    );

    Ok(CniResult::build(
        &conf.cni_version,
        conf.version,
        &Plumbed {
            host: (&host_name, &host_mac_s),
            pod: (&env.ifname, &pod_mac_s),
            sandbox: &netns_str,
            mtu: conf.mtu,
            ips: &ep.ips,
        },
        conf.dns.clone(),
    ))
}

/// The allocation and the pair, once both exist.
struct Begun {
    ep: weft_api::Endpoint,
    host_index: u32,
    /// When the kernel's echo carried it.
    pod_index: Option<u32>,
    /// Created from the pod side, whose end is then up already.
    pod_up: bool,
}

/// Takes the results of the allocation and of the pair's creation (made at once), records their
/// undo steps on `revert`, and retries a creation that found the host name taken.
async fn take_begun(
    revert: &mut RevertStack<revert::Node>,
    env: &CniEnv,
    (allocated, first_try): (Result<weft_api::Endpoint, CniError>, Result<Made, CniError>),
    (nl, spec, pod_netns): (&rtnetlink::Handle, &veth::VethSpec, BorrowedFd<'_>),
) -> Result<Begun, CniError> {
    if allocated.is_ok() {
        revert.push(Undo::Release {
            container_id: env.container_id.clone(),
            ifname: env.ifname.clone(),
        });
    }
    // Unless the kernel refused a taken name (and created nothing), the pair may exist, also
    // after an error (e.g. from the echo); deleting a missing link is a no-op. The name is this
    // (container, ifname)'s own, never another pod's. Pushed after the release, so undone
    // first: no route through the veth outlives the IP.
    if !matches!(first_try, Ok(Made::Taken(_))) {
        revert.push(Undo::DeleteLink(spec.host_name.clone()));
    }
    let ep = allocated?;
    tracing::info!(endpoint = ep.id, ips = ?ep.ips, "allocated");
    if ep.ips.is_empty() {
        return Err(CniError::Manager(format!(
            "endpoint {} was allocated no IP",
            ep.id
        )));
    }
    let (created, pod_up) = match first_try? {
        Made::Pair(created) => (created, true),
        Made::Taken(Side::Pod) => return Err(veth::taken(spec, Side::Pod)),
        // The host name was taken, e.g. by this pair's previous veth whose background deletion
        // (after its DEL) was still running. The allocation waited for any such deletion (the
        // manager's `settle`), so the name is free now unless something else holds it.
        Made::Taken(Side::Host) => match veth::create(nl, spec, pod_netns).await {
            Ok(Made::Pair(created)) => {
                revert.push(Undo::DeleteLink(spec.host_name.clone()));
                (created, false)
            }
            Ok(Made::Taken(side)) => return Err(veth::taken(spec, side)),
            Err(e) => {
                revert.push(Undo::DeleteLink(spec.host_name.clone()));
                return Err(e);
            }
        },
    };
    let host_index = match created.host_index {
        Some(index) => index,
        None => veth::index_of(nl, &spec.host_name).await?.ok_or_else(|| {
            CniError::netlink(
                "creating the veth pair",
                format!("{} vanished", spec.host_name),
            )
        })?,
    };
    Ok(Begun {
        ep,
        host_index,
        pod_index: created.pod_index,
        pod_up,
    })
}

/// The host veth's routes and neighbour, and the pod's ingress limit: traffic to the pod leaves
/// the node through the host veth, whose root qdisc (Weft's clsact is not one) shapes it.
/// Traffic from the pod is shaped on the pod's own interface (`pod_side`).
async fn host_side(
    nl: &rtnetlink::Handle,
    index: u32,
    ips: &[IpConfig],
    pod_mac: MacAddr,
    ingress_bits: Option<u64>,
) -> Result<(), CniError> {
    netlink::host::configure(nl, index, ips, pod_mac).await?;
    match ingress_bits {
        Some(bits) => shaping::limit(nl, index, Bucket::for_rate(bits)).await,
        None => Ok(()),
    }
}

/// Configures the pod side (on its netns thread) and the host side at once; both must succeed.
async fn both_sides(
    pod: netns::Worker<PodJob, ()>,
    job: PodJob,
    host: impl std::future::Future<Output = Result<(), CniError>>,
) -> Result<(), CniError> {
    let (pod, host) = futures::join!(pod.run(job), host);
    pod.and(host)
}

/// The manager attaches the datapath and installs the policy while the addresses and routes are
/// configured: it needs only the host veth, and nothing in the pod can send before ADD returns,
/// which waits for both. A failure of either fails the ADD, whose revert undoes both (the release
/// of a ready endpoint is a DEL). Returns when the plumbing ended (µs since the ADD began).
async fn plumb_and_register(
    plumb: impl std::future::Future<Output = (Result<(), CniError>, u128)>,
    register: impl std::future::Future<Output = Result<weft_api::Endpoint, CniError>>,
) -> Result<u128, CniError> {
    let ((plumbed, plumb_us), registered) = futures::join!(plumb, register);
    if let (Err(_), Err(e)) = (&plumbed, &registered) {
        tracing::error!(error = %e, "registering failed too");
    }
    plumbed?;
    registered?;
    Ok(plumb_us)
}

/// What the pod side needs once the veth exists.
struct PodJob {
    /// The pod end's ifindex, when the kernel's echo carried it.
    index: Option<u32>,
    /// The pod end is still down (created from the node netns).
    bring_up: bool,
    ips: Vec<IpConfig>,
    host_mac: MacAddr,
    egress_bits: Option<u64>,
}

/// Runs on the netns thread: its own runtime and netlink socket inside the pod netns. Creates
/// the pair at once, reports it on `created`, then configures the pod side when handed the job.
/// A closed `job` channel (the ADD failed first) ends it untouched.
fn pod_side(
    spec: &veth::VethSpec,
    node: &std::fs::File,
    created: tokio::sync::oneshot::Sender<Result<Made, CniError>>,
    job: tokio::sync::oneshot::Receiver<PodJob>,
) -> Result<(), CniError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .map_err(|e| CniError::netlink("building the pod-side runtime", e))?;
    rt.block_on(async {
        let nl = netlink::connect()?;
        let _ = created.send(veth::create_from_pod(&nl, spec, node.as_fd()).await);
        let Ok(job) = job.await else {
            return Err(CniError::netlink(
                "configuring the pod side",
                "the ADD ended before the veth existed",
            ));
        };
        let index = match job.index {
            Some(i) => i,
            None => veth::index_of(&nl, &spec.pod_name).await?.ok_or_else(|| {
                CniError::netlink(
                    "configuring the pod side",
                    format!("{} not found", spec.pod_name),
                )
            })?,
        };
        netlink::pod::configure(&nl, index, &job.ips, job.host_mac, job.bring_up).await?;
        match job.egress_bits {
            Some(bits) => shaping::limit(&nl, index, Bucket::for_rate(bits)).await,
            None => Ok(()),
        }
    })
}
