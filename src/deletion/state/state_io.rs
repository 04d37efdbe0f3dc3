//! Snapshot and restore of a [`CursorDeletionState`]: the bridge between the
//! live state and every persisted form ([`DeletionSnapshot`]).

use super::{CursorDeletionState, DeletionError};
use crate::deletion::range_set::{PositionRangeSet, RangeSetError};
use crate::deletion::snapshot::DeletionSnapshot;

fn check_snapshot(snapshot: &DeletionSnapshot) -> Result<(), DeletionError> {
    super::validate_bound(snapshot.mark_delete)?;
    if let Some(l) = snapshot.ledgers.keys().find(|l| **l < 0) {
        return Err(RangeSetError::NegativeLedgerId {
            ledger_id: *l,
            entry_id: 0,
        }
        .into());
    }
    if let Some(p) = snapshot
        .batch_ack_sets
        .keys()
        .find(|p| p.ledger_id < 0 || u32::try_from(p.entry_id).is_err())
    {
        return Err(RangeSetError::EntryIdOutOfRange {
            ledger_id: p.ledger_id,
            entry_id: p.entry_id,
        }
        .into());
    }
    Ok(())
}

impl CursorDeletionState {
    /// A consistent copy of mark-delete, the individually deleted entries
    /// and the batch ack sets, taken under the cursor read lock (so a
    /// grouped ack is either wholly in it or not at all). Cost: one clone
    /// of each ledger's bitmap.
    pub fn snapshot(&self) -> DeletionSnapshot {
        let g = self.inner.read();
        DeletionSnapshot {
            mark_delete: g.mark_delete,
            ledgers: g.ranges.to_bitmaps(),
            batch_ack_sets: g.batch_ack_sets.clone(),
        }
    }

    /// A state recovered from a persisted snapshot (Pulsar's cursor
    /// recovery: `recoverIndividualDeletedMessages` +
    /// `recoverBatchDeletedIndexes`); the published directory is built
    /// from it and the reset epoch starts at 0.
    ///
    /// # Errors
    /// [`DeletionError::RangeSet`] for a mark-delete entry id other than
    /// -1 or a u32, a negative ledger id, or a batch position that is not
    /// an entry.
    pub fn from_snapshot(mut snapshot: DeletionSnapshot) -> Result<Self, DeletionError> {
        check_snapshot(&snapshot)?;
        snapshot.normalize();
        let mut set = PositionRangeSet::new();
        set.rebuild_from_bitmaps(snapshot.ledgers)?;
        let state = Self::with_ranges(snapshot.mark_delete, set);
        // No other thread can reach `state` yet.
        state.inner.write().batch_ack_sets = snapshot.batch_ack_sets;
        Ok(state)
    }

    /// Replaces the whole state with `snapshot` (mark-delete may move
    /// backward, so this runs inside the reset epoch bracket: a lock-free
    /// lookup overlapping it falls back to the cursor lock). Entries at or
    /// below the snapshot's mark-delete are dropped.
    ///
    /// # Errors
    /// As [`from_snapshot`](Self::from_snapshot); unchanged on error.
    pub fn restore(&self, mut snapshot: DeletionSnapshot) -> Result<(), DeletionError> {
        check_snapshot(&snapshot)?;
        snapshot.normalize();
        let DeletionSnapshot {
            mark_delete,
            ledgers,
            batch_ack_sets,
        } = snapshot;
        let mut g = self.inner.write();
        self.replace_under_reset_epoch(&mut g, mark_delete, move |ranges| {
            ranges.rebuild_from_bitmaps(ledgers)
        })?;
        g.batch_ack_sets = batch_ack_sets;
        tracing::debug!(to = %mark_delete, "cursor deletion state restored");
        Ok(())
    }
}
