//! [`BucketDelayedDeliveryTracker`]: the bucket-based delayed delivery
//! tracker (Pulsar `BucketDelayedDeliveryTracker`, with the semantics of
//! seed 000: merge keeps segment 1, no duplicate delivery, counter = runtime
//! bitmap cardinality).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::sync::Arc;

use roaring::RoaringBitmap;

use super::bucket::{BucketContext, ImmutableBucket, MutableBucket};
use super::clock::Clock;
use super::config::{BucketTrackerConfig, RecoveryPolicy};
use super::error::DelayedError;
use super::index::BucketDelayedMessageIndex;
use super::snapshot::{
    cut_segments, decode_segment_bitmaps, parse_bucket_key, CutSegment, IndexEntry,
    SnapshotMetadata, SnapshotSegment,
};
use super::storage::BucketSnapshotStorage;
use crate::position::Position;
use crate::sync::Mutex;

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
    /// or corrupt under [`RecoveryPolicy::SkipCorrupt`]).
    pub skipped_buckets: u64,
}

#[derive(Debug)]
struct Inner {
    index: BucketDelayedMessageIndex,
    mutable: MutableBucket,
    /// start ledger → bucket; ranges are disjoint.
    immutable: BTreeMap<i64, ImmutableBucket>,
    shared_queue: BinaryHeap<Reverse<IndexEntry>>,
    /// boundary position → start ledger of its bucket.
    boundaries: HashMap<(i64, u32), i64>,
    mark_delete: Option<Position>,
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
    /// corrupt snapshot under [`RecoveryPolicy::Fail`]. On error nothing is
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
            inner: Mutex::new(Inner {
                index: BucketDelayedMessageIndex::new(),
                mutable: MutableBucket::new(),
                immutable: BTreeMap::new(),
                shared_queue: BinaryHeap::new(),
                boundaries: HashMap::new(),
                mark_delete: None,
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

    fn debug_check(&self, inner: &Inner) {
        debug_assert!(
            inner.index.check(),
            "counter {} != cardinality {}",
            inner.index.len(),
            inner.index.cardinality()
        );
    }

    // ------------------------------------------------------------ add

    /// Tracks message `(ledger_id, entry_id)` to be delivered at
    /// `deliver_at_ms` (Pulsar `addMessage`).
    ///
    /// Returns `Ok(false)` if the message is not tracked as delayed: it is
    /// already due (`deliver_at_ms < 0` or `≤ cutoff`; it is untracked if it
    /// was tracked, and the caller dispatches it now), or it is at or below
    /// the mark-delete recorded by
    /// [`update_mark_delete`](Self::update_mark_delete) (already
    /// acknowledged: it is neither counted nor ever scheduled; the
    /// dispatcher's deletion check drops it, as Pulsar's does after a read).
    /// Returns `Ok(true)` if it is tracked (or already was: a duplicate is
    /// not counted twice). So the count always equals what
    /// [`get_scheduled_messages`](Self::get_scheduled_messages) will deliver. May seal the mutable bucket (and
    /// then trim + merge) synchronously; a snapshot failure there never fails
    /// the add (the sealed messages stay in memory and are still delivered).
    ///
    /// # Errors
    /// [`DelayedError::EntryIdOutOfRange`] (entry id outside `0..=u32::MAX`),
    /// [`DelayedError::InvalidLedgerId`], [`DelayedError::Closed`]; state
    /// unchanged.
    pub fn add_message(
        &self,
        ledger_id: i64,
        entry_id: i64,
        deliver_at_ms: i64,
    ) -> Result<bool, DelayedError> {
        let entry = validate_position(ledger_id, entry_id)?;
        let mut inner = self.inner.lock();
        if inner.closed {
            return Err(DelayedError::Closed);
        }
        let cutoff = self.cutoff();
        let acknowledged = inner
            .mark_delete
            .is_some_and(|md| Position::new(ledger_id, entry_id) <= md);
        if acknowledged || deliver_at_ms < 0 || deliver_at_ms as u64 <= cutoff {
            // An expired re-add must not leave its bit behind. A
            // position at or below the mark-delete is never tracked (nothing
            // tracked lies there: `update_mark_delete` untracked it), so the
            // count only holds what will be delivered.
            inner.index.untrack(ledger_id, entry);
            self.debug_check(&inner);
            return Ok(false);
        }
        if inner.index.contains(ledger_id, entry) {
            return Ok(true);
        }
        let idx = IndexEntry {
            timestamp: deliver_at_ms as u64,
            ledger_id,
            entry_id: entry,
        };
        let exist_bucket = Self::find_bucket(&inner, ledger_id).is_some();
        let mctx = inner.mutable.context();
        if !exist_bucket && ledger_id > mctx.end_ledger_id && !inner.mutable.is_empty() {
            if inner.mutable.len() as u64 >= self.config.min_index_count_per_bucket {
                self.seal(&mut inner);
                if self.config.max_num_buckets > 0
                    && inner.immutable.len() as i64 > self.config.max_num_buckets
                {
                    self.trim(&mut inner);
                    self.merge(&mut inner);
                }
            } else if Self::spans_bucket(&inner, mctx.start_ledger_id, ledger_id) {
                // Deviation from Pulsar (which would seal overlapping ranges):
                // extending the mutable range past an immutable bucket would
                // enclose it, so hand the small heap to the shared queue
                // (never persisted, rebuilt by the dispatcher's re-read).
                let Inner {
                    mutable,
                    shared_queue,
                    ..
                } = &mut *inner;
                let (_, rest) = mutable.take_sorted();
                shared_queue.extend(rest.into_iter().map(Reverse));
            }
        } else if !exist_bucket
            && ledger_id > mctx.end_ledger_id
            && inner.mutable.is_empty()
            && mctx != BucketContext::EMPTY
            && Self::spans_bucket(&inner, mctx.start_ledger_id, ledger_id)
        {
            inner.mutable.reset_range();
        }
        let mctx = inner.mutable.context();
        if ledger_id >= mctx.end_ledger_id && !exist_bucket {
            inner.mutable.add(idx);
        } else {
            inner.shared_queue.push(Reverse(idx));
        }
        inner.index.track(ledger_id, entry);
        self.debug_check(&inner);
        Ok(true)
    }

    /// Registers a persisted bucket (seal or merge result) whose snapshot is
    /// `id`, and loads its segment 1 into the shared queue.
    ///
    /// `segments` must be non-empty (both callers return early otherwise).
    fn register_bucket(
        inner: &mut Inner,
        ctx: BucketContext,
        id: i64,
        count: u64,
        frozen_bitmap: BTreeMap<i64, RoaringBitmap>,
        segments: Vec<CutSegment>,
    ) {
        let bucket = ImmutableBucket {
            ctx,
            snapshot_id: id,
            current_segment_entry_id: 1,
            last_segment_entry_id: segments.len() as u64,
            number_bucket_delayed_messages: count,
            first_schedule_timestamps: segments.iter().map(|s| s.min_schedule_timestamp).collect(),
            frozen_bitmap,
            merging: false,
            boundary: None,
        };
        inner.immutable.insert(ctx.start_ledger_id, bucket);
        if let Some(first) = segments.into_iter().next() {
            Self::install_segment(inner, ctx.start_ledger_id, first.indexes);
        }
    }

    fn find_bucket(inner: &Inner, ledger_id: i64) -> Option<i64> {
        inner
            .immutable
            .range(..=ledger_id)
            .next_back()
            .filter(|(_, b)| b.ctx.contains(ledger_id))
            .map(|(s, _)| *s)
    }

    /// Whether some immutable bucket starts inside `(start, ledger_id]`.
    /// Whether the ledger range `[start, end]` overlaps any immutable bucket.
    /// Buckets are disjoint and keyed by start, so only the last bucket
    /// starting at or before `end` can overlap.
    fn spans_bucket(inner: &Inner, start: i64, end: i64) -> bool {
        start >= 0
            && inner
                .immutable
                .range(..=end)
                .next_back()
                .is_some_and(|(_, b)| b.ctx.end_ledger_id >= start)
    }

    // ------------------------------------------------------------ seal

    fn seal(&self, inner: &mut Inner) {
        let (tracked_range, indexes) = inner.mutable.take_sorted();
        // The bucket covers the ledgers its indexes actually hold. The
        // mutable range can be wider (its start survives entries that became
        // due and moved to the shared queue); sealing that wider range could
        // overlap an immutable bucket, which recovery cannot tell apart from
        // a half-finished merge (found by tests/delayed_model.rs).
        let (Some(first), Some(last)) = (
            indexes.iter().map(|i| i.ledger_id).min(),
            indexes.iter().map(|i| i.ledger_id).max(),
        ) else {
            return;
        };
        let ctx = BucketContext {
            start_ledger_id: first.max(tracked_range.start_ledger_id),
            end_ledger_id: last,
        };
        if Self::spans_bucket(inner, ctx.start_ledger_id, ctx.end_ledger_id) {
            // Still overlapping: keep these indexes live in the shared queue
            // (never persisted; the dispatcher's re-read rebuilds them).
            inner.shared_queue.extend(indexes.into_iter().map(Reverse));
            return;
        }
        let count = indexes.len() as u64;
        let segments = cut_segments(
            indexes,
            self.config.max_time_step_per_bucket_snapshot_segment_ms,
            self.config.max_indexes_per_bucket_snapshot_segment,
        );
        if segments.is_empty() {
            return;
        }
        let metadata = SnapshotMetadata {
            metadata_list: segments.iter().map(CutSegment::to_metadata).collect(),
        };
        let protos: Vec<SnapshotSegment> = segments.iter().map(CutSegment::to_proto).collect();
        let key = ctx.key();
        match self.create_with_retries(&metadata, &protos, &key, &[]) {
            Ok(id) => {
                let frozen = union_bitmaps(&segments);
                Self::register_bucket(inner, ctx, id, count, frozen, segments);
                inner.stats.seals += 1;
                tracing::debug!(bucket = %key, snapshot_id = id, count, "sealed bucket");
            }
            Err(e) => {
                // Pulsar: on create failure every segment stays in the shared
                // queue and the bucket is dropped; the runtime index still
                // tracks the messages, so they are delivered and counted.
                tracing::warn!(bucket = %key, error = %e, "bucket snapshot create failed; keeping its messages in memory");
                for s in segments {
                    inner
                        .shared_queue
                        .extend(s.indexes.into_iter().map(Reverse));
                }
                inner.stats.seal_failures += 1;
            }
        }
    }

    /// Pushes a loaded segment into the shared queue and sets the bucket's
    /// boundary to its last index.
    fn install_segment(inner: &mut Inner, bucket_start: i64, indexes: Vec<IndexEntry>) {
        let last = indexes.last().copied();
        inner.shared_queue.extend(indexes.into_iter().map(Reverse));
        Self::set_boundary(inner, bucket_start, last);
    }

    fn set_boundary(inner: &mut Inner, bucket_start: i64, last: Option<IndexEntry>) {
        let Some(bucket) = inner.immutable.get_mut(&bucket_start) else {
            return;
        };
        if let Some(old) = bucket.boundary.take() {
            inner.boundaries.remove(&(old.ledger_id, old.entry_id));
        }
        bucket.boundary = last;
        if let Some(b) = last {
            inner
                .boundaries
                .insert((b.ledger_id, b.entry_id), bucket_start);
        }
    }

    fn remove_bucket(inner: &mut Inner, bucket_start: i64) -> Option<ImmutableBucket> {
        let bucket = inner.immutable.remove(&bucket_start)?;
        if let Some(b) = bucket.boundary {
            inner.boundaries.remove(&(b.ledger_id, b.entry_id));
        }
        Some(bucket)
    }

    fn create_with_retries(
        &self,
        metadata: &SnapshotMetadata,
        segments: &[SnapshotSegment],
        key: &str,
        replaces: &[(i64, String)],
    ) -> Result<i64, DelayedError> {
        let mut last = None;
        for _ in 0..=STORAGE_RETRIES {
            match self.storage.create(metadata, segments, key, replaces) {
                Ok(id) => return Ok(id),
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("the loop runs at least once"))
    }

    fn delete_with_retries(&self, inner: &mut Inner, snapshot_id: i64, key: &str) -> bool {
        let mut last = None;
        for _ in 0..=STORAGE_RETRIES {
            match self.storage.delete(snapshot_id, key) {
                Ok(()) => {
                    inner.stats.snapshot_deletes += 1;
                    return true;
                }
                Err(e) => last = Some(e),
            }
        }
        inner.stats.snapshot_delete_failures += 1;
        if let Some(e) = last {
            tracing::warn!(snapshot_id, bucket = key, error = %e, "bucket snapshot delete failed");
        }
        false
    }

    // ------------------------------------------------------------ delivery

    /// Returns up to `max` positions that are due (Pulsar
    /// `getScheduledMessages`), sorted by `(ledger_id, entry_id)`, and
    /// untracks them. Loads the next segment of a bucket when its boundary
    /// reaches the head of the queue; a failed load keeps the head and stops
    /// (retried on the next call). Queue entries in ledgers below the
    /// mark-delete ledger are discarded without waiting for their time (their
    /// positions are acknowledged, hence no longer tracked nor counted). A
    /// position is returned only if it was still tracked (duplicate and stale
    /// queue entries are skipped), so every counted message is returned once.
    ///
    /// # Errors
    /// [`DelayedError::Closed`].
    pub fn get_scheduled_messages(&self, max: usize) -> Result<Vec<Position>, DelayedError> {
        let mut inner = self.inner.lock();
        if inner.closed {
            return Err(DelayedError::Closed);
        }
        let cutoff = self.cutoff();
        let first_live = inner.mark_delete.map(|p| p.ledger_id);
        {
            let Inner {
                mutable,
                shared_queue,
                ..
            } = &mut *inner;
            mutable.move_due(cutoff, |i| shared_queue.push(Reverse(i)));
        }
        let mut out = Vec::new();
        let mut n = max;
        while n > 0 {
            let Some(&Reverse(head)) = inner.shared_queue.peek() else {
                break;
            };
            let key = (head.ledger_id, head.entry_id);
            let orphan = first_live.is_some_and(|fl| head.ledger_id < fl);
            if !orphan && head.timestamp > cutoff {
                break;
            }
            if let Some(&start) = inner.boundaries.get(&key) {
                // The loaded segment is exhausted up to its last index: load
                // the next one (or retire the bucket). Also for an orphaned
                // boundary, so later segments are not stranded.
                if !self.load_next_segment(&mut inner, start) {
                    break;
                }
                continue;
            }
            inner.shared_queue.pop();
            let tracked = inner.index.untrack(head.ledger_id, head.entry_id);
            if tracked && !orphan {
                out.push(Position::new(head.ledger_id, i64::from(head.entry_id)));
                n -= 1;
            }
        }
        out.sort_unstable();
        self.debug_check(&inner);
        Ok(out)
    }

    /// Loads segment `current + 1` of bucket `start` (or retires the bucket
    /// after its last segment). Returns whether the head may be consumed.
    fn load_next_segment(&self, inner: &mut Inner, start: i64) -> bool {
        let Some(bucket) = inner.immutable.get(&start) else {
            return true;
        };
        if bucket.merging {
            return false;
        }
        let next = bucket.current_segment_entry_id + 1;
        let (id, key, last) = (
            bucket.snapshot_id,
            bucket.ctx.key(),
            bucket.last_segment_entry_id,
        );
        if next > last {
            Self::remove_bucket(inner, start);
            self.delete_with_retries(inner, id, &key);
            return true;
        }
        match self.read_segment(id, next) {
            Ok(indexes) => {
                if let Some(b) = inner.immutable.get_mut(&start) {
                    b.current_segment_entry_id = next;
                }
                Self::install_segment(inner, start, indexes);
                inner.stats.segment_loads += 1;
                true
            }
            Err(
                e @ (DelayedError::CorruptSnapshot { .. } | DelayedError::SnapshotNotFound { .. }),
            ) => {
                // The segment can never be read: fall back to its metadata
                // bitmaps and deliver those positions no earlier than the
                // segment's max timestamp (late, never early, never lost).
                tracing::error!(snapshot_id = id, segment = next, error = %e, "unreadable bucket segment");
                match self.storage.get_metadata(id) {
                    Ok(meta) => match meta
                        .metadata_list
                        .get(next as usize - 1)
                        .ok_or_else(|| DelayedError::CorruptSnapshot {
                            snapshot_id: id,
                            reason: "segment metadata missing".into(),
                        })
                        .and_then(|m| {
                            decode_segment_bitmaps(id, m).map(|b| (m.max_schedule_timestamp, b))
                        }) {
                        Ok((ts, bitmaps)) => {
                            let mut indexes: Vec<IndexEntry> = bitmaps
                                .iter()
                                .flat_map(|(l, bm)| {
                                    bm.iter().map(move |e| IndexEntry {
                                        timestamp: ts,
                                        ledger_id: *l,
                                        entry_id: e,
                                    })
                                })
                                .collect();
                            indexes.sort_unstable();
                            if let Some(b) = inner.immutable.get_mut(&start) {
                                b.current_segment_entry_id = next;
                            }
                            Self::install_segment(inner, start, indexes);
                            true
                        }
                        Err(e) => {
                            tracing::error!(snapshot_id = id, error = %e, "bucket metadata unreadable too");
                            inner.stats.segment_load_failures += 1;
                            false
                        }
                    },
                    Err(e) => {
                        tracing::warn!(snapshot_id = id, error = %e, "bucket metadata read failed");
                        inner.stats.segment_load_failures += 1;
                        false
                    }
                }
            }
            Err(e) => {
                tracing::warn!(snapshot_id = id, segment = next, error = %e, "segment load failed; will retry");
                inner.stats.segment_load_failures += 1;
                false
            }
        }
    }

    fn read_segment(&self, id: i64, segment: u64) -> Result<Vec<IndexEntry>, DelayedError> {
        let segs = self.storage.get_segments(id, segment, segment)?;
        let seg = segs
            .into_iter()
            .next()
            .ok_or(DelayedError::CorruptSnapshot {
                snapshot_id: id,
                reason: format!("segment {segment} missing"),
            })?;
        let mut v = seg
            .indexes
            .iter()
            .map(|d| IndexEntry::from_proto(id, d))
            .collect::<Result<Vec<_>, _>>()?;
        v.sort_unstable();
        Ok(v)
    }

    /// Earliest delivery time (ms) among the queued and mutable messages
    /// (Pulsar `nextDeliveryTime`); `None` (= +∞) if both heaps are empty.
    /// The count may be > 0 with only unloaded segments left.
    pub fn next_delivery_time(&self) -> Option<u64> {
        let inner = self.inner.lock();
        Self::next_delivery(&inner)
    }

    fn next_delivery(inner: &Inner) -> Option<u64> {
        let a = inner.shared_queue.peek().map(|r| r.0.timestamp);
        let b = inner.mutable.peek().map(|i| i.timestamp);
        match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether a message is deliverable now (Pulsar `hasMessageAvailable`):
    /// `count > 0 && next_delivery_time ≤ cutoff`.
    pub fn has_message_available(&self) -> bool {
        let inner = self.inner.lock();
        !inner.closed
            && !inner.index.is_empty()
            && Self::next_delivery(&inner).is_some_and(|t| t <= self.cutoff())
    }

    /// How long (ms) the dispatcher's timer should wait before the next read
    /// (Pulsar `updateTimer`): `None` when nothing is tracked, the target is
    /// unknown (+∞) or already past; otherwise
    /// `max(target − now, last_tick_run + tick − now)`.
    pub fn next_timer_delay_ms(&self) -> Option<u64> {
        let inner = self.inner.lock();
        if inner.closed || inner.index.is_empty() {
            return None;
        }
        let target = Self::next_delivery(&inner)?;
        let now = self.clock.now_ms();
        if target <= now {
            return None;
        }
        let tick_floor = inner
            .last_tick_run_ms
            .saturating_add(self.config.tick_time_ms)
            .saturating_sub(now);
        Some((target - now).max(tick_floor))
    }

    /// The timer fired (Pulsar `run`): moves due mutable entries to the
    /// shared queue and records the tick time. The caller then asks the
    /// dispatcher to read.
    pub fn on_timer_fired(&self) {
        let mut inner = self.inner.lock();
        let cutoff = self.cutoff();
        let now = self.clock.now_ms();
        let Inner {
            mutable,
            shared_queue,
            last_tick_run_ms,
            ..
        } = &mut *inner;
        mutable.move_due(cutoff, |i| shared_queue.push(Reverse(i)));
        *last_tick_run_ms = now;
    }

    /// Number of tracked delayed messages (the runtime index's counter).
    pub fn number_of_delayed_messages(&self) -> u64 {
        self.inner.lock().index.len()
    }

    /// Whether `(ledger_id, entry_id)` is tracked (Pulsar `containsMessage`);
    /// `false` for positions that cannot be tracked.
    pub fn contains_message(&self, ledger_id: i64, entry_id: i64) -> bool {
        match validate_position(ledger_id, entry_id) {
            Ok(e) => self.inner.lock().index.contains(ledger_id, e),
            Err(_) => false,
        }
    }

    /// Records the subscription's mark-delete position (Pulsar reads it from
    /// the cursor; call it after construction and whenever it advances): its
    /// ledger is `firstLive` for trim and for dropping orphaned queue entries,
    /// and every tracked position `<= position` is untracked, and later
    /// [`add_message`](Self::add_message) calls at or below it return
    /// `Ok(false)` without tracking: the tracker never schedules nor counts an
    /// acknowledged position (Pulsar keeps them counted until trim and relies
    /// on the dispatcher's deletion check).
    ///
    /// Only moves forward: a position at or below the recorded one is
    /// ignored, so a late call from a racing ack path cannot move it back. A
    /// cursor reset (seek) to an earlier position must instead call
    /// [`clear`](Self::clear) (which forgets the mark-delete) or
    /// [`reset_mark_delete`](Self::reset_mark_delete); otherwise messages
    /// re-added below the old mark-delete would be counted but never
    /// delivered.
    pub fn update_mark_delete(&self, position: Position) {
        let mut inner = self.inner.lock();
        if inner.mark_delete.is_none_or(|p| position > p) {
            Self::set_mark_delete(&mut inner, position);
        }
        self.debug_check(&inner);
    }

    /// Records the mark-delete position after a cursor reset (Pulsar's
    /// `resetCursor` / seek; Pulsar's tracker reads the cursor's mark-delete
    /// live, so it follows a reset in both directions). Unlike
    /// [`update_mark_delete`](Self::update_mark_delete) it also moves
    /// **backward**: the tracked messages are kept (all of them lie above
    /// the old mark-delete, hence above the new one) and messages the
    /// dispatcher re-reads between the new and the old mark-delete can be
    /// added and are delivered when due. Moving forward untracks every
    /// position `<= position`, as `update_mark_delete` does.
    ///
    /// Call it from the thread that resets the cursor, before the dispatcher
    /// re-reads from the new read position.
    pub fn reset_mark_delete(&self, position: Position) {
        let mut inner = self.inner.lock();
        Self::set_mark_delete(&mut inner, position);
        self.debug_check(&inner);
    }

    fn set_mark_delete(inner: &mut Inner, position: Position) {
        inner.mark_delete = Some(position);
        inner
            .index
            .untrack_up_to(position.ledger_id, position.entry_id);
    }

    // ------------------------------------------------------------ trim / merge

    /// Runs trim then one merge now (Pulsar runs this chain after a seal when
    /// `max_num_buckets` is exceeded; exposed for admin use and tests).
    /// Returns whether a merge committed.
    ///
    /// # Errors
    /// [`DelayedError::Closed`].
    pub fn trim_and_merge(&self) -> Result<bool, DelayedError> {
        let mut inner = self.inner.lock();
        if inner.closed {
            return Err(DelayedError::Closed);
        }
        self.trim(&mut inner);
        let merged = self.merge(&mut inner);
        self.debug_check(&inner);
        Ok(merged)
    }

    /// Deletes, one at a time in ledger order, the buckets whose whole range
    /// lies below the mark-delete ledger; stops at the first delete failure.
    /// Each trimmed bucket's frozen bitmap is untracked bit by bit.
    fn trim(&self, inner: &mut Inner) -> usize {
        let Some(first_live) = inner.mark_delete.map(|p| p.ledger_id) else {
            return 0;
        };
        let candidates: Vec<i64> = inner
            .immutable
            .values()
            .filter(|b| b.ctx.end_ledger_id < first_live && !b.merging)
            .map(|b| b.ctx.start_ledger_id)
            .collect();
        let mut trimmed = 0;
        for start in candidates {
            let (id, key) = {
                let b = &inner.immutable[&start];
                (b.snapshot_id, b.ctx.key())
            };
            if !self.delete_with_retries(inner, id, &key) {
                break;
            }
            if let Some(b) = Self::remove_bucket(inner, start) {
                for (l, bm) in &b.frozen_bitmap {
                    inner.index.untrack_all(*l, bm);
                }
            }
            inner.stats.trimmed_buckets += 1;
            trimmed += 1;
        }
        trimmed
    }

    /// Pulsar's merge selection: windows of `k = min(4, n)` adjacent buckets
    /// (then `k − 1` down to 2); eligible if every bucket has an unloaded
    /// segment and none is merging (and, here, the merged range would not
    /// enclose the mutable bucket's range); the winner has the smallest
    /// message sum (ties to the right) among windows whose earliest next
    /// segment timestamp improves on the running minimum.
    fn select_merge(&self, inner: &Inner) -> Option<Vec<i64>> {
        let buckets: Vec<&ImmutableBucket> = inner.immutable.values().collect();
        let n = buckets.len();
        if n < 2 {
            return None;
        }
        let mctx = inner.mutable.context();
        let mut k = MAX_MERGE_NUM.min(n);
        while k >= 2 {
            let mut best: Option<usize> = None;
            let mut min_sum = u64::MAX;
            let mut min_ts = u64::MAX;
            for i in 0..=(n - k) {
                let w = &buckets[i..i + k];
                let eligible = w
                    .iter()
                    .all(|b| b.last_segment_entry_id > b.current_segment_entry_id && !b.merging);
                let lo = w[0].ctx.start_ledger_id;
                let hi = w[k - 1].ctx.end_ledger_id;
                let encloses_mutable = mctx != BucketContext::EMPTY
                    && mctx.start_ledger_id <= hi
                    && lo <= mctx.end_ledger_id;
                if !eligible || encloses_mutable {
                    continue;
                }
                let sum: u64 = w.iter().map(|b| b.number_bucket_delayed_messages).sum();
                let ts = w
                    .iter()
                    .map(|b| b.next_unloaded_timestamp())
                    .min()
                    .unwrap_or(u64::MAX);
                if sum <= min_sum && ts < min_ts {
                    min_sum = sum;
                    min_ts = ts;
                    best = Some(i);
                }
            }
            if let Some(i) = best {
                return Some(
                    buckets[i..i + k]
                        .iter()
                        .map(|b| b.ctx.start_ledger_id)
                        .collect(),
                );
            }
            k -= 1;
        }
        None
    }

    /// Merge execution: read segments 1..=last of each
    /// source (plus tracked queued positions in the range's gaps), keep only
    /// indexes still in the runtime index, build one snapshot over
    /// `[first.start, last.end]`, commit it replacing the sources atomically,
    /// then replace the queue entries of its positions by its first segment
    /// (no second live entry). Any storage failure aborts the merge with the
    /// sources unchanged.
    fn merge(&self, inner: &mut Inner) -> bool {
        let Some(sources) = self.select_merge(inner) else {
            return false;
        };
        for s in &sources {
            if let Some(b) = inner.immutable.get_mut(s) {
                b.merging = true;
            }
        }
        let result = self.merge_sources(inner, &sources);
        for s in &sources {
            if let Some(b) = inner.immutable.get_mut(s) {
                b.merging = false;
            }
        }
        match result {
            Ok(()) => {
                inner.stats.merges += 1;
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "bucket merge aborted; sources unchanged");
                inner.stats.merge_failures += 1;
                false
            }
        }
    }

    fn merge_sources(&self, inner: &mut Inner, sources: &[i64]) -> Result<(), DelayedError> {
        let mut kept: Vec<IndexEntry> = Vec::new();
        let mut replaces = Vec::with_capacity(sources.len());
        for s in sources {
            let b = &inner.immutable[s];
            let segs = self
                .storage
                .get_segments(b.snapshot_id, 1, b.last_segment_entry_id)?;
            if segs.len() as u64 != b.last_segment_entry_id {
                return Err(DelayedError::CorruptSnapshot {
                    snapshot_id: b.snapshot_id,
                    reason: format!(
                        "expected {} segments, read {}",
                        b.last_segment_entry_id,
                        segs.len()
                    ),
                });
            }
            for seg in &segs {
                for d in &seg.indexes {
                    let idx = IndexEntry::from_proto(b.snapshot_id, d)?;
                    // Nothing already dispatched is persisted again (no duplicate delivery).
                    if inner.index.contains(idx.ledger_id, idx.entry_id) {
                        kept.push(idx);
                    }
                }
            }
            replaces.push((b.snapshot_id, b.ctx.key()));
        }
        let ctx = BucketContext {
            start_ledger_id: inner.immutable[&sources[0]].ctx.start_ledger_id,
            end_ledger_id: inner.immutable[&sources[sources.len() - 1]]
                .ctx
                .end_ledger_id,
        };
        // Tracked positions queued inside the merged range but in no source
        // snapshot (gaps between the sources: failed seals, late adds) are
        // persisted too, so the merged snapshot covers its whole range.
        let in_source = |l: i64, e: u32| {
            sources.iter().any(|s| {
                inner.immutable[s]
                    .frozen_bitmap
                    .get(&l)
                    .is_some_and(|bm| bm.contains(e))
            })
        };
        kept.extend(inner.shared_queue.iter().map(|r| r.0).filter(|i| {
            ctx.contains(i.ledger_id)
                && inner.index.contains(i.ledger_id, i.entry_id)
                && !in_source(i.ledger_id, i.entry_id)
        }));
        kept.sort_unstable();
        kept.dedup();
        let count = kept.len() as u64;
        let segments = cut_segments(
            kept,
            self.config.max_time_step_per_bucket_snapshot_segment_ms,
            self.config.max_indexes_per_bucket_snapshot_segment,
        );
        if segments.is_empty() {
            // Everything was dispatched: just retire the sources.
            for (s, (id, key)) in sources.iter().zip(&replaces) {
                if !self.delete_with_retries(inner, *id, key) {
                    return Err(DelayedError::storage(
                        "delete",
                        "merge source delete failed",
                    ));
                }
                Self::remove_bucket(inner, *s);
            }
            return Ok(());
        }
        let metadata = SnapshotMetadata {
            metadata_list: segments.iter().map(CutSegment::to_metadata).collect(),
        };
        let protos: Vec<SnapshotSegment> = segments.iter().map(CutSegment::to_proto).collect();
        let key = ctx.key();
        let id = self.create_with_retries(&metadata, &protos, &key, &replaces)?;
        // Committed: the merged bucket replaces its sources. Its positions
        // are live again only through its first segment: drop their queue
        // entries (the sources' loaded segments, gap entries) and queue
        // segment 1, so no position gets a second live entry.
        for s in sources {
            Self::remove_bucket(inner, *s);
        }
        let frozen = union_bitmaps(&segments);
        inner.shared_queue.retain(|r| {
            !frozen
                .get(&r.0.ledger_id)
                .is_some_and(|bm| bm.contains(r.0.entry_id))
        });
        Self::register_bucket(inner, ctx, id, count, frozen, segments);
        tracing::debug!(bucket = %key, snapshot_id = id, count, "merged buckets");
        Ok(())
    }

    // ------------------------------------------------------------ recovery

    fn recover(&self, inner: &mut Inner) -> Result<(), DelayedError> {
        let keys = self.storage.bucket_keys()?;
        let mut ranges: Vec<((i64, i64), String, i64)> = keys
            .into_iter()
            .filter_map(|(k, id)| parse_bucket_key(&k).map(|r| (r, k, id)))
            .collect();
        // Enclosing ranges first: sort by start ascending, end descending.
        ranges.sort_by(|a, b| a.0 .0.cmp(&b.0 .0).then(b.0 .1.cmp(&a.0 .1)));
        let mut kept: Vec<((i64, i64), String, i64)> = Vec::new();
        for r in ranges {
            match kept.last() {
                Some(((_, pe), _, _)) if r.0 .1 <= *pe => {
                    // Enclosed by a kept range: a merge source left behind.
                    self.delete_with_retries(inner, r.2, &r.1);
                    inner.stats.skipped_buckets += 1;
                }
                Some(((_, pe), _, _)) if r.0 .0 <= *pe => {
                    tracing::warn!(bucket = %r.1, "bucket range overlaps another; ignored");
                    inner.stats.skipped_buckets += 1;
                }
                _ => kept.push(r),
            }
        }
        let cutoff = self.cutoff();
        for ((start, end), key, id) in kept {
            match self.recover_bucket(start, end, id, cutoff) {
                Ok(Some((bucket, first_indexes))) => {
                    for (l, bm) in &bucket.frozen_bitmap {
                        inner.index.restore(*l, bm);
                    }
                    inner.immutable.insert(start, bucket);
                    Self::install_segment(inner, start, first_indexes);
                    inner.stats.recovered_buckets += 1;
                }
                Ok(None) => {
                    // Fully expired: its messages are re-read and dispatched.
                    self.delete_with_retries(inner, id, &key);
                    inner.stats.skipped_buckets += 1;
                }
                Err(DelayedError::SnapshotNotFound { .. }) => {
                    tracing::warn!(bucket = %key, snapshot_id = id, "dangling bucket key; removing");
                    self.delete_with_retries(inner, id, &key);
                    inner.stats.skipped_buckets += 1;
                }
                Err(e @ DelayedError::CorruptSnapshot { .. }) => {
                    match self.config.recovery_policy {
                        RecoveryPolicy::Fail => return Err(e),
                        RecoveryPolicy::SkipCorrupt => {
                            tracing::error!(bucket = %key, error = %e, "corrupt bucket snapshot skipped and deleted");
                            self.delete_with_retries(inner, id, &key);
                            inner.stats.skipped_buckets += 1;
                        }
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Reads one bucket: skips leading segments with `max ≤ cutoff`, rebuilds
    /// the bitmap from the rest and loads the first remaining segment.
    #[allow(clippy::type_complexity)]
    fn recover_bucket(
        &self,
        start: i64,
        end: i64,
        id: i64,
        cutoff: u64,
    ) -> Result<Option<(ImmutableBucket, Vec<IndexEntry>)>, DelayedError> {
        let meta = self.storage.get_metadata(id)?;
        let n = meta.metadata_list.len() as u64;
        let stored = self.storage.length(id)?;
        if stored != n {
            return Err(DelayedError::CorruptSnapshot {
                snapshot_id: id,
                reason: format!("metadata lists {n} segments, snapshot has {stored}"),
            });
        }
        let ctx = BucketContext {
            start_ledger_id: start,
            end_ledger_id: end,
        };
        let first_remaining = meta
            .metadata_list
            .iter()
            .position(|m| m.max_schedule_timestamp > cutoff);
        let Some(first_remaining) = first_remaining else {
            return Ok(None);
        };
        let mut frozen: BTreeMap<i64, RoaringBitmap> = BTreeMap::new();
        let mut count = 0u64;
        for m in &meta.metadata_list[first_remaining..] {
            for (l, bm) in decode_segment_bitmaps(id, m)? {
                if !ctx.contains(l) {
                    return Err(DelayedError::CorruptSnapshot {
                        snapshot_id: id,
                        reason: format!("ledger {l} outside bucket range [{start}, {end}]"),
                    });
                }
                count += bm.len();
                *frozen.entry(l).or_default() |= bm;
            }
        }
        for bm in frozen.values_mut() {
            bm.optimize();
        }
        let current = first_remaining as u64 + 1;
        let first_indexes = self.read_segment(id, current)?;
        if let Some(bad) = first_indexes.iter().find(|i| !ctx.contains(i.ledger_id)) {
            return Err(DelayedError::CorruptSnapshot {
                snapshot_id: id,
                reason: format!(
                    "segment index ledger {} outside bucket range",
                    bad.ledger_id
                ),
            });
        }
        let bucket = ImmutableBucket {
            ctx,
            snapshot_id: id,
            current_segment_entry_id: current,
            last_segment_entry_id: n,
            number_bucket_delayed_messages: count,
            first_schedule_timestamps: meta
                .metadata_list
                .iter()
                .map(|m| m.min_schedule_timestamp)
                .collect(),
            frozen_bitmap: frozen,
            merging: false,
            boundary: None,
        };
        Ok(Some((bucket, first_indexes)))
    }

    // ------------------------------------------------------------ clear / close

    /// Deletes every bucket snapshot and forgets every tracked message
    /// (Pulsar `clear`, e.g. on clear-backlog or a cursor reset) **and the
    /// recorded mark-delete**: give the cursor's current mark-delete again
    /// with [`update_mark_delete`](Self::update_mark_delete) (any position is
    /// accepted after a clear, also one below the previous mark-delete), so
    /// messages the dispatcher re-reads after a reset are delivered.
    ///
    /// # Errors
    /// [`DelayedError::Storage`] if a snapshot delete fails after retries:
    /// buckets deleted so far are removed (their bits untracked), the rest
    /// and the in-memory messages are kept, so the state stays consistent;
    /// [`DelayedError::Closed`].
    pub fn clear(&self) -> Result<(), DelayedError> {
        let mut inner = self.inner.lock();
        if inner.closed {
            return Err(DelayedError::Closed);
        }
        let starts: Vec<i64> = inner.immutable.keys().copied().collect();
        for s in starts {
            let (id, key) = {
                let b = &inner.immutable[&s];
                (b.snapshot_id, b.ctx.key())
            };
            if !self.delete_with_retries(&mut inner, id, &key) {
                self.debug_check(&inner);
                return Err(DelayedError::storage(
                    "delete",
                    format!("clearing bucket {key}"),
                ));
            }
            if let Some(b) = Self::remove_bucket(&mut inner, s) {
                for (l, bm) in &b.frozen_bitmap {
                    inner.index.untrack_all(*l, bm);
                }
            }
        }
        inner.index.clear();
        inner.shared_queue = BinaryHeap::new();
        inner.boundaries.clear();
        inner.mutable.clear();
        // Pulsar reads the mark-delete live from the cursor; a stale one kept
        // here would make every re-added message below it an orphan
        // (counted, then dropped undelivered).
        inner.mark_delete = None;
        Ok(())
    }

    /// Closes the tracker (Pulsar `close`): frees the heaps and the index,
    /// keeps every snapshot for the next recovery. Later calls fail with
    /// [`DelayedError::Closed`] (queries return empty/zero). Idempotent.
    pub fn close(&self) {
        let mut inner = self.inner.lock();
        inner.closed = true;
        inner.shared_queue = BinaryHeap::new();
        inner.mutable.clear();
        inner.index.clear();
        inner.immutable.clear();
        inner.boundaries.clear();
    }

    // ------------------------------------------------------------ introspection

    /// Background-work counters.
    pub fn stats(&self) -> TrackerStats {
        self.inner.lock().stats
    }

    /// The immutable buckets as `(range, snapshot id, current segment, last
    /// segment)`, in ledger order.
    pub fn buckets(&self) -> Vec<(BucketContext, i64, u64, u64)> {
        self.inner
            .lock()
            .immutable
            .values()
            .map(|b| {
                (
                    b.ctx,
                    b.snapshot_id,
                    b.current_segment_entry_id,
                    b.last_segment_entry_id,
                )
            })
            .collect()
    }

    /// Entries in the shared queue (including duplicates not yet skipped).
    pub fn shared_queue_len(&self) -> usize {
        self.inner.lock().shared_queue.len()
    }

    /// Checks the internal invariants: counter == cardinality, bucket ranges
    /// disjoint, every boundary maps to its bucket, `1 ≤ current ≤ last`.
    ///
    /// # Errors
    /// A description of the first violated invariant.
    pub fn verify_invariants(&self) -> Result<(), String> {
        let inner = self.inner.lock();
        if !inner.index.check() {
            return Err(format!(
                "counter {} != cardinality {}",
                inner.index.len(),
                inner.index.cardinality()
            ));
        }
        let mut prev_end = i64::MIN;
        for (s, b) in &inner.immutable {
            if *s != b.ctx.start_ledger_id || b.ctx.start_ledger_id <= prev_end {
                return Err(format!("bucket {} overlaps or is misfiled", b.ctx.key()));
            }
            prev_end = b.ctx.end_ledger_id;
            if b.current_segment_entry_id == 0
                || b.current_segment_entry_id > b.last_segment_entry_id
            {
                return Err(format!("bucket {} has bad segment cursor", b.ctx.key()));
            }
            if let Some(bd) = b.boundary {
                if inner.boundaries.get(&(bd.ledger_id, bd.entry_id)) != Some(s) {
                    return Err(format!("bucket {} boundary not registered", b.ctx.key()));
                }
            }
        }
        for (pos, s) in &inner.boundaries {
            let ok = inner
                .immutable
                .get(s)
                .and_then(|b| b.boundary)
                .is_some_and(|b| (b.ledger_id, b.entry_id) == *pos);
            if !ok {
                return Err(format!("stale boundary {pos:?}"));
            }
        }
        Ok(())
    }

    /// Approximate bytes held by the tracker's in-memory structures (heaps'
    /// capacity, bitmaps' serialized size, boundary map), for reports.
    pub fn approx_memory_bytes(&self) -> usize {
        let inner = self.inner.lock();
        let q = inner.shared_queue.capacity() * std::mem::size_of::<IndexEntry>();
        let idx: usize = inner
            .index
            .iter()
            .map(|(_, b)| b.serialized_size() + 48)
            .sum();
        let frozen: usize = inner
            .immutable
            .values()
            .map(|b| b.frozen_bitmap_bytes() + 128)
            .sum();
        q + idx + frozen + inner.mutable.heap_capacity_bytes() + inner.boundaries.capacity() * 24
    }
}
