//! The transaction messages of Pulsar's `PulsarApi.proto` (proto2, the
//! coordinator commands of PIP-31), the coordinator's log record
//! (`PulsarTransactionMetadata.proto`'s `TransactionMetadataEntry`) and the
//! transaction markers' `MessageMetadata` ([`txn_marker`], `Markers.newTxnMarker`). Field
//! numbers, labels and defaults are Pulsar's; optional fields are `Option`
//! so an explicit value (also 0) is on the wire as protoc writes it.

use prost::Message;

use super::frame::encode_entry_payload;
use super::metadata::{MessageMetadata, SingleMessageMetadata};

/// `TxnAction`: `COMMIT = 0`, `ABORT = 1`.
pub mod txn_action {
    /// `COMMIT`.
    pub const COMMIT: i32 = 0;
    /// `ABORT`.
    pub const ABORT: i32 = 1;
}

/// `MarkerType` (`PulsarMarkers.proto`) values of the transaction markers.
pub mod marker_type {
    /// `TXN_COMMITTING`.
    pub const TXN_COMMITTING: i32 = 20;
    /// `TXN_COMMIT`.
    pub const TXN_COMMIT: i32 = 21;
    /// `TXN_ABORT`.
    pub const TXN_ABORT: i32 = 22;
}

/// `CommandTcClientConnectRequest`.
#[derive(Clone, PartialEq, Message)]
pub struct CommandTcClientConnectRequest {
    /// `request_id = 1`, required.
    #[prost(uint64, required, tag = "1")]
    pub request_id: u64,
    /// `tc_id = 2`, required, default 0.
    #[prost(uint64, required, tag = "2", default = "0")]
    pub tc_id: u64,
}

/// `CommandTcClientConnectResponse`.
#[derive(Clone, PartialEq, Message)]
pub struct CommandTcClientConnectResponse {
    /// `request_id = 1`, required.
    #[prost(uint64, required, tag = "1")]
    pub request_id: u64,
    /// `error = 2` (`ServerError`).
    #[prost(int32, optional, tag = "2")]
    pub error: Option<i32>,
    /// `message = 3`.
    #[prost(string, optional, tag = "3")]
    pub message: Option<String>,
}

/// `CommandNewTxn`.
#[derive(Clone, PartialEq, Message)]
pub struct CommandNewTxn {
    /// `request_id = 1`, required.
    #[prost(uint64, required, tag = "1")]
    pub request_id: u64,
    /// `txn_ttl_millis = 2`, default 0 (the transaction timeout, ms).
    #[prost(uint64, optional, tag = "2", default = "0")]
    pub txn_ttl_millis: Option<u64>,
    /// `tc_id = 3`, default 0.
    #[prost(uint64, optional, tag = "3", default = "0")]
    pub tc_id: Option<u64>,
}

/// The shape shared by `CommandNewTxnResponse`,
/// `CommandAddPartitionToTxnResponse`, `CommandAddSubscriptionToTxnResponse`
/// and `CommandEndTxnResponse`: `request_id = 1` (required),
/// `txnid_least_bits = 2`, `txnid_most_bits = 3` (default 0), `error = 4`,
/// `message = 5`.
#[derive(Clone, PartialEq, Message)]
pub struct CommandTxnResponse {
    /// `request_id = 1`, required.
    #[prost(uint64, required, tag = "1")]
    pub request_id: u64,
    /// `txnid_least_bits = 2`, default 0.
    #[prost(uint64, optional, tag = "2", default = "0")]
    pub txnid_least_bits: Option<u64>,
    /// `txnid_most_bits = 3`, default 0.
    #[prost(uint64, optional, tag = "3", default = "0")]
    pub txnid_most_bits: Option<u64>,
    /// `error = 4` (`ServerError`).
    #[prost(int32, optional, tag = "4")]
    pub error: Option<i32>,
    /// `message = 5`.
    #[prost(string, optional, tag = "5")]
    pub message: Option<String>,
}

/// `CommandAddPartitionToTxn`.
#[derive(Clone, PartialEq, Message)]
pub struct CommandAddPartitionToTxn {
    /// `request_id = 1`, required.
    #[prost(uint64, required, tag = "1")]
    pub request_id: u64,
    /// `txnid_least_bits = 2`, default 0.
    #[prost(uint64, optional, tag = "2", default = "0")]
    pub txnid_least_bits: Option<u64>,
    /// `txnid_most_bits = 3`, default 0.
    #[prost(uint64, optional, tag = "3", default = "0")]
    pub txnid_most_bits: Option<u64>,
    /// `partitions = 4`, repeated.
    #[prost(string, repeated, tag = "4")]
    pub partitions: Vec<String>,
}

/// `Subscription` (`topic = 1`, `subscription = 2`, both required).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Message)]
pub struct TxnSubscription {
    /// `topic = 1`, required.
    #[prost(string, required, tag = "1")]
    pub topic: String,
    /// `subscription = 2`, required.
    #[prost(string, required, tag = "2")]
    pub subscription: String,
}

