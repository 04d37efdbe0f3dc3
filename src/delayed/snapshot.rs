//! The bucket snapshot format (Pulsar's `pulsar.delay` proto2 messages,
//! hand-written with explicit tags so no `protoc` is needed), the runtime
//! index entry, segment cutting and bucket keys.
//!
//! Layout of one snapshot: entry 0 is [`SnapshotMetadata`] (one
//! [`SnapshotSegmentMetadata`] per segment), entries `1..=N` are
//! [`SnapshotSegment`]s. Bitmaps are the 32-bit RoaringBitmap portable
//! serialization of one ledger's entry ids in one segment, so snapshots are
//! byte-compatible with Pulsar's Java implementation.

use std::collections::BTreeMap;

use prost::Message;
use roaring::RoaringBitmap;

use super::error::DelayedError;
use crate::proto::presence::{check_required, RequiredSpec};

/// Prefix of the cursor property that names a committed bucket snapshot:
/// `#pulsar.internal.delayed.bucket_<start>_<end>` → snapshot id.
pub const BUCKET_KEY_PREFIX: &str = "#pulsar.internal.delayed.bucket";

/// The cursor-property key of the bucket covering ledgers
/// `[start_ledger_id, end_ledger_id]`.
pub fn bucket_key(start_ledger_id: i64, end_ledger_id: i64) -> String {
    format!("{BUCKET_KEY_PREFIX}_{start_ledger_id}_{end_ledger_id}")
}

/// Parses a bucket key back into `(start, end)`; `None` for keys that are
/// not bucket keys or are malformed (`start > end`, negative, non-numeric).
pub fn parse_bucket_key(key: &str) -> Option<(i64, i64)> {
    let rest = key.strip_prefix(BUCKET_KEY_PREFIX)?.strip_prefix('_')?;
    let (s, e) = rest.split_once('_')?;
    let (s, e) = (s.parse::<i64>().ok()?, e.parse::<i64>().ok()?);
    (0 <= s && s <= e).then_some((s, e))
}

/// Pulsar `DelayedIndex.DelayedOperationType` (`DELAY = 0`, `CANCEL = 1`);
/// the tracker only writes `DELAY` implicitly (field absent).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum DelayedOperationType {
    /// A delayed message (the default).
    Delay = 0,
    /// A cancelled delayed message (unused by the tracker).
    Cancel = 1,
}

/// `message DelayedIndex { required uint64 timestamp = 1; required uint64
/// ledger_id = 2; required uint64 entry_id = 3; optional DelayedOperationType
/// delayed_operation_type = 4 [default = DELAY]; }`. `timestamp` in ms.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DelayedIndex {
    /// Delivery time (ms since the epoch).
    #[prost(uint64, required, tag = "1")]
    pub timestamp: u64,
    /// Ledger id.
    #[prost(uint64, required, tag = "2")]
    pub ledger_id: u64,
    /// Entry id.
    #[prost(uint64, required, tag = "3")]
    pub entry_id: u64,
    /// Operation type; absent means `DELAY`.
    #[prost(enumeration = "DelayedOperationType", optional, tag = "4")]
    pub delayed_operation_type: Option<i32>,
}

/// `message SnapshotSegment { repeated DelayedIndex indexes = 1; }`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SnapshotSegment {
    /// Indexes in `(timestamp, ledger_id, entry_id)` order.
    #[prost(message, repeated, tag = "1")]
    pub indexes: Vec<DelayedIndex>,
}

/// `message SnapshotSegmentMetadata { map<uint64, bytes>
/// delayed_index_bit_map = 1; required uint64 max_schedule_timestamp = 2;
/// required uint64 min_schedule_timestamp = 3; }`.
///
/// [`prost::Message`] is implemented by hand so that every map entry is
/// written with both its key and its value, as protobuf-java (and protoc's
/// C++ runtime) write map entries: prost's derived encoding omits a key
/// equal to 0, which would make the bitmap of ledger 0 differ from the
/// bytes Pulsar writes (decoding is the same either way).
#[derive(Clone, PartialEq, Default, Debug)]
pub struct SnapshotSegmentMetadata {
    /// Ledger id → portable RoaringBitmap bytes of that ledger's entry ids in
    /// the segment (encoded in ascending ledger order).
    pub delayed_index_bit_map: BTreeMap<u64, Vec<u8>>,
    /// Largest timestamp in the segment (ms).
    pub max_schedule_timestamp: u64,
    /// Smallest timestamp in the segment (ms).
    pub min_schedule_timestamp: u64,
}

