//! The version of the policy computation (rules + identities → [`crate::mapstate::EndpointPolicy`]).
//!
//! A restarted manager trusts the policy slots a previous run wrote completely, without
//! recomputing them, when nothing they are computed from changed. The code that computes them
//! is one of those things: a build that computes a slot differently must not keep what an
//! older build wrote. The manager persists this version with its slot records and recomputes
//! every slot when it differs (docs/DATAPATH.md, "Restart that trusts what it wrote").
//!
//! Bump [`POLICY_COMPILER_VERSION`] with any change that can change a computed policy (entries,
//! verdicts, enforcement flags) for the same rules and identities. The test
//! `policy/tests/compiler_golden.rs` computes a fixed corpus of policies and endpoints and
//! compares a digest of the result with [`POLICY_COMPILER_GOLDENS`]: a change to the
//! computation without a new line there fails it, naming the line to add.

/// Version of the policy computation. Bumped with every change to what it computes.
pub const POLICY_COMPILER_VERSION: u32 = 2;

/// `(version, digest of the golden corpus computed by that version)`, oldest first; the last
/// line is [`POLICY_COMPILER_VERSION`]'s. Append a line with each bump; never edit a past one
/// (it records what that version computed).
pub const POLICY_COMPILER_GOLDENS: &[(u32, u64)] = &[
    (1, 0x0ea0_7e58_624e_0268),
    // 2: ClusterNetworkPolicy tiers computed (and the corpus gained cnp-tiers.yaml).
    (2, 0xf60d_490c_afb8_81bc),
];
