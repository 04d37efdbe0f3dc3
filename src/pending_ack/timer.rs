//! Injectable timer and clock: the handle's retry timer and the buffered
//! writer's flush timer run on a [`Timer`]. [`VirtualTimer`] is driven by the
//! caller (tests, the simulator, models); [`SystemTimer`] (std builds) runs
//! one background thread.

use std::collections::BTreeMap;

use crate::sync::Mutex;
#[cfg(not(any(loom, feature = "shuttle")))]
use crate::sync::{AtomicBool, AtomicU64, Ordering};

/// A scheduled one-shot task.
pub type TimerTask = Box<dyn FnOnce() + Send>;

/// Identifies a scheduled task for [`Timer::cancel`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TimerId(pub u64);

/// A one-shot timer with a millisecond clock.
///
/// Concurrency: every method may be called from any thread, including from
/// inside a running task. Tasks run without any timer lock held.
pub trait Timer: Send + Sync + std::fmt::Debug {
    /// Current time in ms (virtual or since the timer started).
    fn now_ms(&self) -> u64;
    /// Runs `task` once, `delay_ms` ms from now.
    fn schedule(&self, delay_ms: u64, task: TimerTask) -> TimerId;
    /// Cancels a task that has not started; returns whether it was pending.
    fn cancel(&self, id: TimerId) -> bool;
}

#[derive(Default)]
struct VirtualState {
    now_ms: u64,
    next_id: u64,
    tasks: BTreeMap<(u64, u64), TimerTask>,
}

/// A timer on virtual time: nothing fires until the owner calls
/// [`VirtualTimer::advance`], [`VirtualTimer::advance_to`] or
/// [`VirtualTimer::fire_next`]. Tasks due at the same time run in scheduling
/// order. Used by the tests, the simulator and the shuttle models.
#[derive(Default)]
pub struct VirtualTimer {
    state: Mutex<VirtualState>,
}

impl std::fmt::Debug for VirtualTimer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.state.lock();
        f.debug_struct("VirtualTimer")
            .field("now_ms", &s.now_ms)
            .field("pending", &s.tasks.len())
            .finish()
    }
}

impl VirtualTimer {
    /// A timer at virtual time 0 with nothing scheduled.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of tasks scheduled and not yet run or cancelled.
    pub fn pending(&self) -> usize {
        self.state.lock().tasks.len()
    }

    /// Due time (ms) of the earliest pending task.
    pub fn next_due_ms(&self) -> Option<u64> {
        self.state.lock().tasks.keys().next().map(|(due, _)| *due)
    }

    /// Moves the clock to the earliest pending task's due time (never
    /// backwards) and runs that one task. Returns `false` if none is pending.
    pub fn fire_next(&self) -> bool {
        let task = {
            let mut s = self.state.lock();
            let Some((&(due, id), _)) = s.tasks.iter().next() else {
                return false;
            };
            s.now_ms = s.now_ms.max(due);
            s.tasks.remove(&(due, id))
        };
        if let Some(task) = task {
            task();
        }
        true
    }

    /// Runs every task due at or before `t_ms` in due order (including tasks
    /// they schedule that fall due by then), then sets the clock to `t_ms`.
    pub fn advance_to(&self, t_ms: u64) {
        loop {
            let task = {
                let mut s = self.state.lock();
                let Some((&(due, id), _)) = s.tasks.iter().next() else {
                    break;
                };
                if due > t_ms {
                    break;
                }
                s.now_ms = s.now_ms.max(due);
                s.tasks.remove(&(due, id))
            };
            if let Some(task) = task {
                task();
            }
        }
        let mut s = self.state.lock();
        s.now_ms = s.now_ms.max(t_ms);
    }

    /// `advance_to(now + ms)`.
    pub fn advance(&self, ms: u64) {
        let t = self.now_ms() + ms;
        self.advance_to(t);
    }
}

impl Timer for VirtualTimer {
    fn now_ms(&self) -> u64 {
        self.state.lock().now_ms
    }

