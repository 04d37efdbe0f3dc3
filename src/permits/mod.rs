//! PIP-491 exact permit accounting (seed 003): the broker debits exactly P
//! permits per delivered command, tells the client P on the wire
//! (`CommandMessage.message_permits`), and the client returns exactly P to
//! exactly the broker-consumer incarnation that was debited.
//!
//! | submodule | role | Pulsar counterpart |
//! |---|---|---|
//! | [`wire`] | prost types with `PulsarApi.proto` field numbers (`BaseCommand` and the commands exchanged), required-field checks; `ack_set` helpers | `PulsarApi.proto` |
//! | [`frame`] | simple / payload frames, entry payload (`0x0e01` crc32c, `0x0e02` broker-entry prefix), batch framing | `Commands` (binary protocol framing) |
//! | [`presence`] | proto2 `required`-field presence walk shared by every decoder | protobuf-java `isInitialized` |
//! | [`broker`] | per-entry finalisation after pending-ack admission; one [`SendMessagesResult`] drives every debit | `Consumer.sendMessages`, `SendMessagesResult`, Shared dispatchers |
//! | [`client`] | resolution ladder, command budget, per-incarnation [`ConsumerPermitState`], Flow revalidation; [`ClientConsumer::handle_frame`] takes real frames | `MessagePermitAccounting`, `ConsumerImpl`, `ConsumerPermitState` |
//!
//! # The rule pulsar-core adopts
//!
//! An explicit `message_permits` that is invalid (0 or above `i32::MAX`)
//! **or inconsistent** with the payload's batch metadata and `ack_set` is a
//! protocol error: the client returns no credit for that command and closes
//! the source connection (which drops the broker-side debt with the broker
//! consumer). Accumulator overflow closes the connection too. Field absence
//! (old broker) falls back to `ack_set` popcount, then
//! `num_messages_in_batch`, then 1, and never closes.
//!
//! # Conservation
//!
//! For every incarnation: Σ P debited by the broker = Σ permits its client
//! returns (message tokens + command drains); returns reach the broker only
//! as Flows written while the incarnation is current, and no Flow of an old
//! incarnation is written after its replacement's Subscribe. Checked by
//! `specs/PermitConservation.tla`, `loom-tests/permits.rs`,
//! `shuttle-tests/permits.rs` and `tests/permits_proptest.rs`.
//!
//! ```
//! use pulsar_core::permits::client::{CommandBudget, resolve_full};
//! use pulsar_core::permits::wire::CommandMessage;
//!
//! // partial batch of B = 10 with indexes 0, 1, 2 deliverable, P = 3
//! let cmd = CommandMessage { ack_set: vec![0b111], message_permits: Some(3), ..Default::default() };
//! assert_eq!(resolve_full(&cmd, 10).unwrap().permits, 3);
//! let mut budget = CommandBudget::new(3);
//! budget.claim().unwrap();          // one message handed off (returns 1 itself)
//! assert_eq!(budget.drain(), 2);    // the command returns the other 2
//! ```

pub mod broker;
pub mod client;
pub mod frame;
pub mod presence;
pub mod wire;

// The broker side's consumer is `BrokerConsumer` here, next to the client's
// `ClientConsumer` (`broker::Consumer` is Pulsar's name inside the module).
pub use broker::{
    AdmitAll, BrokerEntry, BrokerPermitError, Consumer as BrokerConsumer, ConsumerKey, Dispatch,
    SendMessagesResult, SharedDispatcher,
};
pub use client::{
    ClientConnection, ClientConsumer, CommandBudget, ConsumerPermitState, PermitProtocolError,
};
pub use wire::WireError;
