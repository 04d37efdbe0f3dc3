//! Batch-index deletion state: partial acks AND into the stored ack set
//! (set bit = index still unacknowledged, the pending-ack `ack_set`
//! convention), the entry is deleted whole when none is left, the filter
//! hands out the remaining set, and the state survives a restart through
//! `ManagedCursor` on redb and through Pulsar's `PositionInfo`.
#![cfg(not(any(loom, feature = "shuttle")))]

use std::sync::Arc;

use pulsar_core::deletion::position_info::{
    decode_position_info, encode_position_info, PulsarForm,
};
use pulsar_core::deletion::{BatchAckOutcome, CursorDeletionState, LedgerLayout};
use pulsar_core::ledger::{LedgerConfig, ManagedLedger, RedbStore};

mod common;
use common::p;

#[test]
fn partial_acks_accumulate_and_the_last_one_deletes_the_entry() {
    let layout = LedgerLayout::new([(1, 10)]);
    let state = CursorDeletionState::new(p(1, -1)).unwrap();
    // Batch of 3 at 1:3: index 1 acked → indexes 0 and 2 remain (0b101).
    assert_eq!(
        state
            .delete_batch_indexes(p(1, 3), &[0b101], &layout)
            .unwrap(),
        BatchAckOutcome::Partial(vec![0b101])
    );
    assert!(!state.is_message_deleted(p(1, 3)));
    // Index 0 acked by a later request whose set still has 1 cleared.
    assert_eq!(
        state
            .delete_batch_indexes(p(1, 3), &[0b100], &layout)
            .unwrap(),
        BatchAckOutcome::Partial(vec![0b100])
    );
    // An ack set that re-sets index 0 cannot un-acknowledge it.
    assert_eq!(
        state
            .delete_batch_indexes(p(1, 3), &[0b111], &layout)
            .unwrap(),
        BatchAckOutcome::Partial(vec![0b100])
    );
    let kept = state.filter_read_entries_with_ack_sets(vec![p(1, 2), p(1, 3)], |x| *x);
    assert_eq!(kept, vec![(p(1, 2), None), (p(1, 3), Some(vec![0b100]))]);
    assert_eq!(
        state
            .delete_batch_indexes(p(1, 3), &[0b011], &layout)
            .unwrap(),
        BatchAckOutcome::EntryDeleted(p(1, -1))
    );
    assert!(state.is_message_deleted(p(1, 3)));
    assert_eq!(state.batch_ack_set(p(1, 3)), None);
    assert_eq!(
        state
            .delete_batch_indexes(p(1, 3), &[0b1], &layout)
            .unwrap(),
        BatchAckOutcome::AlreadyDeleted
    );
    assert!(state
        .filter_read_entries_with_ack_sets(vec![p(1, 3)], |x| *x)
        .is_empty());
}

/// The last confirmed entry itself takes batch acks; one past it is a
/// typed error.
#[test]
fn batch_acks_reach_the_last_confirmed_entry() {
    let layout = LedgerLayout::new([(1, 4)]);
    let state = CursorDeletionState::new(p(1, -1)).unwrap();
    assert_eq!(
        state
            .delete_batch_indexes(p(1, 3), &[0b1, 0], &layout)
            .unwrap(),
        BatchAckOutcome::Partial(vec![0b1])
    );
    assert!(state
        .delete_batch_indexes(p(1, 4), &[0b1], &layout)
        .is_err());
    assert_eq!(state.batch_entry_count(), 1);
}

#[test]
fn whole_entry_acks_mark_delete_and_reset_drop_batch_state() {
    let layout = LedgerLayout::new([(1, 10)]);
    let state = CursorDeletionState::new(p(1, -1)).unwrap();
    for e in [2, 4, 6] {
        state
            .delete_batch_indexes(p(1, e), &[0b10], &layout)
            .unwrap();
    }
    state.delete(&[p(1, 2)], &layout).unwrap();
    assert_eq!(state.batch_ack_set(p(1, 2)), None);
    state.mark_delete(p(1, 4), &layout).unwrap();
    assert_eq!(state.batch_ack_set(p(1, 4)), None);
    assert_eq!(state.batch_ack_set(p(1, 6)), Some(vec![0b10]));
    state.reset(p(1, 0), &layout).unwrap();
    assert_eq!(state.batch_entry_count(), 0);
    // Beyond the last confirmed entry: typed error, unchanged.
    assert!(state.delete_batch_indexes(p(1, 10), &[1], &layout).is_err());
    assert_eq!(state.batch_entry_count(), 0);
}

#[test]
fn batch_ack_sets_survive_a_restart_and_pulsars_encoding() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("b.redb");
    let want = {
        let store = Arc::new(RedbStore::open(&path).unwrap());
        let ml = ManagedLedger::open("t", LedgerConfig::default(), store).unwrap();
        ml.append_batch(&[b"x".as_slice(); 20]).unwrap();
        let cursor = ml.open_cursor("c").unwrap();
        let state = CursorDeletionState::new(cursor.mark_delete_position()).unwrap();
        state.delete(&[p(1, 0), p(1, 5)], &*ml).unwrap();
        state
            .delete_batch_indexes(p(1, 7), &[-1, 0b1], &*ml)
            .unwrap();
        cursor.persist_deletion_state(&state, &[]).unwrap();
        state.snapshot()
    };
    let store = Arc::new(RedbStore::open(&path).unwrap());
    let ml = ManagedLedger::open("t", LedgerConfig::default(), store).unwrap();
    let cursor = ml.open_cursor("c").unwrap();
    let state = cursor.recover_deletion_state().unwrap();
    assert_eq!(state.snapshot(), want);
    assert_eq!(state.batch_ack_set(p(1, 7)), Some(vec![-1, 0b1]));
    for form in [
        PulsarForm::PULSAR_DEFAULT_RANGES,
        PulsarForm::PULSAR_DEFAULT_LONG_ARRAY,
    ] {
        let bytes = encode_position_info(&want, form, &[]).unwrap();
        let back = decode_position_info(&bytes).unwrap().snapshot;
        assert_eq!(
            CursorDeletionState::from_snapshot(back).unwrap().snapshot(),
            want
        );
    }
}
