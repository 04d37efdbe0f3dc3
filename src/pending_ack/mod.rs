//! Pending-ack replay: rebuilding a subscription's transactional
//! pending acks from its pending-ack log, with a replay that ends every
//! failed attempt, never issues a read after a failure, rewinds the cursor,
//! and retries transient failures with backoff on a timer instead of
//! spinning on a shared replay thread.
//!
//! The pieces, bottom-up:
//!
//! - [`record`]: the log records (individual/cumulative ACK, COMMIT, ABORT,
//!   keyed by [`TxnId`]) in Pulsar's `TransactionPendingAck.proto` bytes
//!   (proto2 presence, unpacked `ack_set`), single and batched (`0x0e01`,
//!   version 1).
//! - `ReplayAttempt` (internal; the models reach it through the hidden
//!   `pulsar_core::__model`): one attempt's read pipeline (`fill_queue`,
//!   `read_complete`, `read_failed`, `stop_replay`) and end-of-attempt
//!   rules; [`classify`] decides which failures complete the replay.
//! - [`ReadDispatcher`]: where issued reads run: [`InlineReads`] (the
//!   completion re-enters the replay thread) or a [`ReaderThread`].
//! - [`SubscriptionView`]: the handle's view of its subscription's cursor
//!   (live: what it already deleted; durable: what its persisted mark-delete
//!   and individually deleted ranges hold), implemented by
//!   [`CursorSubscription`] (a [`ManagedCursor`](crate::ledger::ManagedCursor)
//!   with its [`CursorDeletionState`](crate::deletion::CursorDeletionState))
//!   and [`MemorySubscription`]. A transactional ack of a position the
//!   subscription deleted is a conflict (Pulsar's
//!   `TransactionConflictException`); the log is trimmed only past commits
//!   the subscription holds durably
//!   ([`PendingAckHandle::subscription_persisted`]), and the commits a
//!   replay recovers that it does not are handed back
//!   ([`PendingAckHandle::committed_acks`], [`CommittedAck`]) to be
//!   re-applied, so a committed ack survives a crash before the
//!   subscription cursor is persisted.
//! - [`PendingAckHandle`]: state machine None/Initializing/Ready/Error/Close,
//!   [`Backoff`] retries on an injectable [`Timer`] ([`VirtualTimer`] in
//!   tests), [`ReadyWaiter`]s that always complete, idempotent handlers
//!   ([`PendingAckState`]).
//! - [`ReplayExecutorPool`]: a few single-threaded executors shared by many
//!   handles (assigned by hash).
//! - [`BufferedWriter`]: batched appends with a one-shot re-armed flush
//!   timer; a failed attempt closes it (cancelling the timer).
//!
//! ```
//! use std::sync::Arc;
//! use pulsar_core::ledger::{LedgerConfig, ManagedLedger, MemoryStore};
//! use pulsar_core::pending_ack::*;
//!
//! let store = Arc::new(MemoryStore::new());
//! let ml = ManagedLedger::open("t-sub__transaction_pending_ack", LedgerConfig::default(), store)?;
//! let t = TxnId::new(0, 1);
//! let p = pulsar_core::Position::new(3, 0);
//! ml.append(&PendingAckRecord::individual_ack(t, vec![AckedPosition::whole(p)]).encode())?;
//! let cursor = Arc::new(ml.open_cursor("__pending_ack_state")?);
//! let pool = ReplayExecutorPool::new(1, ExecutorMode::Manual)?;
//! let timer = Arc::new(VirtualTimer::new());
//! let handle = PendingAckHandle::new("t-sub", cursor, Arc::new(MemorySubscription::default()), &pool, Arc::new(InlineReads), timer, HandleConfig::default())?;
//! let waiter = handle.ready_waiter();
//! handle.init();
//! pool.run_pending();
//! assert_eq!(waiter.try_result(), Some(Ok(())));
//! assert_eq!(handle.summary().individual[&t].len(), 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Invariants
//!
//! | spec | invariant | functions | tests |
//! |---|---|---|---|
//! | `PendingAckReplay` | `NoReadAfterFailure` | `ReplayAttempt::fill_queue`, `ReplayAttempt::read_failed` | `failed_attempt_issues_exactly_one_read`, `negative_control_reader_order_reversed_is_caught`, `negative_control_writer_order_reversed_is_caught` |
//! | `PendingAckReplay` | `CompleteImpliesFullyApplied` | `ReplayAttempt::run`, `ReplayAttempt::fill_queue` | `drained_check_never_loses_the_last_read`, `failed_attempt_rewinds_so_the_retry_applies_every_record` |
//! | `PendingAckReplay` | `RewindBeforeRetry` | `ReplayAttempt::run` | `reused_cursor_with_read_position_past_the_log_replays_from_the_mark_delete` |
//! | `PendingAckReplay` | `ReadyImpliesCaughtUp` | `ReplayAttempt::run`, `ReplayAttempt::drained_end` | `an_attempt_that_runs_dry_short_of_the_log_end_is_never_ready` |
//! | `PendingAckReplay` | `LateReadsChangeNothing` | [`ReadJob::run`], `ReplayAttempt::stop_replay` | `close_with_a_lost_read_callback_frees_the_executor_and_a_late_callback_changes_nothing`, `late_entries_of_a_closed_attempt_are_released_not_applied`, `late_read_after_stop_never_moves_the_cursor`, `negative_control_late_read_without_gate_is_caught` |
//! | `PendingAckReplay` | `CloseFreesExecutor`, `AttemptEnds` | [`PendingAckHandle::close`], `ReplayAttempt::interrupt` | `close_with_a_lost_read_callback_frees_the_executor_and_a_late_callback_changes_nothing`, `handles_on_one_executor_random`, `handles_on_one_executor_pct` |
//! | `PendingAckReplay` | `HandleSettles` | `PendingAckHandle::schedule_retry`, `PendingAckHandle::give_up`, `PendingAckHandle::cursor_reopen_failed` | `closed_cursor_is_reopened_through_the_managed_ledger_on_the_redb_store`, `closed_cursor_that_cannot_reopen_fails_waiters_after_a_bounded_number_of_attempts` |
//! | `PendingAckReplayBatch` | `RefusedOnlyOnConflict`, `PendingKeptUntilResolved`, `NoPendingDeleted` | [`PendingAckState::check`], [`PendingAckState::apply_checked`] | `disjoint_batch_indexes_of_one_entry_by_two_txns_are_both_pending`, `replay_of_batch_index_acks_rebuilds_the_same_state`, `batch_index_acks_match_the_reference_model` |
//! | `PendingAckReplayDurable` | `CommittedAckDurable` | [`PendingAckState::take_trim`], [`PendingAckHandle::committed_acks`] | `a_committed_ack_survives_a_crash_before_the_subscription_is_persisted`, `a_committed_cumulative_ack_survives_a_crash_before_the_subscription_is_persisted`, `replay_and_appends_trim_the_log_up_to_the_oldest_unresolved_entry` |
//! | `PendingAckReplayDurable` | `PendingNotDeleted` | [`PendingAckHandle::append`] | `a_transactional_ack_of_an_entry_the_subscription_deleted_is_a_conflict` |
//!
//! How: `fill_queue` loads the counter before the flag and `read_failed`
//! stores the flag before the counter (`NoReadAfterFailure`); a stored
//! failure before catching up fails the attempt and `fill_queue`'s drained
//! check is fresh (`CompleteImpliesFullyApplied`); `run` rewinds at attempt
//! start and on failure (`RewindBeforeRetry`) and ends a dry attempt short
//! of the log end with [`PendingAckError::IncompleteReplay`]
//! (`ReadyImpliesCaughtUp`); [`ReadJob::run`] reads under the attempt's
//! read gate, which `stop_replay` closes (`LateReadsChangeNothing`);
//! [`PendingAckHandle::close`] interrupts the attempt and the failure path
//! never waits for outstanding reads (`CloseFreesExecutor`, `AttemptEnds`);
//! the handle retries or gives up, and a closed cursor is reopened or given
//! up after [`HandleConfig::max_cursor_reopen_attempts`] (`HandleSettles`).
//! The log bytes equal protoc's for `TransactionPendingAck.proto`
//! ([`record::PendingAckRecord::encode`], [`record::encode_batch`],
//! [`record::decode_entry`]; golden bytes per record kind and value class in
//! `tests/pending_ack_wire.rs`); no spec models them.
//!
//! The log is trimmed past an entry only once the [`SubscriptionView`]
//! holds that entry's commits durably, and the replay hands back every
//! commit the subscription lacks (`CommittedAckDurable`; a real crash on
//! the redb store between the commit and the subscription's persist in
//! `tests/pending_ack_subscription.rs`; simulator rule "committed ack lost
//! in a restart", mutant `pending_ack_trim_before_apply`). A transactional
//! ack of a position the subscription deleted is refused before anything is
//! written ([`PendingAckError::AckConflict`], holder `None`;
//! `PendingNotDeleted`, mutant `pending_ack_ack_of_deleted_accepted`).
//!
//! Trace validation: `specs/TracePendingAckReplay.tla` on the runs of
//! `tests/trace_pending_ack.rs` (one thread), `tests/trace_pending_ack_threads.rs`
//! (shuttle: replay, reader and timer threads) and the simulator. Each
//! `FqCount`/`FqFlag` line pins the value loaded (mutants
//! `pending_ack_fill_queue_reversed_order`, `pending_ack_read_failed_reversed_order`,
//! `pending_ack_unclassified_failure_only_logs` are rejected); `REnd` pins
//! the outcome (mutant `pending_ack_every_failure_fails_attempt` rejected at
//! `REnd`); `HStart`/`REnd` pin the rewound read position, in runs with a
//! moved cursor (mutants `pending_ack_failed_attempt_no_rewind`,
//! `pending_ack_partial_replay_reported_complete` rejected at `HStart`);
//! `REnd` and `HDone` check `ReadyImpliesCaughtUp`, and the trace cfg also
//! checks `RunSettles` (every recorded run ends Ready or Error, the trace
//! form of `HandleSettles`). `LateReadsChangeNothing` has its hooks in place
//! (`EnvTake`/`ReadOk` of a stopped attempt), but no recorded run loses a
//! callback yet; `CloseFreesExecutor` and `AttemptEnds` are liveness, which
//! finite traces cannot check; the batch-index invariants have no trace.
//!
//! Checks: `specs/PendingAckReplay.tla` (protocol, with bug cfgs),
//! `specs/PendingAckReplayBatch.tla` (batch-index acks),
//! `specs/PendingAckReplayDurable.tla` (the log and the subscription
//! cursor's persisted state across a crash between any two durable writes;
//! bug cfgs trim-before-apply and no conflict check),
//! `loom-tests/pending_ack.rs` (the real `fill_queue`/`read_failed`
//! orderings), `shuttle-tests/pending_ack.rs` (several handles on one
//! executor), `tests/pending_ack_scenarios.rs` (virtual-time scenarios),
//! trace validation (`bash .ci/trace PendingAckReplay`: the hooks of
//! `src/trace.rs`'s `pending_ack` module, feature `trace`, named after the
//! spec's actions, record the handle's own runs; TLC checks the spec can
//! follow every line). Three sources: the one-thread recorder
//! (`tests/trace_pending_ack.rs`), shuttle schedules of the replay on its
//! executor thread racing a [`ReaderThread`] and the retry timer
//! (`tests/trace_pending_ack_threads.rs`), and the simulator's own handles
//! (`pulsar-core simulate --trace-dir`: txn-outage and a no-loss variant;
//! each hook line names its handle, the engine writes its log and start
//! position; runs cut short by a broker restart are validated as
//! prefixes). Not traced yet: a lost-ledger run with auto-skip on (the
//! managed ledger skips the lost entries inside the read, as Pulsar's
//! `OpReadEntry` does, and the replay ends drained, explained by auto-skip;
//! the spec models auto-skip as a completing read failure instead), a log
//! only partly lost (the spec's `lost` is the whole log; the simulator's
//! trace writer drops those runs), lost callbacks, closed-cursor reopening.

mod backoff;
mod error;
mod executor;
mod handle;
mod reader;
pub mod record;
pub(crate) mod replay;
mod state;
mod subscription;
mod timer;
mod writer;

pub use backoff::{Backoff, BackoffConfig};
pub use error::PendingAckError;
pub use executor::{ExecutorMode, ExecutorTask, ReplayExecutor, ReplayExecutorPool};
pub use handle::{HandleConfig, HandleState, HandleStats, PendingAckHandle, ReadyWaiter};
pub use reader::{InlineReads, ReaderThread};
pub use record::{
    decode_entry, encode_batch, AckType, AckedPosition, PendingAckOp, PendingAckRecord, TxnId,
};
pub use replay::{
    classify, FailureDisposition, ReadDispatcher, ReadJob, ReplayConfig, ReplayReport, ReplaySink,
};
pub use state::{PendingAckState, PendingAckSummary};
pub use subscription::{CommittedAck, CursorSubscription, MemorySubscription, SubscriptionView};
#[cfg(not(any(loom, feature = "shuttle")))]
pub use timer::SystemTimer;
pub use timer::{Timer, TimerId, TimerTask, VirtualTimer};
pub use writer::{AppendAck, AppendCallback, BufferedWriter, WriterConfig, WriterState};
