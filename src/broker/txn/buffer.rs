//! The transaction buffer of a topic (Pulsar's `TopicTransactionBuffer`):
//! which transactions have entries on the topic and have not ended
//! (ongoing, with the position of their first entry), which were aborted,
//! and the **max read position** — the position before the first entry of
//! the oldest ongoing transaction (the last confirmed entry when none is
//! ongoing). Dispatch never reads past it, so a consumer never receives an
//! entry of an open transaction nor anything after it (Pulsar's
//! read-committed isolation); an aborted transaction's entries and every
//! marker are acknowledged for each subscription and never dispatched.
//!
//! ## Recovery, and a topic whose buffer cannot recover
//!
//! [`TxnBuffer::recover`] reads the topic from its first entry
//! ([`super::scan`]; [`TxnBuffer::recover_from`] from a snapshot): a data entry with a transaction id opens that
//! transaction (if it has not ended), a `TXN_COMMIT` marker ends it, a
//! `TXN_ABORT` marker ends it and records it aborted. The pending-ack replay's
//! read-failure discipline, which Pulsar's `TopicTransactionBuffer` recovery lacks (it
//! re-issues a failed read in a hot loop and can report a partial recovery
//! as complete):
//!
//! - every read failure ends the attempt, and no read is issued after it
//!   (the scan returns the failure at once);
//! - a failed attempt is never reported complete: the topic is not opened;
//! - the next attempt starts again from its start (the snapshot's max read
//!   position, or the first entry: the rewind, an attempt keeps no read
//!   position), and only after a backoff (100 ms
//!   doubling to 60 s per topic): requests for the
//!   topic before then are refused at once, without a read.
//!
//! While its buffer cannot recover, the topic is not open: lookups,
//! producers and subscribes for it are answered `ServiceNotReady`
//! (Pulsar closes the whole topic on this path). No other topic is
//! affected.
//!
//! ## Snapshot
//!
//! A topic's buffer is snapshotted (Pulsar's `TransactionBufferSnapshot`,
//! [`super::snapshot`]): its max read position and its aborted set (each
//! aborted transaction with the position of its abort marker). Recovery
//! from a snapshot ([`TxnBuffer::recover_from`]) starts with the snapshot's
//! aborted set and reads the topic only after the snapshot's max read
//! position: every entry of a transaction ongoing at snapshot time is after
//! that position, and an abort marker at or before it is in the snapshot's
//! aborted set, so the result is the buffer a read from the first entry
//! gives (spec `TransactionBufferSnapshot`, `SnapshotRecoveryEqualsFullReplay`).
//!
//! ## Trimming the aborted set
//!
//! An aborted transaction is forgotten once the ledger holding its abort
//! marker is gone (its entries are in that ledger or earlier ones):
//! [`TxnBuffer::trim_aborted`] against the managed ledger's ledger list
//! (Pulsar's `trimExpiredAbortedTxns`, run after each marker and at
//! recovery) and [`TxnBuffer::ledgers_deleted`] for the code that deletes
//! ledgers.

use std::collections::{BTreeMap, BTreeSet};

use crate::ledger::{LedgerError, ManagedLedger};
use crate::Position;

use super::snapshot::{AbortTxnMetadata, TransactionBufferSnapshot};
use super::TxnId;
use crate::proto::frame::parse_entry_payload;
use crate::proto::txn::marker_type;

/// What an entry means to the transaction buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryTxn {
    /// A plain message.
    Plain,
    /// A message of transaction `TxnId`.
    Data(TxnId),
    /// A `TXN_COMMIT` marker.
    Commit(TxnId),
    /// A `TXN_ABORT` marker.
    Abort(TxnId),
    /// Another marker (`marker_type` set: never dispatched).
    OtherMarker,
}

/// Reads the transaction fields of a stored entry's `MessageMetadata`
/// (`marker_type = 20`, `txnid_least_bits = 22`, `txnid_most_bits = 23`).
/// An unreadable entry is [`EntryTxn::Plain`] (dispatch's own check reports
/// it).
pub fn entry_txn(data: &[u8]) -> EntryTxn {
    let Ok(parsed) = parse_entry_payload(data) else {
        return EntryTxn::Plain;
    };
    let m = &parsed.metadata;
    let txn = m.txn_id().map(|(most, least)| TxnId::new(most, least));
    match (m.marker_type, txn) {
        (Some(marker_type::TXN_COMMIT), Some(t)) => EntryTxn::Commit(t),
        (Some(marker_type::TXN_ABORT), Some(t)) => EntryTxn::Abort(t),
        (Some(_), _) => EntryTxn::OtherMarker,
        (None, Some(t)) => EntryTxn::Data(t),
        (None, None) => EntryTxn::Plain,
    }
}

