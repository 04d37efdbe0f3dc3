//! The simulated clients' side of the wire: Pulsar frames cut from a byte
//! stream by the rule `serve` applies to its sockets, the producer's
//! `MessageMetadata` (with the key and `deliver_at_time` a Pulsar producer
//! sets), entry payloads and command frames built with the crate's own
//! encoders ([`OutFrame`], `permits::frame`).

use prost::Message;

use crate::broker::proto::BrokerCommand;
use crate::broker::{OutFrame, MAX_FRAME_SIZE};
use crate::permits::frame::{crc32c, MAGIC_CRC32C};
use crate::permits::wire::SingleMessageMetadata;

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
/// (the layout `permits::frame::encode_entry_payload` writes).
pub fn entry_payload(
    meta: &ProducerMetadata,
    messages: &[(SingleMessageMetadata, Vec<u8>)],
) -> Vec<u8> {
    let mut body = Vec::new();
    let md = meta.encode_to_vec();
    body.extend_from_slice(&(md.len() as u32).to_be_bytes());
    body.extend_from_slice(&md);
    if meta.num_messages_in_batch.is_none() && messages.len() == 1 {
        body.extend_from_slice(&messages[0].1);
    } else {
        for (smm, payload) in messages {
            let s = smm.encode_to_vec();
            body.extend_from_slice(&(s.len() as u32).to_be_bytes());
            body.extend_from_slice(&s);
            body.extend_from_slice(payload);
        }
    }
    let mut out = Vec::with_capacity(6 + body.len());
    out.extend_from_slice(&MAGIC_CRC32C.to_be_bytes());
    out.extend_from_slice(&crc32c(&body).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// One command frame on the wire: `[total_size][command_size][command][payload]`.
pub fn frame(cmd: &BrokerCommand, payload: Vec<u8>) -> Vec<u8> {
    OutFrame {
        command: cmd.encode_to_vec(),
        payload,
    }
    .encode()
}

/// One frame cut from a stream: its command bytes, its payload and the
/// whole frame (for decoders that take a frame).
#[derive(Debug)]
pub struct CutFrame {
    /// The `BaseCommand` bytes.
    pub command: Vec<u8>,
    /// The bytes after the command.
    pub payload: Vec<u8>,
    /// The frame as it was on the wire.
    pub whole: Vec<u8>,
}

/// A byte stream cut into frames by `serve`'s rule (`serve/conn.rs`
/// `read_loop`): `total_size` above [`MAX_FRAME_SIZE`] or below 4, or a
/// `command_size` that does not fit, is an error (the connection closes);
/// a frame is handed on only once all of it arrived.
#[derive(Debug, Default)]
pub struct FrameCutter {
    pending: Vec<u8>,
}

impl FrameCutter {
    /// Appends bytes as they arrive.
    pub fn push(&mut self, bytes: &[u8]) {
        self.pending.extend_from_slice(bytes);
    }

    /// The next whole frame, if one has arrived.
    ///
    /// # Errors
    /// Why the connection must close.
    pub fn next_frame(&mut self) -> Result<Option<CutFrame>, String> {
        if self.pending.len() < 4 {
            return Ok(None);
        }
        let p = &self.pending;
        let total = u64::from(u32::from_be_bytes([p[0], p[1], p[2], p[3]]));
        if total as usize > MAX_FRAME_SIZE {
            return Err(format!("frame of {total} bytes exceeds the limit"));
        }
        if total < 4 {
            return Err(format!("total_size {total} below 4"));
        }
        let end = 4 + total as usize;
        if p.len() < end {
            return Ok(None);
        }
        let whole: Vec<u8> = self.pending.drain(..end).collect();
        let cmd_size = u64::from(u32::from_be_bytes([whole[4], whole[5], whole[6], whole[7]]));
        if cmd_size + 4 > total {
            return Err(format!(
                "command_size {cmd_size} exceeds total_size {total}"
            ));
        }
        let cmd_end = 8 + cmd_size as usize;
        Ok(Some(CutFrame {
            command: whole[8..cmd_end].to_vec(),
            payload: whole[cmd_end..].to_vec(),
            whole,
        }))
    }
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests {
    use super::*;
    use crate::broker::entry_info;
    use crate::broker::proto::ty;

    #[test]
    fn frames_split_anywhere_are_cut_whole_and_in_order() {
        let a = frame(
            &BrokerCommand {
                r#type: ty::PING,
                ping: Some(crate::broker::proto::Empty {}),
                ..Default::default()
            },
            Vec::new(),
        );
        let b = frame(
            &BrokerCommand {
                r#type: ty::PONG,
                pong: Some(crate::broker::proto::Empty {}),
                ..Default::default()
            },
            vec![1, 2, 3],
        );
        let stream: Vec<u8> = a.iter().chain(b.iter()).copied().collect();
        for split in 0..stream.len() {
            let mut c = FrameCutter::default();
            let mut got = Vec::new();
            for part in [&stream[..split], &stream[split..]] {
                c.push(part);
                while let Some(f) = c.next_frame().unwrap() {
                    got.push(f.whole);
                }
            }
            assert_eq!(got, vec![a.clone(), b.clone()], "split at {split}");
        }
    }

    #[test]
    fn a_frame_above_the_limit_or_with_a_command_past_its_end_is_an_error() {
        let mut c = FrameCutter::default();
        c.push(&((MAX_FRAME_SIZE as u32) + 1).to_be_bytes());
        assert!(c.next_frame().is_err());
        let mut c = FrameCutter::default();
        c.push(&[0, 0, 0, 5, 0, 0, 0, 9, 0]);
        assert!(c.next_frame().is_err());
    }

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
