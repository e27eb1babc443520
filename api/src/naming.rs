//! Names and MACs derived from (container id, ifname), so the CNI, the manager and a restarted
//! manager all arrive at the same host veth without asking each other.

/// Prefix of every host-side veth.
pub const HOST_IFNAME_PREFIX: &str = "weft";

/// Linux `IFNAMSIZ - 1`.
pub const MAX_IFNAME_LEN: usize = 15;

fn fnv1a64(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            // Separator so ("ab","c") and ("a","bc") differ.
            h ^= 0xff;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        for b in p.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// Host-side veth name: `weft` + 11 hex digits of a hash of (container id, ifname): 15 bytes.
#[must_use]
pub fn host_ifname(container_id: &str, ifname: &str) -> String {
    let h = fnv1a64(&[container_id, ifname]);
    format!("{HOST_IFNAME_PREFIX}{:011x}", h & 0x0fff_ffff_ffff)
}

/// Is `name` shaped like a host-side veth (`weft` + 11 hex digits)? `weft_host` and
/// `weft_net` are not.
#[must_use]
pub fn is_host_ifname(name: &str) -> bool {
    name.strip_prefix(HOST_IFNAME_PREFIX)
        .is_some_and(|h| h.len() == 11 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Deterministic, locally administered unicast MACs (host side, pod side) for the pair.
/// Fixed MACs let both sides install permanent neighbours without reading the links back.
#[must_use]
pub fn veth_macs(container_id: &str, ifname: &str) -> ([u8; 6], [u8; 6]) {
    let h = fnv1a64(&[container_id, ifname, "mac"]).to_be_bytes();
    // 0x02: locally administered, unicast. Last byte distinguishes the two ends.
    let host = [0x02, h[0], h[1], h[2], h[3], 0x01];
    let pod = [0x02, h[0], h[1], h[2], h[3], 0x02];
    (host, pod)
}

/// `aa:bb:cc:dd:ee:ff`.
#[must_use]
pub fn format_mac(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_ifname_fits_and_is_stable() {
        let a = host_ifname("abc", "eth0");
        assert_eq!(a.len(), MAX_IFNAME_LEN);
        assert!(a.starts_with(HOST_IFNAME_PREFIX));
        assert_eq!(a, host_ifname("abc", "eth0"));
        assert_ne!(a, host_ifname("abc", "eth1"));
        assert_ne!(host_ifname("ab", "ceth0"), host_ifname("abc", "eth0"));
    }

    #[test]
    fn macs_are_local_unicast_and_distinct() {
        let (h, p) = veth_macs("abc", "eth0");
        assert_ne!(h, p);
        for m in [h, p] {
            assert_eq!(m[0] & 0x01, 0, "unicast");
            assert_eq!(m[0] & 0x02, 0x02, "locally administered");
        }
        assert_eq!(format_mac(&h).len(), 17);
    }

    #[test]
    fn host_ifname_shape() {
        assert!(is_host_ifname(&host_ifname("c", "eth0")));
        assert!(!is_host_ifname("weft_host"));
        assert!(!is_host_ifname("weft_net"));
        assert!(!is_host_ifname("weft0123456789ab"));
    }
}
