//! The cursor read as two inputs (`read_completion.rs`): what lands between
//! a read's issue and its completion. An ack in that window is dropped by
//! the locked post-I/O filter (Pulsar's read is asynchronous, so the hint
//! cleared it and the filter catches it); a consumer closed meanwhile
//! leaves the entries to the others; a seek, a rewind or an unsubscribe
//! makes the completion stale and it is dropped; one read in flight per
//! subscription.

use super::*;

/// Every output queued, without completing reads: the frames and the reads
/// issued.
fn drain(b: &mut Broker) -> (Vec<(u64, BrokerCommand)>, Vec<ReadId>) {
    let (mut frames, mut reads) = (Vec::new(), Vec::new());
    while let Some(o) = b.poll_output() {
        match o {
            Output::Frame { conn, frame } => frames.push((conn, frame.decode_command().unwrap())),
            Output::ReadIssued { read } => reads.push(read),
            _ => {}
        }
    }
    (frames, reads)
}

/// Hands `c` to the core and drains without completing reads.
fn input(b: &mut Broker, conn: u64, c: BrokerCommand) -> (Vec<(u64, BrokerCommand)>, Vec<ReadId>) {
    b.handle_frame(conn, &enc(&c), &[], T0).unwrap();
    drain(b)
}

fn flow_cmd(cid: u64, n: u32) -> BrokerCommand {
    BrokerCommand {
        r#type: ty::FLOW,
        flow: Some(CommandFlow {
            consumer_id: cid,
            message_permits: n,
        }),
        ..Default::default()
    }
}

fn ack_cmd(cid: u64, p: Position) -> BrokerCommand {
    BrokerCommand {
        r#type: ty::ACK,
        ack: Some(CommandAck {
            consumer_id: cid,
            ack_type: 0,
            message_id: vec![mid(p, vec![])],
            validation_error: None,
            txnid_least_bits: None,
            txnid_most_bits: None,
            request_id: None,
        }),
        ..Default::default()
    }
}

fn close_cmd(cid: u64, request_id: u64) -> BrokerCommand {
    BrokerCommand {
        r#type: ty::CLOSE_CONSUMER,
        close_consumer: Some(command::CommandIdRequest {
            id: cid,
            request_id,
        }),
        ..Default::default()
    }
}

