//! The permits scenarios run by both `loom-tests/permits.rs` (every
//! interleaving, bounded preemptions) and `shuttle-tests/permits.rs`
//! (random and PCT schedules): per-incarnation permit returns, the connection task's Flow writes
//! and a same-connection consumer replacement (CommandCloseConsumer +
//! Subscribe).
//!
//! Threads (loom allows 4 including main): two application threads return
//! permits for incarnation A, the connection task flushes Flow requests,
//! and main replaces A by B and returns a permit to B.
//!
//! Checked on the real `ClientConnection` / `ConsumerPermitState`:
//! - no Flow of A is written after CloseConsumer(A) / Subscribe(B);
//! - Σ Flow written for A = what A accepted minus what was abandoned with it
//!   (dropped stale requests, residual at close, late adds to the closed
//!   state), so nothing is lost or duplicated and none of it reaches B;
//! - Σ Flow written for B = its initial grant + exactly what B returned.
//!
//! The negative control is a test-only model of the same protocol whose
//! connection task writes Flow **without** revalidating the incarnation;
//! both checkers must find the schedule where A's Flow follows B's
//! Subscribe.

use pulsar_core::__model::sync::{thread, Arc, AtomicU64, Mutex, Ordering};
use pulsar_core::permits::client::{ClientConnection, ClientFrame, Incarnation, ReturnOutcome};

const RQ: u32 = 2; // threshold 1: every return drains into a Flow request

/// A frame reduced to what the checks need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum W {
    Subscribe(u64),
    Flow(u64, u32),
    Close(u64),
}

/// The shared wire check (used by the real test and the negative control).
/// No Flow carries 0 permits (a protocol error for the broker): when two
/// returns race to drain the accumulator, the one that finds it empty
/// writes nothing.
fn check_wire_order(wire: &[W], old: u64, new: u64) {
    assert!(
        !wire.iter().any(|w| matches!(w, W::Flow(_, 0))),
        "Flow(0) written: {wire:?}"
    );
    let replaced_at = wire
        .iter()
        .position(|w| *w == W::Subscribe(new))
        .expect("replacement Subscribe written");
    for w in &wire[replaced_at..] {
        assert!(
            !matches!(w, W::Flow(i, _) if *i == old),
            "old incarnation Flow written after replacement's Subscribe: {wire:?}"
        );
    }
}

fn sum_flows(wire: &[W], inc: u64) -> u64 {
    wire.iter()
        .map(|w| match w {
            W::Flow(i, n) if *i == inc => u64::from(*n),
            _ => 0,
        })
        .sum()
}

fn accepted(outcome: ReturnOutcome) -> u64 {
    match outcome {
        ReturnOutcome::Accepted { .. } => 1,
        ReturnOutcome::Stale => 0,
    }
}

