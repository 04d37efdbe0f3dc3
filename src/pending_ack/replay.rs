//! One replay attempt of the pending-ack log (Pulsar's
//! `MLPendingAckStore.replayAsync` + `FillEntryQueueCallback`; a read
//! failure it does not classify ends the replay).
//!
//! The attempt reads ahead of processing: the replay thread's
//! [`ReplayAttempt::fill_queue`] issues at most one read of
//! [`ReplayConfig::read_batch`] entries at a time into a bounded entry queue,
//! reads complete or fail on another thread (or inline), and the replay
//! thread applies dequeued entries. The orderings that make "no read after a
//! failure" hold:
//!
//! * writer ([`ReplayAttempt::read_failed`]): store the failure, clear
//!   `is_readable`, **then** decrement `outstanding_reads`;
//! * writer ([`ReplayAttempt::read_complete`]): enqueue, **then** decrement;
//! * reader ([`ReplayAttempt::fill_queue`]): load `outstanding_reads`, and
//!   only if it is 0 load `is_readable`.
//!
//! Only the replay thread increments the counter, so observing 0 while a
//! read was in flight means observing the decrement, and with it the cleared
//! flag (SeqCst on both). `loom-tests/pending_ack.rs` checks this on this
//! very code; `specs/PendingAckReplay.tla` checks the protocol. Between the
//! two loads and between the two stores are the test hook points
//! [`hook::Point::FillQueueBetweenLoads`] and
//! [`hook::Point::ReadFailedBetweenStores`] (nothing without the
//! `race-hooks` feature), where the simulator's `replay_race` stage places
//! the other thread's operation on every run.
//!
//! Start of an attempt: the cursor is cached and shared, so its read
//! position may be anywhere; [`ReplayAttempt::run`] first rewinds it to the
//! entry after the mark-delete, where the attempt's load position starts.
//!
//! End of an attempt ([`ReplayAttempt::run`]): the replay completes when it
//! caught up to the last-confirmed snapshot, on one of the three completing
//! failure shapes ([`classify`]), when a failure arrives after it caught up,
//! or (auto-skip on) when nothing is readable and the queue is drained. A
//! replay that runs dry short of the snapshot otherwise is failed with
//! [`PendingAckError::IncompleteReplay`]: Ready implies every record up to
//! the log end at the attempt's start was applied. Any other failure fails
//! the attempt: `stop_replay` (entries read but not applied are released;
//! through the read gate no later read of this attempt touches the cursor),
//! the cursor is rewound to the entry after its mark-delete, and the error
//! is returned unwrapped for the handle to classify. The end never waits for
//! outstanding reads, so a lost read callback cannot hold the replay
//! thread once the attempt is interrupted or the cursor closed.

use std::collections::VecDeque;
use std::sync::Arc;

use tracing::{debug, warn};

use super::error::PendingAckError;
use super::record::{decode_entry, PendingAckRecord};
use crate::ledger::{Entry, LedgerError, ManagedCursor};
use crate::position::Position;
use crate::sync::{hook, AtomicBool, AtomicUsize, Condvar, Mutex, Ordering};

/// One issued read of `max_entries` entries for one replay attempt. Exactly
/// one of [`ReadJob::run`], [`ReadJob::complete`], [`ReadJob::fail`] should
/// be called (each consumes the job). A job that is dropped or finished
/// late is a lost/late callback, as in Pulsar: the attempt waits for it
/// until the cursor is closed or the attempt is interrupted (the handle's
/// `close`); a late finish after the attempt ended releases its entries and
/// changes nothing (the attempt is stopped, and [`ReadJob::run`] then does
/// not touch the shared cursor).
#[must_use = "a read job must be finished with run, complete or fail"]
pub struct ReadJob {
    attempt: Arc<ReplayAttempt>,
    max_entries: usize,
}

impl std::fmt::Debug for ReadJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadJob")
            .field("max_entries", &self.max_entries)
            .finish_non_exhaustive()
    }
}

impl ReadJob {
    /// Entries requested.
    pub fn max_entries(&self) -> usize {
        self.max_entries
    }

    /// The cursor the read is for (the attempt's shared cursor).
    pub fn cursor(&self) -> &Arc<ManagedCursor> {
        &self.attempt.cursor
    }

