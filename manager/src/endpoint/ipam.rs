//! Per-family address pools carved from the node CIDRs.
//!
//! Pure bookkeeping: the registry persists every change in the same sled transaction as the
//! endpoint that owns it, and rebuilds pools from the store at start.

use ipnet::IpNet;
use std::collections::BTreeSet;
use std::net::IpAddr;

use crate::node::nth_address;

/// IPAM failures.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IpamError {
    /// Every address of the pool is taken.
    #[error(
        "IP pool {pool} is exhausted ({capacity} addresses in use): delete unused pods or give the node a larger pod CIDR"
    )]
    Exhausted {
        /// Pool CIDR.
        pool: IpNet,
        /// Allocatable addresses.
        capacity: u128,
    },
    /// The address is outside the pool, or reserved.
    #[error("{addr} is not allocatable in pool {pool}")]
    NotInPool {
        /// The address.
        addr: IpAddr,
        /// Pool CIDR.
        pool: IpNet,
    },
}

/// One pool: a node CIDR minus the network, broadcast (IPv4) and router addresses.
#[derive(Debug, Clone)]
pub struct Pool {
    cidr: IpNet,
    /// Offsets (address - network) in use by endpoints.
    used: BTreeSet<u128>,
    /// Next-fit cursor: a freed address is not handed out again at once, so a late packet or a
    /// stale neighbour entry for a deleted pod does not hit its successor.
    cursor: u128,
}

/// Offset of the router IP in every pool.
const ROUTER_OFFSET: u128 = 1;

impl Pool {
    /// An empty pool over `cidr`.
    #[must_use]
    pub fn new(cidr: IpNet) -> Self {
        Self {
            cidr,
            used: BTreeSet::new(),
            cursor: ROUTER_OFFSET,
        }
    }

    /// The CIDR.
    #[must_use]
    pub fn cidr(&self) -> IpNet {
        self.cidr
    }

    /// The router (gateway) address.
    #[must_use]
    pub fn router(&self) -> IpAddr {
        nth_address(self.cidr, ROUTER_OFFSET)
    }

    fn size(&self) -> u128 {
        let host_bits = u32::from(self.cidr.max_prefix_len() - self.cidr.prefix_len());
        1u128.checked_shl(host_bits).unwrap_or(u128::MAX)
    }

    /// Highest allocatable offset (the broadcast address is reserved for IPv4).
    fn last_offset(&self) -> u128 {
        match self.cidr {
            IpNet::V4(_) => self.size() - 2,
            IpNet::V6(_) => self.size() - 1,
        }
    }

    /// Addresses allocatable in total.
    #[must_use]
    pub fn capacity(&self) -> u128 {
        // Offsets 2..=last: 0 is the network, 1 the router.
        self.last_offset().saturating_sub(ROUTER_OFFSET)
    }

    /// Addresses in use.
    #[must_use]
    pub fn used(&self) -> u128 {
        self.used.len() as u128
    }

    /// Does this pool hold `addr`'s family?
    #[must_use]
    pub fn same_family(&self, addr: IpAddr) -> bool {
        matches!(
            (self.cidr, addr),
            (IpNet::V4(_), IpAddr::V4(_)) | (IpNet::V6(_), IpAddr::V6(_))
        )
    }

    fn offset_of(&self, addr: IpAddr) -> Option<u128> {
        let off = match (self.cidr, addr) {
            (IpNet::V4(n), IpAddr::V4(a)) if n.contains(&a) => {
                u128::from(u32::from(a) - u32::from(n.network()))
            }
            (IpNet::V6(n), IpAddr::V6(a)) if n.contains(&a) => {
                u128::from(a) - u128::from(n.network())
            }
            _ => return None,
        };
        (off > ROUTER_OFFSET && off <= self.last_offset()).then_some(off)
    }

