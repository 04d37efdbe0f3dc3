//! Topics, subscriptions and dispatch of `pulsar-core serve`, on the
//! library's components:
//!
//! | concern | component |
//! |---|---|
//! | entries, durable cursors (mark-delete, the deletion state in its compact record, properties) | `ledger::ManagedLedger` / `ManagedCursor` on one `RedbStore` |
//! | acknowledged state, read-scheduling hint, post-I/O filter | `cursor::CursorDeletionState` (`SkipDeleted`: the lock-free hint per entry and one run-end query per deleted run, in `read_entries_with_skip_runs`; `filter_read_entries` after the read; batch ack sets; persisted with `persist_deletion_state`) |
//! | `deliver_at_time` | `delayed::BucketDelayedDeliveryTracker` (strict, snapshots in the same redb file) |
//! | permits, P per command (`message_permits`), unacked count | `permits::broker::Consumer::send_messages` |
//!
//! Locks: `Broker::topics` → `Topic::subscriptions` → one `Subscription`
//! → a connection's outbound queue. Dispatch runs with the subscription
//! locked and queues MESSAGE frames under it (the queue never blocks on the
//! socket), so the permit state, the pending acks and the frames sent agree
//! at every point; a consumer whose connection's queue is above the high
//! watermark is passed over like one without permits.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use prost::Message;
use pulsar_core::cursor::{CursorDeletionState, SkipDeleted};
use pulsar_core::delayed::{
    BucketDelayedDeliveryTracker, BucketTrackerConfig, Clock, RedbSnapshotStorage, SystemClock,
};
use pulsar_core::ledger::{Entry, LedgerConfig, ManagedCursor, ManagedLedger, RedbStore};
use pulsar_core::permits::broker::{AdmitAll, BrokerEntry, Consumer, ConsumerKey};
use pulsar_core::permits::wire::{self, MessageIdData};
use pulsar_core::Position;

use super::conn::ConnWriter;
use super::proto::{ty, DispatchMetadata, ServeCommand};

/// Cursor property marking a subscription the server created (so a
/// recovered cursor is not mistaken for a new `Latest` one).
const CREATED_PROPERTY: &str = "serve.created";
/// Entries read from the cursor (or replayed) per dispatch round.
const READ_BATCH: usize = 100;

/// Errors of broker operations, answered to the client as `CommandError`.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// Storage or component failure.
    #[error("{0}")]
    Component(String),
    /// Topic name not `persistent://tenant/namespace/topic`.
    #[error("invalid topic name {0:?}: expected persistent://tenant/namespace/topic")]
    InvalidTopic(String),
    /// Exclusive subscription already has a consumer, or sub type mismatch.
    #[error("{0}")]
    ConsumerBusy(String),
}

impl BrokerError {
    /// The `ServerError` value.
    pub fn server_error(&self) -> i32 {
        use super::proto::server_error as e;
        match self {
            BrokerError::Component(_) => e::PERSISTENCE_ERROR,
            BrokerError::InvalidTopic(_) => e::INVALID_TOPIC_NAME,
            BrokerError::ConsumerBusy(_) => e::CONSUMER_BUSY,
        }
    }
}

fn comp(e: impl std::fmt::Display) -> BrokerError {
    BrokerError::Component(e.to_string())
}

/// Current wall time in epoch milliseconds.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Longest topic or subscription name accepted, in bytes (a bound of
/// `serve`'s own: each name is a store key and stays in memory while the
/// node runs).
pub const MAX_NAME_BYTES: usize = 1024;

/// `name` for an error message: at most 64 characters of it.
pub fn name_for_error(name: &str) -> String {
    match name.char_indices().nth(64) {
        Some((at, _)) => format!("{}… ({} bytes)", &name[..at], name.len()),
        None => name.to_string(),
    }
}

/// Normalises `my-topic` / `public/default/my-topic` to
/// `persistent://public/default/my-topic`; names above [`MAX_NAME_BYTES`]
/// are invalid.
pub fn normalize_topic(name: &str) -> Result<String, BrokerError> {
    if name.len() > MAX_NAME_BYTES {
        return Err(BrokerError::InvalidTopic(name_for_error(name)));
    }
    if let Some(rest) = name.strip_prefix("persistent://") {
        if rest.split('/').count() == 3 && rest.split('/').all(|p| !p.is_empty()) {
            return Ok(name.to_string());
        }
        return Err(BrokerError::InvalidTopic(name_for_error(name)));
    }
    if name.contains("://") {
        return Err(BrokerError::InvalidTopic(name_for_error(name)));
    }
    match name.split('/').count() {
        1 if !name.is_empty() => Ok(format!("persistent://public/default/{name}")),
        3 if name.split('/').all(|p| !p.is_empty()) => Ok(format!("persistent://{name}")),
        _ => Err(BrokerError::InvalidTopic(name_for_error(name))),
    }
}

