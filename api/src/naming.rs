//! Names and MACs derived from (container id, ifname), so the CNI, the manager and a restarted
//! manager all arrive at the same host veth without asking each other.

use crate::MacAddr;

/// Prefix of every host-side veth.
pub const HOST_IFNAME_PREFIX: &str = "weft";

/// Linux `IFNAMSIZ - 1`.
pub const MAX_IFNAME_LEN: usize = 15;

/// Longest `CNI_CONTAINERID` accepted. Runtimes use 64 hex digits; the bound leaves room for
/// other schemes while keeping ids usable in URLs, file names and logs.
pub const MAX_CONTAINER_ID_LEN: usize = 128;

/// Why `id` is not a valid container id (CNI SPEC: an alphanumeric, then `[a-zA-Z0-9_.-]`, at
/// most [`MAX_CONTAINER_ID_LEN`] bytes), or None.
#[must_use]
pub fn container_id_problem(id: &str) -> Option<String> {
    if id.len() > MAX_CONTAINER_ID_LEN {
        return Some(format!(
            "container id is {} bytes long; at most {MAX_CONTAINER_ID_LEN} are accepted (runtimes use 64 hex digits)",
            id.len()
        ));
    }
    let mut chars = id.chars();
    let ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    (!ok).then(|| format!("container id {id:?} is empty or has characters outside [a-zA-Z0-9_.-]"))
}

/// Why `name` is not a valid interface name (Linux `dev_valid_name`: 1-15 bytes, no `/`, `:`
/// or whitespace, not `.` or `..`; Weft also refuses control characters), or None.
#[must_use]
pub fn ifname_problem(name: &str) -> Option<String> {
    let bad = name.is_empty()
        || name.len() > MAX_IFNAME_LEN
        || name == "."
        || name == ".."
        || name
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace() || c.is_control());
    bad.then(|| {
        format!(
            "interface name {name:?} is not valid (1-15 bytes, no '/', ':', whitespace or control characters, not '.' or '..')"
        )
    })
}

/// FNV-1a of `parts` with a 0xff byte between them, so ("ab","c") and ("a","bc") differ.
fn fnv1a64(parts: &[&str]) -> u64 {
    let mut h = crate::fnv::Fnv64::new();
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            h.feed(&[0xff]);
        }
        h.feed(p.as_bytes());
    }
    h.finish()
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
pub fn veth_macs(container_id: &str, ifname: &str) -> (MacAddr, MacAddr) {
    let h = fnv1a64(&[container_id, ifname, "mac"]).to_be_bytes();
    // 0x02: locally administered, unicast. Last byte distinguishes the two ends.
    let host = [0x02, h[0], h[1], h[2], h[3], 0x01];
    let pod = [0x02, h[0], h[1], h[2], h[3], 0x02];
    (MacAddr::new(host), MacAddr::new(pod))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_ids_and_ifnames_are_bounded() {
        assert_eq!(container_id_problem(&"a".repeat(64)), None);
        assert_eq!(
            container_id_problem(&"a".repeat(MAX_CONTAINER_ID_LEN)),
            None
        );
        assert!(container_id_problem(&"a".repeat(MAX_CONTAINER_ID_LEN + 1)).is_some());
        assert!(container_id_problem(&"a".repeat(100_000)).is_some_and(|m| m.len() < 200));
        for bad in ["", "-a", "a/b", "a b", "a\0", "a%2F"] {
            assert!(container_id_problem(bad).is_some(), "{bad:?}");
        }
        assert_eq!(ifname_problem("eth0"), None);
        for bad in [
            "",
            ".",
            "..",
            "../../x",
            "a:b",
            "a b",
            "a\n",
            "0123456789abcdef",
        ] {
            assert!(ifname_problem(bad).is_some(), "{bad:?}");
        }
    }

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
            assert_eq!(m.octets()[0] & 0x01, 0, "unicast");
            assert_eq!(m.octets()[0] & 0x02, 0x02, "locally administered");
        }
        assert_eq!(h.to_string().len(), 17);
    }

    #[test]
    fn names_and_macs_keep_their_values_across_versions() {
        // A running node's host veths carry these names and MACs: a change here would lose
        // every endpoint across an upgrade.
        assert_eq!(host_ifname("abc", "eth0"), "weft93a6975b88d");
        let (h, p) = veth_macs("abc", "eth0");
        assert_eq!(h.to_string(), "02:f2:e4:00:6e:01");
        assert_eq!(p.to_string(), "02:f2:e4:00:6e:02");
    }

    #[test]
    fn host_ifname_shape() {
        assert!(is_host_ifname(&host_ifname("c", "eth0")));
        assert!(!is_host_ifname("weft_host"));
        assert!(!is_host_ifname("weft_net"));
        assert!(!is_host_ifname("weft0123456789ab"));
    }
}
