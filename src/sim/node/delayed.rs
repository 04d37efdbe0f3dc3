//! Bucket delayed delivery on the node engine: the core's trackers with the
//! workload's bucket settings, their snapshot storage seen and broken from
//! outside, the tracker's truth checks, and the delayed-delivery faults.
//!
//! - **storage** ([`SnapshotStorageHook`]): every subscription's snapshots
//!   go through [`NodeSnapshotStorage`]: seeded create / delete failures
//!   (`faults.snapshot_create_failure_ratio`, `…_delete_failure_ratio`,
//!   and one later bucket's snapshot undeletable during a clear-backlog,
//!   `faults.clear_delete_failure_ratio`) in front of the
//!   [`ObservedStorage`] that logs every committed create and delete for
//!   the truth (a failed call wrote nothing and is not logged).
//! - **truth** ([`DelayedObserver`]): every call the core makes into a
//!   tracker is mirrored into the subscription's [`DelayedTruth`] right
//!   after it returns:
//!   the count must match, every scheduled position must be held, merges
//!   must persist exactly what is held, a recovery must restore every
//!   held, sealed, not yet due index, and the structural invariants
//!   (`verify_invariants`) must hold after every call that did bucket work
//!   and right after a clear. A held message overdue by the late bound is
//!   late. Violations go to the checker at the end of the core's turn.
//! - **faults**: clock jumps (the core's clock steps forward), consumer-set
//!   rewinds (every consumer of a subscription disconnects; the first back
//!   finds the dispatcher empty and the core rewinds the cursor, Pulsar's
//!   `addConsumer`), admin clear-backlogs ([`Broker::clear_backlog`]) and
//!   duplicate Subscribes (the same SUBSCRIBE again on the same connection).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::broker::{Broker, BrokerConfig, DelayedObserver, SnapshotStorageHook, TrackerCall};
use crate::delayed::{
    BucketDelayedDeliveryTracker, BucketSnapshotStorage, BucketTrackerConfig, DelayedError,
    RecoveryPolicy, RedbSnapshotStorage, SnapshotMetadata, SnapshotSegment, TrackerStats,
};
use crate::position::Position;
use crate::sim::delayed_storage::ObservedStorage;
use crate::sim::delayed_truth::DelayedTruth;
use crate::sync::{AtomicI64, AtomicU64, Ordering};

use super::super::report::Activity;
use super::super::workload::Workload;
use super::{ClientRef, Ev, Node, EPOCH_BASE_MS, TOPIC};

/// "No snapshot" (ids are non-negative).
const NO_SNAPSHOT: i64 = -1;

/// The seeded snapshot faults of one subscription.
#[derive(Debug)]
pub(super) struct SnapshotFaults {
    rng: Mutex<ChaCha8Rng>,
    create_ratio: f64,
    delete_ratio: f64,
    /// A snapshot every delete of which fails (a clear-backlog's).
    failing: AtomicI64,
    injected: AtomicU64,
}

impl SnapshotFaults {
    fn draw(&self, ratio: f64) -> bool {
        ratio > 0.0
            && self
                .rng
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .random_bool(ratio.clamp(0.0, 1.0))
    }

    fn inject<T>(&self, op: &'static str) -> Result<T, DelayedError> {
        self.injected.fetch_add(1, Ordering::Relaxed);
        Err(DelayedError::storage(op, "injected fault"))
    }
}

/// The storage of a subscription's bucket snapshots on the node engine:
/// faults in front, the observed redb storage behind.
#[derive(Debug)]
pub(super) struct NodeSnapshotStorage {
    inner: ObservedStorage<RedbSnapshotStorage>,
    faults: Arc<SnapshotFaults>,
}

impl BucketSnapshotStorage for NodeSnapshotStorage {
    fn create(
        &self,
        metadata: &SnapshotMetadata,
        segments: &[SnapshotSegment],
        bucket_key: &str,
        replaces: &[(i64, String)],
    ) -> Result<i64, DelayedError> {
        if self.faults.draw(self.faults.create_ratio) {
            return self.faults.inject("create");
        }
        self.inner.create(metadata, segments, bucket_key, replaces)
    }

    fn get_metadata(&self, snapshot_id: i64) -> Result<SnapshotMetadata, DelayedError> {
        self.inner.get_metadata(snapshot_id)
    }

