//! Group commit: one store writer thread that gives every durable write
//! that arrived while a commit was in flight ONE transaction and ONE fsync
//! (BookKeeper's journal does the same for its adds), and completes each
//! write's [`Completion`](super::Completion) only after that commit
//! returned.
//!
//! ```text
//!  callers (any thread, never blocked) ──submit──► queue ──► writer thread:
//!      take ≤ max_batch_writes / max_batch_bytes (wait ≤ max_delay for more)
//!      admit each write (a refused one completes with its error, unwritten)
//!      begin ─► apply w1, w2, … ─► commit (one fsync) ─► finish w1, w2, …
//! ```
//!
//! Rules, each a test in `tests/group_commit.rs` or `loom-tests/group_commit.rs`:
//!
//! * **Never early.** A write's `finish` runs after `commit` returned `Ok`
//!   for the transaction holding it, never before (loom:
//!   `completion_never_fires_before_its_commit`, with the negative control
//!   `negative_control_completion_before_commit_is_caught`).
//! * **All or nothing.** If applying any write of a batch fails, or the
//!   commit fails, the transaction is dropped (aborted: nothing of the batch
//!   is stored) and every write of the batch finishes with that typed error;
//!   the components change their in-memory state only in a successful
//!   `finish`, so a failed write leaves it unchanged.
//! * **Order.** Writes are applied and finished in submission order (one
//!   submitter's writes, e.g. a managed ledger's appends, stay in order).
//! * **Bounded.** A batch holds at most
//!   [`GroupCommitConfig::max_batch_writes`] writes and (beyond its first
//!   write) [`GroupCommitConfig::max_batch_bytes`] bytes; the writer waits
//!   at most [`GroupCommitConfig::max_delay`] for a batch to fill (default
//!   zero: a batch is whatever arrived during the previous commit). So a
//!   write waits for at most the commit in flight, `max_delay`, and its own
//!   commit (plus, under overload, the batches queued before it).
//! * **Backpressure.** The queue is bounded too:
//!   [`GroupCommitter::check_capacity`] refuses a write with
//!   [`StoreError::Throttled`] (transient: retry later, as a Pulsar client
//!   does on `TooManyRequests`) while
//!   [`GroupCommitConfig::max_queued_writes`] writes or
//!   [`GroupCommitConfig::max_queued_bytes`] bytes wait for the writer.
//!   The store's non-blocking writes (appends, cursor persists, delayed
//!   snapshots) call it before they plan or queue anything, so a refused
//!   write changes nothing and never fails the writes queued before it.
//!   The check and the push are two steps: each thread submitting at the
//!   same instant may add one write beyond the bound, never more.
//! * **Callbacks.** `finish` (and so every completion callback and waker)
//!   runs on the writer thread after the commit, outside the queue lock; a
//!   panicking callback is contained (logged), the writer goes on.
//! * **Stop.** Dropping the [`GroupCommitter`] lets the writer drain the
//!   queue (every queued write is committed and finished) and joins it.
//!
//! The algorithm is generic over a [`CommitBackend`] (the redb store's is
//! `RedbCommitBackend`), so the loom model runs this very code with an
//! in-memory backend. All synchronisation is `crate::sync`'s.

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

use super::error::StoreError;
use crate::sync::{thread, Arc, AtomicU64, Condvar, Mutex, Ordering};

/// Bounds of a [`GroupCommitter`]'s batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupCommitConfig {
    /// Most writes in one transaction (default 1,024; ≥ 1).
    pub max_batch_writes: usize,
    /// Most bytes (the writes' own estimates) in one transaction beyond its
    /// first write, which is always taken (default 16 MiB).
    pub max_batch_bytes: usize,
    /// How long the writer waits for a batch to fill before committing it
    /// (default zero: no waiting; writes that arrive during a commit form
    /// the next batch).
    pub max_delay: Duration,
    /// Most writes waiting in the queue (not yet taken into a batch) before
    /// [`GroupCommitter::check_capacity`] refuses more (default 65,536;
    /// ≥ 1).
    pub max_queued_writes: usize,
    /// Most bytes (the writes' own estimates) waiting in the queue before
    /// [`GroupCommitter::check_capacity`] refuses more (default 256 MiB). A
    /// write larger than this is still taken when the queue is empty.
    pub max_queued_bytes: usize,
}

