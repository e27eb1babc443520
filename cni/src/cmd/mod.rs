//! One module per CNI command.

pub mod add;
pub mod check;
pub mod del;
pub mod status;

use crate::env::CniEnv;
use crate::error::CniError;
use std::path::Path;

/// `CNI_NETNS`, which env validation guarantees for ADD and CHECK.
pub fn netns_path(env: &CniEnv) -> Result<&Path, CniError> {
    env.netns
        .as_deref()
        .ok_or_else(|| CniError::InvalidEnv("CNI_NETNS is required for this command".into()))
}
