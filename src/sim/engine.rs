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
//!   tracker and pending-ack state (replay included) from the store.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use prost::Message as _;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::checker::{DeliveryChecker, MessageRef, OrderCheck};
use super::delayed_truth::DelayedTruth;
use super::report::{peak_memory_kib, Activity, Report, Timing};
use super::scheduler::{Scheduler, VirtualMs};
use super::watchdog::{HangGuard, Heartbeat, Watchdog};
use super::workload::{SubscriptionType, Workload};
use crate::cursor::{CursorDeletionState, DeletionError};
use crate::delayed::{
    BucketDelayedDeliveryTracker, BucketSnapshotStorage, BucketTrackerConfig, FaultPlan,
    FaultyStorage, RecoveryPolicy, RedbSnapshotStorage, VirtualClock as ManualClock,
};

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
}
use crate::ledger::{
    LedgerConfig, LedgerError, LedgerStore, ManagedCursor, ManagedLedger, ReadFailureKind,
    RedbStore, SyncMode,
};
use crate::pending_ack::{
    AckType, AckedPosition, ExecutorMode, HandleConfig, HandleState, InlineReads, PendingAckHandle,
    PendingAckRecord, ReplayExecutorPool, TxnId, VirtualTimer,
};
use crate::permits::broker::BrokerEntry;
use crate::permits::client::{encode_entry_payload, ClientConnection, ClientConsumer, ClientFrame};
use crate::permits::wire::{CommandMessage, MessageMetadata, SingleMessageMetadata};
use crate::permits::{ConsumerKey, SharedDispatcher};
use crate::position::Position;

const TOPIC: &str = "persistent://public/default/sim";
const PENDING_ACK_CURSOR: &str = "__pending_ack_state";
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
    /// After the first Failover active-consumer change, the first non-empty
    /// set of messages the dispatcher hands back from a removed consumer
    /// (the old active consumer's unacknowledged, delivered messages) is
    /// dropped instead of redelivered to the new active one.
    DropFailoverHandover,
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
    /// `Immediate` would survive a real crash or power loss.
    pub sync: SyncMode,
    /// Livelock and wall-clock watchdogs.
    pub watchdog: Watchdog,
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

#[derive(Debug)]
enum Ev {
    Publish,
    Dispatch(usize),
    Deliver {
        sub: usize,
        consumer: usize,
        /// The connection the broker wrote the command to.
        connection_id: u64,
        /// The client incarnation registered when the broker wrote it (a
        /// consumer re-created on the same connection drops frames of its
        /// closed predecessor: the connection is ordered).
        incarnation: crate::permits::client::Incarnation,
        command: CommandMessage,
        payload: Arc<Vec<u8>>,
        /// Seeks completed on the subscription when the broker dispatched it.
        seeks_before_dispatch: u32,
    },
    AppPoll {
        sub: usize,
        consumer: usize,
    },
    Ack {
        sub: usize,
        /// The client incarnation that sent it (a consumer re-created on
        /// the same connection keeps its key).
        incarnation: crate::permits::client::Incarnation,
        broker_generation: u64,
        key: ConsumerKey,
        position: Position,
        messages: Vec<MessageRef>,
        txn: Option<TxnId>,
        /// A cumulative ack up to `position` (Failover).
        cumulative: bool,
    },
    Commit {
        sub: usize,
        broker_generation: u64,
        txn: TxnId,
        positions: Vec<(Position, Vec<MessageRef>)>,
        /// The transaction's ack is cumulative (up to its one position).
        cumulative: bool,
    },
    /// A Failover consumer sends its pending cumulative ack (ack grouping).
    AckFlush {
        sub: usize,
        consumer: usize,
    },
    FlushFlows {
        sub: usize,
        consumer: usize,
    },
    Persist(usize),
    DelayedTick(usize),
    ReplayTimers,
    Restart,
    Reconnect {
        sub: usize,
        consumer: usize,
    },
    OutageStart,
    OutageEnd,
    StallCheck,
    /// Consumer `consumer` of `sub` is re-created on the same connection.
    Recreate {
        sub: usize,
        consumer: usize,
    },
    /// The operator turns the pending-ack logs' auto-skip on and reloads
    /// the topic (after a replay gave up on non-recoverable data).
    OperatorReload,
    /// Admin seek of subscription `sub` forward to its read position.
    Seek {
        sub: usize,
    },
}

impl Ev {
    /// The component an event runs in, its name and subscription (for the
    /// watchdogs' livelock report).
    fn label(&self) -> (&'static str, &'static str, Option<usize>) {
        match self {
            Ev::Publish => ("producer", "Publish", None),
            Ev::Dispatch(s) => (
                "dispatcher (cursor, permits, delayed)",
                "Dispatch",
                Some(*s),
            ),
            Ev::Deliver { sub, .. } => ("client (permits)", "Deliver", Some(*sub)),
            Ev::AppPoll { sub, .. } => ("client (permits)", "AppPoll", Some(*sub)),
            Ev::Ack { sub, .. } => ("broker ack path (cursor, pending_ack)", "Ack", Some(*sub)),
            Ev::Commit { sub, .. } => ("broker ack path (pending_ack)", "Commit", Some(*sub)),
            Ev::AckFlush { sub, .. } => ("client (acks)", "AckFlush", Some(*sub)),
            Ev::FlushFlows { sub, .. } => ("client (flows)", "FlushFlows", Some(*sub)),
            Ev::Persist(s) => ("cursor persistence", "Persist", Some(*s)),
            Ev::DelayedTick(s) => ("delayed", "DelayedTick", Some(*s)),
            Ev::ReplayTimers => ("pending_ack replay", "ReplayTimers", None),
            Ev::Restart => ("broker restart (recovery)", "Restart", None),
            Ev::Reconnect { sub, .. } => ("client reconnect", "Reconnect", Some(*sub)),
            Ev::OutageStart => ("storage", "OutageStart", None),
            Ev::OutageEnd => ("storage", "OutageEnd", None),
            Ev::StallCheck => ("checker", "StallCheck", None),
            Ev::OperatorReload => ("operator reload (pending_ack)", "OperatorReload", None),
            Ev::Recreate { sub, .. } => ("client re-creation (permits)", "Recreate", Some(*sub)),
            Ev::Seek { sub } => ("admin seek", "Seek", Some(*sub)),
        }
    }
}

/// Broker-side state of one subscription (dropped on restart).
struct SubRt {
    name: String,
    cursor: ManagedCursor,
    deletion: CursorDeletionState,
    dispatcher: SharedDispatcher,
    delayed: Option<BucketDelayedDeliveryTracker>,
    pending_ack: Option<PendingAckHandle>,
    pending_ack_cursor: Option<Arc<ManagedCursor>>,
    /// Key_Shared: entries routed to a consumer without permits, in order.
    blocked: BTreeMap<usize, VecDeque<SimEntry>>,
    /// Positions to redeliver that the dispatcher's own replay set does not
    /// hold (read failed during an outage, corrupted on the client).
    redeliver: BTreeSet<Position>,
    /// Consumer slot → broker consumer key.
    consumer_keys: BTreeMap<usize, ConsumerKey>,
    /// Acks applied in memory, not yet persisted: acknowledged (for the
    /// checker) once the mark-delete + ranges reach the store.
    unpersisted: Vec<MessageRef>,
    /// Highest cumulative ack applied in memory, not yet persisted.
    unpersisted_cumulative: Option<Position>,
    /// Failover: consumer slots in subscribe order; the first is active.
    failover_order: Vec<usize>,
    /// The transaction holding the pending cumulative ack, if any (Pulsar
    /// allows one at a time per subscription).
    open_cumulative_txn: Option<TxnId>,
    dispatch_scheduled: bool,
    ready: bool,
}

