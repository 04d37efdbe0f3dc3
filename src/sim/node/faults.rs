//! The node engine's fault plan: clean restarts, consumer reconnects,
//! close/resubscribe of a consumer on the same connection (a new PIP-491
//! incarnation of the same consumer id), redelivery requests, seeks
//! (`seek.rs`: a real SEEK frame), all at
//! seeded times while the producers publish. Crash points are armed on the
//! store by `start_broker` (the k-th durable write after each start).
//! Admission rejections (`faults.admission_reject_ratio`: the core's
//! [`AdmissionHook`] refuses a seeded fraction of the entries it offers)
//! and failed writes (`faults.write_failure_ratio`: a MESSAGE frame the
//! driver does not deliver, reported with `Broker::handle_write_failed`).

use rand::Rng;

use crate::broker::{AdmissionHook, OutFrame};
use crate::sync::{AtomicU64, Ordering};
// Ownership handles use std's Arc in every build (see `ledger::managed_ledger`).
use std::sync::Arc;

use super::{ClientRef, Ev, Node};

/// One planned fault.
#[derive(Debug, Clone, Copy)]
pub(super) enum Fault {
    /// The broker restarts cleanly.
    Restart,
    /// A consumer closes its connection and reconnects.
    Reconnect(usize),
    /// A consumer closes and subscribes again on the same connection.
    SameConnection(usize),
    /// A consumer asks for its unacknowledged messages again.
    Redeliver(usize),
    /// A consumer seeks its subscription (`seek.rs`).
    Seek(usize),
    /// A storage read outage begins (`store_faults.rs`).
    OutageStart,
    /// The outage ends.
    OutageEnd,
    /// The operator turns auto-skip of non-recoverable data on for the
    /// pending-ack logs and reloads the broker (after a replay gave up on
    /// a lost ledger).
    OperatorAutoSkip,
    /// The core's clock steps forward (`delayed.rs`).
    ClockJump,
    /// Every consumer of a subscription disconnects: a consumer-set rewind.
    Rewind(usize),
    /// An admin clear-backlog of a subscription.
    ClearBacklog(usize),
    /// A consumer sends its SUBSCRIBE again on the same connection.
    DuplicateSubscribe(usize),
    /// A consumer unsubscribes its subscription (`unsubscribe.rs`).
    Unsubscribe(usize),
}

/// How long a restart waits for a transaction holding acks, per try, ms.
const RESTART_WAIT_MS: u64 = 20;
/// Tries before a restart goes ahead anyway.
const MAX_RESTART_WAITS: u32 = 100;

/// Planned and run faults.
#[derive(Debug, Default)]
pub(super) struct FaultPlan {
    planned: u64,
    run: u64,
}

impl FaultPlan {
    /// Planned faults not yet run.
    pub(super) fn pending(&self) -> u64 {
        self.planned - self.run
    }
}

