//! The pending-ack log is Pulsar's bytes: golden encodings of every record
//! kind and value class, computed by hand from the protobuf encoding rules
//! against `TransactionPendingAck.proto` (proto2; `PendingAckOp` ACK = 1,
//! COMMIT = 2, ABORT = 3; `CommandAck.AckType` Individual = 0, Cumulative = 1;
//! `required uint64 ledgerId = 1`, `required uint64 entryId = 2`,
//! `repeated int64 ack_set = 3` unpacked, `optional int32 batch_size = 4`;
//! `optional` op = 1, ack_type = 2, txnid_least_bits = 3, txnid_most_bits = 4,
//! `repeated PendingAckMetadata` = 5; `BatchedPendingAckMetadataEntry`
//! `repeated pending_ack_logs = 1` after the shorts 0x0e01, 1).
//!
//! Key bytes: field n with wire type t is `(n << 3) | t`, so 08 10 18 20 are
//! fields 1-4 as varints, 2a is field 5 length-delimited, 0a is field 1
//! length-delimited, 1a is field 3 length-delimited (a packed ack_set).

use prost::Message;
use pulsar_core::pending_ack::record::{
    decode_entry, encode_batch, encode_batch_of_encoded, PendingAckMetadata,
    PendingAckMetadataEntry,
};
use pulsar_core::pending_ack::{AckType, AckedPosition, PendingAckError, PendingAckRecord, TxnId};
use pulsar_core::Position;

fn at() -> Position {
    Position::new(77, 3)
}

fn hex(s: &str) -> Vec<u8> {
    s.split_whitespace()
        .map(|b| u8::from_str_radix(b, 16).expect("hex byte"))
        .collect()
}

/// Encodes, compares with the golden bytes, and decodes the golden bytes back.
fn golden(record: PendingAckRecord, bytes: &str) {
    let want = hex(bytes);
    assert_eq!(record.encode(), want, "encoding of {record:?}");
    assert_eq!(
        decode_entry(at(), &want).expect("golden bytes decode"),
        vec![record]
    );
}

#[test]
fn individual_ack_whole_entry_writes_explicit_zeros() {
    // op ACK=1, ack_type Individual=0 (present), least 1, most 0 (present);
    // metadata ledger 3, entry 4, batch_size 0 (present, as Pulsar sets it).
    golden(
        PendingAckRecord::individual_ack(
            TxnId::new(0, 1),
            vec![AckedPosition::whole(Position::new(3, 4))],
        ),
        "08 01 10 00 18 01 20 00 2a 06 08 03 10 04 20 00",
    );
}

#[test]
fn individual_ack_of_a_batch_index_writes_ack_set_unpacked() {
    // least 300 = ac 02 (two-byte varint); batch of 3, index 1 acked: bits
    // 0 and 2 remain set = 5, one tag 18 per word.
    let p = AckedPosition::batch_indexes(Position::new(60, 2), 3, &[1]).unwrap();
    assert_eq!(p.ack_set, vec![5]);
    golden(
        PendingAckRecord::individual_ack(TxnId::new(7, 300), vec![p]),
        "08 01 10 00 18 ac 02 20 07 2a 08 08 3c 10 02 18 05 20 03",
    );
}

#[test]
fn two_word_ack_set_with_a_negative_word_and_a_large_ledger_id() {
    // ledger 2^33 = 80 80 80 80 20; word 0 = -1 (all 64 indexes unacked) is
    // a ten-byte varint; word 1 = 0x1f (indexes 64..68 unacked, 69 acked);
    // batch_size 70 = 46. Metadata length 23 = 0x17.
    let p = AckedPosition::batch_indexes(Position::new(1 << 33, 0), 70, &[69]).unwrap();
    assert_eq!(p.ack_set, vec![-1, 0x1f]);
    golden(
        PendingAckRecord::individual_ack(TxnId::new(1, 2), vec![p]),
        "08 01 10 00 18 02 20 01 2a 17 08 80 80 80 80 20 10 00 \
         18 ff ff ff ff ff ff ff ff ff 01 18 1f 20 46",
    );
}

