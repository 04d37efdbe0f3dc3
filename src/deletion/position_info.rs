//! Pulsar's persisted cursor position, `PositionInfo` (MLDataFormats.proto,
//! proto2), byte-identical to protoc's output, in both of Pulsar's forms of
//! the individually deleted entries:
//!
//! - [`PulsarForm::MessageRanges`]: `repeated MessageRange
//!   individualDeletedMessages = 3`, one open-closed `(lower, upper]` range
//!   per run of consecutive deleted entries (what `ManagedCursorImpl`
//!   writes with `managedLedgerPersistIndividualAckAsLongArray=false`);
//! - [`PulsarForm::LongArray`]: `repeated LongListMap
//!   individualDeletedMessageRanges = 6`, per ledger the `java.util.BitSet`
//!   words (`toLongArray()`: word `i` bit `j` ⇔ entry `64·i + j` deleted,
//!   trailing zero words dropped) as unpacked `repeated int64 values = 2`.
//!
//! The metadata-store record `ManagedCursorInfo` (range form only) is
//! [`encode_managed_cursor_info`] / [`decode_managed_cursor_info`].
//!
//! Batch-index deletions are `repeated BatchedEntryDeletionIndexInfo
//! batchedEntryDeletionIndexInfo = 5` (position + unpacked `deleteSet`
//! words), cursor properties `repeated LongProperty properties = 4`.
//!
//! Schema (checked against apache/pulsar `MLDataFormats.proto`):
//!
//! | message | field | tag | label |
//! |---|---|---|---|
//! | `PositionInfo` | `ledgerId`, `entryId` (int64) | 1, 2 | required |
//! | | `individualDeletedMessages` (MessageRange) | 3 | repeated |
//! | | `properties` (LongProperty) | 4 | repeated |
//! | | `batchedEntryDeletionIndexInfo` | 5 | repeated |
//! | | `individualDeletedMessageRanges` (LongListMap) | 6 | repeated |
//! | `NestedPositionInfo` | `ledgerId`, `entryId` (int64) | 1, 2 | required |
//! | `MessageRange` | `lowerEndpoint`, `upperEndpoint` (NestedPositionInfo) | 1, 2 | required |
//! | `LongListMap` | `key` (int64) | 1 | required |
//! | | `values` (int64, unpacked) | 2 | repeated |
//! | `BatchedEntryDeletionIndexInfo` | `position` (NestedPositionInfo) | 1 | required |
//! | | `deleteSet` (int64, unpacked) | 2 | repeated |
//! | `LongProperty` | `name` (string), `value` (int64) | 1, 2 | required |
//! | `ManagedCursorInfo` | `cursorsLedgerId` (int64) | 1 | required |
//! | | `markDeleteLedgerId`, `markDeleteEntryId` (int64) | 2, 3 | optional |
//! | | `individualDeletedMessages`, `properties` | 4, 5 | repeated |
//! | | `lastActive` (int64) | 6 | optional |
//! | | `batchedEntryDeletionIndexInfo`, `cursorProperties` (StringProperty) | 7, 8 | repeated |
//! | `StringProperty` | `name`, `value` (string) | 1, 2 | required |
//!
//! # Caps are reported, never applied silently
//!
//! Pulsar persists at most `managedLedgerMaxUnackedRangesToPersist` ranges
//! (default 10,000; the long[] form counts deleted *entries* of whole
//! ledgers against the same cap) and silently keeps the rest only in
//! memory, so acknowledged messages come back after a restart. Here a
//! snapshot that does not fit the cap is [`PositionInfoError::CapExceeded`]
//! (nothing is encoded); the caller picks a larger cap or the crate's own
//! compact form ([`super::compact`]), which has no cap.
//!
//! Decoding accepts packed and unpacked `repeated int64`, rejects a missing
//! required field ([`PositionInfoError::Presence`]) and every value the
//! deletion state cannot hold, with a typed error and no huge allocation.

use std::collections::BTreeMap;

use prost::Message;
use roaring::RoaringBitmap;

