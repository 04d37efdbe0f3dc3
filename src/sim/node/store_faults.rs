//! The node engine's storage faults, in the store under the core (never in
//! the core): a [`LedgerStore`] over the run's [`RedbStore`] that the core's
//! managed ledgers (topics, pending-ack logs) read through
//! ([`crate::broker::Broker::with_ledger_store`]). The core sees only the
//! store's typed errors, as it would see BookKeeper's:
//!
//! - **read outages** (`faults.read_outages`, `outage_ms`): while an outage
//!   window is open every entry read fails with
//!   [`StoreError::Unavailable`] (BookKeeper's bookies unavailable), which
//!   the managed ledger reports as `StorageUnavailable`: the dispatcher
//!   waits for its read backoff (`broker::read_backoff`), a transaction
//!   buffer recovery or a pending-ack replay is retried with its backoff.
//! - **pending-ack replay read failures** (`faults.replay_read_failures`):
//!   at each of the first N restarts, the pending-ack logs' bookies fail
//!   for a window of [`REPLAY_FAILURE_WINDOW_MS`] of virtual time, from the
//!   1st or 2nd read of a pending-ack log after that restart (the 2nd:
//!   after entries were read, not yet applied): every read of a
//!   pending-ack log in the window fails with a transient failure, unavailable or
//!   throttled (`TooManyRequests`), drawn from the seed. Each attempt
//!   fails, drops what it read, and the handle retries after its backoff
//!   (100 ms doubling) until the window closes; a retry without the
//!   backoff, or a failure that does not end the attempt, spins in the
//!   core and is named by the livelock watchdog. The completing shapes
//!   (non-recoverable data, fenced, closed cursor) are not store errors
//!   here: `faults.lose_pending_ack_ledger` is the non-recoverable one.
//! - **a lost pending-ack ledger** (`faults.lose_pending_ack_ledger`): at
//!   the first restart, before the new core opens, the ledger of each
//!   subscription's pending-ack log holding the first record its replay
//!   needs is deleted from the store ([`LedgerStore::mark_ledger_lost`], a
//!   deleted BookKeeper ledger): with `pending_ack_auto_skip` the replay
//!   skips it, without it the replay gives up and the operator turns
//!   auto-skip on and reloads the broker `operator_auto_skip_after_ms` later.
//!   The transactions that had a record there ([`lost_ledger_txns`]) are
//!   told to the checker: what they acknowledged before the loss may be
//!   neither held nor applied at their commit.

use std::collections::{BTreeMap, BTreeSet};
// Ownership handles use std's Arc in every build (see `ledger::managed_ledger`).
use std::sync::Arc;

use crate::broker::txn::TxnId;
use crate::ledger::{
    AppendSegment, LedgerStore, RedbStore, StoreError, StoredCursor, StoredLedger,
};
use crate::pending_ack::decode_entry;
use crate::position::Position;
use crate::sync::Mutex;

/// The pending-ack log's managed-ledger name suffix and cursor (the core's).
const PENDING_ACK_SUFFIX: &str = "__transaction_pending_ack";
const PENDING_ACK_CURSOR: &str = "__pending_ack_state";

/// How long the pending-ack logs' reads fail once the first of them failed
/// after a restart with replay read failures, virtual ms.
pub(super) const REPLAY_FAILURE_WINDOW_MS: u64 = 2_000;

/// Reads of one pending-ack log since the window opened.
#[derive(Debug, Clone, Copy)]
struct ReplayFault {
    reads: u32,
}

/// What the store fails, shared by the driver and every core's store.
#[derive(Debug, Default)]
pub(super) struct StorePlan {
    /// An outage window is open: every entry read fails.
    pub(super) outage: bool,
    /// Reads of each pending-ack log while the window is open.
    replay: BTreeMap<String, ReplayFault>,
    /// The window of pending-ack read failures: from which read of a log
    /// they begin (1-based) and whether they are throttling.
    replay_draw: Option<(u32, bool)>,
    /// The window's end (virtual ms), set by its first failure.
    replay_until: Option<u64>,
    /// The driver's virtual time, ms.
    pub(super) now_ms: u64,
    /// Entry reads failed by outages.
    pub(super) outage_failures: u64,
    /// Pending-ack log reads failed by the armed replay faults.
    pub(super) replay_failures: u64,
}

impl StorePlan {
    /// Opens the window of pending-ack read failures: from its
    /// `fail_from`-th read on, every read of a pending-ack log fails,
    /// throttled or unavailable.
    pub(super) fn arm_replay_failure(&mut self, fail_from: u32, throttled: bool) {
        self.replay.clear();
        self.replay_draw = Some((fail_from, throttled));
        self.replay_until = None;
    }

