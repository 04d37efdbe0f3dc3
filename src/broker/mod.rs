//! # The broker core: one Pulsar node as a sans-io state machine
//!
//! [`Broker`] is the part of a Pulsar broker between the wire and the
//! store: topics, subscriptions, the dispatch pipeline, acks and
//! redelivery, on the crate's components. It has no sockets, no threads,
//! no wall clock and no randomness: decoded commands, connection events,
//! write completions and the time go in; frames, connection closes,
//! permit-ledger records and the next timer deadline come out (the style
//! of `quinn-proto` and `magnetar-proto`). `pulsar-core serve` drives it
//! over TCP; a deterministic driver (a simulator) can drive it on virtual
//! time and put latency and faults around it.
//!
//! | here | Pulsar |
//! |---|---|
//! | [`Broker`] (connections, topics) | `BrokerService`, `ServerCnx` (per-command handling, `connection.rs`) |
//! | [`topic::Topic`] | `PersistentTopic` (one `ManagedLedger`) |
//! | [`subscription::Subscription`] | `PersistentSubscription` + the dispatcher's state (cursor, replay set = `redeliveryMessages`, delayed tracker) |
//! | `dispatch.rs` | `PersistentDispatcherMultipleConsumers` (Shared), `PersistentDispatcherSingleActiveConsumer` (Exclusive, Failover), `PersistentStickyKeyDispatcherMultipleConsumers` (Key_Shared) |
//! | [`subscription::SubConsumer`] | `Consumer` (its PIP-491 permits are its entry in the subscription's `permits::broker::SharedDispatcher`) |
//! | `permits::broker::SharedDispatcher` (one per subscription) | the dispatcher's consumer permits: `consumerFlow`, the `sendMessages` debit, the write listener's removal on a failed MESSAGE write, `removeConsumer` |
//! | [`key_shared`] | `ConsistentHashingStickyKeyConsumerSelector`, `Murmur3_32Hash`, `Commands.peekStickyKey` |
//! | [`crate::proto::command`] | the `PulsarApi.proto` messages the core reads and writes |
//! | [`producer`] | `AbstractTopic.addProducer` / `incrementTopicEpochIfNeeded` (access modes, names, topic epoch) |
//! | [`dedup`] | `MessageDeduplication` |
//! | [`chunking`] | the chunk fields of `MessageMetadata` (PIP-37; stored and dispatched per chunk) |
//! | [`txn`] | `TransactionMetadataStore` (coordinator), `TopicTransactionBuffer`, `PendingAckHandleImpl` wiring, `ServerCnx`'s transaction handlers |
//!
//! ## Input / output contract
//!
//! Inputs (every one takes `now_ms`, epoch milliseconds, the driver's
//! clock; the core's delayed trackers read it through a
//! [`crate::delayed::VirtualClock`] the core sets from these inputs):
//!
//! - [`Broker::handle_open`]: a connection opened (the driver picks its id).
//! - [`Broker::handle_frame`]: one frame's `BaseCommand` bytes and payload
//!   (the driver did the framing and its size limit).
//! - [`Broker::handle_written`]: the driver wrote `n` bytes of the frames
//!   queued for a connection (the write completion that makes it writable
//!   again; see below).
//! - [`Broker::handle_write_failed`]: the driver could not write the next
//!   `n` bytes queued for a connection (`write_failure.rs`: the consumer
//!   incarnation a failed MESSAGE was for is removed and sent
//!   CLOSE_CONSUMER; its P is never re-credited, PIP-491).
//! - [`Broker::handle_close`]: the connection is gone.
//! - [`Broker::handle_timeout`]: the timer fired.
//! - [`Broker::complete_read`]: a cursor read the core issued completed
//!   (`read_completion.rs`; [`Broker::complete_reads`] completes every
//!   read issued, for a driver without read latency).
//!
//! Outputs, in order, from [`Broker::poll_output`] ([`Output`]):
//! `Frame { conn, frame }` (an encoded `BaseCommand` and its payload; the
//! driver writes [`OutFrame::encode`]), `Close { conn, reason }`,
//! `Incarnation(record)` (a consumer incarnation subscribed or ended: its
//! PIP-491 permit ledger), `ReadIssued { read }` (a subscription's cursor
//! read is in flight until the driver calls [`Broker::complete_read`]). [`Broker::poll_timeout`] is the next deadline
//! (`None`: no timer needed).
//!
//! Writability: the core counts the bytes of every frame it queues for a
//! connection and subtracts what [`Broker::handle_written`] reports. At or
//! above [`BrokerConfig::outbound_high_watermark`] the connection's
//! consumers get no MESSAGE (Pulsar's `Consumer.isWritable`); replies to
//! commands are always queued. A driver that never reports writes stalls
//! dispatch at the watermark, never loses a frame.
//!
//! ## Blocking, units, errors
//!
//! Store I/O is synchronous inside the core: durable writes (appends, the
//! cursor's deletion state, cursor properties, delayed-tracker snapshots,
//! the transaction log and pending-ack logs) are issued on the
//! [`crate::ledger::RedbStore`] and commit inside the call that issued
//! them, without an fsync; [`Broker::flush`] (run by
//! [`Broker::poll_output`]) ends the turn with ONE fsynced commit that makes
//! all of them durable, and no output of the turn leaves before it
//! (`turn_commit.rs`; [`BrokerConfig::turn_commit`]). Reads of entries are
//! synchronous too. So every input may block on the store for the
//! duration of a commit, and a poll for the duration of an fsync.
//!
//! Group commit (`group_commit.rs`): a plain ACK is applied in memory when
//! its frame arrives and persisted by [`Broker::flush`], which ends the
//! driver's turn ([`Broker::poll_output`] runs it first): one commit per
//! subscription acknowledged since the last flush, then the held
//! ACK_RESPONSEs (an error response when the commit failed), then dispatch;
//! no ack response is queued before its commit. A group is what the
//! driver hands the core between two polls (its added delay is the
//! driver's handling of those frames; its size, the frames of one read or
//! delivery).
//!
//! Group commit of SENDs (`send_commit.rs`): the SENDs of one turn, across
//! connections, producers and topics, are appended in ONE store
//! transaction when the turn ends (before the acks' commits); each
//! SEND_RECEIPT is queued after that commit, never before, and a new entry
//! is readable and dispatchable only once durable. A batch holds at most
//! [`send_commit::MAX_BATCH_ENTRIES`] entries and
//! [`send_commit::MAX_BATCH_BYTES`] bytes; a command whose handling depends
//! on the batch's outcome commits it first. Transactional ACK and END_TXN
//! commit per command, and every commit of the turn (the SENDs' and the
//! acks' included) is made durable by the turn's one fsynced commit
//! (`turn_commit.rs`): one fsync per turn, every reply after it.
//!
//! Units: time in epoch milliseconds (`u64`), sizes in bytes, permits in
//! messages (PIP-491: a batch entry costs its deliverable indexes).
//!
//! A request the core refuses is answered on the wire with Pulsar's
//! `ServerError` code ([`BrokerError::server_error`]) and changes nothing
//! else. A malformed command, a missing required field or a protocol
//! violation closes the connection: [`Broker::handle_frame`] returns the
//! [`ConnectionError`], the core forgets the connection (its consumers'
//! unacknowledged entries go to replay) and queues `Output::Close`. No
//! input panics.
//!
//! ## Concurrency contract
//!
//! `Broker` is one `&mut self` state machine with no locks of its own; a
//! driver with threads holds it behind one lock and serialises the
//! inputs (`serve` does). Iteration order never depends on hashing: topics,
//! subscriptions, connections and positions are in `BTreeMap`s, so the same
//! inputs give the same outputs. The components it owns synchronise
//! internally through `crate::sync` (the loom/shuttle facade).
//!
//! Transactions (PIP-31: coordinator, transaction buffer, pending ack) are
//! in [`txn`]. Failover's active-consumer change (rewind to the
//! mark-delete, `ACTIVE_CONSUMER_CHANGE`) is in `failover.rs`; pending-ack
//! admission ([`AdmissionHook`], [`BrokerConfig::admission`]) in
//! `admission.rs`; the per-component work counters
//! ([`Broker::counters`]) in [`counters`].
//!
//! Seek (by message id and by publish time, backward and forward) is in
//! `seek.rs`, unsubscribe in `unsubscribe.rs`, readers (non-durable
//! subscriptions) in `reader.rs`.
//!
//! Not implemented (answered as Pulsar answers an unsupported request):
//! schemas, partitioned topics (every topic has 0
//! partitions), Key_Shared `STICKY` mode. `non-persistent://` topics are
//! answered `NotAllowedError` (final for the official clients).

