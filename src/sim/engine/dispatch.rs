//! The dispatcher: redeliveries and due delayed messages, new reads with the
//! lock-free scheduling hint and the locked post-I/O filter, routing
//! (Key_Shared, Failover, Shared), and sending with PIP-491 permits
//! (admission, write completion).
//!
//! One pass ([`Sim::dispatch`]) runs these steps, one job each:
//!
//! | step | job |
//! |---|---|
//! | [`Sim::arm_snapshot_faults`] | draws this pass's bucket-snapshot create/delete failures |
//! | [`Sim::collect_replays`] | redeliveries, handed-back entries and due delayed messages, minus deleted / pending / queued ones |
//! | [`Sim::read_replays`] | reads them by position (an outage puts them back) |
//! | [`Sim::read_new_entries`] | the cursor read, each candidate checked with the lock-free hint; with read latency it completes later ([`Sim::complete_read`]) |
//! | [`Sim::admit_read_entries`] | the locked post-I/O filter and its boundary check, then the delayed tracker's add |
//! | [`Sim::route`] | Key_Shared by Pulsar's consistent-hashing selector ([`crate::broker::key_shared`]), Failover to the active consumer, Shared by permits |
//! | [`Sim::send_routed`] | sends what each consumer has permits for (admission, P debit, write completion) |
//! | [`Sim::finish_pass`] | schedules deliveries, reconnects after write failures and the next pass |
//!
//! **Read latency** ([`Workload::read_latency_ms`]): a cursor read is
//! issued in one pass (the hint is asked then) and completes a seeded
//! 1..=`read_latency_ms` virtual ms later ([`Ev::ReadComplete`]), where the
//! locked post-I/O filter runs; one cursor read is in flight at a time
//! (Pulsar's `havePendingRead`), while replays go on. Acks of copies
//! already out (a due delayed message the tracker dispatched while the
//! cursor re-reads it after a restart or rewind), seeks and mark-delete
//! advances land in between, so the filter drops entries that were not
//! deleted when the read was issued ("filtered after read" in the
//! report). The boundary is checked at completion: every entry the filter
//! passes must not be deleted by the authoritative locked check
//! ([`CursorDeletionState::is_message_deleted`]); one that is (an entry
//! acked before the filter ran) is a `post-I/O filter leak`. A seek or
//! rewind cancels the read in flight (its entries are dropped and the
//! cursor reads again from its new position, as Pulsar's dispatcher does
//! after a rewind with a read pending); a restart drops it with the broker.

use super::*;
use crate::broker::key_shared::{
    sticky_key_hash, ConsistentHashingSelector, DEFAULT_REPLICA_POINTS,
};
use crate::ledger::Entry;

std::thread_local! {
    /// The last Key_Shared ring built, with the consumer slots it holds
    /// (rebuilt when they change; a function of the slots only, so the
    /// cache never changes a run's routing).
    static KEY_SHARED_RING: std::cell::RefCell<Option<(Vec<ConsumerIdx>, ConsistentHashingSelector<ConsumerIdx>)>> =
        const { std::cell::RefCell::new(None) };
}

/// The consumer slot Pulsar's default Key_Shared selector
/// ([`crate::broker::key_shared`]: consistent hashing, 100 points per
/// consumer, Murmur3 slots 1..=65535) picks for application key `key` among
/// the connected `slots`; the sticky key is the key's decimal form (the
/// partition key a producer of this workload would set), a consumer's name
/// `consumer-{slot}`.
pub(super) fn key_shared_slot(slots: &[ConsumerIdx], key: u32) -> ConsumerIdx {
    let slot = sticky_key_hash(key.to_string().as_bytes());
    KEY_SHARED_RING.with(|cell| {
        let mut cache = cell.borrow_mut();
        if cache.as_ref().is_none_or(|(s, _)| s.as_slice() != slots) {
            let mut ring = ConsistentHashingSelector::new(DEFAULT_REPLICA_POINTS);
            for c in slots {
                ring.add_consumer(*c, &format!("consumer-{}", c.0));
            }
            *cache = Some((slots.to_vec(), ring));
        }
        cache
            .as_ref()
            .and_then(|(_, ring)| ring.select(slot).copied())
            .unwrap_or(slots[0])
    })
}

