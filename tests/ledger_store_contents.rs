//! [`RedbStore`]'s per-cursor property listing and its read-only view of a
//! store file: `cursor_properties` returns exactly one cursor's
//! properties (never a neighbour's in the same or another managed ledger),
//! and `read_only_contents` reports a store table of the wrong type as a
//! typed error instead of skipping it (only a table that does not exist is
//! read as empty); and a cursor's deletion state persisted through either
//! store ([`MemoryStore`] keeps it for the life of the process) is what a
//! reopened managed ledger on the same store recovers, and what the
//! read-only view (`pulsar-core inspect` / `verify`) reports as the
//! cursor's individually deleted ranges.
#![cfg(not(any(loom, feature = "shuttle")))]

use std::sync::Arc;

use pulsar_core::deletion::CursorDeletionState;
use pulsar_core::ledger::{
    LedgerConfig, LedgerStore, ManagedLedger, MemoryStore, RedbStore, StoreError,
};
use pulsar_core::Position;
use redb::TableDefinition;

#[test]
fn cursor_properties_lists_only_the_named_cursor_of_the_named_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let store = RedbStore::open(dir.path().join("store.redb")).unwrap();
    for (ledger, cursor, key, value) in [
        ("a", "c", "k", 1),
        ("a", "c1", "k", 2),
        ("a", "c1", "m", 3),
        ("a", "c2", "k", 4),
        ("b", "c1", "k", 5),
        ("a0", "c1", "k", 6),
    ] {
        store
            .set_cursor_property(ledger, cursor, key, Some(value))
            .unwrap();
    }
    let props = |l: &str, c: &str| -> Vec<(String, i64)> {
        store.cursor_properties(l, c).unwrap().into_iter().collect()
    };
    assert_eq!(
        props("a", "c1"),
        vec![("k".to_string(), 2), ("m".to_string(), 3)]
    );
    assert_eq!(props("a", "c"), vec![("k".to_string(), 1)]);
    assert_eq!(props("a", "c2"), vec![("k".to_string(), 4)]);
    assert_eq!(props("b", "c1"), vec![("k".to_string(), 5)]);
    assert_eq!(props("b", "c2"), vec![]);
    assert_eq!(props("a", "c3"), vec![]);
}

/// The store's table names (`ml_*`), each created with a type the store
/// does not use.
const STORE_TABLES: [&str; 6] = [
    "ml_ledgers",
    "ml_entries",
    "ml_cursor_mark_delete",
    "ml_cursor_individually_deleted",
    "ml_cursor_deletion_chunks",
    "ml_cursor_properties",
];

#[test]
fn a_store_table_of_another_type_is_a_backend_error_in_the_read_only_view() {
    for name in STORE_TABLES {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.redb");
        {
            let db = redb::Database::create(&path).unwrap();
            let txn = db.begin_write().unwrap();
            {
                let mut t = txn
                    .open_table(TableDefinition::<u64, u64>::new(name))
                    .unwrap();
                t.insert(1, 2).unwrap();
            }
            txn.commit().unwrap();
        }
        match RedbStore::read_only_contents(&path, &|_| true) {
            Err(StoreError::Backend(msg)) => assert!(!msg.is_empty(), "{name}"),
            Err(other) => panic!("{name}: expected a backend error, got {other}"),
            Ok((contents, _)) => panic!("{name}: a mistyped table was read as {contents:?}"),
        }
    }
}

#[test]
fn a_redb_file_without_store_tables_reads_as_empty() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    {
        let db = redb::Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut t = txn
                .open_table(TableDefinition::<u64, u64>::new("someone_elses"))
                .unwrap();
            t.insert(1, 2).unwrap();
        }
        txn.commit().unwrap();
    }
    let (contents, _db) = RedbStore::read_only_contents(&path, &|_| true).unwrap();
    assert!(contents.ledgers.is_empty());
    assert!(contents.cursors.is_empty());
    assert!(contents.entries.is_empty());
    assert!(contents.entry_stats.is_empty());
}

