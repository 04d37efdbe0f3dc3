//! The node engine: `pulsar-core simulate` driving the shipped broker core
//! ([`crate::broker::Broker`]) on virtual time, with faults around it.
//!
//! The core is the one `serve` runs; this driver only swaps the world
//! around it (the shape of tigerbeetle's VOPR and of a sans-io core's
//! deterministic engine):
//!
//! - **clients that speak real frames** (`client.rs`): producers encode
//!   CONNECT, PRODUCER and SEND (a `MessageMetadata` with the key, batches
//!   of several messages, `deliver_at_time` for delayed messages; a
//!   delayed message goes alone, as Pulsar's producer never batches one);
//!   consumers encode SUBSCRIBE (Exclusive/Shared/Failover/Key_Shared),
//!   FLOW, ACK (individual, cumulative, batch-index `ack_set`, each with a
//!   `request_id`: Pulsar's ack receipts), REDELIVER_UNACKNOWLEDGED_MESSAGES
//!   and CLOSE_CONSUMER. Their permits are the library's client side
//!   (`permits::client::ClientConsumer` / `ClientConnection` decide every
//!   Flow and settle every MESSAGE's `message_permits`). Every frame is
//!   decoded on arrival (SEND_RECEIPT, MESSAGE, SUCCESS, ERROR,
//!   ACK_RESPONSE, CONNECTED, PRODUCER_SUCCESS).
//! - **the network** (this file): bytes go through a [`FrameCutter`]
//!   on each side (the cut `serve` makes), with a seeded latency per
//!   transfer; a connection's bytes keep their order, and the broker's
//!   output keeps the order the core produced it (one outbound link), so
//!   a SEND_RECEIPT reaches its producer before the MESSAGE of that entry
//!   reaches a consumer. Write completions (`handle_written`) follow each
//!   transfer; the core's timer (`poll_timeout`) is a scheduled event.
//! - **faults** (`faults.rs`): clean restarts, crashes at the k-th durable
//!   write of the store ([`crate::sim::crash_storage`]), consumer
//!   reconnects, close/resubscribe on the same connection (a new PIP-491
//!   incarnation of the same consumer id) and redelivery requests.
//!
//! The checker ([`DeliveryChecker`]) sees only what the clients see: a
//! message is published when its SEND_RECEIPT arrives, delivered when the
//! application dequeues it, acknowledged when its ACK_RESPONSE arrives
//! without an error; restarts and reconnects as the clients live them.
//!
//! A crash: the store's backend dies at its k-th durable write; the driver
//! stops feeding the core at once, drops it and every frame in flight from
//! it (a dead process sends nothing), rolls the store back to its durable
//! image, opens a new core on it, and every client reconnects as a Pulsar
//! client does: producers resend what had no receipt, consumers subscribe
//! again (new incarnations) and resend acks that had no receipt.
//!
//! Duplicates after a crash: the core has no deduplication (as Pulsar with
//! `brokerDeduplicationEnabled=false`), so a SEND whose entry became
//! durable but whose receipt was lost leaves a copy in the topic, and the
//! resend a second one. The checker counts the resend as the published
//! message (its receipt arrived); a delivered entry the checker does not
//! know is accepted as that copy only when its payload names a send whose
//! connection was lost before its receipt arrived: it is then registered
//! as published (exempt from the order rule: it sits at the position of
//! the lost send) and must be delivered and acknowledged like any other
//! message. Any other unknown entry is a violation.

mod admission;
pub mod chunks;
mod client;
mod counters;
pub mod creation;
mod delayed;
mod deleted_ack_probe;
mod dup_copy;
mod faults;
mod faulty;
mod nack;
pub mod producers;
pub mod reader;
mod seek;
mod store_faults;
mod stored_once;
mod trace_run;
pub mod txn;
mod txn_cumulative;
pub mod unsubscribe;
pub mod wire;

use std::collections::BTreeMap;
use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::broker::{Broker, BrokerConfig, Output, ReadId};
use crate::ledger::RedbStore;

use super::checker::{DeliveryChecker, OrderCheck};
use super::crash_storage::{CrashKind, CrashPoint, CrashRecord, CrashStorage};
use super::options::{Sabotage, SimError, SimOptions};
use super::report::{peak_memory_kib, Activity, Report, Timing};
use super::scheduler::{Scheduler, VirtualMs};
use super::watchdog::{HangGuard, Heartbeat, LoopWatch};
use super::workload::{SubscriptionType, Workload};

use crate::broker::FrameCutter;
use client::{Consumer, Producer};
use faults::FaultPlan;

/// The broker's epoch-ms clock at virtual time 0.
pub const EPOCH_BASE_MS: u64 = 1_700_000_000_000;
/// The topic every client uses.
pub const TOPIC: &str = "persistent://public/default/sim-node";
/// Cache of the store, bytes.
/// The store file a data dir keeps after a run (the name `inspect` and
/// `verify` look for).
const STORE_FILE: &str = "pulsar-core.redb";
const STORE_CACHE_BYTES: usize = 4 * 1024 * 1024;
/// A run stops at this virtual time (the rest is "unfinished").
const VIRTUAL_LIMIT_MS: u64 = 6 * 3_600_000;

/// Virtual ms between two trims of consumed ledgers in the node engine.
const RETENTION_CHECK_INTERVAL_MS: u64 = 1_000;

/// The core's settings for workload `w`: its entries per ledger (a
/// workload with small ledgers has consumed ledgers trimmed, at crash
/// points too), no retention, trimming every
/// [`RETENTION_CHECK_INTERVAL_MS`], its turn commit and transaction buffer
/// snapshot settings.
fn node_broker_config(w: &Workload) -> BrokerConfig {
    let mut c = BrokerConfig::new("pulsar://sim-node:6650");
    c.ledger.max_entries_per_ledger = w.max_entries_per_ledger;
    c.retention_check_interval_ms = RETENTION_CHECK_INTERVAL_MS;
    c.turn_commit = w.turn_commit;
    c.txn_snapshot = crate::broker::txn::SnapshotConfig {
        max_transaction_count: w.txn.snapshot_max_transaction_count,
        min_time_ms: w.txn.snapshot_min_time_ms,
    };
    c
}

