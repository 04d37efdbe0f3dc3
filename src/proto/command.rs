//! Pulsar's `PulsarApi.proto` (proto2) messages the broker core reads and
//! writes that [`crate::proto::wire`] does not declare: the connect
//! handshake, lookup, producer/send, errors and the envelope that carries
//! them ([`BrokerCommand`], a `BaseCommand` with every command the core
//! handles). Field numbers, types, labels and defaults are Pulsar's;
//! optional fields are `Option` so an explicit value (also 0) is on the
//! wire, as protoc writes it (`bash .ci/check protoc` compares them).
//! Messages shared with the permit protocol (`CommandMessage`,
//! `CommandFlow`, `CommandAck`, `MessageIdData`,
//! `CommandRedeliverUnacknowledgedMessages`, `CommandSubscribe`) are
//! [`crate::proto::wire`]'s types, nested here.
//!
//! Required fields decode to their default when missing (prost); the
//! handlers that need one check presence through [`has_required`], which
//! runs the crate's one proto2 walker ([`crate::proto::presence`]), so a
//! client that omits one gets a typed error, never a guess.

use prost::Message;

use crate::proto::presence;
pub use crate::proto::wire::{
    CommandAck, CommandFlow, CommandMessage, CommandRedeliverUnacknowledgedMessages,
    CommandSubscribe, CommandSuccess, MessageIdData,
};

/// `BaseCommand.Type` values used by the server (the value equals the
/// number of the field that carries the command).
#[allow(missing_docs)]
pub mod ty {
    pub const CONNECT: i32 = 2;
    pub const CONNECTED: i32 = 3;
    pub const SUBSCRIBE: i32 = 4;
    pub const PRODUCER: i32 = 5;
    pub const SEND: i32 = 6;
    pub const SEND_RECEIPT: i32 = 7;
    pub const SEND_ERROR: i32 = 8;
    pub const MESSAGE: i32 = 9;
    pub const ACK: i32 = 10;
    pub const FLOW: i32 = 11;
    pub const UNSUBSCRIBE: i32 = 12;
    pub const SUCCESS: i32 = 13;
    pub const ERROR: i32 = 14;
    pub const CLOSE_PRODUCER: i32 = 15;
    pub const CLOSE_CONSUMER: i32 = 16;
    pub const PRODUCER_SUCCESS: i32 = 17;
    pub const PING: i32 = 18;
    pub const PONG: i32 = 19;
    pub const REDELIVER_UNACKNOWLEDGED_MESSAGES: i32 = 20;
    pub const PARTITIONED_METADATA: i32 = 21;
    pub const PARTITIONED_METADATA_RESPONSE: i32 = 22;
    pub const LOOKUP: i32 = 23;
    pub const LOOKUP_RESPONSE: i32 = 24;
    pub const SEEK: i32 = 28;
    pub const GET_LAST_MESSAGE_ID: i32 = 29;
    pub const GET_LAST_MESSAGE_ID_RESPONSE: i32 = 30;
    pub const ACTIVE_CONSUMER_CHANGE: i32 = 31;
    pub const GET_SCHEMA: i32 = 34;
    pub const GET_SCHEMA_RESPONSE: i32 = 35;
    pub const ACK_RESPONSE: i32 = 38;
    pub const NEW_TXN: i32 = 50;
    pub const NEW_TXN_RESPONSE: i32 = 51;
    pub const ADD_PARTITION_TO_TXN: i32 = 52;
    pub const ADD_PARTITION_TO_TXN_RESPONSE: i32 = 53;
    pub const ADD_SUBSCRIPTION_TO_TXN: i32 = 54;
    pub const ADD_SUBSCRIPTION_TO_TXN_RESPONSE: i32 = 55;
    pub const END_TXN: i32 = 56;
    pub const END_TXN_RESPONSE: i32 = 57;
    pub const END_TXN_ON_PARTITION: i32 = 58;
    pub const END_TXN_ON_PARTITION_RESPONSE: i32 = 59;
    pub const END_TXN_ON_SUBSCRIPTION: i32 = 60;
    pub const END_TXN_ON_SUBSCRIPTION_RESPONSE: i32 = 61;
    pub const TC_CLIENT_CONNECT_REQUEST: i32 = 62;
    pub const TC_CLIENT_CONNECT_RESPONSE: i32 = 63;
}