#[test]
fn individual_ack_of_two_positions_repeats_field_5() {
    golden(
        PendingAckRecord::individual_ack(
            TxnId::new(0, 9),
            vec![
                AckedPosition::whole(Position::new(3, 4)),
                AckedPosition::whole(Position::new(3, 5)),
            ],
        ),
        "08 01 10 00 18 09 20 00 2a 06 08 03 10 04 20 00 2a 06 08 03 10 05 20 00",
    );
}

#[test]
fn cumulative_ack_has_no_batch_size_and_zero_txn_halves_present() {
    // Pulsar's appendCumulativeAck never sets batch_size; txn (0,0) still
    // writes both halves.
    golden(
        PendingAckRecord::cumulative_ack(TxnId::new(0, 0), Position::new(5, 9)),
        "08 01 10 01 18 00 20 00 2a 04 08 05 10 09",
    );
}

#[test]
fn commit_and_abort_of_both_ack_types() {
    golden(
        PendingAckRecord::commit(TxnId::new(0, 1), AckType::Individual),
        "08 02 10 00 18 01 20 00",
    );
    golden(
        PendingAckRecord::commit(TxnId::new(2, 3), AckType::Cumulative),
        "08 02 10 01 18 03 20 02",
    );
    golden(
        PendingAckRecord::abort(TxnId::new(0, 5), AckType::Individual),
        "08 03 10 00 18 05 20 00",
    );
    // most = u64::MAX: ten-byte varint.
    golden(
        PendingAckRecord::abort(TxnId::new(u64::MAX, 1), AckType::Cumulative),
        "08 03 10 01 18 01 20 ff ff ff ff ff ff ff ff ff 01",
    );
}

#[test]
fn batched_entry_is_magic_version_then_batched_metadata_entry() {
    let recs = vec![
        PendingAckRecord::commit(TxnId::new(0, 1), AckType::Individual),
        PendingAckRecord::abort(TxnId::new(0, 5), AckType::Individual),
    ];
    let want = hex("0e 01 00 01 0a 08 08 02 10 00 18 01 20 00 0a 08 08 03 10 00 18 05 20 00");
    assert_eq!(encode_batch(&recs), want);
    let enc: Vec<Vec<u8>> = recs.iter().map(PendingAckRecord::encode).collect();
    let refs: Vec<&[u8]> = enc.iter().map(Vec::as_slice).collect();
    assert_eq!(encode_batch_of_encoded(&refs).unwrap(), want);
    assert_eq!(decode_entry(at(), &want).unwrap(), recs);
}

#[test]
fn packed_ack_set_is_accepted_on_decode() {
    // Same record as the batch-index golden, ack_set packed: 1a 01 05.
    let packed = hex("08 01 10 00 18 ac 02 20 07 2a 09 08 3c 10 02 1a 01 05 20 03");
    let p = AckedPosition::batch_indexes(Position::new(60, 2), 3, &[1]).unwrap();
    assert_eq!(
        decode_entry(at(), &packed).unwrap(),
        vec![PendingAckRecord::individual_ack(
            TxnId::new(7, 300),
            vec![p]
        )]
    );
    // Two words packed: 1a 0b (ff×9 01) 1f.
    let packed2 = hex("08 01 10 00 18 02 20 01 2a 17 08 80 80 80 80 20 10 00 \
         1a 0b ff ff ff ff ff ff ff ff ff 01 1f 20 46");
    let recs = decode_entry(at(), &packed2).unwrap();
    assert_eq!(recs[0].positions[0].ack_set, vec![-1, 0x1f]);
    assert_eq!(
        recs[0].positions[0].acked_indexes().unwrap(),
        [69].into_iter().collect()
    );
}

#[test]
fn absent_and_explicit_zero_are_distinguished() {
    let zero = PendingAckMetadataEntry::decode(&hex("20 00")[..]).unwrap();
    assert_eq!(zero.txnid_most_bits, Some(0));
    let absent = PendingAckMetadataEntry::decode(&[][..]).unwrap();
    assert_eq!(absent.txnid_most_bits, None);
    let m = PendingAckMetadata::decode(&hex("08 00 10 00")[..]).unwrap();
    assert_eq!(
        (m.ledger_id, m.entry_id, m.batch_size),
        (Some(0), Some(0), None)
    );
}

