//! [`DeletionSnapshot`]: the persisted shape of a cursor's deletion state
//! (mark-delete, individually deleted entries per ledger, batch-index ack
//! sets), the value every persisted form encodes and decodes.

use std::collections::BTreeMap;

use roaring::RoaringBitmap;

use crate::position::Position;

/// A consistent copy of a cursor's deletion state, taken under the cursor
/// lock by [`CursorDeletionState::snapshot`](super::CursorDeletionState::snapshot)
/// and installed by
/// [`CursorDeletionState::restore`](super::CursorDeletionState::restore).
///
/// Shapes: `ledgers` maps ledger id → bitmap of deleted entry ids strictly
/// above `mark_delete` (bit `n` ⇔ `(ledger, n)` deleted; Pulsar's
/// `individualDeletedMessages`); `batch_ack_sets` maps a batch entry's
/// position → its ack set, little-endian 64-bit words in which a **set** bit
/// is a batch index still to be acknowledged (Pulsar's
/// `batchDeletedIndexes` / `BatchedEntryDeletionIndexInfo.deleteSet`, the
/// same convention as the pending-ack `ack_set`). A position whose ack set
/// empties is a whole deleted entry and is in `ledgers`, not here.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeletionSnapshot {
    /// Every position `<=` it is acknowledged.
    pub mark_delete: Position,
    /// Individually deleted entries above mark-delete, per ledger (no empty
    /// bitmaps once [`normalize`](Self::normalize)d).
    pub ledgers: BTreeMap<i64, RoaringBitmap>,
    /// Partially acknowledged batch entries: position → ack-set words (set
    /// bit = index not yet acknowledged).
    pub batch_ack_sets: BTreeMap<Position, Vec<i64>>,
}

/// Drops an ack set's trailing zero words (an all-zero set becomes `[]`).
/// `truncate` to the last non-zero word: no loop that could fail to end.
pub(crate) fn trim_ack_set(words: &mut Vec<i64>) {
    words.truncate(words.iter().rposition(|&w| w != 0).map_or(0, |i| i + 1));
}

impl DeletionSnapshot {
    /// A snapshot with only a mark-delete position.
    pub fn new(mark_delete: Position) -> Self {
        Self {
            mark_delete,
            ..Self::default()
        }
    }

    /// Drops every entry at or below mark-delete, empty bitmaps, batch ack
    /// sets at or below mark-delete or of an already deleted entry, and
    /// trailing zero words of ack sets (an all-zero ack set is kept as
    /// `[]`, Pulsar's "fully acknowledged" state before the entry is added
    /// to the ranges).
    pub fn normalize(&mut self) {
        let md = self.mark_delete;
        self.ledgers.retain(|l, bits| {
            if *l < md.ledger_id {
                return false;
            }
            if *l == md.ledger_id && md.entry_id >= 0 {
                let upto = u32::try_from(md.entry_id).unwrap_or(u32::MAX);
                bits.remove_range(0..=upto);
            }
            !bits.is_empty()
        });
        let ledgers = &self.ledgers;
        self.batch_ack_sets.retain(|p, words| {
            trim_ack_set(words);
            *p > md
                && !u32::try_from(p.entry_id)
                    .is_ok_and(|e| ledgers.get(&p.ledger_id).is_some_and(|b| b.contains(e)))
        });
    }

    /// Number of individually deleted entries.
    pub fn deleted_entries(&self) -> u64 {
        self.ledgers.values().map(RoaringBitmap::len).sum()
    }

    /// Number of maximal ranges (runs of consecutive deleted entries, per
    /// ledger): the number of `MessageRange`s Pulsar's range form needs.
    pub fn range_count(&self) -> u64 {
        self.ledgers
            .values()
            .map(|b| {
                let mut it = b.iter();
                let mut n = 0u64;
                while it.next_range().is_some() {
                    n += 1;
                }
                n
            })
            .sum()
    }

    /// Every maximal range `(lower, upper]` ascending, never spanning
    /// ledgers (`lower` is the entry before the run's first one).
    pub fn ranges(&self) -> impl Iterator<Item = (Position, Position)> + '_ {
        self.ledgers.iter().flat_map(|(l, b)| {
            let mut it = b.iter();
            std::iter::from_fn(move || it.next_range()).map(move |r| {
                (
                    Position::new(*l, i64::from(*r.start()) - 1),
                    Position::new(*l, i64::from(*r.end())),
                )
            })
        })
    }

    /// Whether `p` is acknowledged: at or below mark-delete or an
    /// individually deleted entry (a partially acknowledged batch entry is
    /// not).
    pub fn is_deleted(&self, p: Position) -> bool {
        p <= self.mark_delete
            || u32::try_from(p.entry_id).is_ok_and(|e| {
                self.ledgers
                    .get(&p.ledger_id)
                    .is_some_and(|b| b.contains(e))
            })
    }
}