    /// Performs the read on the calling thread
    /// ([`crate::ledger::ManagedCursor::read_entries`]) and delivers the
    /// result to the replay; if the attempt already ended, reads nothing.
    ///
    /// # Blocking
    /// Yes: the read (store I/O) on the calling thread; no durable write.
    pub fn run(self) {
        self.attempt.run_read(self.max_entries);
    }

    /// Delivers `entries` as this read's result (`readEntriesComplete`).
    pub fn complete(self, entries: Vec<Entry>) {
        self.attempt.read_complete(entries);
    }

    /// Delivers `error` as this read's failure (`readEntriesFailed`).
    pub fn fail(self, error: LedgerError) {
        self.attempt.read_failed(error);
    }
}

/// Where issued reads run. Called by the replay thread from `fill_queue`
/// with no replay lock held; may finish the job before returning.
pub trait ReadDispatcher: Send + Sync + std::fmt::Debug {
    /// Takes responsibility for finishing `job`.
    fn dispatch(&self, job: ReadJob);
}

/// Sizes of the replay's read pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayConfig {
    /// Entry-queue capacity (entries). Default 2000.
    pub queue_capacity: usize,
    /// Entries per read. Default 100. A read is issued only while
    /// `queued + read_batch < queue_capacity`.
    pub read_batch: usize,
}

impl Default for ReplayConfig {
    fn default() -> Self {
        Self {
            queue_capacity: 2000,
            read_batch: 100,
        }
    }
}

impl ReplayConfig {
    /// Checks `1 <= read_batch < queue_capacity`.
    ///
    /// # Errors
    /// [`PendingAckError::InvalidConfig`].
    pub fn validate(&self) -> Result<(), PendingAckError> {
        if self.read_batch == 0 || self.read_batch >= self.queue_capacity {
            return Err(PendingAckError::InvalidConfig(format!(
                "replay needs 1 <= read_batch < queue_capacity, got {} and {}",
                self.read_batch, self.queue_capacity
            )));
        }
        Ok(())
    }
}

/// What a read failure does to the attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureDisposition {
    /// One of the three completing shapes: end the replay as if caught up
    /// (non-recoverable with auto-skip on; fenced; cursor already closed).
    CompletesReplay,
    /// Anything else: fail the attempt (rewind, close the writer, report).
    FailsAttempt,
}

/// Classifies a read failure (Java precedence `(A && B) || C || D`).
pub fn classify(error: &LedgerError, auto_skip_non_recoverable_data: bool) -> FailureDisposition {
    let completing = (error.is_non_recoverable() && auto_skip_non_recoverable_data)
        || matches!(error, LedgerError::Fenced { .. })
        || matches!(error, LedgerError::CursorAlreadyClosed { .. });
    if completing {
        FailureDisposition::CompletesReplay
    } else {
        FailureDisposition::FailsAttempt
    }
}

/// Applies replayed records; implemented by the handle's state. Called only
/// on the replay thread.
pub trait ReplaySink {
    /// Applies every record of the log entry at `position` (idempotently:
    /// re-reading an applied entry after a rewind must be harmless) and
    /// returns the position the log may be trimmed to (mark-deleted), if it
    /// moved.
    fn apply_entry(&mut self, position: Position, records: &[PendingAckRecord])
        -> Option<Position>;
}

/// How a completed attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayReport {
    /// Log entries applied in this attempt.
    pub entries_applied: u64,
    /// Records applied in this attempt (a batched entry holds several).
    pub records_applied: u64,
    /// Reads issued in this attempt.
    pub reads_issued: usize,
    /// The loop reached the last-confirmed snapshot.
    pub caught_up: bool,
    /// The completing failure shape that ended it, if any (state may be
    /// partial: queued entries were discarded).
    pub completing_failure: Option<LedgerError>,
}

struct QueueState {
    stopped: bool,
    queue: VecDeque<Entry>,
}

