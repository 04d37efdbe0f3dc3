//! Managed-ledger substrate: append/read/rollover/rewind/mark-delete, every
//! injected read-failure kind, lost ledgers with and without auto-skip, and
//! redb durability (close + reopen, and a process killed mid-batch).
#![cfg(not(any(loom, feature = "shuttle")))]

mod common;
use common::p;

use std::sync::Arc;

use pulsar_core::ledger::{
    LedgerConfig, LedgerError, LedgerStore, ManagedLedger, MemoryStore, ReadFailureKind, RedbStore,
};
use pulsar_core::Position;

fn cfg(max: u32) -> LedgerConfig {
    LedgerConfig {
        max_entries_per_ledger: max,
        auto_skip_non_recoverable_data: false,
    }
}

/// Runs `f` against both backends.
fn both(f: impl Fn(Arc<dyn LedgerStore>)) {
    f(Arc::new(MemoryStore::new()));
    let dir = tempfile::tempdir().unwrap();
    f(Arc::new(
        RedbStore::open(dir.path().join("store.redb")).unwrap(),
    ));
}

#[test]
fn append_rolls_over_and_reads_in_order() {
    both(|store| {
        let ml = ManagedLedger::open("t", cfg(3), store).unwrap();
        assert_eq!(ml.last_confirmed_entry(), p(1, -1));
        let payloads: Vec<Vec<u8>> = (0..7u8).map(|i| vec![i]).collect();
        let refs: Vec<&[u8]> = payloads.iter().map(|v| v.as_slice()).collect();
        let pos = ml.append_batch(&refs).unwrap();
        assert_eq!(
            pos,
            vec![
                p(1, 0),
                p(1, 1),
                p(1, 2),
                p(2, 0),
                p(2, 1),
                p(2, 2),
                p(3, 0)
            ]
        );
        assert_eq!(ml.append(b"x").unwrap(), p(3, 1));
        assert_eq!(ml.last_confirmed_entry(), p(3, 1));
        assert_eq!(ml.ledgers(), vec![(1, 3), (2, 3), (3, 2)]);

        let c = ml.open_cursor("sub").unwrap();
        assert_eq!(c.mark_delete_position(), p(1, -1));
        assert_eq!(c.read_position(), p(1, 0));
        assert!(c.has_more_entries());
        assert_eq!(c.number_of_entries_to_read(), 8);
        let first = c.read_entries(4).unwrap();
        assert_eq!(
            first.iter().map(|e| e.position).collect::<Vec<_>>(),
            vec![p(1, 0), p(1, 1), p(1, 2), p(2, 0)]
        );
        assert_eq!(first[3].data, vec![3]);
        assert_eq!(c.read_position(), p(2, 1));
        let rest = c.read_entries(100).unwrap();
        assert_eq!(rest.len(), 4);
        assert!(!c.has_more_entries());
        assert!(c.read_entries(10).unwrap().is_empty());
        assert_eq!(c.read_position(), p(3, 2));
    });
}

#[test]
fn mark_delete_rewind_and_reset() {
    both(|store| {
        let ml = ManagedLedger::open("t", cfg(2), store).unwrap();
        for i in 0..6u8 {
            ml.append(&[i]).unwrap();
        }
        let c = ml.open_cursor("sub").unwrap();
        c.read_entries(5).unwrap();
        assert_eq!(c.read_position(), p(3, 1));

        c.mark_delete(p(2, 0)).unwrap();
        assert_eq!(c.mark_delete_position(), p(2, 0));
        assert_eq!(c.read_position(), p(3, 1), "read position ahead stays");
        c.rewind();
        assert_eq!(c.read_position(), p(2, 1), "rewind = next(mark-delete)");

        // Mark-delete at the end of a ledger: next valid is in the next ledger.
        c.mark_delete(p(2, 1)).unwrap();
        c.rewind();
        assert_eq!(c.read_position(), p(3, 0));

        // Backward mark-delete is refused and changes nothing.
        let err = c.mark_delete(p(1, 1)).unwrap_err();
        assert!(
            matches!(err, LedgerError::MarkDeleteBackward { .. }),
            "{err}"
        );
        assert_eq!(c.mark_delete_position(), p(2, 1));

        // Beyond the last confirmed entry is refused.
        let err = c.mark_delete(p(3, 2)).unwrap_err();
        assert!(
            matches!(err, LedgerError::BeyondLastConfirmed { .. }),
            "{err}"
        );

        // Mark-delete past the read position pushes the read position forward.
        c.rewind();
        c.mark_delete(p(3, 0)).unwrap();
        assert_eq!(c.read_position(), p(3, 1));

        // Reset may move mark-delete backward.
        c.reset(p(1, 1)).unwrap();
        assert_eq!(c.mark_delete_position(), p(1, 0));
        assert_eq!(c.read_position(), p(1, 1));
        let e = c.read_entries(1).unwrap();
        assert_eq!(e[0].position, p(1, 1));
    });
}

