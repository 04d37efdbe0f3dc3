//! The transaction buffer snapshot as Pulsar stores it
//! (`SingleSnapshotAbortedTxnProcessorImpl`; the segmented snapshot,
//! `transactionBufferSegmentedSnapshotEnabled`, is not implemented).
//!
//! ## Where and what
//!
//! One message per snapshot on the namespace's system topic
//! `persistent://<tenant>/<namespace>/__transaction_buffer_snapshot`, keyed
//! (`partition_key`) by the topic's full name; the latest message of a key
//! is the topic's snapshot (Pulsar reads it through a table view of the
//! compacted topic). The value is Pulsar's `Schema.AVRO(TransactionBufferSnapshot.class)`:
//! the schema Avro 1.12.0's `ReflectData.AllowNull` derives from the POJOs
//! `TransactionBufferSnapshot { String topicName; long maxReadPositionLedgerId;
//! long maxReadPositionEntryId; List<AbortTxnMetadata> aborts; }` and
//! `AbortTxnMetadata { long txnIdMostBits, txnIdLeastBits, ledgerId, entryId; }`
//! (package `org.apache.pulsar.broker.transaction.buffer.metadata`):
//!
//! - `ReflectData` orders a class's fields by name, so the records are
//!   `TransactionBufferSnapshot { aborts, maxReadPositionEntryId,
//!   maxReadPositionLedgerId, topicName }` and `AbortTxnMetadata { entryId,
//!   ledgerId, txnIdLeastBits, txnIdMostBits }`;
//! - `AllowNull` makes every non-primitive field a union `["null", T]`
//!   (`aborts`, `topicName`); `long` fields stay `long`; the array's items are
//!   not nullable.
//!
//! Pulsar's Avro writer emits the Avro binary encoding of one datum with no
//! header: a record is its fields in order; `long` a zig-zag varint; a union
//! its branch index (a `long`) then the value; `string` a `long` length then
//! UTF-8; an array one block `count, items…` (when not empty) then `0`.
//! [`TransactionBufferSnapshot::encode`] writes exactly that;
//! [`TransactionBufferSnapshot::decode`] reads it (and any valid block
//! form) and refuses anything else with a typed [`SnapshotError`].
//!
//! The stored entry is a Pulsar message: `[0x0e01][crc32c][size][MessageMetadata][payload]`
//! with `partition_key` = the topic's name and `partition_key_b64_encoded =
//! false` (as `TypedMessageBuilder.key` sets them) and `uncompressed_size`.
//! Not written: `schema_version` (this node has no schema registry).

use crate::proto::frame::{encode_entry_payload, parse_entry_payload};
use crate::proto::metadata::{MessageMetadata, SingleMessageMetadata};
use crate::Position;

/// Local name of the namespace's snapshot system topic
/// (`SystemTopicNames.TRANSACTION_BUFFER_SNAPSHOT`).
pub const SNAPSHOT_TOPIC: &str = "__transaction_buffer_snapshot";

/// Producer name of the snapshot messages this node writes.
pub const SNAPSHOT_PRODUCER_NAME: &str = "pulsar-core.transaction-buffer-snapshot";

/// When a topic's transaction buffer takes a snapshot (Pulsar's broker
/// settings of the same names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotConfig {
    /// `transactionBufferSnapshotMaxTransactionCount` (default 1000): after
    /// this many transactions ended on the topic (commit or abort marker)
    /// since its last snapshot, the ending one takes a snapshot.
    pub max_transaction_count: u64,
    /// `transactionBufferSnapshotMinTimeInMillis` (default 5000): every this
    /// many ms, a topic whose max read position moved since its last
    /// snapshot takes one.
    pub min_time_ms: u64,
}

impl Default for SnapshotConfig {
    fn default() -> Self {
        Self {
            max_transaction_count: 1000,
            min_time_ms: 5000,
        }
    }
}

/// `persistent://<tenant>/<namespace>/__transaction_buffer_snapshot` for a
/// topic `persistent://<tenant>/<namespace>/<local>`; `None` for a name not
/// of that form.
pub fn snapshot_topic(topic: &str) -> Option<String> {
    let rest = topic.strip_prefix("persistent://")?;
    let mut parts = rest.splitn(3, '/');
    let (tenant, ns, local) = (parts.next()?, parts.next()?, parts.next()?);
    if tenant.is_empty() || ns.is_empty() || local.is_empty() {
        return None;
    }
    Some(format!("persistent://{tenant}/{ns}/{SNAPSHOT_TOPIC}"))
}

