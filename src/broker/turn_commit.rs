//! One durable commit per driver turn: every durable write a turn makes —
//! the SENDs' group commit, END_TXN's coordinator log records, transaction
//! markers and pending-ack COMMIT/ABORT records, transactional acks'
//! pending-ack log appends, cursor persists after acks (mark-delete,
//! individually deleted ranges), delayed-delivery and transaction-buffer
//! snapshots — commits without an fsync, and the turn ends with ONE
//! fsynced commit, the barrier ([`crate::ledger::RedbStore::commit_barrier`],
//! `ledger::barrier`), before any output of the turn leaves the core.
//!
//! Pulsar's counterpart is BookKeeper's journal: one fsync for every add
//! that arrived meanwhile, each add's callback after it. Here the "adds"
//! are every store commit of the turn, and the callbacks every output the
//! turn queued: SEND_RECEIPT, ACK_RESPONSE, END_TXN_RESPONSE, and also the
//! MESSAGEs a commit made dispatchable (entries of a committed
//! transaction), none of which [`Broker::poll_output`] hands out before the
//! barrier returned (it runs [`Broker::flush`], which ends with the
//! barrier, before it takes the first output).
//!
//! Order: redb's commits are ordered and a crash keeps the commits up to
//! the last durable one, so each turn's writes are durable all together or
//! not at all, and in their order within the turn: a commit marker is never
//! durable without the entries it commits (the SENDs' transaction is
//! committed before END_TXN is handled, `send_commit.rs`), a pending-ack
//! COMMIT never without the ack log appends before it, the coordinator's
//! COMMITTED never without the markers. A crash before the barrier's fsync
//! completes loses the whole turn, and no client saw an output of it.
//!
//! A failed barrier ([`Broker::turn_commit_failed`]): no write of the turn
//! may be reported durable, and redb refuses every later write until the
//! store is reopened (at the state before the turn). So every reply of the
//! turn that confirms a write is answered with its typed error instead
//! (SEND_RECEIPT → SEND_ERROR `PersistenceError`, ACK_RESPONSE with
//! `UnknownError` as a failed ack's receipt, or `PersistenceError` for a
//! transactional one, the transaction responses with `PersistenceError`,
//! SUCCESS / PRODUCER_SUCCESS → ERROR `PersistenceError`), every other
//! output of the turn (MESSAGEs above all) is dropped, every connection is
//! closed (the clients reconnect and resend, as after a BookKeeper write
//! failure fences a topic in Pulsar), and the core drops its topics and its
//! transaction coordinator: none of the turn's in-memory effects survives,
//! what is reopened is the store's state, the state before the turn.
//!
//! Bound and delay: as the SENDs' group commit (`send_commit.rs`), a turn
//! is what the driver hands the core between two polls; a driver that polls
//! after every frame gets one fsync per frame. [`BrokerConfig::turn_commit`]
//! off restores one fsync per store commit.

use crate::proto::command::{self, server_error, ty, BrokerCommand};

use super::output::{OutFrame, Output};
use super::{Broker, BrokerConfig};

#[cfg(doc)]
use crate::ledger::RedbStore;

impl Broker {
    /// Ends the turn's durable writes: the barrier, then every output
    /// queued so far may leave; on failure, [`Broker::turn_commit_failed`].
    pub(crate) fn commit_turn(&mut self) {
        if !self.config.turn_commit {
            self.out.durable = self.out.queue.len();
            return;
        }
        match self.store.commit_barrier() {
            Ok(_) => self.out.durable = self.out.queue.len(),
            Err(e) => self.turn_commit_failed(&e.to_string()),
        }
    }

