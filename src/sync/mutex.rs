//! [`Mutex`]: the active backend's mutual-exclusion lock, with poisoning
//! recovered.

use std::fmt;

#[cfg(loom)]
use loom::sync::{Mutex as RawMutex, MutexGuard as RawMutexGuard};
#[cfg(all(feature = "shuttle", not(loom)))]
use shuttle::sync::{Mutex as RawMutex, MutexGuard as RawMutexGuard};
#[cfg(not(any(loom, feature = "shuttle")))]
use std::sync::{Mutex as RawMutex, MutexGuard as RawMutexGuard};

/// Mutual-exclusion lock from the active backend (std / loom / shuttle).
///
/// `lock` returns the guard directly: a poisoned lock (a thread panicked
/// while holding it) is recovered rather than propagated, because every
/// critical section in this crate restores its invariants before any
/// operation that could panic. Any thread may call it; it blocks (std) or
/// yields to the model's scheduler (loom/shuttle).
pub struct Mutex<T> {
    pub(super) inner: RawMutex<T>,
}

/// Guard returned by [`Mutex::lock`].
pub type MutexGuard<'a, T> = RawMutexGuard<'a, T>;

impl<T> Mutex<T> {
    /// Creates an unlocked mutex holding `value`.
    pub fn new(value: T) -> Self {
        Self {
            inner: RawMutex::new(value),
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
