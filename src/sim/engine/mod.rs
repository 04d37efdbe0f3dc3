//! The broker-in-a-box: one topic on the durable store, its subscriptions,
//! consumers and clients, driven by the discrete-event [`Scheduler`] on
//! virtual time. Every step goes through the crate's real components:
//!
//! - producers append batch entries to the topic's [`ManagedLedger`] on the
//!   redb store;
//! - each subscription's dispatcher schedules reads with
//!   [`CursorDeletionState::is_deleted_for_read_scheduling`] (through
//!   [`ManagedCursor::read_entries_with_skip`]) and filters with the locked
//!   [`CursorDeletionState::filter_read_entries`];
//! - delayed messages go through the [`BucketDelayedDeliveryTracker`] with
//!   snapshots in the same redb file;
//! - deliveries carry `message_permits` from the broker side
//!   ([`SharedDispatcher`]) and clients account with [`ClientConsumer`];
//! - acknowledgements go into the cursor deletion state (individual acks,
//!   and on Failover cumulative acks through its mark-delete path) and, for
//!   transactions, through the [`PendingAckHandle`]'s log first;
//! - an admin seek resets a subscription's [`ManagedCursor`] and
//!   [`CursorDeletionState`] forward (Pulsar's reset cursor), reconnects its
//!   consumers and gives the delayed tracker the new mark-delete, so its
//!   trim path runs;
//! - a restart drops everything in memory and recovers cursor, delayed
//!   tracker and pending-ack state (replay included) from the store;
//! - a crash point (`faults.crash_points`, `faults.crash_at_writes`) kills
//!   the broker at a durable write of the store, kept in memory by
//!   [`CrashStorage`]: nothing the dead broker did after it reaches a
//!   client, the store keeps exactly what was fsynced, and the broker
//!   recovers as after a restart.
//!
//! Layout: this file holds the run's state (`Sim`), the event loop and the
//! event handler; `broker` (open, recover, publish, persist), `dispatch`
//! (the dispatcher's phases), `acks` (the broker's ack path), `client`
//! (deliveries, polls, Flow), `replay` (pending-ack replay and its rules),
//! `faults` (plan, outage, restart, reconnect, re-creation, seek),
//! `crashes` (crash points: plan, arming, the crash and what the recovered
//! store says the dead broker made durable),
//! `checks` (tracker count, overdue, stalls), `events` and `ids`
//! (subscription and consumer indexes).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use prost::Message as _;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::checker::{DeliveryChecker, MessageRef, OrderCheck};
use super::crash_storage::CrashStorage;
use super::delayed_storage::ObservedStorage;
use super::delayed_truth::DelayedTruth;
use super::report::{peak_memory_kib, Activity, Report, Timing};
use super::scheduler::{Scheduler, VirtualMs};
use super::watchdog::{HangGuard, Heartbeat, LoopWatch, Watchdog};
use super::workload::{SubscriptionType, Workload};
use crate::delayed::{
    BucketDelayedDeliveryTracker, BucketSnapshotStorage, BucketTrackerConfig, FaultPlan,
    FaultyStorage, RecoveryPolicy, RedbSnapshotStorage, VirtualClock,
};
use crate::deletion::{CursorDeletionState, DeletionError};
use crate::ledger::{
    LedgerConfig, LedgerError, LedgerStore, ManagedCursor, ManagedLedger, ReadFailureKind,
    RedbStore, SyncMode,
};
use crate::pending_ack::{
    AckType, AckedPosition, CommittedAck, CursorSubscription, ExecutorMode, HandleConfig,
    HandleState, InlineReads, PendingAckHandle, PendingAckRecord, ReplayExecutorPool, TxnId,
    VirtualTimer,
};
use crate::permits::broker::BrokerEntry;
use crate::permits::client::{encode_entry_payload, ClientConnection, ClientConsumer, ClientFrame};
use crate::permits::{ConsumerKey, SharedDispatcher};
use crate::position::Position;
use crate::proto::metadata::{MessageMetadata, SingleMessageMetadata};
use crate::proto::wire::CommandMessage;

mod acks;
mod broker;
mod checks;
mod client;
mod client_faults;
mod crashes;
mod delayed_faults;
mod dispatch;
mod events;
mod faults;
mod ids;
mod replay;

use crashes::{CrashPlan, UnreceiptedPublish};
use events::Ev;
use faults::{install_outage, ResetKind};
use ids::{ConsumerIdx, SubIdx};
use replay::{install_read_faults, pa_durable, LostReads, PaTruth, ReplayReadPlan, SharedPaTruth};

/// An entry on its way to a consumer: the permit view, its key and bytes.
#[derive(Debug, Clone)]
struct SimEntry {
    entry: BrokerEntry,
    key: u32,
    payload: Arc<Vec<u8>>,
}

impl SimEntry {
    fn new(position: Position, batch_size: u32, key: u32, payload: Vec<u8>) -> Self {
        Self {
            entry: BrokerEntry {
                position,
                batch_size,
                ack_set: Vec::new(),
            },
            key,
            payload: Arc::new(payload),
        }
    }

    /// The entry with the cursor's stored ack set of a partially
    /// acknowledged batch (set bit = index still to deliver), if any: the
    /// dispatcher sends only those indexes and P is their count.
    fn with_ack_set(mut self, ack_set: Option<Vec<i64>>) -> Self {
        if let Some(a) = ack_set {
            self.entry.ack_set = a;
        }
        self
    }
}

