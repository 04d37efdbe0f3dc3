//! The `replay_race` stage of `pulsar-core simulate`: the real pending-ack
//! replay on a real managed ledger, driven through the situations
//! the main simulation does not produce, each checked against an external
//! oracle.
//!
//! The main simulation replays on one thread in virtual time, with a log
//! that mostly fits one read batch and a cursor only its own handle moves.
//! This stage (≤ [`ReplayRaceConfig::race`] wall time, default 1 s, plus a
//! few ms) runs five scenarios:
//!
//! | scenario | what it does | rule (violation when) |
//! |---|---|---|
//! | `read-ahead failure` | a handle ([`PendingAckHandle`], batched writer on, [`InlineReads`], read batch 2) replays a 60-entry log; its third read fails (storage unavailable) while entries read ahead are queued, unapplied; the retry completes | **replay complete without every durable record**: the Ready handle's open transactions differ from the log's (entries read ahead by the failed attempt and never applied were skipped: no rewind) |
//! | same run | after Ready, virtual time advances 20 ms | **failed attempt's buffered writer left open**: the failed attempt's writer is not Closed, or its flush timer still runs after the attempt failed |
//! | `reload over a cached cursor` | a first handle replays the log and closes (topic unloaded); the managed ledger keeps the cursor, whose read position is at the log end; a second handle over the same cursor replays | **replay complete without every durable record** (a replay that started where the previous owner left the cursor and ran dry short of the log end was reported complete), or **replay never completed** within 200 attempts |
//! | `read failure race` | for the stage's wall time: one attempt after another ([`ReplayAttempt`] on a real thread, applying to a [`PendingAckState`]); the first read (64 entries) completes inline; a storage thread fails the second at a varying point while the replay thread applies the first read's entries (so `fill_queue` runs concurrently with `read_failed`) | **read issued after a read failure**: the dispatcher receives a read of the attempt after the storage thread started delivering its failure |
//!
//! | `read failure inside fill_queue` | 8 attempts on this thread, read batch 8; the first read completes inline; at the test hook point [`Point::FillQueueBetweenLoads`] with the second read outstanding, a storage thread delivers that read's failure and the hook waits until `read_failed` returned (with the loads in order the point is reached only once nothing is outstanding: the failure is then delivered between two entries instead) | **read issued after a read failure** (as above) |
//! | `fill_queue inside read_failed` | same attempts; the storage thread's `read_failed` is parked at the test hook point [`Point::ReadFailedBetweenStores`] while the replay thread runs one whole `fill_queue` pass | **read issued after a read failure** (as above) |
//!
//! The read failure race reaches a reversed load order in `fill_queue` or a
//! reversed store order in `read_failed` only when the two threads run at
//! the same instant, so its catch rate depends on the machine's load. The
//! two forced interleavings place the failure inside that window through
//! the crate's test hooks (`crate::sync::hook`) on every trial, so either
//! reversal is caught on every run (loom, shuttle and trace validation
//! check the same orderings exhaustively or by schedule). Counters that
//! depend on timing (trials, reads) are kept with the wall-clock figures,
//! out of the same-seed comparison; on correct code the violations are
//! always 0.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::ledger::{
    LedgerConfig, LedgerError, ManagedCursor, ManagedLedger, MemoryStore, ReadFailureKind,
};
use crate::pending_ack::replay::{ReadDispatcher, ReadJob, ReplayAttempt, ReplaySink};
use crate::pending_ack::{
    AckType, AckedPosition, ExecutorMode, HandleConfig, HandleState, InlineReads, PendingAckHandle,
    PendingAckRecord, PendingAckState, ReplayConfig, ReplayExecutorPool, Timer, TxnId,
    VirtualTimer, WriterConfig, WriterState,
};
use crate::position::Position;
use crate::sync::hook::{self, Point};

/// Transactions in the scenarios' log: each an individual ack; the even
/// ones also committed (so 60 entries, 20 transactions open at the end).
const LOG_TXNS: u64 = 40;
/// The read (1-based, over the handle's reads) that fails in the
/// read-ahead scenario: after two reads of two entries were queued.
const FAIL_READ: u64 = 3;
/// Bound on timer steps / executor rounds while driving a handle.
const DRIVE_STEPS: usize = 20_000;
/// Attempts after which a handle that is still not Ready is a violation.
const MAX_ATTEMPTS: u64 = 200;
/// Entries of the race scenario's log (single-record acks, never trimmed).
const RACE_ENTRIES: u64 = 200;
/// Entries per read in the race scenario (the first read's entries keep the
/// replay thread busy while the second read fails).
const RACE_BATCH: usize = 64;
/// Bound on one race trial (a trial takes well under a millisecond).
const TRIAL_BOUND: Duration = Duration::from_secs(5);
/// Trials of each forced interleaving (each a few reads on a 40-entry log).
const FORCED_TRIALS: u64 = 8;
/// Entries per read in the forced interleavings: the first read's entries
/// keep the replay loop iterating (and calling `fill_queue`) while the
/// second read is outstanding.
const FORCED_BATCH: usize = 8;
/// Entries of the forced interleavings' log.
const FORCED_ENTRIES: u64 = 40;

