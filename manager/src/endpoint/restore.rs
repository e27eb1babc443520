//! Start-up reconciliation of persisted endpoints against the node (Cilium's
//! `restoreOldEndpoints`), the delete-queue drain, and the reaper of abandoned ADDs.

use std::path::Path;
use std::time::Duration;
use weft_api::delete_queue::DeleteQueue;
use weft_api::{Endpoint, EndpointState, naming};

use crate::node::hostnet::HostNet;
use crate::service::{ADD_GRACE_MS, Manager, ManagerError};

/// Why a persisted endpoint cannot be kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invalid {
    /// Its DEL started but never finished.
    Deleting,
    /// The host veth is gone (the pod's netns was deleted, which destroys the pair).
    VethMissing,
    /// A link with that name exists, but it is not the one registered.
    VethReplaced {
        /// Recorded ifindex.
        recorded: u32,
        /// Current ifindex.
        found: u32,
    },
    /// The pod's netns file is gone.
    NetnsMissing,
    /// An ADD that never registered, older than the grace period.
    Abandoned,
}

impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Deleting => f.write_str("delete was interrupted"),
            Self::VethMissing => f.write_str("host veth no longer exists"),
            Self::VethReplaced { recorded, found } => write!(
                f,
                "host veth has ifindex {found}, not the recorded {recorded}"
            ),
            Self::NetnsMissing => f.write_str("pod netns no longer exists"),
            Self::Abandoned => f.write_str("ADD never completed within the grace period"),
        }
    }
}

/// Decides whether `ep` survives a restart. `link_index` is the host veth's current ifindex.
#[must_use]
pub fn validate(
    ep: &Endpoint,
    link_index: Option<u32>,
    netns_exists: bool,
    now_ms: u64,
) -> Option<Invalid> {
    match ep.state {
        EndpointState::Deleting => Some(Invalid::Deleting),
        EndpointState::Allocated => {
            (now_ms.saturating_sub(ep.created_ms) > ADD_GRACE_MS).then_some(Invalid::Abandoned)
        }
        EndpointState::Ready => match (link_index, ep.host_ifindex) {
            (None, _) => Some(Invalid::VethMissing),
            (Some(found), Some(recorded)) if found != recorded => {
                Some(Invalid::VethReplaced { recorded, found })
            }
            _ if !netns_exists => Some(Invalid::NetnsMissing),
            _ => None,
        },
    }
}

/// Validates every persisted endpoint and removes the invalid ones completely.
/// Returns (kept, removed).
pub async fn restore_endpoints(
    manager: &Manager,
    hostnet: &dyn HostNet,
    now_ms: u64,
) -> Result<(usize, usize), ManagerError> {
    let (mut kept, mut removed) = (0, 0);
    let links = hostnet.link_indexes().await?;
    for ep in manager.endpoints() {
        let link = links.get(&ep.host_ifname).copied();
        let netns = Path::new(&ep.netns).exists();
        match validate(&ep, link, netns, now_ms) {
            None => kept += 1,
            Some(why) => {
                tracing::warn!(endpoint_id = ep.id, container_id = %ep.container_id, reason = %why, "removing endpoint at restore");
                manager.remove_fully(&ep).await?;
                removed += 1;
            }
        }
    }
    Ok((kept, removed))
}

/// Completes every DEL that was queued while the manager was down. Each endpoint is marked
/// `deleting` while the queue is still locked, so an ADD for the same pair that comes in
/// meanwhile finds the delete in progress (and is told to retry) instead of a file-less queue
/// and then losing its new endpoint to this drain.
pub async fn drain_delete_queue(manager: &Manager, queue: &DeleteQueue) -> usize {
    let mut pending = Vec::new();
    let report = queue.drain(|req| {
        match manager.begin_delete_pair(&req.container_id, &req.ifname) {
            Ok(ep) => {
                pending.push((req.clone(), ep));
                true
            }
            Err(e) => {
                tracing::error!(container_id = %req.container_id, "queued DEL kept for later: {e}");
                false
            }
        }
    });
    let report = match report {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("cannot drain the delete queue: {e}");
            return 0;
        }
    };
    for bad in &report.corrupt {
        tracing::warn!(path = %bad.display(), "unreadable delete request moved aside");
    }
    for (req, ep) in &pending {
        let result = match ep {
            Some(ep) => manager.remove_fully(ep).await.map(drop),
            None => {
                manager
                    .delete_host_link(&naming::host_ifname(&req.container_id, &req.ifname))
                    .await
            }
        };
        match result {
            Ok(()) => {
                tracing::info!(container_id = %req.container_id, ifname = %req.ifname, "queued DEL completed");
            }
            // Marked `deleting`: housekeeping finishes it.
            Err(e) => tracing::error!(container_id = %req.container_id, "queued DEL failed: {e}"),
        }
    }
    pending.len()
}

