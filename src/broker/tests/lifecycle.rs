//! Consumed-ledger trimming through the broker core (`lifecycle.rs`): the
//! timer deletes what every subscription acknowledged, a subscription
//! without consumers keeps its backlog, unacknowledged and replayed entries
//! are kept, and a restart after a trim recovers every subscription.

use super::*;

/// A core whose topics roll over every 3 entries and trim every second.
/// Deduplication stays on: its durable cursor is snapshotted before each
/// trim, so only the subscriptions set the boundary.
fn small_ledgers(dir: &tempfile::TempDir) -> Broker {
    let mut config = BrokerConfig::new("pulsar://node:6650");
    config.ledger.max_entries_per_ledger = 3;
    config.retention_check_interval_ms = 1_000;
    Broker::new(open_store(dir), config, T0)
}

fn ledger_ids(b: &Broker) -> Vec<i64> {
    b.topics()[TOPIC]
        .ml
        .ledgers()
        .into_iter()
        .map(|(id, _)| id)
        .collect()
}

#[test]
fn the_timer_deletes_ledgers_every_subscription_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = small_ledgers(&dir);
    connect(&mut b, 1);
    producer(&mut b, 1, 1);
    // No closed ledger yet: no trimming deadline.
    assert_eq!(b.poll_timeout(), None);
    subscribe(&mut b, 1, 7, "s", sub_type::SHARED, "c");
    let ps: Vec<Position> = (0..10)
        .map(|i| send(&mut b, 1, 1, i, &entry(None, None, None)))
        .collect();
    assert_eq!(ledger_ids(&b), vec![1, 2, 3, 4]);
    // A closed ledger: trimming is due (never ran: at once).
    assert!(b.poll_timeout().is_some_and(|t| t <= T0));
    // Delivered, not acknowledged: everything is kept.
    assert_eq!(flow(&mut b, 1, 7, 100).len(), 10);
    b.handle_timeout(T0);
    assert_eq!(ledger_ids(&b), vec![1, 2, 3, 4]);
    assert_eq!(b.ledgers_deleted_total(), 0);
    // The next trim is one interval later.
    assert_eq!(b.poll_timeout(), Some(T0 + 1_000));
    // Acknowledge ledgers 1 and 2 and one entry of 3: 1 and 2 go.
    let acked: Vec<MessageIdData> = ps[..7].iter().map(|p| mid(*p, vec![])).collect();
    ack(&mut b, 1, 7, false, acked, None);
    b.handle_timeout(T0 + 999);
    assert_eq!(ledger_ids(&b), vec![1, 2, 3, 4], "not due yet");
    b.handle_timeout(T0 + 1_000);
    assert_eq!(ledger_ids(&b), vec![3, 4]);
    assert_eq!(b.ledgers_deleted_total(), 2);
    // Redelivery of what is left still reads it.
    let out = feed(
        &mut b,
        1,
        BrokerCommand {
            r#type: ty::REDELIVER_UNACKNOWLEDGED_MESSAGES,
            redeliver_unacknowledged_messages: Some(CommandRedeliverUnacknowledgedMessages {
                consumer_id: 7,
                message_ids: Vec::new(),
                consumer_epoch: None,
            }),
            ..Default::default()
        },
    );
    let redelivered: Vec<Position> = out
        .iter()
        .filter_map(|(_, f, _)| f.message.as_ref())
        .map(|m| Position::new(m.message_id.ledger_id as i64, m.message_id.entry_id as i64))
        .collect();
    assert_eq!(redelivered, ps[7..].to_vec());
    // Everything acknowledged: every closed ledger goes, the current one
    // (4) stays.
    let rest: Vec<MessageIdData> = ps[7..].iter().map(|p| mid(*p, vec![])).collect();
    ack(&mut b, 1, 7, false, rest, None);
    b.handle_timeout(T0 + 2_000);
    assert_eq!(ledger_ids(&b), vec![4]);
    assert_eq!(b.ledgers_deleted_total(), 3);
}