mod admission;
pub mod chunking;
mod clear_backlog;
mod connection;
mod consumer_set;
pub mod counters;
pub mod dedup;
pub mod delayed_hooks;
mod dispatch;
pub mod entry;
pub mod error;
mod failover;
pub mod framing;
mod group_commit;
pub mod key_shared;
mod lifecycle;
pub mod output;
pub mod producer;
mod publish;
pub mod read_backoff;
mod read_completion;
mod reader;
mod seek;
pub mod send_commit;
pub mod subscription;
pub mod topic;
mod turn_commit;
pub mod txn;
mod unsubscribe;
mod write_failure;

use std::collections::BTreeMap;
// Ownership handles use std's Arc in every build (see `ledger::managed_ledger`).
use std::sync::Arc;

use crate::delayed::BucketTrackerConfig;
use crate::delayed::VirtualClock;
use crate::ledger::{LedgerConfig, LedgerStore, ManagedLedger, RedbStore, RetentionPolicy};

pub use admission::AdmissionHook;
pub use clear_backlog::BacklogCleared;
pub use counters::DispatchCounters;
pub use delayed_hooks::SnapshotStorageHook;
#[cfg(feature = "sim")]
pub use delayed_hooks::{DelayedObserver, TrackerCall};
pub use dispatch::READ_BATCH;
pub use entry::{entry_info, EntryInfo};
pub use error::{BrokerError, ConnectionError};
pub use failover::ACTIVE_CONSUMER_LISTENER_VERSION;
pub use framing::{CutFrame, FrameCutter, FramingError};
pub use output::{IncarnationRecord, OutFrame, Output, ReadId};
pub use topic::{name_for_error, normalize_topic, Topic, MAX_NAME_BYTES};

