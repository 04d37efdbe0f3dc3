//! Seek, unsubscribe and readers through the broker core (`seek.rs`,
//! `unsubscribe.rs`, `reader.rs`): a backward seek makes acknowledged
//! entries deliverable again and drops the individually deleted ranges
//! past the new position, a forward seek acknowledges what it skips, both
//! survive a restart; a publish-time seek finds the first entry published
//! at or after the time; unsubscribe deletes the cursor durably (it no
//! longer pins ledgers) and is refused while another consumer is attached;
//! a reader's cursor is never persisted and goes with its consumer.

use super::*;
use crate::ledger::LedgerStore;

/// An entry published at `publish_time`.
fn entry_at(publish_time: u64) -> Vec<u8> {
    let md = MessageMetadata {
        producer_name: "p".into(),
        sequence_id: 1,
        publish_time,
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

fn seek_cmd(
    cid: u64,
    request_id: u64,
    id: Option<MessageIdData>,
    time: Option<u64>,
) -> BrokerCommand {
    BrokerCommand {
        r#type: ty::SEEK,
        seek: Some(command::CommandSeek {
            consumer_id: cid,
            request_id,
            message_id: id,
            message_publish_time: time,
        }),
        ..Default::default()
    }
}

fn close_consumer(cid: u64) -> BrokerCommand {
    BrokerCommand {
        r#type: ty::CLOSE_CONSUMER,
        close_consumer: Some(command::CommandIdRequest {
            id: cid,
            request_id: 0,
        }),
        ..Default::default()
    }
}

fn error(request_id: u64, error: i32, message: &str) -> BrokerCommand {
    BrokerCommand {
        r#type: ty::ERROR,
        error: Some(command::CommandError {
            request_id,
            error,
            message: message.into(),
        }),
        ..Default::default()
    }
}

fn positions(out: &[(u64, BrokerCommand, usize)]) -> Vec<Position> {
    out.iter()
        .filter(|(_, f, _)| f.r#type == ty::MESSAGE)
        .map(|(_, f, _)| {
            let m = &f.message.as_ref().unwrap().message_id;
            Position::new(m.ledger_id as i64, m.entry_id as i64)
        })
        .collect()
}

/// Seeks consumer 7 of connection 1: the consumer gets CLOSE_CONSUMER,
/// the request SUCCESS; the client subscribes again.
fn seek_and_resubscribe(
    b: &mut Broker,
    request_id: u64,
    id: Option<MessageIdData>,
    time: Option<u64>,
) {
    let out = feed(b, 1, seek_cmd(7, request_id, id, time));
    assert_eq!(
        out,
        vec![(1, close_consumer(7), 0), (1, success(request_id), 0)],
        "CLOSE_CONSUMER, then SUCCESS"
    );
    subscribe(b, 1, 7, "s", sub_type::SHARED, "c");
}

fn unsubscribe_cmd(cid: u64, request_id: u64) -> BrokerCommand {
    BrokerCommand {
        r#type: ty::UNSUBSCRIBE,
        unsubscribe: Some(command::CommandIdRequest {
            id: cid,
            request_id,
        }),
        ..Default::default()
    }
}

/// A reader's CommandSubscribe (`durable = false`, Exclusive) with
/// `start_message_id = 9` and `start_message_rollback_duration_sec = 16`
/// appended to the struct's bytes, as a client encodes them.
fn reader_subscribe(
    cid: u64,
    sub: &str,
    start: Option<MessageIdData>,
    rollback: Option<u64>,
) -> Vec<u8> {
    let mut s = CommandSubscribe {
        topic: "t".into(),
        subscription: sub.into(),
        sub_type: sub_type::EXCLUSIVE,
        consumer_id: cid,
        request_id: 300 + cid,
        consumer_name: Some("r".into()),
        priority_level: None,
        durable: Some(false),
        initial_position: None,
        key_shared_meta: None,
        consumer_epoch: None,
    }
    .encode_to_vec();
    if let Some(m) = start {
        prost::encoding::message::encode(9, &m, &mut s);
    }
    if let Some(r) = rollback {
        prost::encoding::uint64::encode(16, &r, &mut s);
    }
    let mut base = Vec::new();
    prost::encoding::int32::encode(1, &ty::SUBSCRIBE, &mut base);
    prost::encoding::bytes::encode(4, &s, &mut base);
    base
}

fn earliest() -> MessageIdData {
    MessageIdData {
        ledger_id: u64::MAX,
        entry_id: u64::MAX,
        ..mid(Position::new(0, 0), vec![])
    }
}

#[test]
fn a_backward_seek_redelivers_acknowledged_entries_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let ps: Vec<Position>;
    {
        let mut b = core(&dir);
        connect(&mut b, 1);
        producer(&mut b, 1, 1);
        ps = (0..6)
            .map(|i| send(&mut b, 1, 1, i, &entry(None, None, None)))
            .collect();
        subscribe(&mut b, 1, 7, "s", sub_type::SHARED, "c");
        assert_eq!(positions(&flow(&mut b, 1, 7, 100)), ps);
        // 0..=1 cumulatively, 4 individually: a range past the new position.
        ack(&mut b, 1, 7, true, vec![mid(ps[1], vec![])], None);
        ack(&mut b, 1, 7, false, vec![mid(ps[4], vec![])], None);
        assert_eq!(sub(&b, "s").deletion().individually_deleted_count(), 1);
        let epoch = sub(&b, "s").deletion().reset_epoch();
        seek_and_resubscribe(&mut b, 50, Some(mid(ps[1], vec![])), None);
        let s = sub(&b, "s");
        assert_eq!(s.mark_delete(), ps[0]);
        assert_eq!(s.deletion().individually_deleted_count(), 0);
        assert!(
            s.deletion().reset_epoch() > epoch,
            "the reset epoch path ran"
        );
        assert_eq!(s.counters.resets, 1);
        assert_eq!(positions(&flow(&mut b, 1, 7, 100)), ps[1..].to_vec());
    }
    // kill: the reset mark-delete and its cleared ranges were persisted.
    let mut b = core(&dir);
    connect(&mut b, 1);
    subscribe(&mut b, 1, 7, "s", sub_type::SHARED, "c");
    assert_eq!(sub(&b, "s").mark_delete(), ps[0]);
    assert_eq!(positions(&flow(&mut b, 1, 7, 100)), ps[1..].to_vec());
}

#[test]
fn a_forward_seek_acknowledges_what_it_skips_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let ps: Vec<Position>;
    {
        let mut b = core(&dir);
        connect(&mut b, 1);
        producer(&mut b, 1, 1);
        ps = (0..6)
            .map(|i| send(&mut b, 1, 1, i, &entry(None, None, None)))
            .collect();
        subscribe(&mut b, 1, 7, "s", sub_type::SHARED, "c");
        assert_eq!(flow(&mut b, 1, 7, 2).len(), 2);
        seek_and_resubscribe(&mut b, 51, Some(mid(ps[4], vec![])), None);
        assert_eq!(sub(&b, "s").mark_delete(), ps[3]);
        assert_eq!(sub(&b, "s").replay_len(), 0, "the replay set is cleared");
        assert_eq!(positions(&flow(&mut b, 1, 7, 100)), ps[4..].to_vec());
    }
    let mut b = core(&dir);
    connect(&mut b, 1);
    subscribe(&mut b, 1, 7, "s", sub_type::SHARED, "c");
    assert_eq!(positions(&flow(&mut b, 1, 7, 100)), ps[4..].to_vec());
    // Seek to latest (i64::MAX) and to earliest (ledger id -1 unsigned).
    let latest = MessageIdData {
        ledger_id: i64::MAX as u64,
        entry_id: i64::MAX as u64,
        ..mid(ps[0], vec![])
    };
    seek_and_resubscribe(&mut b, 52, Some(latest), None);
    assert_eq!(sub(&b, "s").mark_delete(), ps[5]);
    assert!(flow(&mut b, 1, 7, 100).is_empty());
    seek_and_resubscribe(&mut b, 53, Some(earliest()), None);
    assert_eq!(positions(&flow(&mut b, 1, 7, 100)), ps);
}

#[test]
fn a_seek_inside_a_batch_keeps_the_indexes_before_it_acknowledged() {
    let (_d, mut b) = with_producer();
    let ps: Vec<Position> = (0..3)
        .map(|i| send(&mut b, 1, 1, i, &entry(None, Some(4), None)))
        .collect();
    subscribe(&mut b, 1, 7, "s", sub_type::SHARED, "c");
    assert_eq!(flow(&mut b, 1, 7, 100).len(), 3);
    ack(&mut b, 1, 7, true, vec![mid(ps[2], vec![])], None);
    // Seek to batch index 2 of entry 1: the client's ack_set has bits 2, 3.
    seek_and_resubscribe(&mut b, 54, Some(mid(ps[1], vec![0b1100])), None);
    assert_eq!(sub(&b, "s").mark_delete(), ps[0]);
    assert_eq!(
        sub(&b, "s").deletion().batch_ack_set(ps[1]),
        Some(vec![0b1100])
    );
    let out = flow(&mut b, 1, 7, 100);
    assert_eq!(
        out.into_iter().map(|(c, f, _)| (c, f)).collect::<Vec<_>>(),
        vec![
            (1, message(7, ps[1], 0, vec![0b1100], 2)),
            (1, message(7, ps[2], 0, vec![], 4)),
        ]
    );
}

#[test]
fn a_publish_time_seek_starts_at_the_first_entry_published_at_or_after_it() {
    let (_d, mut b) = with_producer();
    let ps: Vec<Position> = (0..5u64)
        .map(|i| send(&mut b, 1, 1, i, &entry_at(1_000 + 10 * i)))
        .collect();
    subscribe(&mut b, 1, 7, "s", sub_type::SHARED, "c");
    assert_eq!(flow(&mut b, 1, 7, 100).len(), 5);
    ack(&mut b, 1, 7, true, vec![mid(ps[4], vec![])], None);
    // Backward, to a time between entries 1 (1010) and 2 (1020).
    seek_and_resubscribe(&mut b, 55, None, Some(1_015));
    assert_eq!(positions(&flow(&mut b, 1, 7, 100)), ps[2..].to_vec());
    // Exactly a publish time: that entry is included.
    seek_and_resubscribe(&mut b, 56, None, Some(1_010));
    assert_eq!(positions(&flow(&mut b, 1, 7, 100)), ps[1..].to_vec());
    // Before every entry: from the first; after all: nothing.
    seek_and_resubscribe(&mut b, 57, None, Some(1));
    assert_eq!(positions(&flow(&mut b, 1, 7, 100)), ps);
    seek_and_resubscribe(&mut b, 58, None, Some(5_000));
    assert!(flow(&mut b, 1, 7, 100).is_empty());
    assert_eq!(sub(&b, "s").mark_delete(), ps[4]);
}

#[test]
fn a_seek_without_a_target_or_for_an_unknown_consumer_is_a_metadata_error() {
    let (_d, mut b) = with_producer();
    send(&mut b, 1, 1, 0, &entry(None, None, None));
    subscribe(&mut b, 1, 7, "s", sub_type::SHARED, "c");
    let out = feed(&mut b, 1, seek_cmd(7, 60, None, None));
    let msg = "Message id and message publish time were not present";
    assert_eq!(
        out,
        vec![(1, error(60, server_error::METADATA_ERROR, msg), 0)]
    );
    let out = feed(&mut b, 1, seek_cmd(8, 61, None, Some(1)));
    assert_eq!(
        out,
        vec![(
            1,
            error(61, server_error::METADATA_ERROR, "Consumer not found"),
            0
        )]
    );
    // The consumer is still attached.
    assert_eq!(sub(&b, "s").consumers.len(), 1);
}

#[test]
fn unsubscribe_deletes_the_cursor_durably_and_is_refused_while_others_are_attached() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut b = core(&dir);
        connect(&mut b, 1);
        producer(&mut b, 1, 1);
        for i in 0..3 {
            send(&mut b, 1, 1, i, &entry(None, None, None));
        }
        subscribe(&mut b, 1, 7, "s", sub_type::SHARED, "c");
        subscribe(&mut b, 1, 8, "s", sub_type::SHARED, "d");
        let out = feed(&mut b, 1, unsubscribe_cmd(7, 70));
        let msg = "Unconnected or shared consumer attempting to unsubscribe";
        assert_eq!(
            out,
            vec![(1, error(70, server_error::METADATA_ERROR, msg), 0)]
        );
        assert_eq!(sub(&b, "s").consumers.len(), 2);
        // Consumer 8 closes; 7 is alone now.
        let out = feed(
            &mut b,
            1,
            BrokerCommand {
                r#type: ty::CLOSE_CONSUMER,
                close_consumer: Some(command::CommandIdRequest {
                    id: 8,
                    request_id: 71,
                }),
                ..Default::default()
            },
        );
        assert_eq!(out, vec![(1, success(71), 0)]);
        let out = feed(&mut b, 1, unsubscribe_cmd(7, 72));
        assert_eq!(out, vec![(1, success(72), 0)]);
        assert!(!b.topics()[TOPIC].subscriptions.contains_key("s"));
        assert_eq!(b.store().load_cursor(TOPIC, "s").unwrap(), None);
        // The consumer is gone: a second unsubscribe does not find it.
        let out = feed(&mut b, 1, unsubscribe_cmd(7, 73));
        assert_eq!(
            out,
            vec![(
                1,
                error(73, server_error::METADATA_ERROR, "Consumer not found"),
                0
            )]
        );
    }
    // After a restart the subscription is new: Latest starts at the end.
    let b = core(&dir);
    assert!(!b
        .store()
        .list_cursors(TOPIC)
        .unwrap()
        .contains(&"s".to_string()));
}

