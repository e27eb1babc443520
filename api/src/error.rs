//! The error body of every non-2xx answer, and its machine-readable kind.

use serde::{Deserialize, Serialize};

/// Every non-2xx answer carries this body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiError {
    /// Machine-readable kind; callers decide on it, never on `message`.
    pub kind: ApiErrorKind,
    /// What went wrong and how to fix it.
    pub message: String,
}

/// What kind of failure an [`ApiError`] reports. On the wire it is a `snake_case` string
/// (`pool_exhausted`, `busy`, ...), the same strings the API has always sent; a kind this
/// version does not know parses as [`ApiErrorKind::Other`] with its string kept, so an older
/// client still reads a newer manager's errors.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum ApiErrorKind {
    /// No address left in a pool (HTTP 507). The CNI reports it as its code 100.
    PoolExhausted,
    /// No such endpoint, map or path (404).
    NotFound,
    /// Retryable: the endpoint is being deleted, or the kvstore cannot number a new identity
    /// now (503). The CNI reports "try again later" (code 11).
    Busy,
    /// The manager is still starting (503); retryable like [`Self::Busy`].
    NotReady,
    /// The request contradicts the current state: another container owns the endpoint, or it
    /// is registered already with other values (409).
    Conflict,
    /// The request is malformed or names something invalid (400).
    Invalid,
    /// The path does not take that method (405).
    MethodNotAllowed,
    /// The body is larger than [`crate::MAX_REQUEST_BODY`] (413).
    TooLarge,
    /// The manager failed (500): the message says where.
    Internal,
    /// Client side: the answer was not an API error body (a proxy's page, a truncated body).
    Http,
    /// A kind this version does not know (from a newer manager), as it was sent.
    Other(String),
}

impl ApiErrorKind {
    /// The wire string.
    #[must_use]
    pub fn as_str(&self) -> &str {
        match self {
            Self::PoolExhausted => "pool_exhausted",
            Self::NotFound => "not_found",
            Self::Busy => "busy",
            Self::NotReady => "not_ready",
            Self::Conflict => "conflict",
            Self::Invalid => "invalid",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::TooLarge => "too_large",
            Self::Internal => "internal",
            Self::Http => "http",
            Self::Other(s) => s,
        }
    }

    /// Should the caller try the same request again later?
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Busy | Self::NotReady)
    }
}

impl From<String> for ApiErrorKind {
    fn from(s: String) -> Self {
        match s.as_str() {
            "pool_exhausted" => Self::PoolExhausted,
            "not_found" => Self::NotFound,
            "busy" => Self::Busy,
            "not_ready" => Self::NotReady,
            "conflict" => Self::Conflict,
            "invalid" => Self::Invalid,
            "method_not_allowed" => Self::MethodNotAllowed,
            "too_large" => Self::TooLarge,
            "internal" => Self::Internal,
            "http" => Self::Http,
            _ => Self::Other(s),
        }
    }
}

impl From<&str> for ApiErrorKind {
    fn from(s: &str) -> Self {
        Self::from(s.to_owned())
    }
}

impl From<ApiErrorKind> for String {
    fn from(k: ApiErrorKind) -> Self {
        match k {
            ApiErrorKind::Other(s) => s,
            known => known.as_str().to_owned(),
        }
    }
}

impl std::fmt::Display for ApiErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KNOWN: [ApiErrorKind; 10] = [
        ApiErrorKind::PoolExhausted,
        ApiErrorKind::NotFound,
        ApiErrorKind::Busy,
        ApiErrorKind::NotReady,
        ApiErrorKind::Conflict,
        ApiErrorKind::Invalid,
        ApiErrorKind::MethodNotAllowed,
        ApiErrorKind::TooLarge,
        ApiErrorKind::Internal,
        ApiErrorKind::Http,
    ];

    #[test]
    fn kinds_travel_as_the_strings_the_api_always_sent() {
        let body = r#"{"kind":"pool_exhausted","message":"pool 10.0.0.0/24 is full"}"#;
        let e: ApiError = serde_json::from_str(body).unwrap();
        assert_eq!(e.kind, ApiErrorKind::PoolExhausted);
        assert_eq!(serde_json::to_string(&e).unwrap(), body);
        for k in KNOWN {
            let wire = serde_json::to_value(&k).unwrap();
            assert_eq!(wire, serde_json::Value::String(k.as_str().into()));
            assert_eq!(serde_json::from_value::<ApiErrorKind>(wire).unwrap(), k);
        }
    }

    #[test]
    fn an_unknown_kind_is_kept_not_refused() {
        let e: ApiError =
            serde_json::from_str(r#"{"kind":"quota_exceeded","message":"m"}"#).unwrap();
        assert_eq!(e.kind, ApiErrorKind::Other("quota_exceeded".into()));
        assert_eq!(e.kind.to_string(), "quota_exceeded");
        assert!(!e.kind.is_retryable());
    }
}