use connection::Connection;
use output::Outbox;

/// A connection's id, chosen by the driver (unique while open; `serve`
/// never reuses one).
pub type ConnectionId = u64;

/// Largest frame `serve` accepts: Pulsar's `maxMessageSize` (5 MiB) plus
/// 10 KiB of headers.
pub const MAX_FRAME_SIZE: usize = crate::proto::frame::DEFAULT_MAX_FRAME_SIZE;
/// Advertised `max_message_size` (Pulsar's default `maxMessageSize`).
pub const MAX_MESSAGE_SIZE: i32 = 5 * 1024 * 1024;
/// Protocol version the core speaks (v19: up to transactions' TC connect).
pub const PROTOCOL_VERSION: i32 = 19;
/// Default outbound high watermark of a connection (bytes queued and not
/// yet written above which its consumers get no MESSAGE).
pub const OUTBOUND_HIGH_WATERMARK: usize = 4 * 1024 * 1024;

/// The core's settings.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// The URL lookups answer (`pulsar://host:port`).
    pub advertised_url: String,
    /// `server_version` of CONNECTED.
    pub server_version: String,
    /// See [`OUTBOUND_HIGH_WATERMARK`].
    pub outbound_high_watermark: usize,
    /// Broker-side deduplication by producer name and sequence id
    /// ([`dedup`]; Pulsar's `brokerDeduplicationEnabled`, off by default
    /// there, on by default here).
    pub deduplication: bool,
    /// Pending-ack admission ([`AdmissionHook`]); `None` admits every entry.
    pub admission: Option<AdmissionHook>,
    /// Every topic's managed-ledger settings (entries per ledger, auto-skip
    /// of non-recoverable data).
    pub ledger: LedgerConfig,
    /// How long consumed ledgers are kept (default: not kept, as Pulsar).
    pub retention: RetentionPolicy,
    /// How often consumed ledgers are trimmed, ms (`lifecycle.rs`).
    pub retention_check_interval_ms: u64,
    /// Every subscription's delayed-delivery bucket tracker settings.
    pub delayed: BucketTrackerConfig,
    /// Wraps every subscription's bucket snapshot storage
    /// ([`SnapshotStorageHook`]); `None`: the store's, as it is.
    pub snapshot_storage: Option<SnapshotStorageHook>,
    /// Told of every delayed-tracker call (test instrumentation, feature
    /// `sim`; see [`DelayedObserver`]).
    #[cfg(feature = "sim")]
    pub delayed_observer: Option<DelayedObserver>,
    /// One fsync per driver turn (`turn_commit.rs`): every store commit of
    /// a turn is made durable by one barrier commit before any output of
    /// the turn leaves [`Broker::poll_output`]. Off: every commit fsyncs
    /// on its own (with [`crate::ledger::SyncMode::Immediate`]). The core
    /// turns the store's deferral on ([`RedbStore::defer_to_barrier`]) for
    /// its lifetime, on every clone of the store.
    pub turn_commit: bool,
    /// When transaction buffers take snapshots
    /// (`transactionBufferSnapshotMaxTransactionCount`,
    /// `transactionBufferSnapshotMinTimeInMillis`; Pulsar's defaults).
    pub txn_snapshot: txn::SnapshotConfig,
}