/// Whether `topic` is a snapshot system topic (it has no transaction
/// buffer: Pulsar gives system topics `TransactionBufferDisable`).
pub fn is_snapshot_topic(topic: &str) -> bool {
    topic
        .rsplit('/')
        .next()
        .is_some_and(|local| local == SNAPSHOT_TOPIC)
}

/// One aborted transaction and the position of its abort marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbortTxnMetadata {
    /// `txnIdMostBits`.
    pub txn_id_most_bits: i64,
    /// `txnIdLeastBits`.
    pub txn_id_least_bits: i64,
    /// `ledgerId` of the abort marker.
    pub ledger_id: i64,
    /// `entryId` of the abort marker.
    pub entry_id: i64,
}

/// Pulsar's `TransactionBufferSnapshot`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransactionBufferSnapshot {
    /// `topicName` (nullable).
    pub topic_name: Option<String>,
    /// `maxReadPositionLedgerId`.
    pub max_read_position_ledger_id: i64,
    /// `maxReadPositionEntryId`.
    pub max_read_position_entry_id: i64,
    /// `aborts` (nullable), in the order the aborts happened.
    pub aborts: Option<Vec<AbortTxnMetadata>>,
}

/// Why snapshot bytes are not a `TransactionBufferSnapshot`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    /// The bytes end inside a value.
    #[error("snapshot truncated at byte {0}")]
    Truncated(usize),
    /// A varint longer than 10 bytes or above 64 bits.
    #[error("invalid long encoding at byte {0}")]
    BadLong(usize),
    /// A union branch other than 0 (null) or 1.
    #[error("union branch {index} at byte {at} (expected 0 or 1)")]
    BadUnion {
        /// The branch read.
        index: i64,
        /// Where.
        at: usize,
    },
    /// A negative length, or one past the end of the bytes.
    #[error("invalid length {len} at byte {at}")]
    BadLength {
        /// The length read.
        len: i64,
        /// Where.
        at: usize,
    },
    /// `topicName` is not UTF-8.
    #[error("topicName is not UTF-8")]
    NotUtf8,
    /// Bytes after the record.
    #[error("{0} bytes after the snapshot record")]
    Trailing(usize),
    /// The entry is not a Pulsar message (framing or metadata).
    #[error("snapshot entry: {0}")]
    Entry(String),
}

fn put_long(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8 & 0x7f) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn long(&mut self) -> Result<i64, SnapshotError> {
        let start = self.at;
        let mut z: u64 = 0;
        for i in 0..10 {
            let Some(&byte) = self.b.get(self.at) else {
                return Err(SnapshotError::Truncated(self.at));
            };
            self.at += 1;
            if i == 9 && byte > 1 {
                return Err(SnapshotError::BadLong(start));
            }
            z |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                return Ok((z >> 1) as i64 ^ -((z & 1) as i64));
            }
        }
        Err(SnapshotError::BadLong(start))
    }

    /// A union `["null", T]`: whether the value is present.
    fn present(&mut self) -> Result<bool, SnapshotError> {
        let at = self.at;
        match self.long()? {
            0 => Ok(false),
            1 => Ok(true),
            index => Err(SnapshotError::BadUnion { index, at }),
        }
    }

    fn bytes(&mut self, len: i64, at: usize) -> Result<&[u8], SnapshotError> {
        let n = usize::try_from(len).map_err(|_| SnapshotError::BadLength { len, at })?;
        if n > self.b.len() - self.at {
            return Err(SnapshotError::BadLength { len, at });
        }
        let s = &self.b[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }
}

impl TransactionBufferSnapshot {
    /// The max read position it was taken at.
    pub fn max_read_position(&self) -> Position {
        Position::new(
            self.max_read_position_ledger_id,
            self.max_read_position_entry_id,
        )
    }

