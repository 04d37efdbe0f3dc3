//! # Transactions in the broker core (PIP-31)
//!
//! | here | Pulsar |
//! |---|---|
//! | [`coordinator::Coordinator`] | `MLTransactionMetadataStore` (one transaction coordinator, `tc_id` 0) with its log `MLTransactionLogImpl` |
//! | [`buffer::TxnBuffer`] | `TopicTransactionBuffer` (ongoing transactions, aborted set, max read position) |
//! | the subscription's `PendingAckHandle` | `PendingAckHandleImpl` + `MLPendingAckStore` (`crate::pending_ack`) |
//! | `handlers.rs` | `ServerCnx.handleTcClientConnectRequest` / `handleNewTxn` / `handleAddPartitionToTxn` / `handleAddSubscriptionToTxn` / `handleEndTxn`, and `TransactionMetadataStoreService.endTransaction`'s `END_TXN_ON_PARTITION` / `END_TXN_ON_SUBSCRIPTION` steps, done inside the node |
//!
//! ## Durable state, all on the node's redb store
//!
//! - The coordinator's log: managed ledger
//!   `persistent://pulsar/system/__transaction_log_0`, one
//!   `TransactionMetadataEntry` (Pulsar's bytes) per state change: `NEW`
//!   (Open, timeout), `ADD_PARTITION`, `ADD_SUBSCRIPTION`, `UPDATE`
//!   (Open → Committing/Aborting, then → Committed/Aborted). Recovery reads
//!   it from the start and rebuilds every transaction not yet
//!   Committed/Aborted.
//! - Transactional messages: entries of their topic carrying
//!   `MessageMetadata.txnid_most_bits`/`txnid_least_bits`; the end of a
//!   transaction on a topic is a marker entry (`marker_type` `TXN_COMMIT` /
//!   `TXN_ABORT`, producer `pulsar.txn.marker`, empty payload, as
//!   `Markers.newTxnMarker` writes it). The buffer is rebuilt from its
//!   latest snapshot and the topic's entries after the snapshot's max read
//!   position (see [`buffer`] for the recovery discipline).
//! - Transaction buffer snapshots: Pulsar's `TransactionBufferSnapshot`
//!   (Avro) on the namespace's system topic `__transaction_buffer_snapshot`,
//!   keyed by topic ([`snapshot`] for the bytes, `snapshots.rs` for the
//!   triggers and loading).
//! - Transactional acks: the subscription's pending-ack log
//!   (`<topic>-<sub>__transaction_pending_ack`, cursor
//!   `__pending_ack_state`), replayed by `crate::pending_ack`.
//!
//! ## END_TXN, and a crash between any two of its durable writes
//!
//! 1. the coordinator logs Open → Committing (or Aborting);
//! 2. each partition: its marker appended (`END_TXN_ON_PARTITION`);
//! 3. each subscription: COMMIT (ABORT) appended to its pending-ack log; on
//!    commit the acks are applied to the subscription's cursor and persisted,
//!    then the handle is told (it may trim its log); on abort the positions
//!    go back to the replay set (redelivered) (`END_TXN_ON_SUBSCRIPTION`);
//! 4. the coordinator logs Committing → Committed (Aborting → Aborted); the
//!    client gets `END_TXN_RESPONSE`.
//!
//! The coordinator's log is trimmed (its cursor's mark-delete moves) over
//! the records of transactions whose step 4 is durable, and the buffer's
//! aborted set over ledgers that are gone (see [`coordinator`], [`buffer`]).
//!
//! Recovery finishes every Committing/Aborting transaction by redoing 2–4
//! (each step is idempotent: a partition whose buffer no longer holds the
//! transaction as ongoing gets no second marker; a pending-ack handle that
//! no longer holds the transaction changes nothing). Open transactions stay
//! open until their timeout (`txn_ttl_millis` of `NEW_TXN`), which aborts
//! them through the same steps; timeouts run on [`super::Broker::poll_timeout`]
//! / [`super::Broker::handle_timeout`], never a wall clock.

//!
//! # Invariants
//!
//! | spec | invariant | functions | tests |
//! |---|---|---|---|
//! | `TransactionBufferRecovery` | `NoReadAfterFailure` | [`scan`], [`TxnBuffer::recover`] | `a_read_failure_ends_the_recovery_attempt_and_the_retry_starts_over` |
//! | `TransactionBufferRecovery` | `ReadyImpliesFullyApplied` | [`TxnBuffer::recover`], `Broker::recover_buffer` | `a_read_failure_ends_the_recovery_attempt_and_the_retry_starts_over`, `a_topic_whose_buffer_cannot_recover_is_not_opened_until_its_backoff_passes` |
//! | `TransactionBufferSnapshot` | `SnapshotRecoveryEqualsFullReplay` | [`TxnBuffer::recover_from`], [`TxnBuffer::snapshot`], `Broker::recover_buffer_attempt`, `Broker::take_txn_buffer_snapshot` | `recovery_from_a_snapshot_and_the_tail_equals_a_full_replay`, `a_snapshot_past_an_open_transactions_first_entry_differs_from_a_full_replay`, `recovery_from_the_snapshot_equals_a_full_read_across_a_crash` |
//!
//! How: [`scan`] returns at the first failed read (no further read); a
//! failed recovery returns the error, so the topic is not opened (no
//! partial buffer is ever served); the next attempt starts again (from the
//! snapshot's max read position, or the first entry; nothing kept between
//! attempts) after a per-topic backoff; reading the snapshot topic is part
//! of the attempt. A snapshot records the max read position (before the
//! first entry of the oldest open transaction) and the aborted set at one
//! instant, and recovery starts with that set and reads every entry after
//! that position. Not modelled: the coordinator, its log trimming and the
//! END_TXN crash points (unit tests:
//! `a_crash_after_each_durable_write_of_end_txn_is_finished_by_recovery`,
//! `an_open_transaction_survives_a_crash_and_commits_after_it`,
//! `the_log_is_trimmed_as_transactions_end_and_no_sequence_is_reused`);
//! trimming the aborted set as ledgers are deleted
//! (`the_aborted_set_is_trimmed_when_the_ledger_of_the_abort_marker_is_gone`).

