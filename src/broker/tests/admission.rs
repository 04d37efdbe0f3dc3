//! Pending-ack admission and failed writes in the dispatch path.

use std::sync::atomic::{AtomicU64, Ordering};

use super::*;
use crate::broker::AdmissionHook;
use crate::permits::broker::ConsumerKey;

/// A core whose admission refuses the first `n` entries offered.
fn core_rejecting_first(dir: &tempfile::TempDir, n: u64) -> Broker {
    let calls = Arc::new(AtomicU64::new(0));
    let mut config = BrokerConfig::new("pulsar://node:6650");
    config.admission = Some(AdmissionHook::new(move |_, _| {
        calls.fetch_add(1, Ordering::Relaxed) >= n
    }));
    Broker::new(open_store(dir), config, T0)
}

fn positions_to(out: &[(u64, BrokerCommand, usize)], conn: u64) -> Vec<Position> {
    out.iter()
        .filter(|(c, f, _)| *c == conn && f.r#type == ty::MESSAGE)
        .map(|(_, f, _)| {
            let m = &f.message.as_ref().unwrap().message_id;
            Position::new(m.ledger_id as i64, m.entry_id as i64)
        })
        .collect()
}

#[test]
fn an_entry_refused_by_admission_is_replayed_before_later_entries_on_failover() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = core_rejecting_first(&dir, 1);
    connect(&mut b, 1);
    producer(&mut b, 1, 1);
    let ps: Vec<Position> = (0..3)
        .map(|i| send(&mut b, 1, 1, i, &entry(None, None, None)))
        .collect();
    feed(&mut b, 1, subscribe_cmd(7, "f", sub_type::FAILOVER, "a", 0));
    // The first entry is refused: neither sent nor debited; the later ones
    // wait behind it in the replay set, which the next round reads first.
    let out = flow(&mut b, 1, 7, 10);
    assert_eq!(positions_to(&out, 1), ps);
    let s = sub(&b, "f");
    assert_eq!(s.admission_rejections, 1);
    assert_eq!(s.consumers[0].debited, 3);
    assert_eq!(s.available(s.consumers[0].key), 7);
}

#[test]
fn a_refused_key_holds_back_later_entries_of_its_key_on_key_shared() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = core_rejecting_first(&dir, 1);
    connect(&mut b, 1);
    producer(&mut b, 1, 1);
    let ps: Vec<Position> = (0..3)
        .map(|i| send(&mut b, 1, 1, i, &entry(Some("k"), None, None)))
        .collect();
    feed(
        &mut b,
        1,
        subscribe_cmd(7, "k", sub_type::KEY_SHARED, "a", 0),
    );
    let out = flow(&mut b, 1, 7, 10);
    assert_eq!(positions_to(&out, 1), ps);
}