use super::range_set::{PositionRangeSet, RangeSetError};
use super::snapshot::DeletionSnapshot;
use crate::position::Position;
use crate::proto::presence::{check_required, PresenceError, RequiredSpec};

/// Pulsar's default `managedLedgerMaxUnackedRangesToPersist`.
pub const PULSAR_MAX_UNACKED_RANGES_TO_PERSIST: usize = 10_000;

/// `NestedPositionInfo` (a position inside another message).
#[derive(Clone, Copy, PartialEq, Eq, Message)]
pub struct NestedPositionInfo {
    /// `required int64 ledgerId = 1`.
    #[prost(int64, required, tag = "1")]
    pub ledger_id: i64,
    /// `required int64 entryId = 2`.
    #[prost(int64, required, tag = "2")]
    pub entry_id: i64,
}

/// `MessageRange`: the open-closed range `(lower, upper]`.
#[derive(Clone, Copy, PartialEq, Eq, Message)]
pub struct MessageRange {
    /// `required NestedPositionInfo lowerEndpoint = 1` (exclusive).
    #[prost(message, required, tag = "1")]
    pub lower_endpoint: NestedPositionInfo,
    /// `required NestedPositionInfo upperEndpoint = 2` (inclusive).
    #[prost(message, required, tag = "2")]
    pub upper_endpoint: NestedPositionInfo,
}

/// `LongListMap`: ledger id → `BitSet.toLongArray()` words.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct LongListMap {
    /// `required int64 key = 1`: the ledger id.
    #[prost(int64, required, tag = "1")]
    pub key: i64,
    /// `repeated int64 values = 2` (unpacked): the bitset words.
    #[prost(int64, repeated, packed = "false", tag = "2")]
    pub values: Vec<i64>,
}

/// `BatchedEntryDeletionIndexInfo`: a batch entry's remaining ack set.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct BatchedEntryDeletionIndexInfo {
    /// `required NestedPositionInfo position = 1`.
    #[prost(message, required, tag = "1")]
    pub position: NestedPositionInfo,
    /// `repeated int64 deleteSet = 2` (unpacked): ack-set words, a set bit
    /// is a batch index not yet acknowledged.
    #[prost(int64, repeated, packed = "false", tag = "2")]
    pub delete_set: Vec<i64>,
}

/// `LongProperty`: a named i64 cursor property.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct LongProperty {
    /// `required string name = 1`.
    #[prost(string, required, tag = "1")]
    pub name: String,
    /// `required int64 value = 2`.
    #[prost(int64, required, tag = "2")]
    pub value: i64,
}

/// `PositionInfo`: the cursor-ledger entry `ManagedCursorImpl` writes on
/// every persisted mark-delete.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct PositionInfo {
    /// `required int64 ledgerId = 1` (mark-delete).
    #[prost(int64, required, tag = "1")]
    pub ledger_id: i64,
    /// `required int64 entryId = 2` (mark-delete).
    #[prost(int64, required, tag = "2")]
    pub entry_id: i64,
    /// `repeated MessageRange individualDeletedMessages = 3`.
    #[prost(message, repeated, tag = "3")]
    pub individual_deleted_messages: Vec<MessageRange>,
    /// `repeated LongProperty properties = 4`.
    #[prost(message, repeated, tag = "4")]
    pub properties: Vec<LongProperty>,
    /// `repeated BatchedEntryDeletionIndexInfo batchedEntryDeletionIndexInfo = 5`.
    #[prost(message, repeated, tag = "5")]
    pub batched_entry_deletion_index_info: Vec<BatchedEntryDeletionIndexInfo>,
    /// `repeated LongListMap individualDeletedMessageRanges = 6`.
    #[prost(message, repeated, tag = "6")]
    pub individual_deleted_message_ranges: Vec<LongListMap>,
}

/// `StringProperty`: a named string cursor property.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct StringProperty {
    /// `required string name = 1`.
    #[prost(string, required, tag = "1")]
    pub name: String,
    /// `required string value = 2`.
    #[prost(string, required, tag = "2")]
    pub value: String,
}

