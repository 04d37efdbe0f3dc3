//! The owned store writes of the non-blocking path
//! ([`LedgerStore::submit`](super::LedgerStore::submit)) and the redb
//! backend of the [`GroupCommitter`](super::GroupCommitter).

use std::fmt;

use redb::{Database, WriteTransaction};

use super::committer::CommitBackend;
use super::error::StoreError;
use super::store::{begin_write, contained, AppendSegment, LedgerStore, RedbStore, SyncMode};
use crate::position::Position;
use std::sync::Arc;

/// One durable write of the managed-ledger substrate, owning its data so it
/// can wait in a store writer's queue. Each is one method of
/// [`LedgerStore`], with the same atomicity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LedgerWrite {
    /// [`LedgerStore::append`]: `segments` are `(ledger_id, first_entry_id,
    /// payloads)`.
    Append {
        /// Managed ledger.
        name: String,
        /// The segments, in order.
        segments: Vec<(i64, i64, Vec<Vec<u8>>)>,
    },
    /// [`LedgerStore::save_mark_delete`].
    SaveMarkDelete {
        /// Managed ledger.
        name: String,
        /// Cursor.
        cursor: String,
        /// Mark-delete position.
        mark_delete: Position,
        /// Individually deleted ranges `(lower, upper]`.
        individually_deleted: Vec<(Position, Position)>,
    },
    /// [`LedgerStore::save_deletion_state`].
    SaveDeletionState {
        /// Managed ledger.
        name: String,
        /// Cursor.
        cursor: String,
        /// Mark-delete position.
        mark_delete: Position,
        /// Compact deletion-state chunks.
        chunks: Vec<Vec<u8>>,
        /// Cursor property updates (`Some` sets, `None` removes).
        property_updates: Vec<(String, Option<i64>)>,
    },
}

impl LedgerWrite {
    /// Bytes the write adds to a group-commit batch (payloads and chunks).
    pub fn bytes(&self) -> usize {
        match self {
            LedgerWrite::Append { segments, .. } => segments
                .iter()
                .flat_map(|(_, _, p)| p.iter().map(Vec::len))
                .sum(),
            LedgerWrite::SaveMarkDelete {
                individually_deleted,
                ..
            } => individually_deleted.len() * 32,
            LedgerWrite::SaveDeletionState { chunks, .. } => chunks.iter().map(Vec::len).sum(),
        }
    }

    /// Applies the write through `store`'s blocking methods (one atomic
    /// write each).
    ///
    /// # Blocking
    /// Blocks for the store's write (an fsync on a durable store).
    ///
    /// # Errors
    /// The store's typed error; nothing is written.
    pub fn apply_to<S: LedgerStore + ?Sized>(&self, store: &S) -> Result<(), StoreError> {
        match self {
            LedgerWrite::Append { name, segments } => {
                let payloads: Vec<Vec<&[u8]>> = segments
                    .iter()
                    .map(|(_, _, p)| p.iter().map(Vec::as_slice).collect())
                    .collect();
                let segs: Vec<AppendSegment<'_>> = segments
                    .iter()
                    .zip(&payloads)
                    .map(|((l, f, _), p)| AppendSegment {
                        ledger_id: *l,
                        first_entry_id: *f,
                        payloads: p,
                    })
                    .collect();
                store.append(name, &segs)
            }
            LedgerWrite::SaveMarkDelete {
                name,
                cursor,
                mark_delete,
                individually_deleted,
            } => store.save_mark_delete(name, cursor, *mark_delete, individually_deleted),
            LedgerWrite::SaveDeletionState {
                name,
                cursor,
                mark_delete,
                chunks,
                property_updates,
            } => {
                let props: Vec<(&str, Option<i64>)> = property_updates
                    .iter()
                    .map(|(k, v)| (k.as_str(), *v))
                    .collect();
                store.save_deletion_state(name, cursor, *mark_delete, chunks, &props)
            }
        }
    }