/// Whether `p` is out on a consumer and not yet acknowledged (a due
/// delayed message can reach the dispatcher twice in one lifetime: from the
/// tracker and from the cursor's re-read after a restart).
fn pending_on_consumer(d: &SharedDispatcher, p: &Position) -> bool {
    d.consumers().any(|c| c.pending_acks().contains_key(p))
}

/// Whether `p` is routed and waiting for a consumer's permits.
fn queued_for_consumer(blocked: &BTreeMap<ConsumerIdx, VecDeque<SimEntry>>, p: &Position) -> bool {
    blocked
        .values()
        .any(|q| q.iter().any(|r| r.entry.position == *p))
}

/// What the send step produced: commands to deliver and consumers whose
/// write failed.
#[derive(Default)]
struct Sent {
    deliveries: Vec<(ConsumerIdx, u64, CommandMessage, Arc<Vec<u8>>)>,
    write_failed: Vec<ConsumerIdx>,
}

impl Sim<'_> {
    /// One dispatcher pass of subscription `s` (Pulsar's `readMoreEntries`
    /// and the send that follows a completed read).
    pub(super) fn dispatch(&mut self, s: SubIdx) -> Result<(), SimError> {
        self.arm_snapshot_faults(s);
        let Some(b) = self.broker.as_mut() else {
            return Ok(());
        };
        let sub = &mut b.subs[s];
        sub.dispatch_scheduled = false;
        if !sub.ready || sub.consumer_keys.is_empty() {
            return Ok(());
        }
        let mut to_route: Vec<SimEntry> = Vec::new();
        let replay = self.collect_replays(s)?;
        let mut read_error = self.read_replays(s, replay, &mut to_route)?;
        if !read_error {
            match self.read_new_entries(s)? {
                Some(entries) => self.admit_read_entries(s, entries, &mut to_route)?,
                None => read_error = true,
            }
        }
        let routed = to_route.len();
        self.route(s, to_route);
        let sent = self.send_routed(s)?;
        self.finish_pass(s, routed > 0, read_error, sent);
        Ok(())
    }

    /// A cursor read issued with latency completes: unless a restart
    /// dropped it or a seek or rewind cancelled it, its entries go through
    /// the post-I/O filter and the tracker, then are routed and sent as in
    /// a pass. With no consumer left they wait for replay.
    pub(super) fn complete_read(
        &mut self,
        s: SubIdx,
        broker_generation: u64,
        read: u64,
        entries: Vec<Entry>,
    ) -> Result<(), SimError> {
        let Some(b) = self.broker.as_mut() else {
            return Ok(());
        };
        if b.generation != broker_generation {
            return Ok(()); // issued by a broker that has since restarted
        }
        let sub = &mut b.subs[s];
        if sub.pending_read != Some(read) {
            return Ok(()); // cancelled by a seek or rewind: read again from there
        }
        sub.pending_read = None;
        let read_entries = entries.len();
        let replay_waiting = !sub.consumer_keys.is_empty()
            && (sub.dispatcher.has_replay() || !sub.redeliver.is_empty());
        let mut to_route = Vec::new();
        // As in a pass, what waits for replay goes first: Pulsar's Key_Shared
        // dispatcher serves its replay set (`redeliveryMessages`) before a
        // normal read and never sends a normal read's entry of a key hash
        // that still waits for replay, so a key's replay is never overtaken
        // by newer entries of it (removed consumers' messages, an outage's
        // failed replay read, a hand-back while this read was in flight).
        let mut replay_failed = false;
        if replay_waiting {
            let replay = self.collect_replays(s)?;
            replay_failed = self.read_replays(s, replay, &mut to_route)?;
        }
        let replayed = to_route.len();
        self.admit_read_entries(s, entries, &mut to_route)?;
        let Some(b) = self.broker.as_mut() else {
            return Ok(());
        };
        let sub = &mut b.subs[s];
        if sub.consumer_keys.is_empty() {
            sub.redeliver
                .extend(to_route.drain(..).map(|e| e.entry.position));
        } else if replay_failed {
            // The replay read failed (an outage): the read's entries wait
            // behind the replay set, in position order, for the retry.
            sub.redeliver
                .extend(to_route.drain(replayed..).map(|e| e.entry.position));
        }
        let routed = to_route.len();
        self.route(s, to_route);
        let sent = self.send_routed(s)?;
        self.finish_pass(s, routed + read_entries > 0, replay_failed, sent);
        Ok(())
    }

    /// Draws this pass's injected bucket-snapshot create/delete failures.
    fn arm_snapshot_faults(&mut self, s: SubIdx) {
        let w = self.w;
        if !self.opts.faults {
            return;
        }
        let Some(f) = self.snapshot_faults.get(s.0) else {
            return;
        };
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

    /// The positions to replay this pass: redeliveries (removed consumers,
    /// unsent), what the dispatcher hands back, and due delayed messages;
    /// without deleted ones (the locked check), ones out on a consumer and
    /// ones already routed.
    fn collect_replays(&mut self, s: SubIdx) -> Result<Vec<Position>, SimError> {
        let Some(b) = self.broker.as_mut() else {
            return Ok(Vec::new());
        };
        let sub = &mut b.subs[s];
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
        // As Pulsar's `readMoreEntries`: no read without permits, and the
        // tracker is asked for at most as many messages as the consumers
        // have permits for (the rest stay tracked until the next read).
        let permits_now = sub.dispatcher.total_available_permits();
        if let Some(t) = &sub.delayed {
            if permits_now > 0 && t.has_message_available() {
                let n = (permits_now as usize).min(MAX_READ_ENTRIES);
                match t.get_scheduled_messages(n) {
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
                        // A due message the tracker brings back while a
                        // transaction acknowledged it (it was dispatched from
                        // the cursor's re-read) stays with the pending-ack
                        // handle. Only the tracker's and the re-read's
                        // copies are filtered so: an entry the dispatcher
                        // itself hands back for replay while a transaction
                        // holds it is still delivered (and caught).
                        self.activity.delayed_scheduled += ps.len() as u64;
                        replay.extend(ps.into_iter().filter(|p| !sub.txn_acked.contains(p)));
                    }
                    Err(e) => return Err(SimError::Component(format!("delayed: {e}"))),
                }
            }
        }
        // Never send an entry that is already out on a consumer and not yet
        // acknowledged, or already routed.
        Ok(replay
            .into_iter()
            .filter(|p| Some(*p) == unchecked || !sub.deletion.is_message_deleted(*p))
            .filter(|p| !pending_on_consumer(&sub.dispatcher, p))
            .filter(|p| !queued_for_consumer(&sub.blocked, p))
            .collect())
    }

    /// Reads the replayed positions into `to_route`. Returns whether the
    /// read failed on an outage (the positions go back for the next pass).
    fn read_replays(
        &mut self,
        s: SubIdx,
        replay: Vec<Position>,
        to_route: &mut Vec<SimEntry>,
    ) -> Result<bool, SimError> {
        if replay.is_empty() {
            return Ok(false);
        }
        let Some(b) = self.broker.as_mut() else {
            return Ok(false);
        };
        let sub = &mut b.subs[s];
        match b.ledger.read_positions(&replay) {
            Ok(entries) => {
                for e in entries {
                    if let Some((batch, key, _)) = Self::entry_info(&e.data) {
                        let ack_set = sub.deletion.batch_ack_set(e.position);
                        to_route.push(
                            SimEntry::new(e.position, batch, key, e.data).with_ack_set(ack_set),
                        );
                    }
                }
                Ok(false)
            }
            Err(LedgerError::StorageUnavailable { .. }) => {
                // put them back; retry after the outage
                sub.redeliver.extend(replay);
                Ok(true)
            }
            Err(e) => Err(SimError::Component(format!("replay read: {e}"))),
        }
    }

    /// New entries from the cursor, as many as the consumers have permits
    /// for, each candidate position checked first with the lock-free
    /// read-scheduling hint (a position it reports deleted is not read).
    /// `None` if the read failed on an outage; empty when nothing is read
    /// (no permits, too much routed and waiting, nothing new, a read in
    /// flight) or when the read was issued with latency (its entries come
    /// with [`Ev::ReadComplete`]).
    fn read_new_entries(&mut self, s: SubIdx) -> Result<Option<Vec<Entry>>, SimError> {
        let latency_bound = self.w.read_latency_ms;
        let Some(b) = self.broker.as_mut() else {
            return Ok(Some(Vec::new()));
        };
        let generation = b.generation;
        let sub = &mut b.subs[s];
        let blocked: usize = sub.blocked.values().map(|q| q.len()).sum();
        let permits = sub.dispatcher.total_available_permits();
        if permits <= 0 || blocked >= 1_000 || sub.pending_read.is_some() {
            return Ok(Some(Vec::new()));
        }
        let n = (permits as usize).clamp(1, MAX_READ_ENTRIES);
        let deletion = &sub.deletion;
        let mut skipped = 0u64;
        let mut lookups = 0u64;
        let read = sub.cursor.read_entries_with_skip(n, |l, e| {
            let d = deletion.is_deleted_for_read_scheduling(l, e);
            lookups += 1;
            skipped += u64::from(d);
            d
        });
        self.activity.reads_skipped_by_hint += skipped;
        self.activity.hint_lookups += lookups;
        let entries = match read {
            Ok(entries) => entries,
            Err(LedgerError::StorageUnavailable { .. }) => return Ok(None),
            Err(e) => return Err(SimError::Component(format!("read: {e}"))),
        };
        if latency_bound == 0 || entries.is_empty() {
            return Ok(Some(entries));
        }
        let entries = if self.opts.sabotage == Some(Sabotage::FilterWhenReadIssued) {
            sub.deletion.filter_read_entries(entries, |e| e.position)
        } else {
            entries
        };
        let latency = self.rng.random_range(1..=latency_bound);
        let read = self.next_read_id;
        self.next_read_id += 1;
        sub.pending_read = Some(read);
        self.activity.reads_with_latency += 1;
        self.sched.after(
            latency,
            Ev::ReadComplete {
                sub: s,
                broker_generation: generation,
                read,
                entries,
            },
        );
        Ok(Some(Vec::new()))
    }

    /// A completed cursor read: the locked post-I/O filter drops what was
    /// deleted meanwhile (the correctness boundary), then each delayed
    /// entry goes to the tracker (delivered when due) and the rest into
    /// `to_route`.
    fn admit_read_entries(
        &mut self,
        s: SubIdx,
        entries: Vec<Entry>,
        to_route: &mut Vec<SimEntry>,
    ) -> Result<(), SimError> {
        if entries.is_empty() {
            return Ok(());
        }
        let Some(b) = self.broker.as_mut() else {
            return Ok(());
        };
        let sub = &mut b.subs[s];
        let before = entries.len();
        let entries = if self.opts.sabotage == Some(Sabotage::FilterWhenReadIssued)
            && self.w.read_latency_ms > 0
        {
            entries // filtered when the read was issued
        } else {
            sub.deletion.filter_read_entries(entries, |e| e.position)
        };
        self.activity.entries_filtered_after_read += (before - entries.len()) as u64;
        // The hint's correctness boundary: nothing deleted when the filter ran passes it
        // (the authoritative locked check, per position, no fast path).
        for e in &entries {
            if sub.deletion.is_message_deleted(e.position) {
                self.checker.filter_leak(
                    &sub.name,
                    &format!(
                        "{} passed although it was deleted (acknowledged or at or below mark-delete {}) when the filter ran",
                        e.position,
                        sub.deletion.mark_delete_position()
                    ),
                    self.sched.now(),
                );
            }
        }
        for e in entries {
            let Some((batch, key, deliver_at)) = Self::entry_info(&e.data) else {
                return Err(SimError::Component(format!(
                    "undecodable entry at {}",
                    e.position
                )));
            };
            if deliver_at > 0 {
                if let Some(t) = &sub.delayed {
                    let added =
                        t.add_message(e.position.ledger_id, e.position.entry_id, deliver_at as i64);
                    for what in self.delayed_truth[s].apply_snapshot_events() {
                        self.checker
                            .tracker_violation(&sub.name, &what, self.sched.now());
                    }
                    match added {
                        Ok(true) => {
                            self.activity.delayed_tracked += 1;
                            self.delayed_truth[s].accepted(e.position, deliver_at);
                        }
                        Ok(false) => self.delayed_truth[s].declined(e.position),
                        Err(_) => {}
                    }
                    match added {
                        Ok(true) => continue, // tracked: delivered when due
                        Ok(false)
                            if sub.txn_acked.contains(&e.position)
                                || pending_on_consumer(&sub.dispatcher, &e.position)
                                || to_route.iter().any(|r| r.entry.position == e.position)
                                || queued_for_consumer(&sub.blocked, &e.position) =>
                        {
                            continue; // already on its way via the tracker
                        }
                        Ok(false) => {} // due already: dispatch now
                        Err(err) => return Err(SimError::Component(format!("delayed add: {err}"))),
                    }
                }
            }
            let ack_set = sub.deletion.batch_ack_set(e.position);
            to_route.push(SimEntry::new(e.position, batch, key, e.data).with_ack_set(ack_set));
        }
        Ok(())
    }

    /// Routes `to_route` to consumer queues: Key_Shared by Pulsar's ring,
    /// Failover to the active consumer, Shared to the one with most permits.
    fn route(&mut self, s: SubIdx, to_route: Vec<SimEntry>) {
        let w = self.w;
        let Some(b) = self.broker.as_mut() else {
            return;
        };
        let sub = &mut b.subs[s];
        let slots: Vec<ConsumerIdx> = sub.consumer_keys.keys().copied().collect();
        for e in to_route {
            let slot = match w.subscription_type {
                SubscriptionType::KeyShared => key_shared_slot(&slots, e.key),
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
    }

    /// Sends what each consumer has permits for, in order: pending-ack
    /// admission (rejections go back for replay), the PIP-491 debit check,
    /// and the asynchronous write's completion (a failed write must remove
    /// the consumer).
    fn send_routed(&mut self, s: SubIdx) -> Result<Sent, SimError> {
        let w = self.w;
        let mut sent = Sent::default();
        let Some(b) = self.broker.as_mut() else {
            return Ok(sent);
        };
        let sub = &mut b.subs[s];
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
            let batch_sizes: BTreeMap<Position, u32> = batch
                .iter()
                .map(|e| (e.entry.position, e.entry.batch_size))
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
            // Failover dispatches in order to its one active consumer (as
            // Pulsar's single-active-consumer dispatcher, which rewinds
            // rather than replaying one entry after later ones): after a
            // rejected entry nothing later goes out in this pass, so a
            // cumulative ack never covers an entry waiting for replay.
            let ordered = w.subscription_type == SubscriptionType::Failover;
            let mut rejected_one = false;
            // Pending-ack admission (conflicts, filters): with the
            // fault on, some entries are rejected; they are neither sent nor
            // debited and go back for replay.
            // Copies admitted per position: the component may send an entry
            // only as often as admission let it through.
            let mut admitted: BTreeMap<Position, u32> = BTreeMap::new();
            let mut admit = |_: ConsumerKey, e: &BrokerEntry| {
                if ordered && rejected_one {
                    return false;
                }
                let reject = reject_ratio > 0.0 && rng.random_bool(reject_ratio);
                rejected_one |= reject;
                if !reject {
                    *admitted.entry(e.position).or_default() += 1;
                }
                !reject
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
            if ordered && !rejected.is_empty() {
                // What was routed behind the rejected entry goes back with
                // it, so the replay (in position order) comes first.
                sub.redeliver
                    .extend(queue.drain(..).map(|e| e.entry.position));
            }
            for p in rejected.iter().filter(|_| !ordered) {
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
            // An entry admission rejected is neither sent nor debited
            // (Pulsar's `addPendingAckIfAllowed` refusing it filters it out):
            // a command for it is a violation the moment it is built, not only
            // if a later replay happens to deliver it twice.
            let mut commands_per_position: BTreeMap<Position, u32> = BTreeMap::new();
            for cmd in &d.commands {
                let pos = Position::new(
                    cmd.message_id.ledger_id as i64,
                    cmd.message_id.entry_id as i64,
                );
                *commands_per_position.entry(pos).or_default() += 1;
            }
            for (pos, n) in commands_per_position {
                if n > admitted.get(&pos).copied().unwrap_or(0) {
                    self.checker.permit_violation(
                        &sub.name,
                        slot.0,
                        &format!("sent and debited {pos}, which pending-ack admission rejected"),
                        self.sched.now(),
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
                    slot.0,
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
                        slot.0,
                        "an asynchronous write failure left the consumer registered",
                        self.sched.now(),
                    );
                } else {
                    sent.write_failed.push(slot);
                }
                continue;
            }
            for cmd in d.commands {
                let pos = Position::new(
                    cmd.message_id.ledger_id as i64,
                    cmd.message_id.entry_id as i64,
                );
                if let Some(p) = cmd.message_permits {
                    self.activity.commands_with_permits += 1;
                    if p < batch_sizes.get(&pos).copied().unwrap_or(1) {
                        self.activity.partial_batch_commands += 1;
                    }
                }
                sent.deliveries
                    .push((slot, key.connection_id, cmd, Arc::clone(&payloads[&pos])));
            }
        }
        Ok(sent)
    }

    /// Ends a pass: schedules the reconnects of consumers whose write
    /// failed, the deliveries, and the next pass (after an outage's retry
    /// delay; right away while this pass made progress and there is more to
    /// read or routed entries wait; while entries wait for replay, right
    /// away if this pass delivered something, else 1 ms later; otherwise
    /// the next Flow, ack, publish or tick schedules it), then checks the
    /// delayed tracker's count.
    fn finish_pass(&mut self, s: SubIdx, progress: bool, read_error: bool, sent: Sent) {
        let Some(b) = self.broker.as_mut() else {
            return;
        };
        let sub = &mut b.subs[s];
        let may_continue = !read_error
            && (progress || !sent.deliveries.is_empty())
            && sub.dispatcher.total_available_permits() > 0;
        let more = may_continue
            && (sub.cursor.has_more_entries() || sub.blocked.values().any(|q| !q.is_empty()));
        // Entries this pass put back for replay (rejected by admission, the
        // rest of a Failover queue behind a rejection) are only collected by
        // a later pass. Pulsar's dispatcher reads again after every send and
        // serves its replay set (`redeliveryMessages`) first, so they go out
        // even when nothing new is published and no ack or Flow follows.
        // A pass that sent nothing retries after 1 ms (Pulsar's dispatcher
        // retry backoff), never at the same virtual instant.
        let replay_waiting =
            may_continue && !more && (sub.dispatcher.has_replay() || !sub.redeliver.is_empty());
        let seeks_before_dispatch = self.seeks_done[s];
        let delivered = !sent.deliveries.is_empty();
        for slot in sent.write_failed {
            self.faults_pending += 1;
            self.sched.after(
                NET_MS,
                Ev::Reconnect {
                    sub: s,
                    consumer: slot,
                },
            );
        }
        for (slot, connection_id, command, payload) in sent.deliveries {
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
        if read_error {
            self.sched.after(100, Ev::Dispatch(s));
            if let Some(b) = self.broker.as_mut() {
                b.subs[s].dispatch_scheduled = true;
            }
        } else if more || (replay_waiting && delivered) {
            self.schedule_dispatch(s);
        } else if replay_waiting {
            if let Some(b) = self.broker.as_mut() {
                if !b.subs[s].dispatch_scheduled {
                    b.subs[s].dispatch_scheduled = true;
                    self.sched.after(1, Ev::Dispatch(s));
                }
            }
        }
        self.check_tracker_count(s);
    }
}
