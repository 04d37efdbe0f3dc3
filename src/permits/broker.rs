//! Broker side of PIP-491: one finalised permit value P per sent entry.
//!
//! [`Consumer::send_messages`] computes a candidate P for every entry (B for a
//! full batch, the deliverable `ack_set` bits below B for a partial one),
//! drops entries with P = 0, runs pending-ack admission, and only for
//! admitted entries records P in a [`SendMessagesResult`]. That one result is
//! then the **single source** of:
//!
//! - the consumer debit ([`Consumer::available_permits`] decreases by
//!   [`SendMessagesResult::total_permits`]),
//! - the unacked count ([`Consumer::unacked_messages`] increases by the same),
//! - the Shared dispatcher debit ([`SharedDispatcher::total_available_permits`]),
//! - the serialised `CommandMessage.message_permits` of every command.
//!
//! so `consumer debit = dispatcher debit = Σ P of the commands sent` holds by
//! construction. Balances are `i64` and may go negative (a batch of 10 sent
//! with 1 permit leaves −9: debt, never clamped).
//!
//! An asynchronous write failure ([`SharedDispatcher::on_write_complete`]
//! with an error) removes the consumer: its pending acks go to replay, the
//! dispatcher subtracts its current balance, and P is **never** credited
//! back.
//!
//! Corresponds to Pulsar's `Consumer.sendMessages`, `SendMessagesResult` and
//! the persistent Shared dispatcher's permit bookkeeping (PIP-491).
//!
//! The broker core ([`crate::broker`]) keeps one [`SharedDispatcher`] per
//! subscription, of every subscription type: its Flow, MESSAGE debit, write
//! completion and consumer removal are these methods.
//!
//! Concurrency: these types are plain state machines (`&mut self`); the
//! broker serialises access per subscription (Pulsar's dispatcher is
//! `synchronized`). Wrap a [`SharedDispatcher`] in a
//! `crate::sync::Mutex` to share it.
//!
//! ```
//! use pulsar_core::permits::broker::{AdmitAll, BrokerEntry, Consumer, ConsumerKey};
//! use pulsar_core::Position;
//!
//! let key = ConsumerKey { connection_id: 1, consumer_id: 7 };
//! let mut consumer = Consumer::new(key, 0);
//! consumer.flow_permits(5)?;
//! // A full batch of 4 (P = 4) and a partial batch of 10 with 2 indexes left (P = 2).
//! let entries = vec![
//!     BrokerEntry { position: Position::new(3, 0), batch_size: 4, ack_set: vec![] },
//!     BrokerEntry { position: Position::new(3, 1), batch_size: 10, ack_set: vec![0b11] },
//! ];
//! let dispatch = consumer.send_messages(entries, &mut AdmitAll, 1);
//! assert_eq!(dispatch.result.total_permits(), 6);
//! assert_eq!(dispatch.commands[1].message_permits, Some(2));
//! // Debt is kept, never clamped: 5 - 6.
//! assert_eq!(consumer.available_permits(), -1);
//! assert_eq!(consumer.unacked_messages(), 6);
//! // Acknowledging the partial batch gives back its P to the unacked count.
//! assert_eq!(consumer.acknowledge(Position::new(3, 1))?, 2);
//! # Ok::<(), pulsar_core::permits::broker::BrokerPermitError>(())
//! ```

use std::collections::{BTreeMap, BTreeSet};

use crate::position::Position;
use crate::proto::wire::{self, CommandMessage, MessageIdData, MAX_PERMITS};

/// Errors of the broker-side permit accounting. Every failing call leaves
/// the state unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BrokerPermitError {
    /// A permit value of zero or less was offered to [`SendMessagesResult`].
    #[error("entry {index}: permits must be positive, got {permits}")]
    NonPositivePermits {
        /// Entry slot.
        index: usize,
        /// The rejected value.
        permits: i64,
    },
    /// A permit value above `i32::MAX`.
    #[error("entry {index}: permits {permits} exceed the protocol maximum {MAX_PERMITS}")]
    PermitsTooLarge {
        /// Entry slot.
        index: usize,
        /// The rejected value.
        permits: i64,
    },
    /// The slot already holds a finalised P.
    #[error("entry {index}: permits already finalised ({existing})")]
    AlreadySet {
        /// Entry slot.
        index: usize,
        /// The value already recorded.
        existing: u32,
    },
    /// Adding P would overflow the checked sum (`i32::MAX`).
    #[error("entry {index}: adding {permits} permits to {total} overflows the command sum")]
    SumOverflow {
        /// Entry slot.
        index: usize,
        /// The rejected value.
        permits: u32,
        /// The sum before the rejected addition.
        total: u32,
    },
    /// The slot index is outside the result.
    #[error("entry {index} is outside a result of {len} entries")]
    IndexOutOfRange {
        /// Entry slot.
        index: usize,
        /// Number of slots.
        len: usize,
    },
    /// `flow_permits(0)`: a Flow must grant at least one permit.
    #[error("Flow with 0 permits for consumer {0:?}")]
    ZeroFlow(ConsumerKey),
    /// Adding the Flow would overflow the consumer's i64 balance.
    #[error("Flow of {permits} overflows the balance {balance} of consumer {key:?}")]
    BalanceOverflow {
        /// Consumer.
        key: ConsumerKey,
        /// Current balance.
        balance: i64,
        /// Rejected Flow.
        permits: u32,
    },
    /// No such (or an already removed) consumer.
    #[error("consumer {0:?} is not registered")]
    UnknownConsumer(ConsumerKey),
    /// `add_consumer` for a key that is already registered.
    #[error("consumer {0:?} is already registered")]
    DuplicateConsumer(ConsumerKey),
    /// No pending write with that id.
    #[error("no pending write {0}")]
    UnknownWrite(u64),
    /// Acknowledgment of a position the consumer does not hold.
    #[error("consumer {key:?} has no pending ack for {position}")]
    NotPending {
        /// Consumer.
        key: ConsumerKey,
        /// Position.
        position: Position,
    },
}