/// Parameters of the stage.
#[derive(Debug, Clone)]
pub struct ReplayRaceConfig {
    /// Wall time of the read failure race.
    pub race: Duration,
}

impl Default for ReplayRaceConfig {
    fn default() -> Self {
        Self {
            race: Duration::from_millis(1_000),
        }
    }
}

/// What the stage did and found. The violation counters are checked; the
/// others vary with thread timing.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ReplayRaceReport {
    /// Handles driven to Ready (two scenarios, three handles).
    pub handles_ready: u64,
    /// Replay attempts of those handles that failed and were retried.
    pub failed_attempts: u64,
    /// Race trials (replay attempts on a real thread failed mid-pipeline).
    pub race_trials: u64,
    /// Race trials whose failure landed while the replay thread was still
    /// applying the first read's entries.
    pub race_failures_mid_apply: u64,
    /// Handles reported Ready whose open transactions differ from the log's
    /// (violations).
    pub incomplete_ready: u64,
    /// Failed attempts whose buffered writer was left open or whose flush
    /// timer ran after the failure (violations).
    pub writers_left_open: u64,
    /// Handles not Ready within the attempt bound (violations).
    pub never_ready: u64,
    /// Trials of the forced interleavings run to their end (the second read
    /// issued and failed with the interleaving in place).
    pub forced_trials: u64,
    /// Reads issued by an attempt after its read failure began (violations;
    /// the read failure race and the forced interleavings).
    pub reads_after_failure: u64,
    /// The first violation, if any.
    pub first_violation: Option<String>,
}

impl ReplayRaceReport {
    /// Total violations.
    pub fn violations(&self) -> u64 {
        self.incomplete_ready + self.writers_left_open + self.never_ready + self.reads_after_failure
    }

    /// Adds a scenario's count of reads issued after a read failure and
    /// reports its first one as the violation.
    fn report_reads_after_failure(&mut self, count: &AtomicU64, first: &Mutex<Option<String>>) {
        let after = count.load(Ordering::SeqCst);
        self.reads_after_failure += after;
        if after > 0 {
            let first = first.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if let Some(first) = first {
                self.violation(first);
            }
        }
    }

    fn violation(&mut self, what: String) {
        if self.first_violation.is_none() {
            self.first_violation = Some(what);
        }
    }
}

/// What a complete replay of the scenarios' log must hold: txn → the
/// positions it acks, for the open (uncommitted) transactions.
type OpenTxns = BTreeMap<TxnId, BTreeSet<Position>>;

fn ledger(name: &str) -> Result<Arc<ManagedLedger>, String> {
    let cfg = LedgerConfig {
        max_entries_per_ledger: 1_000,
        auto_skip_non_recoverable_data: false,
    };
    ManagedLedger::open(name, cfg, Arc::new(MemoryStore::new())).map_err(|e| e.to_string())
}

/// The pending-ack store's cursor over `ml` (`__pending_ack_state`).
fn pending_ack_cursor(ml: &Arc<ManagedLedger>) -> Result<Arc<ManagedCursor>, String> {
    Ok(Arc::new(
        ml.open_cursor("__pending_ack_state")
            .map_err(|e| e.to_string())?,
    ))
}

