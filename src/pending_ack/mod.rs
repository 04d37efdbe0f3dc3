//! Pending-ack replay (seed 001): rebuilding a subscription's transactional
//! pending acks from its pending-ack log, with a replay that ends every
//! failed attempt, never issues a read after a failure, rewinds the cursor,
//! and retries transient failures with backoff on a timer instead of
//! spinning on a shared replay thread.
//!
//! The pieces, bottom-up:
//!
//! - [`record`]: the log records (individual/cumulative ACK, COMMIT, ABORT,
//!   keyed by [`TxnId`]) in prost, single and batched (`0x0e01`, version 1).
//! - [`ReplayAttempt`]: one attempt's read pipeline (`fill_queue`,
//!   `read_complete`, `read_failed`, `stop_replay`) and end-of-attempt
//!   rules; [`classify`] decides which failures complete the replay.
//! - [`ReadDispatcher`]: where issued reads run: [`InlineReads`] (the
//!   completion re-enters the replay thread) or a [`ReaderThread`].
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
//! let handle = PendingAckHandle::new("t-sub", cursor, &pool, Arc::new(InlineReads), timer, HandleConfig::default())?;
//! let waiter = handle.ready_waiter();
//! handle.init();
//! pool.run_pending();
//! assert_eq!(waiter.try_result(), Some(Ok(())));
//! assert_eq!(handle.summary().individual[&t].len(), 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Checks: `specs/PendingAckReplay.tla` (protocol, with bug cfgs),
//! `loom-tests/pending_ack.rs` (the real `fill_queue`/`read_failed`
//! orderings), `shuttle-tests/pending_ack.rs` (several handles on one
//! executor), `tests/pending_ack_scenarios.rs` (virtual-time scenarios).

mod backoff;
mod error;
mod executor;
mod handle;
mod reader;
pub mod record;
mod replay;
mod state;
mod timer;
mod writer;

pub use backoff::{Backoff, BackoffConfig};
pub use error::PendingAckError;
pub use executor::{ExecutorMode, ExecutorTask, ReplayExecutor, ReplayExecutorPool};
pub use handle::{HandleConfig, HandleState, HandleStats, PendingAckHandle, ReadyWaiter};
pub use reader::{InlineReads, ReaderThread};
pub use record::{AckType, AckedPosition, PendingAckOp, PendingAckRecord, TxnId};
pub use replay::{
    classify, FailureDisposition, ReadDispatcher, ReadJob, ReplayAttempt, ReplayConfig,
    ReplayReport, ReplaySink,
};
pub use state::{PendingAckState, PendingAckSummary};
#[cfg(not(any(loom, feature = "shuttle")))]
pub use timer::SystemTimer;
pub use timer::{Timer, TimerId, TimerTask, VirtualTimer};
pub use writer::{AppendAck, AppendCallback, BufferedWriter, WriterConfig, WriterState};
