//! The synchronisation facade: the **only** module that chooses between `std`,
//! [loom] and [shuttle] primitives.
//!
//! Every atomic, lock, thread spawn, `Arc` and published cell used by
//! concurrency-critical code in this crate is imported from here, so the very
//! same algorithm runs in production (std), under loom's exhaustive
//! interleaving checker (`RUSTFLAGS="--cfg loom"`) and under shuttle's
//! randomized/PCT schedulers (`--features shuttle`). There is no second copy
//! of any algorithm for the models. This follows tokio's `src/loom` facade.
//!
//! | build                          | primitives                  |
//! |--------------------------------|-----------------------------|
//! | default                        | `std::sync`, `std::thread`, [`arc_swap`] |
//! | `RUSTFLAGS="--cfg loom"`       | `loom::sync`, `loom::thread` |
//! | `--features shuttle` (no loom) | `shuttle::sync`, `shuttle::thread` |
//!
//! With the `sim` feature (the simulator; on in the default features, off
//! in an embedder's `--no-default-features` build) the std backend's
//! atomics are `repr(transparent)` wrappers whose every write is also a
//! [`hook`] point ([`hook::Point::AtomicWrite`], [`hook::Point::AtomicRead`];
//! see `write_points.rs`; [`Published`] cells too): the simulator places a
//! lock-free reader after each write of an operation that publishes state
//! in more than one write, and a complete writer operation after each load
//! of a lock-free read. Each access costs one extra relaxed load of a static
//! while no hook is installed, so measure the components' speed with
//! `cargo bench --no-default-features` (plain std atomics).
//!
//! Locks are exposed through thin wrappers ([`Mutex`], [`RwLock`]) whose
//! `lock`/`read`/`write` return the guard directly: a poisoned lock (a thread
//! panicked while holding it) is recovered rather than propagated, because
//! every critical section in this crate restores its invariants before any
//! operation that could panic.
//!
//! [`Published`] is the published-value cell (a single-writer-friendly,
//! multi-reader "current value" slot) used for lock-free lookups: it wraps
//! [`arc_swap::ArcSwap`] in the std build and a modelled equivalent with the
//! same contract under loom/shuttle (arc-swap is not loom-aware).
//!
//! [loom]: https://docs.rs/loom
//! [shuttle]: https://docs.rs/shuttle

#[cfg(loom)]
mod imp {
    pub use loom::sync::atomic::{
        fence, AtomicBool, AtomicI32, AtomicI64, AtomicU32, AtomicU64, AtomicUsize, Ordering,
    };
    pub use loom::sync::Arc;
    pub(crate) use loom::sync::{
        Condvar as RawCondvar, Mutex as RawMutex, MutexGuard as RawMutexGuard, RwLock as RawRwLock,
        RwLockReadGuard as RawReadGuard, RwLockWriteGuard as RawWriteGuard,
    };
    pub mod thread {
        //! loom's thread module.
        pub use loom::thread::{current, spawn, yield_now, JoinHandle};
    }
}

#[cfg(all(feature = "shuttle", not(loom)))]
mod imp {
    pub use shuttle::sync::atomic::{
        fence, AtomicBool, AtomicI32, AtomicI64, AtomicU32, AtomicU64, AtomicUsize, Ordering,
    };
    pub use shuttle::sync::Arc;
    pub(crate) use shuttle::sync::{
        Condvar as RawCondvar, Mutex as RawMutex, MutexGuard as RawMutexGuard, RwLock as RawRwLock,
        RwLockReadGuard as RawReadGuard, RwLockWriteGuard as RawWriteGuard,
    };
    pub mod thread {
        //! shuttle's thread module.
        pub use shuttle::thread::{current, spawn, yield_now, JoinHandle};
    }
}

#[cfg(not(any(loom, feature = "shuttle")))]
mod imp {
    #[cfg(feature = "sim")]
    pub use super::write_points::{
        AtomicBool, AtomicI32, AtomicI64, AtomicU32, AtomicU64, AtomicUsize,
    };
    pub use std::sync::atomic::{fence, Ordering};
    #[cfg(not(feature = "sim"))]
    pub use std::sync::atomic::{
        AtomicBool, AtomicI32, AtomicI64, AtomicU32, AtomicU64, AtomicUsize,
    };
    pub use std::sync::Arc;
    pub(crate) use std::sync::{
        Condvar as RawCondvar, Mutex as RawMutex, MutexGuard as RawMutexGuard, RwLock as RawRwLock,
        RwLockReadGuard as RawReadGuard, RwLockWriteGuard as RawWriteGuard,
    };
    pub mod thread {
        //! std's thread module.
        pub use std::thread::{current, spawn, yield_now, JoinHandle};
    }
}