impl Default for GroupCommitConfig {
    fn default() -> Self {
        Self {
            max_batch_writes: 1024,
            max_batch_bytes: 16 << 20,
            max_delay: Duration::ZERO,
            max_queued_writes: 1 << 16,
            max_queued_bytes: 256 << 20,
        }
    }
}

/// A store the [`GroupCommitter`] commits to: one transaction at a time,
/// on the writer thread.
pub trait CommitBackend: Send + 'static {
    /// A write transaction; dropping it without [`CommitBackend::commit`]
    /// aborts it (nothing of it is stored).
    type Txn;
    /// Begins a transaction.
    ///
    /// # Errors
    /// The store's typed error; every write of the batch gets it.
    fn begin(&mut self) -> Result<Self::Txn, StoreError>;
    /// Commits `txn` durably: returns only once everything applied to it
    /// is durable (for redb with `SyncMode::Immediate`, after the fsync).
    ///
    /// # Errors
    /// The store's typed error; nothing of `txn` is stored.
    fn commit(&mut self, txn: Self::Txn) -> Result<(), StoreError>;
}

/// One durable write queued on a [`GroupCommitter`].
pub trait StoreWrite<Tx>: Send {
    /// Bytes this write adds to a batch (for
    /// [`GroupCommitConfig::max_batch_bytes`]).
    fn bytes(&self) -> usize {
        0
    }
    /// Called on the writer thread before the batch's transaction begins:
    /// `Err` refuses the write (it is finished with that error at once and
    /// nothing of it is applied). Default: admitted.
    ///
    /// # Errors
    /// Why the write may no longer be applied.
    fn admit(&mut self) -> Result<(), StoreError> {
        Ok(())
    }
    /// Applies the write to the batch's transaction.
    ///
    /// # Errors
    /// The store's typed error: the whole batch is aborted.
    fn apply(&mut self, txn: &Tx) -> Result<(), StoreError>;
    /// The outcome: `Ok` only after the commit of the transaction the write
    /// was applied to returned `Ok`.
    fn finish(self: Box<Self>, outcome: Result<(), StoreError>);
}

/// Counters of a [`GroupCommitter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GroupCommitStats {
    /// Transactions committed.
    pub commits: u64,
    /// Writes committed (sum of the committed batches' sizes).
    pub writes: u64,
    /// Transactions that failed (begin, an apply or the commit); every
    /// write in them got the error.
    pub failed_commits: u64,
    /// Writes refused by their own admission check.
    pub refused: u64,
    /// Largest batch committed.
    pub largest_batch: u64,
    /// Writes refused by [`GroupCommitter::check_capacity`] because the
    /// queue was full (backpressure).
    pub throttled: u64,
}

type Boxed<Tx> = Box<dyn StoreWrite<Tx>>;

struct Queue<Tx> {
    writes: VecDeque<Boxed<Tx>>,
    /// Sum of the queued writes' [`StoreWrite::bytes`].
    bytes: usize,
    stopping: bool,
}

struct Shared<Tx> {
    queue: Mutex<Queue<Tx>>,
    arrived: Condvar,
    commits: AtomicU64,
    writes: AtomicU64,
    failed_commits: AtomicU64,
    refused: AtomicU64,
    largest_batch: AtomicU64,
    throttled: AtomicU64,
}

/// The store writer: see the module docs. Cheap to share behind an `Arc`;
/// [`GroupCommitter::submit`] may be called from any thread and never
/// blocks on I/O.
pub struct GroupCommitter<B: CommitBackend> {
    shared: Arc<Shared<B::Txn>>,
    config: GroupCommitConfig,
    writer: Option<thread::JoinHandle<()>>,
    writer_id: thread::ThreadId,
}

