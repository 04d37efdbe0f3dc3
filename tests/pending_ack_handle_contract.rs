//! The pending-ack handle's contract towards its callers (Pulsar's
//! `PendingAckHandleImpl` futures): every `ReadyWaiter` completes, with the
//! terminal error when the handle gives up or closes; `wait_timeout` waits
//! its bound and no longer; the accessors report what happened; requests in
//! Error/Close fail with the documented errors.
//!
//! Runs on the manual executor under a watchdog (`common/watchdog.rs`), so
//! a handle that never settles fails with a name within seconds.
#![cfg(not(any(loom, feature = "shuttle")))]

#[path = "common/watchdog.rs"]
mod watchdog;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pulsar_core::ledger::{LedgerConfig, ManagedCursor, ManagedLedger, MemoryStore};
use pulsar_core::pending_ack::*;
use pulsar_core::Position;

fn cursor(name: &str) -> (Arc<ManagedLedger>, Arc<ManagedCursor>) {
    let ml =
        ManagedLedger::open(name, LedgerConfig::default(), Arc::new(MemoryStore::new())).unwrap();
    let c = Arc::new(ml.open_cursor("__pending_ack_state").unwrap());
    (ml, c)
}

fn handle(name: &str, c: &Arc<ManagedCursor>, pool: &ReplayExecutorPool) -> PendingAckHandle {
    PendingAckHandle::new(
        name,
        Arc::clone(c),
        Arc::new(MemorySubscription::default()),
        pool,
        Arc::new(InlineReads),
        Arc::new(VirtualTimer::new()),
        HandleConfig::default(),
    )
    .unwrap()
}

fn append(h: &PendingAckHandle, r: PendingAckRecord) -> Option<Result<AppendAck, PendingAckError>> {
    let out = Arc::new(Mutex::new(None));
    let o = Arc::clone(&out);
    h.append(r, Box::new(move |res| *o.lock().unwrap() = Some(res)));
    let res = out.lock().unwrap().take();
    res
}

fn ack(t: u64, e: i64) -> PendingAckRecord {
    PendingAckRecord::individual_ack(
        TxnId::new(1, t),
        vec![AckedPosition::whole(Position::new(9, e))],
    )
}

#[test]
fn a_handle_that_gives_up_fails_every_waiter_and_request_with_its_error() {
    let _w = watchdog::arm("give-up contract", Duration::from_secs(20));
    let (_ml, c) = cursor("giveup");
    let pool = ReplayExecutorPool::new(1, ExecutorMode::Manual).unwrap();
    let h = handle("giveup", &c, &pool);
    assert_eq!(h.name(), "giveup");
    assert_eq!(h.state(), HandleState::None);
    let early = h.ready_waiter();
    assert_eq!(early.try_result(), None);
    // Queued before the handle settles, failed when it gives up.
    let queued = Arc::new(Mutex::new(None));
    let q = Arc::clone(&queued);
    h.append(ack(1, 1), Box::new(move |r| *q.lock().unwrap() = Some(r)));
    assert!(
        queued.lock().unwrap().is_none(),
        "queued until the handle settles"
    );
    // A shut-down executor pool cannot run the replay: non-retryable.
    pool.shutdown();
    h.init();
    assert_eq!(h.state(), HandleState::Error);
    let err = h.error().expect("the error the handle gave up with");
    assert!(
        matches!(&err, PendingAckError::InitFailed { name, cause }
            if name == "giveup" && matches!(**cause, PendingAckError::InvalidConfig(_))),
        "{err:?}"
    );
    assert_eq!(early.try_result(), Some(Err(err.clone())));
    assert_eq!(early.wait(), Err(err.clone()));
    assert_eq!(
        early.wait_timeout(Duration::from_millis(1)),
        Some(Err(err.clone()))
    );
    assert_eq!(early.wait_timeout(Duration::MAX), Some(Err(err.clone())));
    // A waiter taken afterwards completes at once with the same error.
    assert_eq!(h.ready_waiter().try_result(), Some(Err(err.clone())));
    let not_ready = PendingAckError::NotReady {
        name: "giveup".into(),
        state: "Error",
    };
    assert_eq!(
        queued.lock().unwrap().take().map(|r| r.map(|_| ())),
        Some(Err(not_ready.clone()))
    );
    assert_eq!(
        append(&h, ack(2, 2)).map(|r| r.map(|_| ())),
        Some(Err(not_ready))
    );
    // init never leaves Error.
    h.init();
    assert_eq!(h.state(), HandleState::Error);
    assert!(h.stats().completed.is_none());
}