impl Node<'_> {
    /// Virtual time the producers need to publish everything.
    fn publish_span(&self) -> u64 {
        let w = self.w;
        let per_producer = w.messages.div_ceil(u64::from(w.producers));
        let entries = per_producer.div_ceil(u64::from(w.batch_size));
        (entries * w.publish_interval_ms.max(1)).max(100)
    }

    /// Schedules the workload's faults at seeded times in the publish span.
    pub(super) fn plan_faults(&mut self) {
        let f = &self.w.faults;
        let span = self.publish_span();
        let consumers = self.consumers.len();
        let mut faults = Vec::new();
        faults.extend((0..f.restarts).map(|_| Fault::Restart));
        for (n, make) in [
            (f.reconnects, Fault::Reconnect as fn(usize) -> Fault),
            (f.same_connection_reconnects, Fault::SameConnection),
            (f.redeliveries, Fault::Redeliver),
            (f.seeks, Fault::Seek),
            (f.unsubscribes, Fault::Unsubscribe),
        ] {
            for _ in 0..n {
                let c = self.rng.random_range(0..consumers);
                faults.push(make(c));
            }
        }
        let mut restarts_at = Vec::new();
        for fault in faults {
            let at = self.rng.random_range(50..=span + 50);
            if let Fault::Restart = fault {
                restarts_at.push(at);
            }
            self.plan.planned += 1;
            self.sched.at(at, Ev::Fault(fault));
        }
        let outages = u64::from(f.read_outages);
        // The first outages begin at the restarts (`fault`), so the
        // restarted core recovers (transaction buffer, pending-ack replay)
        // into them; the others spread over the publish span.
        let with_restarts = outages.min(restarts_at.len() as u64);
        self.outages_at_restarts = with_restarts as u32;
        // Each outage is two faults: its start and its end.
        self.plan.planned += 2 * outages;
        for i in with_restarts..outages {
            let at = span * (2 * i + 1) / (2 * outages + 1);
            self.sched.at(at, Ev::Fault(Fault::OutageStart));
        }
        for (at, fault) in self.plan_delayed_faults(span) {
            self.plan.planned += 1;
            self.sched.at(at, Ev::Fault(fault));
        }
    }

    /// At a (re)start of the core (before it opens): the pending-ack
    /// replay read failures of this start (the first
    /// `faults.replay_read_failures` starts after the first), and the lost
    /// pending-ack ledger at the first restart.
    pub(super) fn plan_store_faults_at_start(&mut self) {
        let f = &self.w.faults;
        if !self.opts.faults {
            return;
        }
        if std::mem::take(&mut self.operator_reload) {
            // The operator's reload replays what the failed start could
            // not: the start's read failures stay armed for it.
            return;
        }
        self.starts_after_first += 1;
        let restarts = self.starts_after_first;
        if restarts <= f.replay_read_failures {
            let fail_from = 1;
            let throttled = self.rng.random_bool(0.5);
            self.store_plan
                .lock()
                .arm_replay_failure(fail_from, throttled);
        } else {
            self.store_plan.lock().disarm_replay_failure();
        }
        if f.lose_pending_ack_ledger && restarts == 1 {
            self.lose_ledger_at_start = true;
        }
        self.entries_missing_at_start = f.pending_ack_entries_missing;
    }

    /// At a restart (`faults.pending_ack_entries_missing`): the first time
    /// a pending-ack log holds records after its mark-delete, the data of
    /// every entry it holds is gone for good; while the log's mark-delete
    /// is below such entries, the new core's replay cannot apply anything
    /// after it, so the transactions with a record there are told to the
    /// checker.
    pub(super) fn arm_missing_pending_acks(
        &mut self,
        store: &crate::ledger::RedbStore,
    ) -> Result<(), crate::sim::options::SimError> {
        for sub in self.subs.clone() {
            let log = super::store_faults::pending_ack_log(super::TOPIC, &sub);
            let (txns, last) =
                super::store_faults::txns_after_mark_delete(store, &log).map_err(|e| {
                    crate::sim::options::SimError::Component(format!("read a pending-ack log: {e}"))
                })?;
            let (Some(last), false) = (last, txns.is_empty()) else {
                continue;
            };
            self.store_plan
                .lock()
                .missing_upto
                .entry(log)
                .or_insert(last);
            for id in txns {
                if let Some(k) = self.txn_number(id) {
                    self.checker.txn_acks_lost(k, &sub, self.sched.now());
                }
            }
        }
        Ok(())
    }

    /// Loses each subscription's first needed pending-ack ledger in
    /// `store` (BookKeeper's doing, not a broker write: no crash point
    /// falls in it); the transactions with a record there are told to the
    /// checker. Without auto-skip the operator reloads with it later.
    pub(super) fn lose_pending_ack_ledgers(
        &mut self,
        store: &crate::ledger::RedbStore,
    ) -> Result<(), crate::sim::options::SimError> {
        let held = self.storage.disarm();
        let mut lost_any = false;
        for sub in self.subs.clone() {
            let log = super::store_faults::pending_ack_log(super::TOPIC, &sub);
            let lost = super::store_faults::lose_first_needed_ledger(store, &log).map_err(|e| {
                crate::sim::options::SimError::Component(format!("lose a pending-ack ledger: {e}"))
            })?;
            if let Some((_, txns)) = lost {
                lost_any = true;
                self.activity.pending_ack_ledgers_lost += 1;
                self.activity.read_failures_injected += 1;
                for id in txns {
                    if let Some(k) = self.txn_number(id) {
                        self.checker.txn_acks_lost(k, &sub, self.sched.now());
                    }
                }
            }
        }
        if let Some(p) = held {
            // Counted from the new instance's start, as armed.
            self.storage.arm(p);
        }
        if lost_any && !self.auto_skip {
            let at = self.w.faults.operator_auto_skip_after_ms;
            self.plan.planned += 1;
            self.sched.after(at, Ev::Fault(Fault::OperatorAutoSkip));
        }
        Ok(())
    }

    /// Runs a planned fault.
    pub(super) fn fault(&mut self, f: Fault) {
        // A consumer fault waits for its consumer to be connected (after a
        // restart, a crash or its own reconnect).
        if let Fault::Reconnect(c)
        | Fault::SameConnection(c)
        | Fault::Redeliver(c)
        | Fault::Seek(c)
        | Fault::Unsubscribe(c) = f
        {
            // An application re-creates a consumer only once it has it:
            // Pulsar's subscribe hands the consumer over on SUCCESS.
            let subscribing =
                matches!(f, Fault::SameConnection(_)) && !self.consumers[c].subscribed();
            if !self.consumers[c].ready() || subscribing {
                self.sched.after(100, Ev::Fault(f));
                return;
            }
        }
        // With transactional acks, a restart waits (a while) for a
        // transaction holding acknowledgements, so the restarted core
        // replays pending acks from the pending-ack logs.
        if let Fault::Restart = f {
            if self.w.txn_ack_ratio > 0.0
                && self.restart_waits < MAX_RESTART_WAITS
                && !self.txn_holds_acks()
            {
                self.restart_waits += 1;
                self.sched.after(RESTART_WAIT_MS, Ev::Fault(f));
                return;
            }
            self.restart_waits = 0;
        }
        let ran = match f {
            Fault::Rewind(s) => self.rewind(s),
            Fault::ClearBacklog(s) => self.clear_backlog(s),
            Fault::DuplicateSubscribe(c) => self.duplicate_subscribe(c),
            _ => true,
        };
        if !ran {
            super::delayed::retry_later(self, f);
            return;
        }
        self.plan.run += 1;
        match f {
            Fault::ClockJump => self.clock_jump(),
            Fault::Rewind(_) | Fault::ClearBacklog(_) | Fault::DuplicateSubscribe(_) => {}
            Fault::Restart => {
                if self.outages_at_restarts > 0 {
                    self.outages_at_restarts -= 1;
                    self.fault(Fault::OutageStart);
                }
                self.clean_restart();
            }
            Fault::Reconnect(c) => {
                if let Some(conn) = self.consumers[c].conn {
                    self.close_conn(conn);
                    self.connection_lost(conn, ClientRef::Consumer(c), false);
                }
            }
            Fault::SameConnection(c) => self.same_connection(c),
            Fault::Redeliver(c) => self.redeliver(c),
            Fault::Seek(c) => self.seek(c),
            Fault::Unsubscribe(c) => self.unsubscribe(c),
            Fault::OutageStart => {
                self.store_plan.lock().outage = true;
                let end = self.w.faults.outage_ms;
                self.sched.after(end, Ev::Fault(Fault::OutageEnd));
            }
            Fault::OutageEnd => self.store_plan.lock().outage = false,
            Fault::OperatorAutoSkip => {
                self.auto_skip = true;
                self.activity.operator_reloads += 1;
                self.operator_reload = true;
                self.clean_restart();
            }
        }
    }
}