/// `ManagedCursorInfo`: the cursor record Pulsar keeps in the metadata
/// store (ZooKeeper / etcd / Oxia). The deletion state there has only the
/// `MessageRange` form, capped by
/// `managedLedgerMaxUnackedRangesToPersistInMetadataStore`.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct ManagedCursorInfo {
    /// `required int64 cursorsLedgerId = 1` (-1: the mark-delete below is
    /// authoritative, no cursor ledger).
    #[prost(int64, required, tag = "1")]
    pub cursors_ledger_id: i64,
    /// `optional int64 markDeleteLedgerId = 2`.
    #[prost(int64, optional, tag = "2")]
    pub mark_delete_ledger_id: Option<i64>,
    /// `optional int64 markDeleteEntryId = 3`.
    #[prost(int64, optional, tag = "3")]
    pub mark_delete_entry_id: Option<i64>,
    /// `repeated MessageRange individualDeletedMessages = 4`.
    #[prost(message, repeated, tag = "4")]
    pub individual_deleted_messages: Vec<MessageRange>,
    /// `repeated LongProperty properties = 5`.
    #[prost(message, repeated, tag = "5")]
    pub properties: Vec<LongProperty>,
    /// `optional int64 lastActive = 6` (ms since the epoch).
    #[prost(int64, optional, tag = "6")]
    pub last_active: Option<i64>,
    /// `repeated BatchedEntryDeletionIndexInfo batchedEntryDeletionIndexInfo = 7`.
    #[prost(message, repeated, tag = "7")]
    pub batched_entry_deletion_index_info: Vec<BatchedEntryDeletionIndexInfo>,
    /// `repeated StringProperty cursorProperties = 8`.
    #[prost(message, repeated, tag = "8")]
    pub cursor_properties: Vec<StringProperty>,
}

/// Required fields of `StringProperty`.
pub static STRING_PROPERTY: RequiredSpec = RequiredSpec {
    message: "StringProperty",
    required: &[(1, "name"), (2, "value")],
    nested: &[],
};
/// Required fields of `ManagedCursorInfo` (recursively).
pub static MANAGED_CURSOR_INFO: RequiredSpec = RequiredSpec {
    message: "ManagedCursorInfo",
    required: &[(1, "cursorsLedgerId")],
    nested: &[
        (4, true, &MESSAGE_RANGE),
        (5, true, &LONG_PROPERTY),
        (7, true, &BATCHED_ENTRY_DELETION_INDEX_INFO),
        (8, true, &STRING_PROPERTY),
    ],
};

/// Required fields of `NestedPositionInfo`.
pub static NESTED_POSITION_INFO: RequiredSpec = RequiredSpec {
    message: "NestedPositionInfo",
    required: &[(1, "ledgerId"), (2, "entryId")],
    nested: &[],
};
/// Required fields of `MessageRange`.
pub static MESSAGE_RANGE: RequiredSpec = RequiredSpec {
    message: "MessageRange",
    required: &[(1, "lowerEndpoint"), (2, "upperEndpoint")],
    nested: &[
        (1, false, &NESTED_POSITION_INFO),
        (2, false, &NESTED_POSITION_INFO),
    ],
};
/// Required fields of `LongListMap`.
pub static LONG_LIST_MAP: RequiredSpec = RequiredSpec {
    message: "LongListMap",
    required: &[(1, "key")],
    nested: &[],
};
/// Required fields of `BatchedEntryDeletionIndexInfo`.
pub static BATCHED_ENTRY_DELETION_INDEX_INFO: RequiredSpec = RequiredSpec {
    message: "BatchedEntryDeletionIndexInfo",
    required: &[(1, "position")],
    nested: &[(1, false, &NESTED_POSITION_INFO)],
};
/// Required fields of `LongProperty`.
pub static LONG_PROPERTY: RequiredSpec = RequiredSpec {
    message: "LongProperty",
    required: &[(1, "name"), (2, "value")],
    nested: &[],
};
/// Required fields of `PositionInfo` (recursively).
pub static POSITION_INFO: RequiredSpec = RequiredSpec {
    message: "PositionInfo",
    required: &[(1, "ledgerId"), (2, "entryId")],
    nested: &[
        (3, true, &MESSAGE_RANGE),
        (4, true, &LONG_PROPERTY),
        (5, true, &BATCHED_ENTRY_DELETION_INDEX_INFO),
        (6, true, &LONG_LIST_MAP),
    ],
};

