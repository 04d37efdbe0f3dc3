//! Transactional cumulative acks of the Failover consumers, over real
//! frames: a `CommandAck` with `ack_type` Cumulative, the one message id it
//! acknowledges up to, `txnid_least_bits` / `txnid_most_bits` of the open
//! transaction and a `request_id` (its ACK_RESPONSE carries the transaction
//! id, and `TransactionConflict` when Pulsar's pending-ack conflict rules
//! refuse it), as Pulsar's Java client sends
//! `consumer.acknowledgeCumulativeAsync(id, txn)`.
//!
//! The application acknowledges as a transactional consume loop does: a
//! consumer whose cumulative ack went into transaction `k` puts its later
//! cumulative acks into `k` while `k` takes acks, and holds them back once
//! `k` is ending, until `k` ended. A cumulative ack inside a batch (an
//! `ack_set`) is never transactional. At the end of `k`:
//!
//! - committed: the mark-delete moved to the ack's position (the checker
//!   counts everything up to it acknowledged);
//! - aborted (END_TXN abort, a refused commit, or its timeout): nothing of
//!   it was applied; the consumer, still in the incarnation that acked,
//!   asks for its unacknowledged messages again
//!   (REDELIVER_UNACKNOWLEDGED_MESSAGES with a bumped epoch), so everything
//!   after the previous mark-delete comes back to it in order.
//!
//! A refused one (`TransactionConflict`: at or below the mark-delete, below
//! the transaction's own pending cumulative ack, or while another
//! transaction holds one; or any other error) is sent again without the
//! transaction, which is then aborted. The checker's rules for them:
//! `checker::txn_cumulative`.

use crate::broker::txn::TxnId;
use crate::sim::checker::TxnOutcome;

use super::client::OutAck;
use super::{Ev, Node};

/// How a consumer's next cumulative ack goes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CumulativeChoice {
    /// Without a transaction.
    Plain,
    /// Inside transaction (number, id) (counted in flight).
    Txn(u64, TxnId),
    /// Not now: the transaction holding this consumer's cumulative ack is
    /// ending (the ack waits for its end).
    Wait,
}

impl Node<'_> {
    /// How consumer `c`'s next cumulative ack goes out (`within`: inside a
    /// batch, with an `ack_set`).
    pub(super) fn txn_cumulative_choice(&mut self, c: usize, within: bool) -> CumulativeChoice {
        if let Some((k, _)) = self.consumers[c].cum_txn {
            return match self.txn_open_for_acks(k) {
                Some(id) if !within => CumulativeChoice::Txn(k, id),
                Some(_) => {
                    self.txn_ack_unused(k);
                    CumulativeChoice::Wait
                }
                None => CumulativeChoice::Wait,
            };
        }
        if within {
            return CumulativeChoice::Plain;
        }
        match self.txn_for_ack() {
            Some((k, id)) => CumulativeChoice::Txn(k, id),
            None => CumulativeChoice::Plain,
        }
    }

    /// Whether an ack of subscription `sub` (index) may already be in the
    /// cursor without the client knowing it (a resend not receipted, an
    /// ack of an earlier era in flight, or a transactional cumulative ack
    /// whose commit is requested and not answered): until then the client
    /// cannot tell what a cumulative ack may cover.
    pub(super) fn cumulative_unsettled(&self, sub: usize) -> bool {
        self.consumers.iter().any(|o| {
            o.sub == sub
                && (o.acks_unsettled()
                    || o.cum_txn.is_some_and(|(k, _)| self.txn_commit_in_flight(k)))
        })
    }

    /// The ACK_RESPONSE of consumer `c`'s transactional cumulative ack.
    pub(super) fn txn_cumulative_settled(&mut self, c: usize, ack: OutAck, error: Option<i32>) {
        let (Some((k, _)), Some(upto)) = (ack.txn, ack.cumulative) else {
            return;
        };
        let now = self.now();
        let sub_idx = self.consumers[c].sub;
        let sub = self.subs[sub_idx].clone();
        self.txn_cumulative_op_settled(k, error.is_none());
        match error {
            Some(e) => {
                self.txn.activity.acks_refused += 1;
                if e == crate::proto::command::server_error::TRANSACTION_CONFLICT {
                    self.activity.txn_cumulative_conflicts += 1;
                }
                // Acknowledged again without the transaction (which is
                // aborted: an op of it was refused).
                self.send_ack(c, OutAck { txn: None, ..ack });
            }
            None => {
                self.activity.cumulative_acks += 1;
                self.activity.txn_cumulative_acks += 1;
                let co = &self.consumers[c];
                let current = ack.era == co.era && !self.cumulative_unsettled(sub_idx);
                let id = co.id;
                self.checker
                    .txn_cumulative_acked(k, &sub, current.then_some(id), upto, now);
            }
        }
    }

    /// Transaction `k` ended with `outcome` (as the client learned it, or
    /// its timeout passed): the consumers whose cumulative ack it held go
    /// on; after an abort, one still in the incarnation that acked asks for
    /// its unacknowledged messages again.
    pub(super) fn txn_cumulative_ended(&mut self, k: u64, outcome: TxnOutcome) {
        for c in 0..self.consumers.len() {
            let co = &mut self.consumers[c];
            let Some((held, era)) = co.cum_txn.filter(|(held, _)| *held == k) else {
                continue;
            };
            let _ = held;
            co.cum_txn = None;
            if outcome == TxnOutcome::Aborted && co.era == era {
                self.redeliver(c);
            }
            let co = &mut self.consumers[c];
            if !co.poll_scheduled {
                co.poll_scheduled = true;
                self.sched.after(1, Ev::Poll(c));
            }
        }
    }
}
