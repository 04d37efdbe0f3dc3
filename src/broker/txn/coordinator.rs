//! The transaction coordinator (Pulsar's `MLTransactionMetadataStore`):
//! transactions by id with their state, partitions, subscriptions and
//! timeout, every change appended to a durable log before it takes effect.
//!
//! ## Trimming the log
//!
//! A transaction's records are deleted on the log's cursor
//! (`transaction.subscription`, as `MLTransactionLogImpl` names it) once
//! its last record (Committed/Aborted) is durable — written only after
//! every partition and subscription applied the end (its marker appended,
//! its pending-ack commit applied and persisted). The cursor's mark-delete
//! moves over the contiguous prefix of deleted records, so recovery reads
//! the log from there, and ledgers below it may be deleted. The highest
//! transaction sequence is kept in the cursor property `max_local_txn_id`
//! (Pulsar keeps it in a managed-ledger property of that name), written
//! before the mark-delete moves, so a trimmed log never reuses an id.

use std::collections::{BTreeMap, BTreeSet};
// Ownership handles use std's Arc in every build (see `ledger::managed_ledger`).
use std::sync::Arc;

use prost::Message;

use crate::ledger::{LedgerConfig, ManagedCursor, ManagedLedger, RedbStore};
use crate::Position;

use super::TxnId;
use crate::proto::command::server_error;
use crate::proto::txn::{metadata_op, txn_status, TransactionMetadataEntry, TxnSubscription};

/// Why a coordinator request is refused, with Pulsar's `ServerError` code
/// ([`TxnError::server_error`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TxnError {
    /// No such transaction, or it already ended (`TransactionNotFound`;
    /// Pulsar's `TransactionNotFoundException`).
    #[error("transaction {0:?} not found")]
    NotFound(TxnId),
    /// The transaction is not in a state that allows the request
    /// (`InvalidTxnStatus`; Pulsar's `InvalidTxnStatusException`).
    #[error("transaction {txn:?} is {status}, expected {expected}")]
    InvalidStatus {
        /// The transaction.
        txn: TxnId,
        /// Its state.
        status: &'static str,
        /// The state the request needs.
        expected: &'static str,
    },
    /// A transactional ack of a position already acknowledged or pending in
    /// another transaction (`TransactionConflict`).
    #[error("{0}")]
    Conflict(String),
    /// The coordinator is not loaded (`TransactionCoordinatorNotFound`): its
    /// log could not be read, or the request names another `tc_id`.
    #[error("{0}")]
    CoordinatorNotFound(String),
    /// A request Pulsar refuses with `NotAllowedError`.
    #[error("{0}")]
    NotAllowed(String),
    /// The store failed (`PersistenceError`); nothing changed.
    #[error("{0}")]
    Persistence(String),
    /// The topic or its transaction buffer is not ready (`ServiceNotReady`).
    #[error("{0}")]
    NotReady(String),
}

impl TxnError {
    /// The `ServerError` value Pulsar answers with.
    pub fn server_error(&self) -> i32 {
        match self {
            TxnError::NotFound(_) => server_error::TRANSACTION_NOT_FOUND,
            TxnError::InvalidStatus { .. } => server_error::INVALID_TXN_STATUS,
            TxnError::Conflict(_) => server_error::TRANSACTION_CONFLICT,
            TxnError::CoordinatorNotFound(_) => server_error::TRANSACTION_COORDINATOR_NOT_FOUND,
            TxnError::NotAllowed(_) => server_error::NOT_ALLOWED_ERROR,
            TxnError::Persistence(_) => server_error::PERSISTENCE_ERROR,
            TxnError::NotReady(_) => server_error::SERVICE_NOT_READY,
        }
    }
}

fn persistence(e: impl std::fmt::Display) -> TxnError {
    TxnError::Persistence(e.to_string())
}