/// Which of Pulsar's two forms carries the individually deleted entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PulsarForm {
    /// `individualDeletedMessages`: one `MessageRange` per run; at most
    /// `max_ranges` ranges (Pulsar's `managedLedgerMaxUnackedRangesToPersist`).
    MessageRanges {
        /// Range cap ([`PULSAR_MAX_UNACKED_RANGES_TO_PERSIST`] in Pulsar).
        max_ranges: usize,
    },
    /// `individualDeletedMessageRanges`: per ledger the BitSet words; at
    /// most `max_entries` deleted entries in total (Pulsar's `toRanges`
    /// counts each ledger's cardinality against the same setting).
    LongArray {
        /// Deleted-entry cap.
        max_entries: usize,
    },
}

impl PulsarForm {
    /// The range form with Pulsar's default cap.
    pub const PULSAR_DEFAULT_RANGES: PulsarForm = PulsarForm::MessageRanges {
        max_ranges: PULSAR_MAX_UNACKED_RANGES_TO_PERSIST,
    };
    /// The long[] form with Pulsar's default cap.
    pub const PULSAR_DEFAULT_LONG_ARRAY: PulsarForm = PulsarForm::LongArray {
        max_entries: PULSAR_MAX_UNACKED_RANGES_TO_PERSIST,
    };
}

/// Why a `PositionInfo` could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PositionInfoError {
    /// The snapshot needs more ranges (or entries) than the form's cap:
    /// Pulsar would silently drop the excess; nothing is encoded here.
    #[error(
        "the deletion state needs {needed} {unit} but the {form} form is capped at {cap}: \
         Pulsar would drop the excess silently (acknowledged messages redelivered after a \
         restart); raise the cap or use the compact form"
    )]
    CapExceeded {
        /// `"MessageRange"` or `"long[]"`.
        form: &'static str,
        /// What the cap counts (`"ranges"` or `"deleted entries"`).
        unit: &'static str,
        /// The configured cap.
        cap: usize,
        /// What the snapshot needs.
        needed: u64,
    },
    /// A required field is missing, or the protobuf structure is broken.
    #[error("malformed PositionInfo: {0}")]
    Presence(#[from] PresenceError),
    /// prost rejected the bytes (bad varint, wrong wire type, invalid UTF-8).
    #[error("undecodable PositionInfo: {0}")]
    Decode(String),
    /// A range or mark-delete the deletion state cannot hold.
    #[error("invalid individually deleted range in PositionInfo: {0}")]
    Range(#[from] RangeSetError),
    /// A `LongListMap` whose words address entries beyond `u32::MAX`, or a
    /// negative ledger id.
    #[error(
        "LongListMap for ledger {ledger_id} has {words} words: entry ids must be u32 \
         (at most 67108864 words) and ledger ids >= 0"
    )]
    LongArrayOutOfRange {
        /// The map key.
        ledger_id: i64,
        /// Its number of words.
        words: usize,
    },
    /// A batch-index entry whose position is not an entry of a real ledger
    /// (negative ledger id or entry id outside u32).
    #[error("batchedEntryDeletionIndexInfo position {position} is not a valid entry position")]
    InvalidBatchPosition {
        /// The rejected position.
        position: Position,
    },
}

