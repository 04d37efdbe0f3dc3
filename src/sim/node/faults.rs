//! The node engine's fault plan: clean restarts, consumer reconnects,
//! close/resubscribe of a consumer on the same connection (a new PIP-491
//! incarnation of the same consumer id), redelivery requests, all at
//! seeded times while the producers publish. Crash points are armed on the
//! store by `start_broker` (the k-th durable write after each start).

use rand::Rng;

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
            if !self.consumers[c].ready() {
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
