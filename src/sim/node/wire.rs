//! The simulated clients' side of the wire (frames are cut by
//! [`crate::broker::FrameCutter`], as `serve` cuts its sockets): the producer's
//! `MessageMetadata` (with the key and `deliver_at_time` a Pulsar producer
//! sets), entry payloads and command frames built with the crate's own
//! encoders ([`OutFrame`], `proto::frame`).

use prost::Message;

use crate::broker::OutFrame;
use crate::proto::command::BrokerCommand;
use crate::proto::frame::encode_entry_payload_with;
use crate::proto::wire::SingleMessageMetadata;

/// `MessageMetadata` as a Pulsar producer writes it for the workloads here:
/// the required fields, the key (`partition_key`, what Key_Shared routes
/// by), the batch count and `deliver_at_time`. Tags are `PulsarApi.proto`'s;
/// prost writes them in tag order, as protoc does.
#[derive(Clone, PartialEq, Message)]
pub struct ProducerMetadata {
    /// `producer_name = 1`, required.
    #[prost(string, required, tag = "1")]
    pub producer_name: String,
    /// `sequence_id = 2`, required.
    #[prost(uint64, required, tag = "2")]
    pub sequence_id: u64,
    /// `publish_time = 3`, required.
    #[prost(uint64, required, tag = "3")]
    pub publish_time: u64,
    /// `partition_key = 6`.
    #[prost(string, optional, tag = "6")]
    pub partition_key: Option<String>,
    /// `num_messages_in_batch = 11`, default 1 (absent: not a batch).
    #[prost(int32, optional, tag = "11", default = "1")]
    pub num_messages_in_batch: Option<i32>,
    /// `deliver_at_time = 19`.
    #[prost(int64, optional, tag = "19")]
    pub deliver_at_time: Option<i64>,
}

/// An entry payload as a producer sends it:
/// `[0x0e01][crc32c][metadata_size][MessageMetadata][payload]`, the payload
/// being, for a batch, `[size][SingleMessageMetadata][payload]` per message
/// (the layout `proto::frame::encode_entry_payload` writes).
pub fn entry_payload(
    meta: &ProducerMetadata,
    messages: &[(SingleMessageMetadata, Vec<u8>)],
) -> Vec<u8> {
    encode_entry_payload_with(meta, meta.num_messages_in_batch.is_some(), messages)
}

/// One command frame on the wire: `[total_size][command_size][command][payload]`.
pub fn frame(cmd: &BrokerCommand, payload: Vec<u8>) -> Vec<u8> {
    OutFrame {
        command: cmd.encode_to_vec(),
        payload,
    }
    .encode()
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests {
    use super::*;
    use crate::broker::entry_info;

    #[test]
    fn the_core_reads_key_batch_count_and_delivery_time_from_the_producer_metadata() {
        let meta = ProducerMetadata {
            producer_name: "p".into(),
            sequence_id: 1,
            publish_time: 5,
            partition_key: Some("k".into()),
            num_messages_in_batch: Some(2),
            deliver_at_time: Some(99),
        };
        let msg = |n: u8| {
            (
                SingleMessageMetadata {
                    partition_key: None,
                    payload_size: 4,
                    compacted_out: None,
                },
                vec![n; 4],
            )
        };
        let info = entry_info(&entry_payload(&meta, &[msg(1), msg(2)])).unwrap();
        assert_eq!(info.batch_size, 2);
        assert_eq!(info.deliver_at, Some(99));
        assert_eq!(
            info.key_hash,
            crate::broker::key_shared::sticky_key_hash(b"k")
        );
    }
}