/// Appends `n` individual-ack records, one per entry: transaction
/// (`txn_high`, i) acknowledges position `ack_ledger`:i, for i in 0..n.
fn append_individual_acks(
    ml: &ManagedLedger,
    txn_high: u64,
    ack_ledger: i64,
    n: u64,
) -> Result<(), String> {
    for i in 0..n {
        let t = TxnId::new(txn_high, i);
        let p = Position::new(ack_ledger, i as i64);
        ml.append(&PendingAckRecord::individual_ack(t, vec![AckedPosition::whole(p)]).encode())
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Writes the scenarios' log (one record per entry) and returns the open
/// transactions a complete replay must find.
fn write_log(ml: &ManagedLedger) -> Result<OpenTxns, String> {
    let mut open = OpenTxns::new();
    for i in 0..LOG_TXNS {
        let t = TxnId::new(7, i);
        let p = Position::new(100, i as i64);
        ml.append(&PendingAckRecord::individual_ack(t, vec![AckedPosition::whole(p)]).encode())
            .map_err(|e| e.to_string())?;
        if i % 2 == 0 {
            ml.append(&PendingAckRecord::commit(t, AckType::Individual).encode())
                .map_err(|e| e.to_string())?;
        } else {
            open.insert(t, BTreeSet::from([p]));
        }
    }
    Ok(open)
}

struct Driven {
    handle: PendingAckHandle,
    timer: Arc<VirtualTimer>,
}

/// A handle named `name` over `cursor` (manual executor, virtual timer,
/// inline reads, read batch 2), driven until Ready or Error or the bounds.
fn drive_handle(
    name: &str,
    cursor: Arc<ManagedCursor>,
    writer: WriterConfig,
) -> Result<Driven, String> {
    let pool = ReplayExecutorPool::new(1, ExecutorMode::Manual).map_err(|e| e.to_string())?;
    let timer = Arc::new(VirtualTimer::new());
    let cfg = HandleConfig {
        replay: ReplayConfig {
            queue_capacity: 16,
            read_batch: 2,
        },
        writer,
        ..HandleConfig::default()
    };
    let handle = PendingAckHandle::new(
        name,
        cursor,
        Arc::new(crate::pending_ack::MemorySubscription::default()),
        &pool,
        Arc::new(InlineReads),
        Arc::clone(&timer) as Arc<dyn Timer>,
        cfg,
    )
    .map_err(|e| e.to_string())?;
    handle.init();
    for _ in 0..DRIVE_STEPS {
        pool.run_pending();
        if matches!(handle.state(), HandleState::Ready | HandleState::Error)
            || handle.stats().attempts >= MAX_ATTEMPTS
        {
            break;
        }
        if !timer.fire_next() {
            break;
        }
    }
    Ok(Driven { handle, timer })
}

/// Checks a driven handle is Ready with exactly `open`; returns whether it
/// was Ready.
fn check_ready(r: &mut ReplayRaceReport, scenario: &str, d: &Driven, open: &OpenTxns) -> bool {
    let h = &d.handle;
    let stats = h.stats();
    if h.state() != HandleState::Ready {
        r.never_ready += 1;
        r.violation(format!(
            "replay_race ({scenario}): replay never completed: state {:?} after {} attempts (error {:?})",
            h.state(),
            stats.attempts,
            h.error()
        ));
        return false;
    }
    r.handles_ready += 1;
    r.failed_attempts += stats.attempts.saturating_sub(1);
    let found = h.summary().individual;
    if &found != open {
        r.incomplete_ready += 1;
        let missing: Vec<String> = open
            .keys()
            .filter(|t| !found.contains_key(t))
            .map(|t| format!("{}:{}", t.most_sig_bits, t.least_sig_bits))
            .collect();
        let shown = missing.len().min(5);
        r.violation(format!(
            "replay_race ({scenario}): replay complete without every durable record: {} open transactions in the log, {} found after {} attempts (missing {}: [{}{}])",
            open.len(),
            found.len(),
            stats.attempts,
            missing.len(),
            missing[..shown].join(", "),
            if missing.len() > shown { ", ..." } else { "" }
        ));
    }
    true
}

/// Read-ahead failure: the third read fails with entries of the second
/// queued; the retry must apply every record, and the failed attempt's
/// buffered writer must be closed with its flush timer stopped.
fn read_ahead_failure(r: &mut ReplayRaceReport) -> Result<(), String> {
    let ml = ledger("replay-race-read-ahead")?;
    let open = write_log(&ml)?;
    let reads = Arc::new(AtomicU64::new(0));
    {
        let reads = Arc::clone(&reads);
        ml.faults().set_policy(move |_| {
            let n = reads.fetch_add(1, Ordering::SeqCst) + 1;
            (n == FAIL_READ).then_some(ReadFailureKind::StorageUnavailable)
        });
    }
    let cursor = pending_ack_cursor(&ml)?;
    let writer = WriterConfig {
        batch_enabled: true,
        ..WriterConfig::default()
    };
    let d = drive_handle("replay-race-read-ahead", cursor, writer)?;
    if !check_ready(r, "read-ahead failure", &d, &open) {
        return Ok(());
    }
    if d.handle.stats().attempts < 2 {
        return Err(format!(
            "read-ahead failure: the injected failure of read {FAIL_READ} failed no attempt ({} reads)",
            reads.load(Ordering::SeqCst)
        ));
    }
    let Some(w) = d.handle.last_failed_writer() else {
        r.writers_left_open += 1;
        r.violation(
            "replay_race (read-ahead failure): failed attempt's buffered writer left open: the handle recorded none".into(),
        );
        return Ok(());
    };
    let runs_before = w.timer_runs();
    d.timer.advance(20);
    let runs_after = w.timer_runs();
    if w.state() != WriterState::Closed || w.has_flush_timer() || runs_after > runs_before {
        r.writers_left_open += 1;
        r.violation(format!(
            "replay_race (read-ahead failure): failed attempt's buffered writer left open: state {:?}, flush timer armed {}, {} flush-timer runs in the 20 ms after Ready",
            w.state(),
            w.has_flush_timer(),
            runs_after - runs_before
        ));
    }
    d.handle.close();
    Ok(())
}

/// Reload over a cached cursor: a first handle replays and closes; the
/// cursor (cached by the managed ledger) is left at the log end; a second
/// handle over it must still apply every record.
fn reload_over_cached_cursor(r: &mut ReplayRaceReport) -> Result<(), String> {
    let ml = ledger("replay-race-reload")?;
    let open = write_log(&ml)?;
    let cursor = pending_ack_cursor(&ml)?;
    let first = drive_handle(
        "replay-race-reload",
        Arc::clone(&cursor),
        WriterConfig::default(),
    )?;
    let ready = check_ready(r, "first load", &first, &open);
    first.handle.close();
    if !ready {
        return Ok(());
    }
    if cursor.has_more_entries() {
        return Err(format!(
            "reload over a cached cursor: the first replay left the read position at {}, not at the log end",
            cursor.read_position()
        ));
    }
    let second = drive_handle("replay-race-reload", cursor, WriterConfig::default())?;
    check_ready(r, "reload over a cached cursor", &second, &open);
    second.handle.close();
    Ok(())
}

/// The race scenario's shared observations (std atomics, outside the
/// component).
#[derive(Default)]
struct RaceOracle {
    /// Current trial (1-based).
    trial: AtomicU64,
    /// Reads dispatched in the current trial.
    dispatched: AtomicU64,
    /// Entries applied in the current trial.
    applied: AtomicU64,
    /// The trial whose read failure the storage thread started delivering.
    failing: AtomicU64,
    /// Reads dispatched after that (violations).
    reads_after_failure: AtomicU64,
    /// The first one, described.
    first: Mutex<Option<String>>,
}

struct RaceJob {
    job: ReadJob,
    trial: u64,
    nth: u64,
}

#[derive(Debug)]
struct RaceDispatcher {
    oracle: Arc<RaceOracle>,
    jobs: Mutex<mpsc::Sender<RaceJob>>,
}

impl std::fmt::Debug for RaceOracle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaceOracle")
            .field("trial", &self.trial)
            .finish_non_exhaustive()
    }
}

