//! [`BucketDelayedDeliveryTracker`]: the bucket-based delayed delivery
//! tracker (Pulsar `BucketDelayedDeliveryTracker`, with these semantics:
//! merge keeps segment 1, no duplicate delivery, counter = runtime
//! bitmap cardinality).
//!
//! This file holds the tracker's state (one lock over `Inner`) and its
//! constructor; each operation lives in its own file, all of them `impl`
//! blocks of the one tracker type:
//!
//! | file | job |
//! |---|---|
//! | `add.rs` | [`add_message`](BucketDelayedDeliveryTracker::add_message): mutable bucket or shared queue |
//! | `seal.rs` | seal the mutable bucket into a persisted immutable bucket |
//! | `buckets.rs` | the bucket map and the boundary registry |
//! | `retry.rs` | snapshot create / delete with bounded retries |
//! | `delivery.rs` | [`get_scheduled_messages`](BucketDelayedDeliveryTracker::get_scheduled_messages) |
//! | `segment.rs` | load the next segment at a boundary (metadata fallback) |
//! | `timer.rs` | next delivery time, availability, the dispatcher's timer |
//! | `mark_delete.rs` | the mark-delete position: untrack every acknowledged position |
//! | `trim.rs` | retire buckets below the mark-delete ledger |
//! | `merge.rs` | select and merge adjacent buckets |
//! | `recovery.rs` | rebuild the buckets and the runtime index from storage |
//! | `lifecycle.rs` | [`clear`](BucketDelayedDeliveryTracker::clear), [`close`](BucketDelayedDeliveryTracker::close) |
//! | `introspection.rs` | queries, counters, invariant checks, memory estimate |

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::sync::Arc;

use roaring::RoaringBitmap;

use super::bucket::{ImmutableBucket, MutableBucket};
use super::clock::Clock;
use super::config::BucketTrackerConfig;
use super::error::DelayedError;
use super::index::BucketDelayedMessageIndex;
use super::snapshot::{CutSegment, IndexEntry};
use super::storage::BucketSnapshotStorage;
use crate::position::Position;
use crate::sync::Mutex;

mod add;
mod buckets;
mod delivery;
mod introspection;
mod lifecycle;
mod mark_delete;
mod merge;
mod recovery;
mod retry;
mod seal;
mod segment;
mod timer;
mod trim;

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests;

/// Retries of snapshot create and delete after the first attempt (Pulsar's
/// `MaxRetryTimes`).
pub const STORAGE_RETRIES: usize = 3;
/// Most buckets one merge combines (Pulsar `MAX_MERGE_NUM`).
pub const MAX_MERGE_NUM: usize = 4;

/// Counters of background work, for tests and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrackerStats {
    /// Buckets sealed and persisted.
    pub seals: u64,
    /// Seals whose snapshot creation failed (contents kept in the queue).
    pub seal_failures: u64,
    /// Merges committed.
    pub merges: u64,
    /// Merges aborted by a storage failure (sources kept unchanged).
    pub merge_failures: u64,
    /// Buckets removed by trim.
    pub trimmed_buckets: u64,
    /// Segments loaded at a boundary.
    pub segment_loads: u64,
    /// Segment loads that failed (head kept, retried on the next call).
    pub segment_load_failures: u64,
    /// Snapshots deleted.
    pub snapshot_deletes: u64,
    /// Snapshot deletes that failed after all retries.
    pub snapshot_delete_failures: u64,
    /// Buckets restored by recovery.
    pub recovered_buckets: u64,
    /// Buckets recovery skipped and deleted (missing, expired, enclosed,
    /// or corrupt under [`RecoveryPolicy::SkipCorrupt`](super::RecoveryPolicy::SkipCorrupt)).
    pub skipped_buckets: u64,
}

#[derive(Debug)]
pub(crate) struct Inner {
    index: BucketDelayedMessageIndex,
    mutable: MutableBucket,
    /// start ledger → bucket; ranges are disjoint.
    immutable: BTreeMap<i64, ImmutableBucket>,
    shared_queue: BinaryHeap<Reverse<IndexEntry>>,
    /// boundary position → start ledger of its bucket.
    boundaries: HashMap<(i64, u32), i64>,
    mark_delete: Option<Position>,
    /// A [`reset_mark_delete`](BucketDelayedDeliveryTracker::reset_mark_delete)
    /// moved the mark-delete backward since the last clear: a re-added
    /// position may then sit next to its own stale queue entry (or be queued
    /// again by a later segment load), so `NoSecondLiveCopy` is not checked.
    reset_backward: bool,
    last_tick_run_ms: u64,
    closed: bool,
    stats: TrackerStats,
}