/// `TxnStatus` name.
pub fn status_name(s: i32) -> &'static str {
    match s {
        txn_status::OPEN => "OPEN",
        txn_status::COMMITTING => "COMMITTING",
        txn_status::COMMITTED => "COMMITTED",
        txn_status::ABORTING => "ABORTING",
        txn_status::ABORTED => "ABORTED",
        _ => "UNKNOWN",
    }
}

/// One transaction the coordinator holds (Open, Committing or Aborting).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnMeta {
    /// (coordinator id, sequence).
    pub id: TxnId,
    /// [`txn_status`] value.
    pub status: i32,
    /// Topics it produced to (`ADD_PARTITION_TO_TXN`).
    pub partitions: BTreeSet<String>,
    /// (topic, subscription) pairs it acknowledged on
    /// (`ADD_SUBSCRIPTION_TO_TXN`).
    pub subscriptions: BTreeSet<(String, String)>,
    /// When an Open transaction times out and is aborted (epoch ms).
    pub timeout_at: u64,
}

/// The coordinator: its log and the transactions not yet ended.
pub struct Coordinator {
    tc_id: u64,
    log: Arc<ManagedLedger>,
    cursor: ManagedCursor,
    txns: BTreeMap<TxnId, TxnMeta>,
    max_sequence: u64,
    /// Log records of the transactions not yet ended.
    records: BTreeMap<TxnId, Vec<Position>>,
    /// Records of ended transactions above the cursor's mark-delete.
    deleted: BTreeSet<Position>,
}

/// Name of the coordinator log's cursor (`MLTransactionLogImpl`'s
/// `TRANSACTION_SUBSCRIPTION_NAME`).
pub const LOG_CURSOR: &str = "transaction.subscription";

/// Cursor property holding the highest transaction sequence handed out
/// (`MLTransactionSequenceIdGenerator`'s `max_local_txn_id`).
pub const MAX_LOCAL_TXN_ID: &str = "max_local_txn_id";

/// The coordinator log's managed-ledger name for `tc_id`.
pub fn log_name(tc_id: u64) -> String {
    format!("persistent://pulsar/system/__transaction_log_{tc_id}")
}

impl Coordinator {
    /// Opens coordinator `tc_id` on `store` and recovers it from its log:
    /// every record in order (`NEW` opens, `ADD_*` adds, `UPDATE` moves the
    /// state; Committed/Aborted transactions are forgotten).
    ///
    /// # Errors
    /// [`TxnError::Persistence`] when the log cannot be opened or read, or a
    /// record does not decode: the coordinator is not loaded (a partial log
    /// is never taken as the whole).
    pub fn open(store: &RedbStore, tc_id: u64) -> Result<Self, TxnError> {
        let log = ManagedLedger::open(
            log_name(tc_id),
            LedgerConfig::default(),
            Arc::new(store.clone()),
        )
        .map_err(persistence)?;
        let cursor = log.open_cursor(LOG_CURSOR).map_err(persistence)?;
        let kept = cursor
            .properties()
            .map_err(persistence)?
            .get(MAX_LOCAL_TXN_ID)
            .map_or(0, |v| *v as u64);
        let from = cursor.mark_delete_position();
        let mut c = Self {
            tc_id,
            log,
            cursor,
            txns: BTreeMap::new(),
            max_sequence: kept,
            records: BTreeMap::new(),
            deleted: BTreeSet::new(),
        };
        let mut bad = None;
        let log = Arc::clone(&c.log);
        super::scan(&log, from, |e| {
            if bad.is_some() {
                return;
            }
            match TransactionMetadataEntry::decode(e.data.as_slice()) {
                Ok(r) => c.apply(&r, e.position),
                Err(err) => bad = Some(format!("coordinator log entry {}: {err}", e.position)),
            }
        })
        .map_err(|e| TxnError::Persistence(format!("coordinator log read failed: {e}")))?;
        if let Some(b) = bad {
            return Err(TxnError::Persistence(b));
        }
        c.trim();
        tracing::info!(
            tc_id,
            open = c.txns.len(),
            max_sequence = c.max_sequence,
            "transaction coordinator recovered"
        );
        Ok(c)
    }

