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
//! - **pending-ack entries whose data is gone**
//!   (`faults.pending_ack_entries_missing`, with auto-skip on): at the
//!   first restart at which a pending-ack log holds records after its
//!   mark-delete, the data of every entry it holds then is gone for good: a
//!   read of them returns no entry (the managed ledger's
//!   `NonRecoverableData`, one of Pulsar's completing shapes with
//!   auto-skip). Each replay that starts at or before them completes at its
//!   first read with nothing applied; one that fails the attempt instead
//!   retries with its backoff and never becomes ready. At each such start
//!   the transactions with a record after the log's mark-delete
//!   ([`txns_after_mark_delete`]) are told to the checker as having lost
//!   their acks.
//! - **the retry pace the store sees**: after a failed read of a
//!   pending-ack log, the same core reads that log again no sooner than
//!   [`MIN_REPLAY_RETRY_MS`] later (Pulsar's pending-ack backoff starts at
//!   100 ms and never returns less). A read sooner is a retry loop without
//!   backoff (the "hot loop" of a failing read): reported as a livelock,
//!   from the storage side, without reading the core's state.
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
use crate::ledger::{LedgerStore, ReadFaultStore, RedbStore, StoreError};
use crate::pending_ack::decode_entry;
use crate::position::Position;
use crate::sync::Mutex;

/// The pending-ack log's managed-ledger name suffix and cursor (the core's).
const PENDING_ACK_SUFFIX: &str = "__transaction_pending_ack";
const PENDING_ACK_CURSOR: &str = "__pending_ack_state";

/// How long the pending-ack logs' reads fail once the first of them failed
/// after a restart with replay read failures, virtual ms.
pub(super) const REPLAY_FAILURE_WINDOW_MS: u64 = 2_000;