/// One replay attempt (one Pulsar `MLPendingAckStore` instance).
///
/// Threads: [`ReplayAttempt::run`] and [`ReplayAttempt::fill_queue`] on the
/// replay thread only; [`ReplayAttempt::read_complete`] /
/// [`ReplayAttempt::read_failed`] on any thread, including re-entrantly on
/// the replay thread inside `fill_queue`; [`ReplayAttempt::interrupt`] and
/// the accessors from any thread.
pub struct ReplayAttempt {
    name: String,
    cursor: Arc<ManagedCursor>,
    dispatcher: Arc<dyn ReadDispatcher>,
    config: ReplayConfig,
    auto_skip: bool,
    lac_snapshot: Position,
    start_position: Position,
    outstanding_reads: AtomicUsize,
    is_readable: AtomicBool,
    interrupted: AtomicBool,
    reads_issued: AtomicUsize,
    attempt_failure: Mutex<Option<LedgerError>>,
    completing_failure: Mutex<Option<LedgerError>>,
    shared: Mutex<QueueState>,
    progress: Condvar,
    /// Held by [`ReadJob::run`] across its cursor read and delivery, and by
    /// [`ReplayAttempt::stop_replay`] while it marks the attempt stopped: once
    /// `stop_replay` returned, no read of this attempt moves the shared
    /// cursor (lock order: `read_gate` before `shared`).
    read_gate: Mutex<()>,
}

impl std::fmt::Debug for ReplayAttempt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplayAttempt")
            .field("name", &self.name)
            .field("lac_snapshot", &self.lac_snapshot)
            .field("outstanding_reads", &self.outstanding_reads())
            .field("is_readable", &self.is_readable())
            .finish_non_exhaustive()
    }
}

impl ReplayAttempt {
    /// Builds an attempt over `cursor`, snapshotting the log's last confirmed
    /// entry and the cursor's mark-delete (where replay starts).
    ///
    /// # Errors
    /// [`PendingAckError::InvalidConfig`] for a bad [`ReplayConfig`].
    pub fn new(
        name: impl Into<String>,
        cursor: Arc<ManagedCursor>,
        dispatcher: Arc<dyn ReadDispatcher>,
        config: ReplayConfig,
    ) -> Result<Arc<Self>, PendingAckError> {
        config.validate()?;
        let auto_skip = cursor.ledger().config().auto_skip_non_recoverable_data;
        let lac_snapshot = cursor.ledger().last_confirmed_entry();
        let start_position = cursor.mark_delete_position();
        Ok(Arc::new(Self {
            name: name.into(),
            cursor,
            dispatcher,
            config,
            auto_skip,
            lac_snapshot,
            start_position,
            outstanding_reads: AtomicUsize::new(0),
            is_readable: AtomicBool::new(true),
            interrupted: AtomicBool::new(false),
            reads_issued: AtomicUsize::new(0),
            attempt_failure: Mutex::new(None),
            completing_failure: Mutex::new(None),
            shared: Mutex::new(QueueState {
                stopped: false,
                queue: VecDeque::new(),
            }),
            progress: Condvar::new(),
            read_gate: Mutex::new(()),
        }))
    }

    /// The pending-ack log cursor this attempt reads.
    pub fn cursor(&self) -> &Arc<ManagedCursor> {
        &self.cursor
    }

    /// Reads issued so far.
    pub fn reads_issued(&self) -> usize {
        self.reads_issued.load(Ordering::SeqCst)
    }

    /// Reads in flight (0 or 1).
    pub fn outstanding_reads(&self) -> usize {
        self.outstanding_reads.load(Ordering::SeqCst)
    }

    /// The `is_readable` flag.
    pub fn is_readable(&self) -> bool {
        self.is_readable.load(Ordering::SeqCst)
    }

    /// Entries queued and not yet applied.
    pub fn queued(&self) -> usize {
        self.shared.lock().queue.len()
    }

    /// The unclassified failure stored by `read_failed`, if any.
    pub fn attempt_failure(&self) -> Option<LedgerError> {
        self.attempt_failure.lock().clone()
    }

    /// Asks the replay loop to stop (the handle is closing); the attempt then
    /// fails with [`PendingAckError::Interrupted`]. Any thread.
    pub fn interrupt(&self) {
        self.interrupted.store(true, Ordering::SeqCst);
        self.wake();
    }

    fn wake(&self) {
        // Taking the lock orders this wake-up after any waiter's predicate
        // check, so a waiter that saw the old state is already waiting.
        drop(self.shared.lock());
        self.progress.notify_all();
    }

