//! Pulsar's `PositionInfo` bytes (MLDataFormats.proto, proto2): golden
//! encodings computed by hand from the protobuf rules, for both forms of the
//! individually deleted entries, batch-index ack sets and properties; typed
//! errors for missing required fields, garbage and exceeded caps.
//!
//! Keys: field n, wire type t → `(n << 3) | t`: 08 10 are `ledgerId`/`entryId`
//! (varint), 1a = field 3 (`individualDeletedMessages`), 22 = 4
//! (`properties`), 2a = 5 (`batchedEntryDeletionIndexInfo`), 32 = 6
//! (`individualDeletedMessageRanges`); inside a message 0a/12 are fields 1/2
//! length-delimited and 10 is field 2 as a varint (an unpacked int64).
//! An int64 -1 is the ten-byte varint ff ff ff ff ff ff ff ff ff 01.

use std::collections::BTreeMap;

use proptest::prelude::*;
use pulsar_core::deletion::position_info::{
    bitmap_to_words, decode_position_info, encode_position_info, words_to_bitmap,
    PositionInfoError, PulsarForm,
};
use pulsar_core::deletion::DeletionSnapshot;
use pulsar_core::proto::presence::PresenceError;
use pulsar_core::Position;
use roaring::RoaringBitmap;

fn hex(s: &str) -> Vec<u8> {
    s.split_whitespace()
        .map(|b| u8::from_str_radix(b, 16).expect("hex byte"))
        .collect()
}

const RANGES: PulsarForm = PulsarForm::PULSAR_DEFAULT_RANGES;
const LONGS: PulsarForm = PulsarForm::PULSAR_DEFAULT_LONG_ARRAY;

fn snapshot(md: Position, deleted: &[(i64, u32)]) -> DeletionSnapshot {
    let mut s = DeletionSnapshot::new(md);
    for (l, e) in deleted {
        s.ledgers.entry(*l).or_default().insert(*e);
    }
    s
}

/// Encodes in `form`, compares with the golden bytes, decodes them back.
fn golden(s: &DeletionSnapshot, form: PulsarForm, props: &[(String, i64)], bytes: &str) {
    let want = hex(bytes);
    assert_eq!(
        encode_position_info(s, form, props).unwrap(),
        want,
        "{form:?}"
    );
    let back = decode_position_info(&want).unwrap();
    assert_eq!(&back.snapshot, s);
    assert_eq!(back.properties, props);
}

#[test]
fn mark_delete_only_writes_both_required_fields() {
    golden(
        &snapshot(Position::new(3, 4), &[]),
        RANGES,
        &[],
        "08 03 10 04",
    );
    golden(
        &snapshot(Position::new(3, 4), &[]),
        LONGS,
        &[],
        "08 03 10 04",
    );
}

#[test]
fn explicit_zero_and_minus_one_are_on_the_wire() {
    golden(
        &snapshot(Position::new(0, 0), &[]),
        RANGES,
        &[],
        "08 00 10 00",
    );
    golden(
        &snapshot(Position::new(1, -1), &[]),
        RANGES,
        &[],
        "08 01 10 ff ff ff ff ff ff ff ff ff 01",
    );
}

#[test]
fn message_ranges_one_per_run_open_closed() {
    // Deleted 5:2, 5:3, 5:7 → (5:1, 5:3], (5:6, 5:7]; each MessageRange is
    // 0a 04 <lower> 12 04 <upper> = 12 bytes.
    golden(
        &snapshot(Position::new(5, 0), &[(5, 2), (5, 3), (5, 7)]),
        RANGES,
        &[],
        "08 05 10 00 \
         1a 0c 0a 04 08 05 10 01 12 04 08 05 10 03 \
         1a 0c 0a 04 08 05 10 06 12 04 08 05 10 07",
    );
}

