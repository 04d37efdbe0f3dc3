//! The non-blocking forms of the managed ledger's and cursor's durable
//! writes: each returns a [`Completion`] at once and completes it after
//! the write is durable, through [`LedgerStore::submit`](super::LedgerStore::submit)
//! (on a [`RedbStore`](super::RedbStore), the store's group committer:
//! writes that arrive while a commit is in flight share the next
//! transaction and its one fsync).
//!
//! | blocking | non-blocking |
//! |---|---|
//! | [`ManagedLedger::append`] | [`ManagedLedger::append_async`] |
//! | [`ManagedLedger::append_batch`] | [`ManagedLedger::append_batch_async`] |
//! | [`ManagedCursor::persist_deletion_state`] | [`ManagedCursor::persist_deletion_state_async`] |
//! | [`ManagedCursor::mark_delete`] | [`ManagedCursor::mark_delete_async`] |
//!
//! State: the in-memory state (entries readable, last confirmed entry, the
//! cursor's mark-delete) changes only in a successful completion, on the
//! completing thread, just before the caller's completion fires; a failed
//! write changes nothing. Positions are planned at submission (so
//! `append_async` returns in order), in-flight appends are not readable.
//! If an append fails, every append of the same managed ledger queued
//! behind it (planned on top of its positions) fails too, with
//! [`LedgerError::Store`], before anything of it is written; appends
//! submitted after the failure plan from the last durable entry again.
//!
//! Mixing: a blocking call made while non-blocking writes of the same
//! ledger (appends) or cursor (persists) are queued goes through the same
//! queue and waits, so the store sees every write in call order.

use std::sync::Arc;

use super::completion::{completion_pair, Completion};
use super::cursor::{ManagedCursor, PersistedDeletionState};
use super::error::{LedgerError, StoreError};
use super::managed_ledger::{plan_segments, ManagedLedger};
use super::store::StoredLedgerInfo;
use super::store_write::{LedgerWrite, PendingWrite};
use crate::deletion::{compact, CursorDeletionState, DeletionSnapshot};
use crate::position::Position;
use crate::sync::Ordering;

/// A managed ledger's appends queued and not yet durable.
#[derive(Debug, Default)]
pub(super) struct AppendsInFlight {
    /// How many.
    pub(super) count: u64,
    /// Bumped by a failed append: queued appends of an older generation
    /// were planned on top of it and are refused.
    pub(super) generation: u64,
    /// The ledger tail after the last planned append, while `count > 0`
    /// (`None` after a failure: plan from the durable tail).
    pub(super) tail: Option<(i64, StoredLedgerInfo)>,
}

/// A cursor's persists queued and not yet durable.
#[derive(Debug, Default)]
pub(super) struct PersistsInFlight {
    /// How many.
    pub(super) count: u64,
    /// The mark-delete of the last one queued (a later one may not be
    /// below it).
    pub(super) mark_delete: Option<Position>,
}

fn writer_stopped() -> LedgerError {
    LedgerError::Store(StoreError::Backend(
        "the write did not complete: its store writer stopped, or it was waited for on the store writer thread"
            .into(),
    ))
}

impl ManagedLedger {
    /// Non-blocking [`ManagedLedger::append`]: returns at once; the
    /// completion gets the entry's position once it is durable.
    ///
    /// # Blocking
    /// Never blocks on I/O with a [`RedbStore`](super::RedbStore) (it
    /// takes the ledger's lock to plan the position and queues the write).
    /// With a store whose [`LedgerStore::submit`](super::LedgerStore::submit)
    /// is the default (e.g. [`MemoryStore`](super::MemoryStore)) the write
    /// happens on the calling thread.
    pub fn append_async(&self, data: Vec<u8>) -> Completion<Position, LedgerError> {
        let (completion, completer) = completion_pair(writer_stopped);
        self.append_batch_async(vec![data])
            .on_complete(move |r| completer.complete(r.map(|mut v| v.remove(0))));
        completion
    }