impl BrokerConfig {
    /// Defaults with lookups answering `advertised_url`.
    pub fn new(advertised_url: impl Into<String>) -> Self {
        Self {
            advertised_url: advertised_url.into(),
            server_version: format!("pulsar-core {}", env!("CARGO_PKG_VERSION")),
            outbound_high_watermark: OUTBOUND_HIGH_WATERMARK,
            deduplication: true,
            admission: None,
            ledger: LedgerConfig::default(),
            retention: Self::DEFAULT_RETENTION,
            retention_check_interval_ms: Self::DEFAULT_RETENTION_CHECK_INTERVAL_MS,
            delayed: subscription::default_tracker_config(),
            snapshot_storage: None,
            #[cfg(feature = "sim")]
            delayed_observer: None,
            turn_commit: Self::DEFAULT_TURN_COMMIT,
            txn_snapshot: txn::SnapshotConfig::default(),
        }
    }
}

/// The single node: its store, topics and connections.
pub struct Broker {
    store: RedbStore,
    /// What the topics' and pending-ack logs' managed ledgers read and
    /// write: the store itself, or an embedder's [`LedgerStore`] over it
    /// ([`Broker::with_ledger_store`]).
    ledgers: Arc<dyn LedgerStore>,
    config: BrokerConfig,
    topics: BTreeMap<String, Topic>,
    conns: BTreeMap<ConnectionId, Connection>,
    out: Outbox,
    next_incarnation: u64,
    /// The core's start time: generated producer names carry it, so a name
    /// never repeats across restarts (deduplication keys on names).
    started_ms: u64,
    clock: Arc<VirtualClock>,
    txn: txn::TxnRuntime,
    /// Acks of the current turn waiting for their group commit.
    acks: group_commit::AckGroup,
    /// SENDs of the current turn waiting for their group commit.
    sends: send_commit::SendBatch,
    lifecycle: lifecycle::Lifecycle,
}

impl Broker {
    /// A core on `store` at time `now_ms`. Topics and subscriptions are
    /// opened (and recovered from the store) on first use.
    pub fn new(store: RedbStore, config: BrokerConfig, now_ms: u64) -> Self {
        let ledgers: Arc<dyn LedgerStore> = Arc::new(store.clone());
        Self::with_ledger_store(store, ledgers, config, now_ms)
    }

