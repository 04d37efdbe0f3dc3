//! Acknowledgements: individual and cumulative, when the broker applies
//! them (each must cover only messages delivered to the acking consumer's
//! current incarnation) and when they are persisted (they count).

use super::counts::CheckerCounts;
use super::subscription::{SubState, ACKED, NOT_ACKED, SKIPPED};
use super::window::Lookup;
use super::{DeliveryChecker, MessageRef};
use crate::position::Position;

impl DeliveryChecker {
    /// `msg` was acknowledged on `sub` (the ack reached the cursor).
    pub fn acked(&mut self, sub: &str, msg: MessageRef, now_ms: u64) {
        let base = self.base;
        let known = self.subs.contains_key(sub);
        let idx = match self.lookup(&msg) {
            // Acknowledged (so delivered) on every subscription already.
            Lookup::Retired if known => return,
            Lookup::Live(i)
                if self
                    .subs
                    .get(sub)
                    .is_some_and(|s| s.delivered[i - base] != 0) =>
            {
                i
            }
            _ => {
                self.counts.invalid_events += 1;
                self.violation(now_ms, format!("{sub}: ack of undelivered {msg}"));
                return;
            }
        };
        if let Some(s) = self.subs.get_mut(sub) {
            let i = idx - base;
            if self.key_exclusive && s.acked[i] != ACKED {
                let key = self.published[i].1.key;
                if let (Some(holders), Some(t)) =
                    (s.key_holders.get_mut(&key), s.delivered[i].checked_sub(1))
                {
                    if let Some(n) = holders.get_mut(&t) {
                        *n = n.saturating_sub(1);
                    }
                }
            }
            Self::mark_acked(s, i, &mut self.counts);
        }
        self.ack_recorded();
    }

    /// The broker applied an individual ack from consumer `consumer` of
    /// `sub` for `msgs` (the messages of one entry; into the cursor's
    /// deletion state or the pending-ack store): each must have been
    /// delivered to this consumer in its current incarnation (or already be
    /// acknowledged or skipped); each one that was not is an invalid event.
    /// The ack counts once it is persisted ([`DeliveryChecker::acked`]).
    pub fn ack_applied(&mut self, sub: &str, consumer: usize, msgs: &[MessageRef], now_ms: u64) {
        let Some(s) = self.subs.get_mut(sub) else {
            self.counts.invalid_events += 1;
            self.violation(now_ms, format!("ack on unknown subscription {sub}"));
            return;
        };
        let token = s.token(consumer) + 1;
        let base = self.base;
        let mut first = None;
        let mut bad = 0;
        for msg in msgs {
            let ok = match self.index.get(msg) {
                Some(i) => {
                    s.delivered[i - base] == token
                        || s.acked[i - base] != NOT_ACKED
                        || s.released_from.get(i) == Some(&token)
                }
                None => self.retired.contains(*msg),
            };
            if !ok {
                bad += 1;
                first.get_or_insert(*msg);
            }
        }
        if let Some(msg) = first {
            self.counts.invalid_events += bad;
            self.violation(
                now_ms,
                format!("{sub}/consumer-{consumer}: ack of {msg}, not delivered to this consumer"),
            );
        }
    }