pub(crate) const TOPIC: &str = "persistent://public/default/sim";
const PENDING_ACK_CURSOR: &str = "__pending_ack_state";
/// The pending-ack replay's queue capacity and read batch (small, so a
/// replay reads ahead of what it applied and a failure can hit a later
/// read); `sim_trace` writes them as the trace cfg's Cap and B.
pub(crate) const PENDING_ACK_QUEUE_CAPACITY: usize = 16;
pub(crate) const PENDING_ACK_READ_BATCH: usize = 4;
/// The store's page cache (redb's default is 1 GiB, which a long run fills
/// as its file grows): the simulator reads mostly the tail of the topic, so
/// this bounds its memory without the cache deciding any outcome, bytes.
const STORE_CACHE_BYTES: usize = 64 << 20;
/// Network latency between broker and client, virtual ms.
const NET_MS: VirtualMs = 1;
/// Largest read a dispatcher issues, entries.
const MAX_READ_ENTRIES: usize = 100;
/// Mark-delete persistence interval, virtual ms.
const PERSIST_INTERVAL_MS: VirtualMs = 200;
/// Application poll interval, virtual ms.
const APP_POLL_MS: VirtualMs = 2;
/// Messages an application processes per poll.
const APP_BATCH: usize = 64;
/// Failover with cumulative acks: a consumer with received but not yet
/// acknowledged messages sends its cumulative ack at the latest this long
/// after its last poll (the client's ack grouping time), virtual ms.
const ACK_GROUP_MS: VirtualMs = 100;
/// A planned same-connection re-creation waits at most this long for a poll
/// that queues a Flow, virtual ms.
const RECREATE_DEADLINE_MS: VirtualMs = 5_000;
/// A pending-ack replay not complete this long after the broker started
/// it (outages aside) is a violation, virtual ms (the retry backoff is at
/// most 60 s).
const REPLAY_BOUND_MS: VirtualMs = 150_000;
/// A run that has not drained after this much virtual time stops (what is
/// left is reported as lost).
const VIRTUAL_TIME_LIMIT_MS: VirtualMs = 6 * 60 * 60 * 1000;

/// A deliberate defect for checking that the checker catches it (used by the
/// self-test; never enabled by the CLI).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sabotage {
    /// The client silently drops one message (never delivered, never acked).
    DropOneDelivery,
    /// The client hands one message to the application twice.
    DeliverOneTwice,
    /// The client returns one permit too few once.
    ReturnOnePermitTooFew,
    /// The client stops returning permits altogether (the broker runs dry
    /// while the client's queue is empty: a stall).
    StopReturningPermits,
    /// At the first seek on a subscription with a delayed tracker, the
    /// tracker is not given the new mark-delete (nothing is trimmed, its
    /// indexes below the seek stay tracked) and the first position it then
    /// schedules from below the seek is dispatched without the cursor's
    /// deletion check (a tracker that keeps delivering trimmed indexes).
    DeliverOneTrimmedMessage,
    /// A Failover consumer's first cumulative ack for which a next entry
    /// exists goes one entry past the last one the application received (it
    /// acknowledges a message it was never given).
    CumulativeAckOnePastReceived,
    /// The dispatcher runs the post-I/O filter when a cursor read is issued
    /// instead of when it completes (with read latency, an entry acked
    /// meanwhile passes the boundary).
    FilterWhenReadIssued,
    /// After the first Failover active-consumer change, the first non-empty
    /// set of messages the dispatcher hands back from a removed consumer
    /// (the old active consumer's unacknowledged, delivered messages) is
    /// dropped instead of redelivered to the new active one.
    DropFailoverHandover,
    /// Every pending-ack replay read's callback is lost (the read job is
    /// dropped unfinished), so the first replay waits for it inside one
    /// event until it is interrupted: a hang the hang watchdog must turn
    /// into a named livelock of this run (with
    /// [`Watchdog::exit_on_hang`] set; without it the run never ends).
    LoseReplayReadCallbacks,
    /// The broker handles the first duplicate Subscribe as a new consumer:
    /// it removes the one it has (its pending messages go back for
    /// redelivery) and registers it again with a zero balance, instead of
    /// answering Success and keeping it.
    DuplicateSubscribeReplacesConsumer,
    /// Node engine: the broker core runs without deduplication, so a send
    /// retried after a lost receipt (a crash, a reconnect) is stored again
    /// (the "stored once" rule must catch it).
    NoDeduplication,
}

/// Options of one run besides the workload.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// RNG seed: same seed (and workload), same report.
    pub seed: u64,
    /// Directory of the redb store.
    pub data_dir: PathBuf,
    /// Inject the workload's faults (restarts, outages, …).
    pub faults: bool,
    /// Self-test defect, if any.
    pub sabotage: Option<Sabotage>,
    /// How the store commits ([`SyncMode::Immediate`]: fsync every commit).
    /// A simulated restart closes the store cleanly, which makes deferred
    /// commits durable too, so both modes give the same report; only
    /// `Immediate` would survive a real crash or power loss. A crash point
    /// shows it: it loses what was not fsynced, so with `Deferred` the
    /// checker reports the published messages and acks it lost.
    pub sync: SyncMode,
    /// Livelock and wall-clock watchdogs.
    pub watchdog: Watchdog,
    /// Trace validation (cargo feature `trace`): record the hook lines of
    /// the components the event loop drives and write them, split into one
    /// run per component instance, to this directory (see
    /// `src/sim/sim_trace.rs`, built with the feature). Set without the feature, the run is a
    /// [`SimError::Component`] error.
    pub trace_dir: Option<PathBuf>,
}

