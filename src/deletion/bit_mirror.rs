//! [`BitMirror`]: a copy of one ledger's deleted-entry bitmap that the
//! read-scheduling hint reads without any lock or read-modify-write.
//!
//! Each ledger bitmap of a [`PositionRangeSet`](super::PositionRangeSet) is
//! a roaring bitmap behind its own `RwLock` (the authoritative bits: ranges,
//! cardinality, snapshots). Taking that lock is an atomic read-modify-write,
//! and while a grouped ack holds it a lock-free reader could only give up
//! ("not deleted"). The mirror holds the same bits for entries
//! `0..MIRROR_ENTRIES` as plain atomic words, written by the bitmap's
//! writer inside the same write section, so a lookup is a handful of loads
//! even while a grouped ack into the same ledger is running.
//!
//! Shape: `MIRROR_CHUNKS` lazily allocated chunks of `CHUNK_WORDS` 64-bit
//! words (std build: 16 chunks of 4,096 entries, 512 bytes each, allocated
//! on the first set bit in their span; entries 0..65,536, above Pulsar's
//! default `managedLedgerMaxEntriesPerLedger` of 50,000). Entries beyond
//! the mirror are answered by the caller from the roaring bitmap.
//!
//! # Concurrency contract
//!
//! One writer at a time (the caller holds the bitmap's write lock around
//! every writer method); any number of readers, at any time.
//!
//! - **Setting bits** needs no bracket while the bitmap keeps its owner: a
//!   reader that sees a bit set reads a deletion that happened during or
//!   before its call. A bit set after a re-tag belongs to the new owner, so
//!   a reader that validated the old owner must not keep it: every set is a
//!   Release store, so a reader whose word load sees it also sees (after its
//!   Acquire fence) the re-tag's version bracket, whichever writer thread
//!   ran the bracket (see `SET_ORDERING`).
//! - **Clearing bits and changing the owner** (a summary-slot bitmap handed
//!   to another ledger, a trim below mark-delete, a reset's clear) are
//!   bracketed by `version` as a seqlock: odd while the writer works. A
//!   read ([`BitMirror::contains_validated`]) loads the version, the owner
//!   check and the word, then re-loads the version after an acquire fence;
//!   a read that overlapped a bracket answers "not deleted" (a stale
//!   negative, which the hint's contract allows: one extra read that the
//!   post-I/O filter drops). So a "deleted" answer always comes from a bit
//!   that belonged to the checked owner when it was read and that no
//!   removal touched in between: never a bit of another ledger, never a
//!   bit a removal had already cleared.
//!
//! Checked by the cursor scenarios of `loom-tests/cursor.rs` and
//! `shuttle-tests/cursor.rs` (the real code, e.g. `summary_slot_reuse`),
//! with the negative controls of `tests/scenarios/cursor.rs`
//! (`slot_reuse_model`: a read without the version validation, and under
//! loom one without the acquire fence, both give a stale positive), and by
//! `tests/cursor_range_set.rs` (the hint equals the set, uncontended, for
//! entries inside and beyond the mirror).

use std::ops::RangeInclusive;

use crate::sync::{fence, AtomicU64, Ordering, SetOnce};

/// Words per chunk (64 entries each). Smaller under loom: every modelled
/// atomic is part of the explored state.
#[cfg(not(loom))]
const CHUNK_WORDS: usize = 64;
#[cfg(loom)]
const CHUNK_WORDS: usize = 1;
/// Chunks per mirror.
#[cfg(not(loom))]
const MIRROR_CHUNKS: usize = 16;
#[cfg(loom)]
const MIRROR_CHUNKS: usize = 1;
/// Entries per chunk.
const CHUNK_ENTRIES: u32 = (CHUNK_WORDS as u32) * 64;
/// Entries `0..MIRROR_ENTRIES` are mirrored.
pub(crate) const MIRROR_ENTRIES: u32 = CHUNK_ENTRIES * MIRROR_CHUNKS as u32;

/// Ordering of the word store that sets bits. Release, although a set
/// publishes no data of its own: the seqlock read relies on "a reader whose
/// word load sees a store made after a bracket re-loads the bracket's odd
/// version or later", and the writer that set the bit may be another thread
/// than the one that ran the bracket (the bitmap's lock hands the write
/// sections from thread to thread; it is acquired, never a release fence in
/// the setting thread). The Release store makes the reader's Acquire fence
/// synchronise with the setting thread, whose history (through the lock)
/// contains every earlier bracket. Checked by loom's
/// `summary_slot_reuse_by_two_writer_threads_...` (fails with Relaxed).
/// Free on x86 (a plain store), `stlr` on AArch64.
const SET_ORDERING: Ordering = Ordering::Release;

struct Chunk {
    words: [AtomicU64; CHUNK_WORDS],
}

impl Chunk {
    fn boxed() -> Box<Self> {
        Box::new(Self {
            words: std::array::from_fn(|_| AtomicU64::new(0)),
        })
    }
}

