//! Injectable millisecond clock.

use crate::sync::{AtomicU64, Ordering};

/// A wall clock in milliseconds since the Unix epoch (Pulsar's
/// `Clock.millis()`). Read under the tracker lock: must not block.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Current time in ms.
    fn now_ms(&self) -> u64;
}

/// The system clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }
}

/// A clock on virtual time for tests and simulations: it reads what the
/// owner last set. Any thread may call [`VirtualClock::set`] /
/// [`VirtualClock::advance`]; reads are atomic. The delayed tracker's
/// counterpart of the pending-ack `VirtualTimer` (same "virtual time" naming;
/// the tracker only reads time, it schedules nothing).
#[derive(Debug, Default)]
pub struct VirtualClock {
    now: AtomicU64,
}

impl VirtualClock {
    /// A clock reading `now_ms`.
    pub fn new(now_ms: u64) -> Self {
        Self {
            now: AtomicU64::new(now_ms),
        }
    }

    /// Sets the time to `now_ms` (ms).
    pub fn set(&self, now_ms: u64) {
        self.now.store(now_ms, Ordering::SeqCst);
    }

    /// Advances the time by `delta_ms` (ms) and returns the new time.
    pub fn advance(&self, delta_ms: u64) -> u64 {
        self.now.fetch_add(delta_ms, Ordering::SeqCst) + delta_ms
    }
}

impl Clock for VirtualClock {
    fn now_ms(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
}