    fn schedule(&self, delay_ms: u64, task: TimerTask) -> TimerId {
        let mut s = self.state.lock();
        let id = s.next_id;
        s.next_id += 1;
        let due = s.now_ms.saturating_add(delay_ms);
        s.tasks.insert((due, id), task);
        TimerId(id)
    }

    fn cancel(&self, id: TimerId) -> bool {
        let mut s = self.state.lock();
        let key = s.tasks.keys().find(|(_, i)| *i == id.0).copied();
        key.and_then(|k| s.tasks.remove(&k)).is_some()
    }
}

/// A wall-clock timer with one background thread (std builds only; the
/// models use [`VirtualTimer`], since loom/shuttle do not model time).
/// Dropping it stops the thread; tasks still pending are dropped unrun.
#[cfg(not(any(loom, feature = "shuttle")))]
pub struct SystemTimer {
    shared: std::sync::Arc<SystemShared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[cfg(not(any(loom, feature = "shuttle")))]
struct SystemShared {
    start: std::time::Instant,
    state: Mutex<VirtualState>,
    wake: crate::sync::Condvar,
    stop: AtomicBool,
    ids: AtomicU64,
}

#[cfg(not(any(loom, feature = "shuttle")))]
impl std::fmt::Debug for SystemTimer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SystemTimer")
            .field("pending", &self.shared.state.lock().tasks.len())
            .finish()
    }
}

#[cfg(not(any(loom, feature = "shuttle")))]
impl SystemTimer {
    /// Starts the timer thread (named `pending-ack-timer`).
    ///
    /// # Errors
    /// [`std::io::Error`] if the thread cannot be spawned.
    pub fn start() -> std::io::Result<Self> {
        let shared = std::sync::Arc::new(SystemShared {
            start: std::time::Instant::now(),
            state: Mutex::new(VirtualState::default()),
            wake: crate::sync::Condvar::new(),
            stop: AtomicBool::new(false),
            ids: AtomicU64::new(0),
        });
        let s = std::sync::Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("pending-ack-timer".into())
            .spawn(move || s.run())?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }
}

#[cfg(not(any(loom, feature = "shuttle")))]
impl SystemShared {
    fn now(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    fn run(&self) {
        let mut guard = self.state.lock();
        while !self.stop.load(Ordering::Acquire) {
            let now = self.now();
            match guard.tasks.keys().next().copied() {
                Some((due, id)) if due <= now => {
                    let task = guard.tasks.remove(&(due, id));
                    drop(guard);
                    if let Some(task) = task {
                        task();
                    }
                    guard = self.state.lock();
                }
                Some((due, _)) => {
                    let wait = std::time::Duration::from_millis(due - now);
                    guard = self.wake.wait_timeout(guard, wait).0;
                }
                None => {
                    guard = self
                        .wake
                        .wait_timeout(guard, std::time::Duration::from_millis(100))
                        .0;
                }
            }
        }
    }
}

#[cfg(not(any(loom, feature = "shuttle")))]
impl Timer for SystemTimer {
    fn now_ms(&self) -> u64 {
        self.shared.now()
    }

    fn schedule(&self, delay_ms: u64, task: TimerTask) -> TimerId {
        let id = self.shared.ids.fetch_add(1, Ordering::Relaxed);
        let due = self.shared.now().saturating_add(delay_ms);
        self.shared.state.lock().tasks.insert((due, id), task);
        self.shared.wake.notify_all();
        TimerId(id)
    }

    fn cancel(&self, id: TimerId) -> bool {
        let mut s = self.shared.state.lock();
        let key = s.tasks.keys().find(|(_, i)| *i == id.0).copied();
        key.and_then(|k| s.tasks.remove(&k)).is_some()
    }
}

#[cfg(not(any(loom, feature = "shuttle")))]
impl Drop for SystemTimer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        {
            let _g = self.shared.state.lock();
            self.shared.wake.notify_all();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn virtual_timer_orders_and_cancels() {
        let t = Arc::new(VirtualTimer::new());
        let log = Arc::new(Mutex::new(Vec::new()));
        for (d, tag) in [(30, "c"), (10, "a"), (20, "b")] {
            let log = Arc::clone(&log);
            t.schedule(d, Box::new(move || log.lock().push(tag)));
        }
        let id = t.schedule(15, Box::new(|| panic!("cancelled task ran")));
        assert!(t.cancel(id));
        assert!(!t.cancel(id));
        t.advance(20);
        assert_eq!(*log.lock(), vec!["a", "b"]);
        assert!(t.fire_next());
        assert_eq!(t.now_ms(), 30);
        assert!(!t.fire_next());
    }

