//! Workload descriptions for `pulsar-core simulate`: the five presets and the
//! TOML file format (same fields).

use serde::{Deserialize, Serialize};

/// Subscription type of every subscription in the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SubscriptionType {
    /// Key_Shared with a static hash-range assignment: per-key order is checked.
    KeyShared,
    /// Shared: round-robin by available permits; no order guarantee.
    Shared,
    /// Failover: one active consumer per subscription, the others standby
    /// (Pulsar sorts consumers by priority level and name; here every
    /// consumer has the same priority and the order is subscribe order, so a
    /// reconnecting active consumer hands over to the next one). On a change
    /// of active consumer its unacknowledged messages are redelivered to the
    /// new one. Total order per subscription is checked. The only type (with
    /// Exclusive) on which Pulsar allows cumulative acks; delayed delivery is
    /// not supported on it.
    Failover,
}

/// Which broker a run drives: the shipped broker core
/// (`pulsar_core::broker::Broker`) driven by `sim::node`, whose simulated
/// clients speak real Pulsar frames to it on the crash storage (see
/// `sim::node` for the faults it supports). The only engine; `engine =
/// "node"` stays accepted in workload files, and a file naming the removed
/// model engine is refused with [`WorkloadError::ModelEngineRemoved`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Engine {
    /// The shipped broker core.
    #[default]
    Node,
}

/// Default [`Faults::faulty_closes_without_progress`]: a window of 100
/// messages with 1 % of frames faulty closes the connection with
/// probability 0.63, so 16 closes in a row without a received message
/// (0.63^16 ≈ 0.06 %) stays rare in runs that make progress, while a
/// window of 1,000 (closed with probability 0.99996) gets through after
/// 16 round trips instead of never.
pub const FAULTY_CLOSES_WITHOUT_PROGRESS: u32 = 16;

