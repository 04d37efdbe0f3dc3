//! Faults: the plan over the publish window, storage outages, broker
//! restarts, reconnects on a new connection, re-creation on the same
//! connection, and admin seeks.

use super::*;

/// What an admin reset of a subscription is (see [`Sim::reset_subscription`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ResetKind {
    /// Reset cursor forward to the read position (trims the tracker).
    Seek,
    /// Clear-backlog: mark-delete to the last entry, tracker cleared.
    ClearBacklog,
}

/// Makes every read of `ledger` fail as storage-unavailable while `outage`
/// is set (the simulated BookKeeper outage window).
pub(super) fn install_outage(ledger: &ManagedLedger, outage: &Arc<AtomicBool>) {
    let outage = Arc::clone(outage);
    ledger.faults().set_policy(move |_| {
        outage
            .load(Ordering::Relaxed)
            .then_some(ReadFailureKind::StorageUnavailable)
    });
}

impl Sim<'_> {
    /// Spreads the workload's faults over the expected publish window.
    pub(super) fn plan_faults(&mut self) {
        let f = self.w.faults.clone();
        let batches = self.w.messages.div_ceil(u64::from(self.w.batch_size));
        let ticks = batches.div_ceil(u64::from(self.w.producers)).max(1);
        let window = ticks.saturating_mul(self.w.publish_interval_ms).max(1_000);
        let restart_at =
            |i: u32| (u128::from(window) * u128::from(i + 1) / u128::from(f.restarts + 1)) as u64;
        self.faults_pending = f.restarts
            + f.read_outages
            + f.reconnects
            + f.seeks
            + f.same_connection_reconnects
            + f.rewinds
            + f.clock_jumps
            + f.clear_backlogs;
        self.plan_delayed_faults(window);
        self.plan_drawn_crashes(window);
        for _ in 0..f.same_connection_reconnects {
            let at = self.rng.random_range(0..window);
            let sub = SubIdx(self.rng.random_range(0..self.w.subscriptions as usize));
            let consumer = ConsumerIdx(
                self.rng
                    .random_range(0..self.w.consumers_per_subscription as usize),
            );
            self.sched.at(
                at,
                Ev::Recreate {
                    sub,
                    consumer,
                    deadline: false,
                },
            );
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
            let sub = SubIdx(self.rng.random_range(0..self.w.subscriptions as usize));
            let consumer = ConsumerIdx(
                self.rng
                    .random_range(0..self.w.consumers_per_subscription as usize),
            );
            self.sched.at(at, Ev::Reconnect { sub, consumer });
        }
        for i in 0..f.seeks {
            // Spread over the publish window (offset from the restarts),
            // subscriptions in turn.
            let at = (u128::from(window) * (2 * u128::from(i) + 1) / (2 * u128::from(f.seeks)))
                as u64
                + 150;
            let sub = SubIdx(i as usize % self.w.subscriptions as usize);
            self.sched.at(at, Ev::Seek { sub });
        }
    }

    pub(super) fn restart(&mut self) -> Result<(), SimError> {
        self.activity.restarts += 1;
        tracing::debug!(at_ms = self.sched.now(), "restart");
        self.checker.restarted();
        let mut lost = Vec::new();
        // The lost ledger is BookKeeper's doing, not a broker write: no
        // crash point falls in it.
        let held = self.crash.as_ref().and_then(|c| c.disarm());
        if self.w.faults.lose_pending_ack_ledger && self.activity.restarts == 1 {
            // Lose the pending-ack log's ledger holding the first record the
            // next replay needs (a deleted BookKeeper ledger).
            if let Some(b) = &self.broker {
                for (s, sub) in b.subs.iter().enumerate() {
                    let s = SubIdx(s);
                    if let Some(c) = &sub.pending_ack_cursor {
                        let next = c.ledger().next_valid_position(c.mark_delete_position());
                        if next <= c.ledger().last_confirmed_entry() {
                            c.ledger()
                                .mark_ledger_lost(next.ledger_id)
                                .map_err(comp("lose ledger"))?;
                            self.activity.read_failures_injected += 1;
                            self.activity.pending_ack_ledgers_lost += 1;
                            lost.push((s, next.ledger_id));
                        }
                    }
                }
            }
        }
        if let (Some(c), Some(point)) = (&self.crash, held) {
            c.arm(point);
        }
        for (s, ledger_id) in lost {
            self.pa_ledger_lost[s].insert(ledger_id);
        }
        self.arm_replay_read_failures();
        self.open_broker()?;
        // Every client reconnects with a new incarnation on a new connection.
        for s in SubIdx::all(self.w.subscriptions) {
            for c in ConsumerIdx::all(self.w.consumers_per_subscription) {
                self.resubscribe_on_new_connection(s, c)?;
            }
        }
        Ok(())
    }

    /// Client `c` of subscription `s` drops its connection and subscribes
    /// again on a new one (a new PIP-491 incarnation); the broker registers
    /// the new consumer.
    pub(super) fn resubscribe_on_new_connection(
        &mut self,
        s: SubIdx,
        c: ConsumerIdx,
    ) -> Result<(), SimError> {
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
    pub(super) fn recreate_on_same_connection(
        &mut self,
        s: SubIdx,
        c: ConsumerIdx,
    ) -> Result<(), SimError> {
        self.faults_pending = self.faults_pending.saturating_sub(1);
        if self.clients[s][c].connection.is_closed() {
            return Ok(()); // a reconnect on a new connection is on its way
        }
        self.activity.same_connection_recreations += 1;
        self.checker.consumer_reconnected(&format!("sub-{s}"), c.0);
        // The client writes CloseConsumer and Subscribe; the broker then
        // reads them in that order.
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
        if let Some(b) = self.broker.as_mut() {
            let sub = &mut b.subs[s];
            if let Some(key) = sub.consumer_keys.remove(&c) {
                let _ = sub.dispatcher.remove_consumer(key);
                if let Some(q) = sub.blocked.remove(&c) {
                    sub.redeliver.extend(q.iter().map(|e| e.entry.position));
                }
            }
        }
        self.connect_consumer(s, c)?;
        self.schedule_dispatch(s);
        Ok(())
    }

    pub(super) fn reconnect(&mut self, s: SubIdx, c: ConsumerIdx) -> Result<(), SimError> {
        self.activity.reconnects += 1;
        self.checker.consumer_reconnected(&format!("sub-{s}"), c.0);
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
    pub(super) fn seek(&mut self, s: SubIdx) -> Result<(), SimError> {
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
        self.reset_subscription(s, new_mark_delete, ResetKind::Seek)
    }

    /// Resets subscription `s`'s cursor and deletion state to
    /// `new_mark_delete` (forward) through their real reset paths
    /// (persisted), drops what the dispatcher held for redelivery and the
    /// read in flight, tells the delayed tracker (a seek: the new
    /// mark-delete, then trim; a clear-backlog: `clear`, then the new
    /// mark-delete), and reconnects every consumer as a new incarnation.
    pub(super) fn reset_subscription(
        &mut self,
        s: SubIdx,
        new_mark_delete: Position,
        kind: ResetKind,
    ) -> Result<(), SimError> {
        let now = self.sched.now();
        let Some(b) = self.broker.as_mut() else {
            return Ok(());
        };
        let sub = &mut b.subs[s];
        let target = Position::new(new_mark_delete.ledger_id, new_mark_delete.entry_id + 1);
        self.reset_in_flight = Some((s, new_mark_delete));
        sub.cursor
            .reset(target)
            .map_err(comp("seek: reset cursor"))?;
        let mark_delete = sub
            .deletion
            .reset(target, b.ledger.as_ref())
            .map_err(comp("seek: reset deletion state"))?;
        sub.blocked.clear();
        sub.redeliver.clear();
        sub.pending_read = None; // a read in flight is dropped: read again from the seek

        // The reset is persisted: committed entries at or below it are
        // durable, those above it are redelivered by the seek's design.
        self.committed_refs[s].clear();
        let active_before = sub.failover_order.first().copied();
        sub.failover_order.clear();
        if kind == ResetKind::ClearBacklog {
            if !self.clear_delayed(s, mark_delete)? {
                return Ok(()); // the tracker broke an invariant (reported); the run stops
            }
        } else if let Some(t) = &self
            .broker
            .as_ref()
            .and_then(|b| b.subs[s].delayed.as_ref())
        {
            if self.opts.sabotage == Some(Sabotage::DeliverOneTrimmedMessage) && !self.sabotage_done
            {
                self.sabotage_seek = Some((s, mark_delete));
            } else {
                t.update_mark_delete(mark_delete);
                self.delayed_truth[s].mark_delete(mark_delete);
                t.trim_and_merge().map_err(comp("seek: trim"))?;
            }
        }
        let Some(b) = self.broker.as_mut() else {
            return Ok(());
        };
        let sub = &mut b.subs[s];
        tracing::debug!(sub = %sub.name, %mark_delete, ?kind, "admin reset");
        let name = sub.name.clone();
        match kind {
            ResetKind::Seek => self.activity.seeks += 1,
            ResetKind::ClearBacklog => self.activity.clear_backlogs += 1,
        }
        self.seeks_done[s] = self.checker.seek_completed(&name, mark_delete, now);
        self.check_tracker_count(s);
        for c in ConsumerIdx::all(self.w.consumers_per_subscription) {
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
}
