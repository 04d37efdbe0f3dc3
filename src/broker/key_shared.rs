//! Key_Shared routing as Apache Pulsar 4.x routes by default: the sticky
//! key of an entry, its hash onto the 1..=65535 slot range, and the
//! consistent-hashing ring of consumers that owns each slot.
//!
//! | here | Pulsar 4.x |
//! |---|---|
//! | [`sticky_key`] | `Commands.peekStickyKey`: `ordering_key`, else `partition_key` (base64-decoded when `partition_key_b64_encoded`), else `"NONE_KEY"` |
//! | [`murmur3_32`] | `Murmur3_32Hash.makeHash` (MurmurHash3 x86 32-bit, seed 0, little-endian blocks, result `& Integer.MAX_VALUE`) |
//! | [`sticky_key_hash`] | `StickyKeyConsumerSelectorUtils.makeStickyKeyHash(key, keyHashRange)`: `makeHash(key) % 65535 + 1`, never `STICKY_KEY_HASH_NOT_SET` (0) |
//! | [`ConsistentHashingSelector`] | `ConsistentHashingStickyKeyConsumerSelector` with `ConsumerNameIndexTracker`: [`DEFAULT_REPLICA_POINTS`] points per consumer at `makeStickyKeyHash(name + "\0" + nameIndex + "\0" + i)`; a slot goes to the ring point at or after it (`ceilingEntry`), wrapping to the first |
//!
//! Why this selector: a Key_Shared subscription's `keySharedMeta.keySharedMode`
//! defaults to `AUTO_SPLIT` (absent meta is AUTO_SPLIT too), and with
//! `AUTO_SPLIT` `PersistentStickyKeyDispatcherMultipleConsumers` builds a
//! `ConsistentHashingStickyKeyConsumerSelector(subscriptionKeySharedConsistentHashingReplicaPoints)`
//! because `subscriptionKeySharedUseConsistentHashing` defaults to `true`
//! (`ServiceConfiguration`, replica points default 100). The key hash range is
//! `Range.of(STICKY_KEY_HASH_NOT_SET + 1, DEFAULT_RANGE_SIZE - 1)` with
//! `DEFAULT_RANGE_SIZE = 2 << 15` (65536): slots 1..=65535. `STICKY` mode
//! (client-chosen hash ranges) is not implemented: a subscribe in it is
//! routed by this ring.
//!
//! Ring point collisions are resolved as Pulsar does: the consumer that
//! took the point first keeps it; the colliding ones queue behind it and
//! the first of them takes the point when it leaves.
//!
//! Iteration order is deterministic (`BTreeMap`): the same consumers added
//! in the same order give the same routing on every run, so a simulator
//! and `serve` route a key to the same consumer.

use std::collections::{BTreeMap, BTreeSet};

/// `StickyKeyConsumerSelector.DEFAULT_RANGE_SIZE` (`2 << 15`).
pub const DEFAULT_RANGE_SIZE: u32 = 2 << 15;
/// `StickyKeyConsumerSelector.DEFAULT_REPLICA_POINTS` and the default of
/// `subscriptionKeySharedConsistentHashingReplicaPoints`.
pub const DEFAULT_REPLICA_POINTS: u32 = 100;
/// `STICKY_KEY_HASH_NOT_SET`: never a key's slot.
pub const STICKY_KEY_HASH_NOT_SET: u32 = 0;
/// The sticky key of an entry with neither an ordering key nor a partition
/// key (`Commands.NONE_KEY`).
pub const NONE_KEY: &[u8] = b"NONE_KEY";

const C1: u32 = 0xcc9e_2d51;
const C2: u32 = 0x1b87_3593;

fn mix_k1(k1: u32) -> u32 {
    k1.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2)
}

/// `Murmur3_32Hash.getInstance().makeHash(bytes)`: MurmurHash3 (x86, 32
/// bit, seed 0) with the sign bit cleared, so the result is in `0..2^31`.
pub fn murmur3_32(bytes: &[u8]) -> u32 {
    let mut h1: u32 = 0;
    let mut blocks = bytes.chunks_exact(4);
    for b in &mut blocks {
        let k1 = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        h1 ^= mix_k1(k1);
        h1 = h1.rotate_left(13).wrapping_mul(5).wrapping_add(0xe654_6b64);
    }
    let mut k1 = 0u32;
    for (i, b) in blocks.remainder().iter().enumerate() {
        k1 ^= u32::from(*b) << (i * 8);
    }
    // Pulsar mixes the (possibly empty) tail unconditionally.
    h1 ^= mix_k1(k1);
    h1 ^= bytes.len() as u32;
    h1 ^= h1 >> 16;
    h1 = h1.wrapping_mul(0x85eb_ca6b);
    h1 ^= h1 >> 13;
    h1 = h1.wrapping_mul(0xc2b2_ae35);
    h1 ^= h1 >> 16;
    h1 & i32::MAX as u32
}

/// The slot of a sticky key: `makeHash(key) % 65535 + 1`, in `1..=65535`.
pub fn sticky_key_hash(key: &[u8]) -> u32 {
    let size = DEFAULT_RANGE_SIZE - 1 - STICKY_KEY_HASH_NOT_SET;
    murmur3_32(key) % size + STICKY_KEY_HASH_NOT_SET + 1
}

