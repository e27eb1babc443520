//! Process-level helpers with no knowledge of endpoints or policy: the allocator, the clock,
//! mutexes that survive poisoning, and the one synchronous netlink socket. Calls nothing else
//! in the crate.

pub mod allocator;
pub mod clock;
pub mod locks;
pub(crate) mod netlink_sync;