fn bit_map_entry_len(ledger_id: &u64, bytes: &Vec<u8>) -> usize {
    prost::encoding::uint64::encoded_len(1, ledger_id)
        + prost::encoding::bytes::encoded_len(2, bytes)
}

impl prost::Message for SnapshotSegmentMetadata {
    fn encode_raw(&self, buf: &mut impl prost::bytes::BufMut) {
        use prost::encoding::{encode_key, encode_varint, WireType};
        for (ledger_id, bytes) in &self.delayed_index_bit_map {
            encode_key(1, WireType::LengthDelimited, buf);
            encode_varint(bit_map_entry_len(ledger_id, bytes) as u64, buf);
            prost::encoding::uint64::encode(1, ledger_id, buf);
            prost::encoding::bytes::encode(2, bytes, buf);
        }
        prost::encoding::uint64::encode(2, &self.max_schedule_timestamp, buf);
        prost::encoding::uint64::encode(3, &self.min_schedule_timestamp, buf);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: prost::encoding::WireType,
        buf: &mut impl prost::bytes::Buf,
        ctx: prost::encoding::DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        use prost::encoding::{btree_map, bytes, skip_field, uint64};
        match tag {
            1 => btree_map::merge(
                uint64::merge,
                bytes::merge,
                &mut self.delayed_index_bit_map,
                buf,
                ctx,
            ),
            2 => uint64::merge(wire_type, &mut self.max_schedule_timestamp, buf, ctx),
            3 => uint64::merge(wire_type, &mut self.min_schedule_timestamp, buf, ctx),
            _ => skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        let map: usize = self
            .delayed_index_bit_map
            .iter()
            .map(|(k, v)| {
                let len = bit_map_entry_len(k, v);
                prost::encoding::key_len(1) + prost::encoding::encoded_len_varint(len as u64) + len
            })
            .sum();
        map + prost::encoding::uint64::encoded_len(2, &self.max_schedule_timestamp)
            + prost::encoding::uint64::encoded_len(3, &self.min_schedule_timestamp)
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}

/// `message SnapshotMetadata { repeated SnapshotSegmentMetadata
/// metadata_list = 1; }` (entry 0 of a snapshot).
#[derive(Clone, PartialEq, prost::Message)]
pub struct SnapshotMetadata {
    /// One entry per segment, segment `i + 1` at index `i`.
    #[prost(message, repeated, tag = "1")]
    pub metadata_list: Vec<SnapshotSegmentMetadata>,
}

/// One delayed index `(timestamp ms, ledger_id, entry_id)`, ordered field by
/// field (Pulsar's heap and merge order). 24 bytes in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IndexEntry {
    /// Delivery time (ms).
    pub timestamp: u64,
    /// Ledger id (≥ 0).
    pub ledger_id: i64,
    /// Entry id (fits the 32-bit bitmaps).
    pub entry_id: u32,
}

impl IndexEntry {
    /// The proto form.
    pub fn to_proto(self) -> DelayedIndex {
        DelayedIndex {
            timestamp: self.timestamp,
            ledger_id: self.ledger_id as u64,
            entry_id: u64::from(self.entry_id),
            delayed_operation_type: None,
        }
    }

