//! A per-test watchdog for tests that drive code on the test thread itself
//! (the manual replay executor, the virtual timer): if the guarded section
//! does not finish within its bound, the whole test process exits with a
//! named "HANG" message instead of running until an outer timeout. A hang
//! is a failure with a name, and under cargo-mutants a mutant that makes
//! the code spin is caught in seconds rather than timing out.
//!
//! Include with `#[path = "common/watchdog.rs"] mod watchdog;`.
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Exit status of a process stopped by the watchdog.
pub const HANG_EXIT_CODE: i32 = 124;

/// Disarms the watchdog when dropped (also when the test panics).
#[must_use = "the watchdog is disarmed when this guard is dropped"]
pub struct Watchdog {
    done: Arc<AtomicBool>,
    thread: std::thread::Thread,
}

/// Arms a watchdog: unless the returned guard is dropped within `limit`,
/// prints `HANG: <what> did not finish within <limit>` and exits the test
/// process with [`HANG_EXIT_CODE`].
pub fn arm(what: &str, limit: Duration) -> Watchdog {
    let done = Arc::new(AtomicBool::new(false));
    let d = Arc::clone(&done);
    let what = what.to_string();
    let handle = std::thread::Builder::new()
        .name("test-watchdog".into())
        .spawn(move || {
            let deadline = Instant::now() + limit;
            while !d.load(Ordering::Acquire) {
                let now = Instant::now();
                if now >= deadline {
                    eprintln!("HANG: {what} did not finish within {limit:?}");
                    std::process::exit(HANG_EXIT_CODE);
                }
                std::thread::park_timeout(deadline - now);
            }
        })
        .expect("spawn the test watchdog");
    Watchdog {
        done,
        thread: handle.thread().clone(),
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Release);
        self.thread.unpark();
    }
}

/// Arms one watchdog for the rest of this test process (idempotent: only
/// the first call arms it): the whole test binary must finish within
/// `limit`. For helpers shared by many tests that each drive the manual
/// executor on the test thread, where one hanging test would otherwise
/// hold the binary forever.
pub fn arm_for_process(what: &str, limit: Duration) {
    static ARMED: std::sync::OnceLock<Watchdog> = std::sync::OnceLock::new();
    ARMED.get_or_init(|| arm(what, limit));
}
