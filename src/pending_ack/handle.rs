//! The pending-ack handle (Pulsar's `PendingAckHandleImpl`): owns the
//! subscription's [`PendingAckState`], runs replay attempts on its pinned
//! replay executor, classifies their failures, retries transient ones with
//! backoff on a timer, and completes every waiter.
//!
//! States: `None → Initializing → Ready`, `Initializing → None` (transient
//! failure, retry scheduled), `Initializing → Error` (non-retryable), any →
//! `Close`. Close wins over a pending retry: it cancels the retry timer, and
//! `init` never leaves `Close`.
//!
//! Logging: a completing read failure logs one WARN (in the replay); a
//! transient failure logs one WARN per retry (here) and DEBUG in the
//! replay; giving up logs one ERROR.

use std::sync::Arc;

use tracing::{error, info, warn};

use super::backoff::{Backoff, BackoffConfig};
use super::error::PendingAckError;
use super::executor::{ReplayExecutor, ReplayExecutorPool};
use super::record::{AckType, PendingAckOp, PendingAckRecord};
use super::replay::ReadDispatcher;
use super::replay::{ReplayAttempt, ReplayConfig, ReplayReport};
use super::state::{PendingAckState, PendingAckSummary, SubscribedState};
use super::subscription::{CommittedAck, SubscriptionView};
use super::timer::{Timer, TimerId};
use super::writer::{AppendAck, AppendCallback, BufferedWriter, WriterConfig};
use crate::ledger::ManagedCursor;
use crate::position::Position;
use crate::sync::{AtomicU64, Condvar, Mutex, Ordering};

/// Handle lifecycle (Pulsar's `PendingAckHandleState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandleState {
    /// Not initialising (initially, and between a failed attempt and its
    /// retry).
    None,
    /// A replay attempt is queued or running.
    Initializing,
    /// Replay completed; requests are served.
    Ready,
    /// Gave up after a non-retryable failure.
    Error,
    /// Closed.
    Close,
}

impl HandleState {
    fn name(self) -> &'static str {
        match self {
            HandleState::None => "None",
            HandleState::Initializing => "Initializing",
            HandleState::Ready => "Ready",
            HandleState::Error => "Error",
            HandleState::Close => "Close",
        }
    }
}

/// Settings of a [`PendingAckHandle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandleConfig {
    /// Replay read pipeline.
    pub replay: ReplayConfig,
    /// Retry backoff.
    pub backoff: BackoffConfig,
    /// Buffered writer of each attempt's store.
    pub writer: WriterConfig,
    /// Seed of the backoff jitter (reproducible runs).
    pub jitter_seed: u64,
    /// Attempts in a row that may find the cursor closed and fail to reopen
    /// it (a fenced ledger, a failing store) before the handle gives up with
    /// [`PendingAckError::CursorClosed`]. Default 3; 0 counts as 1.
    pub max_cursor_reopen_attempts: u32,
}

impl Default for HandleConfig {
    fn default() -> Self {
        Self {
            replay: ReplayConfig::default(),
            backoff: BackoffConfig::default(),
            writer: WriterConfig::default(),
            jitter_seed: 0,
            max_cursor_reopen_attempts: 3,
        }
    }
}

/// Counters of a handle, for tests, the simulator and metrics.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HandleStats {
    /// Replay attempts started.
    pub attempts: u64,
    /// Reads issued over all attempts.
    pub reads_issued: u64,
    /// Most reads issued by a single attempt.
    pub max_reads_per_attempt: u64,
    /// Retry delays scheduled (ms, after jitter), in order.
    pub retry_delays_ms: Vec<u64>,
    /// Report of the attempt that completed, if one did.
    pub completed: Option<ReplayReport>,
}

struct WaitCell {
    result: Mutex<Option<Result<(), PendingAckError>>>,
    done: Condvar,
}

impl WaitCell {
    fn new(result: Option<Result<(), PendingAckError>>) -> Arc<Self> {
        Arc::new(Self {
            result: Mutex::new(result),
            done: Condvar::new(),
        })
    }

    fn complete(&self, r: Result<(), PendingAckError>) {
        let mut g = self.result.lock();
        if g.is_none() {
            *g = Some(r);
        }
        drop(g);
        self.done.notify_all();
    }
}