    /// From the proto form.
    ///
    /// # Errors
    /// [`DelayedError::CorruptSnapshot`] if the ledger id exceeds `i64::MAX`,
    /// the entry id exceeds `u32::MAX`, or the operation is `CANCEL`/unknown.
    pub fn from_proto(snapshot_id: i64, d: &DelayedIndex) -> Result<Self, DelayedError> {
        let corrupt = |reason: String| DelayedError::CorruptSnapshot {
            snapshot_id,
            reason,
        };
        let ledger_id = i64::try_from(d.ledger_id)
            .map_err(|_| corrupt(format!("ledger id {} out of range", d.ledger_id)))?;
        let entry_id = u32::try_from(d.entry_id)
            .map_err(|_| corrupt(format!("entry id {} does not fit u32", d.entry_id)))?;
        if let Some(op) = d.delayed_operation_type {
            if op != DelayedOperationType::Delay as i32 {
                return Err(corrupt(format!("unsupported delayed operation type {op}")));
            }
        }
        Ok(Self {
            timestamp: d.timestamp,
            ledger_id,
            entry_id,
        })
    }
}

/// One segment produced by [`cut_segments`].
#[derive(Debug, Clone, PartialEq)]
pub struct CutSegment {
    /// The indexes, ascending.
    pub indexes: Vec<IndexEntry>,
    /// Ledger id → entry ids of this segment.
    pub bitmaps: BTreeMap<i64, RoaringBitmap>,
    /// First timestamp of the segment (ms).
    pub min_schedule_timestamp: u64,
    /// Last timestamp of the segment (ms).
    pub max_schedule_timestamp: u64,
}

impl CutSegment {
    /// The proto segment (entry `i` of the snapshot).
    pub fn to_proto(&self) -> SnapshotSegment {
        SnapshotSegment {
            indexes: self.indexes.iter().map(|i| i.to_proto()).collect(),
        }
    }

