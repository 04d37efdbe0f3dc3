use super::*;

fn m(e: i64) -> MessageRef {
    MessageRef {
        position: Position::new(1, e),
        batch_index: 0,
    }
}

/// Forgetting acknowledged messages changes nothing: random event
/// sequences (acks, duplicates, restarts, reconnects, seeks, cumulative
/// acks, unknown messages) give the same counts and first violation with
/// retirement after every ack as with none, and the window shrinks.
#[test]
fn retiring_acknowledged_messages_keeps_the_report() {
    use rand::{Rng, SeedableRng};
    let mut retired = 0;
    for seed in 0..300u64 {
        for order in [OrderCheck::None, OrderCheck::PerKey, OrderCheck::Total] {
            let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let subs = ["a".to_string(), "b".to_string()];
            let mut eager = DeliveryChecker::new(subs.clone(), 0, order);
            eager.retire_every = 1;
            let mut never = DeliveryChecker::new(subs, 0, order);
            never.retire_every = u32::MAX;
            let mut next_entry = 0i64;
            let mut published: Vec<MessageRef> = Vec::new();
            let mut seeks = 0u32;
            for _ in 0..400 {
                let now = r.random_range(0..1_000u64);
                let sub = ["a", "b", "c"][r.random_range(0..3)];
                let consumer = r.random_range(0..3usize);
                let pick = |r: &mut rand_chacha::ChaCha8Rng, p: &[MessageRef]| {
                    if p.is_empty() || r.random_bool(0.05) {
                        MessageRef {
                            position: Position::new(
                                1 + r.random_range(0..2),
                                r.random_range(0..60),
                            ),
                            batch_index: r.random_range(0..4),
                        }
                    } else {
                        // Mostly recent messages, sometimes old ones.
                        let n = p.len();
                        let back = if r.random_bool(0.8) {
                            r.random_range(0..n.min(8))
                        } else {
                            r.random_range(0..n)
                        };
                        p[n - 1 - back]
                    }
                };
                match r.random_range(0..100) {
                    0..=19 => {
                        let batch = r.random_range(1..4u32);
                        let ledger = 1 + next_entry / 40;
                        for b in 0..batch {
                            let m = MessageRef {
                                position: Position::new(ledger, next_entry % 40),
                                batch_index: b,
                            };
                            let key = r.random_range(0..3);
                            let due = if r.random_bool(0.1) {
                                r.random_range(0..1_000)
                            } else {
                                0
                            };
                            eager.published(m, key, due);
                            never.published(m, key, due);
                            published.push(m);
                        }
                        next_entry += 1 + i64::from(r.random_bool(0.1));
                    }
                    20..=54 => {
                        let m = pick(&mut r, &published);
                        eager.delivered(sub, consumer, m, now, seeks);
                        never.delivered(sub, consumer, m, now, seeks);
                        if r.random_bool(0.6) {
                            eager.acked(sub, m, now);
                            never.acked(sub, m, now);
                        }
                    }
                    55..=79 => {
                        let m = pick(&mut r, &published);
                        eager.ack_applied(sub, consumer, &[m], now);
                        never.ack_applied(sub, consumer, &[m], now);
                        eager.acked(sub, m, now);
                        never.acked(sub, m, now);
                    }
                    80..=84 => {
                        let m = pick(&mut r, &published);
                        eager.cumulative_ack_applied(sub, consumer, m.position, now);
                        never.cumulative_ack_applied(sub, consumer, m.position, now);
                        assert_eq!(
                            eager.cumulative_acked(sub, m.position),
                            never.cumulative_acked(sub, m.position)
                        );
                    }
                    85..=89 => {
                        eager.consumer_reconnected(sub, consumer);
                        never.consumer_reconnected(sub, consumer);
                    }
                    90..=92 => {
                        eager.restarted();
                        never.restarted();
                    }
                    93..=95 => {
                        let m = pick(&mut r, &published);
                        eager.exempt_from_order(sub, m);
                        never.exempt_from_order(sub, m);
                    }
                    _ => {
                        let m = pick(&mut r, &published);
                        let a = eager.seek_completed(sub, m.position, now);
                        assert_eq!(a, never.seek_completed(sub, m.position, now));
                        seeks = seeks.max(a);
                    }
                }
                assert_eq!(eager.all_acked(), never.all_acked());
                assert_eq!(eager.counts, never.counts, "seed {seed}");
            }
            // Acknowledge everything delivered, then re-deliver the oldest.
            for m in published.clone() {
                for s in ["a", "b"] {
                    eager.delivered(s, 9, m, 2_000, 0);
                    never.delivered(s, 9, m, 2_000, 0);
                    eager.acked(s, m, 2_000);
                    never.acked(s, m, 2_000);
                }
            }
            if let Some(m) = published.first() {
                eager.delivered("a", 0, *m, 2_001, seeks);
                never.delivered("a", 0, *m, 2_001, seeks);
            }
            assert!(never.base == 0 && eager.base <= published.len());
            retired += eager.base;
            let (e, ef) = eager.finish(3_000);
            let (n, nf) = never.finish(3_000);
            assert_eq!(e, n, "seed {seed} {order:?}");
            assert_eq!(ef, nf, "seed {seed} {order:?}");
        }
    }
    assert!(
        retired > 1_000,
        "the sequences exercise retirement: {retired}"
    );
}