impl SubRt {
    /// The client index (the checker's stable consumer id) of the broker
    /// consumer `key`, if it is still connected.
    fn client_of(&self, key: ConsumerKey) -> Option<usize> {
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

/// Client side of one consumer (survives broker restarts; reconnects).
struct ClientRt {
    connection: crate::sync::Arc<ClientConnection>,
    consumer: ClientConsumer,
    /// Messages of the entry being processed: position → (remaining, refs).
    in_progress: BTreeMap<Position, (u32, Vec<MessageRef>)>,
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
    /// A same-connection re-creation waits for the next poll.
    recreate_pending: bool,
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
    clock: Arc<ManualClock>,
    snapshot_faults: Vec<Arc<FaultyStorage<RedbSnapshotStorage>>>,
    published: u64,
    producer_seq: Vec<u64>,
    next_txn: u64,
    sabotage_done: bool,
    /// [`Sabotage::DeliverOneTrimmedMessage`] armed: (subscription, the
    /// seek's mark-delete).
    sabotage_seek: Option<(usize, Position)>,
    /// Per subscription: seeks completed (stamped on every dispatch).
    seeks_done: Vec<u32>,
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
    /// Per subscription: what the replay in progress must find (and
    /// whether fewer is allowed: a ledger was lost).
    pa_expected: Vec<Option<(PaTruth, bool)>>,
    /// Per subscription: since when its pending-ack handle is not ready.
    pa_not_ready_since: Vec<Option<VirtualMs>>,
    /// Per subscription: its handle's Error state was handled this lifetime.
    pa_error_seen: Vec<bool>,
    /// Per subscription: injected replay read failures.
    replay_plans: Vec<Arc<std::sync::Mutex<ReplayReadPlan>>>,
    /// Per subscription: a pending-ack ledger was lost since its last replay.
    pa_ledger_lost: Vec<bool>,
    /// The operator turned auto-skip on.
    operator_auto_skip: bool,
    operator_reload_planned: bool,
    /// Per subscription: a replay-bound violation was reported.
    replay_bound_reported: Vec<bool>,
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
        clock: Arc::new(ManualClock::new(0)),
        snapshot_faults: Vec::new(),
        published: 0,
        producer_seq: vec![0; workload.producers as usize],
        next_txn: 1,
        sabotage_done: false,
        sabotage_seek: None,
        seeks_done: vec![0; workload.subscriptions as usize],
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
        replay_plans: (0..workload.subscriptions)
            .map(|_| Arc::default())
            .collect(),
        pa_ledger_lost: vec![false; workload.subscriptions as usize],
        operator_auto_skip: false,
        operator_reload_planned: false,
        replay_bound_reported: vec![false; workload.subscriptions as usize],
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
    sim.start()?;
    sim.event_loop()?;
    let virtual_ms = sim.sched.now();
    let finished_at = sim.finished_at;
    let unpublished = workload.messages.saturating_sub(sim.published);
    let faults_not_run = u64::from(sim.faults_pending);
    sim.checker
        .unfinished(unpublished, faults_not_run, virtual_ms);
    let (counts, first_violation) = sim.checker.finish(virtual_ms);
    let hint_race = (opts.faults && workload.faults.hint_race)
        .then(|| super::hint_race::run(&super::hint_race::HintRaceConfig::default()));
    let hint_race_violations = hint_race.as_ref().map_or(0, |h| h.violations());
    let first_violation =
        first_violation.or_else(|| hint_race.as_ref().and_then(|h| h.first_violation.clone()));
    let wall_ms = started.elapsed().as_millis() as u64;
    let deliveries_per_sec = if wall_ms == 0 {
        counts.delivered as f64
    } else {
        counts.delivered as f64 * 1000.0 / wall_ms as f64
    };
    Ok(Report {
        workload: workload.name.clone(),
        seed: opts.seed,
        data_dir: opts.data_dir.display().to_string(),
        sync: opts.sync.to_string(),
        virtual_ms: finished_at,
        violations: counts.violations() + hint_race_violations,
        counts,
        activity: sim.activity,
        first_violation,
        timing: Timing {
            wall_ms,
            deliveries_per_sec,
            peak_memory_kib: peak_memory_kib(),
            hint_race,
        },
    })
}

/// Read faults planned for one pending-ack log's replay: read number
/// `fail_at.0` (counted over every read of the log) fails with `fail_at.1`;
/// from read `persistent.0` on, every read fails with `persistent.1` until
/// the replay completes (a fence or a closed cursor does not go away by
/// retrying).
#[derive(Debug, Default)]
struct ReplayReadPlan {
    reads: u64,
    fail_at: Option<(u64, ReadFailureKind)>,
    persistent: Option<(u64, ReadFailureKind)>,
    injected: u64,
}

/// Every failure class Pulsar's replay classification distinguishes.
const REPLAY_FAILURE_KINDS: [ReadFailureKind; 6] = [
    ReadFailureKind::StorageUnavailable,
    ReadFailureKind::TooManyRequests,
    ReadFailureKind::NonRecoverableData,
    ReadFailureKind::LedgerNotExist,
    ReadFailureKind::Fenced,
    ReadFailureKind::CursorAlreadyClosed,
];

/// The pending-ack records of one subscription known durable (their append
/// callback succeeded): the transactions a replay must find open.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct PaTruth {
    individual: BTreeSet<TxnId>,
    cumulative: Option<TxnId>,
}

type SharedPaTruth = Arc<std::sync::Mutex<PaTruth>>;

/// An append callback that records `record` in `truth` once it is durable.
fn pa_durable(
    truth: &SharedPaTruth,
    record: &PendingAckRecord,
) -> crate::pending_ack::AppendCallback {
    use crate::pending_ack::PendingAckOp;
    let truth = Arc::clone(truth);
    let txn = record.txn_id;
    let (op, ack_type) = (record.op, record.ack_type);
    Box::new(move |r| {
        if r.is_err() {
            return;
        }
        let mut t = truth.lock().unwrap_or_else(|e| e.into_inner());
        match (op, ack_type) {
            (PendingAckOp::Ack, AckType::Individual) => {
                t.individual.insert(txn);
            }
            (PendingAckOp::Ack, AckType::Cumulative) => {
                t.cumulative = Some(txn);
            }
            (PendingAckOp::Commit | PendingAckOp::Abort, _) => {
                t.individual.remove(&txn);
                if t.cumulative == Some(txn) {
                    t.cumulative = None;
                }
            }
        }
    })
}

/// The P the broker put on `command` unless the faulty-broker mode
/// replaced it: an explicit P the broker computed is at least 1 and at most
/// the entry's message count; anything else was injected.
fn command_permits_sent(command: &CommandMessage, entry: &[u8]) -> Option<u32> {
    let batch = Sim::entry_info(entry).map_or(1, |(b, _, _)| b);
    match command.message_permits {
        Some(p) if p == 0 || p > batch => None,
        other => other,
    }
}

/// Whether a replay failure is (caused by) non-recoverable data.
fn is_non_recoverable(e: &crate::pending_ack::PendingAckError) -> bool {
    use crate::pending_ack::PendingAckError as E;
    match e {
        E::Ledger(l) => l.is_non_recoverable(),
        E::InitFailed { cause, .. } => is_non_recoverable(cause),
        _ => false,
    }
}

/// Makes every read of `ledger` fail as storage-unavailable while `outage`
/// is set (the simulated BookKeeper outage window), and injects the
/// replay plan's failures, if any.
fn install_read_faults(
    ledger: &ManagedLedger,
    outage: &Arc<AtomicBool>,
    plan: Option<Arc<std::sync::Mutex<ReplayReadPlan>>>,
) {
    let outage = Arc::clone(outage);
    ledger.faults().set_policy(move |_| {
        if outage.load(Ordering::Relaxed) {
            return Some(ReadFailureKind::StorageUnavailable);
        }
        let plan = plan.as_ref()?;
        let mut p = plan.lock().unwrap_or_else(|e| e.into_inner());
        p.reads += 1;
        let n = p.reads;
        if let Some((from, kind)) = p.persistent {
            if n >= from {
                p.injected += 1;
                return Some(kind);
            }
        }
        if let Some((at, kind)) = p.fail_at {
            if n == at {
                p.fail_at = None;
                p.injected += 1;
                return Some(kind);
            }
        }
        None
    });
}

/// Makes every read of `ledger` fail as storage-unavailable while `outage`
/// is set (the simulated BookKeeper outage window).
fn install_outage(ledger: &ManagedLedger, outage: &Arc<AtomicBool>) {
    let outage = Arc::clone(outage);
    ledger.faults().set_policy(move |_| {
        outage
            .load(Ordering::Relaxed)
            .then_some(ReadFailureKind::StorageUnavailable)
    });
}

fn hash_key(key: u32) -> u32 {
    // A fixed 32-bit mix (murmur3 finalizer) onto Key_Shared's 0..65536 ring.
    let mut h = key;
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^= h >> 16;
    h % 65_536
}

impl Sim<'_> {
    fn store_path(&self) -> PathBuf {
        self.opts.data_dir.join("pulsar-core.redb")
    }

    fn start(&mut self) -> Result<(), SimError> {
        self.open_broker()?;
        // Clients subscribe.
        for s in 0..self.w.subscriptions as usize {
            let mut row = Vec::new();
            for c in 0..self.w.consumers_per_subscription as usize {
                let connection =
                    crate::sync::Arc::new(ClientConnection::new(self.next_connection_id));
                self.next_connection_id += 1;
                let consumer = ClientConsumer::subscribe(
                    crate::sync::Arc::clone(&connection),
                    c as u64,
                    self.w.receiver_queue_size,
                )
                .map_err(comp("subscribe"))?;
                row.push(ClientRt {
                    connection,
                    consumer,
                    in_progress: BTreeMap::new(),
                    last_delivery_ms: 0,
                    stall_since: None,
                    poll_scheduled: false,
                    dispatch_seeks: BTreeMap::new(),
                    since_cumulative: 0,
                    cumulative_upto: None,
                    ack_flush_scheduled: false,
                    recreate_pending: false,
                });
            }
            self.clients.push(row);
            for c in 0..self.w.consumers_per_subscription as usize {
                self.connect_consumer(s, c)?;
            }
        }
        self.sched.after(0, Ev::Publish);
        for s in 0..self.w.subscriptions as usize {
            self.sched.after(PERSIST_INTERVAL_MS, Ev::Persist(s));
            if self.w.delayed_ratio > 0.0 {
                self.sched.after(self.w.delayed_tick_ms, Ev::DelayedTick(s));
            }
        }
        self.sched
            .after(self.stall_check_interval(), Ev::StallCheck);
        if self.opts.faults {
            self.plan_faults();
        }
        Ok(())
    }

    /// Spreads the workload's faults over the expected publish window.
    fn plan_faults(&mut self) {
        let f = self.w.faults.clone();
        let batches = self.w.messages.div_ceil(u64::from(self.w.batch_size));
        let ticks = batches.div_ceil(u64::from(self.w.producers)).max(1);
        let window = ticks.saturating_mul(self.w.publish_interval_ms).max(1_000);
        let restart_at =
            |i: u32| (u128::from(window) * u128::from(i + 1) / u128::from(f.restarts + 1)) as u64;
        self.faults_pending =
            f.restarts + f.read_outages + f.reconnects + f.seeks + f.same_connection_reconnects;
        for _ in 0..f.same_connection_reconnects {
            let at = self.rng.random_range(0..window);
            let sub = self.rng.random_range(0..self.w.subscriptions as usize);
            let consumer = self
                .rng
                .random_range(0..self.w.consumers_per_subscription as usize);
            self.sched.at(at, Ev::Recreate { sub, consumer });
        }
        for i in 0..f.restarts {
            self.sched.at(restart_at(i), Ev::Restart);
        }
        for i in 0..f.read_outages {
            // An outage starts shortly before a restart when there is one, so
            // the restarted broker replays (pending acks) into the outage.
            let at = if i < f.restarts {
                restart_at(i).saturating_sub(300)
            } else {
                (u128::from(window) * (2 * u128::from(i) + 1)
                    / (2 * u128::from(f.read_outages) + 1)) as u64
            };
            self.sched.at(at, Ev::OutageStart);
            self.sched.at(at.saturating_add(f.outage_ms), Ev::OutageEnd);
        }
        for _ in 0..f.reconnects {
            let at = self.rng.random_range(0..window);
            let sub = self.rng.random_range(0..self.w.subscriptions as usize);
            let consumer = self
                .rng
                .random_range(0..self.w.consumers_per_subscription as usize);
            self.sched.at(at, Ev::Reconnect { sub, consumer });
        }
        for i in 0..f.seeks {
            // Spread over the publish window (offset from the restarts),
            // subscriptions in turn.
            let at = (u128::from(window) * (2 * u128::from(i) + 1) / (2 * u128::from(f.seeks)))
                as u64
                + 150;
            let sub = i as usize % self.w.subscriptions as usize;
            self.sched.at(at, Ev::Seek { sub });
        }
    }

    // ------------------------------------------------------------ broker

