//! Producers through the core: access modes and names (Pulsar's
//! `AbstractTopic.addProducer`), deduplication across a reconnect and a
//! restart (`MessageDeduplication`), chunked messages stored per chunk, and
//! the SEND_ERROR a client fails one message on.

use super::*;

/// PRODUCER with a name, an access mode and a topic epoch; every frame out.
fn producer_cmd(
    b: &mut Broker,
    conn: u64,
    pid: u64,
    name: Option<&str>,
    mode: i32,
    epoch: Option<u64>,
) -> Vec<(u64, BrokerCommand, usize)> {
    feed(
        b,
        conn,
        BrokerCommand {
            r#type: ty::PRODUCER,
            producer: Some(command::CommandProducer {
                topic: "t".into(),
                producer_id: pid,
                request_id: 100 + pid,
                producer_name: name.map(String::from),
                producer_access_mode: Some(mode),
                topic_epoch: epoch,
            }),
            ..Default::default()
        },
    )
}

fn ok(out: &[(u64, BrokerCommand, usize)]) -> command::CommandProducerSuccess {
    assert_eq!(out.len(), 1, "{out:?}");
    out[0].1.producer_success.clone().expect("PRODUCER_SUCCESS")
}

fn err(out: &[(u64, BrokerCommand, usize)]) -> i32 {
    assert_eq!(out.len(), 1, "{out:?}");
    out[0].1.error.clone().expect("ERROR").error
}