/// A long clean run keeps only the unacknowledged window.
#[test]
fn window_is_bounded_by_the_unacknowledged_messages() {
    let mut c = DeliveryChecker::new(["s".to_string(), "t".to_string()], 0, OrderCheck::PerKey);
    c.retire_every = 16;
    for e in 0..100_000 {
        c.published(m(e), (e % 7) as u32, 0);
        for s in ["s", "t"] {
            c.delivered(s, 0, m(e), 1, 0);
            c.acked(s, m(e), 2);
        }
        assert!(c.published.len() <= 17, "window {}", c.published.len());
    }
    c.delivered("s", 0, m(3), 3, 0); // forgotten, still a duplicate
    c.delivered("s", 0, m(100_000), 3, 0); // never published
    let (counts, first) = c.finish(4);
    assert_eq!(counts.duplicate_violations, 1);
    assert_eq!(counts.invalid_events, 1);
    assert!(first.unwrap().contains("1:3#0 redelivered after its ack"));
}

#[test]
fn clean_run_has_no_violations() {
    let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::PerKey);
    for e in 0..3 {
        c.published(m(e), 7, 0);
    }
    for e in 0..3 {
        c.delivered("s", 0, m(e), 10, 0);
        c.acked("s", m(e), 11);
    }
    assert!(c.all_acked());
    let (counts, first) = c.finish(20);
    assert_eq!(counts.violations(), 0, "{first:?}");
    assert_eq!(
        (counts.published, counts.delivered, counts.acked),
        (3, 3, 3)
    );
}

#[test]
fn duplicate_without_restart_is_a_violation_with_restart_allowed() {
    let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::PerKey);
    c.published(m(0), 1, 0);
    c.delivered("s", 0, m(0), 1, 0);
    c.restarted();
    c.delivered("s", 0, m(0), 2, 0);
    c.delivered("s", 0, m(0), 3, 0);
    c.acked("s", m(0), 4);
    let (counts, first) = c.finish(5);
    assert_eq!(counts.duplicates_allowed, 1);
    assert_eq!(counts.duplicate_violations, 1);
    assert!(first.unwrap().contains("delivered twice"));
}

#[test]
fn redelivery_after_ack_loss_and_order_are_caught() {
    let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::PerKey);
    for e in 0..3 {
        c.published(m(e), 1, 0);
    }
    c.delivered("s", 0, m(1), 1, 0);
    c.delivered("s", 0, m(0), 2, 0); // overtaken by #2
    c.acked("s", m(0), 3);
    c.restarted();
    c.delivered("s", 0, m(0), 4, 0); // after its ack
    c.acked("s", m(2), 5); // never delivered
    let (counts, _) = c.finish(6);
    assert_eq!(counts.order_violations, 1);
    assert_eq!(counts.duplicate_violations, 1);
    assert_eq!(counts.invalid_events, 1);
    assert_eq!(counts.lost, 2); // 1 and 2 never acked
}

#[test]
fn delayed_messages_must_not_come_early() {
    let mut c = DeliveryChecker::new(["s".to_string()], 100, OrderCheck::PerKey);
    c.published(m(0), 0, 1_000);
    c.published(m(1), 0, 1_000);
    c.delivered("s", 0, m(0), 950, 0); // within the tick tolerance
    c.delivered("s", 0, m(1), 800, 0);
    let (counts, _) = c.finish(2_000);
    assert_eq!(counts.early_deliveries, 1);
}

#[test]
fn seek_skips_unacked_and_catches_a_delivery_dispatched_after_it() {
    let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::None);
    for e in 0..4 {
        c.published(m(e), 0, 0);
    }
    c.delivered("s", 0, m(0), 1, 0);
    c.acked("s", m(0), 2);
    c.delivered("s", 0, m(1), 3, 0); // dispatched before the seek
    let epoch = c.seek_completed("s", Position::new(1, 2), 4);
    assert_eq!(epoch, 1);
    assert!(!c.all_acked());
    c.delivered("s", 0, m(1), 5, 0); // in flight before the seek: allowed
    c.acked("s", m(1), 6); // skipped → acked
    c.delivered("s", 0, m(2), 7, epoch); // dispatched after the seek: violation
    c.delivered("s", 0, m(3), 8, epoch);
    c.acked("s", m(3), 9);
    assert!(c.all_acked(), "m(2) is skipped, the rest acked");
    let (counts, first) = c.finish(10);
    assert_eq!(counts.skipped_by_seek, 1);
    assert_eq!(counts.delivered_after_seek, 1);
    assert_eq!(counts.lost, 0);
    assert_eq!(counts.violations(), 1);
    assert!(first.unwrap().contains("after a seek"));
}