/// The transaction buffer's state of one topic.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TxnBuffer {
    /// Ongoing transactions → position of their first entry.
    ongoing: BTreeMap<TxnId, Position>,
    /// Transactions whose abort marker is on the topic → the marker's
    /// position.
    aborted: BTreeMap<TxnId, Position>,
}

impl TxnBuffer {
    /// Rebuilds the buffer of `ml` by reading it from its first entry.
    ///
    /// # Errors
    /// The first read failure: the attempt ends there (no further read) and
    /// is not a recovery.
    pub fn recover(ml: &ManagedLedger) -> Result<Self, LedgerError> {
        Self::recover_from(ml, None)
    }

    /// Rebuilds the buffer of `ml` from `snapshot` (its aborted set) and the
    /// entries after the snapshot's max read position; without a snapshot,
    /// from the first entry. The aborted set is then trimmed to the ledgers
    /// `ml` still has.
    ///
    /// # Errors
    /// The first read failure: the attempt ends there (no further read) and
    /// is not a recovery.
    pub fn recover_from(
        ml: &ManagedLedger,
        snapshot: Option<&TransactionBufferSnapshot>,
    ) -> Result<Self, LedgerError> {
        let mut b = Self::default();
        let start = match snapshot {
            Some(s) => {
                for a in s.aborts.iter().flatten() {
                    b.aborted.insert(
                        TxnId::new(a.txn_id_most_bits as u64, a.txn_id_least_bits as u64),
                        Position::new(a.ledger_id, a.entry_id),
                    );
                }
                s.max_read_position()
            }
            None => super::before_first(ml),
        };
        super::scan(ml, start, |e| {
            b.observe(e.position, entry_txn(&e.data));
        })?;
        b.trim_aborted(&ml.ledgers());
        Ok(b)
    }

    /// The snapshot of this buffer for `topic` whose last confirmed entry is
    /// `last_confirmed`: the max read position and the aborted set in marker
    /// order.
    pub fn snapshot(&self, topic: &str, last_confirmed: Position) -> TransactionBufferSnapshot {
        let mrp = self.max_read_position(last_confirmed);
        let mut aborts: Vec<(Position, TxnId)> =
            self.aborted.iter().map(|(t, p)| (*p, *t)).collect();
        aborts.sort();
        TransactionBufferSnapshot {
            topic_name: Some(topic.to_string()),
            max_read_position_ledger_id: mrp.ledger_id,
            max_read_position_entry_id: mrp.entry_id,
            aborts: Some(
                aborts
                    .into_iter()
                    .map(|(p, t)| AbortTxnMetadata {
                        txn_id_most_bits: t.most_sig_bits as i64,
                        txn_id_least_bits: t.least_sig_bits as i64,
                        ledger_id: p.ledger_id,
                        entry_id: p.entry_id,
                    })
                    .collect(),
            ),
        }
    }

    /// Forgets every aborted transaction whose abort marker's ledger is not
    /// in `ledgers` (ledger id, entries), i.e. was deleted; how many.
    pub fn trim_aborted(&mut self, ledgers: &[(i64, i64)]) -> usize {
        let before = self.aborted.len();
        let live: BTreeSet<i64> = ledgers.iter().map(|(id, _)| *id).collect();
        self.aborted.retain(|_, p| live.contains(&p.ledger_id));
        before - self.aborted.len()
    }

    /// The ledgers up to `up_to_ledger_id` (inclusive) were deleted: every
    /// aborted transaction whose abort marker was in one of them is
    /// forgotten; how many. The hook for the code that deletes a managed
    /// ledger's ledgers.
    pub fn ledgers_deleted(&mut self, up_to_ledger_id: i64) -> usize {
        let before = self.aborted.len();
        self.aborted.retain(|_, p| p.ledger_id > up_to_ledger_id);
        before - self.aborted.len()
    }

    /// Aborted transactions → the position of their abort marker.
    pub fn aborted(&self) -> &BTreeMap<TxnId, Position> {
        &self.aborted
    }