/// The shortest pause between a failed read of a pending-ack log and the
/// next read of it by the same core, virtual ms (Pulsar's pending-ack
/// backoff: initial 100 ms, never less).
pub(super) const MIN_REPLAY_RETRY_MS: u64 = 100;

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
    /// Per pending-ack log, when the current core's last read of it failed.
    failed_at: BTreeMap<String, u64>,
    /// The first read of a pending-ack log sooner than
    /// [`MIN_REPLAY_RETRY_MS`] after a failed one (a retry without
    /// backoff), for the driver to report.
    pub(super) hot_retry: Option<String>,
    /// Per pending-ack log, the last entry whose data is gone: every entry
    /// at or below it (`faults.pending_ack_entries_missing`).
    pub(super) missing_upto: BTreeMap<String, Position>,
    /// Pending-ack log reads that returned no entry because of it.
    pub(super) missing_reads: u64,
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

    /// A new core: the retry pace is judged per core.
    pub(super) fn new_core(&mut self) {
        self.failed_at.clear();
    }

    /// The failure of a read of `name`, if one is due (and the pace of
    /// retries after failed pending-ack reads).
    fn read_fault(&mut self, name: &str) -> Option<StoreError> {
        let pending_ack = name.ends_with(PENDING_ACK_SUFFIX);
        if pending_ack {
            if let Some(t) = self.failed_at.remove(name) {
                if self.now_ms < t + MIN_REPLAY_RETRY_MS && self.hot_retry.is_none() {
                    self.hot_retry = Some(format!(
                        "pending-ack log {name} read again {} ms after a failed read (the backoff's least is {MIN_REPLAY_RETRY_MS} ms): a retry loop without backoff",
                        self.now_ms - t
                    ));
                }
            }
        }
        let e = self.fault_of(name);
        if pending_ack && e.is_some() {
            self.failed_at.insert(name.to_string(), self.now_ms);
        }
        e
    }

    /// Whether a read of `name` from (`ledger_id`, `first`) returns no
    /// entry (its data gone).
    fn entries_missing(&mut self, name: &str, ledger_id: i64, first: i64) -> bool {
        let missing = self
            .missing_upto
            .get(name)
            .is_some_and(|upto| Position::new(ledger_id, first) <= *upto);
        if missing {
            self.missing_reads += 1;
        }
        missing
    }

    fn fault_of(&mut self, name: &str) -> Option<StoreError> {
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
pub(super) type FaultyLedgerStore = ReadFaultStore<RedbStore>;

/// A [`FaultyLedgerStore`] over `inner` failing the reads `plan` names.
pub(super) fn faulty_ledger_store(inner: RedbStore, plan: SharedPlan) -> FaultyLedgerStore {
    let missing = Arc::clone(&plan);
    ReadFaultStore::new(inner, move |name| plan.lock().read_fault(name))
        .with_missing_entries(move |name, l, e| missing.lock().entries_missing(name, l, e))
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

/// The transactions with a record after the mark-delete of pending-ack
/// log `log` (what its next replay must apply) and the log's last entry.
///
/// # Errors
/// The store's.
pub(super) fn txns_after_mark_delete(
    store: &RedbStore,
    log: &str,
) -> Result<(BTreeSet<TxnId>, Option<Position>), StoreError> {
    let ledgers = store.load_ledger(log)?;
    let mark_delete = store
        .load_cursor(log, PENDING_ACK_CURSOR)?
        .map_or(Position::new(-1, -1), |c| c.mark_delete);
    let mut txns = BTreeSet::new();
    let mut last = None;
    for (&id, info) in &ledgers.ledgers {
        if info.lost || info.entries == 0 || id < mark_delete.ledger_id {
            continue;
        }
        last = Some(Position::new(id, info.entries - 1));
        let first = if id == mark_delete.ledger_id {
            mark_delete.entry_id + 1
        } else {
            0
        };
        if first >= info.entries {
            continue;
        }
        for (e, data) in store.read(log, id, first, info.entries - 1)? {
            if let Ok(records) = decode_entry(Position::new(id, e), &data) {
                txns.extend(records.iter().map(|r| r.txn_id));
            }
        }
    }
    Ok((txns, last))
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
    use crate::ledger::AppendSegment;

    fn store() -> (tempfile::TempDir, RedbStore) {
        let dir = tempfile::tempdir().unwrap();
        let s = RedbStore::open(dir.path().join("s.redb")).unwrap();
        (dir, s)
    }

    #[test]
    fn an_outage_fails_every_read_and_a_replay_window_every_pending_ack_read_in_it() {
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
        let s = faulty_ledger_store(inner, Arc::clone(&plan));
        assert!(s.read(&log, 1, 0, 0).is_ok());
        plan.lock().outage = true;
        assert!(matches!(
            s.read("t", 1, 0, 0),
            Err(StoreError::Unavailable(_))
        ));
        plan.lock().outage = false;
        plan.lock().arm_replay_failure(2, true);
        assert!(s.read(&log, 1, 0, 0).is_ok(), "the first read succeeds");
        for now in [0, 50, 1_000] {
            plan.lock().now_ms = now;
            assert!(matches!(
                s.read(&log, 1, 0, 0),
                Err(StoreError::Throttled(_))
            ));
        }
        assert!(
            s.read("t", 1, 0, 0).is_ok(),
            "topics are not pending-ack logs"
        );
        plan.lock().now_ms = REPLAY_FAILURE_WINDOW_MS;
        assert!(s.read(&log, 1, 0, 0).is_ok(), "the window closed");
        plan.lock().hot_retry = None;
        let p = plan.lock();
        assert_eq!((p.outage_failures, p.replay_failures), (1, 3));
    }

    #[test]
    fn missing_entries_are_a_short_read_of_the_pending_ack_logs_only() {
        let (_d, inner) = store();
        let log = pending_ack_log("t", "s");
        for name in [log.as_str(), "t"] {
            inner.create_ledger(name, 1).unwrap();
            inner
                .append(
                    name,
                    &[AppendSegment {
                        ledger_id: 1,
                        first_entry_id: 0,
                        payloads: &[b"x".as_slice(); 2],
                    }],
                )
                .unwrap();
        }
        let plan = SharedPlan::default();
        let s = faulty_ledger_store(inner, Arc::clone(&plan));
        assert_eq!(s.read(&log, 1, 0, 1).unwrap().len(), 2);
        plan.lock()
            .missing_upto
            .insert(log.clone(), Position::new(1, 0));
        assert!(s.read(&log, 1, 0, 1).unwrap().is_empty(), "data gone");
        assert_eq!(s.read("t", 1, 0, 1).unwrap().len(), 2, "a topic's entries");
        assert_eq!(s.read(&log, 1, 1, 1).unwrap().len(), 1, "a later entry");
        assert_eq!(plan.lock().missing_reads, 1);
    }

    #[test]
    fn the_transactions_after_the_mark_delete_are_the_ones_a_replay_needs() {
        use crate::pending_ack::{AckedPosition, PendingAckRecord};
        let (_d, s) = store();
        let log = pending_ack_log("t", "s");
        s.create_ledger(&log, 1).unwrap();
        let entries: Vec<Vec<u8>> = (1..=3)
            .map(|k| {
                PendingAckRecord::individual_ack(
                    TxnId::new(0, k),
                    vec![AckedPosition::whole(Position::new(9, k as i64))],
                )
                .encode()
            })
            .collect();
        let payloads: Vec<&[u8]> = entries.iter().map(Vec::as_slice).collect();
        s.append(
            &log,
            &[AppendSegment {
                ledger_id: 1,
                first_entry_id: 0,
                payloads: &payloads,
            }],
        )
        .unwrap();
        let (all, last) = txns_after_mark_delete(&s, &log).unwrap();
        assert_eq!(all.len(), 3, "no cursor yet: every record");
        assert_eq!(last, Some(Position::new(1, 2)));
        s.save_mark_delete(&log, PENDING_ACK_CURSOR, Position::new(1, 0), &[])
            .unwrap();
        let (rest, _) = txns_after_mark_delete(&s, &log).unwrap();
        assert_eq!(
            rest,
            [TxnId::new(0, 2), TxnId::new(0, 3)].into_iter().collect()
        );
    }

    #[test]
    fn a_pending_ack_read_sooner_than_the_least_backoff_after_a_failure_is_a_hot_retry() {
        let (_d, inner) = store();
        let plan = SharedPlan::default();
        let s = faulty_ledger_store(inner, Arc::clone(&plan));
        let log = pending_ack_log("t", "s");
        plan.lock().arm_replay_failure(1, false);
        assert!(s.read(&log, 1, 0, 0).is_err());
        plan.lock().now_ms = MIN_REPLAY_RETRY_MS;
        assert!(s.read(&log, 1, 0, 0).is_err(), "at the least backoff: fine");
        assert_eq!(plan.lock().hot_retry, None);
        plan.lock().now_ms = MIN_REPLAY_RETRY_MS + 99;
        assert!(s.read(&log, 1, 0, 0).is_err());
        let hot = plan
            .lock()
            .hot_retry
            .clone()
            .expect("a retry 99 ms after a failure");
        assert!(hot.contains("99 ms"), "{hot}");
        // A new core's first read is not a retry of the old core's.
        let mut p = plan.lock();
        p.hot_retry = None;
        p.new_core();
        drop(p);
        assert!(s.read(&log, 1, 0, 0).is_err());
        assert_eq!(plan.lock().hot_retry, None);
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