    fn get_segments(
        &self,
        snapshot_id: i64,
        first: u64,
        last: u64,
    ) -> Result<Vec<SnapshotSegment>, DelayedError> {
        self.inner.get_segments(snapshot_id, first, last)
    }

    fn length(&self, snapshot_id: i64) -> Result<u64, DelayedError> {
        self.inner.length(snapshot_id)
    }

    fn delete(&self, snapshot_id: i64, bucket_key: &str) -> Result<(), DelayedError> {
        if self.faults.failing.load(Ordering::Relaxed) == snapshot_id
            || self.faults.draw(self.faults.delete_ratio)
        {
            return self.faults.inject("delete");
        }
        self.inner.delete(snapshot_id, bucket_key)
    }

    fn bucket_keys(&self) -> Result<Vec<(String, i64)>, DelayedError> {
        self.inner.bucket_keys()
    }
}

/// What the observer and the storage hook share with the driver.
#[derive(Debug, Default)]
struct Shared {
    truths: BTreeMap<String, DelayedTruth>,
    faults: BTreeMap<String, Arc<SnapshotFaults>>,
    /// (subscription, what, late?) for the checker.
    violations: Vec<(String, String, bool)>,
    /// Trackers opened per subscription (a second one is a recovery).
    opened: BTreeMap<String, u64>,
    recoveries: u64,
    clear_failures: u64,
    /// The core's clock at the current call (set by the driver).
    core_now: u64,
    /// The core commits each turn with one barrier
    /// ([`BrokerConfig::turn_commit`]): a snapshot change is durable only
    /// once the driver reports the turn's barrier
    /// ([`DelayedSide::turn_durable`]).
    turn_commit: bool,
}

impl Shared {
    /// The truth of subscription `sub` (made on first use).
    fn truth(&mut self, sub: &str) -> &mut DelayedTruth {
        let deferred = self.turn_commit;
        self.truths.entry(sub.to_string()).or_insert_with(|| {
            let mut t = DelayedTruth::default();
            if deferred {
                t.defer_durability_to_barriers();
            }
            t
        })
    }
}

/// The node engine's delayed-delivery side.
#[derive(Debug, Default)]
pub(super) struct DelayedSide {
    shared: Arc<Mutex<Shared>>,
    /// The core's clock is ahead of the virtual time by this much (jumps).
    pub(super) clock_offset_ms: u64,
    /// Per subscription: for each clear-backlog, the first connection id
    /// opened after it (every consumer connection of the subscription was
    /// closed before it).
    clears: BTreeMap<usize, Vec<u64>>,
    /// Per subscription: the mark-delete of its last clear-backlog.
    cleared_to: BTreeMap<usize, Position>,
    /// Tracker work of the cores dropped so far.
    stats: TrackerStats,
    seed: u64,
}