#[cfg(all(feature = "sim", not(any(loom, feature = "shuttle"))))]
#[path = "sync/write_points.rs"]
mod write_points;

pub use imp::thread;
pub use imp::{
    fence, Arc, AtomicBool, AtomicI32, AtomicI64, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};

/// Pads and aligns a value to the cache-line size of the target (128 bytes
/// on x86_64 and aarch64), so that a value written often (e.g. a lock word)
/// does not share a cache line with values other threads only read.
///
/// A memory-layout wrapper with no synchronisation of its own, so the same
/// type is used in every build (std, loom, shuttle).
pub use crossbeam_utils::CachePadded;

use std::fmt;
use std::time::Duration;

/// Mutual-exclusion lock from the active backend (std / loom / shuttle).
///
/// `lock` returns the guard directly; poisoning is recovered (see the module
/// docs). Any thread may call it; it blocks (std) or yields to the model's
/// scheduler (loom/shuttle).
pub struct Mutex<T> {
    inner: imp::RawMutex<T>,
}

/// Guard returned by [`Mutex::lock`].
pub type MutexGuard<'a, T> = imp::RawMutexGuard<'a, T>;

impl<T> Mutex<T> {
    /// Creates an unlocked mutex holding `value`.
    pub fn new(value: T) -> Self {
        Self {
            inner: imp::RawMutex::new(value),
        }
    }

    /// Acquires the lock, blocking the calling thread until it is available.
    pub fn lock(&self) -> MutexGuard<'_, T> {
        match self.inner.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Consumes the mutex and returns the value.
    pub fn into_inner(self) -> T {
        match self.inner.into_inner() {
            Ok(v) => v,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}

impl<T: Default> Default for Mutex<T> {
    fn default() -> Self {
        Self::new(T::default())
    }
}

impl<T: fmt::Debug> fmt::Debug for Mutex<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mutex").finish_non_exhaustive()
    }
}

/// Reader-writer lock from the active backend (std / loom / shuttle).
///
/// `read`/`write` return guards directly; poisoning is recovered.
pub struct RwLock<T> {
    inner: imp::RawRwLock<T>,
}

/// Shared guard returned by [`RwLock::read`].
pub type RwLockReadGuard<'a, T> = imp::RawReadGuard<'a, T>;
/// Exclusive guard returned by [`RwLock::write`].
pub type RwLockWriteGuard<'a, T> = imp::RawWriteGuard<'a, T>;

impl<T> RwLock<T> {
    /// Creates an unlocked reader-writer lock holding `value`.
    pub fn new(value: T) -> Self {
        Self {
            inner: imp::RawRwLock::new(value),
        }
    }

    /// Acquires shared access, blocking while a writer holds the lock.
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        match self.inner.read() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Acquires shared access only if that needs no waiting: `None` while a
    /// writer holds the lock (or, with std's writer-preferring lock, while
    /// a writer is queued). Never blocks; for lock-free readers that may
    /// answer conservatively instead of waiting.
    pub fn try_read(&self) -> Option<RwLockReadGuard<'_, T>> {
        match self.inner.try_read() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Acquires exclusive access, blocking while any reader or writer holds it.
    pub fn write(&self) -> RwLockWriteGuard<'_, T> {
        match self.inner.write() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}

impl<T: Default> Default for RwLock<T> {
    fn default() -> Self {
        Self::new(T::default())
    }
}

impl<T> fmt::Debug for RwLock<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwLock").finish_non_exhaustive()
    }
}

/// Condition variable from the active backend, paired with [`Mutex`].
pub struct Condvar {
    inner: imp::RawCondvar,
}

impl Condvar {
    /// Creates a condition variable with no waiters.
    pub fn new() -> Self {
        Self {
            inner: imp::RawCondvar::new(),
        }
    }

    /// Blocks until notified (spurious wake-ups are possible: re-check the
    /// predicate in a loop).
    pub fn wait<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        match self.inner.wait(guard) {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Blocks until notified or until `timeout` (wall-clock; std build only
    /// honours it exactly) elapses. Returns the guard and whether it timed out.
    pub fn wait_timeout<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        timeout: Duration,
    ) -> (MutexGuard<'a, T>, bool) {
        match self.inner.wait_timeout(guard, timeout) {
            Ok((g, r)) => (g, r.timed_out()),
            Err(poisoned) => {
                let (g, r) = poisoned.into_inner();
                (g, r.timed_out())
            }
        }
    }

    /// Wakes one waiter.
    pub fn notify_one(&self) {
        self.inner.notify_one();
    }

    /// Wakes every waiter.
    pub fn notify_all(&self) {
        self.inner.notify_all();
    }
}

impl Default for Condvar {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Condvar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Condvar").finish_non_exhaustive()
    }
}