    /// The coordinator id (`TxnId::most_sig_bits` of its transactions).
    pub fn tc_id(&self) -> u64 {
        self.tc_id
    }

    /// The transactions not yet ended.
    pub fn transactions(&self) -> &BTreeMap<TxnId, TxnMeta> {
        &self.txns
    }

    /// Transaction `id`, if not yet ended.
    pub fn get(&self, id: TxnId) -> Option<&TxnMeta> {
        self.txns.get(&id)
    }

    /// The cursor's mark-delete: the log is read from there at recovery.
    pub fn log_mark_delete(&self) -> Position {
        self.cursor.mark_delete_position()
    }

    /// Moves the log cursor's mark-delete over the contiguous records of
    /// ended transactions (`max_local_txn_id` first). A store failure
    /// leaves it where it was (retried at the next end).
    fn trim(&mut self) {
        let mut md = self.cursor.mark_delete_position();
        let lac = self.log.last_confirmed_entry();
        loop {
            let next = self.log.next_valid_position(md);
            if next > lac || !self.deleted.contains(&next) {
                break;
            }
            md = next;
        }
        if md == self.cursor.mark_delete_position() {
            return;
        }
        let r = self
            .cursor
            .set_property(MAX_LOCAL_TXN_ID, self.max_sequence as i64)
            .and_then(|()| self.cursor.mark_delete(md));
        match r {
            Ok(()) => {
                self.deleted = self.deleted.split_off(&md.next_in_ledger());
            }
            Err(e) => tracing::warn!(error = %e, "coordinator log not trimmed"),
        }
    }

    fn apply(&mut self, r: &TransactionMetadataEntry, at: Position) {
        let id = TxnId::new(
            r.txnid_most_bits.unwrap_or(0),
            r.txnid_least_bits.unwrap_or(0),
        );
        self.max_sequence = self.max_sequence.max(id.least_sig_bits);
        if r.metadata_op != Some(metadata_op::NEW) && !self.txns.contains_key(&id) {
            // A record of a transaction that already ended.
            self.deleted.insert(at);
            return;
        }
        self.records.entry(id).or_default().push(at);
        match r.metadata_op {
            Some(metadata_op::NEW) => {
                let start = r.start_time.unwrap_or(0);
                self.txns.insert(
                    id,
                    TxnMeta {
                        id,
                        status: txn_status::OPEN,
                        partitions: BTreeSet::new(),
                        subscriptions: BTreeSet::new(),
                        timeout_at: start.saturating_add(r.timeout_ms.unwrap_or(0)),
                    },
                );
            }
            Some(metadata_op::ADD_PARTITION) => {
                if let Some(t) = self.txns.get_mut(&id) {
                    t.partitions.extend(r.partitions.iter().cloned());
                }
            }
            Some(metadata_op::ADD_SUBSCRIPTION) => {
                if let Some(t) = self.txns.get_mut(&id) {
                    t.subscriptions.extend(
                        r.subscriptions
                            .iter()
                            .map(|s| (s.topic.clone(), s.subscription.clone())),
                    );
                }
            }
            Some(metadata_op::UPDATE) => match r.new_status {
                Some(txn_status::COMMITTED | txn_status::ABORTED) => {
                    self.txns.remove(&id);
                    self.deleted
                        .extend(self.records.remove(&id).unwrap_or_default());
                }
                Some(s) => {
                    if let Some(t) = self.txns.get_mut(&id) {
                        t.status = s;
                    }
                }
                None => {}
            },
            _ => {}
        }
    }

    /// Appends `r` to the log (durable on return), then applies it.
    fn log(&mut self, r: TransactionMetadataEntry) -> Result<(), TxnError> {
        let at = self.log.append(&r.encode_to_vec()).map_err(persistence)?;
        self.apply(&r, at);
        Ok(())
    }

