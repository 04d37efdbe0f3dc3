//! Delayed-delivery faults: consumer-set rewinds, broker clock jumps and
//! clear-backlogs (see [`Faults::rewinds`](crate::sim::Faults::rewinds),
//! [`Faults::clock_jumps`](crate::sim::Faults::clock_jumps) and
//! [`Faults::clear_backlogs`](crate::sim::Faults::clear_backlogs)).

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
        // Clear-backlog `i` at (8i + 7) / 8n of the window (seven eighths in
        // for one): after the restart halfway and the rewinds (whose
        // re-reads it would otherwise empty), once buckets were sealed and
        // partly dispatched; the rest of the window publishes on.
        for i in 0..f.clear_backlogs {
            let at = (u128::from(window) * (8 * u128::from(i) + 7)
                / (8 * u128::from(f.clear_backlogs))) as u64;
            let sub = SubIdx(i as usize % self.w.subscriptions as usize);
            self.sched.at(at, Ev::ClearBacklog { sub });
        }
    }

    /// Admin clear-backlog of subscription `s` (Pulsar
    /// `PersistentSubscription.clearBacklog`): the cursor's mark-delete moves
    /// to the last entry (`asyncClearBacklog`), then the dispatcher clears
    /// its delayed messages (`clearDelayedMessages`: the bucket tracker's
    /// `clear`, which deletes every bucket snapshot). Everything
    /// unacknowledged so far is skipped; the consumers reconnect as after a
    /// seek (what they hold is at or below the new mark-delete).
    pub(super) fn clear_backlog(&mut self, s: SubIdx) -> Result<(), SimError> {
        let Some(b) = self.broker.as_ref() else {
            return Ok(());
        };
        let last_confirmed = b.ledger.last_confirmed_entry();
        if !b.subs[s].ready || last_confirmed.entry_id < 0 {
            // Not serving yet (replay) or nothing published: try again soon.
            self.sched.after(100, Ev::ClearBacklog { sub: s });
            return Ok(());
        }
        self.faults_pending = self.faults_pending.saturating_sub(1);
        self.reset_subscription(s, last_confirmed, ResetKind::ClearBacklog)
    }

    /// The delayed-tracker half of a clear-backlog: `clear`, with (at rate
    /// `faults.clear_delete_failure_ratio`) the snapshot of one bucket after
    /// the first undeletable, so `clear` fails after its retries with the
    /// buckets before it removed; then the cleared backlog's `mark_delete`
    /// (which untracks what a failed clear kept) and, after a failure, a
    /// trim of the buckets left below it. The tracker's structural
    /// invariants (`CounterEqualsCardinality` first) are checked right after
    /// `clear` returns, before any other call. Returns `false` if they broke
    /// (reported; the run stops).
    pub(super) fn clear_delayed(
        &mut self,
        s: SubIdx,
        mark_delete: Position,
    ) -> Result<bool, SimError> {
        let Some(t) = self
            .broker
            .as_ref()
            .and_then(|b| b.subs[s].delayed.as_ref())
        else {
            return Ok(true);
        };
        let ratio = self.w.faults.clear_delete_failure_ratio;
        let mut failing = None;
        if self.opts.faults && ratio > 0.0 && self.rng.random_bool(ratio) {
            let buckets = t.buckets();
            if buckets.len() >= 2 {
                let k = self.rng.random_range(1..buckets.len());
                failing = Some(buckets[k].1);
            }
        }
        let faults = self.snapshot_faults.get(s.0);
        if let (Some(f), Some(id)) = (faults, failing) {
            f.fail_deletes_of(Some(id));
            self.activity.snapshot_failures_injected += 1;
        }
        let cleared = t.clear();
        if let Some(f) = faults {
            f.fail_deletes_of(None);
        }
        if let Err(e) = &cleared {
            self.activity.delayed_clear_failures += 1;
            tracing::debug!(sub = %s, error = %e, "delayed tracker clear failed");
        }
        if let Err(e) = t.verify_invariants() {
            let truth = &mut self.delayed_truth[s];
            if !truth.invariant_reported {
                truth.invariant_reported = true;
                let after = match &cleared {
                    Ok(()) => "clear".to_string(),
                    Err(c) => format!("a failed clear ({c})"),
                };
                self.checker.tracker_violation(
                    &format!("sub-{s}"),
                    &format!("invariant violated after {after}: {e}"),
                    self.sched.now(),
                );
            }
            self.tracker_corrupt = true;
            return Ok(false);
        }
        t.update_mark_delete(mark_delete);
        self.delayed_truth[s].mark_delete(mark_delete);
        if cleared.is_err() {
            t.trim_and_merge()
                .map_err(comp("clear-backlog: trim after a failed clear"))?;
        }
        Ok(true)
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