    /// The Avro binary encoding Pulsar writes (see the module docs).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            24 + self.topic_name.as_ref().map_or(0, String::len)
                + 40 * self.aborts.as_ref().map_or(0, Vec::len),
        );
        match &self.aborts {
            None => put_long(&mut out, 0),
            Some(list) => {
                put_long(&mut out, 1);
                if !list.is_empty() {
                    put_long(&mut out, list.len() as i64);
                    for a in list {
                        put_long(&mut out, a.entry_id);
                        put_long(&mut out, a.ledger_id);
                        put_long(&mut out, a.txn_id_least_bits);
                        put_long(&mut out, a.txn_id_most_bits);
                    }
                }
                put_long(&mut out, 0);
            }
        }
        put_long(&mut out, self.max_read_position_entry_id);
        put_long(&mut out, self.max_read_position_ledger_id);
        match &self.topic_name {
            None => put_long(&mut out, 0),
            Some(t) => {
                put_long(&mut out, 1);
                put_long(&mut out, t.len() as i64);
                out.extend_from_slice(t.as_bytes());
            }
        }
        out
    }

    /// Reads the Avro binary encoding of the schema.
    ///
    /// # Errors
    /// [`SnapshotError`] for anything else (never a panic, whatever the
    /// bytes).
    pub fn decode(b: &[u8]) -> Result<Self, SnapshotError> {
        let mut r = Reader { b, at: 0 };
        let aborts = if r.present()? {
            let mut list = Vec::new();
            loop {
                let at = r.at;
                let count = r.long()?;
                if count == 0 {
                    break;
                }
                if count < 0 {
                    // A block with its byte size (valid Avro, not what
                    // Pulsar writes).
                    let _size = r.long()?;
                }
                let n = count.unsigned_abs();
                // Each item takes at least 4 bytes: no allocation beyond
                // what the bytes can hold.
                if n > ((b.len() - r.at) / 4) as u64 {
                    return Err(SnapshotError::BadLength { len: count, at });
                }
                list.reserve(n as usize);
                for _ in 0..n {
                    let entry_id = r.long()?;
                    let ledger_id = r.long()?;
                    let txn_id_least_bits = r.long()?;
                    let txn_id_most_bits = r.long()?;
                    list.push(AbortTxnMetadata {
                        txn_id_most_bits,
                        txn_id_least_bits,
                        ledger_id,
                        entry_id,
                    });
                }
            }
            Some(list)
        } else {
            None
        };
        let max_read_position_entry_id = r.long()?;
        let max_read_position_ledger_id = r.long()?;
        let topic_name = if r.present()? {
            let at = r.at;
            let len = r.long()?;
            let s = r.bytes(len, at)?;
            Some(
                std::str::from_utf8(s)
                    .map_err(|_| SnapshotError::NotUtf8)?
                    .to_string(),
            )
        } else {
            None
        };
        if r.at != b.len() {
            return Err(SnapshotError::Trailing(b.len() - r.at));
        }
        Ok(Self {
            topic_name,
            max_read_position_ledger_id,
            max_read_position_entry_id,
            aborts,
        })
    }
}

/// The stored entry of a snapshot of `topic` (see the module docs).
pub fn snapshot_entry(
    topic: &str,
    snapshot: &TransactionBufferSnapshot,
    sequence_id: u64,
    publish_time: u64,
) -> Vec<u8> {
    let payload = snapshot.encode();
    let md = MessageMetadata {
        producer_name: SNAPSHOT_PRODUCER_NAME.into(),
        sequence_id,
        publish_time,
        partition_key: Some(topic.to_string()),
        uncompressed_size: Some(payload.len() as u32),
        partition_key_b64_encoded: Some(false),
        ..Default::default()
    };
    encode_entry_payload(&md, &[(SingleMessageMetadata::default(), payload)])
}

/// The key (`partition_key`) of a stored snapshot message, and whether it
/// is a tombstone.
///
/// # Errors
/// [`SnapshotError::Entry`] when the entry is not a Pulsar message or has no
/// key.
pub fn entry_key(data: &[u8]) -> Result<(String, bool), SnapshotError> {
    let parsed = parse_entry_payload(data).map_err(|e| SnapshotError::Entry(e.to_string()))?;
    let m = parsed.metadata;
    let key = m
        .partition_key
        .ok_or_else(|| SnapshotError::Entry("no partition_key".into()))?;
    Ok((key, m.null_value == Some(true)))
}