/// A waiter on the handle becoming usable (the `add_consumer` path's
/// `pendingAckHandleFuture`). Always completes: `Ok` when Ready, an error
/// when the handle gives up ([`PendingAckError::InitFailed`]) or closes
/// ([`PendingAckError::Closed`]).
#[derive(Clone)]
pub struct ReadyWaiter {
    cell: Arc<WaitCell>,
}

impl std::fmt::Debug for ReadyWaiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadyWaiter")
            .field("result", &*self.cell.result.lock())
            .finish()
    }
}

impl ReadyWaiter {
    /// The result, if already completed. Never blocks.
    ///
    /// # Errors
    /// `Some(Err(_))` carries the handle's terminal error: the replay gave up
    /// on a non-retryable failure, or the handle was closed.
    pub fn try_result(&self) -> Option<Result<(), PendingAckError>> {
        self.cell.result.lock().clone()
    }

    /// Blocks until completed. Any thread except the handle's replay
    /// executor (that would deadlock, as in Pulsar).
    ///
    /// # Errors
    /// The handle's terminal error (replay gave up, or the handle closed).
    pub fn wait(&self) -> Result<(), PendingAckError> {
        let mut g = self.cell.result.lock();
        loop {
            if let Some(r) = g.as_ref() {
                return r.clone();
            }
            g = self.cell.done.wait(g);
        }
    }

    /// Blocks up to `timeout` (wall clock; std builds) and returns the
    /// result if it completed by then (`None` on timeout). A timeout too large
    /// for the clock waits without limit.
    ///
    /// # Errors
    /// As [`ReadyWaiter::wait`], inside the `Some`.
    pub fn wait_timeout(
        &self,
        timeout: std::time::Duration,
    ) -> Option<Result<(), PendingAckError>> {
        // A timeout too large to represent as an instant means "no timeout".
        let Some(deadline) = std::time::Instant::now().checked_add(timeout) else {
            return Some(self.wait());
        };
        let mut g = self.cell.result.lock();
        loop {
            if let Some(r) = g.as_ref() {
                return Some(r.clone());
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return None;
            }
            g = self.cell.done.wait_timeout(g, deadline - now).0;
        }
    }
}

struct Core {
    state: HandleState,
    backoff: Backoff,
    waiters: Vec<Arc<WaitCell>>,
    error: Option<PendingAckError>,
    retry_timer: Option<TimerId>,
    /// Consecutive attempts that found the cursor closed and could not
    /// reopen it.
    reopen_failures: u32,
    attempt: Option<Arc<ReplayAttempt>>,
    writer: Option<Arc<BufferedWriter>>,
    last_failed_writer: Option<Arc<BufferedWriter>>,
    queued: Vec<(PendingAckRecord, AppendCallback)>,
    stats: HandleStats,
}

struct Inner {
    name: String,
    /// The pending-ack log cursor; replaced when a closed one is reopened
    /// through its managed ledger.
    cursor: Mutex<Arc<ManagedCursor>>,
    /// The subscription whose transactional acks this handle holds.
    subscription: Arc<dyn SubscriptionView>,
    executor: Arc<ReplayExecutor>,
    dispatcher: Arc<dyn ReadDispatcher>,
    timer: Arc<dyn Timer>,
    config: HandleConfig,
    core: Mutex<Core>,
    state: Mutex<PendingAckState>,
    generation: AtomicU64,
}

/// A pending-ack handle for one subscription. Cheap to clone (shared).
///
/// Threads: every method may be called from any thread. Replay attempts run
/// on the executor the pool assigns by hash of `name`; retries fire on the
/// timer's thread and only re-submit the attempt to the executor.
#[derive(Clone)]
pub struct PendingAckHandle {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for PendingAckHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingAckHandle")
            .field("name", &self.inner.name)
            .field("state", &self.state())
            .field("executor", &self.inner.executor.index())
            .finish()
    }
}

