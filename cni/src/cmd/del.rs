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
pub async fn run(env: &CniEnv, conf: &NetConf) -> Result<(), CniError> {
    let client = Client::new(&conf.socket);
    let host_name = host_ifname(&env.container_id, &env.ifname);
    let mut errors = Vec::new();

    match manager::delete(&client, &env.container_id, &env.ifname).await {
        Ok(resp) => tracing::info!(
            released = ?resp.deleted.as_ref().map(|e| e.id),
            "manager released the endpoint"
        ),
        Err(e) => errors.push(e),
    }
    let link = async {
        let nl = netlink::connect()?;
        veth::delete(&nl, &host_name).await
    };
    match link.await {
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
