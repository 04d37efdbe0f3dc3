//! The ledger paths of seek, unsubscribe and readers: a reset deletion
//! state is persisted in one write whether the mark-delete moves backward
//! or forward and is what a reopened cursor recovers; a non-durable cursor
//! writes nothing to the store; a deleted cursor is gone from the store
//! (every record of it) and no longer holds ledgers against trimming. Both
//! stores.
#![cfg(not(any(loom, feature = "shuttle")))]

use std::sync::Arc;

use pulsar_core::deletion::CursorDeletionState;
use pulsar_core::ledger::{
    LedgerConfig, LedgerStore, ManagedLedger, MemoryStore, RedbStore, RetentionPolicy,
};
use pulsar_core::Position;

fn cfg() -> LedgerConfig {
    LedgerConfig {
        max_entries_per_ledger: 3,
        auto_skip_non_recoverable_data: false,
    }
}

fn both(f: impl Fn(Arc<dyn LedgerStore>)) {
    f(Arc::new(MemoryStore::new()));
    let dir = tempfile::tempdir().unwrap();
    f(Arc::new(
        RedbStore::open(dir.path().join("s.redb")).unwrap(),
    ));
}

#[test]
fn a_reset_deletion_state_is_persisted_backward_and_recovered() {
    both(|store| {
        let ml = ManagedLedger::open("t", cfg(), Arc::clone(&store)).unwrap();
        let ps: Vec<Position> = (0..6u8).map(|i| ml.append(&[i]).unwrap()).collect();
        let c = ml.open_cursor("s").unwrap();
        let st = c.recover_deletion_state().unwrap();
        st.delete(&ps[..2], &*ml).unwrap();
        st.delete(&[ps[4]], &*ml).unwrap();
        c.persist_deletion_state(&st, &[]).unwrap();
        assert_eq!(c.mark_delete_position(), ps[1]);
        // Backward to ps[1] (mark-delete ps[0]): the plain persist refuses.
        st.reset(ps[1], &*ml).unwrap();
        assert!(c.persist_deletion_state(&st, &[]).is_err());
        c.persist_reset_deletion_state(&st).unwrap();
        assert_eq!(c.mark_delete_position(), ps[0]);
        assert_eq!(c.read_position(), ps[1]);
        let c2 = ml.open_cursor("s").unwrap();
        let back = c2.recover_deletion_state().unwrap();
        assert_eq!(back.mark_delete_position(), ps[0]);
        assert_eq!(
            back.individually_deleted_count(),
            0,
            "ps[4]'s range cleared"
        );
        // Forward.
        st.reset(ps[5], &*ml).unwrap();
        c.persist_reset_deletion_state(&st).unwrap();
        let c3 = ml.open_cursor("s").unwrap();
        assert_eq!(c3.mark_delete_position(), ps[4]);
    });
}

#[test]
fn a_non_durable_cursor_writes_nothing() {
    both(|store| {
        let ml = ManagedLedger::open("t", cfg(), Arc::clone(&store)).unwrap();
        let ps: Vec<Position> = (0..4u8).map(|i| ml.append(&[i]).unwrap()).collect();
        let c = ml.open_non_durable_cursor("r", Position::new(i64::MIN, -1));
        assert!(!c.is_durable());
        assert_eq!(c.read_position(), ps[0], "earliest: the first entry");
        assert_eq!(c.read_entries(10).unwrap().len(), 4);
        let st = CursorDeletionState::new(c.mark_delete_position()).unwrap();
        st.delete(&ps[..3], &*ml).unwrap();
        c.persist_deletion_state(&st, &[]).unwrap();
        c.set_property("k", 1).unwrap();
        c.mark_delete(ps[3]).unwrap();
        assert_eq!(c.mark_delete_position(), ps[3]);
        assert!(
            store.list_cursors("t").unwrap().is_empty(),
            "nothing persisted"
        );
        assert!(c.properties().unwrap().is_empty());
        // Latest: past the last entry.
        let l = ml.open_non_durable_cursor("r2", Position::new(i64::MAX, 0));
        assert_eq!(l.mark_delete_position(), ps[3]);
    });
}

#[test]
fn a_deleted_cursor_is_gone_and_no_longer_holds_ledgers() {
    both(|store| {
        let ml = ManagedLedger::open("t", cfg(), Arc::clone(&store)).unwrap();
        for i in 0..9u8 {
            ml.append(&[i]).unwrap();
        }
        let c = ml.open_cursor("s").unwrap();
        c.set_property("k", 7).unwrap();
        let st = c.recover_deletion_state().unwrap();
        st.delete(&[Position::new(1, 1)], &*ml).unwrap();
        c.persist_deletion_state(&st, &[]).unwrap();
        let none = RetentionPolicy {
            time_ms: 0,
            size_bytes: 0,
        };
        let kept = ml.trim_consumed_ledgers(0, none, None).unwrap();
        assert!(kept.deleted_ledgers.is_empty(), "the cursor holds ledger 1");
        store.delete_cursor("t", "s").unwrap();
        assert!(store.load_cursor("t", "s").unwrap().is_none());
        assert!(store.load_deletion_state("t", "s").unwrap().is_none());
        assert!(store.list_cursors("t").unwrap().is_empty());
        let out = ml.trim_consumed_ledgers(0, none, None).unwrap();
        assert_eq!(out.deleted_ledgers, vec![1, 2], "every closed ledger");
        // Re-created under the same name: new, no old properties.
        let c = ml.open_cursor("s").unwrap();
        assert!(c.properties().unwrap().is_empty());
        // Deleting an unknown cursor is no error.
        store.delete_cursor("t", "nope").unwrap();
    });
}
