//! [`Condvar`]: the active backend's condition variable, paired with
//! [`super::Mutex`].

use std::fmt;
use std::time::Duration;

#[cfg(loom)]
use loom::sync::Condvar as RawCondvar;
#[cfg(all(feature = "shuttle", not(loom)))]
use shuttle::sync::Condvar as RawCondvar;
#[cfg(not(any(loom, feature = "shuttle")))]
use std::sync::Condvar as RawCondvar;

use super::MutexGuard;

/// Condition variable from the active backend, paired with [`super::Mutex`].
pub struct Condvar {
    inner: RawCondvar,
}

impl Condvar {
    /// Creates a condition variable with no waiters.
    pub fn new() -> Self {
        Self {
            inner: RawCondvar::new(),
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
