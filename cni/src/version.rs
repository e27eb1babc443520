//! Spec versions this plugin speaks and how their result formats differ.

use crate::error::CniError;

/// Every version VERSION reports, oldest first.
pub const SUPPORTED: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// The newest version: used when the caller did not say.
pub const LATEST: &str = "1.1.0";

/// A supported spec version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SpecVersion {
    /// 0.3.0 and 0.3.1 (same result format).
    V03,
    /// 0.4.0 (adds CHECK).
    V04,
    /// 1.0.0 (ips lose `version`).
    V10,
    /// 1.1.0 (adds STATUS, GC).
    V11,
}

impl SpecVersion {
    /// Parses a `cniVersion`; anything not in [`SUPPORTED`] is error code 1.
    pub fn parse(v: &str) -> Result<Self, CniError> {
        match v {
            "0.3.0" | "0.3.1" => Ok(Self::V03),
            "0.4.0" => Ok(Self::V04),
            "1.0.0" => Ok(Self::V10),
            "1.1.0" => Ok(Self::V11),
            other => Err(CniError::IncompatibleVersion(format!(
                "unsupported cniVersion {other:?}; supported: {}",
                SUPPORTED.join(", ")
            ))),
        }
    }

    /// Before 1.0.0, each `ips` entry carried `"version": "4"|"6"`.
    #[must_use]
    pub fn ips_have_version(self) -> bool {
        self < Self::V10
    }

    /// 1.1.0 added `mtu` to interfaces.
    #[must_use]
    pub fn interfaces_have_mtu(self) -> bool {
        self >= Self::V11
    }
}

/// The VERSION command's answer.
#[must_use]
pub fn version_info(requested: Option<&str>) -> serde_json::Value {
    serde_json::json!({
        "cniVersion": requested.unwrap_or(LATEST),
        "supportedVersions": SUPPORTED,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_supported_and_rejects_others() {
        for v in SUPPORTED {
            assert!(SpecVersion::parse(v).is_ok(), "{v}");
        }
        for v in ["0.2.0", "1.2.0", "", "1.0", "v1.0.0"] {
            assert_eq!(SpecVersion::parse(v).unwrap_err().code(), 1, "{v}");
        }
    }

    #[test]
    fn version_info_shape() {
        let v = version_info(None);
        assert_eq!(v["cniVersion"], "1.1.0");
        assert_eq!(v["supportedVersions"].as_array().unwrap().len(), 5);
        assert_eq!(version_info(Some("0.4.0"))["cniVersion"], "0.4.0");
    }
}
