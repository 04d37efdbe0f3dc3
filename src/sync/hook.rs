//! Test hooks: named points inside components where a harness (the
//! simulator's `hint_race` and `replay_race` stages) runs code **on the
//! calling thread**, to place another operation exactly inside a window
//! that real threads hit only by luck (e.g. a reset between the two
//! reset-epoch reads of a lock-free lookup, a read failure between the
//! pending-ack replay's two loads in `fill_queue`).
//!
//! A component calls [`at`] at its named points: one line, whose no-op twin
//! (every build without the `race-hooks` feature: the default build,
//! `cargo bench`, `serve`, an embedder's `default-features = false`) is an
//! empty inline function, so the point compiles to nothing. With
//! `race-hooks` a hook is installed per thread (`install`); the cost
//! when no hook is installed in the process is one relaxed load of a static
//! and a predictable branch. The registry uses `std` directly in every
//! build (like `crate::trace`'s log): it is not a scheduling point under
//! loom or shuttle. A hook is not re-entered: a point reached from inside
//! the hook itself is skipped.

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
    /// only in builds with the `race-hooks` feature on the std backend (see
    /// `hooked_atomic.rs`). Reached on the writing thread, so a hook can
    /// run a lock-free reader between two writes of one operation.
    AtomicWrite,
    /// Any load of one of the facade's atomics or a
    /// [`Published`](super::Published) cell, just after it returned;
    /// same builds as [`Point::AtomicWrite`]. Reached on the reading
    /// thread, so a hook can run a complete writer operation between
    /// two loads of one lock-free read.
    AtomicRead,
}

#[cfg(feature = "race-hooks")]
pub use registry::{at, install};

/// No-op twin of the registry's `at` (no `race-hooks` feature): the point
/// compiles to nothing.
#[cfg(not(feature = "race-hooks"))]
#[inline(always)]
pub fn at(_point: Point) {}

/// The per-thread hook registry (`race-hooks` builds only).
#[cfg(feature = "race-hooks")]
mod registry {
    use super::Point;
    use std::cell::RefCell;
    use std::sync::atomic::{AtomicUsize, Ordering};

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