impl SimOptions {
    /// Options for a run with `seed` on `data_dir`: faults on, no sabotage,
    /// default watchdogs (no process exit on a hang).
    pub fn new(seed: u64, data_dir: PathBuf) -> Self {
        Self {
            seed,
            data_dir,
            faults: true,
            sabotage: None,
            sync: SyncMode::Immediate,
            watchdog: Watchdog::default(),
            trace_dir: None,
        }
    }
}

/// Why a run could not be carried out (not a violation: a violation is in
/// the report).
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The data directory cannot be created or written.
    #[error("data dir {path}: {reason}")]
    DataDir {
        /// The directory.
        path: String,
        /// What failed.
        reason: String,
    },
    /// The store or a component failed in a way the run cannot continue from.
    #[error("simulation aborted: {0}")]
    Component(String),
}

fn comp<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> SimError {
    move |e| SimError::Component(format!("{what}: {e}"))
}

/// The application payload of one message: who published it, its key and
/// when it may be delivered.
#[derive(Clone, PartialEq, prost::Message)]
struct SimPayload {
    #[prost(uint32, tag = "1")]
    producer: u32,
    #[prost(uint32, tag = "2")]
    key: u32,
    #[prost(uint64, tag = "3")]
    deliver_at_ms: u64,
}

/// Broker-side state of one subscription (dropped on restart).
struct SubRt {
    name: String,
    cursor: Arc<ManagedCursor>,
    deletion: Arc<CursorDeletionState>,
    dispatcher: SharedDispatcher,
    delayed: Option<BucketDelayedDeliveryTracker>,
    pending_ack: Option<PendingAckHandle>,
    pending_ack_cursor: Option<Arc<ManagedCursor>>,
    /// Key_Shared: entries routed to a consumer without permits, in order.
    blocked: BTreeMap<ConsumerIdx, VecDeque<SimEntry>>,
    /// Positions to redeliver that the dispatcher's own replay set does not
    /// hold (read failed during an outage, corrupted on the client).
    redeliver: BTreeSet<Position>,
    /// Consumer slot → broker consumer key.
    consumer_keys: BTreeMap<ConsumerIdx, ConsumerKey>,
    /// Acks applied in memory, not yet persisted: acknowledged (for the
    /// checker) once the mark-delete + ranges reach the store.
    unpersisted: Vec<MessageRef>,
    /// Messages of partially acknowledged batch entries (batch-index acks
    /// applied to the deletion state): acknowledged for the checker only
    /// once their entry is deleted whole and persisted (the persisted form
    /// here is the mark-delete and ranges; a restart forgets the partial
    /// state and redelivers the whole entry).
    partial_acked: BTreeMap<Position, Vec<MessageRef>>,
    /// Highest cumulative ack applied in memory, not yet persisted.
    unpersisted_cumulative: Option<Position>,
    /// Committed transactional acks a replay handed back
    /// ([`PendingAckHandle::committed_acks`]) were applied in memory: the
    /// next persist writes them even with no other ack pending.
    recovered_commits: bool,
    /// Failover: consumer slots in subscribe order; the first is active.
    failover_order: Vec<ConsumerIdx>,
    /// The transaction holding the pending cumulative ack, if any (Pulsar
    /// allows one at a time per subscription).
    open_cumulative_txn: Option<TxnId>,
    /// Entries acknowledged individually in a transaction not yet committed:
    /// the consumer no longer holds them (Pulsar's `Consumer` drops a
    /// transactional ack's position from its pending acks) but the
    /// pending-ack handle does, so a due delayed message the tracker and a
    /// cursor re-read both bring back is not dispatched a second time to
    /// another consumer while the first one's transaction still holds it.
    txn_acked: BTreeSet<Position>,
    /// The id of the cursor read in flight, if any (one at a time, as
    /// Pulsar's `havePendingRead`); a seek or rewind cancels it (its
    /// entries are dropped on completion and the cursor reads again).
    pending_read: Option<u64>,
    dispatch_scheduled: bool,
    ready: bool,
}

impl SubRt {
    /// The client index (the checker's stable consumer id) of the broker
    /// consumer `key`, if it is still connected.
    fn client_of(&self, key: ConsumerKey) -> Option<ConsumerIdx> {
        self.consumer_keys
            .iter()
            .find(|(_, k)| **k == key)
            .map(|(c, _)| *c)
    }
}

struct Broker {
    generation: u64,
    ledger: Arc<ManagedLedger>,
    subs: Vec<SubRt>,
    pool: Arc<ReplayExecutorPool>,
    timer: Arc<VirtualTimer>,
}

/// One entry the application is processing (the messages of one delivery).
#[derive(Debug, Default)]
struct InProgress {
    /// Messages of this delivery not yet processed.
    remaining: u32,
    /// Messages processed, for the entry's ack.
    refs: Vec<MessageRef>,
    /// Settled message by message (`Workload::negative_ack_ratio`): each
    /// acknowledged on its own or negatively acknowledged.
    split: bool,
    /// Split: the messages negatively acknowledged so far.
    nacked: Vec<MessageRef>,
}