/// Faults injected during the run (each switchable).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Faults {
    /// Broker restarts during the run (everything in memory is dropped and
    /// recovered from the store).
    pub restarts: u32,
    /// Windows of transient storage read failures (each `outage_ms` long).
    pub read_outages: u32,
    /// Length of one read outage, virtual ms.
    pub outage_ms: u64,
    /// Lose the pending-ack log's ledger holding the first record the next
    /// replay needs, at the first restart (a deleted BookKeeper ledger);
    /// what happens then depends on `pending_ack_auto_skip`.
    pub lose_pending_ack_ledger: bool,
    /// Consumer reconnects (new PIP-491 incarnation) during the run.
    pub reconnects: u32,
    /// Fraction of deliveries whose batch the client finds corrupted.
    pub corrupted_batch_ratio: f64,
    /// Fraction of bucket snapshot creates that fail.
    pub snapshot_create_failure_ratio: f64,
    /// Fraction of bucket snapshot deletes that fail.
    pub snapshot_delete_failure_ratio: f64,
    /// Admin seeks (Pulsar's reset cursor to a later position): a
    /// subscription's cursor is moved forward to its read position, its
    /// consumers are disconnected and reconnect as new incarnations, and the
    /// delayed tracker is given the new mark-delete (trimming buckets below
    /// it). Unacknowledged messages at or below the seek are skipped.
    pub seeks: u32,
    /// Run the `hint_race` stage after the simulation: real threads acking,
    /// resetting and moving mark-delete across ledger boundaries on a cursor
    /// deletion state while another runs the lock-free hint and the post-I/O
    /// filter, checked by an external oracle (see `sim::hint_race`).
    pub hint_race: bool,
    /// Run the `replay_race` stage after the simulation: the real
    /// pending-ack replay on real threads and a real managed ledger (a read
    /// failure after read-ahead with later reads outstanding, a reload over a
    /// cached cursor left at the log end, `fill_queue` racing `read_failed`),
    /// checked by an external oracle (see `sim::replay_race`).
    pub replay_race: bool,
    /// Wall time of the `replay_race` stage's read-failure race, ms.
    pub replay_race_ms: u64,
    /// Open the pending-ack logs with `auto_skip_non_recoverable_data`
    /// (Pulsar's default is off: a replay that meets a lost ledger gives
    /// up and the subscription fails to load until an operator turns it on
    /// and reloads the topic, `operator_auto_skip_after_ms` later).
    pub pending_ack_auto_skip: bool,
    /// How long after a replay gave up on non-recoverable data the operator
    /// turns auto-skip on and reloads the topic, virtual ms.
    pub operator_auto_skip_after_ms: u64,
    /// At each of the first this many restarts, each subscription's
    /// pending-ack replay gets one read failure on its second or third read
    /// (after entries were read ahead, not yet applied), of a class picked
    /// from all six Pulsar distinguishes (storage unavailable, too many
    /// requests, non-recoverable data, ledger not exist, fenced, cursor
    /// closed; the last two persist until the replay completes).
    pub replay_read_failures: u32,
    /// Node engine: at the first restart at which a pending-ack log holds
    /// records after its mark-delete, the data of its entries is gone (a
    /// read returns none: the managed ledger's `NonRecoverableData`) until
    /// a replay completed over it. With `pending_ack_auto_skip` on, that
    /// failure completes the replay at its first read with nothing applied
    /// (one of Pulsar's completing shapes); the transactions with a record
    /// after the log's mark-delete are told to the checker as having lost
    /// their acks.
    pub pending_ack_entries_missing: bool,
    /// Faulty-broker mode: fraction of deliveries whose `message_permits`
    /// is replaced by an invalid value (0, or above the batch's message
    /// count); the client must close the connection without credit (and
    /// reconnects).
    pub invalid_permits_ratio: f64,
    /// Faulty-broker mode on corrupted batches: fraction of the deliveries
    /// whose batch the client finds corrupted (`corrupted_batch_ratio`)
    /// that carry `message_permits = 0`. The client cannot read the batch,
    /// so it resolves P from the command alone; 0 is invalid there too and
    /// it must close the connection without credit (and reconnects).
    pub zero_permits_on_corrupted_ratio: f64,
    /// Fairness of the faulty broker: after this many connections of one
    /// consumer closed on an injected invalid P in a row, with the
    /// application receiving no message in between, the broker sends valid
    /// P until the application receives one. The simulated connection
    /// delivers a dispatch pass's whole window at one virtual instant,
    /// before the application's next poll, so with a window of 1,000
    /// messages and about 1 % of frames faulty nearly every window closes
    /// the connection and redelivers the same window: no protocol makes
    /// progress against a peer that breaks every window, and the run would
    /// only end at a watchdog. `u32::MAX` turns the bound off.
    pub faulty_closes_without_progress: u32,
    /// Fraction of entries pending-ack admission rejects (Pulsar: a
    /// transaction conflict or a filter): neither sent nor debited, replayed.
    pub admission_reject_ratio: f64,
    /// Node engine: after every 16th receipt of a consumer's individual
    /// (non-transactional) ack while a transaction is open, the consumer
    /// acknowledges the same message ids again inside that transaction (a
    /// client acking a message twice, the second time in a transaction).
    /// They are deleted in the subscription: the core must refuse the ack
    /// (Pulsar's `TransactionConflictException`) and write nothing.
    pub txn_acks_of_deleted: bool,
    /// Fraction of dispatches whose asynchronous write fails: the broker
    /// must remove the consumer (its messages are redelivered) and the
    /// client reconnects.
    pub write_failure_ratio: f64,
    /// Consumer re-creations on the same connection (Pulsar's pooled
    /// connection): the consumer closes and subscribes again with the same
    /// id right after its application returned permits whose Flow is still
    /// queued; that Flow must not credit the new incarnation.
    pub same_connection_reconnects: u32,
    /// Consumer-set rewinds: every consumer of one subscription disconnects
    /// and subscribes again; the first to come back finds the dispatcher
    /// without consumers, so it rewinds the cursor to the mark-delete (Pulsar
    /// `PersistentDispatcherMultipleConsumers.addConsumer`) and clears its
    /// redelivery set, while the bucket delayed tracker keeps what it holds
    /// (Pulsar clears only the in-memory tracker). The re-read re-adds every
    /// unacknowledged delayed message: a tracked one not yet due is a
    /// duplicate add, a tracked one already due is an expired re-add. Each
    /// rewind is planned right after the clock jump of the same number (same
    /// instant), so the re-read meets messages the jump made due while still
    /// tracked.
    pub rewinds: u32,
    /// Forward steps of the broker's clock (an NTP step correction or a VM
    /// resumed after a pause), each `clock_jump_ms` long: the delayed tracker
    /// finds many messages due at once and delivers them over several reads
    /// (measured against the producers' clock they come up to the sum of
    /// the jumps early, which the checker allows).
    pub clock_jumps: u32,
    /// Length of one clock jump, virtual ms.
    pub clock_jump_ms: u64,
    /// Admin clear-backlogs (Pulsar `PersistentSubscription.clearBacklog`,
    /// `pulsar-admin topics clear-backlog`): a subscription's mark-delete
    /// moves to the last entry (`ManagedCursor.asyncClearBacklog`), then
    /// the dispatcher clears its delayed messages
    /// (`clearDelayedMessages`, the bucket tracker's `clear`: every bucket
    /// snapshot is deleted). Every unacknowledged message published so far
    /// is skipped; the consumers reconnect as after a seek.
    pub clear_backlogs: u32,
    /// Fraction of clear-backlogs during which the snapshot of one of the
    /// tracker's later buckets (any but the first, so earlier ones are
    /// already removed) cannot be deleted: every delete of it fails, so
    /// `clear` fails after its retries (the cleared backlog's mark-delete
    /// then trims what is left).
    pub clear_delete_failure_ratio: f64,
    /// Duplicate Subscribes: a consumer sends Subscribe again with the
    /// same consumer id on the same connection (a client retrying a
    /// Subscribe whose response it did not see). The broker answers
    /// Success and keeps the one consumer it has (Pulsar
    /// `ServerCnx.handleSubscribe` with an existing consumer of that id):
    /// no second incarnation, no second grant of the receiver queue.
    pub duplicate_subscribes: u32,
    /// Crash points drawn from the run's seed: each one kills the broker
    /// at a durable write of the store (just before or just after that
    /// write's fsync, drawn) without a clean close: every in-memory
    /// structure is dropped, the store keeps exactly what was fsynced, and
    /// the broker recovers from it. They are spread over the publish
    /// window; some fall a few durable writes after the previous crash's
    /// reopen (a crash during recovery). A run with crash points keeps its
    /// store in memory (`sim::crash_storage`).
    pub crash_points: u32,
    /// Explicit crash points, taken in order: the broker crashes at the
    /// k-th durable write (fsync) since its last (re)start, for each k
    /// here (before or after it, drawn from the seed), before the drawn
    /// `crash_points`.
    pub crash_at_writes: Vec<u64>,
    /// Node engine: the k of each of its `crash_points` is drawn from
    /// 1..=this (durable writes since the broker's last (re)start).
    pub crash_window: u64,
    /// Node engine: REDELIVER_UNACKNOWLEDGED_MESSAGES requests (a consumer
    /// bumps its epoch and asks for its unacknowledged messages again).
    pub redeliveries: u32,
    /// Node engine: after a crash, the next crash point's k is drawn from
    /// 1..=this instead of 1..=`crash_window`, so it falls during the
    /// recovery (the store dies again while the broker reopens: its
    /// coordinator, transaction buffer and pending-ack replays); 0 = off.
    pub crash_recovery_window: u64,
    /// Node engine: reader clients (Pulsar's Reader: a non-durable
    /// subscription, CommandSubscribe with `durable = false`), at most
    /// [`MAX_READERS`]. Each opens a session at a drawn start (earliest,
    /// latest, or a published message id, inclusive or exclusive), reads
    /// to the end it saw at the open, acknowledges cumulatively, closes and
    /// opens the next, for the whole run, across restarts and crashes
    /// (`sim::node::reader`, judged by `sim::checker::reader`).
    pub readers: u32,
    /// Node engine: unsubscribes of a durable subscription by one of its
    /// consumers (with `force` drawn: a forced one disconnects the other
    /// consumers; an unforced one with other consumers attached is
    /// refused); the consumers then subscribe again, creating a new
    /// subscription of the same name at its initial position (earliest),
    /// which must redeliver everything still retained, none of the old
    /// subscription's acks carried over (`sim::node::unsubscribe`).
    pub unsubscribes: u32,
    /// Node engine: the fraction of messages a producer sends as 2–4
    /// chunks (PIP-37: one SEND per chunk with `is_chunk`, the message's
    /// `uuid`, `chunk_id`, `num_chunks_from_msg`, `total_chunk_msg_size`
    /// and one `sequence_id`); the consumer client reassembles them and
    /// acknowledges every chunk (`sim::node::chunks`).
    pub chunked_ratio: f64,
    /// Node engine: the fraction of producer opens in an exclusive access
    /// mode (`Exclusive`, `WaitForExclusive`, `ExclusiveWithFencing`,
    /// drawn uniformly; the rest `Shared`), every producer on the one
    /// topic keeping its name across opens. A producer releases the topic
    /// now and then (CLOSE_PRODUCER, or its connection dropped) and when it
    /// has sent everything; a refused or fenced one opens again with a new
    /// draw; an admitted one sometimes asks for a second producer of its
    /// own name, which must be refused (`ProducerBusy`). Judged by
    /// `sim::checker::producers` (`sim::node::producers`).
    pub producer_access_modes: f64,
}

/// The most reader clients a workload may run (`faults.readers`).
pub const MAX_READERS: u32 = 16;