    fn open_txn(&self, id: TxnId) -> Result<&TxnMeta, TxnError> {
        let t = self.txns.get(&id).ok_or(TxnError::NotFound(id))?;
        if t.status != txn_status::OPEN {
            return Err(TxnError::InvalidStatus {
                txn: id,
                status: status_name(t.status),
                expected: "OPEN",
            });
        }
        Ok(t)
    }

    fn record(id: TxnId, op: i32, now_ms: u64) -> TransactionMetadataEntry {
        TransactionMetadataEntry {
            metadata_op: Some(op),
            txnid_least_bits: Some(id.least_sig_bits),
            txnid_most_bits: Some(id.most_sig_bits),
            last_modification_time: Some(now_ms),
            ..Default::default()
        }
    }

    /// `NEW_TXN`: a new Open transaction `(tc_id, next sequence)` that times
    /// out `timeout_ms` after `now_ms`.
    ///
    /// # Errors
    /// [`TxnError::Persistence`] (nothing changed).
    pub fn new_txn(&mut self, timeout_ms: u64, now_ms: u64) -> Result<TxnId, TxnError> {
        let id = TxnId::new(self.tc_id, self.max_sequence + 1);
        let mut r = Self::record(id, metadata_op::NEW, now_ms);
        r.new_status = Some(txn_status::OPEN);
        r.timeout_ms = Some(timeout_ms);
        r.start_time = Some(now_ms);
        r.max_sequence_id = Some(id.least_sig_bits);
        self.log(r)?;
        Ok(id)
    }

    /// `ADD_PARTITION_TO_TXN`.
    ///
    /// # Errors
    /// [`TxnError::NotFound`], [`TxnError::InvalidStatus`] (not Open),
    /// [`TxnError::Persistence`].
    pub fn add_partitions(
        &mut self,
        id: TxnId,
        partitions: &[String],
        now_ms: u64,
    ) -> Result<(), TxnError> {
        let t = self.open_txn(id)?;
        let new: Vec<String> = partitions
            .iter()
            .filter(|p| !t.partitions.contains(*p))
            .cloned()
            .collect();
        if new.is_empty() {
            return Ok(());
        }
        let mut r = Self::record(id, metadata_op::ADD_PARTITION, now_ms);
        r.partitions = new;
        self.log(r)
    }

    /// `ADD_SUBSCRIPTION_TO_TXN`.
    ///
    /// # Errors
    /// As [`Coordinator::add_partitions`].
    pub fn add_subscriptions(
        &mut self,
        id: TxnId,
        subscriptions: &[(String, String)],
        now_ms: u64,
    ) -> Result<(), TxnError> {
        let t = self.open_txn(id)?;
        let new: Vec<TxnSubscription> = subscriptions
            .iter()
            .filter(|s| !t.subscriptions.contains(*s))
            .map(|(topic, subscription)| TxnSubscription {
                topic: topic.clone(),
                subscription: subscription.clone(),
            })
            .collect();
        if new.is_empty() {
            return Ok(());
        }
        let mut r = Self::record(id, metadata_op::ADD_SUBSCRIPTION, now_ms);
        r.subscriptions = new;
        self.log(r)
    }

    /// First durable write of `END_TXN`: Open → Committing (`commit`) or
    /// Aborting. A transaction already Committing (Aborting) is returned as
    /// it is for the same action (a retried END_TXN finishes it).
    ///
    /// # Errors
    /// [`TxnError::NotFound`]; [`TxnError::InvalidStatus`] for the other
    /// action on an ending transaction; [`TxnError::Persistence`].
    pub fn begin_end(&mut self, id: TxnId, commit: bool, now_ms: u64) -> Result<TxnMeta, TxnError> {
        let t = self.txns.get(&id).ok_or(TxnError::NotFound(id))?;
        let target = if commit {
            txn_status::COMMITTING
        } else {
            txn_status::ABORTING
        };
        if t.status == target {
            return Ok(t.clone());
        }
        if t.status != txn_status::OPEN {
            return Err(TxnError::InvalidStatus {
                txn: id,
                status: status_name(t.status),
                expected: "OPEN",
            });
        }
        let mut r = Self::record(id, metadata_op::UPDATE, now_ms);
        r.expected_status = Some(txn_status::OPEN);
        r.new_status = Some(target);
        self.log(r)?;
        self.txns.get(&id).cloned().ok_or(TxnError::NotFound(id))
    }

