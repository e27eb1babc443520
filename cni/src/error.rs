//! The one place where failures become CNI error codes (CNI SPEC "Error" section).
//!
//! Every command returns `Result<_, CniError>`; `main` prints the error object on stdout and exits
//! non-zero. Codes 1–99 are the spec's well-known ones, 100+ are Weft's own.

use weft_api::ApiErrorKind;
use weft_api::client::ClientError;

/// Weft's plugin-specific codes (the spec leaves 100+ to plugins).
pub mod code {
    /// Incompatible CNI version.
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    /// Invalid necessary environment variables.
    pub const INVALID_ENV: u32 = 4;
    /// Failed to decode content.
    pub const DECODE: u32 = 6;
    /// Invalid network config.
    pub const INVALID_CONFIG: u32 = 7;
    /// Try again later.
    pub const TRY_AGAIN_LATER: u32 = 11;
    /// STATUS: plugin not available.
    pub const NOT_AVAILABLE: u32 = 50;
    /// STATUS: limited connectivity (no address can be allocated).
    pub const LIMITED_CONNECTIVITY: u32 = 51;
    /// The manager's address pool is exhausted.
    pub const POOL_EXHAUSTED: u32 = 100;
    /// The interface (or the endpoint) already exists.
    pub const INTERFACE_EXISTS: u32 = 101;
    /// A netlink or netns operation failed.
    pub const NETLINK: u32 = 102;
    /// The manager refused the request or answered something unusable.
    pub const MANAGER: u32 = 103;
    /// CHECK found the container's networking differs from prevResult.
    pub const CHECK_MISMATCH: u32 = 104;
}

/// Everything that can make a CNI command fail.
#[derive(Debug, thiserror::Error)]
pub enum CniError {
    /// Unsupported `cniVersion`, or a command the requested version does not have.
    #[error("{0}")]
    IncompatibleVersion(String),
    /// A missing or malformed `CNI_*` variable (or an unknown `CNI_COMMAND`).
    #[error("{0}")]
    InvalidEnv(String),
    /// stdin is not a JSON network configuration.
    #[error("failed to decode network configuration: {0}")]
    Decode(String),
    /// The configuration decodes but a field is wrong.
    #[error("invalid network configuration: {0}")]
    InvalidConfig(String),
    /// The manager could not be reached (or is not ready yet).
    #[error("{msg}")]
    TryAgainLater {
        /// What happened, naming the socket.
        msg: String,
        /// Underlying cause.
        details: String,
    },
    /// STATUS: the manager is unreachable or not ready.
    #[error("{0}")]
    NotAvailable(String),
    /// STATUS: no pool can allocate.
    #[error("{0}")]
    LimitedConnectivity(String),
    /// The manager has no address left in a pool (the message names it).
    #[error("{0}")]
    PoolExhausted(String),
    /// `CNI_IFNAME` (or the host veth) already exists.
    #[error("{0}")]
    InterfaceExists(String),
    /// A netlink/netns operation failed.
    #[error("{context}: {source}")]
    Netlink {
        /// What was being done.
        context: String,
        /// The kernel's answer (or why the step could not be done).
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The manager rejected the request.
    #[error("weft-manager rejected the request: {0}")]
    Manager(String),
    /// CHECK mismatch.
    #[error("check failed: {0}")]
    CheckMismatch(String),
}

impl CniError {
    /// The CNI error code.
    #[must_use]
    pub fn code(&self) -> u32 {
        match self {
            Self::IncompatibleVersion(_) => code::INCOMPATIBLE_VERSION,
            Self::InvalidEnv(_) => code::INVALID_ENV,
            Self::Decode(_) => code::DECODE,
            Self::InvalidConfig(_) => code::INVALID_CONFIG,
            Self::TryAgainLater { .. } => code::TRY_AGAIN_LATER,
            Self::NotAvailable(_) => code::NOT_AVAILABLE,
            Self::LimitedConnectivity(_) => code::LIMITED_CONNECTIVITY,
            Self::PoolExhausted(_) => code::POOL_EXHAUSTED,
            Self::InterfaceExists(_) => code::INTERFACE_EXISTS,
            Self::Netlink { .. } => code::NETLINK,
            Self::Manager(_) => code::MANAGER,
            Self::CheckMismatch(_) => code::CHECK_MISMATCH,
        }
    }

    fn details(&self) -> String {
        match self {
            Self::TryAgainLater { details, .. } => details.clone(),
            Self::Netlink { source, .. } => source.to_string(),
            _ => String::new(),
        }
    }