impl ReadDispatcher for RaceDispatcher {
    fn dispatch(&self, job: ReadJob) {
        let o = &self.oracle;
        let trial = o.trial.load(Ordering::SeqCst);
        let nth = o.dispatched.fetch_add(1, Ordering::SeqCst) + 1;
        if o.failing.load(Ordering::SeqCst) == trial {
            o.reads_after_failure.fetch_add(1, Ordering::SeqCst);
            let mut first = o.first.lock().unwrap_or_else(|e| e.into_inner());
            if first.is_none() {
                *first = Some(format!(
                    "replay_race (read failure race): read issued after a read failure: trial {trial}, read {nth} dispatched after read 2 failed ({} entries applied)",
                    o.applied.load(Ordering::SeqCst)
                ));
            }
        }
        if nth == 1 {
            // The first read completes inline (re-entering the replay thread
            // inside `fill_queue`), so the trial goes straight to applying
            // its entries while the second read is outstanding.
            job.run();
            return;
        }
        let sent = self
            .jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(RaceJob { job, trial, nth });
        if let Err(mpsc::SendError(j)) = sent {
            j.job.fail(LedgerError::StorageUnavailable {
                reason: "replay_race storage thread stopped".into(),
            });
        }
    }
}

/// Applies to a real [`PendingAckState`] and counts the entries applied.
struct CountingSink<'a> {
    state: PendingAckState,
    applied: &'a AtomicU64,
}

impl ReplaySink for CountingSink<'_> {
    fn apply_entry(
        &mut self,
        position: Position,
        records: &[PendingAckRecord],
    ) -> Option<Position> {
        let trim = self.state.apply_entry(position, records);
        self.applied.fetch_add(1, Ordering::SeqCst);
        trim
    }
}

