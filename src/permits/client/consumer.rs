//! The client consumer's native-message path: frames and entry payloads in,
//! messages with permit tokens out, exactly P settled per command.

use std::collections::VecDeque;

use super::acked::AcknowledgedMessages;
use super::budget::{BudgetError, CommandBudget};
use super::resolution::{resolve_early, resolve_full, PermitProtocolError};
use super::state::{
    ClientConnection, ClientFrame, ClientPermitError, CloseReason, ConsumerPermitState,
    Incarnation, ReturnOutcome, ValidationError,
};
use crate::proto::frame::{self, PayloadError};
use crate::proto::wire::{self, Command, CommandMessage, MessageIdData, WireError};
use crate::sync::{Arc, Ordering};

/// The one permit a handed-off message owes its source incarnation.
/// Released exactly once: by [`PermitToken::release`] or on drop.
#[derive(Debug)]
pub struct PermitToken {
    state: Option<Arc<ConsumerPermitState>>,
}

impl PermitToken {
    fn new(state: Arc<ConsumerPermitState>) -> Self {
        Self { state: Some(state) }
    }

    /// The source incarnation.
    pub fn incarnation(&self) -> Option<Incarnation> {
        self.state.as_ref().map(|s| s.incarnation())
    }

    /// Returns the permit to the source incarnation (a no-op credit if it
    /// was replaced). Consumes the token.
    ///
    /// # Errors
    /// [`PermitProtocolError::AccumulatorOverflow`] (the connection closes).
    pub fn release(mut self) -> Result<ReturnOutcome, PermitProtocolError> {
        crate::trace::permits::app_return(self.state.as_deref());
        match self.state.take() {
            Some(s) => s.return_permits(1),
            None => Ok(ReturnOutcome::Stale),
        }
    }
}

impl Drop for PermitToken {
    fn drop(&mut self) {
        if let Some(s) = self.state.take() {
            crate::trace::permits::app_return(Some(&s));
            if let Err(e) = s.return_permits(1) {
                tracing::error!(%e, "permit return on drop failed");
            }
        }
    }
}

/// A message handed off to the application; dequeuing it releases its
/// permit (drop it or call [`ReceivedMessage::release_permit`]).
#[derive(Debug)]
pub struct ReceivedMessage {
    /// Id (with `batch_index` for batched messages).
    pub message_id: MessageIdData,
    /// Payload bytes.
    pub payload: Vec<u8>,
    /// The permit it owes.
    pub token: PermitToken,
}

impl ReceivedMessage {
    /// Returns this message's permit now.
    ///
    /// # Errors
    /// [`PermitProtocolError::AccumulatorOverflow`].
    pub fn release_permit(self) -> Result<ReturnOutcome, PermitProtocolError> {
        self.token.release()
    }
}

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommandOutcomeKind {
    /// Expanded (possibly partially: `skipped` and a mid-batch failure are
    /// settled by the command's own return).
    Delivered {
        /// Deliverable indexes skipped (compacted-out, duplicate).
        skipped: u32,
        /// Whether expansion stopped at a corrupted message.
        failed_mid_batch: bool,
    },
    /// Corrupted before expansion (checksum / metadata): the whole early P
    /// was returned.
    Corrupted(ValidationError),
    /// The command's epoch is older than the consumer's: P returned.
    StaleEpoch,
    /// The consumer's incarnation was replaced, or its Subscribe is not yet
    /// acknowledged (the command was sent to the previous broker consumer):
    /// nothing returned (the broker consumer it was debited from is gone).
    StaleIncarnation,
    /// Protocol violation: the connection was closed, no credit.
    ProtocolError(PermitProtocolError),
}

/// Result of [`ClientConsumer::handle_message`]. For every non-protocol
/// outcome `delivered + returned = permits` (the messages return
/// `delivered` themselves when dequeued).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandOutcome {
    /// P settled for this command (0 on protocol error or stale incarnation).
    pub permits: u32,
    /// Messages handed off to the application.
    pub delivered: u32,
    /// Permits returned by the command itself (drained budget).
    pub returned: u32,
    /// What happened.
    pub kind: CommandOutcomeKind,
}

/// What [`ClientConsumer::resubscribe`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resubscribed {
    /// The replaced incarnation.
    pub previous: Incarnation,
    /// The new incarnation (awaiting Subscribe success).
    pub incarnation: Incarnation,
    /// Messages of the previous incarnation cleared from the receiver
    /// queue (their returns were no-ops).
    pub cleared: u32,
}

/// The client consumer's native-message path (Pulsar's `ConsumerImpl`
/// message handling) with exact permit accounting.
///
/// Owned by the connection task (`&mut self`); returns from dequeued
/// messages happen on any thread through their [`PermitToken`].
#[derive(Debug)]
pub struct ClientConsumer {
    consumer_id: u64,
    receiver_queue_size: u32,
    connection: Arc<ClientConnection>,
    state: Arc<ConsumerPermitState>,
    epoch: u64,
    queue: VecDeque<ReceivedMessage>,
    acknowledged: AcknowledgedMessages,
}

