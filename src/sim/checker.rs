//! The simulator's independent delivery checker.
//!
//! It sees only what a user of the broker could see — messages published,
//! messages delivered to consumers, acknowledgements, restarts and consumer
//! reconnects, admin seeks — and derives from those alone: duplicates (split
//! into the at-least-once redeliveries Pulsar allows after a restart or
//! reconnect, and violations), lost messages (unacknowledged messages at or
//! below a seek are *skipped*, not lost; delivering one that was dispatched
//! after the seek is a violation), per-key (Key_Shared) or total (Failover)
//! order violations, cumulative acks that cover undelivered messages, early
//! delayed deliveries and stalls. It shares no state with the components it
//! checks.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::position::Position;

/// Identity of one logical message: the entry holding it and its index in
/// the batch (0 for a non-batched entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageRef {
    /// The entry's position.
    pub position: Position,
    /// Index within the batch.
    pub batch_index: u32,
}

impl std::fmt::Display for MessageRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}#{}", self.position, self.batch_index)
    }
}

/// Which delivery order the subscription type guarantees (and so is checked
/// within one redelivery generation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrderCheck {
    /// No order guarantee (Shared).
    None,
    /// Per-key publish order (Key_Shared).
    PerKey,
    /// Total publish order of the subscription (Failover: one active consumer).
    Total,
}

/// Per-message state on one subscription.
const NOT_ACKED: u8 = 0;
const ACKED: u8 = 1;
/// Unacknowledged when an admin seek moved the mark-delete past it.
const SKIPPED: u8 = 2;

#[derive(Debug, Clone, Copy)]
struct Published {
    key: u32,
    /// Publish order of this message among messages with the same key.
    key_seq: u64,
    /// Earliest delivery time (virtual ms), 0 for an ordinary message.
    deliver_at_ms: u64,
}

/// Per subscription, indexed by the message's publish index (dense: the
/// checker holds ~5 bytes per message and subscription, so a 20-million
/// delivery fan-out fits in memory).
#[derive(Debug, Default)]
struct SubState {
    /// Publish index → redelivery generation of its last delivery + 1 (0 =
    /// never delivered).
    delivered: Vec<u32>,
    /// Publish index → NOT_ACKED / ACKED (persisted) / SKIPPED (by a seek).
    acked: Vec<u8>,
    acked_count: u64,
    skipped_count: u64,
    /// Mark-delete after each completed seek, in seek order (forward only).
    seeks: Vec<Position>,
    /// Publish indexes below this were checked by a seek.
    seek_scan_from: usize,
    /// Publish indexes below this were checked by an applied cumulative ack.
    cumulative_checked_to: usize,
    /// Publish indexes below this were marked by a persisted cumulative ack.
    cumulative_acked_to: usize,
    /// Bumped on every restart and consumer reconnect of this subscription:
    /// a redelivery across a bump is an allowed at-least-once duplicate.
    generation: u32,
    /// key → (generation, highest key_seq delivered first-time in it).
    key_progress: HashMap<u32, (u32, u64)>,
    /// Publish indexes exempt from the per-key order check (replayed after
    /// a corrupted delivery).
    order_exempt: std::collections::HashSet<usize>,
}