#[test]
fn a_forced_unsubscribe_disconnects_the_other_consumers() {
    let (_d, mut b) = with_producer();
    send(&mut b, 1, 1, 0, &entry(None, None, None));
    subscribe(&mut b, 1, 7, "s", sub_type::SHARED, "c");
    connect(&mut b, 2);
    subscribe(&mut b, 2, 8, "s", sub_type::SHARED, "d");
    let mut raw = enc(&unsubscribe_cmd(7, 74));
    // force = 3 inside CommandUnsubscribe (field 12): rebuild with it.
    let mut inner = command::CommandIdRequest {
        id: 7,
        request_id: 74,
    }
    .encode_to_vec();
    prost::encoding::bool::encode(3, &true, &mut inner);
    raw.clear();
    prost::encoding::int32::encode(1, &ty::UNSUBSCRIBE, &mut raw);
    prost::encoding::bytes::encode(12, &inner, &mut raw);
    b.handle_frame(1, &raw, &[], T0).unwrap();
    let out = frames(&mut b);
    assert_eq!(out, vec![(2, close_consumer(8), 0), (1, success(74), 0)]);
    assert!(!b.topics()[TOPIC].subscriptions.contains_key("s"));
}

#[test]
fn an_unsubscribed_subscription_no_longer_pins_ledgers() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = BrokerConfig::new("pulsar://node:6650");
    config.ledger.max_entries_per_ledger = 3;
    config.retention_check_interval_ms = 1_000;
    config.deduplication = false;
    let mut b = Broker::new(open_store(&dir), config, T0);
    connect(&mut b, 1);
    producer(&mut b, 1, 1);
    subscribe(&mut b, 1, 7, "s", sub_type::SHARED, "c");
    for i in 0..10 {
        send(&mut b, 1, 1, i, &entry(None, None, None));
    }
    b.handle_timeout(T0);
    assert_eq!(
        b.ledgers_deleted_total(),
        0,
        "the subscription's backlog is kept"
    );
    let out = feed(&mut b, 1, unsubscribe_cmd(7, 75));
    assert_eq!(out, vec![(1, success(75), 0)]);
    b.handle_timeout(T0 + 1_000);
    assert_eq!(
        b.ledgers_deleted_total(),
        3,
        "every closed ledger is consumed"
    );
}