/// The storage thread: fails each trial's second read once the replay
/// thread has applied `1 + trial % 8` entries of the first, after
/// `(trial / 8) % 32` more spins (so over the trials the failure lands at
/// every point of the replay loop's iteration); completes any other read
/// (one issued after the failure) on the real cursor.
fn storage(rx: mpsc::Receiver<RaceJob>, oracle: Arc<RaceOracle>, mid_apply: Arc<AtomicU64>) {
    loop {
        let job = match rx.try_recv() {
            Ok(j) => j,
            Err(mpsc::TryRecvError::Empty) => {
                std::hint::spin_loop();
                continue;
            }
            Err(mpsc::TryRecvError::Disconnected) => return,
        };
        if job.nth != 2 {
            job.job.run();
            continue;
        }
        let target = 1 + job.trial % 8;
        let spin_until = Instant::now() + Duration::from_millis(2);
        while oracle.applied.load(Ordering::SeqCst) < target && Instant::now() < spin_until {
            std::hint::spin_loop();
        }
        for _ in 0..(job.trial / 8) % 32 {
            std::hint::spin_loop();
        }
        if oracle.applied.load(Ordering::SeqCst) < RACE_BATCH as u64 {
            mid_apply.fetch_add(1, Ordering::Relaxed);
        }
        oracle.failing.store(job.trial, Ordering::SeqCst);
        job.job.fail(LedgerError::StorageUnavailable {
            reason: "replay_race: injected read failure".into(),
        });
    }
}

/// The read failure race for `duration`, on a thread of its own bounded by
/// [`TRIAL_BOUND`] per trial.
fn read_failure_race(
    r: &mut ReplayRaceReport,
    duration: Duration,
    progress: &dyn Fn(),
) -> Result<(), String> {
    let ml = ledger("replay-race-race")?;
    append_individual_acks(&ml, 9, 200, RACE_ENTRIES)?;
    let cursor = pending_ack_cursor(&ml)?;
    let oracle = Arc::new(RaceOracle::default());
    let mid_apply = Arc::new(AtomicU64::new(0));
    let (tx, rx) = mpsc::channel();
    let storage_thread = {
        let (oracle, mid_apply) = (Arc::clone(&oracle), Arc::clone(&mid_apply));
        std::thread::spawn(move || storage(rx, oracle, mid_apply))
    };
    let dispatcher: Arc<dyn ReadDispatcher> = Arc::new(RaceDispatcher {
        oracle: Arc::clone(&oracle),
        jobs: Mutex::new(tx),
    });
    let config = ReplayConfig {
        queue_capacity: 4 * RACE_ENTRIES as usize,
        read_batch: RACE_BATCH,
    };
    let (done_tx, done_rx) = mpsc::channel();
    let replay_thread = {
        let oracle = Arc::clone(&oracle);
        std::thread::spawn(move || {
            let deadline = Instant::now() + duration;
            let mut trials = 0u64;
            while Instant::now() < deadline {
                trials += 1;
                oracle.applied.store(0, Ordering::SeqCst);
                oracle.dispatched.store(0, Ordering::SeqCst);
                oracle.trial.store(trials, Ordering::SeqCst);
                // Every trial starts from the log's first entry whatever the
                // replay does with the cursor (the stage's own reset).
                cursor.rewind();
                let attempt = match ReplayAttempt::new(
                    format!("replay-race#{trials}"),
                    Arc::clone(&cursor),
                    Arc::clone(&dispatcher),
                    config,
                ) {
                    Ok(a) => a,
                    Err(e) => {
                        let _ = done_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                let mut sink = CountingSink {
                    state: PendingAckState::default(),
                    applied: &oracle.applied,
                };
                // The attempt fails (read 2); its outcome is not this
                // scenario's rule.
                let _ = attempt.run(&mut sink);
                let _ = done_tx.send(Ok(trials));
            }
            drop(dispatcher);
        })
    };
    let mut trials = 0u64;
    let bound = Instant::now() + duration + TRIAL_BOUND;
    let mut last_progress = Instant::now();
    loop {
        match done_rx.recv_timeout(TRIAL_BOUND) {
            Ok(Ok(n)) => {
                trials = n;
                if last_progress.elapsed() >= Duration::from_millis(100) {
                    last_progress = Instant::now();
                    progress();
                }
            }
            Ok(Err(e)) => return Err(e),
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                r.never_ready += 1;
                r.violation(format!(
                    "replay_race (read failure race): replay attempt did not end within {TRIAL_BOUND:?} (trial {})",
                    trials + 1
                ));
                // The threads are left behind: the process reports and exits.
                return Ok(());
            }
        }
        if Instant::now() > bound {
            break;
        }
    }
    let _ = replay_thread.join();
    let _ = storage_thread.join();
    r.race_trials += trials;
    r.race_failures_mid_apply += mid_apply.load(Ordering::Relaxed);
    r.report_reads_after_failure(&oracle.reads_after_failure, &oracle.first);
    Ok(())
}

/// The two forced interleavings of a read failure with `fill_queue`, each
/// placed through a test hook (`crate::sync::hook`) exactly inside the
/// window that the read failure race reaches only by luck.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Forced {
    /// On the replay thread, at [`Point::FillQueueBetweenLoads`] with the
    /// second read outstanding: the storage thread delivers that read's
    /// failure, and the hook waits until `read_failed` has returned. With
    /// R1 (`outstanding_reads`) loaded first the point is reached only
    /// after the failure's decrement, so nothing is outstanding; with R2
    /// (`is_readable`) first the flag was read before the failure and R1
    /// then sees 0.
    FailureInsideFillQueue,
    /// On the storage thread, at [`Point::ReadFailedBetweenStores`]: the
    /// replay thread runs a whole `fill_queue` pass while the hook waits.
    /// With `is_readable` cleared first that pass sees the read still
    /// outstanding; with the decrement first it sees 0 reads and a
    /// readable attempt.
    FillQueueInsideReadFailed,
}