/// What the node engine did, beyond the counters of [`Activity`].
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct NodeActivity {
    /// Crash points reached: the broker died at a durable write.
    pub crash_points: u64,
    /// Of those, crashes after the fsync (the write durable, no answer sent).
    pub crashes_after_sync: u64,
    /// Of the crash points reached, those drawn within
    /// `faults.crash_recovery_window` durable writes of the start after a
    /// crash (the store died again while the broker reopened).
    pub crashes_in_recovery: u64,
    /// Clean restarts.
    pub clean_restarts: u64,
    /// Entries producers sent again after a lost connection (no receipt).
    pub resent_entries: u64,
    /// Copies of such sends delivered (registered as published on delivery).
    pub lost_receipt_copies: u64,
    /// Messages of resent entries the broker answered as duplicates
    /// (receipt `(-1, -1)`, not stored again: deduplication).
    pub deduplicated_messages: u64,
    /// Of those, messages whose earlier copy the store held when the
    /// answer arrived, published to the checker then (`dup_copy.rs`).
    pub dup_copies_in_store: u64,
    /// Acks sent again after a lost connection (no receipt).
    pub ack_retries: u64,
    /// ACK_RESPONSEs received.
    pub ack_receipts: u64,
    /// Batch-index acks (`ack_set`) sent.
    pub batch_index_acks: u64,
    /// Corrupted MESSAGEs of an earlier consumer epoch (their entry
    /// already given back by the epoch's redelivery request: no negative
    /// ack stands in for their validation-error ack, `faulty.rs`).
    pub corrupted_of_earlier_epoch: u64,
    /// REDELIVER_UNACKNOWLEDGED_MESSAGES sent.
    pub redelivery_requests: u64,
    /// MESSAGE commands the client discarded (stale epoch or incarnation).
    pub stale_commands: u64,
    /// ACTIVE_CONSUMER_CHANGE notices telling a Failover consumer it is
    /// not the active one.
    pub inactive_notices: u64,
    /// SEEK frames sent (`faults.seeks`, `seek.rs`).
    pub seeks_sent: u64,
    /// Of those, resets the core applied (the checker was told).
    pub seeks_applied: u64,
    /// Of those, resets of a SEEK the core died on, or applied in a turn
    /// a crash lost before its outputs left, found in the recovered cursor.
    pub seeks_applied_at_crash: u64,
    /// Resets the core applied in a turn a crash lost before its outputs
    /// left, not in the recovered cursor: no reset happened.
    pub seeks_lost_in_crash: u64,
    /// Frames the clients sent / the core sent.
    pub frames_to_broker: u64,
    /// Frames the core sent.
    pub frames_from_broker: u64,
    /// Durable writes of the store over the run.
    pub durable_writes: u64,
    /// Transactions (`txn.rs`).
    pub txn: txn::TxnActivity,
    /// Consumed ledgers the core deleted (`broker::lifecycle`), over every
    /// broker generation.
    pub ledgers_deleted: u64,
    /// Reads of a pending-ack log that returned no entry, its data gone
    /// (`faults.pending_ack_entries_missing`, `store_faults.rs`).
    pub pending_ack_reads_missing: u64,
    /// Readers (`faults.readers`, `reader.rs`).
    pub readers: reader::ReaderActivity,
    /// Unsubscribes (`faults.unsubscribes`, `unsubscribe.rs`).
    pub unsubscribes: unsubscribe::UnsubActivity,
    /// Subscriptions' first creations (`creation.rs`).
    pub creations: creation::CreationActivity,
    /// Chunked messages (`faults.chunked_ratio`, `chunks.rs`).
    pub chunks: chunks::ChunkActivity,
    /// Producer access modes and names (`faults.producer_access_modes`,
    /// `producers.rs`).
    pub producer_access: producers::AccessActivity,
}

/// Which client a connection belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClientRef {
    Producer(usize),
    Consumer(usize),
    /// The transaction client or the second topic's reader (`txn.rs`).
    Txn(txn::Role),
    /// A reader client (`reader.rs`).
    Reader(usize),
}

/// One event of the run.
#[derive(Debug)]
enum Ev {
    /// Bytes of connection `conn` reach the core (of broker generation `gen`).
    ToBroker { gen: u64, conn: u64, bytes: Vec<u8> },
    /// The core's bytes of `conn` were written (generation `gen`).
    Written { gen: u64, conn: u64, bytes: usize },
    /// The core's bytes of `conn` could not be written (generation `gen`).
    WriteFailed { gen: u64, conn: u64, bytes: usize },
    /// The core's bytes reach the client of `conn`.
    ToClient { conn: u64, bytes: Vec<u8> },
    /// The core closed `conn`.
    Closed { conn: u64 },
    /// The core's timer, for its deadline `deadline` (virtual ms).
    Timer { gen: u64, deadline: VirtualMs },
    /// A producer publishes its next entry.
    Publish(usize),
    /// A consumer's application takes what its receiver queue holds.
    Poll(usize),
    /// A client (re)connects.
    Connect(ClientRef),
    /// A planned fault.
    Fault(faults::Fault),
    /// A timed step of the transaction client (`txn.rs`).
    Txn(txn::TxnEv),
    /// A seek's reset reaches the clients (`seek.rs`).
    SeekApplied { sub: String, md: crate::Position },
    /// A cursor read the core issued completes (generation `gen`), after
    /// the workload's read latency.
    ReadDone { gen: u64, read: ReadId },
    /// A timed step of a reader (`reader.rs`).
    Reader(reader::ReaderEv),
    /// A subscription created again after an unsubscribe reaches the
    /// clients (`unsubscribe.rs`).
    Unsubscribed { sub: String, md: crate::Position },
    /// A subscription's first creation reached its client (`creation.rs`):
    /// its initial position's mark-delete `md`.
    Created { sub: String, md: crate::Position },
}