/// Identifies a broker-side consumer: the connection it was subscribed on and
/// its `consumer_id` there. A re-subscribe with the same ids after a close
/// is a **new** broker consumer (new balance, starting at 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConsumerKey {
    /// Broker-side connection id.
    pub connection_id: u64,
    /// `consumer_id` chosen by the client on that connection.
    pub consumer_id: u64,
}

/// One entry offered to a consumer by the dispatcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerEntry {
    /// Position of the entry.
    pub position: Position,
    /// Batch size B (`num_messages_in_batch`, 1 for a non-batched entry).
    pub batch_size: u32,
    /// Remaining-index bitset from the cursor (1 = deliverable); empty when
    /// no index of the batch is acknowledged.
    pub ack_set: Vec<i64>,
}

impl BrokerEntry {
    /// Candidate P: B for a full batch, else the set bits below B (0 means
    /// nothing deliverable).
    pub fn candidate_permits(&self) -> u32 {
        if self.ack_set.is_empty() {
            self.batch_size
        } else {
            wire::popcount_below(&self.ack_set, self.batch_size)
        }
    }
}

/// Per-entry finalised permits and their checked sum: Pulsar's
/// `SendMessagesResult`.
///
/// Slot `i` is 0 while entry `i` is not sent. [`set_permits`] rejects
/// P ≤ 0, P > `i32::MAX`, a second set of the same slot, and a sum that
/// would exceed `i32::MAX` (leaving the slot unset). The value is owned, so
/// it outlives the sender's (recyclable) inputs.
///
/// [`set_permits`]: SendMessagesResult::set_permits
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SendMessagesResult {
    per_entry: Vec<u32>,
    total: u32,
}

impl SendMessagesResult {
    /// A result with `entries` unset slots.
    pub fn new(entries: usize) -> Self {
        Self {
            per_entry: vec![0; entries],
            total: 0,
        }
    }

    /// Finalises P for slot `index`.
    ///
    /// # Errors
    /// [`BrokerPermitError::NonPositivePermits`], [`PermitsTooLarge`],
    /// [`AlreadySet`], [`SumOverflow`], [`IndexOutOfRange`]; the result is
    /// unchanged on error.
    ///
    /// [`PermitsTooLarge`]: BrokerPermitError::PermitsTooLarge
    /// [`AlreadySet`]: BrokerPermitError::AlreadySet
    /// [`SumOverflow`]: BrokerPermitError::SumOverflow
    /// [`IndexOutOfRange`]: BrokerPermitError::IndexOutOfRange
    pub fn set_permits(&mut self, index: usize, permits: i64) -> Result<(), BrokerPermitError> {
        let len = self.per_entry.len();
        let slot = self
            .per_entry
            .get(index)
            .copied()
            .ok_or(BrokerPermitError::IndexOutOfRange { index, len })?;
        if permits <= 0 {
            return Err(BrokerPermitError::NonPositivePermits { index, permits });
        }
        if permits > i64::from(MAX_PERMITS) {
            return Err(BrokerPermitError::PermitsTooLarge { index, permits });
        }
        if slot != 0 {
            return Err(BrokerPermitError::AlreadySet {
                index,
                existing: slot,
            });
        }
        // 1 <= permits <= i32::MAX, checked above.
        let p = permits as u32;
        let total = self
            .total
            .checked_add(p)
            .filter(|t| *t <= MAX_PERMITS)
            .ok_or(BrokerPermitError::SumOverflow {
                index,
                permits: p,
                total: self.total,
            })?;
        self.per_entry[index] = p;
        self.total = total;
        Ok(())
    }

    /// P of slot `index`, `None` when not sent (or out of range).
    pub fn permits(&self, index: usize) -> Option<u32> {
        self.per_entry.get(index).copied().filter(|p| *p > 0)
    }

