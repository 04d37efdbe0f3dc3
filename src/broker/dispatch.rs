//! The dispatch pipeline of a subscription (Pulsar's
//! `PersistentDispatcherMultipleConsumers` / `…SingleActiveConsumer` /
//! `PersistentStickyKeyDispatcherMultipleConsumers` `readMoreEntries` →
//! `sendMessagesToConsumers`), one round after another while a consumer
//! can receive:
//!
//! 1. **replay**: entries redelivered or left by a removed consumer
//!    (Key_Shared: only those whose consumer can receive now);
//! 2. **due delayed entries** from the delayed tracker;
//! 3. **read** new entries from the cursor with the lock-free
//!    read-scheduling hint (`SkipDeleted`: one run-end query per deleted
//!    run); the read is in flight until the driver delivers its completion
//!    (`read_completion.rs`: one read in flight per subscription, Pulsar's
//!    `havePendingRead`), and only then does the locked **post-I/O filter**
//!    (`filter_read_entries`) drop what was acknowledged meanwhile;
//! 4. per entry of a completed read (and of steps 1 and 2): the delayed tracker's **add** (an entry it accepts waits;
//!    one it declines is due and goes on), **routing** (Shared round-robin,
//!    Failover/Exclusive the first consumer, Key_Shared the consistent-hashing
//!    ring of `key_shared.rs`, a key held by one consumer at a time), and the
//!    **PIP-491 send** through the subscription's
//!    `permits::broker::SharedDispatcher::send_to_consumer` (P debited,
//!    `message_permits` on the MESSAGE, a write id whose completion the
//!    driver reports: `write_failure.rs`), queued as a frame.
//!
//! An entry that cannot go now (no consumer with permits, its key held
//! elsewhere, or waiting behind a replayed entry of its key) goes to replay.
//! A consumer whose connection is at or above the outbound high watermark
//! counts as having no permits (Pulsar's `Consumer.isWritable`).

use crate::deletion::SkipDeleted;
use crate::ledger::{Entry, ManagedLedger};
use crate::permits::broker::{AdmitAll, BrokerEntry, NotSentReason};
use crate::Position;

use super::counters::CountingSkip;
use super::entry::{entry_info, EntryInfo};
use super::output::Outbox;
use super::subscription::{sub_type, Subscription};
use super::txn::{entry_txn, EntryTxn};
use crate::proto::command::{ty, BrokerCommand};

/// Entries read from the cursor (or replayed) per dispatch round.
pub const READ_BATCH: usize = 100;
/// Rounds per dispatch call at most (each round sends or stops).
const MAX_ROUNDS: usize = 1000;

impl Subscription {
    /// Whether dispatch may send consumer `idx` a MESSAGE now: permits
    /// left and its connection below the high watermark.
    fn can_receive(&self, idx: usize, out: &Outbox) -> bool {
        let c = &self.consumers[idx];
        self.available(c.key) > 0 && out.is_writable(c.conn)
    }

    /// Σ available permits of the consumers dispatch may send to now.
    fn total_permits(&self, out: &Outbox) -> i64 {
        // Exclusive / Failover: only the active consumer is sent entries.
        let active = self.active_consumer();
        self.consumers
            .iter()
            .filter(|c| active.is_none_or(|k| c.key == k))
            .filter(|c| out.is_writable(c.conn))
            .map(|c| self.available(c.key).max(0))
            .sum()
    }

    /// Index of the consumer that owns slot `key_hash` on the Key_Shared ring.
    fn key_owner(&self, key_hash: u32) -> Option<usize> {
        let key = self.selector.select(key_hash)?;
        self.consumers.iter().position(|c| c.key == *key)
    }

    /// Sends what the consumers have permits for: replay first, then due
    /// delayed entries, then new entries from the cursor.
    ///
    /// Nothing is dispatched while the subscription's pending-ack handle
    /// has not replayed its log (Pulsar's `addConsumer` waits for
    /// `pendingAckHandleFuture`): an entry acknowledged in a transaction
    /// still open is not known yet and would go out again. Nothing is read
    /// before the retry deadline of a failed read (`read_backoff.rs`).
    pub(crate) fn dispatch(&mut self, ml: &ManagedLedger, out: &mut Outbox) {
        if self.pending_ack.is_some() && !self.pending_ack_applied {
            return;
        }
        if !self.read_backoff.may_read(self.clock.now_ms()) {
            return;
        }
        // Markers and aborted transactions' entries met on the way:
        // acknowledged for this subscription, never dispatched.
        let mut skipped = Vec::new();
        self.dispatch_rounds(ml, out, &mut skipped);
        if !skipped.is_empty() {
            let deleted = self.deletion.delete(&skipped, ml).map(|_| ());
            if let Err(e) = deleted
                .map_err(|e| e.to_string())
                .and_then(|()| self.persist_and_settle())
            {
                tracing::warn!(error = %e, subscription = %self.name, "acknowledging transaction markers / aborted entries failed");
            }
        }
    }