#[test]
fn a_reader_is_never_persisted_and_goes_with_its_consumer() {
    let (_d, mut b) = with_producer();
    let ps: Vec<Position> = (0..4)
        .map(|i| send(&mut b, 1, 1, i, &entry(None, None, None)))
        .collect();
    // From earliest.
    b.handle_frame(
        1,
        &reader_subscribe(7, "r1", Some(earliest()), None),
        &[],
        T0,
    )
    .unwrap();
    assert_eq!(frames(&mut b), vec![(1, success(307), 0)]);
    assert!(!sub(&b, "r1").is_durable());
    assert_eq!(positions(&flow(&mut b, 1, 7, 100)), ps);
    ack(&mut b, 1, 7, true, vec![mid(ps[3], vec![])], None);
    assert_eq!(sub(&b, "r1").mark_delete(), ps[3]);
    // From a message id: at that entry (the client drops what it excludes).
    b.handle_frame(
        1,
        &reader_subscribe(8, "r2", Some(mid(ps[2], vec![])), None),
        &[],
        T0,
    )
    .unwrap();
    assert_eq!(frames(&mut b), vec![(1, success(308), 0)]);
    assert_eq!(positions(&flow(&mut b, 1, 8, 100)), ps[2..].to_vec());
    // Nothing of either is in the store.
    let cursors = b.store().list_cursors(TOPIC).unwrap();
    assert!(
        !cursors.iter().any(|c| c == "r1" || c == "r2"),
        "{cursors:?}"
    );
    // Closing the consumer removes the subscription.
    let out = feed(
        &mut b,
        1,
        BrokerCommand {
            r#type: ty::CLOSE_CONSUMER,
            close_consumer: Some(command::CommandIdRequest {
                id: 7,
                request_id: 76,
            }),
            ..Default::default()
        },
    );
    assert_eq!(out, vec![(1, success(76), 0)]);
    assert!(!b.topics()[TOPIC].subscriptions.contains_key("r1"));
    // A reader seeks too (in memory): its subscription stays for the
    // consumer's reconnect (a reset is no close), which reads from there.
    let out = feed(&mut b, 1, seek_cmd(8, 77, Some(earliest()), None));
    assert_eq!(out, vec![(1, close_consumer(8), 0), (1, success(77), 0)]);
    assert!(b.topics()[TOPIC].subscriptions.contains_key("r2"));
    b.handle_frame(
        1,
        &reader_subscribe(8, "r2", Some(earliest()), None),
        &[],
        T0,
    )
    .unwrap();
    assert_eq!(frames(&mut b), vec![(1, success(308), 0)]);
    assert_eq!(positions(&flow(&mut b, 1, 8, 100)), ps);
    assert!(!b
        .store()
        .list_cursors(TOPIC)
        .unwrap()
        .iter()
        .any(|c| c == "r2"));
    // A reader by rollback duration.
    b.handle_frame(1, &reader_subscribe(9, "r3", None, Some(3600)), &[], T0)
        .unwrap();
    assert_eq!(frames(&mut b), vec![(1, success(309), 0)]);
    // entry() is published at time 2: long before T0 - 1 h, so nothing.
    assert!(flow(&mut b, 1, 9, 100).is_empty());
}