impl Ev {
    fn label(&self) -> (&'static str, &'static str) {
        match self {
            Ev::ToBroker { .. } => ("broker core", "ToBroker"),
            Ev::Written { .. } => ("broker core", "Written"),
            Ev::WriteFailed { .. } => ("broker core", "WriteFailed"),
            Ev::ToClient { .. } => ("client", "ToClient"),
            Ev::Closed { .. } => ("client", "Closed"),
            Ev::Timer { .. } => ("broker core", "Timer"),
            Ev::Publish(_) => ("producer", "Publish"),
            Ev::Poll(_) => ("consumer", "Poll"),
            Ev::Connect(_) => ("client", "Connect"),
            Ev::Fault(_) => ("faults", "Fault"),
            Ev::Txn(_) => ("transaction client", "Txn"),
            Ev::SeekApplied { .. } => ("client", "SeekApplied"),
            Ev::ReadDone { .. } => ("broker core", "ReadDone"),
            Ev::Reader(_) => ("reader", "Reader"),
            Ev::Unsubscribed { .. } => ("client", "Unsubscribed"),
            Ev::Created { .. } => ("client", "Created"),
        }
    }
}

/// The driver's state.
struct Node<'a> {
    w: &'a Workload,
    opts: &'a SimOptions,
    rng: ChaCha8Rng,
    sched: Scheduler<Ev>,
    checker: DeliveryChecker,
    activity: Activity,
    node: NodeActivity,
    heartbeat: Arc<Heartbeat>,
    storage: CrashStorage,
    broker: Option<Broker>,
    /// Incremented at every (re)start: events of an older core are dropped.
    gen: u64,
    /// The core's side of each connection: its frame cutter.
    broker_side: BTreeMap<u64, FrameCutter>,
    /// Arrival time of the last transfer per client connection (to the core).
    to_broker_last: BTreeMap<u64, VirtualMs>,
    /// Arrival time of the core's last transfer (one outbound link).
    from_broker_last: VirtualMs,
    /// The core's timer deadline already scheduled (virtual ms) and the
    /// last deadline that fired.
    timer_at: Option<VirtualMs>,
    timer_fired: Option<VirtualMs>,
    conns: BTreeMap<u64, ClientRef>,
    next_conn: u64,
    producers: Vec<Producer>,
    consumers: Vec<Consumer>,
    /// The "stored once" rule's record ([`stored_once`]).
    stored_once: stored_once::StoredOnce,
    plan: FaultPlan,
    crashes_left: u32,
    /// Whether the run's work is done (the loop only drains).
    done: bool,
    /// Whether the self-test defect ([`Sabotage`]) was applied (each once).
    sabotage_spent: bool,
    subs: Vec<String>,
    /// Entries the core's admission hook refused (every core of the run).
    admission_rejections: Arc<crate::sync::AtomicU64>,
    /// What the admission hook admitted, spent by each MESSAGE the core
    /// queues (`admission.rs`); `None` without a hook.
    admissions: Option<admission::SharedAdmissions>,
    /// Transactional acks of deleted messages in flight (`deleted_ack_probe.rs`).
    probes: deleted_ack_probe::Probes,
    /// The per-component counters of the cores dropped so far.
    core_counters: crate::broker::DispatchCounters,
    /// The transaction client and the second topic's reader (`txn.rs`).
    txn: txn::TxnSide,
    /// Seeks in flight (`seek.rs`).
    seeks: seek::SeekSide,
    /// The reader clients (`reader.rs`).
    readers: reader::ReaderSide,
    /// Unsubscribes in flight (`unsubscribe.rs`).
    unsubs: unsubscribe::UnsubSide,
    /// Subscriptions' first creations (`creation.rs`).
    creations: creation::CreationSide,
    /// Chunk contexts of the consumers (`chunks.rs`).
    chunks: chunks::ChunkSide,
    /// Producer access modes and names (`producers.rs`).
    access: producers::AccessSide,
    /// What the store under every core fails (`store_faults.rs`).
    store_plan: store_faults::SharedPlan,
    /// The pending-ack logs are opened with auto-skip of non-recoverable
    /// data (the workload's, or the operator's after a replay gave up).
    auto_skip: bool,
    /// The next start loses each pending-ack log's first needed ledger.
    lose_ledger_at_start: bool,
    /// The next start may lose the pending-ack logs' entries
    /// (`store_faults.rs`).
    entries_missing_at_start: bool,
    /// Tries the planned restart waited for a transaction holding acks.
    restart_waits: u32,
    /// Read outages still to begin at a restart.
    outages_at_restarts: u32,
    /// Restarts and crashes so far (operator reloads not counted).
    starts_after_first: u32,
    /// The next start is the operator's reload with auto-skip on.
    operator_reload: bool,
    /// Delayed delivery: tracker settings, snapshot faults, the truth
    /// (`delayed.rs`).
    delayed: delayed::DelayedSide,
    /// The next start follows a crash (`faults.crash_recovery_window`).
    crashed: bool,
    /// The armed crash point was drawn within `faults.crash_recovery_window`.
    recovery_armed: bool,
    /// Reads the core issued that complete in this turn (no read latency).
    reads_now: Vec<ReadId>,
    /// Whether [`Node::call_broker`] is completing `reads_now`.
    completing_reads: bool,
}

