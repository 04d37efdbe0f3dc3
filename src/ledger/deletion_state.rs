//! How the ledger uses the deletion state below it (`crate::deletion`): the
//! managed ledger is the [`LedgerTopology`] a cursor's deletion state
//! checks acks against, and [`SkipDeleted`] is a [`ReadSkip`] predicate of
//! [`ManagedCursor::read_entries_with_skip_runs`](super::ManagedCursor::read_entries_with_skip_runs).
//! Both impls live here so the dependency runs one way: `ledger` imports
//! `deletion`, never the reverse (`.ci/layers` checks it).

use super::{ManagedLedger, ReadSkip};
use crate::deletion::{LedgerTopology, SkipDeleted};
use crate::position::Position;

impl LedgerTopology for ManagedLedger {
    fn last_confirmed_entry(&self) -> Position {
        ManagedLedger::last_confirmed_entry(self)
    }
    /// With auto-skip of non-recoverable data on, a lost ledger holds no
    /// position: its entries count as deleted for every cursor.
    fn next_valid_position(&self, p: Position) -> Position {
        ManagedLedger::next_valid_position_for_cursors(self, p)
    }
    fn ledger_entries(&self) -> Vec<(i64, i64)> {
        ManagedLedger::ledgers(self)
    }
}

impl ReadSkip for SkipDeleted<'_> {
    fn skip(&mut self, ledger_id: i64, entry_id: i64) -> bool {
        SkipDeleted::skip(self, ledger_id, entry_id)
    }

    fn skipped_run_end(&mut self, ledger_id: i64, entry_id: i64) -> Option<i64> {
        SkipDeleted::skipped_run_end(self, ledger_id, entry_id)
    }
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests {
    use crate::deletion::{CursorDeletionState, DeletionError};
    use crate::Position;

    #[test]
    fn acks_are_checked_against_the_managed_ledger_topology() {
        use crate::ledger::{LedgerConfig, ManagedLedger, MemoryStore};
        let ml = ManagedLedger::open(
            "t",
            LedgerConfig {
                max_entries_per_ledger: 3,
                ..LedgerConfig::default()
            },
            std::sync::Arc::new(MemoryStore::new()),
        )
        .unwrap();
        let ps: Vec<_> = (0..5).map(|i| ml.append(&[i]).unwrap()).collect();
        let st = CursorDeletionState::new(Position::new(ps[0].ledger_id, -1)).unwrap();
        st.delete(&ps[..4], &*ml).unwrap();
        assert_eq!(st.mark_delete_position(), ps[3]);
        assert!(matches!(
            st.delete(&[ps[4].next_in_ledger()], &*ml),
            Err(DeletionError::BeyondLastConfirmed { .. })
        ));
    }
}