#[test]
fn message_range_of_a_ledgers_first_entry_has_lower_entry_minus_one() {
    // Deleted 6:0 with mark-delete 5:0: (6:-1, 6:0]; the lower endpoint is
    // 08 06 10 + ten-byte -1 = 13 bytes, the range 2 + 13 + 2 + 4 = 21 = 0x15.
    golden(
        &snapshot(Position::new(5, 0), &[(6, 0)]),
        RANGES,
        &[],
        "08 05 10 00 1a 15 0a 0d 08 06 10 ff ff ff ff ff ff ff ff ff 01 12 04 08 06 10 00",
    );
}

#[test]
fn long_array_is_the_bitset_words_unpacked() {
    // Bits 2, 3, 7 → word 0x8c = 140 = varint 8c 01.
    golden(
        &snapshot(Position::new(5, 0), &[(5, 2), (5, 3), (5, 7)]),
        LONGS,
        &[],
        "08 05 10 00 32 05 08 05 10 8c 01",
    );
    // Entry 64 only → words [0, 1] (the leading zero word is written).
    golden(
        &snapshot(Position::new(5, 0), &[(5, 64)]),
        LONGS,
        &[],
        "08 05 10 00 32 06 08 05 10 00 10 01",
    );
    // Entry 63 → word i64::MIN: a ten-byte varint; two ledgers in key order.
    golden(
        &snapshot(Position::new(5, 0), &[(5, 63), (7, 0)]),
        LONGS,
        &[],
        "08 05 10 00 32 0d 08 05 10 80 80 80 80 80 80 80 80 80 01 32 04 08 07 10 01",
    );
}

#[test]
fn properties_and_batch_ack_sets_in_field_order() {
    // LongProperty ("a", 0): 0a 01 61 10 00; batch (5:9) ack set [5]:
    // 0a 04 08 05 10 09 10 05 (8 bytes); fields written 1, 2, 4, 5, 6.
    let mut s = snapshot(Position::new(5, 0), &[(5, 2)]);
    s.batch_ack_sets.insert(Position::new(5, 9), vec![5]);
    golden(
        &s,
        LONGS,
        &[("a".into(), 0)],
        "08 05 10 00 22 05 0a 01 61 10 00 2a 08 0a 04 08 05 10 09 10 05 32 04 08 05 10 04",
    );
    golden(
        &s,
        RANGES,
        &[("a".into(), 0)],
        "08 05 10 00 1a 0c 0a 04 08 05 10 01 12 04 08 05 10 02 \
         22 05 0a 01 61 10 00 2a 08 0a 04 08 05 10 09 10 05",
    );
}

#[test]
fn packed_values_are_accepted() {
    // values = [140] packed: 12 02 8c 01.
    let d = decode_position_info(&hex("08 05 10 00 32 06 08 05 12 02 8c 01")).unwrap();
    assert_eq!(
        d.snapshot,
        snapshot(Position::new(5, 0), &[(5, 2), (5, 3), (5, 7)])
    );
    // deleteSet [5, 1] packed: 12 02 05 01.
    let d = decode_position_info(&hex("08 05 10 00 2a 0a 0a 04 08 05 10 09 12 02 05 01")).unwrap();
    assert_eq!(d.snapshot.batch_ack_sets[&Position::new(5, 9)], vec![5, 1]);
}

#[test]
fn missing_required_fields_are_typed_errors() {
    let missing = |bytes: &str, field: &str| match decode_position_info(&hex(bytes)) {
        Err(PositionInfoError::Presence(PresenceError::MissingRequired { field: f, .. })) => {
            assert_eq!(f, field, "{bytes}")
        }
        other => panic!("{bytes}: {other:?}"),
    };
    missing("08 05", "entryId");
    missing("10 05", "ledgerId");
    missing("08 05 10 00 1a 06 0a 04 08 05 10 01", "upperEndpoint");
    missing("08 05 10 00 1a 0a 0a 02 08 05 12 04 08 05 10 01", "entryId");
    missing("08 05 10 00 32 02 10 01", "key");
    missing("08 05 10 00 2a 02 10 05", "position");
    missing("08 05 10 00 22 02 10 00", "name");
}

