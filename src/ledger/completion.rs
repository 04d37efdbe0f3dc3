//! [`Completion`]: the result of a durable write that completes later, as a
//! runtime-agnostic one-shot (a [`Future`] woken through its
//! [`Waker`](std::task::Waker), a callback, or a blocking wait).
//!
//! The writer side is a [`Completer`]: it is completed exactly once, on the
//! thread that learned the outcome (the store writer thread of
//! [`GroupCommitter`](super::GroupCommitter), after the write's commit).
//! A [`Completer`] dropped without completing (its writer stopped) completes
//! with the error given when the pair was made, so a waiter never hangs.
//!
//! Synchronisation: one [`crate::sync::Mutex`] per pair and a
//! [`crate::sync::Condvar`] for blocking waiters, so the loom and shuttle
//! models (`loom-tests/group_commit.rs`) run this code.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::sync::{Arc, Condvar, Mutex};

/// A completion callback: runs once with the outcome, on the completing
/// thread (the store writer thread for [`GroupCommitter`](super::GroupCommitter)'s
/// writes), so it must not block.
pub type Callback<T, E> = Box<dyn FnOnce(Result<T, E>) + Send>;

enum State<T, E> {
    Pending {
        waker: Option<Waker>,
        callback: Option<Callback<T, E>>,
    },
    Done(Result<T, E>),
    Taken,
}

struct Slot<T, E> {
    state: Mutex<State<T, E>>,
    ready: Condvar,
    /// The error of a completion that cannot complete (its completer was
    /// dropped, or it was waited for on the store writer thread itself).
    abandoned: fn() -> E,
}

/// The outcome of a durable write, delivered later: `Ok` only after the
/// write is durable (its commit, and with
/// [`SyncMode::Immediate`](super::SyncMode::Immediate) its fsync, returned),
/// never before; `Err` with the typed error of that write otherwise.
///
/// Needs no particular runtime. Use it as a [`Future`] (`.await` in any
/// executor: the completing thread wakes the task's [`Waker`]), attach a
/// callback with [`Completion::on_complete`], poll it with
/// [`Completion::try_take`], or block with [`Completion::wait`].
#[must_use = "a Completion does nothing unless awaited, waited on or given a callback; the write goes ahead either way"]
pub struct Completion<T, E> {
    slot: Arc<Slot<T, E>>,
}

/// The writer side of a [`Completion`]: [`Completer::complete`] delivers
/// the outcome once.
pub struct Completer<T, E> {
    slot: Option<Arc<Slot<T, E>>>,
    abandoned: fn() -> E,
}

/// A connected pair: the [`Completion`] for the caller, the [`Completer`]
/// for the writer. A completer dropped without completing completes with
/// `Err(abandoned())` (so does a blocking wait on the store writer thread,
/// see [`Completion::wait`]).
pub fn completion_pair<T, E>(abandoned: fn() -> E) -> (Completion<T, E>, Completer<T, E>) {
    let slot = Arc::new(Slot {
        state: Mutex::new(State::Pending {
            waker: None,
            callback: None,
        }),
        ready: Condvar::new(),
        abandoned,
    });
    (
        Completion {
            slot: Arc::clone(&slot),
        },
        Completer {
            slot: Some(slot),
            abandoned,
        },
    )
}

impl<T, E> Completion<T, E> {
    /// A completion that is already complete (an argument refused before
    /// anything was queued, for example).
    pub fn ready(result: Result<T, E>) -> Self {
        fn never<E>() -> E {
            unreachable!("a ready completion is never abandoned")
        }
        Self {
            slot: Arc::new(Slot {
                state: Mutex::new(State::Done(result)),
                ready: Condvar::new(),
                abandoned: never::<E>,
            }),
        }
    }

    /// Whether the outcome is known (and not taken yet).
    ///
    /// # Blocking
    /// Never blocks (takes the pair's lock for a moment).
    pub fn is_complete(&self) -> bool {
        matches!(*self.slot.state.lock(), State::Done(_))
    }

    /// The outcome if it is known, else `None` (ask again later).
    ///
    /// # Blocking
    /// Never blocks.
    ///
    /// # Panics
    /// Never; after the outcome was taken (by an earlier `try_take` or the
    /// future's `poll`) it returns `None`.
    pub fn try_take(&mut self) -> Option<Result<T, E>> {
        let mut s = self.slot.state.lock();
        match std::mem::replace(&mut *s, State::Taken) {
            State::Done(r) => Some(r),
            other => {
                *s = other;
                None
            }
        }
    }