#[test]
fn every_injected_failure_kind_is_its_typed_error_and_leaves_read_position() {
    both(|store| {
        let ml = ManagedLedger::open("t", cfg(10), store).unwrap();
        ml.append(b"a").unwrap();
        let c = ml.open_cursor("sub").unwrap();
        let cases = [
            ReadFailureKind::LedgerNotExist,
            ReadFailureKind::NonRecoverableData,
            ReadFailureKind::Fenced,
            ReadFailureKind::CursorAlreadyClosed,
            ReadFailureKind::StorageUnavailable,
            ReadFailureKind::TooManyRequests,
        ];
        for kind in cases {
            ml.faults().fail_next_reads(kind, 1);
            let err = c.read_entries(10).unwrap_err();
            assert_eq!(err.read_failure_kind(), Some(kind), "{err}");
            assert_eq!(
                err.is_non_recoverable(),
                matches!(
                    kind,
                    ReadFailureKind::LedgerNotExist | ReadFailureKind::NonRecoverableData
                )
            );
            assert_eq!(c.read_position(), p(1, 0));
        }
        // One-shot faults are consumed: the next read succeeds.
        assert_eq!(c.read_entries(10).unwrap().len(), 1);

        // A policy applies to every read until cleared.
        ml.faults()
            .set_policy(|req| (req.cursor == "sub").then_some(ReadFailureKind::TooManyRequests));
        c.rewind();
        assert_eq!(c.read_entries(1).unwrap_err(), LedgerError::TooManyRequests);
        assert_eq!(c.read_entries(1).unwrap_err(), LedgerError::TooManyRequests);
        ml.faults().clear();
        assert_eq!(c.read_entries(1).unwrap().len(), 1);
        assert!(
            c.read_entries(0).is_err(),
            "0 entries is an invalid argument"
        );
    });
}

#[test]
fn closed_cursor_and_fenced_ledger() {
    both(|store| {
        let ml = ManagedLedger::open("t", cfg(10), store).unwrap();
        ml.append(b"a").unwrap();
        let c = ml.open_cursor("sub").unwrap();
        c.close();
        assert!(matches!(
            c.read_entries(1),
            Err(LedgerError::CursorAlreadyClosed { .. })
        ));
        assert!(matches!(
            c.mark_delete(p(1, 0)),
            Err(LedgerError::CursorAlreadyClosed { .. })
        ));
        let c2 = ml.open_cursor("other").unwrap();
        ml.fence();
        assert!(matches!(
            c2.read_entries(1),
            Err(LedgerError::Fenced { .. })
        ));
        assert!(matches!(ml.append(b"b"), Err(LedgerError::Fenced { .. })));
    });
}

#[test]
fn lost_ledger_fails_reads_unless_auto_skip() {
    both(|store| {
        let ml = ManagedLedger::open("t", cfg(2), Arc::clone(&store)).unwrap();
        for i in 0..6u8 {
            ml.append(&[i]).unwrap();
        }
        ml.mark_ledger_lost(2).unwrap();
        let c = ml.open_cursor("sub").unwrap();
        // Entries before the lost ledger are returned; the failure shows on
        // the next read, and repeats (the read position never moves).
        assert_eq!(c.read_entries(10).unwrap().len(), 2);
        for _ in 0..3 {
            assert_eq!(
                c.read_entries(10).unwrap_err(),
                LedgerError::LedgerNotExist { ledger_id: 2 }
            );
            assert_eq!(c.read_position(), p(2, 0));
        }
        assert!(ml.mark_ledger_lost(99).is_err());

        // Same ledger list, auto-skip on: the lost ledger is skipped.
        let skip = ManagedLedger::open(
            "t",
            LedgerConfig {
                max_entries_per_ledger: 2,
                auto_skip_non_recoverable_data: true,
            },
            store,
        )
        .unwrap();
        let c = skip.open_cursor("sub2").unwrap();
        let got: Vec<_> = c
            .read_entries(10)
            .unwrap()
            .into_iter()
            .map(|e| e.position)
            .collect();
        assert_eq!(got, vec![p(1, 0), p(1, 1), p(3, 0), p(3, 1)]);
    });
}