/// A published-value cell: one current `Arc<T>` that readers load without
/// taking a lock and writers replace atomically.
///
/// Contract (checked by `loom-tests/published.rs` and
/// `shuttle-tests/published.rs`):
/// - a load returns a value that some `store`/`rcu` actually published (never
///   a torn or invented value);
/// - loads are linearizable with stores: once a thread has observed value
///   `v2`, none of its later loads returns a value published before `v2`;
/// - everything the writer did before `store` happens-before anything a reader
///   does after a load that returns the stored value (release/acquire).
///
/// Std build: a thin wrapper over [`arc_swap::ArcSwap`] (wait-free loads via
/// its debt slots). Loom/shuttle builds: a modelled equivalent, an
/// `RwLock<Arc<T>>` of the model's scheduler, with the same contract.
///
/// Concurrency: any number of threads may `load`/`with` concurrently with any
/// number of `store`/`rcu` callers. `rcu` retries its closure while racing
/// other writers, so the closure must be pure.
pub struct Published<T> {
    #[cfg(not(any(loom, feature = "shuttle")))]
    inner: arc_swap::ArcSwap<T>,
    #[cfg(any(loom, feature = "shuttle"))]
    inner: imp::RawRwLock<Arc<T>>,
}

impl<T> Published<T> {
    /// Creates a cell whose current value is `value`.
    pub fn new(value: T) -> Self {
        Self::from_arc(Arc::new(value))
    }

    /// Creates a cell whose current value is the given `Arc`.
    pub fn from_arc(value: Arc<T>) -> Self {
        #[cfg(not(any(loom, feature = "shuttle")))]
        {
            Self {
                inner: arc_swap::ArcSwap::new(value),
            }
        }
        #[cfg(any(loom, feature = "shuttle"))]
        {
            Self {
                inner: imp::RawRwLock::new(value),
            }
        }
    }

    /// Returns the current value as an owned `Arc` (one reference-count
    /// increment; prefer [`Published::with`] on hot paths).
    pub fn load(&self) -> Arc<T> {
        #[cfg(not(any(loom, feature = "shuttle")))]
        {
            let value = self.inner.load_full();
            #[cfg(feature = "sim")]
            hook::at(hook::Point::AtomicRead);
            value
        }
        #[cfg(any(loom, feature = "shuttle"))]
        {
            let guard = match self.inner.read() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
            Arc::clone(&guard)
        }
    }

    /// Runs `f` on the current value without taking a lock or touching the
    /// reference count (std build). The borrow must not escape `f`.
    #[inline]
    pub fn with<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        #[cfg(not(any(loom, feature = "shuttle")))]
        {
            let guard = self.inner.load();
            #[cfg(feature = "sim")]
            hook::at(hook::Point::AtomicRead);
            f(&guard)
        }
        #[cfg(any(loom, feature = "shuttle"))]
        {
            let current = self.load();
            f(&current)
        }
    }

    /// Publishes `value`, replacing the current one.
    pub fn store(&self, value: T) {
        self.store_arc(Arc::new(value));
    }

    /// Publishes an existing `Arc`, replacing the current one.
    pub fn store_arc(&self, value: Arc<T>) {
        #[cfg(not(any(loom, feature = "shuttle")))]
        {
            self.inner.store(value);
            #[cfg(feature = "sim")]
            hook::at(hook::Point::AtomicWrite);
        }
        #[cfg(any(loom, feature = "shuttle"))]
        {
            let mut guard = match self.inner.write() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
            *guard = value;
        }
    }

    /// Read-copy-update: publishes `f(current)`, retrying if another writer
    /// published in between. Returns the value that was replaced.
    pub fn rcu(&self, mut f: impl FnMut(&T) -> T) -> Arc<T> {
        #[cfg(not(any(loom, feature = "shuttle")))]
        {
            let old = self.inner.rcu(|cur| Arc::new(f(cur)));
            #[cfg(feature = "sim")]
            hook::at(hook::Point::AtomicWrite);
            old
        }
        #[cfg(any(loom, feature = "shuttle"))]
        {
            let mut guard = match self.inner.write() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
            let next = Arc::new(f(&guard));
            std::mem::replace(&mut *guard, next)
        }
    }
}