    /// As [`Broker::new`], with the topics' and pending-ack logs' managed
    /// ledgers on `ledgers` (a [`LedgerStore`] over `store`'s database,
    /// e.g. one that adds a storage layer's failures: its typed errors are
    /// handled as Pulsar handles BookKeeper's, see `read_backoff.rs`).
    /// Everything else (cursor state of the delayed trackers, the
    /// transaction coordinator's log, snapshots) stays on `store`; so do
    /// the appends of SENDs, which the group commit writes for several
    /// topics in one transaction of `store` (`send_commit.rs`): `ledgers`
    /// must be over `store`'s database, and its `append` is not called for
    /// SENDs.
    pub fn with_ledger_store(
        store: RedbStore,
        ledgers: Arc<dyn LedgerStore>,
        config: BrokerConfig,
        now_ms: u64,
    ) -> Self {
        let txn_snapshot = config.txn_snapshot;
        let out = Outbox {
            high_watermark: config.outbound_high_watermark,
            ..Outbox::default()
        };
        let mut b = Self {
            store,
            ledgers,
            config,
            topics: BTreeMap::new(),
            conns: BTreeMap::new(),
            out,
            next_incarnation: 1,
            started_ms: now_ms,
            clock: Arc::new(VirtualClock::new(now_ms)),
            txn: txn::TxnRuntime::new(now_ms, txn_snapshot),
            acks: group_commit::AckGroup::default(),
            sends: send_commit::SendBatch::default(),
            lifecycle: lifecycle::Lifecycle::default(),
        };
        // The coordinator recovers at start: transactions a crash left
        // Committing/Aborting are finished now (a failure is retried from
        // handle_timeout with backoff).
        if let Err(e) = b.txn_ready() {
            tracing::warn!(error = %e, "transaction coordinator not recovered at start");
        }
        // From here every store commit waits for its turn's barrier
        // (`turn_commit.rs`).
        if b.config.turn_commit {
            b.store.defer_to_barrier(true);
        }
        b
    }

    /// The store.
    pub fn store(&self) -> &RedbStore {
        &self.store
    }

    /// Open topics, by name.
    pub fn topics(&self) -> &BTreeMap<String, Topic> {
        &self.topics
    }

    /// Advances the core's clock to `now_ms` (never backwards).
    fn tick(&mut self, now_ms: u64) {
        use crate::delayed::Clock;
        if now_ms > self.clock.now_ms() {
            self.clock.set(now_ms);
        }
        // Pending-ack replay retries fall due on the core's clock.
        self.txn.timer.advance_to(self.clock.now_ms());
        self.txn.pool.run_pending();
    }

    fn now(&self) -> u64 {
        use crate::delayed::Clock;
        self.clock.now_ms()
    }