    /// Applies the write inside `txn` (the group committer's batch): the
    /// same table writes as [`RedbStore`]'s blocking methods.
    pub(super) fn apply_in(&self, txn: &WriteTransaction) -> Result<(), StoreError> {
        match self {
            LedgerWrite::Append { name, segments } => {
                let payloads: Vec<Vec<&[u8]>> = segments
                    .iter()
                    .map(|(_, _, p)| p.iter().map(Vec::as_slice).collect())
                    .collect();
                let segs: Vec<AppendSegment<'_>> = segments
                    .iter()
                    .zip(&payloads)
                    .map(|((l, f, _), p)| AppendSegment {
                        ledger_id: *l,
                        first_entry_id: *f,
                        payloads: p,
                    })
                    .collect();
                RedbStore::append_in(txn, name, &segs)
            }
            LedgerWrite::SaveMarkDelete {
                name,
                cursor,
                mark_delete,
                individually_deleted,
            } => RedbStore::save_mark_delete_in(
                txn,
                name,
                cursor,
                *mark_delete,
                individually_deleted,
            ),
            LedgerWrite::SaveDeletionState {
                name,
                cursor,
                mark_delete,
                chunks,
                property_updates,
            } => {
                let props: Vec<(&str, Option<i64>)> = property_updates
                    .iter()
                    .map(|(k, v)| (k.as_str(), *v))
                    .collect();
                RedbStore::save_deletion_state_in(txn, name, cursor, *mark_delete, chunks, &props)
            }
        }
    }
}

/// An admission check of a [`PendingWrite`] (run by the store writer just
/// before the write's transaction begins).
pub type Admit = Box<dyn FnMut() -> Result<(), StoreError> + Send>;
/// The completion of a [`PendingWrite`]: its outcome, after its commit.
pub type WriteDone = Box<dyn FnOnce(Result<(), StoreError>) + Send>;

/// A [`LedgerWrite`] with its completion, for
/// [`LedgerStore::submit`](super::LedgerStore::submit).
pub struct PendingWrite {
    write: LedgerWrite,
    admit: Admit,
    done: WriteDone,
}

impl PendingWrite {
    /// `write`, whose outcome goes to `done` once it is durable (or failed).
    pub fn new(
        write: LedgerWrite,
        done: impl FnOnce(Result<(), StoreError>) + Send + 'static,
    ) -> Self {
        Self {
            write,
            admit: Box::new(|| Ok(())),
            done: Box::new(done),
        }
    }

    /// Adds an admission check: run by the store writer right before the
    /// write's transaction begins; `Err` refuses the write (nothing of it
    /// is written; `done` gets the error).
    pub fn with_admit(
        mut self,
        admit: impl FnMut() -> Result<(), StoreError> + Send + 'static,
    ) -> Self {
        self.admit = Box::new(admit);
        self
    }

    /// The write, its admission check and its completion.
    pub fn into_parts(self) -> (LedgerWrite, Admit, WriteDone) {
        (self.write, self.admit, self.done)
    }
}

impl fmt::Debug for PendingWrite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PendingWrite")
            .field("write", &self.write)
            .finish_non_exhaustive()
    }
}

/// The [`CommitBackend`] of a [`RedbStore`]: one redb write transaction per
/// batch, with the store's [`SyncMode`] (`Immediate`: the commit returns
/// after its fsync).
pub struct RedbCommitBackend {
    db: Arc<Database>,
    mode: SyncMode,
}

impl RedbCommitBackend {
    pub(super) fn new(db: Arc<Database>, mode: SyncMode) -> Self {
        Self { db, mode }
    }
}

impl fmt::Debug for RedbCommitBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedbCommitBackend")
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl CommitBackend for RedbCommitBackend {
    type Txn = WriteTransaction;

    fn begin(&mut self) -> Result<WriteTransaction, StoreError> {
        begin_write(&self.db, self.mode)
    }

    fn commit(&mut self, txn: WriteTransaction) -> Result<(), StoreError> {
        contained("commit", || Ok(txn.commit()?))
    }
}
