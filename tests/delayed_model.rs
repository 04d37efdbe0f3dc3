//! proptest model test of the bucket delayed delivery tracker (`BucketDelayedDeliveryTracker`)
//! against a reference model: a `BTreeMap<Position, deliver_at>` of pending
//! delayed messages.
//!
//! Random sequences of add / advance clock / get / ack (mark-delete) / force
//! merge / crash + recover (with the dispatcher's re-read) / storage faults /
//! admin seek forward or back (clear, update_mark_delete or
//! reset_mark_delete, then the dispatcher's re-read).
//! Checked after every step:
//! * nothing is delivered twice within one lifetime (between crashes);
//! * every delivered position was pending and due (never early);
//! * nothing due is lost: a `get` that returns fewer than asked (and hit no
//!   injected fault) leaves no due pending message behind;
//! * the tracker's count equals the model's pending count and the internal
//!   invariants hold;
//! * at the end, with faults disarmed, draining delivers exactly the pending
//!   set.
#![cfg(not(any(loom, feature = "shuttle")))]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use proptest::prelude::*;
use pulsar_core::delayed::{
    BucketDelayedDeliveryTracker, BucketTrackerConfig, FaultPlan, FaultyStorage,
    MemorySnapshotStorage, RecoveryPolicy, VirtualClock,
};
use pulsar_core::Position;

const TICK: u64 = 5;

#[derive(Debug, Clone)]
enum Op {
    /// Add the next message (in a new ledger if `new_ledger`), due in `delay` ms.
    Add { new_ledger: bool, delay: u64 },
    /// Advance the clock.
    Advance(u64),
    /// get_scheduled_messages(max).
    Get(usize),
    /// Advance mark-delete over the delivered prefix.
    Ack,
    /// trim + merge now.
    ForceMerge,
    /// Drop the tracker and recover from storage, then re-read.
    CrashRecover,
    /// Arm storage faults.
    Fault { create: u32, read: u32, delete: u32 },
    /// Reset the subscription (admin seek) to the `pick`-th added position
    /// as its mark-delete, forward (skipping undelivered messages) or back:
    /// through `clear()` then `update_mark_delete`, or without a clear
    /// through `update_mark_delete` (forward) / `reset_mark_delete` (back);
    /// then the dispatcher re-reads every message above it not tracked.
    Seek { pick: usize, clear: bool },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (any::<bool>(), 1u64..80).prop_map(|(new_ledger, delay)| Op::Add { new_ledger, delay }),
        2 => (1u64..30).prop_map(Op::Advance),
        3 => (1usize..8).prop_map(Op::Get),
        1 => Just(Op::Ack),
        1 => Just(Op::ForceMerge),
        1 => Just(Op::CrashRecover),
        1 => (0u32..6, 0u32..3, 0u32..6).prop_map(|(create, read, delete)| Op::Fault { create, read, delete }),
        1 => (any::<usize>(), any::<bool>()).prop_map(|(pick, clear)| Op::Seek { pick, clear }),
    ]
}

fn config(max_num_buckets: i64) -> BucketTrackerConfig {
    BucketTrackerConfig {
        tick_time_ms: TICK,
        deliver_at_time_strict: false,
        min_index_count_per_bucket: 3,
        max_time_step_per_bucket_snapshot_segment_ms: 10,
        max_indexes_per_bucket_snapshot_segment: 2,
        max_num_buckets,
        recovery_policy: RecoveryPolicy::Fail,
    }
}

struct Harness {
    clock: Arc<VirtualClock>,
    storage: Arc<FaultyStorage<Arc<MemorySnapshotStorage>>>,
    tracker: BucketDelayedDeliveryTracker,
    config: BucketTrackerConfig,
    /// Every message ever added: position → deliver_at.
    all: BTreeMap<Position, u64>,
    /// The model: tracked (pending delayed) messages.
    pending: BTreeMap<Position, u64>,
    /// Delivered in this lifetime.
    delivered: BTreeSet<Position>,
    /// Delivered in any lifetime (may be acknowledged).
    ever_delivered: BTreeSet<Position>,
    mark_delete: Option<Position>,
    ledger: i64,
    entry: i64,
}

impl Harness {
    fn new(max_num_buckets: i64) -> Self {
        let clock = Arc::new(VirtualClock::new(1000));
        let storage = Arc::new(FaultyStorage::new(Arc::new(MemorySnapshotStorage::new())));
        let config = config(max_num_buckets);
        let tracker =
            BucketDelayedDeliveryTracker::new(config.clone(), storage.clone(), clock.clone())
                .expect("empty storage recovers");
        Self {
            clock,
            storage,
            tracker,
            config,
            all: BTreeMap::new(),
            pending: BTreeMap::new(),
            delivered: BTreeSet::new(),
            ever_delivered: BTreeSet::new(),
            mark_delete: None,
            ledger: 1,
            entry: 0,
        }
    }

    fn cutoff(&self) -> u64 {
        use pulsar_core::delayed::Clock;
        self.clock.now_ms() + TICK
    }

    fn deliver(&mut self, p: Position) {
        assert!(
            self.delivered.insert(p),
            "{p} delivered twice in one lifetime"
        );
        self.ever_delivered.insert(p);
        self.pending.remove(&p);
    }

    /// The dispatcher hands a message to the tracker (first read or re-read).
    fn offer(&mut self, p: Position, at: u64) {
        let tracked = self
            .tracker
            .add_message(p.ledger_id, p.entry_id, at as i64)
            .expect("valid position");
        if tracked {
            self.pending.insert(p, at);
        } else {
            assert!(at <= self.cutoff(), "{p} at {at} refused but not due");
            self.deliver(p);
        }
    }