    /// Picks the next free address after the cursor, wrapping once.
    pub fn allocate(&mut self) -> Result<IpAddr, IpamError> {
        if self.used() >= self.capacity() {
            return Err(IpamError::Exhausted {
                pool: self.cidr,
                capacity: self.capacity(),
            });
        }
        let first = ROUTER_OFFSET + 1;
        let last = self.last_offset();
        let mut off = if self.cursor >= last {
            first
        } else {
            self.cursor + 1
        };
        // Bounded: the pool is not full, so a free offset exists within `used + 1` steps of
        // any start when scanning past used entries in order.
        while self.used.contains(&off) {
            off = if off >= last { first } else { off + 1 };
        }
        self.used.insert(off);
        self.cursor = off;
        Ok(nth_address(self.cidr, off))
    }

    /// Marks `addr` used (restore from the store). Returns false if it was already used.
    pub fn claim(&mut self, addr: IpAddr) -> Result<bool, IpamError> {
        let off = self.offset_of(addr).ok_or(IpamError::NotInPool {
            addr,
            pool: self.cidr,
        })?;
        Ok(self.used.insert(off))
    }

    /// Frees `addr`. Freeing an address that is not used is a no-op (DEL is idempotent).
    pub fn release(&mut self, addr: IpAddr) {
        if let Some(off) = self.offset_of(addr) {
            self.used.remove(&off);
        }
    }

    /// Is `addr` currently allocated?
    #[must_use]
    pub fn is_used(&self, addr: IpAddr) -> bool {
        self.offset_of(addr).is_some_and(|o| self.used.contains(&o))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(c: &str) -> Pool {
        Pool::new(c.parse().unwrap())
    }

    #[test]
    fn v4_reserves_network_router_broadcast() {
        let mut p = pool("10.0.1.0/29");
        assert_eq!(p.capacity(), 5);
        let got: Vec<String> = (0..5).map(|_| p.allocate().unwrap().to_string()).collect();
        assert_eq!(
            got,
            ["10.0.1.2", "10.0.1.3", "10.0.1.4", "10.0.1.5", "10.0.1.6"]
        );
        let err = p.allocate().unwrap_err();
        assert!(err.to_string().contains("10.0.1.0/29"), "{err}");
    }

    #[test]
    fn v6_reserves_subnet_anycast_and_router() {
        let mut p = pool("fd00::/126");
        assert_eq!(p.capacity(), 2);
        assert_eq!(p.allocate().unwrap().to_string(), "fd00::2");
        assert_eq!(p.allocate().unwrap().to_string(), "fd00::3");
        assert!(p.allocate().is_err());
        assert_eq!(pool("fd00::/64").capacity(), (1u128 << 64) - 2);
    }

    #[test]
    fn freed_address_is_not_reused_immediately() {
        let mut p = pool("10.0.1.0/24");
        let a = p.allocate().unwrap();
        p.release(a);
        let b = p.allocate().unwrap();
        assert_ne!(a, b);
        assert_eq!(p.used(), 1);
    }

    #[test]
    fn allocation_wraps_around_to_freed_addresses() {
        let mut p = pool("10.0.1.0/30");
        let a = p.allocate().unwrap();
        p.release(a);
        assert_eq!(p.allocate().unwrap(), a);
    }

    #[test]
    fn claim_restores_and_rejects_reserved() {
        let mut p = pool("10.0.1.0/24");
        assert!(p.claim("10.0.1.9".parse().unwrap()).unwrap());
        assert!(!p.claim("10.0.1.9".parse().unwrap()).unwrap());
        assert!(p.claim("10.0.1.1".parse().unwrap()).is_err(), "router");
        assert!(p.claim("10.0.1.255".parse().unwrap()).is_err(), "broadcast");
        assert!(p.claim("10.0.2.1".parse().unwrap()).is_err(), "outside");
        assert!(p.is_used("10.0.1.9".parse().unwrap()));
        p.release("10.0.1.9".parse().unwrap());
        assert_eq!(p.used(), 0);
    }
}