    /// Applies one entry of the topic, in position order.
    pub fn observe(&mut self, p: Position, t: EntryTxn) {
        match t {
            EntryTxn::Data(t) if !self.aborted.contains_key(&t) => {
                self.ongoing.entry(t).or_insert(p);
            }
            EntryTxn::Commit(t) => {
                self.ongoing.remove(&t);
            }
            EntryTxn::Abort(t) => {
                self.ongoing.remove(&t);
                self.aborted.entry(t).or_insert(p);
            }
            _ => {}
        }
    }

    /// Ongoing transactions and the position of their first entry.
    pub fn ongoing(&self) -> &BTreeMap<TxnId, Position> {
        &self.ongoing
    }

    /// Whether `t` has entries here and has not ended.
    pub fn is_ongoing(&self, t: TxnId) -> bool {
        self.ongoing.contains_key(&t)
    }

    /// Whether `t` was aborted on this topic.
    pub fn is_aborted(&self, t: TxnId) -> bool {
        self.aborted.contains_key(&t)
    }

    /// The max read position: just before the first entry of the oldest
    /// ongoing transaction, else `last_confirmed`.
    pub fn max_read_position(&self, last_confirmed: Position) -> Position {
        match self.ongoing.values().min() {
            Some(first) => first.previous_in_ledger().min(last_confirmed),
            None => last_confirmed,
        }
    }

