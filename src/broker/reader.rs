//! Readers: non-durable subscriptions (Pulsar's `PersistentTopic.getNonDurableSubscription`
//! and `NonDurableCursorImpl`), CommandSubscribe with `durable = false`.
//!
//! - The cursor is never written to the store
//!   ([`ManagedLedger::open_non_durable_cursor`]): it holds no ledger
//!   against trimming (readers rely on retention, as in Pulsar), acks only
//!   move it in memory, and it is gone after a restart. Its delayed
//!   tracker keeps its buckets in memory.
//! - Where it starts (`start_message_id = 9`, absent: `initialPosition`):
//!   Pulsar's `earliest` (ledger id -1) from the first entry, `latest`
//!   (`i64::MAX`) after the last confirmed entry, and any other id `(L, E)`
//!   AT that entry: the broker takes it as a batch message id and steps
//!   one entry back ("the batch might not have been consumed in its
//!   entirety"), so the reader's client drops what comes before its start
//!   (and the start itself unless `startMessageIdInclusive`, a client-side
//!   option with no field in the command).
//! - `start_message_rollback_duration_sec = 16` > 0: the new subscription
//!   is reset to the publish time `now - duration` (`seek.rs`).
//! - It is removed when its last consumer closes (Pulsar deletes a
//!   non-durable cursor with its last consumer).
//! - A name cannot be durable and non-durable at once: a non-durable
//!   subscribe to a durable subscription's name (open or persisted), or a
//!   durable subscribe to a live non-durable one, is answered
//!   `NotAllowedError`.

use std::sync::Arc;

use crate::delayed::{BucketTrackerConfig, Clock, MemorySnapshotStorage};
use crate::deletion::CursorDeletionState;
use crate::ledger::{LedgerStore, ManagedLedger, RedbStore};
use crate::proto::presence;
use crate::proto::wire::{CommandSubscribe, MessageIdData};
use crate::Position;

use super::error::{comp, BrokerError, ConnectionError};
use super::subscription::Subscription;
use super::topic::Topic;
use super::Broker;

/// The reader fields of a CommandSubscribe (read from its bytes: the
/// decoded struct carries only what every subscribe needs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ReaderStart {
    /// `start_message_id = 9`.
    pub(crate) message_id: Option<MessageIdData>,
    /// `start_message_rollback_duration_sec = 16`.
    pub(crate) rollback_secs: Option<u64>,
}

impl ReaderStart {
    /// The fields of the CommandSubscribe inside BaseCommand bytes `raw`.
    ///
    /// # Errors
    /// [`ConnectionError::Malformed`] when `start_message_id` does not
    /// decode or lacks a required field.
    pub(crate) fn of(raw: &[u8]) -> Result<Self, ConnectionError> {
        use prost::Message;
        let malformed = |e: String| ConnectionError::Malformed(format!("CommandSubscribe: {e}"));
        let Some(inner) = presence::find_delimited("BaseCommand", raw, 4)
            .map_err(|e| malformed(e.to_string()))?
        else {
            return Ok(Self::default());
        };
        let message_id = match presence::find_delimited("CommandSubscribe", inner, 9)
            .map_err(|e| malformed(e.to_string()))?
        {
            Some(bytes) => {
                for tag in [1, 2] {
                    if presence::find_varint("MessageIdData", bytes, tag)
                        .map_err(|e| malformed(e.to_string()))?
                        .is_none()
                    {
                        return Err(malformed(format!(
                            "start_message_id lacks required field {tag}"
                        )));
                    }
                }
                Some(MessageIdData::decode(bytes).map_err(|e| malformed(e.to_string()))?)
            }
            None => None,
        };
        let rollback_secs = presence::find_varint("CommandSubscribe", inner, 16)
            .map_err(|e| malformed(e.to_string()))?;
        Ok(Self {
            message_id,
            rollback_secs,
        })
    }

    /// The mark-delete a new non-durable cursor starts at (see the module
    /// docs); `earliest` is the subscribe's `initialPosition` when no
    /// start id was sent.
    pub(crate) fn mark_delete(&self, ml: &ManagedLedger, earliest: bool) -> Position {
        let last = ml.last_confirmed_entry();
        let Some(m) = &self.message_id else {
            return if earliest {
                Position::new(i64::MIN, -1)
            } else {
                last
            };
        };
        match (i64::try_from(m.ledger_id), i64::try_from(m.entry_id)) {
            // The unsigned form of -1: earliest.
            (Err(_), _) => Position::new(i64::MIN, -1),
            // (L, E): at E, so the mark-delete is the entry before.
            (Ok(l), Ok(e)) if l < i64::MAX => Position::new(l, e - 1),
            // latest, or an entry id beyond i64: after the last entry.
            _ => last,
        }
    }
}