/// The snapshot a stored snapshot message holds (`None` for a tombstone).
///
/// # Errors
/// [`SnapshotError`] for an entry that is not a snapshot message.
pub fn decode_entry(data: &[u8]) -> Result<Option<TransactionBufferSnapshot>, SnapshotError> {
    let parsed = parse_entry_payload(data).map_err(|e| SnapshotError::Entry(e.to_string()))?;
    if parsed.metadata.null_value == Some(true) {
        return Ok(None);
    }
    TransactionBufferSnapshot::decode(parsed.payload).map(Some)
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// Golden bytes: the Avro binary encoding of Pulsar's snapshot schema
    /// (as `ReflectData.AllowNull` of Avro 1.12.0 derives it: fields by
    /// name, non-primitive fields `["null", T]`), produced by Apache Avro's
    /// own Python implementation (`avro` 1.12.0, `DatumWriter` +
    /// `BinaryEncoder`) from that schema as JSON — an encoder independent of
    /// this one. Each case: (bytes, the snapshot).
    fn golden() -> Vec<(&'static str, TransactionBufferSnapshot)> {
        let t1 = Some("persistent://public/default/t1".to_string());
        vec![
            (
                "02020e020806000402023c70657273697374656e743a2f2f7075626c69632f64656661756c742f7431",
                TransactionBufferSnapshot {
                    topic_name: t1.clone(),
                    max_read_position_ledger_id: 1,
                    max_read_position_entry_id: 2,
                    aborts: Some(vec![AbortTxnMetadata {
                        txn_id_most_bits: 3,
                        txn_id_least_bits: 4,
                        ledger_id: 1,
                        entry_id: 7,
                    }]),
                },
            ),
            (
                "02000118023c70657273697374656e743a2f2f7075626c69632f64656661756c742f7431",
                TransactionBufferSnapshot {
                    topic_name: t1,
                    max_read_position_ledger_id: 12,
                    max_read_position_entry_id: -1,
                    aborts: Some(vec![]),
                },
            ),
            (
                "00000000",
                TransactionBufferSnapshot {
                    topic_name: None,
                    max_read_position_ledger_id: 0,
                    max_read_position_entry_id: 0,
                    aborts: None,
                },
            ),
            (
                "02048001a8e8c8e997078201007f04feffffffffffffffff010100d804a8e8c8e99707022470657273697374656e743a2f2f612f622f63",
                TransactionBufferSnapshot {
                    topic_name: Some("persistent://a/b/c".into()),
                    max_read_position_ledger_id: 123_456_789_012,
                    max_read_position_entry_id: 300,
                    aborts: Some(vec![
                        AbortTxnMetadata {
                            txn_id_most_bits: 0,
                            txn_id_least_bits: 65,
                            ledger_id: 123_456_789_012,
                            entry_id: 64,
                        },
                        AbortTxnMetadata {
                            txn_id_most_bits: -1,
                            txn_id_least_bits: i64::MAX,
                            ledger_id: 2,
                            entry_id: -64,
                        },
                    ]),
                },
            ),
        ]
    }

    #[test]
    fn snapshot_bytes_are_the_avro_encoding_pulsar_writes() {
        for (bytes, snap) in golden() {
            assert_eq!(snap.encode(), hex(bytes), "{snap:?}");
            assert_eq!(
                TransactionBufferSnapshot::decode(&hex(bytes)).unwrap(),
                snap
            );
        }
    }

    /// Every truncation, every single-byte change and trailing bytes of the
    /// golden encodings decode to a typed error or to another valid
    /// snapshot, never a panic.
    #[test]
    fn corrupt_snapshot_bytes_are_a_typed_error_never_a_panic() {
        for (bytes, snap) in golden() {
            let b = hex(bytes);
            for n in 0..b.len() {
                assert!(
                    TransactionBufferSnapshot::decode(&b[..n]).is_err(),
                    "{n} of {}",
                    b.len()
                );
            }
            for i in 0..b.len() {
                for v in [0x00, 0x01, 0x7f, 0x80, 0xff] {
                    let mut c = b.clone();
                    c[i] = v;
                    if let Ok(s) = TransactionBufferSnapshot::decode(&c) {
                        let again = TransactionBufferSnapshot::decode(&s.encode());
                        assert_eq!(again.as_ref(), Ok(&s), "a decoded snapshot round-trips");
                    }
                }
            }
            let mut t = b.clone();
            t.push(0);
            assert_eq!(
                TransactionBufferSnapshot::decode(&t),
                Err(SnapshotError::Trailing(1))
            );
            let _ = snap;
        }
        assert!(matches!(
            TransactionBufferSnapshot::decode(&[0x04]),
            Err(SnapshotError::BadUnion { index: 2, at: 0 })
        ));
        assert!(matches!(
            TransactionBufferSnapshot::decode(&[0xff; 11]),
            Err(SnapshotError::BadLong(0))
        ));
        // A count far above what the bytes can hold allocates nothing.
        assert!(matches!(
            TransactionBufferSnapshot::decode(&[0x02, 0xfe, 0xff, 0xff, 0xff, 0x0f]),
            Err(SnapshotError::BadLength { .. })
        ));
    }

    #[test]
    fn a_snapshot_message_is_keyed_by_its_topic() {
        let (_, snap) = golden().remove(0);
        let e = snapshot_entry("persistent://public/default/t1", &snap, 5, 9);
        assert_eq!(
            entry_key(&e).unwrap(),
            ("persistent://public/default/t1".into(), false)
        );
        assert_eq!(decode_entry(&e).unwrap(), Some(snap));
        assert_eq!(
            snapshot_topic("persistent://public/default/t1").as_deref(),
            Some("persistent://public/default/__transaction_buffer_snapshot")
        );
        assert!(is_snapshot_topic(
            "persistent://public/default/__transaction_buffer_snapshot"
        ));
        assert!(!is_snapshot_topic("persistent://public/default/t1"));
    }
}
