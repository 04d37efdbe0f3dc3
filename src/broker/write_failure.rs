//! A failed write of queued frames (PIP-491's write failure, Pulsar's
//! `Consumer.sendMessages` write listener): the consumer incarnation a
//! failed MESSAGE was for is removed, as if it had closed (Pulsar:
//! `cnx.closeConsumer` + `subscription.removeConsumer`): the client is sent
//! CLOSE_CONSUMER and subscribes again as a new incarnation, its
//! unacknowledged entries go to replay for the other consumers, and the P
//! debited for the failed MESSAGE is never credited to anyone (the
//! incarnation that was debited is gone; the new one starts from its own
//! Flow). A consumer kept after a failed write would keep that P debited
//! for a MESSAGE its client never received: the client never returns the
//! permit, and the consumer's balance leaks until it stalls.

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
        let failed = self.out.completed(conn, bytes);
        let mut seen = Vec::new();
        for m in failed {
            if !seen.contains(&(m.consumer, m.incarnation)) {
                seen.push((m.consumer, m.incarnation));
                self.write_failed(conn, m);
            }
        }
        self.dispatch_connection(conn);
    }

    /// Removes the incarnation `m` was sent to, if it is still attached.
    fn write_failed(&mut self, conn: ConnectionId, m: SentMessage) {
        let live = self.topics.values().any(|t| {
            t.subscriptions.values().any(|s| {
                s.consumers
                    .iter()
                    .any(|c| c.key == m.consumer && c.incarnation == m.incarnation)
            })
        });
        if !live {
            return;
        }
        tracing::warn!(conn, consumer = ?m.consumer, position = %m.position, "MESSAGE write failed: removing the consumer");
        // Pulsar's broker-initiated CloseConsumer (no request of the client:
        // request_id 0), queued before the removal (`cnx.closeConsumer`);
        // the client subscribes again.
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
        // After the notice: what the removal hands to other consumers is
        // queued behind it.
        crate::trace::permits::broker_remove((conn, m.consumer.consumer_id), "write");
        self.remove_consumer_of(conn, m.consumer.consumer_id, "write failed");
    }
}