/// The handshake of one forced-interleaving trial (guarded by
/// [`Baton::steps`]).
#[derive(Debug, Default)]
struct Steps {
    /// Reads dispatched in this trial.
    dispatched: u64,
    /// Entries applied in this trial.
    applied: u64,
    /// Entries applied when the second read was dispatched.
    applied_at_second_read: Option<u64>,
    /// The storage thread is to fail the second read.
    fail_requested: bool,
    /// The storage thread started delivering the failure.
    failing: bool,
    /// `read_failed` of the second read returned.
    failed: bool,
    /// The storage thread is parked in `read_failed`'s hook.
    at_hook: bool,
    /// The replay thread came back from a `fill_queue` pass that started
    /// after the storage thread parked in the hook.
    pass_done: bool,
    /// A handshake wait ran out (the scenario is stuck).
    stuck: Option<String>,
}

/// The forced interleavings' shared state (std primitives, outside the
/// component) and its oracle.
#[derive(Debug, Default)]
struct Baton {
    /// The scenario's name (for the violation).
    scenario: &'static str,
    trial: AtomicU64,
    steps: Mutex<Steps>,
    moved: std::sync::Condvar,
    /// Reads dispatched after the second read's failure began (violations).
    reads_after_failure: AtomicU64,
    first: Mutex<Option<String>>,
}

impl Baton {
    fn lock(&self) -> std::sync::MutexGuard<'_, Steps> {
        self.steps.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies `f` to the steps and wakes every waiter.
    fn update(&self, f: impl FnOnce(&mut Steps)) {
        f(&mut self.lock());
        self.moved.notify_all();
    }

