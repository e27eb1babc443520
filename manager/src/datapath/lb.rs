//! The Service maps (`lb_services`, `lb_backends`, `lb_revnat`, `lb_flows`): how a frontend and
//! its backends are written, read back after a restart, and dumped (docs/DATAPATH.md,
//! "Services").

use super::error::DatapathError;
use super::state::{Maps, ignore_missing};
use super::types::{LbTable, addr_from};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::net::IpAddr;
use weft_api::lb::{Backend, Frontend, LbProto};
use weft_ebpf::{self as abi, map_names as names};

fn family_addr(addr: IpAddr) -> (u8, [u8; 16]) {
    let mut raw = [0u8; 16];
    match addr {
        IpAddr::V4(a) => {
            raw[..4].copy_from_slice(&a.octets());
            (abi::FAMILY_V4, raw)
        }
        IpAddr::V6(a) => (abi::FAMILY_V6, a.octets()),
    }
}

fn proto_of(n: u8) -> Option<LbProto> {
    [LbProto::Tcp, LbProto::Udp, LbProto::Sctp]
        .into_iter()
        .find(|p| p.number() == n)
}

pub(crate) fn lb_key(f: &Frontend) -> abi::LbKey {
    let (family, addr) = family_addr(f.addr);
    abi::LbKey {
        addr,
        port: f.port.to_be(),
        proto: f.proto.number(),
        family,
    }
}

fn revnat_value(f: &Frontend) -> abi::LbAddr {
    let (family, addr) = family_addr(f.addr);
    abi::LbAddr {
        addr,
        port: f.port.to_be(),
        family,
        proto: f.proto.number(),
    }
}

fn backend_value(b: &Backend) -> abi::LbAddr {
    let (family, addr) = family_addr(b.addr);
    abi::LbAddr {
        addr,
        port: b.port.to_be(),
        family,
        proto: 0,
    }
}

fn backend_of(v: &abi::LbAddr) -> Backend {
    Backend {
        addr: addr_from(v.family, &v.addr),
        port: u16::from_be(v.port),
    }
}

fn frontend_of(v: &abi::LbAddr) -> Option<Frontend> {
    Some(Frontend {
        addr: addr_from(v.family, &v.addr),
        port: u16::from_be(v.port),
        proto: proto_of(v.proto)?,
    })
}

impl Maps {
    /// [`super::Datapath::lb_upsert`]: backends first (slots `0..n`), then the reverse entry,
    /// then the frontend's entry with the new count, then the slots beyond it, so that a
    /// packet always finds `count` backends written.
    pub(crate) fn lb_upsert(
        &mut self,
        id: u32,
        frontend: &Frontend,
        backends: &[Backend],
        previous: usize,
    ) -> Result<(), DatapathError> {
        for (slot, b) in (0u32..).zip(backends) {
            self.lb_backends
                .insert(abi::LbBackendKey { id, slot }, backend_value(b), 0)
                .map_err(DatapathError::map(names::LB_BACKENDS))?;
        }
        self.lb_revnat
            .insert(id, revnat_value(frontend), 0)
            .map_err(DatapathError::map(names::LB_REVNAT))?;
        let key = lb_key(frontend);
        if backends.is_empty() {
            ignore_missing(self.lb_services.remove(&key))
                .map_err(DatapathError::map(names::LB_SERVICES))?;
        } else {
            let count = u32::try_from(backends.len()).map_err(|_| {
                DatapathError::Invalid(format!("{} backends for one frontend", backends.len()))
            })?;
            self.lb_services
                .insert(key, abi::LbService { id, count }, 0)
                .map_err(DatapathError::map(names::LB_SERVICES))?;
        }
        self.lb_remove_slots(id, backends.len(), previous)
    }

    fn lb_remove_slots(&mut self, id: u32, from: usize, to: usize) -> Result<(), DatapathError> {
        for slot in from..to {
            let slot = u32::try_from(slot).unwrap_or(u32::MAX);
            ignore_missing(self.lb_backends.remove(&abi::LbBackendKey { id, slot }))
                .map_err(DatapathError::map(names::LB_BACKENDS))?;
        }
        Ok(())
    }

    /// [`super::Datapath::lb_remove`]: the frontend's entry first, then its backends and its
    /// reverse entry.
    pub(crate) fn lb_remove(
        &mut self,
        id: u32,
        frontend: &Frontend,
        previous: usize,
    ) -> Result<(), DatapathError> {
        ignore_missing(self.lb_services.remove(&lb_key(frontend)))
            .map_err(DatapathError::map(names::LB_SERVICES))?;
        self.lb_remove_slots(id, 0, previous)?;
        ignore_missing(self.lb_revnat.remove(&id)).map_err(DatapathError::map(names::LB_REVNAT))
    }

