//! Wire types of the permit protocol and the `ack_set` bitset helpers.
//!
//! Hand-written [`prost::Message`] structs with the field numbers, types and
//! labels of Pulsar's `PulsarApi.proto` (proto2). The entry metadata
//! (`MessageMetadata`, `SingleMessageMetadata`) is [`super::metadata`]'s.
//! Only the command fields the permit protocol and the simulator need are
//! declared; unknown fields are skipped
//! on decode, exactly as an old peer skips `message_permits` (so a decoded
//! command re-encodes without them).
//!
//! | message | fields declared here (`req` = proto2 `required`) |
//! |---|---|
//! | [`BaseCommand`] | type (1, req), subscribe (4), message (9), ack (10), flow (11), success (13), close_consumer (16), ping (18), pong (19), redeliverUnacknowledgedMessages (20) |
//! | [`CommandMessage`] | consumer_id (1, req), message_id (2, req), redelivery_count (3, default 0), ack_set (4, repeated int64), consumer_epoch (5), message_permits (6, PIP-491) |
//! | [`CommandFlow`] | consumer_id (1, req), messagePermits (2, req) |
//! | [`CommandSubscribe`] | topic (1, req), subscription (2, req), subType (3, req), consumer_id (4, req), request_id (5, req), consumer_name (6), priority_level (7), durable (8), initialPosition (13), keySharedMeta (17: keySharedMode 1, req), consumer_epoch (19) |
//! | [`CommandAck`] | consumer_id (1, req), ack_type (2, req), message_id (3, repeated), validation_error (4), txnid_least_bits (6), txnid_most_bits (7), request_id (8) |
//! | [`CommandSuccess`] | request_id (1, req) |
//! | [`CommandCloseConsumer`] | consumer_id (1, req), request_id (2, req) |
//! | [`CommandRedeliverUnacknowledgedMessages`] | consumer_id (1, req), message_ids (2, repeated), consumer_epoch (3) |
//! | [`MessageIdData`] | ledgerId (1, req), entryId (2, req), partition (3, default -1), batch_index (4, default -1), ack_set (5, repeated int64), batch_size (6), first_chunk_message_id (7) |
//!
//! Bytes are protoc's: fields in tag order, optional fields with an explicit
//! value (also 0) on the wire, repeated scalars **unpacked** (proto2 without
//! `[packed = true]`); decoders accept packed and unpacked.
//!
//! ## Required fields
//!
//! prost decodes a missing `required` field as its default. Every
//! `decode_*` here first runs [`check_required`] with the message's
//! [`RequiredSpec`] (recursing into its nested messages, also those whose
//! field is skipped here: `KeyValue`, `KeyLongValue`, `EncryptionKeys`,
//! `Schema`, a subscribe's `start_message_id`), so an omission is
//! [`WireError::Presence`] naming the field, as Pulsar's Java decoder
//! rejects it.
//!
//! | invariant | function | tests |
//! |---|---|---|
//! | a required-field omission is a typed error | [`decode_base_command`], [`decode_command_message`], [`decode_command_flow`], [`decode_message_metadata`](super::metadata::decode_message_metadata), [`decode_single_message_metadata`](super::metadata::decode_single_message_metadata), [`decode_message_id`] | `every_required_field_omission_is_a_typed_error`, `required_fields_of_skipped_nested_messages_are_checked` |
//! | `ack_set` written unpacked, read in both forms | prost `packed = "false"` | `ack_set_is_written_unpacked_and_read_in_both_forms` |
//! | no decoder panics or over-allocates | all of the above | `tests/wire_frames.rs` fuzz |
//!
//! ## `ack_set` convention
//!
//! An `ack_set` is a little-endian bitset of `i64` words: batch index `i` is
//! bit `i % 64` of word `i / 64`. A set bit means **not acknowledged, i.e.
//! deliverable**; a clear bit means acknowledged (skip). An absent or empty
//! `ack_set` means every index is deliverable. Only bits below the batch
//! size `B` count; bits at or above `B` are ignored (and words past
//! `ceil(B / 64)` therefore too).
//!
//! Decoding never panics: a truncated or malformed buffer is a
//! [`WireError::Decode`].

use prost::Message;

use crate::proto::presence::{check_required, RequiredSpec};

/// Largest permit value the protocol allows in one command or Flow
/// (`i32::MAX`, PIP-491's valid range is `1..=2^31-1`).
pub const MAX_PERMITS: u32 = i32::MAX as u32;

/// Errors decoding or validating wire data.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The protobuf bytes are truncated or malformed.
    #[error("malformed protobuf {what}: {reason}")]
    Decode {
        /// Which message was being decoded.
        what: &'static str,
        /// prost's description of the failure.
        reason: String,
    },
    /// The batch size (`num_messages_in_batch`) is not positive.
    #[error("invalid num_messages_in_batch {0}: must be at least 1")]
    InvalidBatchSize(i32),
    /// A proto2 `required` field is absent (or the raw structure is broken
    /// in a way found while checking presence).
    #[error(transparent)]
    Presence(#[from] crate::proto::presence::PresenceError),
    /// A `BaseCommand` whose `type` names a command whose field is absent.
    #[error("BaseCommand of type {type_name} ({type_value}) lacks its {type_name} field")]
    MissingCommand {
        /// The `type` value.
        type_value: i32,
        /// Its name.
        type_name: &'static str,
    },
    /// A non-empty `ack_set` leaves no deliverable index below the batch size.
    #[error("ack_set has no deliverable index below batch size {batch_size}")]
    NoDeliverableIndex {
        /// The batch size B the bits were counted against.
        batch_size: u32,
    },
}

