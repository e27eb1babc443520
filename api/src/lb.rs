//! Service load-balancing: the frontends (a Service's `ClusterIP`, port and protocol) the
//! datapath translates to one of their backends before policy, and what `GET /v1/services`
//! reports.

use serde::{Deserialize, Serialize};
use std::net::IpAddr;

/// An L4 protocol a frontend can have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum LbProto {
    /// TCP (6).
    Tcp,
    /// UDP (17).
    Udp,
    /// SCTP (132).
    Sctp,
}

impl LbProto {
    /// The IP protocol number.
    #[must_use]
    pub fn number(self) -> u8 {
        match self {
            Self::Tcp => 6,
            Self::Udp => 17,
            Self::Sctp => 132,
        }
    }
}

/// What a client addresses: a Service's `ClusterIP`, port and protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Frontend {
    /// The `ClusterIP`.
    pub addr: IpAddr,
    /// The Service port.
    pub port: u16,
    /// Protocol.
    pub proto: LbProto,
}

/// Where a frontend's connections go: a ready endpoint's address and its target port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Backend {
    /// The endpoint's address (same family as the frontend).
    pub addr: IpAddr,
    /// The port the endpoint serves the frontend on.
    pub port: u16,
}

/// One Service as the datapath has it (`GET /v1/services`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceInfo {
    /// `namespace/name`.
    pub name: String,
    /// Its frontends with their backends, in the order of the Service's ports.
    pub frontends: Vec<FrontendInfo>,
}

/// A frontend and its backends (`GET /v1/services`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrontendInfo {
    /// The frontend.
    pub frontend: Frontend,
    /// Its datapath id (the reverse-translation index in conntrack).
    pub id: u32,
    /// Ready backends; empty: the datapath leaves the frontend to kube-proxy.
    pub backends: Vec<Backend>,
}