    /// Σ P over sent entries (≤ `i32::MAX`).
    pub fn total_permits(&self) -> u32 {
        self.total
    }

    /// Number of entries that were sent.
    pub fn sent_entries(&self) -> usize {
        self.per_entry.iter().filter(|p| **p > 0).count()
    }

    /// Number of slots.
    pub fn len(&self) -> usize {
        self.per_entry.len()
    }

    /// Whether the result has no slots.
    pub fn is_empty(&self) -> bool {
        self.per_entry.is_empty()
    }
}

/// Why an offered entry was not sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotSentReason {
    /// Candidate P was 0 (no deliverable index below B, or B = 0).
    NoDeliverableIndex,
    /// Pending-ack admission rejected it.
    RejectedByAdmission,
    /// The position is already pending ack on this consumer: sent by an
    /// earlier call, or earlier in the same call (a duplicate in the batch).
    /// Not sent, not debited, and not put back for replay: it is out on
    /// this consumer already (its ack settles it; removing the consumer
    /// replays it).
    AlreadyPending,
    /// The entry's position has a negative ledger or entry id (it cannot be
    /// serialised as `MessageIdData`).
    InvalidPosition,
    /// The result refused P (sum overflow).
    Accounting(BrokerPermitError),
}

/// Pending-ack admission: decides, per entry, whether the consumer may take
/// it (Pulsar's `PendingAcksMap.addPendingAckIfAllowed`). Any
/// `FnMut(ConsumerKey, &BrokerEntry) -> bool` is one.
pub trait PendingAckAdmission {
    /// `true` to admit the entry to `consumer`.
    fn admit(&mut self, consumer: ConsumerKey, entry: &BrokerEntry) -> bool;
}

impl<F: FnMut(ConsumerKey, &BrokerEntry) -> bool> PendingAckAdmission for F {
    fn admit(&mut self, consumer: ConsumerKey, entry: &BrokerEntry) -> bool {
        self(consumer, entry)
    }
}

/// Admits everything.
#[derive(Debug, Clone, Copy, Default)]
pub struct AdmitAll;

impl PendingAckAdmission for AdmitAll {
    fn admit(&mut self, _consumer: ConsumerKey, _entry: &BrokerEntry) -> bool {
        true
    }
}

/// Output of [`Consumer::send_messages`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dispatch {
    /// Consumer the entries went to.
    pub consumer: ConsumerKey,
    /// The finalised permits (single source of every debit).
    pub result: SendMessagesResult,
    /// One command per sent entry, `message_permits` taken from `result`.
    pub commands: Vec<CommandMessage>,
    /// Entries not sent, with the reason; the dispatcher puts them back for
    /// replay. Neither sent nor debited.
    pub not_sent: Vec<(Position, NotSentReason)>,
    /// Id to report the asynchronous write outcome with
    /// ([`SharedDispatcher::on_write_complete`]); `None` when nothing was
    /// sent.
    pub write_id: Option<u64>,
}

/// A broker-side consumer's permit state (Pulsar's `Consumer`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Consumer {
    key: ConsumerKey,
    epoch: u64,
    permits: i64,
    unacked: i64,
    pending: BTreeMap<Position, u32>,
}

impl Consumer {
    /// A new consumer with 0 permits (it waits for the client's first Flow).
    pub fn new(key: ConsumerKey, epoch: u64) -> Self {
        Self {
            key,
            epoch,
            permits: 0,
            unacked: 0,
            pending: BTreeMap::new(),
        }
    }

    /// The consumer's key.
    pub fn key(&self) -> ConsumerKey {
        self.key
    }

    /// Available permits (may be negative: debt).
    pub fn available_permits(&self) -> i64 {
        self.permits
    }

    /// Unacked messages (Σ P of pending acks).
    pub fn unacked_messages(&self) -> i64 {
        self.unacked
    }

    /// Positions pending ack with their P.
    pub fn pending_acks(&self) -> &BTreeMap<Position, u32> {
        &self.pending
    }

    /// Applies a Flow of `permits` (Pulsar's `flowPermits`).
    ///
    /// # Errors
    /// [`BrokerPermitError::ZeroFlow`] for 0; [`BrokerPermitError::BalanceOverflow`].
    pub fn flow_permits(&mut self, permits: u32) -> Result<(), BrokerPermitError> {
        if permits == 0 {
            return Err(BrokerPermitError::ZeroFlow(self.key));
        }
        self.permits = self.permits.checked_add(i64::from(permits)).ok_or(
            BrokerPermitError::BalanceOverflow {
                key: self.key,
                balance: self.permits,
                permits,
            },
        )?;
        Ok(())
    }