    fn open_broker(&mut self) -> Result<(), SimError> {
        let generation = self.broker.as_ref().map_or(0, |b| b.generation + 1);
        // A crash: every in-memory structure goes. Handles are closed first
        // only so their timer/executor tasks release the store (they hold
        // references to it); nothing is flushed or persisted by this.
        if let Some(old) = self.broker.take() {
            self.collect_tracker_stats(&old);
            for sub in &old.subs {
                if let Some(h) = &sub.pending_ack {
                    h.close();
                }
            }
            old.pool.shutdown();
        }
        self.snapshot_faults.clear();
        let store = RedbStore::open_with(self.store_path(), self.opts.sync).map_err(|e| {
            SimError::DataDir {
                path: self.opts.data_dir.display().to_string(),
                reason: e.to_string(),
            }
        })?;
        let dyn_store: Arc<dyn LedgerStore> = Arc::new(store.clone());
        let ledger = ManagedLedger::open(
            TOPIC,
            LedgerConfig {
                max_entries_per_ledger: self.w.max_entries_per_ledger,
                auto_skip_non_recoverable_data: false,
            },
            Arc::clone(&dyn_store),
        )
        .map_err(comp("open topic"))?;
        install_outage(&ledger, &self.outage);
        let pool = ReplayExecutorPool::new(2, ExecutorMode::Manual).map_err(comp("executors"))?;
        let timer = Arc::new(VirtualTimer::new());
        timer.advance_to(self.sched.now());
        let mut subs = Vec::new();
        for s in 0..self.w.subscriptions as usize {
            let name = format!("sub-{s}");
            let cursor = ledger.open_cursor(&name).map_err(comp("open cursor"))?;
            let deletion = CursorDeletionState::recover(
                cursor.mark_delete_position(),
                &cursor.individually_deleted_ranges(),
            )
            .map_err(comp("recover cursor"))?;
            let delayed = if self.w.delayed_ratio > 0.0 {
                let redb = RedbSnapshotStorage::new(store.clone(), TOPIC, &name)
                    .map_err(comp("snapshot storage"))?;
                let faulty = Arc::new(FaultyStorage::new(redb));
                self.snapshot_faults.push(Arc::clone(&faulty));
                let storage: Arc<dyn BucketSnapshotStorage> = faulty;
                let tracker = BucketDelayedDeliveryTracker::new(
                    BucketTrackerConfig {
                        tick_time_ms: self.w.delayed_tick_ms,
                        min_index_count_per_bucket: self.w.delayed_min_index_count_per_bucket,
                        max_num_buckets: self.w.delayed_max_num_buckets,
                        max_time_step_per_bucket_snapshot_segment_ms: 5_000,
                        max_indexes_per_bucket_snapshot_segment: 100,
                        recovery_policy: RecoveryPolicy::SkipCorrupt,
                        ..BucketTrackerConfig::default()
                    },
                    storage,
                    self.clock.clone(),
                )
                .map_err(comp("delayed tracker recovery"))?;
                // Pulsar's tracker reads the mark-delete from the cursor.
                let truth = &mut self.delayed_truth[s];
                if self.sabotage_seek.is_none() {
                    tracker.update_mark_delete(deletion.mark_delete_position());
                    truth.mark_delete(deletion.mark_delete_position());
                }
                // What recovery restored is what the tracker holds now.
                let held: Vec<(Position, u64)> = truth
                    .ever_added()
                    .filter(|(p, _)| tracker.contains_message(p.ledger_id, p.entry_id))
                    .collect();
                truth.resync(held);
                if generation > 0 {
                    self.activity.delayed_recoveries += 1;
                }
                Some(tracker)
            } else {
                None
            };
            let (pending_ack, pending_ack_cursor) = if self.w.txn_ack_ratio > 0.0 {
                let pa_ledger = ManagedLedger::open(
                    format!("{TOPIC}-{name}__transaction_pending_ack"),
                    LedgerConfig {
                        max_entries_per_ledger: 50,
                        auto_skip_non_recoverable_data: self.pa_auto_skip(),
                    },
                    Arc::clone(&dyn_store),
                )
                .map_err(comp("open pending-ack log"))?;
                install_read_faults(
                    &pa_ledger,
                    &self.outage,
                    Some(Arc::clone(&self.replay_plans[s])),
                );
                let pa_cursor = Arc::new(
                    pa_ledger
                        .open_cursor(PENDING_ACK_CURSOR)
                        .map_err(comp("open pending-ack cursor"))?,
                );
                let handle = PendingAckHandle::new(
                    format!("{TOPIC}-{name}"),
                    Arc::clone(&pa_cursor),
                    &pool,
                    Arc::new(InlineReads),
                    timer.clone(),
                    HandleConfig {
                        jitter_seed: self.opts.seed,
                        // Small reads, so a replay reads ahead of what it
                        // applied and a failure can hit a later read.
                        replay: crate::pending_ack::ReplayConfig {
                            queue_capacity: 16,
                            read_batch: 4,
                        },
                        ..HandleConfig::default()
                    },
                )
                .map_err(comp("pending-ack handle"))?;
                let expected = self.pa_truth[s]
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone();
                self.pa_expected[s] = Some((expected, self.pa_ledger_lost[s]));
                self.pa_not_ready_since[s] = Some(self.sched.now());
                self.pa_error_seen[s] = false;
                handle.init();
                drop(pa_ledger);
                (Some(handle), Some(pa_cursor))
            } else {
                (None, None)
            };
            subs.push(SubRt {
                name,
                cursor,
                deletion,
                dispatcher: SharedDispatcher::new(),
                delayed,
                ready: pending_ack.is_none(),
                pending_ack,
                pending_ack_cursor,
                blocked: BTreeMap::new(),
                redeliver: BTreeSet::new(),
                consumer_keys: BTreeMap::new(),
                unpersisted: Vec::new(),
                unpersisted_cumulative: None,
                failover_order: Vec::new(),
                open_cumulative_txn: None,
                dispatch_scheduled: false,
            });
        }
        self.broker = Some(Broker {
            generation,
            ledger,
            subs,
            pool,
            timer,
        });
        for s in 0..self.w.subscriptions as usize {
            self.check_tracker_count(s);
        }
        self.drive_replays()?;
        Ok(())
    }

    fn collect_tracker_stats(&mut self, b: &Broker) {
        for sub in &b.subs {
            if let Some(t) = &sub.delayed {
                let st = t.stats();
                self.activity.bucket_seals += st.seals;
                self.activity.bucket_merges += st.merges;
                self.activity.bucket_trims += st.trimmed_buckets;
            }
        }
    }

    /// Runs queued replay work and schedules the next retry timer.
    fn drive_replays(&mut self) -> Result<(), SimError> {
        let Some(b) = self.broker.as_mut() else {
            return Ok(());
        };
        self.heartbeat.enter("pending_ack replay");
        b.pool.run_pending();
        let mut newly_ready = Vec::new();
        let mut reload = false;
        let now = self.sched.now();
        for (s, sub) in b.subs.iter_mut().enumerate() {
            let Some(h) = &sub.pending_ack else { continue };
            match h.state() {
                HandleState::Ready if !sub.ready => {
                    sub.ready = true;
                    newly_ready.push(s);
                    self.pa_not_ready_since[s] = None;
                    self.pa_ledger_lost[s] = false;
                    let summary = h.summary();
                    let stats = h.stats();
                    // A replay reported complete holds exactly the
                    // transactions open in the log up to its end at the
                    // start (fewer only when it was ended by a completing
                    // failure or a lost ledger was skipped).
                    let found = PaTruth {
                        individual: summary.individual.keys().copied().collect(),
                        cumulative: summary.cumulative.map(|(t, _)| t),
                    };
                    let completing = stats
                        .completed
                        .as_ref()
                        .and_then(|r| r.completing_failure.clone());
                    if let Some((_, lenient)) = self.pa_expected[s].take() {
                        // What is durable now: no append happens while the
                        // subscription replays, and records the crashed
                        // broker's writer flushed on close may report
                        // durable only after the replay started.
                        let expected = self.pa_truth[s]
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .clone();
                        if completing.is_some() {
                            self.activity.replays_ended_by_completing_failure += 1;
                        }
                        let subset = found.individual.is_subset(&expected.individual)
                            && (found.cumulative.is_none()
                                || found.cumulative == expected.cumulative);
                        // A replay ended by a completing failure read a prefix
                        // of the log (Pulsar accepts it as complete): it may
                        // miss commits of transactions it found, so nothing
                        // is checked then. A skipped lost ledger only drops
                        // transactions.
                        let bad = if completing.is_some() {
                            false
                        } else if lenient {
                            !subset
                        } else {
                            found != expected
                        };
                        if bad {
                            let missing: Vec<String> = expected
                                .individual
                                .difference(&found.individual)
                                .map(|t| format!("{t:?}"))
                                .collect();
                            let extra: Vec<String> = found
                                .individual
                                .difference(&expected.individual)
                                .map(|t| format!("{t:?}"))
                                .collect();
                            self.checker.replay_violation(
                                &sub.name,
                                &format!(
                                    "reported complete after {} attempts without every record up to the log's end: {} open transactions expected, {} found (missing: [{}]; unexpected: [{}]; cumulative expected {:?}, found {:?})",
                                    stats.attempts,
                                    expected.individual.len(),
                                    found.individual.len(),
                                    missing.join(", "),
                                    extra.join(", "),
                                    expected.cumulative,
                                    found.cumulative
                                ),
                                now,
                            );
                        }
                    }
                    // From here on the broker's view is the replayed one.
                    *self.pa_truth[s].lock().unwrap_or_else(|e| e.into_inner()) = found;
                    {
                        let mut plan = self.replay_plans[s]
                            .lock()
                            .unwrap_or_else(|e| e.into_inner());
                        plan.persistent = None;
                        self.activity.replay_read_failures_injected +=
                            std::mem::take(&mut plan.injected);
                    }
                    // Transactions left open by the restart are aborted (the
                    // coordinator timed them out): their messages are redelivered.
                    for txn in summary.individual.keys() {
                        let record = PendingAckRecord::abort(*txn, AckType::Individual);
                        let durable = pa_durable(&self.pa_truth[s], &record);
                        h.append(record, durable);
                    }
                    if let Some((txn, _)) = summary.cumulative {
                        let record = PendingAckRecord::abort(txn, AckType::Cumulative);
                        let durable = pa_durable(&self.pa_truth[s], &record);
                        h.append(record, durable);
                    }
                    let completed_reads = stats
                        .completed
                        .as_ref()
                        .map_or(0, |r| r.reads_issued as u64);
                    self.activity.replays_completed += 1;
                    self.activity.replay_failed_attempts += stats.attempts.saturating_sub(1);
                    self.activity.replay_reads_in_failed_attempts +=
                        stats.reads_issued.saturating_sub(completed_reads);
                }
                HandleState::Error if !self.pa_error_seen[s] => {
                    self.pa_error_seen[s] = true;
                    let error = h.error();
                    let auto_skip = self.w.faults.pending_ack_auto_skip || self.operator_auto_skip;
                    let expected = !auto_skip && error.as_ref().is_some_and(is_non_recoverable);
                    if expected {
                        // Pulsar with auto-skip off: the subscription fails to
                        // load until an operator turns auto-skip on and
                        // reloads the topic.
                        self.activity.replay_gave_up_non_recoverable += 1;
                        reload = true;
                    } else {
                        self.checker.replay_violation(
                            &sub.name,
                            &format!("gave up with {error:?} (auto-skip {auto_skip})"),
                            now,
                        );
                    }
                }
                _ => {}
            }
        }
        if let Some(due) = b.timer.next_due_ms() {
            self.sched.at(due, Ev::ReplayTimers);
        }
        for s in newly_ready {
            self.schedule_dispatch(s);
        }
        if reload && !self.operator_reload_planned {
            self.operator_reload_planned = true;
            self.faults_pending += 1;
            self.sched.after(
                self.w.faults.operator_auto_skip_after_ms,
                Ev::OperatorReload,
            );
        }
        Ok(())
    }

    /// Whether the pending-ack logs are opened with
    /// `auto_skip_non_recoverable_data` (the workload's setting, or on once
    /// the operator turned it on).
    fn pa_auto_skip(&self) -> bool {
        self.w.faults.pending_ack_auto_skip || self.operator_auto_skip
    }

    /// The operator turns auto-skip on and reloads the topic (a restart as
    /// far as every component and client is concerned).
    fn operator_reload(&mut self) -> Result<(), SimError> {
        self.operator_auto_skip = true;
        self.activity.operator_reloads += 1;
        self.checker.restarted();
        self.open_broker()?;
        for s in 0..self.w.subscriptions as usize {
            for c in 0..self.w.consumers_per_subscription as usize {
                self.resubscribe_on_new_connection(s, c)?;
            }
        }
        Ok(())
    }