/// A decoded `PositionInfo`: the deletion state and the cursor properties.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedPositionInfo {
    /// Mark-delete, individually deleted entries, batch ack sets
    /// (normalised: nothing at or below mark-delete).
    pub snapshot: DeletionSnapshot,
    /// `properties` in wire order (name, value).
    pub properties: Vec<(String, i64)>,
}

fn nested(p: Position) -> NestedPositionInfo {
    NestedPositionInfo {
        ledger_id: p.ledger_id,
        entry_id: p.entry_id,
    }
}

/// `java.util.BitSet.toLongArray()` of one ledger's bitmap.
pub fn bitmap_to_words(bits: &RoaringBitmap) -> Vec<i64> {
    let Some(max) = bits.max() else {
        return Vec::new();
    };
    let mut words = vec![0u64; max as usize / 64 + 1];
    let mut it = bits.iter();
    while let Some(run) = it.next_range() {
        let (s, e) = (*run.start() as usize, *run.end() as usize);
        let (ws, we) = (s / 64, e / 64);
        for (w, word) in words.iter_mut().enumerate().take(we + 1).skip(ws) {
            let lo = if w == ws { s % 64 } else { 0 };
            let hi = if w == we { e % 64 } else { 63 };
            let span = hi - lo + 1;
            let mask = if span == 64 {
                u64::MAX
            } else {
                ((1u64 << span) - 1) << lo
            };
            *word |= mask;
        }
    }
    words.into_iter().map(|w| w as i64).collect()
}

/// Most words a long array may hold: 2^26 words cover the entry ids
/// `0..2^32` (a bitmap of one ledger).
const MAX_LONG_ARRAY_WORDS: usize = 1 << 26;

/// A long array of `words` words for `ledger_id` can be decoded: at most
/// [`MAX_LONG_ARRAY_WORDS`] (checked before anything is allocated) and a
/// ledger id >= 0.
fn long_array_in_range(ledger_id: i64, words: usize) -> Result<(), PositionInfoError> {
    if words > MAX_LONG_ARRAY_WORDS || ledger_id < 0 {
        return Err(PositionInfoError::LongArrayOutOfRange { ledger_id, words });
    }
    Ok(())
}

/// The inverse of [`bitmap_to_words`] (`BitSet.valueOf(long[])`).
///
/// # Errors
/// [`PositionInfoError::LongArrayOutOfRange`] for more than 2^26 words.
pub fn words_to_bitmap(ledger_id: i64, words: &[i64]) -> Result<RoaringBitmap, PositionInfoError> {
    long_array_in_range(ledger_id, words.len())?;
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    Ok(RoaringBitmap::from_lsb0_bytes(0, &bytes))
}

/// Encodes `snapshot` (plus `properties`, in order) as Pulsar's
/// `PositionInfo` in `form`: mark-delete, the individually deleted entries,
/// every batch ack set, the properties; protoc's field order and
/// presence (required fields always written, even when zero).
///
/// # Errors
/// [`PositionInfoError::CapExceeded`] if the snapshot does not fit the
/// form's cap (nothing is dropped).
pub fn encode_position_info(
    snapshot: &DeletionSnapshot,
    form: PulsarForm,
    properties: &[(String, i64)],
) -> Result<Vec<u8>, PositionInfoError> {
    Ok(to_message(snapshot, form, properties)?.encode_to_vec())
}