/// The positions of the MESSAGE frames, with their connection.
fn delivered(frames: &[(u64, BrokerCommand)]) -> Vec<(u64, Position)> {
    frames
        .iter()
        .filter(|(_, f)| f.r#type == ty::MESSAGE)
        .map(|(c, f)| {
            let m = &f.message.as_ref().unwrap().message_id;
            (*c, Position::new(m.ledger_id as i64, m.entry_id as i64))
        })
        .collect()
}

/// Three entries published on connection 1, consumer 7 of Shared
/// subscription `s` subscribed on it.
fn three_entries() -> (tempfile::TempDir, Broker, Vec<Position>) {
    let (d, mut b) = with_producer();
    let ps: Vec<Position> = (0..3)
        .map(|i| send(&mut b, 1, 1, i, &entry(None, None, None)))
        .collect();
    subscribe(&mut b, 1, 7, "s", sub_type::SHARED, "a");
    (d, b, ps)
}

#[test]
fn an_ack_landing_while_the_read_is_in_flight_is_dropped_by_the_post_io_filter() {
    let (_d, mut b, ps) = three_entries();
    let (frames, reads) = input(&mut b, 1, flow_cmd(7, 10));
    assert!(
        frames.is_empty(),
        "nothing goes out before the read completes"
    );
    assert_eq!(reads.len(), 1);
    assert_eq!(b.counters().cursor_reads, 1);
    // The hint saw nothing deleted when the read was issued; the ack lands
    // before the read completes (Pulsar: between asyncReadEntries and
    // readEntriesComplete).
    let (frames, more) = input(&mut b, 1, ack_cmd(7, ps[1]));
    assert!(frames.is_empty() && more.is_empty(), "one read in flight");
    assert_eq!(b.counters().filtered_after_read, 0);
    assert!(b.complete_read(reads[0], T0));
    let (frames, next) = drain(&mut b);
    assert_eq!(
        delivered(&frames),
        vec![(1, ps[0]), (1, ps[2])],
        "the acknowledged entry is filtered after the read"
    );
    let c = b.counters();
    assert_eq!((c.entries_read, c.filtered_after_read), (3, 1));
    // The next read finds the end of the topic: nothing in flight.
    assert!(next.is_empty());
    assert_eq!(c.stale_read_completions, 0);
}

#[test]
fn only_one_read_is_in_flight_per_subscription() {
    let (_d, mut b, ps) = three_entries();
    let (_, reads) = input(&mut b, 1, flow_cmd(7, 1));
    assert_eq!(reads.len(), 1);
    // More permits while the read is in flight: no second read.
    let (frames, more) = input(&mut b, 1, flow_cmd(7, 10));
    assert!(frames.is_empty() && more.is_empty());
    assert_eq!(b.counters().cursor_reads, 1);
    assert!(b.complete_read(reads[0], T0));
    let (frames, next) = drain(&mut b);
    assert_eq!(delivered(&frames), vec![(1, ps[0])]);
    // Its completion issues the next read, for the rest.
    assert_eq!(next.len(), 1);
    assert!(b.complete_read(next[0], T0));
    let (frames, _) = drain(&mut b);
    assert_eq!(delivered(&frames), vec![(1, ps[1]), (1, ps[2])]);
    // A completion delivered twice is stale the second time.
    assert!(!b.complete_read(next[0], T0));
    assert_eq!(b.counters().stale_read_completions, 1);
}

#[test]
fn a_consumer_closed_while_its_read_is_in_flight_leaves_the_entries_to_the_others() {
    let (_d, mut b, ps) = three_entries();
    connect(&mut b, 2);
    subscribe(&mut b, 2, 8, "s", sub_type::SHARED, "b");
    let (_, reads) = input(&mut b, 1, flow_cmd(7, 10));
    assert_eq!(reads.len(), 1);
    let (frames, _) = input(&mut b, 1, close_cmd(7, 5));
    assert_eq!(frames, vec![(1, success(5))]);
    // Consumer 8 asks while the read is in flight: it waits for it.
    let (frames, more) = input(&mut b, 2, flow_cmd(8, 10));
    assert!(frames.is_empty() && more.is_empty());
    assert!(b.complete_read(reads[0], T0));
    let (frames, _) = drain(&mut b);
    assert_eq!(
        delivered(&frames),
        vec![(2, ps[0]), (2, ps[1]), (2, ps[2])],
        "the closed consumer's read goes to the consumer left, once, in order"
    );
    assert_eq!(b.counters().stale_read_completions, 0);
    assert_eq!(sub(&b, "s").replay_len(), 0);
}

#[test]
fn a_read_completing_with_no_consumer_waits_and_a_rewind_makes_it_stale() {
    let (_d, mut b, ps) = three_entries();
    let (_, reads) = input(&mut b, 1, flow_cmd(7, 10));
    input(&mut b, 1, close_cmd(7, 5));
    // The last consumer left: a new one is the first of the subscription,
    // which rewinds to the mark-delete (consumer_set.rs) and drops the read.
    subscribe(&mut b, 1, 9, "s", sub_type::SHARED, "c");
    assert!(!b.complete_read(reads[0], T0), "stale after the rewind");
    assert_eq!(b.counters().stale_read_completions, 1);
    let out = flow(&mut b, 1, 9, 10);
    let got: Vec<Position> = out
        .iter()
        .filter(|(_, f, _)| f.r#type == ty::MESSAGE)
        .map(|(_, f, _)| {
            let m = &f.message.as_ref().unwrap().message_id;
            Position::new(m.ledger_id as i64, m.entry_id as i64)
        })
        .collect();
    assert_eq!(got, ps, "the re-read delivers each entry once");
}

#[test]
fn a_completion_after_a_seek_is_stale_and_the_entries_are_read_again() {
    let (_d, mut b, ps) = three_entries();
    let (_, reads) = input(&mut b, 1, flow_cmd(7, 10));
    assert_eq!(reads.len(), 1);
    // A forward seek past ps[0] while the read (of ps[0..3]) is in flight.
    let seek = BrokerCommand {
        r#type: ty::SEEK,
        seek: Some(command::CommandSeek {
            consumer_id: 7,
            request_id: 6,
            message_id: Some(mid(ps[1], vec![])),
            message_publish_time: None,
        }),
        ..Default::default()
    };
    let (frames, _) = input(&mut b, 1, seek);
    assert!(frames.contains(&(1, success(6))), "{frames:?}");
    assert!(
        !b.complete_read(reads[0], T0),
        "the read of the positions before the reset is dropped"
    );
    let (frames, _) = drain(&mut b);
    assert!(delivered(&frames).is_empty(), "{frames:?}");
    assert_eq!(b.counters().stale_read_completions, 1);
    subscribe(&mut b, 1, 7, "s", sub_type::SHARED, "a");
    let out = flow(&mut b, 1, 7, 10);
    let got: Vec<Position> = out
        .iter()
        .filter(|(_, f, _)| f.r#type == ty::MESSAGE)
        .map(|(_, f, _)| {
            let m = &f.message.as_ref().unwrap().message_id;
            Position::new(m.ledger_id as i64, m.entry_id as i64)
        })
        .collect();
    assert_eq!(got, ps[1..].to_vec(), "read again from the seek's position");
}

#[test]
fn a_completion_after_an_unsubscribe_is_stale() {
    let (_d, mut b, _ps) = three_entries();
    let (_, reads) = input(&mut b, 1, flow_cmd(7, 10));
    let unsubscribe = BrokerCommand {
        r#type: ty::UNSUBSCRIBE,
        unsubscribe: Some(command::CommandIdRequest {
            id: 7,
            request_id: 8,
        }),
        ..Default::default()
    };
    let (frames, _) = input(&mut b, 1, unsubscribe);
    assert_eq!(frames, vec![(1, success(8))]);
    assert!(!b.complete_read(reads[0], T0));
    assert!(drain(&mut b).0.is_empty());
    assert_eq!(b.counters().stale_read_completions, 1);
}

#[test]
fn a_completion_for_another_core_is_stale() {
    let (_d, mut b, _ps) = three_entries();
    // A read id this core never issued (a driver's event for a core it
    // replaced after a crash, were it not dropped there).
    assert!(!b.complete_read(1_000, T0));
    assert_eq!(b.counters().stale_read_completions, 1);
    assert!(drain(&mut b).0.is_empty());
}