impl<B: CommitBackend> GroupCommitter<B>
where
    B::Txn: 'static,
{
    /// Starts the writer thread on `backend`.
    ///
    /// # Blocking
    /// Spawns one thread; no I/O.
    pub fn start(backend: B, config: GroupCommitConfig) -> Self {
        let config = GroupCommitConfig {
            max_batch_writes: config.max_batch_writes.max(1),
            max_queued_writes: config.max_queued_writes.max(1),
            ..config
        };
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                writes: VecDeque::new(),
                bytes: 0,
                stopping: false,
            }),
            arrived: Condvar::new(),
            commits: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            failed_commits: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            largest_batch: AtomicU64::new(0),
            throttled: AtomicU64::new(0),
        });
        let writer = {
            let shared = Arc::clone(&shared);
            thread::spawn(move || writer_loop(backend, &shared, config))
        };
        let writer_id = writer.thread().id();
        Self {
            shared,
            config,
            writer: Some(writer),
            writer_id,
        }
    }

    /// Queues `write`; it is applied in the next batch and finished after
    /// that batch's commit. After the committer began stopping (it is being
    /// dropped) the write is finished at once with
    /// [`StoreError::Backend`].
    ///
    /// # Blocking
    /// Never blocks on I/O: takes the queue lock for a push.
    pub fn submit(&self, write: Boxed<B::Txn>) {
        let refused = {
            let mut q = self.shared.queue.lock();
            if q.stopping {
                Some(write)
            } else {
                q.bytes = q.bytes.saturating_add(write.bytes());
                q.writes.push_back(write);
                None
            }
        };
        match refused {
            Some(w) => w.finish(Err(stopped())),
            None => self.shared.arrived.notify_one(),
        }
    }

    /// Whether a write of about `bytes` bytes may be queued now
    /// (backpressure; see the module docs): `Err(StoreError::Throttled)`
    /// while [`GroupCommitConfig::max_queued_writes`] writes or
    /// [`GroupCommitConfig::max_queued_bytes`] bytes (counting this one;
    /// a write into an empty queue always fits) wait for the writer.
    /// Counted in [`GroupCommitStats::throttled`].
    ///
    /// # Errors
    /// [`StoreError::Throttled`] with the queue's size and bounds; nothing
    /// is queued or changed.
    ///
    /// # Blocking
    /// Never blocks on I/O: takes the queue lock for a read.
    pub fn check_capacity(&self, bytes: usize) -> Result<(), StoreError> {
        let (writes, queued_bytes) = self.queued();
        let full = writes >= self.config.max_queued_writes
            || (writes > 0 && queued_bytes.saturating_add(bytes) > self.config.max_queued_bytes);
        if !full {
            return Ok(());
        }
        self.shared.throttled.fetch_add(1, Ordering::Relaxed);
        Err(StoreError::Throttled(format!(
            "the store writer's queue is full: {writes} writes / {queued_bytes} bytes wait \
             (max_queued_writes {}, max_queued_bytes {}); the write was not queued",
            self.config.max_queued_writes, self.config.max_queued_bytes
        )))
    }

    /// Writes and bytes waiting in the queue now (not yet in a batch).
    pub fn queued(&self) -> (usize, usize) {
        let q = self.shared.queue.lock();
        (q.writes.len(), q.bytes)
    }

    /// Its batch bounds.
    pub fn config(&self) -> GroupCommitConfig {
        self.config
    }

    /// Its counters so far.
    pub fn stats(&self) -> GroupCommitStats {
        let s = &self.shared;
        GroupCommitStats {
            commits: s.commits.load(Ordering::Relaxed),
            writes: s.writes.load(Ordering::Relaxed),
            failed_commits: s.failed_commits.load(Ordering::Relaxed),
            refused: s.refused.load(Ordering::Relaxed),
            largest_batch: s.largest_batch.load(Ordering::Relaxed),
            throttled: s.throttled.load(Ordering::Relaxed),
        }
    }

    /// Whether the calling thread is the writer thread (a completion
    /// callback runs there).
    pub fn on_writer_thread(&self) -> bool {
        thread::current().id() == self.writer_id
    }
}

