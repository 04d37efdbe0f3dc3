//! One durable commit per driver turn (`turn_commit.rs`): SENDs,
//! transactional acks and END_TXN of one turn are made durable by one
//! fsynced commit, nothing of the turn leaves before it, and a failed one
//! answers every operation with its error and keeps none of them.

use super::*;
use crate::ledger::SyncMode;
use crate::sim::crash_storage::{CrashKind, CrashPoint, CrashStorage};

fn on(storage: &CrashStorage, turn_commit: bool) -> Broker {
    let store = RedbStore::open_on_backend(storage.backend(), SyncMode::Immediate, 1 << 20)
        .expect("open the store");
    let mut config = BrokerConfig::new("pulsar://node:6650");
    config.turn_commit = turn_commit;
    Broker::new(store, config, T0)
}

/// A producer, a coordinator connection, subscription `work` with `n`
/// entries delivered to consumer 7, and an open transaction holding the
/// topic and `work`.
fn setup(storage: &CrashStorage, turn_commit: bool, n: u64) -> (Broker, Vec<Position>, TxnId) {
    let mut b = on(storage, turn_commit);
    connect(&mut b, 1);
    producer(&mut b, 1, 1);
    assert_eq!(
        tc_connect(&mut b, 1)[0]
            .1
            .tc_client_connect_response
            .clone()
            .unwrap()
            .error,
        None
    );
    subscribe(&mut b, 1, 7, "work", sub_type::SHARED, "w");
    let inputs: Vec<Position> = (0..n)
        .map(|i| send(&mut b, 1, 1, i, &entry(None, None, None)))
        .collect();
    assert_eq!(delivered(&flow(&mut b, 1, 7, 100), 7), inputs);
    let t = new_txn(&mut b, 1, 60_000);
    add_partition(&mut b, 1, t);
    add_subscription(&mut b, 1, t, "work");
    (b, inputs, t)
}

/// Hands the core, in ONE turn (no poll between), `sends` transactional
/// SENDs, a transactional ack of every input, and END_TXN(commit).
fn one_turn(b: &mut Broker, inputs: &[Position], t: TxnId, sends: u64) {
    for seq in 0..sends {
        let c = BrokerCommand {
            r#type: ty::SEND,
            send: Some(command::CommandSend {
                producer_id: 1,
                sequence_id: 100 + seq,
                txnid_least_bits: Some(t.least_sig_bits),
                txnid_most_bits: Some(t.most_sig_bits),
                ..Default::default()
            }),
            ..Default::default()
        };
        b.handle_frame(1, &enc(&c), &txn_entry(t), T0).unwrap();
    }
    for (i, p) in inputs.iter().enumerate() {
        let c = BrokerCommand {
            r#type: ty::ACK,
            ack: Some(CommandAck {
                consumer_id: 7,
                ack_type: 0,
                message_id: vec![mid(*p, vec![])],
                validation_error: None,
                txnid_least_bits: Some(t.least_sig_bits),
                txnid_most_bits: Some(t.most_sig_bits),
                request_id: Some(200 + i as u64),
            }),
            ..Default::default()
        };
        b.handle_frame(1, &enc(&c), &[], T0).unwrap();
    }
    let c = BrokerCommand {
        r#type: ty::END_TXN,
        end_txn: Some(tp::CommandEndTxn {
            request_id: 5,
            txnid_least_bits: Some(t.least_sig_bits),
            txnid_most_bits: Some(t.most_sig_bits),
            txn_action: Some(tp::txn_action::COMMIT),
        }),
        ..Default::default()
    };
    b.handle_frame(1, &enc(&c), &[], T0).unwrap();
}

/// The replies of the turn: SEND receipts / errors, ack responses' error
/// codes, END_TXN's error code.
type Replies = (Vec<Result<(), i32>>, Vec<Option<i32>>, Option<Option<i32>>);

fn replies(out: &[(u64, BrokerCommand, usize)]) -> Replies {
    let sends = out
        .iter()
        .filter_map(|(_, f, _)| match (&f.send_receipt, &f.send_error) {
            (Some(_), _) => Some(Ok(())),
            (_, Some(e)) => Some(Err(e.error)),
            _ => None,
        })
        .collect();
    let acks = out
        .iter()
        .filter_map(|(_, f, _)| f.ack_response.as_ref().map(|r| r.error))
        .collect();
    let end = out
        .iter()
        .find_map(|(_, f, _)| f.end_txn_response.as_ref().map(|r| r.error));
    (sends, acks, end)
}