/// Counters and the first violation, as reported.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CheckerCounts {
    /// Logical messages published.
    pub published: u64,
    /// Deliveries to consumers (including duplicates), summed over subscriptions.
    pub delivered: u64,
    /// Distinct messages acknowledged, summed over subscriptions.
    pub acked: u64,
    /// Redeliveries after a restart or reconnect (Pulsar's at-least-once).
    pub duplicates_allowed: u64,
    /// Duplicates with no restart/reconnect in between, or after an ack.
    pub duplicate_violations: u64,
    /// Messages published but never acknowledged by some subscription
    /// (counted once per subscription) at the end of the run.
    pub lost: u64,
    /// Deliveries that overtook an earlier message of the same key
    /// (Key_Shared), or any earlier message (Failover), in the same
    /// subscription and redelivery generation.
    pub order_violations: u64,
    /// Messages not acknowledged when an admin seek moved the subscription's
    /// mark-delete past them (skipped, not lost), summed over subscriptions.
    pub skipped_by_seek: u64,
    /// Deliveries of a message at or below a seek's mark-delete that the
    /// broker dispatched after the seek completed (e.g. a delayed tracker
    /// that keeps delivering trimmed indexes).
    pub delivered_after_seek: u64,
    /// Delayed messages delivered before their delivery time (minus the
    /// allowed tick).
    pub early_deliveries: u64,
    /// Acknowledgements (individual, or covered by a cumulative ack) of
    /// messages never delivered, or deliveries of messages never published.
    pub invalid_events: u64,
    /// Consumers that had backlog and free receiver queue but got nothing for
    /// longer than the stall bound.
    pub stalls: u64,
    /// Consumers whose broker-side permits, once everything was delivered,
    /// acknowledged and returned, differ from their receiver queue size
    /// (PIP-491: a permit leaked or was returned twice).
    pub permit_mismatches: u64,
    /// Messages not published, plus planned faults not run, when the run hit
    /// its virtual-time limit (a cut-short run proves nothing).
    pub unfinished: u64,
}

impl CheckerCounts {
    /// Total number of violations of any kind.
    pub fn violations(&self) -> u64 {
        self.duplicate_violations
            + self.lost
            + self.order_violations
            + self.delivered_after_seek
            + self.early_deliveries
            + self.invalid_events
            + self.stalls
            + self.permit_mismatches
            + self.unfinished
    }
}

/// Records events and checks them (see the module docs). Single-threaded:
/// the simulator's event loop owns it.
#[derive(Debug)]
pub struct DeliveryChecker {
    /// Message → publish index into `published`.
    index: HashMap<MessageRef, u32>,
    published: Vec<(MessageRef, Published)>,
    next_key_seq: HashMap<u32, u64>,
    subs: BTreeMap<String, SubState>,
    counts: CheckerCounts,
    first_violation: Option<String>,
    /// Delayed deliveries may come this many ms early (`tick` in non-strict mode).
    early_tolerance_ms: u64,
    /// Which order is guaranteed and so checked.
    order: OrderCheck,
}

impl DeliveryChecker {
    /// A checker for the given subscriptions; every published message is
    /// expected once in each of them. `early_tolerance_ms` is how early a
    /// delayed message may be delivered (Pulsar's non-strict tick); `order`
    /// is the order the subscription type guarantees.
    pub fn new(
        subscriptions: impl IntoIterator<Item = String>,
        early_tolerance_ms: u64,
        order: OrderCheck,
    ) -> Self {
        Self {
            index: HashMap::new(),
            published: Vec::new(),
            next_key_seq: HashMap::new(),
            subs: subscriptions
                .into_iter()
                .map(|s| (s, SubState::default()))
                .collect(),
            counts: CheckerCounts::default(),
            first_violation: None,
            early_tolerance_ms,
            order,
        }
    }

    fn violation(&mut self, at_ms: u64, what: String) {
        if self.first_violation.is_none() {
            self.first_violation = Some(format!("t={at_ms}ms: {what}"));
        }
    }

    /// A message was durably published with ordering key `key` (0 when the
    /// workload has no keys) and earliest delivery time `deliver_at_ms` (0 for
    /// an immediate message).
    pub fn published(&mut self, msg: MessageRef, key: u32, deliver_at_ms: u64) {
        let seq = self.next_key_seq.entry(key).or_insert(0);
        *seq += 1;
        let idx = self.published.len() as u32;
        self.index.insert(msg, idx);
        self.published.push((
            msg,
            Published {
                key,
                key_seq: *seq,
                deliver_at_ms,
            },
        ));
        for s in self.subs.values_mut() {
            s.delivered.push(0);
            s.acked.push(NOT_ACKED);
        }
        self.counts.published += 1;
    }

    /// The broker restarted: every subscription enters a new redelivery
    /// generation.
    pub fn restarted(&mut self) {
        for s in self.subs.values_mut() {
            s.generation += 1;
        }
    }

