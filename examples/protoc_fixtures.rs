//! The Rust half of the protoc byte-parity check (`bash .ci/check protoc`,
//! driven by `tests/protoc/check.py`): fixed fixtures of every Pulsar
//! message this crate writes on the cursor, pending-ack, delivery and
//! delayed-bucket-snapshot paths, and of the commands `pulsar-core serve`
//! answers with, encoded by the crate's own encoders.
//!
//! - no argument (or `encode`): one line per fixture, `NAME HEX`, the bytes
//!   `deletion::position_info`, `pending_ack::record`, `proto::wire`, `proto::metadata` and
//!   `delayed::snapshot` produce; the checker compares them with protoc's bytes for the same
//!   fixture built from the `.proto` transcriptions in `tests/protoc/`.
//! - `decode FILE`: FILE holds `NAME HEX` lines written by protoc's
//!   generated code (`NAME+packed`: the same fixture with its repeated int64
//!   fields packed; `NAME+map_order`: its map entries in another order);
//!   each is decoded by the crate's decoder and must give back fixture NAME
//!   exactly. Exit status 1 on any mismatch.
//! - `reject FILE`: the same format, each line a fixture with a required
//!   field left out (protoc's partial encoding, `NAME+missing_FIELD`); the
//!   crate's decoder must refuse every one with a typed error.
//!
//! Proto2 presence is part of the fixtures: required and optional fields
//! holding zero (on the wire), empty repeated fields (absent), negative
//! int64 words (10-byte varints), `[default = -1]` fields set to -1.

use std::collections::BTreeMap;
use std::process::ExitCode;

use prost::Message;
use pulsar_core::delayed::snapshot::{decode_metadata, decode_segment};
use pulsar_core::delayed::{
    cut_segments, DelayedIndex, DelayedOperationType, IndexEntry, SnapshotMetadata,
    SnapshotSegment, SnapshotSegmentMetadata,
};
use pulsar_core::deletion::position_info::{
    decode_managed_cursor_info, decode_position_info, encode_managed_cursor_info,
    encode_position_info, DecodedPositionInfo, PulsarForm,
};
use pulsar_core::deletion::DeletionSnapshot;
use pulsar_core::pending_ack::record::{
    decode_entry, encode_batch, AckedPosition, PendingAckRecord, TxnId,
};
use pulsar_core::proto::metadata::{
    compression_type, decode_message_metadata, EncryptionKeys, KeyValue, MessageMetadata,
};
use pulsar_core::proto::txn::{marker_type, txn_marker};
use pulsar_core::proto::wire::{
    decode_base_command, AckType, BaseCommand, Command, CommandAck, CommandFlow, CommandMessage,
    MessageIdData,
};
use pulsar_core::Position;
use roaring::RoaringBitmap;

/// The broker core's own PulsarApi messages (the handshake, lookup,
/// producer and response commands `pulsar-core serve` answers with).
use pulsar_core::proto::command::{
    BrokerCommand as ServeCommand, CommandAckResponse, CommandConnected, CommandError,
    CommandGetLastMessageIdResponse, CommandGetSchemaResponse, CommandLookupTopicResponse,
    CommandPartitionedTopicMetadataResponse, CommandProducerSuccess, CommandSendError,
    CommandSendReceipt, Empty,
};
use pulsar_core::proto::txn::{CommandTcClientConnectResponse, CommandTxnResponse};

/// What a fixture is, so its decoded form can be compared.
enum Fixture {
    PositionInfo {
        snapshot: DeletionSnapshot,
        form: PulsarForm,
        properties: Vec<(String, i64)>,
    },
    ManagedCursorInfo {
        snapshot: DeletionSnapshot,
        cursors_ledger_id: i64,
        properties: Vec<(String, i64)>,
        last_active: Option<i64>,
    },
    PendingAck(Vec<PendingAckRecord>),
    PendingAckBatch(Vec<PendingAckRecord>),
    Command(Box<BaseCommand>),
    SnapshotMetadata(SnapshotMetadata),
    SnapshotSegment(SnapshotSegment),
    Serve(Box<ServeCommand>),
    Metadata(Box<MessageMetadata>),
}