impl Faults {
    /// Whether the run has crash points (and so keeps its store in memory).
    pub fn has_crash_points(&self) -> bool {
        self.crash_points > 0 || !self.crash_at_writes.is_empty()
    }
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            restarts: 1,
            read_outages: 1,
            outage_ms: 2_000,
            lose_pending_ack_ledger: false,
            reconnects: 2,
            corrupted_batch_ratio: 0.0,
            snapshot_create_failure_ratio: 0.0,
            snapshot_delete_failure_ratio: 0.0,
            seeks: 0,
            hint_race: false,
            replay_race: false,
            replay_race_ms: 1_000,
            pending_ack_auto_skip: false,
            operator_auto_skip_after_ms: 5_000,
            replay_read_failures: 0,
            pending_ack_entries_missing: false,
            invalid_permits_ratio: 0.0,
            zero_permits_on_corrupted_ratio: 0.0,
            faulty_closes_without_progress: FAULTY_CLOSES_WITHOUT_PROGRESS,
            admission_reject_ratio: 0.0,
            txn_acks_of_deleted: false,
            write_failure_ratio: 0.0,
            same_connection_reconnects: 0,
            rewinds: 0,
            clock_jumps: 0,
            clock_jump_ms: 10_000,
            clear_backlogs: 0,
            clear_delete_failure_ratio: 0.0,
            duplicate_subscribes: 0,
            crash_points: 0,
            crash_at_writes: Vec::new(),
            crash_window: 200,
            redeliveries: 0,
            crash_recovery_window: 0,
            readers: 0,
            unsubscribes: 0,
            chunked_ratio: 0.0,
            producer_access_modes: 0.0,
        }
    }
}

impl Faults {
    /// No faults at all.
    pub fn none() -> Self {
        Self {
            restarts: 0,
            read_outages: 0,
            outage_ms: 0,
            lose_pending_ack_ledger: false,
            reconnects: 0,
            corrupted_batch_ratio: 0.0,
            snapshot_create_failure_ratio: 0.0,
            snapshot_delete_failure_ratio: 0.0,
            seeks: 0,
            hint_race: false,
            replay_race: false,
            replay_race_ms: 1_000,
            pending_ack_auto_skip: false,
            operator_auto_skip_after_ms: 5_000,
            replay_read_failures: 0,
            pending_ack_entries_missing: false,
            invalid_permits_ratio: 0.0,
            zero_permits_on_corrupted_ratio: 0.0,
            faulty_closes_without_progress: FAULTY_CLOSES_WITHOUT_PROGRESS,
            admission_reject_ratio: 0.0,
            txn_acks_of_deleted: false,
            write_failure_ratio: 0.0,
            same_connection_reconnects: 0,
            rewinds: 0,
            clock_jumps: 0,
            clock_jump_ms: 10_000,
            clear_backlogs: 0,
            clear_delete_failure_ratio: 0.0,
            duplicate_subscribes: 0,
            crash_points: 0,
            crash_at_writes: Vec::new(),
            crash_window: 200,
            redeliveries: 0,
            crash_recovery_window: 0,
            readers: 0,
            unsubscribes: 0,
            chunked_ratio: 0.0,
            producer_access_modes: 0.0,
        }
    }
}

/// One simulated workload. Every field has a default; a TOML file may set
/// any subset (unknown fields are an error).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Workload {
    /// Name shown in the report.
    pub name: String,
    /// Which broker the run drives (default: the simulator's model).
    pub engine: Engine,
    /// Producers publishing to the one topic.
    pub producers: u32,
    /// Subscriptions on the topic (fan-out: each gets every message).
    pub subscriptions: u32,
    /// Consumers per subscription.
    pub consumers_per_subscription: u32,
    /// Subscription type.
    pub subscription_type: SubscriptionType,
    /// Logical messages published in total.
    pub messages: u64,
    /// Messages per batch entry (1 = no batching).
    pub batch_size: u32,
    /// Distinct ordering keys.
    pub keys: u32,
    /// Fraction of messages that are delayed.
    pub delayed_ratio: f64,
    /// Largest delivery delay, virtual ms (at most 2 h: a run stops at 6 h
    /// of virtual time).
    pub max_delay_ms: u64,
    /// Fraction of acknowledgements made inside a transaction.
    pub txn_ack_ratio: f64,
    /// Failover only: each consumer acks cumulatively, once every this many
    /// received messages, up to the last entry it received completely (0 =
    /// individual acks). Shared and Key_Shared reject cumulative acks.
    pub cumulative_ack_every: u32,
    /// Consumer receiver queue size, messages.
    pub receiver_queue_size: u32,
    /// Entries per ledger before rollover.
    pub max_entries_per_ledger: u32,
    /// Bucket tracker: minimum indexes before a bucket is sealed.
    pub delayed_min_index_count_per_bucket: u64,
    /// Bucket tracker: maximum buckets before merging.
    pub delayed_max_num_buckets: i64,
    /// Bucket tracker tick, ms.
    pub delayed_tick_ms: u64,
    /// Producer publish interval between batches, virtual ms.
    pub publish_interval_ms: u64,
    /// Largest latency of a dispatcher's cursor read (a BookKeeper entry
    /// read), virtual ms: each read takes a seeded uniform 1..=this, and
    /// the dispatcher issues the next one only after it completed (0 =
    /// reads complete instantly). The read-scheduling hint is checked when
    /// the read is issued and the locked post-I/O filter runs when it
    /// completes, so acks, seeks and rewinds land in between.
    pub read_latency_ms: u64,
    /// A consumer with backlog and free receiver queue that receives nothing
    /// for longer than this is a stall, virtual ms.
    pub stall_bound_ms: u64,
    /// A delayed message first delivered (or still held by the tracker)
    /// more than this after its delivery time is late, virtual ms (0 =
    /// `stall_bound_ms + faults.outage_ms + 10 × delayed_tick_ms`).
    pub delayed_late_bound_ms: u64,
    /// Fraction of received entries the application settles message by
    /// message: each message is acknowledged on its own (a batch-index ack,
    /// `ack_set` with only its bit cleared, for a batched entry) or
    /// negatively acknowledged, about half each; once the entry's messages
    /// of that delivery are processed, the negatively acknowledged ones go
    /// back to the broker in one negative ack (Pulsar's
    /// `redeliverUnacknowledgedMessages` with message ids), which
    /// redelivers the entry with the acknowledged indexes left out (a
    /// partial batch: `ack_set`, P below the batch size). Not with
    /// cumulative acks (Failover's total order).
    pub negative_ack_ratio: f64,
    /// Node engine: [`crate::broker::BrokerConfig::turn_commit`] (`serve`'s
    /// default, on: one fsync per driver turn, so END_TXN's coordinator
    /// records, markers and pending-ack records are one durable unit). Off
    /// (`serve --no-turn-commit`, an embedder's `turn_commit = false`):
    /// every store commit is durable on its own, and the crash points fall
    /// between them too (e.g. the coordinator log ending at Committing).
    pub turn_commit: bool,
    /// Node engine: transactions a client runs over the wire (see [`TxnWorkload`]).
    pub txn: TxnWorkload,
    /// Faults.
    pub faults: Faults,
}