/// `ServerError` values the server answers with.
#[allow(missing_docs)]
pub mod server_error {
    pub const UNKNOWN_ERROR: i32 = 0;
    pub const METADATA_ERROR: i32 = 1;
    pub const PERSISTENCE_ERROR: i32 = 2;
    pub const CONSUMER_BUSY: i32 = 5;
    pub const SERVICE_NOT_READY: i32 = 6;
    pub const CHECKSUM_ERROR: i32 = 9;
    pub const UNSUPPORTED_VERSION_ERROR: i32 = 10;
    pub const TOPIC_NOT_FOUND: i32 = 11;
    pub const CONSUMER_NOT_FOUND: i32 = 13;
    pub const PRODUCER_BUSY: i32 = 16;
    pub const INVALID_TOPIC_NAME: i32 = 17;
    pub const TRANSACTION_COORDINATOR_NOT_FOUND: i32 = 20;
    pub const INVALID_TXN_STATUS: i32 = 21;
    pub const NOT_ALLOWED_ERROR: i32 = 22;
    pub const TRANSACTION_CONFLICT: i32 = 23;
    pub const TRANSACTION_NOT_FOUND: i32 = 24;
    pub const PRODUCER_FENCED: i32 = 25;
}

/// `CommandConnect`.
#[derive(Clone, PartialEq, Message)]
pub struct CommandConnect {
    /// `client_version = 1`, required string.
    #[prost(string, required, tag = "1")]
    pub client_version: String,
    /// `protocol_version = 4`, optional int32, default 0.
    #[prost(int32, optional, tag = "4", default = "0")]
    pub protocol_version: Option<i32>,
}

/// `CommandConnected`.
#[derive(Clone, PartialEq, Message)]
pub struct CommandConnected {
    /// `server_version = 1`, required string.
    #[prost(string, required, tag = "1")]
    pub server_version: String,
    /// `protocol_version = 2`, optional int32, default 0.
    #[prost(int32, optional, tag = "2", default = "0")]
    pub protocol_version: Option<i32>,
    /// `max_message_size = 3`, optional int32.
    #[prost(int32, optional, tag = "3")]
    pub max_message_size: Option<i32>,
}

/// `CommandPartitionedTopicMetadata`.
#[derive(Clone, PartialEq, Message)]
pub struct CommandPartitionedTopicMetadata {
    /// `topic = 1`, required.
    #[prost(string, required, tag = "1")]
    pub topic: String,
    /// `request_id = 2`, required.
    #[prost(uint64, required, tag = "2")]
    pub request_id: u64,
}

/// `CommandPartitionedTopicMetadataResponse`.
#[derive(Clone, PartialEq, Message)]
pub struct CommandPartitionedTopicMetadataResponse {
    /// `partitions = 1`.
    #[prost(uint32, optional, tag = "1")]
    pub partitions: Option<u32>,
    /// `request_id = 2`, required.
    #[prost(uint64, required, tag = "2")]
    pub request_id: u64,
    /// `response = 3` (Success 0, Failed 1).
    #[prost(int32, optional, tag = "3")]
    pub response: Option<i32>,
    /// `error = 4`.
    #[prost(int32, optional, tag = "4")]
    pub error: Option<i32>,
    /// `message = 5`.
    #[prost(string, optional, tag = "5")]
    pub message: Option<String>,
}

/// `CommandLookupTopic`.
#[derive(Clone, PartialEq, Message)]
pub struct CommandLookupTopic {
    /// `topic = 1`, required.
    #[prost(string, required, tag = "1")]
    pub topic: String,
    /// `request_id = 2`, required.
    #[prost(uint64, required, tag = "2")]
    pub request_id: u64,
}