fn snapshot(
    mark_delete: Position,
    ledgers: &[(i64, &[u32])],
    batch: &[(Position, &[i64])],
) -> DeletionSnapshot {
    DeletionSnapshot {
        mark_delete,
        ledgers: ledgers
            .iter()
            .map(|(l, e)| (*l, e.iter().copied().collect::<RoaringBitmap>()))
            .collect(),
        batch_ack_sets: batch.iter().map(|(p, w)| (*p, w.to_vec())).collect(),
    }
}

fn id(ledger_id: u64, entry_id: u64) -> MessageIdData {
    MessageIdData {
        ledger_id,
        entry_id,
        partition: None,
        batch_index: None,
        ack_set: Vec::new(),
        batch_size: None,
        first_chunk_message_id: None,
    }
}

/// A `ServeCommand` of type `ty` carrying what `fill` sets.
fn serve(ty: i32, fill: impl FnOnce(&mut ServeCommand)) -> Fixture {
    let mut c = ServeCommand {
        r#type: ty,
        ..Default::default()
    };
    fill(&mut c);
    Fixture::Serve(Box::new(c))
}

const UNCAPPED_RANGES: PulsarForm = PulsarForm::MessageRanges {
    max_ranges: usize::MAX,
};
const UNCAPPED_LONGS: PulsarForm = PulsarForm::LongArray {
    max_entries: usize::MAX,
};

