//! The checker's integer-keyed maps and their hasher.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Hashes the checker's integer keys (a [`MessageRef`](super::MessageRef)'s
/// three integers, a key, a consumer id, a token) folded by multiply-rotate
/// and finished with a 64-bit mixer: the window's index is looked up on
/// every delivery and ack, and std's SipHash, built against adversarial
/// keys, was the checker's largest cost. The keys are the simulator's own,
/// so no flooding resistance is needed; no result depends on a map's
/// iteration order (with std's per-process random seeds it could not have
/// been deterministic).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct IntKeyHasher(u64);

/// A map keyed by integers (see [`IntKeyHasher`]).
pub(super) type IntMap<K, V> = HashMap<K, V, BuildHasherDefault<IntKeyHasher>>;

impl Hasher for IntKeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }

    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(26) ^ x).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn write_i64(&mut self, x: i64) {
        self.write_u64(x as u64);
    }

    fn write_u32(&mut self, x: u32) {
        self.write_u64(u64::from(x));
    }

    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }

    fn finish(&self) -> u64 {
        // splitmix64's finaliser: every input bit reaches the top bits,
        // which hashbrown uses for its control bytes
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}