/// The lock-free copy of one ledger bitmap's entries `0..MIRROR_ENTRIES`
/// (see the module docs for the contract).
pub(crate) struct BitMirror {
    /// Seqlock version: odd while a writer clears bits or changes what the
    /// bits belong to.
    version: AtomicU64,
    /// Boxed: an unallocated chunk costs one pointer-sized cell, not 512
    /// bytes.
    chunks: [SetOnce<Box<Chunk>>; MIRROR_CHUNKS],
}

/// Word index and bit mask of `entry` within its chunk.
#[inline]
fn locate(entry: u32) -> (usize, usize, u64) {
    let chunk = (entry / CHUNK_ENTRIES) as usize;
    let word = ((entry % CHUNK_ENTRIES) / 64) as usize;
    (chunk, word, 1u64 << (entry % 64))
}

/// Mask of bits `lo..=hi` of one word (`lo <= hi < 64`).
#[inline]
fn word_mask(lo: u32, hi: u32) -> u64 {
    debug_assert!(lo <= hi && hi < 64);
    (u64::MAX >> (63 - hi)) & (u64::MAX << lo)
}

impl BitMirror {
    pub(crate) fn new() -> Self {
        Self {
            version: AtomicU64::new(0),
            chunks: std::array::from_fn(|_| SetOnce::new()),
        }
    }

    /// Whether `entry` is set, for a lock-free reader; `None` if `entry` is
    /// beyond the mirror (the caller asks the roaring bitmap). `owner_ok`
    /// runs inside the validated window: a bit is reported only if it
    /// returned true and no clear or owner change overlapped the read.
    #[inline]
    pub(crate) fn contains_validated(
        &self,
        entry: u32,
        owner_ok: impl FnOnce() -> bool,
    ) -> Option<bool> {
        if entry >= MIRROR_ENTRIES {
            return None;
        }
        let (chunk, word, mask) = locate(entry);
        // Acquire: pairs with the Release store that ends a bracket, so the
        // loads below see every clear and owner change of that bracket.
        let v1 = self.version.load(Ordering::Acquire);
        if v1 & 1 != 0 {
            return Some(false);
        }
        if !owner_ok() {
            return Some(false);
        }
        // Relaxed: the bit's own value is all that is read; its validity is
        // established by the version re-load below.
        let set = self.chunks[chunk]
            .with(|c| c.words[word].load(Ordering::Relaxed) & mask != 0)
            .unwrap_or(false);
        // Seqlock read side: if the loads above saw any store of a bracket
        // (made after the writer's Release fence), this Acquire fence makes
        // the bracket's opening store visible to the re-load, which then
        // differs from v1.
        fence(Ordering::Acquire);
        Some(set && self.version.load(Ordering::Relaxed) == v1)
    }

    /// Sets `entry`'s bit (writer, under the bitmap's write lock). An entry
    /// beyond the mirror is ignored.
    pub(crate) fn set(&self, entry: u32) {
        if entry >= MIRROR_ENTRIES {
            return;
        }
        let (chunk, word, mask) = locate(entry);
        self.chunks[chunk].with_or_init(Chunk::boxed, |c| {
            // Single writer: a load and a store, no read-modify-write.
            let w = &c.words[word];
            w.store(w.load(Ordering::Relaxed) | mask, SET_ORDERING);
        });
    }

    /// Sets every bit of `range` that lies in the mirror (writer).
    pub(crate) fn set_range(&self, range: RangeInclusive<u32>) {
        self.for_each_word(
            range,
            |w, mask| {
                w.store(w.load(Ordering::Relaxed) | mask, SET_ORDERING);
            },
            true,
        );
    }

    /// Clears every bit of `range` that lies in the mirror, inside a
    /// version bracket (writer).
    pub(crate) fn clear_range(&self, range: RangeInclusive<u32>) {
        self.bracket(|| {
            self.for_each_word(
                range,
                |w, mask| {
                    w.store(w.load(Ordering::Relaxed) & !mask, Ordering::Relaxed);
                },
                false,
            );
        });
    }

    /// Clears every bit and runs `also` (e.g. an owner change) inside one
    /// version bracket (writer).
    pub(crate) fn clear_all_and(&self, also: impl FnOnce()) {
        self.bracket(|| {
            for c in &self.chunks {
                c.with(|c| {
                    for w in &c.words {
                        w.store(0, Ordering::Relaxed);
                    }
                });
            }
            also();
        });
    }

    /// Runs `f` with the version odd: readers that overlap it answer
    /// "not deleted".
    fn bracket(&self, f: impl FnOnce()) {
        // Single writer: only this thread stores the version.
        let v = self.version.load(Ordering::Relaxed);
        self.version.store(v + 1, Ordering::Relaxed);
        // Release fence: a reader whose loads see any store made by `f`
        // synchronises with it (through its Acquire fence) and re-loads at
        // least v + 1.
        fence(Ordering::Release);
        f();
        // Release: a reader that loads v + 2 sees every store of `f`.
        self.version.store(v + 2, Ordering::Release);
    }