    /// Non-blocking [`ManagedLedger::append_batch`]: the positions are
    /// planned now, the batch is stored in ONE atomic write (shared with
    /// the other writes of its group commit), and the completion gets the
    /// positions once it is durable; on error nothing of the batch is
    /// stored and the ledger is unchanged.
    ///
    /// # Blocking
    /// As [`ManagedLedger::append_async`].
    ///
    /// # Errors
    /// Through the completion: [`LedgerError::Fenced`];
    /// [`LedgerError::Store`] if the store fails, or an append queued
    /// before this one failed.
    pub fn append_batch_async(
        &self,
        payloads: Vec<Vec<u8>>,
    ) -> Completion<Vec<Position>, LedgerError> {
        if self.fenced.load(Ordering::Acquire) {
            return Completion::ready(Err(LedgerError::Fenced {
                ledger: self.name.clone(),
            }));
        }
        if payloads.is_empty() {
            return Completion::ready(Ok(Vec::new()));
        }
        self.append_batch_queued(payloads)
    }

    /// Plans `payloads` behind every queued append and queues them.
    pub(super) fn append_batch_queued(
        &self,
        payloads: Vec<Vec<u8>>,
    ) -> Completion<Vec<Position>, LedgerError> {
        let (completion, completer) = completion_pair(writer_stopped);
        let order = self.submit_order.lock();
        // Backpressure before any position is planned: a refused batch
        // leaves the ledger and the appends queued before it untouched.
        let bytes = payloads.iter().map(Vec::len).sum();
        if let Err(e) = self.store.write_capacity(bytes) {
            return Completion::ready(Err(LedgerError::Store(e)));
        }
        let (plan, generation) = {
            let mut st = self.state.lock();
            let tail = match st.in_flight.tail {
                Some(t) if st.in_flight.count > 0 => t,
                _ => st.current(),
            };
            let (plan, new_tail) =
                plan_segments(tail, self.config.max_entries_per_ledger, payloads.len());
            st.in_flight.count += 1;
            st.in_flight.tail = Some(new_tail);
            (plan, st.in_flight.generation)
        };
        let mut rest = payloads.into_iter();
        let segments: Vec<(i64, i64, Vec<Vec<u8>>)> = plan
            .iter()
            .map(|&(id, first, n)| (id, first, rest.by_ref().take(n).collect()))
            .collect();
        let seg_bytes: Vec<u64> = segments
            .iter()
            .map(|(_, _, p)| p.iter().map(|e| e.len() as u64).sum())
            .collect();
        let write = LedgerWrite::Append {
            name: self.name.clone(),
            segments,
        };
        let admit_state = Arc::clone(&self.state);
        let done_state = Arc::clone(&self.state);
        let name = self.name.clone();
        let pending = PendingWrite::new(write, move |outcome: Result<(), StoreError>| {
            let mut st = done_state.lock();
            st.in_flight.count -= 1;
            match outcome {
                Ok(()) => {
                    let mut out = Vec::new();
                    for (&(id, first, n), bytes) in plan.iter().zip(&seg_bytes) {
                        let n = n as i64;
                        out.extend((0..n).map(|i| Position::new(id, first + i)));
                        let info = st.ledgers.entry(id).or_default();
                        info.entries = info.entries.max(first + n);
                        info.size_bytes += bytes;
                    }
                    if st.in_flight.count == 0 {
                        st.in_flight.tail = None;
                    }
                    drop(st);
                    crate::trace::ledger_cursor::append_entries(&name, &out);
                    completer.complete(Ok(out));
                }
                Err(e) => {
                    if st.in_flight.generation == generation {
                        st.in_flight.generation += 1;
                        st.in_flight.tail = None;
                    }
                    drop(st);
                    completer.complete(Err(LedgerError::Store(e)));
                }
            }
        })
        .with_admit(move || {
            if admit_state.lock().in_flight.generation == generation {
                Ok(())
            } else {
                Err(StoreError::Backend(
                    "an append queued before this one failed; nothing of this one was written"
                        .into(),
                ))
            }
        });
        self.store.submit(pending);
        drop(order);
        completion
    }
}

impl ManagedCursor {
    /// Non-blocking [`ManagedCursor::persist_deletion_state`]: the state is
    /// snapshotted and checked now; the completion gets what was written
    /// once it is durable. The cursor's mark-delete (and read position)
    /// move only then; on error nothing changes.
    ///
    /// # Blocking
    /// Never blocks on I/O with a [`RedbStore`](super::RedbStore): it takes
    /// the deletion state's read lock for the snapshot, encodes it, and
    /// queues the write. With a default-`submit` store the write happens on
    /// the calling thread.
    ///
    /// # Errors
    /// Through the completion: as
    /// [`ManagedCursor::persist_deletion_state`] (checked against the last
    /// queued persist's mark-delete, so a later persist may not go below
    /// an earlier one still in flight).
    pub fn persist_deletion_state_async(
        &self,
        state: &CursorDeletionState,
        property_updates: Vec<(String, Option<i64>)>,
    ) -> Completion<PersistedDeletionState, LedgerError> {
        self.persist_snapshot_queued(
            state.snapshot(),
            property_updates,
            compact::DEFAULT_CHUNK_BYTES,
            false,
        )
    }