fn missing(bytes: &str) -> (&'static str, &'static str) {
    match decode_entry(at(), &hex(bytes)) {
        Err(PendingAckError::MissingField {
            position,
            message,
            field,
        }) => {
            assert_eq!(position, at());
            (message, field)
        }
        other => panic!("expected MissingField for {bytes}, got {other:?}"),
    }
}

#[test]
fn missing_required_and_always_set_fields_are_typed_errors() {
    let meta = "PendingAckMetadata";
    let entry = "PendingAckMetadataEntry";
    // Metadata without ledgerId (only entryId 4, batch_size 0).
    assert_eq!(
        missing("08 01 10 00 18 01 20 00 2a 04 10 04 20 00"),
        (meta, "ledgerId")
    );
    // Metadata without entryId.
    assert_eq!(
        missing("08 01 10 00 18 01 20 00 2a 04 08 03 20 00"),
        (meta, "entryId")
    );
    // An ack_set without batch_size cannot be interpreted.
    assert_eq!(
        missing("08 01 10 00 18 01 20 00 2a 06 08 03 10 04 18 05"),
        (meta, "batch_size")
    );
    assert_eq!(missing("10 00 18 01 20 00"), (entry, "pending_ack_op"));
    assert_eq!(missing("08 02 18 01 20 00"), (entry, "ack_type"));
    assert_eq!(missing("08 02 10 00 20 00"), (entry, "txnid_least_bits"));
    assert_eq!(missing("08 02 10 00 18 01"), (entry, "txnid_most_bits"));
    // Inside a batched entry too.
    assert_eq!(
        missing("0e 01 00 01 0a 06 08 02 10 00 18 01"),
        (entry, "txnid_most_bits")
    );
}

#[test]
fn out_of_range_values_are_typed_decode_errors() {
    for bad in [
        // op 0 (the old, wrong numbering's ACK) is not a PendingAckOp.
        "08 00 10 00 18 01 20 00",
        // op 4.
        "08 04 10 00 18 01 20 00",
        // ack_type 2.
        "08 02 10 02 18 01 20 00",
        // ledgerId 2^63 does not fit a position.
        "08 01 10 00 18 01 20 00 2a 0e 08 80 80 80 80 80 80 80 80 80 01 10 04 20 00",
        // ack_set bit 3 set for a batch of 3.
        "08 01 10 00 18 01 20 00 2a 08 08 03 10 04 18 08 20 03",
        // two ack_set words for a batch of 3.
        "08 01 10 00 18 01 20 00 2a 0a 08 03 10 04 18 05 18 01 20 03",
        // COMMIT listing a position.
        "08 02 10 00 18 01 20 00 2a 06 08 03 10 04 20 00",
    ] {
        match decode_entry(at(), &hex(bad)) {
            Err(PendingAckError::Decode { position, .. }) => assert_eq!(position, at()),
            other => panic!("expected a decode error for {bad}, got {other:?}"),
        }
    }
}

/// A batch entry's size bounds the memory of its batch-index acks (one index
/// per message). A `batch_size` larger than any batch a broker can store
/// (Pulsar's default `maxMessageSize` of 5 MiB at no less than 5 bytes per
/// batched message) is a typed error on decode and on construction, never a
/// per-index allocation of up to 2^31 entries.
#[test]
fn batch_size_beyond_any_storable_batch_is_a_typed_error() {
    // ACK, Individual, least 1, most 0; metadata ledger 3, entry 4, ack_set
    // [1] (index 0 unacked), batch_size i32::MAX = ff ff ff ff 07.
    match decode_entry(
        at(),
        &hex("08 01 10 00 18 01 20 00 2a 0c 08 03 10 04 18 01 20 ff ff ff ff 07"),
    ) {
        Err(PendingAckError::Decode { position, reason }) => {
            assert_eq!(position, at());
            assert!(reason.contains("batch_size"), "{reason}");
        }
        other => panic!("expected a decode error, got {other:?}"),
    }
    let max = AckedPosition::MAX_BATCH_SIZE;
    assert!(matches!(
        AckedPosition::batch_indexes(Position::new(3, 4), max + 1, &[0]),
        Err(PendingAckError::InvalidRecord(_))
    ));
    assert!(matches!(
        AckedPosition::batch_indexes(Position::new(3, 4), i32::MAX, &[0]),
        Err(PendingAckError::InvalidRecord(_))
    ));
    // The largest storable batch is accepted.
    let p = AckedPosition::batch_indexes(Position::new(3, 4), max, &[0]).unwrap();
    assert_eq!(p.acked_indexes().map(|s| s.len()), Some(1));
    let rec = PendingAckRecord::individual_ack(TxnId::new(0, 1), vec![p]);
    rec.validate().unwrap();
    assert_eq!(decode_entry(at(), &rec.encode()).unwrap(), vec![rec]);
}