    /// Finalises and sends `entries` (Pulsar's `Consumer.sendMessages`):
    /// candidate P per entry, drop P = 0, refuse a position already pending
    /// ack on this consumer (from an earlier call, or earlier in `entries`:
    /// a duplicate is sent once), pending-ack admission, record P in the
    /// result, then debit permits and add unacked by the result's total and
    /// build one command per sent entry from the result. `write_id` tags the
    /// asynchronous write of the commands. So `unacked_messages` always
    /// equals Σ P of [`pending_acks`](Self::pending_acks).
    ///
    /// Never fails as a whole: per-entry refusals are listed in
    /// [`Dispatch::not_sent`] ([`NotSentReason::AlreadyPending`] for a
    /// duplicate) and cost nothing.
    pub fn send_messages(
        &mut self,
        entries: Vec<BrokerEntry>,
        admission: &mut dyn PendingAckAdmission,
        write_id: u64,
    ) -> Dispatch {
        let mut result = SendMessagesResult::new(entries.len());
        let mut not_sent = Vec::new();
        // Positions finalised earlier in this call: a second copy must not
        // be sent (its P would be debited twice while `pending` holds one).
        let mut finalised: BTreeSet<Position> = BTreeSet::new();
        for (i, entry) in entries.iter().enumerate() {
            if entry.position.ledger_id < 0 || entry.position.entry_id < 0 {
                not_sent.push((entry.position, NotSentReason::InvalidPosition));
                continue;
            }
            let candidate = entry.candidate_permits();
            if candidate == 0 {
                not_sent.push((entry.position, NotSentReason::NoDeliverableIndex));
                continue;
            }
            if self.pending.contains_key(&entry.position) || finalised.contains(&entry.position) {
                not_sent.push((entry.position, NotSentReason::AlreadyPending));
                continue;
            }
            if !admission.admit(self.key, entry) {
                not_sent.push((entry.position, NotSentReason::RejectedByAdmission));
                continue;
            }
            match result.set_permits(i, i64::from(candidate)) {
                Ok(()) => {
                    finalised.insert(entry.position);
                }
                Err(e) => not_sent.push((entry.position, NotSentReason::Accounting(e))),
            }
        }
        let total = i64::from(result.total_permits());
        // |total| <= i32::MAX; a balance reaching i64::MIN would need 2^32
        // such sends without Flow: saturating keeps the debt representable.
        self.permits = self.permits.saturating_sub(total);
        self.unacked = self.unacked.saturating_add(total);
        let mut commands = Vec::with_capacity(result.sent_entries());
        for (i, entry) in entries.into_iter().enumerate() {
            let Some(p) = result.permits(i) else { continue };
            self.pending.insert(entry.position, p);
            crate::trace::permits::broker_send((self.key.connection_id, self.key.consumer_id), p);
            let full = entry.ack_set.is_empty()
                || wire::popcount_below(&entry.ack_set, entry.batch_size) == entry.batch_size;
            commands.push(CommandMessage {
                consumer_id: self.key.consumer_id,
                message_id: MessageIdData {
                    ledger_id: entry.position.ledger_id as u64,
                    entry_id: entry.position.entry_id as u64,
                    ..Default::default()
                },
                redelivery_count: None,
                ack_set: if full { Vec::new() } else { entry.ack_set },
                consumer_epoch: Some(self.epoch),
                message_permits: Some(p),
            });
        }
        let write_id = (!commands.is_empty()).then_some(write_id);
        tracing::trace!(consumer = ?self.key, total, sent = commands.len(), "send_messages");
        Dispatch {
            consumer: self.key,
            result,
            commands,
            not_sent,
            write_id,
        }
    }

    /// Acknowledges `position`: unacked decreases by its P.
    ///
    /// # Errors
    /// [`BrokerPermitError::NotPending`].
    pub fn acknowledge(&mut self, position: Position) -> Result<u32, BrokerPermitError> {
        let p = self
            .pending
            .remove(&position)
            .ok_or(BrokerPermitError::NotPending {
                key: self.key,
                position,
            })?;
        self.unacked -= i64::from(p);
        Ok(p)
    }
}

/// What removing a consumer did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemovedConsumer {
    /// The removed consumer.
    pub key: ConsumerKey,
    /// Its balance at removal (subtracted from the dispatcher total).
    pub permits: i64,
    /// Its unacked messages at removal (Σ P of the pending acks replayed).
    pub unacked: i64,
    /// Its pending acks, moved to replay.
    pub replayed: Vec<Position>,
}

/// A persistent Shared dispatcher's permit bookkeeping: the consumers, the
/// dispatcher-wide `total_available_permits`, in-flight writes and the
/// replay set.
///
/// Invariant (checked in tests): `total_available_permits` = Σ available
/// permits of the registered consumers.
#[derive(Debug, Default)]
pub struct SharedDispatcher {
    consumers: BTreeMap<ConsumerKey, Consumer>,
    total_available_permits: i64,
    writes: BTreeMap<u64, ConsumerKey>,
    next_write_id: u64,
    replay: BTreeSet<Position>,
}

