//! Broker-side deduplication (Pulsar's `MessageDeduplication`) and the
//! durable topic epoch of [`super::producer`].
//!
//! Per producer name, the highest sequence id persisted. A SEND whose
//! `sequence_id` is at or below it is a duplicate: it is not stored again
//! and gets a SEND_RECEIPT with message id `(-1, -1)` (Pulsar's
//! `publishContext.completed(null, -1, -1)`), so the client completes the
//! send. A chunked message counts by its last chunk only: earlier chunks are
//! always stored (the consumer drops a repeated chunk id), the last one is
//! judged and recorded.
//!
//! Durable form (Pulsar snapshots the map into the properties of a cursor
//! named `pulsar.dedup` and replays the ledger after the cursor's
//! mark-delete): the same here, on the project's store. Every
//! [`SNAPSHOT_INTERVAL`] entries (or [`SNAPSHOT_INTERVAL_MS`] of sends) the whole map is written as the cursor's
//! properties in one redb transaction, then the cursor is mark-deleted at
//! the last entry the map covers. At topic open the map is read back and
//! every entry after the mark-delete is replayed from its
//! `MessageMetadata` (`producer_name`, `sequence_id`,
//! `highest_sequence_id`). Why this form: an entry's metadata already holds
//! its producer and sequence id and is committed with the entry, so the map
//! is exact after any crash without a second write per SEND; the snapshot
//! only bounds the replay, and it is atomic (one transaction) and ordered
//! before the mark-delete (a crash between them replays more, never less:
//! the map takes maxima, so re-applying an entry changes nothing). The
//! cursor also holds back trimming of the entries the replay needs, as in
//! Pulsar. A replay that cannot read an entry fails the topic's open with
//! a `PersistenceError` (a map that missed an entry would store a retried
//! send twice).
//!
//! The replay takes no partial chunked message into account: an entry that
//! is a chunk other than the last never moves the map, so a message whose
//! last chunk was not stored before a crash is stored whole when retried.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::ledger::{ManagedCursor, ManagedLedger, RedbStore};
use crate::Position;

use super::chunking::{publish_metadata, ChunkPart, PublishFields};
use super::error::{comp, BrokerError};

/// The cursor whose properties hold the snapshot (Pulsar's name).
pub const CURSOR: &str = "pulsar.dedup";
/// Entries between two snapshots (Pulsar's
/// `brokerDeduplicationEntriesInterval` default).
pub const SNAPSHOT_INTERVAL: u64 = 1000;
/// Time between two snapshots while entries are appended (Pulsar's
/// `brokerDeduplicationSnapshotIntervalSeconds` default, 120 s).
pub const SNAPSHOT_INTERVAL_MS: u64 = 120_000;
/// Property key prefix of a producer's highest persisted sequence id.
const SEQ_PREFIX: &str = "seq/";
/// Property key of the topic epoch.
const EPOCH_KEY: &str = "topic_epoch";
/// Entries read per replay step.
const REPLAY_BATCH: usize = 256;

/// Pulsar's `MessageDupStatus`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Store it.
    NotDup,
    /// Already persisted: answer without storing.
    Dup,
    /// At or below a sequence id of an entry of the current group commit
    /// (pushed, not yet durable: Pulsar's `Unknown`, between
    /// `highestSequencedPushed` and `highestSequencedPersisted`). Not
    /// stored; answered after that commit: a duplicate's receipt when it
    /// committed, `PersistenceError` when it failed (the client resends).
    Pending,
}

/// One topic's deduplication state.
pub struct Deduplication {
    enabled: bool,
    store: RedbStore,
    ledger: String,
    cursor: ManagedCursor,
    /// Highest sequence id persisted, by producer name.
    persisted: BTreeMap<String, i64>,
    /// Highest sequence id of an entry of the current group commit, by
    /// producer name (Pulsar's `highestSequencedPushed`); empty between
    /// commits.
    pushed: BTreeMap<String, i64>,
    /// Entries appended since the last snapshot.
    since_snapshot: u64,
    /// The last entry the map covers.
    last: Option<Position>,
    /// When the last snapshot was taken (core time, ms).
    snapshot_ms: u64,
    epoch: Option<u64>,
}