    /// Queues a checked deletion-state snapshot behind every queued persist.
    pub(super) fn persist_snapshot_queued(
        &self,
        snapshot: DeletionSnapshot,
        property_updates: Vec<(String, Option<i64>)>,
        chunk_bytes: usize,
        reset: bool,
    ) -> Completion<PersistedDeletionState, LedgerError> {
        let order = self.submit_order.lock();
        if let Err(e) = self.write_capacity() {
            return Completion::ready(Err(e));
        }
        let md = snapshot.mark_delete;
        {
            let mut cursor = match self.live() {
                Ok(c) => c,
                Err(e) => return Completion::ready(Err(e)),
            };
            let floor = cursor.in_flight.mark_delete.unwrap_or(cursor.mark_delete);
            if let Err(e) = self.check_deletion_snapshot(&snapshot, floor, reset) {
                return Completion::ready(Err(e));
            }
            cursor.in_flight.count += 1;
            cursor.in_flight.mark_delete = Some(md);
        }
        let chunks = compact::encode(&snapshot, chunk_bytes);
        let persisted = PersistedDeletionState {
            mark_delete: md,
            deleted_entries: snapshot.deleted_entries(),
            batch_entries: snapshot.batch_ack_sets.len(),
            bytes: chunks.iter().map(Vec::len).sum(),
            chunks: chunks.len(),
        };
        let ranges: Vec<(Position, Position)> = snapshot.ranges().collect();
        let write = LedgerWrite::SaveDeletionState {
            name: self.ledger.name.clone(),
            cursor: self.name.clone(),
            mark_delete: md,
            chunks,
            property_updates,
        };
        let (ml, name) = (self.ledger.name.clone(), self.name.clone());
        let completion = self.queue_persist(write, md, false, move |cursor, ledger| {
            if reset {
                cursor.read_position = ledger.next_valid_position(md);
                crate::trace::ledger_cursor::reset(&ml, &name, md, cursor.read_position);
            } else if cursor.read_position <= md {
                cursor.read_position = ledger.next_valid_position(md);
            }
            cursor.individually_deleted.clear();
            (persisted, ranges)
        });
        drop(order);
        completion
    }

    /// Non-blocking [`ManagedCursor::mark_delete`] (no individually deleted
    /// ranges): checked now, persisted through the store writer; the
    /// cursor's mark-delete moves once it is durable.
    ///
    /// # Blocking
    /// As [`ManagedCursor::persist_deletion_state_async`].
    ///
    /// # Errors
    /// Through the completion: as [`ManagedCursor::mark_delete`] (checked
    /// against the last queued persist's mark-delete).
    pub fn mark_delete_async(&self, position: Position) -> Completion<(), LedgerError> {
        self.mark_delete_with_ranges_queued(position, Vec::new())
    }

    /// Checks and queues a mark-delete with its individually deleted
    /// ranges behind every queued persist.
    pub(super) fn mark_delete_with_ranges_queued(
        &self,
        position: Position,
        individually_deleted: Vec<(Position, Position)>,
    ) -> Completion<(), LedgerError> {
        let order = self.submit_order.lock();
        if let Err(e) = self.write_capacity() {
            return Completion::ready(Err(e));
        }
        {
            let mut cursor = match self.live() {
                Ok(c) => c,
                Err(e) => return Completion::ready(Err(e)),
            };
            let floor = cursor.in_flight.mark_delete.unwrap_or(cursor.mark_delete);
            if position < floor {
                return Completion::ready(Err(LedgerError::MarkDeleteBackward {
                    current: floor,
                    requested: position,
                }));
            }
            let checked = {
                let st = self.ledger.state.lock();
                st.check_mark_delete_position(position)
                    .and_then(|()| st.check_deleted_ranges(position, &individually_deleted))
            };
            if let Err(e) = checked {
                return Completion::ready(Err(e));
            }
            cursor.in_flight.count += 1;
            cursor.in_flight.mark_delete = Some(position);
        }
        let write = LedgerWrite::SaveMarkDelete {
            name: self.ledger.name.clone(),
            cursor: self.name.clone(),
            mark_delete: position,
            individually_deleted: individually_deleted.clone(),
        };
        let completion = self.queue_persist(write, position, true, move |cursor, ledger| {
            if cursor.read_position <= position {
                cursor.read_position = ledger.next_valid_position(position);
            }
            cursor.individually_deleted = individually_deleted.clone();
            ((), individually_deleted)
        });
        drop(order);
        completion
    }

