//! Negative acks on the node engine (`negative_ack_ratio`): the
//! application negatively acknowledges a seeded fraction of the messages it
//! takes instead of acknowledging them; once it is done with an entry's
//! delivery (no message of that entry left in its queue), the client sends
//! the entry's id in one REDELIVER_UNACKNOWLEDGED_MESSAGES with
//! `message_ids`, as Pulsar's client does after its negative-ack delay
//! (`NegativeAcksTracker` → `redeliverUnacknowledgedMessages(Set<MessageId>)`).
//! The core puts the entry back for redelivery with the indexes still
//! unacknowledged (a partial batch: `ack_set`, P below the batch size).
//! The checker allows exactly one redelivery, to any consumer, of each
//! negatively acknowledged message and of every other message of the
//! named entries its holder still has unacknowledged (the request names
//! entries: an index taken under a transactional ack the core refused
//! comes back with them).

use rand::Rng;

use crate::proto::command::{ty, BrokerCommand};
use crate::proto::wire::{CommandRedeliverUnacknowledgedMessages, MessageIdData};
use crate::sim::checker::MessageRef;

use super::client::CONSUMER_ID;
use super::wire::frame;
use super::Node;

impl Node<'_> {
    /// Whether the application negatively acknowledges the message it
    /// takes now.
    pub(super) fn nack_drawn(&mut self) -> bool {
        let r = self.w.negative_ack_ratio;
        r > 0.0 && self.opts.faults && self.rng.random_bool(r.clamp(0.0, 1.0))
    }

    /// Sends the negative acks of consumer `c` whose entries' deliveries
    /// the application is done with (after the acks of the same poll, so
    /// the redelivery leaves the acknowledged indexes out).
    pub(super) fn send_nacks(&mut self, c: usize) {
        let co = &mut self.consumers[c];
        let era = co.era;
        // Negative acks of an earlier incarnation are moot: it ended, and
        // everything it held comes back anyway.
        co.nacks.retain(|_, (e, _)| *e == era);
        let done: Vec<_> = co
            .nacks
            .keys()
            .copied()
            .filter(|p| !co.app.iter().any(|(_, r)| r.position == *p))
            .collect();
        if done.is_empty() {
            return;
        }
        let Some(conn) = co.conn else {
            return;
        };
        let mut ids = Vec::new();
        let mut entries = Vec::new();
        let mut msgs: Vec<MessageRef> = Vec::new();
        for p in done {
            if let Some((_, ms)) = co.nacks.remove(&p) {
                entries.push(p);
                ids.push(MessageIdData {
                    ledger_id: p.ledger_id as u64,
                    entry_id: p.entry_id as u64,
                    ..Default::default()
                });
                msgs.extend(ms);
            }
        }
        let (sub, id) = (self.subs[co.sub].clone(), co.id);
        let cmd = BrokerCommand {
            r#type: ty::REDELIVER_UNACKNOWLEDGED_MESSAGES,
            redeliver_unacknowledged_messages: Some(CommandRedeliverUnacknowledgedMessages {
                consumer_id: CONSUMER_ID,
                message_ids: ids,
                consumer_epoch: None,
            }),
            ..Default::default()
        };
        // A message another incarnation's ack settled first (the entry was
        // redelivered here before that ack landed) needs no redelivery.
        msgs.retain(|m| !self.checker.is_settled(&sub, *m));
        self.activity.negative_acks += msgs.len() as u64;
        self.checker.nacked(&sub, id, &msgs, self.now());
        // The request names entries: the core gives back every message of
        // them this incarnation still holds unacknowledged (one whose
        // transactional ack was refused, say), not only the negatively
        // acknowledged ones.
        self.checker
            .redelivery_requested(&sub, id, &entries, self.now());
        self.send_to_broker(conn, frame(&cmd, Vec::new()));
    }
}
