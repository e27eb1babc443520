//! The one MAC address type: parsed and formatted here only (`aa:bb:cc:dd:ee:ff`, lowercase on
//! output), and a string on the wire and in the manager's store.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// An Ethernet (EUI-48) address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct MacAddr([u8; 6]);

/// A string that is not `aa:bb:cc:dd:ee:ff` (six pairs of hex digits).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{input:?} is not a MAC address (aa:bb:cc:dd:ee:ff)")]
pub struct MacParseError {
    /// The input, cut to 40 characters.
    input: String,
}

impl MacAddr {
    /// The address of these octets.
    #[must_use]
    pub const fn new(octets: [u8; 6]) -> Self {
        Self(octets)
    }

    /// Its octets, in wire order.
    #[must_use]
    pub const fn octets(self) -> [u8; 6] {
        self.0
    }
}

impl From<[u8; 6]> for MacAddr {
    fn from(octets: [u8; 6]) -> Self {
        Self(octets)
    }
}

impl FromStr for MacAddr {
    type Err = MacParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || MacParseError {
            input: s.chars().take(40).collect(),
        };
        let mut out = [0u8; 6];
        let mut parts = s.split(':');
        for b in &mut out {
            let part = parts.next().ok_or_else(bad)?;
            if part.len() != 2 || !part.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(bad());
            }
            *b = u8::from_str_radix(part, 16).map_err(|_| bad())?;
        }
        match parts.next() {
            None => Ok(Self(out)),
            Some(_) => Err(bad()),
        }
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, octet) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{octet:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Serialize for MacAddr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for MacAddr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_formats_one_way() {
        let m: MacAddr = "02:AB:cd:00:0f:ff".parse().unwrap();
        assert_eq!(m.octets(), [0x02, 0xab, 0xcd, 0x00, 0x0f, 0xff]);
        assert_eq!(m.to_string(), "02:ab:cd:00:0f:ff");
        assert_eq!(format!("{m:?}"), "02:ab:cd:00:0f:ff");
        assert_eq!(serde_json::to_string(&m).unwrap(), "\"02:ab:cd:00:0f:ff\"");
        let back: MacAddr = serde_json::from_str("\"02:ab:cd:00:0f:ff\"").unwrap();
        assert_eq!(back, m);
    }

    #[test]
    fn anything_else_is_refused_naming_the_input() {
        for bad in [
            "",
            "zz:zz",
            "02:00:00:00:00",
            "02:00:00:00:00:01:02",
            "2:0:0:0:0:1",
            "+2:00:00:00:00:01",
            "02-00-00-00-00-01",
            "02:00:00:00:00:01 ",
        ] {
            let e = bad.parse::<MacAddr>().unwrap_err();
            assert!(e.to_string().contains("not a MAC address"), "{bad:?}: {e}");
        }
        assert!(serde_json::from_str::<MacAddr>("\"zz\"").is_err());
        let long = "a".repeat(10_000);
        assert!(long.parse::<MacAddr>().unwrap_err().to_string().len() < 100);
    }
}