/// `CommandLookupTopicResponse`.
#[derive(Clone, PartialEq, Message)]
pub struct CommandLookupTopicResponse {
    /// `brokerServiceUrl = 1`.
    #[prost(string, optional, tag = "1")]
    pub broker_service_url: Option<String>,
    /// `response = 3` (Redirect 0, Connect 1, Failed 2).
    #[prost(int32, optional, tag = "3")]
    pub response: Option<i32>,
    /// `request_id = 4`, required.
    #[prost(uint64, required, tag = "4")]
    pub request_id: u64,
    /// `authoritative = 5`, default false.
    #[prost(bool, optional, tag = "5", default = "false")]
    pub authoritative: Option<bool>,
    /// `error = 6`.
    #[prost(int32, optional, tag = "6")]
    pub error: Option<i32>,
    /// `message = 7`.
    #[prost(string, optional, tag = "7")]
    pub message: Option<String>,
}

/// `CommandProducer` (the fields the server reads).
#[derive(Clone, PartialEq, Message)]
pub struct CommandProducer {
    /// `topic = 1`, required.
    #[prost(string, required, tag = "1")]
    pub topic: String,
    /// `producer_id = 2`, required.
    #[prost(uint64, required, tag = "2")]
    pub producer_id: u64,
    /// `request_id = 3`, required.
    #[prost(uint64, required, tag = "3")]
    pub request_id: u64,
    /// `producer_name = 4`.
    #[prost(string, optional, tag = "4")]
    pub producer_name: Option<String>,
    /// `producer_access_mode = 10` (`ProducerAccessMode`), default Shared (0).
    #[prost(int32, optional, tag = "10", default = "0")]
    pub producer_access_mode: Option<i32>,
    /// `topic_epoch = 11`: the epoch a reconnecting exclusive producer held.
    #[prost(uint64, optional, tag = "11")]
    pub topic_epoch: Option<u64>,
}

/// `CommandProducerSuccess`.
#[derive(Clone, PartialEq, Message)]
pub struct CommandProducerSuccess {
    /// `request_id = 1`, required.
    #[prost(uint64, required, tag = "1")]
    pub request_id: u64,
    /// `producer_name = 2`, required.
    #[prost(string, required, tag = "2")]
    pub producer_name: String,
    /// `last_sequence_id = 3`, optional int64, default -1.
    #[prost(int64, optional, tag = "3", default = "-1")]
    pub last_sequence_id: Option<i64>,
    /// `topic_epoch = 5`.
    #[prost(uint64, optional, tag = "5")]
    pub topic_epoch: Option<u64>,
    /// `producer_ready = 6`, default true (false: a `WaitForExclusive`
    /// producer is queued; a second PRODUCER_SUCCESS with the same
    /// request id follows when it gets the topic).
    #[prost(bool, optional, tag = "6", default = "true")]
    pub producer_ready: Option<bool>,
}

/// `CommandSend`.
#[derive(Clone, PartialEq, Message)]
pub struct CommandSend {
    /// `producer_id = 1`, required.
    #[prost(uint64, required, tag = "1")]
    pub producer_id: u64,
    /// `sequence_id = 2`, required.
    #[prost(uint64, required, tag = "2")]
    pub sequence_id: u64,
    /// `num_messages = 3`, default 1.
    #[prost(int32, optional, tag = "3", default = "1")]
    pub num_messages: Option<i32>,
    /// `txnid_least_bits = 4`.
    #[prost(uint64, optional, tag = "4", default = "0")]
    pub txnid_least_bits: Option<u64>,
    /// `txnid_most_bits = 5`.
    #[prost(uint64, optional, tag = "5", default = "0")]
    pub txnid_most_bits: Option<u64>,
    /// `highest_sequence_id = 6`, default 0.
    #[prost(uint64, optional, tag = "6", default = "0")]
    pub highest_sequence_id: Option<u64>,
    /// `is_chunk = 7`, default false.
    #[prost(bool, optional, tag = "7", default = "false")]
    pub is_chunk: Option<bool>,
}

/// `CommandSendReceipt`.
#[derive(Clone, PartialEq, Message)]
pub struct CommandSendReceipt {
    /// `producer_id = 1`, required.
    #[prost(uint64, required, tag = "1")]
    pub producer_id: u64,
    /// `sequence_id = 2`, required.
    #[prost(uint64, required, tag = "2")]
    pub sequence_id: u64,
    /// `message_id = 3`.
    #[prost(message, optional, tag = "3")]
    pub message_id: Option<MessageIdData>,
    /// `highest_sequence_id = 4`, default 0.
    #[prost(uint64, optional, tag = "4", default = "0")]
    pub highest_sequence_id: Option<u64>,
}