pub mod buffer;
pub mod coordinator;
mod handlers;
pub mod snapshot;
mod snapshots;

use std::collections::BTreeMap;
// Ownership handles use std's Arc in every build (see `ledger::managed_ledger`).
use std::sync::Arc;

use crate::ledger::{Entry, LedgerError, ManagedLedger};
use crate::pending_ack::{ExecutorMode, ReplayExecutorPool, VirtualTimer};
use crate::Position;

pub use crate::pending_ack::TxnId;
pub use buffer::{entry_txn, EntryTxn, TxnBuffer};
pub use coordinator::{Coordinator, TxnError, TxnMeta};
pub(crate) use handlers::txn_ack_response as handlers_ack_response;
pub use snapshot::{SnapshotConfig, TransactionBufferSnapshot};

/// Topic-name prefix of the coordinator's assignment topic
/// (`transaction_coordinator_assign`, its partitions are the coordinators).
pub const TC_ASSIGN_TOPIC: &str = "persistent://pulsar/system/transaction_coordinator_assign";

/// Entries read per batch by a recovery scan.
pub const SCAN_BATCH: usize = 100;

/// Reads every entry of `ml` after `after` in position order, in batches of
/// [`SCAN_BATCH`], handing each to `f`. A read failure ends the scan at
/// once (no read after it) with the failure; the caller's attempt is then
/// incomplete and must not be reported complete.
///
/// # Errors
/// The first read failure.
pub fn scan(
    ml: &ManagedLedger,
    after: Position,
    mut f: impl FnMut(&Entry),
) -> Result<u64, LedgerError> {
    let mut at = after;
    let mut n = 0u64;
    loop {
        let lac = ml.last_confirmed_entry();
        let mut ps = Vec::with_capacity(SCAN_BATCH);
        let mut p = at;
        while ps.len() < SCAN_BATCH {
            let next = ml.next_valid_position(p);
            if next > lac {
                break;
            }
            ps.push(next);
            p = next;
        }
        let Some(last) = ps.last().copied() else {
            return Ok(n);
        };
        for e in ml.read_positions(&ps)? {
            f(&e);
            n += 1;
        }
        at = last;
    }
}

/// The position before the first entry of `ml` (where a full scan starts).
pub fn before_first(ml: &ManagedLedger) -> Position {
    ml.ledgers()
        .first()
        .map_or(Position::new(0, -1), |(id, _)| Position::new(*id, -1))
}

/// Backoff of a failed recovery (coordinator log or transaction buffer):
/// Pulsar's pending-ack handle backoff (100 ms doubling to 60 s).
pub(crate) fn backoff_ms(failures: u32) -> u64 {
    100u64.saturating_mul(1u64 << failures.min(10)).min(60_000)
}

/// The broker's transaction machinery: the coordinator (opened on first
/// use, retried with backoff while its log cannot be read), the pending-ack
/// handles' executor and timer (driven by the core's inputs: manual
/// executor, virtual timer at the core's clock), and the backoff of topics
/// whose transaction buffer could not recover.
pub(crate) struct TxnRuntime {
    pub(crate) coordinator: Option<Coordinator>,
    pub(crate) coordinator_failures: u32,
    pub(crate) coordinator_retry_at: u64,
    pub(crate) pool: Arc<ReplayExecutorPool>,
    pub(crate) timer: Arc<VirtualTimer>,
    /// Topic → (failed recoveries, earliest next attempt).
    pub(crate) buffer_retry: BTreeMap<String, (u32, u64)>,
    /// When transaction buffers take snapshots.
    pub(crate) snapshot_config: snapshot::SnapshotConfig,
    /// Snapshot topic → key → position of its latest snapshot message.
    pub(crate) snapshot_index: BTreeMap<String, BTreeMap<String, Position>>,
    /// Topic → its snapshot bookkeeping.
    pub(crate) snapshot_book: BTreeMap<String, snapshots::SnapshotBook>,
    /// `sequence_id` of the last snapshot message written.
    pub(crate) snapshot_seq: u64,
}

impl TxnRuntime {
    pub(crate) fn new(now_ms: u64, snapshot_config: snapshot::SnapshotConfig) -> Self {
        let timer = Arc::new(VirtualTimer::new());
        timer.advance_to(now_ms);
        Self {
            coordinator: None,
            coordinator_failures: 0,
            coordinator_retry_at: 0,
            // A manual executor: replay attempts run inside the core's inputs.
            pool: ReplayExecutorPool::new(1, ExecutorMode::Manual)
                .expect("one manual executor is a valid pool"),
            timer,
            buffer_retry: BTreeMap::new(),
            snapshot_config,
            snapshot_index: BTreeMap::new(),
            snapshot_book: BTreeMap::new(),
            snapshot_seq: 0,
        }
    }
}
