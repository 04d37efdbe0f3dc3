//! Transactional acks of deleted messages (`faults.txn_acks_of_deleted`):
//! after every [`PROBE_EVERY`]-th receipt of a consumer's individual
//! (non-transactional) ack while a transaction is open, the consumer sends
//! an ACK of the same message ids inside that transaction. Their receipt
//! says they are deleted in the subscription (individually, by batch index,
//! or below the mark-delete), so the core must refuse the transactional ack
//! with an error (Pulsar's `PendingAckHandleImpl` checks the subscription's
//! cursor: `TransactionConflictException`) and write nothing. An answer
//! without an error is a violation. Refused, the probe changes nothing in
//! the core, and its transaction is not touched (it is not one of the
//! transaction's acks).

use std::collections::BTreeMap;

use crate::proto::command::{ty, BrokerCommand, CommandAckResponse};
use crate::proto::wire::{self, CommandAck, MessageIdData};

use super::client::CONSUMER_ID;
use super::wire::frame;
use super::Node;

/// One probe per this many ack receipts (of every consumer).
const PROBE_EVERY: u64 = 16;
/// Request ids of the probes (far above a consumer's own).
const PROBE_REQUEST_BASE: u64 = 1 << 62;

/// The probes of a run.
#[derive(Debug, Default)]
pub(super) struct Probes {
    /// Individual ack receipts counted.
    receipts: u64,
    /// Probes sent.
    sent: u64,
    /// Probes without an answer: (connection, request id) → (consumer,
    /// message ids).
    in_flight: BTreeMap<(u64, u64), (usize, Vec<MessageIdData>)>,
}

impl Node<'_> {
    /// Consumer `c`'s individual ack of `ids` was receipted: every
    /// [`PROBE_EVERY`]-th time, with a transaction open, acknowledge them
    /// again inside it.
    pub(super) fn probe_deleted_ack(&mut self, c: usize, ids: &[MessageIdData]) {
        if !self.w.faults.txn_acks_of_deleted || !self.opts.faults || ids.is_empty() {
            return;
        }
        self.probes.receipts += 1;
        if !self.probes.receipts.is_multiple_of(PROBE_EVERY) {
            return;
        }
        let (Some(txn), Some(conn)) = (self.any_txn_open_for_acks(), self.consumers[c].conn) else {
            return;
        };
        let req = PROBE_REQUEST_BASE + self.probes.sent;
        self.probes.sent += 1;
        let cmd = BrokerCommand {
            r#type: ty::ACK,
            ack: Some(CommandAck {
                consumer_id: CONSUMER_ID,
                ack_type: 0,
                message_id: ids.to_vec(),
                validation_error: None,
                txnid_least_bits: Some(txn.least_sig_bits),
                txnid_most_bits: Some(txn.most_sig_bits),
                request_id: Some(req),
            }),
            ..Default::default()
        };
        self.probes.in_flight.insert((conn, req), (c, ids.to_vec()));
        self.send_to_broker(conn, frame(&cmd, Vec::new()));
    }

    /// An ACK_RESPONSE on `conn`: `true` if it answers a probe (judged
    /// here), `false` if it is the consumer's own.
    pub(super) fn probe_answered(&mut self, conn: u64, r: &CommandAckResponse) -> bool {
        let Some(req) = r.request_id.filter(|q| *q >= PROBE_REQUEST_BASE) else {
            return false;
        };
        let Some((c, ids)) = self.probes.in_flight.remove(&(conn, req)) else {
            return true; // of a connection since lost
        };
        if r.error.is_some() {
            self.activity.txn_acks_of_deleted_refused += 1;
            return true;
        }
        let sub = self.subs[self.consumers[c].sub].clone();
        // An entry, or the batch indexes its `ack_set` acknowledges.
        let what: Vec<String> = ids
            .iter()
            .map(|m| {
                let size = m.batch_size.unwrap_or(0).max(0) as u32;
                let acked: Vec<String> = (0..size)
                    .filter(|i| !m.ack_set.is_empty() && !wire::is_deliverable(&m.ack_set, *i))
                    .map(|i| i.to_string())
                    .collect();
                if acked.is_empty() {
                    format!("{}:{}", m.ledger_id, m.entry_id)
                } else {
                    format!("{}:{}#{}", m.ledger_id, m.entry_id, acked.join(","))
                }
            })
            .collect();
        let now = self.now();
        self.checker.replay_violation(
            &sub,
            &format!(
                "transactional ack of a deleted entry accepted: {} already acknowledged (receipt seen), acknowledged again inside a transaction (Pulsar: TransactionConflictException)",
                what.join(", ")
            ),
            now,
        );
        true
    }
}
