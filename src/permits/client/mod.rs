//! Client side of PIP-491: resolve P, spend it through a command budget, and
//! return it to exactly the broker-consumer incarnation that was debited.
//!
//! - [`resolve_early`] / [`resolve_full`]: the resolution ladder
//!   (explicit `message_permits` → `ack_set` popcount → `num_messages_in_batch`
//!   → legacy 1). pulsar-core follows PIP-491: an explicit P that is
//!   invalid (0, > `i32::MAX`) **or inconsistent** with the batch metadata
//!   and `ack_set` is a [`PermitProtocolError`]; the client closes the source
//!   connection and returns no credit for that command.
//! - [`CommandBudget`]: claim / restore / drain, so a command returns
//!   exactly P whatever mix of delivered, skipped, compacted-out,
//!   failed-mid-batch and stale-epoch messages it carried.
//! - [`ConsumerPermitState`]: one per broker-consumer incarnation; its
//!   atomic accumulator (checked arithmetic, drains at
//!   `receiver_queue_size / 2`) queues a Flow request; the connection task
//!   ([`ClientConnection::flush_flows`]) revalidates the incarnation right
//!   before writing the Flow, under the same lock that a replacement
//!   (Subscribe / CloseConsumer) takes, so no credit crosses incarnations.
//! - [`ClientConsumer`]: the message path that ties them together.
//!
//! Corresponds to Pulsar's `MessagePermitAccounting`, `ConsumerImpl`'s
//! native-message path and `ConsumerPermitState` (PIP-491).
//!
//! # Concurrency contract
//!
//! [`ConsumerPermitState::return_permits`] and [`PermitToken::release`] may
//! be called from any thread, concurrently with each other, with
//! [`ClientConnection::flush_flows`] (the connection task) and with a
//! replacement ([`ClientConnection::subscribe`],
//! [`ClientConnection::close_consumer`], [`ClientConnection::close`]). All
//! synchronisation goes through the crate's sync facade, so loom and shuttle check
//! this exact code. [`ClientConsumer`] is `&mut self` (owned by the
//! connection task; share it behind a `crate::sync::Mutex`).
//!
//! | file | role |
//! |---|---|
//! | `resolution.rs` | the ladder, [`PermitProtocolError`] |
//! | `budget.rs` | [`CommandBudget`] |
//! | `state.rs` | [`Incarnation`], [`ConsumerPermitState`], [`ClientConnection`] |
//! | `acked.rs` | `AcknowledgedMessages` (an incarnation's acks as bitmaps, for `isDuplicate`) |
//! | `consumer.rs` | [`ClientConsumer`], [`PermitToken`], [`ReceivedMessage`] |
//!
//! Framing (frames, entry payloads, crc32c) lives in [`crate::proto::frame`].

mod acked;
mod budget;
mod consumer;
mod resolution;
mod state;
#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests;

pub use crate::proto::frame::{crc32c, encode_entry_payload};
pub use budget::{BudgetError, CommandBudget};
pub use consumer::{
    ClientConsumer, CommandOutcome, CommandOutcomeKind, PermitToken, ReceivedMessage, Resubscribed,
};
pub use resolution::{
    resolve_early, resolve_full, PermitProtocolError, PermitSource, ResolvedPermits,
};
pub use state::{
    ClientConnection, ClientFrame, ClientPermitError, CloseReason, ConsumerPermitState,
    FlushReport, Incarnation, ReturnOutcome, ValidationError,
};