#[test]
fn a_name_is_durable_or_non_durable_never_both() {
    let (_d, mut b) = with_producer();
    send(&mut b, 1, 1, 0, &entry(None, None, None));
    subscribe(&mut b, 1, 7, "s", sub_type::EXCLUSIVE, "c");
    b.handle_frame(
        1,
        &reader_subscribe(8, "s", Some(earliest()), None),
        &[],
        T0,
    )
    .unwrap();
    let out = frames(&mut b);
    assert_eq!(out.len(), 1);
    let e = out[0].1.error.as_ref().unwrap();
    assert_eq!(
        (e.request_id, e.error),
        (308, server_error::NOT_ALLOWED_ERROR)
    );
}

/// GET_LAST_MESSAGE_ID as Pulsar answers it: the last entry with its
/// largest batch index always set (a reader's `hasMessageAvailable`
/// compares it with the last message it received), the mark-delete as
/// ledger_id and entry_id only.
#[test]
fn get_last_message_id_answers_a_reader_with_the_largest_batch_index() {
    let (_d, mut b) = with_producer();
    let p0 = send(&mut b, 1, 1, 0, &entry(None, None, None));
    b.handle_frame(
        1,
        &reader_subscribe(7, "r", Some(earliest()), None),
        &[],
        T0,
    )
    .unwrap();
    frames(&mut b);
    let get = |b: &mut Broker, request_id| {
        let out = feed(
            b,
            1,
            BrokerCommand {
                r#type: ty::GET_LAST_MESSAGE_ID,
                get_last_message_id: Some(command::CommandIdRequest { id: 7, request_id }),
                ..Default::default()
            },
        );
        out[0].1.get_last_message_id_response.clone().unwrap()
    };
    let r = get(&mut b, 78);
    let want_last = |p: Position, batch_index| MessageIdData {
        ledger_id: p.ledger_id as u64,
        entry_id: p.entry_id as u64,
        partition: Some(-1),
        batch_index: Some(batch_index),
        ..Default::default()
    };
    assert_eq!(r.last_message_id, want_last(p0, -1), "not a batch: -1");
    let md = MessageIdData {
        ledger_id: p0.ledger_id as u64,
        entry_id: u64::MAX,
        ..Default::default()
    };
    assert_eq!(r.consumer_mark_delete_position, Some(md));
    let p1 = send(&mut b, 1, 1, 1, &entry(None, Some(5), None));
    let r = get(&mut b, 79);
    assert_eq!(r.last_message_id, want_last(p1, 4), "a batch of 5: index 4");
    // An unknown consumer.
    let out = feed(
        &mut b,
        1,
        BrokerCommand {
            r#type: ty::GET_LAST_MESSAGE_ID,
            get_last_message_id: Some(command::CommandIdRequest {
                id: 9,
                request_id: 80,
            }),
            ..Default::default()
        },
    );
    assert_eq!(out[0].1.error.as_ref().unwrap().request_id, 80);
}