impl PendingAckHandle {
    /// Creates a handle (state None) for the pending-ack log read through
    /// `cursor` (Pulsar: ML `<topic>-<sub>__transaction_pending_ack`, cursor
    /// `__pending_ack_state`, cached and shared by every attempt). The cursor
    /// stays owned by the caller: the handle never closes it. `subscription`
    /// is the subscription's cursor as the handle sees it (Pulsar's handle
    /// holds its `PersistentSubscription`): a transactional ack of a position
    /// it already deleted is a conflict, and the log is trimmed only past
    /// commits its persisted state holds. Call [`PendingAckHandle::init`] to
    /// start replaying.
    ///
    /// # Errors
    /// [`PendingAckError::InvalidConfig`] for a bad configuration.
    pub fn new(
        name: impl Into<String>,
        cursor: Arc<ManagedCursor>,
        subscription: Arc<dyn SubscriptionView>,
        pool: &ReplayExecutorPool,
        dispatcher: Arc<dyn ReadDispatcher>,
        timer: Arc<dyn Timer>,
        config: HandleConfig,
    ) -> Result<Self, PendingAckError> {
        config.replay.validate()?;
        config.backoff.validate()?;
        config.writer.validate()?;
        let name = name.into();
        let executor = pool.executor_for(&name);
        Ok(Self {
            inner: Arc::new(Inner {
                cursor: Mutex::new(cursor),
                subscription,
                executor,
                dispatcher,
                timer,
                config,
                core: Mutex::new(Core {
                    state: HandleState::None,
                    backoff: Backoff::new(config.backoff, config.jitter_seed),
                    waiters: Vec::new(),
                    error: None,
                    retry_timer: None,
                    reopen_failures: 0,
                    attempt: None,
                    writer: None,
                    last_failed_writer: None,
                    queued: Vec::new(),
                    stats: HandleStats::default(),
                }),
                state: Mutex::new(PendingAckState::default()),
                generation: AtomicU64::new(0),
                name,
            }),
        })
    }

    /// The handle's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Index of the replay executor it is pinned to.
    pub fn executor_index(&self) -> usize {
        self.inner.executor.index()
    }

    /// Current state.
    pub fn state(&self) -> HandleState {
        self.inner.core.lock().state
    }

    /// Counters so far.
    pub fn stats(&self) -> HandleStats {
        self.inner.core.lock().stats.clone()
    }

    /// The effects of the replayed and appended records. After the handle
    /// moved to Error, this still shows what was applied before the failing
    /// record (a partial view): callers must check [`PendingAckHandle::state`]
    /// before trusting it.
    pub fn summary(&self) -> PendingAckSummary {
        self.inner.state.lock().summary()
    }

    /// The buffered writer of the most recent failed attempt (to check it
    /// was closed and its flush timer cancelled).
    pub fn last_failed_writer(&self) -> Option<Arc<BufferedWriter>> {
        self.inner.core.lock().last_failed_writer.clone()
    }

    /// The error the handle gave up with, in state Error.
    pub fn error(&self) -> Option<PendingAckError> {
        self.inner.core.lock().error.clone()
    }

    /// `init()`: from None moves to Initializing and submits a replay
    /// attempt to the handle's executor; in any other state does nothing
    /// (in particular a queued retry never reopens a closed handle).
    pub fn init(&self) {
        {
            let mut c = self.inner.core.lock();
            if c.state != HandleState::None {
                return;
            }
            c.state = HandleState::Initializing;
            crate::trace::pending_ack::h_timer(&self.inner.name);
            // At most one retry timer is armed: an init ahead of the pending
            // retry (an embedder's call) replaces it. Called by that timer,
            // the cancel finds nothing.
            if let Some(id) = c.retry_timer.take() {
                self.inner.timer.cancel(id);
            }
        }
        let me = self.clone();
        if !self
            .inner
            .executor
            .submit(Box::new(move || me.run_attempt()))
        {
            self.give_up(PendingAckError::InvalidConfig(
                "the replay executor pool is shut down".into(),
            ));
        }
    }

    /// A waiter that completes when the handle is Ready (Ok) or gives up or
    /// closes (Err). Completed at once if that already happened.
    pub fn ready_waiter(&self) -> ReadyWaiter {
        let mut c = self.inner.core.lock();
        let now = match c.state {
            HandleState::Ready => Some(Ok(())),
            HandleState::Error => Some(Err(c.error.clone().unwrap_or_else(|| {
                PendingAckError::NotReady {
                    name: self.inner.name.clone(),
                    state: "Error",
                }
            }))),
            HandleState::Close => Some(Err(self.closed())),
            HandleState::None | HandleState::Initializing => None,
        };
        let cell = WaitCell::new(now.clone());
        if now.is_none() {
            c.waiters.push(Arc::clone(&cell));
        }
        ReadyWaiter { cell }
    }