/// The single node: its store and topics.
pub struct Broker {
    store: RedbStore,
    topics: Mutex<HashMap<String, Arc<Topic>>>,
    next_incarnation: AtomicU64,
    permit_ledger: Option<Mutex<std::fs::File>>,
}

/// Locks a mutex, recovering it from a panicked holder (a panic in one
/// connection's thread must not take the node down).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Broker {
    /// A broker on `store`; `permit_ledger` receives one JSON line per
    /// consumer incarnation when it ends (and periodic snapshots).
    pub fn new(store: RedbStore, permit_ledger: Option<std::fs::File>) -> Self {
        Self {
            store,
            topics: Mutex::new(HashMap::new()),
            next_incarnation: AtomicU64::new(1),
            permit_ledger: permit_ledger.map(Mutex::new),
        }
    }

    /// Opens (or recovers) topic `name` (normalised).
    pub fn topic(&self, name: &str) -> Result<Arc<Topic>, BrokerError> {
        let name = normalize_topic(name)?;
        let mut topics = lock(&self.topics);
        if let Some(t) = topics.get(&name) {
            return Ok(Arc::clone(t));
        }
        let ml = ManagedLedger::open(
            name.clone(),
            LedgerConfig::default(),
            Arc::new(self.store.clone()),
        )
        .map_err(comp)?;
        let t = Arc::new(Topic {
            name: name.clone(),
            ml,
            subscriptions: Mutex::new(HashMap::new()),
        });
        topics.insert(name, Arc::clone(&t));
        Ok(t)
    }

    /// Every open topic.
    pub fn topics(&self) -> Vec<Arc<Topic>> {
        lock(&self.topics).values().cloned().collect()
    }

    /// Subscribes a consumer; returns its subscription.
    #[allow(clippy::too_many_arguments)]
    pub fn subscribe(
        &self,
        topic: &Arc<Topic>,
        subscription: &str,
        sub_type: i32,
        earliest: bool,
        key: ConsumerKey,
        epoch: u64,
        name: String,
        priority: i32,
        conn: Arc<ConnWriter>,
    ) -> Result<Arc<Mutex<Subscription>>, BrokerError> {
        let sub = {
            let mut subs = lock(&topic.subscriptions);
            match subs.get(subscription) {
                Some(s) => Arc::clone(s),
                None => {
                    let s = Arc::new(Mutex::new(Subscription::open(
                        &self.store,
                        &topic.ml,
                        subscription,
                        sub_type,
                        earliest,
                        Arc::new(SystemClock),
                    )?));
                    subs.insert(subscription.to_string(), Arc::clone(&s));
                    s
                }
            }
        };
        {
            let mut s = lock(&sub);
            if s.consumers.is_empty() {
                s.sub_type = sub_type;
            } else if s.sub_type != sub_type {
                return Err(BrokerError::ConsumerBusy(format!(
                    "subscription {subscription} has type {}, not {}",
                    s.sub_type, sub_type
                )));
            } else if sub_type == 0 {
                return Err(BrokerError::ConsumerBusy(format!(
                    "exclusive subscription {subscription} already has a consumer"
                )));
            }
            let incarnation = self.next_incarnation.fetch_add(1, Ordering::Relaxed);
            s.consumers.push(SubConsumer {
                key,
                incarnation,
                epoch,
                name,
                priority,
                conn,
                permits: Consumer::new(key, epoch),
                granted: 0,
                debited: 0,
                commands: 0,
                min_available: 0,
                redeliveries: 0,
            });
            if s.sub_type == 2 {
                s.consumers
                    .sort_by(|a, b| (a.priority, &a.name).cmp(&(b.priority, &b.name)));
            }
            tracing::info!(topic = %topic.name, subscription, ?key, incarnation, sub_type, "consumer subscribed");
            if let Some(c) = s.consumers.iter().find(|c| c.key == key) {
                self.write_ledger(&topic.name, subscription, c, "subscribed");
            }
        }
        Ok(sub)
    }

    /// Writes one permit-ledger line for consumer incarnation `c`.
    pub fn write_ledger(&self, topic: &str, sub: &str, c: &SubConsumer, end: &str) {
        let Some(f) = &self.permit_ledger else { return };
        let line = format!(
            "{{\"boot\":{},\"incarnation\":{},\"connection_id\":{},\"consumer_id\":{},\"topic\":{:?},\"subscription\":{:?},\"granted\":{},\"debited\":{},\"available\":{},\"min_available\":{},\"commands\":{},\"unacked\":{},\"end\":{:?}}}\n",
            std::process::id(),
            c.incarnation,
            c.key.connection_id,
            c.key.consumer_id,
            topic,
            sub,
            c.granted,
            c.debited,
            c.permits.available_permits(),
            c.min_available,
            c.commands,
            c.permits.unacked_messages(),
            end
        );
        let mut f = lock(f);
        if let Err(e) = f.write_all(line.as_bytes()).and_then(|()| f.flush()) {
            tracing::error!(error = %e, "cannot write the permit ledger");
        }
    }

    /// Snapshots every live incarnation into the permit ledger.
    pub fn snapshot_ledger(&self, end: &str) {
        for t in self.topics() {
            let subs: Vec<_> = lock(&t.subscriptions)
                .iter()
                .map(|(n, s)| (n.clone(), Arc::clone(s)))
                .collect();
            for (name, s) in subs {
                let s = lock(&s);
                for c in &s.consumers {
                    self.write_ledger(&t.name, &name, c, end);
                }
            }
        }
    }

    /// Runs dispatch on every subscription with consumers: the
    /// delayed-delivery timer, and the resumption of consumers whose
    /// connection drained its outbound queue below the high watermark.
    pub fn dispatch_all(&self) {
        for t in self.topics() {
            let subs: Vec<_> = lock(&t.subscriptions).values().cloned().collect();
            for s in subs {
                let mut s = lock(&s);
                if !s.consumers.is_empty() {
                    s.dispatch(&t.ml);
                }
            }
        }
    }
}

