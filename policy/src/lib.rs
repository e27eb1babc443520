//! placeholder until the policy issue lands