#[test]
fn a_failed_message_write_removes_the_consumer_and_its_entries_go_to_another() {
    let (_d, mut b) = with_producer();
    let p0 = send(&mut b, 1, 1, 0, &entry(None, None, None));
    connect(&mut b, 2);
    connect(&mut b, 3);
    subscribe(&mut b, 2, 7, "s", sub_type::SHARED, "a");
    let out = flow(&mut b, 2, 7, 1);
    assert_eq!(positions_to(&out, 2), vec![p0]);
    subscribe(&mut b, 3, 8, "s", sub_type::SHARED, "b");
    assert!(flow(&mut b, 3, 8, 5).is_empty());
    // The MESSAGE (and the frames before it) on connection 2 failed: the
    // incarnation that was debited for it is removed (its P is never
    // credited to anyone), its client is told CLOSE_CONSUMER, and the entry
    // goes to consumer 8.
    let queued: usize = 2048;
    b.handle_write_failed(2, queued, T0);
    let out = frames(&mut b);
    assert!(
        out.iter()
            .any(|(c, f, _)| *c == 2 && f.r#type == ty::CLOSE_CONSUMER),
        "{out:?}"
    );
    assert_eq!(positions_to(&out, 3), vec![p0]);
    let s = sub(&b, "s");
    assert_eq!(s.consumers.len(), 1);
    assert_eq!(s.consumers[0].key.consumer_id, 8);
    // The removal is the dispatcher's: consumer 7 is gone from the permit
    // bookkeeping too, its balance (1 - 1) with it, and its write dropped.
    assert!(s
        .permits(ConsumerKey {
            connection_id: 2,
            consumer_id: 7
        })
        .is_none());
    assert_eq!(s.dispatcher.total_available_permits(), 5 - 1);
    assert_eq!(s.dispatcher.writes_in_flight(), 1, "consumer 8's MESSAGE");
}

#[test]
fn a_written_frame_is_not_failed_afterwards() {
    let (_d, mut b) = with_producer();
    let p0 = send(&mut b, 1, 1, 0, &entry(None, None, None));
    connect(&mut b, 2);
    subscribe(&mut b, 2, 7, "s", sub_type::SHARED, "a");
    let mut written = 0;
    b.handle_written(2, 0, T0);
    let out = flow(&mut b, 2, 7, 1);
    assert_eq!(positions_to(&out, 2), vec![p0]);
    assert_eq!(sub(&b, "s").dispatcher.writes_in_flight(), 1);
    // Everything queued so far was written; a later failure covers nothing.
    written += 1 << 20;
    b.handle_written(2, written, T0);
    // The written MESSAGE settled its write id in the dispatcher.
    assert_eq!(sub(&b, "s").dispatcher.writes_in_flight(), 0);
    b.handle_write_failed(2, 100, T0);
    assert!(frames(&mut b).is_empty());
    assert_eq!(sub(&b, "s").consumers.len(), 1);
}

/// The subscription's consumers and its dispatcher's permit entries are
/// one set: after a CLOSE_CONSUMER, a failed MESSAGE write and a closed
/// connection (two consumers of it at once), the dispatcher holds exactly
/// the attached consumers, its total is the sum of their balances, no
/// write of a removed consumer is pending, and what they left reaches the
/// next consumer, in order.
#[test]
fn every_way_of_leaving_removes_the_consumer_from_the_dispatcher() {
    fn in_sync(s: &Subscription) {
        let mut attached: Vec<ConsumerKey> = s.consumers.iter().map(|c| c.key).collect();
        attached.sort();
        let registered: Vec<ConsumerKey> = s.dispatcher.consumers().map(|c| c.key()).collect();
        assert_eq!(attached, registered);
        assert_eq!(
            s.dispatcher.total_available_permits(),
            s.dispatcher.sum_consumer_permits()
        );
    }
    let (_d, mut b) = with_producer();
    let ps: Vec<Position> = (0..6)
        .map(|i| send(&mut b, 1, 1, i, &entry(None, None, None)))
        .collect();
    connect(&mut b, 2);
    connect(&mut b, 3);
    subscribe(&mut b, 1, 6, "s", sub_type::SHARED, "d");
    subscribe(&mut b, 2, 7, "s", sub_type::SHARED, "a");
    subscribe(&mut b, 2, 9, "s", sub_type::SHARED, "c");
    subscribe(&mut b, 3, 8, "s", sub_type::SHARED, "b");
    for (conn, cid) in [(1, 6), (2, 7), (2, 9), (3, 8)] {
        assert_eq!(positions_to(&flow(&mut b, conn, cid, 1), conn).len(), 1);
    }
    in_sync(sub(&b, "s"));
    assert_eq!(sub(&b, "s").dispatcher.writes_in_flight(), 4);
    feed(
        &mut b,
        1,
        BrokerCommand {
            r#type: ty::CLOSE_CONSUMER,
            close_consumer: Some(command::CommandIdRequest {
                id: 6,
                request_id: 5,
            }),
            ..Default::default()
        },
    );
    in_sync(sub(&b, "s"));
    b.handle_write_failed(3, 1 << 20, T0);
    let out = frames(&mut b);
    assert!(
        out.iter()
            .any(|(c, f, _)| *c == 3 && f.r#type == ty::CLOSE_CONSUMER),
        "{out:?}"
    );
    in_sync(sub(&b, "s"));
    b.handle_close(2, T0);
    frames(&mut b);
    let s = sub(&b, "s");
    in_sync(s);
    assert!(s.consumers.is_empty());
    assert_eq!(s.dispatcher.total_available_permits(), 0);
    assert_eq!(s.dispatcher.writes_in_flight(), 0);
    subscribe(&mut b, 1, 5, "s", sub_type::SHARED, "e");
    let out = flow(&mut b, 1, 5, 10);
    assert_eq!(positions_to(&out, 1), ps);
    in_sync(sub(&b, "s"));
}