    /// Closes the window: no further failure.
    pub(super) fn disarm_replay_failure(&mut self) {
        self.replay.clear();
        self.replay_draw = None;
        self.replay_until = None;
    }

    /// The failure of a read of `name`, if one is due.
    fn read_fault(&mut self, name: &str) -> Option<StoreError> {
        if self.outage {
            self.outage_failures += 1;
            return Some(StoreError::Unavailable(
                "injected: bookies unavailable (read outage)".into(),
            ));
        }
        if !name.ends_with(PENDING_ACK_SUFFIX) {
            return None;
        }
        let (fail_from, throttled) = self.replay_draw?;
        let f = self
            .replay
            .entry(name.to_string())
            .or_insert(ReplayFault { reads: 0 });
        f.reads += 1;
        if f.reads < fail_from {
            return None;
        }
        let until = *self
            .replay_until
            .get_or_insert(self.now_ms + REPLAY_FAILURE_WINDOW_MS);
        if self.now_ms >= until {
            self.disarm_replay_failure();
            return None;
        }
        self.replay_failures += 1;
        Some(if throttled {
            StoreError::Throttled("injected: pending-ack log read throttled".into())
        } else {
            StoreError::Unavailable("injected: pending-ack log read failed".into())
        })
    }
}

pub(super) type SharedPlan = Arc<Mutex<StorePlan>>;

/// The [`LedgerStore`] the node engine gives each core: `inner` with the
/// plan's failures on entry reads; every other operation as `inner`.
#[derive(Debug)]
pub(super) struct FaultyLedgerStore {
    inner: RedbStore,
    plan: SharedPlan,
}

impl FaultyLedgerStore {
    pub(super) fn new(inner: RedbStore, plan: SharedPlan) -> Self {
        Self { inner, plan }
    }
}

impl LedgerStore for FaultyLedgerStore {
    fn load_ledger(&self, name: &str) -> Result<StoredLedger, StoreError> {
        self.inner.load_ledger(name)
    }

    fn create_ledger(&self, name: &str, ledger_id: i64) -> Result<(), StoreError> {
        self.inner.create_ledger(name, ledger_id)
    }

    fn append(&self, name: &str, segments: &[AppendSegment<'_>]) -> Result<(), StoreError> {
        self.inner.append(name, segments)
    }

    fn read(
        &self,
        name: &str,
        ledger_id: i64,
        first: i64,
        last: i64,
    ) -> Result<Vec<(i64, Vec<u8>)>, StoreError> {
        if let Some(e) = self.plan.lock().read_fault(name) {
            return Err(e);
        }
        self.inner.read(name, ledger_id, first, last)
    }

    fn mark_ledger_lost(&self, name: &str, ledger_id: i64) -> Result<(), StoreError> {
        self.inner.mark_ledger_lost(name, ledger_id)
    }

    fn delete_ledgers(&self, name: &str, ledger_ids: &[i64]) -> Result<(), StoreError> {
        self.inner.delete_ledgers(name, ledger_ids)
    }

    fn load_cursor(&self, name: &str, cursor: &str) -> Result<Option<StoredCursor>, StoreError> {
        self.inner.load_cursor(name, cursor)
    }

    fn save_mark_delete(
        &self,
        name: &str,
        cursor: &str,
        mark_delete: Position,
        individually_deleted: &[(Position, Position)],
    ) -> Result<(), StoreError> {
        self.inner
            .save_mark_delete(name, cursor, mark_delete, individually_deleted)
    }

    fn set_cursor_property(
        &self,
        name: &str,
        cursor: &str,
        key: &str,
        value: Option<i64>,
    ) -> Result<(), StoreError> {
        self.inner.set_cursor_property(name, cursor, key, value)
    }

    fn list_cursors(&self, name: &str) -> Result<Vec<String>, StoreError> {
        self.inner.list_cursors(name)
    }

    fn save_deletion_state(
        &self,
        name: &str,
        cursor: &str,
        mark_delete: Position,
        chunks: &[Vec<u8>],
        property_updates: &[(&str, Option<i64>)],
    ) -> Result<(), StoreError> {
        self.inner
            .save_deletion_state(name, cursor, mark_delete, chunks, property_updates)
    }

    fn load_deletion_state(
        &self,
        name: &str,
        cursor: &str,
    ) -> Result<Option<Vec<Vec<u8>>>, StoreError> {
        self.inner.load_deletion_state(name, cursor)
    }
}

/// The pending-ack log of subscription `sub` of `topic` (the core's name).
pub(super) fn pending_ack_log(topic: &str, sub: &str) -> String {
    format!("{topic}-{sub}{PENDING_ACK_SUFFIX}")
}

/// Deletes the ledger of pending-ack log `log` holding the first record
/// its next replay needs (the first entry after its cursor's mark-delete),
/// if it has one, and returns the transactions with a record in it.
///
/// # Errors
/// The store's.
pub(super) fn lose_first_needed_ledger(
    store: &RedbStore,
    log: &str,
) -> Result<Option<(i64, BTreeSet<TxnId>)>, StoreError> {
    let ledgers = store.load_ledger(log)?;
    let mark_delete = store
        .load_cursor(log, PENDING_ACK_CURSOR)?
        .map_or(Position::new(-1, -1), |c| c.mark_delete);
    let Some((&id, info)) = ledgers.ledgers.iter().find(|(id, info)| {
        !info.lost
            && info.entries > 0
            && (**id > mark_delete.ledger_id
                || (**id == mark_delete.ledger_id && mark_delete.entry_id + 1 < info.entries))
    }) else {
        return Ok(None);
    };
    let txns = lost_ledger_txns(store, log, id, info.entries)?;
    store.mark_ledger_lost(log, id)?;
    Ok(Some((id, txns)))
}

/// The transactions with a record in ledger `id` (`entries` entries) of
/// pending-ack log `log`.
fn lost_ledger_txns(
    store: &RedbStore,
    log: &str,
    id: i64,
    entries: i64,
) -> Result<BTreeSet<TxnId>, StoreError> {
    let mut txns = BTreeSet::new();
    for (e, data) in store.read(log, id, 0, entries - 1)? {
        if let Ok(records) = decode_entry(Position::new(id, e), &data) {
            txns.extend(records.iter().map(|r| r.txn_id));
        }
    }
    Ok(txns)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, RedbStore) {
        let dir = tempfile::tempdir().unwrap();
        let s = RedbStore::open(dir.path().join("s.redb")).unwrap();
        (dir, s)
    }

