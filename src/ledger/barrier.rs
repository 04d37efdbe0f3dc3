//! One fsync for the durable writes of a turn: [`RedbStore`] commits
//! deferred to a barrier.
//!
//! While deferral is on ([`RedbStore::defer_to_barrier`]), every write
//! transaction begun through [`RedbStore::begin`] (every write of the
//! store's own methods, of every clone of the store: ledger appends,
//! cursor persists, pending-ack log appends, the transaction log, delayed
//! snapshots) commits with redb's `Durability::None`: atomic and visible at
//! once, but not fsynced. [`RedbStore::commit_barrier`] then makes every
//! one of them durable with ONE fsynced commit (BookKeeper's journal: one
//! fsync for every add that arrived meanwhile).
//!
//! What a crash keeps: redb reopens at its last durable commit, and commits
//! are ordered, so a crash before the barrier's fsync completes loses every
//! write since the previous barrier and keeps everything before it — a
//! prefix of the commits, never a later write without an earlier one (a
//! transaction's commit marker is never durable without the entries it
//! commits, a pending-ack commit never without the ack log append before
//! it). A caller must therefore hold every completion (reply) of a deferred
//! write until its barrier returned `Ok` (the broker core does: nothing
//! leaves [`crate::broker::Broker::poll_output`] before its turn's barrier).
//!
//! A failed barrier: redb refuses every later write after an I/O failure
//! of a commit (`PreviousIo`) until the database is reopened, and the
//! reopened database holds the state before the first deferred write
//! since the previous barrier. So a failed barrier means the process must
//! reopen the store; what it answered (nothing of the failed batch as a
//! success) stays true.
//!
//! With [`SyncMode::Deferred`] nothing changes: its commits are never
//! fsynced one by one, and the barrier is a no-op.

use redb::WriteTransaction;

use super::error::StoreError;
use super::store::{contained, RedbStore, SyncMode};

/// The deferral switch and counters one store's clones share.
#[derive(Debug, Default)]
pub(crate) struct BarrierState {
    /// Whether [`RedbStore::begin`] defers its transaction's fsync.
    deferring: bool,
    /// Transactions begun deferred since the last barrier.
    pending: u64,
    /// Transactions begun with an fsynced commit, plus barriers committed.
    durable: u64,
}

impl RedbStore {
    /// The sync mode of a transaction begun now (and counts it).
    pub(super) fn begin_mode(&self) -> SyncMode {
        let mut b = self.barrier.lock();
        if self.sync_mode() == SyncMode::Immediate && b.deferring {
            b.pending += 1;
            SyncMode::Deferred
        } else {
            if self.sync_mode() == SyncMode::Immediate {
                b.durable += 1;
            }
            self.sync_mode()
        }
    }

    /// Turns deferral of commits to a barrier on or off (see the module
    /// docs of `ledger::barrier`), for this store and every clone of it.
    /// Turning it off does not make deferred commits durable: call
    /// [`RedbStore::commit_barrier`].
    ///
    /// # Blocking
    /// Never blocks on I/O.
    pub fn defer_to_barrier(&self, on: bool) {
        self.barrier.lock().deferring = on;
    }

    /// Whether commits are deferred to a barrier now.
    pub fn defers_to_barrier(&self) -> bool {
        self.barrier.lock().deferring
    }

    /// Makes every commit deferred since the last barrier durable with one
    /// fsynced commit; `Ok(false)` (and no I/O) when there is none.
    ///
    /// # Errors
    /// [`StoreError::Backend`] when the commit or its fsync fails: none of
    /// the deferred commits may be reported durable, and redb refuses later
    /// writes until the database is reopened (at its last durable commit).
    ///
    /// # Blocking
    /// Yes: one fsynced commit on the calling thread when there is
    /// something to make durable (waits for any write transaction in
    /// progress, the group committer's included).
    pub fn commit_barrier(&self) -> Result<bool, StoreError> {
        if self.barrier.lock().pending == 0 {
            return Ok(false);
        }
        contained("commit_barrier", || {
            let txn: WriteTransaction = self.database().begin_write()?;
            txn.commit()?;
            Ok(())
        })?;
        self.barrier_synced();
        Ok(true)
    }

    /// A durable commit made every earlier one durable.
    pub(super) fn barrier_synced(&self) {
        let mut b = self.barrier.lock();
        b.pending = 0;
        b.durable += 1;
    }

    /// Commits begun deferred since the last barrier.
    pub fn deferred_commits(&self) -> u64 {
        self.barrier.lock().pending
    }

    /// Fsynced commits this store (and its clones) began through
    /// [`RedbStore::begin`], plus barriers committed: the store's durable
    /// writes, each one fsync (the file's growth may add some).
    pub fn durable_commits(&self) -> u64 {
        self.barrier.lock().durable
    }
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests {
    use super::*;
    use crate::ledger::AppendSegment;
    use crate::ledger::LedgerStore;

    fn seg<'a>(first: i64, p: &'a [&'a [u8]]) -> [AppendSegment<'a>; 1] {
        [AppendSegment {
            ledger_id: 1,
            first_entry_id: first,
            payloads: p,
        }]
    }

    /// Deferred commits are visible at once and cost one durable commit
    /// together; without deferral each append is one.
    #[test]
    fn deferred_commits_share_one_durable_barrier() {
        let dir = tempfile::tempdir().unwrap();
        let s = RedbStore::open(dir.path().join("b.redb")).unwrap();
        s.create_ledger("ml", 1).unwrap();
        let base = s.durable_commits();
        for i in 0..3 {
            s.append("ml", &seg(i, &[b"x"])).unwrap();
        }
        assert_eq!(s.durable_commits() - base, 3, "one fsync per append");
        let clone = s.clone();
        clone.defer_to_barrier(true);
        assert!(s.defers_to_barrier(), "clones share the switch");
        let base = s.durable_commits();
        for i in 3..6 {
            s.append("ml", &seg(i, &[b"y"])).unwrap();
        }
        assert_eq!(s.deferred_commits(), 3);
        assert_eq!(s.durable_commits(), base, "no fsync before the barrier");
        assert_eq!(s.read("ml", 1, 0, 5).unwrap().len(), 6, "visible at once");
        assert!(s.commit_barrier().unwrap());
        assert_eq!(s.durable_commits() - base, 1, "one fsync for the batch");
        assert!(!s.commit_barrier().unwrap(), "nothing deferred: no I/O");
    }
}
