//! The pending-ack handle's view of its subscription (Pulsar's
//! `PendingAckHandleImpl` holds the `PersistentSubscription` and asks its
//! `ManagedCursor`).
//!
//! Two questions, asked of two states:
//!
//! * **live** — has the subscription already deleted this entry (or batch
//!   index)? A transactional ack of such a position is Pulsar's
//!   `TransactionConflictException` ([`PendingAckError::AckConflict`] with
//!   no holder).
//! * **durable** — does the subscription's *persisted* state (its persisted
//!   mark-delete and individually deleted ranges) hold a committed
//!   transactional ack? Only then may the pending-ack log be trimmed past
//!   the log entries that record it: until the subscription cursor is
//!   persisted, the untrimmed log is the only durable copy of the commit,
//!   and the next replay re-applies it ([`CommittedAck`]). This is
//!   `MLPendingAckStore`'s rule of trimming the log only up to the
//!   subscription cursor's persisted mark-delete.
//!
//! [`PendingAckError::AckConflict`]: super::PendingAckError::AckConflict

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::deletion::{CursorDeletionState, DeletionError, LedgerTopology};
use crate::ledger::ManagedCursor;
use crate::position::Position;

/// The effect of one committed transactional ack on the subscription: what
/// the embedder applies to the subscription cursor (idempotently), and what
/// must be in the subscription's persisted state before the pending-ack log
/// may forget it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum CommittedAck {
    /// An individual ack of a whole entry: the entry is deleted.
    Entry(Position),
    /// An individual ack of some batch indexes of an entry holding
    /// `batch_size` messages: those indexes are deleted.
    BatchIndexes {
        /// The batch entry.
        position: Position,
        /// Messages in the batch entry.
        batch_size: i32,
        /// The deleted indexes.
        indexes: BTreeSet<u32>,
    },
    /// A cumulative ack: the mark-delete moves to this position.
    MarkDelete(Position),
}

/// What the pending-ack handle needs to know about its subscription's
/// cursor. Implemented for the library's own subscription pair by
/// [`CursorSubscription`]; called from any thread, so implementations must
/// not block on the handle.
pub trait SubscriptionView: Send + Sync {
    /// The subscription's live (in-memory) mark-delete.
    fn mark_delete_position(&self) -> Position;

    /// Whether the subscription has deleted `position` (live state): the
    /// whole entry when `batch_index` is `None`, else that batch index
    /// (deleted also when the whole entry is).
    fn is_deleted(&self, position: Position, batch_index: Option<u32>) -> bool;

    /// The mark-delete the subscription has persisted.
    fn persisted_mark_delete_position(&self) -> Position;

    /// Whether the subscription's persisted state holds `position` (or its
    /// batch index `batch_index`) deleted: at or below the persisted
    /// mark-delete or in a persisted individually deleted range. May answer
    /// `false` for a deleted position (the trim then waits); must never
    /// answer `true` for one the persisted state does not hold.
    fn is_persisted_deleted(&self, position: Position, batch_index: Option<u32>) -> bool;

    /// Whether `ack` is in the subscription's persisted state.
    fn holds_durably(&self, ack: &CommittedAck) -> bool {
        match ack {
            CommittedAck::Entry(p) => self.is_persisted_deleted(*p, None),
            CommittedAck::BatchIndexes {
                position, indexes, ..
            } => {
                self.is_persisted_deleted(*position, None)
                    || indexes
                        .iter()
                        .all(|i| self.is_persisted_deleted(*position, Some(*i)))
            }
            CommittedAck::MarkDelete(p) => self.persisted_mark_delete_position() >= *p,
        }
    }
}

/// A subscription as the library's embedders hold it: its [`ManagedCursor`]
/// on the topic ledger (the persisted mark-delete and individually deleted
/// ranges, written by [`ManagedCursor::mark_delete_with_ranges`]) and the
/// live [`CursorDeletionState`] acks go to.
///
/// Persisted batch indexes are not consulted: a committed batch-index ack
/// counts as durable once its whole entry is (the trim waits longer, never
/// less). The same holds for ranges written in the compact form
/// ([`ManagedCursor::persist_deletion_state`]), which the cursor does not
/// keep in memory: only its mark-delete counts.
#[derive(Debug, Clone)]
pub struct CursorSubscription {
    cursor: Arc<ManagedCursor>,
    deletion: Arc<CursorDeletionState>,
}

impl CursorSubscription {
    /// The subscription of `cursor` (persisted state) whose live deletion
    /// state is `deletion`.
    pub fn new(cursor: Arc<ManagedCursor>, deletion: Arc<CursorDeletionState>) -> Self {
        Self { cursor, deletion }
    }

