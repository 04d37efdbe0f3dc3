//! Taking and loading transaction buffer snapshots in the node (the format
//! is in [`super::snapshot`]).
//!
//! - **Where:** each namespace's system topic
//!   `__transaction_buffer_snapshot`, opened as a topic of the node (one
//!   owner of its managed ledger; a client may read it); it has no
//!   transaction buffer of its own.
//! - **When** (Pulsar's `TopicTransactionBuffer` triggers): before the first
//!   transactional entry of a topic without a snapshot (Pulsar's "first
//!   snapshot"); when a transaction ends on the topic and
//!   [`SnapshotConfig::max_transaction_count`] transactions ended since the
//!   last snapshot; every [`SnapshotConfig::min_time_ms`] when the max read
//!   position moved since the last snapshot. Pulsar counts forward moves of
//!   the max read position (plain publishes included) for the first
//!   trigger; here it counts ended transactions (the setting's name) and
//!   plain publishes are covered by the interval.
//! - **Loading:** the latest message per key, from an index of the system
//!   topic built by reading it once (Pulsar reads a table view of it). A
//!   read failure ends the attempt (the topic's recovery fails and is
//!   retried after its backoff, the pending-ack replay's discipline). A snapshot that
//!   does not decode ([`super::snapshot::SnapshotError`]) or names another
//!   topic is not used: the buffer is recovered by reading the topic from
//!   its first entry (correct, only slower), and the error is logged.
//!
//! A failed snapshot write changes nothing but the log (as in Pulsar): the
//! next trigger retries. A failed first snapshot refuses the transactional
//! SEND that needed it.

use std::collections::BTreeMap;

use crate::broker::error::BrokerError;
use crate::broker::Broker;
use crate::Position;

use super::snapshot::{
    decode_entry, entry_key, is_snapshot_topic, snapshot_entry, snapshot_topic, SnapshotConfig,
    TransactionBufferSnapshot,
};
use super::TxnBuffer;

/// A topic's snapshot bookkeeping.
#[derive(Debug, Clone, Default)]
pub(crate) struct SnapshotBook {
    /// The max read position of its latest snapshot (written, or recovered
    /// from); `None`: the topic has no snapshot.
    pub(crate) taken: Option<Position>,
    /// Transactions ended on the topic since then.
    pub(crate) ended_since: u64,
    /// When the interval trigger next looks at it.
    pub(crate) next_at: u64,
}

impl Broker {
    /// Sets when transaction buffers take snapshots (from now on; at start:
    /// [`crate::broker::BrokerConfig::txn_snapshot`]).
    pub fn set_txn_snapshot_config(&mut self, config: SnapshotConfig) {
        self.config.txn_snapshot = config;
        self.txn.snapshot_config = config;
    }

    /// The latest snapshot of `topic` stored on its namespace's snapshot
    /// topic, if any.
    pub fn txn_buffer_snapshot(
        &mut self,
        topic: &str,
    ) -> Result<Option<TransactionBufferSnapshot>, BrokerError> {
        let Some(st) = snapshot_topic(topic) else {
            return Ok(None);
        };
        let Some(p) = self.snapshot_index(&st)?.get(topic).copied() else {
            return Ok(None);
        };
        let ml = self.topic_ml(&st)?;
        let e = ml
            .read_positions(&[p])
            .map_err(|e| BrokerError::NotReady(format!("snapshot of {topic} not read: {e}")))?;
        let Some(e) = e.first() else {
            return Ok(None);
        };
        match decode_entry(&e.data) {
            Ok(Some(s)) if s.topic_name.as_deref() == Some(topic) => Ok(Some(s)),
            Ok(Some(s)) => {
                tracing::warn!(
                    topic,
                    named = ?s.topic_name,
                    "transaction buffer snapshot names another topic: not used, the topic is read from its first entry"
                );
                Ok(None)
            }
            Ok(None) => Ok(None),
            Err(err) => {
                tracing::warn!(topic, at = %p, error = %err, "transaction buffer snapshot does not decode: not used, the topic is read from its first entry");
                Ok(None)
            }
        }
    }