    /// The proto segment metadata (portable roaring bytes per ledger).
    pub fn to_metadata(&self) -> SnapshotSegmentMetadata {
        let delayed_index_bit_map = self
            .bitmaps
            .iter()
            .map(|(l, bm)| (*l as u64, encode_bitmap(bm)))
            .collect();
        SnapshotSegmentMetadata {
            delayed_index_bit_map,
            max_schedule_timestamp: self.max_schedule_timestamp,
            min_schedule_timestamp: self.min_schedule_timestamp,
        }
    }
}

/// Cuts ascending `indexes` into segments exactly as Pulsar: a segment starts
/// at `first = ts`, its window ends at `first + time_step_ms − 1`, and it
/// closes when the input is exhausted, the next timestamp is past the window,
/// or (`max_indexes > 0`; −1, Pulsar's "no limit", and 0 set none) it holds
/// `max_indexes` indexes. `min` is the
/// first timestamp and `max` the last.
///
/// A `time_step_ms` of 0 is treated as 1.
///
/// Example with a 10 ms step: timestamps 10, 20, 30 → 3 segments; 10, 10,
/// 10, 10, 20 → 2; twenty indexes at one timestamp with `max_indexes = 5` → 4.
pub fn cut_segments(
    indexes: impl IntoIterator<Item = IndexEntry>,
    time_step_ms: u64,
    max_indexes: i64,
) -> Vec<CutSegment> {
    let mut out: Vec<CutSegment> = Vec::new();
    let mut cur: Option<(CutSegment, u64)> = None;
    for idx in indexes {
        let full = |seg: &CutSegment, upper: u64| {
            idx.timestamp > upper || (max_indexes > 0 && seg.indexes.len() as i64 >= max_indexes)
        };
        if let Some((seg, upper)) = &cur {
            if full(seg, *upper) {
                let (seg, _) = cur.take().expect("checked Some above");
                out.push(seg);
            }
        }
        let (seg, _) = cur.get_or_insert_with(|| {
            (
                CutSegment {
                    indexes: Vec::new(),
                    bitmaps: BTreeMap::new(),
                    min_schedule_timestamp: idx.timestamp,
                    max_schedule_timestamp: idx.timestamp,
                },
                idx.timestamp.saturating_add(time_step_ms.max(1) - 1),
            )
        });
        seg.indexes.push(idx);
        seg.bitmaps
            .entry(idx.ledger_id)
            .or_default()
            .insert(idx.entry_id);
        seg.max_schedule_timestamp = idx.timestamp;
    }
    if let Some((seg, _)) = cur {
        out.push(seg);
    }
    out
}

/// Portable (32-bit RoaringBitmap) serialization.
pub fn encode_bitmap(bm: &RoaringBitmap) -> Vec<u8> {
    let mut v = Vec::with_capacity(bm.serialized_size());
    bm.serialize_into(&mut v)
        .expect("writing into a Vec<u8> cannot fail");
    v
}

/// Decodes portable roaring bytes (checked: bad bytes are an error).
pub fn decode_bitmap(snapshot_id: i64, bytes: &[u8]) -> Result<RoaringBitmap, DelayedError> {
    RoaringBitmap::deserialize_from(bytes).map_err(|e| DelayedError::CorruptSnapshot {
        snapshot_id,
        reason: format!("bad roaring bitmap bytes: {e}"),
    })
}

/// Required fields of `DelayedIndex`.
pub static DELAYED_INDEX_REQUIRED: RequiredSpec = RequiredSpec {
    message: "DelayedIndex",
    required: &[(1, "timestamp"), (2, "ledger_id"), (3, "entry_id")],
    nested: &[],
};
/// Required fields of `SnapshotSegment` (its repeated `DelayedIndex`).
pub static SNAPSHOT_SEGMENT_REQUIRED: RequiredSpec = RequiredSpec {
    message: "SnapshotSegment",
    required: &[],
    nested: &[(1, true, &DELAYED_INDEX_REQUIRED)],
};
/// Required fields of `SnapshotSegmentMetadata`.
pub static SNAPSHOT_SEGMENT_METADATA_REQUIRED: RequiredSpec = RequiredSpec {
    message: "SnapshotSegmentMetadata",
    required: &[(2, "max_schedule_timestamp"), (3, "min_schedule_timestamp")],
    nested: &[],
};
/// Required fields of `SnapshotMetadata` (its repeated `SnapshotSegmentMetadata`).
pub static SNAPSHOT_METADATA_REQUIRED: RequiredSpec = RequiredSpec {
    message: "SnapshotMetadata",
    required: &[],
    nested: &[(1, true, &SNAPSHOT_SEGMENT_METADATA_REQUIRED)],
};

/// Decodes entry 0 of a snapshot.
///
/// # Errors
/// [`DelayedError::CorruptSnapshot`] for malformed protobuf or a missing
/// required field (`max_schedule_timestamp`, `min_schedule_timestamp`).
pub fn decode_metadata(snapshot_id: i64, bytes: &[u8]) -> Result<SnapshotMetadata, DelayedError> {
    let corrupt = |e: &dyn std::fmt::Display| DelayedError::CorruptSnapshot {
        snapshot_id,
        reason: format!("bad SnapshotMetadata protobuf: {e}"),
    };
    check_required(&SNAPSHOT_METADATA_REQUIRED, bytes).map_err(|e| corrupt(&e))?;
    SnapshotMetadata::decode(bytes).map_err(|e| corrupt(&e))
}

/// Decodes entry `entry` (≥ 1) of a snapshot.
///
/// # Errors
/// [`DelayedError::CorruptSnapshot`] for malformed protobuf or a
/// `DelayedIndex` missing `timestamp`, `ledger_id` or `entry_id`.
pub fn decode_segment(
    snapshot_id: i64,
    entry: u64,
    bytes: &[u8],
) -> Result<SnapshotSegment, DelayedError> {
    let corrupt = |e: &dyn std::fmt::Display| DelayedError::CorruptSnapshot {
        snapshot_id,
        reason: format!("bad SnapshotSegment protobuf in segment {entry}: {e}"),
    };
    check_required(&SNAPSHOT_SEGMENT_REQUIRED, bytes).map_err(|e| corrupt(&e))?;
    SnapshotSegment::decode(bytes).map_err(|e| corrupt(&e))
}

/// Decodes the per-ledger bitmaps of one segment's metadata.
pub fn decode_segment_bitmaps(
    snapshot_id: i64,
    meta: &SnapshotSegmentMetadata,
) -> Result<BTreeMap<i64, RoaringBitmap>, DelayedError> {
    let mut out = BTreeMap::new();
    for (l, bytes) in &meta.delayed_index_bit_map {
        let ledger = i64::try_from(*l).map_err(|_| DelayedError::CorruptSnapshot {
            snapshot_id,
            reason: format!("ledger id {l} out of range"),
        })?;
        out.insert(ledger, decode_bitmap(snapshot_id, bytes)?);
    }
    Ok(out)
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests {
    /// Clearing a segment's metadata leaves the empty message (what a
    /// decoder starts from).
    #[test]
    fn snapshot_segment_metadata_clear_resets_every_field() {
        use prost::Message as _;
        let mut m = super::SnapshotSegmentMetadata {
            max_schedule_timestamp: 9,
            min_schedule_timestamp: 3,
            ..Default::default()
        };
        m.delayed_index_bit_map.insert(4, vec![1, 2]);
        m.clear();
        assert_eq!(m, super::SnapshotSegmentMetadata::default());
    }

    use super::*;

    fn ix(ts: u64, l: i64, e: u32) -> IndexEntry {
        IndexEntry {
            timestamp: ts,
            ledger_id: l,
            entry_id: e,
        }
    }

    #[test]
    fn cutting_matches_the_notes_examples() {
        let a = cut_segments([ix(10, 1, 0), ix(20, 1, 1), ix(30, 1, 2)], 10, -1);
        assert_eq!(a.len(), 3);
        let b = cut_segments(
            [
                ix(10, 1, 0),
                ix(10, 1, 1),
                ix(10, 1, 2),
                ix(10, 1, 3),
                ix(20, 1, 4),
            ],
            10,
            -1,
        );
        assert_eq!(b.len(), 2);
        assert_eq!(b[0].indexes.len(), 4);
        let c = cut_segments((0..20).map(|e| ix(10, 1, e)), 10, 5);
        assert_eq!(c.len(), 4);
        assert!(c.iter().all(|s| s.indexes.len() == 5));
        // window is [first, first + step - 1]: 10..=19 stays together.
        let d = cut_segments([ix(10, 1, 0), ix(19, 1, 1), ix(20, 1, 2)], 10, -1);
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].min_schedule_timestamp, 10);
        assert_eq!(d[0].max_schedule_timestamp, 19);
        assert!(cut_segments([], 10, 5).is_empty());
        // a count limit of 0 or -1 is no limit: only the time window cuts
        for no_limit in [0, -1] {
            let e = cut_segments((0..6).map(|e| ix(10, 1, e)), 10, no_limit);
            assert_eq!(e.len(), 1, "max_indexes {no_limit}");
        }
    }