    #[test]
    fn an_outage_fails_every_read_and_a_replay_failure_only_the_drawn_read_of_each_log() {
        let (_d, inner) = store();
        let log = pending_ack_log("t", "s");
        inner.create_ledger(&log, 1).unwrap();
        inner
            .append(
                &log,
                &[AppendSegment {
                    ledger_id: 1,
                    first_entry_id: 0,
                    payloads: &[b"x".as_slice()],
                }],
            )
            .unwrap();
        let plan = SharedPlan::default();
        let s = FaultyLedgerStore::new(inner, Arc::clone(&plan));
        assert!(s.read(&log, 1, 0, 0).is_ok());
        plan.lock().outage = true;
        assert!(matches!(
            s.read("t", 1, 0, 0),
            Err(StoreError::Unavailable(_))
        ));
        plan.lock().outage = false;
        plan.lock().arm_replay_failure(2, true);
        assert!(s.read(&log, 1, 0, 0).is_ok());
        assert!(matches!(
            s.read(&log, 1, 0, 0),
            Err(StoreError::Throttled(_))
        ));
        assert!(s.read(&log, 1, 0, 0).is_ok(), "one failure per arming");
        assert!(
            s.read("t", 1, 0, 0).is_ok(),
            "topics are not pending-ack logs"
        );
        let p = plan.lock();
        assert_eq!((p.outage_failures, p.replay_failures), (1, 1));
    }

    #[test]
    fn the_lost_ledger_is_the_first_one_after_the_mark_delete() {
        let (_d, s) = store();
        let log = pending_ack_log("t", "s");
        for id in 1..=3 {
            s.create_ledger(&log, id).unwrap();
            s.append(
                &log,
                &[AppendSegment {
                    ledger_id: id,
                    first_entry_id: 0,
                    payloads: &[b"not a record".as_slice(); 2],
                }],
            )
            .unwrap();
        }
        // Ledger 1 wholly consumed: ledger 2 holds the first needed record.
        s.save_mark_delete(&log, PENDING_ACK_CURSOR, Position::new(1, 1), &[])
            .unwrap();
        let (id, _) = lose_first_needed_ledger(&s, &log).unwrap().unwrap();
        assert_eq!(id, 2);
        assert!(s.load_ledger(&log).unwrap().ledgers[&2].lost);
        assert!(!s.load_ledger(&log).unwrap().ledgers[&3].lost);
        assert_eq!(lose_first_needed_ledger(&s, "none").unwrap(), None);
    }
}
