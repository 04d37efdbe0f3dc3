//! Replay executors: a small pool of single-threaded executors shared by
//! many pending-ack handles, each handle pinned to one executor by a hash of
//! its name (Pulsar's transaction executor provider, picked by identity
//! hash). A replay that held its executor would starve every co-hashed
//! handle; the replay therefore releases its executor between attempts (the
//! retry waits on a timer, not on the executor).
//!
//! Two modes: [`ExecutorMode::Threads`] runs one thread per executor
//! (spawned through `crate::sync::thread`, so it runs under loom/shuttle
//! too); [`ExecutorMode::Manual`] runs nothing by itself, the owner drives
//! [`ReplayExecutorPool::run_pending`] (deterministic virtual-time tests).

use std::collections::VecDeque;
use std::sync::Arc;

use super::error::PendingAckError;
use crate::sync::{thread, Condvar, Mutex};

/// A unit of work on a replay executor.
pub type ExecutorTask = Box<dyn FnOnce() + Send>;

/// How the pool runs its executors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecutorMode {
    /// One thread per executor.
    Threads,
    /// No threads; [`ReplayExecutorPool::run_pending`] runs queued tasks on
    /// the caller's thread.
    Manual,
}

#[derive(Default)]
struct Queue {
    tasks: VecDeque<ExecutorTask>,
    shutdown: bool,
    running: bool,
}

/// One single-threaded executor: tasks run one at a time, in submission
/// order. Cheap to share (`Arc`).
pub struct ReplayExecutor {
    index: usize,
    queue: Mutex<Queue>,
    ready: Condvar,
}

impl std::fmt::Debug for ReplayExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplayExecutor")
            .field("index", &self.index)
            .field("queued", &self.queue.lock().tasks.len())
            .finish()
    }
}

impl ReplayExecutor {
    /// Index of this executor in its pool.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Queues `task`. Returns `false` (and drops the task) after shutdown.
    /// Any thread may call it.
    pub fn submit(&self, task: ExecutorTask) -> bool {
        let mut q = self.queue.lock();
        if q.shutdown {
            return false;
        }
        q.tasks.push_back(task);
        drop(q);
        self.ready.notify_all();
        true
    }

    /// Runs queued tasks on the calling thread until the queue is empty;
    /// returns how many ran. Used in [`ExecutorMode::Manual`]; in threads
    /// mode it is a no-op returning 0 (the executor's thread owns the queue).
    fn run_pending(&self) -> usize {
        let mut n = 0;
        loop {
            let task = {
                let mut q = self.queue.lock();
                if q.running {
                    return n;
                }
                match q.tasks.pop_front() {
                    Some(t) => t,
                    None => return n,
                }
            };
            task();
            n += 1;
        }
    }

    fn thread_loop(&self) {
        loop {
            let task = {
                let mut q = self.queue.lock();
                loop {
                    if let Some(t) = q.tasks.pop_front() {
                        break t;
                    }
                    if q.shutdown {
                        return;
                    }
                    q = self.ready.wait(q);
                }
            };
            task();
        }
    }

    /// Whether no task is queued (a task may still be running).
    pub fn is_idle(&self) -> bool {
        self.queue.lock().tasks.is_empty()
    }
}

/// A fixed pool of [`ReplayExecutor`]s.
pub struct ReplayExecutorPool {
    mode: ExecutorMode,
    executors: Vec<Arc<ReplayExecutor>>,
    threads: Mutex<Vec<thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for ReplayExecutorPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplayExecutorPool")
            .field("mode", &self.mode)
            .field("executors", &self.executors.len())
            .finish()
    }
}