impl Default for Workload {
    fn default() -> Self {
        Self {
            name: "custom".into(),
            engine: Engine::Node,
            producers: 10,
            subscriptions: 2,
            consumers_per_subscription: 2,
            subscription_type: SubscriptionType::KeyShared,
            messages: 10_000,
            batch_size: 10,
            keys: 100,
            delayed_ratio: 0.0,
            max_delay_ms: 10_000,
            txn_ack_ratio: 0.0,
            cumulative_ack_every: 0,
            receiver_queue_size: 1_000,
            max_entries_per_ledger: 5_000,
            delayed_min_index_count_per_bucket: 50_000,
            delayed_max_num_buckets: -1,
            delayed_tick_ms: 1_000,
            publish_interval_ms: 10,
            read_latency_ms: 0,
            stall_bound_ms: 30_000,
            delayed_late_bound_ms: 0,
            negative_ack_ratio: 0.0,
            turn_commit: true,
            txn: TxnWorkload::default(),
            faults: Faults::default(),
        }
    }
}

/// Cursor read latency bound of the presets ([`Workload::read_latency_ms`]),
/// virtual ms: a few BookKeeper round trips (`delayed` uses 20).
pub const PRESET_READ_LATENCY_MS: u64 = 5;

/// Why a workload was rejected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WorkloadError {
    /// The preset name is not one of [`Workload::PRESETS`].
    #[error("unknown workload {0:?}: expected one of default, fanout, delayed, txn-outage, permit-churn, failover, or a path to a .toml file")]
    UnknownPreset(String),
    /// The workload file could not be read.
    #[error("cannot read workload file {path}: {reason}")]
    Unreadable {
        /// The file.
        path: String,
        /// The I/O error.
        reason: String,
    },
    /// The workload file is not valid TOML for [`Workload`].
    #[error("invalid workload file {path}: {reason}")]
    Malformed {
        /// The file.
        path: String,
        /// The parse error.
        reason: String,
    },
    /// A field is out of range.
    #[error("invalid workload: {0}")]
    Invalid(String),
    /// A combination Pulsar does not support (e.g. delayed delivery or
    /// corrupted batches on Failover, cumulative acks on Shared/Key_Shared).
    #[error("unsupported workload: {0}")]
    Unsupported(String),
    /// The workload file names the simulator's model engine (`engine =
    /// "model"`), which was removed: every run drives the broker core.
    #[error("workload file {path}: engine = \"model\": the simulator's model engine was removed; every run drives the shipped broker core (drop the line or write engine = \"node\")")]
    ModelEngineRemoved {
        /// The file.
        path: String,
    },
}

impl Workload {
    /// The late bound of delayed messages (see
    /// [`Workload::delayed_late_bound_ms`]).
    pub fn delayed_late_bound(&self) -> u64 {
        if self.delayed_late_bound_ms > 0 {
            self.delayed_late_bound_ms
        } else {
            self.stall_bound_ms + self.faults.outage_ms + 10 * self.delayed_tick_ms
        }
    }

    /// The preset names.
    pub const PRESETS: [&'static str; 6] = [
        "default",
        "fanout",
        "delayed",
        "txn-outage",
        "permit-churn",
        "failover",
    ];