    /// An index whose operation type is absent or `DELAY` is read; `CANCEL`
    /// or an unknown type makes the snapshot corrupt.
    #[test]
    fn delayed_indexes_other_than_delay_are_refused() {
        let d = |op: Option<i32>| DelayedIndex {
            timestamp: 5,
            ledger_id: 1,
            entry_id: 2,
            delayed_operation_type: op,
        };
        for op in [None, Some(DelayedOperationType::Delay as i32)] {
            let i = IndexEntry::from_proto(7, &d(op)).unwrap();
            assert_eq!((i.timestamp, i.ledger_id, i.entry_id), (5, 1, 2));
        }
        for op in [DelayedOperationType::Cancel as i32, 9] {
            assert!(matches!(
                IndexEntry::from_proto(7, &d(Some(op))),
                Err(DelayedError::CorruptSnapshot { snapshot_id: 7, .. })
            ));
        }
    }

    #[test]
    fn bucket_keys_roundtrip_and_reject_garbage() {
        assert_eq!(bucket_key(3, 7), "#pulsar.internal.delayed.bucket_3_7");
        assert_eq!(parse_bucket_key(&bucket_key(3, 7)), Some((3, 7)));
        assert_eq!(
            parse_bucket_key("#pulsar.internal.delayed.bucket_7_3"),
            None
        );
        assert_eq!(
            parse_bucket_key("#pulsar.internal.delayed.bucket_x_3"),
            None
        );
        assert_eq!(parse_bucket_key("other"), None);
    }