    #[test]
    fn virtual_timer_reports_the_earliest_due_time() {
        let t = VirtualTimer::new();
        assert_eq!(t.next_due_ms(), None);
        t.advance(7);
        t.schedule(50, Box::new(|| ()));
        t.schedule(30, Box::new(|| ()));
        assert_eq!(t.next_due_ms(), Some(37));
        assert!(t.fire_next());
        assert_eq!(t.next_due_ms(), Some(57));
        assert!(t.fire_next());
        assert_eq!(t.next_due_ms(), None);
        let shown = format!("{t:?}");
        assert!(
            shown.contains("VirtualTimer") && shown.contains("now_ms: 57"),
            "{shown}"
        );
    }

    #[test]
    fn system_timer_never_runs_a_task_before_its_due_time() {
        let t = SystemTimer::start().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let mut due = Vec::new();
        for delay in [40, 80, 120] {
            let scheduled_at = t.now_ms();
            due.push(scheduled_at + delay);
            let shared = std::sync::Arc::clone(&t.shared);
            let tx = tx.clone();
            t.schedule(delay, Box::new(move || tx.send(shared.now()).unwrap()));
        }
        for d in due {
            let ran_at = rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap();
            assert!(ran_at >= d, "ran at {ran_at} ms, due at {d} ms");
        }
    }

    #[test]
    fn system_timer_waits_only_until_the_due_time() {
        // The clock counts from the timer's start: a timer running for a
        // while must still wait `delay`, not `delay` plus its age.
        let t = SystemTimer::start().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1_500));
        assert!(t.now_ms() >= 1_500, "now_ms {}", t.now_ms());
        let (tx, rx) = std::sync::mpsc::channel();
        let start = std::time::Instant::now();
        t.schedule(10, Box::new(move || tx.send(()).unwrap()));
        rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap();
        let waited = start.elapsed();
        assert!(
            waited < std::time::Duration::from_millis(1_200),
            "a 10 ms task ran after {waited:?}"
        );
    }

    #[test]
    fn system_timer_cancel_reports_only_pending_tasks() {
        let t = SystemTimer::start().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let fired = t.schedule(1, Box::new(move || tx.send(()).unwrap()));
        rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap();
        assert!(!t.cancel(fired), "a task that already ran is not pending");
        assert!(!t.cancel(TimerId(u64::MAX)), "an unknown id is not pending");
        let shown = format!("{t:?}");
        assert!(
            shown.contains("SystemTimer") && shown.contains("pending: 0"),
            "{shown}"
        );
    }

    #[test]
    fn dropping_a_system_timer_stops_its_thread() {
        let t = SystemTimer::start().unwrap();
        let shared = std::sync::Arc::clone(&t.shared);
        t.schedule(60_000, Box::new(|| ()));
        // Dropped on a helper thread: a timer thread that never stops makes
        // this test fail in 5 s instead of hanging in the join.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            drop(t);
            let _ = tx.send(());
        });
        rx.recv_timeout(std::time::Duration::from_secs(5))
            .expect("dropping the timer did not return within 5 s: its thread did not stop");
        // The thread held the other reference; drop joined it.
        assert_eq!(std::sync::Arc::strong_count(&shared), 1);
    }

    #[test]
    fn system_timer_fires_and_cancels() {
        let t = SystemTimer::start().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let id = t.schedule(5_000, Box::new(|| panic!("cancelled")));
        t.schedule(1, Box::new(move || tx.send(()).unwrap()));
        rx.recv_timeout(std::time::Duration::from_secs(5)).unwrap();
        assert!(t.cancel(id));
    }
}
