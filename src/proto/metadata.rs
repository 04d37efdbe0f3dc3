//! The metadata of a published entry: `MessageMetadata` (one per entry, the
//! producer's header) and `SingleMessageMetadata` (one per message of a
//! batch), with every field of `PulsarApi.proto` (proto2) that Pulsar 4.x
//! defines for them. One type serves every reader and writer: the broker
//! core (key, batch size, compression, delivery time, transaction and
//! marker fields), the permit client (batch size), the transaction buffer
//! and its markers, the simulator's producers and `inspect`.
//!
//! | field (`MessageMetadata`) | number | type, label, default |
//! |---|---|---|
//! | producer_name | 1 | string, required |
//! | sequence_id | 2 | uint64, required |
//! | publish_time | 3 | uint64, required (ms since the epoch) |
//! | properties | 4 | repeated [`KeyValue`] |
//! | replicated_from | 5 | string |
//! | partition_key | 6 | string |
//! | replicate_to | 7 | repeated string |
//! | compression | 8 | `CompressionType` ([`compression_type`]), default NONE |
//! | uncompressed_size | 9 | uint32, default 0 |
//! | num_messages_in_batch | 11 | int32, default 1 |
//! | event_time | 12 | uint64, default 0 |
//! | encryption_keys | 13 | repeated [`EncryptionKeys`] |
//! | encryption_algo | 14 | string |
//! | encryption_param | 15 | bytes |
//! | schema_version | 16 | bytes |
//! | partition_key_b64_encoded | 17 | bool, default false |
//! | ordering_key | 18 | bytes |
//! | deliver_at_time | 19 | int64 (ms since the epoch) |
//! | marker_type | 20 | int32 (`PulsarMarkers.proto`'s `MarkerType`) |
//! | txnid_least_bits | 22 | uint64 |
//! | txnid_most_bits | 23 | uint64 |
//! | highest_sequence_id | 24 | uint64, default 0 |
//! | null_value | 25 | bool, default false |
//! | uuid | 26 | string (chunking) |
//! | num_chunks_from_msg | 27 | int32 (chunking) |
//! | total_chunk_msg_size | 28 | int32 (chunking) |
//! | chunk_id | 29 | int32 (chunking) |
//! | null_partition_key | 30 | bool, default false |
//!
//! (10 was `checksum`, removed; 21 is not assigned.) Every optional field is
//! an `Option`, so an explicit value (also the default) is on the wire as
//! protoc writes it, and an absent one is absent; repeated fields are empty
//! when absent. `bash .ci/check protoc` compares a fixture setting every
//! field with protoc's bytes, and the decoders refuse an omitted required
//! field (also inside `properties` and `encryption_keys`).

use prost::Message;

use super::presence::{check_required, RequiredSpec};
use super::wire::{decode_err, WireError, ENCRYPTION_KEYS, KEY_VALUE};

/// `CompressionType` values (`compression = 8`).
pub mod compression_type {
    /// `NONE` (the default).
    pub const NONE: i32 = 0;
    /// `LZ4`.
    pub const LZ4: i32 = 1;
    /// `ZLIB`.
    pub const ZLIB: i32 = 2;
    /// `ZSTD`.
    pub const ZSTD: i32 = 3;
    /// `SNAPPY`.
    pub const SNAPPY: i32 = 4;
}

/// `KeyValue`: a message property.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct KeyValue {
    /// `key = 1`, required string.
    #[prost(string, required, tag = "1")]
    pub key: String,
    /// `value = 2`, required string.
    #[prost(string, required, tag = "2")]
    pub value: String,
}

/// `EncryptionKeys`: one encrypted data key of an encrypted message.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct EncryptionKeys {
    /// `key = 1`, required string (the key's name).
    #[prost(string, required, tag = "1")]
    pub key: String,
    /// `value = 2`, required bytes (the encrypted data key).
    #[prost(bytes = "vec", required, tag = "2")]
    pub value: Vec<u8>,
    /// `metadata = 3`, repeated [`KeyValue`].
    #[prost(message, repeated, tag = "3")]
    pub metadata: Vec<KeyValue>,
}