/// Pulsar answers a publish, a transactional ack and END_TXN only once
/// what they wrote is durable (BookKeeper's journal groups the adds of
/// the moment under one fsync): a turn with N SENDs, M transactional acks
/// and an END_TXN is one fsynced commit, and every reply follows it.
#[test]
fn a_turn_of_sends_txn_acks_and_end_txn_is_one_durable_commit() {
    const N: u64 = 4;
    const M: u64 = 3;
    let mut counts = Vec::new();
    for turn_commit in [true, false] {
        let storage = CrashStorage::new();
        let (mut b, inputs, t) = setup(&storage, turn_commit, M);
        let fsyncs = storage.durable_writes_since_open();
        let commits = b.store().durable_commits();
        one_turn(&mut b, &inputs, t, N);
        if turn_commit {
            assert_eq!(
                storage.durable_writes_since_open(),
                fsyncs,
                "no fsync before the turn ends"
            );
        }
        // The turn's outputs; the reads it issued complete afterwards, as
        // later inputs with turns of their own.
        let mut out = Vec::new();
        let mut reads = Vec::new();
        while let Some(o) = b.poll_output() {
            match o {
                Output::Frame { conn, frame } => {
                    out.push((conn, frame.decode_command().unwrap(), frame.payload.len()));
                }
                Output::ReadIssued { read } => reads.push(read),
                _ => {}
            }
        }
        let (sends, acks, end) = replies(&out);
        assert_eq!(sends, vec![Ok(()); N as usize], "{out:?}");
        assert_eq!(acks, vec![None; M as usize], "{out:?}");
        assert_eq!(end, Some(None), "{out:?}");
        counts.push((
            b.store().durable_commits() - commits,
            storage.durable_writes_since_open() - fsyncs,
        ));
        for r in reads {
            b.complete_read(r, T0);
        }
        frames(&mut b);
        // The commit took effect: the acks applied, the messages delivered.
        assert!(inputs
            .iter()
            .all(|p| sub(&b, "work").deletion().is_message_deleted(*p)));
    }
    let (with, without) = (counts[0], counts[1]);
    assert_eq!(with.0, 1, "one durable commit for the turn: {counts:?}");
    assert!(
        with.1 <= 2,
        "one fsync (plus at most one for the file's growth): {counts:?}"
    );
    // Negative control: the same turn with a commit per write.
    assert!(
        without.0 >= 1 + M + 2,
        "without the turn's barrier each write commits on its own: {counts:?}"
    );
}

/// A failed turn commit: no reply of the turn confirms anything (every
/// SEND, ack and END_TXN gets its typed error), no MESSAGE of it leaves,
/// every connection closes, and the store reopens at the state before the
/// turn (the transaction still open, its acks not applied, its messages
/// absent).
#[test]
fn a_failed_turn_commit_answers_every_operation_with_an_error_and_keeps_none() {
    const N: u64 = 2;
    const M: u64 = 2;
    let storage = CrashStorage::new();
    let (mut b, inputs, t) = setup(&storage, true, M);
    // The turn's own fsync fails (nothing of it becomes durable).
    storage.arm(CrashPoint {
        k: storage.durable_writes_since_open() + 1,
        kind: CrashKind::BeforeSync,
    });
    one_turn(&mut b, &inputs, t, N);
    let mut outs = Vec::new();
    while let Some(o) = b.poll_output() {
        outs.push(o);
    }
    assert!(storage.is_dead(), "the armed fsync was the turn's");
    let out: Vec<(u64, BrokerCommand, usize)> = outs
        .iter()
        .filter_map(|o| match o {
            Output::Frame { conn, frame } => {
                Some((*conn, frame.decode_command().unwrap(), frame.payload.len()))
            }
            _ => None,
        })
        .collect();
    let (sends, acks, end) = replies(&out);
    assert_eq!(sends.len(), N as usize, "{out:?}");
    assert!(sends.iter().all(|r| r.is_err()), "{out:?}");
    assert_eq!(acks.len(), M as usize, "{out:?}");
    assert!(acks.iter().all(Option::is_some), "{out:?}");
    assert!(matches!(end, Some(Some(_))), "{out:?}");
    assert!(
        out.iter().all(|(_, f, _)| f.r#type != ty::MESSAGE),
        "no MESSAGE of the failed turn leaves: {out:?}"
    );
    assert!(
        outs.iter()
            .any(|o| matches!(o, Output::Close { conn: 1, .. })),
        "the connection closes"
    );
    assert!(b.topics().is_empty(), "the core keeps no in-memory effect");
    drop(b);
    storage.recover();
    let mut b = on(&storage, true);
    connect(&mut b, 2);
    subscribe(&mut b, 2, 8, "work", sub_type::SHARED, "w");
    assert_eq!(
        delivered(&flow(&mut b, 2, 8, 100), 8),
        inputs,
        "the acks of the failed turn are not applied and its messages are not stored"
    );
    assert!(inputs
        .iter()
        .all(|p| !sub(&b, "work").deletion().is_message_deleted(*p)));
}
