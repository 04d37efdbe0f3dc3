//! Unsubscribe (Pulsar's `ServerCnx.handleUnsubscribe` →
//! `Consumer.doUnsubscribe` → `PersistentSubscription.doUnsubscribe` /
//! `delete`): the subscription and its cursor are deleted.
//!
//! - Allowed when the asking consumer is the subscription's only consumer
//!   (`dispatcher.canUnsubscribe`), or with `force = 3` set, which first
//!   disconnects every other consumer (CLOSE_CONSUMER). Otherwise:
//!   `ERROR MetadataError` "Unconnected or shared consumer attempting to
//!   unsubscribe", and nothing changes. An unknown consumer:
//!   `MetadataError` "Consumer not found".
//! - The cursor is deleted from the store in ONE write (mark-delete,
//!   ranges, compact deletion state, properties:
//!   [`LedgerStore::delete_cursor`]); from then on it holds no ledger
//!   against consumed-ledger trimming (`lifecycle.rs`), and a restart does
//!   not bring it back. The delayed tracker's bucket snapshots are
//!   deleted with it (its `clear`). Then SUCCESS. A failed store write
//!   answers `PersistenceError` and keeps the subscription (its consumer
//!   too).
//! - A non-durable subscription (a reader's) has nothing in the store: it
//!   is dropped.

use crate::ledger::LedgerStore;
use crate::proto::command::server_error;

use super::{Broker, ConnectionId};

impl Broker {
    /// CommandUnsubscribe (see the module docs).
    pub(super) fn handle_unsubscribe(
        &mut self,
        conn: ConnectionId,
        consumer_id: u64,
        request_id: u64,
        force: bool,
    ) {
        let Some((topic, name)) = self.consumer_ref(conn, consumer_id) else {
            return self.error(
                conn,
                request_id,
                server_error::METADATA_ERROR,
                "Consumer not found".into(),
            );
        };
        let Some(sub) = self
            .topics
            .get(&topic)
            .and_then(|t| t.subscriptions.get(&name))
        else {
            return self.error(
                conn,
                request_id,
                server_error::METADATA_ERROR,
                "Consumer not found".into(),
            );
        };
        let only = sub.consumers.len() == 1
            && sub
                .consumers
                .iter()
                .all(|c| c.conn == conn && c.key.consumer_id == consumer_id);
        if !only && !force {
            return self.error(
                conn,
                request_id,
                server_error::METADATA_ERROR,
                "Unconnected or shared consumer attempting to unsubscribe".into(),
            );
        }
        let durable = sub.is_durable();
        if durable {
            if let Err(e) = self.store.delete_cursor(&topic, &name) {
                tracing::warn!(conn, topic, subscription = name, error = %e, "unsubscribe: deleting the cursor failed");
                return self.error(
                    conn,
                    request_id,
                    server_error::PERSISTENCE_ERROR,
                    format!("deleting subscription {name}: {e}"),
                );
            }
        }
        // The asking consumer is closed (no CLOSE_CONSUMER: it asked), the
        // others are disconnected.
        self.remove_consumer_of(conn, consumer_id, "unsubscribed");
        self.disconnect_consumers(&topic, &name, "unsubscribed");
        if let Some(t) = self.topics.get_mut(&topic) {
            if let Some(s) = t.subscriptions.remove(&name) {
                if let Err(e) = s.tracker.clear() {
                    tracing::warn!(topic, subscription = name, error = %e, "unsubscribe: delayed bucket snapshots not deleted");
                }
                s.cursor.close();
            }
        }
        tracing::info!(
            conn,
            topic,
            subscription = name,
            force,
            durable,
            "unsubscribed"
        );
        self.success(conn, request_id);
    }
}