    /// A consumer of `sub` reconnected (or was removed): its unacknowledged
    /// messages may be redelivered.
    pub fn consumer_reconnected(&mut self, sub: &str) {
        if let Some(s) = self.subs.get_mut(sub) {
            s.generation += 1;
        }
    }

    /// An admin seek on `sub` completed at `now_ms`, leaving the mark-delete
    /// at `mark_delete` (forward only): every message at or below it that is
    /// not acknowledged is skipped; the consumers reconnected (a new
    /// redelivery generation). Returns the number of seeks completed on
    /// `sub`, the value later deliveries dispatched after it carry.
    pub fn seek_completed(&mut self, sub: &str, mark_delete: Position, now_ms: u64) -> u32 {
        let end = self
            .published
            .partition_point(|(m, _)| m.position <= mark_delete);
        let Some(s) = self.subs.get_mut(sub) else {
            self.counts.invalid_events += 1;
            self.violation(now_ms, format!("seek on unknown subscription {sub}"));
            return 0;
        };
        if let Some(last) = s.seeks.last().copied().filter(|l| mark_delete < *l) {
            let done = s.seeks.len() as u32;
            self.counts.invalid_events += 1;
            self.violation(
                now_ms,
                format!("{sub}: seek moved mark-delete backward from {last} to {mark_delete}"),
            );
            return done;
        }
        for state in &mut s.acked[s.seek_scan_from.min(end)..end] {
            if *state == NOT_ACKED {
                *state = SKIPPED;
                s.skipped_count += 1;
            }
        }
        s.seek_scan_from = s.seek_scan_from.max(end);
        s.seeks.push(mark_delete);
        s.generation += 1;
        s.seeks.len() as u32
    }

    /// `msg` was handed to a consumer of `sub` at `now_ms`; the broker
    /// dispatched it after `seeks_before_dispatch` seeks on `sub` had
    /// completed.
    pub fn delivered(
        &mut self,
        sub: &str,
        msg: MessageRef,
        now_ms: u64,
        seeks_before_dispatch: u32,
    ) {
        self.counts.delivered += 1;
        let Some(idx) = self.index.get(&msg).map(|i| *i as usize) else {
            self.counts.invalid_events += 1;
            self.violation(now_ms, format!("{sub}: delivered unknown message {msg}"));
            return;
        };
        let Some(s) = self.subs.get_mut(sub) else {
            self.counts.invalid_events += 1;
            self.violation(now_ms, format!("delivery on unknown subscription {sub}"));
            return;
        };
        let p = self.published[idx].1;
        let generation = s.generation;
        if let Some(seek) = (seeks_before_dispatch as usize)
            .checked_sub(1)
            .and_then(|i| s.seeks.get(i))
        {
            if msg.position <= *seek {
                let seek = *seek;
                self.counts.delivered_after_seek += 1;
                self.violation(
                    now_ms,
                    format!(
                        "{sub}: {msg} dispatched after a seek to mark-delete {seek} skipped it"
                    ),
                );
                return;
            }
        }
        if s.acked[idx] == ACKED {
            self.counts.duplicate_violations += 1;
            self.violation(now_ms, format!("{sub}: {msg} redelivered after its ack"));
            return;
        }
        let prev = std::mem::replace(&mut s.delivered[idx], generation + 1);
        if prev != 0 {
            if prev - 1 == generation {
                self.counts.duplicate_violations += 1;
                self.violation(
                    now_ms,
                    format!("{sub}: {msg} delivered twice with no restart or reconnect between"),
                );
            } else {
                self.counts.duplicates_allowed += 1;
            }
            return;
        }
        if p.deliver_at_ms > 0 {
            if now_ms + self.early_tolerance_ms < p.deliver_at_ms {
                self.counts.early_deliveries += 1;
                self.violation(
                    now_ms,
                    format!(
                        "{sub}: delayed {msg} delivered at {now_ms}ms, due at {}ms",
                        p.deliver_at_ms
                    ),
                );
            }
            return; // delayed messages carry no ordering guarantee
        }
        if self.order == OrderCheck::None || s.order_exempt.contains(&idx) {
            return;
        }
        // Total order: one pseudo-key whose sequence is the publish index.
        let (order_key, key_seq) = match self.order {
            OrderCheck::Total => (0, idx as u64 + 1),
            _ => (p.key, p.key_seq),
        };
        let progress = s.key_progress.entry(order_key).or_insert((generation, 0));
        if progress.0 != generation {
            *progress = (generation, 0);
        }
        if key_seq < progress.1 {
            self.counts.order_violations += 1;
            let last = progress.1;
            let what = match self.order {
                OrderCheck::Total => "subscription order".to_string(),
                _ => format!("key {}", p.key),
            };
            self.violation(
                now_ms,
                format!("{sub}: {what}: message #{key_seq} ({msg}) delivered after #{last}"),
            );
        } else {
            progress.1 = key_seq;
        }
    }