/// An entry of producer `name` with `sequence_id` and extra metadata fields.
fn entry_of(name: &str, seq: u64, extra: impl Fn(&mut Vec<u8>)) -> Vec<u8> {
    let mut md = MessageMetadata {
        producer_name: name.into(),
        sequence_id: seq,
        publish_time: 2,
        ..MessageMetadata::default()
    }
    .encode_to_vec();
    extra(&mut md);
    let mut body = Vec::new();
    body.extend_from_slice(&(md.len() as u32).to_be_bytes());
    body.extend_from_slice(&md);
    body.extend_from_slice(b"m");
    let mut out = vec![0x0e, 0x01];
    out.extend_from_slice(&crc32c(&body).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

fn chunk_fields(uuid: &str, id: i32, n: i32) -> impl Fn(&mut Vec<u8>) + '_ {
    move |md: &mut Vec<u8>| {
        prost::encoding::string::encode(26, &uuid.to_string(), md);
        prost::encoding::int32::encode(27, &n, md);
        prost::encoding::int32::encode(28, &(n * 10), md);
        prost::encoding::int32::encode(29, &id, md);
    }
}

fn send_cmd(pid: u64, seq: u64, is_chunk: bool) -> BrokerCommand {
    BrokerCommand {
        r#type: ty::SEND,
        send: Some(command::CommandSend {
            producer_id: pid,
            sequence_id: seq,
            is_chunk: is_chunk.then_some(true),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// SEND and its one answer (receipt or error).
fn send_one(
    b: &mut Broker,
    conn: u64,
    pid: u64,
    seq: u64,
    chunk: bool,
    payload: &[u8],
) -> BrokerCommand {
    b.handle_frame(conn, &enc(&send_cmd(pid, seq, chunk)), payload, T0)
        .unwrap();
    let out = frames(b);
    out.into_iter()
        .find(|(c, f, _)| *c == conn && matches!(f.r#type, ty::SEND_RECEIPT | ty::SEND_ERROR))
        .expect("an answer to SEND")
        .1
}

fn entries(b: &Broker) -> i64 {
    b.topics()[TOPIC].ml.entries_after(Position::new(-1, -1))
}

#[test]
fn a_second_exclusive_producer_is_fenced_and_names_are_unique() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = core(&dir);
    connect(&mut b, 1);
    connect(&mut b, 2);
    let first = ok(&producer_cmd(&mut b, 1, 1, Some("a"), 1, None));
    assert_eq!(
        (first.topic_epoch, first.producer_ready),
        (Some(0), Some(true))
    );
    assert_eq!(
        err(&producer_cmd(&mut b, 2, 1, Some("b"), 1, None)),
        server_error::PRODUCER_FENCED
    );
    assert_eq!(
        err(&producer_cmd(&mut b, 2, 2, Some("c"), 0, None)),
        server_error::PRODUCER_BUSY
    );
    // The exclusive producer leaves with its connection: the topic is free.
    b.handle_close(1, T0);
    let s = ok(&producer_cmd(&mut b, 2, 3, Some("s1"), 0, None));
    assert_eq!(s.topic_epoch, Some(0));
    // Two producers may not share a name, on another connection or this one.
    connect(&mut b, 3);
    assert_eq!(
        err(&producer_cmd(&mut b, 3, 1, Some("s1"), 0, None)),
        server_error::PRODUCER_BUSY
    );
    assert_eq!(
        err(&producer_cmd(&mut b, 2, 4, Some("s1"), 0, None)),
        server_error::PRODUCER_BUSY
    );
    // Freed by CLOSE_PRODUCER, the name is available again.
    let out = feed(
        &mut b,
        2,
        BrokerCommand {
            r#type: ty::CLOSE_PRODUCER,
            close_producer: Some(command::CommandIdRequest {
                id: 3,
                request_id: 9,
            }),
            ..Default::default()
        },
    );
    assert_eq!(out, vec![(2, success(9), 0)]);
    ok(&producer_cmd(&mut b, 3, 1, Some("s1"), 0, None));
}

#[test]
fn wait_for_exclusive_is_answered_not_ready_then_ready_when_the_topic_frees() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = core(&dir);
    connect(&mut b, 1);
    connect(&mut b, 2);
    ok(&producer_cmd(&mut b, 1, 1, Some("a"), 1, None));
    let q = ok(&producer_cmd(&mut b, 2, 1, Some("w"), 2, None));
    assert_eq!((q.producer_ready, q.topic_epoch), (Some(false), None));
    // A queued producer cannot publish yet (Pulsar: not ready).
    let e = send_one(&mut b, 2, 1, 0, false, &entry_of("w", 0, |_| {}));
    assert_eq!(e.send_error.unwrap().error, server_error::SERVICE_NOT_READY);
    b.handle_close(1, T0);
    let out = frames(&mut b);
    let r = ok(&out);
    assert_eq!(out[0].0, 2);
    assert_eq!(
        (r.request_id, r.producer_ready, r.topic_epoch),
        (101, Some(true), Some(1))
    );
    let e = send_one(&mut b, 2, 1, 0, false, &entry_of("w", 0, |_| {}));
    assert!(e.send_receipt.is_some(), "{e:?}");
}

#[test]
fn exclusive_with_fencing_closes_the_holder_and_the_epoch_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut b = core(&dir);
        connect(&mut b, 1);
        connect(&mut b, 2);
        ok(&producer_cmd(&mut b, 1, 1, Some("a"), 1, None));
        let out = producer_cmd(&mut b, 2, 1, Some("f"), 3, None);
        assert_eq!(out.len(), 2, "{out:?}");
        assert_eq!(
            out[0].1.producer_success.clone().unwrap().topic_epoch,
            Some(1)
        );
        assert_eq!(
            (out[1].0, out[1].1.close_producer.clone().unwrap().id),
            (1, 1)
        );
        // The fenced producer is gone from its connection.
        let e = send_one(&mut b, 1, 1, 0, false, &entry_of("a", 0, |_| {}));
        assert!(e.send_error.is_some());
    }
    let mut b = core(&dir);
    connect(&mut b, 1);
    // Reconnecting with the epoch it held (0), the fenced producer stays fenced.
    assert_eq!(
        err(&producer_cmd(&mut b, 1, 1, Some("a"), 1, Some(0))),
        server_error::PRODUCER_FENCED
    );
    let s = ok(&producer_cmd(&mut b, 1, 2, Some("f"), 1, Some(1)));
    assert_eq!(s.topic_epoch, Some(1));
}

/// A producer's send retried after its connection was lost, and again
/// after a restart: stored once, answered with a receipt each time.
fn retried_send(dedup: bool) -> (i64, Vec<MessageIdData>) {
    let dir = tempfile::tempdir().unwrap();
    let config = || {
        let mut c = BrokerConfig::new("pulsar://node:6650");
        c.deduplication = dedup;
        c
    };
    let mut receipts = Vec::new();
    {
        let mut b = Broker::new(open_store(&dir), config(), T0);
        connect(&mut b, 1);
        assert_eq!(
            ok(&producer_cmd(&mut b, 1, 1, Some("p"), 0, None)).last_sequence_id,
            Some(-1)
        );
        for seq in 0..3 {
            let r = send_one(&mut b, 1, 1, seq, false, &entry_of("p", seq, |_| {}));
            receipts.push(r.send_receipt.unwrap().message_id.unwrap());
        }
        // The receipt of 2 was lost with the connection: the client resends 2.
        b.handle_close(1, T0);
        connect(&mut b, 2);
        let s = ok(&producer_cmd(&mut b, 2, 1, Some("p"), 0, None));
        assert_eq!(s.last_sequence_id, Some(if dedup { 2 } else { -1 }));
        let r = send_one(&mut b, 2, 1, 2, false, &entry_of("p", 2, |_| {}));
        receipts.push(r.send_receipt.unwrap().message_id.unwrap());
    }
    // Restart (no snapshot yet: the replay of the ledger rebuilds the map).
    let mut b = Broker::new(open_store(&dir), config(), T0 + 1);
    connect(&mut b, 1);
    ok(&producer_cmd(&mut b, 1, 1, Some("p"), 0, None));
    let r = send_one(&mut b, 1, 1, 1, false, &entry_of("p", 1, |_| {}));
    receipts.push(r.send_receipt.unwrap().message_id.unwrap());
    (entries(&b), receipts)
}

#[test]
fn a_retried_send_is_stored_once_across_a_reconnect_and_a_restart() {
    let (stored, receipts) = retried_send(true);
    assert_eq!(stored, 3);
    // Pulsar answers a duplicate with message id (-1, -1).
    for r in &receipts[3..] {
        assert_eq!((r.ledger_id, r.entry_id), (u64::MAX, u64::MAX));
    }
    // Negative control: without deduplication each retry is stored again.
    let (stored, _) = retried_send(false);
    assert_eq!(stored, 5);
}

#[test]
fn the_snapshot_bounds_the_replay_and_keeps_the_map() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut b = core(&dir);
        connect(&mut b, 1);
        ok(&producer_cmd(&mut b, 1, 1, Some("p"), 0, None));
        ok(&producer_cmd(&mut b, 1, 2, Some("q"), 0, None));
        send_one(&mut b, 1, 1, 7, false, &entry_of("p", 7, |_| {}));
        send_one(&mut b, 1, 2, 3, false, &entry_of("q", 3, |_| {}));
        b.topics.get_mut(TOPIC).unwrap().dedup.snapshot().unwrap();
        send_one(&mut b, 1, 2, 4, false, &entry_of("q", 4, |_| {}));
    }
    let store = open_store(&dir);
    let props = store
        .cursor_properties(TOPIC, super::super::dedup::CURSOR)
        .unwrap();
    assert_eq!(props.get("seq/p"), Some(&7));
    assert_eq!(props.get("seq/q"), Some(&3));
    let mut b = Broker::new(store, BrokerConfig::new("pulsar://node:6650"), T0);
    connect(&mut b, 1);
    // From the snapshot (p) and the replay after it (q: 4).
    assert_eq!(
        ok(&producer_cmd(&mut b, 1, 1, Some("p"), 0, None)).last_sequence_id,
        Some(7)
    );
    assert_eq!(
        ok(&producer_cmd(&mut b, 1, 2, Some("q"), 0, None)).last_sequence_id,
        Some(4)
    );
}

#[test]
fn chunks_are_stored_one_entry_each_and_judged_by_the_last() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = core(&dir);
    connect(&mut b, 1);
    ok(&producer_cmd(&mut b, 1, 1, Some("p"), 0, None));
    subscribe(&mut b, 1, 5, "s", sub_type::EXCLUSIVE, "c");
    for id in 0..3 {
        let r = send_one(
            &mut b,
            1,
            1,
            0,
            true,
            &entry_of("p", 0, chunk_fields("u", id, 3)),
        );
        assert!(r.send_receipt.is_some(), "chunk {id}: {r:?}");
    }
    assert_eq!(entries(&b), 3);
    // Dispatched as three messages (the consumer reassembles).
    let out = flow(&mut b, 1, 5, 10);
    assert_eq!(
        out.iter()
            .filter(|(_, f, _)| f.r#type == ty::MESSAGE)
            .count(),
        3
    );
    // A resent middle chunk is stored again (the consumer drops it by
    // chunk id), a resent last chunk is a duplicate.
    send_one(
        &mut b,
        1,
        1,
        0,
        true,
        &entry_of("p", 0, chunk_fields("u", 1, 3)),
    );
    let r = send_one(
        &mut b,
        1,
        1,
        0,
        true,
        &entry_of("p", 0, chunk_fields("u", 2, 3)),
    );
    assert_eq!(
        r.send_receipt.unwrap().message_id.unwrap().ledger_id,
        u64::MAX
    );
    assert_eq!(entries(&b), 4);
}

#[test]
fn a_refusal_no_retry_cures_gets_the_code_the_client_fails_the_message_on() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = core(&dir);
    connect(&mut b, 1);
    ok(&producer_cmd(&mut b, 1, 1, Some("p"), 0, None));
    // is_chunk without chunk fields; a chunk id out of range.
    let bad = [
        entry_of("p", 0, |_| {}),
        entry_of("p", 0, chunk_fields("u", 3, 3)),
    ];
    for payload in &bad {
        let e = send_one(&mut b, 1, 1, 0, true, payload).send_error.unwrap();
        assert_eq!(e.error, server_error::CHECKSUM_ERROR, "{e:?}");
    }
    assert_eq!(entries(&b), 0);
    // A Java client fails a message on NotAllowedError instead.
    b.handle_open(2, T0);
    b.handle_frame(
        2,
        &enc(&BrokerCommand {
            r#type: ty::CONNECT,
            connect: Some(command::CommandConnect {
                client_version: "Pulsar-Java-v3.3.0".into(),
                protocol_version: Some(21),
            }),
            ..Default::default()
        }),
        &[],
        T0,
    )
    .unwrap();
    frames(&mut b);
    ok(&producer_cmd(&mut b, 2, 1, Some("j"), 0, None));
    let e = send_one(&mut b, 2, 1, 0, true, &bad[0]).send_error.unwrap();
    assert_eq!(e.error, server_error::NOT_ALLOWED_ERROR);
}