    fn closed(&self) -> PendingAckError {
        PendingAckError::Closed {
            name: self.inner.name.clone(),
        }
    }

    /// Logs `record` through the current store's buffered writer and, once
    /// persisted, applies it to the state; `callback` gets the outcome.
    /// Before Ready the request is queued; in Error it fails with
    /// [`PendingAckError::NotReady`], after close with
    /// [`PendingAckError::Closed`].
    ///
    /// # Blocking
    /// Blocks the calling thread for the log append when the handle is
    /// Ready and batching is off (or the record fills a batch): one commit
    /// of the store (an fsync on a [`RedbStore`](crate::ledger::RedbStore)
    /// with `SyncMode::Immediate`). [`PendingAckHandle::append_async`] never
    /// does.
    pub fn append(&self, record: PendingAckRecord, callback: AppendCallback) {
        self.append_with(record, callback, true);
    }

    /// Non-blocking [`PendingAckHandle::append`]: the log append is queued
    /// on the store writer ([`BufferedWriter::append_async`]) and
    /// `callback` runs once the record is durable and applied, on the store
    /// writer thread (with a [`RedbStore`](crate::ledger::RedbStore), in a
    /// group commit shared with the writes that arrived meanwhile).
    /// Requests made before Ready are queued and written when the replay
    /// completes, on the replay executor's thread, as for
    /// [`PendingAckHandle::append`].
    ///
    /// # Blocking
    /// Never blocks on I/O with a `RedbStore`: it takes the handle's locks
    /// for the state and conflict checks and queues the write.
    pub fn append_async(&self, record: PendingAckRecord, callback: AppendCallback) {
        self.append_with(record, callback, false);
    }

    fn append_with(&self, record: PendingAckRecord, callback: AppendCallback, blocking: bool) {
        let writer = {
            let mut c = self.inner.core.lock();
            match c.state {
                HandleState::Ready => c.writer.clone(),
                HandleState::None | HandleState::Initializing => {
                    c.queued.push((record, callback));
                    return;
                }
                HandleState::Error => {
                    drop(c);
                    callback(Err(PendingAckError::NotReady {
                        name: self.inner.name.clone(),
                        state: "Error",
                    }));
                    return;
                }
                HandleState::Close => {
                    drop(c);
                    callback(Err(self.closed()));
                    return;
                }
            }
        };
        let Some(writer) = writer else {
            callback(Err(PendingAckError::WriterClosed));
            return;
        };
        // A malformed record is refused before the conflict check: the check
        // expands batch-index ack sets, which only a validated batch_size
        // bounds.
        if let Err(e) = record.validate() {
            callback(Err(e));
            return;
        }
        // Fail fast on a conflict (nothing is written); a conflict that
        // arises between this check and the append completing is reported
        // by `apply_persisted`, and replay skips that record the same way.
        let checked = self.inner.state.lock().check(&record);
        if let Err(e) = checked.and_then(|()| self.check_subscription(&record)) {
            callback(Err(e));
            return;
        }
        let me = self.clone();
        let rec = record.clone();
        let done: AppendCallback = Box::new(move |r: Result<AppendAck, PendingAckError>| match r {
            Ok(ack) => match me.apply_persisted(ack, &rec, blocking) {
                Ok(()) => callback(Ok(ack)),
                Err(e) => callback(Err(e)),
            },
            Err(e) => callback(Err(e)),
        });
        if blocking {
            writer.append(record, done);
        } else {
            writer.append_async(record, done);
        }
    }