impl<T: Default> Default for Published<T> {
    fn default() -> Self {
        Self::new(T::default())
    }
}

impl<T: fmt::Debug> fmt::Debug for Published<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.with(|v| f.debug_tuple("Published").field(v).finish())
    }
}

/// A cell written at most once, then read without a lock: a lazily
/// allocated part of a structure that lock-free readers reach (the cursor's
/// bitmap mirror chunks, `crate::deletion`'s `BitMirror`).
///
/// Contract: [`SetOnce::with`] runs its closure on the value if it has been
/// set (and returns `None` otherwise); everything the initialising thread
/// did before [`SetOnce::with_or_init`] stored the value happens-before
/// anything a reader does inside `with` on it (release/acquire). Once set,
/// the value never changes or moves.
///
/// Std build: [`std::sync::OnceLock`] (a reader's `with` is one acquire
/// load). Loom/shuttle builds: the value in a `std` `OnceLock` the model
/// does not see, published by a modelled `AtomicBool` (Release store after
/// the value is set, Acquire load before it is read), so the model has
/// exactly the std cell's happens-before edges and no more (a modelled lock
/// on the read path would synchronise every reader with every earlier
/// reader and writer, hiding missing orderings in the code that uses it).
/// Initialisers are serialised by a modelled mutex, which readers never
/// take.
///
/// Concurrency: any number of readers concurrently with initialisers; of
/// racing initialisers exactly one closure's value is kept.
pub struct SetOnce<T> {
    #[cfg(not(any(loom, feature = "shuttle")))]
    inner: std::sync::OnceLock<T>,
    #[cfg(any(loom, feature = "shuttle"))]
    inner: ModelSetOnce<T>,
}

#[cfg(any(loom, feature = "shuttle"))]
struct ModelSetOnce<T> {
    value: std::sync::OnceLock<T>,
    published: imp::AtomicBool,
    init: Mutex<()>,
}

impl<T> SetOnce<T> {
    /// An empty cell.
    pub fn new() -> Self {
        Self {
            #[cfg(not(any(loom, feature = "shuttle")))]
            inner: std::sync::OnceLock::new(),
            #[cfg(any(loom, feature = "shuttle"))]
            inner: ModelSetOnce {
                value: std::sync::OnceLock::new(),
                published: imp::AtomicBool::new(false),
                init: Mutex::new(()),
            },
        }
    }

    /// `f` applied to the value, or `None` if it is not set yet.
    #[inline]
    pub fn with<R>(&self, f: impl FnOnce(&T) -> R) -> Option<R> {
        #[cfg(not(any(loom, feature = "shuttle")))]
        {
            self.inner.get().map(f)
        }
        #[cfg(any(loom, feature = "shuttle"))]
        {
            // Acquire: pairs with the Release store after the value was set.
            if self.inner.published.load(Ordering::Acquire) {
                self.inner.value.get().map(f)
            } else {
                None
            }
        }
    }

    /// `f` applied to the value, setting it to `init()` first if it is
    /// not set.
    pub fn with_or_init<R>(&self, init: impl FnOnce() -> T, f: impl FnOnce(&T) -> R) -> R {
        #[cfg(not(any(loom, feature = "shuttle")))]
        {
            f(self.inner.get_or_init(init))
        }
        #[cfg(any(loom, feature = "shuttle"))]
        {
            if !self.inner.published.load(Ordering::Acquire) {
                let _serialised = self.inner.init.lock();
                if !self.inner.published.load(Ordering::Acquire) {
                    // Uncontended: initialisers hold `init`.
                    let _ = self.inner.value.set(init());
                    // Release: the value's construction happens-before a
                    // reader that sees `published`.
                    self.inner.published.store(true, Ordering::Release);
                }
            }
            f(self
                .inner
                .value
                .get()
                .expect("published only after the value is set"))
        }
    }
}

impl<T> Default for SetOnce<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> fmt::Debug for SetOnce<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SetOnce")
            .field("set", &self.with(|_| ()).is_some())
            .finish()
    }
}