#[test]
fn properties_are_persisted_and_independent_of_mark_delete() {
    both(|store| {
        let ml = ManagedLedger::open("t", cfg(10), store).unwrap();
        ml.append(b"a").unwrap();
        let c = ml.open_cursor("sub").unwrap();
        c.set_property("#pulsar.internal.delayed.bucket_1_2", 42)
            .unwrap();
        c.set_property("k", -7).unwrap();
        c.mark_delete(p(1, 0)).unwrap();
        let props = c.properties().unwrap();
        assert_eq!(props.get("k"), Some(&-7));
        assert_eq!(props.get("#pulsar.internal.delayed.bucket_1_2"), Some(&42));
        c.remove_property("k").unwrap();
        assert_eq!(c.properties().unwrap().len(), 1);
    });
}

#[test]
fn invalid_configuration_is_a_typed_error() {
    let store: Arc<dyn LedgerStore> = Arc::new(MemoryStore::new());
    assert!(matches!(
        ManagedLedger::open("t", cfg(0), Arc::clone(&store)),
        Err(LedgerError::InvalidArgument(_))
    ));
    assert!(matches!(
        ManagedLedger::open("", cfg(1), Arc::clone(&store)),
        Err(LedgerError::InvalidArgument(_))
    ));
    let ml = ManagedLedger::open("t", cfg(1), store).unwrap();
    assert!(matches!(
        ml.open_cursor(""),
        Err(LedgerError::InvalidArgument(_))
    ));
}

#[test]
fn redb_state_survives_close_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    {
        let store: Arc<dyn LedgerStore> = Arc::new(RedbStore::open(&path).unwrap());
        let ml = ManagedLedger::open("topic", cfg(3), Arc::clone(&store)).unwrap();
        for i in 0..8u8 {
            ml.append(&[i; 16]).unwrap();
        }
        ml.mark_ledger_lost(1).unwrap();
        let c = ml.open_cursor("sub").unwrap();
        c.mark_delete_with_ranges(p(2, 0), vec![(p(2, 1), p(2, 2)), (p(3, 0), p(3, 1))])
            .unwrap();
        c.set_property("bucket", 9).unwrap();
    }
    let store: Arc<dyn LedgerStore> = Arc::new(RedbStore::open(&path).unwrap());
    let ml = ManagedLedger::open("topic", cfg(3), store).unwrap();
    assert_eq!(ml.ledgers(), vec![(1, 3), (2, 3), (3, 2)]);
    assert_eq!(ml.last_confirmed_entry(), p(3, 1));
    let c = ml.open_cursor("sub").unwrap();
    assert_eq!(c.mark_delete_position(), p(2, 0));
    assert_eq!(
        c.individually_deleted_ranges(),
        vec![(p(2, 1), p(2, 2)), (p(3, 0), p(3, 1))]
    );
    assert_eq!(c.properties().unwrap().get("bucket"), Some(&9));
    let e = c.read_entries(10).unwrap();
    assert_eq!(e.len(), 4);
    assert_eq!(e[0].position, p(2, 1));
    assert_eq!(e[0].data, vec![4u8; 16]);
    // The lost ledger is still known to be lost.
    c.reset(p(1, 0)).unwrap();
    assert_eq!(
        c.read_entries(1).unwrap_err(),
        LedgerError::LedgerNotExist { ledger_id: 1 }
    );
    // Appends continue after the recovered last entry.
    assert_eq!(ml.append(b"z").unwrap(), p(3, 2));
}

#[test]
fn redb_open_in_unwritable_location_is_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let err = RedbStore::open(file.join("store.redb")).unwrap_err();
    assert!(err.to_string().contains("embedded store error"), "{err}");
}