/// Client side of one consumer (survives broker restarts; reconnects).
struct ClientRt {
    connection: crate::sync::Arc<ClientConnection>,
    consumer: ClientConsumer,
    /// Entries being processed by the application.
    in_progress: BTreeMap<Position, InProgress>,
    /// Messages the last command for an entry handed to the application
    /// (fewer than its batch size for a partial batch), until its first
    /// message is processed.
    delivery_messages: BTreeMap<Position, u32>,
    last_delivery_ms: VirtualMs,
    /// Since when this consumer has had backlog and free receiver queue
    /// without a delivery (the stall clock), if it has.
    stall_since: Option<VirtualMs>,
    poll_scheduled: bool,
    /// Entry → seeks completed on the subscription when the broker
    /// dispatched it (kept only once a seek happened; absent = 0).
    dispatch_seeks: BTreeMap<Position, u32>,
    /// Cumulative acks: messages received since the last one.
    since_cumulative: u32,
    /// Cumulative acks: the last entry received completely.
    cumulative_upto: Option<Position>,
    ack_flush_scheduled: bool,
    /// Same-connection re-creations waiting for a poll that queues a Flow
    /// (or their deadline).
    recreate_pending: u32,
    /// Connections of this consumer closed on an injected invalid P since
    /// its application last received a message (the faulty broker's
    /// fairness bound, `faults.faulty_closes_without_progress`).
    faulty_closes_in_a_row: u32,
}

struct Sim<'a> {
    w: &'a Workload,
    opts: &'a SimOptions,
    rng: ChaCha8Rng,
    sched: Scheduler<Ev>,
    checker: DeliveryChecker,
    activity: Activity,
    broker: Option<Broker>,
    clients: Vec<Vec<ClientRt>>,
    next_connection_id: u64,
    outage: Arc<AtomicBool>,
    clock: Arc<VirtualClock>,
    /// How far the broker's clock (the delayed tracker's) runs ahead of
    /// virtual time (the producers' clock): the sum of the clock jumps.
    broker_clock_offset_ms: u64,
    snapshot_faults: Vec<Arc<FaultyStorage<RedbSnapshotStorage>>>,
    published: u64,
    producer_seq: Vec<u64>,
    next_txn: u64,
    sabotage_done: bool,
    /// [`Sabotage::DeliverOneTrimmedMessage`] armed: (subscription, the
    /// seek's mark-delete).
    sabotage_seek: Option<(SubIdx, Position)>,
    /// Per subscription: seeks completed (stamped on every dispatch).
    seeks_done: Vec<u32>,
    /// A delayed tracker broke a structural invariant (reported): the run
    /// stops after the event that found it, as any further call into that
    /// tracker would only build on its corrupt state.
    tracker_corrupt: bool,
    /// Id of the next cursor read with latency.
    next_read_id: u64,
    /// Fault events (restart, reconnect, outage end) still to come: a run
    /// does not end before its faults happened.
    faults_pending: u32,
    /// Virtual time at which the workload finished (everything published,
    /// planned faults run, every message acknowledged) or the time limit
    /// stopped it; the drain that follows does not count.
    finished_at: VirtualMs,
    acked_at_last_check: Vec<u64>,
    progress: Option<&'a dyn Fn(u64, u64)>,
    heartbeat: Arc<Heartbeat>,
    started: std::time::Instant,
    /// Per subscription: what its delayed tracker should hold.
    delayed_truth: Vec<DelayedTruth>,
    /// Per subscription: pending-ack records known durable.
    pa_truth: Vec<SharedPaTruth>,
    /// Per subscription: what the replay in progress must find, and the
    /// pending-ack log's ledgers lost before it (the transactions with a
    /// record there may differ).
    pa_expected: Vec<Option<(PaTruth, BTreeSet<i64>)>>,
    /// Per subscription: since when its pending-ack handle is not ready.
    pa_not_ready_since: Vec<Option<VirtualMs>>,
    /// Per subscription: its handle's Error state was handled this lifetime.
    pa_error_seen: Vec<bool>,
    /// Per subscription: its replay was ended by a completing failure this
    /// lifetime; it serves nothing until the topic reload.
    pa_awaiting_reload: Vec<bool>,
    /// A topic reload is scheduled.
    topic_reload_planned: bool,
    /// Per subscription: injected replay read failures.
    replay_plans: Vec<Arc<std::sync::Mutex<ReplayReadPlan>>>,
    /// Per subscription: the pending-ack log's ledgers lost since its last
    /// completed replay.
    pa_ledger_lost: Vec<BTreeSet<i64>>,
    /// Per subscription, entries whose transactional ack was committed (its
    /// COMMIT record durable in the pending-ack log) and not yet persisted
    /// with the subscription cursor, with the committing transaction and
    /// the entry's messages: a replay after a restart must re-apply such a
    /// commit (the checker rule "a committed ack is never redelivered after
    /// a restart"), and its messages count as acknowledged once the
    /// subscription persists it.
    committed_refs: Vec<BTreeMap<Position, (TxnId, Vec<MessageRef>)>>,
    /// Transactional individual acks the broker applied (paces the probe
    /// acks of deleted entries).
    txn_acks_seen: u64,
    /// The operator turned auto-skip on.
    operator_auto_skip: bool,
    operator_reload_planned: bool,
    /// Per subscription: a replay-bound violation was reported.
    replay_bound_reported: Vec<bool>,
    /// Brokers opened so far (the next one's generation).
    brokers_opened: u64,
    /// The store's image in memory, with crash points (`None`: the store
    /// file in the data dir; see `crashes`).
    crash: Option<CrashStorage>,
    /// Crash points still to take.
    crash_plan: CrashPlan,
    /// A publish whose append the store's death failed (this event).
    unreceipted_publish: Option<UnreceiptedPublish>,
    /// The seek or clear-backlog in progress (this event): subscription
    /// and the mark-delete it resets to.
    reset_in_flight: Option<(SubIdx, Position)>,
}

