//! Seek (Pulsar's `ServerCnx.handleSeek` → `PersistentSubscription.resetCursor`):
//! a consumer resets its subscription to a message id or to a publish
//! time, backward or forward.
//!
//! What a reset does, in Pulsar's order:
//!
//! 1. every consumer of the subscription is disconnected
//!    (`dispatcher.disconnectActiveConsumers(true)`): each gets
//!    CLOSE_CONSUMER and is removed; its client subscribes again and the
//!    new incarnation reads from the reset position;
//! 2. the cursor is reset (`ManagedCursorImpl.internalResetCursor`): the
//!    mark-delete becomes the position just before the target (backward or
//!    forward), every individually deleted range and batch ack set is
//!    cleared (the deletion state's reset epoch bracket), and a target
//!    inside a batch keeps the seek's `ack_set` for that entry (the indexes
//!    before the batch index stay acknowledged). The new state is persisted
//!    in ONE store write ([`ManagedCursor::persist_reset_deletion_state`]):
//!    a crash shows the old state or the reset one. A failed write restores
//!    the in-memory state and answers an error;
//! 3. the dispatcher forgets what it held for the old position: the replay
//!    set (`redeliveryMessages`, cleared once no consumer is left), the
//!    entries in flight and the redelivery counts; the delayed tracker
//!    follows the new mark-delete both ways (`reset_mark_delete`: what it
//!    holds above it stays tracked, entries re-read are added again,
//!    entries at or below it are acknowledged). Entries acknowledged in an
//!    open transaction stay in the pending-ack log, as in Pulsar;
//! 4. SUCCESS answers the request (`ERROR UnknownError` with "Error when
//!    resetting subscription: …" when the reset fails; `MetadataError`
//!    "Consumer not found" for an unknown consumer and "Message id and
//!    message publish time were not present" for a seek with neither).
//!
//! A publish-time seek finds the position as Pulsar's
//! `PersistentMessageFinder` does: the first entry after the newest entry
//! published before the time (`publish_time < t`), by a binary search over
//! the entries (publish times are assumed to grow with positions); the
//! first entry when none was published before, past the last entry when
//! all were.
//!
//! Acknowledgement semantics a checker relies on: a backward seek makes
//! every entry after the new mark-delete deliverable again, also ones that
//! were acknowledged; a forward seek acknowledges every entry it skips.

use crate::ledger::{ManagedCursor, ManagedLedger};
use crate::permits::broker::ConsumerKey;
use crate::proto::command::{self, server_error, ty, BrokerCommand, CommandIdRequest};
use crate::proto::wire::MessageIdData;
use crate::Position;

use super::output::Output;
use super::subscription::{within_batch, Leave, Subscription};
use super::{Broker, ConnectionId};

/// Where a seek's message id points: the entry the next read starts at.
/// Pulsar's `earliest` (ledger id -1, sent as its unsigned form) is the
/// first entry; an id past the last confirmed entry (`latest`:
/// `i64::MAX`) is the position just past it.
pub(crate) fn seek_target(ml: &ManagedLedger, m: &MessageIdData) -> Position {
    let last = ml.last_confirmed_entry();
    let end = ml.next_valid_position(last);
    let Ok(ledger_id) = i64::try_from(m.ledger_id) else {
        // The unsigned form of a negative ledger id: earliest.
        return Position::new(-1, 0);
    };
    let entry_id = match i64::try_from(m.entry_id) {
        Ok(e) if e <= i64::from(u32::MAX) => e,
        // (L, -1) sent unsigned: from the ledger's first entry.
        Err(_) if m.entry_id == u64::MAX => 0,
        _ => return end,
    };
    let p = Position::new(ledger_id, entry_id);
    if p.previous_in_ledger() > last {
        end
    } else {
        p
    }
}