/// The sticky key of an entry from its metadata fields
/// (`Commands.peekStickyKey`): the ordering key, else the partition key
/// (base64-decoded when flagged; an undecodable one is used as its bytes),
/// else [`NONE_KEY`].
pub fn sticky_key(
    ordering_key: Option<&[u8]>,
    partition_key: Option<&str>,
    partition_key_b64: bool,
) -> Vec<u8> {
    if let Some(k) = ordering_key {
        return k.to_vec();
    }
    match partition_key {
        Some(k) if partition_key_b64 => base64_decode(k).unwrap_or_else(|| k.as_bytes().to_vec()),
        Some(k) => k.as_bytes().to_vec(),
        None => NONE_KEY.to_vec(),
    }
}

/// Standard base64 (RFC 4648, `=` padding optional); `None` for any other
/// character.
fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let bytes = s.trim_end_matches('=').as_bytes();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for &c in bytes {
        acc = (acc << 6) | val(c)?;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

/// One ring point: the consumer that owns it and those that collided with
/// it, in arrival order (`HashRingPointEntry`).
#[derive(Debug, Clone)]
struct RingPoint<C> {
    selected: C,
    colliding: Vec<C>,
}

/// `ConsistentHashingStickyKeyConsumerSelector`: each consumer holds
/// `points` ring points at `sticky_key_hash(name + "\0" + nameIndex + "\0" + i)`;
/// a slot is served by the consumer of the first point at or after it,
/// wrapping to the first point. `nameIndex` is the lowest index not in use
/// by another consumer of the same name (`ConsumerNameIndexTracker`), so
/// consumers sharing a name do not collide on every point.
#[derive(Debug, Clone)]
pub struct ConsistentHashingSelector<C> {
    points: u32,
    ring: BTreeMap<u32, RingPoint<C>>,
    /// Consumer -> (name, name index).
    members: BTreeMap<C, (String, u32)>,
    /// Name -> name indexes in use.
    name_indexes: BTreeMap<String, BTreeSet<u32>>,
}

impl<C: Ord + Clone> ConsistentHashingSelector<C> {
    /// An empty ring with `points` points per consumer (Pulsar's
    /// `subscriptionKeySharedConsistentHashingReplicaPoints`).
    pub fn new(points: u32) -> Self {
        Self {
            points,
            ring: BTreeMap::new(),
            members: BTreeMap::new(),
            name_indexes: BTreeMap::new(),
        }
    }

    fn point_hash(name: &str, name_index: u32, i: u32) -> u32 {
        sticky_key_hash(format!("{name}\0{name_index}\0{i}").as_bytes())
    }

    /// Adds consumer `id` named `name` (a consumer already on the ring is
    /// left as it is).
    pub fn add_consumer(&mut self, id: C, name: &str) {
        if self.members.contains_key(&id) {
            return;
        }
        let used = self.name_indexes.entry(name.to_string()).or_default();
        let name_index = (0..).find(|i| !used.contains(i)).unwrap_or(0);
        used.insert(name_index);
        for i in 0..self.points {
            let h = Self::point_hash(name, name_index, i);
            match self.ring.get_mut(&h) {
                Some(p) => p.colliding.push(id.clone()),
                None => {
                    self.ring.insert(
                        h,
                        RingPoint {
                            selected: id.clone(),
                            colliding: Vec::new(),
                        },
                    );
                }
            }
        }
        self.members.insert(id, (name.to_string(), name_index));
    }

    /// Removes consumer `id`: each of its points goes to the first
    /// consumer that collided with it, or leaves the ring.
    pub fn remove_consumer(&mut self, id: &C) {
        let Some((name, name_index)) = self.members.remove(id) else {
            return;
        };
        for i in 0..self.points {
            let h = Self::point_hash(&name, name_index, i);
            let Some(p) = self.ring.get_mut(&h) else {
                continue;
            };
            if p.selected == *id {
                if p.colliding.is_empty() {
                    self.ring.remove(&h);
                } else {
                    p.selected = p.colliding.remove(0);
                }
            } else {
                p.colliding.retain(|c| c != id);
            }
        }
        if let Some(used) = self.name_indexes.get_mut(&name) {
            used.remove(&name_index);
            if used.is_empty() {
                self.name_indexes.remove(&name);
            }
        }
    }

    /// The consumer serving slot `hash` (`select(int hash)`); `None` with
    /// no consumer.
    pub fn select(&self, hash: u32) -> Option<&C> {
        self.ring
            .range(hash..)
            .next()
            .or_else(|| self.ring.iter().next())
            .map(|(_, p)| &p.selected)
    }

    /// The ring points `(slot, consumer)` in slot order.
    pub fn points(&self) -> impl Iterator<Item = (u32, &C)> {
        self.ring.iter().map(|(h, p)| (*h, &p.selected))
    }

    /// Whether no consumer is on the ring.
    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests {
    use super::*;

    /// Pulsar 3.x's `ConsistentHashingStickyKeyConsumerSelectorTest.testGetConsumerKeyHashRanges`
    /// (3 points per consumer, a ring over the full int range, points at
    /// `Murmur3_32Hash.makeHash(name + "\0" + i)` in that version) expects
    /// these range ends; every range ends at a ring point of the consumer
    /// it is listed under, so they are `makeHash` of the point keys.
    #[test]
    fn murmur3_matches_pulsars_ring_points() {
        let expected: [(&str, [u32; 3]); 3] = [
            ("consumer1", [242_013_991, 1_656_011_842, 1_914_695_766]),
            ("consumer2", [90_164_503, 119_056_334, 722_195_656]),
            ("consumer3", [242_377_547, 382_436_667, 1_707_482_097]),
        ];
        for (name, points) in expected {
            let mut got: Vec<u32> = (0..3)
                .map(|i| murmur3_32(format!("{name}\0{i}").as_bytes()))
                .collect();
            got.sort_unstable();
            assert_eq!(got, points, "{name}");
        }
    }

    /// The same consumers on Pulsar 4's ring: points at
    /// `makeStickyKeyHash(name + "\0" + nameIndex + "\0" + i)` =
    /// `makeHash(..) % 65535 + 1` (values computed from that formula by an
    /// independent MurmurHash3 implementation); a slot goes to the point at
    /// or after it, past the last point to the first.
    #[test]
    fn the_ring_routes_a_slot_to_the_next_point_wrapping() {
        let mut s = ConsistentHashingSelector::new(3);
        for name in ["consumer1", "consumer2", "consumer3"] {
            s.add_consumer(name.to_string(), name);
        }
        let expected: Vec<(u32, &str)> = vec![
            (6_668, "consumer2"),
            (14_358, "consumer3"),
            (18_366, "consumer1"),
            (29_990, "consumer3"),
            (39_817, "consumer1"),
            (52_979, "consumer2"),
            (60_442, "consumer1"),
            (63_679, "consumer2"),
            (65_183, "consumer3"),
        ];
        let got: Vec<(u32, &str)> = s.points().map(|(h, c)| (h, c.as_str())).collect();
        assert_eq!(got, expected);
        let at = |h| s.select(h).map(String::as_str);
        assert_eq!(at(1), Some("consumer2"));
        assert_eq!(at(6_668), Some("consumer2"));
        assert_eq!(at(6_669), Some("consumer3"));
        assert_eq!(at(65_183), Some("consumer3"));
        assert_eq!(at(65_184), Some("consumer2"), "wraps to the first point");
        // "NONE_KEY" hashes to slot 56505 (makeHash 504741539).
        assert_eq!(sticky_key_hash(NONE_KEY), 56_505);
        assert_eq!(at(sticky_key_hash(NONE_KEY)), Some("consumer1"));
        // Removing consumer1 hands its slots to the next points.
        s.remove_consumer(&"consumer1".to_string());
        assert_eq!(s.points().count(), 6);
        let at = |h| s.select(h).map(String::as_str);
        assert_eq!(at(sticky_key_hash(NONE_KEY)), Some("consumer2"));
        assert_eq!(at(18_366), Some("consumer3"));
    }

    #[test]
    fn a_slot_is_never_zero_and_keys_follow_pulsars_precedence() {
        for k in [&b""[..], b"a", b"NONE_KEY", b"key-1", &[0xff; 17]] {
            let h = sticky_key_hash(k);
            assert!((1..=65_535).contains(&h), "{h}");
            assert_eq!(h, murmur3_32(k) % 65_535 + 1);
        }
        assert_eq!(sticky_key(Some(b"o"), Some("p"), false), b"o");
        assert_eq!(sticky_key(None, Some("p"), false), b"p");
        assert_eq!(sticky_key(None, Some("aGk="), true), b"hi");
        assert_eq!(sticky_key(None, Some("aGk"), true), b"hi");
        assert_eq!(sticky_key(None, None, false), NONE_KEY);
    }

    /// Two consumers with one name get name indexes 0 and 1, so their
    /// points differ; a collision keeps the first consumer and hands the
    /// point to the second when the first leaves.
    #[test]
    fn consumers_sharing_a_name_get_distinct_points() {
        let mut s = ConsistentHashingSelector::new(10);
        s.add_consumer(1u32, "c");
        s.add_consumer(2u32, "c");
        let ones = s.points().filter(|(_, c)| **c == 1).count();
        let twos = s.points().filter(|(_, c)| **c == 2).count();
        assert_eq!(ones + twos, s.points().count());
        assert!(ones > 0 && twos > 0);
        s.remove_consumer(&1);
        assert!(s.points().all(|(_, c)| *c == 2));
        // The leaver's index is free again: the next "c" takes index 0.
        s.add_consumer(3u32, "c");
        let mut t = ConsistentHashingSelector::new(10);
        t.add_consumer(3u32, "c");
        let threes: Vec<u32> = s
            .points()
            .filter(|(_, c)| **c == 3)
            .map(|(h, _)| h)
            .collect();
        let alone: Vec<u32> = t.points().map(|(h, _)| h).collect();
        assert!(threes.iter().all(|h| alone.contains(h)));
    }
}