/// Runs `workload` with `opts` and returns the report.
///
/// `progress(done, total)` is called now and then with acknowledged and
/// expected acknowledgements (for a progress bar).
///
/// # Errors
/// [`SimError`] if the data dir is unusable or a component fails in a way
/// the run cannot continue from (violations are reported, not errors).
///
/// ```
/// use pulsar_core::ledger::SyncMode;
/// use pulsar_core::sim::{run, SimOptions, Workload};
///
/// let dir = tempfile::tempdir()?;
/// let mut workload = Workload::resolve("permit-churn")?;
/// workload.messages = 200;
/// let opts = SimOptions {
///     sync: SyncMode::Deferred,
///     ..SimOptions::new(7, dir.path().join("data"))
/// };
/// let report = run(&workload, &opts, None)?;
/// assert!(report.is_clean(), "{report}");
/// assert_eq!(report.counts.published, 200);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn run(
    workload: &Workload,
    opts: &SimOptions,
    progress: Option<&dyn Fn(u64, u64)>,
) -> Result<Report, SimError> {
    workload
        .validate()
        .map_err(|e| SimError::Component(e.to_string()))?;
    std::fs::create_dir_all(&opts.data_dir).map_err(|e| SimError::DataDir {
        path: opts.data_dir.display().to_string(),
        reason: e.to_string(),
    })?;
    let started = std::time::Instant::now();
    let subs: Vec<String> = (0..workload.subscriptions)
        .map(|i| format!("sub-{i}"))
        .collect();
    let tolerance = workload.delayed_tick_ms;
    let mut sim = Sim {
        w: workload,
        opts,
        rng: ChaCha8Rng::seed_from_u64(opts.seed),
        sched: Scheduler::new(),
        checker: DeliveryChecker::new(
            subs,
            tolerance,
            match workload.subscription_type {
                SubscriptionType::KeyShared => OrderCheck::PerKey,
                SubscriptionType::Failover => OrderCheck::Total,
                SubscriptionType::Shared => OrderCheck::None,
            },
        ),
        activity: Activity::default(),
        broker: None,
        clients: Vec::new(),
        next_connection_id: 1,
        outage: Arc::new(AtomicBool::new(false)),
        clock: Arc::new(VirtualClock::new(0)),
        broker_clock_offset_ms: 0,
        snapshot_faults: Vec::new(),
        published: 0,
        producer_seq: vec![0; workload.producers as usize],
        next_txn: 1,
        sabotage_done: false,
        sabotage_seek: None,
        seeks_done: vec![0; workload.subscriptions as usize],
        tracker_corrupt: false,
        next_read_id: 0,
        faults_pending: 0,
        finished_at: 0,
        acked_at_last_check: vec![0; workload.subscriptions as usize],
        progress,
        heartbeat: Arc::new(Heartbeat::default()),
        started,
        delayed_truth: (0..workload.subscriptions)
            .map(|_| DelayedTruth::default())
            .collect(),
        pa_truth: (0..workload.subscriptions)
            .map(|_| SharedPaTruth::default())
            .collect(),
        pa_expected: vec![None; workload.subscriptions as usize],
        pa_not_ready_since: vec![None; workload.subscriptions as usize],
        pa_error_seen: vec![false; workload.subscriptions as usize],
        pa_awaiting_reload: vec![false; workload.subscriptions as usize],
        topic_reload_planned: false,
        replay_plans: (0..workload.subscriptions)
            .map(|_| Arc::default())
            .collect(),
        pa_ledger_lost: vec![BTreeSet::new(); workload.subscriptions as usize],
        committed_refs: vec![BTreeMap::new(); workload.subscriptions as usize],
        txn_acks_seen: 0,
        operator_auto_skip: false,
        operator_reload_planned: false,
        replay_bound_reported: vec![false; workload.subscriptions as usize],
        brokers_opened: 0,
        crash: Sim::crash_storage_for(workload, opts)?,
        crash_plan: CrashPlan::default(),
        unreceipted_publish: None,
        reset_in_flight: None,
    };
    sim.checker.set_late_bound(workload.delayed_late_bound());
    let _hang_guard = HangGuard::start(
        Arc::clone(&sim.heartbeat),
        opts.watchdog.exit_on_hang,
        format!(
            "pulsar-core simulate: workload {}, seed {}",
            workload.name, opts.seed
        ),
    );
    #[cfg(feature = "trace")]
    if opts.trace_dir.is_some() {
        crate::trace::start();
    }
    #[cfg(not(feature = "trace"))]
    if opts.trace_dir.is_some() {
        return Err(SimError::Component(
            "trace recording needs the cargo feature `trace`".into(),
        ));
    }
    let looped = sim.start().and_then(|()| sim.event_loop());
    // The lines of the event loop only: the race stages below run real
    // threads on components of their own.
    #[cfg(feature = "trace")]
    if let Some(dir) = &opts.trace_dir {
        let lines = crate::trace::finish();
        super::sim_trace::write(dir, workload, TOPIC, &lines).map_err(|e| SimError::DataDir {
            path: dir.display().to_string(),
            reason: e.to_string(),
        })?;
    }
    looped?;
    let virtual_ms = sim.sched.now();
    let finished_at = sim.finished_at;
    let unpublished = workload.messages.saturating_sub(sim.published);
    let faults_not_run = u64::from(sim.faults_pending);
    sim.checker
        .unfinished(unpublished, faults_not_run, virtual_ms);
    let (counts, first_violation) = sim.checker.finish(virtual_ms);
    // A run the hang watchdog cancelled ends with its livelock: the extra
    // stages are not run.
    let stages = super::stages::run(workload, opts.faults, &sim.heartbeat);
    let stage_violations = stages.violations();
    let first_violation = first_violation.or_else(|| stages.first_violation());
    // A hang the watchdog cancelled is a violation even if the run then
    // ended by itself (e.g. the interrupt unstuck a stage after the loop).
    let late_hang = (counts.livelocks == 0)
        .then(|| sim.heartbeat.hang_report())
        .flatten();
    let late_hang_violations = u64::from(late_hang.is_some());
    let first_violation = first_violation.or(late_hang);
    let wall_ms = started.elapsed().as_millis() as u64;
    let components = super::report::components(&sim.activity);
    let deliveries_per_sec = if wall_ms == 0 {
        counts.delivered as f64
    } else {
        counts.delivered as f64 * 1000.0 / wall_ms as f64
    };
    Ok(Report {
        workload: workload.name.clone(),
        seed: opts.seed,
        data_dir: opts.data_dir.display().to_string(),
        sync: match opts.sync {
            SyncMode::Immediate => "always",
            SyncMode::Deferred => "deferred",
        }
        .to_string(),
        virtual_ms: finished_at,
        violations: counts.violations() + stage_violations + late_hang_violations,
        counts,
        activity: sim.activity,
        components,
        first_violation,
        timing: Timing {
            wall_ms,
            deliveries_per_sec,
            peak_memory_kib: peak_memory_kib(),
            #[cfg(feature = "race-hooks")]
            hint_race: stages.hint_race,
            #[cfg(feature = "race-hooks")]
            replay_race: stages.replay_race,
            stages_not_built: stages.not_built,
        },
    })
}