#[test]
fn an_unknown_access_mode_and_the_dedup_cursor_name_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = core(&dir);
    connect(&mut b, 1);
    assert_eq!(
        err(&producer_cmd(&mut b, 1, 1, Some("p"), 9, None)),
        server_error::NOT_ALLOWED_ERROR
    );
    let out = feed(
        &mut b,
        1,
        subscribe_cmd(1, super::super::dedup::CURSOR, sub_type::EXCLUSIVE, "c", 0),
    );
    assert_eq!(
        out[0].1.error.clone().unwrap().error,
        server_error::NOT_ALLOWED_ERROR
    );
}

#[test]
fn a_snapshot_is_taken_once_its_time_interval_passed() {
    use super::super::dedup::{CURSOR, SNAPSHOT_INTERVAL_MS};
    let dir = tempfile::tempdir().unwrap();
    let mut b = core(&dir);
    connect(&mut b, 1);
    ok(&producer_cmd(&mut b, 1, 1, Some("p"), 0, None));
    send_one(&mut b, 1, 1, 1, false, &entry_of("p", 1, |_| {}));
    assert_eq!(
        b.store()
            .cursor_properties(TOPIC, CURSOR)
            .unwrap()
            .get("seq/p"),
        None
    );
    let later = T0 + SNAPSHOT_INTERVAL_MS;
    b.handle_frame(
        1,
        &enc(&send_cmd(1, 2, false)),
        &entry_of("p", 2, |_| {}),
        later,
    )
    .unwrap();
    frames(&mut b);
    assert_eq!(
        b.store()
            .cursor_properties(TOPIC, CURSOR)
            .unwrap()
            .get("seq/p"),
        Some(&2)
    );
    // The cursor's mark-delete follows: the snapshotted entries are not held back.
    let md = b.topics()[TOPIC].dedup.mark_delete();
    assert_eq!(md, b.topics()[TOPIC].ml.last_confirmed_entry());
}

#[test]
fn a_queued_producer_with_a_stale_epoch_is_refused_on_its_turn_and_the_next_one_promoted() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = core(&dir);
    for c in 1..=3 {
        connect(&mut b, c);
    }
    assert_eq!(
        ok(&producer_cmd(&mut b, 1, 1, Some("a"), 1, Some(5))).topic_epoch,
        Some(5)
    );
    let q = ok(&producer_cmd(&mut b, 2, 1, Some("old"), 2, Some(2)));
    assert_eq!(q.producer_ready, Some(false));
    let q = ok(&producer_cmd(&mut b, 3, 1, Some("new"), 2, None));
    assert_eq!(q.producer_ready, Some(false));
    b.handle_close(1, T0);
    let out = frames(&mut b);
    assert_eq!(out.len(), 2, "{out:?}");
    assert_eq!(
        (out[0].0, out[0].1.error.clone().unwrap().error),
        (2, server_error::PRODUCER_FENCED)
    );
    let r = out[1].1.producer_success.clone().unwrap();
    assert_eq!(
        (out[1].0, r.producer_ready, r.topic_epoch),
        (3, Some(true), Some(6))
    );
}