#[test]
fn wait_timeout_waits_its_bound_then_reports_nothing() {
    let _w = watchdog::arm("wait_timeout bound", Duration::from_secs(20));
    let (_ml, c) = cursor("pending");
    let pool = ReplayExecutorPool::new(1, ExecutorMode::Manual).unwrap();
    let h = handle("pending", &c, &pool);
    let w = h.ready_waiter();
    h.init();
    assert_eq!(
        h.state(),
        HandleState::Initializing,
        "queued on the executor"
    );
    let t0 = Instant::now();
    assert_eq!(w.wait_timeout(Duration::from_millis(30)), None);
    assert!(
        t0.elapsed() >= Duration::from_millis(30),
        "returned after {:?}",
        t0.elapsed()
    );
    // Completed from another thread while waiting without a bound.
    let h2 = h.clone();
    let closer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        h2.close();
    });
    assert_eq!(
        w.wait(),
        Err(PendingAckError::Closed {
            name: "pending".into()
        })
    );
    closer.join().unwrap();
    assert_eq!(h.state(), HandleState::Close);
    assert_eq!(
        append(&h, ack(1, 1)).map(|r| r.map(|_| ())),
        Some(Err(PendingAckError::Closed {
            name: "pending".into()
        }))
    );
    // The queued attempt finds the handle closed and does nothing.
    pool.run_pending();
    assert_eq!(h.state(), HandleState::Close);
    assert_eq!(h.stats().attempts, 0);
}

#[test]
fn a_ready_handle_reports_its_replay_and_serves_appends() {
    let _w = watchdog::arm("ready handle", Duration::from_secs(20));
    let (ml, c) = cursor("sub-a");
    for t in 0..3 {
        ml.append(&ack(t, t as i64).encode()).unwrap();
    }
    let pool = ReplayExecutorPool::new(4, ExecutorMode::Manual).unwrap();
    let h = handle("sub-a", &c, &pool);
    assert_eq!(
        h.executor_index(),
        3,
        "pinned by the (FNV-1a) hash of its name: 3 of 4"
    );
    let w = h.ready_waiter();
    h.init();
    assert_eq!(pool.run_pending(), 1);
    assert_eq!(h.state(), HandleState::Ready);
    assert_eq!(w.wait_timeout(Duration::from_secs(5)), Some(Ok(())));
    assert_eq!(h.ready_waiter().try_result(), Some(Ok(())));
    let stats = h.stats();
    assert_eq!(stats.attempts, 1);
    assert_eq!(stats.reads_issued, 1);
    assert_eq!(stats.max_reads_per_attempt, 1);
    let report = stats.completed.expect("completed");
    assert_eq!((report.entries_applied, report.records_applied), (3, 3));
    assert_eq!(h.summary().individual.len(), 3);
    assert!(h.error().is_none());
    assert!(h.last_failed_writer().is_none());
    assert!(Arc::ptr_eq(&h.cursor(), &c));
    let ok = append(&h, ack(9, 9)).expect("appended synchronously (batching off)");
    let ack_ = ok.expect("appended");
    assert_eq!(ack_.position, ml.last_confirmed_entry());
    assert_eq!(h.summary().individual.len(), 4);
    // init in Ready does nothing.
    h.init();
    assert_eq!(pool.run_pending(), 0);
}

