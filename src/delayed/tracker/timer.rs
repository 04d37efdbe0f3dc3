//! The dispatcher's timer: the next delivery time, whether a message is
//! available, the timer delay (Pulsar `nextDeliveryTime`,
//! `hasMessageAvailable`, `updateTimer`, `run`).

use std::cmp::Reverse;

use super::{BucketDelayedDeliveryTracker, Inner};

impl BucketDelayedDeliveryTracker {
    /// Earliest delivery time (ms) among the queued and mutable messages
    /// (Pulsar `nextDeliveryTime`); `None` (= +∞) if both heaps are empty.
    /// The count may be > 0 with only unloaded segments left.
    pub fn next_delivery_time(&self) -> Option<u64> {
        let inner = self.inner.lock();
        Self::next_delivery(&inner)
    }

    pub(super) fn next_delivery(inner: &Inner) -> Option<u64> {
        let a = inner.shared_queue.peek().map(|r| r.0.timestamp);
        let b = inner.mutable.peek().map(|i| i.timestamp);
        match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether a message is deliverable now (Pulsar `hasMessageAvailable`):
    /// `count > 0 && next_delivery_time ≤ cutoff`.
    pub fn has_message_available(&self) -> bool {
        let inner = self.inner.lock();
        !inner.closed
            && !inner.index.is_empty()
            && Self::next_delivery(&inner).is_some_and(|t| t <= self.cutoff())
    }

    /// How long (ms) the dispatcher's timer should wait before the next read
    /// (Pulsar `updateTimer`): `None` when nothing is tracked, the target is
    /// unknown (+∞) or already past; otherwise
    /// `max(target − now, last_tick_run + tick − now)`.
    pub fn next_timer_delay_ms(&self) -> Option<u64> {
        let inner = self.inner.lock();
        if inner.closed || inner.index.is_empty() {
            return None;
        }
        let target = Self::next_delivery(&inner)?;
        let now = self.clock.now_ms();
        if target <= now {
            return None;
        }
        let tick_floor = inner
            .last_tick_run_ms
            .saturating_add(self.config.tick_time_ms)
            .saturating_sub(now);
        Some((target - now).max(tick_floor))
    }

    /// The timer fired (Pulsar `run`): moves due mutable entries to the
    /// shared queue and records the tick time. The caller then asks the
    /// dispatcher to read.
    pub fn on_timer_fired(&self) {
        let mut inner = self.inner.lock();
        let cutoff = self.cutoff();
        let now = self.clock.now_ms();
        let Inner {
            mutable,
            shared_queue,
            last_tick_run_ms,
            ..
        } = &mut *inner;
        mutable.move_due(cutoff, |i| shared_queue.push(Reverse(i)));
        *last_tick_run_ms = now;
    }
}