fn fixtures() -> Vec<(&'static str, Fixture)> {
    // Ledger 3 above mark-delete (3,4): a run 6..=8, a single 10; ledger 5:
    // entries 0, 1, 63 (bit 63: a negative word), 64; two batch entries,
    // one with a negative word, one fully acknowledged (empty deleteSet).
    let mixed = snapshot(
        Position::new(3, 4),
        &[(3, &[6, 7, 8, 10]), (5, &[0, 1, 63, 64])],
        &[(Position::new(3, 5), &[6, -1]), (Position::new(3, 9), &[])],
    );
    let props = vec![("a".to_string(), 0), ("neg".to_string(), -5)];
    // Ledger 0 (a zero key), two all-ones words and entry 130; mark-delete
    // (0,-1) (a negative entry id).
    let full_words: Vec<u32> = (0..128).chain([130]).collect();
    let full = snapshot(Position::new(0, -1), &[(0, &full_words)], &[]);
    let individual = PendingAckRecord::individual_ack(
        TxnId::new(0, 0),
        vec![
            AckedPosition::whole(Position::new(1, 0)),
            AckedPosition::batch_indexes(Position::new(2, 3), 70, &[0, 65])
                .expect("valid batch ack"),
        ],
    );
    let cumulative = PendingAckRecord::cumulative_ack(TxnId::new(u64::MAX, 1), Position::new(5, 6));
    let commit = PendingAckRecord::commit(TxnId::new(1, 2), AckType::Individual);
    let abort = PendingAckRecord::abort(TxnId::new(0, 9), AckType::Cumulative);
    let chunk = MessageIdData {
        partition: Some(0),
        batch_index: Some(0),
        ack_set: vec![1],
        batch_size: Some(0),
        ..id(1, 2)
    };
    // Delayed indexes cut with a 10 ms step: segment 1 holds timestamps
    // 0..=5 (ledger 0 entries 0 and 3, ledger 7 entry 1: a zero key and a
    // zero timestamp), segment 2 one index in the second roaring container.
    let ix = |timestamp, ledger_id, entry_id| IndexEntry {
        timestamp,
        ledger_id,
        entry_id,
    };
    let segments = cut_segments(
        [ix(0, 0, 0), ix(5, 0, 3), ix(5, 7, 1), ix(1000, 2, 70_000)],
        10,
        -1,
    );
    assert_eq!(segments.len(), 2, "fixture: two segments");
    vec![
        (
            "position_info/zero_mark_delete",
            Fixture::PositionInfo {
                snapshot: DeletionSnapshot::new(Position::new(0, 0)),
                form: PulsarForm::PULSAR_DEFAULT_RANGES,
                properties: Vec::new(),
            },
        ),
        (
            "position_info/ranges",
            Fixture::PositionInfo {
                snapshot: mixed.clone(),
                form: UNCAPPED_RANGES,
                properties: props.clone(),
            },
        ),
        (
            "position_info/long_array",
            Fixture::PositionInfo {
                snapshot: mixed.clone(),
                form: UNCAPPED_LONGS,
                properties: props.clone(),
            },
        ),
        (
            "position_info/long_array_full_words",
            Fixture::PositionInfo {
                snapshot: full,
                form: PulsarForm::PULSAR_DEFAULT_LONG_ARRAY,
                properties: Vec::new(),
            },
        ),
        (
            "managed_cursor_info/last_active_zero",
            Fixture::ManagedCursorInfo {
                snapshot: mixed,
                cursors_ledger_id: -1,
                properties: vec![("p".to_string(), 1)],
                last_active: Some(0),
            },
        ),
        (
            "managed_cursor_info/zero_mark_delete",
            Fixture::ManagedCursorInfo {
                snapshot: DeletionSnapshot::new(Position::new(0, 0)),
                cursors_ledger_id: 0,
                properties: Vec::new(),
                last_active: None,
            },
        ),
        (
            "pending_ack/individual_ack",
            Fixture::PendingAck(vec![individual.clone()]),
        ),
        (
            "pending_ack/cumulative_ack",
            Fixture::PendingAck(vec![cumulative.clone()]),
        ),
        (
            "pending_ack/commit",
            Fixture::PendingAck(vec![commit.clone()]),
        ),
        (
            "pending_ack/abort",
            Fixture::PendingAck(vec![abort.clone()]),
        ),
        (
            "pending_ack/batched",
            Fixture::PendingAckBatch(vec![individual, cumulative, commit, abort]),
        ),
        (
            "command/message_minimal",
            Fixture::Command(Box::new(
                Command::Message(CommandMessage {
                    consumer_id: 0,
                    message_id: id(0, 0),
                    redelivery_count: None,
                    ack_set: Vec::new(),
                    consumer_epoch: None,
                    message_permits: None,
                })
                .into_base(),
            )),
        ),
        (
            "command/message_batch",
            Fixture::Command(Box::new(
                Command::Message(CommandMessage {
                    consumer_id: 7,
                    message_id: MessageIdData {
                        partition: Some(-1),
                        ..id(12, 34)
                    },
                    redelivery_count: Some(0),
                    ack_set: vec![5, i64::MIN],
                    consumer_epoch: Some(0),
                    message_permits: Some(3),
                })
                .into_base(),
            )),
        ),
        (
            "command/message_chunk",
            Fixture::Command(Box::new(
                Command::Message(CommandMessage {
                    consumer_id: u64::MAX,
                    message_id: MessageIdData {
                        first_chunk_message_id: Some(Box::new(chunk)),
                        ..id(1, 3)
                    },
                    redelivery_count: Some(2),
                    ack_set: Vec::new(),
                    consumer_epoch: None,
                    message_permits: Some(1),
                })
                .into_base(),
            )),
        ),
        (
            "command/flow_zero",
            Fixture::Command(Box::new(
                Command::Flow(CommandFlow {
                    consumer_id: 0,
                    message_permits: 0,
                })
                .into_base(),
            )),
        ),
        (
            "command/flow_max",
            Fixture::Command(Box::new(
                Command::Flow(CommandFlow {
                    consumer_id: u64::MAX,
                    message_permits: u32::MAX,
                })
                .into_base(),
            )),
        ),
        (
            "command/ack_individual",
            Fixture::Command(Box::new(
                Command::Ack(CommandAck {
                    consumer_id: 1,
                    ack_type: AckType::Individual as i32,
                    message_id: vec![
                        id(3, 4),
                        MessageIdData {
                            batch_index: Some(2),
                            ack_set: vec![0b1011],
                            batch_size: Some(4),
                            ..id(3, 5)
                        },
                    ],
                    validation_error: None,
                    txnid_least_bits: None,
                    txnid_most_bits: None,
                    request_id: Some(0),
                })
                .into_base(),
            )),
        ),
        (
            "metadata/full",
            Fixture::Metadata(Box::new(MessageMetadata {
                producer_name: "p-1".into(),
                sequence_id: u64::MAX,
                publish_time: 1_700_000_000_000,
                properties: vec![kv("k", ""), kv("", "v")],
                replicated_from: Some("west".into()),
                partition_key: Some("key-1".into()),
                replicate_to: vec!["east".into(), String::new()],
                compression: Some(compression_type::LZ4),
                uncompressed_size: Some(0),
                num_messages_in_batch: Some(3),
                event_time: Some(0),
                encryption_keys: vec![EncryptionKeys {
                    key: "rsa".into(),
                    value: vec![0, 255],
                    metadata: vec![kv("alg", "x")],
                }],
                encryption_algo: Some(String::new()),
                encryption_param: Some(vec![1, 2, 3]),
                schema_version: Some(Vec::new()),
                partition_key_b64_encoded: Some(false),
                ordering_key: Some(vec![0x80, 0]),
                deliver_at_time: Some(-1),
                marker_type: Some(0),
                txnid_least_bits: Some(u64::MAX),
                txnid_most_bits: Some(0),
                highest_sequence_id: Some(7),
                null_value: Some(false),
                uuid: Some("p-1-7".into()),
                num_chunks_from_msg: Some(2),
                total_chunk_msg_size: Some(2_000_000),
                chunk_id: Some(0),
                null_partition_key: Some(true),
            })),
        ),
        ("metadata/required_zero", Fixture::Metadata(Box::default())),
        (
            "metadata/txn_commit_marker",
            Fixture::Metadata(Box::new(txn_marker(marker_type::TXN_COMMIT, 5, 9, 0, 5))),
        ),
        (
            "command/ack_cumulative_txn",
            Fixture::Command(Box::new(
                Command::Ack(CommandAck {
                    consumer_id: 0,
                    ack_type: AckType::Cumulative as i32,
                    message_id: vec![id(9, 9)],
                    validation_error: Some(2),
                    txnid_least_bits: Some(0),
                    txnid_most_bits: Some(u64::MAX),
                    request_id: None,
                })
                .into_base(),
            )),
        ),
        (
            "delayed/metadata",
            Fixture::SnapshotMetadata(SnapshotMetadata {
                metadata_list: segments.iter().map(|s| s.to_metadata()).collect(),
            }),
        ),
        (
            "delayed/metadata_zero_timestamps",
            Fixture::SnapshotMetadata(SnapshotMetadata {
                metadata_list: vec![SnapshotSegmentMetadata::default()],
            }),
        ),
        (
            "delayed/segment_1",
            Fixture::SnapshotSegment(segments[0].to_proto()),
        ),
        (
            "delayed/segment_2",
            Fixture::SnapshotSegment(segments[1].to_proto()),
        ),
        (
            "delayed/segment_explicit_delay",
            Fixture::SnapshotSegment(SnapshotSegment {
                indexes: vec![DelayedIndex {
                    timestamp: 1,
                    ledger_id: 2,
                    entry_id: 3,
                    delayed_operation_type: Some(DelayedOperationType::Delay as i32),
                }],
            }),
        ),
        (
            "serve/connected",
            serve(3, |c| {
                c.connected = Some(CommandConnected {
                    server_version: "pulsar-core".into(),
                    protocol_version: Some(21),
                    max_message_size: Some(5 << 20),
                })
            }),
        ),
        (
            "serve/partition_metadata_response",
            serve(22, |c| {
                c.partition_metadata_response = Some(CommandPartitionedTopicMetadataResponse {
                    partitions: Some(0),
                    request_id: 5,
                    response: Some(0),
                    error: None,
                    message: None,
                })
            }),
        ),
        (
            "serve/lookup_response",
            serve(24, |c| {
                c.lookup_topic_response = Some(CommandLookupTopicResponse {
                    broker_service_url: Some("pulsar://127.0.0.1:6650".into()),
                    response: Some(1),
                    request_id: 0,
                    authoritative: Some(false),
                    error: None,
                    message: None,
                })
            }),
        ),
        (
            "serve/producer_success",
            serve(17, |c| {
                c.producer_success = Some(CommandProducerSuccess {
                    request_id: 1,
                    producer_name: "p".into(),
                    last_sequence_id: Some(-1),
                    topic_epoch: Some(3),
                    producer_ready: Some(false),
                })
            }),
        ),
        (
            "serve/send_receipt",
            serve(7, |c| {
                c.send_receipt = Some(CommandSendReceipt {
                    producer_id: 0,
                    sequence_id: 0,
                    message_id: Some(id(3, 4)),
                    highest_sequence_id: Some(0),
                })
            }),
        ),
        (
            "serve/send_receipt_duplicate",
            serve(7, |c| {
                c.send_receipt = Some(CommandSendReceipt {
                    producer_id: 0,
                    sequence_id: 9,
                    message_id: Some(id(u64::MAX, u64::MAX)),
                    highest_sequence_id: Some(0),
                })
            }),
        ),
        (
            "serve/send_error",
            serve(8, |c| {
                c.send_error = Some(CommandSendError {
                    producer_id: 1,
                    sequence_id: 2,
                    error: 2,
                    message: "persistence".into(),
                })
            }),
        ),
        (
            "serve/error",
            serve(14, |c| {
                c.error = Some(CommandError {
                    request_id: 9,
                    error: 11,
                    message: String::new(),
                })
            }),
        ),
        (
            "serve/get_last_message_id_response",
            serve(30, |c| {
                c.get_last_message_id_response = Some(CommandGetLastMessageIdResponse {
                    last_message_id: MessageIdData {
                        partition: Some(-1),
                        batch_index: Some(4),
                        ..id(1, 2)
                    },
                    request_id: 3,
                    consumer_mark_delete_position: Some(id(1, 1)),
                })
            }),
        ),
        (
            "serve/get_last_message_id_response_no_batch",
            serve(30, |c| {
                c.get_last_message_id_response = Some(CommandGetLastMessageIdResponse {
                    last_message_id: MessageIdData {
                        partition: Some(-1),
                        batch_index: Some(-1),
                        ..id(1, 0)
                    },
                    request_id: 4,
                    consumer_mark_delete_position: Some(id(1, u64::MAX)),
                })
            }),
        ),
        (
            "serve/get_schema_response",
            serve(35, |c| {
                c.get_schema_response = Some(CommandGetSchemaResponse {
                    request_id: 4,
                    error_code: Some(0),
                    error_message: Some("no schema".into()),
                })
            }),
        ),
        (
            "serve/ack_response",
            serve(38, |c| {
                c.ack_response = Some(CommandAckResponse {
                    consumer_id: 2,
                    txnid_least_bits: None,
                    txnid_most_bits: None,
                    error: None,
                    message: None,
                    request_id: Some(7),
                })
            }),
        ),
        ("serve/pong", serve(19, |c| c.pong = Some(Empty {}))),
        (
            "serve/txn_ack_response",
            serve(38, |c| {
                c.ack_response = Some(CommandAckResponse {
                    consumer_id: 2,
                    txnid_least_bits: Some(0),
                    txnid_most_bits: Some(0),
                    error: Some(23),
                    message: Some("conflict".into()),
                    request_id: Some(7),
                })
            }),
        ),
        (
            "serve/tc_client_connect_response",
            serve(63, |c| {
                c.tc_client_connect_response = Some(CommandTcClientConnectResponse {
                    request_id: 0,
                    error: None,
                    message: None,
                })
            }),
        ),
        (
            "serve/tc_client_connect_response_error",
            serve(63, |c| {
                c.tc_client_connect_response = Some(CommandTcClientConnectResponse {
                    request_id: 3,
                    error: Some(20),
                    message: Some(String::new()),
                })
            }),
        ),
        (
            "serve/new_txn_response",
            serve(51, |c| {
                c.new_txn_response = Some(txn_response(2, 1, 0, None))
            }),
        ),
        (
            "serve/add_partition_to_txn_response",
            serve(53, |c| {
                c.add_partition_to_txn_response =
                    Some(txn_response(3, u64::MAX, 0, Some((21, "not open"))))
            }),
        ),
        (
            "serve/add_subscription_to_txn_response",
            serve(55, |c| {
                c.add_subscription_to_txn_response = Some(txn_response(4, 5, 0, None))
            }),
        ),
        (
            "serve/end_txn_response",
            serve(57, |c| {
                c.end_txn_response = Some(txn_response(5, 5, 0, Some((24, "gone"))))
            }),
        ),
    ]
}

