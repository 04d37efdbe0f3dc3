//! One subscription (Pulsar's `PersistentSubscription` with its
//! dispatcher's state): the durable cursor, the deletion state, the delayed
//! tracker, the replay set and the consumers (their PIP-491 permits in the
//! subscription's `permits::broker::SharedDispatcher`); Flow, acks
//! (individual, cumulative, batch-index `ack_set`), redelivery and consumer
//! removal. The dispatch pipeline itself is in `dispatch.rs`.

use std::collections::{BTreeMap, BTreeSet};
// Ownership handles use std's Arc in every build (see `ledger::managed_ledger`).
use std::sync::Arc;

use crate::delayed::{
    BucketDelayedDeliveryTracker, BucketTrackerConfig, Clock, RedbSnapshotStorage,
};
use crate::deletion::CursorDeletionState;
use crate::ledger::{ManagedCursor, ManagedLedger, RedbStore};
use crate::pending_ack::PendingAckHandle;
use crate::permits::broker::{Consumer, ConsumerKey, RemovedConsumer, SharedDispatcher};
use crate::proto::wire::{self, MessageIdData};
use crate::sync::Mutex;
use crate::Position;

use super::entry::entry_info;
use super::error::{comp, BrokerError};
use super::key_shared::{ConsistentHashingSelector, DEFAULT_REPLICA_POINTS};
use super::output::IncarnationRecord;
use super::txn::TxnBuffer;
use super::ConnectionId;

/// Cursor property marking a subscription the core created (so a recovered
/// cursor is not mistaken for a new `Latest` one).
const CREATED_PROPERTY: &str = "serve.created";

/// `CommandSubscribe.SubType` values.
pub mod sub_type {
    /// `Exclusive`.
    pub const EXCLUSIVE: i32 = 0;
    /// `Shared`.
    pub const SHARED: i32 = 1;
    /// `Failover`.
    pub const FAILOVER: i32 = 2;
    /// `Key_Shared`.
    pub const KEY_SHARED: i32 = 3;
}

/// A consumer incarnation attached to a subscription (Pulsar's `Consumer`):
/// what the broker keeps besides its PIP-491 permit state, which is the
/// subscription's [`SharedDispatcher`]'s entry under the same key.
#[derive(Debug)]
pub struct SubConsumer {
    /// (connection, consumer id).
    pub key: ConsumerKey,
    /// Unique per subscribe, across connections.
    pub incarnation: u64,
    /// `consumer_epoch` the client last announced.
    pub epoch: u64,
    pub(crate) name: String,
    pub(crate) priority: i32,
    /// Its connection.
    pub conn: ConnectionId,
    /// Σ Flow permits received.
    pub granted: u64,
    /// Σ `message_permits` of the MESSAGE commands sent.
    pub debited: u64,
    /// MESSAGE commands sent.
    pub commands: u64,
    /// Lowest available balance observed.
    pub min_available: i64,
    /// Redelivery requests received.
    pub redeliveries: u64,
}

impl SubConsumer {
    /// Its permit-ledger record, with the `available` permits and the
    /// `unacked` messages of its dispatcher entry.
    pub fn record(
        &self,
        topic: &str,
        subscription: &str,
        end: &str,
        (available, unacked): (i64, i64),
    ) -> IncarnationRecord {
        IncarnationRecord {
            incarnation: self.incarnation,
            connection_id: self.key.connection_id,
            consumer_id: self.key.consumer_id,
            topic: topic.to_string(),
            subscription: subscription.to_string(),
            granted: self.granted,
            debited: self.debited,
            available,
            min_available: self.min_available,
            commands: self.commands,
            unacked,
            end: end.to_string(),
        }
    }
}

/// How a consumer leaves its subscription ([`Subscription::leave`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Leave {
    /// Its client's CLOSE_CONSUMER.
    Close,
    /// The broker disconnects it (a seek, an unsubscribe).
    Disconnect,
    /// Its connection closed: every consumer of the connection leaves.
    Connection,
}

