//! Watchdogs of a simulation run: a hang is a failure with a name.
//!
//! - **Virtual time stuck** (in the event loop): more than
//!   [`Watchdog::same_time_events`] events in a row at one virtual
//!   millisecond is a livelock (something reschedules itself at "now"
//!   forever); the run stops with a violation naming the component of the
//!   last events.
//! - **No progress** (in the event loop): more than
//!   [`Watchdog::no_progress_events`] events in a row in which no
//!   application receives a message and none is acknowledged, while some
//!   published message is not acknowledged, is a livelock whose
//!   virtual time still advances (e.g. a connection closed and the same
//!   window redelivered every few milliseconds); the run stops with a
//!   violation naming the component of the last events, the virtual time
//!   since the last progress and the reconnects in it.
//! - **Wall-clock bound** (in the event loop): a run past
//!   [`Watchdog::wall_limit`] stops with a violation.
//! - **Hang inside one event** (a watchdog thread): a component that spins
//!   inside a single call (e.g. a replay loop re-issuing a failing read) never
//!   returns to the event loop, so neither check above runs. With
//!   [`Watchdog::exit_on_hang`] set, a thread watching the loop's
//!   [`Heartbeat`] cancels the run when no event finished for that long: it
//!   records the livelock report (component, virtual time, last events) and
//!   calls the interrupt the run registered ([`Heartbeat::set_interrupt`]:
//!   the simulator closes the pending-ack handles, which interrupts a
//!   running replay attempt). The event loop sees the report after the
//!   event returns and ends the run with it as a violation, so the run is a
//!   named failure of that run only (a swarm goes on with the next seed).
//!   Only if the run still has not stopped [`HANG_GRACE`] later (a component
//!   that ignores the interrupt) does the thread print the report and exit
//!   the process with status 1.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Watchdog bounds of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watchdog {
    /// Events in a row at the same virtual millisecond before the run is
    /// stopped as a livelock. Default 2,000,000 (a busy default run handles
    /// well under 100,000 events in one millisecond).
    pub same_time_events: u64,
    /// Events in a row in which no application receives a message and
    /// none is acknowledged, while some published message is not
    /// acknowledged, before the run is stopped as a livelock. Default
    /// 300,000 (a run that makes progress delivers a message every few
    /// events; a wait for a delayed message, an outage or a replay runs a
    /// few events per 100 virtual ms).
    pub no_progress_events: u64,
    /// Wall-clock bound of the whole run (default none).
    pub wall_limit: Option<Duration>,
    /// If set, a run in which no event finishes for this long is cancelled
    /// and ends with a livelock violation; if it does not stop within
    /// [`HANG_GRACE`] after that, the report is printed and the process
    /// exits with status 1 (default none: no watchdog thread).
    pub exit_on_hang: Option<Duration>,
}

impl Default for Watchdog {
    fn default() -> Self {
        Self {
            same_time_events: 2_000_000,
            no_progress_events: 300_000,
            wall_limit: None,
            exit_on_hang: None,
        }
    }
}

/// The in-loop watchdogs both simulator engines apply after each event:
/// events in a row at one virtual millisecond, and the wall-clock bound.
/// Each check returns the livelock report when its bound is passed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LoopWatch {
    bounds: Watchdog,
    /// (virtual ms, events in a row at it).
    same_time: (u64, u64),
}

impl LoopWatch {
    /// Watching with `bounds`, the first event at `now`.
    pub(crate) fn new(bounds: Watchdog, now: u64) -> Self {
        Self {
            bounds,
            same_time: (now, 0),
        }
    }

    /// One more event at virtual `now`: a report once more than
    /// [`Watchdog::same_time_events`] ran at the same millisecond.
    pub(crate) fn same_time(&mut self, now: u64, heartbeat: &Heartbeat) -> Option<String> {
        if self.same_time.0 != now {
            self.same_time = (now, 1);
            return None;
        }
        self.same_time.1 += 1;
        (self.same_time.1 > self.bounds.same_time_events).then(|| {
            let (component, recent) = heartbeat.describe();
            format!(
                "livelock at t={now}ms in {component}: virtual time did not advance for {} events; last events: {recent}",
                self.same_time.1
            )
        })
    }

    /// A report once the run has taken longer than
    /// [`Watchdog::wall_limit`] since `started`.
    pub(crate) fn wall_limit(
        &self,
        started: std::time::Instant,
        now: u64,
        heartbeat: &Heartbeat,
    ) -> Option<String> {
        let limit = self.bounds.wall_limit?;
        (started.elapsed() > limit).then(|| {
            let (component, recent) = heartbeat.describe();
            format!(
                "wall-clock limit of {:.1}s exceeded at t={now}ms in {component}; last events: {recent}",
                limit.as_secs_f64()
            )
        })
    }
}