fn kv(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: value.into(),
    }
}

/// A coordinator response (`CommandNewTxnResponse` and its siblings share
/// the shape) with explicit txnid fields.
fn txn_response(
    request_id: u64,
    least: u64,
    most: u64,
    error: Option<(i32, &str)>,
) -> CommandTxnResponse {
    CommandTxnResponse {
        request_id,
        txnid_least_bits: Some(least),
        txnid_most_bits: Some(most),
        error: error.map(|e| e.0),
        message: error.map(|e| e.1.to_string()),
    }
}

fn encode(f: &Fixture) -> Vec<u8> {
    match f {
        Fixture::PositionInfo {
            snapshot,
            form,
            properties,
        } => encode_position_info(snapshot, *form, properties).expect("fixture fits its form"),
        Fixture::ManagedCursorInfo {
            snapshot,
            cursors_ledger_id,
            properties,
            last_active,
        } => encode_managed_cursor_info(
            snapshot,
            *cursors_ledger_id,
            usize::MAX,
            properties,
            *last_active,
        )
        .expect("fixture fits"),
        Fixture::PendingAck(records) => records[0].encode(),
        Fixture::PendingAckBatch(records) => encode_batch(records),
        Fixture::Command(base) => base.encode_to_vec(),
        Fixture::SnapshotMetadata(m) => m.encode_to_vec(),
        Fixture::SnapshotSegment(m) => m.encode_to_vec(),
        Fixture::Serve(c) => c.encode_to_vec(),
        Fixture::Metadata(m) => m.encode_to_vec(),
    }
}