/// Bucket-based delayed delivery tracker for one subscription.
///
/// Units: timestamps and `deliver_at` are ms since the epoch as read from the
/// injected [`Clock`]; counts are messages (positions).
///
/// # Concurrency
/// `Send + Sync`. Every method takes `&self`, runs under the one tracker lock
/// and performs its snapshot I/O synchronously under that lock (see the
/// module docs): any thread may call any method, calls are linearised.
/// Typical use: the dispatcher thread calls [`add_message`](Self::add_message)
/// and [`get_scheduled_messages`](Self::get_scheduled_messages); a timer
/// thread calls [`has_message_available`](Self::has_message_available) /
/// [`next_delivery_time`](Self::next_delivery_time); the ack path calls
/// [`update_mark_delete`](Self::update_mark_delete).
#[derive(Debug)]
pub struct BucketDelayedDeliveryTracker {
    config: BucketTrackerConfig,
    clock: Arc<dyn Clock>,
    storage: Arc<dyn BucketSnapshotStorage>,
    inner: Mutex<Inner>,
    /// This tracker's id in its trace lines (`st.trk`).
    // Read only by the recorder (zero-sized without the `trace` feature).
    #[cfg_attr(not(feature = "trace"), allow(dead_code))]
    trace_id: crate::trace::bucket_merge::Id,
}

fn validate_position(ledger_id: i64, entry_id: i64) -> Result<u32, DelayedError> {
    if ledger_id < 0 {
        return Err(DelayedError::InvalidLedgerId { ledger_id });
    }
    u32::try_from(entry_id).map_err(|_| DelayedError::EntryIdOutOfRange {
        ledger_id,
        entry_id,
    })
}

fn union_bitmaps(segments: &[CutSegment]) -> BTreeMap<i64, RoaringBitmap> {
    let mut out: BTreeMap<i64, RoaringBitmap> = BTreeMap::new();
    for s in segments {
        for (l, bm) in &s.bitmaps {
            *out.entry(*l).or_default() |= bm;
        }
    }
    for bm in out.values_mut() {
        bm.optimize();
    }
    out
}

impl BucketDelayedDeliveryTracker {
    /// Creates the tracker and recovers the committed buckets found in
    /// `storage` (Pulsar does this in the constructor; see the module docs
    /// for how missing / expired / corrupt snapshots are handled).
    ///
    /// # Errors
    /// [`DelayedError::InvalidConfig`]; [`DelayedError::Storage`] if listing
    /// or reading snapshots fails; [`DelayedError::CorruptSnapshot`] for a
    /// corrupt snapshot under [`RecoveryPolicy::Fail`](super::RecoveryPolicy::Fail). On error nothing is
    /// returned; storage keeps every snapshot that was not already found
    /// missing/expired/enclosed.
    pub fn new(
        config: BucketTrackerConfig,
        storage: Arc<dyn BucketSnapshotStorage>,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, DelayedError> {
        config.validate()?;
        let tracker = Self {
            config,
            clock,
            storage,
            trace_id: crate::trace::bucket_merge::next_id(),
            inner: Mutex::new(Inner {
                index: BucketDelayedMessageIndex::new(),
                mutable: MutableBucket::new(),
                immutable: BTreeMap::new(),
                shared_queue: BinaryHeap::new(),
                boundaries: HashMap::new(),
                mark_delete: None,
                reset_backward: false,
                last_tick_run_ms: 0,
                closed: false,
                stats: TrackerStats::default(),
            }),
        };
        {
            let mut inner = tracker.inner.lock();
            tracker.recover(&mut inner)?;
            tracker.debug_check(&inner);
        }
        Ok(tracker)
    }

    /// The configuration.
    pub fn config(&self) -> &BucketTrackerConfig {
        &self.config
    }

    fn cutoff(&self) -> u64 {
        let now = self.clock.now_ms();
        if self.config.deliver_at_time_strict {
            now
        } else {
            now.saturating_add(self.config.tick_time_ms)
        }
    }

    /// This tracker's id in its trace lines (`st.trk`; a simulator run
    /// splits its lines into one run per subscription by it).
    #[cfg(feature = "trace")]
    pub fn trace_id(&self) -> u64 {
        self.trace_id
    }

    /// The tracker's state in `specs/BucketMerge.tla`'s terms, for the
    /// trace hooks ([`crate::trace::bucket_merge`]; positions as ledgers;
    /// `trk`: the tracker's [`trace_id`](Self::trace_id)).
    #[cfg(feature = "trace")]
    pub(crate) fn trace_state(&self, inner: &Inner) -> serde_json::Value {
        let mut queue: Vec<i64> = inner.shared_queue.iter().map(|r| r.0.ledger_id).collect();
        queue.sort_unstable();
        let buckets: Vec<[i64; 3]> = inner
            .immutable
            .values()
            .map(|b| {
                let cur = i64::try_from(b.current_segment_entry_id).unwrap_or(i64::MAX);
                [b.ctx.start_ledger_id, b.ctx.end_ledger_id, cur]
            })
            .collect();
        serde_json::json!({
            "clock": self.clock.now_ms(),
            "index": inner.index.ledgers(),
            "counter": inner.index.len(),
            "queue": queue,
            "mheap": inner.mutable.ledgers(),
            "buckets": buckets,
            "trk": self.trace_id,
        })
    }

    fn debug_check(&self, inner: &Inner) {
        debug_assert!(
            inner.index.check(),
            "counter {} != cardinality {}",
            inner.index.len(),
            inner.index.cardinality()
        );
    }
}