/// The `PositionInfo` message for `snapshot` (see [`encode_position_info`]).
///
/// # Errors
/// As [`encode_position_info`].
pub fn to_message(
    snapshot: &DeletionSnapshot,
    form: PulsarForm,
    properties: &[(String, i64)],
) -> Result<PositionInfo, PositionInfoError> {
    let mut info = PositionInfo {
        ledger_id: snapshot.mark_delete.ledger_id,
        entry_id: snapshot.mark_delete.entry_id,
        individual_deleted_messages: Vec::new(),
        properties: properties
            .iter()
            .map(|(name, value)| LongProperty {
                name: name.clone(),
                value: *value,
            })
            .collect(),
        batched_entry_deletion_index_info: snapshot
            .batch_ack_sets
            .iter()
            .map(|(p, words)| BatchedEntryDeletionIndexInfo {
                position: nested(*p),
                delete_set: words.clone(),
            })
            .collect(),
        individual_deleted_message_ranges: Vec::new(),
    };
    match form {
        PulsarForm::MessageRanges { max_ranges } => {
            let needed = snapshot.range_count();
            if needed > max_ranges as u64 {
                return Err(PositionInfoError::CapExceeded {
                    form: "MessageRange",
                    unit: "ranges",
                    cap: max_ranges,
                    needed,
                });
            }
            info.individual_deleted_messages = snapshot
                .ranges()
                .map(|(lo, up)| MessageRange {
                    lower_endpoint: nested(lo),
                    upper_endpoint: nested(up),
                })
                .collect();
        }
        PulsarForm::LongArray { max_entries } => {
            let needed = snapshot.deleted_entries();
            if needed > max_entries as u64 {
                return Err(PositionInfoError::CapExceeded {
                    form: "long[]",
                    unit: "deleted entries",
                    cap: max_entries,
                    needed,
                });
            }
            info.individual_deleted_message_ranges = snapshot
                .ledgers
                .iter()
                .filter(|(_, b)| !b.is_empty())
                .map(|(l, b)| LongListMap {
                    key: *l,
                    values: bitmap_to_words(b),
                })
                .collect();
        }
    }
    Ok(info)
}

/// Decodes a `PositionInfo` written by Pulsar (either form) or by
/// [`encode_position_info`]. As Pulsar's recovery does, the range list is
/// used when it is non-empty, else the long[] map; ranges are added with
/// Pulsar's `addOpenClosed` semantics (a legacy cross-ledger range fills
/// its upper ledger from entry 0). Entries at or below mark-delete are
/// dropped.
///
/// # Errors
/// [`PositionInfoError::Presence`] (missing required field, truncation),
/// [`PositionInfoError::Decode`], [`PositionInfoError::Range`],
/// [`PositionInfoError::LongArrayOutOfRange`],
/// [`PositionInfoError::InvalidBatchPosition`].
pub fn decode_position_info(bytes: &[u8]) -> Result<DecodedPositionInfo, PositionInfoError> {
    check_required(&POSITION_INFO, bytes)?;
    let info = PositionInfo::decode(bytes).map_err(|e| PositionInfoError::Decode(e.to_string()))?;
    from_message(&info)
}

/// The deletion state held by a decoded `PositionInfo` message.
///
/// # Errors
/// As [`decode_position_info`] (after the wire checks).
pub fn from_message(info: &PositionInfo) -> Result<DecodedPositionInfo, PositionInfoError> {
    let mark_delete = Position::new(info.ledger_id, info.entry_id);
    if mark_delete.entry_id != -1 && u32::try_from(mark_delete.entry_id).is_err() {
        return Err(RangeSetError::BoundOutOfRange {
            ledger_id: mark_delete.ledger_id,
            entry_id: mark_delete.entry_id,
        }
        .into());
    }
    let mut ledgers: BTreeMap<i64, RoaringBitmap> = BTreeMap::new();
    if !info.individual_deleted_messages.is_empty() {
        let ranges: Vec<(Position, Position)> = info
            .individual_deleted_messages
            .iter()
            .map(|r| {
                (
                    Position::new(r.lower_endpoint.ledger_id, r.lower_endpoint.entry_id),
                    Position::new(r.upper_endpoint.ledger_id, r.upper_endpoint.entry_id),
                )
            })
            .collect();
        ledgers = PositionRangeSet::from_ranges(&ranges)?.to_bitmaps();
    } else {
        for m in &info.individual_deleted_message_ranges {
            let bits = words_to_bitmap(m.key, &m.values)?;
            *ledgers.entry(m.key).or_default() |= bits;
        }
    }
    let mut batch_ack_sets = BTreeMap::new();
    for b in &info.batched_entry_deletion_index_info {
        let position = Position::new(b.position.ledger_id, b.position.entry_id);
        if position.ledger_id < 0 || u32::try_from(position.entry_id).is_err() {
            return Err(PositionInfoError::InvalidBatchPosition { position });
        }
        batch_ack_sets.insert(position, b.delete_set.clone());
    }
    let mut snapshot = DeletionSnapshot {
        mark_delete,
        ledgers,
        batch_ack_sets,
    };
    snapshot.normalize();
    Ok(DecodedPositionInfo {
        snapshot,
        properties: info
            .properties
            .iter()
            .map(|p| (p.name.clone(), p.value))
            .collect(),
    })
}