/// FNV-1a: a stable hash so a handle name always maps to the same executor.
fn fnv1a(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

impl ReplayExecutorPool {
    /// Creates `size` executors (and, in threads mode, their threads).
    ///
    /// # Errors
    /// [`PendingAckError::InvalidConfig`] for `size == 0`.
    pub fn new(size: usize, mode: ExecutorMode) -> Result<Arc<Self>, PendingAckError> {
        if size == 0 {
            return Err(PendingAckError::InvalidConfig(
                "a replay executor pool needs at least one executor".into(),
            ));
        }
        let executors: Vec<Arc<ReplayExecutor>> = (0..size)
            .map(|index| {
                Arc::new(ReplayExecutor {
                    index,
                    queue: Mutex::new(Queue {
                        running: mode == ExecutorMode::Threads,
                        ..Queue::default()
                    }),
                    ready: Condvar::new(),
                })
            })
            .collect();
        let mut threads = Vec::new();
        if mode == ExecutorMode::Threads {
            for e in &executors {
                let e = Arc::clone(e);
                threads.push(thread::spawn(move || e.thread_loop()));
            }
        }
        Ok(Arc::new(Self {
            mode,
            executors,
            threads: Mutex::new(threads),
        }))
    }

    /// The executor a handle named `name` is pinned to (stable hash mod size).
    pub fn executor_for(&self, name: &str) -> Arc<ReplayExecutor> {
        let i = (fnv1a(name) % self.executors.len() as u64) as usize;
        Arc::clone(&self.executors[i])
    }

    /// The executor at `index` (mod size).
    pub fn executor(&self, index: usize) -> Arc<ReplayExecutor> {
        Arc::clone(&self.executors[index % self.executors.len()])
    }

    /// Manual mode: runs every queued task of every executor on the calling
    /// thread until all queues are empty; returns how many ran. Threads mode:
    /// returns 0.
    pub fn run_pending(&self) -> usize {
        let mut total = 0;
        loop {
            let n: usize = self.executors.iter().map(|e| e.run_pending()).sum();
            if n == 0 {
                return total;
            }
            total += n;
        }
    }

    /// Stops accepting tasks, lets each executor finish its queue and joins
    /// the threads. Idempotent. Must not be called from an executor thread.
    pub fn shutdown(&self) {
        for e in &self.executors {
            e.queue.lock().shutdown = true;
            e.ready.notify_all();
        }
        let threads = std::mem::take(&mut *self.threads.lock());
        for t in threads {
            let _ = t.join();
        }
    }
}

impl Drop for ReplayExecutorPool {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn executor_index_wraps_around_the_pool() {
        let pool = ReplayExecutorPool::new(3, ExecutorMode::Manual).unwrap();
        for i in 0..10 {
            assert_eq!(pool.executor(i).index(), i % 3, "executor({i})");
        }
        let shown = format!("{pool:?}");
        assert!(
            shown.contains("ReplayExecutorPool") && shown.contains("executors: 3"),
            "{shown}"
        );
    }

    #[test]
    fn a_queued_task_makes_the_executor_busy_until_it_ran() {
        let pool = ReplayExecutorPool::new(1, ExecutorMode::Manual).unwrap();
        let e = pool.executor(0);
        assert!(e.is_idle());
        let ran = Arc::new(AtomicUsize::new(0));
        let r = Arc::clone(&ran);
        assert!(e.submit(Box::new(move || {
            r.fetch_add(1, Ordering::SeqCst);
        })));
        assert!(!e.is_idle());
        let shown = format!("{e:?}");
        assert!(
            shown.contains("index: 0") && shown.contains("queued: 1"),
            "{shown}"
        );
        assert_eq!(pool.run_pending(), 1);
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        assert!(e.is_idle());
    }

    #[test]
    fn dropping_the_pool_stops_and_joins_its_threads() {
        let pool = ReplayExecutorPool::new(2, ExecutorMode::Threads).unwrap();
        let e = pool.executor(1);
        drop(pool);
        // Each thread held a reference to its executor; drop joined them.
        assert_eq!(Arc::strong_count(&e), 1);
        assert!(
            !e.submit(Box::new(|| ())),
            "a stopped executor takes no task"
        );
    }
}
