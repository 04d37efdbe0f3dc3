//! The four replay/handle paths of the replay's promise ("a failed attempt
//! releases its replay thread; an incomplete replay is never reported
//! complete"), end to end on the redb store where storage matters:
//!
//! 1. a lost read callback ended by `close()`: the executor is free at once,
//!    the late callback is ignored safely;
//! 2. a reused cursor whose read position moved past the mark-delete: every
//!    attempt starts at the first entry after the mark-delete, and Ready
//!    means every record up to the attempt's log end was applied;
//! 3. a closed cursor: the retry reopens it through the managed ledger, or
//!    waiters fail with a clear error after a bounded number of attempts;
//! 4. batch-index acks: per-index conflicts, commit/abort of one txn's
//!    indexes only.
#![cfg(not(any(loom, feature = "shuttle")))]

#[path = "common/watchdog.rs"]
mod watchdog;

/// Bound of the whole test binary (it runs in about a second): a replay
/// that spins on the manual executor fails with a named HANG, not a timeout.
const WATCHDOG: std::time::Duration = std::time::Duration::from_secs(20);

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use pulsar_core::ledger::{
    LedgerConfig, LedgerStore, ManagedCursor, ManagedLedger, MemoryStore, RedbStore,
};
use pulsar_core::pending_ack::*;
use pulsar_core::Position;

const CURSOR: &str = "__pending_ack_state";

fn manual() -> (Arc<ReplayExecutorPool>, Arc<VirtualTimer>) {
    watchdog::arm_for_process("tests/pending_ack_paths.rs", WATCHDOG);
    (
        ReplayExecutorPool::new(1, ExecutorMode::Manual).unwrap(),
        Arc::new(VirtualTimer::new()),
    )
}

fn ledger(store: Arc<dyn LedgerStore>, name: &str) -> Arc<ManagedLedger> {
    ManagedLedger::open(name, LedgerConfig::default(), store).unwrap()
}

fn new_handle(
    name: &str,
    cursor: &Arc<ManagedCursor>,
    pool: &ReplayExecutorPool,
    timer: &Arc<VirtualTimer>,
    dispatcher: Arc<dyn ReadDispatcher>,
    cfg: HandleConfig,
) -> PendingAckHandle {
    PendingAckHandle::new(
        name,
        Arc::clone(cursor),
        Arc::new(MemorySubscription::default()),
        pool,
        dispatcher,
        Arc::clone(timer) as Arc<dyn Timer>,
        cfg,
    )
    .unwrap()
}

/// Runs the executor and the virtual timer until `h` is Ready or Error, at
/// most `max_fires` timer tasks; returns whether it settled.
fn drive(
    pool: &ReplayExecutorPool,
    timer: &VirtualTimer,
    h: &PendingAckHandle,
    max_fires: usize,
) -> bool {
    for _ in 0..=max_fires {
        pool.run_pending();
        if matches!(h.state(), HandleState::Ready | HandleState::Error) {
            return true;
        }
        if !timer.fire_next() {
            return false;
        }
    }
    false
}

/// Appends through the handle and returns the callback's result.
fn append(h: &PendingAckHandle, r: PendingAckRecord) -> Result<AppendAck, PendingAckError> {
    let out = Arc::new(Mutex::new(None));
    let o = Arc::clone(&out);
    h.append(
        r,
        Box::new(move |res| {
            *o.lock().unwrap() = Some(res);
        }),
    );
    let res = out.lock().unwrap().take();
    res.expect("append callback ran (batching off: synchronous)")
}

fn batch(p: Position, size: i32, idx: &[u32]) -> AckedPosition {
    AckedPosition::batch_indexes(p, size, idx).unwrap()
}

fn ready_handle_on_empty_log(name: &str) -> (PendingAckHandle, Arc<ManagedCursor>) {
    let (pool, timer) = manual();
    let ml = ledger(Arc::new(MemoryStore::new()), name);
    let cursor = Arc::new(ml.open_cursor(CURSOR).unwrap());
    let h = new_handle(
        name,
        &cursor,
        &pool,
        &timer,
        Arc::new(InlineReads),
        HandleConfig::default(),
    );
    h.init();
    assert!(drive(&pool, &timer, &h, 0));
    assert_eq!(h.state(), HandleState::Ready);
    (h, cursor)
}