#[test]
fn a_persisted_deletion_state_is_recovered_by_a_reopened_ledger_on_either_store() {
    let dir = tempfile::tempdir().unwrap();
    let stores: [Arc<dyn LedgerStore>; 2] = [
        Arc::new(MemoryStore::new()),
        Arc::new(RedbStore::open(dir.path().join("store.redb")).unwrap()),
    ];
    let cfg = || LedgerConfig {
        max_entries_per_ledger: 8,
        auto_skip_non_recoverable_data: false,
    };
    for store in stores {
        let snapshot = {
            let ml = ManagedLedger::open("topic", cfg(), store.clone()).unwrap();
            let payloads: Vec<&[u8]> = vec![b"m"; 20];
            ml.append_batch(&payloads).unwrap();
            let cursor = ml.open_cursor("sub").unwrap();
            let state = CursorDeletionState::new(cursor.mark_delete_position()).unwrap();
            let acked: Vec<Position> = ml
                .ledgers()
                .iter()
                .flat_map(|(l, n)| (0..*n).map(move |e| Position::new(*l, e)))
                .enumerate()
                .filter(|(i, _)| *i < 3 || i % 3 == 0)
                .map(|(_, p)| p)
                .collect();
            state.delete(&acked, &*ml).unwrap();
            cursor
                .persist_deletion_state(&state, &[("bucket", Some(7))])
                .unwrap();
            state.snapshot()
        };
        assert!(snapshot.deleted_entries() > 0, "{snapshot:?}");
        let ml = ManagedLedger::open("topic", cfg(), store.clone()).unwrap();
        let cursor = ml.open_cursor("sub").unwrap();
        assert_eq!(cursor.mark_delete_position(), snapshot.mark_delete);
        assert_eq!(cursor.properties().unwrap()["bucket"], 7);
        assert_eq!(
            cursor.recover_deletion_state().unwrap().snapshot(),
            snapshot
        );
    }
}

#[test]
fn list_cursors_names_exactly_the_cursors_persisted_for_the_ledger_on_either_store() {
    let dir = tempfile::tempdir().unwrap();
    let stores: [Arc<dyn LedgerStore>; 2] = [
        Arc::new(MemoryStore::new()),
        Arc::new(RedbStore::open(dir.path().join("store.redb")).unwrap()),
    ];
    let cfg = || LedgerConfig {
        max_entries_per_ledger: 8,
        auto_skip_non_recoverable_data: false,
    };
    for store in stores {
        assert_eq!(store.list_cursors("topic").unwrap(), Vec::<String>::new());
        let topic = ManagedLedger::open("topic", cfg(), store.clone()).unwrap();
        let other = ManagedLedger::open("topic-2", cfg(), store.clone()).unwrap();
        topic.append(b"m").unwrap();
        other.append(b"m").unwrap();
        for (ml, name) in [(&topic, "sub-b"), (&topic, "sub-a"), (&other, "sub-c")] {
            let c = ml.open_cursor(name).unwrap();
            c.mark_delete(Position::new(1, 0)).unwrap();
        }
        assert_eq!(store.list_cursors("topic").unwrap(), vec!["sub-a", "sub-b"]);
        assert_eq!(store.list_cursors("topic-2").unwrap(), vec!["sub-c"]);
        assert_eq!(store.list_cursors("topic-3").unwrap(), Vec::<String>::new());
    }
}

#[test]
fn the_read_only_view_reports_the_ranges_of_a_compact_deletion_state() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let want = {
        let store = Arc::new(RedbStore::open(&path).unwrap());
        let ml = ManagedLedger::open("topic", LedgerConfig::default(), store).unwrap();
        ml.append_batch(&[b"m".as_slice(); 12]).unwrap();
        let cursor = ml.open_cursor("sub").unwrap();
        // The legacy record first, then the compact one replaces it.
        cursor
            .mark_delete_with_ranges(
                Position::new(1, -1),
                vec![(Position::new(1, 8), Position::new(1, 9))],
            )
            .unwrap();
        let state = CursorDeletionState::new(cursor.mark_delete_position()).unwrap();
        let acked = [0, 1, 3, 4, 5, 10].map(|e| Position::new(1, e));
        state.delete(&acked, &*ml).unwrap();
        cursor
            .persist_deletion_state_chunked(&state, &[], 8)
            .unwrap();
        (
            state.mark_delete_position(),
            state.individually_deleted_ranges(),
        )
    };
    assert_eq!(
        want.1,
        vec![
            (Position::new(1, 2), Position::new(1, 5)),
            (Position::new(1, 9), Position::new(1, 10)),
        ]
    );
    let (contents, db) = RedbStore::read_only_contents(&path, &|_| true).unwrap();
    let cursor = &contents.cursors[&("topic".to_string(), "sub".to_string())];
    assert_eq!(cursor.mark_delete, want.0);
    assert_eq!(cursor.individually_deleted, want.1);
    drop(db);
    // A damaged compact record is a typed error, not an empty range list.
    {
        let store = RedbStore::open(&path).unwrap();
        let mut chunks = store.load_deletion_state("topic", "sub").unwrap().unwrap();
        chunks[1][0] ^= 0x40;
        store
            .save_deletion_state("topic", "sub", want.0, &chunks, &[])
            .unwrap();
    }
    assert!(matches!(
        RedbStore::read_only_contents(&path, &|_| true),
        Err(StoreError::Corrupt(_))
    ));
}