    /// The next output, in the order produced; `None` when none is queued.
    /// It first ends the turn ([`Broker::flush`]): the group commit of the
    /// turn's acks, whose receipts it then releases.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.flush();
        let o = self.out.queue.pop_front();
        self.out.durable = self.out.durable.saturating_sub(usize::from(o.is_some()));
        o
    }

    /// The next deadline (epoch ms) at which [`Broker::handle_timeout`]
    /// should run: the earliest delivery time of a delayed entry on a
    /// subscription with consumers, the earliest timeout of an open
    /// transaction, a pending-ack replay retry, or the coordinator's
    /// recovery retry, consumed-ledger trimming, a subscription's read
    /// retry after a failed read (`read_backoff.rs`). A deadline at or before now means "as
    /// soon as you can"; `None`: no timer needed.
    pub fn poll_timeout(&self) -> Option<u64> {
        self.topics
            .values()
            .flat_map(|t| t.subscriptions.values())
            .filter(|s| !s.consumers.is_empty())
            .flat_map(|s| {
                // Due delayed entries wait for what holds the dispatch: a
                // pending-ack replay not yet applied (its retry is on the
                // transaction timer, its completion asks for "now") and a
                // read backoff (its deadline). A due time reported while the
                // dispatch is held would stay in the past after the timer
                // fired and hide every later deadline (the replay's retry).
                let replay_held = s.pending_ack.is_some() && !s.pending_ack_applied;
                let due = s
                    .tracker
                    .next_delivery_time()
                    .filter(|_| !replay_held)
                    .map(|t| s.read_backoff.deadline().map_or(t, |r| t.max(r)));
                [due, s.read_backoff.deadline()].into_iter().flatten()
            })
            .chain(self.txn_timeout())
            .chain(self.trim_deadline())
            .min()
    }

    /// The timer fired: dispatches every subscription with consumers (due
    /// delayed entries, and anything a consumer can now take), and trims
    /// consumed ledgers when their interval has passed.
    pub fn handle_timeout(&mut self, now_ms: u64) {
        self.commit_sends();
        self.tick(now_ms);
        self.txn_timers();
        self.trim_if_due();
        for t in self.topics.values_mut() {
            for s in t.subscriptions.values_mut() {
                if !s.consumers.is_empty() {
                    s.dispatch(&t.ml, &mut self.out);
                }
            }
        }
    }

    /// The driver wrote `bytes` of the frames queued for `conn`; when that
    /// takes the connection below the high watermark, its subscriptions
    /// dispatch again.
    pub fn handle_written(&mut self, conn: ConnectionId, bytes: usize, now_ms: u64) {
        self.tick(now_ms);
        let Some(b) = self.out.outbound.get_mut(&conn) else {
            return;
        };
        let was = *b < self.out.high_watermark;
        *b = b.saturating_sub(bytes);
        let below = *b < self.out.high_watermark;
        for m in self.out.completed(conn, bytes) {
            self.write_completed(conn, m, Ok(()));
        }
        if !was && below {
            self.dispatch_connection(conn);
        }
    }

    /// Dispatches every subscription with a consumer on `conn`.
    fn dispatch_connection(&mut self, conn: ConnectionId) {
        for t in self.topics.values_mut() {
            for s in t.subscriptions.values_mut() {
                if s.consumers.iter().any(|c| c.conn == conn) {
                    s.dispatch(&t.ml, &mut self.out);
                }
            }
        }
    }

    /// Permit-ledger records of every live consumer incarnation, labelled
    /// `end` (e.g. `snapshot`), in topic, subscription, attach order.
    pub fn incarnations(&self, end: &str) -> Vec<IncarnationRecord> {
        let mut v = Vec::new();
        for t in self.topics.values() {
            for (name, s) in &t.subscriptions {
                for c in &s.consumers {
                    v.push(c.record(&t.name, name, end, s.balance(c.key)));
                }
            }
        }
        v
    }

    /// Opens (or recovers) topic `name` (normalised) and returns its name.
    fn topic(&mut self, name: &str) -> Result<String, BrokerError> {
        let name = normalize_topic(name)?;
        if !self.topics.contains_key(&name) {
            let ml = ManagedLedger::open(
                name.clone(),
                self.config.ledger.clone(),
                Arc::clone(&self.ledgers),
            )
            .map_err(error::comp)?;
            let buffer = self.recover_buffer(&name, &ml)?;
            let dedup = dedup::Deduplication::recover(
                &self.store,
                &ml,
                self.config.deduplication,
                self.now(),
            )?;
            let producers = producer::TopicProducers::new(dedup.topic_epoch());
            self.topics.insert(
                name.clone(),
                Topic {
                    name: name.clone(),
                    ml,
                    subscriptions: BTreeMap::new(),
                    buffer: Arc::new(crate::sync::Mutex::new(buffer)),
                    producers,
                    dedup,
                },
            );
        }
        Ok(name)
    }
}

impl Drop for Broker {
    /// Makes the last turn's commits durable (if a driver dropped the core
    /// without polling) and stops deferring the store's commits.
    fn drop(&mut self) {
        if self.config.turn_commit {
            if let Err(e) = self.store.commit_barrier() {
                tracing::warn!(error = %e, "the last turn's durable commit failed at close");
            }
            self.store.defer_to_barrier(false);
        }
    }
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests;