/// `CommandAddSubscriptionToTxn`.
#[derive(Clone, PartialEq, Message)]
pub struct CommandAddSubscriptionToTxn {
    /// `request_id = 1`, required.
    #[prost(uint64, required, tag = "1")]
    pub request_id: u64,
    /// `txnid_least_bits = 2`, default 0.
    #[prost(uint64, optional, tag = "2", default = "0")]
    pub txnid_least_bits: Option<u64>,
    /// `txnid_most_bits = 3`, default 0.
    #[prost(uint64, optional, tag = "3", default = "0")]
    pub txnid_most_bits: Option<u64>,
    /// `subscription = 4`, repeated.
    #[prost(message, repeated, tag = "4")]
    pub subscription: Vec<TxnSubscription>,
}

/// `CommandEndTxn`.
#[derive(Clone, PartialEq, Message)]
pub struct CommandEndTxn {
    /// `request_id = 1`, required.
    #[prost(uint64, required, tag = "1")]
    pub request_id: u64,
    /// `txnid_least_bits = 2`, default 0.
    #[prost(uint64, optional, tag = "2", default = "0")]
    pub txnid_least_bits: Option<u64>,
    /// `txnid_most_bits = 3`, default 0.
    #[prost(uint64, optional, tag = "3", default = "0")]
    pub txnid_most_bits: Option<u64>,
    /// `txn_action = 4` ([`txn_action`]).
    #[prost(int32, optional, tag = "4")]
    pub txn_action: Option<i32>,
}

/// `TxnStatus` (`PulsarTransactionMetadata.proto`).
pub mod txn_status {
    /// `OPEN`.
    pub const OPEN: i32 = 0;
    /// `COMMITTING`.
    pub const COMMITTING: i32 = 1;
    /// `COMMITTED`.
    pub const COMMITTED: i32 = 2;
    /// `ABORTING`.
    pub const ABORTING: i32 = 3;
    /// `ABORTED`.
    pub const ABORTED: i32 = 4;
}

/// `TransactionMetadataEntry.TransactionMetadataOp`.
pub mod metadata_op {
    /// `NEW`.
    pub const NEW: i32 = 0;
    /// `ADD_PARTITION`.
    pub const ADD_PARTITION: i32 = 1;
    /// `ADD_SUBSCRIPTION`.
    pub const ADD_SUBSCRIPTION: i32 = 2;
    /// `UPDATE`.
    pub const UPDATE: i32 = 3;
}

/// `TransactionMetadataEntry`: one record of the coordinator's log
/// (Pulsar's `MLTransactionLogImpl` appends one per state change).
#[derive(Clone, PartialEq, Message)]
pub struct TransactionMetadataEntry {
    /// `metadata_op = 1` ([`metadata_op`]).
    #[prost(int32, optional, tag = "1")]
    pub metadata_op: Option<i32>,
    /// `txnid_least_bits = 2`, default 0.
    #[prost(uint64, optional, tag = "2", default = "0")]
    pub txnid_least_bits: Option<u64>,
    /// `txnid_most_bits = 3`, default 0.
    #[prost(uint64, optional, tag = "3", default = "0")]
    pub txnid_most_bits: Option<u64>,
    /// `expected_status = 4` ([`txn_status`]).
    #[prost(int32, optional, tag = "4")]
    pub expected_status: Option<i32>,
    /// `new_status = 5` ([`txn_status`]).
    #[prost(int32, optional, tag = "5")]
    pub new_status: Option<i32>,
    /// `partitions = 6`.
    #[prost(string, repeated, tag = "6")]
    pub partitions: Vec<String>,
    /// `subscriptions = 7`.
    #[prost(message, repeated, tag = "7")]
    pub subscriptions: Vec<TxnSubscription>,
    /// `timeout_ms = 8`.
    #[prost(uint64, optional, tag = "8")]
    pub timeout_ms: Option<u64>,
    /// `start_time = 9`.
    #[prost(uint64, optional, tag = "9")]
    pub start_time: Option<u64>,
    /// `last_modification_time = 10`.
    #[prost(uint64, optional, tag = "10")]
    pub last_modification_time: Option<u64>,
    /// `max_sequence_id = 11`.
    #[prost(uint64, optional, tag = "11")]
    pub max_sequence_id: Option<u64>,
}

/// Producer name of Pulsar's transaction markers.
pub const MARKER_PRODUCER_NAME: &str = "pulsar.txn.marker";

/// A transaction marker's `MessageMetadata` as `Markers.newTxnMarker`
/// writes it: `producer_name` [`MARKER_PRODUCER_NAME`], `sequence_id`,
/// `publish_time`, `marker_type` ([`marker_type`]), `txnid_least_bits`,
/// `txnid_most_bits`; nothing else.
pub fn txn_marker(
    marker_type: i32,
    sequence_id: u64,
    publish_time: u64,
    txnid_most_bits: u64,
    txnid_least_bits: u64,
) -> MessageMetadata {
    MessageMetadata {
        producer_name: MARKER_PRODUCER_NAME.into(),
        sequence_id,
        publish_time,
        marker_type: Some(marker_type),
        txnid_least_bits: Some(txnid_least_bits),
        txnid_most_bits: Some(txnid_most_bits),
        ..Default::default()
    }
}

/// The stored entry of a marker: `[0x0e01][crc32c][size][metadata]` with an
/// empty payload (`Commands.serializeMetadataAndPayload` with `Crc32c`).
pub fn marker_entry(metadata: &MessageMetadata) -> Vec<u8> {
    encode_entry_payload(metadata, &[(SingleMessageMetadata::default(), Vec::new())])
}