    /// The turn's barrier failed (see the module docs): its confirming
    /// replies become their errors, its other outputs are dropped, every
    /// connection is closed and the core's topics and coordinator are
    /// dropped, to be reopened from the store.
    pub(crate) fn turn_commit_failed(&mut self, error: &str) {
        tracing::warn!(
            error,
            "the turn's durable commit failed: its replies become errors, every connection closes"
        );
        let message = format!("the store failed to make the write durable: {error}");
        let turn: Vec<Output> = self.out.queue.drain(self.out.durable..).collect();
        for o in turn {
            match o {
                Output::Frame { conn, frame } => {
                    if let Some(cmd) = failed_reply(&frame, &message) {
                        self.out.queue.push_back(Output::Frame {
                            conn,
                            frame: OutFrame::new(&cmd, Vec::new()),
                        });
                    }
                }
                other => self.out.queue.push_back(other),
            }
        }
        let before = self.out.queue.len();
        let conns: Vec<_> = self.conns.keys().copied().collect();
        for conn in &conns {
            self.forget(*conn);
        }
        // What forgetting the connections queued for them (consumer
        // changes) goes nowhere: they close now.
        let mut i = before;
        while i < self.out.queue.len() {
            if matches!(self.out.queue[i], Output::Frame { .. }) {
                self.out.queue.remove(i);
            } else {
                i += 1;
            }
        }
        for conn in conns {
            self.out.queue.push_back(Output::Close {
                conn,
                reason: message.clone(),
            });
        }
        self.topics.clear();
        let now = self.now();
        let snapshot_seq = self.txn.snapshot_seq;
        self.txn = super::txn::TxnRuntime::new(now, self.config.txn_snapshot);
        self.txn.snapshot_seq = snapshot_seq;
        self.out.durable = self.out.queue.len();
    }
}

/// The error form of a reply that confirms a durable write; `None` for an
/// output that is dropped (a MESSAGE, a consumer change) and `Some` of the
/// reply itself when it is already an error.
fn failed_reply(frame: &OutFrame, message: &str) -> Option<BrokerCommand> {
    let mut cmd = frame.decode_command().ok()?;
    let persistence = server_error::PERSISTENCE_ERROR;
    match cmd.r#type {
        ty::SEND_RECEIPT => {
            let r = cmd.send_receipt?;
            Some(BrokerCommand {
                r#type: ty::SEND_ERROR,
                send_error: Some(command::CommandSendError {
                    producer_id: r.producer_id,
                    sequence_id: r.sequence_id,
                    error: persistence,
                    message: message.to_string(),
                }),
                ..Default::default()
            })
        }
        ty::ACK_RESPONSE => {
            let r = cmd.ack_response.as_mut()?;
            if r.error.is_none() {
                // A plain ack's failed receipt is Pulsar's UnknownError
                // (`group_commit.rs`); a transactional one's the
                // coordinator's PersistenceError.
                r.error = Some(if r.txnid_most_bits.is_some() {
                    persistence
                } else {
                    server_error::UNKNOWN_ERROR
                });
                r.message = Some(message.to_string());
            }
            Some(cmd)
        }
        ty::NEW_TXN_RESPONSE
        | ty::ADD_PARTITION_TO_TXN_RESPONSE
        | ty::ADD_SUBSCRIPTION_TO_TXN_RESPONSE
        | ty::END_TXN_RESPONSE => {
            let r = match cmd.r#type {
                ty::NEW_TXN_RESPONSE => cmd.new_txn_response.as_mut(),
                ty::ADD_PARTITION_TO_TXN_RESPONSE => cmd.add_partition_to_txn_response.as_mut(),
                ty::ADD_SUBSCRIPTION_TO_TXN_RESPONSE => {
                    cmd.add_subscription_to_txn_response.as_mut()
                }
                _ => cmd.end_txn_response.as_mut(),
            }?;
            if r.error.is_none() {
                r.error = Some(persistence);
                r.message = Some(message.to_string());
            }
            Some(cmd)
        }
        ty::TC_CLIENT_CONNECT_RESPONSE => {
            let r = cmd.tc_client_connect_response.as_mut()?;
            if r.error.is_none() {
                r.error = Some(persistence);
                r.message = Some(message.to_string());
            }
            Some(cmd)
        }
        ty::SUCCESS | ty::PRODUCER_SUCCESS => {
            let request_id = match cmd.r#type {
                ty::SUCCESS => cmd.success?.request_id,
                _ => cmd.producer_success?.request_id,
            };
            Some(error_cmd(request_id, persistence, message))
        }
        ty::SEND_ERROR | ty::ERROR => Some(cmd),
        _ => None,
    }
}

fn error_cmd(request_id: u64, error: i32, message: &str) -> BrokerCommand {
    BrokerCommand {
        r#type: ty::ERROR,
        error: Some(command::CommandError {
            request_id,
            error,
            message: message.to_string(),
        }),
        ..Default::default()
    }
}

impl BrokerConfig {
    /// Default of [`BrokerConfig::turn_commit`]: on.
    pub const DEFAULT_TURN_COMMIT: bool = true;
}