    fn topic_ml(
        &mut self,
        name: &str,
    ) -> Result<std::sync::Arc<crate::ledger::ManagedLedger>, BrokerError> {
        let name = self.topic(name)?;
        Ok(std::sync::Arc::clone(&self.topics[&name].ml))
    }

    /// Key → position of its latest snapshot message on snapshot topic
    /// `st`, read once from the topic's first entry.
    fn snapshot_index(&mut self, st: &str) -> Result<&BTreeMap<String, Position>, BrokerError> {
        if !self.txn.snapshot_index.contains_key(st) && !self.topics.contains_key(st) {
            // A namespace without snapshots: nothing is created for it
            // (Pulsar checks that the system topic exists).
            use crate::ledger::LedgerStore;
            let stored = self.store.load_ledger(st).map_err(|e| {
                BrokerError::NotReady(format!(
                    "transaction buffer snapshots of {} not read: {e}",
                    crate::broker::name_for_error(st)
                ))
            })?;
            if stored.ledgers.is_empty() {
                self.txn
                    .snapshot_index
                    .insert(st.to_string(), BTreeMap::new());
            }
        }
        if !self.txn.snapshot_index.contains_key(st) {
            let ml = self.topic_ml(st)?;
            let mut index = BTreeMap::new();
            super::scan(&ml, super::before_first(&ml), |e| match entry_key(&e.data) {
                Ok((key, false)) => {
                    index.insert(key, e.position);
                }
                Ok((key, true)) => {
                    index.remove(&key);
                }
                Err(err) => {
                    tracing::warn!(topic = st, at = %e.position, error = %err, "not a snapshot message: skipped");
                }
            })
            .map_err(|e| {
                BrokerError::NotReady(format!(
                    "transaction buffer snapshots of {} not read: {e}",
                    crate::broker::name_for_error(st)
                ))
            })?;
            self.txn.snapshot_index.insert(st.to_string(), index);
        }
        Ok(&self.txn.snapshot_index[st])
    }

    /// Recovers the buffer of `name` from its latest snapshot and the
    /// entries after it (from the first entry without a usable snapshot).
    /// A snapshot topic has no buffer (nothing is read).
    pub(crate) fn recover_buffer_attempt(
        &mut self,
        name: &str,
        ml: &crate::ledger::ManagedLedger,
    ) -> Result<TxnBuffer, BrokerError> {
        if is_snapshot_topic(name) {
            return Ok(TxnBuffer::default());
        }
        let snap = self.txn_buffer_snapshot(name)?;
        let b = TxnBuffer::recover_from(ml, snap.as_ref()).map_err(|e| {
            BrokerError::NotReady(format!(
                "topic {}: transaction buffer recovery failed: {e}",
                crate::broker::name_for_error(name)
            ))
        })?;
        let next_at = self
            .now()
            .saturating_add(self.txn.snapshot_config.min_time_ms);
        self.txn.snapshot_book.insert(
            name.to_string(),
            SnapshotBook {
                taken: snap.map(|s| s.max_read_position()),
                ended_since: 0,
                next_at,
            },
        );
        Ok(b)
    }