/// The real `ClientConnection`: two application threads return permits
/// for incarnation A, the connection task flushes Flow requests, main
/// replaces A by B and returns a permit to B.
pub fn replacement_during_returns() {
    let conn = Arc::new(ClientConnection::new(1));
    let a = conn.subscribe(1, RQ).unwrap();
    conn.subscribe_succeeded(&a).unwrap();
    let inc_a: Incarnation = a.incarnation();

    // two application threads dequeue A's messages: one permit each
    let returners: Vec<_> = (0..2)
        .map(|_| {
            let a = Arc::clone(&a);
            thread::spawn(move || accepted(a.return_permits(1).unwrap()))
        })
        .collect();
    // the connection task
    let task = {
        let conn = Arc::clone(&conn);
        thread::spawn(move || {
            let mut r = conn.flush_flows();
            let r2 = conn.flush_flows();
            r.written.extend(r2.written);
            r.dropped.extend(r2.dropped);
            r
        })
    };
    // main: close/recreate on the same connection, then B returns one
    let residual_a = conn.close_consumer(1).unwrap();
    let b = conn.subscribe(1, RQ).unwrap();
    conn.subscribe_succeeded(&b).unwrap();
    let inc_b = b.incarnation();
    let accepted_b = accepted(b.return_permits(1).unwrap());
    assert_eq!(accepted_b, 1, "B is current");

    let accepted_a: u64 = returners.into_iter().map(|h| h.join().unwrap()).sum();
    let mut report = task.join().unwrap();
    // the connection task's final pass after everyone is done
    let last = conn.flush_flows();
    report.written.extend(last.written);
    report.dropped.extend(last.dropped);

    let wire: Vec<W> = conn
        .take_outbox()
        .into_iter()
        .filter_map(|f| match f {
            ClientFrame::Subscribe { incarnation, .. } => Some(W::Subscribe(incarnation.serial)),
            ClientFrame::Flow {
                incarnation,
                command,
            } => Some(W::Flow(incarnation.serial, command.message_permits)),
            ClientFrame::CloseConsumer { incarnation, .. } => Some(W::Close(incarnation.serial)),
            _ => None,
        })
        .collect();
    check_wire_order(&wire, inc_a.serial, inc_b.serial);
    let close_at = wire
        .iter()
        .position(|w| *w == W::Close(inc_a.serial))
        .unwrap();
    assert!(
        wire[close_at..]
            .iter()
            .all(|w| !matches!(w, W::Flow(i, _) if *i == inc_a.serial)),
        "Flow of A after its CloseConsumer: {wire:?}"
    );

    // A: written = accepted - abandoned (dropped + residual + late adds)
    let dropped_a: u64 = report
        .dropped
        .iter()
        .filter(|(i, _)| *i == inc_a)
        .map(|(_, n)| u64::from(*n))
        .sum();
    let written_a = sum_flows(&wire, inc_a.serial);
    assert_eq!(
        written_a + dropped_a + residual_a + a.accumulated(),
        u64::from(RQ) + accepted_a,
        "A's credit not conserved: {wire:?} {report:?}"
    );
    assert_eq!(
        report
            .written
            .iter()
            .filter(|(i, _)| *i == inc_a)
            .map(|(_, n)| u64::from(*n))
            .sum::<u64>()
            + u64::from(RQ),
        written_a
    );
    // B: exactly its grant plus what it returned, nothing from A
    assert!(report.dropped.iter().all(|(i, _)| *i != inc_b));
    assert_eq!(sum_flows(&wire, inc_b.serial), u64::from(RQ) + accepted_b);
    assert_eq!(b.accumulated(), 0);
}

// ---------------------------------------------------------------------------
// Negative control: a TEST-ONLY model of the buggy ordering.
// ---------------------------------------------------------------------------

/// The same protocol in miniature, with the bug: the connection task writes
/// every drained Flow request without checking that its incarnation is
/// still current.
struct BuggyConnection {
    current: AtomicU64,
    accumulator: AtomicU64,
    requests: Mutex<Vec<(u64, u32)>>,
    wire: Mutex<Vec<W>>,
}

impl BuggyConnection {
    fn return_one(&self, inc: u64) {
        if self.current.load(Ordering::Acquire) != inc {
            return;
        }
        self.accumulator.fetch_add(1, Ordering::AcqRel);
        let drained = self.accumulator.swap(0, Ordering::AcqRel);
        if drained > 0 {
            self.requests.lock().push((inc, drained as u32));
        }
    }

    fn flush_without_revalidation(&self) {
        let reqs: Vec<_> = std::mem::take(&mut *self.requests.lock());
        for (inc, n) in reqs {
            // BUG: no check that `inc` is still the current incarnation
            self.wire.lock().push(W::Flow(inc, n));
        }
    }

    fn replace(&self, old: u64, new: u64) {
        let mut wire = self.wire.lock();
        wire.push(W::Close(old));
        self.current.store(new, Ordering::Release);
        self.accumulator.store(0, Ordering::Release);
        wire.push(W::Subscribe(new));
    }
}

/// Negative control: the miniature protocol without revalidation. Must fail
/// with "old incarnation Flow written after replacement's Subscribe".
pub fn flow_without_revalidation() {
    let conn = Arc::new(BuggyConnection {
        current: AtomicU64::new(1),
        accumulator: AtomicU64::new(0),
        requests: Mutex::new(Vec::new()),
        wire: Mutex::new(vec![W::Subscribe(1)]),
    });
    let returner = {
        let conn = Arc::clone(&conn);
        thread::spawn(move || conn.return_one(1))
    };
    let task = {
        let conn = Arc::clone(&conn);
        thread::spawn(move || conn.flush_without_revalidation())
    };
    conn.replace(1, 2);
    returner.join().unwrap();
    task.join().unwrap();
    conn.flush_without_revalidation();
    let wire = conn.wire.lock().clone();
    check_wire_order(&wire, 1, 2);
}