    /// `msg` was acknowledged on `sub` (the ack reached the cursor).
    pub fn acked(&mut self, sub: &str, msg: MessageRef, now_ms: u64) {
        let idx = self.index.get(&msg).map(|i| *i as usize);
        let delivered =
            idx.is_some_and(|i| self.subs.get(sub).is_some_and(|s| s.delivered[i] != 0));
        let (Some(idx), true) = (idx, delivered) else {
            self.counts.invalid_events += 1;
            self.violation(now_ms, format!("{sub}: ack of undelivered {msg}"));
            return;
        };
        if let Some(s) = self.subs.get_mut(sub) {
            Self::mark_acked(s, idx, &mut self.counts);
        }
    }

    fn mark_acked(s: &mut SubState, idx: usize, counts: &mut CheckerCounts) {
        match std::mem::replace(&mut s.acked[idx], ACKED) {
            ACKED => {}
            SKIPPED => {
                s.skipped_count -= 1;
                s.acked_count += 1;
                counts.acked += 1;
            }
            _ => {
                s.acked_count += 1;
                counts.acked += 1;
            }
        }
    }

    /// The broker applied a cumulative ack up to entry `upto` on `sub` (into
    /// the cursor, or into the pending-ack store for a transaction): every
    /// message at or below it must have been delivered (or acknowledged or
    /// skipped) by now; each one that was not is an invalid event.
    pub fn cumulative_ack_applied(&mut self, sub: &str, upto: Position, now_ms: u64) {
        let end = self.published.partition_point(|(m, _)| m.position <= upto);
        let Some(s) = self.subs.get_mut(sub) else {
            self.counts.invalid_events += 1;
            self.violation(
                now_ms,
                format!("cumulative ack on unknown subscription {sub}"),
            );
            return;
        };
        let from = s.cumulative_checked_to.min(end);
        let mut first = None;
        let mut bad = 0;
        for i in from..end {
            if s.delivered[i] == 0 && s.acked[i] == NOT_ACKED {
                bad += 1;
                first.get_or_insert(i);
            }
        }
        s.cumulative_checked_to = s.cumulative_checked_to.max(end);
        if let Some(i) = first {
            self.counts.invalid_events += bad;
            let msg = self.published[i].0;
            self.violation(
                now_ms,
                format!("{sub}: cumulative ack up to {upto} covers undelivered {msg}"),
            );
        }
    }

    /// A cumulative ack up to entry `upto` on `sub` reached the store: every
    /// delivered message at or below it is acknowledged (an undelivered one
    /// stays unacknowledged: it was reported when the ack was applied).
    /// Returns how many messages it newly acknowledged.
    pub fn cumulative_acked(&mut self, sub: &str, upto: Position) -> u64 {
        let end = self.published.partition_point(|(m, _)| m.position <= upto);
        let before = self.counts.acked;
        if let Some(s) = self.subs.get_mut(sub) {
            for i in s.cumulative_acked_to.min(end)..end {
                if s.delivered[i] != 0 {
                    Self::mark_acked(s, i, &mut self.counts);
                }
            }
            s.cumulative_acked_to = s.cumulative_acked_to.max(end);
        }
        self.counts.acked - before
    }