impl ClientConsumer {
    /// Writes Subscribe for `consumer_id` on `connection`. The new
    /// incarnation accepts commands and writes Flow only after
    /// [`subscribe_succeeded`](Self::subscribe_succeeded) (the broker's
    /// Success, which follows on the connection every command the broker
    /// sent to a previous incarnation).
    ///
    /// # Errors
    /// [`ClientPermitError::ConnectionClosed`].
    pub fn subscribe(
        connection: Arc<ClientConnection>,
        consumer_id: u64,
        receiver_queue_size: u32,
    ) -> Result<Self, ClientPermitError> {
        let state = connection.subscribe(consumer_id, receiver_queue_size)?;
        Ok(Self {
            consumer_id,
            receiver_queue_size,
            connection,
            state,
            epoch: 0,
            queue: VecDeque::new(),
            acknowledged: AcknowledgedMessages::new(),
        })
    }

    /// The broker acknowledged the Subscribe of `incarnation`: if it is
    /// still the current one, Flow is enabled and the full receiver queue
    /// granted (returns the permits granted).
    ///
    /// # Errors
    /// [`ClientPermitError::NotCurrent`] for a replaced incarnation (ignore
    /// it), [`ClientPermitError::AlreadySubscribed`] for a second call on the
    /// same incarnation (no second grant), [`ClientPermitError::ConnectionClosed`].
    pub fn subscribe_succeeded(
        &mut self,
        incarnation: Incarnation,
    ) -> Result<u32, ClientPermitError> {
        if incarnation != self.state.incarnation() {
            return Err(ClientPermitError::NotCurrent(incarnation));
        }
        self.connection.subscribe_succeeded(&self.state)
    }

    /// The current permit state.
    pub fn state(&self) -> &Arc<ConsumerPermitState> {
        &self.state
    }

    /// The current connection.
    pub fn connection(&self) -> &Arc<ClientConnection> {
        &self.connection
    }

    /// consumer_id.
    pub fn consumer_id(&self) -> u64 {
        self.consumer_id
    }

    /// Current consumer epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Messages waiting in the receiver queue.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Dequeues the next message; the caller releases its permit (drop or
    /// [`ReceivedMessage::release_permit`]).
    pub fn receive(&mut self) -> Option<ReceivedMessage> {
        self.queue.pop_front()
    }

    /// Records an acknowledgment: redeliveries of it to this incarnation are
    /// skipped as duplicates (Pulsar's ack-grouping `isDuplicate`). The record
    /// is dropped by [`resubscribe`](Self::resubscribe): an ack sent on the
    /// old connection may have been lost with it (or with a broker restart),
    /// and the broker's redelivery must then reach the application again
    /// (at-least-once), or the message would never be acknowledged.
    pub fn acknowledge(&mut self, id: &MessageIdData) {
        self.acknowledged
            .insert(id.ledger_id, id.entry_id, id.batch_index(), id.batch_size);
    }

