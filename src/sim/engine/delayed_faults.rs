//! Delayed-delivery faults: consumer-set rewinds and broker clock jumps
//! (see [`Faults::rewinds`](crate::sim::Faults::rewinds) and
//! [`Faults::clock_jumps`](crate::sim::Faults::clock_jumps)).

use super::*;

impl Sim<'_> {
    /// Plans the clock jumps and rewinds over the publish `window`, 100 ms
    /// before the seeks' slots (a seek drops what the tracker holds) and off
    /// the restarts; rewind `i` comes right after clock jump `i`, at the same
    /// instant (events at one instant run in planning order), before the
    /// dispatcher has drained what the jump made due.
    pub(super) fn plan_delayed_faults(&mut self, window: VirtualMs) {
        let f = &self.w.faults;
        let spread = |i: u32, n: u32| {
            (u128::from(window) * (2 * u128::from(i) + 1) / (2 * u128::from(n.max(1)))) as u64
        };
        for i in 0..f.clock_jumps {
            self.sched
                .at(spread(i, f.clock_jumps).saturating_sub(100), Ev::ClockJump);
        }
        for i in 0..f.rewinds {
            let sub = SubIdx(i as usize % self.w.subscriptions as usize);
            self.sched
                .at(spread(i, f.rewinds).saturating_sub(100), Ev::Rewind { sub });
        }
    }

    /// Every consumer of subscription `s` disconnects and subscribes again on
    /// a new connection (new incarnations; what they had pending goes back
    /// for redelivery). The first one back finds no consumer on the
    /// dispatcher, which (Pulsar's `addConsumer` on an empty consumer set)
    /// rewinds the cursor to the mark-delete and clears its redelivery set:
    /// everything unacknowledged is read again. The bucket delayed tracker is
    /// kept as it is, so the re-read re-adds messages it still tracks (an
    /// already-due one is an expired re-add, which must untrack it).
    pub(super) fn rewind(&mut self, s: SubIdx) -> Result<(), SimError> {
        let ready = self.broker.as_ref().is_some_and(|b| b.subs[s].ready);
        if !ready {
            self.sched.after(100, Ev::Rewind { sub: s });
            return Ok(());
        }
        self.faults_pending = self.faults_pending.saturating_sub(1);
        self.activity.rewinds += 1;
        let name = format!("sub-{s}");
        for c in ConsumerIdx::all(self.w.consumers_per_subscription) {
            self.checker.consumer_reconnected(&name, c.0);
            self.resubscribe_on_new_connection(s, c)?;
        }
        if let Some(b) = self.broker.as_mut() {
            let sub = &mut b.subs[s];
            sub.cursor.rewind();
            sub.pending_read = None; // a read in flight is dropped: read again after the rewind
            sub.blocked.clear();
            sub.redeliver.clear();
            sub.dispatcher.take_replay();
        }
        tracing::debug!(sub = %name, "consumer-set rewind");
        self.check_tracker_count(s);
        self.schedule_dispatch(s);
        Ok(())
    }

    /// The broker's clock steps `faults.clock_jump_ms` forward: the delayed
    /// tracker sees that much more time pass at once; the checker allows
    /// deliveries that much earlier by the producers' clock from now on.
    pub(super) fn clock_jump(&mut self) {
        let ms = self.w.faults.clock_jump_ms;
        self.broker_clock_offset_ms += ms;
        self.clock
            .set(self.sched.now() + self.broker_clock_offset_ms);
        self.checker.allow_early(ms);
        self.activity.clock_jumps += 1;
        for s in SubIdx::all(self.w.subscriptions) {
            self.schedule_dispatch(s);
        }
    }
}