#[test]
fn cumulative_ack_covering_an_undelivered_message_and_total_order() {
    let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::Total);
    for e in 0..4 {
        c.published(m(e), e as u32, 0); // distinct keys: order is total
    }
    c.delivered("s", 0, m(0), 1, 0);
    c.delivered("s", 0, m(1), 2, 0);
    c.cumulative_ack_applied("s", 0, Position::new(1, 1), 3);
    c.cumulative_acked("s", Position::new(1, 1));
    c.delivered("s", 0, m(3), 4, 0);
    c.cumulative_ack_applied("s", 0, Position::new(1, 3), 5); // m(2) undelivered
    c.cumulative_acked("s", Position::new(1, 3));
    c.delivered("s", 0, m(2), 6, 0); // overtaken by m(3)
    c.delivered("s", 0, m(1), 7, 0); // after its cumulative ack
    let (counts, first) = c.finish(8);
    assert_eq!(counts.acked, 3);
    assert_eq!(counts.invalid_events, 1);
    assert_eq!(counts.order_violations, 1);
    assert_eq!(counts.duplicate_violations, 1);
    assert_eq!(counts.lost, 1);
    assert!(first.unwrap().contains("covers undelivered"));
}

/// Per-consumer duplicates across reconnects: a standby's reconnect must not license a duplicate to, or reset
/// the order progress of, the active consumer (Failover).
#[test]
fn unrelated_reconnect_allows_no_duplicate_or_disorder() {
    let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::Total);
    for e in 0..4 {
        c.published(m(e), e as u32, 0);
    }
    c.delivered("s", 0, m(0), 1, 0);
    c.delivered("s", 0, m(1), 2, 0);
    c.delivered("s", 0, m(3), 3, 0);
    c.consumer_reconnected("s", 1); // a standby: nothing is redelivered
    c.delivered("s", 0, m(1), 4, 0); // duplicate to the active consumer
    c.delivered("s", 0, m(2), 5, 0); // 2 after 3 to the same incarnation
    for e in 0..4 {
        c.acked("s", m(e), 6);
    }
    let (counts, first) = c.finish(7);
    assert_eq!(counts.duplicates_allowed, 0);
    assert_eq!(counts.duplicate_violations, 1);
    assert_eq!(counts.order_violations, 1);
    assert!(first.unwrap().contains("delivered twice to consumer-0"));
}

/// The same on Shared: consumer 1's reconnect does not allow a duplicate to
/// consumer 0 of what consumer 0 received, nor a copy to consumer 1 of
/// what consumer 0 still holds; it does allow redelivering consumer 1's.
#[test]
fn shared_duplicate_needs_the_holder_to_reconnect() {
    let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::None);
    for e in 0..3 {
        c.published(m(e), 0, 0);
    }
    c.delivered("s", 0, m(0), 1, 0);
    c.delivered("s", 1, m(1), 1, 0);
    c.consumer_reconnected("s", 1);
    c.delivered("s", 0, m(1), 2, 0); // consumer 1's: allowed
    c.delivered("s", 0, m(0), 3, 0); // consumer 0 never reconnected
    c.delivered("s", 1, m(0), 4, 0); // held by consumer 0: not allowed
    let (counts, first) = c.finish(5);
    assert_eq!(counts.duplicates_allowed, 1);
    assert_eq!(counts.duplicate_violations, 2);
    assert!(first.unwrap().contains("delivered twice to consumer-0"));
}

/// Redelivery order: a replay after a failover must come in order (Failover) and a
/// Key_Shared key's replay before newer messages of that key.
#[test]
fn redeliveries_are_order_checked() {
    let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::Total);
    for e in 0..3 {
        c.published(m(e), e as u32, 0);
    }
    for e in 0..3 {
        c.delivered("s", 0, m(e), 1, 0);
    }
    c.consumer_reconnected("s", 0); // real failover to consumer 1
    for e in (0..3).rev() {
        c.delivered("s", 1, m(e), 2, 0); // replayed 2, 1, 0
    }
    let (counts, first) = c.finish(3);
    assert_eq!(counts.duplicates_allowed, 3);
    assert_eq!(counts.order_violations, 2);
    assert!(first.unwrap().contains("redelivered message #2"));

    let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::PerKey);
    for e in 0..4 {
        c.published(m(e), 7, 0);
    }
    c.delivered("s", 0, m(0), 1, 0);
    c.delivered("s", 0, m(1), 1, 0);
    c.consumer_reconnected("s", 0);
    c.delivered("s", 1, m(2), 2, 0); // newer message of key 7 first
    c.delivered("s", 1, m(0), 3, 0); // then the replay
    c.delivered("s", 1, m(1), 3, 0);
    c.delivered("s", 1, m(3), 3, 0);
    let (counts, first) = c.finish(4);
    assert_eq!(counts.order_violations, 2);
    assert!(first.unwrap().contains("key 7: redelivered message #1"));

    // The same replay in order, before newer messages: clean.
    let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::PerKey);
    for e in 0..4 {
        c.published(m(e), 7, 0);
    }
    c.delivered("s", 0, m(0), 1, 0);
    c.delivered("s", 0, m(1), 1, 0);
    c.consumer_reconnected("s", 0);
    for e in 0..4 {
        c.delivered("s", 1, m(e), 2, 0);
        c.acked("s", m(e), 3);
    }
    let (counts, first) = c.finish(4);
    assert_eq!(counts.violations(), 0, "{first:?}");
    assert_eq!(counts.duplicates_allowed, 2);
}

