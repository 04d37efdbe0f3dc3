//! Group commit of SENDs: the SENDs of one turn, across connections,
//! producers and topics, share one store commit (counted as the store's
//! fsyncs); no SEND_RECEIPT is queued before the commit of its entry; an
//! entry is dispatched only once durable; deduplication holds across a
//! crash inside the batch.

use super::*;
use crate::ledger::SyncMode;
use crate::sim::crash_storage::{CrashKind, CrashPoint, CrashStorage};

use super::super::send_commit::{MAX_BATCH_BYTES, MAX_BATCH_ENTRIES};

const OTHER: &str = "persistent://public/default/u";

fn on(storage: &CrashStorage) -> Broker {
    let store = RedbStore::open_on_backend(storage.backend(), SyncMode::Immediate, 1 << 20)
        .expect("open the store");
    Broker::new(store, BrokerConfig::new("pulsar://node:6650"), T0)
}

/// PRODUCER `pid` named `name` on `topic`.
fn producer_on(b: &mut Broker, conn: u64, pid: u64, topic: &str, name: &str) {
    let out = feed(
        b,
        conn,
        BrokerCommand {
            r#type: ty::PRODUCER,
            producer: Some(command::CommandProducer {
                topic: topic.into(),
                producer_id: pid,
                request_id: 100 + pid,
                producer_name: Some(name.into()),
                producer_access_mode: None,
                topic_epoch: None,
            }),
            ..Default::default()
        },
    );
    assert_eq!(out[0].1.r#type, ty::PRODUCER_SUCCESS, "{out:?}");
}

/// An entry of producer `name` with `seq` in its metadata (what the
/// deduplication replay reads after a restart).
fn entry_of(name: &str, seq: u64) -> Vec<u8> {
    let md = MessageMetadata {
        producer_name: name.into(),
        sequence_id: seq,
        publish_time: 2,
        ..Default::default()
    }
    .encode_to_vec();
    let mut body = Vec::new();
    body.extend_from_slice(&(md.len() as u32).to_be_bytes());
    body.extend_from_slice(&md);
    body.extend_from_slice(b"m");
    let mut out = vec![0x0e, 0x01];
    out.extend_from_slice(&crc32c(&body).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// Hands the core one SEND without ending the turn.
fn send_frame(b: &mut Broker, conn: u64, pid: u64, seq: u64, payload: &[u8]) {
    let c = BrokerCommand {
        r#type: ty::SEND,
        send: Some(command::CommandSend {
            producer_id: pid,
            sequence_id: seq,
            ..Default::default()
        }),
        ..Default::default()
    };
    b.handle_frame(conn, &enc(&c), payload, T0).unwrap();
}

/// Replies to SENDs in `out`, in order: (conn, producer, sequence id,
/// message id or the SEND_ERROR code).
fn send_replies(
    out: &[(u64, BrokerCommand, usize)],
) -> Vec<(u64, u64, u64, Result<Position, i32>)> {
    out.iter()
        .filter_map(|(c, f, _)| {
            if let Some(r) = &f.send_receipt {
                let id = r.message_id.clone().unwrap();
                Some((
                    *c,
                    r.producer_id,
                    r.sequence_id,
                    Ok(Position::new(id.ledger_id as i64, id.entry_id as i64)),
                ))
            } else {
                f.send_error
                    .as_ref()
                    .map(|e| (*c, e.producer_id, e.sequence_id, Err(e.error)))
            }
        })
        .collect()
}

/// Frames queued and not yet taken, without ending the turn.
fn queued(b: &Broker) -> Vec<BrokerCommand> {
    b.out
        .queue
        .iter()
        .filter_map(|o| match o {
            Output::Frame { frame, .. } => frame.decode_command().ok(),
            _ => None,
        })
        .collect()
}

const DUP: Position = Position::new(-1, -1);

/// Two connections, producers on two topics.
fn two_producers(storage: &CrashStorage) -> Broker {
    let mut b = on(storage);
    connect(&mut b, 1);
    connect(&mut b, 2);
    producer_on(&mut b, 1, 1, TOPIC, "p");
    producer_on(&mut b, 2, 1, OTHER, "q");
    producer_on(&mut b, 2, 2, TOPIC, "r");
    b
}

#[test]
fn the_sends_of_one_turn_share_one_commit_and_their_receipts_follow_it() {
    let storage = CrashStorage::new();
    let mut b = two_producers(&storage);
    subscribe(&mut b, 1, 7, "s", sub_type::SHARED, "c");
    let _ = flow(&mut b, 1, 7, 100);
    let before = storage.durable_writes_since_open();
    let sends = [
        (1, 1, 0),
        (2, 1, 0),
        (2, 2, 0),
        (1, 1, 1),
        (2, 1, 1),
        (2, 2, 1),
    ];
    for (conn, pid, seq) in sends {
        send_frame(&mut b, conn, pid, seq, &entry(None, None, None));
    }
    // Nothing durable yet: no receipt, and the entries are not readable.
    assert_eq!(storage.durable_writes_since_open(), before);
    let early = queued(&b);
    assert!(
        early
            .iter()
            .all(|f| f.send_receipt.is_none() && f.message.is_none()),
        "a receipt or a MESSAGE queued before the commit: {early:?}"
    );
    assert_eq!(
        b.topics()[TOPIC].ml.last_confirmed_entry(),
        Position::new(1, -1)
    );
    b.flush();
    assert_eq!(
        storage.durable_writes_since_open(),
        before + 1,
        "six SENDs of one turn on two topics, one commit"
    );
    let out = frames(&mut b);
    assert_eq!(
        send_replies(&out),
        vec![
            (1, 1, 0, Ok(Position::new(1, 0))),
            (2, 1, 0, Ok(Position::new(1, 0))),
            (2, 2, 0, Ok(Position::new(1, 1))),
            (1, 1, 1, Ok(Position::new(1, 2))),
            (2, 1, 1, Ok(Position::new(1, 1))),
            (2, 2, 1, Ok(Position::new(1, 3))),
        ]
    );
    // The durable entries are dispatched after their receipts.
    let first_message = out.iter().position(|(_, f, _)| f.message.is_some());
    let last_receipt = out.iter().rposition(|(_, f, _)| f.send_receipt.is_some());
    assert!(first_message > last_receipt, "{out:?}");
    assert_eq!(
        out.iter().filter(|(_, f, _)| f.message.is_some()).count(),
        4
    );
}

#[test]
fn a_failed_commit_answers_every_send_of_the_batch_with_an_error_and_stores_none() {
    let storage = CrashStorage::new();
    let mut b = two_producers(&storage);
    storage.arm(CrashPoint {
        k: storage.durable_writes_since_open() + 1,
        kind: CrashKind::BeforeSync,
    });
    for (conn, pid, seq) in [(1, 1, 0), (2, 1, 0), (1, 1, 1)] {
        send_frame(&mut b, conn, pid, seq, &entry_of("x", seq));
    }
    let out = frames(&mut b);
    assert!(storage.is_dead(), "the group commit reached the store");
    let replies = send_replies(&out);
    assert_eq!(replies.len(), 3, "{replies:?}");
    assert!(
        replies
            .iter()
            .all(|r| r.3 == Err(server_error::PERSISTENCE_ERROR)),
        "a receipt went out for an entry that is not durable: {replies:?}"
    );
    drop(b);
    storage.recover();
    let b = on(&storage);
    let mut b = b;
    connect(&mut b, 3);
    producer_on(&mut b, 3, 1, TOPIC, "p");
    assert_eq!(
        b.topics()[TOPIC].ml.last_confirmed_entry(),
        Position::new(1, -1)
    );
}

/// A crash at the batch's fsync: before it, nothing is stored and the
/// resent SENDs are stored once; after it, everything is, and the resent
/// SENDs are duplicates (the map is rebuilt from the ledger).
#[test]
fn deduplication_holds_across_a_crash_inside_the_batch() {
    for kind in [CrashKind::BeforeSync, CrashKind::AfterSync] {
        let storage = CrashStorage::new();
        let mut b = on(&storage);
        connect(&mut b, 1);
        producer_on(&mut b, 1, 1, TOPIC, "p");
        storage.arm(CrashPoint {
            k: storage.durable_writes_since_open() + 1,
            kind,
        });
        for seq in 0..3 {
            send_frame(&mut b, 1, 1, seq, &entry_of("p", seq));
        }
        b.flush();
        assert!(storage.is_dead(), "{kind:?}");
        drop(b);
        storage.recover();
        let mut b = on(&storage);
        connect(&mut b, 2);
        producer_on(&mut b, 2, 1, TOPIC, "p");
        for seq in 0..3 {
            send_frame(&mut b, 2, 1, seq, &entry_of("p", seq));
        }
        let replies = send_replies(&frames(&mut b));
        let expected: Vec<_> = (0..3)
            .map(|seq| {
                let at = match kind {
                    CrashKind::BeforeSync => Position::new(1, seq as i64),
                    CrashKind::AfterSync => DUP,
                };
                (2, 1, seq, Ok(at))
            })
            .collect();
        assert_eq!(replies, expected, "{kind:?}");
        assert_eq!(
            b.topics()[TOPIC].ml.last_confirmed_entry(),
            Position::new(1, 2),
            "{kind:?}: each entry stored once"
        );
    }
}

#[test]
fn a_duplicate_of_an_entry_of_the_batch_is_answered_after_its_commit_in_order() {
    let storage = CrashStorage::new();
    let mut b = on(&storage);
    connect(&mut b, 1);
    producer_on(&mut b, 1, 1, TOPIC, "p");
    send_frame(&mut b, 1, 1, 0, &entry_of("p", 0));
    send_frame(&mut b, 1, 1, 0, &entry_of("p", 0));
    send_frame(&mut b, 1, 1, 1, &entry_of("p", 1));
    // A refusal of the same producer waits behind its earlier sends.
    send_frame(&mut b, 1, 1, 2, b"\x0e\x01garbage");
    assert!(queued(&b).is_empty());
    let replies = send_replies(&frames(&mut b));
    assert_eq!(
        replies,
        vec![
            (1, 1, 0, Ok(Position::new(1, 0))),
            (1, 1, 0, Ok(DUP)),
            (1, 1, 1, Ok(Position::new(1, 1))),
            (1, 1, 2, Err(server_error::CHECKSUM_ERROR)),
        ]
    );
    assert_eq!(
        b.topics()[TOPIC].ml.last_confirmed_entry(),
        Position::new(1, 1)
    );
}

/// Store commits begun so far (each batch is one; its fsync is the turn's
/// barrier, `turn_commit.rs`).
fn store_commits(b: &Broker) -> u64 {
    b.store().durable_commits() + b.store().deferred_commits()
}

#[test]
fn a_batch_is_bounded_in_entries_and_a_producer_close_waits_for_its_receipts() {
    let storage = CrashStorage::new();
    let mut b = on(&storage);
    connect(&mut b, 1);
    producer_on(&mut b, 1, 1, TOPIC, "p");
    let before = store_commits(&b);
    let n = MAX_BATCH_ENTRIES as u64 + 1;
    for seq in 0..n - 1 {
        send_frame(&mut b, 1, 1, seq, &entry(None, None, None));
    }
    assert_eq!(store_commits(&b), before, "within the bound");
    send_frame(&mut b, 1, 1, n - 1, &entry(None, None, None));
    let committed = store_commits(&b);
    assert!(
        committed > before,
        "the bound was reached: the batch committed"
    );
    let receipts = queued(&b)
        .iter()
        .filter(|f| f.send_receipt.is_some())
        .count();
    assert_eq!(
        receipts, MAX_BATCH_ENTRIES,
        "the last SEND waits for the next commit"
    );
    // CLOSE_PRODUCER depends on the batch: committed before its success.
    b.handle_frame(
        1,
        &enc(&BrokerCommand {
            r#type: ty::CLOSE_PRODUCER,
            close_producer: Some(command::CommandIdRequest {
                id: 1,
                request_id: 55,
            }),
            ..Default::default()
        }),
        &[],
        T0,
    )
    .unwrap();
    assert!(store_commits(&b) > committed);
    let out = frames(&mut b);
    let replies = send_replies(&out);
    assert_eq!(replies.len() as u64, n);
    assert!(replies.iter().all(|r| r.3.is_ok()));
    assert_eq!(
        out.last().unwrap().1,
        success(55),
        "the close's success comes last"
    );
    assert!(MAX_BATCH_BYTES >= crate::broker::MAX_MESSAGE_SIZE as usize);
}