const KILL_CHILD_ENV: &str = "PULSAR_CORE_LEDGER_KILL_CHILD";
const BATCH: usize = 37;

/// Child half of `redb_batches_are_whole_after_kill`: appends batches of
/// `BATCH` entries forever (each payload names its batch) until killed.
#[test]
fn redb_kill_child() {
    let Ok(path) = std::env::var(KILL_CHILD_ENV) else {
        return; // only meaningful when spawned by the parent test
    };
    let store: Arc<dyn LedgerStore> = Arc::new(RedbStore::open(&path).unwrap());
    let ml = ManagedLedger::open("topic", cfg(1000), store).unwrap();
    for batch in 0u64.. {
        let payloads: Vec<Vec<u8>> = (0..BATCH as u64)
            .map(|i| [batch.to_le_bytes(), i.to_le_bytes()].concat())
            .collect();
        let refs: Vec<&[u8]> = payloads.iter().map(|v| v.as_slice()).collect();
        ml.append_batch(&refs).unwrap();
        if batch == 0 {
            std::fs::write(format!("{path}.started"), b"1").unwrap();
        }
    }
}

/// A process killed (SIGKILL) in the middle of appending batches leaves, after
/// reopening, only whole batches: never a torn batch or entry.
#[test]
fn redb_batches_are_whole_after_kill() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let exe = std::env::current_exe().unwrap();
    for round in 0..3 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.redb");
        let path_s = path.to_str().unwrap().to_string();
        let mut child = std::process::Command::new(&exe)
            .args([
                "--exact",
                "redb_kill_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(KILL_CHILD_ENV, &path_s)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let started = format!("{path_s}.started");
        let t0 = std::time::Instant::now();
        while !std::path::Path::new(&started).exists() {
            assert!(t0.elapsed().as_secs() < 60, "child never started");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        std::thread::sleep(std::time::Duration::from_millis(rng.random_range(20..200)));
        child.kill().unwrap();
        child.wait().unwrap();

        let store: Arc<dyn LedgerStore> = Arc::new(RedbStore::open(&path).unwrap());
        let ml = ManagedLedger::open("topic", cfg(1000), store).unwrap();
        let c = ml.open_cursor("check").unwrap();
        let mut entries = Vec::new();
        loop {
            let got = c.read_entries(500).unwrap();
            if got.is_empty() {
                break;
            }
            entries.extend(got);
        }
        assert!(!entries.is_empty(), "round {round}: nothing persisted");
        assert_eq!(
            entries.len() % BATCH,
            0,
            "round {round}: {} entries is not a whole number of batches",
            entries.len()
        );
        for (n, e) in entries.iter().enumerate() {
            let batch = u64::from_le_bytes(e.data[..8].try_into().unwrap());
            let idx = u64::from_le_bytes(e.data[8..16].try_into().unwrap());
            assert_eq!(
                (batch, idx),
                ((n / BATCH) as u64, (n % BATCH) as u64),
                "round {round}: entry {n} at {} out of order",
                e.position
            );
        }
    }
}

#[test]
fn read_with_skip_reads_first_non_skipped_run_and_jumps_skipped_windows() {
    both(|store| {
        let ml = ManagedLedger::open("t", cfg(10), store).unwrap();
        for i in 0..15u8 {
            ml.append(&[i]).unwrap();
        }
        let c = ml.open_cursor("sub").unwrap();
        // Skip 1:0..=1:2 and 1:5: the first run is 1:3..=1:4.
        let skip = |l: i64, e: i64| l == 1 && (e <= 2 || e == 5);
        let got: Vec<_> = c
            .read_entries_with_skip(8, skip)
            .unwrap()
            .into_iter()
            .map(|e| e.position)
            .collect();
        assert_eq!(got, vec![p(1, 3), p(1, 4)]);
        assert_eq!(c.read_position(), p(1, 5));
        // Next call: 1:5 skipped, run 1:6..=1:9 (window clipped at ledger end).
        let got: Vec<_> = c
            .read_entries_with_skip(8, skip)
            .unwrap()
            .into_iter()
            .map(|e| e.position)
            .collect();
        assert_eq!(got, vec![p(1, 6), p(1, 7), p(1, 8), p(1, 9)]);
        // A fully skipped ledger-2 window moves on to the end.
        let got = c.read_entries_with_skip(8, |l, _| l == 2).unwrap();
        assert!(got.is_empty());
        assert_eq!(c.read_position(), p(2, 5));
        assert!(!c.has_more_entries());
        // Nothing skipped = plain read.
        c.rewind();
        assert_eq!(c.read_entries_with_skip(3, |_, _| false).unwrap().len(), 3);
        assert!(c.read_entries_with_skip(0, |_, _| false).is_err());
    });
}

#[test]
fn read_positions_for_redelivery() {
    both(|store| {
        let ml = ManagedLedger::open("t", cfg(2), store).unwrap();
        for i in 0..4u8 {
            ml.append(&[i]).unwrap();
        }
        let got = ml.read_positions(&[p(2, 1), p(1, 0)]).unwrap();
        assert_eq!(got[0].data, vec![3]);
        assert_eq!(got[1].data, vec![0]);
        assert!(matches!(
            ml.read_positions(&[p(2, 2)]),
            Err(LedgerError::BeyondLastConfirmed { .. })
        ));
        assert!(matches!(
            ml.read_positions(&[p(1, 7)]),
            Err(LedgerError::NonRecoverableData { .. })
        ));
        ml.mark_ledger_lost(1).unwrap();
        assert_eq!(
            ml.read_positions(&[p(1, 1)]).unwrap_err(),
            LedgerError::LedgerNotExist { ledger_id: 1 }
        );
        ml.faults()
            .fail_next_reads(ReadFailureKind::StorageUnavailable, 1);
        assert!(matches!(
            ml.read_positions(&[p(2, 0)]),
            Err(LedgerError::StorageUnavailable { .. })
        ));
        assert_eq!(ml.read_positions(&[]).unwrap(), vec![]);
    });
}

#[test]
fn read_with_skip_failure_keeps_the_read_position_before_unread_entries() {
    both(|store| {
        let ml = ManagedLedger::open("t", cfg(3), store).unwrap();
        for i in 0..9u8 {
            ml.append(&[i]).unwrap();
        }
        ml.mark_ledger_lost(2).unwrap();
        let c = ml.open_cursor("sub").unwrap();
        // Ledger 1 entirely skipped, then ledger 2 is lost: the read position
        // may pass the skipped ledger but must not move into ledger 2.
        let err = c.read_entries_with_skip(10, |l, _| l == 1).unwrap_err();
        assert_eq!(err, LedgerError::LedgerNotExist { ledger_id: 2 });
        assert_eq!(c.read_position(), p(2, 0));
        // A skip of 2:0 must not carry the read position to 2:1 on failure.
        c.rewind();
        let err = c
            .read_entries_with_skip(10, |l, e| l == 1 || (l == 2 && e == 0))
            .unwrap_err();
        assert_eq!(err, LedgerError::LedgerNotExist { ledger_id: 2 });
        assert_eq!(c.read_position(), p(2, 0));
    });
}

/// Runs `f` on its own thread and fails the test (instead of hanging the
/// suite) if it does not return within `secs` seconds.
fn within<R: Send + 'static>(secs: u64, what: &str, f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(std::time::Duration::from_secs(secs)) {
        Ok(r) => r,
        Err(_) => panic!("{what}: no return after {secs} s (hang or deadlock)"),
    }
}