// ------------------------------------------------------ path 4: batch-index acks

#[test]
fn disjoint_batch_indexes_of_one_entry_by_two_txns_are_both_pending() {
    let (h, cursor) = ready_handle_on_empty_log("batch-disjoint");
    let e = Position::new(9, 1);
    let (t1, t2, t3, t4) = (
        TxnId::new(0, 1),
        TxnId::new(0, 2),
        TxnId::new(0, 3),
        TxnId::new(0, 4),
    );
    append(
        &h,
        PendingAckRecord::individual_ack(t1, vec![batch(e, 4, &[0, 1])]),
    )
    .unwrap();
    append(
        &h,
        PendingAckRecord::individual_ack(t2, vec![batch(e, 4, &[2])]),
    )
    .unwrap();
    let s = h.summary();
    assert_eq!(s.batch_indexes[&t1][&e], BTreeSet::from([0, 1]));
    assert_eq!(s.batch_indexes[&t2][&e], BTreeSet::from([2]));

    // Index 1 is pending in t1: a typed per-index conflict, nothing written.
    let lce = cursor.ledger().last_confirmed_entry();
    assert_eq!(
        append(
            &h,
            PendingAckRecord::individual_ack(t3, vec![batch(e, 4, &[1, 3])])
        ),
        Err(PendingAckError::AckConflict {
            txn_id: t3,
            position: e,
            batch_index: Some(1),
            holder: Some(t1),
        })
    );
    // A whole-entry ack of a position with pending indexes conflicts too.
    assert!(matches!(
        append(&h, PendingAckRecord::individual_ack(t3, vec![AckedPosition::whole(e)])),
        Err(PendingAckError::AckConflict { batch_index: Some(0), holder: Some(h1), .. }) if h1 == t1
    ));
    assert_eq!(
        cursor.ledger().last_confirmed_entry(),
        lce,
        "a refused ack is not logged"
    );

    // Commit t1: only t1's indexes become deleted; t2's stay pending.
    append(&h, PendingAckRecord::commit(t1, AckType::Individual)).unwrap();
    let s = h.summary();
    assert_eq!(s.deleted_batch_indexes[&e], BTreeSet::from([0, 1]));
    assert!(!s.batch_indexes.contains_key(&t1));
    assert_eq!(s.batch_indexes[&t2][&e], BTreeSet::from([2]));

    // After the commit, another free index is accepted; a committed one is
    // "already acknowledged".
    append(
        &h,
        PendingAckRecord::individual_ack(t4, vec![batch(e, 4, &[3])]),
    )
    .unwrap();
    assert_eq!(
        append(
            &h,
            PendingAckRecord::individual_ack(t3, vec![batch(e, 4, &[0])])
        ),
        Err(PendingAckError::AckConflict {
            txn_id: t3,
            position: e,
            batch_index: Some(0),
            holder: None,
        })
    );

    // Abort t2 frees index 2 only; t3 takes it; committing t3 and t4 deletes
    // the whole entry.
    append(&h, PendingAckRecord::abort(t2, AckType::Individual)).unwrap();
    assert_eq!(h.summary().batch_indexes[&t4][&e], BTreeSet::from([3]));
    append(
        &h,
        PendingAckRecord::individual_ack(t3, vec![batch(e, 4, &[2])]),
    )
    .unwrap();
    append(&h, PendingAckRecord::commit(t3, AckType::Individual)).unwrap();
    append(&h, PendingAckRecord::commit(t4, AckType::Individual)).unwrap();
    let s = h.summary();
    assert!(s.deleted.contains(&e));
    assert!(s.deleted_batch_indexes.is_empty());
    assert!(s.batch_indexes.is_empty());
}

