//! DEL: best effort and idempotent. Every step runs; the first error is reported.

use crate::env::CniEnv;
use crate::error::CniError;
use crate::manager::{self, Released};
use crate::netconf::NetConf;
use crate::netlink::{self, veth};
use weft_api::client::Client;
use weft_api::naming::host_ifname;

/// Releases the endpoint (the manager checks it belongs to this container). Neither
/// `CNI_NETNS` nor `prevResult` is needed: the second DEL of containerd's `RemovePodSandbox`
/// has neither.
///
/// The manager sets the host veth down (its routes go with it) before it frees the IPs, answers,
/// and deletes the veth afterwards: the deletion blocks in the kernel for ~20 ms (RCU grace
/// periods in `unregister_netdevice`) and nothing needs to wait for it. Only when the manager
/// is unreachable (the DEL is queued) or fails does this process delete the veth itself.
pub async fn run(env: &CniEnv, conf: &NetConf) -> Result<(), CniError> {
    let client = Client::new(&conf.socket);
    let host_name = host_ifname(&env.container_id, &env.ifname);
    let mut errors = Vec::new();
    match manager::release_or_queue(&client, &env.container_id, &env.ifname).await {
        Ok(Released::ByManager(released)) => {
            tracing::info!(?released, "manager released the endpoint");
            return Ok(());
        }
        Ok(Released::Queued) => {}
        Err(e) => errors.push(e),
    }
    let link = match netlink::connect() {
        Ok(nl) => veth::delete(&nl, &host_name).await,
        Err(e) => Err(e),
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