/// One subscription: durable cursor, deletion state, delayed tracker,
/// replay set and consumers.
pub struct Subscription {
    pub(crate) name: String,
    /// [`sub_type`] value.
    pub sub_type: i32,
    pub(crate) cursor: Arc<ManagedCursor>,
    pub(crate) deletion: Arc<CursorDeletionState>,
    pub(crate) tracker: BucketDelayedDeliveryTracker,
    /// Entries to (re)deliver before new reads, with their key hash.
    pub(crate) replay: BTreeMap<Position, u32>,
    /// Key hash of every entry delivered and not acknowledged.
    pub(crate) inflight: BTreeMap<Position, u32>,
    pub(crate) redelivery_count: BTreeMap<Position, u32>,
    /// Batch size B of every entry delivered and not yet deleted (an ack's
    /// `MessageIdData.batch_size` is optional and the C++ client omits it).
    pub(crate) batch_sizes: BTreeMap<Position, u32>,
    /// Attached consumers (Failover: in priority, then name order).
    pub consumers: Vec<SubConsumer>,
    /// The consumers' PIP-491 permit state (Pulsar's Shared dispatcher
    /// bookkeeping, for every subscription type): one entry per attached
    /// consumer, Flow, the send debit with its write id, write completion,
    /// removal with its pending entries handed to replay.
    pub(crate) dispatcher: SharedDispatcher,
    pub(crate) round_robin: usize,
    /// Key_Shared: the consistent-hashing ring of the consumers.
    pub(crate) selector: ConsistentHashingSelector<ConsumerKey>,
    /// The topic's transaction buffer (max read position, aborted
    /// transactions), shared with the topic.
    pub(crate) buffer: Arc<Mutex<TxnBuffer>>,
    /// The pending-ack handle of transactional acks (opened by the broker).
    pub(crate) pending_ack: Option<PendingAckHandle>,
    /// Whether the commits the pending-ack replay handed back were applied.
    pub(crate) pending_ack_applied: bool,
    /// Entries acknowledged inside a transaction not yet ended: not
    /// dispatched (an abort puts them back in replay).
    pub(crate) txn_pending: BTreeSet<Position>,
    /// Batch indexes acknowledged inside transactions not yet ended, per
    /// entry: dispatch leaves them out of the `ack_set` it sends (Pulsar's
    /// `filterEntriesForConsumer` ANDs the pending-ack handle's ack set in).
    pub(crate) txn_batch_pending: BTreeMap<Position, BTreeSet<u32>>,
    /// The embedder's pending-ack admission rule (`None`: admit all).
    pub(crate) admission: Option<super::admission::AdmissionHook>,
    /// Entries refused by admission (each put back in replay).
    pub admission_rejections: u64,
    /// The components' work on this subscription.
    pub counters: super::counters::DispatchCounters,
    /// The cursor read issued and not yet used (`read_completion.rs`).
    pub(crate) read_in_flight: Option<super::read_completion::InFlightRead>,
    /// Reads wait after a failed one (`read_backoff.rs`).
    pub(crate) read_backoff: super::read_backoff::ReadBackoff,
    /// The core's clock (the read backoff's deadlines).
    pub(crate) clock: Arc<dyn Clock>,
    /// Where its delayed tracker's calls are reported (`delayed_hooks.rs`).
    #[cfg_attr(not(feature = "sim"), allow(dead_code))]
    pub(crate) watch: super::delayed_hooks::TrackerWatch,
}

/// `ack_set` restricted to the indexes of a batch of `size` messages (set
/// bit = index still unacknowledged; bits at or above `size` cleared).
pub(super) fn within_batch(ack_set: &[i64], size: u32) -> Vec<i64> {
    let all = wire::ack_set_from_indexes(0..size);
    all.iter()
        .zip(ack_set.iter().chain(std::iter::repeat(&0)))
        .map(|(a, b)| a & b)
        .collect()
}

