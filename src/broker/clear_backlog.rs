//! Admin clear-backlog (Pulsar `PersistentSubscription.clearBacklog`,
//! `pulsar-admin topics clear-backlog`): the subscription's cursor
//! mark-deletes the topic's last entry with no individually deleted
//! ranges (`ManagedCursor.asyncClearBacklog`), then the dispatcher clears
//! its delayed messages (`clearDelayedMessages`: the bucket tracker's
//! `clear`, which deletes every bucket snapshot). The tracker is then
//! given the new mark-delete, so what a failed `clear` kept is untracked,
//! and the buckets left below it are trimmed. Every unacknowledged entry
//! published so far is skipped; the consumers stay attached, their pending
//! entries settled as acknowledged.

use crate::Position;

use super::error::{comp, BrokerError};
use super::Broker;

/// What a clear-backlog did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BacklogCleared {
    /// The subscription's mark-delete now (the topic's last entry then).
    pub mark_delete: Position,
    /// Whether the delayed tracker's `clear` removed every bucket (`false`:
    /// a snapshot could not be deleted; the mark-delete untracked what it
    /// kept and the trim removed what it could).
    pub delayed_cleared: bool,
}

impl Broker {
    /// Clears the backlog of subscription `subscription` of `topic` at
    /// `now_ms`, then dispatches it.
    ///
    /// # Errors
    /// [`BrokerError::InvalidTopic`] for a bad name,
    /// [`BrokerError::Component`] for a topic or subscription that is not
    /// open, or a store failure of the mark-delete (nothing changed then).
    pub fn clear_backlog(
        &mut self,
        topic: &str,
        subscription: &str,
        now_ms: u64,
    ) -> Result<BacklogCleared, BrokerError> {
        self.tick(now_ms);
        let name = super::normalize_topic(topic)?;
        let t = self
            .topics
            .get_mut(&name)
            .ok_or_else(|| BrokerError::Component(format!("topic {name} is not open")))?;
        let ml = &t.ml;
        let s = t.subscriptions.get_mut(subscription).ok_or_else(|| {
            BrokerError::Component(format!("subscription {subscription} of {name} is not open"))
        })?;
        let last = ml.last_confirmed_entry();
        let md = last.max(s.deletion.mark_delete_position());
        // Durable first (nothing changes when it fails): mark-delete at the
        // last entry, no individually deleted ranges above it.
        if md > s.deletion.mark_delete_position() {
            s.cursor.mark_delete(md).map_err(comp)?;
            s.deletion.mark_delete(md, &**ml).map_err(comp)?;
        }
        let cleared = s.tracker.clear();
        super::delayed_hooks::observe_tracker!(
            &*s,
            super::delayed_hooks::TrackerCall::Cleared {
                ok: cleared.is_ok()
            }
        );
        if let Err(e) = &cleared {
            tracing::warn!(subscription, error = %e, "clear-backlog: delayed tracker clear failed; trimming below the mark-delete");
        }
        // The tracker's mark-delete (untracks what a failed clear kept) and
        // the settling of every consumer's pending entries, replay and
        // in-flight bookkeeping.
        s.persist_and_settle().map_err(BrokerError::Component)?;
        if cleared.is_err() {
            if let Err(e) = s.tracker.trim_and_merge() {
                tracing::warn!(subscription, error = %e, "clear-backlog: trim after a failed clear");
            }
        }
        s.counters.backlogs_cleared += 1;
        tracing::info!(topic = %name, subscription, mark_delete = %md, delayed_cleared = cleared.is_ok(), "backlog cleared");
        if !s.consumers.is_empty() {
            s.dispatch(ml, &mut self.out);
        }
        Ok(BacklogCleared {
            mark_delete: md,
            delayed_cleared: cleared.is_ok(),
        })
    }
}