    /// `fillQueue()`: if there is room for a batch, no read is outstanding
    /// (read FIRST) and the attempt is readable (read SECOND), issues a read
    /// when the cursor has more entries, or clears `is_readable` when it has
    /// none and the queue is empty. Returns `is_readable`. Replay thread only.
    pub fn fill_queue(self: &Arc<Self>) -> bool {
        let queued = self.shared.lock().queue.len();
        let room = queued + self.config.read_batch < self.config.queue_capacity;
        crate::trace::pending_ack::fq_room(&self.name, queued, room);
        if room && self.may_issue_read() {
            let more = self.cursor.has_more_entries();
            if more {
                self.outstanding_reads.fetch_add(1, Ordering::SeqCst);
                self.reads_issued.fetch_add(1, Ordering::SeqCst);
                crate::trace::pending_ack::fq_issue(&self.name, true);
                self.dispatcher.dispatch(ReadJob {
                    attempt: Arc::clone(self),
                    max_entries: self.config.read_batch,
                });
            } else if self.shared.lock().queue.is_empty() {
                // The emptiness check must be FRESH (after the counter load):
                // the last read's entries are enqueued before its decrement,
                // so seeing 0 above guarantees they are visible here. The
                // room snapshot taken at the top may predate them (loom's
                // drained_check_never_loses_the_last_read pins this order).
                self.is_readable.store(false, Ordering::SeqCst);
            }
            crate::trace::pending_ack::fq_no_more(&self.name, more);
        }
        let readable = self.is_readable.load(Ordering::SeqCst);
        crate::trace::pending_ack::fq_ret(&self.name, readable);
        readable
    }

    /// `fill_queue`'s two loads, in the order that makes "no read after a
    /// failure" hold: R1 (no read outstanding) FIRST, and only if it held,
    /// R2 (`is_readable`). Between them is the test hook point
    /// [`hook::Point::FillQueueBetweenLoads`] (the simulator's
    /// `replay_race` stage completes a read failure there; nothing
    /// without the `race-hooks` feature).
    fn may_issue_read(&self) -> bool {
        if !self.no_outstanding_read() {
            return false;
        }
        hook::at(hook::Point::FillQueueBetweenLoads);
        self.readable_for_fill()
    }

    /// `fill_queue`'s first load (R1): no read is outstanding.
    fn no_outstanding_read(&self) -> bool {
        let outstanding = self.outstanding_reads.load(Ordering::SeqCst);
        crate::trace::pending_ack::fq_count(&self.name, outstanding);
        outstanding == 0
    }

    /// `fill_queue`'s second load (R2), only after R1 saw no outstanding read.
    fn readable_for_fill(&self) -> bool {
        let readable = self.is_readable.load(Ordering::SeqCst);
        crate::trace::pending_ack::fq_flag(&self.name, readable);
        readable
    }

    /// `readEntriesComplete`: enqueues `entries` (or releases them if the
    /// replay already stopped), THEN decrements the outstanding counter. Any
    /// thread. The queue cannot overflow: a read is issued only with room
    /// for a whole batch and only one read is ever outstanding.
    pub fn read_complete(&self, entries: Vec<Entry>) {
        let released = {
            let mut s = self.shared.lock();
            let queued = s.queue.len() + if s.stopped { 0 } else { entries.len() };
            crate::trace::pending_ack::read_ok(&self.name, &self.cursor, queued);
            if s.stopped {
                entries
            } else {
                s.queue.extend(entries);
                Vec::new()
            }
        };
        if !released.is_empty() {
            debug!(handle = %self.name, released = released.len(), "pending-ack replay already stopped; late entries released");
        }
        drop(released);
        self.outstanding_reads.fetch_sub(1, Ordering::SeqCst);
        crate::trace::pending_ack::env_finish(&self.name, "dec");
        self.wake();
    }

    /// `readEntriesFailed`: classifies `error`; a failure that does not
    /// complete the replay is stored (W1); then `is_readable` is cleared
    /// (W2); THEN the outstanding counter is decremented (W3). Any thread,
    /// including the replay thread inside `fill_queue`.
    pub fn read_failed(&self, error: LedgerError) {
        crate::trace::pending_ack::read_fail(&self.name, &error);
        match classify(&error, self.auto_skip) {
            FailureDisposition::FailsAttempt => {
                debug!(handle = %self.name, %error, "pending-ack log read failed; ending this replay attempt");
                let mut slot = self.attempt_failure.lock();
                if slot.is_none() {
                    *slot = Some(error);
                }
            }
            FailureDisposition::CompletesReplay => {
                let mut slot = self.completing_failure.lock();
                if slot.is_none() {
                    *slot = Some(error);
                }
            }
        }
        self.is_readable.store(false, Ordering::SeqCst);
        crate::trace::pending_ack::env_finish(&self.name, "w2");
        // Test hook point between the two stores (the `replay_race` stage
        // runs a whole `fill_queue` pass of the replay thread here;
        // nothing without the `race-hooks` feature).
        hook::at(hook::Point::ReadFailedBetweenStores);
        self.outstanding_reads.fetch_sub(1, Ordering::SeqCst);
        crate::trace::pending_ack::env_finish(&self.name, "w3");
        self.wake();
    }

