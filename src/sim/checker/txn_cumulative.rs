//! Transactional cumulative acks as a client sees them (Failover and
//! Exclusive: Pulsar's `PendingAckHandleImpl` holds at most one pending
//! cumulative ack per subscription, and applies it to the cursor only when
//! its transaction commits). Nothing of the broker's state is read: the
//! rules use the acks' receipts, the END_TXN answers and the deliveries.
//!
//! | rule | what breaks it |
//! |---|---|
//! | `committed-cumulative-ack-redelivered` | a message at or below the position of a committed transactional cumulative ack delivered on its subscription after the commit was answered (the commit moved the mark-delete there) |
//! | `aborted-cumulative-ack-not-redelivered` | at the end of the run, a message at or below an aborted transactional cumulative ack neither acknowledged otherwise nor delivered again and acknowledged (an abort applies nothing: everything after the previous mark-delete stays to be delivered) |
//! | `cumulative-conflict-accepted` | a transactional cumulative ack answered without an error although Pulsar's conflict rules refuse it with `TransactionConflict`: its position is at or below a cumulative ack the client saw persisted (the mark-delete is at least there), or not above its own transaction's pending cumulative ack, or another transaction the client still holds open (no END_TXN requested, its timeout not reachable yet) holds a receipted cumulative ack on the subscription |
//!
//! Before its commit a transactional cumulative ack acknowledges nothing:
//! what it covers may be redelivered after a reconnect, a restart or an
//! active-consumer change, and a later cumulative ack of another consumer
//! incarnation covering it must have had it delivered (the cumulative-ack
//! rule of `acks.rs`). At its receipt the ack itself is checked as an
//! applied cumulative ack is: everything it covers was delivered to the
//! acking consumer's current incarnation.

use std::collections::BTreeMap;

use super::subscription::NOT_ACKED;
use super::{DeliveryChecker, TxnOutcome};
use crate::position::Position;

/// The client's view of the transactional cumulative acks.
#[derive(Debug, Default)]
pub(super) struct CumulativeState {
    /// Transaction → subscription → the highest position of its receipted
    /// cumulative acks (pending until it ends).
    pending: BTreeMap<u64, BTreeMap<String, Position>>,
    /// Subscription → the highest position a committed one acknowledged.
    committed: BTreeMap<String, Position>,
    /// (subscription, position) of each aborted one.
    aborted: Vec<(String, Position)>,
}

impl DeliveryChecker {
    /// Consumer `consumer` (`None`: the client cannot tell which of its
    /// incarnations the ack covers, an ack of an earlier era, or another
    /// ack of the subscription unsettled) of `sub` had its cumulative ack up
    /// to entry `upto` inside transaction `k` receipted without an error.
    pub fn txn_cumulative_acked(
        &mut self,
        k: u64,
        sub: &str,
        consumer: Option<usize>,
        upto: Position,
        now_ms: u64,
    ) {
        self.txn_cumulative_conflict_rules(k, sub, upto, now_ms);
        if let Some(c) = consumer {
            self.txn_cumulative_covers_delivered(sub, c, upto, now_ms);
        }
        let held = self
            .txn
            .cumulative
            .pending
            .entry(k)
            .or_default()
            .entry(sub.to_string())
            .or_insert(upto);
        *held = (*held).max(upto);
    }

    /// Pulsar's conflict rules, as far as the client can know their inputs.
    fn txn_cumulative_conflict_rules(&mut self, k: u64, sub: &str, upto: Position, now_ms: u64) {
        let persisted = self.subs.get(sub).and_then(|s| s.cumulative_acked_upto);
        let own = self
            .txn
            .cumulative
            .pending
            .get(&k)
            .and_then(|m| m.get(sub))
            .copied();
        let broker_now = now_ms.saturating_add(self.early_tolerance_ms);
        let other = self
            .txn
            .cumulative
            .pending
            .iter()
            .filter(|(j, _)| **j != k)
            .find_map(|(j, m)| {
                let v = self.txn.txns.get(j)?;
                let q = m.get(sub)?;
                (v.phase == Some(super::txn::Phase::Open) && broker_now < v.open_until_ms)
                    .then_some((*j, *q))
            });
        let why = if let Some(md) = persisted.filter(|md| upto <= *md) {
            Some(format!(
                "at or below the persisted cumulative ack up to {md}"
            ))
        } else if let Some(q) = own.filter(|q| upto <= *q) {
            Some(format!(
                "not above its own pending cumulative ack up to {q}"
            ))
        } else {
            other.map(|(j, q)| {
                format!("while open transaction {j} holds a cumulative ack up to {q}")
            })
        };
        if let Some(why) = why {
            self.txn_violation(
                now_ms,
                "cumulative-conflict-accepted",
                format!("{sub}: transactional cumulative ack up to {upto} in transaction {k} accepted {why}"),
            );
        }
    }