fn stopped() -> StoreError {
    StoreError::Backend("the store writer has stopped; the write was not applied".into())
}

impl<B: CommitBackend> Drop for GroupCommitter<B> {
    /// Stops the writer after it drained the queue.
    ///
    /// # Blocking
    /// Joins the writer thread: waits for every queued write's commit.
    /// Dropped on the writer thread itself (the last owner released in a
    /// completion callback), it does not wait: the writer drains and exits
    /// on its own.
    fn drop(&mut self) {
        self.shared.queue.lock().stopping = true;
        self.shared.arrived.notify_all();
        if let Some(w) = self.writer.take() {
            if thread::current().id() != self.writer_id {
                let _ = w.join();
            }
        }
    }
}

impl<B: CommitBackend> fmt::Debug for GroupCommitter<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GroupCommitter")
            .field("config", &self.config)
            .field("stats", &self.stats())
            .finish()
    }
}

/// Takes the next batch: blocks until a write arrives (or the committer
/// stops with an empty queue: `None`), then waits up to `max_delay` for
/// the batch to fill.
fn next_batch<Tx>(shared: &Shared<Tx>, config: &GroupCommitConfig) -> Option<Vec<Boxed<Tx>>> {
    let mut q = shared.queue.lock();
    while q.writes.is_empty() {
        if q.stopping {
            return None;
        }
        q = shared.arrived.wait(q);
    }
    if !config.max_delay.is_zero() {
        let deadline = Instant::now() + config.max_delay;
        while q.writes.len() < config.max_batch_writes && !q.stopping {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            q = shared.arrived.wait_timeout(q, deadline - now).0;
        }
    }
    let mut batch = Vec::new();
    let mut bytes = 0usize;
    while let Some(w) = q.writes.front() {
        let b = w.bytes();
        if !batch.is_empty()
            && (batch.len() >= config.max_batch_writes
                || bytes.saturating_add(b) > config.max_batch_bytes)
        {
            break;
        }
        bytes = bytes.saturating_add(b);
        batch.extend(q.writes.pop_front());
    }
    q.bytes = q.bytes.saturating_sub(bytes);
    Some(batch)
}

thread::thread_local! {
    /// Whether this thread is a group committer's writer thread (the
    /// backend's thread-local: a loom or shuttle thread is not an OS
    /// thread). Not a `const` initialiser: loom's macro takes none.
    #[allow(clippy::missing_const_for_thread_local)]
    static ON_WRITER_THREAD: std::cell::Cell<bool> = std::cell::Cell::new(false);
}

/// Whether the calling thread is a group committer's writer thread (where
/// completion callbacks run): a blocking wait for a write there would wait
/// for the thread itself, so [`Completion::wait`](super::Completion::wait)
/// refuses it with the completion's error instead of hanging.
pub(super) fn on_store_writer_thread() -> bool {
    ON_WRITER_THREAD.with(std::cell::Cell::get)
}

fn writer_loop<B: CommitBackend>(
    mut backend: B,
    shared: &Shared<B::Txn>,
    config: GroupCommitConfig,
) {
    ON_WRITER_THREAD.with(|f| f.set(true));
    while let Some(batch) = next_batch(shared, &config) {
        commit_batch(&mut backend, shared, batch);
    }
}