fn lock(s: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

/// The workload's bucket tracker settings.
pub(super) fn tracker_config(w: &Workload) -> BucketTrackerConfig {
    BucketTrackerConfig {
        tick_time_ms: w.delayed_tick_ms,
        min_index_count_per_bucket: w.delayed_min_index_count_per_bucket,
        max_num_buckets: w.delayed_max_num_buckets,
        max_time_step_per_bucket_snapshot_segment_ms: 5_000,
        max_indexes_per_bucket_snapshot_segment: 100,
        recovery_policy: RecoveryPolicy::SkipCorrupt,
        deliver_at_time_strict: true,
    }
}

/// The checks after one tracker call (see the module doc).
fn observe(
    sh: &mut Shared,
    sub: &str,
    call: TrackerCall<'_>,
    t: &BucketDelayedDeliveryTracker,
    tick_ms: u64,
) {
    sh.truth(sub);
    let Shared {
        truths,
        violations,
        opened,
        recoveries,
        clear_failures,
        core_now,
        ..
    } = sh;
    let truth = truths.get_mut(sub).expect("made above");
    let mut report = |what: String| violations.push((sub.to_string(), what, false));
    match call {
        TrackerCall::Opened { mark_delete } => {
            let n = opened.entry(sub.to_string()).or_insert(0);
            *n += 1;
            if *n > 1 {
                *recoveries += 1;
            }
            truth.mark_delete(mark_delete);
            let cutoff = *core_now + tick_ms;
            if let Some(what) =
                truth.check_recovery(cutoff, |p| t.contains_message(p.ledger_id, p.entry_id))
            {
                report(what);
            }
            let held: Vec<(Position, u64)> = truth
                .ever_added()
                .filter(|(p, _)| t.contains_message(p.ledger_id, p.entry_id))
                .collect();
            truth.resync(held);
        }
        TrackerCall::Added {
            position,
            deliver_at,
            result,
        } => {
            for what in truth.apply_snapshot_events() {
                report(what);
            }
            match result {
                Some(true) => truth.accepted(position, deliver_at),
                Some(false) => truth.declined(position),
                None => {}
            }
        }
        TrackerCall::Scheduled(ps) => {
            for what in truth.apply_snapshot_events() {
                report(what);
            }
            for p in ps {
                if !truth.scheduled(*p) {
                    report(format!(
                        "scheduled {p}, which it does not hold (scheduled before, or never added)"
                    ));
                }
            }
        }
        TrackerCall::MarkDelete(md) => {
            for what in truth.apply_snapshot_events() {
                report(what);
            }
            truth.mark_delete(md);
        }
        TrackerCall::Cleared { ok } => {
            for what in truth.apply_snapshot_events() {
                report(what);
            }
            if !ok {
                *clear_failures += 1;
            }
            // Right after `clear` returns, before any other call: a clear
            // that removed buckets one at a time must leave the counter
            // equal to the runtime index (`CounterEqualsCardinality`).
            if let Err(e) = t.verify_invariants() {
                if !truth.invariant_reported {
                    truth.invariant_reported = true;
                    let after = if ok { "clear" } else { "a failed clear" };
                    report(format!("invariant violated after {after}: {e}"));
                }
            }
            truth.checked_stats = Some(t.stats());
            // A clear drops everything; a failed one keeps the buckets it
            // could not delete (until the mark-delete that follows): the
            // truth holds what the tracker still does.
            let held: Vec<(Position, u64)> = if ok {
                Vec::new()
            } else {
                truth
                    .ever_added()
                    .filter(|(p, _)| t.contains_message(p.ledger_id, p.entry_id))
                    .collect()
            };
            let reported = truth.invariant_reported;
            truth.resync(held);
            truth.invariant_reported = reported;
            truth.checked_stats = Some(t.stats());
        }
    }
    let stats = t.stats();
    if truth.checked_stats != Some(stats) {
        truth.checked_stats = Some(stats);
        if let Err(e) = t.verify_invariants() {
            if !truth.invariant_reported {
                truth.invariant_reported = true;
                report(format!("invariant violated: {e}"));
            }
        }
    }
    let n = t.number_of_delayed_messages();
    if n != truth.len() && !truth.mismatch_reported {
        truth.mismatch_reported = true;
        let want = truth.len();
        report(format!("count mismatch: reports {n} delayed messages, holds {want} (accepted, not yet scheduled, above the mark-delete)"));
    }
}

impl DelayedSide {
    /// The hooks of a new core: the workload's tracker settings, the
    /// observed and faulty snapshot storage, the truth's observer.
    pub(super) fn configure(&mut self, w: &Workload, faults_on: bool, config: &mut BrokerConfig) {
        config.delayed = tracker_config(w);
        lock(&self.shared).turn_commit = config.turn_commit;
        let topic = crate::broker::normalize_topic(TOPIC).unwrap_or_else(|_| TOPIC.to_string());
        let (create_ratio, delete_ratio) = if faults_on {
            (
                w.faults.snapshot_create_failure_ratio,
                w.faults.snapshot_delete_failure_ratio,
            )
        } else {
            (0.0, 0.0)
        };
        self.seed = self.seed.wrapping_add(1);
        let base_seed = self.seed;
        let shared = Arc::clone(&self.shared);
        let storage_topic = topic.clone();
        config.snapshot_storage = Some(SnapshotStorageHook::new(move |t, sub, redb| {
            if t != storage_topic {
                return Arc::new(redb) as Arc<dyn BucketSnapshotStorage>;
            }
            let mut sh = lock(&shared);
            let log = sh.truth(sub).snapshot_log();
            let faults = Arc::clone(sh.faults.entry(sub.to_string()).or_insert_with(|| {
                let mut s = 0u64;
                for b in sub.bytes() {
                    s = s.wrapping_mul(31).wrapping_add(u64::from(b));
                }
                Arc::new(SnapshotFaults {
                    rng: Mutex::new(ChaCha8Rng::seed_from_u64(base_seed ^ s)),
                    create_ratio,
                    delete_ratio,
                    failing: AtomicI64::new(NO_SNAPSHOT),
                    injected: AtomicU64::new(0),
                })
            }));
            Arc::new(NodeSnapshotStorage {
                inner: ObservedStorage::new(redb, log),
                faults,
            })
        }));
        let shared = Arc::clone(&self.shared);
        let tick = w.delayed_tick_ms;
        config.delayed_observer = Some(DelayedObserver::new(move |t, sub, call, tracker| {
            if t != topic {
                return;
            }
            observe(&mut lock(&shared), sub, call, tracker, tick);
        }));
    }

    /// Records the core's clock (epoch ms) before a call into the core.
    pub(super) fn set_core_now(&self, now_ms: u64) {
        lock(&self.shared).core_now = now_ms;
    }

    /// The core's turn barrier returned `Ok` (or the core closed cleanly):
    /// every snapshot change so far is durable, a later crash keeps it.
    pub(super) fn turn_durable(&self) {
        let mut sh = lock(&self.shared);
        let Shared {
            truths, violations, ..
        } = &mut *sh;
        for (sub, truth) in truths.iter_mut() {
            for what in truth.turn_durable() {
                violations.push((sub.clone(), what, false));
            }
        }
    }

    /// The core died at a crash point: the snapshot changes since the last
    /// durable barrier are lost with it.
    pub(super) fn crashed(&self) {
        for truth in lock(&self.shared).truths.values_mut() {
            truth.crashed();
        }
    }

    /// Violations found since the last call: (subscription, what, late?).
    pub(super) fn take_violations(&self) -> Vec<(String, String, bool)> {
        std::mem::take(&mut lock(&self.shared).violations)
    }

    /// A message the trackers still hold past its delivery time plus
    /// `bound` (reported once per subscription): (subscription, what).
    pub(super) fn overdue(&self, core_now: u64, bound: u64) -> Vec<(String, String)> {
        let mut sh = lock(&self.shared);
        let mut v = Vec::new();
        if bound == 0 {
            return v;
        }
        for (sub, truth) in sh.truths.iter_mut() {
            if truth.overdue_reported {
                continue;
            }
            if let Some((due, p)) = truth.first_due() {
                if core_now > due + bound {
                    truth.overdue_reported = true;
                    v.push((
                        sub.clone(),
                        format!("{p} due at {due}ms is still held by the tracker at {core_now}ms (bound {bound}ms)"),
                    ));
                }
            }
        }
        v
    }

    /// Adds the trackers' work of the core about to be dropped.
    pub(super) fn collect(&mut self, b: &Broker) {
        let topic = crate::broker::normalize_topic(TOPIC).unwrap_or_else(|_| TOPIC.to_string());
        if let Some(t) = b.topics().get(&topic) {
            for s in t.subscriptions.values() {
                let st = s.tracker().stats();
                self.stats.seals += st.seals;
                self.stats.merges += st.merges;
                self.stats.trimmed_buckets += st.trimmed_buckets;
            }
        }
    }

    /// Copies the run's delayed-delivery work into the report's activity.
    pub(super) fn add_to_activity(&self, a: &mut Activity) {
        let sh = lock(&self.shared);
        a.bucket_seals += self.stats.seals;
        a.bucket_merges += self.stats.merges;
        a.bucket_trims += self.stats.trimmed_buckets;
        a.delayed_recoveries += sh.recoveries;
        a.delayed_clear_failures += sh.clear_failures;
        a.snapshot_failures_injected += sh
            .faults
            .values()
            .map(|f| f.injected.load(Ordering::Relaxed))
            .sum::<u64>();
    }

    /// Clear-backlogs done on subscription `sub` before connection `conn`
    /// was opened (the checker's "dispatched after a seek" count).
    pub(super) fn clears_before(&self, sub: usize, conn: Option<u64>) -> u32 {
        let Some(conn) = conn else { return 0 };
        self.clears.get(&sub).map_or(0, |v| {
            v.iter().filter(|first| conn >= **first).count() as u32
        })
    }
}

impl Node<'_> {
    /// The core's clock now (epoch ms): virtual time plus the clock jumps.
    pub(super) fn core_now(&self) -> u64 {
        EPOCH_BASE_MS + self.now() + self.delayed.clock_offset_ms
    }

    /// Hands the trackers' truth violations to the checker.
    pub(super) fn drain_delayed_violations(&mut self) {
        let now = self.now();
        for (sub, what, late) in self.delayed.take_violations() {
            if late {
                self.checker.late(&sub, &what, now);
            } else {
                self.checker.tracker_violation(&sub, &what, now);
            }
        }
    }

    /// Late check of what the trackers hold.
    pub(super) fn check_delayed_overdue(&mut self) {
        if self.w.delayed_ratio <= 0.0 {
            return;
        }
        let bound = self.checker.late_bound();
        let now = self.now();
        for (sub, what) in self.delayed.overdue(self.core_now(), bound) {
            self.checker.late(&sub, &what, now);
        }
    }

    /// Plans the clock jumps, rewinds and clear-backlogs over the publish
    /// `window` (rewind `i` right after clock jump
    /// `i`, at the same instant; clear-backlog `i` at (8i + 7) / 8n of the
    /// window) and the duplicate Subscribes at seeded times.
    pub(super) fn plan_delayed_faults(&mut self, window: u64) -> Vec<(u64, super::faults::Fault)> {
        use super::faults::Fault;
        let f = &self.w.faults;
        let subs = self.w.subscriptions as usize;
        let spread = |i: u32, n: u32| {
            (u128::from(window) * (2 * u128::from(i) + 1) / (2 * u128::from(n.max(1)))) as u64
        };
        let mut v = Vec::new();
        let jumps_and_rewinds = f.clock_jumps.max(f.rewinds);
        for i in 0..jumps_and_rewinds {
            let at = spread(i, jumps_and_rewinds).saturating_sub(100).max(1);
            if i < f.clock_jumps {
                v.push((at, Fault::ClockJump));
            }
            if i < f.rewinds {
                v.push((at, Fault::Rewind(i as usize % subs)));
            }
        }
        for i in 0..f.clear_backlogs {
            let at = (u128::from(window) * (8 * u128::from(i) + 7)
                / (8 * u128::from(f.clear_backlogs))) as u64;
            v.push((at, Fault::ClearBacklog(i as usize % subs)));
        }
        let consumers = self.consumers.len();
        for _ in 0..f.duplicate_subscribes {
            let c = self.rng.random_range(0..consumers);
            let at = self.rng.random_range(50..=window + 50);
            v.push((at, Fault::DuplicateSubscribe(c)));
        }
        v
    }

    /// The core's clock steps `faults.clock_jump_ms` forward; the checker
    /// allows deliveries that much earlier by the producers' clock.
    pub(super) fn clock_jump(&mut self) {
        let ms = self.w.faults.clock_jump_ms;
        self.delayed.clock_offset_ms += ms;
        self.checker.allow_early(ms);
        self.activity.clock_jumps += 1;
        // Transactions whose ttl the core's clock now passes may time out.
        let core_now = self.now() + self.delayed.clock_offset_ms;
        self.txn_clock_jumped(core_now);
        // The core sees the new time with its next input (its timer,
        // rescheduled by the next turn, is due at once): a rewind planned
        // at the same instant disconnects the consumers first, so the
        // rewound read meets messages the jump made due while the tracker
        // still holds them (expired re-adds).
    }

    /// Closes every consumer connection of subscription `s` (each consumer
    /// reconnects after its backoff as a new incarnation).
    fn disconnect_subscription(&mut self, s: usize) {
        let cs: Vec<(usize, u64)> = self
            .consumers
            .iter()
            .enumerate()
            .filter(|(_, co)| co.sub == s)
            .filter_map(|(i, co)| co.conn.map(|conn| (i, conn)))
            .collect();
        for (c, conn) in cs {
            self.close_conn(conn);
            self.connection_lost(conn, ClientRef::Consumer(c), false);
        }
    }

    /// Whether every consumer of subscription `s` is subscribed.
    fn subscription_ready(&self, s: usize) -> bool {
        self.broker.is_some()
            && self
                .consumers
                .iter()
                .filter(|co| co.sub == s)
                .all(|co| co.ready())
    }

    /// A consumer-set rewind of subscription `s`: every consumer
    /// disconnects; the first to subscribe again finds no consumer and the
    /// core rewinds the cursor to the mark-delete. `false`: not now (try
    /// again later).
    pub(super) fn rewind(&mut self, s: usize) -> bool {
        if !self.subscription_ready(s) {
            return false;
        }
        self.activity.rewinds += 1;
        self.disconnect_subscription(s);
        true
    }

    /// An admin clear-backlog of subscription `s`: its consumers
    /// disconnect first (what they hold is at or below the new
    /// mark-delete), then [`Broker::clear_backlog`]; with
    /// `faults.clear_delete_failure_ratio`, the snapshot of one of the
    /// tracker's later buckets cannot be deleted during it. `false`: not
    /// now (try again later).
    pub(super) fn clear_backlog(&mut self, s: usize) -> bool {
        if !self.subscription_ready(s) {
            return false;
        }
        let sub = self.subs[s].clone();
        let topic = crate::broker::normalize_topic(TOPIC).unwrap_or_else(|_| TOPIC.to_string());
        let buckets: Vec<i64> = self
            .broker
            .as_ref()
            .and_then(|b| b.topics().get(&topic))
            .and_then(|t| t.subscriptions.get(&sub))
            .map(|x| x.tracker().buckets().iter().map(|b| b.1).collect())
            .unwrap_or_default();
        let ratio = self.w.faults.clear_delete_failure_ratio;
        let failing = (self.opts.faults
            && ratio > 0.0
            && buckets.len() >= 2
            && self.rng.random_bool(ratio.clamp(0.0, 1.0)))
        .then(|| buckets[self.rng.random_range(1..buckets.len())]);
        self.disconnect_subscription(s);
        let faults = lock(&self.delayed.shared).faults.get(&sub).cloned();
        if let (Some(f), Some(id)) = (&faults, failing) {
            f.failing.store(id, Ordering::Relaxed);
        }
        let mut done = None;
        self.with_broker(|b, now| done = Some(b.clear_backlog(TOPIC, &sub, now)));
        if let Some(f) = &faults {
            f.failing.store(NO_SNAPSHOT, Ordering::Relaxed);
        }
        match done {
            Some(Ok(d)) => {
                self.activity.clear_backlogs += 1;
                self.delayed
                    .clears
                    .entry(s)
                    .or_default()
                    .push(self.next_conn);
                self.delayed.cleared_to.insert(s, d.mark_delete);
                self.checker.seek_completed(&sub, d.mark_delete, self.now());
                self.checker.skip_at_or_below(&sub, d.mark_delete);
            }
            Some(Err(e)) => {
                tracing::debug!(subscription = %sub, error = %e, "clear-backlog refused");
            }
            None => {} // the core died (crash point) before or during it
        }
        true
    }

    /// `msgs` were registered as published (a receipt, or a lost
    /// receipt's copy delivered): what a clear-backlog before covered was
    /// skipped by it.
    pub(super) fn published_after_clears(&mut self, msgs: &[crate::sim::checker::MessageRef]) {
        let cleared: Vec<(usize, Position)> = self
            .delayed
            .cleared_to
            .iter()
            .map(|(s, md)| (*s, *md))
            .collect();
        for (s, md) in cleared {
            for m in msgs {
                self.checker.published_below_seek(&self.subs[s], *m, md);
            }
        }
    }

    /// A duplicate Subscribe: consumer `c` sends its SUBSCRIBE again on the
    /// same connection with the same consumer id (a client retrying a
    /// Subscribe whose response it did not see); the core answers Success
    /// and keeps the one consumer. `false`: not now.
    pub(super) fn duplicate_subscribe(&mut self, c: usize) -> bool {
        if !self.consumers[c].ready() || self.broker.is_none() {
            return false;
        }
        let Some(bytes) = self.subscribe_again_frame(c) else {
            return false;
        };
        let Some(conn) = self.consumers[c].conn else {
            return false;
        };
        self.activity.duplicate_subscribes += 1;
        self.send_to_broker(conn, bytes);
        true
    }
}

/// Schedules a fault again later when it could not run now.
pub(super) fn retry_later(n: &mut Node<'_>, f: super::faults::Fault) {
    n.sched.after(100, Ev::Fault(f));
}