    fn check(&self) {
        self.tracker
            .verify_invariants()
            .expect("tracker invariants");
        assert_eq!(
            self.tracker.number_of_delayed_messages(),
            self.pending.len() as u64,
            "count differs from the model"
        );
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Add { new_ledger, delay } => {
                if new_ledger {
                    self.ledger += 1;
                    self.entry = 0;
                }
                let p = Position::new(self.ledger, self.entry);
                self.entry += 1;
                use pulsar_core::delayed::Clock;
                let at = self.clock.now_ms() + delay;
                self.all.insert(p, at);
                self.offer(p, at);
            }
            Op::Advance(ms) => {
                self.clock.advance(ms);
            }
            Op::Get(max) => {
                let injected = self.storage.injected();
                let cutoff = self.cutoff();
                let got = self.tracker.get_scheduled_messages(max).expect("open");
                assert!(got.len() <= max);
                for p in got.iter().copied() {
                    let at = self.pending.get(&p).copied();
                    assert!(at.is_some(), "{p} delivered but not pending");
                    assert!(at.unwrap() <= cutoff, "{p} delivered early");
                    self.deliver(p);
                }
                if got.len() < max && self.storage.injected() == injected {
                    let lost: Vec<_> = self
                        .pending
                        .iter()
                        .filter(|(_, at)| **at <= cutoff)
                        .collect();
                    assert!(lost.is_empty(), "due messages not delivered: {lost:?}");
                }
            }
            Op::Ack => {
                // Mark-delete = the longest prefix of delivered messages.
                let mut md = None;
                for p in self.all.keys() {
                    if self.ever_delivered.contains(p) && !self.pending.contains_key(p) {
                        md = Some(*p);
                    } else {
                        break;
                    }
                }
                if let Some(md) = md {
                    if self.mark_delete.is_none_or(|old| md > old) {
                        self.mark_delete = Some(md);
                        self.tracker.update_mark_delete(md);
                    }
                }
            }
            Op::ForceMerge => {
                self.tracker.trim_and_merge().expect("open");
            }
            Op::CrashRecover => {
                self.storage.arm(FaultPlan::default());
                let tracker = BucketDelayedDeliveryTracker::new(
                    self.config.clone(),
                    self.storage.clone(),
                    self.clock.clone(),
                )
                .expect("recovery of well-formed snapshots");
                // The old instance is gone (its memory is lost).
                self.tracker = tracker;
                self.delivered.clear();
                self.pending.clear();
                if let Some(md) = self.mark_delete {
                    self.tracker.update_mark_delete(md);
                }
                // The dispatcher re-reads every unacknowledged message.
                let reread: Vec<(Position, u64)> = self
                    .all
                    .iter()
                    .filter(|(p, _)| self.mark_delete.is_none_or(|md| **p > md))
                    .map(|(p, at)| (*p, *at))
                    .collect();
                for (p, at) in reread {
                    self.offer(p, at);
                }
            }
            Op::Seek { pick, clear } => {
                if self.all.is_empty() {
                    return self.check();
                }
                let targets: Vec<Position> = self.all.keys().copied().collect();
                let md = targets[pick % targets.len()];
                let forward = self.mark_delete.is_none_or(|old| md > old);
                // A clear that fails on a delete fault keeps the state; the
                // seek then goes through the mark-delete calls alone.
                if clear && self.tracker.clear().is_ok() {
                    self.pending.clear();
                    self.tracker.update_mark_delete(md);
                } else if forward {
                    self.tracker.update_mark_delete(md);
                } else {
                    self.tracker.reset_mark_delete(md);
                }
                self.mark_delete = Some(md);
                // Skipped (forward) messages are acknowledged; everything
                // above the new mark-delete is unacknowledged and is read
                // again, so it may be delivered again (a new lifetime).
                self.pending.retain(|p, _| *p > md);
                self.delivered.retain(|p| *p <= md);
                let reread: Vec<(Position, u64)> = self
                    .all
                    .range(md..)
                    .filter(|(p, _)| **p > md && !self.pending.contains_key(p))
                    .map(|(p, at)| (*p, *at))
                    .collect();
                for (p, at) in reread {
                    self.offer(p, at);
                }
            }
            Op::Fault {
                create,
                read,
                delete,
            } => self.storage.arm(FaultPlan {
                create,
                read,
                delete,
            }),
        }
        self.check();
    }

    fn finish(&mut self) {
        self.storage.arm(FaultPlan::default());
        self.clock.advance(1_000_000);
        // Every non-empty batch delivers at least one tracked message: the
        // drain ends within `tracked + 1` calls, or the tracker is wrong.
        let mut got = Vec::new();
        let bound = self.tracker.number_of_delayed_messages() + 1;
        let mut calls = 0;
        loop {
            calls += 1;
            assert!(
                calls <= bound,
                "get_scheduled_messages still returns messages after {bound} calls ({} delivered)",
                got.len()
            );
            let batch = self.tracker.get_scheduled_messages(16).expect("open");
            if batch.is_empty() {
                break;
            }
            got.extend(batch);
        }
        for p in &got {
            self.deliver(*p);
        }
        if std::env::var("MODEL_STATS").is_ok() {
            eprintln!(
                "STATS {:?} injected={}",
                self.tracker.stats(),
                self.storage.injected()
            );
        }
        assert!(
            self.pending.is_empty(),
            "never delivered: {:?}",
            self.pending
        );
        assert_eq!(self.tracker.number_of_delayed_messages(), 0);
        self.tracker.verify_invariants().expect("invariants");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn tracker_matches_model(ops in proptest::collection::vec(op(), 1..120), max_buckets in prop_oneof![Just(-1i64), Just(2i64), Just(3i64)]) {
        let mut h = Harness::new(max_buckets);
        for op in &ops {
            h.apply(op);
        }
        h.finish();
    }
}