/// `MessageIdData`: the id of a delivered entry (and, for batch-index
/// acknowledgment, its remaining-index `ack_set`).
#[derive(Clone, PartialEq, Eq, Message)]
pub struct MessageIdData {
    /// `ledgerId = 1`, required uint64.
    #[prost(uint64, required, tag = "1")]
    pub ledger_id: u64,
    /// `entryId = 2`, required uint64.
    #[prost(uint64, required, tag = "2")]
    pub entry_id: u64,
    /// `partition = 3`, optional int32, default -1.
    #[prost(int32, optional, tag = "3", default = "-1")]
    pub partition: Option<i32>,
    /// `batch_index = 4`, optional int32, default -1.
    #[prost(int32, optional, tag = "4", default = "-1")]
    pub batch_index: Option<i32>,
    /// `ack_set = 5`, repeated int64 (proto2, unpacked).
    #[prost(int64, repeated, packed = "false", tag = "5")]
    pub ack_set: Vec<i64>,
    /// `batch_size = 6`, optional int32.
    #[prost(int32, optional, tag = "6")]
    pub batch_size: Option<i32>,
    /// `first_chunk_message_id = 7`, optional MessageIdData.
    #[prost(message, optional, boxed, tag = "7")]
    pub first_chunk_message_id: Option<Box<MessageIdData>>,
}

/// `CommandMessage`: the broker delivers one entry to a consumer.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct CommandMessage {
    /// `consumer_id = 1`, required uint64.
    #[prost(uint64, required, tag = "1")]
    pub consumer_id: u64,
    /// `message_id = 2`, required MessageIdData.
    #[prost(message, required, tag = "2")]
    pub message_id: MessageIdData,
    /// `redelivery_count = 3`, optional uint32, default 0.
    #[prost(uint32, optional, tag = "3", default = "0")]
    pub redelivery_count: Option<u32>,
    /// `ack_set = 4`, repeated int64 (proto2, unpacked): the deliverable
    /// indexes of a partially acknowledged batch.
    #[prost(int64, repeated, packed = "false", tag = "4")]
    pub ack_set: Vec<i64>,
    /// `consumer_epoch = 5`, optional uint64.
    #[prost(uint64, optional, tag = "5")]
    pub consumer_epoch: Option<u64>,
    /// `message_permits = 6`, optional uint32 **without default** (PIP-491
    /// draft 2): the permits P the broker debited for this command. An
    /// upgraded broker always sends it (also P = 1); `None` means an old
    /// broker or a proxy that dropped the field.
    #[prost(uint32, optional, tag = "6")]
    pub message_permits: Option<u32>,
}

/// `CommandFlow`: the client grants `message_permits` more permits to a
/// consumer (additive; the broker rejects 0).
#[derive(Clone, PartialEq, Eq, Message)]
pub struct CommandFlow {
    /// `consumer_id = 1`, required uint64.
    #[prost(uint64, required, tag = "1")]
    pub consumer_id: u64,
    /// `messagePermits = 2`, required uint32.
    #[prost(uint32, required, tag = "2")]
    pub message_permits: u32,
}

/// `CommandAck.AckType` (`PulsarApi.proto`), also the `ack_type` of the
/// pending-ack log (`TransactionPendingAck.proto` imports it;
/// [`crate::pending_ack::AckType`] is this type).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum AckType {
    /// `Individual = 0`: acknowledges exactly the listed positions.
    Individual = 0,
    /// `Cumulative = 1`: acknowledges everything up to and including the
    /// position.
    Cumulative = 1,
}

/// `CommandSubscribe.SubType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum SubType {
    /// `Exclusive = 0`.
    Exclusive = 0,
    /// `Shared = 1`.
    Shared = 1,
    /// `Failover = 2`.
    Failover = 2,
    /// `Key_Shared = 3`.
    KeyShared = 3,
}

/// `KeySharedMeta` (in `CommandSubscribe.keySharedMeta`), reduced to its
/// required mode (`hashRanges` = 3 and `allowOutOfOrderDelivery` = 4 are
/// skipped on decode; a `hashRanges` entry is still checked for its required
/// fields).
#[derive(Clone, PartialEq, Eq, Message)]
pub struct KeySharedMeta {
    /// `keySharedMode = 1`, required enum (AUTO_SPLIT = 0, STICKY = 1).
    #[prost(int32, required, tag = "1")]
    pub key_shared_mode: i32,
}

/// `CommandSubscribe`: its required fields and the optional ones a broker
/// reads to place the consumer (the others are skipped on decode; `None` is
/// absent on the wire).
#[derive(Clone, PartialEq, Eq, Message)]
pub struct CommandSubscribe {
    /// `topic = 1`, required string.
    #[prost(string, required, tag = "1")]
    pub topic: String,
    /// `subscription = 2`, required string.
    #[prost(string, required, tag = "2")]
    pub subscription: String,
    /// `subType = 3`, required SubType.
    #[prost(enumeration = "SubType", required, tag = "3")]
    pub sub_type: i32,
    /// `consumer_id = 4`, required uint64.
    #[prost(uint64, required, tag = "4")]
    pub consumer_id: u64,
    /// `request_id = 5`, required uint64.
    #[prost(uint64, required, tag = "5")]
    pub request_id: u64,
    /// `consumer_name = 6`, optional string.
    #[prost(string, optional, tag = "6")]
    pub consumer_name: Option<String>,
    /// `priority_level = 7`, optional int32.
    #[prost(int32, optional, tag = "7")]
    pub priority_level: Option<i32>,
    /// `durable = 8`, optional bool, default true.
    #[prost(bool, optional, tag = "8", default = "true")]
    pub durable: Option<bool>,
    /// `initialPosition = 13`, optional enum, default Latest (0); Earliest = 1.
    #[prost(int32, optional, tag = "13", default = "0")]
    pub initial_position: Option<i32>,
    /// `keySharedMeta = 17`, optional.
    #[prost(message, optional, tag = "17")]
    pub key_shared_meta: Option<KeySharedMeta>,
    /// `consumer_epoch = 19`, optional uint64.
    #[prost(uint64, optional, tag = "19")]
    pub consumer_epoch: Option<u64>,
}