/// `CommandSendError`.
#[derive(Clone, PartialEq, Message)]
pub struct CommandSendError {
    /// `producer_id = 1`, required.
    #[prost(uint64, required, tag = "1")]
    pub producer_id: u64,
    /// `sequence_id = 2`, required.
    #[prost(uint64, required, tag = "2")]
    pub sequence_id: u64,
    /// `error = 3`, required ServerError.
    #[prost(int32, required, tag = "3")]
    pub error: i32,
    /// `message = 4`, required.
    #[prost(string, required, tag = "4")]
    pub message: String,
}

/// `CommandError`.
#[derive(Clone, PartialEq, Message)]
pub struct CommandError {
    /// `request_id = 1`, required.
    #[prost(uint64, required, tag = "1")]
    pub request_id: u64,
    /// `error = 2`, required ServerError.
    #[prost(int32, required, tag = "2")]
    pub error: i32,
    /// `message = 3`, required.
    #[prost(string, required, tag = "3")]
    pub message: String,
}

/// `CommandCloseProducer` / `CommandCloseConsumer` / `CommandUnsubscribe`
/// share this shape: `(id = 1, request_id = 2)`, both required.
#[derive(Clone, PartialEq, Message)]
pub struct CommandIdRequest {
    /// `producer_id` / `consumer_id = 1`, required.
    #[prost(uint64, required, tag = "1")]
    pub id: u64,
    /// `request_id = 2`, required.
    #[prost(uint64, required, tag = "2")]
    pub request_id: u64,
}

/// `CommandSeek`: reset a consumer's subscription to a message id or a
/// publish time (`expression = 5`, PIP-105, is not read).
#[derive(Clone, PartialEq, Message)]
pub struct CommandSeek {
    /// `consumer_id = 1`, required.
    #[prost(uint64, required, tag = "1")]
    pub consumer_id: u64,
    /// `request_id = 2`, required.
    #[prost(uint64, required, tag = "2")]
    pub request_id: u64,
    /// `message_id = 3` (with `ack_set` for a batch index).
    #[prost(message, optional, tag = "3")]
    pub message_id: Option<MessageIdData>,
    /// `message_publish_time = 4`, epoch ms.
    #[prost(uint64, optional, tag = "4")]
    pub message_publish_time: Option<u64>,
}

/// `CommandGetLastMessageIdResponse`.
#[derive(Clone, PartialEq, Message)]
pub struct CommandGetLastMessageIdResponse {
    /// `last_message_id = 1`, required.
    #[prost(message, required, tag = "1")]
    pub last_message_id: MessageIdData,
    /// `request_id = 2`, required.
    #[prost(uint64, required, tag = "2")]
    pub request_id: u64,
    /// `consumer_mark_delete_position = 3`.
    #[prost(message, optional, tag = "3")]
    pub consumer_mark_delete_position: Option<MessageIdData>,
}

/// `CommandGetSchemaResponse` (error form only: the server keeps no schemas).
#[derive(Clone, PartialEq, Message)]
pub struct CommandGetSchemaResponse {
    /// `request_id = 1`, required.
    #[prost(uint64, required, tag = "1")]
    pub request_id: u64,
    /// `error_code = 2`.
    #[prost(int32, optional, tag = "2")]
    pub error_code: Option<i32>,
    /// `error_message = 3`.
    #[prost(string, optional, tag = "3")]
    pub error_message: Option<String>,
}

/// `CommandAckResponse`.
#[derive(Clone, PartialEq, Message)]
pub struct CommandAckResponse {
    /// `consumer_id = 1`, required.
    #[prost(uint64, required, tag = "1")]
    pub consumer_id: u64,
    /// `txnid_least_bits = 2`, default 0 (set on a transactional ack's response).
    #[prost(uint64, optional, tag = "2", default = "0")]
    pub txnid_least_bits: Option<u64>,
    /// `txnid_most_bits = 3`, default 0.
    #[prost(uint64, optional, tag = "3", default = "0")]
    pub txnid_most_bits: Option<u64>,
    /// `error = 4`.
    #[prost(int32, optional, tag = "4")]
    pub error: Option<i32>,
    /// `message = 5`.
    #[prost(string, optional, tag = "5")]
    pub message: Option<String>,
    /// `request_id = 6`.
    #[prost(uint64, optional, tag = "6")]
    pub request_id: Option<u64>,
}