    /// Waits until `done` holds, at most [`TRIAL_BOUND`]; a timeout is
    /// recorded as the trial's `stuck` reason (`what`).
    fn wait(&self, what: &str, done: impl Fn(&Steps) -> bool) {
        let deadline = Instant::now() + TRIAL_BOUND;
        let mut s = self.lock();
        while !done(&s) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                s.stuck.get_or_insert_with(|| what.to_string());
                return;
            }
            s = self
                .moved
                .wait_timeout(s, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// Runs the first read inline, sends the second to the storage thread,
/// runs any later one inline, and records every read dispatched after the
/// second read's failure began.
#[derive(Debug)]
struct ForcedDispatcher {
    baton: Arc<Baton>,
    jobs: Mutex<mpsc::Sender<ReadJob>>,
}

impl ReadDispatcher for ForcedDispatcher {
    fn dispatch(&self, job: ReadJob) {
        let b = &self.baton;
        let nth = {
            let mut s = b.lock();
            s.dispatched += 1;
            if s.dispatched == 2 {
                s.applied_at_second_read = Some(s.applied);
            }
            if s.failing {
                b.reads_after_failure.fetch_add(1, Ordering::SeqCst);
                let mut first = b.first.lock().unwrap_or_else(|e| e.into_inner());
                first.get_or_insert_with(|| {
                    format!(
                        "replay_race ({}): read issued after a read failure: trial {}, read {} dispatched after read 2's failure began ({} entries applied)",
                        b.scenario,
                        b.trial.load(Ordering::SeqCst),
                        s.dispatched,
                        s.applied
                    )
                });
            }
            s.dispatched
        };
        if nth != 2 {
            job.run();
            return;
        }
        let sent = self
            .jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(job);
        if let Err(mpsc::SendError(job)) = sent {
            job.fail(LedgerError::StorageUnavailable {
                reason: "replay_race storage thread stopped".into(),
            });
        }
    }
}

/// The forced interleavings' sink: applies to a real [`PendingAckState`]
/// and, on the replay thread between entries, drives the handshake.
struct ForcedSink {
    state: PendingAckState,
    baton: Arc<Baton>,
    forced: Forced,
}

impl ReplaySink for ForcedSink {
    fn apply_entry(
        &mut self,
        position: Position,
        records: &[PendingAckRecord],
    ) -> Option<Position> {
        let trim = self.state.apply_entry(position, records);
        let b = &self.baton;
        let request = {
            let mut s = b.lock();
            s.applied += 1;
            if s.at_hook && !s.pass_done {
                // The fill_queue pass since the previous entry ran entirely
                // while the storage thread was parked in read_failed.
                s.pass_done = true;
                b.moved.notify_all();
            }
            let request = !s.fail_requested
                && s.applied_at_second_read
                    .is_some_and(|at| match self.forced {
                        // One whole loop iteration (a fill_queue pass) with
                        // the second read outstanding, then fail it.
                        Forced::FailureInsideFillQueue => s.applied >= at + 2,
                        Forced::FillQueueInsideReadFailed => s.applied > at,
                    });
            if request {
                s.fail_requested = true;
                b.moved.notify_all();
            }
            request
        };
        if request {
            match self.forced {
                Forced::FailureInsideFillQueue => b.wait(
                    "the second read's failure (requested between entries)",
                    |s| s.failed,
                ),
                // Return once the storage thread is parked in the hook: the
                // next fill_queue pass runs inside read_failed.
                Forced::FillQueueInsideReadFailed => {
                    b.wait("read_failed reaching its hook point", |s| s.at_hook)
                }
            }
        }
        trim
    }
}

/// The forced interleavings' storage thread: waits until the second read's
/// failure is requested, then delivers it; with
/// [`Forced::FillQueueInsideReadFailed`] its hook parks `read_failed`
/// between its two stores until the replay thread ran a `fill_queue` pass.
fn forced_storage(rx: mpsc::Receiver<ReadJob>, baton: Arc<Baton>, forced: Forced) {
    let _hook = (forced == Forced::FillQueueInsideReadFailed).then(|| {
        let baton = Arc::clone(&baton);
        hook::install(move |point| {
            if point == Point::ReadFailedBetweenStores {
                baton.update(|s| s.at_hook = true);
                baton.wait("a fill_queue pass inside read_failed", |s| s.pass_done);
            }
        })
    });
    while let Ok(job) = rx.recv() {
        baton.wait("the request to fail the second read", |s| s.fail_requested);
        baton.update(|s| s.failing = true);
        job.fail(LedgerError::StorageUnavailable {
            reason: "replay_race: injected read failure".into(),
        });
        baton.update(|s| s.failed = true);
    }
}

/// One forced interleaving, [`FORCED_TRIALS`] trials: a [`ReplayAttempt`]
/// on this thread over a 40-entry log, read batch 8; the first read
/// completes inline, the second is failed by a storage thread exactly
/// inside the window `forced` names. Rule: **read issued after a read
/// failure** (the dispatcher receives a read of the attempt after the
/// storage thread started delivering the second read's failure). Every
/// trial must issue and fail the second read with the interleaving in
/// place (else the scenario reports that it failed to run).
fn forced_interleaving(r: &mut ReplayRaceReport, forced: Forced) -> Result<(), String> {
    let ml = ledger("replay-race-forced")?;
    append_individual_acks(&ml, 11, 300, FORCED_ENTRIES)?;
    let cursor = pending_ack_cursor(&ml)?;
    let baton = Arc::new(Baton {
        scenario: match forced {
            Forced::FailureInsideFillQueue => "read failure inside fill_queue",
            Forced::FillQueueInsideReadFailed => "fill_queue inside read_failed",
        },
        ..Baton::default()
    });
    let (tx, rx) = mpsc::channel();
    let storage_thread = {
        let baton = Arc::clone(&baton);
        std::thread::spawn(move || forced_storage(rx, baton, forced))
    };
    let dispatcher: Arc<dyn ReadDispatcher> = Arc::new(ForcedDispatcher {
        baton: Arc::clone(&baton),
        jobs: Mutex::new(tx),
    });
    let _hook = (forced == Forced::FailureInsideFillQueue).then(|| {
        let baton = Arc::clone(&baton);
        hook::install(move |point| {
            if point != Point::FillQueueBetweenLoads {
                return;
            }
            let request = {
                let mut s = baton.lock();
                let request = s.dispatched >= 2 && !s.fail_requested;
                s.fail_requested |= request;
                request
            };
            if request {
                baton.moved.notify_all();
                baton.wait(
                    "the second read's failure (requested inside fill_queue)",
                    |s| s.failed,
                );
            }
        })
    });
    let config = ReplayConfig {
        queue_capacity: 4 * FORCED_ENTRIES as usize,
        read_batch: FORCED_BATCH,
    };
    let mut outcome = Ok(());
    for trial in 1..=FORCED_TRIALS {
        *baton.lock() = Steps::default();
        baton.trial.store(trial, Ordering::SeqCst);
        cursor.rewind();
        let attempt = ReplayAttempt::new(
            format!("replay-race-forced#{trial}"),
            Arc::clone(&cursor),
            Arc::clone(&dispatcher),
            config,
        )
        .map_err(|e| e.to_string())?;
        let mut sink = ForcedSink {
            state: PendingAckState::default(),
            baton: Arc::clone(&baton),
            forced,
        };
        // The attempt fails (read 2); its outcome is not this scenario's rule.
        let _ = attempt.run(&mut sink);
        // The pass that ended the attempt (nothing readable) ran inside
        // read_failed too: release the storage thread, then wait for it.
        baton.update(|s| s.pass_done = true);
        baton.wait("the second read's failure to return", |s| s.failed);
        let s = baton.lock();
        if let Some(what) = &s.stuck {
            outcome = Err(format!("trial {trial}: timed out waiting for {what}"));
            break;
        }
        if s.dispatched < 2 || !s.failed {
            outcome = Err(format!(
                "trial {trial}: the second read was not issued and failed ({} reads)",
                s.dispatched
            ));
            break;
        }
        r.forced_trials += 1;
    }
    drop(dispatcher);
    let _ = storage_thread.join();
    r.report_reads_after_failure(&baton.reads_after_failure, &baton.first);
    outcome
}

/// One scenario of the stage (fills the report; `Err` when it cannot be set up).
type Scenario<'a> = Box<dyn Fn(&mut ReplayRaceReport) -> Result<(), String> + 'a>;

/// Runs the stage's five scenarios. A scenario that cannot be set up (a
/// store error) is reported as a violation naming it.
pub fn run(config: &ReplayRaceConfig) -> ReplayRaceReport {
    run_with_progress(config, &|| {})
}

/// [`run`], calling `progress` about every 100 ms while trials complete (the
/// simulator's hang watchdog counts them as finished events; a trial that
/// does not end within 5 s is a violation of its own).
pub fn run_with_progress(config: &ReplayRaceConfig, progress: &dyn Fn()) -> ReplayRaceReport {
    let mut r = ReplayRaceReport::default();
    let steps: [(&str, Scenario<'_>); 5] = [
        ("read-ahead failure", Box::new(read_ahead_failure)),
        (
            "reload over a cached cursor",
            Box::new(reload_over_cached_cursor),
        ),
        (
            "read failure inside fill_queue",
            Box::new(|r: &mut ReplayRaceReport| {
                forced_interleaving(r, Forced::FailureInsideFillQueue)
            }),
        ),
        (
            "fill_queue inside read_failed",
            Box::new(|r: &mut ReplayRaceReport| {
                forced_interleaving(r, Forced::FillQueueInsideReadFailed)
            }),
        ),
        (
            "read failure race",
            Box::new(|r: &mut ReplayRaceReport| read_failure_race(r, config.race, progress)),
        ),
    ];
    for (name, step) in steps {
        if let Err(e) = step(&mut r) {
            r.never_ready += 1;
            r.violation(format!("replay_race ({name}): scenario failed to run: {e}"));
        }
    }
    r
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests {
    use super::*;

    #[test]
    fn replay_race_on_the_real_code_is_clean_and_exercises_every_scenario() {
        // Whether a 200 ms race window lands a failure while entries are
        // being applied depends on the machine's load: up to 20 windows
        // (4 s), every one clean, at least one with a mid-apply failure.
        let mut mid_apply = 0;
        for _ in 0..20 {
            let r = run(&ReplayRaceConfig {
                race: Duration::from_millis(200),
            });
            assert_eq!(r.violations(), 0, "{r:?}");
            assert_eq!(r.handles_ready, 3, "{r:?}");
            assert_eq!(r.forced_trials, 2 * FORCED_TRIALS, "{r:?}");
            assert!(r.failed_attempts >= 1, "{r:?}");
            assert!(r.race_trials > 0, "{r:?}");
            mid_apply += r.race_failures_mid_apply;
            if mid_apply > 0 {
                break;
            }
        }
        assert!(mid_apply > 0, "no race window failed a read mid-apply");
    }
}