    fn dispatch_rounds(
        &mut self,
        ml: &ManagedLedger,
        out: &mut Outbox,
        skipped: &mut Vec<Position>,
    ) {
        let mut rounds = 0;
        while self.total_permits(out) > 0 && rounds < MAX_ROUNDS {
            rounds += 1;
            let mut progressed = false;
            // The transaction buffer's max read position: nothing past it is
            // dispatched (entries of an open transaction, and after them).
            let max_read = self
                .buffer
                .lock()
                .max_read_position(ml.last_confirmed_entry());
            // 1. replay
            if !self.replay.is_empty() {
                // Key_Shared: only entries whose consumer can receive, so
                // entries of a stalled consumer do not starve the others.
                let key_shared = self.sub_type == sub_type::KEY_SHARED;
                let positions: Vec<Position> = self
                    .replay
                    .iter()
                    .filter(|(p, _)| **p <= max_read)
                    .filter(|(_, h)| {
                        !key_shared
                            || self
                                .key_owner(**h)
                                .is_some_and(|i| self.can_receive(i, out))
                    })
                    .map(|(p, _)| *p)
                    .take(READ_BATCH)
                    .collect();
                for p in &positions {
                    self.replay.remove(p);
                }
                progressed |= self.deliver_positions(ml, &positions, true, out, skipped);
            }
            // 2. delayed entries whose time has come
            if self.total_permits(out) > 0 && self.tracker.has_message_available() {
                match self.tracker.get_scheduled_messages(READ_BATCH) {
                    Ok(positions) if !positions.is_empty() => {
                        super::delayed_hooks::observe_tracker!(
                            self,
                            super::delayed_hooks::TrackerCall::Scheduled(&positions)
                        );
                        self.counters.delayed_scheduled += positions.len() as u64;
                        progressed |= self.deliver_positions(ml, &positions, true, out, skipped);
                    }
                    Ok(_) => {}
                    Err(e) => tracing::error!(error = %e, "delayed tracker"),
                }
            }
            // 3. a completed read: the post-I/O filter, then its entries
            if self.read_in_flight.as_ref().is_some_and(|r| r.completed) {
                progressed |= self.deliver_completed_read(out, skipped);
            }
            // 3. new entries: a read is issued unless one is in flight
            let read_at = self.cursor.read_position();
            if self.read_in_flight.is_none() && self.total_permits(out) > 0 && read_at <= max_read {
                let mut n = (self.total_permits(out) as usize).clamp(1, READ_BATCH);
                // Read no further than the max read position (an entry read
                // past it after skipping deleted ones waits in replay).
                if read_at.ledger_id == max_read.ledger_id {
                    n = n.min((max_read.entry_id - read_at.entry_id + 1).max(1) as usize);
                } else if max_read < ml.last_confirmed_entry() {
                    n = 1;
                }
                // The lock-free hint per entry; a deleted entry's run end is
                // asked once and the scan hops past the whole run.
                let mut skip = CountingSkip {
                    inner: SkipDeleted::new(&self.deletion),
                    hits: 0,
                };
                let read = self.cursor.read_entries_with_skip_runs(n, &mut skip);
                self.counters.cursor_reads += 1;
                self.counters.hint_lookups += skip.inner.hint_calls;
                self.counters.hint_hits += skip.hits;
                match read {
                    Ok(entries) if !entries.is_empty() => {
                        self.read_backoff.succeeded();
                        // In flight until its completion: the filter and
                        // the delivery run then (`read_completion.rs`).
                        self.issue_read(entries, out);
                    }
                    Ok(_) => self.read_backoff.succeeded(),
                    Err(e) => {
                        let retry_at = self.read_backoff.failed(self.clock.now_ms());
                        tracing::warn!(error = %e, subscription = %self.name, retry_at, "cursor read failed; reading again after the backoff");
                        break;
                    }
                }
            }
            if !progressed {
                break;
            }
        }
    }

    fn deliver_positions(
        &mut self,
        ml: &ManagedLedger,
        positions: &[Position],
        due: bool,
        out: &mut Outbox,
        skipped: &mut Vec<Position>,
    ) -> bool {
        let live: Vec<Position> = positions
            .iter()
            .copied()
            .filter(|p| !self.deletion.is_message_deleted(*p))
            .collect();
        if live.is_empty() {
            return false;
        }
        match ml.read_positions(&live) {
            Ok(entries) => {
                self.read_backoff.succeeded();
                self.deliver_entries(entries, due, out, skipped)
            }
            Err(e) => {
                let retry_at = self.read_backoff.failed(self.clock.now_ms());
                tracing::warn!(error = %e, subscription = %self.name, retry_at, "replay read failed; reading again after the backoff");
                for p in live {
                    self.replay.insert(p, 0);
                }
                false
            }
        }
    }