    /// Last durable write of `END_TXN`: Committing → Committed (Aborting →
    /// Aborted); the transaction is forgotten (a later request for it is
    /// `TransactionNotFound`, as in Pulsar).
    ///
    /// # Errors
    /// [`TxnError::NotFound`]; [`TxnError::InvalidStatus`] when it is not
    /// ending; [`TxnError::Persistence`].
    pub fn finish_end(&mut self, id: TxnId, now_ms: u64) -> Result<(), TxnError> {
        let t = self.txns.get(&id).ok_or(TxnError::NotFound(id))?;
        let (expected, new) = match t.status {
            txn_status::COMMITTING => (txn_status::COMMITTING, txn_status::COMMITTED),
            txn_status::ABORTING => (txn_status::ABORTING, txn_status::ABORTED),
            s => {
                return Err(TxnError::InvalidStatus {
                    txn: id,
                    status: status_name(s),
                    expected: "COMMITTING or ABORTING",
                })
            }
        };
        let mut r = Self::record(id, metadata_op::UPDATE, now_ms);
        r.expected_status = Some(expected);
        r.new_status = Some(new);
        self.log(r)?;
        self.trim();
        Ok(())
    }

    /// Transactions a crash left Committing or Aborting (recovery finishes
    /// them).
    pub fn ending(&self) -> Vec<TxnMeta> {
        self.txns
            .values()
            .filter(|t| t.status != txn_status::OPEN)
            .cloned()
            .collect()
    }

    /// Earliest timeout of an Open transaction.
    pub fn next_timeout(&self) -> Option<u64> {
        self.txns
            .values()
            .filter(|t| t.status == txn_status::OPEN)
            .map(|t| t.timeout_at)
            .min()
    }

    /// Open transactions whose timeout is at or before `now_ms`.
    pub fn expired(&self, now_ms: u64) -> Vec<TxnId> {
        self.txns
            .values()
            .filter(|t| t.status == txn_status::OPEN && t.timeout_at <= now_ms)
            .map(|t| t.id)
            .collect()
    }
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests {
    use super::*;

    fn store(dir: &tempfile::TempDir) -> RedbStore {
        RedbStore::open(dir.path().join("s.redb")).unwrap()
    }

    #[test]
    fn the_state_machine_answers_with_pulsars_errors() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Coordinator::open(&store(&dir), 0).unwrap();
        let t = c.new_txn(1000, 10).unwrap();
        assert_eq!(t, TxnId::new(0, 1));
        assert_eq!(c.new_txn(1000, 10).unwrap(), TxnId::new(0, 2));
        let ghost = TxnId::new(0, 99);
        assert_eq!(
            c.add_partitions(ghost, &["t".into()], 11)
                .unwrap_err()
                .server_error(),
            server_error::TRANSACTION_NOT_FOUND
        );
        c.add_partitions(t, &["t".into()], 11).unwrap();
        c.add_subscriptions(t, &[("t".into(), "s".into())], 11)
            .unwrap();
        assert_eq!(
            c.begin_end(t, true, 12).unwrap().status,
            txn_status::COMMITTING
        );
        // A retried commit is the same step; an abort of a committing one is not.
        assert_eq!(
            c.begin_end(t, true, 12).unwrap().status,
            txn_status::COMMITTING
        );
        assert_eq!(
            c.begin_end(t, false, 12).unwrap_err().server_error(),
            server_error::INVALID_TXN_STATUS
        );
        assert_eq!(
            c.add_partitions(t, &["u".into()], 12)
                .unwrap_err()
                .server_error(),
            server_error::INVALID_TXN_STATUS
        );
        c.finish_end(t, 13).unwrap();
        assert!(c.get(t).is_none());
        assert_eq!(
            c.begin_end(t, true, 14).unwrap_err().server_error(),
            server_error::TRANSACTION_NOT_FOUND
        );
        assert_eq!(c.next_timeout(), Some(1010));
        assert_eq!(c.expired(1009), vec![]);
        assert_eq!(c.expired(1010), vec![TxnId::new(0, 2)]);
    }