    /// Applies a committed ack to the live deletion state (idempotent: an
    /// entry already deleted or a mark-delete already passed changes
    /// nothing). The embedder calls this for each of
    /// [`PendingAckHandle::committed_acks`](super::PendingAckHandle::committed_acks)
    /// after a replay, then persists the cursor.
    ///
    /// # Errors
    /// As [`CursorDeletionState::delete`] /
    /// [`CursorDeletionState::mark_delete`] (a position the topic ledger does
    /// not hold); unchanged on error.
    pub fn apply(
        &self,
        ack: &CommittedAck,
        ledger: &dyn LedgerTopology,
    ) -> Result<(), DeletionError> {
        match ack {
            CommittedAck::Entry(p) => self.deletion.delete(&[*p], ledger).map(|_| ()),
            CommittedAck::BatchIndexes {
                position,
                batch_size,
                indexes,
            } => {
                // The remaining-indexes mask: every index of the batch but
                // the acknowledged ones (the stored ack set is ANDed in).
                let n = (*batch_size).max(0) as u32;
                let mut words = vec![0_i64; n.div_ceil(64) as usize];
                for i in (0..n).filter(|i| !indexes.contains(i)) {
                    words[(i / 64) as usize] |= 1_i64 << (i % 64);
                }
                self.deletion
                    .delete_batch_indexes(*position, &words, ledger)
                    .map(|_| ())
            }
            CommittedAck::MarkDelete(p) => match self.deletion.mark_delete(*p, ledger) {
                Ok(_) | Err(DeletionError::MarkDeleteBackward { .. }) => Ok(()),
                Err(e) => Err(e),
            },
        }
    }
}

impl SubscriptionView for CursorSubscription {
    fn mark_delete_position(&self) -> Position {
        self.deletion.mark_delete_position()
    }

    fn is_deleted(&self, position: Position, batch_index: Option<u32>) -> bool {
        if self.deletion.is_message_deleted(position) {
            return true;
        }
        let Some(i) = batch_index else { return false };
        // Pulsar's ack set: a set bit is an index still to deliver.
        self.deletion.batch_ack_set(position).is_some_and(|words| {
            match words.get((i / 64) as usize) {
                Some(w) => w & (1_i64 << (i % 64)) == 0,
                None => false,
            }
        })
    }

    fn persisted_mark_delete_position(&self) -> Position {
        self.cursor.mark_delete_position()
    }

    fn is_persisted_deleted(&self, position: Position, _batch_index: Option<u32>) -> bool {
        position <= self.cursor.mark_delete_position()
            || self
                .cursor
                .individually_deleted_ranges()
                .iter()
                .any(|(lower, upper)| *lower < position && position <= *upper)
    }
}

/// Deleted entries and batch indexes above a mark-delete.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Deleted {
    mark_delete: Position,
    entries: BTreeSet<Position>,
    indexes: BTreeSet<(Position, u32)>,
}

impl Deleted {
    fn holds(&self, position: Position, batch_index: Option<u32>) -> bool {
        position <= self.mark_delete
            || self.entries.contains(&position)
            || batch_index.is_some_and(|i| self.indexes.contains(&(position, i)))
    }
}

/// A subscription held in memory (an embedder without a managed cursor,
/// tests, examples): [`MemorySubscription::apply`] changes its live state,
/// [`MemorySubscription::persist`] makes the live state its persisted one,
/// and [`MemorySubscription::crash`] drops what was never persisted.
#[derive(Debug)]
pub struct MemorySubscription {
    state: crate::sync::Mutex<(Deleted, Deleted)>,
}

impl Default for MemorySubscription {
    fn default() -> Self {
        Self::new(Position::new(-1, -1))
    }
}

impl MemorySubscription {
    /// A subscription whose live and persisted mark-delete is `mark_delete`.
    pub fn new(mark_delete: Position) -> Self {
        let d = Deleted {
            mark_delete,
            entries: BTreeSet::new(),
            indexes: BTreeSet::new(),
        };
        Self {
            state: crate::sync::Mutex::new((d.clone(), d)),
        }
    }

    /// Applies an ack to the live state (idempotent; a mark-delete never
    /// moves back).
    pub fn apply(&self, ack: &CommittedAck) {
        let mut g = self.state.lock();
        let live = &mut g.0;
        match ack {
            CommittedAck::Entry(p) => {
                live.entries.insert(*p);
            }
            CommittedAck::BatchIndexes {
                position, indexes, ..
            } => live.indexes.extend(indexes.iter().map(|i| (*position, *i))),
            CommittedAck::MarkDelete(p) => {
                if *p > live.mark_delete {
                    live.mark_delete = *p;
                    live.entries = live.entries.split_off(p);
                    live.entries.remove(p);
                    live.indexes.retain(|(q, _)| q > p);
                }
            }
        }
    }

    /// Persists the live state.
    pub fn persist(&self) {
        let mut g = self.state.lock();
        g.1 = g.0.clone();
    }

    /// A crash: the live state goes back to the persisted one.
    pub fn crash(&self) {
        let mut g = self.state.lock();
        g.0 = g.1.clone();
    }
}

impl SubscriptionView for MemorySubscription {
    fn mark_delete_position(&self) -> Position {
        self.state.lock().0.mark_delete
    }

    fn is_deleted(&self, position: Position, batch_index: Option<u32>) -> bool {
        self.state.lock().0.holds(position, batch_index)
    }

    fn persisted_mark_delete_position(&self) -> Position {
        self.state.lock().1.mark_delete
    }

    fn is_persisted_deleted(&self, position: Position, batch_index: Option<u32>) -> bool {
        self.state.lock().1.holds(position, batch_index)
    }
}