    #[test]
    fn decoding_bad_bytes_is_a_typed_error() {
        assert!(matches!(
            decode_metadata(4, &[0xff, 0xff, 0xff]),
            Err(DelayedError::CorruptSnapshot { snapshot_id: 4, .. })
        ));
        assert!(matches!(
            decode_bitmap(4, &[1, 2, 3]),
            Err(DelayedError::CorruptSnapshot { .. })
        ));
        let bad = DelayedIndex {
            timestamp: 1,
            ledger_id: 1,
            entry_id: u64::from(u32::MAX) + 1,
            delayed_operation_type: None,
        };
        assert!(IndexEntry::from_proto(1, &bad).is_err());
    }

    #[test]
    fn map_entry_for_ledger_0_is_written_with_its_key() {
        // {0: [0xAA]}, max 5, min 3: entry = [key 1: 0][value 2: len 1, 0xAA]
        let meta = SnapshotSegmentMetadata {
            delayed_index_bit_map: BTreeMap::from([(0u64, vec![0xAA])]),
            max_schedule_timestamp: 5,
            min_schedule_timestamp: 3,
        };
        let bytes = meta.encode_to_vec();
        assert_eq!(
            bytes,
            [0x0a, 0x05, 0x08, 0x00, 0x12, 0x01, 0xAA, 0x10, 0x05, 0x18, 0x03]
        );
        assert_eq!(bytes.len(), meta.encoded_len());
        assert_eq!(SnapshotSegmentMetadata::decode(&bytes[..]).unwrap(), meta);
        // an entry written without its key (prost's derived form) decodes the same
        let keyless = [0x0a, 0x03, 0x12, 0x01, 0xAA, 0x10, 0x05, 0x18, 0x03];
        assert_eq!(SnapshotSegmentMetadata::decode(&keyless[..]).unwrap(), meta);
    }

    #[test]
    fn snapshot_metadata_without_a_required_timestamp_is_corrupt() {
        // metadata_list[0] = {max 5, min 3}
        assert!(decode_metadata(1, &[0x0a, 0x04, 0x10, 0x05, 0x18, 0x03]).is_ok());
        for (bytes, field) in [
            (&[0x0a, 0x02, 0x10, 0x05][..], "min_schedule_timestamp"),
            (&[0x0a, 0x02, 0x18, 0x03][..], "max_schedule_timestamp"),
        ] {
            match decode_metadata(1, bytes) {
                Err(DelayedError::CorruptSnapshot { reason, .. }) => {
                    assert!(reason.contains(field), "{reason}")
                }
                other => panic!("{other:?}"),
            }
        }
        // the empty metadata (no segments) is valid
        assert!(decode_metadata(1, &[]).is_ok());
    }

    #[test]
    fn delayed_index_without_a_required_field_is_corrupt() {
        // indexes[0] = {timestamp 1, ledger_id 2, entry_id 3}
        assert!(decode_segment(1, 1, &[0x0a, 0x06, 0x08, 1, 0x10, 2, 0x18, 3]).is_ok());
        for (bytes, field) in [
            (&[0x0a, 0x04, 0x10, 2, 0x18, 3][..], "timestamp"),
            (&[0x0a, 0x04, 0x08, 1, 0x18, 3][..], "ledger_id"),
            (&[0x0a, 0x04, 0x08, 1, 0x10, 2][..], "entry_id"),
        ] {
            match decode_segment(1, 1, bytes) {
                Err(DelayedError::CorruptSnapshot { reason, .. }) => {
                    assert!(reason.contains(field), "{reason}")
                }
                other => panic!("{other:?}"),
            }
        }
    }
}