/// Cumulative acks cover only delivered messages: after a failover the new active consumer's cumulative ack must
/// not cover the old active consumer's messages it never received.
#[test]
fn cumulative_ack_must_cover_only_this_consumers_deliveries() {
    let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::Total);
    for e in 0..4 {
        c.published(m(e), 0, 0);
    }
    c.delivered("s", 0, m(0), 1, 0);
    c.delivered("s", 0, m(1), 1, 0);
    c.consumer_reconnected("s", 0); // handover to consumer 1 ...
    c.delivered("s", 1, m(2), 2, 0); // ... that skipped the redelivery
    c.delivered("s", 1, m(3), 2, 0);
    c.cumulative_ack_applied("s", 1, Position::new(1, 3), 3);
    let (counts, first) = c.finish(4);
    assert_eq!(counts.invalid_events, 2);
    assert!(first
        .unwrap()
        .contains("covers a message not delivered to this consumer: 1:0#0"));

    // With the redelivery (in order) the same ack is clean.
    let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::Total);
    for e in 0..4 {
        c.published(m(e), 0, 0);
    }
    c.delivered("s", 0, m(0), 1, 0);
    c.delivered("s", 0, m(1), 1, 0);
    c.consumer_reconnected("s", 0);
    for e in 0..4 {
        c.delivered("s", 1, m(e), 2, 0);
    }
    c.cumulative_ack_applied("s", 1, Position::new(1, 3), 3);
    assert_eq!(c.cumulative_acked("s", Position::new(1, 3)), 4);
    let (counts, first) = c.finish(4);
    assert_eq!(counts.violations(), 0, "{first:?}");
}

/// Publications are registered in receipt order, not position order (a
/// node client's producers get their receipts on separate connections; the
/// copy of a send whose receipt was lost is registered at its first
/// delivery): a cumulative ack covers exactly the messages at or below its
/// position, wherever they sit in the window.
#[test]
fn cumulative_ack_covers_messages_registered_out_of_position_order() {
    let publish = |c: &mut DeliveryChecker| {
        for e in [0, 1, 3, 4, 2, 5] {
            c.published(m(e), 0, 0);
        }
    };
    // Everything up to 1:2 delivered and cumulatively acknowledged; the
    // next incarnation's cumulative ack covers only what it was delivered.
    let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::None);
    publish(&mut c);
    for e in 0..=3 {
        c.delivered("s", 0, m(e), 1, 0);
    }
    c.cumulative_ack_applied("s", 0, Position::new(1, 2), 2);
    assert_eq!(c.cumulative_acked("s", Position::new(1, 2)), 3);
    c.consumer_reconnected("s", 0);
    for e in 3..=5 {
        c.delivered("s", 0, m(e), 3, 0);
    }
    c.cumulative_ack_applied("s", 0, Position::new(1, 5), 4);
    assert_eq!(c.cumulative_acked("s", Position::new(1, 5)), 3);
    let (counts, first) = c.finish(5);
    assert_eq!(counts.violations(), 0, "{first:?}");
    assert_eq!(counts.acked, 6);

    // The late-registered 1:2 never delivered: a cumulative ack up to 1:1
    // leaves it (and 1:3) alone, one up to 1:4 covers it undelivered.
    let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::None);
    publish(&mut c);
    for e in [0, 1, 3, 4] {
        c.delivered("s", 0, m(e), 1, 0);
    }
    c.cumulative_ack_applied("s", 0, Position::new(1, 1), 2);
    assert_eq!(c.cumulative_acked("s", Position::new(1, 1)), 2);
    c.cumulative_ack_applied("s", 0, Position::new(1, 4), 3);
    assert_eq!(c.cumulative_acked("s", Position::new(1, 4)), 2);
    let (counts, first) = c.finish(4);
    assert_eq!(counts.invalid_events, 1);
    assert!(first
        .unwrap()
        .contains("cumulative ack up to 1:4 covers undelivered 1:2#0"));
}

/// An individual ack must come from the consumer incarnation the message
/// was delivered to.
#[test]
fn individual_ack_must_come_from_the_receiving_incarnation() {
    let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::None);
    for e in 0..3 {
        c.published(m(e), 0, 0);
    }
    c.delivered("s", 0, m(0), 1, 0);
    c.delivered("s", 0, m(1), 1, 0);
    c.delivered("s", 1, m(2), 1, 0);
    c.ack_applied("s", 0, &[m(0)], 2); // fine
    c.ack_applied("s", 1, &[m(1)], 2); // consumer 1 never got it
    c.consumer_reconnected("s", 1);
    c.ack_applied("s", 1, &[m(2)], 3); // the old incarnation's
    let (counts, first) = c.finish(4);
    assert_eq!(counts.invalid_events, 2);
    assert!(first
        .unwrap()
        .contains("consumer-1: ack of 1:1#0, not delivered to this consumer"));
}