/// Runs while serving: completes DELs queued during the start-up window (after the initial
/// drain, before the socket existed), and removes allocations whose ADD never registered (the
/// CNI was killed, e.g. by a kubelet timeout). An endpoint that registered meanwhile is `ready`
/// and is left alone; a CNI that registers after the reap gets "not found" and rolls back.
pub async fn housekeeping(manager: std::sync::Arc<Manager>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        if let Some(queue) = manager.delete_queue()
            && !queue.is_empty().unwrap_or(true)
        {
            drain_delete_queue(&manager, queue).await;
        }
        reap_abandoned(&manager, crate::sys::clock::now_ms()).await;
        if let Err(e) = manager.collect_idle(crate::sys::clock::now_ms()) {
            tracing::error!("freeing idle identities failed; retrying: {e}");
        }
        manager.persist_slot_records();
        match manager.repair_if_needed() {
            Ok(true) => tracing::warn!("recomputed every endpoint after a failed regeneration"),
            Ok(false) => {}
            Err(e) => tracing::error!("full regeneration failed; retrying: {e}"),
        }
    }
}

/// Removes every allocation older than the grace period that never registered. Returns how
/// many were reaped.
pub async fn reap_abandoned(manager: &Manager, now_ms: u64) -> usize {
    let mut reaped = 0;
    for ep in manager.endpoints() {
        // A DEL whose datapath step failed left the endpoint `deleting`; finish it here rather
        // than hold its IP until the next restart.
        let stuck = ep.state == EndpointState::Deleting;
        if !stuck && validate(&ep, None, true, now_ms) != Some(Invalid::Abandoned) {
            continue;
        }
        match manager.remove_fully(&ep).await {
            Ok(false) => {}
            Ok(true) => {
                let what = if stuck {
                    "finished an interrupted delete"
                } else {
                    "reaped an ADD that never completed"
                };
                tracing::warn!(endpoint_id = ep.id, container_id = %ep.container_id, "{what}");
                reaped += 1;
            }
            Err(e) => tracing::error!(
                endpoint_id = ep.id,
                "reaping abandoned endpoint failed: {e}"
            ),
        }
    }
    reaped
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_api::IpConfig;

    fn ep(state: EndpointState, ifindex: Option<u32>) -> Endpoint {
        Endpoint {
            id: 1,
            container_id: "c".into(),
            ifname: "eth0".into(),
            netns: "/x".into(),
            pod_namespace: None,
            pod_name: None,
            labels: vec![],
            identity: 0,
            ips: vec![IpConfig {
                address: "10.0.0.2".parse().unwrap(),
                gateway: "10.0.0.1".parse().unwrap(),
            }],
            host_ifname: "weftx".into(),
            host_ifindex: ifindex,
            host_mac: None,
            pod_mac: None,
            state,
            policy_revision: 0,
            created_ms: 1_000,
        }
    }

    #[test]
    fn ready_endpoint_with_its_veth_and_netns_is_kept() {
        assert_eq!(
            validate(&ep(EndpointState::Ready, Some(5)), Some(5), true, 2_000),
            None
        );
    }

    #[test]
    fn invalid_endpoints_are_named() {
        let ready = ep(EndpointState::Ready, Some(5));
        assert_eq!(validate(&ready, None, true, 0), Some(Invalid::VethMissing));
        assert_eq!(
            validate(&ready, Some(6), true, 0),
            Some(Invalid::VethReplaced {
                recorded: 5,
                found: 6
            })
        );
        assert_eq!(
            validate(&ready, Some(5), false, 0),
            Some(Invalid::NetnsMissing)
        );
        assert_eq!(
            validate(&ep(EndpointState::Deleting, Some(5)), Some(5), true, 0),
            Some(Invalid::Deleting)
        );
    }

    #[test]
    fn allocations_in_flight_survive_until_the_grace_period_ends() {
        let a = ep(EndpointState::Allocated, None);
        assert_eq!(validate(&a, None, false, 1_000 + ADD_GRACE_MS), None);
        assert_eq!(
            validate(&a, None, false, 1_001 + ADD_GRACE_MS),
            Some(Invalid::Abandoned)
        );
    }
}
