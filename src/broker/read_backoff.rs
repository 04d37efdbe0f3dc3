//! A subscription's read-failure backoff: Pulsar's dispatcher
//! `readEntriesFailed` (`PersistentDispatcherMultipleConsumers`,
//! `PersistentDispatcherSingleActiveConsumer`), which schedules the next
//! `readMoreEntries` after `readFailureBackoff.next()` and halves the
//! backoff (`reduceToHalf`) when a read completes.
//!
//! When a read of the subscription's entries fails (the cursor's read of
//! new entries, or the read of replayed or due delayed positions), the
//! subscription issues no read before the retry deadline; the core's timer
//! ([`crate::broker::Broker::poll_timeout`]) fires at it and the dispatch
//! reads again. So a storage outage costs one failed read per backoff step,
//! never a read per input (a Flow or an ack during the outage waits for the
//! deadline too), and nothing is lost: the entries stay unread (cursor) or
//! in the replay set. The settings are Pulsar's defaults
//! (`dispatcherReadFailureBackoffInitialTimeInMs` 15 s,
//! `dispatcherReadFailureBackoffMaxTimeInMs` 60 s, no mandatory stop).

/// First wait after a read failure, ms (Pulsar's
/// `dispatcherReadFailureBackoffInitialTimeInMs`).
pub const READ_FAILURE_BACKOFF_INITIAL_MS: u64 = 15_000;
/// Longest wait, ms (`dispatcherReadFailureBackoffMaxTimeInMs`).
pub const READ_FAILURE_BACKOFF_MAX_MS: u64 = 60_000;

/// The backoff state of one subscription's reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReadBackoff {
    /// The wait the next failure gets (Pulsar's `Backoff.next`).
    next_ms: u64,
    /// No read before this (epoch ms), after a failure.
    retry_at: Option<u64>,
    /// Failed reads so far (for the counters).
    pub(crate) failures: u64,
}

impl Default for ReadBackoff {
    fn default() -> Self {
        Self {
            next_ms: READ_FAILURE_BACKOFF_INITIAL_MS,
            retry_at: None,
            failures: 0,
        }
    }
}

impl ReadBackoff {
    /// Whether the subscription may read at `now_ms`.
    pub(crate) fn may_read(&self, now_ms: u64) -> bool {
        self.retry_at.is_none_or(|t| now_ms >= t)
    }

    /// A read failed at `now_ms`: no read before the returned deadline; the
    /// next failure waits twice as long, at most
    /// [`READ_FAILURE_BACKOFF_MAX_MS`].
    pub(crate) fn failed(&mut self, now_ms: u64) -> u64 {
        let wait = self.next_ms;
        self.next_ms = (self.next_ms.saturating_mul(2)).min(READ_FAILURE_BACKOFF_MAX_MS);
        let at = now_ms.saturating_add(wait);
        self.retry_at = Some(at);
        self.failures += 1;
        at
    }

    /// A read completed: the deadline is gone and the next failure's wait
    /// halves, never below [`READ_FAILURE_BACKOFF_INITIAL_MS`] (Pulsar's
    /// `reduceToHalf`).
    pub(crate) fn succeeded(&mut self) {
        self.retry_at = None;
        if self.next_ms > READ_FAILURE_BACKOFF_INITIAL_MS {
            self.next_ms = (self.next_ms / 2).max(READ_FAILURE_BACKOFF_INITIAL_MS);
        }
    }

    /// The retry deadline (epoch ms) while reads wait for it.
    pub(crate) fn deadline(&self) -> Option<u64> {
        self.retry_at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_blocks_reads_until_its_deadline_and_the_wait_doubles_up_to_the_cap() {
        let mut b = ReadBackoff::default();
        assert!(b.may_read(0));
        let mut now = 1_000;
        let mut waits = Vec::new();
        for _ in 0..5 {
            let at = b.failed(now);
            assert!(!b.may_read(at - 1), "no read before the deadline");
            assert!(b.may_read(at));
            assert_eq!(b.deadline(), Some(at));
            waits.push(at - now);
            now = at;
        }
        assert_eq!(waits, [15_000, 30_000, 60_000, 60_000, 60_000]);
        assert_eq!(b.failures, 5);
    }

    #[test]
    fn a_completed_read_clears_the_deadline_and_halves_the_next_wait() {
        let mut b = ReadBackoff::default();
        b.failed(0);
        b.failed(0);
        b.failed(0); // next wait: 60 s
        b.succeeded();
        assert_eq!(b.deadline(), None);
        assert!(b.may_read(0));
        assert_eq!(b.failed(0), 30_000, "halved once");
        b.succeeded();
        b.succeeded();
        b.succeeded();
        assert_eq!(b.failed(0), 15_000, "never below the initial wait");
    }
}