    /// Replaces the incarnation: on `connection` (a reconnect when it is a
    /// different connection, a close/recreate when it is the same). Writes
    /// CloseConsumer for the old incarnation if it is still open, clears the
    /// receiver queue (those messages belong to the old incarnation, so
    /// their returns are no-ops) and writes Subscribe; the full receiver
    /// queue is granted on [`subscribe_succeeded`](Self::subscribe_succeeded).
    ///
    /// # Errors
    /// [`ClientPermitError::ConnectionClosed`] (nothing changed).
    pub fn resubscribe(
        &mut self,
        connection: Arc<ClientConnection>,
    ) -> Result<Resubscribed, ClientPermitError> {
        let state = connection.subscribe(self.consumer_id, self.receiver_queue_size)?;
        let previous = self.state.incarnation();
        if !Arc::ptr_eq(&connection, &self.connection) && !self.state.is_closed() {
            match self.connection.close_consumer(self.consumer_id) {
                Ok(_)
                | Err(ClientPermitError::ConnectionClosed(_))
                | Err(ClientPermitError::UnknownConsumer { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        // same connection: `subscribe` above already closed the old state
        let cleared = self.queue.len() as u32;
        self.queue.clear();
        self.acknowledged.clear();
        let incarnation = state.incarnation();
        self.state = state;
        self.connection = connection;
        Ok(Resubscribed {
            previous,
            incarnation,
            cleared,
        })
    }

    /// Bumps the consumer epoch (redeliver unacknowledged): the queued
    /// messages are cleared and return their permits; commands of older
    /// epochs are discarded and return their P.
    pub fn redeliver_unacknowledged(&mut self) {
        self.epoch += 1;
        self.queue.clear();
        self.connection
            .push_frame(ClientFrame::RedeliverUnacknowledged {
                consumer_id: self.consumer_id,
                consumer_epoch: self.epoch,
            });
    }

    fn protocol_error(&self, err: PermitProtocolError) -> CommandOutcome {
        self.connection.close(CloseReason::Protocol(err.clone()));
        CommandOutcome {
            permits: 0,
            delivered: 0,
            returned: 0,
            kind: CommandOutcomeKind::ProtocolError(err),
        }
    }

    fn settle(
        &self,
        permits: u32,
        delivered: u32,
        returned: u32,
        kind: CommandOutcomeKind,
    ) -> CommandOutcome {
        crate::trace::permits::client_receive(self.state.trace_key(), delivered, false);
        // Returning 0 permits is a no-op in every state.
        if let Err(e) = self.state.return_permits(returned) {
            return self.protocol_error(e);
        }
        CommandOutcome {
            permits,
            delivered,
            returned,
            kind,
        }
    }

    fn corrupted(&self, cmd: &CommandMessage, early: u32, err: ValidationError) -> CommandOutcome {
        self.connection.push_frame(ClientFrame::AckValidationError {
            consumer_id: self.consumer_id,
            message_id: cmd.message_id.clone(),
            validation_error: err,
        });
        self.settle(early, 0, early, CommandOutcomeKind::Corrupted(err))
    }

    /// Decodes a `CommandMessage` frame and handles it with
    /// [`handle_message`](Self::handle_message). A truncated or malformed
    /// frame cannot be settled (P is unknown): the connection is closed and
    /// no credit returned ([`PermitProtocolError::Malformed`]).
    ///
    /// # Errors
    /// As [`handle_message`](Self::handle_message).
    pub fn handle_command_bytes(
        &mut self,
        command: &[u8],
        payload: &[u8],
    ) -> Result<CommandOutcome, ClientPermitError> {
        match wire::decode_command_message(command) {
            Ok(cmd) => self.handle_message(&cmd, payload),
            Err(e) => Ok(self.protocol_error(PermitProtocolError::Malformed(e))),
        }
    }

    /// Decodes one whole Pulsar frame (`[total_size][command_size][BaseCommand][headers_and_payload]`)
    /// and handles its `CommandMessage` with
    /// [`handle_message`](Self::handle_message). A malformed frame cannot
    /// be settled (P is unknown): the connection is closed and no credit
    /// returned ([`PermitProtocolError::MalformedFrame`]); `max_frame_size`
    /// bounds what is read (Pulsar: [`frame::DEFAULT_MAX_FRAME_SIZE`]).
    ///
    /// # Errors
    /// [`ClientPermitError::UnexpectedCommand`] for a well-formed frame
    /// that is not a MESSAGE (nothing settled; route it elsewhere); as
    /// [`handle_message`](Self::handle_message).
    pub fn handle_frame(
        &mut self,
        bytes: &[u8],
        max_frame_size: usize,
    ) -> Result<CommandOutcome, ClientPermitError> {
        let decoded = match frame::decode_frame(bytes, max_frame_size) {
            Ok(f) => f,
            Err(e) => return Ok(self.protocol_error(PermitProtocolError::MalformedFrame(e))),
        };
        match (&decoded.command, decoded.headers_and_payload) {
            (Command::Message(cmd), Some(payload)) => self.handle_message(cmd, payload),
            (other, _) => Err(ClientPermitError::UnexpectedCommand(other.type_name())),
        }
    }

    /// Handles one delivered command with its entry payload, Pulsar's
    /// `headersAndPayload` (`[0x0e02 …]? [0x0e01][crc32c]? [metadata size][MessageMetadata][payload]`,
    /// see [`frame::parse_entry_payload`] and
    /// [`encode_entry_payload`](crate::proto::frame::encode_entry_payload)):
    /// resolve P, validate, expand, settle.
    ///
    /// Outcomes: invalid / inconsistent explicit P closes the connection and
    /// returns 0; checksum or metadata corruption returns the early P; a
    /// stale epoch returns P; otherwise every deliverable, non-skipped
    /// message is handed off with one permit and the command returns the
    /// rest, so the total is exactly P.
    ///
    /// # Errors
    /// [`ClientPermitError::WrongConsumer`] (nothing settled: the caller
    /// routed the command wrongly).
    pub fn handle_message(
        &mut self,
        cmd: &CommandMessage,
        payload: &[u8],
    ) -> Result<CommandOutcome, ClientPermitError> {
        if cmd.consumer_id != self.consumer_id {
            return Err(ClientPermitError::WrongConsumer {
                expected: self.consumer_id,
                got: cmd.consumer_id,
            });
        }
        if self.state.is_closed() || !self.state.flow_enabled.load(Ordering::Acquire) {
            // a replaced incarnation, or a command the broker sent to the
            // previous incarnation before it saw our Subscribe
            crate::trace::permits::client_receive(self.state.trace_key(), 0, true);
            return Ok(CommandOutcome {
                permits: 0,
                delivered: 0,
                returned: 0,
                kind: CommandOutcomeKind::StaleIncarnation,
            });
        }
        let early = match resolve_early(cmd) {
            Ok(r) => r.permits,
            Err(e) => return Ok(self.protocol_error(e)),
        };
        // broker-entry metadata, magic, checksum, metadata
        let entry = match frame::parse_entry_payload(payload) {
            Ok(e) => e,
            Err(PayloadError::Checksum(_)) => {
                return Ok(self.corrupted(cmd, early, ValidationError::ChecksumMismatch));
            }
            Err(PayloadError::Metadata(_)) => {
                return Ok(self.corrupted(cmd, early, ValidationError::BatchDeSerializeError));
            }
        };
        let metadata = entry.metadata;
        let body = entry.payload;
        let mut at = 0usize;
        let batch_size = match metadata.batch_size() {
            Ok(b) => b,
            Err(WireError::InvalidBatchSize(b)) if cmd.message_permits.is_some() => {
                return Ok(self.protocol_error(PermitProtocolError::Inconsistent {
                    explicit: cmd.message_permits.unwrap_or(0),
                    batch_size: b.max(0) as u32,
                    expected: None,
                }));
            }
            Err(_) => {
                return Ok(self.corrupted(cmd, early, ValidationError::BatchDeSerializeError));
            }
        };
        let full = match resolve_full(cmd, batch_size) {
            Ok(r) => r.permits,
            Err(e) => return Ok(self.protocol_error(e)),
        };
        let mut budget = CommandBudget::new(full);
        if cmd.consumer_epoch.is_some_and(|e| e < self.epoch) {
            let returned = budget.drain();
            return Ok(self.settle(full, 0, returned, CommandOutcomeKind::StaleEpoch));
        }
        let mut skipped = 0;
        let mut failed_mid_batch = false;
        let is_batch = metadata.num_messages_in_batch.is_some();
        for index in 0..batch_size {
            // parse message `index` (also for non-deliverable ones, to advance)
            let (smm, payload_start) = if is_batch {
                match frame::read_batch_message_header(body, at) {
                    Ok((smm, start)) => (Some(smm), start),
                    Err(_) => {
                        failed_mid_batch = true;
                        break;
                    }
                }
            } else {
                (None, at)
            };
            let payload_len = match &smm {
                // read_batch_message_header rejects a negative payload_size
                Some(s) => s.payload_size.max(0) as usize,
                None => body.len().saturating_sub(payload_start),
            };
            let payload_end = payload_start.saturating_add(payload_len);
            at = payload_end;
            if !wire::is_deliverable(&cmd.ack_set, index) {
                continue;
            }
            let batch_index = if is_batch { index as i32 } else { -1 };
            let duplicate = self.acknowledged.contains(
                cmd.message_id.ledger_id,
                cmd.message_id.entry_id,
                batch_index,
            );
            if smm.as_ref().is_some_and(|s| s.compacted_out()) || duplicate {
                skipped += 1;
                continue;
            }
            if let Err(BudgetError::Exhausted { permits }) = budget.claim() {
                // more deliverable messages than P: malformed command
                let _ = budget.drain();
                return Ok(self.protocol_error(PermitProtocolError::BudgetExhausted { permits }));
            }
            // hand-off: build the message; a truncated payload fails it
            match body.get(payload_start..payload_end) {
                Some(bytes) => {
                    self.queue.push_back(ReceivedMessage {
                        message_id: MessageIdData {
                            batch_index: is_batch.then_some(batch_index),
                            batch_size: is_batch.then_some(batch_size as i32),
                            ack_set: Vec::new(),
                            ..cmd.message_id.clone()
                        },
                        payload: bytes.to_vec(),
                        token: PermitToken::new(Arc::clone(&self.state)),
                    });
                }
                None => {
                    // invariant: claim() just succeeded, so a unit is claimed
                    let _ = budget.restore();
                    failed_mid_batch = true;
                    break;
                }
            }
        }
        if failed_mid_batch {
            self.connection.push_frame(ClientFrame::AckValidationError {
                consumer_id: self.consumer_id,
                message_id: cmd.message_id.clone(),
                validation_error: ValidationError::BatchDeSerializeError,
            });
        }
        let delivered = budget.claimed();
        let returned = budget.drain();
        Ok(self.settle(
            full,
            delivered,
            returned,
            CommandOutcomeKind::Delivered {
                skipped,
                failed_mid_batch,
            },
        ))
    }
}