/// CommandGetLastMessageIdResponse for a consumer whose subscription's
/// mark-delete is `md` (Pulsar's `ServerCnx.getLargestBatchIndexWhenPossible`
/// and `Commands.newGetLastMessageIdResponse`): the last confirmed entry
/// with `partition` -1 and `batch_index` always set, the largest batch
/// index of that entry (`num_messages_in_batch - 1` when the field is
/// present, else -1: a reader's `hasMessageAvailable` compares it with the
/// last message it received, so a batch's later messages count); the
/// mark-delete as ledger_id and entry_id only, present when its ledger id
/// is not negative. `(L, -1)` ("no entry") is written with entry_id the
/// unsigned form of -1, as Pulsar does.
pub(crate) fn last_message_id_response(
    ml: &ManagedLedger,
    md: Position,
    request_id: u64,
) -> crate::proto::command::CommandGetLastMessageIdResponse {
    let last = ml.last_confirmed_entry();
    let largest_batch_index = if last.entry_id < 0 {
        -1
    } else {
        ml.read_positions(&[last])
            .ok()
            .and_then(|e| e.into_iter().next())
            .and_then(|e| {
                crate::proto::frame::parse_entry_payload(&e.data)
                    .ok()
                    .map(|p| p.metadata.num_messages_in_batch)
            })
            .flatten()
            .map_or(-1, |n| n.max(0) - 1)
    };
    crate::proto::command::CommandGetLastMessageIdResponse {
        last_message_id: MessageIdData {
            ledger_id: last.ledger_id.max(0) as u64,
            entry_id: last.entry_id as u64,
            partition: Some(-1),
            batch_index: Some(largest_batch_index),
            ..Default::default()
        },
        request_id,
        consumer_mark_delete_position: (md.ledger_id >= 0).then(|| MessageIdData {
            ledger_id: md.ledger_id as u64,
            entry_id: md.entry_id as u64,
            ..Default::default()
        }),
    }
}

impl Subscription {
    /// A non-durable subscription `name` on `ml` whose mark-delete is
    /// `mark_delete` (clamped into the ledger): nothing of it is persisted.
    ///
    /// # Errors
    /// [`BrokerError::Component`] when the deletion state or the tracker
    /// cannot be made.
    pub(crate) fn open_non_durable(
        _store: &RedbStore,
        ml: &Arc<ManagedLedger>,
        name: &str,
        sub_type: i32,
        mark_delete: Position,
        clock: Arc<dyn Clock>,
        tracker_config: BucketTrackerConfig,
    ) -> Result<Self, BrokerError> {
        let cursor = Arc::new(ml.open_non_durable_cursor(name, mark_delete));
        let md = cursor.mark_delete_position();
        let deletion = Arc::new(CursorDeletionState::new(md).map_err(comp)?);
        tracing::info!(topic = ml.name(), subscription = name, mark_delete = %md, "non-durable subscription opened");
        Self::assemble(
            ml,
            name,
            sub_type,
            cursor,
            deletion,
            Arc::new(MemorySnapshotStorage::new()),
            clock,
            tracker_config,
            super::delayed_hooks::TrackerWatch::default(),
        )
    }

    /// Whether the subscription's cursor is persisted (`false`: a reader's).
    pub fn is_durable(&self) -> bool {
        self.cursor.is_durable()
    }
}

/// Resets the new non-durable subscription `name` of `t` to the publish
/// time `now - secs` (`start_message_rollback_duration_sec`).
pub(crate) fn rollback(
    t: &mut Topic,
    name: &str,
    now_ms: u64,
    secs: u64,
) -> Result<(), BrokerError> {
    let time = now_ms.saturating_sub(secs.saturating_mul(1000));
    let target = super::seek::publish_time_target(&t.ml, time).map_err(BrokerError::Component)?;
    let ml = Arc::clone(&t.ml);
    let sub = t
        .subscriptions
        .get_mut(name)
        .ok_or_else(|| BrokerError::Component("subscription vanished".into()))?;
    sub.reset_cursor(&ml, target, &[])
        .map(|_| ())
        .map_err(BrokerError::Component)
}

impl Broker {
    /// Refuses a subscribe that would make `s.subscription` both durable
    /// and non-durable (see the module docs).
    pub(crate) fn check_durability(
        &self,
        topic: &str,
        s: &CommandSubscribe,
    ) -> Result<(), BrokerError> {
        let wants_durable = s.durable != Some(false);
        let open = self
            .topics
            .get(topic)
            .and_then(|t| t.subscriptions.get(&s.subscription));
        let is_durable = match open {
            Some(sub) => Some(sub.is_durable()),
            None if !wants_durable => self
                .store
                .load_cursor(topic, &s.subscription)
                .map_err(|e| BrokerError::Component(e.to_string()))?
                .map(|_| true),
            None => None,
        };
        match is_durable {
            Some(d) if d != wants_durable => Err(BrokerError::NotAllowed(format!(
                "subscription {} exists and is {}",
                s.subscription,
                if d { "durable" } else { "non-durable" }
            ))),
            _ => Ok(()),
        }
    }

    /// Removes non-durable subscription `subscription` of `topic` once it
    /// has no consumer (its cursor closed; nothing was persisted).
    pub(crate) fn drop_idle_non_durable(&mut self, topic: &str, subscription: &str) {
        let Some(t) = self.topics.get_mut(topic) else {
            return;
        };
        let idle = t
            .subscriptions
            .get(subscription)
            .is_some_and(|s| !s.is_durable() && s.consumers.is_empty());
        if idle {
            if let Some(s) = t.subscriptions.remove(subscription) {
                s.cursor.close();
                tracing::info!(topic, subscription, "non-durable subscription removed");
            }
        }
    }
}