/// `CommandAck`: an acknowledgment, or (with `validation_error`) the report
/// of a corrupted entry discarded before the application.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct CommandAck {
    /// `consumer_id = 1`, required uint64.
    #[prost(uint64, required, tag = "1")]
    pub consumer_id: u64,
    /// `ack_type = 2`, required AckType.
    #[prost(enumeration = "AckType", required, tag = "2")]
    pub ack_type: i32,
    /// `message_id = 3`, repeated MessageIdData.
    #[prost(message, repeated, tag = "3")]
    pub message_id: Vec<MessageIdData>,
    /// `validation_error = 4`, optional ValidationError (0..=4).
    #[prost(int32, optional, tag = "4")]
    pub validation_error: Option<i32>,
    /// `txnid_least_bits = 6`, optional uint64, default 0.
    #[prost(uint64, optional, tag = "6")]
    pub txnid_least_bits: Option<u64>,
    /// `txnid_most_bits = 7`, optional uint64, default 0.
    #[prost(uint64, optional, tag = "7")]
    pub txnid_most_bits: Option<u64>,
    /// `request_id = 8`, optional uint64.
    #[prost(uint64, optional, tag = "8")]
    pub request_id: Option<u64>,
}

/// `CommandSuccess`, reduced to `request_id`.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct CommandSuccess {
    /// `request_id = 1`, required uint64.
    #[prost(uint64, required, tag = "1")]
    pub request_id: u64,
}

/// `CommandCloseConsumer`, reduced to its required fields.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct CommandCloseConsumer {
    /// `consumer_id = 1`, required uint64.
    #[prost(uint64, required, tag = "1")]
    pub consumer_id: u64,
    /// `request_id = 2`, required uint64.
    #[prost(uint64, required, tag = "2")]
    pub request_id: u64,
}

/// `CommandRedeliverUnacknowledgedMessages`.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct CommandRedeliverUnacknowledgedMessages {
    /// `consumer_id = 1`, required uint64.
    #[prost(uint64, required, tag = "1")]
    pub consumer_id: u64,
    /// `message_ids = 2`, repeated MessageIdData.
    #[prost(message, repeated, tag = "2")]
    pub message_ids: Vec<MessageIdData>,
    /// `consumer_epoch = 3`, optional uint64.
    #[prost(uint64, optional, tag = "3")]
    pub consumer_epoch: Option<u64>,
}

/// `CommandPing` / `CommandPong` (no fields).
#[derive(Clone, PartialEq, Eq, Message)]
pub struct CommandPing {}

/// `BaseCommand.Type` values of the commands declared here.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum CommandType {
    /// `SUBSCRIBE = 4`.
    Subscribe = 4,
    /// `MESSAGE = 9`.
    Message = 9,
    /// `ACK = 10`.
    Ack = 10,
    /// `FLOW = 11`.
    Flow = 11,
    /// `SUCCESS = 13`.
    Success = 13,
    /// `CLOSE_CONSUMER = 16`.
    CloseConsumer = 16,
    /// `PING = 18`.
    Ping = 18,
    /// `PONG = 19`.
    Pong = 19,
    /// `REDELIVER_UNACKNOWLEDGED_MESSAGES = 20`.
    RedeliverUnacknowledgedMessages = 20,
}

/// `BaseCommand`: the envelope of every command on the connection (`type`
/// names which optional field carries the command). Only the fields of
/// [`CommandType`] are declared; other commands decode with their field
/// skipped and are reported by [`BaseCommand::command`] as
/// [`Command::Other`].
#[derive(Clone, PartialEq, Eq, Message)]
pub struct BaseCommand {
    /// `type = 1`, required Type.
    #[prost(int32, required, tag = "1")]
    pub r#type: i32,
    /// `subscribe = 4`.
    #[prost(message, optional, tag = "4")]
    pub subscribe: Option<CommandSubscribe>,
    /// `message = 9`.
    #[prost(message, optional, tag = "9")]
    pub message: Option<CommandMessage>,
    /// `ack = 10`.
    #[prost(message, optional, tag = "10")]
    pub ack: Option<CommandAck>,
    /// `flow = 11`.
    #[prost(message, optional, tag = "11")]
    pub flow: Option<CommandFlow>,
    /// `success = 13`.
    #[prost(message, optional, tag = "13")]
    pub success: Option<CommandSuccess>,
    /// `close_consumer = 16`.
    #[prost(message, optional, tag = "16")]
    pub close_consumer: Option<CommandCloseConsumer>,
    /// `ping = 18`.
    #[prost(message, optional, tag = "18")]
    pub ping: Option<CommandPing>,
    /// `pong = 19`.
    #[prost(message, optional, tag = "19")]
    pub pong: Option<CommandPing>,
    /// `redeliverUnacknowledgedMessages = 20`.
    #[prost(message, optional, tag = "20")]
    pub redeliver_unacknowledged_messages: Option<CommandRedeliverUnacknowledgedMessages>,
}

/// A decoded command, by type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// SUBSCRIBE.
    Subscribe(CommandSubscribe),
    /// MESSAGE.
    Message(CommandMessage),
    /// ACK.
    Ack(CommandAck),
    /// FLOW.
    Flow(CommandFlow),
    /// SUCCESS.
    Success(CommandSuccess),
    /// CLOSE_CONSUMER.
    CloseConsumer(CommandCloseConsumer),
    /// PING.
    Ping,
    /// PONG.
    Pong,
    /// REDELIVER_UNACKNOWLEDGED_MESSAGES.
    RedeliverUnacknowledgedMessages(CommandRedeliverUnacknowledgedMessages),
    /// A command type this crate does not declare (the raw `type` value).
    Other(i32),
}

