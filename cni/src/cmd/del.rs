//! DEL: best effort and idempotent. Every step runs; the first error is reported.

use crate::env::CniEnv;
use crate::error::CniError;
use crate::manager;
use crate::netconf::NetConf;
use crate::netlink::{self, veth};
use weft_api::client::Client;
use weft_api::naming::host_ifname;

/// Releases the endpoint (the manager checks it belongs to this container) and deletes the host
/// veth. Neither `CNI_NETNS` nor `prevResult` is needed: the second DEL of containerd's
/// `RemovePodSandbox` has neither.
///
/// The two run in parallel: deleting a veth blocks in the kernel for ~20 ms (RCU grace periods in
/// `unregister_netdevice`), during which the manager answers. The link is deleted on its own
/// thread, which starts in this thread's (the node's) netns.
pub async fn run(env: &CniEnv, conf: &NetConf) -> Result<(), CniError> {
    let client = Client::new(&conf.socket);
    let host_name = host_ifname(&env.container_id, &env.ifname);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let name = host_name.clone();
    let spawned = std::thread::Builder::new()
        .name("weft-del-link".into())
        .spawn(move || {
            let result = tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .build()
                .map_err(|e| CniError::netlink("building the DEL runtime", e))
                .and_then(|rt| {
                    rt.block_on(async {
                        let nl = netlink::connect()?;
                        veth::delete(&nl, &name).await
                    })
                });
            let _ = tx.send(result);
        });

    let mut errors = Vec::new();
    match manager::release_or_queue(&client, &env.container_id, &env.ifname).await {
        Ok(released) => tracing::info!(?released, "manager released the endpoint (or queued)"),
        Err(e) => errors.push(e),
    }
    let link = match spawned {
        Ok(handle) => {
            let r = rx.await.unwrap_or_else(|_| {
                Err(CniError::netlink(
                    format!("deleting {host_name}"),
                    "thread died",
                ))
            });
            let _ = handle.join();
            r
        }
        Err(e) => Err(CniError::netlink("spawning the DEL thread", e)),
    };
    match link {
        Ok(existed) => tracing::info!(host_ifname = %host_name, existed, "host veth gone"),
        Err(e) => errors.push(e),
    }

    for e in errors.iter().skip(1) {
        tracing::error!(error = %e, "DEL step failed");
    }
    match errors.into_iter().next() {
        Some(first) => Err(first),
        None => Ok(()),
    }
}