/// One topic: its managed ledger and subscriptions.
pub struct Topic {
    /// `persistent://tenant/namespace/topic`.
    pub name: String,
    /// Its managed ledger.
    pub ml: Arc<ManagedLedger>,
    /// Subscriptions by name.
    pub subscriptions: Mutex<HashMap<String, Arc<Mutex<Subscription>>>>,
}

/// A consumer incarnation attached to a subscription.
pub struct SubConsumer {
    /// (connection, consumer id).
    pub key: ConsumerKey,
    /// Unique per subscribe, across connections.
    pub incarnation: u64,
    /// `consumer_epoch` the client last announced.
    pub epoch: u64,
    name: String,
    priority: i32,
    conn: Arc<ConnWriter>,
    /// The library's permit state of this incarnation.
    pub permits: Consumer,
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
    /// Whether dispatch may send this consumer a MESSAGE now: permits left
    /// and its connection's outbound queue below the high watermark
    /// (Pulsar's `Consumer.isWritable`).
    fn can_receive(&self) -> bool {
        self.permits.available_permits() > 0 && self.conn.is_writable()
    }
}

/// What dispatch needs from an entry's metadata.
pub struct EntryInfo {
    batch_size: u32,
    key_hash: u32,
    deliver_at: Option<i64>,
}