/// Entry id `i64::MAX` must not overflow: a position past a ledger's end
/// moves to the next ledger, or past the end when there is none.
#[test]
fn entry_id_i64_max_does_not_overflow() {
    both(|store| {
        let ml = ManagedLedger::open("t", cfg(10), store).unwrap();
        for i in 0..15u8 {
            ml.append(&[i]).unwrap();
        }
        // Ledger 1 holds 1:0..=1:9, ledger 2 holds 2:0..=2:4.
        assert_eq!(ml.next_valid_position(p(1, i64::MAX)), p(2, 0));
        assert_eq!(ml.next_valid_position(p(2, i64::MAX)), p(2, 5));
        assert_eq!(ml.next_valid_position(p(i64::MAX, i64::MAX)), p(2, 5));
        assert_eq!(ml.entries_after(p(1, i64::MAX)), 5);
        assert_eq!(ml.entries_after(p(2, i64::MAX)), 0);
        assert_eq!(ml.entries_after(p(1, i64::MIN)), 15);

        let c = ml.open_cursor("c").unwrap();
        // Reset past the end of ledger 1 = the first entry of ledger 2.
        c.reset(p(1, i64::MAX)).unwrap();
        assert_eq!(c.read_position(), p(2, 0));
        assert_eq!(c.mark_delete_position(), p(2, -1));
        // Reset past the end of the last ledger = past the end.
        c.reset(p(2, i64::MAX)).unwrap();
        assert_eq!(c.read_position(), p(2, 5));
        assert_eq!(c.mark_delete_position(), p(2, 4));
        assert_eq!(c.number_of_entries_to_read(), 0);
        // The locks were released (no panic while holding them).
        c.reset(p(1, 0)).unwrap();
        assert_eq!(c.read_entries(1).unwrap()[0].position, p(1, 0));

        // Mark-delete at an entry past its ledger's end (below the last
        // confirmed entry in position order) is a typed error, state unchanged.
        let err = c.mark_delete(p(1, i64::MAX)).unwrap_err();
        assert!(matches!(err, LedgerError::InvalidPosition { .. }), "{err}");
        assert_eq!(c.mark_delete_position(), p(1, -1));
        assert_eq!(c.read_position(), p(1, 1));
    });
}