    /// Pulsar's check of the subscription cursor before a transactional
    /// ack (`TransactionConflictException`): an individual ack of an entry
    /// (or batch index) the subscription already deleted, or a cumulative
    /// ack at or below its mark-delete.
    fn check_subscription(&self, r: &PendingAckRecord) -> Result<(), PendingAckError> {
        if r.op != PendingAckOp::Ack {
            return Ok(());
        }
        let sub = &*self.inner.subscription;
        let conflict = |position, batch_index| PendingAckError::AckConflict {
            txn_id: r.txn_id,
            position,
            batch_index,
            holder: None,
        };
        if r.ack_type == AckType::Cumulative {
            return match r.positions.first() {
                Some(p) if p.position <= sub.mark_delete_position() => {
                    Err(conflict(p.position, None))
                }
                _ => Ok(()),
            };
        }
        for ap in &r.positions {
            let p = ap.position;
            if sub.is_deleted(p, None) {
                return Err(conflict(p, None));
            }
            for i in ap.acked_indexes().into_iter().flatten() {
                if sub.is_deleted(p, Some(i)) {
                    return Err(conflict(p, Some(i)));
                }
            }
        }
        Ok(())
    }

    fn apply_persisted(
        &self,
        ack: AppendAck,
        record: &PendingAckRecord,
        blocking: bool,
    ) -> Result<(), PendingAckError> {
        let (trim, applied) = {
            let mut st = self.inner.state.lock();
            let applied = st.apply_checked(record).map(|_| ());
            st.index_log_entry(ack.position, std::slice::from_ref(record));
            let trim = if ack.batch_index + 1 == ack.batch_size {
                st.take_trim(&*self.inner.subscription)
            } else {
                None
            };
            (trim, applied)
        };
        if let Some(p) = trim {
            self.trim_log(p, blocking);
        }
        applied
    }

    /// Mark-deletes the pending-ack log up to `p` (never backwards); after
    /// a non-blocking append (on the store writer thread) through the
    /// store writer too, without waiting.
    fn trim_log(&self, p: Position, blocking: bool) {
        let cursor = self.cursor();
        if p > cursor.mark_delete_position() {
            if blocking {
                if let Err(e) = cursor.mark_delete(p) {
                    tracing::debug!(handle = %self.inner.name, %e, "pending-ack log trim failed");
                }
            } else {
                let name = self.inner.name.clone();
                cursor.mark_delete_async(p).on_complete(move |r| {
                    if let Err(e) = r {
                        tracing::debug!(handle = %name, %e, "pending-ack log trim failed");
                    }
                });
            }
        }
    }

    /// The committed transactional acks the pending-ack log still holds
    /// and the subscription's persisted state does not (log order). After
    /// a replay these are the commits a crash may have taken from the
    /// subscription cursor before it was persisted: the embedder applies
    /// them to the subscription (idempotent), persists it, and calls
    /// [`PendingAckHandle::subscription_persisted`]. Empty before Ready.
    pub fn committed_acks(&self) -> Vec<CommittedAck> {
        if self.state() != HandleState::Ready {
            return Vec::new();
        }
        let acks = self.inner.state.lock().committed_acks();
        acks.into_iter()
            .filter(|a| !self.inner.subscription.holds_durably(a))
            .collect()
    }

    /// The subscription persisted its cursor: trims the pending-ack log past
    /// the entries whose committed acks the subscription now holds durably
    /// (Pulsar's `MLPendingAckStore` trims up to the subscription's
    /// persisted mark-delete). Only in Ready (a replay trims as it goes).
    ///
    /// # Blocking
    /// May trim the pending-ack log: one store commit (the log cursor's
    /// mark-delete) on the calling thread.
    pub fn subscription_persisted(&self) {
        if self.state() != HandleState::Ready {
            return;
        }
        let trim = self.inner.state.lock().take_trim(&*self.inner.subscription);
        if let Some(p) = trim {
            self.trim_log(p, true);
        }
    }

    /// Closes the handle: cancels a pending retry, interrupts a running
    /// attempt, closes the current writer, fails waiters and queued requests
    /// with [`PendingAckError::Closed`]. Idempotent.
    pub fn close(&self) {
        let (waiters, queued, attempt, writer) = {
            let mut c = self.inner.core.lock();
            if c.state == HandleState::Close {
                return;
            }
            c.state = HandleState::Close;
            if let Some(id) = c.retry_timer.take() {
                self.inner.timer.cancel(id);
            }
            (
                std::mem::take(&mut c.waiters),
                std::mem::take(&mut c.queued),
                c.attempt.take(),
                c.writer.take(),
            )
        };
        if let Some(a) = attempt {
            a.interrupt();
        }
        if let Some(w) = writer {
            w.close();
        }
        for w in waiters {
            w.complete(Err(self.closed()));
        }
        for (_, cb) in queued {
            cb(Err(self.closed()));
        }
        info!(handle = %self.inner.name, "pending ack handle closed");
    }

