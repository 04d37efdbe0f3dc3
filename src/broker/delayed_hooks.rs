//! The delayed tracker's boundary to its embedder:
//!
//! - [`SnapshotStorageHook`]: what the bucket snapshots of a subscription
//!   are written to. The core builds a [`RedbSnapshotStorage`] on its store
//!   (Pulsar's `BookkeeperBucketSnapshotStorage`); the hook may wrap it (a
//!   storage with its own latency or failures, or one that logs its
//!   committed creates and deletes) and returns what the tracker uses.
//! - [`DelayedObserver`] (feature `sim` only: test instrumentation, absent
//!   from an embedder's `default-features = false` build): told, right
//!   after it returns, of every call the core makes into a subscription's
//!   tracker (open/recovery, add, scheduled, mark-delete, clear), so a
//!   driver can keep what the tracker must hold next to what it was told
//!   (`sim::delayed_truth`). It never changes what the core does.

use std::fmt;
// Ownership handles use std's Arc in every build (see `ledger::managed_ledger`).
use std::sync::Arc;

use crate::delayed::{BucketSnapshotStorage, RedbSnapshotStorage};

/// Builds a subscription's bucket snapshot storage from the core's
/// (`(topic, subscription, storage on the core's store)`).
#[derive(Clone)]
#[allow(clippy::type_complexity)]
pub struct SnapshotStorageHook(
    pub Arc<dyn Fn(&str, &str, RedbSnapshotStorage) -> Arc<dyn BucketSnapshotStorage> + Send + Sync>,
);

impl SnapshotStorageHook {
    /// A hook from a closure.
    pub fn new(
        f: impl Fn(&str, &str, RedbSnapshotStorage) -> Arc<dyn BucketSnapshotStorage>
            + Send
            + Sync
            + 'static,
    ) -> Self {
        Self(Arc::new(f))
    }

    pub(crate) fn storage(
        &self,
        topic: &str,
        subscription: &str,
        redb: RedbSnapshotStorage,
    ) -> Arc<dyn BucketSnapshotStorage> {
        (self.0)(topic, subscription, redb)
    }
}

impl fmt::Debug for SnapshotStorageHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SnapshotStorageHook")
    }
}

#[cfg(feature = "sim")]
pub use observer::{DelayedObserver, TrackerCall};

#[cfg(feature = "sim")]
mod observer {
    use std::fmt;
    use std::sync::Arc;

    use crate::delayed::BucketDelayedDeliveryTracker;
    use crate::Position;

    /// One call the core made into a subscription's delayed tracker,
    /// reported right after it returned.
    #[derive(Debug)]
    pub enum TrackerCall<'a> {
        /// The tracker was built (recovered from the snapshot storage) and
        /// given the subscription's mark-delete.
        Opened {
            /// The recovered mark-delete it was given.
            mark_delete: Position,
        },
        /// `add_message(position, deliver_at)` returned `result` (`None`:
        /// an error, nothing tracked).
        Added {
            /// The entry.
            position: Position,
            /// Its delivery time, epoch ms.
            deliver_at: u64,
            /// `Some(true)`: tracked; `Some(false)`: due, dispatch now.
            result: Option<bool>,
        },
        /// `get_scheduled_messages` handed out these positions.
        Scheduled(&'a [Position]),
        /// `update_mark_delete(position)`.
        MarkDelete(Position),
        /// `clear()` (a clear-backlog) returned (`ok`: every bucket removed).
        Cleared {
            /// Whether it succeeded.
            ok: bool,
        },
    }

    /// Receives `(topic, subscription, call, tracker)` for every tracker
    /// call of the core. It must not call back into the core.
    #[derive(Clone)]
    #[allow(clippy::type_complexity)]
    pub struct DelayedObserver(
        pub Arc<dyn Fn(&str, &str, TrackerCall<'_>, &BucketDelayedDeliveryTracker) + Send + Sync>,
    );

    impl DelayedObserver {
        /// An observer from a closure.
        pub fn new(
            f: impl Fn(&str, &str, TrackerCall<'_>, &BucketDelayedDeliveryTracker)
                + Send
                + Sync
                + 'static,
        ) -> Self {
            Self(Arc::new(f))
        }
    }

    impl fmt::Debug for DelayedObserver {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("DelayedObserver")
        }
    }
}

/// What a subscription reports to the observer (nothing without `sim`).
#[derive(Clone, Default)]
pub(crate) struct TrackerWatch {
    #[cfg(feature = "sim")]
    pub(crate) observer: Option<(String, DelayedObserver)>,
}

impl fmt::Debug for TrackerWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TrackerWatch")
    }
}

/// Reports `$call` (a [`TrackerCall`]) of subscription `$sub` to its
/// observer, if any; compiles to nothing without feature `sim`.
macro_rules! observe_tracker {
    ($sub:expr, $call:expr) => {{
        #[cfg(feature = "sim")]
        {
            let s: &$crate::broker::subscription::Subscription = $sub;
            if let Some((topic, o)) = &s.watch.observer {
                (o.0)(topic, &s.name, $call, &s.tracker);
            }
        }
    }};
}
pub(crate) use observe_tracker;

impl super::BrokerConfig {
    /// Opens (or recovers) subscription `name` of `ml` with these settings:
    /// its tracker's snapshots in the store (through
    /// [`snapshot_storage`](super::BrokerConfig::snapshot_storage) when set),
    /// its tracker calls reported to the observer (feature `sim`).
    ///
    /// # Errors
    /// As [`super::subscription::Subscription::open_with`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn open_subscription(
        &self,
        store: &crate::ledger::RedbStore,
        ml: &Arc<crate::ledger::ManagedLedger>,
        name: &str,
        sub_type: i32,
        earliest: bool,
        clock: Arc<dyn crate::delayed::Clock>,
        now_ms: u64,
    ) -> Result<super::subscription::Subscription, super::BrokerError> {
        let redb =
            RedbSnapshotStorage::new(store.clone(), ml.name(), name).map_err(super::error::comp)?;
        let storage: Arc<dyn BucketSnapshotStorage> = match &self.snapshot_storage {
            Some(h) => h.storage(ml.name(), name, redb),
            None => Arc::new(redb),
        };
        #[allow(unused_mut)]
        let mut watch = TrackerWatch::default();
        #[cfg(feature = "sim")]
        {
            watch.observer = self
                .delayed_observer
                .clone()
                .map(|o| (ml.name().to_string(), o));
        }
        super::subscription::Subscription::open_on_storage(
            ml,
            name,
            sub_type,
            earliest,
            clock,
            now_ms,
            self.delayed.clone(),
            storage,
            watch,
        )
    }
}
