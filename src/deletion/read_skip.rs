//! [`SkipDeleted`]: the deletion state as the skip predicate of
//! [`ManagedCursor::read_entries_with_skip_runs`](crate::ledger::ManagedCursor::read_entries_with_skip_runs)
//! (the ledger implements its `ReadSkip` for it, `src/ledger/deletion_state.rs`:
//! the deletion state does not depend on the ledger).

use super::CursorDeletionState;

/// Skips entries the lock-free hint reports deleted and hops to the end of
/// each deleted run (Pulsar's read-scheduling predicate, one hop per
/// deleted run). Counts its calls, so a test or metric can check that the work is
/// per run, not per deleted entry.
///
/// Contract: as [`CursorDeletionState::is_deleted_for_read_scheduling`]
/// (a stale negative is an extra read; never a stale positive after a
/// completed reset); the run end comes from the authoritative state under
/// its read lock, taken once per skipped run.
#[derive(Debug)]
pub struct SkipDeleted<'a> {
    state: &'a CursorDeletionState,
    /// Lock-free hint lookups made.
    pub hint_calls: u64,
    /// Run-end queries made (one per skipped run).
    pub run_queries: u64,
}

impl<'a> SkipDeleted<'a> {
    /// A predicate over `state` with zeroed counters.
    pub fn new(state: &'a CursorDeletionState) -> Self {
        Self {
            state,
            hint_calls: 0,
            run_queries: 0,
        }
    }
}

impl SkipDeleted<'_> {
    /// Whether `(ledger_id, entry_id)` may be skipped without reading it:
    /// the lock-free hint says it is deleted.
    pub fn skip(&mut self, ledger_id: i64, entry_id: i64) -> bool {
        self.hint_calls += 1;
        self.state
            .is_deleted_for_read_scheduling(ledger_id, entry_id)
    }

    /// The last entry id of the deleted run of `ledger_id` starting at
    /// `entry_id` (asked after [`skip`](Self::skip) answered `true`).
    pub fn skipped_run_end(&mut self, ledger_id: i64, entry_id: i64) -> Option<i64> {
        self.run_queries += 1;
        self.state.deleted_run_end(ledger_id, entry_id)
    }
}