/// `CommandActiveConsumerChange` (Failover: whether the consumer is the
/// active one).
#[derive(Clone, PartialEq, Message)]
pub struct CommandActiveConsumerChange {
    /// `consumer_id = 1`, required.
    #[prost(uint64, required, tag = "1")]
    pub consumer_id: u64,
    /// `is_active = 2`, optional bool, default false.
    #[prost(bool, optional, tag = "2", default = "false")]
    pub is_active: Option<bool>,
}

/// `CommandPing` / `CommandPong` (no fields).
#[derive(Clone, PartialEq, Message)]
pub struct Empty {}

/// `BaseCommand` with every command the broker core reads or writes.
#[derive(Clone, PartialEq, Message)]
pub struct BrokerCommand {
    /// `type = 1`, required.
    #[prost(int32, required, tag = "1")]
    pub r#type: i32,
    #[prost(message, optional, tag = "2")]
    #[allow(missing_docs)]
    pub connect: Option<CommandConnect>,
    #[prost(message, optional, tag = "3")]
    #[allow(missing_docs)]
    pub connected: Option<CommandConnected>,
    #[prost(message, optional, tag = "4")]
    #[allow(missing_docs)]
    pub subscribe: Option<CommandSubscribe>,
    #[prost(message, optional, tag = "5")]
    #[allow(missing_docs)]
    pub producer: Option<CommandProducer>,
    #[prost(message, optional, tag = "6")]
    #[allow(missing_docs)]
    pub send: Option<CommandSend>,
    #[prost(message, optional, tag = "7")]
    #[allow(missing_docs)]
    pub send_receipt: Option<CommandSendReceipt>,
    #[prost(message, optional, tag = "8")]
    #[allow(missing_docs)]
    pub send_error: Option<CommandSendError>,
    #[prost(message, optional, tag = "9")]
    #[allow(missing_docs)]
    pub message: Option<CommandMessage>,
    #[prost(message, optional, tag = "10")]
    #[allow(missing_docs)]
    pub ack: Option<CommandAck>,
    #[prost(message, optional, tag = "11")]
    #[allow(missing_docs)]
    pub flow: Option<CommandFlow>,
    #[prost(message, optional, tag = "12")]
    #[allow(missing_docs)]
    pub unsubscribe: Option<CommandIdRequest>,
    #[prost(message, optional, tag = "13")]
    #[allow(missing_docs)]
    pub success: Option<CommandSuccess>,
    #[prost(message, optional, tag = "14")]
    #[allow(missing_docs)]
    pub error: Option<CommandError>,
    #[prost(message, optional, tag = "15")]
    #[allow(missing_docs)]
    pub close_producer: Option<CommandIdRequest>,
    #[prost(message, optional, tag = "16")]
    #[allow(missing_docs)]
    pub close_consumer: Option<CommandIdRequest>,
    #[prost(message, optional, tag = "17")]
    #[allow(missing_docs)]
    pub producer_success: Option<CommandProducerSuccess>,
    #[prost(message, optional, tag = "18")]
    #[allow(missing_docs)]
    pub ping: Option<Empty>,
    #[prost(message, optional, tag = "19")]
    #[allow(missing_docs)]
    pub pong: Option<Empty>,
    #[prost(message, optional, tag = "20")]
    #[allow(missing_docs)]
    pub redeliver_unacknowledged_messages: Option<CommandRedeliverUnacknowledgedMessages>,
    #[prost(message, optional, tag = "21")]
    #[allow(missing_docs)]
    pub partition_metadata: Option<CommandPartitionedTopicMetadata>,
    #[prost(message, optional, tag = "22")]
    #[allow(missing_docs)]
    pub partition_metadata_response: Option<CommandPartitionedTopicMetadataResponse>,
    #[prost(message, optional, tag = "23")]
    #[allow(missing_docs)]
    pub lookup_topic: Option<CommandLookupTopic>,
    #[prost(message, optional, tag = "24")]
    #[allow(missing_docs)]
    pub lookup_topic_response: Option<CommandLookupTopicResponse>,
    #[prost(message, optional, tag = "28")]
    #[allow(missing_docs)]
    pub seek: Option<CommandSeek>,
    #[prost(message, optional, tag = "29")]
    #[allow(missing_docs)]
    pub get_last_message_id: Option<CommandIdRequest>,
    #[prost(message, optional, tag = "30")]
    #[allow(missing_docs)]
    pub get_last_message_id_response: Option<CommandGetLastMessageIdResponse>,
    #[prost(message, optional, tag = "31")]
    #[allow(missing_docs)]
    pub active_consumer_change: Option<CommandActiveConsumerChange>,
    #[prost(message, optional, tag = "35")]
    #[allow(missing_docs)]
    pub get_schema_response: Option<CommandGetSchemaResponse>,
    #[prost(message, optional, tag = "38")]
    #[allow(missing_docs)]
    pub ack_response: Option<CommandAckResponse>,
    #[prost(message, optional, tag = "50")]
    #[allow(missing_docs)]
    pub new_txn: Option<super::txn::CommandNewTxn>,
    #[prost(message, optional, tag = "51")]
    #[allow(missing_docs)]
    pub new_txn_response: Option<super::txn::CommandTxnResponse>,
    #[prost(message, optional, tag = "52")]
    #[allow(missing_docs)]
    pub add_partition_to_txn: Option<super::txn::CommandAddPartitionToTxn>,
    #[prost(message, optional, tag = "53")]
    #[allow(missing_docs)]
    pub add_partition_to_txn_response: Option<super::txn::CommandTxnResponse>,
    #[prost(message, optional, tag = "54")]
    #[allow(missing_docs)]
    pub add_subscription_to_txn: Option<super::txn::CommandAddSubscriptionToTxn>,
    #[prost(message, optional, tag = "55")]
    #[allow(missing_docs)]
    pub add_subscription_to_txn_response: Option<super::txn::CommandTxnResponse>,
    #[prost(message, optional, tag = "56")]
    #[allow(missing_docs)]
    pub end_txn: Option<super::txn::CommandEndTxn>,
    #[prost(message, optional, tag = "57")]
    #[allow(missing_docs)]
    pub end_txn_response: Option<super::txn::CommandTxnResponse>,
    #[prost(message, optional, tag = "62")]
    #[allow(missing_docs)]
    pub tc_client_connect_request: Option<super::txn::CommandTcClientConnectRequest>,
    #[prost(message, optional, tag = "63")]
    #[allow(missing_docs)]
    pub tc_client_connect_response: Option<super::txn::CommandTcClientConnectResponse>,
}

