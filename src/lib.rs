//! # pulsar-core
//!
//! Rust implementations of four concurrency-critical pieces of Apache
//! Pulsar's delivery path, each with machine-checked correctness claims
//! (TLA+ specs in `specs/`, loom and shuttle models in `loom-tests/` and
//! `shuttle-tests/`, proptest model tests in `tests/`).
//!
//! | module | Pulsar counterpart | what it is |
//! |---|---|---|
//! | [`position`] | `Position` | `Position` (ledger_id, entry_id) |
//! | [`ledger`] | `ManagedLedgerImpl`, `ManagedCursorImpl` | managed-ledger substrate: ledgers, entries, cursors, durable store |
//! | [`deletion`] | `PositionRangeSet`, `ManagedCursorImpl`'s individual deletion | a cursor's deletion state: mark-delete, individually deleted ranges (roaring per ledger) and the lock-free read-scheduling hint |
//! | [`pending_ack`] | `MLPendingAckStore` | pending-ack log replay: read pipeline, failure classification, rewind, retry with backoff, buffered writer |
//! | [`delayed`] | `BucketDelayedDeliveryTracker` | bucket delayed delivery tracker with durable snapshots |
//! | [`proto`] | `PulsarApi.proto`, `Commands` | Pulsar's binary protocol: `PulsarApi.proto` messages, frames, message metadata, proto2 presence |
//! | [`permits`] | PIP-491 | PIP-491 exact permit accounting: `message_permits` on the wire, broker finalisation, client budget, per-incarnation accumulator |
//! | [`broker`] | `BrokerService`, `ServerCnx`, `PersistentTopic` | the broker core: topics, subscriptions, dispatch, acks as a sans-io state machine (`serve` drives it) |
//! | `sim` (feature `sim`) | — | `pulsar-core simulate`: the broker-in-a-box on the real components, fault injection, independent delivery checker |
//!
//! All synchronisation goes through one crate-private facade (`src/sync/`,
//! the only place that chooses std / loom / shuttle primitives); in every
//! build but the model-checking ones its `Arc` is `std::sync::Arc` and its
//! atomics are std's (hooked ones only with the test feature `race-hooks`).
//!
//! Every public fallible operation returns a typed error; bad input never
//! panics and leaves state unchanged.
//!
//! # Features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `sim` | via `cli` | the `sim` module (serde, serde_json, toml) |
//! | `cli` | yes | the `pulsar-core` binary (sim + clap, indicatif, ctrlc, tracing-subscriber, tempfile) |
//! | `race-hooks` | no | test hooks for the simulator's `hint_race` / `replay_race` stages (implies `sim`); test-only |
//! | `trace` | no | trace-validation hooks (`trace` module); test-only |
//! | `shuttle` | no | the crate's synchronisation through shuttle, for `shuttle-tests/` only |
//!
//! An embedder that needs only the components sets `default-features = false`.
#![warn(missing_docs)]

pub mod broker;
pub mod delayed;
pub mod deletion;
pub mod ledger;
pub mod pending_ack;
pub mod permits;
pub mod position;
pub mod proto;
#[cfg(feature = "sim")]
pub mod sim;
#[cfg(feature = "trace")]
pub mod trace;
// Without the `trace` feature the components' trace hooks are the no-op
// twins of src/trace_nop.rs (each call compiles to nothing).
#[cfg(not(feature = "trace"))]
mod trace_nop;
#[cfg(not(feature = "trace"))]
use trace_nop as trace;

mod sync;
// The model-checking internals (not public API; see src/model.rs): what the
// loom/shuttle test crates need from `crate::sync` and the components.
#[doc(hidden)]
#[path = "model.rs"]
pub mod __model;

pub use position::{Position, PositionParseError};

// The unit tests share the integration tests' helpers (tests/common/mod.rs),
// which name the crate `pulsar_core`.
#[cfg(test)]
extern crate self as pulsar_core;
#[cfg(test)]
#[path = "../tests/common/mod.rs"]
mod test_support;
/// The embedded database [`ledger::RedbStore`] runs on: its
/// [`ledger::RedbStore::database`] and [`ledger::RedbStore::begin`] hand out
/// `redb` types, so embedders use this version of redb.
pub use redb;