#[test]
fn garbage_and_impossible_values_are_typed_errors() {
    for bytes in ["ff", "08", "0a 05 01", "08 05 10 00 1a 7f"] {
        assert!(
            matches!(
                decode_position_info(&hex(bytes)),
                Err(PositionInfoError::Presence(_))
            ),
            "{bytes}"
        );
    }
    // Inverted range (5:3, 5:1].
    assert!(matches!(
        decode_position_info(&hex(
            "08 05 10 00 1a 0c 0a 04 08 05 10 03 12 04 08 05 10 01"
        )),
        Err(PositionInfoError::Range(_))
    ));
    // Mark-delete entry id -2.
    assert!(matches!(
        decode_position_info(&hex("08 05 10 fe ff ff ff ff ff ff ff ff 01")),
        Err(PositionInfoError::Range(_))
    ));
    // LongListMap with a negative ledger id.
    assert!(matches!(
        decode_position_info(&hex(
            "08 05 10 00 32 0d 08 ff ff ff ff ff ff ff ff ff 01 10 01"
        )),
        Err(PositionInfoError::LongArrayOutOfRange { .. })
    ));
    // Invalid UTF-8 in a property name: prost's decode error.
    assert!(matches!(
        decode_position_info(&hex("08 05 10 00 22 05 0a 01 ff 10 00")),
        Err(PositionInfoError::Decode(_))
    ));
}

#[test]
fn exceeding_pulsars_cap_is_reported_not_truncated() {
    // 10,001 single-entry ranges (every other entry).
    let mut s = DeletionSnapshot::new(Position::new(1, -1));
    s.ledgers.insert(
        1,
        (0..10_001u32).map(|i| 2 * i + 1).collect::<RoaringBitmap>(),
    );
    match encode_position_info(&s, RANGES, &[]) {
        Err(PositionInfoError::CapExceeded { cap, needed, .. }) => {
            assert_eq!((cap, needed), (10_000, 10_001))
        }
        other => panic!("{other:?}"),
    }
    match encode_position_info(&s, LONGS, &[]) {
        Err(PositionInfoError::CapExceeded { cap, needed, .. }) => {
            assert_eq!((cap, needed), (10_000, 10_001))
        }
        other => panic!("{other:?}"),
    }
    // With the cap raised both forms restore it exactly.
    for form in [
        PulsarForm::MessageRanges { max_ranges: 20_000 },
        PulsarForm::LongArray {
            max_entries: 20_000,
        },
    ] {
        let bytes = encode_position_info(&s, form, &[]).unwrap();
        assert_eq!(decode_position_info(&bytes).unwrap().snapshot, s);
    }
}

proptest! {
    #[test]
    fn bitset_words_round_trip(entries in proptest::collection::btree_set(0u32..5000, 0..300)) {
        let bits: RoaringBitmap = entries.iter().copied().collect();
        let words = bitmap_to_words(&bits);
        // Oracle: java.util.BitSet.toLongArray word by word.
        let mut want = vec![0u64; entries.iter().next_back().map_or(0, |m| *m as usize / 64 + 1)];
        for e in &entries {
            want[*e as usize / 64] |= 1 << (e % 64);
        }
        prop_assert_eq!(words.iter().map(|w| *w as u64).collect::<Vec<_>>(), want);
        prop_assert_eq!(words_to_bitmap(1, &words).unwrap(), bits);
    }

    #[test]
    fn both_forms_restore_the_same_state(
        md_entry in -1i64..50,
        deleted in proptest::collection::btree_set((1i64..4, 0u32..400), 0..200),
    ) {
        let md = Position::new(1, md_entry);
        let mut s = DeletionSnapshot::new(md);
        let mut by_ledger: BTreeMap<i64, RoaringBitmap> = BTreeMap::new();
        for (l, e) in &deleted {
            by_ledger.entry(*l).or_default().insert(*e);
        }
        s.ledgers = by_ledger;
        s.normalize();
        for form in [RANGES, LONGS] {
            let bytes = encode_position_info(&s, form, &[]).unwrap();
            prop_assert_eq!(&decode_position_info(&bytes).unwrap().snapshot, &s);
        }
    }
}

