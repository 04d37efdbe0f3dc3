//! Pulsar's delayed-delivery configuration knobs and their defaults.

use super::error::DelayedError;

/// What recovery does with a corrupt snapshot (bad protobuf, bad roaring
/// bytes, segment count mismatch, ledger outside the bucket range).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RecoveryPolicy {
    /// Pulsar's behaviour: recovery fails with the typed error and the
    /// caller falls back (Pulsar: the factory uses the in-memory tracker).
    /// Storage is left untouched.
    #[default]
    Fail,
    /// Delete the corrupt snapshot (and its cursor property) and continue;
    /// its messages are rebuilt by the dispatcher's re-read.
    SkipCorrupt,
}

/// Configuration of [`super::BucketDelayedDeliveryTracker`]; the defaults are
/// Pulsar's `ServiceConfiguration` defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketTrackerConfig {
    /// `delayedDeliveryTickTimeMillis` (ms, default 1000): delivery may happen
    /// up to one tick early unless strict; also the timer tick.
    pub tick_time_ms: u64,
    /// `isDelayedDeliveryDeliverAtTimeStrict` (default false): cutoff is `now`
    /// instead of `now + tick`.
    pub deliver_at_time_strict: bool,
    /// `delayedDeliveryMinIndexCountPerBucket` (entries, default 50000): the
    /// mutable bucket is sealed only once it holds this many indexes.
    pub min_index_count_per_bucket: u64,
    /// `delayedDeliveryMaxTimeStepPerBucketSnapshotSegmentSeconds` converted
    /// to ms (default 300 s = 300000 ms): a segment spans at most this time.
    pub max_time_step_per_bucket_snapshot_segment_ms: u64,
    /// `delayedDeliveryMaxIndexesPerBucketSnapshotSegment` (indexes, default
    /// 5000, −1 = unlimited).
    pub max_indexes_per_bucket_snapshot_segment: i64,
    /// `delayedDeliveryMaxNumBuckets` (default −1; ≤ 0 disables merge and trim
    /// after seal).
    pub max_num_buckets: i64,
    /// What recovery does with corrupt snapshots.
    pub recovery_policy: RecoveryPolicy,
}

impl Default for BucketTrackerConfig {
    fn default() -> Self {
        Self {
            tick_time_ms: 1000,
            deliver_at_time_strict: false,
            min_index_count_per_bucket: 50_000,
            max_time_step_per_bucket_snapshot_segment_ms: 300_000,
            max_indexes_per_bucket_snapshot_segment: 5000,
            max_num_buckets: -1,
            recovery_policy: RecoveryPolicy::Fail,
        }
    }
}

impl BucketTrackerConfig {
    /// Checks the values.
    ///
    /// # Errors
    /// [`DelayedError::InvalidConfig`] if the time step is 0, the max
    /// indexes per segment is 0 or below −1, or the min index count is 0.
    pub fn validate(&self) -> Result<(), DelayedError> {
        if self.max_time_step_per_bucket_snapshot_segment_ms == 0 {
            return Err(DelayedError::InvalidConfig(
                "max_time_step_per_bucket_snapshot_segment_ms must be > 0".into(),
            ));
        }
        if self.max_indexes_per_bucket_snapshot_segment == 0
            || self.max_indexes_per_bucket_snapshot_segment < -1
        {
            return Err(DelayedError::InvalidConfig(
                "max_indexes_per_bucket_snapshot_segment must be -1 or > 0".into(),
            ));
        }
        if self.min_index_count_per_bucket == 0 {
            return Err(DelayedError::InvalidConfig(
                "min_index_count_per_bucket must be > 0".into(),
            ));
        }
        Ok(())
    }
}