/// A negative ack of its holder allows exactly one redelivery of the
/// message, to the same live consumer incarnation or another consumer, and
/// exempts it from the per-key order; a second redelivery without another
/// negative ack is still a duplicate.
#[test]
fn a_negative_ack_allows_one_redelivery_only() {
    let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::PerKey);
    for e in 0..2 {
        c.published(m(e), 7, 0);
    }
    c.delivered("s", 0, m(0), 1, 0);
    c.delivered("s", 0, m(1), 1, 0);
    c.nacked("s", 0, &[m(0)], 2);
    // Redelivered after the newer m(1) of the same key: allowed (exempt).
    c.delivered("s", 0, m(0), 3, 0);
    let (counts, first) = c.finish(4);
    assert_eq!(counts.duplicates_allowed, 1, "{first:?}");
    assert_eq!(counts.order_violations, 0, "{first:?}");
    assert_eq!(counts.duplicate_violations, 0, "{first:?}");

    let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::PerKey);
    c.published(m(0), 7, 0);
    c.delivered("s", 0, m(0), 1, 0);
    c.nacked("s", 0, &[m(0)], 2);
    c.delivered("s", 1, m(0), 3, 0);
    c.delivered("s", 0, m(0), 4, 0);
    let (counts, first) = c.finish(5);
    assert_eq!(counts.duplicates_allowed, 1);
    assert_eq!(counts.duplicate_violations, 1);
    assert!(first
        .unwrap()
        .contains("while consumer-1, which received it"));
}

/// Negative control: a negative ack from a consumer the message was not
/// delivered to (or of an acknowledged message) is an invalid event and
/// allows no redelivery.
#[test]
fn a_negative_ack_by_another_consumer_is_invalid_and_allows_nothing() {
    let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::PerKey);
    c.published(m(0), 7, 0);
    c.published(m(1), 7, 0);
    c.delivered("s", 0, m(0), 1, 0);
    c.nacked("s", 1, &[m(0)], 2);
    c.delivered("s", 1, m(0), 3, 0);
    c.delivered("s", 0, m(1), 3, 0);
    c.acked("s", m(1), 4);
    c.nacked("s", 0, &[m(1)], 5);
    let (counts, first) = c.finish(6);
    assert_eq!(counts.invalid_events, 2);
    assert_eq!(counts.duplicate_violations, 1);
    assert!(first.unwrap().contains("negative ack of 1:0#0"));
}

/// A redelivery request names entries, not messages: the broker gives
/// back every message of a named entry the requesting incarnation holds
/// unacknowledged, to any consumer, once. Here consumer 1 holds batch
/// 1:0 (#0 acknowledged, #1 negatively acknowledged but settled by
/// another incarnation's ack first, #2 taken under a transactional ack the
/// broker refused); its request for 1:0 lets #2 go to consumer 0.
/// Negative controls: with no request, with the request from a consumer
/// that does not hold the entry, for another entry, or a second
/// redelivery after the one the request allowed, #2 on consumer 0 while
/// consumer 1 lives is a duplicate violation.
#[test]
fn a_redelivery_request_releases_every_unacknowledged_message_its_holder_has_of_the_entry() {
    let b = |e: i64, i: u32| MessageRef {
        position: Position::new(1, e),
        batch_index: i,
    };
    // `request`: who asks for which entry (None: no request); `again`: a
    // second redelivery follows the allowed one.
    let run = |request: Option<(usize, i64)>, again: bool| {
        let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::None);
        for i in 0..3 {
            c.published(b(0, i), 0, 0);
        }
        c.published(b(1, 0), 0, 0);
        for i in 0..3 {
            c.delivered("s", 1, b(0, i), 1, 0);
        }
        c.delivered("s", 1, b(1, 0), 1, 0);
        c.ack_applied("s", 1, &[b(0, 0)], 2);
        c.acked("s", b(0, 0), 2);
        c.acked("s", b(0, 1), 2);
        // The client's negative ack of 1:0#1 names nothing unsettled.
        c.nacked("s", 1, &[], 3);
        if let Some((consumer, entry)) = request {
            c.redelivery_requested("s", consumer, &[Position::new(1, entry)], 3);
        }
        c.delivered("s", 0, b(0, 2), 4, 0);
        if again {
            c.delivered("s", 2, b(0, 2), 5, 0);
        }
        c.ack_applied("s", 0, &[b(0, 2)], 6);
        c.acked("s", b(0, 2), 6);
        c.ack_applied("s", 1, &[b(1, 0)], 6);
        c.acked("s", b(1, 0), 6);
        c.finish(7)
    };
    let (counts, first) = run(Some((1, 0)), false);
    assert_eq!(counts.violations(), 0, "{first:?}");
    assert_eq!(counts.duplicates_allowed, 1);
    for (request, again) in [
        (None, false),
        (Some((2, 0)), false),
        (Some((1, 1)), false),
        (Some((1, 0)), true),
    ] {
        let (counts, first) = run(request, again);
        assert_eq!(
            counts.duplicate_violations, 1,
            "{request:?} {again}: {first:?}"
        );
        assert!(
            first
                .as_deref()
                .is_some_and(|f| f.contains("1:0#2 delivered to consumer-")
                    && f.contains("which received it, neither reconnected nor restarted")),
            "{request:?} {again}: {first:?}"
        );
    }
}