/// `MessageMetadata`: the header of a published entry, every field of
/// `PulsarApi.proto` (the table of the module docs).
#[derive(Clone, PartialEq, Eq, Message)]
pub struct MessageMetadata {
    /// `producer_name = 1`, required string.
    #[prost(string, required, tag = "1")]
    pub producer_name: String,
    /// `sequence_id = 2`, required uint64.
    #[prost(uint64, required, tag = "2")]
    pub sequence_id: u64,
    /// `publish_time = 3`, required uint64 (ms since the epoch).
    #[prost(uint64, required, tag = "3")]
    pub publish_time: u64,
    /// `properties = 4`, repeated `KeyValue`.
    #[prost(message, repeated, tag = "4")]
    pub properties: Vec<KeyValue>,
    /// `replicated_from = 5`: the source cluster of a replicated message.
    #[prost(string, optional, tag = "5")]
    pub replicated_from: Option<String>,
    /// `partition_key = 6`: the message key (routing, Key_Shared).
    #[prost(string, optional, tag = "6")]
    pub partition_key: Option<String>,
    /// `replicate_to = 7`, repeated string.
    #[prost(string, repeated, tag = "7")]
    pub replicate_to: Vec<String>,
    /// `compression = 8` (`CompressionType`, [`compression_type`]), default NONE.
    #[prost(int32, optional, tag = "8", default = "0")]
    pub compression: Option<i32>,
    /// `uncompressed_size = 9`, default 0: the payload's size once inflated.
    #[prost(uint32, optional, tag = "9", default = "0")]
    pub uncompressed_size: Option<u32>,
    /// `num_messages_in_batch = 11`, default 1: the batch size B (present
    /// only on a batch).
    #[prost(int32, optional, tag = "11", default = "1")]
    pub num_messages_in_batch: Option<i32>,
    /// `event_time = 12`, default 0.
    #[prost(uint64, optional, tag = "12", default = "0")]
    pub event_time: Option<u64>,
    /// `encryption_keys = 13`, repeated `EncryptionKeys`.
    #[prost(message, repeated, tag = "13")]
    pub encryption_keys: Vec<EncryptionKeys>,
    /// `encryption_algo = 14`.
    #[prost(string, optional, tag = "14")]
    pub encryption_algo: Option<String>,
    /// `encryption_param = 15`.
    #[prost(bytes = "vec", optional, tag = "15")]
    pub encryption_param: Option<Vec<u8>>,
    /// `schema_version = 16`.
    #[prost(bytes = "vec", optional, tag = "16")]
    pub schema_version: Option<Vec<u8>>,
    /// `partition_key_b64_encoded = 17`, default false.
    #[prost(bool, optional, tag = "17", default = "false")]
    pub partition_key_b64_encoded: Option<bool>,
    /// `ordering_key = 18`: the Key_Shared key when set (before `partition_key`).
    #[prost(bytes = "vec", optional, tag = "18")]
    pub ordering_key: Option<Vec<u8>>,
    /// `deliver_at_time = 19`: delayed delivery, ms since the epoch.
    #[prost(int64, optional, tag = "19")]
    pub deliver_at_time: Option<i64>,
    /// `marker_type = 20`: set on the broker's markers (transaction
    /// commit/abort, [`crate::proto::txn::marker_type`]), never dispatched.
    #[prost(int32, optional, tag = "20")]
    pub marker_type: Option<i32>,
    /// `txnid_least_bits = 22`: the transaction of a transactional message.
    #[prost(uint64, optional, tag = "22")]
    pub txnid_least_bits: Option<u64>,
    /// `txnid_most_bits = 23`.
    #[prost(uint64, optional, tag = "23")]
    pub txnid_most_bits: Option<u64>,
    /// `highest_sequence_id = 24`, default 0.
    #[prost(uint64, optional, tag = "24", default = "0")]
    pub highest_sequence_id: Option<u64>,
    /// `null_value = 25`, default false.
    #[prost(bool, optional, tag = "25", default = "false")]
    pub null_value: Option<bool>,
    /// `uuid = 26`: the chunked message's id.
    #[prost(string, optional, tag = "26")]
    pub uuid: Option<String>,
    /// `num_chunks_from_msg = 27`: chunks of the chunked message.
    #[prost(int32, optional, tag = "27")]
    pub num_chunks_from_msg: Option<i32>,
    /// `total_chunk_msg_size = 28`: the chunked message's whole size.
    #[prost(int32, optional, tag = "28")]
    pub total_chunk_msg_size: Option<i32>,
    /// `chunk_id = 29`: this chunk's index.
    #[prost(int32, optional, tag = "29")]
    pub chunk_id: Option<i32>,
    /// `null_partition_key = 30`, default false.
    #[prost(bool, optional, tag = "30", default = "false")]
    pub null_partition_key: Option<bool>,
}

