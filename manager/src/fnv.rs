//! FNV-1a, 64 bit: the digests the manager persists (slot contents, slot keys, policy inputs)
//! must stay the same across builds, which std's hashers do not promise.

/// An FNV-1a hash fed byte slices in order.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fnv(u64);

impl Fnv {
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    pub(crate) fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }

    pub(crate) fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(Self::PRIME);
        }
    }

    pub(crate) fn finish(self) -> u64 {
        self.0
    }
}

/// The FNV-1a hash of `bytes`.
pub(crate) fn hash(bytes: &[u8]) -> u64 {
    let mut h = Fnv::new();
    h.feed(bytes);
    h.finish()
}

#[cfg(test)]
mod tests {
    #[test]
    fn known_values() {
        // Published FNV-1a 64 test vectors.
        assert_eq!(super::hash(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(super::hash(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