    /// Whether the delayed tracker holds the entry at `p` for later
    /// delivery (Pulsar's dispatcher `trackDelayedDelivery`). Only the
    /// tracker's answer counts: `addMessage` returning false means "due by
    /// the tracker's clock, dispatch now", so an entry whose time falls
    /// between the reader's clock and the tracker's is dispatched, never
    /// dropped. Pulsar applies `deliver_at_time` only on Shared and
    /// Key_Shared subscriptions; Exclusive/Failover dispatch in order.
    pub(crate) fn held_by_tracker(&self, p: Position, deliver_at: Option<i64>) -> bool {
        let Some(t) = deliver_at
            .filter(|_| self.sub_type == sub_type::SHARED || self.sub_type == sub_type::KEY_SHARED)
        else {
            return false;
        };
        let added = self.tracker.add_message(p.ledger_id, p.entry_id, t);
        super::delayed_hooks::observe_tracker!(
            self,
            super::delayed_hooks::TrackerCall::Added {
                position: p,
                deliver_at: u64::try_from(t).unwrap_or(0),
                result: added.as_ref().ok().copied(),
            }
        );
        match added {
            Ok(tracked) => tracked,
            Err(e) => {
                tracing::warn!(error = %e, position = %p, "delayed tracker refused; delivering now");
                false
            }
        }
    }

    /// Picks the consumer for an entry with `key_hash`; `None` when none can
    /// receive it now (the entry waits in replay).
    fn pick(&mut self, key_hash: u32, out: &Outbox) -> Option<usize> {
        let n = self.consumers.len();
        if n == 0 {
            return None;
        }
        match self.sub_type {
            sub_type::SHARED => {
                for i in 0..n {
                    let idx = (self.round_robin + i) % n;
                    if self.can_receive(idx, out) {
                        self.round_robin = (idx + 1) % n;
                        return Some(idx);
                    }
                }
                None
            }
            sub_type::KEY_SHARED => self
                .key_owner(key_hash)
                .filter(|&idx| self.can_receive(idx, out)),
            _ => self.can_receive(0, out).then_some(0),
        }
    }

    /// Whether a consumer other than `idx` holds unacknowledged entries of
    /// key slot `key_hash`.
    fn key_held_elsewhere(&self, key_hash: u32, idx: usize) -> bool {
        self.inflight.iter().any(|(p, h)| {
            *h == key_hash
                && self.consumers.iter().enumerate().any(|(j, c)| {
                    j != idx
                        && self
                            .permits(c.key)
                            .is_some_and(|c| c.pending_acks().contains_key(p))
                })
        })
    }