#[test]
fn replay_of_batch_index_acks_rebuilds_the_same_state() {
    let (h, cursor) = ready_handle_on_empty_log("batch-replay");
    let e = Position::new(9, 1);
    let f = Position::new(9, 2);
    let (t1, t2) = (TxnId::new(0, 1), TxnId::new(0, 2));
    append(
        &h,
        PendingAckRecord::individual_ack(t1, vec![batch(e, 3, &[0])]),
    )
    .unwrap();
    append(
        &h,
        PendingAckRecord::individual_ack(t2, vec![batch(e, 3, &[1]), AckedPosition::whole(f)]),
    )
    .unwrap();
    append(&h, PendingAckRecord::commit(t1, AckType::Individual)).unwrap();
    let live = h.summary();

    let (pool, timer) = manual();
    let replayer = new_handle(
        "batch-replay-2",
        &cursor,
        &pool,
        &timer,
        Arc::new(InlineReads),
        HandleConfig::default(),
    );
    replayer.init();
    assert!(drive(&pool, &timer, &replayer, 0));
    assert_eq!(replayer.state(), HandleState::Ready);
    // The pending part is rebuilt from the log; the committed effects live
    // on the subscription (the log entries of t1 were trimmed once resolved).
    let replayed = replayer.summary();
    assert_eq!(replayed.individual, live.individual);
    assert_eq!(replayed.batch_indexes, live.batch_indexes);
    assert_eq!(live.batch_indexes[&t2][&e], BTreeSet::from([1]));
    assert_eq!(
        live.deleted_batch_indexes,
        BTreeMap::from([(e, BTreeSet::from([0]))])
    );
    // t1's index 0 is not pending after replay, so t2 cannot have it and a
    // new txn's ack of index 2 is accepted.
    assert_eq!(
        append(
            &replayer,
            PendingAckRecord::individual_ack(TxnId::new(0, 3), vec![batch(e, 3, &[2])])
        )
        .map(|_| ()),
        Ok(())
    );
}

// ------------------------------------------- path 2: reused cursor, moved read position

/// A redb-backed pending-ack log: entry 0 ACK(t0), entry 1 COMMIT(t0)
/// (trimmed: mark-delete at entry 1), entries 2..=5 ACKs of t1..t4, which
/// stay pending. Returns the ledger, its cursor and the pending positions.
fn redb_log(
    dir: &tempfile::TempDir,
    name: &str,
) -> (Arc<ManagedLedger>, Arc<ManagedCursor>, Vec<Position>) {
    watchdog::arm_for_process("tests/pending_ack_paths.rs", WATCHDOG);
    let store = Arc::new(RedbStore::open(dir.path().join("store.redb")).unwrap());
    let ml = ledger(store, name);
    let ack = |t: u64, e: i64| {
        PendingAckRecord::individual_ack(
            TxnId::new(0, t),
            vec![AckedPosition::whole(Position::new(500, e))],
        )
        .encode()
    };
    ml.append(&ack(0, 0)).unwrap();
    let md = ml
        .append(&PendingAckRecord::commit(TxnId::new(0, 0), AckType::Individual).encode())
        .unwrap();
    let pending: Vec<Position> = (1..=4).map(|t| Position::new(500, t as i64)).collect();
    for t in 1..=4 {
        ml.append(&ack(t, t as i64)).unwrap();
    }
    let cursor = Arc::new(ml.open_cursor(CURSOR).unwrap());
    cursor.mark_delete(md).unwrap();
    (ml, cursor, pending)
}