/// Runs `workload` (its `engine` is `node`) with `opts`.
///
/// # Errors
/// [`SimError::Component`] for a workload the engine cannot run or a store
/// that cannot be opened.
pub fn run(
    workload: &Workload,
    opts: &SimOptions,
    progress: Option<&dyn Fn(u64, u64)>,
) -> Result<Report, SimError> {
    workload
        .validate()
        .map_err(|e| SimError::Component(e.to_string()))?;
    let effective = txn::with_txn_ack_ratio(workload);
    let workload = &effective;
    let started = std::time::Instant::now();
    let subs: Vec<String> = (0..workload.subscriptions)
        .map(|i| format!("sub-{i}"))
        .collect();
    let order = match workload.subscription_type {
        SubscriptionType::KeyShared => OrderCheck::PerKey,
        SubscriptionType::Failover => OrderCheck::Total,
        SubscriptionType::Shared => OrderCheck::None,
    };
    // The core's delayed tracker is strict (`deliver_at_time_strict`):
    // nothing may come early.
    let mut checker = DeliveryChecker::new(subs.clone(), 0, order);
    checker.set_late_bound(workload.delayed_late_bound());
    checker.set_key_exclusive(true);
    let creations = creation::CreationSide::new(&subs);
    let mut n = Node {
        w: workload,
        opts,
        rng: ChaCha8Rng::seed_from_u64(opts.seed),
        sched: Scheduler::new(),
        checker,
        activity: Activity::default(),
        node: NodeActivity::default(),
        heartbeat: Arc::new(Heartbeat::default()),
        storage: CrashStorage::new(),
        broker: None,
        gen: 0,
        broker_side: BTreeMap::new(),
        stored_once: stored_once::StoredOnce::default(),
        to_broker_last: BTreeMap::new(),
        from_broker_last: 0,
        timer_at: None,
        timer_fired: None,
        conns: BTreeMap::new(),
        next_conn: 1,
        producers: Vec::new(),
        consumers: Vec::new(),
        plan: FaultPlan::default(),
        crashes_left: if opts.faults {
            workload.faults.crash_points
        } else {
            0
        },
        done: false,
        sabotage_spent: false,
        subs,
        admission_rejections: Arc::new(crate::sync::AtomicU64::new(0)),
        admissions: None,
        probes: deleted_ack_probe::Probes::default(),
        core_counters: crate::broker::DispatchCounters::default(),
        txn: txn::TxnSide::default(),
        seeks: seek::SeekSide::default(),
        readers: reader::ReaderSide::default(),
        unsubs: unsubscribe::UnsubSide::default(),
        creations,
        chunks: chunks::ChunkSide::default(),
        access: producers::AccessSide::default(),
        store_plan: store_faults::SharedPlan::default(),
        auto_skip: workload.faults.pending_ack_auto_skip,
        lose_ledger_at_start: false,
        entries_missing_at_start: false,
        restart_waits: 0,
        outages_at_restarts: 0,
        starts_after_first: 0,
        operator_reload: false,
        delayed: delayed::DelayedSide::default(),
        crashed: false,
        recovery_armed: false,
        reads_now: Vec::new(),
        completing_reads: false,
    };
    let _hang_guard = HangGuard::start(
        Arc::clone(&n.heartbeat),
        opts.watchdog.exit_on_hang,
        format!(
            "pulsar-core simulate: workload {}, seed {}",
            workload.name, opts.seed
        ),
    );
    trace_run::start(workload, opts)?;
    let looped = n
        .start_broker()
        .and_then(|()| {
            n.setup_clients();
            n.setup_readers();
            n.setup_txn()
        })
        .and_then(|()| {
            if opts.faults {
                n.plan_faults();
            }
            n.event_loop(progress)
        });
    // The lines of the event loop only: the race stages below run real
    // threads on components of their own.
    trace_run::finish(workload, opts)?;
    looped?;
    let virtual_ms = n.sched.now();
    if n.storage.disarm().is_some() {
        n.activity.crash_points_unreached += 1;
    }
    n.node.durable_writes = n.storage.stats().durable_writes;
    n.activity.admission_rejections = n.admission_rejections.load(crate::sync::Ordering::Relaxed);
    {
        let plan = n.store_plan.lock();
        n.activity.read_failures_injected += plan.outage_failures + plan.replay_failures;
        n.activity.replay_read_failures_injected += plan.replay_failures;
        n.activity.read_failures_injected += plan.missing_reads;
        n.node.pending_ack_reads_missing = plan.missing_reads;
    }
    n.node.txn = std::mem::take(&mut n.txn.activity);
    // The transactional acks and ends the pending-ack handles logged.
    n.activity.txn_individual_acks += n.node.txn.acks;
    n.activity.txn_commits += n.node.txn.committed;
    n.activity.txn_aborts += n.node.txn.aborted;
    let txn_work = txn::component(&n.node.txn, workload.txn.messages_per_topic > 0);
    let reader_work = reader::component(
        &n.node.readers,
        &n.node.unsubscribes,
        workload.faults.readers > 0,
        workload.faults.unsubscribes > 0,
    );
    n.node.chunks = std::mem::take(&mut n.chunks.activity);
    let chunk_work = chunks::component(&n.node.chunks, workload.faults.chunked_ratio > 0.0);
    n.node.producer_access = std::mem::take(&mut n.access.activity);
    let access_work = producers::component(
        &n.node.producer_access,
        workload.faults.producer_access_modes > 0.0,
    );
    // The last core closes cleanly.
    n.retire_broker();
    // An existing data dir keeps the store file (`pulsar-core inspect`,
    // `verify`), as the CLI's `--data-dir` / `--keep-data` promise.
    let saved_to = opts
        .data_dir
        .is_dir()
        .then(|| opts.data_dir.join(STORE_FILE));
    if let Some(path) = &saved_to {
        std::fs::write(path, n.storage.durable_image()).map_err(|e| {
            SimError::Component(format!("write the store file {}: {e}", path.display()))
        })?;
    }
    n.activity.crash_storage = Some(n.storage.stats());
    counters::into_activity(&n.core_counters, &mut n.activity);
    n.delayed.add_to_activity(&mut n.activity);
    n.drain_delayed_violations();
    // A send answered as a duplicate must have a copy in the topic, which
    // the run delivers — unless a clear-backlog or a seek may have skipped
    // that copy (Pulsar delivers neither what a clear-backlog acknowledged
    // nor what a forward seek passed), so the rule holds only in runs
    // without either.
    let copies_may_be_skipped = n.activity.clear_backlogs > 0 || workload.faults.seeks > 0;
    for (p, seq) in n
        .stored_once
        .never_stored()
        .into_iter()
        .filter(|_| !copies_may_be_skipped)
    {
        let due = n.stored_once.due_ms(p, seq);
        let what = format!(
            "producer p-{p} sequence id {seq} answered as a duplicate, no copy ever receipted or delivered (due at t={due}ms)"
        );
        n.checker.receipted_never_stored(&what, virtual_ms);
    }
    let Node {
        checker,
        mut activity,
        node,
        heartbeat,
        ..
    } = n;
    let (counts, first_violation) = checker.finish(virtual_ms);
    // The stages on real threads (the shipped cursor deletion state and
    // pending-ack replay), as after a model-engine run.
    let stages = super::stages::run(workload, opts.faults, &heartbeat);
    let first_violation = first_violation.or_else(|| stages.first_violation());
    activity.node = Some(node);
    // The core's per-component counters (`counters.rs`) and what the event
    // loop counted: a component with no work reads NOT EXERCISED.
    let mut components = super::report::components(&activity);
    components.push(txn_work);
    components.extend(reader_work);
    components.extend(chunk_work);
    components.extend(access_work);
    let wall_ms = started.elapsed().as_millis() as u64;
    let delivered = counts.delivered;
    Ok(Report {
        workload: workload.name.clone(),
        seed: opts.seed,
        data_dir: saved_to.map_or_else(
            || "in memory (sim::crash_storage)".into(),
            |p| format!("in memory (sim::crash_storage), saved to {}", p.display()),
        ),
        sync: match opts.sync {
            crate::ledger::SyncMode::Immediate => "always".into(),
            crate::ledger::SyncMode::Deferred => "deferred".into(),
        },
        virtual_ms,
        violations: counts.violations() + stages.violations(),
        counts,
        activity,
        components,
        first_violation,
        timing: Timing {
            #[cfg(feature = "race-hooks")]
            hint_race: stages.hint_race,
            #[cfg(feature = "race-hooks")]
            replay_race: stages.replay_race,
            stages_not_built: stages.not_built,
            wall_ms,
            deliveries_per_sec: delivered as f64 / (wall_ms.max(1) as f64 / 1000.0),
            peak_memory_kib: peak_memory_kib(),
        },
    })
}

