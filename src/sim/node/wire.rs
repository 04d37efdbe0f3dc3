//! The simulated clients' side of the wire (frames are cut by
//! [`crate::broker::FrameCutter`], as `serve` cuts its sockets): command
//! frames built with the crate's own encoder ([`OutFrame`]); entry payloads
//! are `proto::frame::encode_entry_payload`'s, with the producer's
//! `proto::metadata::MessageMetadata` (the key and `deliver_at_time` a
//! Pulsar producer sets).

use prost::Message;

use crate::broker::OutFrame;
use crate::proto::command::BrokerCommand;

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
    use crate::broker::entry_info;
    use crate::proto::frame::encode_entry_payload;
    use crate::proto::metadata::{MessageMetadata, SingleMessageMetadata};

    #[test]
    fn the_core_reads_key_batch_count_and_delivery_time_from_the_producer_metadata() {
        let meta = MessageMetadata {
            producer_name: "p".into(),
            sequence_id: 1,
            publish_time: 5,
            partition_key: Some("k".into()),
            num_messages_in_batch: Some(2),
            deliver_at_time: Some(99),
            ..Default::default()
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
        let info = entry_info(&encode_entry_payload(&meta, &[msg(1), msg(2)])).unwrap();
        assert_eq!(info.batch_size, 2);
        assert_eq!(info.deliver_at, Some(99));
        assert_eq!(
            info.key_hash,
            crate::broker::key_shared::sticky_key_hash(b"k")
        );
    }
}
