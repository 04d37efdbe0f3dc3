//! [`Published`]: the published-value cell of lock-free lookups.

use std::fmt;

use super::{hook, Arc};

#[cfg(loom)]
use loom::sync::RwLock as RawRwLock;
#[cfg(all(feature = "shuttle", not(loom)))]
use shuttle::sync::RwLock as RawRwLock;

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
    inner: RawRwLock<Arc<T>>,
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
                inner: RawRwLock::new(value),
            }
        }
    }

    /// Returns the current value as an owned `Arc` (one reference-count
    /// increment; prefer [`Published::with`] on hot paths).
    pub fn load(&self) -> Arc<T> {
        #[cfg(not(any(loom, feature = "shuttle")))]
        {
            let value = self.inner.load_full();
            hook::at(hook::Point::AtomicRead);
            value
        }
        #[cfg(any(loom, feature = "shuttle"))]
        {
            let guard = match self.inner.read() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
            let value = Arc::clone(&guard);
            drop(guard);
            hook::at(hook::Point::AtomicRead);
            value
        }
    }

    /// Runs `f` on the current value without taking a lock or touching the
    /// reference count (std build). The borrow must not escape `f`.
    #[inline]
    pub fn with<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        #[cfg(not(any(loom, feature = "shuttle")))]
        {
            let guard = self.inner.load();
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
            hook::at(hook::Point::AtomicWrite);
        }
        #[cfg(any(loom, feature = "shuttle"))]
        {
            let mut guard = match self.inner.write() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
            *guard = value;
            drop(guard);
            hook::at(hook::Point::AtomicWrite);
        }
    }

    /// Read-copy-update: publishes `f(current)`, retrying if another writer
    /// published in between. Returns the value that was replaced.
    pub fn rcu(&self, mut f: impl FnMut(&T) -> T) -> Arc<T> {
        #[cfg(not(any(loom, feature = "shuttle")))]
        {
            let old = self.inner.rcu(|cur| Arc::new(f(cur)));
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
            let old = std::mem::replace(&mut *guard, next);
            drop(guard);
            hook::at(hook::Point::AtomicWrite);
            old
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