    /// The pending-ack log cursor the next attempt reads (a reopened one
    /// after the original was closed).
    pub fn cursor(&self) -> Arc<ManagedCursor> {
        Arc::clone(&self.inner.cursor.lock())
    }

    /// The cursor for a new attempt: the current one if open; if it was
    /// closed, a cursor of the same name reopened through its managed ledger
    /// (recovered from the store: persisted mark-delete, read position the
    /// entry after it), as Pulsar's retry reopens the store through its
    /// factory. A fenced ledger cannot be reopened by this owner.
    fn open_cursor(&self) -> Result<Arc<ManagedCursor>, String> {
        let mut slot = self.inner.cursor.lock();
        if !slot.is_closed() {
            return Ok(Arc::clone(&slot));
        }
        let ledger = Arc::clone(slot.ledger());
        if ledger.is_fenced() {
            return Err(format!(
                "managed ledger {} is fenced (owned elsewhere)",
                ledger.name()
            ));
        }
        let reopened = Arc::new(ledger.open_cursor(slot.name()).map_err(|e| e.to_string())?);
        info!(handle = %self.inner.name, cursor = %slot.name(), mark_delete = %reopened.mark_delete_position(), "pending-ack cursor was closed; reopened through the managed ledger");
        *slot = Arc::clone(&reopened);
        Ok(reopened)
    }

    /// A closed cursor that could not be reopened: retried with backoff at
    /// most [`HandleConfig::max_cursor_reopen_attempts`] attempts in a row,
    /// then every waiter fails with [`PendingAckError::CursorClosed`].
    fn cursor_reopen_failed(&self, reason: String) {
        let (attempts, cursor) = {
            let mut c = self.inner.core.lock();
            c.reopen_failures += 1;
            c.stats.attempts += 1;
            (
                c.reopen_failures,
                self.inner.cursor.lock().name().to_string(),
            )
        };
        let e = PendingAckError::CursorClosed {
            name: self.inner.name.clone(),
            cursor,
            attempts,
            reason,
        };
        if attempts >= self.inner.config.max_cursor_reopen_attempts.max(1) {
            self.give_up(e);
        } else {
            self.schedule_retry(e);
        }
    }

    /// One replay attempt; runs on the handle's executor.
    fn run_attempt(&self) {
        let inner = &self.inner;
        let cursor = match self.open_cursor() {
            Ok(c) => c,
            Err(reason) => {
                self.cursor_reopen_failed(reason);
                return;
            }
        };
        inner.core.lock().reopen_failures = 0;
        let gen = inner.generation.fetch_add(1, Ordering::SeqCst) + 1;
        let built = ReplayAttempt::new(
            format!("{}#{gen}", inner.name),
            Arc::clone(&cursor),
            Arc::clone(&inner.dispatcher),
            inner.config.replay,
        )
        .and_then(|a| {
            BufferedWriter::open(
                Arc::clone(cursor.ledger()),
                Arc::clone(&inner.timer),
                inner.config.writer,
            )
            .map(|w| (a, w))
        });
        let (attempt, writer) = match built {
            Ok(x) => x,
            Err(e) => {
                self.give_up(e);
                return;
            }
        };
        {
            let mut c = inner.core.lock();
            if c.state != HandleState::Initializing {
                drop(c);
                writer.close();
                return;
            }
            c.stats.attempts += 1;
            c.attempt = Some(Arc::clone(&attempt));
            c.writer = Some(Arc::clone(&writer));
        }
        let result = {
            let mut st = inner.state.lock();
            attempt.run(&mut SubscribedState {
                state: &mut st,
                subscription: &*inner.subscription,
            })
        };
        let reads = attempt.reads_issued() as u64;
        {
            let mut c = inner.core.lock();
            c.attempt = None;
            c.stats.reads_issued += reads;
            c.stats.max_reads_per_attempt = c.stats.max_reads_per_attempt.max(reads);
        }
        match result {
            Ok(report) => self.replay_complete(report),
            Err(e) => {
                // fail_replay: close this attempt's buffered writer (cancels
                // its flush timer), leave cursor and ledger open, report.
                writer.close();
                {
                    let mut c = inner.core.lock();
                    if c.writer.as_ref().is_some_and(|w| Arc::ptr_eq(w, &writer)) {
                        c.writer = None;
                    }
                    c.last_failed_writer = Some(writer);
                }
                self.exception_handle(e);
            }
        }
    }