    /// Drop and reopen the redb store after each durable write: the log
    /// rebuilds the same transactions, sequence numbers never repeat.
    #[test]
    fn recovery_after_each_durable_write_rebuilds_the_same_transactions() {
        let dir = tempfile::tempdir().unwrap();
        type Step = Box<dyn Fn(&mut Coordinator)>;
        let steps: Vec<Step> = vec![
            Box::new(|c| {
                c.new_txn(500, 1).unwrap();
            }),
            Box::new(|c| {
                c.add_partitions(TxnId::new(0, 1), &["t".into()], 2)
                    .unwrap()
            }),
            Box::new(|c| {
                c.add_subscriptions(TxnId::new(0, 1), &[("t".into(), "s".into())], 3)
                    .unwrap()
            }),
            Box::new(|c| {
                c.begin_end(TxnId::new(0, 1), false, 4).unwrap();
            }),
            Box::new(|c| c.finish_end(TxnId::new(0, 1), 5).unwrap()),
        ];
        let mut expected: Vec<BTreeMap<TxnId, TxnMeta>> = Vec::new();
        for (i, step) in steps.iter().enumerate() {
            let mut c = Coordinator::open(&store(&dir), 0).unwrap();
            if let Some(prev) = expected.last() {
                assert_eq!(c.transactions(), prev, "after write {i}");
            }
            step(&mut c);
            expected.push(c.transactions().clone());
            drop(c);
        }
        let mut c = Coordinator::open(&store(&dir), 0).unwrap();
        assert!(c.transactions().is_empty());
        assert_eq!(
            c.new_txn(1, 6).unwrap(),
            TxnId::new(0, 2),
            "no sequence reused"
        );
    }

    /// The log is trimmed (its cursor's mark-delete) over the records of
    /// ended transactions, never past a record of one still open; a
    /// recovery reads from there and reuses no sequence.
    #[test]
    fn the_log_is_trimmed_as_transactions_end_and_no_sequence_is_reused() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Coordinator::open(&store(&dir), 0).unwrap();
        let start = c.log_mark_delete();
        let t1 = c.new_txn(1000, 1).unwrap();
        let t2 = c.new_txn(1000, 1).unwrap();
        c.add_partitions(t1, &["t".into()], 2).unwrap();
        c.begin_end(t2, false, 3).unwrap();
        c.finish_end(t2, 3).unwrap();
        assert_eq!(c.log_mark_delete(), start, "t1's NEW is first and open");
        c.begin_end(t1, true, 4).unwrap();
        c.finish_end(t1, 4).unwrap();
        let lac = c.log.last_confirmed_entry();
        assert_eq!(c.log_mark_delete(), lac, "every record of an ended txn");
        let t3 = c.new_txn(1000, 5).unwrap();
        drop(c);
        let mut c = Coordinator::open(&store(&dir), 0).unwrap();
        assert_eq!(c.log_mark_delete(), lac);
        assert_eq!(
            c.transactions().keys().copied().collect::<Vec<_>>(),
            vec![t3]
        );
        c.begin_end(t3, false, 6).unwrap();
        c.finish_end(t3, 6).unwrap();
        drop(c);
        let mut c = Coordinator::open(&store(&dir), 0).unwrap();
        assert!(c.transactions().is_empty());
        assert_eq!(
            c.new_txn(1, 7).unwrap(),
            TxnId::new(0, 4),
            "the whole log trimmed: max_local_txn_id keeps the sequence"
        );
    }
}