/// Test hooks: named points inside components where a harness (the
/// simulator's `hint_race` and `replay_race` stages) runs code **on the
/// calling thread**, to place another operation exactly inside a window
/// that real threads hit only by luck (e.g. a reset between the two
/// reset-epoch reads of a lock-free lookup, a read failure between the
/// pending-ack replay's two loads in `fill_queue`).
///
/// A hook is installed per thread ([`hook::install`]); a component calls
/// [`hook::at`] at its named points. Cost when no hook is installed in the
/// process: one relaxed load of a static and a predictable branch. The
/// registry uses `std` directly in every build (like `crate::trace`'s
/// log): it is not a scheduling point under loom or shuttle. A hook is
/// not re-entered: a point reached from inside the hook itself is skipped.
pub mod hook {
    use std::cell::RefCell;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A named point in a component's code.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    #[non_exhaustive]
    pub enum Point {
        /// `CursorDeletionState::read_scheduling_lookup`: the lock-free
        /// attempt has read an even reset epoch and the mark-delete
        /// snapshot; it has not yet read the directory nor re-read the
        /// epoch.
        SchedulingLookupAfterMarkDelete,
        /// `CursorDeletionState`'s reset bracket (`reset`, `restore`): the
        /// ranges are replaced and mark-delete is published, the reset
        /// epoch is still odd and the cursor write lock is held (between
        /// `ResetClear` and `ResetEnd` of `specs/DeletionLookup.tla`).
        /// Reached on the resetting thread.
        ResetBeforeEnd,
        /// `pending_ack::replay::ReplayAttempt::fill_queue`: the first of
        /// its two loads (`outstanding_reads`, then `is_readable`) has
        /// passed; the second has not run. Reached on the replay thread.
        FillQueueBetweenLoads,
        /// `pending_ack::replay::ReplayAttempt::read_failed`: the first of
        /// its two stores (clear `is_readable`, then decrement
        /// `outstanding_reads`) is done; the second is not. Reached on the
        /// thread delivering the read failure.
        ReadFailedBetweenStores,
        /// Any write (store, swap, read-modify-write, compare-exchange,
        /// also a failed one) to one of the facade's atomics or a
        /// [`Published`](super::Published) cell, just after it took effect;
        /// only in builds with the `sim` feature on the std backend (see
        /// `write_points.rs`). Reached on the writing thread, so a hook can
        /// run a lock-free reader between two writes of one operation.
        AtomicWrite,
        /// Any load of one of the facade's atomics or a
        /// [`Published`](super::Published) cell, just after it returned;
        /// same builds as [`Point::AtomicWrite`]. Reached on the reading
        /// thread, so a hook can run a complete writer operation between
        /// two loads of one lock-free read.
        AtomicRead,
    }

    type Hook = Box<dyn FnMut(Point)>;

    /// Threads with a hook installed (fast path: 0).
    static INSTALLED: AtomicUsize = AtomicUsize::new(0);

    std::thread_local! {
        static HOOK: RefCell<Option<Hook>> = const { RefCell::new(None) };
    }

    /// Runs this thread's hook, if any, at `point`.
    #[inline]
    pub fn at(point: Point) {
        // Relaxed: the flag only gates a thread-local lookup; the hook
        // itself is installed and run on the same thread.
        if INSTALLED.load(Ordering::Relaxed) != 0 {
            run(point);
        }
    }

    #[cold]
    fn run(point: Point) {
        HOOK.with(|h| {
            // Busy = this point was reached from inside the hook: skip.
            if let Ok(mut h) = h.try_borrow_mut() {
                if let Some(f) = h.as_mut() {
                    f(point);
                }
            }
        });
    }

    /// Removes the hook it was returned for when dropped.
    #[derive(Debug)]
    #[must_use = "the hook is removed when this is dropped"]
    pub struct Installed(());

    impl Drop for Installed {
        fn drop(&mut self) {
            if HOOK.with(|h| h.borrow_mut().take()).is_some() {
                INSTALLED.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// Installs `f` as this thread's hook (replacing any), until the
    /// returned guard is dropped.
    pub fn install(f: impl FnMut(Point) + 'static) -> Installed {
        if HOOK.with(|h| h.borrow_mut().replace(Box::new(f))).is_none() {
            INSTALLED.fetch_add(1, Ordering::Relaxed);
        }
        Installed(())
    }
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests {
    use super::*;

    #[test]
    fn published_load_store_rcu() {
        let cell = Published::new(1u32);
        assert_eq!(*cell.load(), 1);
        cell.store(2);
        assert_eq!(cell.with(|v| *v), 2);
        let old = cell.rcu(|v| v + 10);
        assert_eq!(*old, 2);
        assert_eq!(*cell.load(), 12);
    }

    #[test]
    fn mutex_recovers_from_poison() {
        let m = Arc::new(Mutex::new(5));
        let m2 = Arc::clone(&m);
        let _ = std::thread::spawn(move || {
            let _g = m2.lock();
            panic!("poison on purpose");
        })
        .join();
        assert_eq!(*m.lock(), 5);
    }
}