    /// Routes entries to consumers and queues their MESSAGE frames; returns
    /// whether any was sent.
    pub(super) fn deliver_entries(
        &mut self,
        entries: Vec<Entry>,
        due: bool,
        out: &mut Outbox,
        skipped: &mut Vec<Position>,
    ) -> bool {
        let mut sent_any = false;
        let lac = entries.iter().map(|e| e.position).max();
        for entry in entries {
            // The transaction buffer: markers and aborted transactions'
            // entries are acknowledged and skipped; an entry past the max
            // read position waits in replay; an entry acknowledged inside an
            // open transaction is not dispatched.
            let txn = entry_txn(&entry.data);
            {
                let buffer = self.buffer.lock();
                match txn {
                    EntryTxn::Commit(_) | EntryTxn::Abort(_) | EntryTxn::OtherMarker => {
                        skipped.push(entry.position);
                        continue;
                    }
                    EntryTxn::Data(t) if buffer.is_aborted(t) => {
                        skipped.push(entry.position);
                        continue;
                    }
                    _ => {}
                }
                if !buffer.dispatchable(entry.position, txn, lac.unwrap_or(entry.position)) {
                    drop(buffer);
                    let info = entry_info(&entry.data).ok();
                    // A delayed entry read past the max read position goes
                    // to the tracker (it comes back here when due), never
                    // straight to replay: replays are delivered as due.
                    if !due
                        && info
                            .as_ref()
                            .is_some_and(|i| self.held_by_tracker(entry.position, i.deliver_at))
                    {
                        continue;
                    }
                    let h = info.map_or(0, |i| i.key_hash);
                    self.replay.insert(entry.position, h);
                    continue;
                }
            }
            if self.txn_pending.contains(&entry.position) {
                continue;
            }
            let info = entry_info(&entry.data).unwrap_or_else(|e| {
                tracing::warn!(position = %entry.position, error = %e, "entry metadata unreadable; delivering as one message");
                EntryInfo::unreadable()
            });
            let p = entry.position;
            if !due && self.held_by_tracker(p, info.deliver_at) {
                self.counters.delayed_added += 1;
                continue;
            }
            // A read after a consumer-set rewind (`consumer_set.rs`) meets
            // entries already out on a consumer (a due delayed entry the
            // tracker handed out in this pass) or waiting in replay: they
            // are delivered once, from there.
            if !due && (self.inflight.contains_key(&p) || self.replay.contains_key(&p)) {
                continue;
            }
            // An entry waiting in replay keeps its order: later entries of
            // its key (Key_Shared) or of the subscription (Exclusive,
            // Failover) wait behind it.
            let blocked = self.blocked_by_replay(p, info.key_hash);
            let pick = if blocked {
                None
            } else {
                self.pick(info.key_hash, out)
            };
            // Key_Shared: a key is held by one consumer at a time; when the
            // consumer set changed, the key waits until the consumer still
            // holding unacknowledged entries of it acknowledges them.
            let pick = pick.filter(|&idx| {
                self.sub_type != sub_type::KEY_SHARED
                    || !self.key_held_elsewhere(info.key_hash, idx)
            });
            let Some(idx) = pick else {
                self.replay.insert(p, info.key_hash);
                continue;
            };
            // A partially acknowledged batch goes out with the indexes still
            // to deliver (the deletion state's ack set, less the indexes
            // acknowledged in open transactions); one with none left waits
            // for its transactions to end.
            let Some(ack_set) = self.dispatch_ack_set(p, info.batch_size) else {
                continue;
            };
            let redelivery = self.redelivery_count.get(&p).copied().unwrap_or(0);
            let hook = self.admission.clone();
            let key = self.consumers[idx].key;
            let entries = vec![BrokerEntry {
                position: p,
                batch_size: info.batch_size,
                ack_set,
            }];
            let sent = match &hook {
                Some(h) => {
                    self.dispatcher
                        .send_to_consumer(key, entries, &mut |k, e: &BrokerEntry| {
                            h.admit(k, e.position)
                        })
                }
                None => self
                    .dispatcher
                    .send_to_consumer(key, entries, &mut AdmitAll),
            };
            // What the dispatcher put back for replay is this entry, when
            // admission refused it (handled below); an entry with nothing
            // deliverable is not dispatched again.
            self.dispatcher.take_replay();
            let dispatch = match sent {
                Ok(d) => d,
                Err(e) => {
                    // Not reached: `key` is an attached consumer.
                    tracing::warn!(error = %e, position = %p, "send to a consumer the dispatcher does not know");
                    self.replay.insert(p, info.key_hash);
                    continue;
                }
            };
            let Some(mut cmd) = dispatch.commands.into_iter().next() else {
                tracing::debug!(position = %p, not_sent = ?dispatch.not_sent, "entry not sent");
                if dispatch
                    .not_sent
                    .iter()
                    .any(|(_, r)| *r == NotSentReason::RejectedByAdmission)
                {
                    // Neither sent nor debited: back to replay, where later
                    // entries see it, and another round re-reads it.
                    self.replay.insert(p, info.key_hash);
                    self.admission_rejections += 1;
                    sent_any = true;
                }
                continue;
            };
            let permits = u64::from(dispatch.result.total_permits());
            let write_id = dispatch.write_id.unwrap_or_default();
            let available = self.available(key);
            let c = &mut self.consumers[idx];
            cmd.consumer_epoch = Some(c.epoch);
            // The count sent is the number of earlier deliveries.
            cmd.redelivery_count = Some(redelivery);
            cmd.message_id.partition = Some(-1);
            let base = BrokerCommand {
                r#type: ty::MESSAGE,
                message: Some(cmd),
                ..Default::default()
            };
            self.counters.messages_sent += 1;
            self.counters.permits_debited += permits;
            if permits < u64::from(info.batch_size) {
                self.counters.partial_batches += 1;
            }
            let c = &mut self.consumers[idx];
            c.debited += permits;
            c.commands += 1;
            c.min_available = c.min_available.min(available);
            out.message_frame(
                c.conn,
                &base,
                entry.data,
                super::output::SentMessage {
                    consumer: c.key,
                    incarnation: c.incarnation,
                    position: p,
                    write_id,
                },
            );
            self.inflight.insert(p, info.key_hash);
            self.batch_sizes.insert(p, info.batch_size);
            *self.redelivery_count.entry(p).or_insert(0) += 1;
            sent_any = true;
        }
        sent_any
    }
}