impl Command {
    /// Wraps the command in its `BaseCommand` envelope (`Other` yields a
    /// `BaseCommand` with only `type`).
    pub fn into_base(self) -> BaseCommand {
        let mut b = BaseCommand::default();
        b.r#type = match self {
            Command::Subscribe(c) => {
                b.subscribe = Some(c);
                CommandType::Subscribe as i32
            }
            Command::Message(c) => {
                b.message = Some(c);
                CommandType::Message as i32
            }
            Command::Ack(c) => {
                b.ack = Some(c);
                CommandType::Ack as i32
            }
            Command::Flow(c) => {
                b.flow = Some(c);
                CommandType::Flow as i32
            }
            Command::Success(c) => {
                b.success = Some(c);
                CommandType::Success as i32
            }
            Command::CloseConsumer(c) => {
                b.close_consumer = Some(c);
                CommandType::CloseConsumer as i32
            }
            Command::Ping => {
                b.ping = Some(CommandPing {});
                CommandType::Ping as i32
            }
            Command::Pong => {
                b.pong = Some(CommandPing {});
                CommandType::Pong as i32
            }
            Command::RedeliverUnacknowledgedMessages(c) => {
                b.redeliver_unacknowledged_messages = Some(c);
                CommandType::RedeliverUnacknowledgedMessages as i32
            }
            Command::Other(t) => t,
        };
        b
    }

    /// The `BaseCommand.Type` name (`"MESSAGE"`, …; `"UNKNOWN"` for others).
    pub fn type_name(&self) -> &'static str {
        match self {
            Command::Subscribe(_) => "SUBSCRIBE",
            Command::Message(_) => "MESSAGE",
            Command::Ack(_) => "ACK",
            Command::Flow(_) => "FLOW",
            Command::Success(_) => "SUCCESS",
            Command::CloseConsumer(_) => "CLOSE_CONSUMER",
            Command::Ping => "PING",
            Command::Pong => "PONG",
            Command::RedeliverUnacknowledgedMessages(_) => "REDELIVER_UNACKNOWLEDGED_MESSAGES",
            Command::Other(_) => "UNKNOWN",
        }
    }
}