/// Encodes `snapshot` as Pulsar's metadata-store `ManagedCursorInfo`
/// (`cursorsLedgerId`, mark-delete, ranges, properties, batch ack sets;
/// `lastActive` when given). Only the `MessageRange` form exists there.
///
/// # Errors
/// [`PositionInfoError::CapExceeded`] for more than `max_ranges` ranges
/// (Pulsar's `managedLedgerMaxUnackedRangesToPersistInMetadataStore`).
pub fn encode_managed_cursor_info(
    snapshot: &DeletionSnapshot,
    cursors_ledger_id: i64,
    max_ranges: usize,
    properties: &[(String, i64)],
    last_active: Option<i64>,
) -> Result<Vec<u8>, PositionInfoError> {
    let info = to_message(
        snapshot,
        PulsarForm::MessageRanges { max_ranges },
        properties,
    )?;
    Ok(ManagedCursorInfo {
        cursors_ledger_id,
        mark_delete_ledger_id: Some(info.ledger_id),
        mark_delete_entry_id: Some(info.entry_id),
        individual_deleted_messages: info.individual_deleted_messages,
        properties: info.properties,
        last_active,
        batched_entry_deletion_index_info: info.batched_entry_deletion_index_info,
        cursor_properties: Vec::new(),
    }
    .encode_to_vec())
}

/// Decodes a `ManagedCursorInfo`: the cursor ledger id and, when the
/// record carries a mark-delete, the deletion state (a record without
/// `markDeleteLedgerId`/`markDeleteEntryId` points at its cursor ledger
/// for the state: `None`).
///
/// # Errors
/// As [`decode_position_info`].
pub fn decode_managed_cursor_info(
    bytes: &[u8],
) -> Result<(i64, Option<DecodedPositionInfo>), PositionInfoError> {
    check_required(&MANAGED_CURSOR_INFO, bytes)?;
    let info =
        ManagedCursorInfo::decode(bytes).map_err(|e| PositionInfoError::Decode(e.to_string()))?;
    let (Some(ledger_id), Some(entry_id)) = (info.mark_delete_ledger_id, info.mark_delete_entry_id)
    else {
        return Ok((info.cursors_ledger_id, None));
    };
    let as_position_info = PositionInfo {
        ledger_id,
        entry_id,
        individual_deleted_messages: info.individual_deleted_messages,
        properties: info.properties,
        batched_entry_deletion_index_info: info.batched_entry_deletion_index_info,
        individual_deleted_message_ranges: Vec::new(),
    };
    Ok((
        info.cursors_ledger_id,
        Some(from_message(&as_position_info)?),
    ))
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod long_array_tests {
    use super::*;

    /// 2^26 words (entry ids up to 2^32) decode; one more word, or a
    /// negative ledger id, is out of range.
    #[test]
    fn long_arrays_are_in_range_up_to_2_pow_26_words() {
        assert_eq!(long_array_in_range(0, 1 << 26), Ok(()));
        assert_eq!(long_array_in_range(7, 0), Ok(()));
        assert_eq!(
            long_array_in_range(0, (1 << 26) + 1),
            Err(PositionInfoError::LongArrayOutOfRange {
                ledger_id: 0,
                words: (1 << 26) + 1
            })
        );
        assert_eq!(
            long_array_in_range(-1, 1),
            Err(PositionInfoError::LongArrayOutOfRange {
                ledger_id: -1,
                words: 1
            })
        );
    }
}