    /// [`ReadJob::run`]: under the read gate, reads the cursor and delivers
    /// the result, unless the attempt already stopped: then the late job only
    /// gives back its outstanding-read count and touches nothing.
    fn run_read(&self, max_entries: usize) {
        let _gate = self.read_gate.lock();
        crate::trace::pending_ack::env_take(&self.name);
        if self.shared.lock().stopped {
            debug!(handle = %self.name, "pending-ack replay already stopped; late read not performed");
            crate::trace::pending_ack::read_ok(&self.name, &self.cursor, 0);
            self.outstanding_reads.fetch_sub(1, Ordering::SeqCst);
            crate::trace::pending_ack::env_finish(&self.name, "dec");
            self.wake();
            return;
        }
        match self.cursor.read_entries(max_entries) {
            Ok(entries) => self.read_complete(entries),
            Err(e) => self.read_failed(e),
        }
    }

    /// Whether [`ReplayAttempt::stop_replay`] ran (the attempt ended).
    pub fn is_stopped(&self) -> bool {
        self.shared.lock().stopped
    }

    /// `stopReplay()`: marks the replay stopped (later completions release
    /// their entries; a later [`ReadJob::run`] reads nothing) and releases
    /// everything queued. Waits for a [`ReadJob::run`] in progress (bounded
    /// by one storage read; a lost callback holds nothing). Idempotent; any
    /// thread.
    pub fn stop_replay(&self) -> usize {
        let _gate = self.read_gate.lock();
        let drained: Vec<Entry> = {
            let mut s = self.shared.lock();
            s.stopped = true;
            s.queue.drain(..).collect()
        };
        drained.len()
    }

    fn poll(&self) -> Option<Entry> {
        self.shared.lock().queue.pop_front()
    }

    /// Waits (≤ 1 ms in std builds, the Java loop's sleep) until an entry is
    /// queued, no read is outstanding, or the attempt is interrupted.
    fn wait_for_progress(&self) {
        let s = self.shared.lock();
        if s.queue.is_empty()
            && self.outstanding_reads.load(Ordering::SeqCst) != 0
            && !self.interrupted.load(Ordering::SeqCst)
        {
            let _ = self
                .progress
                .wait_timeout(s, std::time::Duration::from_millis(1));
        }
    }

    /// Runs the attempt to its end on the calling (replay) thread, applying
    /// entries to `sink` and trimming the log as it reports. See the module
    /// docs for the end-of-attempt rules.
    ///
    /// # Errors
    /// The failure that failed the attempt, unwrapped: a stored read failure
    /// ([`PendingAckError::Ledger`]), [`PendingAckError::Decode`] /
    /// [`PendingAckError::InvalidRecord`] for a bad entry,
    /// `Ledger(CursorAlreadyClosed)` if the cursor is closed at the start or
    /// while waiting, [`PendingAckError::Interrupted`]. The cursor has been
    /// rewound when this returns an error.
    ///
    /// # Blocking
    /// Yes: runs the whole attempt on the calling thread (the replay
    /// executor's): it waits for the reads it issues and trims the log as it
    /// reports (store commits of the log cursor's mark-delete).
    pub fn run(
        self: &Arc<Self>,
        sink: &mut dyn ReplaySink,
    ) -> Result<ReplayReport, PendingAckError> {
        let result = self.run_loop(sink);
        let discarded = self.stop_replay();
        match result {
            Ok((caught_up, entries_applied, records_applied)) => {
                let stored = self.attempt_failure.lock().take();
                match stored {
                    Some(error) if !caught_up => Err(self.fail(error.into())),
                    _ => {
                        let completing_failure = self.completing_failure.lock().clone();
                        // Spec ReadyImpliesCaughtUp: a complete replay either
                        // reached the snapshot or was ended by a completing
                        // shape / auto-skipped data (drained_end fails the rest).
                        debug_assert!(
                            caught_up || completing_failure.is_some() || self.auto_skip,
                            "pending-ack replay {} reported complete short of {}",
                            self.name,
                            self.lac_snapshot
                        );
                        if let Some(error) = &completing_failure {
                            warn!(
                                handle = %self.name,
                                %error,
                                start = %self.start_position,
                                read_position = %self.cursor.read_position(),
                                lac = %self.lac_snapshot,
                                discarded,
                                "pending-ack replay ended by a read failure that completes the replay"
                            );
                        }
                        crate::trace::pending_ack::r_end(&self.name, "complete", &self.cursor);
                        Ok(ReplayReport {
                            entries_applied,
                            records_applied,
                            reads_issued: self.reads_issued(),
                            caught_up,
                            completing_failure,
                        })
                    }
                }
            }
            Err(e) => Err(self.fail(e)),
        }
    }