    fn connect_consumer(&mut self, s: usize, c: usize) -> Result<(), SimError> {
        let Some(b) = self.broker.as_mut() else {
            return Ok(());
        };
        let client = &mut self.clients[s][c];
        let incarnation = client.consumer.state().incarnation();
        let key = ConsumerKey {
            connection_id: client.connection.id(),
            consumer_id: client.consumer.consumer_id(),
        };
        let sub = &mut b.subs[s];
        // Entries of the old connection handed back for redelivery.
        let mut handed_back = 0;
        if let Some(old) = sub.consumer_keys.insert(c, key) {
            if old != key {
                if let Ok(removed) = sub.dispatcher.remove_consumer(old) {
                    handed_back += removed.replayed.len();
                }
                // What was read for the old connection but never sent goes
                // back too: it is re-read in position order together with
                // the unacknowledged messages `remove_consumer` put into
                // replay, never behind newer entries (as Pulsar's Key_Shared
                // replays before new reads and its single-active-consumer
                // dispatcher rewinds).
                if let Some(q) = sub.blocked.remove(&c) {
                    handed_back += q.len();
                    sub.redeliver.extend(q.iter().map(|e| e.entry.position));
                }
            }
        }
        if self.w.subscription_type == SubscriptionType::Failover {
            // A (re)subscribing consumer goes to the end of the order; when
            // the active one changes, what was held for the old one is
            // redelivered (with its unacknowledged messages, which
            // `remove_consumer` put into replay) to the new one, in order.
            let active_before = sub.failover_order.first().copied();
            sub.failover_order.retain(|&x| x != c);
            sub.failover_order.push(c);
            if active_before.is_some_and(|a| Some(a) != sub.failover_order.first().copied()) {
                self.activity.active_consumer_changes += 1;
                for (_, q) in std::mem::take(&mut sub.blocked) {
                    handed_back += q.len();
                    sub.redeliver.extend(q.iter().map(|e| e.entry.position));
                }
                self.activity.handover_entries += handed_back as u64;
            }
        }
        if sub.dispatcher.consumer(key).is_none() {
            sub.dispatcher
                .add_consumer(key, client.consumer.epoch())
                .map_err(comp("add consumer"))?;
        }
        client
            .consumer
            .subscribe_succeeded(incarnation)
            .map_err(comp("subscribe succeeded"))?;
        self.sched.after(
            0,
            Ev::FlushFlows {
                sub: s,
                consumer: c,
            },
        );
        Ok(())
    }

    fn schedule_dispatch(&mut self, s: usize) {
        if let Some(b) = self.broker.as_mut() {
            if !b.subs[s].dispatch_scheduled {
                b.subs[s].dispatch_scheduled = true;
                self.sched.after(0, Ev::Dispatch(s));
            }
        }
    }

    // ------------------------------------------------------------ events