/// Decodes `bytes` with the crate's decoder for `f`'s message and compares
/// the result with the fixture; `Err` says what differs.
fn check_decode(f: &Fixture, bytes: &[u8]) -> Result<(), String> {
    let normalized = |s: &DeletionSnapshot| {
        let mut s = s.clone();
        s.normalize();
        s
    };
    match f {
        Fixture::PositionInfo {
            snapshot,
            properties,
            ..
        } => {
            let got = decode_position_info(bytes).map_err(|e| e.to_string())?;
            let want = DecodedPositionInfo {
                snapshot: normalized(snapshot),
                properties: properties.clone(),
            };
            (got == want)
                .then_some(())
                .ok_or(format!("decoded {got:?}, fixture {want:?}"))
        }
        Fixture::ManagedCursorInfo {
            snapshot,
            cursors_ledger_id,
            properties,
            ..
        } => {
            let got = decode_managed_cursor_info(bytes).map_err(|e| e.to_string())?;
            let want = (
                *cursors_ledger_id,
                Some(DecodedPositionInfo {
                    snapshot: normalized(snapshot),
                    properties: properties.clone(),
                }),
            );
            (got == want)
                .then_some(())
                .ok_or(format!("decoded {got:?}, fixture {want:?}"))
        }
        Fixture::PendingAck(records) | Fixture::PendingAckBatch(records) => {
            let got = decode_entry(Position::new(1, 0), bytes).map_err(|e| e.to_string())?;
            (&got == records)
                .then_some(())
                .ok_or(format!("decoded {got:?}, fixture {records:?}"))
        }
        Fixture::Command(base) => {
            let (got, _) = decode_base_command(bytes).map_err(|e| e.to_string())?;
            (got == **base)
                .then_some(())
                .ok_or(format!("decoded {got:?}, fixture {base:?}"))
        }
        Fixture::SnapshotMetadata(want) => {
            let got = decode_metadata(1, bytes).map_err(|e| e.to_string())?;
            (&got == want)
                .then_some(())
                .ok_or(format!("decoded {got:?}, fixture {want:?}"))
        }
        Fixture::Serve(want) => {
            let got = ServeCommand::decode(bytes).map_err(|e| e.to_string())?;
            (got == **want)
                .then_some(())
                .ok_or(format!("decoded {got:?}, fixture {want:?}"))
        }
        Fixture::SnapshotSegment(want) => {
            let got = decode_segment(1, 1, bytes).map_err(|e| e.to_string())?;
            (&got == want)
                .then_some(())
                .ok_or(format!("decoded {got:?}, fixture {want:?}"))
        }
        Fixture::Metadata(want) => {
            let got = decode_message_metadata(bytes).map_err(|e| e.to_string())?;
            (got == **want)
                .then_some(())
                .ok_or(format!("decoded {got:?}, fixture {want:?}"))
        }
    }
}