    /// A named preset (docs/internals/simulator.md says what each exercises).
    ///
    /// # Errors
    /// [`WorkloadError::UnknownPreset`].
    pub fn preset(name: &str) -> Result<Self, WorkloadError> {
        let base = Workload::default();
        Ok(match name {
            // What `pulsar-core simulate` runs without `--workload`: all four
            // components do work in one seeded run on the shipped broker
            // core (its report's component section says so). Shared with
            // delayed messages (bucket seals and merges across small
            // ledgers, tracker recoveries at the restarts and crash points,
            // rewinds and clock jumps, clear-backlogs failing on a later
            // bucket's snapshot delete), transactional acks (a pending-ack
            // replay after each restart and crash, with read failures
            // retried), negative acks and batch-index acks (partial batches
            // with `ack_set`, P below the batch size), the faulty-frame and
            // write-failure paths of the permits, cursor reads that take
            // 1..=20 virtual ms (acks land while a read is in flight: the
            // post-I/O filter drops them), and the hint_race and
            // replay_race stages. No seeks: the node engine refuses them
            // with transactions or delayed messages (`node_unsupported`:
            // the checker's transaction rules and the delayed truth do not
            // model a reset yet); tests/workloads/node_seek.toml runs them.
            "default" => Workload {
                name: name.into(),
                engine: Engine::Node,
                producers: 20,
                subscriptions: 2,
                consumers_per_subscription: 3,
                subscription_type: SubscriptionType::Shared,
                messages: 20_000,
                batch_size: 10,
                keys: 100,
                delayed_ratio: 0.8,
                max_delay_ms: 40_000,
                txn_ack_ratio: 0.1,
                receiver_queue_size: 100,
                max_entries_per_ledger: 200,
                delayed_min_index_count_per_bucket: 50,
                delayed_max_num_buckets: 2,
                delayed_tick_ms: 100,
                publish_interval_ms: 50,
                read_latency_ms: 20,
                negative_ack_ratio: 0.1,
                faults: Faults {
                    restarts: 3,
                    read_outages: 1,
                    outage_ms: 2_000,
                    reconnects: 4,
                    replay_read_failures: 3,
                    crash_points: 3,
                    snapshot_create_failure_ratio: 0.05,
                    snapshot_delete_failure_ratio: 0.05,
                    rewinds: 4,
                    clock_jumps: 2,
                    hint_race: true,
                    replay_race: true,
                    admission_reject_ratio: 0.01,
                    same_connection_reconnects: 2,
                    duplicate_subscribes: 4,
                    write_failure_ratio: 0.005,
                    invalid_permits_ratio: 0.005,
                    corrupted_batch_ratio: 0.01,
                    zero_permits_on_corrupted_ratio: 0.25,
                    clear_backlogs: 2,
                    clear_delete_failure_ratio: 1.0,
                    ..Faults::default()
                },
                ..base
            },
            // The read-scheduling hint's contended shape: 500 producers, one topic, 20 Key_Shared
            // subscriptions × 10 consumers, on the shipped broker core
            // (its Key_Shared routing, the read with the hint), then the hint_race stage.
            "fanout" => Workload {
                name: name.into(),
                engine: Engine::Node,
                producers: 500,
                subscriptions: 20,
                consumers_per_subscription: 10,
                subscription_type: SubscriptionType::KeyShared,
                messages: 100_000,
                batch_size: 10,
                keys: 10_000,
                publish_interval_ms: 50,
                faults: Faults {
                    hint_race: true,
                    // The core has no read-outage path yet (the store
                    // wrapper fails no reads).
                    read_outages: 0,
                    ..Faults::default()
                },
                ..base
            },
            // Delayed messages over many ledgers with small bucket limits so
            // seal, merge and trim happen often, on the shipped broker core
            // (its trackers checked against the truth: `sim::node::delayed`).
            "delayed" => Workload {
                name: name.into(),
                engine: Engine::Node,
                producers: 20,
                subscriptions: 2,
                consumers_per_subscription: 2,
                subscription_type: SubscriptionType::Shared,
                messages: 20_000,
                batch_size: 1,
                delayed_ratio: 0.8,
                max_delay_ms: 60_000,
                max_entries_per_ledger: 200,
                delayed_min_index_count_per_bucket: 100,
                delayed_max_num_buckets: 4,
                delayed_tick_ms: 100,
                // Cold reads of a backlog spread over many small ledgers: long
                // enough that acks of the due messages the tracker dispatches
                // land while a rewind's or restart's re-read of them is in
                // flight (the post-I/O filter drops them).
                read_latency_ms: 20,
                faults: Faults {
                    snapshot_create_failure_ratio: 0.05,
                    snapshot_delete_failure_ratio: 0.05,
                    // No seeks (with the node engine's SEEK the run's
                    // acked + skipped accounting does not add up yet) and
                    // no read outage (it moves the seeds' dispatch timing
                    // off what the delayed_* mutants' lines catch).
                    read_outages: 0,
                    rewinds: 2,
                    clock_jumps: 2,
                    clock_jump_ms: 15_000,
                    clear_backlogs: 1,
                    clear_delete_failure_ratio: 0.5,
                    ..Faults::default()
                },
                ..base
            },
            // Transactional acks, a storage outage and a deleted pending-ack
            // ledger across restarts, on the shipped broker core (the
            // faults are the store's: `sim::node::store_faults`).
            "txn-outage" => Workload {
                name: name.into(),
                engine: Engine::Node,
                producers: 10,
                subscriptions: 2,
                consumers_per_subscription: 2,
                subscription_type: SubscriptionType::Shared,
                messages: 10_000,
                batch_size: 5,
                txn_ack_ratio: 0.5,
                publish_interval_ms: 100,
                read_latency_ms: PRESET_READ_LATENCY_MS,
                faults: Faults {
                    restarts: 2,
                    read_outages: 2,
                    outage_ms: 10_000,
                    lose_pending_ack_ledger: true,
                    replay_read_failures: 2,
                    admission_reject_ratio: 0.01,
                    replay_race: true,
                    ..Faults::default()
                },
                ..base
            },
            // Shared, frequent reconnects and corrupted batches, on the
            // shipped broker core (faulty frames are the network's:
            // `sim::node::faulty`).
            "permit-churn" => Workload {
                name: name.into(),
                engine: Engine::Node,
                producers: 10,
                subscriptions: 1,
                consumers_per_subscription: 5,
                subscription_type: SubscriptionType::Shared,
                messages: 20_000,
                batch_size: 20,
                receiver_queue_size: 100,
                faults: Faults {
                    reconnects: 20,
                    corrupted_batch_ratio: 0.02,
                    same_connection_reconnects: 10,
                    invalid_permits_ratio: 0.005,
                    zero_permits_on_corrupted_ratio: 0.25,
                    // No read outages, admission rejections or write
                    // failures in this shape (the core's admission and
                    // write-failure paths run in
                    // `tests/workloads/node_dispatch_faults.toml`).
                    read_outages: 0,
                    ..Faults::default()
                },
                ..base
            },
            // Failover with cumulative acks, some of them transactional
            // (`sim::node::txn_cumulative`), across restarts, crashes at
            // durable writes, an outage, a lost pending-ack ledger and
            // active-consumer changes, on the shipped broker core.
            "failover" => Workload {
                name: name.into(),
                engine: Engine::Node,
                producers: 10,
                subscriptions: 2,
                consumers_per_subscription: 3,
                subscription_type: SubscriptionType::Failover,
                messages: 10_000,
                batch_size: 5,
                txn_ack_ratio: 0.3,
                cumulative_ack_every: 200,
                publish_interval_ms: 50,
                read_latency_ms: PRESET_READ_LATENCY_MS,
                faults: Faults {
                    restarts: 2,
                    read_outages: 1,
                    outage_ms: 3_000,
                    reconnects: 8,
                    lose_pending_ack_ledger: true,
                    pending_ack_auto_skip: true,
                    replay_read_failures: 2,
                    redeliveries: 2,
                    crash_points: 3,
                    crash_window: 150,
                    ..Faults::default()
                },
                txn: TxnWorkload {
                    crashes_during_end: 1,
                    ..TxnWorkload::default()
                },
                ..base
            },
            other => return Err(WorkloadError::UnknownPreset(other.to_string())),
        })
    }