/// The position a publish-time seek to `t` resets to (see the module
/// docs).
///
/// # Errors
/// An entry whose metadata cannot be read.
pub(crate) fn publish_time_target(ml: &ManagedLedger, t: u64) -> Result<Position, String> {
    // Every entry, by index across ledgers (lost ledgers hold none).
    let ledgers: Vec<(i64, i64)> = ml.ledgers().into_iter().filter(|(_, n)| *n > 0).collect();
    let total: i64 = ledgers.iter().map(|(_, n)| n).sum();
    let at = |mut i: i64| -> Position {
        for (l, n) in &ledgers {
            if i < *n {
                return Position::new(*l, i);
            }
            i -= n;
        }
        ml.next_valid_position(ml.last_confirmed_entry())
    };
    let published_before = |p: Position| -> Result<bool, String> {
        let e = ml
            .read_positions(&[p])
            .map_err(|e| format!("reading {p}: {e}"))?;
        let e = e.first().ok_or_else(|| format!("no entry at {p}"))?;
        let parsed = crate::proto::frame::parse_entry_payload(&e.data)
            .map_err(|e| format!("entry {p}: {e}"))?;
        Ok(parsed.metadata.publish_time < t)
    };
    // The first index whose entry was not published before t.
    let (mut lo, mut hi) = (0i64, total);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if published_before(at(mid))? {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    Ok(at(lo))
}

impl Subscription {
    /// Resets the subscription so that the next read starts at
    /// `read_from` (see the module docs): the deletion state's reset (its
    /// epoch path), the seek's `ack_set` kept for a batch target, ONE
    /// durable write, then the dispatcher's state cleared. Returns the new
    /// mark-delete. The caller removed the consumers first.
    ///
    /// # Errors
    /// A description of the failure (a target the deletion state refuses,
    /// an unreadable batch entry, the store's failure); the subscription is
    /// unchanged, in memory and in the store.
    pub(crate) fn reset_cursor(
        &mut self,
        ml: &ManagedLedger,
        read_from: Position,
        ack_set: &[i64],
    ) -> Result<Position, String> {
        let before = self.deletion.snapshot();
        let md = self
            .deletion
            .reset(read_from, ml)
            .map_err(|e| e.to_string())?;
        let persisted = self
            .seed_batch_position(ml, md, read_from, ack_set)
            .and_then(|()| {
                persist_reset(&self.cursor, self).map_err(|e| format!("persisting the reset: {e}"))
            });
        if let Err(e) = persisted {
            if let Err(r) = self.deletion.restore(before) {
                tracing::error!(error = %r, subscription = %self.name, "restoring the deletion state after a failed reset");
            }
            return Err(e);
        }
        self.replay.clear();
        self.inflight.clear();
        self.drop_read_in_flight();
        self.redelivery_count.clear();
        self.batch_sizes.clear();
        // Pulsar's tracker reads the cursor's mark-delete live: it follows
        // the reset both ways (what it holds above the new mark-delete stays
        // tracked; what the dispatcher re-reads is added again).
        self.tracker.reset_mark_delete(md);
        super::delayed_hooks::observe_tracker!(
            &*self,
            super::delayed_hooks::TrackerCall::MarkDelete(md)
        );
        self.counters.resets += 1;
        tracing::info!(subscription = %self.name, mark_delete = %md, "subscription reset");
        Ok(md)
    }

    /// A seek into a batch (`ack_set` present, the target an entry): the
    /// indexes the set marks acknowledged stay so (Pulsar re-seeds the
    /// reset position's ack set).
    fn seed_batch_position(
        &mut self,
        ml: &ManagedLedger,
        md: Position,
        read_from: Position,
        ack_set: &[i64],
    ) -> Result<(), String> {
        if ack_set.is_empty() || md.next_in_ledger() != read_from {
            return Ok(());
        }
        let size = self.batch_size_of(ml, read_from)?;
        let remaining = within_batch(ack_set, size);
        self.deletion
            .delete_batch_indexes(read_from, &remaining, ml)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

fn persist_reset(cursor: &ManagedCursor, s: &Subscription) -> Result<(), String> {
    cursor
        .persist_reset_deletion_state(&s.deletion)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

impl Broker {
    /// CommandSeek (see the module docs).
    pub(super) fn handle_seek(&mut self, conn: ConnectionId, s: command::CommandSeek) {
        let request_id = s.request_id;
        if s.message_id.is_none() && s.message_publish_time.is_none() {
            return self.error(
                conn,
                request_id,
                server_error::METADATA_ERROR,
                "Message id and message publish time were not present".into(),
            );
        }
        let Some(r) = self.consumer_ref(conn, s.consumer_id) else {
            return self.error(
                conn,
                request_id,
                server_error::METADATA_ERROR,
                "Consumer not found".into(),
            );
        };
        let Some(ml) = self.topics.get(&r.0).map(|t| std::sync::Arc::clone(&t.ml)) else {
            return self.error(
                conn,
                request_id,
                server_error::METADATA_ERROR,
                "Consumer not found".into(),
            );
        };
        let (target, ack_set, what) = match (&s.message_id, s.message_publish_time) {
            (Some(m), _) => (Ok(seek_target(&ml, m)), m.ack_set.clone(), "message id"),
            (None, Some(t)) => (publish_time_target(&ml, t), Vec::new(), "publish time"),
            (None, None) => unreachable!("checked above"),
        };
        let result = target.and_then(|target| {
            self.disconnect_consumers(&r.0, &r.1, "seek");
            let sub = self
                .topics
                .get_mut(&r.0)
                .and_then(|t| t.subscriptions.get_mut(&r.1))
                .ok_or_else(|| "subscription vanished".to_string())?;
            sub.reset_cursor(&ml, target, &ack_set)
        });
        match result {
            Ok(md) => {
                tracing::info!(conn, topic = %r.0, subscription = %r.1, mark_delete = %md, what, "reset subscription");
                self.success(conn, request_id);
            }
            Err(e) => {
                let prefix = if s.message_id.is_some() {
                    "Error when resetting subscription: "
                } else {
                    "Reset subscription to publish time error: "
                };
                self.error(
                    conn,
                    request_id,
                    server_error::UNKNOWN_ERROR,
                    format!("{prefix}{e}"),
                );
            }
        }
    }

    /// (topic, subscription) consumer `consumer_id` of `conn` is on.
    pub(crate) fn consumer_ref(
        &self,
        conn: ConnectionId,
        consumer_id: u64,
    ) -> Option<(String, String)> {
        self.conns
            .get(&conn)
            .and_then(|c| c.consumer_target(consumer_id))
    }

    /// Disconnects every consumer of `subscription` of `topic` (Pulsar's
    /// `disconnectActiveConsumers`): each gets CLOSE_CONSUMER (a
    /// broker-initiated close: request_id 0) and is removed without
    /// dispatching to the others; its permit ledger ends with `end`.
    pub(crate) fn disconnect_consumers(&mut self, topic: &str, subscription: &str, end: &str) {
        let Some(t) = self.topics.get_mut(topic) else {
            return;
        };
        let Some(sub) = t.subscriptions.get_mut(subscription) else {
            return;
        };
        let keys: Vec<ConsumerKey> = sub.consumers.iter().map(|c| c.key).collect();
        let active_before = sub.active_consumer();
        for key in &keys {
            self.out.frame(
                key.connection_id,
                &BrokerCommand {
                    r#type: ty::CLOSE_CONSUMER,
                    close_consumer: Some(CommandIdRequest {
                        id: key.consumer_id,
                        request_id: 0,
                    }),
                    ..Default::default()
                },
                Vec::new(),
            );
            for removed in sub.leave(*key, Leave::Disconnect) {
                if let Some(c) = sub.detach(&removed) {
                    let balance = (removed.permits, removed.unacked);
                    let record = c.record(&t.name, subscription, end, balance);
                    self.out.queue.push_back(Output::Incarnation(record));
                }
            }
        }
        sub.after_consumers_changed(active_before, None, &mut self.out);
        for key in keys {
            if let Some(c) = self.conns.get_mut(&key.connection_id) {
                c.forget_consumer(key.consumer_id);
            }
        }
    }
}