impl SharedDispatcher {
    /// An empty dispatcher.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a new broker consumer (Subscribe) with 0 permits.
    ///
    /// # Errors
    /// [`BrokerPermitError::DuplicateConsumer`].
    pub fn add_consumer(&mut self, key: ConsumerKey, epoch: u64) -> Result<(), BrokerPermitError> {
        if self.consumers.contains_key(&key) {
            return Err(BrokerPermitError::DuplicateConsumer(key));
        }
        self.consumers.insert(key, Consumer::new(key, epoch));
        crate::trace::permits::broker_recv_subscribe((key.connection_id, key.consumer_id));
        Ok(())
    }

    /// The consumer registered under `key`.
    pub fn consumer(&self, key: ConsumerKey) -> Option<&Consumer> {
        self.consumers.get(&key)
    }

    /// Registered consumers.
    pub fn consumers(&self) -> impl Iterator<Item = &Consumer> {
        self.consumers.values()
    }

    /// Dispatcher-wide available permits (may be negative).
    pub fn total_available_permits(&self) -> i64 {
        self.total_available_permits
    }

    /// Writes issued by [`send_to_consumer`](Self::send_to_consumer) whose
    /// outcome was not reported yet (a removed consumer's are dropped).
    pub fn writes_in_flight(&self) -> usize {
        self.writes.len()
    }

    /// Applies a Flow to a consumer and the dispatcher total
    /// (`subscription.consumerFlow`).
    ///
    /// # Errors
    /// [`BrokerPermitError::UnknownConsumer`], [`BrokerPermitError::ZeroFlow`],
    /// [`BrokerPermitError::BalanceOverflow`].
    pub fn consumer_flow(
        &mut self,
        key: ConsumerKey,
        permits: u32,
    ) -> Result<(), BrokerPermitError> {
        crate::trace::permits::broker_recv_flow((key.connection_id, key.consumer_id), permits);
        let c = self
            .consumers
            .get_mut(&key)
            .ok_or(BrokerPermitError::UnknownConsumer(key))?;
        let total = self
            .total_available_permits
            .checked_add(i64::from(permits))
            .ok_or(BrokerPermitError::BalanceOverflow {
                key,
                balance: self.total_available_permits,
                permits,
            })?;
        c.flow_permits(permits)?;
        self.total_available_permits = total;
        Ok(())
    }

    /// Sends `entries` to `key` through [`Consumer::send_messages`] and
    /// debits the dispatcher total by the same result's total. Unsent
    /// entries go to replay, except [`NotSentReason::AlreadyPending`] ones
    /// (they are out on this consumer already). Selecting a consumer with positive permits is
    /// the caller's policy (Pulsar skips consumers in debt); this method
    /// does not refuse a consumer whose balance is ≤ 0.
    ///
    /// # Errors
    /// [`BrokerPermitError::UnknownConsumer`].
    pub fn send_to_consumer(
        &mut self,
        key: ConsumerKey,
        entries: Vec<BrokerEntry>,
        admission: &mut dyn PendingAckAdmission,
    ) -> Result<Dispatch, BrokerPermitError> {
        let c = self
            .consumers
            .get_mut(&key)
            .ok_or(BrokerPermitError::UnknownConsumer(key))?;
        let write_id = self.next_write_id;
        let dispatch = c.send_messages(entries, admission, write_id);
        self.total_available_permits = self
            .total_available_permits
            .saturating_sub(i64::from(dispatch.result.total_permits()));
        if let Some(id) = dispatch.write_id {
            self.next_write_id += 1;
            self.writes.insert(id, key);
        }
        for (pos, reason) in &dispatch.not_sent {
            if *reason != NotSentReason::AlreadyPending {
                self.replay.insert(*pos);
            }
        }
        Ok(dispatch)
    }

    /// Reports the asynchronous write outcome of a dispatch. On failure the
    /// consumer is removed (terminal outcome, pending acks to replay, no
    /// re-credit of P) and `Some(RemovedConsumer)` returned.
    ///
    /// # Errors
    /// [`BrokerPermitError::UnknownWrite`].
    pub fn on_write_complete(
        &mut self,
        write_id: u64,
        outcome: Result<(), String>,
    ) -> Result<Option<RemovedConsumer>, BrokerPermitError> {
        let key = self
            .writes
            .remove(&write_id)
            .ok_or(BrokerPermitError::UnknownWrite(write_id))?;
        match outcome {
            Ok(()) => Ok(None),
            Err(reason) => {
                tracing::warn!(consumer = ?key, %reason, "message write failed: removing consumer");
                match self.remove(key) {
                    Ok(r) => {
                        crate::trace::permits::broker_remove(
                            (key.connection_id, key.consumer_id),
                            "write",
                        );
                        Ok(Some(r))
                    }
                    // already removed (e.g. the connection closed first)
                    Err(BrokerPermitError::UnknownConsumer(_)) => Ok(None),
                    Err(e) => Err(e),
                }
            }
        }
    }

