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
//! ([`super::scan`]): a data entry with a transaction id opens that
//! transaction (if it has not ended), a `TXN_COMMIT` marker ends it, a
//! `TXN_ABORT` marker ends it and records it aborted. Seed 001's discipline,
//! which Pulsar's `TopicTransactionBuffer` recovery lacks (Pulsar #26379: it
//! re-issues a failed read in a hot loop and can report a partial recovery
//! as complete):
//!
//! - every read failure ends the attempt, and no read is issued after it
//!   (the scan returns the failure at once);
//! - a failed attempt is never reported complete: the topic is not opened;
//! - the next attempt starts again from the first entry (the rewind: an
//!   attempt keeps no read position), and only after a backoff (100 ms
//!   doubling to 60 s per topic): requests for the
//!   topic before then are refused at once, without a read.
//!
//! While its buffer cannot recover, the topic is not open: lookups,
//! producers and subscribes for it are answered `ServiceNotReady`
//! (Pulsar closes the whole topic on this path). No other topic is
//! affected.
//!
//! Not yet: the snapshot (Pulsar's `TransactionBufferSnapshot`, which lets
//! recovery start at the snapshot's max read position instead of the first
//! entry) and trimming the aborted set as ledgers are deleted.

use std::collections::{BTreeMap, BTreeSet};

use prost::Message;

use crate::ledger::{LedgerError, ManagedLedger};
use crate::Position;

use super::TxnId;
use crate::broker::entry::metadata_and_payload;
use crate::proto::txn::{marker_type, TxnEntryMetadata};

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
    let Ok((meta, _)) = metadata_and_payload(data) else {
        return EntryTxn::Plain;
    };
    let Ok(m) = TxnEntryMetadata::decode(meta) else {
        return EntryTxn::Plain;
    };
    let txn = match (m.txnid_most_bits, m.txnid_least_bits) {
        (None, None) => None,
        (most, least) => Some(TxnId::new(most.unwrap_or(0), least.unwrap_or(0))),
    };
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
    /// Transactions whose abort marker is on the topic.
    aborted: BTreeSet<TxnId>,
}

impl TxnBuffer {
    /// Rebuilds the buffer of `ml` by reading it from its first entry.
    ///
    /// # Errors
    /// The first read failure: the attempt ends there (no further read) and
    /// is not a recovery.
    pub fn recover(ml: &ManagedLedger) -> Result<Self, LedgerError> {
        let mut b = Self::default();
        super::scan(ml, super::before_first(ml), |e| {
            b.observe(e.position, entry_txn(&e.data));
        })?;
        Ok(b)
    }

    /// Applies one entry of the topic, in position order.
    pub fn observe(&mut self, p: Position, t: EntryTxn) {
        match t {
            EntryTxn::Data(t) if !self.aborted.contains(&t) => {
                self.ongoing.entry(t).or_insert(p);
            }
            EntryTxn::Commit(t) => {
                self.ongoing.remove(&t);
            }
            EntryTxn::Abort(t) => {
                self.ongoing.remove(&t);
                self.aborted.insert(t);
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
        self.aborted.contains(&t)
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
                EntryTxn::Data(t) => !self.aborted.contains(&t) && !self.ongoing.contains_key(&t),
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

    use crate::ledger::{LedgerConfig, ManagedLedger, MemoryStore, ReadFailureKind};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    fn marker(t: TxnId, kind: i32) -> Vec<u8> {
        crate::proto::txn::TxnMarkerMetadata {
            producer_name: crate::proto::txn::MARKER_PRODUCER_NAME.into(),
            sequence_id: t.least_sig_bits,
            publish_time: 1,
            marker_type: Some(kind),
            txnid_least_bits: Some(t.least_sig_bits),
            txnid_most_bits: Some(t.most_sig_bits),
        }
        .entry()
    }

    /// A topic of 250 entries: transactions 1..=5 with data entries, 1 and
    /// 3 committed, 2 aborted, 4 and 5 open.
    fn topic() -> Arc<ManagedLedger> {
        let ml = ManagedLedger::open(
            "persistent://public/default/tb",
            LedgerConfig::default(),
            Arc::new(MemoryStore::new()),
        )
        .unwrap();
        for i in 0..250u64 {
            let data = match i {
                200 => marker(TxnId::new(0, 1), marker_type::TXN_COMMIT),
                201 => marker(TxnId::new(0, 2), marker_type::TXN_ABORT),
                202 => marker(TxnId::new(0, 3), marker_type::TXN_COMMIT),
                _ if i > 202 => data_entry(TxnId::new(0, 4 + i % 2)),
                _ => data_entry(TxnId::new(0, i % 5 + 1)),
            };
            ml.append(&data).unwrap();
        }
        ml
    }

    fn data_entry(t: TxnId) -> Vec<u8> {
        let mut md = crate::proto::wire::MessageMetadata {
            producer_name: "p".into(),
            sequence_id: 1,
            publish_time: 2,
            num_messages_in_batch: None,
        }
        .encode_to_vec();
        prost::encoding::uint64::encode(22, &t.least_sig_bits, &mut md);
        prost::encoding::uint64::encode(23, &t.most_sig_bits, &mut md);
        let mut body = Vec::new();
        body.extend_from_slice(&(md.len() as u32).to_be_bytes());
        body.extend_from_slice(&md);
        body.push(b'm');
        let mut out = vec![0x0e, 0x01];
        out.extend_from_slice(&crate::proto::frame::crc32c(&body).to_be_bytes());
        out.extend_from_slice(&body);
        out
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

    /// Seed 001's discipline (Pulsar #26379 lacks it): a read failure ends
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