/// The delayed tracker settings of a subscription unless the
/// [`BrokerConfig`](super::BrokerConfig) says otherwise: Pulsar's bucket
/// defaults, a 100 ms tick and strict delivery times.
pub fn default_tracker_config() -> BucketTrackerConfig {
    BucketTrackerConfig {
        tick_time_ms: 100,
        deliver_at_time_strict: true,
        ..BucketTrackerConfig::default()
    }
}

impl Subscription {
    /// As [`Subscription::open_with`] with [`default_tracker_config`].
    ///
    /// # Errors
    /// As [`Subscription::open_with`].
    pub fn open(
        store: &RedbStore,
        ml: &Arc<ManagedLedger>,
        name: &str,
        sub_type: i32,
        earliest: bool,
        clock: Arc<dyn Clock>,
        now_ms: u64,
    ) -> Result<Self, BrokerError> {
        let config = default_tracker_config();
        Self::open_with(store, ml, name, sub_type, earliest, clock, now_ms, config)
    }

    /// Opens (or recovers) subscription `name` on `ml`: a new one starts at
    /// the end of the topic unless `earliest`; a recovered one at its
    /// persisted mark-delete, individually deleted entries and batch ack
    /// sets. The delayed tracker reads time from `clock`; `now_ms` stamps a
    /// new subscription's creation.
    ///
    /// The delayed tracker runs with `tracker_config`.
    ///
    /// # Errors
    /// [`BrokerError::Component`] when the store fails.
    #[allow(clippy::too_many_arguments)]
    pub fn open_with(
        store: &RedbStore,
        ml: &Arc<ManagedLedger>,
        name: &str,
        sub_type: i32,
        earliest: bool,
        clock: Arc<dyn Clock>,
        now_ms: u64,
        tracker_config: BucketTrackerConfig,
    ) -> Result<Self, BrokerError> {
        let storage = RedbSnapshotStorage::new(store.clone(), ml.name(), name).map_err(comp)?;
        Self::open_on_storage(
            ml,
            name,
            sub_type,
            earliest,
            clock,
            now_ms,
            tracker_config,
            Arc::new(storage),
            super::delayed_hooks::TrackerWatch::default(),
        )
    }