impl BaseCommand {
    /// The command this envelope carries.
    ///
    /// # Errors
    /// [`WireError::MissingCommand`] when `type` names a declared command
    /// whose field is absent (Pulsar's `checkArgument(cmd.hasX())`).
    pub fn command(&self) -> Result<Command, WireError> {
        let missing = |t: CommandType, name| WireError::MissingCommand {
            type_value: t as i32,
            type_name: name,
        };
        let Ok(t) = CommandType::try_from(self.r#type) else {
            return Ok(Command::Other(self.r#type));
        };
        Ok(match t {
            CommandType::Subscribe => {
                Command::Subscribe(self.subscribe.clone().ok_or(missing(t, "SUBSCRIBE"))?)
            }
            CommandType::Message => {
                Command::Message(self.message.clone().ok_or(missing(t, "MESSAGE"))?)
            }
            CommandType::Ack => Command::Ack(self.ack.clone().ok_or(missing(t, "ACK"))?),
            CommandType::Flow => Command::Flow(self.flow.clone().ok_or(missing(t, "FLOW"))?),
            CommandType::Success => {
                Command::Success(self.success.clone().ok_or(missing(t, "SUCCESS"))?)
            }
            CommandType::CloseConsumer => Command::CloseConsumer(
                self.close_consumer
                    .clone()
                    .ok_or(missing(t, "CLOSE_CONSUMER"))?,
            ),
            CommandType::Ping => {
                self.ping.as_ref().ok_or(missing(t, "PING"))?;
                Command::Ping
            }
            CommandType::Pong => {
                self.pong.as_ref().ok_or(missing(t, "PONG"))?;
                Command::Pong
            }
            CommandType::RedeliverUnacknowledgedMessages => {
                Command::RedeliverUnacknowledgedMessages(
                    self.redeliver_unacknowledged_messages
                        .clone()
                        .ok_or(missing(t, "REDELIVER_UNACKNOWLEDGED_MESSAGES"))?,
                )
            }
        })
    }
}

// ---------------------------------------------------------------------------
// required fields (proto2), checked before prost decodes
// ---------------------------------------------------------------------------

/// Required fields of `KeyValue` (properties and metadata; skipped on
/// decode, checked because Pulsar's decoder checks them).
pub static KEY_VALUE: RequiredSpec = RequiredSpec {
    message: "KeyValue",
    required: &[(1, "key"), (2, "value")],
    nested: &[],
};
/// Required fields of `KeyLongValue` (`CommandAck.properties`; skipped).
pub static KEY_LONG_VALUE: RequiredSpec = RequiredSpec {
    message: "KeyLongValue",
    required: &[(1, "key"), (2, "value")],
    nested: &[],
};
/// Required fields of `EncryptionKeys` (`MessageMetadata.encryption_keys`; skipped).
pub static ENCRYPTION_KEYS: RequiredSpec = RequiredSpec {
    message: "EncryptionKeys",
    required: &[(1, "key"), (2, "value")],
    nested: &[(3, true, &KEY_VALUE)],
};
/// Required fields of `Schema` (in `CommandSubscribe` and `CommandSuccess`; skipped).
pub static SCHEMA: RequiredSpec = RequiredSpec {
    message: "Schema",
    required: &[(1, "name"), (3, "schema_data"), (4, "type")],
    nested: &[(5, true, &KEY_VALUE)],
};
/// Required fields of `MessageIdData` (and its `first_chunk_message_id`).
pub static MESSAGE_ID_DATA: RequiredSpec = RequiredSpec {
    message: "MessageIdData",
    required: &[(1, "ledgerId"), (2, "entryId")],
    nested: &[(7, false, &MESSAGE_ID_DATA)],
};
/// Required fields of `CommandMessage`.
pub static COMMAND_MESSAGE: RequiredSpec = RequiredSpec {
    message: "CommandMessage",
    required: &[(1, "consumer_id"), (2, "message_id")],
    nested: &[(2, false, &MESSAGE_ID_DATA)],
};
/// Required fields of `CommandFlow`.
pub static COMMAND_FLOW: RequiredSpec = RequiredSpec {
    message: "CommandFlow",
    required: &[(1, "consumer_id"), (2, "messagePermits")],
    nested: &[],
};
/// Required fields of `CommandSubscribe`.
pub static COMMAND_SUBSCRIBE: RequiredSpec = RequiredSpec {
    message: "CommandSubscribe",
    required: &[
        (1, "topic"),
        (2, "subscription"),
        (3, "subType"),
        (4, "consumer_id"),
        (5, "request_id"),
    ],
    nested: &[
        (9, false, &MESSAGE_ID_DATA),
        (10, true, &KEY_VALUE),
        (12, false, &SCHEMA),
        (17, false, &KEY_SHARED_META),
    ],
};
/// Required fields of `KeySharedMeta`.
pub static KEY_SHARED_META: RequiredSpec = RequiredSpec {
    message: "KeySharedMeta",
    required: &[(1, "keySharedMode")],
    nested: &[(3, true, &INT_RANGE)],
};
/// Required fields of `IntRange` (in `KeySharedMeta.hashRanges`).
pub static INT_RANGE: RequiredSpec = RequiredSpec {
    message: "IntRange",
    required: &[(1, "start"), (2, "end")],
    nested: &[],
};
/// Required fields of `CommandAck`.
pub static COMMAND_ACK: RequiredSpec = RequiredSpec {
    message: "CommandAck",
    required: &[(1, "consumer_id"), (2, "ack_type")],
    nested: &[(3, true, &MESSAGE_ID_DATA), (5, true, &KEY_LONG_VALUE)],
};
/// Required fields of `CommandSuccess`.
pub static COMMAND_SUCCESS: RequiredSpec = RequiredSpec {
    message: "CommandSuccess",
    required: &[(1, "request_id")],
    nested: &[(2, false, &SCHEMA)],
};
/// Required fields of `CommandCloseConsumer`.
pub static COMMAND_CLOSE_CONSUMER: RequiredSpec = RequiredSpec {
    message: "CommandCloseConsumer",
    required: &[(1, "consumer_id"), (2, "request_id")],
    nested: &[],
};
/// Required fields of `CommandRedeliverUnacknowledgedMessages`.
pub static COMMAND_REDELIVER: RequiredSpec = RequiredSpec {
    message: "CommandRedeliverUnacknowledgedMessages",
    required: &[(1, "consumer_id")],
    nested: &[(2, true, &MESSAGE_ID_DATA)],
};
/// Required fields of `BaseCommand` and of every command it declares.
pub static BASE_COMMAND: RequiredSpec = RequiredSpec {
    message: "BaseCommand",
    required: &[(1, "type")],
    nested: &[
        (4, false, &COMMAND_SUBSCRIBE),
        (9, false, &COMMAND_MESSAGE),
        (10, false, &COMMAND_ACK),
        (11, false, &COMMAND_FLOW),
        (13, false, &COMMAND_SUCCESS),
        (16, false, &COMMAND_CLOSE_CONSUMER),
        (20, false, &COMMAND_REDELIVER),
    ],
};

/// Decodes a `BaseCommand` and the command it carries.
///
/// # Errors
/// [`WireError::Presence`] for a missing required field (of the envelope
/// or of the carried command), [`WireError::Decode`] for malformed
/// protobuf, [`WireError::MissingCommand`]; never panics.
pub fn decode_base_command(bytes: &[u8]) -> Result<(BaseCommand, Command), WireError> {
    check_required(&BASE_COMMAND, bytes)?;
    let base = BaseCommand::decode(bytes).map_err(|e| decode_err("BaseCommand", e))?;
    let cmd = base.command()?;
    Ok((base, cmd))
}

pub(crate) fn decode_err(what: &'static str, e: prost::DecodeError) -> WireError {
    WireError::Decode {
        what,
        reason: e.to_string(),
    }
}

/// Decodes a [`CommandMessage`]; truncated/malformed input is a typed error.
///
/// # Errors
/// [`WireError`] for truncated or malformed protobuf (including a missing
/// required field); never panics.
pub fn decode_command_message(bytes: &[u8]) -> Result<CommandMessage, WireError> {
    check_required(&COMMAND_MESSAGE, bytes)?;
    CommandMessage::decode(bytes).map_err(|e| decode_err("CommandMessage", e))
}

/// Decodes a [`CommandFlow`].
///
/// # Errors
/// [`WireError`] for truncated or malformed protobuf (including a missing
/// required field); never panics.
pub fn decode_command_flow(bytes: &[u8]) -> Result<CommandFlow, WireError> {
    check_required(&COMMAND_FLOW, bytes)?;
    CommandFlow::decode(bytes).map_err(|e| decode_err("CommandFlow", e))
}

/// Decodes a [`MessageIdData`].
///
/// # Errors
/// [`WireError`] for truncated or malformed protobuf (including a missing
/// required field); never panics.
pub fn decode_message_id(bytes: &[u8]) -> Result<MessageIdData, WireError> {
    check_required(&MESSAGE_ID_DATA, bytes)?;
    MessageIdData::decode(bytes).map_err(|e| decode_err("MessageIdData", e))
}

// ---------------------------------------------------------------------------
// ack_set helpers
// ---------------------------------------------------------------------------

/// Whether batch index `index` is deliverable under `ack_set` (bit
/// `index % 64` of word `index / 64` set). An empty `ack_set` makes every
/// index deliverable; an index past the last word is not deliverable
/// (missing words are zero, as in `BitSet.valueOf`).
pub fn is_deliverable(ack_set: &[i64], index: u32) -> bool {
    if ack_set.is_empty() {
        return true;
    }
    match ack_set.get((index / 64) as usize) {
        Some(word) => (*word as u64 >> (index % 64)) & 1 == 1,
        None => false,
    }
}

/// Number of set bits in `ack_set` at indexes below `batch_size` (the
/// deliverable count of a partial batch). Ignores the empty-means-all rule:
/// callers decide what an empty `ack_set` means (see [`expected_permits`]).
pub fn popcount_below(ack_set: &[i64], batch_size: u32) -> u32 {
    let mut count = 0u32;
    let full_words = (batch_size / 64) as usize;
    for (w, word) in ack_set.iter().enumerate() {
        let word = *word as u64;
        if w < full_words {
            count += word.count_ones();
        } else if w == full_words {
            // rem < 64; 0 masks the word out.
            let rem = batch_size % 64;
            count += (word & ((1u64 << rem) - 1)).count_ones();
            break;
        } else {
            break;
        }
    }
    count
}

/// Number of set bits in every word of `ack_set` (the *early* resolution,
/// before B is known). Saturates at `u64::MAX` (unreachable: a slice of
/// `i64` words cannot hold that many bits).
pub fn popcount_all(ack_set: &[i64]) -> u64 {
    ack_set.iter().map(|w| u64::from(w.count_ones())).sum()
}

/// The permits a command for a batch of `batch_size` messages with this
/// `ack_set` costs: B when `ack_set` is empty, else the deliverable bits
/// below B.
///
/// # Errors
/// [`WireError::NoDeliverableIndex`] when a non-empty `ack_set` has no
/// deliverable index below B (such an entry must never be sent).
pub fn expected_permits(ack_set: &[i64], batch_size: u32) -> Result<u32, WireError> {
    if ack_set.is_empty() {
        return Ok(batch_size);
    }
    match popcount_below(ack_set, batch_size) {
        0 => Err(WireError::NoDeliverableIndex { batch_size }),
        n => Ok(n),
    }
}

/// Builds the `ack_set` words whose deliverable bits are exactly `indexes`
/// (indexes may repeat or come in any order). The result has
/// `max(index) / 64 + 1` words, or none for no indexes.
pub fn ack_set_from_indexes(indexes: impl IntoIterator<Item = u32>) -> Vec<i64> {
    let mut words: Vec<u64> = Vec::new();
    for i in indexes {
        let w = (i / 64) as usize;
        if words.len() <= w {
            words.resize(w + 1, 0);
        }
        words[w] |= 1u64 << (i % 64);
    }
    words.into_iter().map(|w| w as i64).collect()
}

/// The deliverable indexes below `batch_size` under `ack_set` (all of
/// `0..batch_size` when `ack_set` is empty), ascending.
pub fn deliverable_indexes(ack_set: &[i64], batch_size: u32) -> impl Iterator<Item = u32> + '_ {
    (0..batch_size).filter(move |i| is_deliverable(ack_set, *i))
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests {
    use super::*;
    use crate::proto::metadata::*;
    use crate::proto::presence::PresenceError;

    #[test]
    fn ack_set_bits_follow_word_and_bit_layout() {
        let set = ack_set_from_indexes([0, 63, 64, 130]);
        assert_eq!(set.len(), 3);
        assert_eq!(set[0] as u64, 1 | (1 << 63));
        assert_eq!(set[1], 1);
        assert_eq!(set[2], 1 << 2);
        assert!(is_deliverable(&set, 63));
        assert!(!is_deliverable(&set, 62));
        assert!(!is_deliverable(&set, 1000));
        assert_eq!(popcount_below(&set, 64), 2);
        assert_eq!(popcount_below(&set, 65), 3);
        assert_eq!(popcount_below(&set, 130), 3);
        assert_eq!(popcount_below(&set, 131), 4);
        assert_eq!(popcount_all(&set), 4);
    }

    #[test]
    fn expected_permits_rules() {
        assert_eq!(expected_permits(&[], 10), Ok(10));
        assert_eq!(expected_permits(&[0b111], 10), Ok(3));
        // bits at or above B never count
        assert_eq!(expected_permits(&[0b1 | (1 << 20)], 10), Ok(1));
        assert_eq!(
            expected_permits(&[0], 4),
            Err(WireError::NoDeliverableIndex { batch_size: 4 })
        );
        assert_eq!(
            expected_permits(&[0b10], 1),
            Err(WireError::NoDeliverableIndex { batch_size: 1 })
        );
    }

    #[test]
    fn truncated_command_is_a_typed_error() {
        let cmd = CommandMessage {
            consumer_id: 7,
            message_id: MessageIdData {
                ledger_id: 1,
                entry_id: 2,
                ..Default::default()
            },
            ack_set: vec![0b1011],
            message_permits: Some(3),
            ..Default::default()
        };
        let bytes = cmd.encode_to_vec();
        assert_eq!(decode_command_message(&bytes), Ok(cmd));
        for cut in 1..bytes.len() {
            // every strict prefix either fails or decodes to something else;
            // it never panics
            let _ = decode_command_message(&bytes[..cut]);
        }
        assert!(matches!(
            decode_command_message(&bytes[..bytes.len() - 1]),
            Err(WireError::Decode { .. } | WireError::Presence(_))
        ));
    }

    #[test]
    fn metadata_batch_size_default_and_invalid() {
        let mut md = MessageMetadata::default();
        assert_eq!(md.batch_size(), Ok(1));
        md.num_messages_in_batch = Some(0);
        assert_eq!(md.batch_size(), Err(WireError::InvalidBatchSize(0)));
        md.num_messages_in_batch = Some(-3);
        assert_eq!(md.batch_size(), Err(WireError::InvalidBatchSize(-3)));
    }

    /// Each decoder of a proto2 message with `required` fields rejects the
    /// message with one required field left out, naming that field (prost
    /// alone would decode it as the field's default).
    #[test]
    fn every_required_field_omission_is_a_typed_error() {
        fn missing(r: Result<impl std::fmt::Debug, WireError>, field: &str) {
            match r {
                Err(WireError::Presence(PresenceError::MissingRequired { field: f, .. })) => {
                    assert_eq!(f, field)
                }
                other => panic!("expected missing {field}, got {other:?}"),
            }
        }
        // MessageIdData {ledgerId 3, entryId 4}
        assert!(decode_message_id(&[0x08, 3, 0x10, 4]).is_ok());
        missing(decode_message_id(&[0x10, 4]), "ledgerId");
        missing(decode_message_id(&[0x08, 3]), "entryId");
        // first_chunk_message_id without entryId
        missing(
            decode_message_id(&[0x08, 3, 0x10, 4, 0x3a, 2, 0x08, 1]),
            "entryId",
        );
        // CommandMessage {consumer_id 1, message_id {3, 4}}
        assert!(decode_command_message(&[0x08, 1, 0x12, 4, 0x08, 3, 0x10, 4]).is_ok());
        missing(
            decode_command_message(&[0x12, 4, 0x08, 3, 0x10, 4]),
            "consumer_id",
        );
        missing(decode_command_message(&[0x08, 1, 0x30, 3]), "message_id");
        missing(
            decode_command_message(&[0x08, 1, 0x12, 2, 0x08, 3]),
            "entryId",
        );
        // CommandFlow {consumer_id 1, messagePermits 100}
        assert!(decode_command_flow(&[0x08, 1, 0x10, 100]).is_ok());
        missing(decode_command_flow(&[0x08, 1]), "messagePermits");
        missing(decode_command_flow(&[0x10, 100]), "consumer_id");
        // MessageMetadata {producer_name "p", sequence_id 7, publish_time 9}
        let md = [0x0a, 1, b'p', 0x10, 7, 0x18, 9];
        assert!(decode_message_metadata(&md).is_ok());
        missing(decode_message_metadata(&md[3..]), "producer_name");
        missing(
            decode_message_metadata(&[0x0a, 1, b'p', 0x18, 9]),
            "sequence_id",
        );
        missing(decode_message_metadata(&md[..5]), "publish_time");
        // SingleMessageMetadata {payload_size 2}
        assert!(decode_single_message_metadata(&[0x18, 2]).is_ok());
        missing(decode_single_message_metadata(&[0x20, 1]), "payload_size");
        // BaseCommand {type FLOW, flow {...}}
        let flow = [0x08, 11, 0x5a, 4, 0x08, 1, 0x10, 100];
        assert!(decode_base_command(&flow).is_ok());
        missing(decode_base_command(&flow[2..]), "type");
        missing(
            decode_base_command(&[0x08, 11, 0x5a, 2, 0x08, 1]),
            "messagePermits",
        );
        assert_eq!(
            decode_base_command(&[0x08, 11]).unwrap_err(),
            WireError::MissingCommand {
                type_value: 11,
                type_name: "FLOW"
            }
        );
        // CommandSubscribe {topic, subscription, subType, consumer_id, request_id}
        let sub: Vec<u8> = [0x0a, 1, b't', 0x12, 1, b's', 0x18, 1, 0x20, 1, 0x28, 2].to_vec();
        let base = |c: &[u8]| {
            let mut v = vec![0x08, 4, 0x22, c.len() as u8];
            v.extend_from_slice(c);
            v
        };
        assert!(decode_base_command(&base(&sub)).is_ok());
        for (cut, field) in [
            (0..3, "topic"),
            (3..6, "subscription"),
            (6..8, "subType"),
            (8..10, "consumer_id"),
            (10..12, "request_id"),
        ] {
            let mut c = sub.clone();
            c.drain(cut);
            missing(decode_base_command(&base(&c)), field);
        }
        // CommandAck {consumer_id 1, ack_type 0, message_id [{3, 4}]} (field 10 = 0x52)
        let ack = |c: &[u8]| {
            let mut v = vec![0x08, 10, 0x52, c.len() as u8];
            v.extend_from_slice(c);
            v
        };
        assert!(decode_base_command(&ack(&[0x08, 1, 0x10, 0, 0x1a, 4, 0x08, 3, 0x10, 4])).is_ok());
        missing(decode_base_command(&ack(&[0x10, 0])), "consumer_id");
        missing(decode_base_command(&ack(&[0x08, 1])), "ack_type");
        missing(
            decode_base_command(&ack(&[0x08, 1, 0x10, 0, 0x1a, 2, 0x08, 3])),
            "entryId",
        );
        // CommandSuccess {request_id} (field 13 = 0x6a)
        assert!(decode_base_command(&[0x08, 13, 0x6a, 2, 0x08, 5]).is_ok());
        missing(decode_base_command(&[0x08, 13, 0x6a, 0]), "request_id");
        // CommandCloseConsumer {consumer_id, request_id} (field 16 = 0x82 0x01)
        assert!(decode_base_command(&[0x08, 16, 0x82, 1, 4, 0x08, 1, 0x10, 2]).is_ok());
        missing(
            decode_base_command(&[0x08, 16, 0x82, 1, 2, 0x08, 1]),
            "request_id",
        );
        missing(
            decode_base_command(&[0x08, 16, 0x82, 1, 2, 0x10, 2]),
            "consumer_id",
        );
        // CommandRedeliverUnacknowledgedMessages {consumer_id} (field 20 = 0xa2 0x01)
        assert!(decode_base_command(&[0x08, 20, 0xa2, 1, 2, 0x08, 1]).is_ok());
        missing(
            decode_base_command(&[0x08, 20, 0xa2, 1, 2, 0x18, 1]),
            "consumer_id",
        );
    }

    /// Pulsar's decoder checks the required fields of every nested message,
    /// also of the fields this crate skips (`KeyValue` properties,
    /// `EncryptionKeys`, `KeyLongValue`, `Schema`, a subscribe's
    /// `start_message_id`): each omission is a typed error here too.
    #[test]
    fn required_fields_of_skipped_nested_messages_are_checked() {
        fn missing(r: Result<impl std::fmt::Debug, WireError>, field: &str) {
            match r {
                Err(WireError::Presence(PresenceError::MissingRequired { field: f, .. })) => {
                    assert_eq!(f, field)
                }
                other => panic!("expected missing {field}, got {other:?}"),
            }
        }
        let md = [0x0a, 1, b'p', 0x10, 7, 0x18, 9];
        let with = |base: &[u8], extra: &[u8]| {
            let mut v = base.to_vec();
            v.extend_from_slice(extra);
            v
        };
        // MessageMetadata.properties (4) KeyValue {key, value}
        assert!(
            decode_message_metadata(&with(&md, &[0x22, 6, 0x0a, 1, b'k', 0x12, 1, b'v'])).is_ok()
        );
        missing(
            decode_message_metadata(&with(&md, &[0x22, 3, 0x0a, 1, b'k'])),
            "value",
        );
        missing(
            decode_message_metadata(&with(&md, &[0x22, 3, 0x12, 1, b'v'])),
            "key",
        );
        // MessageMetadata.encryption_keys (13) EncryptionKeys {key, value, metadata KeyValue}
        assert!(decode_message_metadata(&with(&md, &[0x6a, 6, 0x0a, 1, b'k', 0x12, 1, 1])).is_ok());
        missing(
            decode_message_metadata(&with(&md, &[0x6a, 3, 0x0a, 1, b'k'])),
            "value",
        );
        missing(
            decode_message_metadata(&with(
                &md,
                &[0x6a, 11, 0x0a, 1, b'k', 0x12, 1, 1, 0x1a, 3, 0x0a, 1, b'k'],
            )),
            "value",
        );
        // SingleMessageMetadata.properties (1)
        missing(
            decode_single_message_metadata(&[0x0a, 3, 0x12, 1, b'v', 0x18, 2]),
            "key",
        );
        // CommandSubscribe.start_message_id (9), metadata (10), schema (12)
        let sub = [0x0a, 1, b't', 0x12, 1, b's', 0x18, 1, 0x20, 1, 0x28, 2];
        let base = |c: &[u8]| {
            let mut v = vec![0x08, 4, 0x22, c.len() as u8];
            v.extend_from_slice(c);
            v
        };
        missing(
            decode_base_command(&base(&with(&sub, &[0x4a, 2, 0x08, 1]))),
            "entryId",
        );
        missing(
            decode_base_command(&base(&with(&sub, &[0x52, 3, 0x0a, 1, b'k']))),
            "value",
        );
        // Schema {name 1, schema_data 3, type 4}
        assert!(decode_base_command(&base(&with(
            &sub,
            &[0x62, 7, 0x0a, 1, b'n', 0x1a, 0, 0x20, 1]
        )))
        .is_ok());
        missing(
            decode_base_command(&base(&with(&sub, &[0x62, 5, 0x0a, 1, b'n', 0x1a, 0]))),
            "type",
        );
        // CommandSubscribe.keySharedMeta (17) {keySharedMode 1 required,
        // hashRanges 3: IntRange {start 1, end 2} required}
        assert!(decode_base_command(&base(&with(
            &sub,
            &[0x8a, 0x01, 8, 0x08, 1, 0x1a, 4, 0x08, 0, 0x10, 5]
        )))
        .is_ok());
        missing(
            decode_base_command(&base(&with(&sub, &[0x8a, 0x01, 2, 0x20, 1]))),
            "keySharedMode",
        );
        missing(
            decode_base_command(&base(&with(
                &sub,
                &[0x8a, 0x01, 6, 0x08, 1, 0x1a, 2, 0x08, 0],
            ))),
            "end",
        );
        // CommandAck.properties (5) KeyLongValue {key, value}
        let ack = [0x08, 10, 0x52, 9, 0x08, 1, 0x10, 0, 0x2a, 3, 0x0a, 1, b'k'];
        missing(decode_base_command(&ack), "value");
        // CommandSuccess.schema (2)
        missing(
            decode_base_command(&[0x08, 13, 0x6a, 4, 0x08, 5, 0x12, 0]),
            "name",
        );
    }

    /// proto2 repeated scalars are unpacked on the wire (what protoc writes
    /// for `repeated int64 ack_set = 4` without `[packed = true]`), and the
    /// decoder accepts the packed form too.
    #[test]
    fn ack_set_is_written_unpacked_and_read_in_both_forms() {
        let cmd = CommandMessage {
            consumer_id: 1,
            message_id: MessageIdData {
                ledger_id: 3,
                entry_id: 4,
                ..Default::default()
            },
            ack_set: vec![1, 2],
            message_permits: Some(2),
            ..Default::default()
        };
        let unpacked = [
            0x08, 1, 0x12, 4, 0x08, 3, 0x10, 4, 0x20, 1, 0x20, 2, 0x30, 2,
        ];
        assert_eq!(cmd.encode_to_vec(), unpacked);
        let packed = [0x08, 1, 0x12, 4, 0x08, 3, 0x10, 4, 0x22, 2, 1, 2, 0x30, 2];
        assert_eq!(decode_command_message(&packed).unwrap(), cmd);
        // an explicit zero of an optional field is on the wire
        let zero = CommandMessage {
            message_permits: Some(0),
            ack_set: vec![],
            ..cmd
        };
        assert!(zero.encode_to_vec().ends_with(&[0x30, 0]));
    }
}
