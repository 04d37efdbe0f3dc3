//! PIP-491 exact permit accounting: the broker debits exactly P
//! permits per delivered command, tells the client P on the wire
//! (`CommandMessage.message_permits`), and the client returns exactly P to
//! exactly the broker-consumer incarnation that was debited.
//!
//! The messages, frames and the `ack_set` convention are [`crate::proto`]'s.
//!
//! | submodule | role | Pulsar counterpart |
//! |---|---|---|
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
//! # Invariants
//!
//! | spec | invariant | functions | tests |
//! |---|---|---|---|
//! | `PermitConservation` | `Conservation` | [`broker::Consumer::send_messages`], `ClientConsumer::handle_message`, [`CommandBudget`], [`ConsumerPermitState::return_permits`] | `handle_message_settles_exactly_p`, `budget_claimed_plus_drained_is_p`, `broker_accounting_matches_reference`, `corrupted_payload_credits_its_permits_once`, `flow_never_crosses_incarnations_and_credit_is_conserved`, `permits_conserved_random`, `permits_conserved_pct` |
//! | `PermitConservation` | `NoExcessCredit` | [`ClientConnection::subscribe_succeeded`], [`ClientConnection::flush_flows`] | `subscribe_succeeded_twice_grants_once` |
//! | `PermitConservation` | `NoStaleCredit` | [`ClientConnection::flush_flows`], [`ClientConnection::subscribe`] | `flow_drains_at_half_queue_and_is_revalidated_on_same_connection_recreate`, `negative_control_flow_without_revalidation_crosses_incarnations` |
//!
//! What the rows say, per current incarnation: broker balance + commands in
//! flight + held + accumulator + queued Flow requests + Flows in flight = RQ
//! (`Conservation`: `send_messages` debits once per finalised P,
//! `handle_message` hands d to the [`CommandBudget`] and returns P − d,
//! `return_permits` adds checked and drains at RQ/2; `tests/permits_proptest.rs`,
//! `tests/permits_settlement.rs`, loom and shuttle); the broker never holds
//! more than RQ for a consumer (`NoExcessCredit`: one grant per incarnation);
//! no Flow is applied to another incarnation than its own (`NoStaleCredit`:
//! `flush_flows` revalidates the incarnation under the connection lock,
//! `subscribe` closes the old state and abandons its credit).
//!
//! Trace lines that pin each row: `ClientReceive` pins d, `Drain` and
//! `FlushResidual` the accumulator (mutant `permits_budget_returned_twice`
//! is rejected); `BrokerRecv` pins each Flow's permits; `ConnTaskWrite` pins
//! written/dropped (mutant `permits_flow_without_revalidation` is rejected,
//! and its simulator trace too:
//! `tests/trace_mutants/permits_flow_without_revalidation_sim.patch`).
//!
//! Trace validation (`bash .ci/trace PermitConservation`) records the real
//! dispatcher and client consumer through the hooks of `src/trace.rs`'s
//! `permits` module (feature `trace`, named after the spec's actions), from
//! two sources: `tests/trace_permits.rs`'s interleavings, and simulator runs
//! (`pulsar-core simulate --trace-dir`, `src/sim/sim_trace.rs`: one spec run
//! per consumer id on one connection, across its re-creations on that
//! connection; a permit-churn run and swarm seed 2's workload). The broker
//! removing a consumer on its own (a failed write,
//! [`SharedDispatcher::on_write_complete`]; a closed connection,
//! [`SharedDispatcher::remove_connection`]) is the spec's
//! `BrokerWriteFailure`; the idle flush
//! ([`ClientConnection::flush_residual`]: the residual credit written at
//! once, below the threshold) is the spec's `FlushResidual`. Not traced: an
//! incarnation replaced before its Subscribe succeeded (the code then never
//! writes its receiver-queue grant; the spec writes Subscribe and the grant
//! together), protocol errors (the connection closes: its run ends there).
//!
//! ```
//! use pulsar_core::permits::client::{CommandBudget, resolve_full};
//! use pulsar_core::proto::wire::CommandMessage;
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

// The broker side's consumer is `BrokerConsumer` here, next to the client's
// `ClientConsumer` (`broker::Consumer` is Pulsar's name inside the module).
pub use crate::proto::wire::WireError;
pub use broker::{
    AdmitAll, BrokerEntry, BrokerPermitError, Consumer as BrokerConsumer, ConsumerKey, Dispatch,
    SendMessagesResult, SharedDispatcher,
};
pub use client::{
    ClientConnection, ClientConsumer, CommandBudget, ConsumerPermitState, PermitProtocolError,
};
