//! A discrete-event scheduler on virtual time: events fire in (time, insertion
//! order), so a run is a deterministic function of its seed.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Virtual time in milliseconds since the start of the run.
pub type VirtualMs = u64;

#[derive(Debug)]
struct Scheduled<E> {
    at: VirtualMs,
    seq: u64,
    event: E,
}

impl<E> PartialEq for Scheduled<E> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl<E> Eq for Scheduled<E> {}
impl<E> PartialOrd for Scheduled<E> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<E> Ord for Scheduled<E> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// Event queue ordered by virtual time, ties broken by insertion order.
/// Single-threaded (owned by the simulator's event loop).
#[derive(Debug)]
pub struct Scheduler<E> {
    now: VirtualMs,
    seq: u64,
    queue: BinaryHeap<Reverse<Scheduled<E>>>,
}

impl<E> Default for Scheduler<E> {
    fn default() -> Self {
        Self {
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
        }
    }
}

impl<E> Scheduler<E> {
    /// An empty scheduler at time 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// Current virtual time.
    pub fn now(&self) -> VirtualMs {
        self.now
    }

    /// Schedules `event` `delay_ms` after now.
    pub fn after(&mut self, delay_ms: VirtualMs, event: E) {
        self.at(self.now.saturating_add(delay_ms), event);
    }

    /// Schedules `event` at absolute time `at` (clamped to now: the past is
    /// not reachable).
    pub fn at(&mut self, at: VirtualMs, event: E) {
        self.seq += 1;
        self.queue.push(Reverse(Scheduled {
            at: at.max(self.now),
            seq: self.seq,
            event,
        }));
    }

    /// Pops the next event and advances the clock to its time.
    pub fn pop(&mut self) -> Option<(VirtualMs, E)> {
        let Reverse(s) = self.queue.pop()?;
        self.now = s.at;
        Some((s.at, s.event))
    }

    /// The next event and its time, without taking it.
    pub fn peek(&self) -> Option<(VirtualMs, &E)> {
        self.queue.peek().map(|Reverse(s)| (s.at, &s.event))
    }

    /// Number of pending events.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether no event is pending.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fires_in_time_then_insertion_order() {
        let mut s = Scheduler::new();
        s.after(10, "b");
        s.after(5, "a");
        s.after(10, "c");
        assert_eq!(s.pop(), Some((5, "a")));
        s.at(0, "past-clamped");
        assert_eq!(s.pop(), Some((5, "past-clamped")));
        assert_eq!(s.pop(), Some((10, "b")));
        assert_eq!(s.pop(), Some((10, "c")));
        assert_eq!(s.pop(), None);
        assert_eq!(s.now(), 10);
    }
}