fn seq_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Raises `name`'s highest sequence id in `map` to the entry's (a chunk
/// other than the last counts for nothing).
fn record_in(
    map: &mut BTreeMap<String, i64>,
    name: &str,
    sequence_id: u64,
    highest: u64,
    chunk: Option<ChunkPart>,
) {
    if chunk.is_some_and(|c| !c.is_last()) {
        return;
    }
    let h = seq_i64(sequence_id.max(highest));
    let e = map.entry(name.to_string()).or_insert(h);
    *e = (*e).max(h);
}

impl Deduplication {
    /// Opens (or recovers) the state of `ml`: the snapshot, then the replay
    /// of every entry after it. With `enabled` false every SEND is stored
    /// and `last_sequence_id` is -1 (the epoch is still kept).
    ///
    /// # Errors
    /// [`BrokerError::Component`] when the store or a replayed read fails.
    pub fn recover(
        store: &RedbStore,
        ml: &Arc<ManagedLedger>,
        enabled: bool,
        now_ms: u64,
    ) -> Result<Self, BrokerError> {
        let cursor = ml.open_cursor(CURSOR).map_err(comp)?;
        let props = cursor.properties().map_err(comp)?;
        let mut persisted = BTreeMap::new();
        let mut epoch = None;
        for (k, v) in props {
            if let Some(name) = k.strip_prefix(SEQ_PREFIX) {
                persisted.insert(name.to_string(), v);
            } else if k == EPOCH_KEY {
                epoch = u64::try_from(v).ok();
            }
        }
        let mut d = Self {
            enabled,
            store: store.clone(),
            ledger: ml.name().to_string(),
            cursor,
            persisted,
            pushed: BTreeMap::new(),
            since_snapshot: 0,
            last: None,
            snapshot_ms: now_ms,
            epoch,
        };
        let mut replayed = 0u64;
        loop {
            let entries = d.cursor.read_entries(REPLAY_BATCH).map_err(comp)?;
            if entries.is_empty() {
                break;
            }
            for e in entries {
                replayed += 1;
                d.last = Some(e.position);
                let Ok(md) = publish_metadata(&e.data) else {
                    continue;
                };
                if md.is_marker() {
                    continue;
                }
                let chunk = md.chunk(false).ok().flatten();
                d.record(
                    &md.producer_name,
                    md.sequence_id,
                    md.highest_sequence_id.unwrap_or(0),
                    chunk,
                );
            }
        }
        d.since_snapshot = replayed;
        if replayed >= SNAPSHOT_INTERVAL {
            d.snapshot()?;
        }
        Ok(d)
    }

    /// The cursor's mark-delete: entries after it are replayed at the next
    /// open (and held back from trimming).
    pub fn mark_delete(&self) -> Position {
        self.cursor.mark_delete_position()
    }

    /// Whether entries were appended since the last snapshot (the cursor
    /// holds them back from trimming).
    pub fn behind_snapshot(&self) -> bool {
        self.since_snapshot > 0
    }

    /// The durable topic epoch.
    pub fn topic_epoch(&self) -> Option<u64> {
        self.epoch
    }

    /// Makes `epoch` the durable topic epoch (before any producer is told).
    ///
    /// # Errors
    /// [`BrokerError::Component`] when the store fails (nothing changed).
    pub fn set_topic_epoch(&mut self, epoch: u64) -> Result<(), BrokerError> {
        if self.epoch == Some(epoch) {
            return Ok(());
        }
        let v = i64::try_from(epoch).map_err(|_| {
            BrokerError::ProducerFenced(format!("topic epoch {epoch} above i64::MAX"))
        })?;
        self.cursor.set_property(EPOCH_KEY, v).map_err(comp)?;
        self.epoch = Some(epoch);
        Ok(())
    }

    /// `last_sequence_id` for producer `name` (-1: none, or dedup off).
    pub fn last_sequence_id(&self, name: &str) -> i64 {
        if !self.enabled {
            return -1;
        }
        self.persisted.get(name).copied().unwrap_or(-1)
    }

    /// Whether a SEND of `name` with `sequence_id` (the first of a batch)
    /// and `chunk` is already persisted.
    pub fn check(&self, name: &str, sequence_id: u64, chunk: Option<ChunkPart>) -> Verdict {
        if !self.enabled || chunk.is_some_and(|c| !c.is_last()) {
            return Verdict::NotDup;
        }
        let seq = seq_i64(sequence_id);
        match (self.persisted.get(name), self.pushed.get(name)) {
            (Some(&h), _) if seq <= h => Verdict::Dup,
            (_, Some(&h)) if seq <= h => Verdict::Pending,
            _ => Verdict::NotDup,
        }
    }

    fn record(&mut self, name: &str, sequence_id: u64, highest: u64, chunk: Option<ChunkPart>) {
        record_in(&mut self.persisted, name, sequence_id, highest, chunk);
    }

    /// Entry `sequence_id ..= highest` of `name` joined the current group
    /// commit: a later SEND at or below it is [`Verdict::Pending`] until
    /// [`Deduplication::commit_ended`].
    pub fn pushed(&mut self, name: &str, sequence_id: u64, highest: u64, chunk: Option<ChunkPart>) {
        if self.enabled {
            record_in(&mut self.pushed, name, sequence_id, highest, chunk);
        }
    }

    /// The group commit ended (its entries were recorded by
    /// [`Deduplication::persisted`], or it failed and they are not stored).
    pub fn commit_ended(&mut self) {
        self.pushed.clear();
    }

    /// Entry `pos` of `name` (`sequence_id` ..= `highest`) was persisted at
    /// `now_ms`. Every [`SNAPSHOT_INTERVAL`] entries, or at the first entry
    /// [`SNAPSHOT_INTERVAL_MS`] after the last snapshot, the map is
    /// snapshotted (so the cursor holds back at most that tail); a failed
    /// snapshot is logged and retried at the next entry (the map stays
    /// exact in memory, and the replay after a crash covers the gap).
    pub fn persisted(
        &mut self,
        name: &str,
        sequence_id: u64,
        highest: u64,
        chunk: Option<ChunkPart>,
        pos: Position,
        now_ms: u64,
    ) {
        self.last = Some(pos);
        self.since_snapshot += 1;
        if self.enabled {
            self.record(name, sequence_id, highest, chunk);
        }
        if self.since_snapshot >= SNAPSHOT_INTERVAL
            || now_ms >= self.snapshot_ms.saturating_add(SNAPSHOT_INTERVAL_MS)
        {
            self.snapshot_ms = now_ms;
            if let Err(e) = self.snapshot() {
                tracing::warn!(ledger = %self.ledger, error = %e, "deduplication snapshot failed");
            }
        }
    }

    /// Writes the map as the cursor's properties (one transaction), then
    /// mark-deletes the cursor at the last entry it covers.
    ///
    /// # Errors
    /// [`BrokerError::Component`] when the store fails.
    pub fn snapshot(&mut self) -> Result<(), BrokerError> {
        let Some(last) = self.last else {
            return Ok(());
        };
        let old = self.cursor.properties().map_err(comp)?;
        let txn = self.store.begin().map_err(comp)?;
        for k in old.keys().filter(|k| k.starts_with(SEQ_PREFIX)) {
            let name = &k[SEQ_PREFIX.len()..];
            if !self.persisted.contains_key(name) {
                RedbStore::set_cursor_property_in(&txn, &self.ledger, CURSOR, k, None)
                    .map_err(comp)?;
            }
        }
        for (name, seq) in &self.persisted {
            let key = format!("{SEQ_PREFIX}{name}");
            if old.get(&key) != Some(seq) {
                RedbStore::set_cursor_property_in(&txn, &self.ledger, CURSOR, &key, Some(*seq))
                    .map_err(comp)?;
            }
        }
        txn.commit().map_err(comp)?;
        if last > self.cursor.mark_delete_position() {
            self.cursor.mark_delete(last).map_err(comp)?;
        }
        self.since_snapshot = 0;
        Ok(())
    }
}
