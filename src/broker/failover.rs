//! Failover's active consumer (Pulsar's
//! `PersistentDispatcherSingleActiveConsumer` /
//! `AbstractDispatcherSingleActiveConsumer`): on a change of the active
//! consumer the dispatcher rewinds to the mark-delete, so every entry not
//! yet acknowledged reaches the new active consumer in publish order
//! before any newer entry (the former active consumer's unacknowledged
//! entries included), and `ACTIVE_CONSUMER_CHANGE` tells each consumer of
//! the subscription whether it is the active one.
//!
//! The active consumer is the first in (priority level, consumer name)
//! order ([`super::subscription::Subscription::add_consumer`] keeps that
//! order). Pulsar notifies only Failover subscriptions and only clients of
//! protocol version 12 or later (`Commands.peerSupportsActiveConsumerListener`).

use crate::permits::broker::ConsumerKey;
use crate::Position;

use super::output::Outbox;
use super::subscription::{sub_type, Subscription};
use crate::proto::command::{ty, BrokerCommand, CommandActiveConsumerChange};

/// First protocol version whose clients understand `ACTIVE_CONSUMER_CHANGE`
/// (`ProtocolVersion.v12`).
pub const ACTIVE_CONSUMER_LISTENER_VERSION: i32 = 12;

impl Subscription {
    /// The consumer dispatch sends to on an Exclusive or Failover
    /// subscription (`None` for Shared / Key_Shared or with no consumer).
    pub fn active_consumer(&self) -> Option<ConsumerKey> {
        match self.sub_type {
            sub_type::EXCLUSIVE | sub_type::FAILOVER => self.consumers.first().map(|c| c.key),
            _ => None,
        }
    }

    /// After the consumer set changed (`before` was the active consumer):
    /// if the active consumer of a Failover subscription changed, rewinds
    /// the dispatcher to the mark-delete and notifies the consumers.
    /// `added` is a consumer that just subscribed: when the active
    /// consumer stayed, it alone learns which one is active (Pulsar's
    /// `addConsumer`). The caller dispatches afterwards.
    pub(crate) fn after_consumers_changed(
        &mut self,
        before: Option<ConsumerKey>,
        added: Option<ConsumerKey>,
        out: &mut Outbox,
    ) {
        if self.sub_type != sub_type::FAILOVER {
            return;
        }
        let Some(active) = self.active_consumer() else {
            return;
        };
        if before == Some(active) {
            if let Some(c) = added.and_then(|k| self.consumers.iter().find(|c| c.key == k)) {
                notify(out, c.conn, c.key.consumer_id, false);
            }
            return;
        }
        if before.is_some() {
            self.counters.active_consumer_changes += 1;
            let held = self.inflight.keys().chain(self.replay.keys());
            self.counters.failover_handover_entries +=
                held.collect::<std::collections::BTreeSet<_>>().len() as u64;
        }
        self.rewind_to_mark_delete();
        for c in &self.consumers {
            notify(out, c.conn, c.key.consumer_id, c.key == active);
        }
    }

    /// Rewinds the dispatcher to the mark-delete (Pulsar's `cursor.rewind()`
    /// on an active-consumer change): what any consumer was sent and has not
    /// acknowledged is released (its PIP-491 pending entry settled without
    /// a credit, as a redelivery does) and read again from the cursor, in
    /// position order; the replay set is emptied, as the cursor covers it.
    pub(crate) fn rewind_to_mark_delete(&mut self) {
        let pending: Vec<(ConsumerKey, Position)> = self
            .dispatcher
            .consumers()
            .flat_map(|c| c.pending_acks().keys().map(move |p| (c.key(), *p)))
            .collect();
        for (key, p) in pending {
            let _ = self.dispatcher.acknowledge(key, p);
        }
        self.inflight.clear();
        self.replay.clear();
        self.drop_read_in_flight();
        self.cursor.rewind();
        tracing::debug!(subscription = %self.name, read_position = %self.cursor.read_position(), "failover: rewound to the mark-delete");
    }
}

/// Queues `ACTIVE_CONSUMER_CHANGE` for consumer `consumer_id` on `conn`,
/// if the connection's client understands it.
fn notify(out: &mut Outbox, conn: super::ConnectionId, consumer_id: u64, is_active: bool) {
    if !out.active_listeners.contains(&conn) {
        return;
    }
    out.frame(
        conn,
        &BrokerCommand {
            r#type: ty::ACTIVE_CONSUMER_CHANGE,
            active_consumer_change: Some(CommandActiveConsumerChange {
                consumer_id,
                is_active: Some(is_active),
            }),
            ..Default::default()
        },
        Vec::new(),
    );
}