    /// Runs `callback` with the outcome: at once on this thread if it is
    /// known, else on the completing thread (for the group committer, the
    /// store writer thread, right after the commit), so the callback must
    /// not block.
    ///
    /// # Blocking
    /// Does not block (unless the outcome is known and `callback` blocks).
    pub fn on_complete(self, callback: impl FnOnce(Result<T, E>) + Send + 'static) {
        let mut s = self.slot.state.lock();
        match std::mem::replace(&mut *s, State::Taken) {
            State::Done(r) => {
                drop(s);
                callback(r);
            }
            State::Pending { waker, .. } => {
                *s = State::Pending {
                    waker,
                    callback: Some(Box::new(callback)),
                };
            }
            State::Taken => {}
        }
    }

    /// Blocks the calling thread until the outcome is known.
    ///
    /// # Blocking
    /// Blocks until the write's commit returned (for
    /// [`SyncMode::Immediate`](super::SyncMode::Immediate), its fsync): do
    /// not call it on an async runtime's worker thread; `.await` the
    /// completion instead.
    ///
    /// Called on a group committer's writer thread (inside a completion
    /// callback) with the outcome not known yet, it returns the
    /// completion's "abandoned" error at once (logged): waiting there would
    /// wait for the thread itself.
    pub fn wait(self) -> Result<T, E> {
        let mut s = self.slot.state.lock();
        loop {
            match std::mem::replace(&mut *s, State::Taken) {
                State::Done(r) => return r,
                State::Taken => unreachable!("a Completion's outcome is taken only through self"),
                pending => {
                    *s = pending;
                    if super::committer::on_store_writer_thread() {
                        tracing::error!("a blocking wait for a durable write on the store writer thread; refused (it would never complete)");
                        return Err((self.slot.abandoned)());
                    }
                    s = self.slot.ready.wait(s);
                }
            }
        }
    }

    /// As [`Completion::wait`], for at most `timeout`: `Err(self)` if the
    /// outcome is not known by then (a hang is a failure with a name: tests
    /// use this).
    ///
    /// # Blocking
    /// Blocks for at most `timeout`.
    pub fn wait_timeout(self, timeout: Duration) -> Result<Result<T, E>, Self> {
        let deadline = Instant::now() + timeout;
        let mut s = self.slot.state.lock();
        loop {
            match std::mem::replace(&mut *s, State::Taken) {
                State::Done(r) => return Ok(r),
                State::Taken => unreachable!("a Completion's outcome is taken only through self"),
                pending => {
                    *s = pending;
                    if super::committer::on_store_writer_thread() {
                        tracing::error!("a blocking wait for a durable write on the store writer thread; refused (it would never complete)");
                        return Ok(Err((self.slot.abandoned)()));
                    }
                    let now = Instant::now();
                    if now >= deadline {
                        drop(s);
                        return Err(self);
                    }
                    s = self.slot.ready.wait_timeout(s, deadline - now).0;
                }
            }
        }
    }
}

impl<T, E> Future for Completion<T, E> {
    type Output = Result<T, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut s = self.slot.state.lock();
        match std::mem::replace(&mut *s, State::Taken) {
            State::Done(r) => Poll::Ready(r),
            State::Pending { callback, .. } => {
                *s = State::Pending {
                    waker: Some(cx.waker().clone()),
                    callback,
                };
                Poll::Pending
            }
            State::Taken => panic!("Completion polled after it returned Ready"),
        }
    }
}

impl<T, E> Completer<T, E> {
    /// Delivers `result`: wakes the awaiting task, runs the callback (on
    /// this thread, after the pair's lock is released) or wakes a blocked
    /// [`Completion::wait`]. Call it only once the write is durable (or has
    /// failed).
    pub fn complete(mut self, result: Result<T, E>) {
        if let Some(slot) = self.slot.take() {
            deliver(&slot, result);
        }
    }
}

fn deliver<T, E>(slot: &Slot<T, E>, result: Result<T, E>) {
    let mut s = slot.state.lock();
    match std::mem::replace(&mut *s, State::Taken) {
        State::Pending {
            waker,
            callback: Some(cb),
        } => {
            drop(s);
            if let Some(w) = waker {
                w.wake();
            }
            cb(result);
        }
        State::Pending {
            waker,
            callback: None,
        } => {
            *s = State::Done(result);
            drop(s);
            slot.ready.notify_all();
            if let Some(w) = waker {
                w.wake();
            }
        }
        // Completed twice cannot happen (`complete` consumes the
        // completer); a taken slot had its outcome already.
        done @ (State::Done(_) | State::Taken) => *s = done,
    }
}

impl<T, E> Drop for Completer<T, E> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            deliver(&slot, Err((self.abandoned)()));
        }
    }
}

impl<T, E> fmt::Debug for Completion<T, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Completion")
            .field("complete", &self.is_complete())
            .finish()
    }
}

impl<T, E> fmt::Debug for Completer<T, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Completer").finish_non_exhaustive()
    }
}
