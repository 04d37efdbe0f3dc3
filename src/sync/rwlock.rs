//! [`RwLock`]: the active backend's reader-writer lock, with poisoning
//! recovered.

use std::fmt;

#[cfg(loom)]
use loom::sync::{
    RwLock as RawRwLock, RwLockReadGuard as RawReadGuard, RwLockWriteGuard as RawWriteGuard,
};
#[cfg(all(feature = "shuttle", not(loom)))]
use shuttle::sync::{
    RwLock as RawRwLock, RwLockReadGuard as RawReadGuard, RwLockWriteGuard as RawWriteGuard,
};
#[cfg(not(any(loom, feature = "shuttle")))]
use std::sync::{
    RwLock as RawRwLock, RwLockReadGuard as RawReadGuard, RwLockWriteGuard as RawWriteGuard,
};

/// Reader-writer lock from the active backend (std / loom / shuttle).
///
/// `read`/`write` return guards directly; poisoning is recovered (see
/// [`super::Mutex`]).
pub struct RwLock<T> {
    inner: RawRwLock<T>,
}

/// Shared guard returned by [`RwLock::read`].
type RwLockReadGuard<'a, T> = RawReadGuard<'a, T>;
/// Exclusive guard returned by [`RwLock::write`].
type RwLockWriteGuard<'a, T> = RawWriteGuard<'a, T>;

impl<T> RwLock<T> {
    /// Creates an unlocked reader-writer lock holding `value`.
    pub fn new(value: T) -> Self {
        Self {
            inner: RawRwLock::new(value),
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