/// Key_Shared exclusivity (PIP-379): a key's message delivered to a second
/// live consumer incarnation while the first holds an unacknowledged one
/// is an order violation; after the ack, or once the holder's incarnation
/// ended, it is not.
#[test]
fn a_key_on_two_consumers_at_once_is_a_violation_when_keys_are_exclusive() {
    let m = |e| MessageRef {
        position: Position::new(1, e),
        batch_index: 0,
    };
    let setup = || {
        let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::PerKey);
        c.set_key_exclusive(true);
        for e in 0..4 {
            c.published(m(e), 7, 0);
        }
        c.delivered("s", 0, m(0), 1, 0);
        c
    };
    let mut c = setup();
    c.delivered("s", 1, m(1), 2, 0);
    let (counts, first) = c.finish(3);
    assert_eq!(counts.order_violations, 1, "{first:?}");
    assert!(first
        .unwrap()
        .contains("holds unacknowledged messages of the key"));
    // Acknowledged first: the key is free.
    let mut c = setup();
    c.acked("s", m(0), 2);
    c.delivered("s", 1, m(1), 3, 0);
    c.acked("s", m(1), 3);
    // The holder reconnected: what it held may go elsewhere.
    c.delivered("s", 0, m(2), 4, 0);
    c.consumer_reconnected("s", 0);
    c.delivered("s", 1, m(3), 5, 0);
    let (counts, first) = c.finish(6);
    assert_eq!(counts.order_violations, 0, "{first:?}");
    // Off by default.
    let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::PerKey);
    c.published(m(0), 7, 0);
    c.published(m(1), 7, 0);
    c.delivered("s", 0, m(0), 1, 0);
    c.delivered("s", 1, m(1), 2, 0);
    assert_eq!(c.finish(3).0.order_violations, 0);
}

/// An aborted transactional ack of one message of a batch gives the whole
/// entry back (Pulsar's abort calls `redeliverUnacknowledgedMessages` with
/// the entry's position): its other unacknowledged messages, still held by
/// their consumer, may come once more; an acknowledged one may not, and a
/// message of another entry is still a duplicate.
#[test]
fn an_aborted_batch_index_ack_releases_the_entrys_unacknowledged_messages() {
    let b = |e: i64, i: u32| MessageRef {
        position: Position::new(1, e),
        batch_index: i,
    };
    let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::None);
    for i in 0..3 {
        c.published(b(0, i), 7, 0);
    }
    c.published(b(1, 0), 7, 0);
    for m in [b(0, 0), b(0, 1), b(0, 2), b(1, 0)] {
        c.delivered("s", 0, m, 1, 0);
    }
    c.acked("s", b(0, 2), 2);
    c.txn_begun(1, 2, 60_000);
    c.txn_acked(1, "s", b(0, 0));
    c.txn_end_requested(1, false, 3);
    c.txn_ended(1, TxnOutcome::Aborted, 4);
    // The entry comes back with indexes 0 and 1 (2 is acknowledged), index
    // 1 to another consumer; its first holder still acknowledges it.
    c.delivered("s", 0, b(0, 0), 5, 0);
    c.delivered("s", 1, b(0, 1), 5, 0);
    c.ack_applied("s", 0, &[b(0, 1)], 6);
    let (counts, first) = c.finish(7);
    assert_eq!(counts.duplicate_violations, 0, "{first:?}");
    assert_eq!(counts.invalid_events, 0, "{first:?}");
    assert_eq!(counts.duplicates_allowed, 2, "{first:?}");
    // Negative control: another entry's message is not released.
    let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::None);
    c.published(b(0, 0), 7, 0);
    c.published(b(1, 0), 7, 0);
    c.delivered("s", 0, b(0, 0), 1, 0);
    c.delivered("s", 0, b(1, 0), 1, 0);
    c.txn_begun(1, 2, 60_000);
    c.txn_acked(1, "s", b(0, 0));
    c.txn_end_requested(1, false, 3);
    c.delivered("s", 0, b(1, 0), 5, 0);
    let (counts, first) = c.finish(6);
    assert_eq!(counts.duplicate_violations, 1, "{first:?}");
}