/// Number of recent events kept for a livelock report.
const RECENT: usize = 12;

/// How long a cancelled run may take to stop before the hang watchdog
/// exits the process (capped at the hang bound itself).
pub const HANG_GRACE: Duration = Duration::from_secs(5);

/// The interrupt a run registers for the hang watchdog.
type Interrupt = Box<dyn Fn() + Send + Sync>;

/// What the event loop is doing, shared with the hang watchdog thread.
#[derive(Default)]
pub struct Heartbeat {
    events_done: AtomicU64,
    now_ms: AtomicU64,
    stop: AtomicBool,
    state: Mutex<HeartbeatState>,
    /// The livelock report, once the hang watchdog cancelled the run.
    hang: Mutex<Option<String>>,
    interrupt: Mutex<Option<Interrupt>>,
}

impl std::fmt::Debug for Heartbeat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Heartbeat")
            .field("events_done", &self.events_done)
            .field("now_ms", &self.now_ms)
            .field("hang", &self.hang_report())
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct HeartbeatState {
    /// Component currently running.
    component: &'static str,
    /// (virtual ms, event label, subscription) of the last events, oldest first.
    recent: std::collections::VecDeque<(u64, &'static str, Option<usize>)>,
}

impl Heartbeat {
    /// An event `label` of `component` starts at virtual `now_ms`.
    pub fn begin(
        &self,
        now_ms: u64,
        component: &'static str,
        label: &'static str,
        sub: Option<usize>,
    ) {
        self.now_ms.store(now_ms, Ordering::Relaxed);
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.component = component;
        if s.recent.len() == RECENT {
            s.recent.pop_front();
        }
        s.recent.push_back((now_ms, label, sub));
    }

    /// The component running changes inside an event (e.g. a restart starts
    /// the pending-ack replay).
    pub fn enter(&self, component: &'static str) {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .component = component;
    }

    /// The current event finished.
    pub fn end(&self) {
        self.events_done.fetch_add(1, Ordering::Relaxed);
    }

    /// The component running and the recent events, for a report.
    pub fn describe(&self) -> (&'static str, String) {
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let recent = s
            .recent
            .iter()
            .map(|(t, l, sub)| match sub {
                Some(s) => format!("t={t}ms {l}(sub-{s})"),
                None => format!("t={t}ms {l}"),
            })
            .collect::<Vec<_>>()
            .join("; ");
        (s.component, recent)
    }

    fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Registers what the hang watchdog calls to unstick a component
    /// spinning inside one event (replaces the previous one). It runs on the
    /// watchdog thread, so it must only use thread-safe entry points (e.g.
    /// `PendingAckHandle::close`).
    pub fn set_interrupt(&self, interrupt: Box<dyn Fn() + Send + Sync>) {
        *self.interrupt.lock().unwrap_or_else(|e| e.into_inner()) = Some(interrupt);
    }

    /// The livelock report if the hang watchdog cancelled the run.
    pub fn hang_report(&self) -> Option<String> {
        self.hang.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Records `report` and calls the registered interrupt.
    fn cancel(&self, report: String) {
        *self.hang.lock().unwrap_or_else(|e| e.into_inner()) = Some(report);
        if let Some(interrupt) = &*self.interrupt.lock().unwrap_or_else(|e| e.into_inner()) {
            interrupt();
        }
    }
}

/// The hang watchdog thread of one run; stops when dropped.
pub struct HangGuard {
    heartbeat: Arc<Heartbeat>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HangGuard {
    /// Starts watching `heartbeat` if `exit_on_hang` is set: when no event
    /// finishes for that long, cancels the run ([`Heartbeat::hang_report`]
    /// then holds the livelock report, the registered interrupt has run);
    /// if the run has not stopped [`HANG_GRACE`] later, prints `header` and
    /// the report on stdout and stderr and exits the process with status 1.
    pub fn start(
        heartbeat: Arc<Heartbeat>,
        exit_on_hang: Option<Duration>,
        header: String,
    ) -> Self {
        let thread = exit_on_hang.map(|limit| {
            let hb = Arc::clone(&heartbeat);
            std::thread::spawn(move || {
                let tick = Duration::from_millis(50).min(limit);
                let mut last = hb.events_done.load(Ordering::Relaxed);
                let mut since = std::time::Instant::now();
                let mut cancelled: Option<(std::time::Instant, u64, String)> = None;
                while !hb.stop.load(Ordering::Relaxed) {
                    // Parked rather than asleep: dropping the guard unparks
                    // it, so a finished run does not wait out the tick
                    // (a swarm runs thousands of short runs).
                    std::thread::park_timeout(tick);
                    if hb.stop.load(Ordering::Relaxed) {
                        break;
                    }
                    if let Some((at, now, report)) = &cancelled {
                        if at.elapsed() >= HANG_GRACE.min(limit) {
                            let msg = format!(
                                "{header}\nresult: FAILED (1 violations); first: t={now}ms: {report} (the run did not stop within {:.1}s of being interrupted)",
                                at.elapsed().as_secs_f64()
                            );
                            println!("{msg}");
                            eprintln!("{msg}");
                            std::process::exit(1);
                        }
                        continue;
                    }
                    let done = hb.events_done.load(Ordering::Relaxed);
                    if done != last {
                        last = done;
                        since = std::time::Instant::now();
                        continue;
                    }
                    if since.elapsed() >= limit {
                        let (component, recent) = hb.describe();
                        let now = hb.now_ms.load(Ordering::Relaxed);
                        let report = format!(
                            "livelock at t={now}ms in {component}: no event finished for {:.1}s of wall time (virtual time stopped); last events: {recent}",
                            since.elapsed().as_secs_f64()
                        );
                        hb.cancel(report.clone());
                        cancelled = Some((std::time::Instant::now(), now, report));
                    }
                }
            })
        });
        Self { heartbeat, thread }
    }
}

impl Drop for HangGuard {
    fn drop(&mut self) {
        self.heartbeat.stop();
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_event_finishing_cancels_the_run_with_a_named_report_and_interrupts_it() {
        let hb = Arc::new(Heartbeat::default());
        let interrupted = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&interrupted);
        hb.set_interrupt(Box::new(move || flag.store(true, Ordering::SeqCst)));
        hb.begin(42, "pending_ack replay", "Restart", None);
        let guard = HangGuard::start(
            Arc::clone(&hb),
            Some(Duration::from_millis(100)),
            String::new(),
        );
        let started = std::time::Instant::now();
        while hb.hang_report().is_none() && started.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let report = hb.hang_report().expect("the hang watchdog never fired");
        assert!(
            report.contains("livelock at t=42ms in pending_ack replay"),
            "{report}"
        );
        assert!(interrupted.load(Ordering::SeqCst));
        // The run stops within the grace: the guard is dropped, no exit.
        drop(guard);
    }

    #[test]
    fn events_finishing_keep_the_watchdog_quiet() {
        let hb = Arc::new(Heartbeat::default());
        let guard = HangGuard::start(Arc::clone(&hb), Some(Duration::from_secs(2)), String::new());
        for i in 0..40 {
            hb.begin(i, "producer", "Publish", None);
            std::thread::sleep(Duration::from_millis(10));
            hb.end();
        }
        assert_eq!(hb.hang_report(), None);
        drop(guard);
    }

    #[test]
    fn loop_watch_names_a_run_stuck_at_one_millisecond_and_resets_when_time_moves() {
        let bounds = Watchdog {
            same_time_events: 3,
            ..Watchdog::default()
        };
        let hb = Heartbeat::default();
        let mut w = LoopWatch::new(bounds, 0);
        for _ in 0..3 {
            assert_eq!(w.same_time(5, &hb), None);
        }
        let report = w
            .same_time(5, &hb)
            .expect("a fourth event at t=5 passes the bound");
        assert!(
            report.contains("t=5ms") && report.contains("did not advance for 4 events"),
            "{report}"
        );
        // Time moved: the count starts again.
        assert_eq!(w.same_time(6, &hb), None);
        assert_eq!(w.same_time(6, &hb), None);
    }

    #[test]
    fn loop_watch_reports_the_wall_clock_bound_only_once_passed() {
        let hb = Heartbeat::default();
        let none = LoopWatch::new(Watchdog::default(), 0);
        let long_ago = std::time::Instant::now() - Duration::from_secs(3);
        assert_eq!(none.wall_limit(long_ago, 7, &hb), None, "no bound set");
        let bounded = LoopWatch::new(
            Watchdog {
                wall_limit: Some(Duration::from_secs(1)),
                ..Watchdog::default()
            },
            0,
        );
        assert_eq!(bounded.wall_limit(std::time::Instant::now(), 7, &hb), None);
        let report = bounded
            .wall_limit(long_ago, 7, &hb)
            .expect("past the bound");
        assert!(
            report.contains("wall-clock limit of 1.0s exceeded at t=7ms"),
            "{report}"
        );
    }
}
