//! The synchronisation facade: the **only** place that chooses between `std`,
//! [loom] and [shuttle] primitives (after tokio's crate-private `src/loom/`).
//!
//! Every atomic, lock, thread spawn, `Arc` and published cell used by
//! concurrency-critical code in this crate is imported from here, so the very
//! same algorithm runs in production (std), under loom's exhaustive
//! interleaving checker (`RUSTFLAGS="--cfg loom"`) and under shuttle's
//! randomized/PCT schedulers (`--features shuttle`). There is no second copy
//! of any algorithm for the models.
//!
//! | build                          | primitives                  |
//! |--------------------------------|-----------------------------|
//! | default, `--no-default-features` | `std::sync`, `std::thread`, [`arc_swap`] |
//! | `--features race-hooks`        | std, with [`hooked_atomic`]'s atomics (every access a [`hook`] point) |
//! | `RUSTFLAGS="--cfg loom"`       | `loom::sync`, `loom::thread` |
//! | `--features shuttle` (no loom) | `shuttle::sync`, `shuttle::thread` |
//!
//! One primitive per file: [`atomic`] (atomics, `fence`, `Ordering`),
//! [`thread`], [`mutex`], [`rwlock`], [`condvar`], [`published`],
//! [`set_once`]; [`hook`] holds the simulator's test hooks (empty inline
//! functions without the `race-hooks` feature).
//!
//! The module is crate-private. The model-checking test crates
//! (`loom-tests/`, `shuttle-tests/`, the shuttle trace recorders) reach the
//! few primitives they build their threads with through
//! `pulsar_core::__model::sync` (src/model.rs).
//!
//! [loom]: https://docs.rs/loom
//! [shuttle]: https://docs.rs/shuttle

mod atomic;
mod condvar;
pub(crate) mod hook;
#[cfg(all(feature = "race-hooks", not(any(loom, feature = "shuttle"))))]
mod hooked_atomic;
mod mutex;
mod published;
mod rwlock;
mod set_once;
pub mod thread;

pub use atomic::{fence, AtomicBool, AtomicI64, AtomicU32, AtomicU64, AtomicUsize, Ordering};
pub use condvar::Condvar;
pub use mutex::{Mutex, MutexGuard};
pub use published::Published;
pub use rwlock::RwLock;
pub use set_once::SetOnce;

/// `Arc` of the active backend (`std::sync::Arc` in every build but the
/// model-checking ones).
#[cfg(loom)]
pub use loom::sync::Arc;
/// `Arc` of the active backend (`std::sync::Arc` in every build but the
/// model-checking ones).
#[cfg(all(feature = "shuttle", not(loom)))]
pub use shuttle::sync::Arc;
/// `Arc` of the active backend (`std::sync::Arc` in every build but the
/// model-checking ones).
#[cfg(not(any(loom, feature = "shuttle")))]
pub use std::sync::Arc;

/// Pads and aligns a value to the cache-line size of the target (128 bytes
/// on x86_64 and aarch64), so that a value written often (e.g. a lock word)
/// does not share a cache line with values other threads only read.
///
/// A memory-layout wrapper with no synchronisation of its own, so the same
/// type is used in every build (std, loom, shuttle).
pub use crossbeam_utils::CachePadded;

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