fn commit(t: u64) -> PendingAckRecord {
    PendingAckRecord::commit(TxnId::new(1, t), AckType::Individual)
}

/// The pending-ack log is trimmed (mark-deleted) up to the last entry before
/// the oldest unresolved transaction, by the replay and by appends alike, so
/// a restart replays only what is still pending; never past a committed ack
/// the subscription has not persisted (until then the log is its only
/// durable copy), and the trim advances when the subscription persists.
#[test]
fn replay_and_appends_trim_the_log_up_to_the_oldest_unresolved_entry() {
    let _w = watchdog::arm("log trim", Duration::from_secs(20));
    let (ml, c) = cursor("trim");
    let p0 = ml.append(&ack(1, 1).encode()).unwrap();
    let p1 = ml.append(&ack(2, 2).encode()).unwrap();
    let _p2 = ml.append(&commit(1).encode()).unwrap();
    let before = c.mark_delete_position();
    assert!(before < p0);
    let pool = ReplayExecutorPool::new(1, ExecutorMode::Manual).unwrap();
    let sub = Arc::new(MemorySubscription::default());
    let h = PendingAckHandle::new(
        "trim",
        Arc::clone(&c),
        Arc::clone(&sub) as Arc<dyn SubscriptionView>,
        &pool,
        Arc::new(InlineReads),
        Arc::new(VirtualTimer::new()),
        HandleConfig::default(),
    )
    .unwrap();
    h.init();
    pool.run_pending();
    assert_eq!(h.state(), HandleState::Ready);
    // t1 committed at p0, but the subscription has not persisted it.
    assert_eq!(c.mark_delete_position(), before, "the commit keeps p0");
    let recovered = h.committed_acks();
    assert_eq!(
        recovered,
        vec![CommittedAck::Entry(Position::new(9, 1))],
        "the replay hands the commit back"
    );
    for a in &recovered {
        sub.apply(a);
    }
    h.subscription_persisted();
    assert_eq!(c.mark_delete_position(), before, "applied, not persisted");
    sub.persist();
    h.subscription_persisted();
    // t1 resolved and durable at p0; t2 still pending at p1.
    assert_eq!(c.mark_delete_position(), p0, "trimmed up to p0");
    let a3 = append(&h, ack(3, 3)).unwrap().unwrap();
    assert_eq!(
        c.mark_delete_position(),
        p0,
        "a new pending ack trims nothing"
    );
    let a4 = append(&h, commit(2)).unwrap().unwrap();
    assert!(a4.position > a3.position && a3.position > p1);
    assert_eq!(c.mark_delete_position(), p0, "t2's commit not persisted");
    sub.apply(&CommittedAck::Entry(Position::new(9, 2)));
    sub.persist();
    h.subscription_persisted();
    // p1 resolved and durable; p2 holds only resolved records; p3 (t3)
    // still pending.
    assert_eq!(c.mark_delete_position(), ml.next_valid_position(p1));
    let a5 = append(
        &h,
        PendingAckRecord::abort(TxnId::new(1, 3), AckType::Individual),
    )
    .unwrap()
    .unwrap();
    assert_eq!(c.mark_delete_position(), a5.position, "everything resolved");
    assert!(h.summary().individual.is_empty());
}

#[test]
fn diagnostics_name_the_handle_and_its_state() {
    let (_ml, c) = cursor("shown");
    let pool = ReplayExecutorPool::new(1, ExecutorMode::Manual).unwrap();
    let h = handle("shown", &c, &pool);
    let w = h.ready_waiter();
    let shown = format!("{h:?}");
    assert!(
        shown.contains("\"shown\"") && shown.contains("None"),
        "{shown}"
    );
    h.close();
    let shown = format!("{w:?}");
    assert!(shown.contains("Closed"), "{shown}");
    assert!(format!("{h:?}").contains("Close"));
}
