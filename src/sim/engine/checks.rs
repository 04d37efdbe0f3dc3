//! Engine-side checks that need the broker's state: the delayed tracker's
//! count and overdue messages, and consumer stalls.

use super::*;

impl Sim<'_> {
    /// The delayed tracker of subscription `s` must report the count of
    /// what it holds (see [`DelayedTruth`]) and pass its structural
    /// invariants (`verify_invariants`, e.g. the spec's `NoSecondLiveCopy`:
    /// a second queue entry of a tracked position changes no delivery,
    /// only the tracker's state shows it); each reported once per lifetime.
    pub(super) fn check_tracker_count(&mut self, s: SubIdx) {
        let Some(t) = self
            .broker
            .as_ref()
            .and_then(|b| b.subs[s].delayed.as_ref())
        else {
            return;
        };
        let n = t.number_of_delayed_messages();
        let truth = &mut self.delayed_truth[s];
        // Only bucket work (a seal, segment load, merge, trim, snapshot
        // create or delete: each moves a TrackerStats counter) puts more
        // than one entry into the shared queue at once or drops bucket
        // bits; an add or a pop queues or untracks one position, which the
        // count check above covers. So the structural check runs after
        // each step that did bucket work, and costs nothing on the others.
        let stats = t.stats();
        let structural = if truth.checked_stats != Some(stats) {
            truth.checked_stats = Some(stats);
            t.verify_invariants()
        } else {
            Ok(())
        };
        if let Err(e) = structural {
            if !truth.invariant_reported {
                truth.invariant_reported = true;
                self.checker.tracker_violation(
                    &format!("sub-{s}"),
                    &format!("invariant violated: {e}"),
                    self.sched.now(),
                );
            }
        }
        for what in truth.apply_snapshot_events() {
            self.checker
                .tracker_violation(&format!("sub-{s}"), &what, self.sched.now());
        }
        if n != truth.len() && !truth.mismatch_reported {
            truth.mismatch_reported = true;
            let want = truth.len();
            self.checker.tracker_violation(
                &format!("sub-{s}"),
                &format!("count mismatch: reports {n} delayed messages, holds {want} (accepted, not yet scheduled, above the mark-delete)"),
                self.sched.now(),
            );
        }
    }

    /// A delayed message the tracker still holds past its delivery time plus
    /// the late bound is late (reported once).
    pub(super) fn check_overdue(&mut self, s: SubIdx) {
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

    pub(super) fn stall_check_interval(&self) -> VirtualMs {
        (self.w.stall_bound_ms / 4).max(1)
    }

    /// A consumer stalls when it has backlog (entries routed to it and held,
    /// or — Shared — anything left to read or redeliver) and free receiver
    /// queue, yet receives nothing for longer than the stall bound. Sampled
    /// every quarter bound; injected outages and replays in progress are not
    /// stalls.
    pub(super) fn stall_check(&mut self) {
        let now = self.sched.now();
        let Some(b) = self.broker.as_ref() else {
            return;
        };
        if self.outage.load(Ordering::Relaxed) {
            return; // reads fail by design during an injected outage
        }
        let mut stalled = Vec::new();
        for (s, sub) in b.subs.iter().enumerate() {
            let s = SubIdx(s);
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
                let c = ConsumerIdx(c);
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