    /// Reads a workload from a TOML file with the fields of [`Workload`].
    ///
    /// # Errors
    /// [`WorkloadError::Unreadable`], [`WorkloadError::Malformed`],
    /// [`WorkloadError::ModelEngineRemoved`] for a file naming `engine =
    /// "model"`, or [`WorkloadError::Invalid`] / [`WorkloadError::Unsupported`]
    /// from [`Workload::validate`].
    pub fn from_toml_file(path: &std::path::Path) -> Result<Self, WorkloadError> {
        let text = std::fs::read_to_string(path).map_err(|e| WorkloadError::Unreadable {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        let names_model = toml::from_str::<toml::Table>(&text)
            .ok()
            .and_then(|t| {
                t.get("engine")
                    .and_then(|e| e.as_str().map(|e| e == "model"))
            })
            .unwrap_or(false);
        if names_model {
            return Err(WorkloadError::ModelEngineRemoved {
                path: path.display().to_string(),
            });
        }
        let w: Workload = toml::from_str(&text).map_err(|e| WorkloadError::Malformed {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        w.validate()?;
        Ok(w)
    }

    /// Resolves `--workload`: a preset name (always wins, even over a file of
    /// that name), or a path to a `.toml` file.
    ///
    /// # Errors
    /// As [`Workload::preset`] / [`Workload::from_toml_file`].
    pub fn resolve(spec: &str) -> Result<Self, WorkloadError> {
        if Self::PRESETS.contains(&spec) {
            return Self::preset(spec);
        }
        if spec.ends_with(".toml") || std::path::Path::new(spec).is_file() {
            return Self::from_toml_file(std::path::Path::new(spec));
        }
        Self::preset(spec)
    }

    /// The first setting the node engine cannot run, if any.
    pub fn node_unsupported(&self) -> Option<&'static str> {
        let f = &self.faults;
        [
            (
                f.seeks > 0 && (self.txn.transactions > 0 || self.txn_ack_ratio > 0.0),
                "faults.seeks > 0 with transactions (the checker's transaction rules, sim::checker::txn, do not know seeks yet)",
            ),
            (
                f.seeks > 0 && self.delayed_ratio > 0.0,
                "faults.seeks > 0 with delayed messages (the delayed tracker's truth, sim::node::delayed, does not know seeks yet)",
            ),
            (
                f.unsubscribes > 0 && (self.txn.transactions > 0 || self.txn_ack_ratio > 0.0),
                "faults.unsubscribes > 0 with transactions (the checker's transaction rules, sim::checker::txn, do not know a subscription deleted and created again)",
            ),
            (
                f.unsubscribes > 0 && self.delayed_ratio > 0.0,
                "faults.unsubscribes > 0 with delayed messages (the delayed tracker's truth, sim::node::delayed, does not know a subscription deleted and created again)",
            ),
            (
                f.readers > 0 && self.txn.transactions > 0 && self.txn.messages_per_topic > 0,
                "faults.readers > 0 with transactional messages (the reader rules, sim::checker::reader, do not know read-committed visibility)",
            ),
            (
                f.chunked_ratio > 0.0
                    && self.subscription_type != SubscriptionType::Failover
                    && self.consumers_per_subscription > 1,
                "faults.chunked_ratio > 0 on a Shared or Key_Shared subscription with several consumers (a message's chunks may reach different consumers, which Pulsar's client cannot reassemble; Pulsar supports chunking on Exclusive and Failover subscriptions)",
            ),
            (
                f.chunked_ratio > 0.0 && self.batch_size > 1,
                "faults.chunked_ratio > 0 with batch_size > 1 (Pulsar's producer refuses chunking with batching)",
            ),
            (
                f.chunked_ratio > 0.0
                    && (self.txn.transactions > 0 || self.txn_ack_ratio > 0.0 || self.delayed_ratio > 0.0),
                "faults.chunked_ratio > 0 with transactions or delayed messages (the node engine's chunking client sends plain chunks only)",
            ),
            (
                f.chunked_ratio > 0.0
                    && (f.readers > 0 || f.seeks > 0 || f.corrupted_batch_ratio > 0.0 || f.invalid_permits_ratio > 0.0 || self.cumulative_ack_every > 0 || self.negative_ack_ratio > 0.0),
                "faults.chunked_ratio > 0 with readers, seeks, damaged deliveries, cumulative acks or negative acks (the chunking client reassembles and acknowledges individually only)",
            ),
            (
                f.chunked_ratio > 0.0 && f.unsubscribes > 0,
                "faults.chunked_ratio > 0 with unsubscribes (the chunking client's reassembly contexts do not follow a subscription deleted and created again; swarm seed 70 livelocks)",
            ),
            (
                f.producer_access_modes > 0.0
                    && (self.txn.transactions > 0 || self.txn_ack_ratio > 0.0),
                "faults.producer_access_modes > 0 with transactions (the transaction client's shared producers on the topic would keep every exclusive producer out)",
            ),
            (
                !f.crash_at_writes.is_empty(),
                "faults.crash_at_writes (the node engine draws k from faults.crash_window)",
            ),
        ]
        .into_iter()
        .find(|(bad, _)| *bad)
        .map(|(_, what)| what)
    }

    /// Checks every field's range.
    ///
    /// # Errors
    /// [`WorkloadError::Invalid`] naming the first bad field.
    pub fn validate(&self) -> Result<(), WorkloadError> {
        let bad = |m: &str| Err(WorkloadError::Invalid(m.to_string()));
        let ratio = |r: f64| (0.0..=1.0).contains(&r);
        if self.messages == 0 {
            return bad("messages must be at least 1");
        }
        if self.producers == 0 {
            return bad("producers must be at least 1");
        }
        if self.subscriptions == 0 || self.consumers_per_subscription == 0 {
            return bad("subscriptions and consumers_per_subscription must be at least 1");
        }
        if self.batch_size == 0 || self.batch_size > 512 {
            return bad("batch_size must be in 1..=512");
        }
        if self.keys == 0 {
            return bad("keys must be at least 1");
        }
        if self.receiver_queue_size < 2 {
            return bad("receiver_queue_size must be at least 2");
        }
        if self.max_entries_per_ledger == 0 {
            return bad("max_entries_per_ledger must be at least 1");
        }
        if self.delayed_tick_ms == 0 || self.stall_bound_ms == 0 {
            return bad("delayed_tick_ms and stall_bound_ms must be at least 1");
        }
        if self.delayed_min_index_count_per_bucket == 0 {
            return bad("delayed_min_index_count_per_bucket must be at least 1");
        }
        // Upper bounds keep every run finite, in memory and free of overflow.
        const HOUR_MS: u64 = 3_600_000;
        for (name, value, max) in [
            ("messages", self.messages, 100_000_000),
            ("producers", u64::from(self.producers), 100_000),
            ("subscriptions", u64::from(self.subscriptions), 1_000),
            (
                "consumers_per_subscription",
                u64::from(self.consumers_per_subscription),
                10_000,
            ),
            ("keys", u64::from(self.keys), 100_000_000),
            (
                "receiver_queue_size",
                u64::from(self.receiver_queue_size),
                1_000_000,
            ),
            (
                "max_entries_per_ledger",
                u64::from(self.max_entries_per_ledger),
                10_000_000,
            ),
            ("publish_interval_ms", self.publish_interval_ms, HOUR_MS),
            ("read_latency_ms", self.read_latency_ms, 60_000),
            // Well inside the run's 6 h virtual-time limit, so that a delayed
            // message is due before the limit cuts the run short.
            ("max_delay_ms", self.max_delay_ms, 2 * HOUR_MS),
            ("delayed_tick_ms", self.delayed_tick_ms, HOUR_MS),
            ("stall_bound_ms", self.stall_bound_ms, 24 * HOUR_MS),
            ("faults.outage_ms", self.faults.outage_ms, HOUR_MS),
            ("faults.restarts", u64::from(self.faults.restarts), 100),
            ("faults.rewinds", u64::from(self.faults.rewinds), 100),
            (
                "faults.clock_jumps",
                u64::from(self.faults.clock_jumps),
                100,
            ),
            ("faults.clock_jump_ms", self.faults.clock_jump_ms, HOUR_MS),
            (
                "faults.clear_backlogs",
                u64::from(self.faults.clear_backlogs),
                100,
            ),
            (
                "faults.read_outages",
                u64::from(self.faults.read_outages),
                100,
            ),
            (
                "faults.reconnects",
                u64::from(self.faults.reconnects),
                100_000,
            ),
            ("faults.seeks", u64::from(self.faults.seeks), 100),
            (
                "faults.duplicate_subscribes",
                u64::from(self.faults.duplicate_subscribes),
                100_000,
            ),
            (
                "faults.crash_points",
                u64::from(self.faults.crash_points),
                100,
            ),
            (
                "faults.crash_at_writes (entries)",
                self.faults.crash_at_writes.len() as u64,
                100,
            ),
            (
                "faults.operator_auto_skip_after_ms",
                self.faults.operator_auto_skip_after_ms,
                HOUR_MS,
            ),
            (
                "faults.replay_read_failures",
                u64::from(self.faults.replay_read_failures),
                100,
            ),
            (
                "faults.same_connection_reconnects",
                u64::from(self.faults.same_connection_reconnects),
                100_000,
            ),
            (
                "delayed_late_bound_ms",
                self.delayed_late_bound_ms,
                24 * HOUR_MS,
            ),
            (
                "cumulative_ack_every",
                u64::from(self.cumulative_ack_every),
                1_000_000,
            ),
        ] {
            if value > max {
                return Err(WorkloadError::Invalid(format!(
                    "{name} must be at most {max}, got {value}"
                )));
            }
        }
        if self.faults.crash_at_writes.contains(&0) {
            return bad("faults.crash_at_writes: durable writes are counted from 1");
        }
        if self.messages.saturating_mul(u64::from(self.subscriptions)) > 2_000_000_000 {
            return bad("messages × subscriptions must be at most 2,000,000,000 deliveries");
        }
        for (name, r) in [
            ("delayed_ratio", self.delayed_ratio),
            ("negative_ack_ratio", self.negative_ack_ratio),
            ("txn_ack_ratio", self.txn_ack_ratio),
            (
                "faults.corrupted_batch_ratio",
                self.faults.corrupted_batch_ratio,
            ),
            (
                "faults.snapshot_create_failure_ratio",
                self.faults.snapshot_create_failure_ratio,
            ),
            (
                "faults.snapshot_delete_failure_ratio",
                self.faults.snapshot_delete_failure_ratio,
            ),
            (
                "faults.invalid_permits_ratio",
                self.faults.invalid_permits_ratio,
            ),
            (
                "faults.zero_permits_on_corrupted_ratio",
                self.faults.zero_permits_on_corrupted_ratio,
            ),
            (
                "faults.admission_reject_ratio",
                self.faults.admission_reject_ratio,
            ),
            (
                "faults.write_failure_ratio",
                self.faults.write_failure_ratio,
            ),
            (
                "faults.clear_delete_failure_ratio",
                self.faults.clear_delete_failure_ratio,
            ),
            ("faults.chunked_ratio", self.faults.chunked_ratio),
            (
                "faults.producer_access_modes",
                self.faults.producer_access_modes,
            ),
        ] {
            if !ratio(r) {
                return Err(WorkloadError::Invalid(format!(
                    "{name} must be within 0.0..=1.0, got {r}"
                )));
            }
        }
        if self.faults.corrupted_batch_ratio > 0.5 {
            return bad(
                "faults.corrupted_batch_ratio must be at most 0.5 (every corrupted delivery is replayed; above that a run may never drain)",
            );
        }
        let unsupported = |m: &str| Err(WorkloadError::Unsupported(m.to_string()));
        if self.faults.crash_window == 0 || self.faults.crash_window > 1_000_000 {
            return bad("faults.crash_window must be in 1..=1,000,000");
        }
        if self.faults.crash_recovery_window > 1_000_000 {
            return bad("faults.crash_recovery_window must be at most 1,000,000");
        }
        if self.faults.redeliveries > 100_000 {
            return bad("faults.redeliveries must be at most 100,000");
        }
        if self.faults.readers > MAX_READERS {
            return bad("faults.readers must be at most 16");
        }
        if self.faults.unsubscribes > 100 {
            return bad("faults.unsubscribes must be at most 100");
        }
        if let Some(what) = self.node_unsupported() {
            return unsupported(&format!("{what}: the broker core has no such path yet"));
        }
        if self.faults.pending_ack_entries_missing && !self.faults.pending_ack_auto_skip {
            return unsupported(
                "faults.pending_ack_entries_missing needs faults.pending_ack_auto_skip: without it the replay retries the lost data forever (Pulsar's replay fails every attempt)",
            );
        }
        self.txn.validate()?;
        let failover = self.subscription_type == SubscriptionType::Failover;
        if failover && self.delayed_ratio > 0.0 {
            return unsupported(
                "delayed_ratio > 0 with subscription_type = \"failover\": Pulsar delivers delayed messages only on Shared and Key_Shared subscriptions",
            );
        }
        if failover && self.faults.rewinds > 0 {
            return unsupported(
                "faults.rewinds > 0 with subscription_type = \"failover\": the consumer-set rewind is the Shared / Key_Shared dispatcher's (PersistentDispatcherMultipleConsumers)",
            );
        }
        if !failover && self.cumulative_ack_every > 0 {
            return unsupported(
                "cumulative_ack_every > 0 needs subscription_type = \"failover\": Pulsar rejects cumulative acks on Shared and Key_Shared subscriptions",
            );
        }
        if failover && self.negative_ack_ratio > 0.0 {
            return unsupported(
                "negative_ack_ratio > 0 with subscription_type = \"failover\": the simulator checks Failover's total order, which a negatively acknowledged message redelivered after later ones breaks",
            );
        }
        if failover && self.faults.corrupted_batch_ratio > 0.0 {
            return unsupported(
                "faults.corrupted_batch_ratio > 0 with subscription_type = \"failover\": the simulator replays a corrupted entry after later ones, which breaks Failover's total order and would be covered by a later cumulative ack",
            );
        }
        Ok(())
    }
}

/// Node engine: transactions as a Pulsar client runs them over the wire
/// (`sim::node::txn`): a transaction client on its own connection runs
/// `transactions` transactions one after another (TC_CLIENT_CONNECT,
/// NEW_TXN, ADD_PARTITION_TO_TXN for the run's topic and a second topic,
/// ADD_SUBSCRIPTION_TO_TXN for every subscription of the run's topic),
/// sends `messages_per_topic` transactional messages to each topic, lets
/// the consumers acknowledge inside it for `open_ms`, then commits or
/// aborts (END_TXN), or leaves it open for its timeout (`timeout_ms`) to
/// abort it. The seed draws each transaction's end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TxnWorkload {
    /// Transactions the client runs (0 = none).
    pub transactions: u32,
    /// Transactional messages per topic per transaction.
    pub messages_per_topic: u32,
    /// Fraction of the consumers' acks of non-batched entries made inside
    /// the open transaction (ADD_SUBSCRIPTION_TO_TXN'd subscriptions).
    pub ack_ratio: f64,
    /// Fraction of transactions ended by END_TXN(abort).
    pub abort_ratio: f64,
    /// Fraction of transactions the client never ends: the coordinator's
    /// timeout aborts them.
    pub timeout_ratio: f64,
    /// How long a transaction stays open for acks, virtual ms.
    pub open_ms: u64,
    /// `txn_ttl_millis` of a transaction left to time out, virtual ms.
    pub timeout_ms: u64,
    /// `txn_ttl_millis` of the others (long: a retried END_TXN answered
    /// `TransactionNotFound` within it proves the transaction ended as
    /// the client asked), virtual ms.
    pub ttl_ms: u64,
    /// Pause between two transactions, virtual ms.
    pub gap_ms: u64,
    /// Of the run's `faults.crash_points`, how many move to an END_TXN:
    /// when the client sends one, the armed crash point moves to one of
    /// the next few durable writes (the coordinator's Committing/Aborting,
    /// the markers, the pending-ack COMMIT/ABORT, the subscription's
    /// persist, Committed/Aborted), so the broker dies inside a commit or
    /// an abort and its recovery must finish it.
    pub crashes_during_end: u32,
    /// The core's `transactionBufferSnapshotMaxTransactionCount`
    /// ([`crate::broker::BrokerConfig::txn_snapshot`], `serve
    /// --transaction-buffer-snapshot-max-transaction-count`): a topic's
    /// transaction buffer takes a snapshot after this many transactions
    /// ended on it.
    pub snapshot_max_transaction_count: u64,
    /// The core's `transactionBufferSnapshotMinTimeInMillis` (`serve
    /// --transaction-buffer-snapshot-min-time-in-millis`), virtual ms:
    /// small, a snapshot falls while a transaction is open (its max read
    /// position held before the transaction's first entry) and the crash
    /// points after it recover the buffer from that snapshot.
    pub snapshot_min_time_ms: u64,
}

impl Default for TxnWorkload {
    fn default() -> Self {
        Self {
            transactions: 0,
            messages_per_topic: 3,
            ack_ratio: 0.3,
            abort_ratio: 0.3,
            timeout_ratio: 0.1,
            open_ms: 200,
            timeout_ms: 1_000,
            ttl_ms: 600_000,
            gap_ms: 20,
            crashes_during_end: 0,
            snapshot_max_transaction_count: 1_000,
            snapshot_min_time_ms: 5_000,
        }
    }
}

impl TxnWorkload {
    /// Checks the ranges.
    ///
    /// # Errors
    /// [`WorkloadError::Invalid`] naming the first bad field.
    pub fn validate(&self) -> Result<(), WorkloadError> {
        let bad = |m: &str| Err(WorkloadError::Invalid(m.to_string()));
        let ratio = |r: f64| (0.0..=1.0).contains(&r);
        if self.transactions > 10_000 || self.messages_per_topic > 1_000 {
            return bad(
                "txn.transactions must be at most 10,000 and txn.messages_per_topic at most 1,000",
            );
        }
        if !ratio(self.ack_ratio)
            || !ratio(self.abort_ratio)
            || !ratio(self.timeout_ratio)
            || self.abort_ratio + self.timeout_ratio > 1.0
        {
            return bad("txn.ack_ratio, txn.abort_ratio, txn.timeout_ratio must be in 0..=1 (abort + timeout at most 1)");
        }
        if self.open_ms == 0 || self.open_ms > 60_000 || self.gap_ms > 60_000 {
            return bad("txn.open_ms must be in 1..=60,000 and txn.gap_ms at most 60,000");
        }
        if self.timeout_ms == 0 || self.timeout_ms > 600_000 {
            return bad("txn.timeout_ms must be in 1..=600,000");
        }
        if self.snapshot_max_transaction_count == 0 || self.snapshot_min_time_ms == 0 {
            return bad("txn.snapshot_max_transaction_count and txn.snapshot_min_time_ms must be at least 1");
        }
        if self.ttl_ms < 60_000 || self.ttl_ms > 3_600_000 {
            return bad("txn.ttl_ms must be in 60,000..=3,600,000 (long beside a run's crashes: see TxnWorkload)");
        }
        Ok(())
    }
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests {
    use super::*;

    #[test]
    fn presets_are_valid() {
        for p in Workload::PRESETS {
            let w = Workload::preset(p).unwrap();
            w.validate().unwrap();
            assert_eq!(w.name, p);
        }
        assert!(matches!(
            Workload::preset("nope"),
            Err(WorkloadError::UnknownPreset(_))
        ));
    }

    #[test]
    fn unsupported_combinations_are_typed_errors() {
        let mut w = Workload::preset("failover").unwrap();
        w.delayed_ratio = 0.1;
        let err = w.validate().unwrap_err();
        assert!(matches!(err, WorkloadError::Unsupported(_)), "{err}");
        assert!(err.to_string().contains("delayed"), "{err}");

        let mut w = Workload::preset("failover").unwrap();
        w.faults.corrupted_batch_ratio = 0.01;
        assert!(matches!(w.validate(), Err(WorkloadError::Unsupported(_))));

        let mut w = Workload::preset("permit-churn").unwrap();
        w.cumulative_ack_every = 5;
        let err = w.validate().unwrap_err();
        assert!(err.to_string().contains("cumulative"), "{err}");
    }

    #[test]
    fn node_only_pending_ack_faults_are_typed_errors_elsewhere() {
        let mut w = Workload::preset("txn-outage").unwrap();
        w.faults.txn_acks_of_deleted = true;
        w.faults.pending_ack_auto_skip = true;
        w.faults.pending_ack_entries_missing = true;
        w.validate().unwrap();
        w.faults.pending_ack_auto_skip = false;
        let err = w.validate().unwrap_err();
        assert!(matches!(err, WorkloadError::Unsupported(_)), "{err}");
        assert!(err.to_string().contains("pending_ack_auto_skip"), "{err}");
    }

    /// A workload file naming the removed model engine is a typed error
    /// saying so; `engine = "node"` and no `engine` line both run the
    /// broker core.
    #[test]
    fn a_file_naming_the_model_engine_is_a_typed_error() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("model.toml");
        std::fs::write(&model, "engine = \"model\"\nmessages = 10\n").unwrap();
        let err = Workload::from_toml_file(&model).unwrap_err();
        assert!(
            matches!(err, WorkloadError::ModelEngineRemoved { .. }),
            "{err}"
        );
        assert!(
            err.to_string().contains("model engine was removed"),
            "{err}"
        );
        for text in ["engine = \"node\"\nmessages = 10\n", "messages = 10\n"] {
            let f = dir.path().join("node.toml");
            std::fs::write(&f, text).unwrap();
            let w = Workload::from_toml_file(&f).unwrap();
            assert_eq!(w.engine, Engine::Node, "{text}");
        }
    }

    #[test]
    fn toml_file_round_trip_and_errors() {
        let dir = tempfile::tempdir().unwrap();
        let ok = dir.path().join("w.toml");
        std::fs::write(
            &ok,
            "name = \"mine\"\nmessages = 50\n[faults]\nrestarts = 0\n",
        )
        .unwrap();
        let w = Workload::resolve(ok.to_str().unwrap()).unwrap();
        assert_eq!(
            (w.name.as_str(), w.messages, w.faults.restarts),
            ("mine", 50, 0)
        );

        let unknown = dir.path().join("u.toml");
        std::fs::write(&unknown, "mesages = 5\n").unwrap();
        assert!(matches!(
            Workload::resolve(unknown.to_str().unwrap()),
            Err(WorkloadError::Malformed { .. })
        ));
        let zero = dir.path().join("z.toml");
        std::fs::write(&zero, "messages = 0\n").unwrap();
        let err = Workload::resolve(zero.to_str().unwrap()).unwrap_err();
        assert!(err.to_string().contains("messages"), "{err}");
        assert!(matches!(
            Workload::resolve("/no/such/file.toml"),
            Err(WorkloadError::Unreadable { .. })
        ));
    }
}
