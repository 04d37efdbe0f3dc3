//! The asynchronous read pipeline around the (synchronous) substrate cursor.
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

use super::replay::ReplayAttempt;
use crate::ledger::{Entry, LedgerError};
use crate::sync::{thread, Condvar, Mutex};

/// One issued read of `max_entries` entries for one replay attempt. Exactly
/// one of [`ReadJob::run`], [`ReadJob::complete`], [`ReadJob::fail`] must be
/// called (each consumes the job); dropping a job unfinished leaves the
/// attempt waiting, as a lost callback does in Pulsar (the replay loop then
/// ends only when the cursor is closed or the handle is closed).
#[must_use = "a read job must be finished with run, complete or fail"]
pub struct ReadJob {
    pub(crate) attempt: Arc<ReplayAttempt>,
    pub(crate) max_entries: usize,
}

impl std::fmt::Debug for ReadJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadJob")
            .field("max_entries", &self.max_entries)
            .finish_non_exhaustive()
    }
}

impl ReadJob {
    /// Entries requested.
    pub fn max_entries(&self) -> usize {
        self.max_entries
    }

    /// Performs the read on the calling thread
    /// ([`crate::ledger::ManagedCursor::read_entries`]) and delivers the
    /// result to the replay.
    pub fn run(self) {
        match self.attempt.cursor().read_entries(self.max_entries) {
            Ok(entries) => self.attempt.read_complete(entries),
            Err(e) => self.attempt.read_failed(e),
        }
    }

    /// Delivers `entries` as this read's result (`readEntriesComplete`).
    pub fn complete(self, entries: Vec<Entry>) {
        self.attempt.read_complete(entries);
    }

    /// Delivers `error` as this read's failure (`readEntriesFailed`).
    pub fn fail(self, error: LedgerError) {
        self.attempt.read_failed(error);
    }
}

/// Where issued reads run. Called by the replay thread from `fill_queue`
/// with no replay lock held; may finish the job before returning.
pub trait ReadDispatcher: Send + Sync + std::fmt::Debug {
    /// Takes responsibility for finishing `job`.
    fn dispatch(&self, job: ReadJob);
}

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