    /// A consumer of `sub` with backlog and free receiver queue received
    /// nothing for `idle_ms`.
    pub fn stalled(&mut self, sub: &str, consumer: &str, idle_ms: u64, now_ms: u64) {
        self.counts.stalls += 1;
        self.violation(
            now_ms,
            format!("{sub}/{consumer}: stalled for {idle_ms}ms with backlog and free permits"),
        );
    }

    /// At quiescence a consumer of `sub` holds `permits` on the broker where
    /// `expected` (its receiver queue size) was due.
    pub fn permit_balance(
        &mut self,
        sub: &str,
        consumer: usize,
        permits: i64,
        expected: i64,
        now_ms: u64,
    ) {
        if permits != expected {
            self.counts.permit_mismatches += 1;
            self.violation(
                now_ms,
                format!(
                    "{sub}/consumer-{consumer}: broker holds {permits} permits after draining, expected {expected}"
                ),
            );
        }
    }

    /// `msg` on `sub` will be replayed after later messages (its delivery
    /// failed before reaching the application): exempt it from the per-key
    /// order check.
    pub fn exempt_from_order(&mut self, sub: &str, msg: MessageRef) {
        if let (Some(s), Some(i)) = (self.subs.get_mut(sub), self.index.get(&msg)) {
            s.order_exempt.insert(*i as usize);
        }
    }

    /// The run stopped at its virtual-time limit with `unpublished` messages
    /// not published and `faults_not_run` planned faults not injected.
    pub fn unfinished(&mut self, unpublished: u64, faults_not_run: u64, now_ms: u64) {
        if unpublished + faults_not_run > 0 {
            self.counts.unfinished += unpublished + faults_not_run;
            self.violation(
                now_ms,
                format!(
                    "run cut short at the virtual-time limit: {unpublished} messages not published, {faults_not_run} planned faults not run"
                ),
            );
        }
    }

    /// Whether every published message is acknowledged (or skipped by a
    /// seek) on every subscription.
    pub fn all_acked(&self) -> bool {
        let n = self.published.len() as u64;
        self.subs
            .values()
            .all(|s| s.acked_count + s.skipped_count == n)
    }

    /// Ends the run: counts messages never acknowledged as lost and returns
    /// the counts and the first violation.
    pub fn finish(mut self, now_ms: u64) -> (CheckerCounts, Option<String>) {
        let mut first_lost = None;
        let mut lost = 0;
        let mut skipped = 0;
        for (name, s) in &self.subs {
            skipped += s.skipped_count;
            for (i, (msg, _)) in self.published.iter().enumerate() {
                if s.acked[i] == NOT_ACKED {
                    lost += 1;
                    if first_lost.is_none() {
                        first_lost = Some(format!("{name}: {msg} never acknowledged"));
                    }
                }
            }
        }
        self.counts.lost = lost;
        self.counts.skipped_by_seek = skipped;
        if let Some(l) = first_lost {
            self.violation(now_ms, l);
        }
        (self.counts, self.first_violation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(e: i64) -> MessageRef {
        MessageRef {
            position: Position::new(1, e),
            batch_index: 0,
        }
    }

    #[test]
    fn clean_run_has_no_violations() {
        let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::PerKey);
        for e in 0..3 {
            c.published(m(e), 7, 0);
        }
        for e in 0..3 {
            c.delivered("s", m(e), 10, 0);
            c.acked("s", m(e), 11);
        }
        assert!(c.all_acked());
        let (counts, first) = c.finish(20);
        assert_eq!(counts.violations(), 0, "{first:?}");
        assert_eq!(
            (counts.published, counts.delivered, counts.acked),
            (3, 3, 3)
        );
    }

    #[test]
    fn duplicate_without_restart_is_a_violation_with_restart_allowed() {
        let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::PerKey);
        c.published(m(0), 1, 0);
        c.delivered("s", m(0), 1, 0);
        c.restarted();
        c.delivered("s", m(0), 2, 0);
        c.delivered("s", m(0), 3, 0);
        c.acked("s", m(0), 4);
        let (counts, first) = c.finish(5);
        assert_eq!(counts.duplicates_allowed, 1);
        assert_eq!(counts.duplicate_violations, 1);
        assert!(first.unwrap().contains("delivered twice"));
    }

