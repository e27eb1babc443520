//! The node's underlay address when `--node-ip` is not given: the IPv4 address of the device
//! the default route uses, else of the first non-loopback device that has one.

use std::net::IpAddr;

/// The detected address, or why there is none.
pub fn detect() -> Result<IpAddr, String> {
    let default_dev = std::fs::read_to_string("/proc/net/route")
        .ok()
        .and_then(|t| default_route_device(&t));
    let addrs: Vec<(String, IpAddr)> = nix::ifaddrs::getifaddrs()
        .map_err(|e| format!("cannot list addresses: {e}"))?
        .filter_map(|a| {
            let ip = a.address?.as_sockaddr_in()?.ip();
            Some((a.interface_name, IpAddr::V4(ip)))
        })
        .collect();
    pick(default_dev.as_deref(), &addrs).ok_or_else(|| {
        "cannot find this node's underlay address (no non-loopback IPv4 address): pass --node-ip".into()
    })
}

fn default_route_device(proc_net_route: &str) -> Option<String> {
    proc_net_route.lines().skip(1).find_map(|l| {
        let mut f = l.split_whitespace();
        let dev = f.next()?;
        (f.next() == Some("00000000") && f.next().is_some()).then(|| dev.to_owned())
    })
}

fn pick(default_dev: Option<&str>, addrs: &[(String, IpAddr)]) -> Option<IpAddr> {
    let usable = |(dev, ip): &&(String, IpAddr)| {
        dev != "lo" && !ip.is_loopback() && !dev.starts_with("weft_")
    };
    default_dev
        .and_then(|d| addrs.iter().filter(usable).find(|(dev, _)| dev == d))
        .or_else(|| addrs.iter().find(usable))
        .map(|(_, ip)| *ip)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_route_device_wins_then_first_non_loopback() {
        let table =
            "Iface\tDestination\tGateway\nunder0\t0000000A\t00000000\neth1\t00000000\t0102000A\n";
        assert_eq!(default_route_device(table).as_deref(), Some("eth1"));
        let addrs = vec![
            ("lo".to_string(), "127.0.0.1".parse().unwrap()),
            ("weft_host".to_string(), "10.1.0.1".parse().unwrap()),
            ("under0".to_string(), "192.0.2.1".parse().unwrap()),
            ("eth1".to_string(), "198.51.100.7".parse().unwrap()),
        ];
        assert_eq!(
            pick(Some("eth1"), &addrs),
            Some("198.51.100.7".parse().unwrap())
        );
        assert_eq!(pick(None, &addrs), Some("192.0.2.1".parse().unwrap()));
        assert_eq!(pick(None, &addrs[..2]), None);
    }
}
