//! Where a replay's issued reads run: [`InlineReads`] and [`ReaderThread`],
//! the two [`ReadDispatcher`]s the crate ships. (The job and the trait live
//! in `replay`, which owns the attempt they complete; this file only
//! depends on them, never the other way round.)
//!
//! Pulsar's `asyncReadEntries` delivers a successful read on a managed-ledger
//! thread and a failure on whatever thread saw it, possibly the replay
//! thread itself, inside the call. [`ReadDispatcher`] models exactly that: the
//! replay's `fill_queue` hands a [`ReadJob`] to a dispatcher, which either
//! runs it inline (the completion or failure re-enters the replay on the
//! replay thread: [`InlineReads`]) or on another thread ([`ReaderThread`]).
//! Tests may supply their own dispatcher and finish a job with
//! [`ReadJob::complete`] / [`ReadJob::fail`], which call the replay's real
//! `read_complete` / `read_failed`.

use std::collections::VecDeque;
use std::sync::Arc;

use super::replay::{ReadDispatcher, ReadJob};
use crate::ledger::LedgerError;
use crate::sync::{thread, Condvar, Mutex};

/// Runs each read synchronously on the replay thread: completions and
/// failures re-enter the replay inside `fill_queue`.
#[derive(Debug, Default, Clone, Copy)]
pub struct InlineReads;

impl ReadDispatcher for InlineReads {
    fn dispatch(&self, job: ReadJob) {
        job.run();
    }
}

#[derive(Default)]
struct ReaderQueue {
    jobs: VecDeque<ReadJob>,
    shutdown: bool,
}

/// A dedicated reader thread (the managed ledger's executor): reads run and
/// complete there, racing the replay thread. Dropping it stops the thread
/// after the queued jobs ran.
pub struct ReaderThread {
    shared: Arc<(Mutex<ReaderQueue>, Condvar)>,
    thread: Mutex<Option<thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for ReaderThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReaderThread").finish_non_exhaustive()
    }
}

impl ReaderThread {
    /// Spawns the reader thread (through `crate::sync::thread`).
    pub fn start() -> Self {
        let shared: Arc<(Mutex<ReaderQueue>, Condvar)> =
            Arc::new((Mutex::new(ReaderQueue::default()), Condvar::new()));
        let s = Arc::clone(&shared);
        let handle = thread::spawn(move || loop {
            let job = {
                let mut q = s.0.lock();
                loop {
                    if let Some(j) = q.jobs.pop_front() {
                        break j;
                    }
                    if q.shutdown {
                        return;
                    }
                    q = s.1.wait(q);
                }
            };
            job.run();
        });
        Self {
            shared,
            thread: Mutex::new(Some(handle)),
        }
    }

    /// Stops the thread once its queue is empty and joins it. Idempotent.
    pub fn shutdown(&self) {
        self.shared.0.lock().shutdown = true;
        self.shared.1.notify_all();
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }
}

impl ReadDispatcher for ReaderThread {
    fn dispatch(&self, job: ReadJob) {
        let mut q = self.shared.0.lock();
        if q.shutdown {
            drop(q);
            job.fail(LedgerError::StorageUnavailable {
                reason: "reader thread is shut down".into(),
            });
            return;
        }
        q.jobs.push_back(job);
        drop(q);
        self.shared.1.notify_all();
    }
}

impl Drop for ReaderThread {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests {
    use super::*;

    #[test]
    fn shutdown_stops_and_joins_the_reader_thread() {
        let r = ReaderThread::start();
        let shared = Arc::clone(&r.shared);
        r.shutdown();
        // The thread held the other reference; shutdown joined it.
        assert_eq!(Arc::strong_count(&shared), 2, "r and this test");
        assert!(shared.0.lock().shutdown);
        r.shutdown();
        assert!(format!("{r:?}").contains("ReaderThread"));
    }

    #[test]
    fn dropping_the_reader_thread_joins_it() {
        let r = ReaderThread::start();
        let shared = Arc::clone(&r.shared);
        drop(r);
        assert_eq!(Arc::strong_count(&shared), 1);
    }
}