    #[test]
    fn redelivery_after_ack_loss_and_order_are_caught() {
        let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::PerKey);
        for e in 0..3 {
            c.published(m(e), 1, 0);
        }
        c.delivered("s", m(1), 1, 0);
        c.delivered("s", m(0), 2, 0); // overtaken by #2
        c.acked("s", m(0), 3);
        c.restarted();
        c.delivered("s", m(0), 4, 0); // after its ack
        c.acked("s", m(2), 5); // never delivered
        let (counts, _) = c.finish(6);
        assert_eq!(counts.order_violations, 1);
        assert_eq!(counts.duplicate_violations, 1);
        assert_eq!(counts.invalid_events, 1);
        assert_eq!(counts.lost, 2); // 1 and 2 never acked
    }

    #[test]
    fn delayed_messages_must_not_come_early() {
        let mut c = DeliveryChecker::new(["s".to_string()], 100, OrderCheck::PerKey);
        c.published(m(0), 0, 1_000);
        c.published(m(1), 0, 1_000);
        c.delivered("s", m(0), 950, 0); // within the tick tolerance
        c.delivered("s", m(1), 800, 0);
        let (counts, _) = c.finish(2_000);
        assert_eq!(counts.early_deliveries, 1);
    }

    #[test]
    fn seek_skips_unacked_and_catches_a_delivery_dispatched_after_it() {
        let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::None);
        for e in 0..4 {
            c.published(m(e), 0, 0);
        }
        c.delivered("s", m(0), 1, 0);
        c.acked("s", m(0), 2);
        c.delivered("s", m(1), 3, 0); // dispatched before the seek
        let epoch = c.seek_completed("s", Position::new(1, 2), 4);
        assert_eq!(epoch, 1);
        assert!(!c.all_acked());
        c.delivered("s", m(1), 5, 0); // in flight before the seek: allowed
        c.acked("s", m(1), 6); // skipped → acked
        c.delivered("s", m(2), 7, epoch); // dispatched after the seek: violation
        c.delivered("s", m(3), 8, epoch);
        c.acked("s", m(3), 9);
        assert!(c.all_acked(), "m(2) is skipped, the rest acked");
        let (counts, first) = c.finish(10);
        assert_eq!(counts.skipped_by_seek, 1);
        assert_eq!(counts.delivered_after_seek, 1);
        assert_eq!(counts.lost, 0);
        assert_eq!(counts.violations(), 1);
        assert!(first.unwrap().contains("after a seek"));
    }

    #[test]
    fn cumulative_ack_covering_an_undelivered_message_and_total_order() {
        let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::Total);
        for e in 0..4 {
            c.published(m(e), e as u32, 0); // distinct keys: order is total
        }
        c.delivered("s", m(0), 1, 0);
        c.delivered("s", m(1), 2, 0);
        c.cumulative_ack_applied("s", Position::new(1, 1), 3);
        c.cumulative_acked("s", Position::new(1, 1));
        c.delivered("s", m(3), 4, 0);
        c.cumulative_ack_applied("s", Position::new(1, 3), 5); // m(2) undelivered
        c.cumulative_acked("s", Position::new(1, 3));
        c.delivered("s", m(2), 6, 0); // overtaken by m(3)
        c.delivered("s", m(1), 7, 0); // after its cumulative ack
        let (counts, first) = c.finish(8);
        assert_eq!(counts.acked, 3);
        assert_eq!(counts.invalid_events, 1);
        assert_eq!(counts.order_violations, 1);
        assert_eq!(counts.duplicate_violations, 1);
        assert_eq!(counts.lost, 1);
        assert!(first.unwrap().contains("covers undelivered"));
    }
}
