//! Bucket-based delayed delivery: Pulsar's `BucketDelayedDeliveryTracker`
//! (merge keeps every segment, no duplicate delivery, the counter is the
//! runtime bitmap's cardinality) on durable bucket
//! snapshots.
//!
//! A subscription with delayed messages hands every message whose
//! `deliverAt` lies in the future to the tracker instead of dispatching it.
//! The tracker keeps a bounded amount of memory per message by sealing
//! contiguous ledger ranges into **buckets** whose contents are persisted as
//! **snapshots** (protobuf, byte-compatible with Pulsar's `pulsar.delay`
//! protos) and loaded back one **segment** at a time when they become due.
//!
//! ```text
//!  add_message ──► MutableBucket (heap, [start, end]) ──seal──► ImmutableBucket
//!        │                  │ due                                 │ segment 1, then
//!        ▼                  ▼                                     ▼ next at boundary
//!  BucketDelayedMessageIndex ◄──── shared queue (min-heap) ◄───────┘
//!  (ledger → RoaringBitmap + counter: the ONLY runtime truth)
//! ```
//!
//! | type | Pulsar | role |
//! |---|---|---|
//! | [`BucketDelayedDeliveryTracker`] | `BucketDelayedDeliveryTracker` | the tracker (one lock) |
//! | [`BucketDelayedMessageIndex`] | `BucketDelayedMessageIndex` | runtime dedup + count |
//! | [`MutableBucket`], [`ImmutableBucket`], [`BucketContext`] | same names | the buckets |
//! | [`SnapshotMetadata`], [`SnapshotSegmentMetadata`], [`SnapshotSegment`], [`DelayedIndex`] | `DelayedMessageIndexBucketSnapshotFormat` | snapshot protobuf |
//! | [`BucketSnapshotStorage`] | `BucketSnapshotStorage` | snapshot store |
//! | [`RedbSnapshotStorage`], [`MemorySnapshotStorage`], [`FaultyStorage`] | `BookkeeperBucketSnapshotStorage` | durable / test / fault-injecting stores |
//!
//! # Semantics
//!
//! * `add_message` of an already-due message **untracks** it and returns
//!   `false` (dispatch now); a duplicate returns `true` without counting; a
//!   position at or below the mark-delete (acknowledged) returns `false` and
//!   is never tracked, so it is neither counted nor scheduled.
//! * A queue pop delivers a position only if
//!   [`BucketDelayedMessageIndex::untrack`] returns `true`, so duplicate queue
//!   entries are never delivered twice nor counted twice.
//! * Merge reads segments `1..=last` of each source bucket but persists only
//!   indexes that are **still in the runtime index** (nothing already
//!   dispatched is written again); tracked positions queued in the gaps of
//!   the merged range are persisted too, so the merged snapshot covers its
//!   whole range. After the atomic commit the queue entries of the merged
//!   positions are replaced by the merged first segment, so **no position
//!   gets a second live queue entry**.
//! * [`BucketDelayedDeliveryTracker::update_mark_delete`] untracks every
//!   acknowledged position at once (Pulsar keeps them counted until trim),
//!   so the count is exactly the number of pending delayed messages. It only
//!   moves forward; a cursor reset goes through
//!   [`BucketDelayedDeliveryTracker::clear`] (which also forgets the
//!   mark-delete) or [`BucketDelayedDeliveryTracker::reset_mark_delete`]
//!   (which may move it back), so messages re-read below the old mark-delete
//!   are delivered, never counted and then dropped.
//! * A segment that cannot be decoded at runtime is replaced by the
//!   positions of its metadata bitmaps, delivered at the segment's max
//!   timestamp (late, never early, never lost); a transient read failure
//!   keeps the head and is retried on the next call.
//! * Trim untracks every bit of the trimmed bucket's frozen bitmap; recovery
//!   restores each bucket's bitmap into the runtime index.
//! * The tracker is told only the mark-delete, so a position acknowledged
//!   individually above it stays in its bucket's snapshot: recovery restores
//!   it and it is counted and delivered again until popped; the dispatcher
//!   drops it by the cursor's deleted state (as Pulsar's does), and its
//!   re-read after the restart never hands it to the tracker (the spec's
//!   `ReReadSkip`).
//! * The counter ([`BucketDelayedDeliveryTracker::number_of_delayed_messages`])
//!   always equals the runtime index's cardinality (asserted in debug builds
//!   at the end of every public operation and by the tests).
//! * [`BucketDelayedDeliveryTracker::verify_invariants`] checks the spec's
//!   structural invariants on the live tracker (`CounterEqualsCardinality`,
//!   `NoSecondLiveCopy`, plus the bucket and boundary bookkeeping) and
//!   returns the first violated one as a typed [`InvariantViolation`]; an
//!   embedder may run it from a health check (linear in the shared queue and
//!   the buckets, no I/O).
//!
//! # Concurrency contract
//!
//! The tracker is `Send + Sync`; every public method takes `&self`, acquires
//! the one tracker lock (`crate::sync::Mutex`) and releases it before
//! returning. Pulsar runs snapshot I/O asynchronously and re-takes the lock in
//! the callbacks; here [`BucketSnapshotStorage`] is synchronous, so seal,
//! segment loads, merge, trim and delete run *inside* the calling operation,
//! under the lock, in Pulsar's order. Rules:
//!
//! * any thread may call any method (dispatcher thread, timer thread, admin
//!   thread); calls are linearised by the lock;
//! * a [`BucketSnapshotStorage`] implementation must never call back into the
//!   tracker (it runs under the tracker lock);
//! * the [`Clock`] is read under the lock and must not block.
//!
//! # Durability contract
//!
//! A snapshot counts as committed once its cursor property
//! `#pulsar.internal.delayed.bucket_<start>_<end>` is written. With
//! [`RedbSnapshotStorage`] the snapshot entries and that property are written
//! in **one** redb transaction (and a merge replaces its sources in the same
//! transaction), so a process kill shows either the old or the new set of
//! buckets. Messages not in any committed snapshot (the mutable bucket, the
//! shared queue) are rebuilt by the dispatcher re-reading from the
//! mark-delete position and calling `add_message` again, exactly as in Pulsar.
//!
//! # Invariants
//!
//! Unit tests are in `src/delayed/tests.rs`; the model test is
//! `tests/delayed_model.rs` `tracker_matches_model`; traces are
//! `specs/TraceBucketMerge.tla` on `tests/trace_bucket_merge.rs`'s runs
//! and on the simulator's (`.ci/trace` SIM_RUNS:
//! `tests/trace_workloads/node_delayed_bucket_merge.toml`, one run per
//! subscription, seals, segment loads, three-way merges and two restarts
//! whose re-reads interleave with deliveries)
//! (each hook line pins the tracker's state, so every action below is
//! checked step by step).
//!
//! | spec | invariant | functions | tests |
//! |---|---|---|---|
//! | `BucketMerge` | `CounterEqualsCardinality` | `BucketDelayedMessageIndex::untrack`, `BucketDelayedMessageIndex::untrack_all`, [`BucketDelayedDeliveryTracker::verify_invariants`] | `add_get_and_expired_readd_untracks`, `trim_untracks_per_bit`, `tracker_matches_model` |
//! | `BucketMerge` | `NoDoubleDelivery` | [`BucketDelayedDeliveryTracker::get_scheduled_messages`], [`BucketDelayedDeliveryTracker::add_message`] | `merge_keeps_only_undispatched_and_adds_no_second_live_copy`, `add_get_and_expired_readd_untracks`, `tracker_matches_model` |
//! | `BucketMerge` | `NoLoss` | `BucketDelayedDeliveryTracker::merge_sources`, `BucketDelayedDeliveryTracker::recover_bucket`, `BucketDelayedMessageIndex::restore` | `merge_reads_segment_one_so_restart_loses_nothing`, `recovery_restores_into_runtime_index_and_skips_expired`, `merge_persists_gap_positions_so_the_merged_range_is_complete` |
//! | `BucketMerge` | `NoDispatchedRestored` | `BucketDelayedDeliveryTracker::merge_sources` | `merge_keeps_only_undispatched_and_adds_no_second_live_copy` |
//! | `BucketMerge` | `NoSecondLiveCopy` | `BucketDelayedDeliveryTracker::merge`, [`BucketDelayedDeliveryTracker::verify_invariants`] | `merge_keeps_only_undispatched_and_adds_no_second_live_copy`, `tracker_matches_model` |
//!
//! What the rows say: the counter is the runtime index's cardinality
//! (`CounterEqualsCardinality`: `untrack` decrements only a tracked bit,
//! trim's `untrack_all` only tracked bits); no position is delivered twice in
//! a lifetime (`NoDoubleDelivery`: a pop delivers only if `untrack` returned
//! true, an expired re-add untracks); every added, undelivered,
//! unacknowledged position is tracked, across restarts (`NoLoss`: a merge
//! reads segments `1..=last`, recovery restores each bucket's bitmap);
//! nothing dispatched is persisted again (`NoDispatchedRestored`: a merge
//! keeps only indexes still tracked); a tracked position has at most one
//! queue entry (`NoSecondLiveCopy`: a merge drops the merged positions' queue
//! entries before queueing segment 1). The spec's `Trim` action (trim
//! untracks per bit) is `trim_untracks_per_bit`.
//!
//! [`BucketDelayedDeliveryTracker::verify_invariants`] checks
//! `CounterEqualsCardinality` (`InvariantViolation::CounterNotCardinality`)
//! and `NoSecondLiveCopy` (`InvariantViolation::SecondLiveCopy`) on the live
//! tracker: `tracker_matches_model` calls it, and `simulate` runs it after
//! every step that did bucket work (mutant `delayed_merge_second_live_entry`).
//!
//! Trace lines that pin each row: every line's `counter` (mutant
//! `delayed_pop_ignores_untrack` rejected at `Pop`); `Pop` lines'
//! `delivered` and the re-read's `Add` lines after a restart (mutant
//! `delayed_expired_readd_keeps_bit` rejected at `Add`); `Merge` lines'
//! `segs` (mutants `delayed_merge_from_current_plus_one`, rejected also by the
//! simulator's traces alone, and `delayed_merge_persists_dispatched`, both at
//! `Merge`); `Recover` lines' `index` (mutant
//! `delayed_recovery_skips_index_restore` rejected at `Recover`, also by the
//! simulator's traces alone); `Merge` lines' `queue` (mutant
//! `delayed_merge_second_live_entry` rejected at `Merge`); `Trim` lines,
//! recorded by `tests/trace_bucket_merge.rs` only (a simulator run under the
//! faults the spec follows does not trim: `docs/testing.md`, trace layer;
//! mutant `delayed_trim_decrements_every_bit` is not rejected, no tracked bit
//! is left below the mark-delete in these runs).
//!
//! # Recovery of bad snapshots
//!
//! A missing snapshot (dangling cursor property) or a fully expired one is
//! deleted and skipped, as Pulsar does. A corrupt one (bad protobuf, bad
//! roaring bytes, segment count mismatch, ledger outside the bucket range)
//! fails recovery with [`DelayedError::CorruptSnapshot`] under
//! [`RecoveryPolicy::Fail`] (Pulsar: the tracker closes and the broker falls
//! back to the in-memory tracker), or is deleted and skipped under
//! [`RecoveryPolicy::SkipCorrupt`] (its messages are rebuilt by the
//! dispatcher's re-read). Recovery never panics and never counts a position
//! twice (restoring is idempotent).
//!
//! ```
//! use std::sync::Arc;
//! use pulsar_core::delayed::{
//!     BucketDelayedDeliveryTracker, BucketTrackerConfig, VirtualClock, MemorySnapshotStorage,
//! };
//! use pulsar_core::Position;
//!
//! let clock = Arc::new(VirtualClock::new(1_000));
//! let storage = Arc::new(MemorySnapshotStorage::new());
//! let config = BucketTrackerConfig { tick_time_ms: 1, ..BucketTrackerConfig::default() };
//! let tracker = BucketDelayedDeliveryTracker::new(config, storage, clock.clone())?;
//! assert!(tracker.add_message(1, 0, 1_500)?); // delayed until 1500 ms
//! assert!(tracker.add_message(1, 1, 2_000)?);
//! assert!(!tracker.add_message(1, 2, 900)?); // already due: not delayed
//! assert_eq!(tracker.number_of_delayed_messages(), 2);
//! clock.set(1_600);
//! assert_eq!(tracker.get_scheduled_messages(10)?, vec![Position::new(1, 0)]);
//! assert_eq!(tracker.number_of_delayed_messages(), 1);
//! # Ok::<(), pulsar_core::delayed::DelayedError>(())
//! ```

mod bucket;
mod clock;
mod config;
mod error;
mod index;
pub mod snapshot;
mod storage;
pub(crate) mod tracker;

pub use bucket::{BucketContext, ImmutableBucket, MutableBucket};
pub use clock::{Clock, SystemClock, VirtualClock};
pub use config::{BucketTrackerConfig, RecoveryPolicy};
pub use error::{DelayedError, InvariantViolation};
pub use index::BucketDelayedMessageIndex;
pub use snapshot::{
    bucket_key, cut_segments, parse_bucket_key, CutSegment, DelayedIndex, DelayedOperationType,
    IndexEntry, SnapshotMetadata, SnapshotSegment, SnapshotSegmentMetadata, BUCKET_KEY_PREFIX,
};
pub use storage::{
    BucketSnapshotStorage, FaultPlan, FaultyStorage, MemorySnapshotStorage, RawSnapshotEntries,
    RedbSnapshotStorage, SNAPSHOT_ENTRIES_TABLE,
};
pub use tracker::{BucketDelayedDeliveryTracker, TrackerStats};

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests;
