//! Group commit of acknowledgements: the (non-transactional) acks of one
//! driver turn share one persist of their subscription's deletion state,
//! and every ack receipt (`ACK_RESPONSE`) waits for that commit.
//!
//! An ACK is applied to the subscription's in-memory deletion state when
//! its frame arrives ([`Broker::handle_frame`]); the subscription is marked
//! dirty and the receipt, when the client asked for one (`request_id`), is
//! held here. [`Broker::flush`] (which [`Broker::poll_output`] runs before
//! it hands out anything) persists every dirty subscription's deletion
//! state in one store transaction each (mark-delete, individually deleted
//! ranges, batch ack sets: `ManagedCursor::persist_deletion_state`), then
//! releases that subscription's held receipts: success when its commit
//! completed, Pulsar's `UnknownError` with the store's message when it
//! failed (as a synchronous ack's failure is answered), and only then
//! settles the consumers' pending acks and dispatches. A receipt is never
//! queued before the commit of the ack it confirms; a crash before the
//! commit loses only acks no client saw a receipt for (Pulsar redelivers
//! them, at-least-once).
//!
//! Bound: a group is one turn of the driver (the frames it hands the core
//! before it next polls), so the added delay is the time the driver takes
//! to handle the frames of one turn, and the group's size is what the turn
//! carries (`serve`: the socket reads of every connection queued for the
//! core while the previous turn ran; the simulator's node engine: every
//! delivery of bytes at one virtual instant). A driver
//! that polls after every frame gets one commit per ack, as without
//! grouping.
//!
//! The turn's SENDs are committed first, in one transaction of their own
//! (`send_commit.rs`). Every commit of the turn (these, the SENDs',
//! transactional acks', END_TXN's) is made durable by one fsynced commit at
//! the end of the turn (`turn_commit.rs`), before any reply leaves.

use std::collections::BTreeSet;

use crate::proto::command::{self, server_error, ty, BrokerCommand};

use super::{Broker, ConnectionId};

/// An ack receipt waiting for its subscription's commit.
#[derive(Debug)]
struct HeldReceipt {
    topic: String,
    subscription: String,
    conn: ConnectionId,
    consumer_id: u64,
    request_id: u64,
}

/// The acks of the current turn: subscriptions to persist, receipts to
/// release after.
#[derive(Debug, Default)]
pub(crate) struct AckGroup {
    /// (topic, subscription) whose deletion state changed since the last
    /// flush.
    dirty: BTreeSet<(String, String)>,
    held: Vec<HeldReceipt>,
}

impl AckGroup {
    /// Whether a flush has work.
    pub(crate) fn is_empty(&self) -> bool {
        self.dirty.is_empty() && self.held.is_empty()
    }

    /// Marks `(topic, subscription)` for the next commit.
    pub(crate) fn mark(&mut self, topic: &str, subscription: &str) {
        self.dirty
            .insert((topic.to_string(), subscription.to_string()));
    }

    /// Holds the receipt of ack `request_id` until the commit of
    /// `(topic, subscription)`.
    pub(crate) fn hold(
        &mut self,
        topic: &str,
        subscription: &str,
        conn: ConnectionId,
        consumer_id: u64,
        request_id: u64,
    ) {
        self.held.push(HeldReceipt {
            topic: topic.to_string(),
            subscription: subscription.to_string(),
            conn,
            consumer_id,
            request_id,
        });
    }
}

/// `CommandAckResponse` of a non-transactional ack (`error` set on failure).
pub(crate) fn ack_response(
    consumer_id: u64,
    request_id: u64,
    result: &Result<(), String>,
) -> BrokerCommand {
    let (error, message) = match result {
        Ok(()) => (None, None),
        Err(e) => (Some(server_error::UNKNOWN_ERROR), Some(e.clone())),
    };
    BrokerCommand {
        r#type: ty::ACK_RESPONSE,
        ack_response: Some(command::CommandAckResponse {
            consumer_id,
            txnid_least_bits: None,
            txnid_most_bits: None,
            error,
            message,
            request_id: Some(request_id),
        }),
        ..Default::default()
    }
}

impl Broker {
    /// Ends the driver's turn: commits the turn's SENDs (one store
    /// transaction, then their receipts), persists the deletion state of every
    /// subscription acknowledged since the last flush (one store commit per
    /// subscription, whatever the number of acks), then releases their ack
    /// receipts (an error receipt when the commit failed) and dispatches
    /// them; last, makes every commit of the turn durable with one fsynced
    /// commit (`turn_commit.rs`) before any output of the turn may leave.
    /// [`Broker::poll_output`] calls it, so a driver needs to call it
    /// only to end a turn without polling.
    ///
    /// # Blocking
    /// Yes: the turn's commits and its one fsync, on the calling thread.
    pub fn flush(&mut self) {
        self.commit_sends();
        self.commit_acks();
        self.commit_turn();
    }

    /// The turn's acks: one persist per acknowledged subscription, then
    /// their receipts and dispatch.
    fn commit_acks(&mut self) {
        if self.acks.is_empty() {
            return;
        }
        let group = std::mem::take(&mut self.acks);
        let mut results = Vec::with_capacity(group.dirty.len());
        for (topic, subscription) in &group.dirty {
            let result = match self
                .topics
                .get_mut(topic)
                .and_then(|t| t.subscriptions.get_mut(subscription))
            {
                Some(s) => s.persist_and_settle(),
                None => Err(format!("subscription {subscription} of {topic} is gone")),
            };
            if let Err(e) = &result {
                tracing::warn!(topic, subscription, error = %e, "group commit of acks failed");
            }
            results.push(((topic, subscription), result));
        }
        for h in &group.held {
            let result = results
                .iter()
                .find(|((t, s), _)| **t == h.topic && **s == h.subscription)
                .map_or(Ok(()), |(_, r)| r.clone());
            if let Err(e) = &result {
                tracing::warn!(conn = h.conn, error = %e, "ack failed");
            }
            let resp = ack_response(h.consumer_id, h.request_id, &result);
            self.out.frame(h.conn, &resp, Vec::new());
        }
        for ((topic, subscription), result) in &results {
            if result.is_ok() {
                self.dispatch_sub(topic, subscription);
            }
        }
    }
}