    /// Removes a consumer: the dispatcher total drops by its balance and its
    /// pending acks go to replay.
    ///
    /// # Errors
    /// [`BrokerPermitError::UnknownConsumer`].
    pub fn remove_consumer(
        &mut self,
        key: ConsumerKey,
    ) -> Result<RemovedConsumer, BrokerPermitError> {
        crate::trace::permits::broker_recv_close((key.connection_id, key.consumer_id));
        self.remove(key)
    }

    /// Removes a consumer the broker disconnects on its own (Pulsar's
    /// `disconnectActiveConsumers` on a seek or a forced unsubscribe; the
    /// client is sent CLOSE_CONSUMER): as [`remove_consumer`], with no
    /// client frame received and no trace line.
    ///
    /// [`remove_consumer`]: Self::remove_consumer
    ///
    /// # Errors
    /// [`BrokerPermitError::UnknownConsumer`].
    pub fn disconnect_consumer(
        &mut self,
        key: ConsumerKey,
    ) -> Result<RemovedConsumer, BrokerPermitError> {
        self.remove(key)
    }

    /// Removes `key`'s consumer (the CloseConsumer frame, a failed write,
    /// a closed connection or a broker-initiated disconnect).
    fn remove(&mut self, key: ConsumerKey) -> Result<RemovedConsumer, BrokerPermitError> {
        let c = self
            .consumers
            .remove(&key)
            .ok_or(BrokerPermitError::UnknownConsumer(key))?;
        self.total_available_permits -= c.permits;
        self.writes.retain(|_, k| *k != key);
        let replayed: Vec<Position> = c.pending.keys().copied().collect();
        self.replay.extend(replayed.iter().copied());
        Ok(RemovedConsumer {
            key,
            permits: c.permits,
            unacked: c.unacked,
            replayed,
        })
    }

    /// Removes every consumer of a closed connection.
    pub fn remove_connection(&mut self, connection_id: u64) -> Vec<RemovedConsumer> {
        let keys: Vec<ConsumerKey> = self
            .consumers
            .keys()
            .filter(|k| k.connection_id == connection_id)
            .copied()
            .collect();
        keys.into_iter()
            .filter_map(|k| {
                let r = self.remove(k).ok()?;
                crate::trace::permits::broker_remove(
                    (k.connection_id, k.consumer_id),
                    "connection",
                );
                Some(r)
            })
            .collect()
    }

    /// Acknowledges `position` for `key`.
    ///
    /// # Errors
    /// [`BrokerPermitError::UnknownConsumer`], [`BrokerPermitError::NotPending`].
    pub fn acknowledge(
        &mut self,
        key: ConsumerKey,
        position: Position,
    ) -> Result<u32, BrokerPermitError> {
        self.consumers
            .get_mut(&key)
            .ok_or(BrokerPermitError::UnknownConsumer(key))?
            .acknowledge(position)
    }

    /// Whether positions wait for replay (Pulsar's non-empty
    /// `redeliveryMessages`): the dispatcher's next read must serve them
    /// first, whether or not the cursor has new entries.
    pub fn has_replay(&self) -> bool {
        !self.replay.is_empty()
    }

    /// Takes the positions waiting for replay (ascending).
    pub fn take_replay(&mut self) -> Vec<Position> {
        std::mem::take(&mut self.replay).into_iter().collect()
    }