    /// Every message at or below `upto` not acknowledged on `sub` was
    /// delivered to `consumer`'s current incarnation (as
    /// [`DeliveryChecker::cumulative_ack_applied`], leaving what later
    /// cumulative acks check unchanged: this one may be aborted).
    fn txn_cumulative_covers_delivered(
        &mut self,
        sub: &str,
        consumer: usize,
        upto: Position,
        now_ms: u64,
    ) {
        let base = self.base;
        let Some(s) = self.subs.get_mut(sub) else {
            return;
        };
        let token = s.token(consumer) + 1;
        let mut first = None;
        let mut bad = 0;
        Self::cumulative_range(
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
        if let Some(i) = first {
            self.counts.invalid_events += bad;
            let msg = self.published[i].0;
            self.violation(
                now_ms,
                format!(
                    "{sub}/consumer-{consumer}: transactional cumulative ack up to {upto} covers {msg}, not delivered to this consumer"
                ),
            );
        }
    }

    /// Transaction `k` ended with `outcome`: a commit acknowledges what its
    /// cumulative acks cover, an abort nothing.
    pub(super) fn txn_cumulative_end(&mut self, k: u64, outcome: TxnOutcome) {
        let Some(held) = self.txn.cumulative.pending.remove(&k) else {
            return;
        };
        for (sub, upto) in held {
            match outcome {
                TxnOutcome::Committed => {
                    self.cumulative_acked(&sub, upto);
                    let c = self.txn.cumulative.committed.entry(sub).or_insert(upto);
                    *c = (*c).max(upto);
                }
                // As its individual acks: taken as committed (the run can
                // end), with no rule of its own.
                TxnOutcome::Unknown => {
                    self.cumulative_acked(&sub, upto);
                }
                TxnOutcome::Aborted => self.txn.cumulative.aborted.push((sub, upto)),
            }
        }
    }

    /// The store lost transaction `k`'s pending-ack records of `sub`: its
    /// cumulative ack there is neither held nor applied at its commit.
    pub(super) fn txn_cumulative_lost(&mut self, k: u64, sub: &str) {
        if let Some(m) = self.txn.cumulative.pending.get_mut(&k) {
            m.remove(sub);
        }
    }

    /// A delivery of `msg` on `sub`: never at or below a committed
    /// transactional cumulative ack.
    pub(super) fn txn_cumulative_delivery(
        &mut self,
        sub: &str,
        msg: super::MessageRef,
        now_ms: u64,
    ) {
        if let Some(upto) = self
            .txn
            .cumulative
            .committed
            .get(sub)
            .copied()
            .filter(|u| msg.position <= *u)
        {
            self.txn_violation(
                now_ms,
                "committed-cumulative-ack-redelivered",
                format!("{sub}: {msg} delivered after a committed transactional cumulative ack up to {upto}"),
            );
        }
    }

    /// End of the run: what an aborted one covered is acknowledged.
    pub(super) fn txn_cumulative_finish(&mut self, now_ms: u64) {
        let mut open = Vec::new();
        for (sub, upto) in &self.txn.cumulative.aborted {
            let Some(s) = self.subs.get(sub) else {
                continue;
            };
            for (i, (m, _)) in self.published.iter().enumerate() {
                if m.position <= *upto && s.acked[i] == NOT_ACKED {
                    open.push((sub.clone(), *upto, *m));
                }
            }
        }
        if let Some((sub, upto, m)) = open.first() {
            let n = open.len();
            self.txn_violation(
                now_ms,
                "aborted-cumulative-ack-not-redelivered",
                format!("{sub}: {m}, covered by an aborted transactional cumulative ack up to {upto}, never acknowledged ({n} such)"),
            );
        }
    }
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests {
    use super::*;
    use crate::sim::checker::{MessageRef, OrderCheck};

    fn m(e: i64) -> MessageRef {
        MessageRef {
            position: Position::new(1, e),
            batch_index: 0,
        }
    }

    /// Two messages delivered to consumer 0, acknowledged cumulatively up
    /// to the second inside transaction 0 (receipted), its end requested.
    fn acked_in_txn(commit: bool) -> DeliveryChecker {
        let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::Total);
        for e in [1, 2] {
            c.published(m(e), 0, 0);
            c.delivered("s", 0, m(e), 1, 0);
        }
        c.txn_begun(0, 0, 60_000);
        c.txn_cumulative_acked(0, "s", Some(0), m(2).position, 2);
        c.txn_end_requested(0, commit, 3);
        c
    }

    fn first(c: DeliveryChecker) -> Option<String> {
        let (counts, first) = c.finish(100);
        (counts.violations() > 0).then(|| first.unwrap_or_default())
    }

    #[test]
    fn a_committed_cumulative_ack_acknowledges_what_it_covers() {
        let mut c = acked_in_txn(true);
        c.txn_ended(0, TxnOutcome::Committed, 4);
        assert_eq!(first(c), None);
    }

    #[test]
    fn committed_cumulative_ack_redelivered_names_a_delivery_after_the_commit() {
        let mut c = acked_in_txn(true);
        c.txn_ended(0, TxnOutcome::Committed, 4);
        c.txn_ack_delivery("s", m(1), 5);
        assert!(first(c)
            .unwrap()
            .contains("committed-cumulative-ack-redelivered"));
    }

    #[test]
    fn aborted_cumulative_ack_not_redelivered_names_what_it_left_unacknowledged() {
        for redelivered in [true, false] {
            let mut c = acked_in_txn(false);
            c.txn_ended(0, TxnOutcome::Aborted, 4);
            if redelivered {
                // Nothing of it applied: the consumer's redelivery request
                // gets both back, and they are acknowledged again.
                c.consumer_reconnected("s", 0);
                for e in [1, 2] {
                    c.txn_ack_delivery("s", m(e), 5);
                    c.delivered("s", 0, m(e), 5, 0);
                }
                c.cumulative_ack_applied("s", 0, m(2).position, 6);
                c.cumulative_acked("s", m(2).position);
                assert_eq!(first(c), None);
            } else {
                assert!(first(c)
                    .unwrap()
                    .contains("aborted-cumulative-ack-not-redelivered"));
            }
        }
    }

    #[test]
    fn cumulative_conflict_accepted_names_each_conflict_rule() {
        // At or below a persisted cumulative ack.
        let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::Total);
        for e in [1, 2, 3] {
            c.published(m(e), 0, 0);
            c.delivered("s", 0, m(e), 1, 0);
        }
        c.cumulative_acked("s", m(2).position);
        c.txn_begun(0, 0, 60_000);
        c.txn_cumulative_acked(0, "s", None, m(2).position, 2);
        assert!(first(c).unwrap().contains("cumulative-conflict-accepted"));
        // Not above its own pending one.
        let mut c = acked_in_txn(true);
        c.txn_cumulative_acked(0, "s", None, m(1).position, 3);
        assert!(first(c).unwrap().contains("cumulative-conflict-accepted"));
        // While another open transaction holds one; none once its end
        // was requested (the broker may have ended it).
        for ended in [false, true] {
            let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::Total);
            for e in [1, 2] {
                c.published(m(e), 0, 0);
                c.delivered("s", 0, m(e), 1, 0);
            }
            c.txn_begun(0, 0, 60_000);
            c.txn_begun(1, 0, 60_000);
            c.txn_cumulative_acked(0, "s", None, m(1).position, 2);
            if ended {
                c.txn_end_requested(0, false, 3);
            }
            c.txn_cumulative_acked(1, "s", None, m(2).position, 4);
            let (counts, first) = c.finish(100);
            assert_eq!(counts.txn_violations > 0, !ended, "{first:?}");
        }
    }

    #[test]
    fn a_transactional_cumulative_ack_covering_an_undelivered_message_is_invalid() {
        let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::Total);
        c.published(m(1), 0, 0);
        c.published(m(2), 0, 0);
        c.delivered("s", 0, m(2), 1, 0);
        c.txn_begun(0, 0, 60_000);
        c.txn_cumulative_acked(0, "s", Some(0), m(2).position, 2);
        assert!(first(c).unwrap().contains("not delivered to this consumer"));
    }
}
