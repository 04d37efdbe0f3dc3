//! The live window and the retired prefix: dense per-message state only
//! from the oldest message some subscription has not acknowledged onwards;
//! before it, only which messages were published (see the module docs of
//! [`checker`](super)).

use super::subscription::ACKED;
use super::{DeliveryChecker, MessageRef};
use crate::position::Position;

/// Consecutive retired entries of one ledger with the same batch size.
#[derive(Debug, Clone, Copy)]
pub(super) struct RetiredRun {
    ledger_id: i64,
    first_entry: i64,
    last_entry: i64,
    batch_size: u32,
}

/// The retired prefix of the published messages (acknowledged on every
/// subscription): only which messages they were, run-length encoded by
/// entry, so a late event about one of them is judged as before. Messages
/// retire in publish order, which is not position order when a
/// transaction commits (its messages are published at the commit, after
/// later plain entries): the runs are kept in position order regardless.
#[derive(Debug, Default)]
pub(super) struct Retired {
    /// Complete entries, in position order, not overlapping.
    runs: Vec<RetiredRun>,
    /// The last entry retired so far and how many of its messages.
    open: Option<(Position, u32)>,
}

impl Retired {
    /// Retires message `m` (in publish order).
    pub(super) fn push(&mut self, m: MessageRef) {
        match &mut self.open {
            Some((p, n)) if *p == m.position => *n = (*n).max(m.batch_index + 1),
            _ => {
                self.close();
                self.open = Some((m.position, m.batch_index + 1));
            }
        }
    }

    /// Moves the open entry into the runs, at its place in position order
    /// (an entry retired out of order lands before later runs).
    pub(super) fn close(&mut self) {
        let Some((p, n)) = self.open.take() else {
            return;
        };
        let key = (p.ledger_id, p.entry_id);
        let at = self
            .runs
            .partition_point(|r| (r.ledger_id, r.first_entry) <= key);
        if let Some(r) = at.checked_sub(1).map(|i| &mut self.runs[i]) {
            if r.ledger_id == p.ledger_id && r.last_entry + 1 == p.entry_id && r.batch_size == n {
                r.last_entry = p.entry_id;
                return;
            }
        }
        self.runs.insert(
            at,
            RetiredRun {
                ledger_id: p.ledger_id,
                first_entry: p.entry_id,
                last_entry: p.entry_id,
                batch_size: n,
            },
        );
    }

    /// Whether `m` was published and retired.
    pub(super) fn contains(&self, m: MessageRef) -> bool {
        if let Some((p, n)) = self.open {
            if p == m.position {
                return m.batch_index < n;
            }
        }
        let key = (m.position.ledger_id, m.position.entry_id);
        let i = self
            .runs
            .partition_point(|r| (r.ledger_id, r.first_entry) <= key);
        i > 0 && {
            let r = self.runs[i - 1];
            r.ledger_id == key.0 && key.1 <= r.last_entry && m.batch_index < r.batch_size
        }
    }
}

/// Where a message stands for the checker.
#[derive(Debug, Clone, Copy)]
pub(super) enum Lookup {
    /// In the window at this absolute publish index.
    Live(usize),
    /// Published and acknowledged on every subscription (forgotten).
    Retired,
    /// Never published.
    Unknown,
}

/// Retire acknowledged messages after this many acks.
pub(super) const RETIRE_EVERY: u32 = 4096;

impl DeliveryChecker {
    /// Where `msg` stands (window index, retired, or never published).
    pub(super) fn lookup(&self, msg: &MessageRef) -> Lookup {
        match self.index.get(msg) {
            Some(i) => Lookup::Live(*i),
            None if self.retired.contains(*msg) => Lookup::Retired,
            None => Lookup::Unknown,
        }
    }

    /// Absolute publish index one past the last message at or below `upto`
    /// (at least `base`: every retired message is acknowledged everywhere,
    /// so range scans need not distinguish below it).
    pub(super) fn end_at_or_below(&self, upto: Position) -> usize {
        self.base + self.published.partition_point(|(m, _)| m.position <= upto)
    }

    /// Forgets the window's prefix that is acknowledged on every
    /// subscription (see the module docs).
    pub(super) fn retire(&mut self) {
        self.acks_since_retire = 0;
        let base = self.base;
        let mut upto = usize::MAX;
        for s in self.subs.values_mut() {
            let mut p = s.acked_prefix.max(base);
            while s.acked.get(p - base) == Some(&ACKED) {
                p += 1;
            }
            s.acked_prefix = p;
            upto = upto.min(p);
        }
        if upto == usize::MAX || upto <= base {
            return;
        }
        let n = upto - base;
        for (m, _) in self.published.drain(..n) {
            self.index.remove(&m);
            self.retired.push(m);
        }
        for s in self.subs.values_mut() {
            s.delivered.drain(..n);
            s.acked.drain(..n);
            s.order_exempt = s.order_exempt.split_off(&upto);
            s.nacked = s.nacked.split_off(&upto);
            s.released_from = s.released_from.split_off(&upto);
            s.released_while_unheld = s.released_while_unheld.split_off(&upto);
            s.seek_scan_from = s.seek_scan_from.max(upto);
            s.cumulative_checked_to = s.cumulative_checked_to.max(upto);
            s.cumulative_acked_to = s.cumulative_acked_to.max(upto);
        }
        self.base = upto;
    }

    /// Counts one recorded ack; retires now and then.
    pub(super) fn ack_recorded(&mut self) {
        self.acks_since_retire += 1;
        if self.acks_since_retire >= self.retire_every {
            self.retire();
        }
    }
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests {
    use super::*;

    fn m(ledger_id: i64, entry_id: i64) -> MessageRef {
        MessageRef {
            position: Position::new(ledger_id, entry_id),
            batch_index: 0,
        }
    }

    /// Retired in publish order with a committed transaction's entries
    /// (1:3, 1:4) published after later plain entries: every retired
    /// entry is still found, and an entry never retired is not.
    #[test]
    fn entries_retired_out_of_position_order_are_all_found() {
        let mut r = Retired::default();
        for e in [1, 2, 5, 6, 7, 3, 4, 8, 10] {
            r.push(m(1, e));
        }
        r.close();
        for e in [1, 2, 3, 4, 5, 6, 7, 8, 10] {
            assert!(r.contains(m(1, e)), "1:{e} retired but not found");
        }
        for e in [0, 9, 11] {
            assert!(!r.contains(m(1, e)), "1:{e} never retired but found");
        }
        assert!(!r.contains(m(2, 1)));
    }
}