/// Mark-delete validates the position (entry id >= -1, an existing
/// ledger, not beyond the last confirmed entry in any form) and the
/// individually deleted ranges; on error nothing changes.
#[test]
fn mark_delete_rejects_invalid_positions_and_ranges() {
    both(|store| {
        let ml = ManagedLedger::open("t", cfg(10), Arc::clone(&store)).unwrap();
        for i in 0..3u8 {
            ml.append(&[i]).unwrap();
        }
        let c = ml.open_cursor("c").unwrap();
        let unchanged = |c: &pulsar_core::ledger::ManagedCursor| {
            assert_eq!(c.mark_delete_position(), p(1, -1));
            assert_eq!(c.read_position(), p(1, 0));
            assert!(c.individually_deleted_ranges().is_empty());
        };
        // (1000, -1) > (1, 2) in position order: beyond the last confirmed.
        let err = c.mark_delete(p(1000, -1)).unwrap_err();
        assert!(
            matches!(err, LedgerError::BeyondLastConfirmed { .. }),
            "{err}"
        );
        unchanged(&c);
        let err = c.mark_delete(p(2, -7)).unwrap_err();
        assert!(matches!(err, LedgerError::InvalidPosition { .. }), "{err}");
        unchanged(&c);

        // Inverted and garbage ranges are refused.
        for ranges in [
            vec![(p(1, 1), p(1, 0))],
            vec![(p(1, 0), p(1, 0))],
            vec![(p(1, 0), p(-5, 99))],
            vec![(p(1, -3), p(1, 0))],
            vec![(p(1, 1), p(1, 5))],
            vec![(p(1, 0), p(1, 2)), (p(1, 1), p(1, 2))],
        ] {
            let err = c
                .mark_delete_with_ranges(p(1, -1), ranges.clone())
                .unwrap_err();
            assert!(
                matches!(err, LedgerError::InvalidDeletedRange { .. }),
                "{ranges:?}: {err}"
            );
            unchanged(&c);
        }
        // A range below the mark-delete position is refused.
        c.mark_delete(p(1, 0)).unwrap();
        let err = c
            .mark_delete_with_ranges(p(1, 0), vec![(p(1, -1), p(1, 0))])
            .unwrap_err();
        assert!(
            matches!(err, LedgerError::InvalidDeletedRange { .. }),
            "{err}"
        );
        assert!(c.individually_deleted_ranges().is_empty());
        // Valid ranges are stored and read back after reopen.
        c.mark_delete_with_ranges(p(1, 0), vec![(p(1, 1), p(1, 2))])
            .unwrap();
        assert_eq!(c.individually_deleted_ranges(), vec![(p(1, 1), p(1, 2))]);
        let again = ManagedLedger::open("t", cfg(10), Arc::clone(&store))
            .unwrap()
            .open_cursor("c")
            .unwrap();
        assert_eq!(
            again.individually_deleted_ranges(),
            vec![(p(1, 1), p(1, 2))]
        );

        // After a rollover: an entry id below -1 is refused; `(2, -1)` (just
        // before the first entry of an existing ledger) is accepted.
        for i in 0..10u8 {
            ml.append(&[i]).unwrap();
        }
        let err = c.mark_delete(p(2, -7)).unwrap_err();
        assert!(matches!(err, LedgerError::InvalidPosition { .. }), "{err}");
        assert_eq!(c.mark_delete_position(), p(1, 0));
        c.mark_delete(p(2, -1)).unwrap();
        assert_eq!(c.read_position(), p(2, 0));
    });
}