/// Whether `ty` is a value of `BaseCommand.Type` (CONNECT = 2 ..
/// GET_OR_CREATE_SCHEMA_RESPONSE = 40, NEW_TXN = 50 .. TOPIC_MIGRATED = 68).
/// `type` is a proto2 required enum: Pulsar's decoder treats any other value
/// as the field missing and closes the connection.
pub fn is_command_type(ty: i32) -> bool {
    matches!(ty, 2..=40 | 50..=68)
}

/// Field number of `request_id` inside the command carried by `BaseCommand`
/// field `ty`, for commands the server does not implement, so its
/// `CommandError` names the request (`None`: the command has no request id).
pub fn request_id_tag(ty: i32) -> Option<u32> {
    match ty {
        // consumerStats (request_id = 1), getTopicsOfNamespace (1),
        // getSchema (1), getOrCreateSchema (1), the transaction commands (1).
        25 | 32 | 34 | 39 | 50..=63 => Some(1),
        // seek (consumer_id = 1, request_id = 2), watchTopicList (1).
        28 => Some(2),
        64 | 67 => Some(1),
        _ => None,
    }
}

/// Reads varint field `tag` of the message that `BaseCommand` carries in
/// field `outer` (`None` when absent or malformed).
pub fn nested_varint(base: &[u8], outer: u32, tag: u32) -> Option<u64> {
    let inner = presence::find_delimited("BaseCommand", base, outer).ok()??;
    presence::find_varint("command", inner, tag).ok()?
}