    /// Σ available permits of the registered consumers (equals
    /// [`total_available_permits`](Self::total_available_permits)).
    pub fn sum_consumer_permits(&self) -> i64 {
        self.consumers.values().map(|c| c.permits).sum()
    }
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests {
    use super::*;

    fn key(c: u64) -> ConsumerKey {
        ConsumerKey {
            connection_id: 1,
            consumer_id: c,
        }
    }

    fn entry(e: i64, b: u32, ack_set: Vec<i64>) -> BrokerEntry {
        BrokerEntry {
            position: Position::new(1, e),
            batch_size: b,
            ack_set,
        }
    }

    #[test]
    fn result_rejects_non_positive_double_set_and_overflow() {
        let mut r = SendMessagesResult::new(3);
        assert_eq!(
            r.set_permits(0, 0),
            Err(BrokerPermitError::NonPositivePermits {
                index: 0,
                permits: 0
            })
        );
        assert_eq!(
            r.set_permits(0, -5),
            Err(BrokerPermitError::NonPositivePermits {
                index: 0,
                permits: -5
            })
        );
        assert_eq!(
            r.set_permits(0, i64::from(MAX_PERMITS) + 1),
            Err(BrokerPermitError::PermitsTooLarge {
                index: 0,
                permits: i64::from(MAX_PERMITS) + 1
            })
        );
        assert_eq!(r.total_permits(), 0);
        r.set_permits(0, i64::from(MAX_PERMITS)).unwrap();
        assert_eq!(
            r.set_permits(0, 1),
            Err(BrokerPermitError::AlreadySet {
                index: 0,
                existing: MAX_PERMITS
            })
        );
        assert_eq!(
            r.set_permits(1, 1),
            Err(BrokerPermitError::SumOverflow {
                index: 1,
                permits: 1,
                total: MAX_PERMITS
            })
        );
        // the overflowing slot stays unset and the sum unchanged
        assert_eq!(r.permits(1), None);
        assert_eq!(r.total_permits(), MAX_PERMITS);
        assert_eq!(
            r.set_permits(9, 1),
            Err(BrokerPermitError::IndexOutOfRange { index: 9, len: 3 })
        );
        assert_eq!(r.sent_entries(), 1);
    }

    #[test]
    fn send_messages_finalises_after_admission_and_is_the_single_source() {
        let mut d = SharedDispatcher::new();
        d.add_consumer(key(1), 0).unwrap();
        d.consumer_flow(key(1), 1).unwrap();
        let entries = vec![
            entry(0, 10, vec![]),      // full batch: P = 10
            entry(1, 10, vec![0b111]), // partial: P = 3
            entry(2, 4, vec![0]),      // nothing deliverable: not sent
            entry(3, 1, vec![]),       // rejected by admission
            entry(4, 1, vec![1 << 5]), // bit above B: nothing deliverable
            BrokerEntry {
                position: Position::new(-1, 0),
                batch_size: 1,
                ack_set: vec![],
            },
        ];
        let mut admission = |_k: ConsumerKey, e: &BrokerEntry| e.position.entry_id != 3;
        let dispatch = d.send_to_consumer(key(1), entries, &mut admission).unwrap();
        assert_eq!(dispatch.result.total_permits(), 13);
        assert_eq!(dispatch.commands.len(), 2);
        assert_eq!(dispatch.commands[0].message_permits, Some(10));
        assert_eq!(dispatch.commands[1].message_permits, Some(3));
        assert_eq!(dispatch.commands[1].ack_set, vec![0b111]);
        let c = d.consumer(key(1)).unwrap();
        // 1 - 13: debt, never clamped
        assert_eq!(c.available_permits(), -12);
        assert_eq!(c.unacked_messages(), 13);
        assert_eq!(d.total_available_permits(), -12);
        assert_eq!(d.sum_consumer_permits(), d.total_available_permits());
        let reasons: Vec<_> = dispatch
            .not_sent
            .iter()
            .map(|(p, r)| (p.entry_id, r.clone()))
            .collect();
        assert_eq!(
            reasons,
            vec![
                (2, NotSentReason::NoDeliverableIndex),
                (3, NotSentReason::RejectedByAdmission),
                (4, NotSentReason::NoDeliverableIndex),
                (0, NotSentReason::InvalidPosition)
            ]
        );
        assert_eq!(
            d.take_replay(),
            vec![
                Position::new(-1, 0),
                Position::new(1, 2),
                Position::new(1, 3),
                Position::new(1, 4)
            ]
        );
        assert_eq!(d.acknowledge(key(1), Position::new(1, 1)), Ok(3));
        assert_eq!(d.consumer(key(1)).unwrap().unacked_messages(), 10);
    }

    #[test]
    fn p_equal_one_is_sent_explicitly() {
        let mut d = SharedDispatcher::new();
        d.add_consumer(key(1), 0).unwrap();
        let dispatch = d
            .send_to_consumer(key(1), vec![entry(0, 1, vec![])], &mut AdmitAll)
            .unwrap();
        assert_eq!(dispatch.commands[0].message_permits, Some(1));
    }

    #[test]
    fn flow_zero_is_an_error_and_changes_nothing() {
        let mut d = SharedDispatcher::new();
        d.add_consumer(key(1), 0).unwrap();
        assert_eq!(
            d.consumer_flow(key(1), 0),
            Err(BrokerPermitError::ZeroFlow(key(1)))
        );
        assert_eq!(d.total_available_permits(), 0);
        assert_eq!(d.consumer(key(1)).unwrap().available_permits(), 0);
        assert_eq!(
            d.consumer_flow(key(2), 5),
            Err(BrokerPermitError::UnknownConsumer(key(2)))
        );
    }

    #[test]
    fn write_failure_removes_consumer_without_recredit() {
        let mut d = SharedDispatcher::new();
        d.add_consumer(key(1), 0).unwrap();
        d.add_consumer(key(2), 0).unwrap();
        d.consumer_flow(key(1), 20).unwrap();
        d.consumer_flow(key(2), 5).unwrap();
        let dispatch = d
            .send_to_consumer(
                key(1),
                vec![entry(0, 10, vec![]), entry(1, 1, vec![])],
                &mut AdmitAll,
            )
            .unwrap();
        assert_eq!(d.total_available_permits(), 25 - 11);
        let removed = d
            .on_write_complete(dispatch.write_id.unwrap(), Err("socket closed".into()))
            .unwrap()
            .unwrap();
        assert_eq!(removed.permits, 9);
        assert_eq!(
            removed.replayed,
            vec![Position::new(1, 0), Position::new(1, 1)]
        );
        assert!(d.consumer(key(1)).is_none());
        // no re-credit: only the other consumer's permits remain
        assert_eq!(d.total_available_permits(), 5);
        assert_eq!(d.sum_consumer_permits(), 5);
        assert_eq!(
            d.consumer_flow(key(1), 3),
            Err(BrokerPermitError::UnknownConsumer(key(1)))
        );
        assert_eq!(
            d.on_write_complete(dispatch.write_id.unwrap(), Ok(())),
            Err(BrokerPermitError::UnknownWrite(0))
        );
    }

    /// A position is pending at most once: the same position twice in one
    /// send is sent (and
    /// debited, and made pending) once; the copy is refused as already
    /// pending, like a position still pending from an earlier send, and is
    /// not put back for replay. unacked == Σ P of pending acks throughout.
    #[test]
    fn duplicate_position_in_one_send_is_sent_once() {
        fn pending_sum(c: &Consumer) -> i64 {
            c.pending_acks().values().map(|p| i64::from(*p)).sum()
        }
        let mut d = SharedDispatcher::new();
        d.add_consumer(key(1), 0).unwrap();
        d.consumer_flow(key(1), 100).unwrap();
        let e = entry(1, 3, vec![]);
        let mut admitted = 0;
        let mut admission = |_k: ConsumerKey, _e: &BrokerEntry| {
            admitted += 1;
            true
        };
        let dispatch = d
            .send_to_consumer(key(1), vec![e.clone(), e.clone()], &mut admission)
            .unwrap();
        assert_eq!(admitted, 1, "the copy is refused before admission");
        assert_eq!(dispatch.commands.len(), 1);
        assert_eq!(dispatch.result.total_permits(), 3);
        assert_eq!(dispatch.result.permits(1), None);
        assert_eq!(
            dispatch.not_sent,
            vec![(Position::new(1, 1), NotSentReason::AlreadyPending)]
        );
        let c = d.consumer(key(1)).unwrap();
        assert_eq!(c.unacked_messages(), 3);
        assert_eq!(pending_sum(c), 3);
        assert_eq!(c.available_permits(), 97);
        assert_eq!(d.total_available_permits(), 97);
        assert!(d.take_replay().is_empty(), "it is out on the consumer");
        // Still pending from the earlier send: the same treatment.
        let again = d.send_to_consumer(key(1), vec![e], &mut AdmitAll).unwrap();
        assert!(again.commands.is_empty());
        assert_eq!(again.write_id, None);
        assert_eq!(
            again.not_sent,
            vec![(Position::new(1, 1), NotSentReason::AlreadyPending)]
        );
        assert!(d.take_replay().is_empty());
        assert_eq!(d.total_available_permits(), 97);
        assert_eq!(d.acknowledge(key(1), Position::new(1, 1)), Ok(3));
        let c = d.consumer(key(1)).unwrap();
        assert_eq!(c.unacked_messages(), 0);
        assert_eq!(pending_sum(c), 0);
        assert_eq!(
            d.acknowledge(key(1), Position::new(1, 1)),
            Err(BrokerPermitError::NotPending {
                key: key(1),
                position: Position::new(1, 1)
            })
        );
    }

    /// `has_replay` tells the dispatcher loop that a read is owed to the
    /// replay set: true after an admission rejection or a removal with
    /// pending acks, false once taken, and untouched by a copy refused as
    /// already pending (it is out on the consumer, not waiting).
    #[test]
    fn has_replay_reports_what_take_replay_would_return() {
        let mut d = SharedDispatcher::new();
        d.add_consumer(key(1), 0).unwrap();
        d.consumer_flow(key(1), 100).unwrap();
        assert!(!d.has_replay());
        let mut reject_two = |_k: ConsumerKey, e: &BrokerEntry| e.position.entry_id != 2;
        let dispatch = d
            .send_to_consumer(
                key(1),
                vec![entry(1, 1, vec![]), entry(2, 1, vec![])],
                &mut reject_two,
            )
            .unwrap();
        assert_eq!(dispatch.commands.len(), 1);
        assert!(d.has_replay(), "the rejected entry waits for replay");
        assert_eq!(d.take_replay(), vec![Position::new(1, 2)]);
        assert!(!d.has_replay());
        let again = d
            .send_to_consumer(key(1), vec![entry(1, 1, vec![])], &mut AdmitAll)
            .unwrap();
        assert_eq!(
            again.not_sent,
            vec![(Position::new(1, 1), NotSentReason::AlreadyPending)]
        );
        assert!(!d.has_replay(), "already pending is not waiting for replay");
        d.remove_consumer(key(1)).unwrap();
        assert!(d.has_replay(), "a removed consumer's pending acks wait");
        assert_eq!(d.take_replay(), vec![Position::new(1, 1)]);
        assert!(!d.has_replay());
    }
}
