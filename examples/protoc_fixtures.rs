//! The Rust half of the protoc byte-parity check (`bash .ci/check protoc`,
//! driven by `tests/protoc/check.py`): fixed fixtures of every Pulsar
//! message this crate writes on the cursor, pending-ack and delivery paths,
//! encoded by the crate's own encoders.
//!
//! - no argument (or `encode`): one line per fixture, `NAME HEX`, the bytes
//!   `cursor::position_info`, `pending_ack::record` and `permits::wire`
//!   produce; the checker compares them with protoc's bytes for the same
//!   fixture built from the `.proto` transcriptions in `tests/protoc/`.
//! - `decode FILE`: FILE holds `NAME HEX` lines written by protoc's
//!   generated code (a `NAME+packed` line: the same fixture with its
//!   repeated int64 fields packed); each is decoded by the crate's decoder
//!   and must give back fixture NAME exactly. Exit status 1 on any mismatch.
//!
//! Proto2 presence is part of the fixtures: required and optional fields
//! holding zero (on the wire), empty repeated fields (absent), negative
//! int64 words (10-byte varints), `[default = -1]` fields set to -1.

use std::collections::BTreeMap;
use std::process::ExitCode;

use prost::Message;
use pulsar_core::cursor::position_info::{
    decode_managed_cursor_info, decode_position_info, encode_managed_cursor_info,
    encode_position_info, DecodedPositionInfo, PulsarForm,
};
use pulsar_core::cursor::DeletionSnapshot;
use pulsar_core::pending_ack::record::{
    decode_entry, encode_batch, AckedPosition, PendingAckRecord, TxnId,
};
use pulsar_core::permits::wire::{
    decode_base_command, AckType, BaseCommand, Command, CommandAck, CommandFlow, CommandMessage,
    MessageIdData,
};
use pulsar_core::Position;
use roaring::RoaringBitmap;

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
    ]
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
        ["decode", file] => {
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
                let base = name.strip_suffix("+packed").unwrap_or(name);
                let (Some(f), Some(bytes)) = (fixtures.get(base), unhex(hexed.trim())) else {
                    eprintln!("protoc_fixtures: unknown fixture or bad hex in {line:?}");
                    bad += 1;
                    continue;
                };
                checked += 1;
                if let Err(e) = check_decode(f, &bytes) {
                    eprintln!("DECODE MISMATCH {name}: {e}");
                    bad += 1;
                }
            }
            println!("protoc_fixtures: decoded {checked} protoc encodings, {bad} mismatches");
            if bad == 0 && checked > 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        _ => {
            eprintln!("usage: protoc_fixtures [encode | decode FILE]");
            ExitCode::FAILURE
        }
    }
}