impl Sim<'_> {
    fn store_path(&self) -> PathBuf {
        self.opts.data_dir.join("pulsar-core.redb")
    }

    fn start(&mut self) -> Result<(), SimError> {
        self.plan_crashes();
        self.open_broker_surviving_crashes()?;
        // Clients subscribe.
        for s in SubIdx::all(self.w.subscriptions) {
            let mut row = Vec::new();
            for c in ConsumerIdx::all(self.w.consumers_per_subscription) {
                let connection =
                    crate::sync::Arc::new(ClientConnection::new(self.next_connection_id));
                self.next_connection_id += 1;
                let consumer = ClientConsumer::subscribe(
                    crate::sync::Arc::clone(&connection),
                    c.0 as u64,
                    self.w.receiver_queue_size,
                )
                .map_err(comp("subscribe"))?;
                row.push(ClientRt {
                    connection,
                    consumer,
                    in_progress: BTreeMap::new(),
                    delivery_messages: BTreeMap::new(),
                    last_delivery_ms: 0,
                    stall_since: None,
                    poll_scheduled: false,
                    dispatch_seeks: BTreeMap::new(),
                    since_cumulative: 0,
                    cumulative_upto: None,
                    ack_flush_scheduled: false,
                    recreate_pending: 0,
                    faulty_closes_in_a_row: 0,
                });
            }
            self.clients.push(row);
            for c in ConsumerIdx::all(self.w.consumers_per_subscription) {
                self.connect_consumer(s, c)?;
            }
        }
        self.sched.after(0, Ev::Publish);
        for s in SubIdx::all(self.w.subscriptions) {
            self.sched.after(PERSIST_INTERVAL_MS, Ev::Persist(s));
            if self.w.delayed_ratio > 0.0 {
                self.sched.after(self.w.delayed_tick_ms, Ev::DelayedTick(s));
            }
        }
        self.sched
            .after(self.stall_check_interval(), Ev::StallCheck);
        if self.opts.faults {
            self.plan_faults();
            self.plan_client_faults();
        }
        Ok(())
    }

    fn event_loop(&mut self) -> Result<(), SimError> {
        let expected = self.w.messages * u64::from(self.w.subscriptions);
        let mut steps: u64 = 0;
        let mut watch = LoopWatch::new(self.opts.watchdog, 0);
        // (messages received or acknowledged, events since that count last
        // changed, virtual time and reconnects when it did)
        let mut progress = (self.checker.progress(), 0u64, 0, self.activity.reconnects);
        while let Some((now, ev)) = self.sched.pop() {
            if !self.step(now, ev, &mut watch)? {
                break;
            }
            steps += 1;
            let made = self.checker.progress();
            if made != progress.0 {
                progress = (made, 0, now, self.activity.reconnects);
            } else {
                progress.1 += 1;
                if progress.1 > self.opts.watchdog.no_progress_events {
                    if self.checker.all_acked() {
                        progress = (made, 0, now, self.activity.reconnects);
                    } else {
                        let (component, recent) = self.heartbeat.describe();
                        let acked = self.checker_acked();
                        self.checker.livelock(
                            &format!(
                                "livelock at t={now}ms in {component}: no message received or acknowledged for {} events ({} virtual ms since the last at t={}ms, {} reconnects since, {acked} of {expected} acknowledged); last events: {recent}",
                                progress.1,
                                now - progress.2,
                                progress.2,
                                self.activity.reconnects - progress.3,
                            ),
                            now,
                        );
                        break;
                    }
                }
            }
            if steps.is_multiple_of(1024) {
                if let Some(report) = watch.wall_limit(self.started, now, &self.heartbeat) {
                    self.checker.livelock(&report, now);
                    break;
                }
            }
            if steps.is_multiple_of(4096) {
                if let Some(p) = self.progress {
                    p(self.checker_acked(), expected);
                }
            }
            if self.published >= self.w.messages
                && self.faults_pending == 0
                && self.checker.all_acked()
            {
                break;
            }
            if now > VIRTUAL_TIME_LIMIT_MS {
                break;
            }
        }
        self.finished_at = self.sched.now();
        // Crash points fall in the main loop only (not in the drain and the
        // clean shutdown that follow).
        self.finish_crashes();
        if self.heartbeat.hang_report().is_some() {
            return Ok(()); // the run was cancelled by the hang watchdog
        }
        if self.tracker_corrupt {
            // Stopped at a tracker's broken invariant (reported): no drain,
            // which would call into that tracker again.
            if let Some(b) = self.broker.take() {
                self.collect_tracker_stats(&b);
                self.broker = Some(b);
            }
            return Ok(());
        }
        self.drain_and_check_permits()?;
        // Persist what was acknowledged (a clean shutdown).
        for s in SubIdx::all(self.w.subscriptions) {
            self.persist(s)?;
        }
        if let Some(b) = self.broker.take() {
            self.collect_tracker_stats(&b);
            self.broker = Some(b);
        }
        if let Some(p) = self.progress {
            p(self.checker_acked(), expected);
        }
        Ok(())
    }

    /// Lets in-flight deliveries, acks and Flows settle (no new publishes or
    /// faults), flushes every client's residual credit, then checks that each
    /// current broker consumer holds exactly its receiver queue of permits.
    fn drain_and_check_permits(&mut self) -> Result<(), SimError> {
        if !self.checker.all_acked() {
            return Ok(()); // lost messages are already the reported violation
        }
        let deadline = self.sched.now() + 10_000;
        let mut watch = LoopWatch::new(self.opts.watchdog, self.sched.now());
        while let Some((now, ev)) = self.sched.pop() {
            if now > deadline {
                break;
            }
            match ev {
                Ev::Publish
                | Ev::ArmCrash
                | Ev::Restart
                | Ev::Recreate { .. }
                | Ev::OutageStart
                | Ev::Seek { .. }
                | Ev::Rewind { .. }
                | Ev::ClearBacklog { .. }
                | Ev::ClockJump
                | Ev::DuplicateSubscribe { .. }
                | Ev::StallCheck
                | Ev::DelayedTick(_)
                | Ev::Persist(_) => {}
                // The same step as the main loop: the broker's timers
                // advance with virtual time (a pending-ack retry due now
                // fires), and the watchdogs see every event.
                other => {
                    if !self.step(now, other, &mut watch)? {
                        return Ok(());
                    }
                }
            }
        }
        for s in SubIdx::all(self.w.subscriptions) {
            for c in ConsumerIdx::all(self.w.consumers_per_subscription) {
                let id = self.clients[s][c].consumer.consumer_id();
                self.clients[s][c]
                    .connection
                    .flush_residual(id)
                    .map_err(comp("flush residual"))?;
                self.flush_flows(s, c)?;
                let permits = self.broker.as_ref().and_then(|b| {
                    let key = b.subs[s].consumer_keys.get(&c)?;
                    b.subs[s]
                        .dispatcher
                        .consumer(*key)
                        .map(|x| x.available_permits())
                });
                if let Some(permits) = permits {
                    let now = self.sched.now();
                    self.checker.permit_balance(
                        &format!("sub-{s}"),
                        c.0,
                        permits,
                        i64::from(self.w.receiver_queue_size),
                        now,
                    );
                }
            }
        }
        Ok(())
    }

    /// Handles one event at virtual time `now`: sets the clocks, fires the
    /// broker's timers due by then, runs the event under the heartbeat, and
    /// applies the in-loop watchdogs (`watch`). Returns `false` when a
    /// watchdog stopped the run (the livelock is reported).
    fn step(&mut self, now: VirtualMs, ev: Ev, watch: &mut LoopWatch) -> Result<bool, SimError> {
        self.clock.set(now + self.broker_clock_offset_ms);
        if let Some(b) = &self.broker {
            b.timer.advance_to(now);
        }
        let (component, label, sub) = ev.label();
        self.heartbeat.begin(now, component, label, sub);
        let handled = self.handle(ev);
        if self.store_dead() {
            // The store died at a crash point in this event: what the event
            // did after it (an error included) is the dead process's.
            self.crash_if_dead()?;
        } else {
            handled?;
        }
        self.reset_in_flight = None;
        self.heartbeat.end();
        if self.tracker_corrupt {
            return Ok(false); // the violation is reported
        }
        if let Some(report) = self.heartbeat.hang_report() {
            // The hang watchdog cancelled the run (a component spun inside
            // one event, or no event finished for its bound).
            self.checker.livelock(&report, now);
            return Ok(false);
        }
        if let Some(report) = watch.same_time(now, &self.heartbeat) {
            self.checker.livelock(&report, now);
            return Ok(false);
        }
        Ok(true)
    }

    fn checker_acked(&self) -> u64 {
        // The checker owns the count; the report carries it. This is only
        // for the progress bar and the no-progress watchdog.
        self.acked_at_last_check.iter().sum()
    }

    fn handle(&mut self, ev: Ev) -> Result<(), SimError> {
        match ev {
            Ev::Publish => self.publish(),
            Ev::Dispatch(s) => self.dispatch(s),
            Ev::ReadComplete {
                sub,
                broker_generation,
                read,
                entries,
            } => self.complete_read(sub, broker_generation, read, entries),
            Ev::Deliver {
                sub,
                consumer,
                connection_id,
                incarnation,
                command,
                payload,
                seeks_before_dispatch,
            } => {
                let client = &self.clients[sub][consumer];
                let connection = &client.connection;
                if connection.id() != connection_id
                    || connection.is_closed()
                    || client.consumer.state().incarnation() != incarnation
                {
                    return Ok(()); // that connection is gone: the bytes never arrive
                }
                self.deliver(sub, consumer, &command, &payload, seeks_before_dispatch)
            }
            Ev::AppPoll { sub, consumer } => self.app_poll(sub, consumer),
            Ev::Ack {
                sub,
                incarnation,
                broker_generation,
                key,
                position,
                messages,
                txn,
                cumulative,
                ack_set,
            } => {
                let current = self
                    .broker
                    .as_ref()
                    .and_then(|b| b.subs[sub].client_of(key))
                    .map(|c| self.clients[sub][c].consumer.state().incarnation());
                if current.is_some_and(|i| i != incarnation) {
                    // From an incarnation closed since (same connection):
                    // its messages were handed back for redelivery.
                    return Ok(());
                }
                if cumulative {
                    self.cumulative_ack(sub, broker_generation, key, position, txn)
                } else if !ack_set.is_empty() {
                    self.batch_index_ack(sub, broker_generation, key, position, messages, ack_set)
                } else {
                    self.ack(sub, broker_generation, key, position, messages, txn)
                }
            }
            Ev::Nack {
                sub,
                incarnation,
                broker_generation,
                key,
                position,
                messages,
            } => {
                let current = self
                    .broker
                    .as_ref()
                    .and_then(|b| b.subs[sub].client_of(key))
                    .map(|c| self.clients[sub][c].consumer.state().incarnation());
                if current.is_some_and(|i| i != incarnation) {
                    return Ok(()); // from an incarnation closed since
                }
                self.nack(sub, broker_generation, key, position, messages)
            }
            Ev::Commit {
                sub,
                broker_generation,
                txn,
                positions,
                cumulative,
            } => self.commit(sub, broker_generation, txn, positions, cumulative),
            Ev::AckFlush { sub, consumer } => {
                self.clients[sub][consumer].ack_flush_scheduled = false;
                self.send_cumulative_ack(sub, consumer);
                Ok(())
            }
            Ev::Seek { sub } => self.seek(sub),
            Ev::Rewind { sub } => self.rewind(sub),
            Ev::ClearBacklog { sub } => self.clear_backlog(sub),
            Ev::ClockJump => {
                self.faults_pending = self.faults_pending.saturating_sub(1);
                self.clock_jump();
                Ok(())
            }
            Ev::FlushFlows { sub, consumer } => self.flush_flows(sub, consumer),
            Ev::DuplicateSubscribe { sub, consumer } => {
                self.faults_pending = self.faults_pending.saturating_sub(1);
                self.duplicate_subscribe(sub, consumer)
            }
            Ev::Persist(s) => {
                // The timer first: a crash in the persist does not stop it.
                self.sched.after(PERSIST_INTERVAL_MS, Ev::Persist(s));
                self.persist(s)
            }
            Ev::DelayedTick(s) => {
                self.check_overdue(s);
                self.schedule_dispatch(s);
                self.sched.after(self.w.delayed_tick_ms, Ev::DelayedTick(s));
                Ok(())
            }
            Ev::ReplayTimers => self.drive_replays(),
            Ev::Restart => {
                self.faults_pending = self.faults_pending.saturating_sub(1);
                self.restart()
            }
            Ev::ArmCrash => {
                self.arm_mid_run_crash();
                Ok(())
            }
            Ev::Reconnect { sub, consumer } => {
                self.faults_pending = self.faults_pending.saturating_sub(1);
                self.reconnect(sub, consumer)
            }
            Ev::OutageStart => {
                self.outage.store(true, Ordering::Relaxed);
                self.activity.read_failures_injected += 1;
                Ok(())
            }
            Ev::OutageEnd => {
                self.faults_pending = self.faults_pending.saturating_sub(1);
                self.outage.store(false, Ordering::Relaxed);
                // The injected outage is not a stall: the stall clocks restart.
                for row in &mut self.clients {
                    for c in row {
                        c.stall_since = None;
                    }
                }
                for s in SubIdx::all(self.w.subscriptions) {
                    if let Some(since) = self.pa_not_ready_since[s].as_mut() {
                        *since = self.sched.now();
                    }
                    self.schedule_dispatch(s);
                }
                Ok(())
            }
            Ev::Recreate {
                sub,
                consumer,
                deadline: false,
            } => {
                if self.clients[sub][consumer].connection.is_closed() {
                    return self.recreate_on_same_connection(sub, consumer);
                }
                // Right after a poll of the application that queued a Flow
                // (so the Flow is queued across the re-creation), at the
                // latest at the deadline.
                self.clients[sub][consumer].recreate_pending += 1;
                self.sched.after(
                    RECREATE_DEADLINE_MS,
                    Ev::Recreate {
                        sub,
                        consumer,
                        deadline: true,
                    },
                );
                Ok(())
            }
            Ev::Recreate {
                sub,
                consumer,
                deadline: true,
            } => {
                let client = &mut self.clients[sub][consumer];
                if client.recreate_pending == 0 {
                    return Ok(()); // a poll did it
                }
                client.recreate_pending -= 1;
                self.recreate_on_same_connection(sub, consumer)
            }
            Ev::OperatorReload => {
                self.faults_pending = self.faults_pending.saturating_sub(1);
                self.operator_reload()
            }
            Ev::TopicReload => {
                self.faults_pending = self.faults_pending.saturating_sub(1);
                self.activity.topic_reloads += 1;
                self.reload_topic()
            }
            Ev::StallCheck => {
                self.check_replay_bound();
                self.stall_check();
                self.sched
                    .after(self.stall_check_interval(), Ev::StallCheck);
                Ok(())
            }
        }
    }
}