/// A huge `max_entries` means "as many as available".
#[test]
fn huge_max_entries_reads_everything_available() {
    both(|store| {
        let ml = ManagedLedger::open("t", cfg(10), store).unwrap();
        for i in 0..15u8 {
            ml.append(&[i]).unwrap();
        }
        let c = ml.open_cursor("c").unwrap();
        assert_eq!(c.read_entries(usize::MAX).unwrap().len(), 15);
        c.rewind();
        assert_eq!(c.read_entries(i64::MAX as usize).unwrap().len(), 15);
        c.rewind();
        // With skip, one call reads the first non-skipped run of the current
        // ledger (here all of ledger 1).
        assert_eq!(
            c.read_entries_with_skip(i64::MAX as usize + 1, |_, _| false)
                .unwrap()
                .len(),
            10
        );
        c.rewind();
        let c = Arc::new(c);
        let c2 = Arc::clone(&c);
        let n = within(10, "read_entries_with_skip(usize::MAX)", move || {
            c2.read_entries_with_skip(usize::MAX, |_, _| false)
                .unwrap()
                .len()
        });
        assert_eq!(n, 10);
        assert_eq!(c.read_position(), p(2, 0));
    });
}

/// A `ReadFaults` policy may call back into the cursor (no cursor lock is
/// held while it runs).
#[test]
fn fault_policy_may_call_back_into_the_cursor() {
    use std::sync::OnceLock;
    let ml = ManagedLedger::open("t", cfg(10), Arc::new(MemoryStore::new())).unwrap();
    for i in 0..3u8 {
        ml.append(&[i]).unwrap();
    }
    let cur: Arc<OnceLock<Arc<pulsar_core::ledger::ManagedCursor>>> = Arc::new(OnceLock::new());
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    {
        let cur = Arc::clone(&cur);
        let seen = Arc::clone(&seen);
        let ml2 = Arc::clone(&ml);
        ml.faults().set_policy(move |req| {
            let c = cur.get().expect("cursor set before the first read");
            let read = c.read_position();
            seen.lock()
                .unwrap()
                .push((req.from, read, ml2.last_confirmed_entry()));
            // Fail reads that start at 1:2.
            (read == Position::new(1, 2)).then_some(ReadFailureKind::TooManyRequests)
        });
    }
    let c = Arc::new(ml.open_cursor("c").unwrap());
    let _ = cur.set(Arc::clone(&c));
    let c2 = Arc::clone(&c);
    let (first, second) = within(
        10,
        "read_entries with a cursor-inspecting policy",
        move || {
            let a = c2.read_entries(2).map(|v| v.len());
            let b = c2.read_entries(2).map(|v| v.len());
            (a, b)
        },
    );
    assert_eq!(first, Ok(2));
    assert_eq!(second, Err(LedgerError::TooManyRequests));
    assert_eq!(c.read_position(), p(1, 2));
    let c3 = Arc::clone(&c);
    let skipped = within(10, "read_entries_with_skip with that policy", move || {
        c3.read_entries_with_skip(2, |_, _| false).map(|v| v.len())
    });
    assert_eq!(skipped, Err(LedgerError::TooManyRequests));
    assert_eq!(
        seen.lock().unwrap()[0],
        (p(1, 0), p(1, 0), p(1, 2)),
        "the policy sees the request and the live cursor"
    );
}

