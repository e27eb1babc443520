//! Properties of the map key encodings (stable counterparts of `fuzz/fuzz_targets/map_keys.rs`):
//! what the manager writes decodes back to what it meant, for any input.

use super::encode::port_blocks;
use super::state::ipcache_key;
use super::types::addr_from;
use proptest::prelude::*;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use weft_ebpf as abi;

fn prefix() -> impl Strategy<Value = ipnet::IpNet> {
    prop_oneof![
        (any::<u32>(), 0u8..=32).prop_map(|(a, l)| ipnet::IpNet::new(
            IpAddr::V4(Ipv4Addr::from(a)),
            l
        )
        .unwrap()),
        (any::<u128>(), 0u8..=128).prop_map(|(a, l)| ipnet::IpNet::new(
            IpAddr::V6(Ipv6Addr::from(a)),
            l
        )
        .unwrap()),
    ]
}

proptest! {
    #[test]
    fn ipcache_keys_decode_to_their_prefix(p in prefix()) {
        let key = ipcache_key(p);
        let data = key.data();
        let len = key.prefix_len() - abi::IPCACHE_FIXED_PREFIX;
        let back = ipnet::IpNet::new(addr_from(data.family, &data.addr), u8::try_from(len).unwrap()).unwrap();
        prop_assert_eq!(back, p.trunc());
        // Bits beyond the prefix are zero: two spellings of one prefix are one key.
        prop_assert_eq!(ipcache_key(p).data(), ipcache_key(p.trunc()).data());
    }

    #[test]
    fn port_blocks_cover_exactly_the_range(a in any::<u16>(), b in any::<u16>()) {
        let (lo, hi) = (a.min(b), a.max(b));
        let mut next = u32::from(lo);
        for (start, bits) in port_blocks(lo, hi) {
            prop_assert_eq!(u32::from(start), next, "blocks are contiguous and ordered");
            prop_assert_eq!(u32::from(start) % (1 << bits), 0, "blocks are aligned");
            next = u32::from(start) + (1 << bits);
        }
        prop_assert_eq!(next, u32::from(hi) + 1);
    }
}