    /// Whether dispatch may deliver the entry at `p` carrying `t`: not past
    /// the max read position, not aborted, not a marker.
    pub fn dispatchable(&self, p: Position, t: EntryTxn, last_confirmed: Position) -> bool {
        p <= self.max_read_position(last_confirmed)
            && match t {
                EntryTxn::Plain => true,
                EntryTxn::Data(t) => {
                    !self.aborted.contains_key(&t) && !self.ongoing.contains_key(&t)
                }
                _ => false,
            }
    }
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests {
    use super::*;

    fn p(e: i64) -> Position {
        Position::new(3, e)
    }

    #[test]
    fn max_read_position_stops_before_the_oldest_ongoing_transaction() {
        let (t1, t2) = (TxnId::new(0, 1), TxnId::new(0, 2));
        let mut b = TxnBuffer::default();
        b.observe(p(0), EntryTxn::Plain);
        b.observe(p(1), EntryTxn::Data(t1));
        b.observe(p(2), EntryTxn::Data(t2));
        b.observe(p(3), EntryTxn::Plain);
        assert_eq!(b.max_read_position(p(3)), p(0));
        assert!(!b.dispatchable(p(3), EntryTxn::Plain, p(3)));
        b.observe(p(4), EntryTxn::Commit(t1));
        assert_eq!(b.max_read_position(p(4)), p(1));
        assert!(b.dispatchable(p(1), EntryTxn::Data(t1), p(4)));
        assert!(!b.dispatchable(p(2), EntryTxn::Data(t2), p(4)));
        b.observe(p(5), EntryTxn::Abort(t2));
        assert_eq!(b.max_read_position(p(5)), p(5));
        assert!(!b.dispatchable(p(2), EntryTxn::Data(t2), p(5)), "aborted");
        assert!(!b.dispatchable(p(4), EntryTxn::Commit(t1), p(5)), "marker");
        assert!(!b.dispatchable(p(5), EntryTxn::Abort(t2), p(5)), "marker");
        assert!(b.dispatchable(p(3), EntryTxn::Plain, p(5)));
    }

    use super::super::snapshot::TransactionBufferSnapshot;
    use crate::ledger::{LedgerConfig, ManagedLedger, MemoryStore, ReadFailureKind};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    fn marker(t: TxnId, kind: i32) -> Vec<u8> {
        let md = crate::proto::txn::txn_marker(
            kind,
            t.least_sig_bits,
            1,
            t.most_sig_bits,
            t.least_sig_bits,
        );
        crate::proto::txn::marker_entry(&md)
    }

    /// A topic of 250 entries: transactions 1..=5 with data entries, 1 and
    /// 3 committed, 2 aborted, 4 and 5 open.
    fn topic() -> Arc<ManagedLedger> {
        let ml = empty_topic(LedgerConfig::default());
        for data in entries() {
            ml.append(&data).unwrap();
        }
        ml
    }

    fn empty_topic(config: LedgerConfig) -> Arc<ManagedLedger> {
        ManagedLedger::open(
            "persistent://public/default/tb",
            config,
            Arc::new(MemoryStore::new()),
        )
        .unwrap()
    }

    fn entries() -> Vec<Vec<u8>> {
        (0..250u64)
            .map(|i| match i {
                200 => marker(TxnId::new(0, 1), marker_type::TXN_COMMIT),
                201 => marker(TxnId::new(0, 2), marker_type::TXN_ABORT),
                202 => marker(TxnId::new(0, 3), marker_type::TXN_COMMIT),
                _ if i > 202 => data_entry(TxnId::new(0, 4 + i % 2)),
                _ => data_entry(TxnId::new(0, i % 5 + 1)),
            })
            .collect()
    }

    /// A topic where transactions start, commit and abort throughout
    /// (ledgers of 16 entries), as (entry, what it is).
    fn mixed_entries() -> Vec<Vec<u8>> {
        let mut v = Vec::new();
        for i in 0..60u64 {
            let t = TxnId::new(0, i / 3 + 1);
            v.push(match i % 6 {
                0 | 1 => data_entry(t),
                2 => data_entry(TxnId::new(0, i / 3 + 1)),
                3 => marker(TxnId::new(0, i / 3), marker_type::TXN_ABORT),
                4 => data_entry(t),
                _ => marker(TxnId::new(0, i / 3 - 1), marker_type::TXN_COMMIT),
            });
        }
        v
    }

    fn reads_of(ml: &ManagedLedger, f: impl FnOnce()) -> usize {
        let reads = Arc::new(AtomicUsize::new(0));
        let r2 = Arc::clone(&reads);
        ml.faults().set_policy(move |_| {
            r2.fetch_add(1, Ordering::SeqCst);
            None
        });
        f();
        ml.faults().clear();
        reads.load(Ordering::SeqCst)
    }

    /// `SnapshotRecoveryEqualsFullReplay`: a snapshot taken after any prefix
    /// of the topic, plus the entries after its max read position, gives the
    /// buffer (ongoing transactions with their first entry, aborted set)
    /// that a read from the first entry gives.
    #[test]
    fn recovery_from_a_snapshot_and_the_tail_equals_a_full_replay() {
        for all in [entries(), mixed_entries()] {
            for k in 0..=all.len() {
                let ml = empty_topic(LedgerConfig {
                    max_entries_per_ledger: 16,
                    ..LedgerConfig::default()
                });
                for d in &all[..k] {
                    ml.append(d).unwrap();
                }
                let at_k = TxnBuffer::recover(&ml).unwrap();
                let snap = at_k.snapshot(ml.name(), ml.last_confirmed_entry());
                let snap = TransactionBufferSnapshot::decode(&snap.encode()).unwrap();
                for d in &all[k..] {
                    ml.append(d).unwrap();
                }
                let full = TxnBuffer::recover(&ml).unwrap();
                let from_snapshot = TxnBuffer::recover_from(&ml, Some(&snap)).unwrap();
                assert_eq!(from_snapshot, full, "snapshot after {k} entries");
                let lac = ml.last_confirmed_entry();
                assert_eq!(
                    from_snapshot.max_read_position(lac),
                    full.max_read_position(lac)
                );
            }
        }
    }

    /// The negative control of the property above: a snapshot whose max
    /// read position is past the first entry of an open transaction loses
    /// that entry (the max read position moves past it).
    #[test]
    fn a_snapshot_past_an_open_transactions_first_entry_differs_from_a_full_replay() {
        let ml = topic();
        let full = TxnBuffer::recover(&ml).unwrap();
        let first4 = full.ongoing()[&TxnId::new(0, 4)];
        let mut snap = full.snapshot(ml.name(), ml.last_confirmed_entry());
        snap.max_read_position_entry_id = first4.entry_id;
        let wrong = TxnBuffer::recover_from(&ml, Some(&snap)).unwrap();
        let lac = ml.last_confirmed_entry();
        assert!(wrong.max_read_position(lac) > full.max_read_position(lac));
    }

    /// Recovery from a snapshot reads only the entries after its max read
    /// position.
    #[test]
    fn recovery_from_a_snapshot_reads_only_the_tail() {
        let ml = topic();
        ml.append(&marker(TxnId::new(0, 4), marker_type::TXN_ABORT))
            .unwrap();
        ml.append(&marker(TxnId::new(0, 5), marker_type::TXN_COMMIT))
            .unwrap();
        let b = TxnBuffer::recover(&ml).unwrap();
        let snap = b.snapshot(ml.name(), ml.last_confirmed_entry());
        assert_eq!(snap.max_read_position(), ml.last_confirmed_entry());
        for _ in 0..300 {
            ml.append(&data_entry(TxnId::new(0, 9))).unwrap();
            ml.append(&marker(TxnId::new(0, 9), marker_type::TXN_COMMIT))
                .unwrap();
        }
        let full = reads_of(&ml, || {
            TxnBuffer::recover(&ml).unwrap();
        });
        let tail = reads_of(&ml, || {
            TxnBuffer::recover_from(&ml, Some(&snap)).unwrap();
        });
        assert_eq!(full, 9, "852 entries in batches of 100");
        assert_eq!(tail, 6, "the 600 entries after the snapshot");
    }

    #[test]
    fn the_aborted_set_is_trimmed_when_the_ledger_of_the_abort_marker_is_gone() {
        let mut b = TxnBuffer::default();
        let (t1, t2) = (TxnId::new(0, 1), TxnId::new(0, 2));
        b.observe(Position::new(3, 0), EntryTxn::Data(t1));
        b.observe(Position::new(4, 0), EntryTxn::Abort(t1));
        b.observe(Position::new(4, 1), EntryTxn::Data(t2));
        b.observe(Position::new(5, 0), EntryTxn::Abort(t2));
        assert_eq!(b.trim_aborted(&[(4, 2), (5, 1)]), 0);
        assert_eq!(b.ledgers_deleted(3), 0, "ledger 3 holds no abort marker");
        assert_eq!(b.ledgers_deleted(4), 1);
        assert!(!b.is_aborted(t1) && b.is_aborted(t2));
        assert_eq!(b.trim_aborted(&[(6, 0)]), 1);
        assert!(b.aborted().is_empty());
    }

    fn data_entry(t: TxnId) -> Vec<u8> {
        let md = crate::proto::metadata::MessageMetadata {
            producer_name: "p".into(),
            sequence_id: 1,
            publish_time: 2,
            txnid_least_bits: Some(t.least_sig_bits),
            txnid_most_bits: Some(t.most_sig_bits),
            ..Default::default()
        };
        crate::proto::frame::encode_entry_payload(
            &md,
            &[(
                crate::proto::metadata::SingleMessageMetadata::default(),
                b"m".to_vec(),
            )],
        )
    }

    #[test]
    fn recovery_rebuilds_ongoing_and_aborted_from_the_topic() {
        let ml = topic();
        let b = TxnBuffer::recover(&ml).unwrap();
        let open: Vec<u64> = b.ongoing().keys().map(|t| t.least_sig_bits).collect();
        assert_eq!(open, vec![4, 5]);
        assert!(b.is_aborted(TxnId::new(0, 2)));
        assert!(!b.is_aborted(TxnId::new(0, 1)));
        assert_eq!(
            b.ongoing()[&TxnId::new(0, 4)],
            Position::new(ml.ledgers()[0].0, 3)
        );
    }

    /// The replay read-failure discipline (Pulsar's recovery lacks it): a read failure ends
    /// the attempt with no further read and is never a recovery; the next
    /// attempt reads from the first entry again and recovers everything.
    #[test]
    fn a_read_failure_ends_the_recovery_attempt_and_the_retry_starts_over() {
        let ml = topic();
        let reference = TxnBuffer::recover(&ml).unwrap();
        for kind in [
            ReadFailureKind::StorageUnavailable,
            ReadFailureKind::LedgerNotExist,
            ReadFailureKind::Fenced,
        ] {
            let reads = Arc::new(AtomicUsize::new(0));
            let r2 = Arc::clone(&reads);
            // The second read of the attempt fails.
            ml.faults()
                .set_policy(move |_| (r2.fetch_add(1, Ordering::SeqCst) == 1).then_some(kind));
            assert!(
                TxnBuffer::recover(&ml).is_err(),
                "{kind:?}: a partial recovery is an error"
            );
            assert_eq!(
                reads.load(Ordering::SeqCst),
                2,
                "{kind:?}: no read after the failure"
            );
            ml.faults().clear();
            assert_eq!(TxnBuffer::recover(&ml).unwrap(), reference, "{kind:?}");
        }
    }
}
