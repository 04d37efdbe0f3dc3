//! [`SetOnce`]: a cell written at most once, then read without a lock.

use std::fmt;

#[cfg(any(loom, feature = "shuttle"))]
use super::{AtomicBool, Mutex, Ordering};

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
    published: AtomicBool,
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
                published: AtomicBool::new(false),
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