    fn replay_complete(&self, report: ReplayReport) {
        let (waiters, queued) = {
            let mut c = self.inner.core.lock();
            if c.state != HandleState::Initializing {
                crate::trace::pending_ack::h_done(&self.inner.name, c.state.name());
                error!(handle = %self.inner.name, state = c.state.name(), "pending-ack replay completed but the handle is no longer initializing");
                return;
            }
            c.state = HandleState::Ready;
            // HDone is recorded under the core lock, where the attempt's end
            // takes effect: no other thread sees the new state before it.
            crate::trace::pending_ack::h_done(&self.inner.name, c.state.name());
            c.stats.completed = Some(report.clone());
            (
                std::mem::take(&mut c.waiters),
                std::mem::take(&mut c.queued),
            )
        };
        info!(handle = %self.inner.name, entries = report.entries_applied, reads = report.reads_issued, "pending-ack replay complete; handle ready");
        for w in waiters {
            w.complete(Ok(()));
        }
        for (r, cb) in queued {
            self.append(r, cb);
        }
    }

    /// `exceptionHandleFuture`: retryable → back to None (unless Close) and
    /// schedule `init` after the next backoff delay; otherwise give up.
    /// The end of a failed attempt: give up or retry.
    fn exception_handle(&self, e: PendingAckError) {
        if !e.is_retryable() {
            self.give_up_at(e, true);
            return;
        }
        self.schedule_retry_at(e, true);
    }

    /// Back to None (unless Close) and `init` after the next backoff delay.
    fn schedule_retry(&self, e: PendingAckError) {
        self.schedule_retry_at(e, false);
    }

    /// [`schedule_retry`](Self::schedule_retry); `attempt_end`: called
    /// where a replay attempt ended (the spec's `HDone`, recorded under the
    /// core lock).
    fn schedule_retry_at(&self, e: PendingAckError, attempt_end: bool) {
        let mut c = self.inner.core.lock();
        if c.state == HandleState::Close {
            crate::trace::pending_ack::h_done_at_end(&self.inner.name, attempt_end, c.state.name());
            return;
        }
        c.state = HandleState::None;
        let delay = c.backoff.next_delay_ms();
        c.stats.retry_delays_ms.push(delay);
        let me = self.clone();
        let id = self
            .inner
            .timer
            .schedule(delay, Box::new(move || me.init()));
        c.retry_timer = Some(id);
        crate::trace::pending_ack::h_done_at_end(&self.inner.name, attempt_end, c.state.name());
        drop(c);
        warn!(handle = %self.inner.name, error = %e, delay_ms = delay, "pending-ack replay attempt failed; retrying init after backoff");
    }

    fn give_up(&self, e: PendingAckError) {
        self.give_up_at(e, false);
    }

    /// [`give_up`](Self::give_up); `attempt_end` as for
    /// [`schedule_retry_at`](Self::schedule_retry_at).
    fn give_up_at(&self, e: PendingAckError, attempt_end: bool) {
        let (waiters, queued, err) = {
            let mut c = self.inner.core.lock();
            if c.state == HandleState::Close {
                crate::trace::pending_ack::h_done_at_end(
                    &self.inner.name,
                    attempt_end,
                    c.state.name(),
                );
                return;
            }
            let err = PendingAckError::InitFailed {
                name: self.inner.name.clone(),
                cause: Box::new(e),
            };
            c.state = HandleState::Error;
            c.error = Some(err.clone());
            crate::trace::pending_ack::h_done_at_end(&self.inner.name, attempt_end, c.state.name());
            (
                std::mem::take(&mut c.waiters),
                std::mem::take(&mut c.queued),
                err,
            )
        };
        error!(handle = %self.inner.name, error = %err, "pending-ack replay failed with a non-retryable error; giving up");
        for w in waiters {
            w.complete(Err(err.clone()));
        }
        for (_, cb) in queued {
            cb(Err(PendingAckError::NotReady {
                name: self.inner.name.clone(),
                state: "Error",
            }));
        }
    }
}