/// `SingleMessageMetadata`: the header of one message inside a batch.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct SingleMessageMetadata {
    /// `partition_key = 2`, optional string.
    #[prost(string, optional, tag = "2")]
    pub partition_key: Option<String>,
    /// `payload_size = 3`, required int32 (bytes).
    #[prost(int32, required, tag = "3")]
    pub payload_size: i32,
    /// `compacted_out = 4`, optional bool, default false: the message was
    /// removed by compaction and must be skipped.
    #[prost(bool, optional, tag = "4", default = "false")]
    pub compacted_out: Option<bool>,
}

/// Required fields of `MessageMetadata` (and of its `properties` and
/// `encryption_keys`).
pub static MESSAGE_METADATA: RequiredSpec = RequiredSpec {
    message: "MessageMetadata",
    required: &[
        (1, "producer_name"),
        (2, "sequence_id"),
        (3, "publish_time"),
    ],
    nested: &[(4, true, &KEY_VALUE), (13, true, &ENCRYPTION_KEYS)],
};

/// Required fields of `SingleMessageMetadata`.
pub static SINGLE_MESSAGE_METADATA: RequiredSpec = RequiredSpec {
    message: "SingleMessageMetadata",
    required: &[(3, "payload_size")],
    nested: &[(1, true, &KEY_VALUE)],
};

impl MessageMetadata {
    /// The batch size B (`num_messages_in_batch`, 1 when absent).
    ///
    /// # Errors
    /// [`WireError::InvalidBatchSize`] when the field is 0 or negative.
    pub fn batch_size(&self) -> Result<u32, WireError> {
        let b = self.num_messages_in_batch();
        if b <= 0 {
            return Err(WireError::InvalidBatchSize(b));
        }
        // b > 0, so the conversion is lossless.
        Ok(b as u32)
    }

    /// The transaction of a transactional message or marker, as
    /// `(most_bits, least_bits)`: `None` when neither half is on the wire
    /// (a missing half reads as 0, as Pulsar's `getTxnidMostBits` does).
    pub fn txn_id(&self) -> Option<(u64, u64)> {
        match (self.txnid_most_bits, self.txnid_least_bits) {
            (None, None) => None,
            (most, least) => Some((most.unwrap_or(0), least.unwrap_or(0))),
        }
    }
}

/// Decodes a [`MessageMetadata`].
///
/// # Errors
/// [`WireError`] for truncated or malformed protobuf (including a missing
/// required field); never panics.
pub fn decode_message_metadata(bytes: &[u8]) -> Result<MessageMetadata, WireError> {
    check_required(&MESSAGE_METADATA, bytes)?;
    MessageMetadata::decode(bytes).map_err(|e| decode_err("MessageMetadata", e))
}

/// Decodes a [`SingleMessageMetadata`].
///
/// # Errors
/// [`WireError`] for truncated or malformed protobuf (including a missing
/// required field); never panics.
pub fn decode_single_message_metadata(bytes: &[u8]) -> Result<SingleMessageMetadata, WireError> {
    check_required(&SINGLE_MESSAGE_METADATA, bytes)?;
    SingleMessageMetadata::decode(bytes).map_err(|e| decode_err("SingleMessageMetadata", e))
}