/// The consumer holding a message when an aborted transactional ack gave
/// its entry back still holds its copy after the abort's redelivery went
/// to another consumer (Pulsar dispatches the entry again with every
/// unacknowledged index, `PendingAckHandleImpl.handleAbort` →
/// `redeliverUnacknowledgedMessages`): its negative ack of that copy is
/// valid and allows one more redelivery. Negative controls: the same
/// negative ack from a consumer that never received the message, or from
/// the holder after it reconnected, is an invalid event.
#[test]
fn a_negative_ack_by_the_holder_an_abort_released_is_valid() {
    let b = |i: u32| MessageRef {
        position: Position::new(1, 0),
        batch_index: i,
    };
    // `nacker`: who negatively acknowledges index 1 at the end;
    // `reconnect`: consumer 2 reconnects first.
    let run = |nacker: usize, reconnect: bool| {
        let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::None);
        c.published(b(0), 7, 0);
        c.published(b(1), 7, 0);
        c.delivered("s", 0, b(0), 1, 0);
        c.delivered("s", 0, b(1), 1, 0);
        // Consumer 0 negatively acknowledges index 1 (the entry goes back)
        // while index 0 is acknowledged in an open transaction.
        c.txn_begun(1, 1, 60_000);
        c.txn_acked(1, "s", b(0));
        c.nacked("s", 0, &[b(1)], 2);
        c.redelivery_requested("s", 0, &[b(1).position], 2);
        c.delivered("s", 2, b(1), 3, 0);
        // The abort gives the entry back: both indexes to consumer 0,
        // while consumer 2 still holds index 1.
        c.txn_end_requested(1, false, 4);
        c.txn_ended(1, TxnOutcome::Aborted, 4);
        c.delivered("s", 0, b(0), 5, 0);
        c.delivered("s", 0, b(1), 5, 0);
        if reconnect {
            c.consumer_reconnected("s", 2);
        }
        c.nacked("s", nacker, &[b(1)], 6);
        c.redelivery_requested("s", nacker, &[b(1).position], 6);
        // The negative ack's redelivery.
        c.delivered("s", 1, b(1), 7, 0);
        c.finish(8)
    };
    let (counts, first) = run(2, false);
    assert_eq!(counts.invalid_events, 0, "{first:?}");
    assert_eq!(counts.duplicate_violations, 0, "{first:?}");
    for (nacker, reconnect) in [(1, false), (2, true)] {
        let (counts, first) = run(nacker, reconnect);
        assert_eq!(counts.invalid_events, 1, "{nacker} {reconnect}: {first:?}");
        assert!(
            first
                .as_deref()
                .is_some_and(|f| f.contains("negative ack of 1:0#1")),
            "{first:?}"
        );
    }
}

/// Two copies of one message out at once, both allowed: the copy the
/// reconnect of its holder allows (to consumer 0) and the copy of an abort
/// granted after that holder was gone (to consumer 2; Pulsar's abort
/// dispatches the entry again with every unacknowledged index). Consumer 0
/// still holds its copy, so its ack of it is valid (Pulsar applies an
/// individual ack of any consumer that received the position). Negative
/// control: the ack of a consumer that never received the message is
/// still an invalid event.
#[test]
fn the_holder_of_a_copy_an_aborts_copy_displaced_may_still_acknowledge_it() {
    let b = |i: u32| MessageRef {
        position: Position::new(1, 0),
        batch_index: i,
    };
    let run = |acker: usize| {
        let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::None);
        c.published(b(0), 7, 0);
        c.published(b(1), 7, 0);
        c.delivered("s", 1, b(0), 1, 0);
        c.delivered("s", 1, b(1), 1, 0);
        c.txn_begun(1, 1, 60_000);
        c.txn_acked(1, "s", b(0));
        c.consumer_reconnected("s", 1);
        c.txn_end_requested(1, false, 2);
        c.txn_ended(1, TxnOutcome::Aborted, 2);
        // The reconnect's copy of index 1, then the abort's copy of the
        // entry (both indexes).
        c.delivered("s", 0, b(1), 3, 0);
        c.delivered("s", 2, b(0), 4, 0);
        c.delivered("s", 2, b(1), 4, 0);
        c.ack_applied("s", acker, &[b(1)], 5);
        c.finish(6)
    };
    let (counts, first) = run(0);
    assert_eq!(counts.duplicate_violations, 0, "{first:?}");
    assert_eq!(counts.invalid_events, 0, "{first:?}");
    let (counts, first) = run(3);
    assert_eq!(counts.invalid_events, 1, "{first:?}");
    assert!(first
        .unwrap()
        .contains("consumer-3: ack of 1:0#1, not delivered to this consumer"));
}

/// An aborted transactional ack gives its entry back while a copy of the
/// entry is still on its way to a consumer that reconnected (Pulsar's
/// dispatcher sent the batch with the pending-ack indexes left out, then
/// the abort's `redeliverUnacknowledgedMessages` dispatches it again with
/// them): the in-flight copy is the delivery the reconnect allows, and the
/// abort's copy comes on top of it, to the same consumer. A third copy is
/// still a duplicate.
#[test]
fn an_abort_while_its_entry_is_in_flight_to_a_reconnected_consumer_allows_the_aborts_copy() {
    let b = |i: u32| MessageRef {
        position: Position::new(1, 0),
        batch_index: i,
    };
    let run = |extra_copy: bool| {
        let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::None);
        c.published(b(0), 7, 0);
        c.published(b(1), 7, 0);
        c.delivered("s", 0, b(0), 1, 0);
        c.delivered("s", 0, b(1), 1, 0);
        c.txn_begun(1, 1, 60_000);
        c.txn_acked(1, "s", b(0));
        c.consumer_reconnected("s", 0);
        // The abort is requested while the entry (index 1 only) is in
        // flight to the new incarnation.
        c.txn_end_requested(1, false, 2);
        c.delivered("s", 0, b(1), 3, 0);
        c.txn_ended(1, TxnOutcome::Aborted, 3);
        // The abort's redelivery: both indexes, same incarnation.
        c.delivered("s", 0, b(0), 4, 0);
        c.delivered("s", 0, b(1), 4, 0);
        if extra_copy {
            c.delivered("s", 0, b(1), 5, 0);
        }
        c.finish(6)
    };
    let (counts, first) = run(false);
    assert_eq!(counts.duplicate_violations, 0, "{first:?}");
    // Negative control: one copy more than the reconnect and the abort
    // allow.
    let (counts, first) = run(true);
    assert_eq!(counts.duplicate_violations, 1, "{first:?}");
}

