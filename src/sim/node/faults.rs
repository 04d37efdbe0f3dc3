//! The node engine's fault plan: clean restarts, consumer reconnects,
//! close/resubscribe of a consumer on the same connection (a new PIP-491
//! incarnation of the same consumer id), redelivery requests, all at
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
}

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
        ] {
            for _ in 0..n {
                let c = self.rng.random_range(0..consumers);
                faults.push(make(c));
            }
        }
        for fault in faults {
            let at = self.rng.random_range(50..=span + 50);
            self.plan.planned += 1;
            self.sched.at(at, Ev::Fault(fault));
        }
    }

    /// Runs a planned fault.
    pub(super) fn fault(&mut self, f: Fault) {
        // A consumer fault waits for its consumer to be connected (after a
        // restart, a crash or its own reconnect).
        if let Fault::Reconnect(c) | Fault::SameConnection(c) | Fault::Redeliver(c) = f {
            // An application re-creates a consumer only once it has it:
            // Pulsar's subscribe hands the consumer over on SUCCESS.
            let subscribing =
                matches!(f, Fault::SameConnection(_)) && !self.consumers[c].subscribed();
            if !self.consumers[c].ready() || subscribing {
                self.sched.after(100, Ev::Fault(f));
                return;
            }
        }
        self.plan.run += 1;
        match f {
            Fault::Restart => self.clean_restart(),
            Fault::Reconnect(c) => {
                if let Some(conn) = self.consumers[c].conn {
                    self.close_conn(conn);
                    self.connection_lost(conn, ClientRef::Consumer(c), false);
                }
            }
            Fault::SameConnection(c) => self.same_connection(c),
            Fault::Redeliver(c) => self.redeliver(c),
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
    /// the refusals in `rejected`. `None` when the workload has none.
    pub(super) fn admission_hook(&mut self, rejected: Arc<AtomicU64>) -> Option<AdmissionHook> {
        let ratio = self.w.faults.admission_reject_ratio;
        if ratio <= 0.0 || !self.opts.faults {
            return None;
        }
        let seed: u64 = self.rng.random();
        let calls = Arc::new(AtomicU64::new(0));
        let threshold = (ratio.clamp(0.0, 1.0) * u64::MAX as f64) as u64;
        Some(AdmissionHook::new(move |_, _| {
            let n = calls.fetch_add(1, Ordering::Relaxed);
            let refuse = splitmix(seed ^ n) < threshold;
            if refuse {
                rejected.fetch_add(1, Ordering::Relaxed);
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
