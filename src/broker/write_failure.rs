//! Write completions of MESSAGE frames (PIP-491's write failure, Pulsar's
//! `Consumer.sendMessages` write listener), through the subscription's
//! [`SharedDispatcher::on_write_complete`] with the write id its
//! `send_to_consumer` issued. A written MESSAGE settles its write id. A
//! failed one removes the consumer incarnation it was for, as if it had
//! closed (Pulsar: `cnx.closeConsumer` + `subscription.removeConsumer`):
//! the client is sent CLOSE_CONSUMER and subscribes again as a new
//! incarnation, its unacknowledged entries go to replay for the other
//! consumers, and the P debited for the failed MESSAGE is never credited
//! to anyone (the incarnation that was debited is gone; the new one starts
//! from its own Flow). A consumer kept after a failed write would keep that
//! P debited for a MESSAGE its client never received: the client never
//! returns the permit, and the consumer's balance leaks until it stalls.
//!
//! [`SharedDispatcher::on_write_complete`]: crate::permits::broker::SharedDispatcher::on_write_complete

use super::output::SentMessage;
use super::{Broker, ConnectionId};
use crate::proto::command::{ty, BrokerCommand, CommandIdRequest};

impl Broker {
    /// The driver could not write the next `bytes` bytes of the frames
    /// queued for `conn` (after every byte already reported written or
    /// failed). Every consumer incarnation a failed MESSAGE was for is
    /// removed (CLOSE_CONSUMER to its client); the connection stays open.
    pub fn handle_write_failed(&mut self, conn: ConnectionId, bytes: usize, now_ms: u64) {
        self.tick(now_ms);
        if let Some(b) = self.out.outbound.get_mut(&conn) {
            *b = b.saturating_sub(bytes);
        }
        for m in self.out.completed(conn, bytes) {
            self.write_completed(conn, m, Err("MESSAGE write failed".into()));
        }
        self.dispatch_connection(conn);
    }

    /// Reports the outcome of `m`'s write to the dispatcher of the
    /// subscription its incarnation is attached to (none: the incarnation
    /// left, and its writes with it). A failure the dispatcher answers by
    /// removing the consumer ends the incarnation here.
    pub(super) fn write_completed(
        &mut self,
        conn: ConnectionId,
        m: SentMessage,
        outcome: Result<(), String>,
    ) {
        let Some(sub) = self.subscription_of(&m) else {
            return;
        };
        let active_before = sub.active_consumer();
        let removed = match sub.dispatcher.on_write_complete(m.write_id, outcome) {
            Ok(Some(removed)) => removed,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(conn, consumer = ?m.consumer, error = %e, "write completion of an unknown write");
                return;
            }
        };
        tracing::warn!(conn, consumer = ?m.consumer, position = %m.position, "MESSAGE write failed: consumer removed");
        let Some((topic, subscription)) = self
            .conns
            .get(&conn)
            .and_then(|c| c.consumer_target(m.consumer.consumer_id))
        else {
            return;
        };
        // Pulsar's broker-initiated CloseConsumer (no request of the client:
        // request_id 0), queued before what the removal hands to the other
        // consumers (`cnx.closeConsumer`); the client subscribes again.
        self.out.frame(
            conn,
            &BrokerCommand {
                r#type: ty::CLOSE_CONSUMER,
                close_consumer: Some(CommandIdRequest {
                    id: m.consumer.consumer_id,
                    request_id: 0,
                }),
                ..Default::default()
            },
            Vec::new(),
        );
        if let Some(c) = self.conns.get_mut(&conn) {
            c.forget_consumer(m.consumer.consumer_id);
        }
        self.end_incarnations(
            &topic,
            &subscription,
            active_before,
            vec![removed],
            "write failed",
        );
    }
}