/// The crate's decoder error for `bytes` read as `f`'s message (a protoc
/// encoding lacking a required field), or `Err` if the decoder accepted it.
fn rejection(f: &Fixture, bytes: &[u8]) -> Result<String, String> {
    let verdict = match f {
        Fixture::PositionInfo { .. } => decode_position_info(bytes)
            .map(|_| ())
            .map_err(|e| e.to_string()),
        Fixture::ManagedCursorInfo { .. } => decode_managed_cursor_info(bytes)
            .map(|_| ())
            .map_err(|e| e.to_string()),
        Fixture::PendingAck(_) | Fixture::PendingAckBatch(_) => {
            decode_entry(Position::new(1, 0), bytes)
                .map(|_| ())
                .map_err(|e| e.to_string())
        }
        Fixture::Command(_) => decode_base_command(bytes)
            .map(|_| ())
            .map_err(|e| e.to_string()),
        Fixture::SnapshotMetadata(_) => decode_metadata(1, bytes)
            .map(|_| ())
            .map_err(|e| e.to_string()),
        Fixture::SnapshotSegment(_) => decode_segment(1, 1, bytes)
            .map(|_| ())
            .map_err(|e| e.to_string()),
        Fixture::Metadata(_) => decode_message_metadata(bytes)
            .map(|_| ())
            .map_err(|e| e.to_string()),
        Fixture::Serve(_) => {
            return Err("serve commands are checked by has_required, not here".into())
        }
    };
    match verdict {
        Err(e) => Ok(e),
        Ok(()) => Err("accepted".into()),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let fixtures: BTreeMap<&str, Fixture> = fixtures().into_iter().collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        [] | ["encode"] => {
            for (name, f) in &fixtures {
                println!("{name} {}", hex(&encode(f)));
            }
            ExitCode::SUCCESS
        }
        [mode @ ("decode" | "reject"), file] => {
            let reject = *mode == "reject";
            let text = match std::fs::read_to_string(file) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("protoc_fixtures: cannot read {file}: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let mut bad = 0;
            let mut checked = 0;
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                let Some((name, hexed)) = line.split_once(' ') else {
                    eprintln!("protoc_fixtures: malformed line {line:?}");
                    bad += 1;
                    continue;
                };
                // `NAME+variant`: fixture NAME in another valid encoding.
                let base = name.split_once('+').map_or(name, |(b, _)| b);
                let (Some(f), Some(bytes)) = (fixtures.get(base), unhex(hexed.trim())) else {
                    eprintln!("protoc_fixtures: unknown fixture or bad hex in {line:?}");
                    bad += 1;
                    continue;
                };
                checked += 1;
                if reject {
                    match rejection(f, &bytes) {
                        Ok(e) => println!("rejected {name}: {e}"),
                        Err(e) => {
                            eprintln!("NOT REJECTED {name}: {e}");
                            bad += 1;
                        }
                    }
                } else if let Err(e) = check_decode(f, &bytes) {
                    eprintln!("DECODE MISMATCH {name}: {e}");
                    bad += 1;
                }
            }
            let verb = if reject { "rejected" } else { "decoded" };
            println!("protoc_fixtures: {verb} {checked} protoc encodings, {bad} mismatches");
            if bad == 0 && checked > 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        _ => {
            eprintln!("usage: protoc_fixtures [encode | decode FILE | reject FILE]");
            ExitCode::FAILURE
        }
    }
}