/// SplitMix64: a seeded, stateless draw for the admission hook (the core
/// calls it in a deterministic order, so a counter is its only state).
fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl Node<'_> {
    /// The admission rule of a new core: refuses a seeded fraction
    /// (`faults.admission_reject_ratio`) of the entries offered, counting
    /// the refusals in `rejected` and recording what it admits in
    /// `self.admissions`. `None` when the workload has none.
    pub(super) fn admission_hook(&mut self, rejected: Arc<AtomicU64>) -> Option<AdmissionHook> {
        let ratio = self.w.faults.admission_reject_ratio;
        if ratio <= 0.0 || !self.opts.faults {
            return None;
        }
        let seed: u64 = self.rng.random();
        let calls = Arc::new(AtomicU64::new(0));
        let threshold = (ratio.clamp(0.0, 1.0) * u64::MAX as f64) as u64;
        // What it admits, for the driver's check of each MESSAGE
        // (`admission.rs`).
        let admissions = Arc::clone(self.admissions.get_or_insert_with(Default::default));
        Some(AdmissionHook::new(move |key, p| {
            let n = calls.fetch_add(1, Ordering::Relaxed);
            let refuse = splitmix(seed ^ n) < threshold;
            if refuse {
                rejected.fetch_add(1, Ordering::Relaxed);
            } else {
                admissions.lock().admitted(key, p);
            }
            !refuse
        }))
    }

    /// Whether the write of `frame` fails (`faults.write_failure_ratio` of
    /// the MESSAGE frames): it never reaches the client and the core is
    /// told with `handle_write_failed`.
    pub(super) fn write_fails(&mut self, frame: &OutFrame) -> bool {
        let ratio = self.w.faults.write_failure_ratio;
        // `BaseCommand.type` is its first field: 0x08, then MESSAGE (9).
        ratio > 0.0
            && self.opts.faults
            && frame.command.starts_with(&[0x08, 9])
            && self.rng.random_bool(ratio.clamp(0.0, 1.0))
    }
}
