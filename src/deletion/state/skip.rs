//! Position arithmetic over the deletion state: skipping entries with or
//! without the individually deleted ones, the nth undeleted entry, counts
//! and ranges around a position, and the end of a deleted run (the hop of
//! the read-scheduling scan). Pulsar's `ManagedCursorImpl.skipEntries`,
//! `getNumIndividualDeletedEntriesToSkip`, `getNthEntry`,
//! `RangeSetWrapper.cardinality` / `rangeContaining`,
//! `getNextAvailablePosition`.

use super::{CursorDeletionState, DeletionError, Inner, LedgerTopology};
use crate::position::Position;

/// Whether [`CursorDeletionState::skip_entries`] counts individually
/// deleted entries among the `n` it skips (Pulsar's
/// `IndividualDeletedEntries`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipMode {
    /// Deleted entries count: mark-delete moves `n` positions forward.
    Include,
    /// Deleted entries do not count: mark-delete moves to the `n`th
    /// undeleted entry (Pulsar's default for `skipMessages`).
    Exclude,
}

/// The `n`th (1-based) undeleted entry after mark-delete, under `g`.
fn nth_undeleted_locked(g: &Inner, ledgers: &[(i64, i64)], mut n: u64) -> Option<Position> {
    if n == 0 {
        return None;
    }
    let md = g.mark_delete;
    for &(l, count) in ledgers.iter().filter(|(l, _)| *l >= md.ledger_id) {
        let first = if l == md.ledger_id {
            md.entry_id.saturating_add(1).max(0)
        } else {
            0
        };
        if first >= count {
            continue;
        }
        let last = count - 1;
        let live_upto = |x: i64| -> u64 {
            (x - first + 1) as u64
                - g.ranges
                    .cardinality_between(Position::new(l, first), Position::new(l, x))
        };
        let live = live_upto(last);
        if n > live {
            n -= live;
            continue;
        }
        // Smallest x with live_upto(x) >= n: O(log entries) cardinality queries.
        let (mut lo, mut hi) = (first, last);
        while lo < hi {
            let span = hi - lo;
            let mid = lo + span / 2;
            // The probe lies inside the span (a wrong step fails here
            // instead of probing outside and spinning).
            debug_assert!(lo <= mid && mid < hi, "probe {mid} outside {lo}..{hi}");
            if live_upto(mid) >= n {
                hi = mid;
            } else {
                lo = mid + 1;
            }
            // Every step at least halves a non-empty span, so the search ends.
            debug_assert!(
                span > 0 && hi - lo <= span / 2,
                "search stalled at {lo}..={hi}"
            );
        }
        return Some(Position::new(l, lo));
    }
    None
}

/// The position `n` entries after `from` (exclusive), clamped to the last
/// entry (Pulsar's `getPositionAfterN(..., startExcluded)`).
fn position_after(ledgers: &[(i64, i64)], from: Position, mut n: u64) -> Option<Position> {
    let mut last = None;
    for &(l, count) in ledgers.iter().filter(|(l, _)| *l >= from.ledger_id) {
        let first = if l == from.ledger_id {
            from.entry_id.saturating_add(1).max(0)
        } else {
            0
        };
        if first >= count {
            continue;
        }
        let avail = (count - first) as u64;
        if n <= avail {
            return Some(Position::new(l, first + n as i64 - 1));
        }
        n -= avail;
        last = Some(Position::new(l, count - 1));
    }
    last
}

impl CursorDeletionState {
    /// The `n`th (1-based) entry after mark-delete that is not individually
    /// deleted (Pulsar's `getNthEntry` position with the deleted ranges
    /// skipped), or `None` if fewer than `n` exist (or `n == 0`). Under the
    /// read lock; O(ledgers + log(entries)) bitmap rank queries.
    pub fn nth_undeleted(&self, n: u64, ledger: &dyn LedgerTopology) -> Option<Position> {
        let ledgers = ledger.ledger_entries();
        nth_undeleted_locked(&self.inner.read(), &ledgers, n)
    }

    /// Skips `n` entries (Pulsar's `skipEntries(n, IndividualDeletedEntries)`):
    /// mark-delete moves to the `n`th entry after it ([`SkipMode::Include`])
    /// or to the `n`th undeleted one ([`SkipMode::Exclude`]), clamped to the
    /// last confirmed entry, then through contiguous deleted ranges; the
    /// set is trimmed. One write-lock section. Returns the new mark-delete
    /// (unchanged for `n == 0` or nothing to skip).
    ///
    /// # Errors
    /// None today beyond the state's own invariants; the `Result` keeps
    /// the shape of [`mark_delete`](Self::mark_delete).
    pub fn skip_entries(
        &self,
        n: u64,
        mode: SkipMode,
        ledger: &dyn LedgerTopology,
    ) -> Result<Position, DeletionError> {
        let ledgers = ledger.ledger_entries();
        let mut g = self.inner.write();
        if n == 0 {
            return Ok(g.mark_delete);
        }
        let target = match mode {
            SkipMode::Include => position_after(&ledgers, g.mark_delete, n),
            SkipMode::Exclude => nth_undeleted_locked(&g, &ledgers, n)
                .or_else(|| Some(ledger.last_confirmed_entry())),
        };
        // A target at or below mark-delete (nothing left to skip) changes
        // nothing: the advance never moves mark-delete backward.
        if let Some(t) = target {
            self.advance_locked(&mut g, t, ledger);
        }
        Ok(g.mark_delete)
    }

    /// Number of individually deleted entries in the closed window
    /// `[lower, upper]` (Pulsar's `individualDeletedMessages.cardinality`);
    /// mark-delete is not counted. Read lock.
    pub fn cardinality_between(&self, lower: Position, upper: Position) -> u64 {
        self.inner.read().ranges.cardinality_between(lower, upper)
    }

    /// The maximal individually deleted range `(lower, upper]` holding
    /// `p` (Pulsar's `rangeContaining`), or `None`. Read lock.
    pub fn range_containing(&self, p: Position) -> Option<(Position, Position)> {
        self.inner.read().ranges.range_containing(p)
    }

    /// If `(ledger_id, entry_id)` is deleted (at or below mark-delete or
    /// individually deleted), the last entry id of the contiguous deleted
    /// run of that ledger starting there (`i64::MAX` when the whole ledger
    /// is below mark-delete); `None` if it is not deleted. One short read
    /// lock: the hop of the read-scheduling scan (Pulsar's
    /// `getNextAvailablePosition`).
    pub fn deleted_run_end(&self, ledger_id: i64, entry_id: i64) -> Option<i64> {
        let g = self.inner.read();
        let p = Position::new(ledger_id, entry_id);
        let md = g.mark_delete;
        if p <= md {
            if md.ledger_id != ledger_id {
                return Some(i64::MAX);
            }
            let after = Position::new(ledger_id, md.entry_id.saturating_add(1));
            return Some(
                g.ranges
                    .run_end_from(after)
                    .map_or(md.entry_id, |q| q.entry_id),
            );
        }
        g.ranges.run_end_from(p).map(|q| q.entry_id)
    }
}