    /// As [`Subscription::open_with`], with the delayed tracker's snapshots
    /// in `storage` and its calls reported to `watch`.
    ///
    /// # Errors
    /// As [`Subscription::open_with`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn open_on_storage(
        ml: &Arc<ManagedLedger>,
        name: &str,
        sub_type: i32,
        earliest: bool,
        clock: Arc<dyn Clock>,
        now_ms: u64,
        tracker_config: BucketTrackerConfig,
        storage: Arc<dyn crate::delayed::BucketSnapshotStorage>,
        watch: super::delayed_hooks::TrackerWatch,
    ) -> Result<Self, BrokerError> {
        let cursor = Arc::new(ml.open_cursor(name).map_err(comp)?);
        let props = cursor.properties().map_err(comp)?;
        if !props.contains_key(CREATED_PROPERTY) {
            if !earliest {
                cursor
                    .mark_delete(ml.last_confirmed_entry())
                    .map_err(comp)?;
            }
            cursor
                .set_property(CREATED_PROPERTY, i64::try_from(now_ms).unwrap_or(i64::MAX))
                .map_err(comp)?;
        }
        // Mark-delete, individually deleted entries and the batch ack sets
        // of partially acknowledged batches, as the last ack persisted them.
        let deletion = Arc::new(cursor.recover_deletion_state().map_err(comp)?);
        Self::assemble(
            ml,
            name,
            sub_type,
            cursor,
            deletion,
            storage,
            clock,
            tracker_config,
            watch,
        )
    }

    /// A subscription on `cursor` with `deletion` as its deletion state and
    /// a delayed tracker on `storage` (shared by durable and non-durable
    /// subscriptions), its tracker's calls reported to `watch`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn assemble(
        ml: &Arc<ManagedLedger>,
        name: &str,
        sub_type: i32,
        cursor: Arc<ManagedCursor>,
        deletion: Arc<CursorDeletionState>,
        storage: Arc<dyn crate::delayed::BucketSnapshotStorage>,
        clock: Arc<dyn Clock>,
        tracker_config: BucketTrackerConfig,
        watch: super::delayed_hooks::TrackerWatch,
    ) -> Result<Self, BrokerError> {
        let tracker = BucketDelayedDeliveryTracker::new(tracker_config, storage, clock.clone())
            .map_err(comp)?;
        crate::trace::bucket_merge::tracker_of(&tracker, ml.name(), name);
        tracker.update_mark_delete(deletion.mark_delete_position());
        tracing::info!(
            topic = ml.name(),
            subscription = name,
            mark_delete = %deletion.mark_delete_position(),
            ranges = deletion.individually_deleted_ranges().len(),
            delayed = tracker.number_of_delayed_messages(),
            "subscription opened"
        );
        let sub = Self {
            name: name.to_string(),
            sub_type,
            cursor,
            deletion,
            tracker,
            replay: BTreeMap::new(),
            inflight: BTreeMap::new(),
            redelivery_count: BTreeMap::new(),
            batch_sizes: BTreeMap::new(),
            consumers: Vec::new(),
            dispatcher: SharedDispatcher::new(),
            round_robin: 0,
            selector: ConsistentHashingSelector::new(DEFAULT_REPLICA_POINTS),
            buffer: Arc::new(Mutex::new(TxnBuffer::default())),
            pending_ack: None,
            pending_ack_applied: false,
            txn_pending: BTreeSet::new(),
            txn_batch_pending: BTreeMap::new(),
            admission: None,
            admission_rejections: 0,
            counters: super::counters::DispatchCounters::default(),
            read_in_flight: None,
            read_backoff: super::read_backoff::ReadBackoff::default(),
            clock,
            watch,
        };
        super::delayed_hooks::observe_tracker!(
            &sub,
            super::delayed_hooks::TrackerCall::Opened {
                mark_delete: sub.deletion.mark_delete_position(),
            }
        );
        Ok(sub)
    }

    /// Takes the batch indexes acknowledged in open transactions from the
    /// pending-ack handle's `summary` (after every transactional ack, end
    /// and replay).
    pub(crate) fn refresh_txn_batch_pending(
        &mut self,
        summary: &crate::pending_ack::PendingAckSummary,
    ) {
        let mut pending: BTreeMap<Position, BTreeSet<u32>> = BTreeMap::new();
        for per_txn in summary.batch_indexes.values() {
            for (p, indexes) in per_txn {
                pending
                    .entry(*p)
                    .or_default()
                    .extend(indexes.iter().copied());
            }
        }
        self.txn_batch_pending = pending;
    }

    /// The `ack_set` to send with the entry at `p` of `batch_size`
    /// messages: the deletion state's (indexes still unacknowledged; empty:
    /// all), without the indexes acknowledged in open transactions.
    /// `None` when every remaining index is pending in a transaction (the
    /// entry is not dispatched, as Pulsar filters it).
    pub(crate) fn dispatch_ack_set(&self, p: Position, batch_size: u32) -> Option<Vec<i64>> {
        let ack_set = self.deletion.batch_ack_set(p).unwrap_or_default();
        let Some(pending) = self.txn_batch_pending.get(&p) else {
            return Some(ack_set);
        };
        let left: Vec<u32> = (0..batch_size)
            .filter(|i| wire::is_deliverable(&ack_set, *i) && !pending.contains(i))
            .collect();
        if left.is_empty() {
            return None;
        }
        Some(wire::ack_set_from_indexes(left))
    }

    /// The subscription name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The mark-delete position.
    pub fn mark_delete(&self) -> Position {
        self.deletion.mark_delete_position()
    }

    /// The deletion state (mark-delete, individually deleted ranges, batch
    /// ack sets).
    pub fn deletion(&self) -> &CursorDeletionState {
        &self.deletion
    }

    /// The delayed tracker.
    pub fn tracker(&self) -> &BucketDelayedDeliveryTracker {
        &self.tracker
    }

    /// Entries waiting for redelivery.
    pub fn replay_len(&self) -> usize {
        self.replay.len()
    }

    pub(crate) fn consumer_mut(&mut self, key: ConsumerKey) -> Option<&mut SubConsumer> {
        self.consumers.iter_mut().find(|c| c.key == key)
    }

    /// The permit state of consumer `key` (its dispatcher entry).
    pub fn permits(&self, key: ConsumerKey) -> Option<&Consumer> {
        self.dispatcher.consumer(key)
    }

    /// Available permits of consumer `key` (0 when not registered).
    pub(crate) fn available(&self, key: ConsumerKey) -> i64 {
        self.permits(key).map_or(0, Consumer::available_permits)
    }

    /// (available permits, unacked messages) of consumer `key`, for its
    /// permit-ledger record.
    pub(crate) fn balance(&self, key: ConsumerKey) -> (i64, i64) {
        self.permits(key)
            .map_or((0, 0), |c| (c.available_permits(), c.unacked_messages()))
    }

    /// Attaches a consumer (the caller checked the subscription's type)
    /// and registers it in the dispatcher with 0 permits.
    ///
    /// # Errors
    /// The dispatcher's refusal of a key already registered (nothing
    /// attached).
    pub(crate) fn add_consumer(&mut self, c: SubConsumer) -> Result<(), String> {
        self.dispatcher
            .add_consumer(c.key, c.epoch)
            .map_err(|e| e.to_string())?;
        if self.sub_type == sub_type::KEY_SHARED {
            self.selector.add_consumer(c.key, &c.name);
        }
        self.consumers.push(c);
        if self.sub_type == sub_type::FAILOVER {
            self.consumers
                .sort_by(|a, b| (a.priority, &a.name).cmp(&(b.priority, &b.name)));
        }
        Ok(())
    }

    /// Applies a Flow (the caller dispatches afterwards).
    pub(crate) fn flow(&mut self, key: ConsumerKey, permits: u32) -> Result<(), String> {
        self.dispatcher
            .consumer_flow(key, permits)
            .map_err(|e| e.to_string())?;
        if let Some(c) = self.consumer_mut(key) {
            c.granted += u64::from(permits);
        }
        Ok(())
    }

    /// Removes consumer `key` (`how`: [`Leave::Connection`] removes every
    /// consumer of its connection) from the dispatcher; the caller
    /// [`detach`](Self::detach)es each removed one.
    pub(crate) fn leave(&mut self, key: ConsumerKey, how: Leave) -> Vec<RemovedConsumer> {
        match how {
            Leave::Close => self
                .dispatcher
                .remove_consumer(key)
                .ok()
                .into_iter()
                .collect(),
            Leave::Disconnect => self
                .dispatcher
                .disconnect_consumer(key)
                .ok()
                .into_iter()
                .collect(),
            Leave::Connection => self.dispatcher.remove_connection(key.connection_id),
        }
    }

    /// Detaches a consumer the dispatcher removed: out of the consumer
    /// order and the Key_Shared ring; the dispatcher's replay set (its
    /// unacknowledged entries) moves to the subscription's replay with
    /// their key hashes (the caller dispatches afterwards).
    pub(crate) fn detach(&mut self, removed: &RemovedConsumer) -> Option<SubConsumer> {
        for p in self.dispatcher.take_replay() {
            let h = self.inflight.remove(&p).unwrap_or(0);
            self.replay.insert(p, h);
        }
        let idx = self.consumers.iter().position(|c| c.key == removed.key)?;
        self.selector.remove_consumer(&removed.key);
        Some(self.consumers.remove(idx))
    }

    /// Settles `p` on every consumer that has it pending (acknowledged,
    /// released for redelivery or rewound): its unacked count drops, no
    /// permit is credited.
    pub(crate) fn settle_pending(&mut self, p: Position) {
        for c in &self.consumers {
            let _ = self.dispatcher.acknowledge(c.key, p);
        }
    }

    /// Moves `positions` of consumer `key` (all its pending when empty) to
    /// replay (the caller dispatches afterwards).
    pub(crate) fn redeliver(
        &mut self,
        key: ConsumerKey,
        positions: &[Position],
        epoch: Option<u64>,
    ) {
        let Some(c) = self.consumers.iter_mut().find(|c| c.key == key) else {
            return;
        };
        if let Some(e) = epoch {
            c.epoch = c.epoch.max(e);
        }
        c.redeliveries += 1;
        let targets: Vec<Position> = if positions.is_empty() {
            self.permits(key)
                .map(|c| c.pending_acks().keys().copied().collect())
                .unwrap_or_default()
        } else {
            positions.to_vec()
        };
        let mut moved = Vec::new();
        for p in targets {
            if self.dispatcher.acknowledge(key, p).is_ok() {
                moved.push(p);
            }
        }
        for p in moved {
            let h = self.inflight.remove(&p).unwrap_or(0);
            self.replay.insert(p, h);
        }
    }

    /// Batch size B of the entry at `p` (recorded at delivery, else read
    /// from the ledger); an error, with no state changed, for a position
    /// the ledger does not hold or an entry whose metadata is unreadable.
    pub(crate) fn batch_size_of(&mut self, ml: &ManagedLedger, p: Position) -> Result<u32, String> {
        if let Some(b) = self.batch_sizes.get(&p) {
            return Ok(*b);
        }
        let size = match ml.read_positions(&[p]) {
            Ok(e) => e
                .first()
                .and_then(|e| entry_info(&e.data).ok())
                .map(|i| i.batch_size)
                .ok_or_else(|| format!("ack_set for unreadable entry {p}"))?,
            Err(e) => return Err(format!("ack_set for entry {p}: {e}")),
        };
        self.batch_sizes.insert(p, size);
        Ok(size)
    }

    /// Acknowledges `ids` (individual, with batch-index `ack_set`) or
    /// cumulatively up to the first id, and persists the deletion state in
    /// one store transaction (synchronously: its completion is the return).
    /// The caller dispatches afterwards.
    ///
    /// # Errors
    /// A description of the failure (unreadable entry for an `ack_set`,
    /// store failure); the acks before it in `ids` may have been applied in
    /// memory but are persisted only by a later successful ack.
    pub fn ack(
        &mut self,
        ml: &ManagedLedger,
        cumulative: bool,
        ids: &[MessageIdData],
    ) -> Result<(), String> {
        if self.apply_ack(ml, cumulative, ids)? {
            self.persist_and_settle()?;
        }
        Ok(())
    }

    /// Applies the acks of `ids` to the in-memory deletion state only (as
    /// [`Subscription::ack`] without the persist): `true` when the state
    /// changed and needs [`Subscription::persist_and_settle`] before the
    /// ack may be confirmed (the broker's group commit, `group_commit.rs`).
    ///
    /// # Errors
    /// As [`Subscription::ack`], without the store's.
    pub(crate) fn apply_ack(
        &mut self,
        ml: &ManagedLedger,
        cumulative: bool,
        ids: &[MessageIdData],
    ) -> Result<bool, String> {
        let mut full = Vec::new();
        for id in ids {
            let p = Position::new(id.ledger_id as i64, id.entry_id as i64);
            if !cumulative && !id.ack_set.is_empty() {
                // Already acknowledged (e.g. an ack the client re-sent after
                // a lost receipt, whose ledger consumed-ledger trimming may
                // have deleted since): nothing to do, and nothing to read.
                if self.deletion.is_message_deleted(p) {
                    continue;
                }
                // The deletion state ANDs the stored set with this one (an
                // index once acknowledged stays so) and deletes the entry
                // when none is left; bits at or above B are not indexes.
                let size = self.batch_size_of(ml, p)?;
                let remaining = within_batch(&id.ack_set, size);
                self.deletion
                    .delete_batch_indexes(p, &remaining, ml)
                    .map_err(|e| e.to_string())?;
                self.counters.batch_index_acks += 1;
                continue;
            }
            full.push(p);
        }
        if cumulative {
            // A cumulative ack inside a batch (batch-index acks on) carries
            // the batch's remaining indexes: everything before the entry is
            // acknowledged, the entry itself only partially.
            let mut batch_acked = false;
            if let Some(id) = ids.first().filter(|id| !id.ack_set.is_empty()) {
                let p = Position::new(id.ledger_id as i64, id.entry_id as i64);
                if !self.deletion.is_message_deleted(p) {
                    // The entry must exist (its B read from it) and the kept
                    // set covers B indexes only: a peer's ack_set never
                    // grows the state beyond the entries' own sizes.
                    let size = self.batch_size_of(ml, p)?;
                    let remaining = within_batch(&id.ack_set, size);
                    self.deletion
                        .delete_batch_indexes(p, &remaining, ml)
                        .map_err(|e| e.to_string())?;
                    batch_acked = true;
                }
                full = vec![p.previous_in_ledger()];
            }
            let advance = full
                .iter()
                .max()
                .copied()
                .filter(|p| *p > self.deletion.mark_delete_position());
            match advance {
                Some(p) => self
                    .deletion
                    .mark_delete(p, ml)
                    .map(|_| ())
                    .map_err(|e| e.to_string())?,
                // Nothing new: nothing to persist.
                None if !batch_acked => return Ok(false),
                None => {}
            }
        } else if !full.is_empty() {
            self.deletion.delete(&full, ml).map_err(|e| e.to_string())?;
        }
        Ok(true)
    }

    /// Persists the deletion state (mark-delete, every individually deleted
    /// entry and the batch ack sets in one store transaction, no range cap),
    /// then settles what is now deleted: consumers' pending acks, replay,
    /// in-flight and per-entry bookkeeping.
    ///
    /// # Errors
    /// The store's failure (nothing settled).
    pub(crate) fn persist_and_settle(&mut self) -> Result<(), String> {
        let md = self.deletion.mark_delete_position();
        self.cursor
            .persist_deletion_state(&self.deletion, &[])
            .map_err(|e| e.to_string())?;
        let ranges = self.deletion.individually_deleted_range_count() as u64;
        self.counters.peak_deleted_ranges = self.counters.peak_deleted_ranges.max(ranges);
        self.tracker.update_mark_delete(md);
        super::delayed_hooks::observe_tracker!(
            self,
            super::delayed_hooks::TrackerCall::MarkDelete(md)
        );
        // Settle pending acks of every consumer for what is now deleted,
        // then the subscription's per-entry bookkeeping: every position
        // checked under one read lock of the deletion state.
        let Self {
            deletion,
            dispatcher,
            inflight,
            replay,
            redelivery_count,
            batch_sizes,
            ..
        } = self;
        deletion.with_deleted_check(|deleted| {
            let done: Vec<(ConsumerKey, Position)> = dispatcher
                .consumers()
                .flat_map(|c| {
                    c.pending_acks()
                        .keys()
                        .filter(|p| deleted(**p))
                        .map(move |p| (c.key(), *p))
                })
                .collect();
            for (key, p) in done {
                let _ = dispatcher.acknowledge(key, p);
            }
            inflight.retain(|p, _| !deleted(*p));
            replay.retain(|p, _| !deleted(*p));
            redelivery_count.retain(|p, _| !deleted(*p));
            batch_sizes.retain(|p, _| !deleted(*p));
        });
        Ok(())
    }
}