    /// Calls `f(word, mask)` for every mirror word that `range` touches,
    /// with the mask of the range's bits in it. `allocate`: create missing
    /// chunks (setting); otherwise skip them (clearing: nothing is set
    /// there).
    fn for_each_word(
        &self,
        range: RangeInclusive<u32>,
        mut f: impl FnMut(&AtomicU64, u64),
        allocate: bool,
    ) {
        let (lo, hi) = (*range.start(), (*range.end()).min(MIRROR_ENTRIES - 1));
        if lo > hi {
            return;
        }
        // Chunk by chunk, word by word: bounded loops over indexes.
        for chunk in lo / CHUNK_ENTRIES..=hi / CHUNK_ENTRIES {
            let chunk_first = chunk * CHUNK_ENTRIES;
            let first = lo.max(chunk_first) - chunk_first;
            let last = hi.min(chunk_first + (CHUNK_ENTRIES - 1)) - chunk_first;
            let mut apply = |c: &Chunk| {
                for word in first / 64..=last / 64 {
                    let lo_bit = if word == first / 64 { first % 64 } else { 0 };
                    let hi_bit = if word == last / 64 { last % 64 } else { 63 };
                    f(&c.words[word as usize], word_mask(lo_bit, hi_bit));
                }
            };
            if allocate {
                self.chunks[chunk as usize].with_or_init(Chunk::boxed, |c| apply(c));
            } else {
                self.chunks[chunk as usize].with(|c| apply(c));
            }
        }
    }
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests {
    use super::*;

    fn read(m: &BitMirror, e: u32) -> bool {
        m.contains_validated(e, || true).expect("inside the mirror")
    }

    fn members(m: &BitMirror, upto: u32) -> Vec<u32> {
        (0..upto).filter(|&e| read(m, e)).collect()
    }

    #[test]
    fn word_masks_cover_exactly_the_range() {
        assert_eq!(word_mask(0, 63), u64::MAX);
        assert_eq!(word_mask(0, 0), 1);
        assert_eq!(word_mask(63, 63), 1 << 63);
        assert_eq!(word_mask(3, 5), 0b111000);
    }

    #[test]
    fn ranges_set_and_clear_exactly_their_entries_across_words_and_chunks() {
        let m = BitMirror::new();
        let end = CHUNK_ENTRIES + 70;
        m.set_range(60..=end);
        assert_eq!(members(&m, end + 10), (60..=end).collect::<Vec<_>>());
        m.clear_range(62..=CHUNK_ENTRIES + 1);
        let expect: Vec<u32> = [60, 61]
            .into_iter()
            .chain(CHUNK_ENTRIES + 2..=end)
            .collect();
        assert_eq!(members(&m, end + 10), expect);
        // Setting a bit that is already set keeps it set.
        m.set(5);
        m.set(5);
        assert!(read(&m, 5));
        m.clear_all_and(|| {});
        assert!(members(&m, end + 10).is_empty());
    }

    #[test]
    fn an_unused_mirror_allocates_no_chunk() {
        // One word-sized version and a pointer-sized cell per chunk: the
        // 512-byte chunks are allocated on their first set bit.
        assert!(std::mem::size_of::<BitMirror>() <= 8 + MIRROR_CHUNKS * 16);
    }

    #[test]
    fn every_entry_of_a_default_size_ledger_is_mirrored() {
        // Pulsar's default managedLedgerMaxEntriesPerLedger is 50,000: a
        // whole ledger of that size is answered without any lock.
        let m = BitMirror::new();
        for e in [0, 4_095, 4_096, 49_999, 65_535] {
            m.set(e);
            assert_eq!(m.contains_validated(e, || true), Some(true), "entry {e}");
        }
        assert_eq!(m.contains_validated(65_536, || true), None);
    }

    #[test]
    fn entries_beyond_the_mirror_are_left_to_the_caller() {
        let m = BitMirror::new();
        m.set(MIRROR_ENTRIES);
        m.set_range(MIRROR_ENTRIES - 1..=u32::MAX);
        assert_eq!(m.contains_validated(MIRROR_ENTRIES, || true), None);
        assert_eq!(m.contains_validated(u32::MAX, || true), None);
        assert!(read(&m, MIRROR_ENTRIES - 1));
        assert!(!read(&m, MIRROR_ENTRIES - 2));
    }

    #[test]
    fn a_failed_owner_check_or_an_open_bracket_answers_not_deleted() {
        let m = BitMirror::new();
        m.set(7);
        assert_eq!(m.contains_validated(7, || false), Some(false));
        // A reader whose window contains a bracket (here: the owner check
        // itself runs a clear of other entries) gives up.
        assert_eq!(
            m.contains_validated(7, || {
                m.clear_range(100..=101);
                true
            }),
            Some(false)
        );
        assert!(read(&m, 7));
        // Odd version: a bracket in progress (bit 7 is still set in it).
        let seen = std::cell::Cell::new(None);
        m.bracket(|| seen.set(Some(m.contains_validated(7, || true))));
        assert_eq!(seen.get(), Some(Some(false)));
        assert!(read(&m, 7));
    }
}