#[test]
fn a_subscription_without_consumers_keeps_its_backlog_and_a_restart_recovers_after_a_trim() {
    let dir = tempfile::tempdir().unwrap();
    let ps: Vec<Position>;
    {
        let mut b = small_ledgers(&dir);
        connect(&mut b, 1);
        producer(&mut b, 1, 1);
        subscribe(&mut b, 1, 7, "fast", sub_type::SHARED, "c");
        subscribe(&mut b, 1, 8, "slow", sub_type::SHARED, "d");
        ps = (0..8)
            .map(|i| send(&mut b, 1, 1, i, &entry(None, None, None)))
            .collect();
        flow(&mut b, 1, 7, 100);
        let all: Vec<MessageIdData> = ps.iter().map(|p| mid(*p, vec![])).collect();
        ack(&mut b, 1, 7, false, all, None);
        // "slow" acknowledged only ledger 1 (cumulatively), then its
        // consumer went away.
        flow(&mut b, 1, 8, 100);
        ack(&mut b, 1, 8, true, vec![mid(ps[2], vec![])], None);
        feed(
            &mut b,
            1,
            BrokerCommand {
                r#type: ty::CLOSE_CONSUMER,
                close_consumer: Some(command::CommandIdRequest {
                    id: 8,
                    request_id: 9,
                }),
                ..Default::default()
            },
        );
        b.handle_timeout(T0 + 1_000);
        assert_eq!(ledger_ids(&b), vec![2, 3]);
    }
    // A new process: "slow" recovers at its mark-delete (the last entry of
    // deleted ledger 1) and gets exactly its backlog.
    let mut b = small_ledgers(&dir);
    connect(&mut b, 1);
    subscribe(&mut b, 1, 8, "slow", sub_type::SHARED, "d");
    assert_eq!(sub(&b, "slow").mark_delete(), ps[2]);
    let out = flow(&mut b, 1, 8, 100);
    let got: Vec<Position> = out
        .iter()
        .filter_map(|(_, f, _)| f.message.as_ref())
        .map(|m| Position::new(m.message_id.ledger_id as i64, m.message_id.entry_id as i64))
        .collect();
    assert_eq!(got, ps[3..].to_vec());
    let all: Vec<MessageIdData> = ps[3..].iter().map(|p| mid(*p, vec![])).collect();
    ack(&mut b, 1, 8, false, all, None);
    b.handle_timeout(T0 + 5_000);
    assert_eq!(ledger_ids(&b), vec![3]);
}

/// A batch-index ack the client re-sends (its receipt lost) after the
/// entry was acknowledged and its ledger deleted is answered as Pulsar
/// answers an ack at or below the mark-delete: success, nothing read.
#[test]
fn a_batch_index_ack_resent_after_its_ledger_was_deleted_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = small_ledgers(&dir);
    connect(&mut b, 1);
    producer(&mut b, 1, 1);
    subscribe(&mut b, 1, 7, "s", sub_type::SHARED, "c");
    let ps: Vec<Position> = (0..4)
        .map(|i| send(&mut b, 1, 1, i, &entry(None, Some(2), None)))
        .collect();
    flow(&mut b, 1, 7, 100);
    let all: Vec<MessageIdData> = ps.iter().map(|p| mid(*p, vec![])).collect();
    ack(&mut b, 1, 7, false, all, None);
    b.handle_timeout(T0 + 1_000);
    assert_eq!(ledger_ids(&b), vec![2]);
    let out = ack(&mut b, 1, 7, false, vec![mid(ps[0], vec![0b10])], Some(5));
    let resp = out
        .iter()
        .find_map(|(_, f, _)| f.ack_response.as_ref())
        .expect("an ACK_RESPONSE");
    assert_eq!((resp.error, resp.request_id), (None, Some(5)), "{resp:?}");
}