    /// A netlink failure while doing `context`.
    pub fn netlink(
        context: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self::Netlink {
            context: context.into(),
            source: source.into(),
        }
    }

    /// The spec's error object for `cni_version`.
    #[must_use]
    pub fn to_json(&self, cni_version: &str) -> serde_json::Value {
        // Built directly: the error path itself must not be able to fail.
        let mut obj = serde_json::json!({
            "cniVersion": cni_version,
            "code": self.code(),
            "msg": self.to_string(),
        });
        let details = self.details();
        if let (false, Some(fields)) = (details.is_empty(), obj.as_object_mut()) {
            fields.insert("details".into(), details.into());
        }
        obj
    }
}

/// Maps a manager client failure onto CNI codes: unreachable → 11 naming the socket, API kinds
/// to their codes, anything else → 103.
impl From<ClientError> for CniError {
    fn from(e: ClientError) -> Self {
        match e {
            ClientError::Unreachable {
                ref path,
                ref source,
            } => Self::TryAgainLater {
                msg: format!(
                    "weft-manager is unreachable at {}; try again later",
                    path.display()
                ),
                details: source.to_string(),
            },
            ClientError::Transport {
                ref path,
                ref source,
            } => Self::TryAgainLater {
                msg: format!(
                    "connection to weft-manager at {} failed; try again later",
                    path.display()
                ),
                details: source.to_string(),
            },
            ClientError::Api { body, .. } => match body.kind {
                ApiErrorKind::PoolExhausted => Self::PoolExhausted(body.message),
                kind if kind.is_retryable() => Self::TryAgainLater {
                    msg: format!("weft-manager is not ready: {}", body.message),
                    details: String::new(),
                },
                kind => Self::Manager(format!("{} ({kind})", body.message)),
            },
            ClientError::Decode { .. } | ClientError::Encode(_) => Self::Manager(e.to_string()),
            // Permanent: retrying the same input cannot succeed.
            ClientError::TooLarge { .. } | ClientError::BadRequest { .. } => {
                Self::InvalidConfig(e.to_string())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use weft_api::ApiError;

    fn api(kind: &str, message: &str) -> ClientError {
        ClientError::Api {
            status: 409,
            body: ApiError {
                kind: ApiErrorKind::from(kind.to_owned()),
                message: message.into(),
            },
        }
    }

    #[test]
    fn client_errors_map_to_codes() {
        let unreachable = CniError::from(ClientError::Unreachable {
            path: PathBuf::from("/run/x.sock"),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        });
        assert_eq!(unreachable.code(), 11);
        assert!(unreachable.to_string().contains("/run/x.sock"));

        let exhausted = CniError::from(api("pool_exhausted", "pool 10.0.0.0/24 is full"));
        assert_eq!(exhausted.code(), 100);
        assert!(exhausted.to_string().contains("10.0.0.0/24"));

        assert_eq!(CniError::from(api("not_ready", "starting")).code(), 11);
        assert_eq!(CniError::from(api("conflict", "x")).code(), 103);
        assert_eq!(CniError::from(api("invalid", "x")).code(), 103);
        let decode = ClientError::Decode {
            status: 200,
            source: serde_json::from_str::<u8>("").unwrap_err(),
        };
        assert_eq!(CniError::from(decode).code(), 103);
    }

    #[test]
    fn every_variant_has_its_code() {
        let cases = [
            (CniError::IncompatibleVersion(String::new()), 1),
            (CniError::InvalidEnv(String::new()), 4),
            (CniError::Decode(String::new()), 6),
            (CniError::InvalidConfig(String::new()), 7),
            (CniError::NotAvailable(String::new()), 50),
            (CniError::LimitedConnectivity(String::new()), 51),
            (CniError::PoolExhausted(String::new()), 100),
            (CniError::InterfaceExists(String::new()), 101),
            (CniError::netlink("x", "y"), 102),
            (CniError::Manager(String::new()), 103),
            (CniError::CheckMismatch(String::new()), 104),
        ];
        for (e, c) in cases {
            assert_eq!(e.code(), c, "{e:?}");
        }
    }

    #[test]
    fn json_has_spec_fields() {
        let v = CniError::TryAgainLater {
            msg: "m".into(),
            details: "d".into(),
        }
        .to_json("1.0.0");
        assert_eq!(v["cniVersion"], "1.0.0");
        assert_eq!(v["code"], 11);
        assert_eq!(v["msg"], "m");
        assert_eq!(v["details"], "d");
        let v = CniError::InvalidEnv("x".into()).to_json("0.4.0");
        assert!(v.get("details").is_none());
    }
}
