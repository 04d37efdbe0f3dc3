//! Swarm seeds whose runs the node engine misjudged, each a workload file
//! with the seed it runs with.
//!
//! - tests/workloads/node_first_subscribe_lost_in_crash.toml, seed 2446:
//!   the crashes fall on the first SUBSCRIBEs, so for ~150 ms no
//!   subscription exists and consumed-ledger trimming deletes ledger 1
//!   (Pulsar trims a ledger no durable cursor holds). Each subscription's
//!   first creation is judged as a re-creation after an unsubscribe is:
//!   at its initial position (the first kept ledger) when it reaches its
//!   client, or from the recovered store when a crash lost its turn; what
//!   was published before it existed is not owed to it. Judged as existing
//!   from the start, the checker counted ledger 1's 200 messages on each
//!   subscription as never acknowledged (400 lost, a livelock).
//! - tests/workloads/node_delayed_late_behind_rewind_backlog.toml, seed
//!   1641 (the shape of swarm seed 1629): the one consumer's connection closes on the faulty broker's
//!   invalid P every few hundred deliveries; each close empties the
//!   consumer set, the core rewinds to the mark-delete and re-reads in
//!   position order, and due delayed messages the tracker already
//!   dispatched wait behind that backlog for longer than the late bound.
//!   The late rule charges a delayed message only once the dispatch passed
//!   it (its negative control: the checker unit test
//!   `a_late_delayed_message_is_a_violation_only_once_the_dispatch_passed_it`).
//! - tests/workloads/node_seek_crash_lost_turn.toml, seed 10: a SEEK the
//!   core applied dies with its turn (cut before its barrier made it
//!   durable); it is judged from the recovered store, as a SEEK the core
//!   died on is, and here it did not happen.
//! - tests/workloads/node_dup_copy_trimmed_after_unsubscribe.toml, seed
//!   3525: a crash after the fsync loses the receipt of a durably appended
//!   send; its retry is answered as a duplicate, then the subscription is
//!   unsubscribed, the ledger holding the copy trimmed and the re-created
//!   subscription starts after it, so no one delivers the copy. The answer
//!   is judged against the store (`sim/node/dup_copy.rs`: the copy is
//!   published at its stored position when the answer arrives); judged by
//!   deliveries alone it read "answered as a duplicate, no copy ever
//!   receipted or delivered".
//! - tests/workloads/node_dup_copy_delayed_key_shared.toml, seed 3754:
//!   Key_Shared with delayed messages and two clean restarts; a send
//!   answered as a duplicate whose copy the application never saw kept the
//!   run waiting for that copy with nothing scheduled (a stall). Settled by
//!   the copy the store holds, as above.
//! - tests/workloads/node_txn_buffer_snapshot_ledger_trimmed.toml, seed
//!   649: consumed-ledger trimming must keep the ledger of
//!   `__transaction_buffer_snapshot` that holds a topic's latest
//!   transaction buffer snapshot (here 1:19; `broker/lifecycle.rs` holds
//!   the smallest indexed snapshot); deleted, the next recovery of that
//!   topic fails with non-recoverable data at 1:19 forever and one
//!   transactional send is never published.
//! - tests/workloads/node_dup_copy_chunked.toml, seed 832: a duplicate
//!   answer for a chunked message whose receipt a crash lost stands for
//!   the stored last chunk; the retry's earlier chunks, stored again, are
//!   not copies of the message (taken for one, the run reads "stored
//!   twice").
#![cfg(not(any(loom, feature = "shuttle")))]

#[path = "common/sim_run.rs"]
mod sim_run;
use sim_run::{assert_clean, run_seed, workload_file};

#[test]
fn a_subscription_whose_first_creation_a_crash_lost_is_owed_only_what_follows_its_creation() {
    let w = workload_file("node_first_subscribe_lost_in_crash.toml");
    let r = run_seed(&w, 2446);
    assert_clean(&r, "seed 2446");
    let n = r.activity.node.as_ref().expect("node activity");
    // The case is reached: both subscriptions created after ledger 1 was
    // trimmed, its messages not owed to them; the rest delivered.
    assert_eq!(n.creations.created, 2, "{:?}", n.creations);
    assert!(n.creations.skipped_before_creation > 0, "{:?}", n.creations);
    assert!(n.crash_points > 0);
    assert!(r.counts.acked > 0);
}

#[test]
fn due_delayed_messages_behind_a_rewind_backlog_are_not_late() {
    let w = workload_file("node_delayed_late_behind_rewind_backlog.toml");
    let r = run_seed(&w, 1641);
    assert_clean(&r, "seed 1641");
    // The case is reached: delayed messages first delivered more than the
    // late bound after they were due (a violation by the clock alone).
    assert!(r.counts.late_behind_backlog > 0, "{r}");
    assert!(r.activity.invalid_permit_closes > 0, "{r}");
}

#[test]
fn a_seek_applied_in_a_turn_a_crash_cut_is_judged_from_the_recovered_store() {
    let w = workload_file("node_seek_crash_lost_turn.toml");
    let r = run_seed(&w, 10);
    assert_clean(&r, "seed 10");
    let n = r.activity.node.as_ref().expect("node activity");
    // The case is reached: a reset applied in memory, not in the store.
    assert!(n.seeks_lost_in_crash > 0, "{n:?}");
    assert!(n.seeks_applied > 0, "{n:?}");
}

#[test]
fn a_duplicate_answer_is_judged_by_the_copy_the_store_holds() {
    let w = workload_file("node_dup_copy_trimmed_after_unsubscribe.toml");
    let r = run_seed(&w, 3525);
    assert_clean(&r, "seed 3525");
    let n = r.activity.node.as_ref().expect("node activity");
    // The case is reached: duplicates answered, their copies found in the
    // store, a ledger trimmed after an unsubscribe.
    assert!(n.dup_copies_in_store > 0, "{n:?}");
    assert!(n.ledgers_deleted > 0, "{n:?}");
    assert!(n.crashes_after_sync > 0, "{n:?}");
}

#[test]
fn a_duplicate_answer_whose_copy_the_store_holds_settles_the_run() {
    let w = workload_file("node_dup_copy_delayed_key_shared.toml");
    let r = run_seed(&w, 3754);
    assert_clean(&r, "seed 3754");
    let n = r.activity.node.as_ref().expect("node activity");
    // The case is reached: sends answered as duplicates after clean
    // restarts, their copies found in the store.
    assert!(n.dup_copies_in_store > 0, "{n:?}");
    assert!(n.clean_restarts > 0, "{n:?}");
}

#[test]
fn a_transaction_buffer_snapshot_survives_consumed_ledger_trimming() {
    let w = workload_file("node_txn_buffer_snapshot_ledger_trimmed.toml");
    let r = run_seed(&w, 649);
    assert_clean(&r, "seed 649");
    assert!(r.activity.txn_commits > 0, "{r}");
}

#[test]
fn a_duplicate_answer_for_a_chunked_message_stands_for_its_stored_last_chunk() {
    let w = workload_file("node_dup_copy_chunked.toml");
    let r = run_seed(&w, 832);
    assert_clean(&r, "seed 832");
    let n = r.activity.node.as_ref().expect("node activity");
    // The case is reached: a crash lost a receipt and the retry was
    // answered as a duplicate (the copy is already known from its delivery,
    // so it is not counted as found only in the store).
    assert!(n.lost_receipt_copies > 0, "{n:?}");
    assert!(n.deduplicated_messages > 0, "{n:?}");
}