    /// [`super::Datapath::lb_frontends`]: every frontend of `lb_revnat` with the backends of
    /// its `lb_services` count.
    pub(crate) fn lb_frontends(&self) -> Result<LbTable, DatapathError> {
        let mut fronts = BTreeMap::new();
        for item in &self.lb_revnat {
            let (id, v) = item.map_err(DatapathError::map(names::LB_REVNAT))?;
            if let Some(f) = frontend_of(&v) {
                fronts.insert(id, f);
            }
        }
        let mut counts = BTreeMap::new();
        for item in &self.lb_services {
            let (_, v) = item.map_err(DatapathError::map(names::LB_SERVICES))?;
            counts.insert(v.id, v.count);
        }
        let mut slots: BTreeMap<u32, BTreeMap<u32, Backend>> = BTreeMap::new();
        for item in &self.lb_backends {
            let (k, v) = item.map_err(DatapathError::map(names::LB_BACKENDS))?;
            if counts.get(&k.id).is_some_and(|&c| k.slot < c) {
                slots
                    .entry(k.id)
                    .or_default()
                    .insert(k.slot, backend_of(&v));
            }
        }
        Ok(fronts
            .into_iter()
            .map(|(id, f)| {
                let backends = slots
                    .remove(&id)
                    .unwrap_or_default()
                    .into_values()
                    .collect();
                (id, (f, backends))
            })
            .collect())
    }
}

/// `weftctl map dump` of the Service maps.
pub(crate) fn dump(maps: &Maps, name: &str) -> Option<Result<Vec<Value>, DatapathError>> {
    let rows = match name {
        names::LB_SERVICES => (|| {
            let mut out = Vec::new();
            for item in &maps.lb_services {
                let (k, v) = item.map_err(DatapathError::map(names::LB_SERVICES))?;
                out.push(json!({
                    "frontend": addr_from(k.family, &k.addr).to_string(),
                    "port": u16::from_be(k.port),
                    "proto": k.proto,
                    "id": v.id,
                    "backends": v.count,
                }));
            }
            Ok(out)
        })(),
        names::LB_BACKENDS => (|| {
            let mut out = Vec::new();
            for item in &maps.lb_backends {
                let (k, v) = item.map_err(DatapathError::map(names::LB_BACKENDS))?;
                out.push(json!({
                    "id": k.id,
                    "slot": k.slot,
                    "backend": addr_from(v.family, &v.addr).to_string(),
                    "port": u16::from_be(v.port),
                }));
            }
            Ok(out)
        })(),
        names::LB_REVNAT => (|| {
            let mut out = Vec::new();
            for item in &maps.lb_revnat {
                let (id, v) = item.map_err(DatapathError::map(names::LB_REVNAT))?;
                out.push(json!({
                    "id": id,
                    "frontend": addr_from(v.family, &v.addr).to_string(),
                    "port": u16::from_be(v.port),
                    "proto": v.proto,
                }));
            }
            Ok(out)
        })(),
        names::LB_FLOWS => (|| {
            let mut out = Vec::new();
            for item in &maps.lb_flows {
                let (k, v) = item.map_err(DatapathError::map(names::LB_FLOWS))?;
                out.push(json!({
                    "src": addr_from(k.family, &k.saddr).to_string(),
                    "sport": u16::from_be(k.sport),
                    "frontend": addr_from(k.family, &k.daddr).to_string(),
                    "port": u16::from_be(k.dport),
                    "proto": k.proto,
                    "backend": addr_from(v.backend.family, &v.backend.addr).to_string(),
                    "backend_port": u16::from_be(v.backend.port),
                    "slot": v.slot,
                }));
            }
            Ok(out)
        })(),
        _ => return None,
    };
    Some(rows)
}

/// `weftctl map list`: entries of a Service map.
pub(crate) fn count(maps: &Maps, name: &str) -> Option<usize> {
    Some(match name {
        names::LB_SERVICES => maps.lb_services.keys().count(),
        names::LB_BACKENDS => maps.lb_backends.keys().count(),
        names::LB_REVNAT => maps.lb_revnat.keys().count(),
        names::LB_FLOWS => maps.lb_flows.keys().count(),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_carry_family_network_order_and_protocol() {
        let f = Frontend {
            addr: "10.96.0.10".parse().unwrap(),
            port: 80,
            proto: LbProto::Udp,
        };
        let k = lb_key(&f);
        assert_eq!(k.family, abi::FAMILY_V4);
        assert_eq!(&k.addr[..4], &[10, 96, 0, 10]);
        assert!(k.addr[4..].iter().all(|&b| b == 0));
        assert_eq!(k.port, 80u16.to_be());
        assert_eq!(k.proto, 17);
        assert_eq!(frontend_of(&revnat_value(&f)), Some(f));
        let b = Backend {
            addr: "fd00::5".parse().unwrap(),
            port: 8080,
        };
        assert_eq!(backend_of(&backend_value(&b)), b);
        assert_eq!(proto_of(1), None);
    }
}
