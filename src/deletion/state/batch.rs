//! Batch-index deletion state: partial acknowledgement of the messages of a
//! batch entry (Pulsar's `batchDeletedIndexes` in `ManagedCursorImpl`,
//! persisted as `BatchedEntryDeletionIndexInfo`).
//!
//! An ack set is a list of little-endian 64-bit words in which a **set**
//! bit is a batch index that is still unacknowledged: the client's
//! `ack_set`, the pending-ack log's `ack_set` (`crate::pending_ack`) and Pulsar's
//! `deleteSet` use the same convention.

use super::{CursorDeletionState, DeletionError, LedgerTopology};
use crate::position::Position;

/// The result of [`CursorDeletionState::delete_batch_indexes`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchAckOutcome {
    /// The entry was already deleted (at or below mark-delete, or in a
    /// range); nothing changed.
    AlreadyDeleted,
    /// Some indexes remain unacknowledged: the stored ack set after the ack.
    Partial(Vec<i64>),
    /// Every index is acknowledged: the entry was deleted as a whole (as by
    /// [`CursorDeletionState::delete`]); mark-delete after the call.
    EntryDeleted(Position),
}

impl CursorDeletionState {
    /// Acknowledges batch indexes of the entry at `position`: the stored
    /// ack set (initially `ack_set` itself) becomes `stored AND ack_set`, so
    /// an index once acknowledged stays acknowledged. When no index is
    /// left the entry is deleted whole and its ack set dropped (Pulsar's
    /// `asyncDelete` with a batch position). One write-lock section for the
    /// partial case.
    ///
    /// # Errors
    /// As [`delete`](Self::delete) for `position` (beyond the last
    /// confirmed entry, invalid ids); unchanged on error.
    pub fn delete_batch_indexes(
        &self,
        position: Position,
        ack_set: &[i64],
        ledger: &dyn LedgerTopology,
    ) -> Result<BatchAckOutcome, DeletionError> {
        crate::deletion::range_set::member_entry(position)?;
        {
            let mut g = self.inner.write();
            let last_confirmed = ledger.last_confirmed_entry();
            if position > last_confirmed {
                return Err(DeletionError::BeyondLastConfirmed {
                    position,
                    last_confirmed,
                });
            }
            if Self::deleted_locked(&g, position) {
                return Ok(BatchAckOutcome::AlreadyDeleted);
            }
            let mut next: Vec<i64> = match g.batch_ack_sets.get(&position) {
                Some(stored) => stored
                    .iter()
                    .zip(ack_set.iter().chain(std::iter::repeat(&0)))
                    .map(|(a, b)| a & b)
                    .collect(),
                None => ack_set.to_vec(),
            };
            crate::deletion::snapshot::trim_ack_set(&mut next);
            if !next.is_empty() {
                g.batch_ack_sets.insert(position, next.clone());
                return Ok(BatchAckOutcome::Partial(next));
            }
            g.batch_ack_sets.remove(&position);
        }
        let outcome = self.delete(&[position], ledger)?;
        Ok(BatchAckOutcome::EntryDeleted(outcome.mark_delete))
    }

    /// The stored ack set of a partially acknowledged batch entry (set bit
    /// = index still to deliver), or `None` (Pulsar's
    /// `getBatchPositionAckSet`). Read lock.
    pub fn batch_ack_set(&self, position: Position) -> Option<Vec<i64>> {
        self.inner.read().batch_ack_sets.get(&position).cloned()
    }

    /// Number of partially acknowledged batch entries. Read lock.
    pub fn batch_entry_count(&self) -> usize {
        self.inner.read().batch_ack_sets.len()
    }

    /// The post-I/O filter with batch-index state: drops every deleted
    /// entry (as [`filter_read_entries`](Self::filter_read_entries)) and
    /// pairs each kept entry with its stored ack set, if partially
    /// acknowledged, so the dispatcher can send it with the entry (the
    /// consumer then skips acknowledged indexes). One read-lock section.
    pub fn filter_read_entries_with_ack_sets<T>(
        &self,
        entries: Vec<T>,
        position_of: impl Fn(&T) -> Position,
    ) -> Vec<(T, Option<Vec<i64>>)> {
        let g = self.inner.read();
        entries
            .into_iter()
            .filter_map(|e| {
                let p = position_of(&e);
                if Self::deleted_locked(&g, p) {
                    return None;
                }
                let ack_set = g.batch_ack_sets.get(&p).cloned();
                Some((e, ack_set))
            })
            .collect()
    }
}