fn key_hash(key: &[u8]) -> u32 {
    // Murmur3-like finaliser over FNV-1a: stable across restarts.
    let mut h: u32 = 0x811c_9dc5;
    for b in key {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h
}

/// Smallest encoding of one message inside a batch payload: its 4-byte
/// metadata size and a `SingleMessageMetadata` holding only the required
/// `payload_size` (key + 1-byte varint), with an empty payload.
const MIN_BATCHED_MESSAGE_BYTES: usize = 6;

/// Reads the `MessageMetadata` of a stored entry (`[0x0e02 …]? [0x0e01][crc]?
/// [size][MessageMetadata]…`).
pub fn entry_info(data: &[u8]) -> Result<EntryInfo, String> {
    let parsed =
        pulsar_core::permits::frame::parse_entry_payload(data).map_err(|e| e.to_string())?;
    let meta_len = data.len() - parsed.payload.len();
    let mut at = 0usize;
    if data.get(0..2) == Some(&[0x0e, 0x02]) {
        let n = u32::from_be_bytes(data[2..6].try_into().map_err(|_| "short")?) as usize;
        at = 6 + n;
    }
    if data.get(at..at + 2) == Some(&[0x0e, 0x01]) {
        at += 6;
    }
    let meta = data.get(at + 4..meta_len).ok_or("metadata out of range")?;
    let m = DispatchMetadata::decode(meta).map_err(|e| e.to_string())?;
    let batch = m.num_messages_in_batch.unwrap_or(1);
    // Each message of a batch takes at least MIN_BATCHED_MESSAGE_BYTES of the
    // payload: a count the payload cannot hold is corrupt, and trusting it
    // would size ack sets and permits from a peer's number.
    // A compressed batch holds `uncompressed_size` bytes once inflated,
    // bounded like any frame.
    let batch_bytes = match m.compression {
        Some(c) if c != 0 => (m.uncompressed_size.unwrap_or(0) as usize)
            .min(pulsar_core::permits::frame::DEFAULT_MAX_FRAME_SIZE),
        _ => parsed.payload.len(),
    };
    if batch > 1 && (batch as usize).saturating_mul(MIN_BATCHED_MESSAGE_BYTES) > batch_bytes {
        return Err(format!(
            "num_messages_in_batch {batch} exceeds what a {batch_bytes}-byte batch payload can hold"
        ));
    }
    let key = m
        .ordering_key
        .clone()
        .or_else(|| m.partition_key.clone().map(String::into_bytes));
    Ok(EntryInfo {
        batch_size: u32::try_from(batch.max(1)).unwrap_or(1),
        key_hash: key.as_deref().map(key_hash).unwrap_or(0),
        deliver_at: m.deliver_at_time,
    })
}

/// One subscription: durable cursor, deletion state, delayed tracker,
/// replay set and consumers.
pub struct Subscription {
    name: String,
    /// 0 Exclusive, 1 Shared, 2 Failover, 3 Key_Shared.
    pub sub_type: i32,
    cursor: ManagedCursor,
    deletion: CursorDeletionState,
    tracker: BucketDelayedDeliveryTracker,
    /// Entries to (re)deliver before new reads, with their key hash.
    replay: BTreeMap<Position, u32>,
    /// Key hash of every entry delivered and not acknowledged.
    inflight: HashMap<Position, u32>,
    redelivery_count: HashMap<Position, u32>,
    /// Batch size B of every entry delivered and not yet deleted (an ack's
    /// `MessageIdData.batch_size` is optional and the C++ client omits it).
    batch_sizes: HashMap<Position, u32>,
    /// Attached consumers.
    pub consumers: Vec<SubConsumer>,
    round_robin: usize,
}

/// `ack_set` restricted to the indexes of a batch of `size` messages (set
/// bit = index still unacknowledged; bits at or above `size` cleared).
fn within_batch(ack_set: &[i64], size: u32) -> Vec<i64> {
    let all = wire::ack_set_from_indexes(0..size);
    all.iter()
        .zip(ack_set.iter().chain(std::iter::repeat(&0)))
        .map(|(a, b)| a & b)
        .collect()
}

impl Subscription {
    fn open(
        store: &RedbStore,
        ml: &Arc<ManagedLedger>,
        name: &str,
        sub_type: i32,
        earliest: bool,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, BrokerError> {
        let cursor = ml.open_cursor(name).map_err(comp)?;
        let props = cursor.properties().map_err(comp)?;
        if !props.contains_key(CREATED_PROPERTY) {
            if !earliest {
                cursor
                    .mark_delete(ml.last_confirmed_entry())
                    .map_err(comp)?;
            }
            cursor
                .set_property(CREATED_PROPERTY, now_ms())
                .map_err(comp)?;
        }
        // Mark-delete, individually deleted entries and the batch ack sets
        // of partially acknowledged batches, as the last ack persisted them.
        let deletion = cursor.recover_deletion_state().map_err(comp)?;
        let storage = RedbSnapshotStorage::new(store.clone(), ml.name(), name).map_err(comp)?;
        let config = BucketTrackerConfig {
            tick_time_ms: 100,
            deliver_at_time_strict: true,
            ..BucketTrackerConfig::default()
        };
        let tracker =
            BucketDelayedDeliveryTracker::new(config, Arc::new(storage), clock).map_err(comp)?;
        tracker.update_mark_delete(deletion.mark_delete_position());
        tracing::info!(
            topic = ml.name(),
            subscription = name,
            mark_delete = %deletion.mark_delete_position(),
            ranges = deletion.individually_deleted_ranges().len(),
            delayed = tracker.number_of_delayed_messages(),
            "subscription opened"
        );
        Ok(Self {
            name: name.to_string(),
            sub_type,
            cursor,
            deletion,
            tracker,
            replay: BTreeMap::new(),
            inflight: HashMap::new(),
            redelivery_count: HashMap::new(),
            batch_sizes: HashMap::new(),
            consumers: Vec::new(),
            round_robin: 0,
        })
    }

    /// The subscription name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The mark-delete position.
    pub fn mark_delete(&self) -> Position {
        self.deletion.mark_delete_position()
    }

    fn consumer_mut(&mut self, key: ConsumerKey) -> Option<&mut SubConsumer> {
        self.consumers.iter_mut().find(|c| c.key == key)
    }

    /// Applies a Flow.
    pub fn flow(
        &mut self,
        ml: &ManagedLedger,
        key: ConsumerKey,
        permits: u32,
    ) -> Result<(), String> {
        let c = self
            .consumer_mut(key)
            .ok_or_else(|| format!("Flow for unknown consumer {key:?}"))?;
        c.permits.flow_permits(permits).map_err(|e| e.to_string())?;
        c.granted += u64::from(permits);
        self.dispatch(ml);
        Ok(())
    }

    /// Removes consumer `key`; its unacknowledged entries go to replay.
    pub fn remove_consumer(&mut self, ml: &ManagedLedger, key: ConsumerKey) -> Option<SubConsumer> {
        let idx = self.consumers.iter().position(|c| c.key == key)?;
        let c = self.consumers.remove(idx);
        for (p, _) in c.permits.pending_acks().iter() {
            let h = self.inflight.remove(p).unwrap_or(0);
            self.replay.insert(*p, h);
        }
        self.dispatch(ml);
        Some(c)
    }

    /// Redelivers `positions` of consumer `key` (all its pending when empty).
    pub fn redeliver(
        &mut self,
        ml: &ManagedLedger,
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
            c.permits.pending_acks().keys().copied().collect()
        } else {
            positions.to_vec()
        };
        let mut moved = Vec::new();
        for p in targets {
            if c.permits.acknowledge(p).is_ok() {
                moved.push(p);
            }
        }
        for p in moved {
            let h = self.inflight.remove(&p).unwrap_or(0);
            self.replay.insert(p, h);
        }
        self.dispatch(ml);
    }

    /// Batch size B of the entry at `p` (recorded at delivery, else read
    /// from the ledger); an error, with no state changed, for a position
    /// the ledger does not hold or an entry whose metadata is unreadable.
    fn batch_size_of(&mut self, ml: &ManagedLedger, p: Position) -> Result<u32, String> {
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
    /// cumulatively up to the first id.
    pub fn ack(
        &mut self,
        ml: &ManagedLedger,
        cumulative: bool,
        ids: &[MessageIdData],
    ) -> Result<(), String> {
        let mut full = Vec::new();
        for id in ids {
            let p = Position::new(id.ledger_id as i64, id.entry_id as i64);
            if !cumulative && !id.ack_set.is_empty() {
                // The deletion state ANDs the stored set with this one (an
                // index once acknowledged stays so) and deletes the entry
                // when none is left; bits at or above B are not indexes.
                let size = self.batch_size_of(ml, p)?;
                let remaining = within_batch(&id.ack_set, size);
                self.deletion
                    .delete_batch_indexes(p, &remaining, ml)
                    .map_err(|e| e.to_string())?;
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
                None if !batch_acked => return Ok(()),
                None => {}
            }
        } else if !full.is_empty() {
            self.deletion.delete(&full, ml).map_err(|e| e.to_string())?;
        }
        // Mark-delete, every individually deleted entry and the batch ack
        // sets in one store transaction (no range cap).
        let md = self.deletion.mark_delete_position();
        self.cursor
            .persist_deletion_state(&self.deletion, &[])
            .map_err(|e| e.to_string())?;
        self.tracker.update_mark_delete(md);
        // Settle pending acks of every consumer for what is now deleted.
        let deleted = |p: &Position| self.deletion.is_message_deleted(*p);
        for c in &mut self.consumers {
            let done: Vec<Position> = c
                .permits
                .pending_acks()
                .keys()
                .copied()
                .filter(deleted)
                .collect();
            for p in done {
                let _ = c.permits.acknowledge(p);
            }
        }
        self.inflight
            .retain(|p, _| !self.deletion.is_message_deleted(*p));
        self.replay
            .retain(|p, _| !self.deletion.is_message_deleted(*p));
        self.redelivery_count
            .retain(|p, _| !self.deletion.is_message_deleted(*p));
        self.batch_sizes
            .retain(|p, _| !self.deletion.is_message_deleted(*p));
        self.dispatch(ml);
        Ok(())
    }

    /// Picks the consumer for an entry with `key_hash`; `None` when it has no
    /// permits (the entry waits in replay).
    fn pick(&mut self, key_hash: u32) -> Option<usize> {
        let n = self.consumers.len();
        if n == 0 {
            return None;
        }
        let has = |c: &SubConsumer| c.can_receive();
        match self.sub_type {
            1 => {
                for i in 0..n {
                    let idx = (self.round_robin + i) % n;
                    if has(&self.consumers[idx]) {
                        self.round_robin = (idx + 1) % n;
                        return Some(idx);
                    }
                }
                None
            }
            3 => {
                let idx = (key_hash as usize) % n;
                has(&self.consumers[idx]).then_some(idx)
            }
            _ => has(&self.consumers[0]).then_some(0),
        }
    }

    fn key_held_elsewhere(&self, key_hash: u32, idx: usize) -> bool {
        self.inflight.iter().any(|(p, h)| {
            *h == key_hash
                && self
                    .consumers
                    .iter()
                    .enumerate()
                    .any(|(j, c)| j != idx && c.permits.pending_acks().contains_key(p))
        })
    }

    /// Σ available permits of the consumers dispatch may send to now.
    fn total_permits(&self) -> i64 {
        self.consumers
            .iter()
            .filter(|c| c.conn.is_writable())
            .map(|c| c.permits.available_permits().max(0))
            .sum()
    }

    /// Sends what the consumers have permits for: replay first, then due
    /// delayed entries, then new entries from the cursor.
    pub fn dispatch(&mut self, ml: &ManagedLedger) {
        let mut rounds = 0;
        while self.total_permits() > 0 && rounds < 1000 {
            rounds += 1;
            let mut progressed = false;
            // 1. replay
            if !self.replay.is_empty() {
                // Key_Shared: only entries whose consumer has permits, so
                // entries of a stalled consumer do not starve the others.
                let n = self.consumers.len();
                let consumers = &self.consumers;
                let key_shared = self.sub_type == 3;
                let ready = |h: u32| !key_shared || consumers[(h as usize) % n].can_receive();
                let positions: Vec<Position> = self
                    .replay
                    .iter()
                    .filter(|(_, h)| ready(**h))
                    .map(|(p, _)| *p)
                    .take(READ_BATCH)
                    .collect();
                for p in &positions {
                    self.replay.remove(p);
                }
                progressed |= self.deliver_positions(ml, &positions, true);
            }
            // 2. delayed entries whose time has come
            if self.total_permits() > 0 && self.tracker.has_message_available() {
                match self.tracker.get_scheduled_messages(READ_BATCH) {
                    Ok(positions) if !positions.is_empty() => {
                        progressed |= self.deliver_positions(ml, &positions, true);
                    }
                    Ok(_) => {}
                    Err(e) => tracing::error!(error = %e, "delayed tracker"),
                }
            }
            // 3. new entries
            if self.total_permits() > 0 {
                let n = (self.total_permits() as usize).clamp(1, READ_BATCH);
                // The lock-free hint per entry; a deleted entry's run end is
                // asked once and the scan hops past the whole run.
                let mut skip = SkipDeleted::new(&self.deletion);
                let read = self.cursor.read_entries_with_skip_runs(n, &mut skip);
                match read {
                    Ok(entries) if !entries.is_empty() => {
                        let entries = self.deletion.filter_read_entries(entries, |e| e.position);
                        progressed |= self.deliver_entries(entries, false);
                        if self.cursor.has_more_entries() {
                            progressed = true;
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::error!(error = %e, subscription = %self.name, "cursor read failed");
                        break;
                    }
                }
            }
            if !progressed {
                break;
            }
        }
    }

    fn deliver_positions(&mut self, ml: &ManagedLedger, positions: &[Position], due: bool) -> bool {
        let live: Vec<Position> = positions
            .iter()
            .copied()
            .filter(|p| !self.deletion.is_message_deleted(*p))
            .collect();
        if live.is_empty() {
            return false;
        }
        match ml.read_positions(&live) {
            Ok(entries) => self.deliver_entries(entries, due),
            Err(e) => {
                tracing::error!(error = %e, "replay read failed");
                for p in live {
                    self.replay.insert(p, 0);
                }
                false
            }
        }
    }

    /// Whether the delayed tracker holds the entry at `p` for later
    /// delivery (Pulsar's dispatcher `trackDelayedDelivery`). Only the
    /// tracker's answer counts: `addMessage` returning false means "due by
    /// the tracker's clock, dispatch now", so an entry whose time falls
    /// between the reader's clock and the tracker's is dispatched, never
    /// dropped. Pulsar applies `deliver_at_time` only on Shared and
    /// Key_Shared subscriptions; Exclusive/Failover dispatch in order.
    fn held_by_tracker(&self, p: Position, deliver_at: Option<i64>) -> bool {
        let Some(t) = deliver_at.filter(|_| self.sub_type == 1 || self.sub_type == 3) else {
            return false;
        };
        match self.tracker.add_message(p.ledger_id, p.entry_id, t) {
            Ok(tracked) => tracked,
            Err(e) => {
                tracing::warn!(error = %e, position = %p, "delayed tracker refused; delivering now");
                false
            }
        }
    }

    /// Routes entries to consumers; returns whether any was sent.
    fn deliver_entries(&mut self, entries: Vec<Entry>, due: bool) -> bool {
        let mut sent_any = false;
        for entry in entries {
            let info = match entry_info(&entry.data) {
                Ok(i) => i,
                Err(e) => {
                    tracing::warn!(position = %entry.position, error = %e, "entry metadata unreadable; delivering as one message");
                    EntryInfo {
                        batch_size: 1,
                        key_hash: 0,
                        deliver_at: None,
                    }
                }
            };
            let p = entry.position;
            if !due && self.held_by_tracker(p, info.deliver_at) {
                continue;
            }
            // A key with entries waiting in replay keeps its order: new
            // entries of that key wait behind them.
            let blocked = self.sub_type == 3
                && self
                    .replay
                    .iter()
                    .any(|(q, h)| *h == info.key_hash && *q < p);
            let pick = if blocked {
                None
            } else {
                self.pick(info.key_hash)
            };
            // Key_Shared: a key is held by one consumer at a time; when the
            // consumer set changed, the key waits until the consumer still
            // holding unacknowledged entries of it acknowledges them.
            let pick = pick
                .filter(|&idx| self.sub_type != 3 || !self.key_held_elsewhere(info.key_hash, idx));
            let Some(idx) = pick else {
                self.replay.insert(p, info.key_hash);
                continue;
            };
            // A partially acknowledged batch goes out with the indexes still
            // to deliver (the deletion state's ack set).
            let ack_set = self.deletion.batch_ack_set(p).unwrap_or_default();
            let redelivery = self.redelivery_count.get(&p).copied().unwrap_or(0);
            let c = &mut self.consumers[idx];
            let dispatch = c.permits.send_messages(
                vec![BrokerEntry {
                    position: p,
                    batch_size: info.batch_size,
                    ack_set,
                }],
                &mut AdmitAll,
                0,
            );
            let Some(mut cmd) = dispatch.commands.into_iter().next() else {
                tracing::debug!(position = %p, not_sent = ?dispatch.not_sent, "entry not sent");
                continue;
            };
            let permits = u64::from(dispatch.result.total_permits());
            cmd.consumer_epoch = Some(c.epoch);
            cmd.redelivery_count = Some(redelivery);
            cmd.message_id.partition = Some(-1);
            let base = ServeCommand {
                r#type: ty::MESSAGE,
                message: Some(cmd),
                ..Default::default()
            };
            c.debited += permits;
            c.commands += 1;
            c.min_available = c.min_available.min(c.permits.available_permits());
            if let Err(e) = c.conn.send(&base, &entry.data) {
                tracing::warn!(error = %e, consumer = ?c.key, "MESSAGE write failed; connection closes");
            }
            self.inflight.insert(p, info.key_hash);
            self.batch_sizes.insert(p, info.batch_size);
            *self.redelivery_count.entry(p).or_insert(0) += 1;
            // The count sent is the number of earlier deliveries.
            sent_any = true;
        }
        sent_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pulsar_core::delayed::VirtualClock;
    use pulsar_core::permits::frame::encode_entry_payload;
    use pulsar_core::permits::wire::{MessageMetadata, SingleMessageMetadata};

    #[test]
    fn topic_names_normalise_to_persistent() {
        assert_eq!(
            normalize_topic("t").unwrap(),
            "persistent://public/default/t"
        );
        assert_eq!(normalize_topic("a/b/c").unwrap(), "persistent://a/b/c");
        assert!(normalize_topic("non-persistent://a/b/c").is_err());
        assert!(normalize_topic("persistent://a//c").is_err());
        assert!(normalize_topic("").is_err());
        let long = "x".repeat(MAX_NAME_BYTES + 1);
        let err = normalize_topic(&long).unwrap_err().to_string();
        assert!(
            err.len() < 200,
            "the error names a prefix of the topic, not all of it: {err}"
        );
        assert!(normalize_topic(&"x".repeat(MAX_NAME_BYTES - 30)).is_ok());
    }

    #[test]
    fn entry_metadata_gives_batch_size_and_rejects_corruption() {
        let meta = MessageMetadata {
            producer_name: "p".into(),
            sequence_id: 1,
            publish_time: 2,
            num_messages_in_batch: Some(3),
        };
        let one = |b: &[u8]| {
            (
                SingleMessageMetadata {
                    payload_size: b.len() as i32,
                    ..Default::default()
                },
                b.to_vec(),
            )
        };
        let bytes = encode_entry_payload(&meta, &[one(b"a"), one(b"b"), one(b"c")]);
        let info = entry_info(&bytes).unwrap();
        assert_eq!(info.batch_size, 3);
        assert_eq!(info.deliver_at, None);
        let mut bad = bytes.clone();
        let last = bad.len() - 1;
        bad[last] ^= 0xff;
        assert!(
            entry_info(&bad).is_err(),
            "checksum mismatch must be an error"
        );
    }

    /// A batch entry of `n` messages as a producer writes it.
    fn batch_entry(n: usize) -> Vec<u8> {
        let meta = MessageMetadata {
            producer_name: "p".into(),
            sequence_id: 1,
            publish_time: 2,
            num_messages_in_batch: Some(n as i32),
        };
        let one = (
            SingleMessageMetadata {
                payload_size: 1,
                ..Default::default()
            },
            b"m".to_vec(),
        );
        encode_entry_payload(&meta, &vec![one; n])
    }

    fn open_sub(store: &RedbStore) -> (Arc<ManagedLedger>, Subscription) {
        let ml = ManagedLedger::open(
            "persistent://public/default/t",
            LedgerConfig::default(),
            Arc::new(store.clone()),
        )
        .unwrap();
        let sub = Subscription::open(store, &ml, "s", 1, true, Arc::new(SystemClock)).unwrap();
        (ml, sub)
    }

    /// An entry the delayed tracker declines (already due by the tracker's
    /// clock) is dispatched now, whatever the dispatcher's own clock says;
    /// one it accepts is held; Exclusive/Failover never delay.
    #[test]
    fn an_entry_the_tracker_declines_is_dispatched_not_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let store = RedbStore::open(dir.path().join("store.redb")).unwrap();
        let ml = ManagedLedger::open(
            "persistent://public/default/t",
            LedgerConfig::default(),
            Arc::new(store.clone()),
        )
        .unwrap();
        // The tracker's clock an hour ahead of the wall clock: a deliver_at
        // a minute from now is in the future for the wall clock but due for
        // the tracker.
        let wall = now_ms();
        let clock = Arc::new(VirtualClock::new((wall + 3_600_000) as u64));
        let shared = Subscription::open(&store, &ml, "s", 1, true, clock.clone()).unwrap();
        let p = |e| Position::new(1, e);
        assert!(!shared.held_by_tracker(p(0), Some(wall + 60_000)));
        assert!(!shared.held_by_tracker(p(1), None));
        assert!(shared.held_by_tracker(p(2), Some(wall + 7_200_000)));
        assert_eq!(shared.tracker.number_of_delayed_messages(), 1);
        let failover = Subscription::open(&store, &ml, "f", 2, true, clock).unwrap();
        assert!(!failover.held_by_tracker(p(3), Some(wall + 7_200_000)));
        assert_eq!(failover.tracker.number_of_delayed_messages(), 0);
    }

    fn id(entry_id: u64, ack_set: Vec<i64>) -> MessageIdData {
        MessageIdData {
            ledger_id: 1,
            entry_id,
            partition: None,
            batch_index: None,
            ack_set,
            batch_size: None,
            first_chunk_message_id: None,
        }
    }

    #[test]
    fn batch_index_acks_go_through_the_deletion_state_and_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.redb");
        {
            let store = RedbStore::open(&path).unwrap();
            let (ml, mut sub) = open_sub(&store);
            ml.append_batch(&[batch_entry(3).as_slice(), &batch_entry(3), &batch_entry(2)])
                .unwrap();
            sub.ack(&ml, false, &[id(1, vec![0b011])]).unwrap();
            // Entry 2: both indexes acked one by one: deleted whole.
            sub.ack(&ml, false, &[id(2, vec![0b10])]).unwrap();
            sub.ack(&ml, false, &[id(2, vec![0b01])]).unwrap();
            assert!(sub.deletion.is_message_deleted(Position::new(1, 2)));
            assert_eq!(sub.deletion.batch_ack_set(Position::new(1, 2)), None);
            // Last before the restart: a cumulative ack inside entry 0
            // (nothing before it) that changes only the batch state: index
            // 1 acked, 0 and 2 remain; bits at or above B (here bit 5) are
            // not indexes and are dropped.
            sub.ack(&ml, true, &[id(0, vec![0b10_0101])]).unwrap();
            assert_eq!(
                sub.deletion.batch_ack_set(Position::new(1, 0)),
                Some(vec![0b101])
            );
        }
        let store = RedbStore::open(&path).unwrap();
        let (ml, mut sub) = open_sub(&store);
        assert_eq!(
            sub.deletion.batch_ack_set(Position::new(1, 0)),
            Some(vec![0b101])
        );
        assert_eq!(
            sub.deletion.batch_ack_set(Position::new(1, 1)),
            Some(vec![0b011])
        );
        assert!(!sub.deletion.is_message_deleted(Position::new(1, 0)));
        assert!(!sub.deletion.is_message_deleted(Position::new(1, 1)));
        assert!(sub.deletion.is_message_deleted(Position::new(1, 2)));
        // A set that re-sets the acknowledged index 1 cannot un-acknowledge it.
        sub.ack(&ml, false, &[id(0, vec![0b111])]).unwrap();
        assert_eq!(
            sub.deletion.batch_ack_set(Position::new(1, 0)),
            Some(vec![0b101])
        );
    }

    #[test]
    fn a_batch_count_the_payload_cannot_hold_is_rejected() {
        let meta = |n| MessageMetadata {
            producer_name: "p".into(),
            sequence_id: 1,
            publish_time: 2,
            num_messages_in_batch: Some(n),
        };
        let one = || {
            (
                SingleMessageMetadata {
                    payload_size: 0,
                    ..Default::default()
                },
                Vec::new(),
            )
        };
        // Three smallest messages: 3 x 6 bytes hold a count of 3 exactly.
        let ok = encode_entry_payload(&meta(3), &[one(), one(), one()]);
        assert_eq!(entry_info(&ok).unwrap().batch_size, 3);
        // The same bytes claiming 4 or i32::MAX messages are corrupt.
        for n in [4, i32::MAX] {
            let bad = encode_entry_payload(&meta(n), &[one(), one(), one()]);
            let err = entry_info(&bad).err().expect("count above the payload");
            assert!(err.contains("num_messages_in_batch"), "{err}");
        }
    }
}