    /// The broker applied a negative ack from consumer `consumer` of `sub`
    /// for `msgs` (messages of one entry): each must have been delivered to
    /// this consumer's current incarnation and not be acknowledged (else an
    /// invalid event, and no redelivery of it is allowed). Each may then be
    /// redelivered once, to any consumer, and is exempt from the order
    /// check (Pulsar redelivers negatively acknowledged messages after
    /// newer ones). The incarnation that held a message when its entry was
    /// given back (an aborted transactional ack or a redelivery request of
    /// the entry: `SubState::released_from`) still holds its copy after
    /// the entry went to another consumer, so its negative ack of it is
    /// valid too, as its ack is.
    pub fn nacked(&mut self, sub: &str, consumer: usize, msgs: &[MessageRef], now_ms: u64) {
        let Some(s) = self.subs.get_mut(sub) else {
            self.counts.invalid_events += 1;
            self.violation(
                now_ms,
                format!("negative ack on unknown subscription {sub}"),
            );
            return;
        };
        let token = s.token(consumer) + 1;
        let base = self.base;
        let mut first = None;
        let mut bad = 0;
        for msg in msgs {
            match self.index.get(msg) {
                Some(i)
                    if (s.delivered[i - base] == token
                        || s.released_from.get(i) == Some(&token))
                        && s.acked[i - base] == NOT_ACKED =>
                {
                    s.nacked.insert(*i);
                    s.order_exempt.insert(*i);
                }
                _ => {
                    bad += 1;
                    first.get_or_insert(*msg);
                }
            }
        }
        if let Some(msg) = first {
            self.counts.invalid_events += bad;
            self.violation(
                now_ms,
                format!("{sub}/consumer-{consumer}: negative ack of {msg}, not delivered to this consumer or already acknowledged"),
            );
        }
    }

    /// Consumer `consumer` of `sub` sent REDELIVER_UNACKNOWLEDGED_MESSAGES
    /// naming `entries` (ledger and entry ids only, as Pulsar's client
    /// sends a negative ack of a batch's message). The broker takes each
    /// named entry the consumer holds out of its pending acks and
    /// dispatches it again with the batch's ack set, to any consumer
    /// (Pulsar's `Consumer.redeliverUnacknowledgedMessages(List<MessageIdData>)`
    /// → `subscription.redeliverUnacknowledgedMessages(consumer, positions)`):
    /// so every message of those entries delivered to this consumer's
    /// current incarnation and still unacknowledged, not only the ones its
    /// application negatively acknowledged, may be redelivered once and
    /// out of order. Messages of the entries held by another incarnation
    /// are not released. Run after [`DeliveryChecker::nacked`], which
    /// judges the negative acks themselves.
    pub fn redelivery_requested(
        &mut self,
        sub: &str,
        consumer: usize,
        entries: &[Position],
        _now_ms: u64,
    ) {
        let base = self.base;
        let Some(s) = self.subs.get_mut(sub) else {
            return;
        };
        let holder = s.token(consumer) + 1;
        for position in entries {
            // Batches of the simulator's producers hold at most 512
            // messages (`Workload::validate`); retired ones are acknowledged.
            for batch_index in 0..512 {
                let m = MessageRef {
                    position: *position,
                    batch_index,
                };
                let Some(&i) = self.index.get(&m) else {
                    continue;
                };
                if s.delivered[i - base] == holder && s.acked[i - base] == NOT_ACKED {
                    s.nacked.insert(i);
                    s.order_exempt.insert(i);
                    // Its holder may still acknowledge it after the entry
                    // went to another consumer.
                    s.released_from.insert(i, holder);
                }
            }
        }
    }

    /// Whether `msg` is acknowledged (or skipped by a seek) on `sub`: a
    /// client's negative ack of it then changes nothing (another
    /// incarnation's ack of it landed first).
    pub fn is_settled(&self, sub: &str, msg: MessageRef) -> bool {
        let Some(s) = self.subs.get(sub) else {
            return false;
        };
        match self.index.get(&msg) {
            Some(i) => s.acked[*i - self.base] != NOT_ACKED,
            None => self.retired.contains(msg),
        }
    }

    /// Marks window index `idx` (absolute − base) acknowledged on `s`.
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