#[test]
fn reused_cursor_with_read_position_past_the_log_replays_from_the_mark_delete() {
    let dir = tempfile::tempdir().unwrap();
    let (ml, cursor, pending) = redb_log(&dir, "moved-read-position");
    // As after an unload: the cached cursor already read everything
    // (read position = LCE + 1) while the mark-delete is at entry 1.
    while cursor.has_more_entries() {
        let _ = cursor.read_entries(100).unwrap();
    }
    assert!(cursor.read_position() > ml.last_confirmed_entry());
    let (pool, timer) = manual();
    let h = new_handle(
        "moved",
        &cursor,
        &pool,
        &timer,
        Arc::new(InlineReads),
        HandleConfig::default(),
    );
    h.init();
    assert!(drive(&pool, &timer, &h, 0));
    assert_eq!(h.state(), HandleState::Ready);
    let got: BTreeSet<Position> = h.summary().individual.values().flatten().copied().collect();
    assert_eq!(
        got,
        pending.iter().copied().collect(),
        "every pending ack after the mark-delete"
    );
    let report = h.stats().completed.unwrap();
    assert!(
        report.caught_up,
        "Ready implies the replay reached the log end: {report:?}"
    );
    assert_eq!(report.entries_applied, 4);
}

/// Moves the shared cursor's read position to the log end instead of
/// running the first read (delivering it empty), as another user of the
/// cached cursor would.
#[derive(Debug, Default)]
struct MovesCursorOnce(Mutex<bool>);

impl ReadDispatcher for MovesCursorOnce {
    fn dispatch(&self, job: ReadJob) {
        let mut done = self.0.lock().unwrap();
        if !*done {
            *done = true;
            let c = Arc::clone(job.cursor());
            while c.has_more_entries() {
                let _ = c.read_entries(100).unwrap();
            }
            drop(done);
            job.complete(Vec::new());
            return;
        }
        drop(done);
        job.run();
    }
}

#[test]
fn an_attempt_that_runs_dry_short_of_the_log_end_is_never_ready() {
    let dir = tempfile::tempdir().unwrap();
    let (_ml, cursor, pending) = redb_log(&dir, "runs-dry");
    let (pool, timer) = manual();
    let h = new_handle(
        "dry",
        &cursor,
        &pool,
        &timer,
        Arc::new(MovesCursorOnce::default()),
        HandleConfig::default(),
    );
    let w = h.ready_waiter();
    h.init();
    pool.run_pending();
    // The first attempt saw nothing readable before the log end: it failed
    // (IncompleteReplay, retryable) instead of reporting Ready.
    assert_eq!(h.state(), HandleState::None, "retry scheduled, not Ready");
    assert_eq!(w.try_result(), None);
    assert_eq!(h.stats().retry_delays_ms.len(), 1);
    // The retry rewinds and replays everything.
    assert!(drive(&pool, &timer, &h, 3));
    assert_eq!(w.try_result(), Some(Ok(())));
    let got: BTreeSet<Position> = h.summary().individual.values().flatten().copied().collect();
    assert_eq!(got, pending.iter().copied().collect());
    assert!(h.stats().completed.unwrap().caught_up);
}

// ------------------------------------------------ path 1: lost read callback + close

/// Keeps every job it is given and never finishes it (a storage client that
/// drops the callback).
#[derive(Debug, Default)]
struct LosesCallbacks(Mutex<Vec<ReadJob>>);

impl ReadDispatcher for LosesCallbacks {
    fn dispatch(&self, job: ReadJob) {
        self.0.lock().unwrap().push(job);
    }
}

/// A pending-ack log on a redb store whose handle `h1` (named `handle`)
/// reads through [`LosesCallbacks`], on a one-thread executor pool.
struct LostCallback {
    _dir: tempfile::TempDir,
    ml: Arc<ManagedLedger>,
    cursor: Arc<ManagedCursor>,
    pending: Vec<Position>,
    pool: Arc<ReplayExecutorPool>,
    timer: Arc<VirtualTimer>,
    lost: Arc<LosesCallbacks>,
    h1: PendingAckHandle,
}

