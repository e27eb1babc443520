//! What the policy bookkeeping can fail with.

use weft_policy::identity::IdentityError;

use crate::store::StoreError;

/// Policy bookkeeping failures.
#[derive(Debug, thiserror::Error)]
pub enum PolicyStateError {
    /// Identity allocation or persistence.
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// Store.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A rule text that parsed before does not any more (cannot happen: parsing is pure).
    #[error("policy rule no longer parses: {0}")]
    Reparse(String),
    /// In kvstore mode a new label set needs a number from the cluster, and none was given.
    #[error("a new identity for {0} must be allocated through the kvstore")]
    NeedsCluster(String),
}