    /// Ends a failed attempt: `stop_replay` already ran, so no read of this
    /// attempt can move the cursor after this rewind (a read whose callback
    /// was lost never runs; one that runs late reads nothing). Never waits
    /// for outstanding reads: a lost callback must not hold the executor.
    fn fail(&self, error: PendingAckError) -> PendingAckError {
        self.cursor.rewind();
        crate::trace::pending_ack::r_end(&self.name, "failed", &self.cursor);
        debug!(handle = %self.name, %error, read_position = %self.cursor.read_position(), "pending-ack replay attempt failed; cursor rewound");
        error
    }

    fn run_loop(
        self: &Arc<Self>,
        sink: &mut dyn ReplaySink,
    ) -> Result<(bool, u64, u64), PendingAckError> {
        if self.cursor.is_closed() {
            return Err(self.closed_error());
        }
        // The cursor is cached and shared (a previous attempt, or anyone else
        // holding it, may have moved its read position past entries after
        // the mark-delete): every attempt reads from the first entry after
        // the mark-delete, where `current` starts.
        self.cursor.rewind();
        crate::trace::pending_ack::h_start(&self.name, &self.cursor);
        let mut current = self.start_position;
        let mut entries = 0u64;
        let mut records = 0u64;
        loop {
            if self.interrupted.load(Ordering::SeqCst) {
                crate::trace::pending_ack::r_loop(&self.name, "end");
                return Err(PendingAckError::Interrupted {
                    name: self.name.clone(),
                });
            }
            if self.lac_snapshot <= current {
                crate::trace::pending_ack::r_loop(&self.name, "end");
                return Ok((true, entries, records));
            }
            crate::trace::pending_ack::r_loop(&self.name, "fq_room");
            if !self.fill_queue() {
                return self.drained_end(current, entries, records);
            }
            let polled = self.poll();
            crate::trace::pending_ack::poll(&self.name, polled.as_ref().map(|e| e.position));
            match polled {
                Some(entry) => {
                    current = entry.position;
                    let decoded = decode_entry(entry.position, &entry.data)?;
                    if let Some(trim) = sink.apply_entry(entry.position, &decoded) {
                        if trim > self.cursor.mark_delete_position() {
                            if let Err(e) = self.cursor.mark_delete(trim) {
                                debug!(handle = %self.name, %e, "pending-ack log trim failed");
                            }
                        }
                    }
                    entries += 1;
                    records += decoded.len() as u64;
                }
                None => {
                    if self.cursor.is_closed() {
                        return Err(self.closed_error());
                    }
                    self.wait_for_progress();
                }
            }
        }
    }

    /// The loop stopped with nothing readable and the queue drained before
    /// it reached the last-confirmed snapshot. Only a completing failure
    /// (stored by `read_failed`) or auto-skipped non-recoverable data may
    /// end a replay short of the snapshot; anything else would report a
    /// partial replay as complete (spec `ReadyImpliesFullyApplied`), so the
    /// attempt fails with [`PendingAckError::IncompleteReplay`] (retryable).
    fn drained_end(
        &self,
        current: Position,
        entries: u64,
        records: u64,
    ) -> Result<(bool, u64, u64), PendingAckError> {
        let explained = self.auto_skip
            || self.completing_failure.lock().is_some()
            || self.attempt_failure.lock().is_some();
        if explained {
            return Ok((false, entries, records));
        }
        Err(PendingAckError::IncompleteReplay {
            name: self.name.clone(),
            applied_up_to: current,
            last_confirmed: self.lac_snapshot,
            read_position: self.cursor.read_position(),
        })
    }

    fn closed_error(&self) -> PendingAckError {
        PendingAckError::Ledger(LedgerError::CursorAlreadyClosed {
            ledger: self.cursor.ledger().name().to_string(),
            cursor: self.cursor.name().to_string(),
        })
    }
}