#[test]
fn managed_cursor_info_for_the_metadata_store() {
    use pulsar_core::deletion::position_info::{
        decode_managed_cursor_info, encode_managed_cursor_info,
    };
    // cursorsLedgerId -1 (ten bytes), mark-delete 5:0 as optional fields 2
    // and 3 (explicit zero written), one range (5:1, 5:2] as field 4 (22),
    // lastActive 1 as field 6 (30 01).
    let s = snapshot(Position::new(5, 0), &[(5, 2)]);
    let want = hex("08 ff ff ff ff ff ff ff ff ff 01 10 05 18 00 \
         22 0c 0a 04 08 05 10 01 12 04 08 05 10 02 30 01");
    assert_eq!(
        encode_managed_cursor_info(&s, -1, 10_000, &[], Some(1)).unwrap(),
        want
    );
    let (ledger, decoded) = decode_managed_cursor_info(&want).unwrap();
    assert_eq!(ledger, -1);
    assert_eq!(decoded.unwrap().snapshot, s);
    // Without a mark-delete the record points at its cursor ledger.
    assert_eq!(
        decode_managed_cursor_info(&hex("08 07")).unwrap(),
        (7, None)
    );
    // cursorsLedgerId is required.
    assert!(matches!(
        decode_managed_cursor_info(&hex("10 05 18 00")),
        Err(PositionInfoError::Presence(
            PresenceError::MissingRequired { .. }
        ))
    ));
    // The metadata-store cap is reported too.
    assert!(matches!(
        encode_managed_cursor_info(&s, -1, 0, &[], None),
        Err(PositionInfoError::CapExceeded { .. })
    ));
}

/// A cap is a maximum: exactly `max_ranges` ranges, or exactly
/// `max_entries` deleted entries, are encoded; one more is `CapExceeded`.
#[test]
fn a_state_exactly_at_the_cap_is_encoded() {
    // three single-entry ranges (entries 1, 3, 5)
    let s = snapshot(Position::new(1, -1), &[(1, 1), (1, 3), (1, 5)]);
    assert!(encode_position_info(&s, PulsarForm::MessageRanges { max_ranges: 3 }, &[]).is_ok());
    assert!(matches!(
        encode_position_info(&s, PulsarForm::MessageRanges { max_ranges: 2 }, &[]),
        Err(PositionInfoError::CapExceeded {
            cap: 2,
            needed: 3,
            ..
        })
    ));
    assert!(encode_position_info(&s, PulsarForm::LongArray { max_entries: 3 }, &[]).is_ok());
    assert!(matches!(
        encode_position_info(&s, PulsarForm::LongArray { max_entries: 2 }, &[]),
        Err(PositionInfoError::CapExceeded {
            cap: 2,
            needed: 3,
            ..
        })
    ));
}

/// A batch-index ack set's position must name an entry: ledger 0 is a
/// ledger like any other; a negative ledger id, or an entry id that is not
/// a u32, is `InvalidBatchPosition`.
#[test]
fn batch_positions_must_name_an_entry() {
    let with_batch = |l: i64, e: u32| {
        let mut s = snapshot(Position::new(0, -1), &[]);
        s.batch_ack_sets
            .insert(Position::new(l, i64::from(e)), vec![0b101]);
        s
    };
    let ok = encode_position_info(&with_batch(0, 3), RANGES, &[]).unwrap();
    let decoded = decode_position_info(&ok).unwrap();
    assert_eq!(decoded.snapshot.batch_ack_sets.len(), 1);
    // the same bytes with ledger id -1 in the batch position
    let mut info =
        pulsar_core::deletion::position_info::to_message(&with_batch(0, 3), RANGES, &[]).unwrap();
    info.batched_entry_deletion_index_info[0].position.ledger_id = -1;
    assert!(matches!(
        pulsar_core::deletion::position_info::from_message(&info),
        Err(PositionInfoError::InvalidBatchPosition { .. })
    ));
    info.batched_entry_deletion_index_info[0].position.ledger_id = 0;
    info.batched_entry_deletion_index_info[0].position.entry_id = -1;
    assert!(matches!(
        pulsar_core::deletion::position_info::from_message(&info),
        Err(PositionInfoError::InvalidBatchPosition { .. })
    ));
}