    fn event_loop(&mut self) -> Result<(), SimError> {
        let expected = self.w.messages * u64::from(self.w.subscriptions);
        let mut steps: u64 = 0;
        let mut same_time = (0, 0u64);
        while let Some((now, ev)) = self.sched.pop() {
            self.clock.set(now);
            if let Some(b) = &self.broker {
                b.timer.advance_to(now);
            }
            let (component, label, sub) = ev.label();
            self.heartbeat.begin(now, component, label, sub);
            self.handle(ev)?;
            self.heartbeat.end();
            steps += 1;
            if same_time.0 == now {
                same_time.1 += 1;
                if same_time.1 > self.opts.watchdog.same_time_events {
                    let (component, recent) = self.heartbeat.describe();
                    self.checker.livelock(
                        &format!(
                            "livelock at t={now}ms in {component}: virtual time did not advance for {} events; last events: {recent}",
                            same_time.1
                        ),
                        now,
                    );
                    break;
                }
            } else {
                same_time = (now, 1);
            }
            if steps.is_multiple_of(1024) {
                if let Some(limit) = self.opts.watchdog.wall_limit {
                    if self.started.elapsed() > limit {
                        let (component, recent) = self.heartbeat.describe();
                        self.checker.livelock(
                            &format!(
                                "wall-clock limit of {:.1}s exceeded at t={now}ms in {component}; last events: {recent}",
                                limit.as_secs_f64()
                            ),
                            now,
                        );
                        break;
                    }
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
        self.drain_and_check_permits()?;
        // Persist what was acknowledged (a clean shutdown).
        for s in 0..self.w.subscriptions as usize {
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
        while let Some((now, ev)) = self.sched.pop() {
            if now > deadline {
                break;
            }
            self.clock.set(now);
            match ev {
                Ev::Publish
                | Ev::Restart
                | Ev::Recreate { .. }
                | Ev::OutageStart
                | Ev::Seek { .. }
                | Ev::StallCheck
                | Ev::DelayedTick(_)
                | Ev::Persist(_) => {}
                other => self.handle(other)?,
            }
        }
        for s in 0..self.w.subscriptions as usize {
            for c in 0..self.w.consumers_per_subscription as usize {
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
                        c,
                        permits,
                        i64::from(self.w.receiver_queue_size),
                        now,
                    );
                }
            }
        }
        Ok(())
    }

    fn checker_acked(&self) -> u64 {
        // The checker owns the count; the report carries it. This is only
        // for the progress bar.
        self.acked_at_last_check.iter().sum()
    }

    fn handle(&mut self, ev: Ev) -> Result<(), SimError> {
        match ev {
            Ev::Publish => self.publish(),
            Ev::Dispatch(s) => self.dispatch(s),
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
                } else {
                    self.ack(sub, broker_generation, key, position, messages, txn)
                }
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
            Ev::FlushFlows { sub, consumer } => self.flush_flows(sub, consumer),
            Ev::Persist(s) => {
                self.persist(s)?;
                self.sched.after(PERSIST_INTERVAL_MS, Ev::Persist(s));
                Ok(())
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
                for s in 0..self.w.subscriptions as usize {
                    if let Some(since) = self.pa_not_ready_since[s].as_mut() {
                        *since = self.sched.now();
                    }
                    self.schedule_dispatch(s);
                }
                Ok(())
            }
            Ev::Recreate { sub, consumer } => {
                let client = &mut self.clients[sub][consumer];
                if client.consumer.queued() > 0 && !client.connection.is_closed() {
                    // Right after the application's next poll returned
                    // permits, while their Flow is still queued.
                    client.recreate_pending = true;
                    Ok(())
                } else {
                    self.recreate_on_same_connection(sub, consumer)
                }
            }
            Ev::OperatorReload => {
                self.faults_pending = self.faults_pending.saturating_sub(1);
                self.operator_reload()
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

    fn publish(&mut self) -> Result<(), SimError> {
        let now = self.sched.now();
        let Some(b) = self.broker.as_ref() else {
            return Ok(());
        };
        // (entry bytes, per message (key, deliver_at_ms))
        type Planned = (Vec<u8>, Vec<(u32, u64)>);
        let mut entries: Vec<Planned> = Vec::new();
        for p in 0..self.w.producers {
            if self.published >= self.w.messages {
                break;
            }
            let delayed = self.w.delayed_ratio > 0.0 && self.rng.random_bool(self.w.delayed_ratio);
            let batch = if delayed {
                1
            } else {
                (u64::from(self.w.batch_size)).min(self.w.messages - self.published) as u32
            };
            let key = self.rng.random_range(0..self.w.keys);
            let deliver_at_ms = if delayed {
                now + self.rng.random_range(1..=self.w.max_delay_ms.max(1))
            } else {
                0
            };
            let seq = self.producer_seq[p as usize];
            self.producer_seq[p as usize] += u64::from(batch);
            let body = SimPayload {
                producer: p,
                key,
                deliver_at_ms,
            }
            .encode_to_vec();
            let metadata = MessageMetadata {
                producer_name: format!("producer-{p}"),
                sequence_id: seq,
                publish_time: now,
                num_messages_in_batch: (batch > 1).then_some(batch as i32),
            };
            let messages: Vec<(SingleMessageMetadata, Vec<u8>)> = (0..batch)
                .map(|_| {
                    (
                        SingleMessageMetadata {
                            partition_key: Some(key.to_string()),
                            payload_size: body.len() as i32,
                            ..SingleMessageMetadata::default()
                        },
                        body.clone(),
                    )
                })
                .collect();
            entries.push((
                encode_entry_payload(&metadata, &messages),
                vec![(key, deliver_at_ms); batch as usize],
            ));
            self.published += u64::from(batch);
        }
        if entries.is_empty() {
            return Ok(());
        }
        let refs: Vec<&[u8]> = entries.iter().map(|(e, _)| e.as_slice()).collect();
        let positions = b.ledger.append_batch(&refs).map_err(comp("append"))?;
        for (pos, (_, msgs)) in positions.iter().zip(&entries) {
            for (i, (key, deliver_at)) in msgs.iter().enumerate() {
                self.checker.published(
                    MessageRef {
                        position: *pos,
                        batch_index: i as u32,
                    },
                    *key,
                    *deliver_at,
                );
            }
        }
        if self.published < self.w.messages {
            self.sched.after(self.w.publish_interval_ms, Ev::Publish);
        }
        for s in 0..self.w.subscriptions as usize {
            self.schedule_dispatch(s);
        }
        Ok(())
    }

    /// Decodes an entry's key and delivery time (first message of the batch).
    fn entry_info(data: &[u8]) -> Option<(u32, u32, u64)> {
        // Pulsar's entry payload layout, parsed by the frame codec.
        let entry = crate::permits::frame::parse_entry_payload(data).ok()?;
        let md = &entry.metadata;
        let batch = md.num_messages_in_batch.unwrap_or(1).max(1) as u32;
        let rest = entry.payload;
        let body = if md.num_messages_in_batch.is_none() {
            rest
        } else {
            let (smm, start) = crate::permits::frame::read_batch_message_header(rest, 0).ok()?;
            rest.get(start..start + smm.payload_size as usize)?
        };
        let p = SimPayload::decode(body).ok()?;
        Some((batch, p.key, p.deliver_at_ms))
    }

    fn dispatch(&mut self, s: usize) -> Result<(), SimError> {
        let w = self.w;
        if self.opts.faults {
            if let Some(f) = self.snapshot_faults.get(s) {
                let create = u32::from(
                    w.faults.snapshot_create_failure_ratio > 0.0
                        && self.rng.random_bool(w.faults.snapshot_create_failure_ratio),
                );
                let delete = u32::from(
                    w.faults.snapshot_delete_failure_ratio > 0.0
                        && self.rng.random_bool(w.faults.snapshot_delete_failure_ratio),
                );
                if create + delete > 0 {
                    self.activity.snapshot_failures_injected += u64::from(create + delete);
                    f.arm(FaultPlan {
                        create,
                        read: 0,
                        delete,
                    });
                }
            }
        }
        let Some(b) = self.broker.as_mut() else {
            return Ok(());
        };
        let sub = &mut b.subs[s];
        sub.dispatch_scheduled = false;
        if !sub.ready || sub.consumer_keys.is_empty() {
            return Ok(());
        }
        let mut to_route: Vec<SimEntry> = Vec::new();
        let mut read_error = false;
        // 1. Redeliveries (removed consumers, unsent) and due delayed messages.
        let mut replay: BTreeSet<Position> = std::mem::take(&mut sub.redeliver);
        let mut handed_back = sub.dispatcher.take_replay();
        if self.opts.sabotage == Some(Sabotage::DropFailoverHandover)
            && !self.sabotage_done
            && self.activity.active_consumer_changes > 0
            && !handed_back.is_empty()
        {
            self.sabotage_done = true;
            handed_back.clear();
        }
        replay.extend(handed_back);
        // Sabotage only: one position the tracker schedules from below the
        // seek it was not told about skips the deletion check below.
        let mut unchecked: Option<Position> = None;
        if let Some(t) = &sub.delayed {
            if t.has_message_available() {
                match t.get_scheduled_messages(MAX_READ_ENTRIES) {
                    Ok(ps) => {
                        if let Some((_, seek_md)) = self.sabotage_seek.filter(|(ss, _)| *ss == s) {
                            if let Some(p) = ps.iter().find(|p| **p <= seek_md) {
                                unchecked = Some(*p);
                                self.sabotage_seek = None;
                                self.sabotage_done = true;
                            }
                        }
                        let truth = &mut self.delayed_truth[s];
                        for p in &ps {
                            if !truth.scheduled(*p) {
                                self.checker.tracker_violation(
                                    &sub.name,
                                    &format!("scheduled {p}, which it does not hold (scheduled before, or never added)"),
                                    self.sched.now(),
                                );
                            }
                        }
                        replay.extend(ps);
                    }
                    Err(e) => return Err(SimError::Component(format!("delayed: {e}"))),
                }
            }
        }
        // Never send an entry that is already out on a consumer and not yet
        // acknowledged (a due delayed message can reach the dispatcher twice
        // in one lifetime: from the tracker and from the cursor's re-read
        // after a restart).
        let pending_on_consumer = |d: &SharedDispatcher, p: &Position| {
            d.consumers().any(|c| c.pending_acks().contains_key(p))
        };
        let replay: Vec<Position> = replay
            .into_iter()
            .filter(|p| Some(*p) == unchecked || !sub.deletion.is_message_deleted(*p))
            .filter(|p| !pending_on_consumer(&sub.dispatcher, p))
            .filter(|p| {
                !sub.blocked
                    .values()
                    .any(|q| q.iter().any(|r| r.entry.position == *p))
            })
            .collect();
        if !replay.is_empty() {
            match b.ledger.read_positions(&replay) {
                Ok(entries) => {
                    for e in entries {
                        if let Some((batch, key, _)) = Self::entry_info(&e.data) {
                            to_route.push(SimEntry::new(e.position, batch, key, e.data));
                        }
                    }
                }
                Err(LedgerError::StorageUnavailable { .. }) => {
                    // put them back; retry after the outage
                    sub.redeliver.extend(replay);
                    read_error = true;
                }
                Err(e) => return Err(SimError::Component(format!("replay read: {e}"))),
            }
        }
        // 2. New entries, as many as the consumers have permits for.
        let blocked: usize = sub.blocked.values().map(|q| q.len()).sum();
        let permits = sub.dispatcher.total_available_permits();
        if !read_error && permits > 0 && blocked < 1_000 {
            let n = (permits as usize).clamp(1, MAX_READ_ENTRIES);
            let deletion = &sub.deletion;
            let mut skipped = 0u64;
            let read = sub.cursor.read_entries_with_skip(n, |l, e| {
                let d = deletion.is_deleted_for_read_scheduling(l, e);
                skipped += u64::from(d);
                d
            });
            self.activity.reads_skipped_by_hint += skipped;
            match read {
                Ok(entries) => {
                    let before = entries.len();
                    let entries = sub.deletion.filter_read_entries(entries, |e| e.position);
                    self.activity.entries_filtered_after_read += (before - entries.len()) as u64;
                    for e in entries {
                        let Some((batch, key, deliver_at)) = Self::entry_info(&e.data) else {
                            return Err(SimError::Component(format!(
                                "undecodable entry at {}",
                                e.position
                            )));
                        };
                        if deliver_at > 0 {
                            if let Some(t) = &sub.delayed {
                                let added = t.add_message(
                                    e.position.ledger_id,
                                    e.position.entry_id,
                                    deliver_at as i64,
                                );
                                match added {
                                    Ok(true) => {
                                        self.delayed_truth[s].accepted(e.position, deliver_at)
                                    }
                                    Ok(false) => self.delayed_truth[s].declined(e.position),
                                    Err(_) => {}
                                }
                                match added {
                                    Ok(true) => continue, // tracked: delivered when due
                                    Ok(false)
                                        if pending_on_consumer(&sub.dispatcher, &e.position)
                                            || to_route
                                                .iter()
                                                .any(|r| r.entry.position == e.position)
                                            || sub.blocked.values().any(|q| {
                                                q.iter().any(|r| r.entry.position == e.position)
                                            }) =>
                                    {
                                        continue; // already on its way via the tracker
                                    }
                                    Ok(false) => {} // due already: dispatch now
                                    Err(err) => {
                                        return Err(SimError::Component(format!(
                                            "delayed add: {err}"
                                        )))
                                    }
                                }
                            }
                        }
                        to_route.push(SimEntry::new(e.position, batch, key, e.data));
                    }
                }
                Err(LedgerError::StorageUnavailable { .. }) => read_error = true,
                Err(e) => return Err(SimError::Component(format!("read: {e}"))),
            }
        }
        // 3. Route: Key_Shared by hash range, Shared by permits.
        let slots: Vec<usize> = sub.consumer_keys.keys().copied().collect();
        let routed = to_route.len();
        for e in to_route {
            let slot = match w.subscription_type {
                SubscriptionType::KeyShared => {
                    let h = hash_key(e.key) as usize;
                    let n = w.consumers_per_subscription as usize;
                    slots[(h * n / 65_536).min(slots.len() - 1)]
                }
                SubscriptionType::Failover => sub
                    .failover_order
                    .iter()
                    .copied()
                    .find(|c| sub.consumer_keys.contains_key(c))
                    .unwrap_or(slots[0]),
                SubscriptionType::Shared => {
                    let mut best = slots[0];
                    let mut best_permits = i64::MIN;
                    for &c in &slots {
                        let p = sub
                            .dispatcher
                            .consumer(sub.consumer_keys[&c])
                            .map_or(i64::MIN, |x| x.available_permits());
                        if p > best_permits {
                            best = c;
                            best_permits = p;
                        }
                    }
                    best
                }
            };
            sub.blocked.entry(slot).or_default().push_back(e);
        }
        // 4. Send what each consumer has permits for, in order.
        let mut deliveries = Vec::new();
        let mut write_failed = Vec::new();
        for (&slot, queue) in sub.blocked.iter_mut() {
            let Some(&key) = sub.consumer_keys.get(&slot) else {
                continue;
            };
            let mut batch = Vec::new();
            let mut budget = sub
                .dispatcher
                .consumer(key)
                .map_or(0, |c| c.available_permits());
            while budget > 0 {
                let Some(e) = queue.pop_front() else { break };
                budget -= i64::from(e.entry.candidate_permits());
                batch.push(e);
            }
            if batch.is_empty() {
                continue;
            }
            let payloads: BTreeMap<Position, Arc<Vec<u8>>> = batch
                .iter()
                .map(|e| (e.entry.position, Arc::clone(&e.payload)))
                .collect();
            let permits_before = sub
                .dispatcher
                .consumer(key)
                .map_or(0, |c| c.available_permits());
            let reject_ratio = if self.opts.faults {
                w.faults.admission_reject_ratio
            } else {
                0.0
            };
            let rng = &mut self.rng;
            // Pending-ack admission (conflicts, filters): with the
            // fault on, some entries are rejected; they are neither sent nor
            // debited and go back for replay.
            let mut admit = |_: ConsumerKey, _: &BrokerEntry| {
                !(reject_ratio > 0.0 && rng.random_bool(reject_ratio))
            };
            let d = sub
                .dispatcher
                .send_to_consumer(
                    key,
                    batch.into_iter().map(|e| e.entry).collect(),
                    &mut admit,
                )
                .map_err(comp("send"))?;
            let rejected: Vec<Position> = d
                .not_sent
                .iter()
                .filter(|(_, r)| *r != crate::permits::broker::NotSentReason::AlreadyPending)
                .map(|(p, _)| *p)
                .collect();
            self.activity.admission_rejections += rejected.len() as u64;
            for p in &rejected {
                // Replayed after later entries: exempt from the order check.
                let batch = payloads
                    .get(p)
                    .and_then(|b| Self::entry_info(b))
                    .map_or(1, |x| x.0);
                for batch_index in 0..batch {
                    self.checker.exempt_from_order(
                        &sub.name,
                        MessageRef {
                            position: *p,
                            batch_index,
                        },
                    );
                }
            }
            // PIP-491: the consumer is debited exactly the P its commands carry.
            let permits_after = sub
                .dispatcher
                .consumer(key)
                .map_or(0, |c| c.available_permits());
            let sent_p: i64 = d
                .commands
                .iter()
                .map(|c| i64::from(c.message_permits.unwrap_or(0)))
                .sum();
            if permits_before - permits_after != sent_p {
                self.checker.permit_violation(
                    &sub.name,
                    slot,
                    &format!(
                        "debited {} permits for commands carrying {sent_p} ({} entries rejected by admission)",
                        permits_before - permits_after,
                        rejected.len()
                    ),
                    self.sched.now(),
                );
            }
            let write_fails = self.opts.faults
                && d.write_id.is_some()
                && w.faults.write_failure_ratio > 0.0
                && self.rng.random_bool(w.faults.write_failure_ratio);
            if let Some(id) = d.write_id {
                let outcome = if write_fails {
                    Err("injected asynchronous write failure".to_string())
                } else {
                    Ok(())
                };
                sub.dispatcher
                    .on_write_complete(id, outcome)
                    .map_err(comp("write complete"))?;
            }
            if write_fails {
                // The write failed: nothing reached the client, the broker
                // must have removed the consumer (its messages go back for
                // redelivery) and the client reconnects.
                self.activity.write_failure_removals += 1;
                if sub.dispatcher.consumer(key).is_some() {
                    self.checker.permit_violation(
                        &sub.name,
                        slot,
                        "an asynchronous write failure left the consumer registered",
                        self.sched.now(),
                    );
                } else {
                    write_failed.push(slot);
                }
                continue;
            }
            for cmd in d.commands {
                let pos = Position::new(
                    cmd.message_id.ledger_id as i64,
                    cmd.message_id.entry_id as i64,
                );
                deliveries.push((slot, key.connection_id, cmd, Arc::clone(&payloads[&pos])));
            }
        }
        // Go on only while this pass made progress: otherwise the next Flow,
        // ack, publish or tick schedules the dispatcher again.
        let more = !read_error
            && (routed > 0 || !deliveries.is_empty())
            && sub.dispatcher.total_available_permits() > 0
            && (sub.cursor.has_more_entries() || sub.blocked.values().any(|q| !q.is_empty()));
        let retry_after_error = read_error;
        let seeks_before_dispatch = self.seeks_done[s];
        for slot in write_failed {
            self.faults_pending += 1;
            self.sched.after(
                NET_MS,
                Ev::Reconnect {
                    sub: s,
                    consumer: slot,
                },
            );
        }
        for (slot, connection_id, command, payload) in deliveries {
            let incarnation = self.clients[s][slot].consumer.state().incarnation();
            self.sched.after(
                NET_MS,
                Ev::Deliver {
                    sub: s,
                    consumer: slot,
                    connection_id,
                    incarnation,
                    command,
                    payload,
                    seeks_before_dispatch,
                },
            );
        }
        if retry_after_error {
            self.sched.after(100, Ev::Dispatch(s));
            if let Some(b) = self.broker.as_mut() {
                b.subs[s].dispatch_scheduled = true;
            }
        } else if more {
            self.schedule_dispatch(s);
        }
        self.check_tracker_count(s);
        Ok(())
    }

    fn deliver(
        &mut self,
        s: usize,
        c: usize,
        command: &CommandMessage,
        payload: &[u8],
        seeks_before_dispatch: u32,
    ) -> Result<(), SimError> {
        if seeks_before_dispatch > 0 {
            let pos = Position::new(
                command.message_id.ledger_id as i64,
                command.message_id.entry_id as i64,
            );
            self.clients[s][c]
                .dispatch_seeks
                .insert(pos, seeks_before_dispatch);
        }
        let corrupt = self.opts.faults
            && self.w.faults.corrupted_batch_ratio > 0.0
            && self.rng.random_bool(self.w.faults.corrupted_batch_ratio);
        let original = payload;
        let mut bytes;
        let payload = if corrupt {
            bytes = payload.to_vec();
            let last = bytes.len() - 1;
            bytes[last] ^= 0xff; // breaks the checksum
            self.activity.corrupted_batches += 1;
            &bytes[..]
        } else {
            payload
        };
        // Faulty-broker mode: an invalid explicit P (0, or above the batch's
        // message count); the client must close the connection and return
        // no credit for it. Only on a payload the client can read: a
        // corrupted batch has no metadata to check P against, so the client
        // returns the P it was sent (PIP-491) and cannot tell it is wrong.
        // (The draw happens either way, so the run's random sequence does
        // not depend on the corruption.)
        let mut faulty;
        let command = if self.opts.faults
            && self.w.faults.invalid_permits_ratio > 0.0
            && self.rng.random_bool(self.w.faults.invalid_permits_ratio)
            && !corrupt
        {
            faulty = command.clone();
            let batch = Self::entry_info(original).map_or(1, |(b, _, _)| b);
            faulty.message_permits = Some(if self.rng.random_bool(0.5) {
                0
            } else {
                batch + 1
            });
            &faulty
        } else {
            command
        };
        let invalid_p = command.message_permits != command_permits_sent(command, original);
        // The broker writes a real Pulsar payload frame; the client decodes it.
        let frame_bytes = crate::permits::frame::encode_payload_frame(
            &crate::permits::wire::Command::Message(command.clone()).into_base(),
            payload,
        );
        let client = &mut self.clients[s][c];
        let outcome = client
            .consumer
            .handle_frame(&frame_bytes, crate::permits::frame::DEFAULT_MAX_FRAME_SIZE)
            .map_err(comp("handle message"))?;
        if invalid_p {
            if client.connection.is_closed() {
                self.activity.invalid_permit_closes += 1;
                self.faults_pending += 1;
                self.sched.after(
                    NET_MS,
                    Ev::Reconnect {
                        sub: s,
                        consumer: c,
                    },
                );
            } else {
                let p = command.message_permits;
                self.checker.permit_violation(
                    &format!("sub-{s}"),
                    c,
                    &format!("the client accepted invalid message_permits {p:?} without closing the connection"),
                    self.sched.now(),
                );
            }
            return Ok(());
        }
        if corrupt {
            // Pulsar's client acks a corrupted entry with a validation error
            // and the broker drops it. Here the corruption happens in transit
            // only (the stored entry is intact), so the simulated broker
            // treats it as a negative ack and replays it instead of losing it.
            if let Some(b) = self.broker.as_mut() {
                let pos = Position::new(
                    command.message_id.ledger_id as i64,
                    command.message_id.entry_id as i64,
                );
                if let Some(key) = b.subs[s].consumer_keys.get(&c).copied() {
                    let _ = b.subs[s].dispatcher.acknowledge(key, pos);
                }
                b.subs[s].redeliver.insert(pos);
            }
            // Nothing of the batch reached the application (the checksum
            // failed); its redelivery comes after later entries, so the
            // entry is exempt from the per-key order check.
            let batch = Self::entry_info(original).map_or(1, |(b, _, _)| b);
            for batch_index in 0..batch {
                self.checker.exempt_from_order(
                    &format!("sub-{s}"),
                    MessageRef {
                        position: Position::new(
                            command.message_id.ledger_id as i64,
                            command.message_id.entry_id as i64,
                        ),
                        batch_index,
                    },
                );
            }
            self.schedule_dispatch(s);
        }
        let _ = outcome;
        let client = &mut self.clients[s][c];
        if !client.poll_scheduled {
            client.poll_scheduled = true;
            self.sched.after(
                APP_POLL_MS,
                Ev::AppPoll {
                    sub: s,
                    consumer: c,
                },
            );
        }
        self.sched.after(
            0,
            Ev::FlushFlows {
                sub: s,
                consumer: c,
            },
        );
        Ok(())
    }

    fn app_poll(&mut self, s: usize, c: usize) -> Result<(), SimError> {
        let now = self.sched.now();
        let sub_name = format!("sub-{s}");
        let broker_generation = self.broker.as_ref().map_or(0, |b| b.generation);
        let key = self
            .broker
            .as_ref()
            .and_then(|b| b.subs[s].consumer_keys.get(&c).copied());
        let mut acks = Vec::new();
        let cumulative_every = self.w.cumulative_ack_every;
        {
            let client = &mut self.clients[s][c];
            client.poll_scheduled = false;
            if client.connection.is_closed() {
                return Ok(()); // reconnecting: the new incarnation starts empty
            }
            for _ in 0..APP_BATCH {
                let Some(msg) = client.consumer.receive() else {
                    break;
                };
                let id = msg.message_id.clone();
                let position = Position::new(id.ledger_id as i64, id.entry_id as i64);
                let batch_index = id.batch_index.unwrap_or(-1).max(0) as u32;
                let batch_size = id.batch_size.unwrap_or(1).max(1) as u32;
                let mref = MessageRef {
                    position,
                    batch_index,
                };
                let mut deliveries = 1;
                let mut release = true;
                if self.opts.sabotage == Some(Sabotage::StopReturningPermits) {
                    release = false;
                }
                if !self.sabotage_done {
                    match self.opts.sabotage {
                        Some(Sabotage::DropOneDelivery) => {
                            self.sabotage_done = true;
                            deliveries = 0;
                        }
                        Some(Sabotage::DeliverOneTwice) => {
                            self.sabotage_done = true;
                            deliveries = 2;
                        }
                        Some(Sabotage::ReturnOnePermitTooFew) => {
                            self.sabotage_done = true;
                            release = false;
                        }
                        Some(
                            Sabotage::StopReturningPermits
                            | Sabotage::DeliverOneTrimmedMessage
                            | Sabotage::CumulativeAckOnePastReceived
                            | Sabotage::DropFailoverHandover,
                        )
                        | None => {}
                    }
                }
                let seeks = client.dispatch_seeks.get(&position).copied().unwrap_or(0);
                for _ in 0..deliveries {
                    self.checker.delivered(&sub_name, c, mref, now, seeks);
                }
                client.last_delivery_ms = now;
                client.stall_since = None;
                if release {
                    msg.release_permit().map_err(comp("permit return"))?;
                } else {
                    std::mem::forget(msg.token);
                }
                if deliveries == 0 {
                    continue; // dropped: never acknowledged
                }
                client.consumer.acknowledge(&id);
                let entry = client
                    .in_progress
                    .entry(position)
                    .or_insert_with(|| (batch_size, Vec::new()));
                entry.0 = entry.0.saturating_sub(1);
                entry.1.push(mref);
                client.since_cumulative += 1;
                if entry.0 == 0 {
                    let (_, refs) = client.in_progress.remove(&position).unwrap_or_default();
                    client.dispatch_seeks.remove(&position);
                    if cumulative_every > 0 {
                        client.cumulative_upto = Some(position);
                    } else {
                        acks.push((position, refs));
                    }
                }
            }
            if client.consumer.queued() > 0 {
                client.poll_scheduled = true;
                self.sched.after(
                    APP_POLL_MS,
                    Ev::AppPoll {
                        sub: s,
                        consumer: c,
                    },
                );
            }
        }
        let incarnation = self.clients[s][c].consumer.state().incarnation();
        if let Some(key) = key {
            for (position, messages) in acks {
                let txn = self.maybe_txn();
                self.sched.after(
                    NET_MS,
                    Ev::Ack {
                        sub: s,
                        incarnation,
                        broker_generation,
                        key,
                        position,
                        messages,
                        txn,
                        cumulative: false,
                    },
                );
            }
        }
        if std::mem::take(&mut self.clients[s][c].recreate_pending) {
            return self.recreate_on_same_connection(s, c);
        }
        if cumulative_every > 0 {
            let client = &mut self.clients[s][c];
            if client.since_cumulative >= cumulative_every {
                self.send_cumulative_ack(s, c);
            } else if client.cumulative_upto.is_some() {
                self.schedule_ack_flush(s, c);
            }
        }
        self.sched.after(
            0,
            Ev::FlushFlows {
                sub: s,
                consumer: c,
            },
        );
        Ok(())
    }

    fn ack(
        &mut self,
        s: usize,
        broker_generation: u64,
        key: ConsumerKey,
        position: Position,
        messages: Vec<MessageRef>,
        txn: Option<TxnId>,
    ) -> Result<(), SimError> {
        let Some(b) = self.broker.as_mut() else {
            return Ok(());
        };
        if b.generation != broker_generation {
            return Ok(()); // sent to a broker that has since restarted: lost
        }
        let sub = &mut b.subs[s];
        if sub.dispatcher.consumer(key).is_none() {
            // Sent on a connection since closed: never processed (Pulsar
            // drops a closed connection's unread frames). The message was
            // handed back for redelivery when the consumer went away.
            return Ok(());
        }
        let _ = sub.dispatcher.acknowledge(key, position);
        let acker = sub.client_of(key).unwrap_or(usize::MAX);
        let now = self.sched.now();
        self.checker.ack_applied(&sub.name, acker, &messages, now);
        if let (Some(txn), Some(h)) = (txn, &sub.pending_ack) {
            let record =
                PendingAckRecord::individual_ack(txn, vec![AckedPosition::whole(position)]);
            let durable = pa_durable(&self.pa_truth[s], &record);
            h.append(record, durable);
            // Transactions stay open for a while (the coordinator commits
            // later), so restarts find open ones in the pending-ack log.
            let delay = self.rng.random_range(10..=2_000);
            self.sched.after(
                delay,
                Ev::Commit {
                    sub: s,
                    broker_generation,
                    txn,
                    positions: vec![(position, messages)],
                    cumulative: false,
                },
            );
            return Ok(());
        }
        sub.deletion
            .delete(&[position], b.ledger.as_ref())
            .map_err(comp("ack"))?;
        sub.unpersisted.extend(messages);
        if let Some(t) = &sub.delayed {
            if self.sabotage_seek.is_none() {
                t.update_mark_delete(sub.deletion.mark_delete_position());
                self.delayed_truth[s].mark_delete(sub.deletion.mark_delete_position());
            }
        }
        self.check_tracker_count(s);
        self.schedule_dispatch(s);
        Ok(())
    }

    /// Schedules client `c`'s pending cumulative ack to be sent after the
    /// ack grouping time, unless a flush is already scheduled.
    fn schedule_ack_flush(&mut self, s: usize, c: usize) {
        let client = &mut self.clients[s][c];
        if !client.ack_flush_scheduled {
            client.ack_flush_scheduled = true;
            self.sched.after(
                ACK_GROUP_MS,
                Ev::AckFlush {
                    sub: s,
                    consumer: c,
                },
            );
        }
    }

    /// A new transaction for the next ack, with probability `txn_ack_ratio`.
    fn maybe_txn(&mut self) -> Option<TxnId> {
        (self.w.txn_ack_ratio > 0.0 && self.rng.random_bool(self.w.txn_ack_ratio)).then(|| {
            self.next_txn += 1;
            TxnId::new(0, self.next_txn)
        })
    }

    /// Failover: consumer `c` of subscription `s` sends a cumulative ack up
    /// to the last entry it received completely (if any since the last
    /// one); some go inside a transaction.
    fn send_cumulative_ack(&mut self, s: usize, c: usize) {
        let Some(b) = self.broker.as_ref() else {
            return;
        };
        let broker_generation = b.generation;
        let Some(key) = b.subs[s].consumer_keys.get(&c).copied() else {
            return;
        };
        let last_confirmed = b.ledger.last_confirmed_entry();
        let next_entry = |p: Position| b.ledger.next_valid_position(p);
        let client = &mut self.clients[s][c];
        let Some(mut position) = client.cumulative_upto.take() else {
            return;
        };
        client.since_cumulative = 0;
        if self.opts.sabotage == Some(Sabotage::CumulativeAckOnePastReceived) && !self.sabotage_done
        {
            let next = next_entry(position);
            if next <= last_confirmed {
                self.sabotage_done = true;
                position = next;
            }
        }
        let txn = self.maybe_txn();
        let incarnation = self.clients[s][c].consumer.state().incarnation();
        self.sched.after(
            NET_MS,
            Ev::Ack {
                sub: s,
                incarnation,
                broker_generation,
                key,
                position,
                messages: Vec::new(),
                txn,
                cumulative: true,
            },
        );
    }

    /// The broker applies a cumulative ack up to `position` (Failover): the
    /// consumer's pending messages up to it are settled, then either the
    /// pending-ack store logs it for transaction `txn` or the cursor's
    /// mark-delete moves. As Pulsar's pending-ack handle, a transactional
    /// cumulative ack while another transaction's cumulative ack is still
    /// pending is rejected (a transaction conflict): nothing changes and the
    /// client acks that range again later.
    fn cumulative_ack(
        &mut self,
        s: usize,
        broker_generation: u64,
        key: ConsumerKey,
        position: Position,
        txn: Option<TxnId>,
    ) -> Result<(), SimError> {
        let now = self.sched.now();
        let Some(b) = self.broker.as_mut() else {
            return Ok(());
        };
        if b.generation != broker_generation {
            return Ok(()); // sent to a broker that has since restarted: lost
        }
        let sub = &mut b.subs[s];
        let Some(consumer) = sub.dispatcher.consumer(key) else {
            return Ok(()); // sent on a connection since closed: never processed
        };
        if let (Some(txn), Some(_), Some(open)) = (txn, &sub.pending_ack, sub.open_cumulative_txn) {
            if open != txn {
                self.activity.txn_cumulative_conflicts += 1;
                if let Some(c) = sub.client_of(key) {
                    let client = &mut self.clients[s][c];
                    client.cumulative_upto = client.cumulative_upto.max(Some(position));
                    self.schedule_ack_flush(s, c);
                }
                return Ok(());
            }
        }
        let settled: Vec<Position> = consumer
            .pending_acks()
            .range(..=position)
            .map(|(p, _)| *p)
            .collect();
        for p in settled {
            let _ = sub.dispatcher.acknowledge(key, p);
        }
        // The checker knows consumers by their stable client index.
        let acker = sub.client_of(key).unwrap_or(usize::MAX);
        self.checker
            .cumulative_ack_applied(&sub.name, acker, position, now);
        self.activity.cumulative_acks += 1;
        if let (Some(txn), Some(h), None) = (txn, &sub.pending_ack, sub.open_cumulative_txn) {
            self.activity.txn_cumulative_acks += 1;
            sub.open_cumulative_txn = Some(txn);
            let record = PendingAckRecord::cumulative_ack(txn, position);
            let durable = pa_durable(&self.pa_truth[s], &record);
            h.append(record, durable);
            let delay = self.rng.random_range(10..=2_000);
            self.sched.after(
                delay,
                Ev::Commit {
                    sub: s,
                    broker_generation,
                    txn,
                    positions: vec![(position, Vec::new())],
                    cumulative: true,
                },
            );
            return Ok(());
        }
        Self::apply_cumulative(sub, position, b.ledger.as_ref())?;
        self.schedule_dispatch(s);
        Ok(())
    }

    /// Moves the subscription's mark-delete to `position` (a stale
    /// cumulative ack below it is a no-op) and remembers it for the checker
    /// until persisted.
    fn apply_cumulative(
        sub: &mut SubRt,
        position: Position,
        ledger: &ManagedLedger,
    ) -> Result<(), SimError> {
        match sub.deletion.mark_delete(position, ledger) {
            Ok(_) | Err(DeletionError::MarkDeleteBackward { .. }) => {}
            Err(e) => return Err(SimError::Component(format!("cumulative ack: {e}"))),
        }
        sub.unpersisted_cumulative = sub.unpersisted_cumulative.max(Some(position));
        Ok(())
    }

    fn commit(
        &mut self,
        s: usize,
        broker_generation: u64,
        txn: TxnId,
        positions: Vec<(Position, Vec<MessageRef>)>,
        cumulative: bool,
    ) -> Result<(), SimError> {
        let Some(b) = self.broker.as_mut() else {
            return Ok(());
        };
        if b.generation != broker_generation {
            return Ok(()); // the transaction was aborted by the restart
        }
        let sub = &mut b.subs[s];
        if cumulative {
            if let Some(h) = &sub.pending_ack {
                let record = PendingAckRecord::commit(txn, AckType::Cumulative);
                let durable = pa_durable(&self.pa_truth[s], &record);
                h.append(record, durable);
            }
            if sub.open_cumulative_txn == Some(txn) {
                sub.open_cumulative_txn = None;
            }
            for (position, _) in positions {
                Self::apply_cumulative(sub, position, b.ledger.as_ref())?;
            }
            self.schedule_dispatch(s);
            return Ok(());
        }
        if let Some(h) = &sub.pending_ack {
            let record = PendingAckRecord::commit(txn, AckType::Individual);
            let durable = pa_durable(&self.pa_truth[s], &record);
            h.append(record, durable);
        }
        let ps: Vec<Position> = positions.iter().map(|(p, _)| *p).collect();
        sub.deletion
            .delete(&ps, b.ledger.as_ref())
            .map_err(comp("commit ack"))?;
        for (_, refs) in positions {
            sub.unpersisted.extend(refs);
        }
        self.schedule_dispatch(s);
        Ok(())
    }

    fn persist(&mut self, s: usize) -> Result<(), SimError> {
        let Some(b) = self.broker.as_mut() else {
            return Ok(());
        };
        let sub = &mut b.subs[s];
        if sub.unpersisted.is_empty() && sub.unpersisted_cumulative.is_none() {
            return Ok(());
        }
        let md = sub.deletion.mark_delete_position();
        let ranges = sub.deletion.individually_deleted_ranges();
        match sub.cursor.mark_delete_with_ranges(md, ranges) {
            Ok(()) => {}
            Err(LedgerError::MarkDeleteBackward { .. }) => {}
            Err(e) => return Err(SimError::Component(format!("persist mark-delete: {e}"))),
        }
        let name = sub.name.clone();
        let now = self.sched.now();
        for m in std::mem::take(&mut sub.unpersisted) {
            self.checker.acked(&name, m, now);
            self.acked_at_last_check[s] += 1;
        }
        if let Some(upto) = sub.unpersisted_cumulative.take() {
            self.acked_at_last_check[s] += self.checker.cumulative_acked(&name, upto);
        }
        Ok(())
    }

    /// The client connection task: writes pending Flow requests (after its
    /// identity revalidation), then the broker reads the connection's frames.
    fn flush_flows(&mut self, s: usize, c: usize) -> Result<(), SimError> {
        let client = &self.clients[s][c];
        client.connection.flush_flows();
        let frames = client.connection.take_outbox();
        let connection_id = client.connection.id();
        let Some(b) = self.broker.as_mut() else {
            return Ok(());
        };
        let mut any = false;
        for frame in frames {
            if let ClientFrame::Flow { command, .. } = frame {
                // The client writes a real FLOW frame; the broker decodes it.
                let bytes = crate::permits::frame::encode_simple_frame(
                    &crate::permits::wire::Command::Flow(command).into_base(),
                );
                let command = match crate::permits::frame::decode_frame(
                    &bytes,
                    crate::permits::frame::DEFAULT_MAX_FRAME_SIZE,
                ) {
                    Ok(crate::permits::frame::Frame {
                        command: crate::permits::wire::Command::Flow(f),
                        ..
                    }) => f,
                    other => {
                        return Err(SimError::Component(format!(
                            "flow frame did not decode as FLOW: {other:?}"
                        )))
                    }
                };
                self.activity.flows += 1;
                let key = ConsumerKey {
                    connection_id,
                    consumer_id: command.consumer_id,
                };
                if b.subs[s].dispatcher.consumer(key).is_some() {
                    b.subs[s]
                        .dispatcher
                        .consumer_flow(key, command.message_permits)
                        .map_err(comp("flow"))?;
                    any = true;
                }
            }
        }
        if any {
            self.schedule_dispatch(s);
        }
        Ok(())
    }

    fn restart(&mut self) -> Result<(), SimError> {
        self.activity.restarts += 1;
        self.checker.restarted();
        let mut lost = Vec::new();
        if self.w.faults.lose_pending_ack_ledger && self.activity.restarts == 1 {
            // Lose the pending-ack log's ledger holding the first record the
            // next replay needs (a deleted BookKeeper ledger).
            if let Some(b) = &self.broker {
                for (s, sub) in b.subs.iter().enumerate() {
                    if let Some(c) = &sub.pending_ack_cursor {
                        let next = c.ledger().next_valid_position(c.mark_delete_position());
                        if next <= c.ledger().last_confirmed_entry() {
                            c.ledger()
                                .mark_ledger_lost(next.ledger_id)
                                .map_err(comp("lose ledger"))?;
                            self.activity.read_failures_injected += 1;
                            self.activity.pending_ack_ledgers_lost += 1;
                            lost.push(s);
                        }
                    }
                }
            }
        }
        for s in lost {
            self.pa_ledger_lost[s] = true;
        }
        self.arm_replay_read_failures();
        self.open_broker()?;
        // Every client reconnects with a new incarnation on a new connection.
        for s in 0..self.w.subscriptions as usize {
            for c in 0..self.w.consumers_per_subscription as usize {
                self.resubscribe_on_new_connection(s, c)?;
            }
        }
        Ok(())
    }

    /// Client `c` of subscription `s` drops its connection and subscribes
    /// again on a new one (a new PIP-491 incarnation); the broker registers
    /// the new consumer.
    fn resubscribe_on_new_connection(&mut self, s: usize, c: usize) -> Result<(), SimError> {
        let connection = crate::sync::Arc::new(ClientConnection::new(self.next_connection_id));
        self.next_connection_id += 1;
        let client = &mut self.clients[s][c];
        client.in_progress.clear();
        client.dispatch_seeks.clear();
        client.since_cumulative = 0;
        client.cumulative_upto = None;
        client
            .consumer
            .resubscribe(crate::sync::Arc::clone(&connection))
            .map_err(comp("resubscribe"))?;
        client.connection = connection;
        self.connect_consumer(s, c)
    }

    /// Client `c` of subscription `s` closes its consumer and subscribes
    /// again with the same id on the same connection (Pulsar's pooled
    /// connection), with Flow requests of the old incarnation still queued:
    /// the connection's revalidation must drop them. The broker removes the
    /// old consumer (its messages go back for redelivery) and adds the new.
    fn recreate_on_same_connection(&mut self, s: usize, c: usize) -> Result<(), SimError> {
        self.faults_pending = self.faults_pending.saturating_sub(1);
        if self.clients[s][c].connection.is_closed() {
            return Ok(()); // a reconnect on a new connection is on its way
        }
        self.activity.same_connection_recreations += 1;
        self.checker.consumer_reconnected(&format!("sub-{s}"), c);
        if let Some(b) = self.broker.as_mut() {
            let sub = &mut b.subs[s];
            if let Some(key) = sub.consumer_keys.remove(&c) {
                let _ = sub.dispatcher.remove_consumer(key);
                if let Some(q) = sub.blocked.remove(&c) {
                    sub.redeliver.extend(q.iter().map(|e| e.entry.position));
                }
            }
        }
        let client = &mut self.clients[s][c];
        client.in_progress.clear();
        client.dispatch_seeks.clear();
        client.since_cumulative = 0;
        client.cumulative_upto = None;
        let connection = crate::sync::Arc::clone(&client.connection);
        client
            .consumer
            .resubscribe(connection)
            .map_err(comp("resubscribe on the same connection"))?;
        self.connect_consumer(s, c)?;
        self.schedule_dispatch(s);
        Ok(())
    }

    fn reconnect(&mut self, s: usize, c: usize) -> Result<(), SimError> {
        self.activity.reconnects += 1;
        self.checker.consumer_reconnected(&format!("sub-{s}"), c);
        self.resubscribe_on_new_connection(s, c)?;
        self.schedule_dispatch(s);
        Ok(())
    }

    /// Admin seek (Pulsar's reset cursor) of subscription `s` forward to the
    /// first entry the cursor has not read (delayed messages the cursor read
    /// that still wait in the tracker are skipped too, which is what lets
    /// the tracker trim its buckets) or past its highest acknowledged range
    /// if that is higher, at most just past the last entry): the cursor and its
    /// deletion state are reset through their real reset paths (persisted),
    /// what the dispatcher held for redelivery is dropped, the delayed
    /// tracker gets the new mark-delete and trims the buckets below it, and
    /// every consumer reconnects as a new incarnation (what they had pending
    /// is not replayed: the cursor reads again from the seek). No acknowledged range
    /// lies above the new mark-delete, so nothing acknowledged becomes
    /// unacknowledged; unacknowledged messages at or below it are skipped.
    fn seek(&mut self, s: usize) -> Result<(), SimError> {
        let now = self.sched.now();
        let Some(b) = self.broker.as_mut() else {
            return Ok(());
        };
        let sub = &mut b.subs[s];
        let last_confirmed = b.ledger.last_confirmed_entry();
        if !sub.ready || last_confirmed.entry_id < 0 {
            // Not serving yet (replay) or nothing published: try again soon.
            self.sched.after(100, Ev::Seek { sub: s });
            return Ok(());
        }
        self.faults_pending = self.faults_pending.saturating_sub(1);
        // The new mark-delete: just before the first entry not yet read
        // (the read position, or an entry read but still held for
        // a consumer without permits), but never below an individually
        // deleted range (after a restart the read position starts over at
        // mark-delete + 1 while acknowledged ranges lie above it; a reset
        // clears them), at most the last entry.
        let highest_deleted = sub
            .deletion
            .individually_deleted_ranges()
            .last()
            .map(|(_, upper)| *upper);
        let first_held = sub
            .blocked
            .values()
            .flat_map(|q| q.iter().map(|e| e.entry.position))
            .min();
        let resume = sub
            .cursor
            .read_position()
            .min(first_held.unwrap_or(Position::LATEST));
        let new_mark_delete = resume
            .previous_in_ledger()
            .max(highest_deleted.unwrap_or(Position::EARLIEST))
            .min(last_confirmed);
        let target = Position::new(new_mark_delete.ledger_id, new_mark_delete.entry_id + 1);
        sub.cursor
            .reset(target)
            .map_err(comp("seek: reset cursor"))?;
        let mark_delete = sub
            .deletion
            .reset(target, b.ledger.as_ref())
            .map_err(comp("seek: reset deletion state"))?;
        sub.blocked.clear();
        sub.redeliver.clear();
        let active_before = sub.failover_order.first().copied();
        sub.failover_order.clear();
        if let Some(t) = &sub.delayed {
            if self.opts.sabotage == Some(Sabotage::DeliverOneTrimmedMessage) && !self.sabotage_done
            {
                self.sabotage_seek = Some((s, mark_delete));
            } else {
                t.update_mark_delete(mark_delete);
                self.delayed_truth[s].mark_delete(mark_delete);
                t.trim_and_merge().map_err(comp("seek: trim"))?;
            }
        }
        tracing::debug!(sub = %sub.name, %mark_delete, "admin seek");
        let name = sub.name.clone();
        self.activity.seeks += 1;
        self.seeks_done[s] = self.checker.seek_completed(&name, mark_delete, now);
        for c in 0..self.w.consumers_per_subscription as usize {
            self.resubscribe_on_new_connection(s, c)?;
        }
        if let Some(b) = self.broker.as_ref() {
            let active_after = b.subs[s].failover_order.first().copied();
            if active_before.is_some() && active_after != active_before {
                self.activity.active_consumer_changes += 1;
            }
        }
        // As Pulsar's reset clears the dispatcher's redelivery set: what the
        // removed consumers had pending is at or below the new mark-delete
        // (skipped) or above it (the cursor reads it again from there).
        if let Some(b) = self.broker.as_mut() {
            b.subs[s].dispatcher.take_replay();
        }
        self.schedule_dispatch(s);
        Ok(())
    }

    /// At a restart (the first `faults.replay_read_failures` ones), each
    /// subscription's replay gets one read failure on a read after its
    /// first (so entries were read ahead and not yet applied), of a class
    /// picked from every class Pulsar's classification distinguishes; a
    /// fence or a closed cursor then persists until the replay completes.
    fn arm_replay_read_failures(&mut self) {
        if !self.opts.faults
            || self.w.txn_ack_ratio == 0.0
            || self.activity.restarts > u64::from(self.w.faults.replay_read_failures)
        {
            return;
        }
        for s in 0..self.w.subscriptions as usize {
            // Half transient (the attempt fails, rewinds and retries),
            // half one of the four other classes.
            let kind = if self.rng.random_bool(0.5) {
                REPLAY_FAILURE_KINDS[self.rng.random_range(0..2)]
            } else {
                REPLAY_FAILURE_KINDS[self.rng.random_range(2..REPLAY_FAILURE_KINDS.len())]
            };
            let nth = self.rng.random_range(2..=3u64);
            let mut plan = self.replay_plans[s]
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let at = plan.reads + nth;
            if matches!(
                kind,
                ReadFailureKind::Fenced | ReadFailureKind::CursorAlreadyClosed
            ) {
                plan.persistent = Some((at, kind));
                plan.fail_at = None;
            } else {
                plan.fail_at = Some((at, kind));
                plan.persistent = None;
            }
        }
    }

    /// A pending-ack replay must complete within the replay bound of the
    /// broker's start (or the end of the last outage).
    fn check_replay_bound(&mut self) {
        let now = self.sched.now();
        for s in 0..self.w.subscriptions as usize {
            let Some(since) = self.pa_not_ready_since[s] else {
                continue;
            };
            if self.replay_bound_reported[s] || now.saturating_sub(since) <= REPLAY_BOUND_MS {
                continue;
            }
            if self.outage.load(Ordering::Relaxed)
                || self.operator_reload_planned && self.activity.operator_reloads == 0
            {
                continue;
            }
            self.replay_bound_reported[s] = true;
            let attempts = self
                .broker
                .as_ref()
                .and_then(|b| b.subs[s].pending_ack.as_ref())
                .map_or(0, |h| h.stats().attempts);
            self.checker.replay_violation(
                &format!("sub-{s}"),
                &format!(
                    "not complete {}ms after the broker started it ({attempts} attempts; bound {REPLAY_BOUND_MS}ms)",
                    now - since
                ),
                now,
            );
        }
    }

    /// The delayed tracker of subscription `s` must report the count of
    /// what it holds (see [`DelayedTruth`]); reported once per lifetime.
    fn check_tracker_count(&mut self, s: usize) {
        let Some(t) = self
            .broker
            .as_ref()
            .and_then(|b| b.subs[s].delayed.as_ref())
        else {
            return;
        };
        let n = t.number_of_delayed_messages();
        let truth = &mut self.delayed_truth[s];
        if n != truth.len() && !truth.mismatch_reported {
            truth.mismatch_reported = true;
            let want = truth.len();
            self.checker.tracker_violation(
                &format!("sub-{s}"),
                &format!("reports {n} delayed messages, holds {want} (accepted, not yet scheduled, above the mark-delete)"),
                self.sched.now(),
            );
        }
    }

    /// A delayed message the tracker still holds past its delivery time plus
    /// the late bound is late (reported once).
    fn check_overdue(&mut self, s: usize) {
        let now = self.sched.now();
        let bound = self.checker.late_bound();
        let truth = &mut self.delayed_truth[s];
        if bound == 0 || truth.overdue_reported {
            return;
        }
        if let Some((due, p)) = truth.first_due() {
            if now > due + bound {
                truth.overdue_reported = true;
                self.checker.late(
                    &format!("sub-{s}"),
                    &format!("{p} due at {due}ms is still held by the tracker at {now}ms (bound {bound}ms)"),
                    now,
                );
            }
        }
    }

    fn stall_check_interval(&self) -> VirtualMs {
        (self.w.stall_bound_ms / 4).max(1)
    }

    /// A consumer stalls when it has backlog (entries routed to it and held,
    /// or — Shared — anything left to read or redeliver) and free receiver
    /// queue, yet receives nothing for longer than the stall bound. Sampled
    /// every quarter bound; injected outages and replays in progress are not
    /// stalls.
    fn stall_check(&mut self) {
        let now = self.sched.now();
        let Some(b) = self.broker.as_ref() else {
            return;
        };
        if self.outage.load(Ordering::Relaxed) {
            return; // reads fail by design during an injected outage
        }
        let mut stalled = Vec::new();
        for (s, sub) in b.subs.iter().enumerate() {
            let backlog = sub.cursor.has_more_entries() || !sub.redeliver.is_empty();
            let shared_backlog = self.w.subscription_type == SubscriptionType::Shared && backlog;
            // Failover: only the active consumer is ever given anything.
            let active = (self.w.subscription_type == SubscriptionType::Failover)
                .then(|| {
                    sub.failover_order
                        .iter()
                        .copied()
                        .find(|c| sub.consumer_keys.contains_key(c))
                })
                .flatten();
            for (c, client) in self.clients[s].iter_mut().enumerate() {
                let held = sub.blocked.get(&c).is_some_and(|q| !q.is_empty())
                    || (backlog && active == Some(c));
                let free_queue = client.consumer.queued() < self.w.receiver_queue_size as usize;
                if !sub.ready || !free_queue || !(held || shared_backlog) {
                    client.stall_since = None;
                    continue;
                }
                let since = *client.stall_since.get_or_insert(now);
                let idle = now.saturating_sub(since.max(client.last_delivery_ms));
                if idle > self.w.stall_bound_ms {
                    stalled.push((s, c, idle));
                    client.stall_since = Some(now); // report each episode once
                }
            }
        }
        for (s, c, idle) in stalled {
            self.checker
                .stalled(&format!("sub-{s}"), &format!("consumer-{c}"), idle, now);
        }
    }
}