    /// Writes a snapshot of open topic `topic`'s buffer to its namespace's
    /// snapshot topic.
    ///
    /// # Errors
    /// The topic is not open, or the snapshot topic cannot be opened, read
    /// or appended to (nothing changed).
    pub fn take_txn_buffer_snapshot(&mut self, topic: &str) -> Result<(), BrokerError> {
        let st = snapshot_topic(topic)
            .ok_or_else(|| BrokerError::InvalidTopic(crate::broker::name_for_error(topic)))?;
        self.snapshot_index(&st)?;
        let (snap, mrp) = {
            let t = self
                .topics
                .get(topic)
                .ok_or_else(|| BrokerError::NotReady(format!("topic {topic} not open")))?;
            let lac = t.ml.last_confirmed_entry();
            let b = t.buffer.lock();
            (b.snapshot(topic, lac), b.max_read_position(lac))
        };
        let sml = self.topic_ml(&st)?;
        self.txn.snapshot_seq += 1;
        let entry = snapshot_entry(topic, &snap, self.txn.snapshot_seq, self.now());
        let p = sml
            .append(&entry)
            .map_err(|e| BrokerError::NotReady(format!("snapshot of {topic} not written: {e}")))?;
        if let Some(index) = self.txn.snapshot_index.get_mut(&st) {
            index.insert(topic.to_string(), p);
        }
        let next_at = self
            .now()
            .saturating_add(self.txn.snapshot_config.min_time_ms);
        let book = self.txn.snapshot_book.entry(topic.to_string()).or_default();
        book.taken = Some(mrp);
        book.ended_since = 0;
        book.next_at = next_at;
        tracing::debug!(topic, max_read_position = %mrp, aborts = snap.aborts.as_ref().map_or(0, Vec::len), "transaction buffer snapshot taken");
        Ok(())
    }

    /// Before the first transactional entry of a topic without a snapshot:
    /// its first snapshot (Pulsar's `takeFirstSnapshot`).
    pub(crate) fn first_snapshot(&mut self, topic: &str) -> Result<(), BrokerError> {
        if self
            .txn
            .snapshot_book
            .get(topic)
            .is_some_and(|b| b.taken.is_some())
        {
            return Ok(());
        }
        self.take_txn_buffer_snapshot(topic)
    }

    /// A transaction ended on `topic` (its marker is appended and
    /// observed): the aborted set is trimmed to the ledgers the topic has,
    /// and a snapshot is taken when enough transactions ended since the last
    /// one.
    pub(crate) fn txn_ended_on(&mut self, topic: &str) {
        if let Some(t) = self.topics.get(topic) {
            let ledgers = t.ml.ledgers();
            t.buffer.lock().trim_aborted(&ledgers);
        }
        let max = self.txn.snapshot_config.max_transaction_count;
        let due = {
            let book = self.txn.snapshot_book.entry(topic.to_string()).or_default();
            book.ended_since += 1;
            book.ended_since >= max
        };
        if due {
            if let Err(e) = self.take_txn_buffer_snapshot(topic) {
                tracing::warn!(topic, error = %e, "transaction buffer snapshot not taken");
            }
        }
    }

    /// Topics whose max read position moved since their last snapshot,
    /// with when the interval trigger looks at them.
    fn snapshot_candidates(&self) -> Vec<(String, u64)> {
        self.txn
            .snapshot_book
            .iter()
            .filter(|(_, b)| b.taken.is_some())
            .filter_map(|(name, b)| {
                let t = self.topics.get(name)?;
                let mrp = t
                    .buffer
                    .lock()
                    .max_read_position(t.ml.last_confirmed_entry());
                (Some(mrp) != b.taken).then(|| (name.clone(), b.next_at))
            })
            .collect()
    }

    /// The next interval-trigger deadline.
    pub(crate) fn snapshot_timeout(&self) -> Option<u64> {
        self.snapshot_candidates()
            .into_iter()
            .map(|(_, at)| at)
            .min()
    }

    /// The interval trigger (Pulsar's `takeSnapshotByTimeout`).
    pub(crate) fn snapshot_timers(&mut self) {
        let now = self.now();
        for (topic, at) in self.snapshot_candidates() {
            if at > now {
                continue;
            }
            if let Err(e) = self.take_txn_buffer_snapshot(&topic) {
                tracing::warn!(topic, error = %e, "transaction buffer snapshot not taken");
                let next = now.saturating_add(self.txn.snapshot_config.min_time_ms);
                if let Some(b) = self.txn.snapshot_book.get_mut(&topic) {
                    b.next_at = next;
                }
            }
        }
    }
}