impl Node<'_> {
    fn now(&self) -> VirtualMs {
        self.sched.now()
    }

    /// Opens a core on the store's current image (a new process) and arms
    /// the next crash point.
    fn start_broker(&mut self) -> Result<(), SimError> {
        let after_crash = std::mem::take(&mut self.crashed);
        let store =
            RedbStore::open_on_backend(self.storage.backend(), self.opts.sync, STORE_CACHE_BYTES)
                .map_err(|e| SimError::Component(format!("open the store: {e}")))?;
        self.gen += 1;
        self.reads_now.clear();
        self.broker_side.clear();
        self.timer_at = None;
        self.timer_fired = None;
        let now = self.core_now();
        self.delayed.set_core_now(now);
        self.readers_check_store(&store);
        self.unsubs_check_store(&store);
        self.creations_check_store(&store);
        self.seeks_check_store(&store);
        self.txn_count_snapshots(&store);
        if std::mem::take(&mut self.lose_ledger_at_start) {
            self.lose_pending_ack_ledgers(&store)?;
        }
        if std::mem::take(&mut self.entries_missing_at_start) {
            self.arm_missing_pending_acks(&store)?;
        }
        let mut config = node_broker_config(self.w);
        self.delayed
            .configure(self.w, self.opts.faults, &mut config);
        config.deduplication = self.opts.sabotage != Some(Sabotage::NoDeduplication);
        config.admission = self.admission_hook(Arc::clone(&self.admission_rejections));
        config.ledger.auto_skip_non_recoverable_data = self.auto_skip;
        self.store_plan.lock().new_core();
        let ledgers = Arc::new(store_faults::faulty_ledger_store(
            store.clone(),
            Arc::clone(&self.store_plan),
        ));
        self.broker = Some(Broker::with_ledger_store(store, ledgers, config, now));
        if self.crashes_left > 0 {
            let base = self.storage.durable_writes_since_open();
            let recovery = self.w.faults.crash_recovery_window;
            self.recovery_armed = after_crash && recovery > 0;
            let window = if self.recovery_armed {
                recovery
            } else {
                self.w.faults.crash_window
            };
            let k = base + self.rng.random_range(1..=window);
            let kind = if self.rng.random_bool(0.5) {
                CrashKind::BeforeSync
            } else {
                CrashKind::AfterSync
            };
            self.storage.arm(CrashPoint { k, kind });
        }
        Ok(())
    }

    /// Calls the core (if it lives) and ends the turn (its group commit,
    /// [`Broker::flush`]), then: if its store died, the crash; else its
    /// outputs go out and its timer is rescheduled.
    fn with_broker(&mut self, f: impl FnOnce(&mut Broker, u64)) {
        self.call_broker(f, true);
    }

    /// As [`Self::with_broker`]; with `end_turn` false the turn goes on
    /// (no group commit, no outputs yet: more frames of the same delivery
    /// follow), a crash of the store is still handled at once.
    fn call_broker(&mut self, f: impl FnOnce(&mut Broker, u64), end_turn: bool) {
        let mut f = Some(f);
        self.call_broker_dyn(
            &mut |b, now| {
                if let Some(f) = f.take() {
                    f(b, now);
                }
            },
            end_turn,
        );
    }

    /// [`Self::call_broker`] on a `dyn` input (it calls itself for the
    /// reads completed in the turn).
    fn call_broker_dyn(&mut self, f: &mut dyn FnMut(&mut Broker, u64), end_turn: bool) {
        self.note_durable();
        let now = self.core_now();
        self.delayed.set_core_now(now);
        let Some(b) = self.broker.as_mut() else {
            return;
        };
        let armed = self.storage.armed();
        // No input may panic the core (its contract): a panic ends the run
        // as a violation, after what the observers saw before it.
        // Without read latency a read completes right after the input that
        // issued it (and after the turn's commit), as `serve` completes them.
        let instant_reads = self.w.read_latency_ms == 0;
        let turn = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            f(b, now);
            if instant_reads {
                b.complete_reads(now);
            }
            if end_turn {
                b.flush();
                if instant_reads {
                    b.complete_reads(now);
                }
            }
        }));
        if turn.is_ok() {
            self.note_durable();
        }
        self.drain_delayed_violations();
        if let Err(p) = turn {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            self.checker
                .livelock(&format!("the broker core panicked: {what}"), self.now());
            // Its state is whatever the panic left: never touched again.
            std::mem::forget(self.broker.take());
            self.done = true;
            return;
        }
        if self.storage.is_dead() {
            if armed.is_some_and(|p| p.kind == CrashKind::AfterSync) {
                self.node.crashes_after_sync += 1;
            }
            self.crash();
            return;
        }
        if end_turn {
            self.pump();
            // Reads issued while the outputs were taken (the turn's commit
            // dispatched), completed without latency: one loop, not a
            // recursion per read.
            if !self.completing_reads {
                self.completing_reads = true;
                while !self.reads_now.is_empty() && self.broker.is_some() && !self.done {
                    let reads = std::mem::take(&mut self.reads_now);
                    self.call_broker_dyn(
                        &mut |b, now| {
                            for r in &reads {
                                b.complete_read(*r, now);
                            }
                        },
                        true,
                    );
                }
                self.completing_reads = false;
            }
        }
    }

    /// Sends the core's outputs and reschedules its timer.
    fn pump(&mut self) {
        let now = self.now();
        let Some(b) = self.broker.as_mut() else {
            return;
        };
        let mut out = Vec::new();
        while let Some(o) = b.poll_output() {
            out.push(o);
        }
        if b.store().deferred_commits() == 0 {
            self.delayed.turn_durable();
        }
        let deadline = b.poll_timeout();
        for o in out {
            match o {
                Output::Frame { conn, frame } => {
                    self.node.frames_from_broker += 1;
                    let bytes = frame.encode();
                    let at = self.outbound_arrival();
                    let len = bytes.len();
                    let gen = self.gen;
                    self.check_admitted(conn, &frame);
                    if self.write_fails(&frame) {
                        let ev = Ev::WriteFailed {
                            gen,
                            conn,
                            bytes: len,
                        };
                        self.sched.at(at, ev);
                        continue;
                    }
                    self.sched.at(at, Ev::ToClient { conn, bytes });
                    self.sched.at(
                        at,
                        Ev::Written {
                            gen,
                            conn,
                            bytes: len,
                        },
                    );
                }
                Output::Close { conn, .. } => {
                    let at = self.outbound_arrival();
                    self.sched.at(at, Ev::Closed { conn });
                }
                Output::Incarnation(_) => {}
                Output::ReadIssued { read } => self.read_issued(read),
            }
        }
        self.schedule_applied_seeks();
        self.schedule_recreated_subscriptions();
        self.schedule_created_subscriptions();
        if let Some(d) = deadline {
            let d = d.saturating_sub(EPOCH_BASE_MS + self.delayed.clock_offset_ms);
            // A deadline in the past that already fired waits for the next
            // input (a Flow, an ack): firing it again changes nothing.
            let again = d <= now && self.timer_fired == Some(d);
            if !again && self.timer_at.is_none_or(|t| d < t) {
                self.timer_at = Some(d.max(now));
                let gen = self.gen;
                self.sched.at(d.max(now), Ev::Timer { gen, deadline: d });
            }
        }
    }

    /// A read the core issued completes after a seeded latency of
    /// 1..=`read_latency_ms` (acks, Flows and other frames reach the core
    /// meanwhile), or in this turn without latency.
    fn read_issued(&mut self, read: ReadId) {
        if self.w.read_latency_ms == 0 {
            self.reads_now.push(read);
            return;
        }
        self.activity.reads_with_latency += 1;
        let at = self.now() + self.rng.random_range(1..=self.w.read_latency_ms);
        let gen = self.gen;
        self.sched.at(at, Ev::ReadDone { gen, read });
    }

    fn latency(&mut self) -> VirtualMs {
        self.rng.random_range(1..=3)
    }

    fn outbound_arrival(&mut self) -> VirtualMs {
        let at = (self.now() + self.latency()).max(self.from_broker_last);
        self.from_broker_last = at;
        at
    }

    /// Sends `bytes` from the client of `conn` to the core, sometimes in
    /// two transfers cut at a random byte (frames split across reads).
    fn send_to_broker(&mut self, conn: u64, bytes: Vec<u8>) {
        if bytes.is_empty() {
            return;
        }
        let last = self.to_broker_last.get(&conn).copied().unwrap_or(0);
        let at = (self.now() + self.latency()).max(last);
        self.to_broker_last.insert(conn, at);
        let gen = self.gen;
        if bytes.len() > 1 && self.rng.random_bool(0.1) {
            let cut = self.rng.random_range(1..bytes.len());
            let (a, b) = bytes.split_at(cut);
            self.sched.at(
                at,
                Ev::ToBroker {
                    gen,
                    conn,
                    bytes: a.to_vec(),
                },
            );
            self.sched.at(
                at,
                Ev::ToBroker {
                    gen,
                    conn,
                    bytes: b.to_vec(),
                },
            );
        } else {
            self.sched.at(at, Ev::ToBroker { gen, conn, bytes });
        }
    }

    /// A new connection of `client`: the core sees it open.
    fn open_conn(&mut self, client: ClientRef) -> u64 {
        let conn = self.next_conn;
        self.next_conn += 1;
        self.conns.insert(conn, client);
        if self.broker.is_some() {
            self.broker_side.insert(conn, FrameCutter::default());
            self.with_broker(|b, now| b.handle_open(conn, now));
        }
        conn
    }

    /// The client closes `conn` (the core sees it close).
    fn close_conn(&mut self, conn: u64) {
        self.conns.remove(&conn);
        self.to_broker_last.remove(&conn);
        if self.broker_side.remove(&conn).is_some() {
            self.with_broker(|b, now| b.handle_close(conn, now));
        }
    }

    /// Drops the core, counting what it did.
    fn retire_broker(&mut self) {
        self.collect_core_counters();
        if let Some(b) = &self.broker {
            self.delayed.collect(b);
        }
        if let Some(b) = self.broker.take() {
            self.node.ledgers_deleted += b.ledgers_deleted_total();
        }
    }

    /// The broker process died at a crash point: nothing more of it runs.
    fn crash(&mut self) {
        // A barrier that returned `Ok` before the process died (at its
        // fsync, `CrashKind::AfterSync`) made its turn durable; what was
        // committed after the last such barrier is lost.
        self.note_durable();
        self.delayed.crashed();
        self.crashed = true;
        if std::mem::take(&mut self.recovery_armed) {
            self.node.crashes_in_recovery += 1;
        }
        self.retire_broker();
        if let Some(p) = self.storage.recover() {
            self.activity.crashes.push(CrashRecord {
                k: p.k,
                kind: p.kind,
                at_ms: self.now(),
            });
        }
        self.crashes_left = self.crashes_left.saturating_sub(1);
        self.node.crash_points += 1;
        self.after_broker_gone();
    }

    /// Every store commit of the core so far is durable (no commit waits
    /// for a turn barrier): its bucket snapshot changes survive a crash
    /// (`sim::delayed_truth`).
    fn note_durable(&mut self) {
        if self
            .broker
            .as_ref()
            .is_some_and(|b| b.store().deferred_commits() == 0)
        {
            self.delayed.turn_durable();
        }
    }

    /// A clean restart: the core is dropped (the store closes cleanly).
    fn clean_restart(&mut self) {
        if self.broker.is_none() {
            return;
        }
        self.retire_broker();
        // The core's drop committed its last turn's barrier.
        if !self.storage.is_dead() {
            self.delayed.turn_durable();
        }
        if !self.operator_reload {
            self.node.clean_restarts += 1;
        }
        self.after_broker_gone();
    }

    /// Every connection is gone with the old process; a new core starts and
    /// every client reconnects after its backoff.
    fn after_broker_gone(&mut self) {
        // The operator's reload is counted as a reload, not a restart.
        if !self.operator_reload {
            self.activity.restarts += 1;
        }
        self.checker.restarted();
        self.plan_store_faults_at_start();
        if let Err(e) = self.start_broker() {
            self.checker.livelock(
                &format!("the store does not reopen after a restart: {e}"),
                self.now(),
            );
            self.done = true;
            return;
        }
        let conns: Vec<(u64, ClientRef)> = self.conns.iter().map(|(c, r)| (*c, *r)).collect();
        self.conns.clear();
        self.to_broker_last.clear();
        for (conn, client) in conns {
            self.connection_lost(conn, client, true);
        }
    }

    fn event_loop(&mut self, progress: Option<&dyn Fn(u64, u64)>) -> Result<(), SimError> {
        let total = self.w.messages;
        let mut watch = LoopWatch::new(self.opts.watchdog, 0);
        let mut idle = (self.checker.progress(), 0u64, 0);
        let mut steps = 0u64;
        let started = std::time::Instant::now();
        while !self.done {
            let Some((now, ev)) = self.sched.pop() else {
                // Nothing more can be delivered: the transaction rules that
                // judge the end name what is missing before the stall.
                self.checker.txn_finish(self.now());
                let (component, recent) = self.heartbeat.describe();
                self.checker.livelock(
                    &format!(
                        "stall at t={}ms: nothing in flight and no timer, with the workload not done (last component {component}; last events: {recent})",
                        self.now()
                    ),
                    self.now(),
                );
                break;
            };
            if now > VIRTUAL_LIMIT_MS {
                let unpublished: u64 = self.producers.iter().map(|p| p.unpublished()).sum();
                self.checker
                    .unfinished(unpublished.max(1), self.plan.pending(), VIRTUAL_LIMIT_MS);
                break;
            }
            let (component, label) = ev.label();
            // The store's faults and its retry-pace rule run on the core's
            // clock (virtual time plus the clock jumps so far): a core whose
            // clock jumped forward retries a failed pending-ack read after
            // its backoff by its own clock, sooner in virtual time.
            self.store_plan.lock().now_ms = now + self.delayed.clock_offset_ms;
            self.heartbeat.begin(now, component, label, None);
            self.handle(ev);
            self.heartbeat.end();
            self.check_delayed_overdue();
            let hot = self.store_plan.lock().hot_retry.take();
            if let Some(what) = hot {
                self.checker.livelock(
                    &format!("livelock at t={now}ms in pending_ack replay: {what}"),
                    now,
                );
                break;
            }
            steps += 1;
            if let Some(report) = self.heartbeat.hang_report() {
                self.checker.livelock(&report, now);
                break;
            }
            if let Some(report) = watch.same_time(now, &self.heartbeat) {
                self.checker.livelock(&report, now);
                break;
            }
            let made = self.checker.progress();
            if made != idle.0 || self.checker.all_acked() {
                idle = (made, 0, now);
            } else {
                idle.1 += 1;
                if idle.1 > self.opts.watchdog.no_progress_events {
                    let (component, recent) = self.heartbeat.describe();
                    self.checker.livelock(
                        &format!(
                            "livelock at t={now}ms in {component}: no message received or acknowledged for {} events ({} virtual ms); last events: {recent}",
                            idle.1,
                            now - idle.2
                        ),
                        now,
                    );
                    break;
                }
            }
            if steps.is_multiple_of(1024) {
                if let Some(report) = watch.wall_limit(started, now, &self.heartbeat) {
                    self.checker.livelock(&report, now);
                    break;
                }
                if let Some(p) = progress {
                    let published: u64 = self.producers.iter().map(|p| p.receipted).sum();
                    p(published.min(total), total);
                }
            }
            if self.finished() {
                self.done = true;
            }
        }
        Ok(())
    }

    /// Every message published and acknowledged everywhere, every planned
    /// fault run.
    fn finished(&self) -> bool {
        self.producers.iter().all(|p| p.unpublished() == 0)
            && self.plan.pending() == 0
            && self.checker.all_acked()
            && self.txn_finished()
            && self.unsubs.settled()
            && self.creations.settled()
            && self.stored_once.copies_settled(self.now())
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::ToBroker { gen, conn, bytes } => {
                if gen == self.gen {
                    self.broker_receive(conn, &bytes);
                }
            }
            Ev::Written { gen, conn, bytes } => {
                if gen == self.gen && self.broker_side.contains_key(&conn) {
                    self.with_broker(|b, now| b.handle_written(conn, bytes, now));
                }
            }
            Ev::WriteFailed { gen, conn, bytes } => {
                if gen == self.gen && self.broker_side.contains_key(&conn) {
                    self.activity.write_failure_removals += 1;
                    self.with_broker(|b, now| b.handle_write_failed(conn, bytes, now));
                }
            }
            Ev::Timer { gen, deadline } => {
                if gen == self.gen {
                    self.timer_at = None;
                    self.timer_fired = Some(deadline);
                    self.with_broker(|b, t| b.handle_timeout(t));
                }
            }
            Ev::ToClient { conn, bytes } => {
                if let Some(c) = self.conns.get(&conn).copied() {
                    self.client_receive(conn, c, &bytes);
                }
            }
            Ev::Closed { conn } => {
                if let Some(c) = self.conns.remove(&conn) {
                    self.to_broker_last.remove(&conn);
                    self.connection_lost(conn, c, false);
                }
            }
            Ev::Publish(p) => self.publish(p),
            Ev::Poll(c) => self.poll(c),
            Ev::Connect(c) => self.connect(c),
            Ev::Fault(f) => self.fault(f),
            Ev::Txn(e) => self.txn_event(e),
            Ev::SeekApplied { sub, md } => self.seek_applied(&sub, md),
            Ev::ReadDone { gen, read } => {
                // A completion meant for a core that died is dropped with it.
                if gen == self.gen {
                    self.with_broker(|b, now| {
                        b.complete_read(read, now);
                    });
                }
            }
            Ev::Reader(e) => self.reader_event(e),
            Ev::Unsubscribed { sub, md } => self.subscription_recreated(&sub, md),
            Ev::Created { sub, md } => self.subscription_created(&sub, md),
        }
    }

    /// The core's side of a connection: bytes cut into frames, each handed
    /// to `handle_frame`; a framing error closes the connection. The bytes
    /// that reach the node at one virtual instant, on every connection, are
    /// one turn of the core (as `serve` hands the core every frame already
    /// buffered): its SENDs and acks share one group commit at the end
    /// ([`Broker::flush`]), their receipts go out after.
    fn broker_receive(&mut self, conn: u64, bytes: &[u8]) {
        let gen = self.gen;
        self.broker_receive_frames(conn, bytes);
        if gen == self.gen && !self.more_bytes_now() {
            self.with_broker(|_, _| {});
        }
    }

    /// Whether the next event is more bytes for the core at this instant
    /// (the turn goes on).
    fn more_bytes_now(&self) -> bool {
        let now = self.now();
        matches!(
            self.sched.peek(),
            Some((at, Ev::ToBroker { gen, .. })) if at == now && *gen == self.gen
        )
    }

    fn broker_receive_frames(&mut self, conn: u64, bytes: &[u8]) {
        let Some(cutter) = self.broker_side.get_mut(&conn) else {
            return;
        };
        cutter.push(bytes);
        loop {
            let gen = self.gen;
            let Some(cutter) = self.broker_side.get_mut(&conn) else {
                return;
            };
            let next = cutter.next_frame();
            match next {
                Ok(Some(f)) => {
                    self.node.frames_to_broker += 1;
                    let seek = self.seek_frame(conn, f.command());
                    let resets = seek.as_ref().and_then(|(_, sub)| self.resets_of(sub));
                    let unsub = self.unsub_frame(conn, f.command());
                    let mut closed = false;
                    self.call_broker(
                        |b, now| {
                            closed = b.handle_frame(conn, f.command(), f.payload(), now).is_err();
                        },
                        false,
                    );
                    if let Some((key, _)) = seek {
                        self.seek_handled(key, resets, gen != self.gen);
                    }
                    if let Some(u) = unsub {
                        self.unsub_handled(u, gen != self.gen);
                    }
                    if gen != self.gen {
                        return; // the core died on this frame
                    }
                    if closed {
                        self.broker_side.remove(&conn);
                        return;
                    }
                }
                Ok(None) => return,
                Err(reason) => {
                    self.checker.livelock(
                        &format!("a client sent a frame the core's framing rejects: {reason}"),
                        self.now(),
                    );
                    self.broker_side.remove(&conn);
                    return;
                }
            }
        }
    }

    fn backoff(&mut self) -> VirtualMs {
        self.rng.random_range(100..=300)
    }
}