/// Every prefix of a valid single or batched entry, and arbitrary bytes, decode
/// to records or to a typed error at the entry's position: never a panic, and
/// a length prefix larger than the entry is refused before any allocation.
#[test]
fn truncated_and_arbitrary_entries_are_typed_errors() {
    let t = TxnId::new(u64::MAX, 300);
    let recs = vec![
        PendingAckRecord::individual_ack(
            t,
            vec![
                AckedPosition::batch_indexes(Position::new(60, 2), 130, &[0, 64, 129]).unwrap(),
                AckedPosition::whole(Position::new(61, 0)),
            ],
        ),
        PendingAckRecord::cumulative_ack(t, Position::new(62, 5)),
        PendingAckRecord::commit(t, AckType::Individual),
    ];
    for full in [recs[0].encode(), encode_batch(&recs)] {
        for cut in 0..full.len() {
            match decode_entry(at(), &full[..cut]) {
                Ok(_) => {}
                Err(PendingAckError::Decode { position, .. })
                | Err(PendingAckError::MissingField { position, .. }) => {
                    assert_eq!(position, at())
                }
                Err(other) => panic!("prefix of {cut} bytes: untyped error {other:?}"),
            }
        }
    }
    // Length prefixes of 2^32 - 1 for field 5 and for a batched record.
    for bad in [
        "08 01 10 00 18 01 20 00 2a ff ff ff ff 0f",
        "0e 01 00 01 0a ff ff ff ff 0f 08 01",
        "08 01 10 00 18 01 20 00 2a 04 1a ff ff ff ff 0f",
    ] {
        assert!(
            matches!(
                decode_entry(at(), &hex(bad)),
                Err(PendingAckError::Decode { .. })
            ),
            "{bad}"
        );
    }
    // A deterministic stream of pseudo-random entries (xorshift), with and
    // without the batched header.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in 0..20_000 {
        let mut bytes = Vec::new();
        if i % 2 == 0 {
            bytes.extend_from_slice(&[0x0e, 0x01, 0x00, 0x01]);
        }
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        for _ in 0..(x % 40) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            bytes.push(x as u8);
        }
        let _ = decode_entry(at(), &bytes);
    }
}

/// Pulsar's `appendCumulativeAck` writes a batch position's `ack_set` but
/// never `batch_size`: such a cumulative ACK decodes (a whole log of Pulsar's
/// bytes replays) and encodes back to the same bytes.
#[test]
fn cumulative_ack_with_an_ack_set_and_no_batch_size_is_pulsars_bytes() {
    // ACK, Cumulative, least 1, most 0; metadata ledger 5, entry 9,
    // ack_set [5] (one tag 18), no batch_size.
    let bytes = hex("08 01 10 01 18 01 20 00 2a 06 08 05 10 09 18 05");
    let recs = decode_entry(at(), &bytes).expect("Pulsar's cumulative batch ack decodes");
    assert_eq!(recs.len(), 1);
    let r = &recs[0];
    assert_eq!(r.ack_type, AckType::Cumulative);
    assert_eq!(
        r.positions,
        vec![AckedPosition {
            position: Position::new(5, 9),
            batch_size: 0,
            ack_set: vec![5],
        }]
    );
    r.validate().unwrap();
    assert_eq!(r.encode(), bytes);
    // An individual ACK with an ack_set still needs its batch_size.
    assert!(matches!(
        decode_entry(
            at(),
            &hex("08 01 10 00 18 01 20 00 2a 06 08 05 10 09 18 05")
        ),
        Err(PendingAckError::MissingField {
            field: "batch_size",
            ..
        })
    ));
}