    /// The broker applied a cumulative ack from consumer `consumer` up to
    /// entry `upto` on `sub` (into the cursor, or into the pending-ack store
    /// for a transaction): every message at or below it (not covered by an
    /// earlier applied cumulative ack) must have been delivered to this
    /// consumer in its current incarnation (or be acknowledged or skipped)
    /// by now; each one that was not is an invalid event.
    pub fn cumulative_ack_applied(
        &mut self,
        sub: &str,
        consumer: usize,
        upto: Position,
        now_ms: u64,
    ) {
        let base = self.base;
        let Some(s) = self.subs.get_mut(sub) else {
            self.counts.invalid_events += 1;
            self.violation(
                now_ms,
                format!("cumulative ack on unknown subscription {sub}"),
            );
            return;
        };
        let token = s.token(consumer) + 1;
        let mut first = None;
        let mut bad = 0;
        let (to, _) = Self::cumulative_range(
            &self.published,
            base,
            s.cumulative_checked_to,
            s.cumulative_checked_upto,
            upto,
            |i| {
                if s.delivered[i] != token && s.acked[i] == NOT_ACKED {
                    bad += 1;
                    first.get_or_insert(i);
                }
            },
        );
        s.cumulative_checked_to = to;
        s.cumulative_checked_upto = s.cumulative_checked_upto.max(Some(upto));
        if let Some(i) = first {
            let what = if s.delivered[i] == 0 {
                "undelivered"
            } else {
                "a message not delivered to this consumer:"
            };
            self.counts.invalid_events += bad;
            let msg = self.published[i].0;
            self.violation(
                now_ms,
                format!(
                    "{sub}/consumer-{consumer}: cumulative ack up to {upto} covers {what} {msg}"
                ),
            );
        }
    }

    /// A cumulative ack up to entry `upto` on `sub` reached the store: every
    /// delivered message at or below it is acknowledged (an undelivered one
    /// stays unacknowledged: it was reported when the ack was applied).
    /// Returns how many messages it newly acknowledged.
    pub fn cumulative_acked(&mut self, sub: &str, upto: Position) -> u64 {
        let base = self.base;
        let before = self.counts.acked;
        if let Some(s) = self.subs.get_mut(sub) {
            let mut covered = Vec::new();
            let (to, _) = Self::cumulative_range(
                &self.published,
                base,
                s.cumulative_acked_to,
                s.cumulative_acked_upto,
                upto,
                |i| covered.push(i),
            );
            for i in covered {
                if s.delivered[i] != 0 {
                    Self::mark_acked(s, i, &mut self.counts);
                }
            }
            s.cumulative_acked_to = to;
            s.cumulative_acked_upto = s.cumulative_acked_upto.max(Some(upto));
        }
        let newly = self.counts.acked - before;
        self.acks_since_retire = self
            .acks_since_retire
            .saturating_add(u32::try_from(newly).unwrap_or(u32::MAX));
        if self.acks_since_retire >= self.retire_every {
            self.retire();
        }
        newly
    }

    /// The window messages a cumulative ack up to `upto` newly covers: each
    /// at or below `upto` and above `covered_upto` (what an earlier one
    /// covered), from window index `from` (absolute; every message below it
    /// is covered) to the window's end, since publications are registered
    /// in receipt order, not position order (a node client's producers
    /// receive their receipts on separate connections; the copy of a send
    /// whose receipt was lost is registered at its first delivery). Calls
    /// `each` with each one's window index (absolute − base); returns the
    /// new `from` (the covered prefix) and how many were visited.
    pub(super) fn cumulative_range(
        published: &std::collections::VecDeque<(MessageRef, super::subscription::Published)>,
        base: usize,
        from: usize,
        covered_upto: Option<Position>,
        upto: Position,
        mut each: impl FnMut(usize),
    ) -> (usize, usize) {
        let start = from.max(base) - base;
        let mut prefix = true;
        let mut to = from.max(base);
        let mut n = 0;
        for (i, (m, _)) in published.iter().enumerate().skip(start) {
            let p = m.position;
            let covered_before = covered_upto.is_some_and(|c| p <= c);
            if p <= upto && !covered_before {
                each(i);
                n += 1;
            }
            if prefix && (p <= upto || covered_before) {
                to = base + i + 1;
            } else {
                prefix = false;
            }
        }
        (to, n)
    }
}
