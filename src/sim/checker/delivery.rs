//! A delivery's rules: never after a seek skipped it, no duplicate while
//! the receiving consumer incarnation lives, no redelivery after an ack,
//! delayed messages neither early nor late, and the subscription type's
//! order within each consumer incarnation and across consumers.

use super::subscription::ACKED;
use super::window::Lookup;
use super::{DeliveryChecker, MessageRef, OrderCheck};

impl DeliveryChecker {
    /// `msg` was handed to consumer `consumer` of `sub` at `now_ms`; the
    /// broker dispatched it after `seeks_before_dispatch` seeks on `sub` had
    /// completed. A redelivery is allowed only if the consumer it was last
    /// delivered to has started a new incarnation since (reconnect, removal,
    /// restart, seek); every delivery of an ordered message, redeliveries
    /// included, must come in order within the receiving consumer's
    /// incarnation.
    pub fn delivered(
        &mut self,
        sub: &str,
        consumer: usize,
        msg: MessageRef,
        now_ms: u64,
        seeks_before_dispatch: u32,
    ) {
        self.counts.delivered += 1;
        let found = self.lookup(&msg);
        if let Lookup::Unknown = found {
            self.counts.invalid_events += 1;
            self.violation(now_ms, format!("{sub}: delivered unknown message {msg}"));
            return;
        }
        let base = self.base;
        let Some(s) = self.subs.get_mut(sub) else {
            self.counts.invalid_events += 1;
            self.violation(now_ms, format!("delivery on unknown subscription {sub}"));
            return;
        };
        let epoch = s.epoch;
        let token = s.token(consumer);
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
        // A retired message reopened by a backward seek on this
        // subscription (`seek.rs`): its redelivery is allowed.
        if matches!(found, Lookup::Retired)
            && s.reopened_retired_above.is_some_and(|r| msg.position > r)
        {
            self.counts.duplicates_allowed += 1;
            return;
        }
        // A retired message is acknowledged on every subscription.
        let idx = match found {
            Lookup::Live(i) if s.acked[i - base] != ACKED => i,
            _ => {
                self.counts.duplicate_violations += 1;
                self.violation(now_ms, format!("{sub}: {msg} redelivered after its ack"));
                return;
            }
        };
        let p = self.published[idx - base].1;
        let prev = std::mem::replace(&mut s.delivered[idx - base], token + 1);
        let first_time = prev == 0;
        let released_while_unheld = s.released_while_unheld.remove(&idx);
        if !first_time {
            let (holder, live) = s.tokens[(prev - 1) as usize];
            // A negative ack or a redelivery request of its holder (or an
            // aborted transactional ack of its entry) releases the message
            // for one redelivery (to any consumer), nothing else does. A release
            // granted after its holder was already gone is not spent on
            // the delivery that holder's reconnect allows: it is for the
            // copy after it.
            let nacked = if !live && released_while_unheld {
                false
            } else {
                s.nacked.remove(&idx)
            };
            if live && !nacked {
                self.counts.duplicate_violations += 1;
                let what = if holder == consumer {
                    format!("{sub}: {msg} delivered twice to consumer-{consumer} with no restart or reconnect between")
                } else {
                    format!("{sub}: {msg} delivered to consumer-{consumer} while consumer-{holder}, which received it, neither reconnected nor restarted")
                };
                self.violation(now_ms, what);
                return;
            }
            if live {
                // A release let the copy go elsewhere while its holder
                // still holds its own (the copy a reconnect allowed, then
                // an abort's): that holder may still acknowledge it.
                s.released_from.insert(idx, prev);
            }
            self.counts.duplicates_allowed += 1;
        }
        if self.key_exclusive && self.order == OrderCheck::PerKey {
            let holders = s.key_holders.entry(p.key).or_default();
            if prev != 0 {
                if let Some(n) = holders.get_mut(&(prev - 1)) {
                    *n = n.saturating_sub(1);
                }
            }
            let other = holders
                .iter()
                .find(|(t, n)| **t != token && **n > 0 && s.tokens[**t as usize].1)
                .map(|(t, _)| s.tokens[*t as usize].0);
            *holders.entry(token).or_insert(0) += 1;
            if let Some(holder) = other {
                self.counts.order_violations += 1;
                self.violation(
                    now_ms,
                    format!(
                        "{sub}: key {}: {msg} delivered to consumer-{consumer} while consumer-{holder} holds unacknowledged messages of the key",
                        p.key
                    ),
                );
                return;
            }
        }
        if p.deliver_at_ms == 0 && first_time {
            s.first_delivered_ordinary(now_ms, msg.position);
        }
        if p.deliver_at_ms > 0 {
            // Late: first delivered more than the bound after it was due,
            // and more than the bound after the subscription's dispatch
            // went past it (an ordinary message at a later position first
            // delivered once it was overdue): the tracker lost or held it
            // while reads passed it. One the dispatch had not reached
            // waited behind older unacknowledged messages: after a
            // consumer-set change Pulsar's dispatcher rewinds to the
            // mark-delete and re-reads in position order
            // (`PersistentDispatcherMultipleConsumers.addConsumer`), and a
            // due delayed message the tracker already dispatched is one of
            // them. One passed less than the bound ago was replayed after
            // later entries (a delivery that failed in transit, an
            // admission rejection) and waits behind the next re-read.
            let bound = self.late_bound_ms;
            let overdue_at = p.deliver_at_ms + bound;
            if first_time && bound > 0 && now_ms > overdue_at {
                let passed = s
                    .passed_between(overdue_at, now_ms - bound)
                    .filter(|(_, p)| *p > msg.position);
                match passed {
                    Some((at, passed)) => {
                        self.counts.late_deliveries += 1;
                        self.violation(
                            now_ms,
                            format!(
                                "{sub}: late delayed message: {msg} first delivered at {now_ms}ms, due at {}ms (bound {bound}ms); dispatch passed it at {at}ms ({passed} first delivered)",
                                p.deliver_at_ms
                            ),
                        );
                    }
                    None => self.counts.late_behind_backlog += 1,
                }
            }
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
        let what = || match self.order {
            OrderCheck::Total => "subscription order".to_string(),
            _ => format!("key {}", p.key),
        };
        // Within the consumer's incarnation: a replay of a key (Key_Shared)
        // or of the subscription from its mark-delete (Failover) comes in
        // publish order and before newer messages of that key.
        let mine = s
            .token_progress
            .entry(token)
            .or_default()
            .entry(order_key)
            .or_insert(0);
        if key_seq < *mine {
            let last = *mine;
            let kind = if first_time { "" } else { "redelivered " };
            let what = what();
            self.counts.order_violations += 1;
            self.violation(
                now_ms,
                format!("{sub}/consumer-{consumer}: {what}: {kind}message #{key_seq} ({msg}) delivered after #{last}"),
            );
            return;
        }
        *mine = key_seq;
        if !first_time {
            return;
        }
        // Across consumers: first-time deliveries in one epoch are in order.
        let progress = s.key_progress.entry(order_key).or_insert((epoch, 0));
        if progress.0 != epoch {
            *progress = (epoch, 0);
        }
        if key_seq < progress.1 {
            self.counts.order_violations += 1;
            let last = progress.1;
            let what = what();
            self.violation(
                now_ms,
                format!("{sub}: {what}: message #{key_seq} ({msg}) delivered after #{last}"),
            );
        } else {
            progress.1 = key_seq;
        }
    }
}