fn lost_callback(log: &str, handle: &str) -> LostCallback {
    watchdog::arm_for_process("tests/pending_ack_paths.rs", WATCHDOG);
    let dir = tempfile::tempdir().unwrap();
    let (ml, cursor, pending) = redb_log(&dir, log);
    let pool = ReplayExecutorPool::new(1, ExecutorMode::Threads).unwrap();
    let timer = Arc::new(VirtualTimer::new());
    let lost = Arc::new(LosesCallbacks::default());
    let h1 = new_handle(
        handle,
        &cursor,
        &pool,
        &timer,
        Arc::clone(&lost) as Arc<dyn ReadDispatcher>,
        HandleConfig::default(),
    );
    LostCallback {
        _dir: dir,
        ml,
        cursor,
        pending,
        pool,
        timer,
        lost,
        h1,
    }
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !f() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

#[test]
fn close_with_a_lost_read_callback_frees_the_executor_and_a_late_callback_changes_nothing() {
    let LostCallback {
        _dir,
        cursor,
        pending,
        pool,
        timer,
        lost,
        h1,
        ..
    } = lost_callback("lost-callback", "lost");
    let w1 = h1.ready_waiter();
    h1.init();
    wait_until("the first read to be issued and lost", || {
        !lost.0.lock().unwrap().is_empty()
    });
    assert_eq!(h1.state(), HandleState::Initializing);

    let closed_at = std::time::Instant::now();
    h1.close();
    assert_eq!(
        w1.try_result(),
        Some(Err(PendingAckError::Closed {
            name: "lost".into()
        }))
    );
    // The executor is free: a re-subscribe on the same executor (same
    // cursor, same single thread) becomes Ready.
    let h2 = new_handle(
        "lost",
        &cursor,
        &pool,
        &timer,
        Arc::new(InlineReads),
        HandleConfig::default(),
    );
    assert_eq!(h2.executor_index(), h1.executor_index());
    h2.init();
    assert_eq!(
        h2.ready_waiter()
            .wait_timeout(std::time::Duration::from_secs(10)),
        Some(Ok(())),
        "the executor was released by close within a bounded time"
    );
    let freed_in = closed_at.elapsed();
    let got: BTreeSet<Position> = h2
        .summary()
        .individual
        .values()
        .flatten()
        .copied()
        .collect();
    assert_eq!(got, pending.iter().copied().collect());
    // Rewound, as a newer attempt's start leaves it: unread entries lie
    // ahead, so a late read that touched the shared cursor would move it.
    cursor.rewind();
    assert!(cursor.has_more_entries());
    let before = (h2.summary(), cursor.read_position(), h1.summary());

    // The late callback runs: it must not read the shared cursor, and
    // nothing reaches h2, h1 or the cursor.
    let mut jobs = std::mem::take(&mut *lost.0.lock().unwrap());
    assert_eq!(jobs.len(), 1, "no read after the lost one");
    let job = jobs.pop().unwrap();
    job.run();
    assert_eq!((h2.summary(), cursor.read_position(), h1.summary()), before);
    pool.shutdown();
    println!("lost callback + close: executor free after {freed_in:?}; late callback ignored");
}

#[test]
fn late_entries_of_a_closed_attempt_are_released_not_applied() {
    let LostCallback {
        _dir,
        ml,
        pool,
        lost,
        h1,
        ..
    } = lost_callback("late-entries", "late");
    h1.init();
    wait_until("the read to be lost", || !lost.0.lock().unwrap().is_empty());
    h1.close();
    wait_until("the executor to be idle", || pool.executor(0).is_idle());
    let job = lost.0.lock().unwrap().pop().unwrap();
    let entries = ml
        .read_positions(&[Position::new(ml.last_confirmed_entry().ledger_id, 2)])
        .unwrap();
    job.complete(entries);
    assert!(
        h1.summary().individual.is_empty(),
        "a late entry is never applied"
    );
    pool.shutdown();
}

// --------------------------------------------------------- path 3: closed cursor

#[test]
fn closed_cursor_is_reopened_through_the_managed_ledger_on_the_redb_store() {
    let dir = tempfile::tempdir().unwrap();
    let (_ml, cursor, pending) = redb_log(&dir, "closed-cursor");
    let md = cursor.mark_delete_position();
    cursor.close();
    let (pool, timer) = manual();
    let h = new_handle(
        "closed",
        &cursor,
        &pool,
        &timer,
        Arc::new(InlineReads),
        HandleConfig::default(),
    );
    let w = h.ready_waiter();
    h.init();
    assert!(drive(&pool, &timer, &h, 5), "settles within 5 retries");
    assert_eq!(w.try_result(), Some(Ok(())));
    let reopened = h.cursor();
    assert!(!Arc::ptr_eq(&reopened, &cursor) && !reopened.is_closed());
    assert_eq!(
        reopened.mark_delete_position(),
        md,
        "recovered from the redb store"
    );
    let got: BTreeSet<Position> = h.summary().individual.values().flatten().copied().collect();
    assert_eq!(got, pending.iter().copied().collect());
    assert!(h.stats().completed.unwrap().caught_up);
}

#[test]
fn closed_cursor_that_cannot_reopen_fails_waiters_after_a_bounded_number_of_attempts() {
    let dir = tempfile::tempdir().unwrap();
    let (ml, cursor, _pending) = redb_log(&dir, "closed-fenced");
    cursor.close();
    ml.fence();
    let (pool, timer) = manual();
    let cfg = HandleConfig {
        max_cursor_reopen_attempts: 3,
        ..HandleConfig::default()
    };
    let h = new_handle("fenced", &cursor, &pool, &timer, Arc::new(InlineReads), cfg);
    let w = h.ready_waiter();
    h.init();
    assert!(
        drive(&pool, &timer, &h, 10),
        "gives up instead of retrying forever"
    );
    assert_eq!(h.state(), HandleState::Error);
    match w.try_result() {
        Some(Err(PendingAckError::InitFailed { cause, .. })) => match *cause {
            PendingAckError::CursorClosed {
                attempts,
                ref reason,
                ..
            } => {
                assert_eq!(attempts, 3);
                assert!(reason.contains("fenced"), "{reason}");
            }
            ref other => panic!("expected CursorClosed, got {other:?}"),
        },
        other => panic!("expected InitFailed(CursorClosed), got {other:?}"),
    }
    assert_eq!(h.stats().attempts, 3);
    assert_eq!(
        h.stats().retry_delays_ms.len(),
        2,
        "backoff between the attempts"
    );
}

/// An append is validated before its conflict check: a malformed record is
/// an `InvalidRecord` (never reported as a conflict), and the check never
/// expands the per-index ack set of an out-of-range `batch_size`.
#[test]
fn append_validates_the_record_before_checking_conflicts() {
    let (h, _cursor) = ready_handle_on_empty_log("append-validates-first");
    let (t1, t2) = (TxnId::new(0, 1), TxnId::new(0, 2));
    let p = Position::new(60, 2);
    append(
        &h,
        PendingAckRecord::individual_ack(t1, vec![AckedPosition::whole(p)]),
    )
    .unwrap();
    let negative_batch = AckedPosition {
        position: p,
        batch_size: -1,
        ack_set: vec![1],
    };
    assert!(matches!(
        append(
            &h,
            PendingAckRecord::individual_ack(t2, vec![negative_batch])
        ),
        Err(PendingAckError::InvalidRecord(_))
    ));
    let negative_ledger = AckedPosition::whole(Position::new(-5, 0));
    assert!(matches!(
        append(
            &h,
            PendingAckRecord::individual_ack(t2, vec![negative_ledger])
        ),
        Err(PendingAckError::InvalidRecord(_))
    ));
    let huge_batch = AckedPosition {
        position: Position::new(60, 3),
        batch_size: i32::MAX,
        ack_set: vec![1],
    };
    assert!(matches!(
        append(&h, PendingAckRecord::individual_ack(t2, vec![huge_batch])),
        Err(PendingAckError::InvalidRecord(_))
    ));
    assert_eq!(
        h.summary().individual.keys().copied().collect::<Vec<_>>(),
        vec![t1]
    );
}

/// A committed cumulative ACK of a batch position that still carries an
/// `ack_set` (some of its batch indexes unacknowledged) moves the mark-delete
/// only to the entry before it: the batch entry's unacknowledged messages are
/// never deleted by the commit.
#[test]
fn committed_cumulative_batch_ack_never_deletes_its_unacknowledged_indexes() {
    let t = TxnId::new(0, 1);
    let mut st = PendingAckState::new(Position::new(5, 0));
    let ack = PendingAckRecord {
        txn_id: t,
        op: PendingAckOp::Ack,
        ack_type: AckType::Cumulative,
        positions: vec![AckedPosition {
            position: Position::new(5, 9),
            batch_size: 0,
            ack_set: vec![5],
        }],
    };
    ack.validate().unwrap();
    assert!(st.apply(&ack));
    assert!(st.apply(&PendingAckRecord::commit(t, AckType::Cumulative)));
    assert_eq!(st.summary().mark_delete, Position::new(5, 8));
    // A whole-entry cumulative ACK still deletes its entry.
    let t2 = TxnId::new(0, 2);
    assert!(st.apply(&PendingAckRecord::cumulative_ack(t2, Position::new(5, 9))));
    assert!(st.apply(&PendingAckRecord::commit(t2, AckType::Cumulative)));
    assert_eq!(st.summary().mark_delete, Position::new(5, 9));
}

/// A log whose last entry is a batched entry (the buffered writer's
/// `0x0e01` form, batch-index acks, a commit and a whole-entry ack in one
/// entry) replays, after the redb store is reopened, to the state the
/// appends built, and the replay is complete (caught up to that entry).
#[test]
fn replay_of_a_log_ending_in_a_batched_entry_rebuilds_the_state_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let (t1, t2, t3) = (TxnId::new(0, 1), TxnId::new(0, 2), TxnId::new(0, 3));
    let b = Position::new(70, 0);
    let batching = HandleConfig {
        writer: WriterConfig {
            batch_enabled: true,
            ..WriterConfig::default()
        },
        ..HandleConfig::default()
    };
    let before = {
        let (pool, timer) = manual();
        let ml = ledger(Arc::new(RedbStore::open(&path).unwrap()), "batched-tail");
        let cursor = Arc::new(ml.open_cursor(CURSOR).unwrap());
        let h = new_handle(
            "batched-tail",
            &cursor,
            &pool,
            &timer,
            Arc::new(InlineReads),
            batching,
        );
        h.init();
        assert!(drive(&pool, &timer, &h, 0));
        let results = Arc::new(Mutex::new(Vec::new()));
        for rec in [
            PendingAckRecord::individual_ack(t1, vec![batch(b, 4, &[0, 1])]),
            PendingAckRecord::individual_ack(t2, vec![batch(b, 4, &[2])]),
            PendingAckRecord::commit(t1, AckType::Individual),
            PendingAckRecord::individual_ack(t3, vec![AckedPosition::whole(Position::new(70, 1))]),
        ] {
            let r = Arc::clone(&results);
            h.append(rec, Box::new(move |x| r.lock().unwrap().push(x)));
        }
        timer.advance(1);
        let results = results.lock().unwrap().clone();
        assert_eq!(results.len(), 4);
        assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
        let last = ml.last_confirmed_entry();
        let tail = ml.read_positions(&[last]).unwrap();
        assert_eq!(&tail[0].data[..4], &[0x0e, 0x01, 0x00, 0x01]);
        let s = h.summary();
        assert_eq!(
            s.deleted_batch_indexes.get(&b),
            Some(&BTreeSet::from([0, 1]))
        );
        h.close();
        pool.shutdown();
        s
    };
    let (pool, timer) = manual();
    let ml = ledger(Arc::new(RedbStore::open(&path).unwrap()), "batched-tail");
    let cursor = Arc::new(ml.open_cursor(CURSOR).unwrap());
    let h = new_handle(
        "batched-tail",
        &cursor,
        &pool,
        &timer,
        Arc::new(InlineReads),
        HandleConfig::default(),
    );
    h.init();
    assert!(drive(&pool, &timer, &h, 0));
    assert_eq!(h.state(), HandleState::Ready);
    assert!(h.stats().completed.expect("completed").caught_up);
    assert_eq!(h.summary(), before);
}
