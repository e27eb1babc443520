//! STATUS and GC (spec 1.1.0).

use crate::error::CniError;
use crate::manager;
use crate::netconf::NetConf;
use crate::version::SpecVersion;
use weft_api::GcRequest;
use weft_api::client::Client;

fn require_11(conf: &NetConf, cmd: &str) -> Result<(), CniError> {
    if conf.version < SpecVersion::V11 {
        return Err(CniError::IncompatibleVersion(format!(
            "{cmd} needs cniVersion 1.1.0 or later, the config says {}",
            conf.cni_version
        )));
    }
    Ok(())
}

/// 0 only if the manager is ready and some pool can allocate; 50 unreachable/not ready, 51 full.
pub async fn status(conf: &NetConf) -> Result<(), CniError> {
    require_11(conf, "STATUS")?;
    let client = Client::new(&conf.socket);
    let sock = conf.socket.display();
    let unavailable = |e: CniError| {
        CniError::NotAvailable(format!("weft-manager at {sock} is not available: {e}"))
    };
    let code = manager::healthz(&client).await.map_err(unavailable)?;
    if code != 200 {
        return Err(CniError::NotAvailable(format!(
            "weft-manager at {sock} is not ready (healthz answered {code})"
        )));
    }
    let st = manager::status(&client).await.map_err(unavailable)?;
    if st.pools.iter().any(|p| p.used < p.capacity) {
        Ok(())
    } else {
        let pools: Vec<String> = st
            .pools
            .iter()
            .map(|p| format!("{} ({}/{})", p.cidr, p.used, p.capacity))
            .collect();
        Err(CniError::LimitedConnectivity(format!(
            "no address left in any pool: {}",
            pools.join(", ")
        )))
    }
}

/// Releases every endpoint not in `cni.dev/valid-attachments`.
pub async fn gc(conf: &NetConf) -> Result<(), CniError> {
    require_11(conf, "GC")?;
    let valid = conf
        .valid_attachments
        .clone()
        .ok_or_else(|| CniError::InvalidConfig("GC needs cni.dev/valid-attachments".into()))?;
    let resp = manager::gc(
        &Client::new(&conf.socket),
        &GcRequest {
            valid_attachments: valid,
        },
    )
    .await?;
    tracing::info!(released = resp.released.len(), "gc done");
    Ok(())
}