    /// Queues [`ManagedCursor::reset`]'s write (mark-delete `md`, no
    /// ranges) behind every queued persist; the read position becomes
    /// `read` once it is durable.
    pub(super) fn reset_queued(&self, md: Position, read: Position) -> Completion<(), LedgerError> {
        let order = self.submit_order.lock();
        if let Err(e) = self.write_capacity() {
            return Completion::ready(Err(e));
        }
        {
            let mut cursor = match self.live() {
                Ok(c) => c,
                Err(e) => return Completion::ready(Err(e)),
            };
            cursor.in_flight.count += 1;
            cursor.in_flight.mark_delete = Some(md);
        }
        let write = LedgerWrite::SaveMarkDelete {
            name: self.ledger.name.clone(),
            cursor: self.name.clone(),
            mark_delete: md,
            individually_deleted: Vec::new(),
        };
        let completion = self.queue_persist(write, md, false, move |cursor, _| {
            cursor.individually_deleted.clear();
            cursor.read_position = read;
            ((), Vec::new())
        });
        drop(order);
        completion
    }

    /// Backpressure for a cursor write, checked before it is counted in
    /// `in_flight` (a refused persist changes nothing): the store's
    /// [`LedgerStore::write_capacity`](super::LedgerStore::write_capacity);
    /// a non-durable cursor writes nothing and is never refused.
    fn write_capacity(&self) -> Result<(), LedgerError> {
        if self.durable {
            self.ledger
                .store
                .write_capacity(0)
                .map_err(LedgerError::Store)
        } else {
            Ok(())
        }
    }

    /// Submits a cursor write counted in `in_flight`; on success moves the
    /// mark-delete to `md` and runs `on_durable` (the read position, the
    /// ranges) under the cursor's lock, before the caller's completion
    /// (trace: a deletion `Persist` line, and with `trace_mark_delete` a
    /// cursor `MarkDelete` line, as the blocking forms record).
    fn queue_persist<T: Send + 'static>(
        &self,
        write: LedgerWrite,
        md: Position,
        trace_mark_delete: bool,
        on_durable: impl FnOnce(
                &mut super::cursor::CursorState,
                &ManagedLedger,
            ) -> (T, Vec<(Position, Position)>)
            + Send
            + 'static,
    ) -> Completion<T, LedgerError> {
        let (completion, completer) = completion_pair(writer_stopped);
        let state = Arc::clone(&self.state);
        let ledger = Arc::clone(&self.ledger);
        let name = self.name.clone();
        let pending = PendingWrite::new(write, move |outcome: Result<(), StoreError>| {
            let mut cursor = state.lock();
            cursor.in_flight.count -= 1;
            if cursor.in_flight.count == 0 {
                cursor.in_flight.mark_delete = None;
            }
            match outcome {
                Ok(()) => {
                    cursor.mark_delete = md;
                    let (value, ranges) = on_durable(&mut cursor, &ledger);
                    let read = cursor.read_position;
                    drop(cursor);
                    crate::trace::deletion::persist(&ledger.name, &name, md, ranges);
                    if trace_mark_delete {
                        crate::trace::ledger_cursor::mark_delete(&ledger.name, &name, md, read);
                    }
                    completer.complete(Ok(value));
                }
                Err(e) => {
                    drop(cursor);
                    completer.complete(Err(LedgerError::Store(e)));
                }
            }
        });
        if self.durable {
            self.ledger.store.submit(pending);
        } else {
            // A non-durable cursor (a reader's) writes nothing: the state
            // moves at once.
            let (_, _, done) = pending.into_parts();
            done(Ok(()));
        }
        completion
    }
}
