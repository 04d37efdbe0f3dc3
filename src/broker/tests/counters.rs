//! The core's per-component counters count the work done.

use super::*;

#[test]
fn counters_count_reads_hint_hits_messages_and_permits() {
    let (_d, mut b) = with_producer();
    let ps: Vec<Position> = (0..3)
        .map(|i| send(&mut b, 1, 1, i, &entry(None, None, None)))
        .collect();
    assert_eq!(b.counters(), DispatchCounters::default());
    connect(&mut b, 2);
    feed(&mut b, 1, subscribe_cmd(7, "f", sub_type::FAILOVER, "b", 0));
    flow(&mut b, 1, 7, 10);
    ack(&mut b, 1, 7, false, vec![mid(ps[1], vec![])], None);
    let c = b.counters();
    assert_eq!((c.messages_sent, c.permits_debited), (3, 3));
    assert!(c.cursor_reads >= 1 && c.entries_read == 3, "{c:?}");
    assert_eq!(c.hint_hits, 0);
    assert_eq!(c.peak_deleted_ranges, 1);
    // The first consumer's arrival is not a change of the active consumer.
    assert_eq!(
        (c.active_consumer_changes, c.failover_handover_entries),
        (0, 0)
    );
    // "a" takes over: the rewind re-reads from the mark-delete and the
    // hint skips the acknowledged entry without reading it.
    feed(&mut b, 2, subscribe_cmd(8, "f", sub_type::FAILOVER, "a", 0));
    flow(&mut b, 2, 8, 10);
    let c = b.counters();
    assert_eq!((c.messages_sent, c.permits_debited), (5, 5));
    assert!(c.hint_hits >= 1, "{c:?}");
    assert!(c.hint_lookups >= 3, "{c:?}");
    assert_eq!(c.entries_read, 5);
    // One change, handing over the two entries "b" held unacknowledged.
    assert_eq!(
        (c.active_consumer_changes, c.failover_handover_entries),
        (1, 2)
    );
}