/// A transactional ack receipted after the client was told its
/// transaction's timeout may have passed (a broker clock jump past its
/// ttl: the coordinator may have aborted it and redelivered the entry
/// already) is released at once: the abort's copy to another consumer is
/// allowed while the acknowledging consumer lives. Negative control: with
/// no timeout reachable, the same copy is a duplicate.
#[test]
fn a_transactional_ack_receipted_after_its_timeout_may_have_passed_is_released() {
    let run = |timeout_reachable: bool| {
        let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::None);
        c.published(m(0), 7, 0);
        c.delivered("s", 0, m(0), 1, 0);
        c.txn_begun(1, 1, 1_000);
        if timeout_reachable {
            c.txn_end_requested(1, false, 2);
        }
        c.txn_acked(1, "s", m(0));
        c.delivered("s", 1, m(0), 3, 0);
        c.finish(4)
    };
    let (counts, first) = run(true);
    assert_eq!(counts.duplicate_violations, 0, "{first:?}");
    let (counts, first) = run(false);
    assert_eq!(counts.duplicate_violations, 1, "{first:?}");
}

/// The late rule: a due delayed message first delivered more than the
/// bound late after the dispatch passed it (an ordinary message after it
/// first delivered more than the bound before) is late — a tracker that
/// lost its index while reads went on. The same lateness while the
/// dispatch never passed it (it waited behind the backlog a rewind
/// re-reads in position order) is counted, not a violation; so is one
/// passed less than the bound before (replayed after later entries).
#[test]
fn a_late_delayed_message_is_a_violation_only_once_the_dispatch_passed_it() {
    let mk = || {
        let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::None);
        c.set_late_bound(1_000);
        c.published(m(0), 0, 100); // delayed, due at 100 ms
        c.published(m(1), 0, 0);
        c
    };
    // Passed at 1,200 ms (overdue since 1,100), delivered at 2,300 ms.
    let mut c = mk();
    c.delivered("s", 0, m(1), 1_200, 0);
    c.acked("s", m(1), 1_201);
    c.delivered("s", 0, m(0), 2_300, 0);
    c.acked("s", m(0), 2_301);
    let (counts, first) = c.finish(2_400);
    assert_eq!(counts.late_deliveries, 1, "{first:?}");
    assert!(first.unwrap().contains("late delayed message: 1:0#0"));
    // Never passed: the backlog in front of it.
    let mut c = mk();
    c.delivered("s", 0, m(0), 2_300, 0);
    c.delivered("s", 0, m(1), 2_300, 0);
    c.acked("s", m(0), 2_301);
    c.acked("s", m(1), 2_301);
    let (counts, first) = c.finish(2_400);
    assert_eq!(counts.violations(), 0, "{first:?}");
    assert_eq!(counts.late_behind_backlog, 1);
    // Passed before it was overdue, or less than the bound before.
    for passed_at in [900, 1_500] {
        let mut c = mk();
        c.delivered("s", 0, m(1), passed_at, 0);
        c.acked("s", m(1), passed_at + 1);
        c.delivered("s", 0, m(0), 2_300, 0);
        c.acked("s", m(0), 2_301);
        let (counts, first) = c.finish(2_400);
        assert_eq!(counts.violations(), 0, "passed at {passed_at}: {first:?}");
        assert_eq!(counts.late_behind_backlog, 1);
    }
}

/// A subscription created after consumed-ledger trimming deleted a ledger
/// (its first creation lost in a crash, so nothing retained it) is owed
/// only what follows its initial position: ledger 1 is skipped, ledger 2
/// must still be delivered and acknowledged (else lost), and without the
/// creation the ledger-1 messages are lost.
#[test]
fn a_subscription_created_late_is_owed_only_what_follows_its_initial_position() {
    let at = |l: i64, e: i64| MessageRef {
        position: Position::new(l, e),
        batch_index: 0,
    };
    let mk = || {
        let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::Total);
        for e in 0..3 {
            c.published(at(1, e), 0, 0);
        }
        c.published(at(2, 0), 0, 0);
        c
    };
    let mut c = mk();
    assert_eq!(c.subscription_created("s", Position::new(2, -1), 1), 3);
    // A late receipt of ledger 1, registered after the creation.
    c.published(at(1, 3), 0, 0);
    c.delivered("s", 0, at(2, 0), 2, 0);
    c.acked("s", at(2, 0), 3);
    assert!(c.all_acked());
    let (counts, first) = c.finish(4);
    assert_eq!(counts.violations(), 0, "{first:?}");
    // Ledger 2 never delivered: lost.
    let mut c = mk();
    c.subscription_created("s", Position::new(2, -1), 1);
    let (counts, first) = c.finish(4);
    assert_eq!(counts.lost, 1, "{first:?}");
    assert!(first.unwrap().contains("2:0#0 never acknowledged"));
    // No creation told: ledger 1 is owed and lost.
    let mut c = mk();
    c.delivered("s", 0, at(2, 0), 2, 0);
    c.acked("s", at(2, 0), 3);
    let (counts, _) = c.finish(4);
    assert_eq!(counts.lost, 3);
}