/// One group commit: admit, begin, apply every write, commit, then finish
/// every write with the commit's outcome (never before it returned).
fn commit_batch<B: CommitBackend>(
    backend: &mut B,
    shared: &Shared<B::Txn>,
    batch: Vec<Boxed<B::Txn>>,
) {
    let mut admitted = Vec::with_capacity(batch.len());
    for mut w in batch {
        match contain("admit", || w.admit()) {
            Ok(()) => admitted.push(w),
            Err(e) => {
                shared.refused.fetch_add(1, Ordering::Relaxed);
                finish(w, Err(e));
            }
        }
    }
    if admitted.is_empty() {
        return;
    }
    let outcome = contain("commit", || {
        let txn = backend.begin()?;
        for w in &mut admitted {
            w.apply(&txn)?;
        }
        backend.commit(txn)
    });
    let n = admitted.len() as u64;
    match &outcome {
        Ok(()) => {
            shared.commits.fetch_add(1, Ordering::Relaxed);
            shared.writes.fetch_add(n, Ordering::Relaxed);
            shared.largest_batch.fetch_max(n, Ordering::Relaxed);
        }
        Err(e) => {
            shared.failed_commits.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(writes = n, error = %e, "group commit failed; every write in it gets the error");
        }
    }
    for w in admitted {
        finish(w, outcome.clone());
    }
}

fn finish<Tx>(w: Boxed<Tx>, outcome: Result<(), StoreError>) {
    if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.finish(outcome)))
    {
        tracing::error!(
            panic = panic_message(&panic),
            "a completion callback panicked on the store writer thread"
        );
    }
}

/// Runs `f` with panics contained: a panic inside the store (redb on an
/// inconsistent page) becomes [`StoreError::Corrupt`] for every write of
/// the batch instead of killing the writer thread.
fn contain<T>(op: &str, f: impl FnOnce() -> Result<T, StoreError>) -> Result<T, StoreError> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(panic) => Err(StoreError::Corrupt(format!(
            "the embedded store failed during group {op}: {}",
            panic_message(&panic)
        ))),
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".into())
}

/// A [`StoreWrite`] from closures: `apply` runs in the batch's transaction
/// and returns the write's value; `done` gets `Ok(value)` after the commit,
/// or the typed error. `admit` (optional) may refuse the write first.
pub struct FnWrite<Tx, R, A, D> {
    bytes: usize,
    admit: Option<Box<dyn FnMut() -> Result<(), StoreError> + Send>>,
    apply: Option<A>,
    value: Option<R>,
    done: D,
    _tx: std::marker::PhantomData<fn(&Tx)>,
}

impl<Tx, R, A, D> FnWrite<Tx, R, A, D>
where
    R: Send,
    A: FnOnce(&Tx) -> Result<R, StoreError> + Send,
    D: FnOnce(Result<R, StoreError>) + Send,
{
    /// A write of about `bytes` bytes.
    pub fn new(bytes: usize, apply: A, done: D) -> Self {
        Self {
            bytes,
            admit: None,
            apply: Some(apply),
            value: None,
            done,
            _tx: std::marker::PhantomData,
        }
    }

    /// Adds an admission check run on the writer thread before the batch's
    /// transaction begins.
    pub fn with_admit(
        mut self,
        admit: impl FnMut() -> Result<(), StoreError> + Send + 'static,
    ) -> Self {
        self.admit = Some(Box::new(admit));
        self
    }
}

impl<Tx, R, A, D> StoreWrite<Tx> for FnWrite<Tx, R, A, D>
where
    R: Send,
    A: FnOnce(&Tx) -> Result<R, StoreError> + Send,
    D: FnOnce(Result<R, StoreError>) + Send,
{
    fn bytes(&self) -> usize {
        self.bytes
    }

    fn admit(&mut self) -> Result<(), StoreError> {
        match &mut self.admit {
            Some(a) => a(),
            None => Ok(()),
        }
    }

    fn apply(&mut self, txn: &Tx) -> Result<(), StoreError> {
        let apply = self
            .apply
            .take()
            .ok_or_else(|| StoreError::Backend("a write was applied twice".into()))?;
        self.value = Some(apply(txn)?);
        Ok(())
    }

    fn finish(self: Box<Self>, outcome: Result<(), StoreError>) {
        let this = *self;
        let result = match (outcome, this.value) {
            (Ok(()), Some(v)) => Ok(v),
            (Ok(()), None) => Err(StoreError::Backend(
                "a write finished without being applied".into(),
            )),
            (Err(e), _) => Err(e),
        };
        (this.done)(result);
    }
}
