//! The compact deletion-state decoder treats every stored stream as bad
//! input until proven otherwise: each defect (short stream, field running
//! past the end, wrong magic/version/checksum, positions the state cannot
//! hold, ledgers out of order, damaged or padded bitmaps, bytes left over)
//! is its own typed [`CompactError`] carrying the offsets and values that
//! locate it, and every boundary value that is valid decodes.
//!
//! The streams are built field by field with a valid CRC-32C trailer, so
//! each case reaches the check it is about instead of failing the checksum.

use pulsar_core::deletion::compact::{self, CompactError, MAGIC, VERSION};
use pulsar_core::deletion::DeletionSnapshot;
use pulsar_core::Position;
use roaring::RoaringBitmap;

/// Smallest well-formed stream: magic, version, mark-delete, two zero
/// counts and the checksum.
const MIN_STREAM: usize = 4 + 1 + 16 + 4 + 4 + 4;

/// Builds a stream body field by field.
#[derive(Default)]
struct Body(Vec<u8>);

impl Body {
    fn header(md: Position) -> Self {
        let mut b = Body::default();
        b.0.extend_from_slice(&MAGIC);
        b.0.push(VERSION);
        b.i64(md.ledger_id).i64(md.entry_id)
    }
    fn i64(mut self, v: i64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(mut self, v: &[u8]) -> Self {
        self.0.extend_from_slice(v);
        self
    }
    fn bitmap(self, ledger_id: i64, entries: &[u32]) -> Self {
        let bits = RoaringBitmap::from_iter(entries.iter().copied());
        let mut raw = Vec::new();
        bits.serialize_into(&mut raw).unwrap();
        self.i64(ledger_id).u32(raw.len() as u32).bytes(&raw)
    }
    /// The body followed by its CRC-32C trailer.
    fn seal(self) -> Vec<u8> {
        let mut out = self.0;
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

fn decode(stream: &[u8]) -> Result<DeletionSnapshot, CompactError> {
    compact::decode_stream(stream)
}

#[test]
fn the_smallest_stream_decodes_and_anything_shorter_is_truncated_by_the_missing_bytes() {
    let stream = Body::header(Position::new(3, 7)).u32(0).u32(0).seal();
    assert_eq!(stream.len(), MIN_STREAM);
    assert_eq!(
        decode(&stream).unwrap(),
        DeletionSnapshot::new(Position::new(3, 7))
    );
    for len in 0..MIN_STREAM {
        assert_eq!(
            decode(&stream[..len]),
            Err(CompactError::Truncated {
                at: len,
                needed: MIN_STREAM - len
            }),
            "stream of {len} bytes"
        );
    }
    // An empty chunk list is an empty stream.
    assert_eq!(
        compact::decode::<Vec<u8>>(&[]),
        Err(CompactError::Truncated {
            at: 0,
            needed: MIN_STREAM
        })
    );
}

#[test]
fn a_field_running_past_the_end_names_its_offset_and_the_missing_byte_count() {
    // One ledger whose length field claims 100 bytes; 4 follow it.
    let body = Body::header(Position::new(1, -1))
        .u32(1)
        .i64(1)
        .u32(100)
        .bytes(&[0; 4]);
    let at = body.len() - 4;
    assert_eq!(
        decode(&body.seal()),
        Err(CompactError::Truncated { at, needed: 96 })
    );
    // A ledger count with no ledger after it: the ledger id is 8 bytes, 4
    // (the batch count's place) are there.
    let body = Body::header(Position::new(1, -1)).u32(1).u32(0);
    let at = body.len() - 4;
    assert_eq!(
        decode(&body.seal()),
        Err(CompactError::Truncated { at, needed: 4 })
    );
    // A field that exactly fills the rest is not truncated: the length of
    // the last ledger's bitmap ends where the batch count begins.
    let stream = Body::header(Position::new(1, -1))
        .u32(1)
        .bitmap(2, &[5, 6])
        .u32(0)
        .seal();
    let mut want = DeletionSnapshot::new(Position::new(1, -1));
    want.ledgers.insert(2, RoaringBitmap::from_iter([5u32, 6]));
    assert_eq!(decode(&stream).unwrap(), want);
}

#[test]
fn an_ack_set_word_count_beyond_the_stream_is_truncated_not_allocated() {
    let body = Body::header(Position::new(1, -1))
        .u32(0)
        .u32(1)
        .i64(1)
        .i64(2)
        .u32(u32::MAX);
    let at = body.len();
    assert_eq!(
        decode(&body.seal()),
        Err(CompactError::Truncated {
            at,
            needed: u32::MAX as usize * 8
        })
    );
}

#[test]
fn magic_version_and_checksum_are_checked_with_the_values_found() {
    let good = Body::header(Position::new(1, -1)).u32(0).u32(0).seal();
    let mut bad_magic = good.clone();
    bad_magic[0] = b'X';
    assert_eq!(
        decode(&bad_magic),
        Err(CompactError::BadMagic {
            found: [b'X', b'C', b'D', b'S']
        })
    );
    let mut bad_version = good.clone();
    bad_version[4] = VERSION + 1;
    assert_eq!(
        decode(&bad_version),
        Err(CompactError::UnsupportedVersion(VERSION + 1))
    );
    let mut flipped = good.clone();
    flipped[10] ^= 0x01;
    let body = &flipped[..flipped.len() - 4];
    let stored = u32::from_le_bytes(flipped[flipped.len() - 4..].try_into().unwrap());
    assert_eq!(
        decode(&flipped),
        Err(CompactError::Checksum {
            stored,
            computed: crc32c::crc32c(body)
        })
    );
    // A flipped trailer bit is a mismatch too.
    let mut trailer = good.clone();
    let last = trailer.len() - 1;
    trailer[last] ^= 0x80;
    assert!(matches!(
        decode(&trailer),
        Err(CompactError::Checksum { .. })
    ));
}

#[test]
fn mark_delete_entry_ids_minus_one_through_u32_max_decode_and_others_are_rejected() {
    for entry_id in [-1, 0, i64::from(u32::MAX)] {
        let md = Position::new(4, entry_id);
        let stream = Body::header(md).u32(0).u32(0).seal();
        assert_eq!(decode(&stream).unwrap().mark_delete, md, "{entry_id}");
    }
    for entry_id in [-2, i64::from(u32::MAX) + 1, i64::MIN, i64::MAX] {
        let md = Position::new(4, entry_id);
        let stream = Body::header(md).u32(0).u32(0).seal();
        assert!(
            matches!(
                decode(&stream),
                Err(CompactError::InvalidPosition { position, .. }) if position == md
            ),
            "{entry_id}: {:?}",
            decode(&stream)
        );
    }
}

#[test]
fn ledger_ids_must_be_non_negative_and_strictly_ascending() {
    let md = Position::new(0, -1);
    // Ledger 0 is a real ledger.
    let stream = Body::header(md).u32(1).bitmap(0, &[1]).u32(0).seal();
    assert_eq!(
        decode(&stream)
            .unwrap()
            .ledgers
            .keys()
            .copied()
            .collect::<Vec<_>>(),
        vec![0]
    );
    let stream = Body::header(md).u32(1).bitmap(-1, &[1]).u32(0).seal();
    assert_eq!(
        decode(&stream),
        Err(CompactError::LedgerOrder { ledger_id: -1 })
    );
    let stream = Body::header(md)
        .u32(2)
        .bitmap(5, &[1])
        .bitmap(5, &[2])
        .u32(0)
        .seal();
    assert_eq!(
        decode(&stream),
        Err(CompactError::LedgerOrder { ledger_id: 5 })
    );
    let stream = Body::header(md)
        .u32(2)
        .bitmap(5, &[1])
        .bitmap(4, &[2])
        .u32(0)
        .seal();
    assert_eq!(
        decode(&stream),
        Err(CompactError::LedgerOrder { ledger_id: 4 })
    );
    let stream = Body::header(md)
        .u32(2)
        .bitmap(4, &[1])
        .bitmap(5, &[2])
        .u32(0)
        .seal();
    assert_eq!(decode(&stream).unwrap().deleted_entries(), 2);
}

#[test]
fn a_damaged_or_padded_bitmap_is_a_bitmap_error_for_its_ledger() {
    let md = Position::new(1, -1);
    let stream = Body::header(md)
        .u32(1)
        .i64(9)
        .u32(4)
        .bytes(&[1, 2, 3, 4])
        .u32(0)
        .seal();
    assert!(matches!(
        decode(&stream),
        Err(CompactError::Bitmap { ledger_id: 9, .. })
    ));
    // A valid bitmap with a stored length one byte longer than it uses.
    let mut raw = Vec::new();
    RoaringBitmap::from_iter([3u32])
        .serialize_into(&mut raw)
        .unwrap();
    let used = raw.len();
    raw.push(0);
    let stream = Body::header(md)
        .u32(1)
        .i64(9)
        .u32(raw.len() as u32)
        .bytes(&raw)
        .u32(0)
        .seal();
    match decode(&stream) {
        Err(CompactError::Bitmap { ledger_id, reason }) => {
            assert_eq!(ledger_id, 9);
            assert!(
                reason.contains(&format!("{} bytes stored", used + 1)),
                "{reason}"
            );
            assert!(reason.contains(&format!("uses {used}")), "{reason}");
        }
        other => panic!("padded bitmap decoded as {other:?}"),
    }
}

#[test]
fn batch_positions_must_be_entries_of_real_ledgers() {
    let md = Position::new(0, -1);
    for (position, valid) in [
        (Position::new(0, 0), true),
        (Position::new(2, i64::from(u32::MAX)), true),
        (Position::new(-1, 3), false),
        (Position::new(2, -1), false),
        (Position::new(2, i64::from(u32::MAX) + 1), false),
    ] {
        let stream = Body::header(md)
            .u32(0)
            .u32(1)
            .i64(position.ledger_id)
            .i64(position.entry_id)
            .u32(1)
            .i64(0b1010)
            .seal();
        let got = decode(&stream);
        if valid {
            assert_eq!(
                got.unwrap().batch_ack_sets.get(&position),
                Some(&vec![0b1010]),
                "{position}"
            );
        } else {
            assert!(
                matches!(got, Err(CompactError::InvalidPosition { position: p, .. }) if p == position),
                "{position}: {got:?}"
            );
        }
    }
}

#[test]
fn ack_set_words_are_read_in_order_and_every_word_is_kept() {
    let md = Position::new(1, -1);
    let stream = Body::header(md)
        .u32(0)
        .u32(2)
        .i64(1)
        .i64(3)
        .u32(3)
        .i64(-1)
        .i64(0)
        .i64(7)
        .i64(1)
        .i64(4)
        .u32(1)
        .i64(2)
        .seal();
    let got = decode(&stream).unwrap();
    assert_eq!(got.batch_ack_sets.len(), 2);
    assert_eq!(got.batch_ack_sets[&Position::new(1, 3)], vec![-1, 0, 7]);
    assert_eq!(got.batch_ack_sets[&Position::new(1, 4)], vec![2]);
}

#[test]
fn bytes_left_before_the_checksum_are_counted() {
    for extra in [1usize, 3, 8] {
        let stream = Body::header(Position::new(1, -1))
            .u32(0)
            .u32(0)
            .bytes(&vec![0; extra])
            .seal();
        assert_eq!(decode(&stream), Err(CompactError::TrailingBytes(extra)));
    }
}

#[test]
fn encode_drops_empty_bitmaps_and_cuts_chunks_of_at_least_one_byte() {
    let mut s = DeletionSnapshot::new(Position::new(1, -1));
    s.ledgers.insert(2, RoaringBitmap::new());
    s.ledgers.insert(3, RoaringBitmap::from_iter([0u32]));
    let stream = compact::encode_stream(&s);
    // Ledger count 1: only ledger 3 is written.
    assert_eq!(&stream[21..25], &1u32.to_le_bytes());
    assert_eq!(&stream[25..33], &3i64.to_le_bytes());
    let mut want = s.clone();
    want.ledgers.remove(&2);
    assert_eq!(decode(&stream).unwrap(), want);
    // A chunk size of 0 is treated as 1: one chunk per byte, nothing lost.
    let chunks = compact::encode(&s, 0);
    assert_eq!(chunks.len(), stream.len());
    assert!(chunks.iter().all(|c| c.len() == 1));
    assert_eq!(compact::decode(&chunks).unwrap(), want);
    let chunks = compact::encode(&s, 7);
    assert_eq!(chunks.len(), stream.len().div_ceil(7));
    assert_eq!(chunks.concat(), stream);
}

#[test]
fn decoding_normalizes_entries_at_or_below_mark_delete_away() {
    // Entries 0..=5 of ledger 2 are at or below mark-delete (2, 5): only 6
    // and 9 are individually deleted above it; ledger 1 is below it.
    let stream = Body::header(Position::new(2, 5))
        .u32(2)
        .bitmap(1, &[4])
        .bitmap(2, &[0, 5, 6, 9])
        .u32(0)
        .seal();
    let got = decode(&stream).unwrap();
    assert_eq!(got.ledgers.len(), 1);
    assert_eq!(
        got.ledgers[&2].iter().collect::<Vec<_>>(),
        vec![6, 9],
        "{got:?}"
    );
}

#[test]
fn the_default_chunk_size_keeps_a_small_state_in_one_row_and_cuts_large_ones_at_one_mib() {
    let mut small = DeletionSnapshot::new(Position::new(1, -1));
    small
        .ledgers
        .insert(1, RoaringBitmap::from_iter([1u32, 5, 9]));
    assert_eq!(
        compact::encode(&small, compact::DEFAULT_CHUNK_BYTES).len(),
        1
    );
    // Every other entry of 8 Mi entries: 128 bitmap containers of 8 KiB,
    // a stream just over 1 MiB.
    let mut large = DeletionSnapshot::new(Position::new(1, -1));
    large
        .ledgers
        .insert(1, RoaringBitmap::from_iter((0u32..1 << 23).step_by(2)));
    let stream = compact::encode_stream(&large);
    assert!(
        stream.len() > 1 << 20 && stream.len() < 2 << 20,
        "{}",
        stream.len()
    );
    let chunks = compact::encode(&large, compact::DEFAULT_CHUNK_BYTES);
    assert_eq!(chunks.len(), 2);
    assert_eq!(chunks[0].len(), 1 << 20);
    assert_eq!(chunks.concat(), stream);
    assert_eq!(compact::decode(&chunks).unwrap(), large);
}
