//! Golden bytes: the bucket snapshot encodings checked against protobuf
//! bytes computed by hand from Pulsar's `pulsar.delay` proto2 definitions
//! (field numbers and wire types) and the 32-bit RoaringBitmap portable
//! format.
#![cfg(not(any(loom, feature = "shuttle")))]

use std::collections::BTreeMap;

use prost::Message;
use pulsar_core::delayed::{
    cut_segments, DelayedIndex, DelayedOperationType, IndexEntry, SnapshotMetadata,
    SnapshotSegment, SnapshotSegmentMetadata,
};

fn idx(timestamp: u64, ledger_id: u64, entry_id: u64) -> DelayedIndex {
    DelayedIndex {
        timestamp,
        ledger_id,
        entry_id,
        delayed_operation_type: None,
    }
}

/// Portable roaring bytes of the bitmap {2}: cookie 12346 (no run
/// containers), 1 container, header (key 0, cardinality-1 0), offset 16,
/// then the array container [2].
const ROARING_2: [u8; 18] = [
    0x3a, 0x30, 0x00, 0x00, // cookie 12346, LE u32
    0x01, 0x00, 0x00, 0x00, // container count
    0x00, 0x00, 0x00, 0x00, // key 0, cardinality - 1 = 0
    0x10, 0x00, 0x00, 0x00, // offset of container 0
    0x02, 0x00, // array container: 2
];

#[test]
fn delayed_index_bytes() {
    // field 1 varint (0x08) 10, field 2 (0x10) 1, field 3 (0x18) 2.
    assert_eq!(
        idx(10, 1, 2).encode_to_vec(),
        [0x08, 0x0a, 0x10, 0x01, 0x18, 0x02]
    );
    // 300 = varint ac 02.
    assert_eq!(
        idx(300, 5, 7).encode_to_vec(),
        [0x08, 0xac, 0x02, 0x10, 0x05, 0x18, 0x07]
    );
    // proto2 required fields are written even when zero.
    assert_eq!(
        idx(0, 0, 0).encode_to_vec(),
        [0x08, 0x00, 0x10, 0x00, 0x18, 0x00]
    );
    // field 4 enum (0x20) CANCEL = 1.
    let cancel = DelayedIndex {
        delayed_operation_type: Some(DelayedOperationType::Cancel as i32),
        ..idx(1, 1, 1)
    };
    assert_eq!(
        cancel.encode_to_vec(),
        [0x08, 0x01, 0x10, 0x01, 0x18, 0x01, 0x20, 0x01]
    );
}

#[test]
fn snapshot_segment_bytes() {
    let seg = SnapshotSegment {
        indexes: vec![idx(10, 1, 2), idx(20, 1, 3)],
    };
    let bytes = seg.encode_to_vec();
    assert_eq!(
        bytes,
        [
            0x0a, 0x06, 0x08, 0x0a, 0x10, 0x01, 0x18, 0x02, // indexes[0]
            0x0a, 0x06, 0x08, 0x14, 0x10, 0x01, 0x18, 0x03, // indexes[1]
        ]
    );
    assert_eq!(SnapshotSegment::decode(bytes.as_slice()).unwrap(), seg);
}

#[test]
fn segment_metadata_and_metadata_bytes() {
    let mut map = BTreeMap::new();
    map.insert(1u64, ROARING_2.to_vec());
    let meta = SnapshotSegmentMetadata {
        delayed_index_bit_map: map,
        max_schedule_timestamp: 10,
        min_schedule_timestamp: 10,
    };
    let mut expected_entry = vec![0x08, 0x01, 0x12, 0x12]; // key 1, value (18 bytes)
    expected_entry.extend_from_slice(&ROARING_2);
    let mut expected = vec![0x0a, expected_entry.len() as u8]; // map entry, field 1
    expected.extend_from_slice(&expected_entry);
    expected.extend_from_slice(&[0x10, 0x0a, 0x18, 0x0a]); // max 10, min 10
    assert_eq!(expected.len(), 28);
    assert_eq!(meta.encode_to_vec(), expected);

    let all = SnapshotMetadata {
        metadata_list: vec![meta.clone()],
    };
    let mut expected_all = vec![0x0a, 28];
    expected_all.extend_from_slice(&expected);
    assert_eq!(all.encode_to_vec(), expected_all);
    assert_eq!(
        SnapshotMetadata::decode(expected_all.as_slice()).unwrap(),
        all
    );
}

#[test]
fn cut_segment_produces_the_golden_encoding() {
    let segs = cut_segments(
        [IndexEntry {
            timestamp: 10,
            ledger_id: 1,
            entry_id: 2,
        }],
        300_000,
        5000,
    );
    assert_eq!(segs.len(), 1);
    assert_eq!(
        segs[0].to_proto().encode_to_vec(),
        [0x0a, 0x06, 0x08, 0x0a, 0x10, 0x01, 0x18, 0x02]
    );
    let meta = segs[0].to_metadata();
    assert_eq!(meta.delayed_index_bit_map[&1], ROARING_2);
    assert_eq!(meta.min_schedule_timestamp, 10);
    assert_eq!(meta.max_schedule_timestamp, 10);
}