/// Whether `BaseCommand` bytes carry field `outer` and, inside it, every
/// field of `required` (proto2 presence, as Pulsar's decoder checks it).
///
/// # Errors
/// A description of the first absent field, or of the structural defect
/// found while walking.
pub fn has_required(base: &[u8], outer: u32, required: &[u32]) -> Result<(), String> {
    let malformed = |_| format!("malformed command in field {outer}");
    let Some(inner) = presence::find_delimited("BaseCommand", base, outer).map_err(malformed)?
    else {
        return Err(format!("BaseCommand lacks field {outer} for its type"));
    };
    match presence::first_missing_tag("command", inner, required).map_err(malformed)? {
        None => Ok(()),
        Some(tag) => Err(format!(
            "command in BaseCommand field {outer} lacks required field {tag}"
        )),
    }
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests {
    use super::*;

    fn base_with(ty: i32, inner: Vec<u8>) -> Vec<u8> {
        let mut b = vec![0x08, ty as u8];
        let key = ((ty as u32) << 3) | 2;
        if key < 0x80 {
            b.push(key as u8);
        } else {
            b.push((key as u8 & 0x7f) | 0x80);
            b.push((key >> 7) as u8);
        }
        b.push(inner.len() as u8);
        b.extend(inner);
        b
    }

    #[test]
    fn only_base_command_type_values_are_command_types() {
        for ty in [2, 18, 40, 50, 68] {
            assert!(is_command_type(ty), "{ty}");
        }
        for ty in [-1, 0, 1, 41, 49, 69, 999] {
            assert!(!is_command_type(ty), "{ty}");
        }
    }

    #[test]
    fn a_missing_required_field_is_named() {
        // CommandAck with consumer_id (1) but no ack_type (2).
        let raw = base_with(10, vec![0x08, 0x01]);
        let err = has_required(&raw, 10, &[1, 2]).unwrap_err();
        assert!(err.contains("lacks required field 2"), "{err}");
        assert!(has_required(&raw, 10, &[1]).is_ok());
        // The command field itself absent.
        assert!(has_required(&[0x08, 10], 10, &[1])
            .unwrap_err()
            .contains("lacks field 10"));
    }

    #[test]
    fn an_unsupported_command_reports_its_request_id() {
        // CommandSeek: consumer_id = 1, request_id = 77.
        let raw = base_with(28, vec![0x08, 0x01, 0x10, 77]);
        let tag = request_id_tag(28).unwrap();
        assert_eq!(nested_varint(&raw, 28, tag), Some(77));
        assert_eq!(request_id_tag(18), None);
        // Truncated bytes are None, not a panic.
        assert_eq!(nested_varint(&raw[..raw.len() - 1], 28, tag), None);
    }

    #[test]
    fn active_consumer_change_bytes_are_protocs() {
        // type=31, field 31 {consumer_id=7, is_active=false}: the default
        // value is on the wire (proto2 presence), as protoc writes a set field.
        let cmd = BrokerCommand {
            r#type: ty::ACTIVE_CONSUMER_CHANGE,
            active_consumer_change: Some(CommandActiveConsumerChange {
                consumer_id: 7,
                is_active: Some(false),
            }),
            ..Default::default()
        };
        assert_eq!(
            cmd.encode_to_vec(),
            vec![0x08, 31, 0xfa, 0x01, 4, 0x08, 7, 0x10, 0]
        );
    }

    #[test]
    fn protoc_presence_optional_zero_is_on_the_wire() {
        let cmd = BrokerCommand {
            r#type: ty::PARTITIONED_METADATA_RESPONSE,
            partition_metadata_response: Some(CommandPartitionedTopicMetadataResponse {
                partitions: Some(0),
                request_id: 5,
                response: Some(0),
                error: None,
                message: None,
            }),
            ..Default::default()
        };
        // type=22, field 22 {partitions=0, request_id=5, response=0}
        assert_eq!(
            cmd.encode_to_vec(),
            vec![0x08, 22, 0xb2, 0x01, 6, 0x08, 0, 0x10, 5, 0x18, 0]
        );
    }
}