/// Marking the current ledger lost closes it: the next append rolls over
/// to a new ledger, and in-process reads agree with reads after a reopen.
#[test]
fn losing_the_current_ledger_rolls_over_and_survives_reopen() {
    let check = |ml: &Arc<ManagedLedger>| {
        assert_eq!(ml.ledgers(), vec![(1, 2), (2, 1)]);
        for pos in [p(1, 0), p(1, 1)] {
            assert_eq!(
                ml.read_positions(&[pos]).unwrap_err(),
                LedgerError::LedgerNotExist { ledger_id: 1 }
            );
        }
        assert_eq!(
            ml.read_positions(&[p(2, 0)]).unwrap()[0].data,
            b"c".to_vec()
        );
        assert_eq!(ml.last_confirmed_entry(), p(2, 0));
    };
    // In memory.
    let mem: Arc<dyn LedgerStore> = Arc::new(MemoryStore::new());
    let ml = ManagedLedger::open("t", cfg(10), Arc::clone(&mem)).unwrap();
    ml.append(b"a").unwrap();
    ml.append(b"b").unwrap();
    ml.mark_ledger_lost(1).unwrap();
    assert_eq!(ml.append(b"c").unwrap(), p(2, 0));
    check(&ml);
    check(&ManagedLedger::open("t", cfg(10), mem).unwrap());
    // Durable, across a reopen.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.redb");
    {
        let store: Arc<dyn LedgerStore> = Arc::new(RedbStore::open(&path).unwrap());
        let ml = ManagedLedger::open("t", cfg(10), store).unwrap();
        ml.append(b"a").unwrap();
        ml.append(b"b").unwrap();
        ml.mark_ledger_lost(1).unwrap();
        assert_eq!(ml.append(b"c").unwrap(), p(2, 0));
        check(&ml);
    }
    let store: Arc<dyn LedgerStore> = Arc::new(RedbStore::open(&path).unwrap());
    let ml = ManagedLedger::open("t", cfg(10), store).unwrap();
    check(&ml);
    let c = ml.open_cursor("c").unwrap();
    assert_eq!(
        c.read_entries(10).unwrap_err(),
        LedgerError::LedgerNotExist { ledger_id: 1 }
    );
}

/// An append planned for a caller's transaction (the broker's group
/// commit: the entries of two managed ledgers in one commit) is invisible
/// until applied after the commit, rolls over like `append_batch`, and a
/// plan the ledger moved past is refused with nothing changed.
#[test]
fn planned_appends_of_two_ledgers_share_one_commit_and_apply_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = RedbStore::open(dir.path().join("store.redb")).unwrap();
    let a = ManagedLedger::open("a", cfg(2), Arc::new(store.clone())).unwrap();
    let b = ManagedLedger::open("b", cfg(2), Arc::new(store.clone())).unwrap();
    let pa: Vec<&[u8]> = vec![b"1", b"2", b"3"];
    let pb: Vec<&[u8]> = vec![b"x"];
    let plan_a = a.plan_append(&pa).unwrap();
    let plan_b = b.plan_append(&pb).unwrap();
    let txn = store.begin().unwrap();
    RedbStore::append_in(&txn, a.name(), &plan_a.segments(&pa)).unwrap();
    RedbStore::append_in(&txn, b.name(), &plan_b.segments(&pb)).unwrap();
    txn.commit().unwrap();
    // Durable but not yet the ledger's: no cursor reads it.
    assert_eq!(a.last_confirmed_entry(), p(1, -1));
    assert_eq!(
        a.apply_append(&plan_a).unwrap(),
        vec![p(1, 0), p(1, 1), p(2, 0)]
    );
    assert_eq!(b.apply_append(&plan_b).unwrap(), vec![p(1, 0)]);
    let c = a.open_cursor("s").unwrap();
    let read: Vec<Vec<u8>> = c
        .read_entries(10)
        .unwrap()
        .into_iter()
        .map(|e| e.data)
        .collect();
    assert_eq!(read, vec![b"1".to_vec(), b"2".to_vec(), b"3".to_vec()]);
    // A stale plan (the ledger moved since) is refused; nothing changes.
    let stale = b.plan_append(&pb).unwrap();
    b.append(b"y").unwrap();
    assert!(matches!(
        b.apply_append(&stale),
        Err(LedgerError::InvalidArgument(_))
    ));
    assert_eq!(b.last_confirmed_entry(), p(1, 1));
    // Reopened: the store holds what the commit wrote.
    drop((c, a, b));
    let a = ManagedLedger::open("a", cfg(2), Arc::new(store)).unwrap();
    assert_eq!(a.last_confirmed_entry(), p(2, 0));
}
