//! FNV-1a, the one hash of every name and digest that must stay the same across builds and
//! restarts (std's hashers promise no such thing): host veth names and MACs (`naming`), the
//! manager's persisted slot digests, slot keys and policy-input digests (64 bits), and the
//! directory its pinned programs live under (128 bits). Changing a byte here renames every
//! host veth and invalidates every persisted digest: the tests pin known values.

/// FNV-1a, 64 bits, fed byte slices in order.
#[derive(Debug, Clone, Copy)]
pub struct Fnv64(u64);

impl Fnv64 {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

    /// The hash of nothing yet.
    #[must_use]
    pub const fn new() -> Self {
        Self(Self::OFFSET)
    }

    /// Feeds `bytes`.
    pub fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(Self::PRIME);
        }
    }

    /// The hash of everything fed.
    #[must_use]
    pub const fn finish(self) -> u64 {
        self.0
    }
}

impl Default for Fnv64 {
    fn default() -> Self {
        Self::new()
    }
}

/// FNV-1a, 128 bits, fed byte slices in order.
#[derive(Debug, Clone, Copy)]
pub struct Fnv128(u128);

impl Fnv128 {
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
    const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;

    /// The hash of nothing yet.
    #[must_use]
    pub const fn new() -> Self {
        Self(Self::OFFSET)
    }

    /// Feeds `bytes`.
    pub fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u128::from(b)).wrapping_mul(Self::PRIME);
        }
    }

    /// The hash of everything fed.
    #[must_use]
    pub const fn finish(self) -> u128 {
        self.0
    }
}

impl Default for Fnv128 {
    fn default() -> Self {
        Self::new()
    }
}

/// The 64-bit FNV-1a hash of `bytes`.
#[must_use]
pub fn hash64(bytes: &[u8]) -> u64 {
    let mut h = Fnv64::new();
    h.feed(bytes);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_test_vectors() {
        // The FNV authors' vectors for "" and "a".
        assert_eq!(hash64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(hash64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(hash64(b"foobar"), 0x8594_4171_f739_67e8);
        let h128 = |b: &[u8]| {
            let mut h = Fnv128::new();
            h.feed(b);
            h.finish()
        };
        assert_eq!(h128(b""), 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d);
        assert_eq!(h128(b"a"), 0xd228_cb69_6f1a_8caf_7891_2b70_4e4a_8964);
    }

    #[test]
    fn feeding_in_pieces_is_feeding_at_once() {
        let mut h = Fnv64::new();
        h.feed(b"foo");
        h.feed(b"bar");
        assert_eq!(h.finish(), hash64(b"foobar"));
    }
}
