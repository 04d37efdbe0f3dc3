//! Transactions as a Pulsar client runs them, over real frames (PIP-31;
//! the command sequence of magnetar's `TransactionCoordinatorClient` and
//! Pulsar's Java `TransactionImpl`, as `tests/interop-rust` drives
//! `serve`):
//!
//! - **the transaction client** (one connection): CONNECT,
//!   TC_CLIENT_CONNECT_REQUEST (coordinator 0), a producer on the run's
//!   topic and one on a second topic; then, one transaction after the
//!   other: NEW_TXN (`txn_ttl_millis`), ADD_PARTITION_TO_TXN (both topics),
//!   ADD_SUBSCRIPTION_TO_TXN (every subscription of the run's topic),
//!   transactional SENDs to both topics (`CommandSend.txnid_*` and the
//!   same id in `MessageMetadata.txnid_*`), a window in which the
//!   consumers acknowledge inside the transaction, then END_TXN commit or
//!   abort, drawn from the seed, or nothing: the coordinator's timeout
//!   aborts it. A transaction whose SEND or ACK lost its receipt (a crash,
//!   a closed connection) or was refused is aborted, as Pulsar's client
//!   fails its commit. An END_TXN without an answer is re-sent after the
//!   reconnect (idempotent on the broker); one answered
//!   `TransactionNotFound` to such a retry within the ttl ended as asked
//!   (the coordinator forgets a transaction only once it ended).
//! - **transactional acks**: a consumer sends a share of its acks with the
//!   open transaction's id (`CommandAck.txnid_*`, with a `request_id`: the
//!   receipt; a batch's message as the batch-index ack of its index). An
//!   ack refused is sent again without the transaction (the transaction is
//!   then aborted). A workload's `txn_ack_ratio` without a `[txn]` table
//!   runs as one ([`with_txn_ack_ratio`]).
//! - **the reader** of the second topic (its own subscription and
//!   connection): every message it receives goes to the checker.
//!
//! The checker (`checker::txn`) sees the sends' receipts, the END_TXN
//! requests and answers, the ack receipts and every delivery.

use std::collections::BTreeMap;

use rand::Rng;
use serde::Serialize;

use crate::broker::txn::TxnId;
use crate::broker::{CutFrame, FrameCutter};
use crate::ledger::SyncMode;
use crate::position::Position;
use crate::proto::command::{self as proto, server_error, ty, BrokerCommand};
use crate::proto::frame::encode_entry_payload;
use crate::proto::metadata::{MessageMetadata, SingleMessageMetadata};
use crate::proto::txn::{
    txn_action, CommandAddPartitionToTxn, CommandAddSubscriptionToTxn, CommandEndTxn,
    CommandNewTxn, CommandTcClientConnectRequest, TxnSubscription,
};
use crate::proto::wire::{self, CommandAck, CommandFlow, CommandSubscribe, MessageIdData};
use crate::sim::checker::{MessageRef, TxnMsg, TxnOutcome};
use crate::sim::crash_storage::CrashPoint;
use crate::sim::options::SimError;
use crate::sim::report::ComponentReport;

use super::wire::frame;
use super::{ClientRef, Ev, Node, EPOCH_BASE_MS, TOPIC};

/// The second topic the transactions write to.
pub const TOPIC2: &str = "persistent://public/default/sim-node-txn";
/// The reader's subscription on [`TOPIC2`].
const READER_SUB: &str = "txn-reader";
/// The checker's key of transactional messages (exempt from order checks).
const TXN_KEY: u32 = u32::MAX;
/// Retry delay of a refused transaction-coordinator request, virtual ms.
const RETRY_MS: u64 = 100;
/// After every transaction ended, how long the reader may still take to
/// receive the committed messages of the second topic, virtual ms.
const READER_GRACE_MS: u64 = 5_000;
/// Permits the reader grants at a time.
const READER_PERMITS: u32 = 500;

/// Which transactional client a connection belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    /// The transaction client (coordinator session and both producers).
    Client,
    /// The second topic's reader.
    Reader,
}

/// A timed step of the transaction client.
#[derive(Debug, Clone, Copy)]
pub(super) enum TxnEv {
    /// Re-send what a refused or lost request left undone.
    Retry,
    /// Begin the next transaction.
    Next,
    /// The open window of transaction `k` ends: end it (or leave it).
    Close(u64),
    /// Transaction `k`, left open, may have been aborted by its timeout.
    TimedOut(u64),
    /// The reader's grace after the last transaction ended.
    Grace,
}

/// What the transactions did (the report's `txn` component).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TxnActivity {
    /// NEW_TXN answered (transactions begun).
    pub begun: u64,
    /// END_TXN(commit) answered without an error.
    pub committed: u64,
    /// END_TXN(abort) answered, or a commit refused.
    pub aborted: u64,
    /// Transactions left to the coordinator's timeout.
    pub timed_out: u64,
    /// Of the aborted: aborted because a SEND or ACK of it lost its
    /// receipt or was refused.
    pub aborted_uncertain: u64,
    /// Outcomes the client could not learn.
    pub unknown: u64,
    /// Transactional SENDs receipted.
    pub sends: u64,
    /// Transactional ACKs receipted.
    pub acks: u64,
    /// Transactional ACKs refused (sent again without the transaction).
    pub acks_refused: u64,
    /// Transactions open (NEW_TXN answered, no END_TXN) when the broker
    /// crashed or restarted.
    pub open_across_crash: u64,
    /// END_TXNs in flight when the broker crashed or restarted.
    pub end_in_flight_at_crash: u64,
    /// Crash points moved into an END_TXN (`txn.crashes_during_end`).
    pub crash_points_in_end: u64,
    /// END_TXNs re-sent (after a lost connection or a retryable error).
    pub end_retries: u64,
    /// Coordinator requests refused while it recovers, retried.
    pub coordinator_retries: u64,
    /// Messages the second topic's reader received.
    pub reader_deliveries: u64,
    /// The broker closed the reader's consumer (CLOSE_CONSUMER after a
    /// failed MESSAGE write): the reader subscribed again.
    pub reader_closed_by_broker: u64,
    /// Restarts (crashes included) whose store holds transaction buffer
    /// snapshots written since the previous start: the topics' buffers are
    /// recovered from a snapshot taken during the run and the entries
    /// after it (`txn.snapshot_min_time_ms`,
    /// `txn.snapshot_max_transaction_count`), not only from the first one.
    pub restarts_after_new_snapshots: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Commit,
    Abort,
    Timeout,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// NEW_TXN sent, no answer yet.
    New,
    /// ADD_PARTITION_TO_TXN / ADD_SUBSCRIPTION_TO_TXN sent.
    Adding,
    /// Sends and acks inside it.
    Open,
    /// END_TXN sent (`commit`).
    Ending(bool),
    /// Done (or left to its timeout).
    Done,
}

#[derive(Debug)]
struct Txn {
    end: End,
    step: Step,
    id: Option<TxnId>,
    ttl_ms: u64,
    /// When the NEW_TXN that was answered was sent.
    sent_at: u64,
    partitions_added: bool,
    subscriptions_added: bool,
    /// Sends without a receipt: (producer, sequence id) → message.
    sends: BTreeMap<(usize, u64), TxnMsg>,
    /// Receipted messages of the run's topic and their positions.
    receipted: Vec<(TxnMsg, Position)>,
    acks_in_flight: u32,
    /// Its acks receipted (pending in the subscriptions' pending-ack logs).
    acks_receipted: u32,
    /// A SEND or ACK of it lost its receipt or was refused.
    uncertain: bool,
    /// The open window passed: no new acks.
    closing: bool,
    /// An END_TXN of it was re-sent after a lost connection.
    end_retried: bool,
}

/// A request of the transaction client awaiting its answer.
#[derive(Debug, Clone, Copy)]
enum Req {
    TcConnect,
    Producer(usize),
    NewTxn(u64),
    AddPartition(u64),
    AddSubscription(u64),
    End(u64),
}

/// The transaction client and the reader.
#[derive(Debug, Default)]
pub(super) struct TxnSide {
    enabled: bool,
    conn: Option<u64>,
    cutter: FrameCutter,
    tc_ready: bool,
    producers_ready: [bool; 2],
    next_req: u64,
    reqs: BTreeMap<u64, Req>,
    next_seq: [u64; 2],
    txns: BTreeMap<u64, Txn>,
    /// Transactions begun (NEW_TXN first sent).
    started: u32,
    retry_scheduled: bool,
    grace_at: Option<u64>,
    grace_passed: bool,
    reader_conn: Option<u64>,
    reader_cutter: FrameCutter,
    reader_req: u64,
    reader_received: u32,
    /// Crash points still to move into an END_TXN.
    crashes_during_end: u32,
    /// The run's `txn_ack_ratio` ([`with_txn_ack_ratio`]): transactions go
    /// on while the consumers acknowledge, and stop once the producers are
    /// done and every message is acknowledged.
    until_acked: bool,
    /// Transactions begun after the producers were done.
    started_after_publish: u32,
    /// No further transaction begins.
    stopped: bool,
    /// Transaction buffer snapshot messages stored at the last start.
    snapshots_stored: i64,
    pub(super) activity: TxnActivity,
}

fn txn_payload(k: u64, topic: u8, i: u32) -> Vec<u8> {
    format!("txn {k} {topic} {i}").into_bytes()
}

/// The transaction message a payload names, if it is one.
fn parse_txn_payload(bytes: &[u8]) -> Option<TxnMsg> {
    let s = std::str::from_utf8(bytes).ok()?;
    let mut it = s.split(' ');
    if it.next()? != "txn" {
        return None;
    }
    Some((
        it.next()?.parse().ok()?,
        it.next()?.parse().ok()?,
        it.next()?.parse().ok()?,
    ))
}

fn err_of(error: Option<i32>) -> Option<i32> {
    error
}

/// The report's `txn` component of a node run.
///
/// `sends`: the workload has transactional messages (`txn.messages_per_topic`
/// above 0); a `txn_ack_ratio` run's transactions only acknowledge (see
/// [`with_txn_ack_ratio`]), so its transactional SENDs and second-topic
/// deliveries are shown but do not decide the verdict.
pub(super) fn component(a: &TxnActivity, sends: bool) -> ComponentReport {
    ComponentReport::new(
        "txn: transaction coordinator + transaction buffer + transactional acks (PIP-31, over the wire)",
        &[
            ("transactions committed", a.committed, true),
            ("transactions aborted", a.aborted, true),
            ("transactions left to their timeout", a.timed_out, false),
            ("transactional SENDs receipted", a.sends, sends),
            ("transactional ACKs receipted", a.acks, true),
            ("open across a crash or restart", a.open_across_crash, false),
            ("crash points moved into an END_TXN", a.crash_points_in_end, false),
            ("END_TXN in flight at a crash or restart", a.end_in_flight_at_crash, false),
            ("second-topic deliveries", a.reader_deliveries, sends),
            ("second-topic reader closed by the broker", a.reader_closed_by_broker, false),
            ("restarts after new transaction buffer snapshots", a.restarts_after_new_snapshots, false),
        ],
    )
}

/// `w` with its `txn_ack_ratio` run over the wire: when it has no `[txn]`
/// transactions, a transaction client runs one transaction after the
/// other while the consumers acknowledge (each open `OPEN_MS`, no
/// transactional messages) until the producers are done and
/// every message is acknowledged, and the consumers acknowledge a
/// `txn_ack_ratio` share of their messages inside the open one.
pub fn with_txn_ack_ratio(w: &crate::sim::workload::Workload) -> crate::sim::workload::Workload {
    /// How long each transaction stays open for acks, virtual ms.
    const OPEN_MS: u64 = 500;
    let mut w = w.clone();
    if w.txn_ack_ratio > 0.0 && w.txn.transactions == 0 {
        let per_producer = w.messages.div_ceil(u64::from(w.producers));
        let entries = per_producer.div_ceil(u64::from(w.batch_size));
        let span = (entries * w.publish_interval_ms.max(1)).max(100);
        let cycle = OPEN_MS + w.txn.gap_ms + 50;
        // The publish span's worth and then some: transactions stop once
        // the producers are done and everything is acknowledged.
        w.txn.transactions = u32::try_from(span.div_ceil(cycle) + 200)
            .unwrap_or(u32::MAX)
            .min(10_000);
        // Acks only: the run's messages are the producers'.
        w.txn.messages_per_topic = 0;
        w.txn.ack_ratio = w.txn_ack_ratio;
        w.txn.open_ms = OPEN_MS;
    }
    w
}

/// Of a `txn_ack_ratio` run's transactions, at most this many begin after
/// the producers are done.
const MAX_TXNS_AFTER_PUBLISH: u32 = 100;

impl Node<'_> {
    /// No further transaction begins.
    fn txn_all_started(&self) -> bool {
        self.txn.stopped || self.txn.started >= self.w.txn.transactions
    }

    /// Whether a transaction not ended holds receipted acks (records in
    /// the pending-ack logs a replay must find).
    /// At a start: counts the transaction buffer snapshot messages the
    /// store holds (read-only, before the core opens it), for
    /// [`TxnActivity::restarts_after_new_snapshots`].
    pub(super) fn txn_count_snapshots(&mut self, store: &crate::ledger::RedbStore) {
        use crate::ledger::LedgerStore;
        if !self.txn.enabled {
            return;
        }
        let Some(st) = crate::broker::txn::snapshot::snapshot_topic(TOPIC) else {
            return;
        };
        let stored = store
            .load_ledger(&st)
            .map(|l| l.ledgers.values().map(|i| i.entries).sum::<i64>())
            .unwrap_or(0);
        if self.gen > 1 && stored > self.txn.snapshots_stored {
            self.txn.activity.restarts_after_new_snapshots += 1;
        }
        self.txn.snapshots_stored = stored;
    }

    pub(super) fn txn_holds_acks(&self) -> bool {
        self.txn
            .txns
            .values()
            .any(|x| matches!(x.step, Step::Open | Step::Ending(_)) && x.acks_receipted > 0)
    }

    /// The client's number of the transaction with id `id`, if it has one.
    pub(super) fn txn_number(&self, id: TxnId) -> Option<u64> {
        self.txn
            .txns
            .iter()
            .find_map(|(k, x)| (x.id == Some(id)).then_some(*k))
    }

    /// Sets up the transaction client and the reader (if the workload has
    /// transactions) and schedules their connects.
    pub(super) fn setup_txn(&mut self) -> Result<(), SimError> {
        if self.w.txn.transactions == 0 {
            return Ok(());
        }
        if self.opts.sync != SyncMode::Immediate {
            return Err(SimError::Component(
                "transactions on the node engine need sync = always: a crash with deferred commits loses answered coordinator writes".into(),
            ));
        }
        self.txn.enabled = true;
        self.txn.until_acked = self.w.txn_ack_ratio > 0.0;
        self.txn.crashes_during_end = self.w.txn.crashes_during_end;
        let at = self.rng.random_range(20..=50);
        self.sched.at(at, Ev::Connect(ClientRef::Txn(Role::Client)));
        let at = self.rng.random_range(0..=10);
        self.sched.at(at, Ev::Connect(ClientRef::Txn(Role::Reader)));
        Ok(())
    }

    /// Every transaction ended and the reader had its chance (or no
    /// transactions).
    pub(super) fn txn_finished(&self) -> bool {
        let t = &self.txn;
        !t.enabled
            || (self.txn_all_started()
                && t.txns.values().all(|x| x.step == Step::Done)
                && self.checker.txn_all_ended()
                && (t.grace_passed || self.checker.txn_committed_seen(1)))
    }

    /// The connection `conn` of `role` is open (CONNECT follows).
    pub(super) fn txn_connecting(&mut self, role: Role, conn: u64) {
        match role {
            Role::Client => {
                let t = &mut self.txn;
                t.conn = Some(conn);
                t.cutter = FrameCutter::default();
                t.tc_ready = false;
                t.producers_ready = [false; 2];
                t.reqs.clear();
            }
            Role::Reader => {
                self.txn.reader_conn = Some(conn);
                self.txn.reader_cutter = FrameCutter::default();
            }
        }
    }

    /// The frame cutter of `role`'s connection.
    pub(super) fn txn_cutter(&mut self, role: Role) -> &mut FrameCutter {
        match role {
            Role::Client => &mut self.txn.cutter,
            Role::Reader => &mut self.txn.reader_cutter,
        }
    }

    /// `role`'s connection `conn` is gone; whether it was its current one
    /// (then it reconnects).
    pub(super) fn txn_connection_lost(&mut self, role: Role, conn: u64, broker_gone: bool) -> bool {
        match role {
            Role::Reader => {
                if self.txn.reader_conn != Some(conn) {
                    return false;
                }
                self.txn.reader_conn = None;
                true
            }
            Role::Client => {
                if self.txn.conn != Some(conn) {
                    return false;
                }
                let t = &mut self.txn;
                t.conn = None;
                t.tc_ready = false;
                t.producers_ready = [false; 2];
                t.reqs.clear();
                for x in t.txns.values_mut() {
                    // A send without a receipt may or may not be in its
                    // topic: the transaction cannot be committed.
                    if !x.sends.is_empty() {
                        x.sends.clear();
                        x.uncertain = true;
                    }
                    if broker_gone {
                        match x.step {
                            Step::Open | Step::Adding => t.activity.open_across_crash += 1,
                            Step::Ending(_) => t.activity.end_in_flight_at_crash += 1,
                            _ => {}
                        }
                    }
                    if let Step::Ending(_) = x.step {
                        x.end_retried = true;
                    }
                }
                true
            }
        }
    }

    fn txn_req(&mut self, r: Req) -> u64 {
        self.txn.next_req += 1;
        let id = self.txn.next_req;
        self.txn.reqs.insert(id, r);
        id
    }

    fn txn_send(&mut self, cmd: &BrokerCommand, payload: Vec<u8>) {
        if let Some(conn) = self.txn.conn {
            self.send_to_broker(conn, frame(cmd, payload));
        }
    }

    /// A frame from the core to `role`.
    pub(super) fn txn_command(&mut self, role: Role, conn: u64, cmd: BrokerCommand, f: &CutFrame) {
        match role {
            Role::Reader => self.reader_command(conn, cmd, f),
            Role::Client => self.client_command(cmd),
        }
    }

    fn client_command(&mut self, cmd: BrokerCommand) {
        match cmd.r#type {
            ty::CONNECTED => {
                let req = self.txn_req(Req::TcConnect);
                self.txn_send(
                    &BrokerCommand {
                        r#type: ty::TC_CLIENT_CONNECT_REQUEST,
                        tc_client_connect_request: Some(CommandTcClientConnectRequest {
                            request_id: req,
                            tc_id: 0,
                        }),
                        ..Default::default()
                    },
                    Vec::new(),
                );
                for (i, topic) in [TOPIC, TOPIC2].into_iter().enumerate() {
                    let req = self.txn_req(Req::Producer(i));
                    self.txn_send(
                        &BrokerCommand {
                            r#type: ty::PRODUCER,
                            producer: Some(proto::CommandProducer {
                                topic: topic.into(),
                                producer_id: i as u64 + 1,
                                request_id: req,
                                producer_name: Some(format!("txn-{i}")),
                                ..Default::default()
                            }),
                            ..Default::default()
                        },
                        Vec::new(),
                    );
                }
            }
            ty::TC_CLIENT_CONNECT_RESPONSE => {
                let Some(r) = cmd.tc_client_connect_response else {
                    return;
                };
                if self.txn.reqs.remove(&r.request_id).is_none() {
                    return;
                }
                if r.error.is_some() {
                    // The coordinator recovers: connect again shortly.
                    self.txn.activity.coordinator_retries += 1;
                    self.txn_schedule_retry();
                    self.txn.tc_ready = false;
                    return;
                }
                self.txn.tc_ready = true;
                self.txn_resume();
            }
            ty::PRODUCER_SUCCESS => {
                let Some(r) = cmd.producer_success else {
                    return;
                };
                if let Some(Req::Producer(i)) = self.txn.reqs.remove(&r.request_id) {
                    self.txn.producers_ready[i] = true;
                    self.txn_resume();
                }
            }
            ty::ERROR => {
                // A refused PRODUCER (topic not ready): the connection is
                // closed and opened again.
                let Some(e) = cmd.error else { return };
                if let Some(Req::Producer(_)) = self.txn.reqs.get(&e.request_id) {
                    if let Some(conn) = self.txn.conn {
                        self.close_conn(conn);
                        self.connection_lost(conn, ClientRef::Txn(Role::Client), false);
                    }
                }
            }
            ty::SEND_RECEIPT => {
                let Some(r) = cmd.send_receipt else { return };
                let p = (r.producer_id as usize).saturating_sub(1);
                let Some(id) = r.message_id else { return };
                let pos = Position::new(id.ledger_id as i64, id.entry_id as i64);
                let found = self
                    .txn
                    .txns
                    .iter_mut()
                    .find_map(|(k, x)| x.sends.remove(&(p, r.sequence_id)).map(|m| (*k, m)));
                if let Some((k, m)) = found {
                    self.txn.activity.sends += 1;
                    self.checker.txn_sent(m, pos);
                    if m.1 == 0 {
                        if let Some(x) = self.txn.txns.get_mut(&k) {
                            x.receipted.push((m, pos));
                        }
                    }
                    self.txn_try_end(k);
                }
            }
            ty::SEND_ERROR => {
                let Some(r) = cmd.send_error else { return };
                let p = (r.producer_id as usize).saturating_sub(1);
                let found = self
                    .txn
                    .txns
                    .iter_mut()
                    .find_map(|(k, x)| x.sends.remove(&(p, r.sequence_id)).map(|_| *k));
                if let Some(k) = found {
                    if let Some(x) = self.txn.txns.get_mut(&k) {
                        x.uncertain = true;
                    }
                    self.txn_try_end(k);
                }
            }
            ty::NEW_TXN_RESPONSE => {
                let Some(r) = cmd.new_txn_response else {
                    return;
                };
                let Some(Req::NewTxn(k)) = self.txn.reqs.remove(&r.request_id) else {
                    return;
                };
                if r.error.is_some() {
                    self.txn.activity.coordinator_retries += 1;
                    self.txn_schedule_retry();
                    return;
                }
                let id = TxnId::new(
                    r.txnid_most_bits.unwrap_or(0),
                    r.txnid_least_bits.unwrap_or(0),
                );
                let Some(x) = self.txn.txns.get_mut(&k) else {
                    return;
                };
                if x.step != Step::New {
                    return;
                }
                x.id = Some(id);
                x.step = Step::Adding;
                let (sent_at, ttl) = (x.sent_at, x.ttl_ms);
                self.txn.activity.begun += 1;
                self.checker.txn_begun(k, sent_at, ttl);
                self.txn_add(k);
            }
            ty::ADD_PARTITION_TO_TXN_RESPONSE | ty::ADD_SUBSCRIPTION_TO_TXN_RESPONSE => {
                let Some(r) = cmd
                    .add_partition_to_txn_response
                    .or(cmd.add_subscription_to_txn_response)
                else {
                    return;
                };
                let (k, partition) = match self.txn.reqs.remove(&r.request_id) {
                    Some(Req::AddPartition(k)) => (k, true),
                    Some(Req::AddSubscription(k)) => (k, false),
                    _ => return,
                };
                match err_of(r.error) {
                    None => {
                        let Some(x) = self.txn.txns.get_mut(&k) else {
                            return;
                        };
                        if partition {
                            x.partitions_added = true;
                        } else {
                            x.subscriptions_added = true;
                        }
                        if x.step == Step::Adding && x.partitions_added && x.subscriptions_added {
                            x.step = Step::Open;
                            self.txn_open(k);
                        }
                    }
                    Some(
                        server_error::TRANSACTION_NOT_FOUND | server_error::INVALID_TXN_STATUS,
                    ) => {
                        // Not open any more: abort it.
                        if let Some(x) = self.txn.txns.get_mut(&k) {
                            x.uncertain = true;
                            if x.step == Step::Adding {
                                x.step = Step::Open;
                                x.closing = true;
                            }
                        }
                        self.txn_try_end(k);
                    }
                    Some(_) => {
                        self.txn.activity.coordinator_retries += 1;
                        self.txn_schedule_retry();
                    }
                }
            }
            ty::END_TXN_RESPONSE => {
                let Some(r) = cmd.end_txn_response else {
                    return;
                };
                let Some(Req::End(k)) = self.txn.reqs.remove(&r.request_id) else {
                    return;
                };
                self.txn_end_answered(k, r.error);
            }
            _ => {}
        }
    }

    fn txn_schedule_retry(&mut self) {
        if !self.txn.retry_scheduled {
            self.txn.retry_scheduled = true;
            self.sched.after(RETRY_MS, Ev::Txn(TxnEv::Retry));
        }
    }

    /// A timed step.
    pub(super) fn txn_event(&mut self, e: TxnEv) {
        match e {
            TxnEv::Retry => {
                self.txn.retry_scheduled = false;
                if self.txn.conn.is_some() && !self.txn.tc_ready {
                    let req = self.txn_req(Req::TcConnect);
                    self.txn_send(
                        &BrokerCommand {
                            r#type: ty::TC_CLIENT_CONNECT_REQUEST,
                            tc_client_connect_request: Some(CommandTcClientConnectRequest {
                                request_id: req,
                                tc_id: 0,
                            }),
                            ..Default::default()
                        },
                        Vec::new(),
                    );
                } else {
                    self.txn_resume();
                }
            }
            TxnEv::Next => self.txn_next(),
            TxnEv::Close(k) => {
                if let Some(x) = self.txn.txns.get_mut(&k) {
                    x.closing = true;
                }
                self.txn_try_end(k);
            }
            TxnEv::TimedOut(k) => {
                let now = self.now();
                self.checker.txn_end_requested(k, false, now);
                self.checker.txn_ended(k, TxnOutcome::Aborted, now);
                self.txn_cumulative_ended(k, TxnOutcome::Aborted);
                self.txn_check_grace();
            }
            TxnEv::Grace => self.txn.grace_passed = true,
        }
    }

    fn txn_ready(&self) -> bool {
        self.txn.conn.is_some() && self.txn.tc_ready && self.txn.producers_ready == [true; 2]
    }

    /// After a (re)connect or a retry: re-sends what has no answer.
    fn txn_resume(&mut self) {
        if !self.txn_ready() {
            return;
        }
        let live: Vec<(u64, Step)> = self
            .txn
            .txns
            .iter()
            .filter(|(_, x)| x.step != Step::Done)
            .map(|(k, x)| (*k, x.step))
            .collect();
        if live.is_empty() {
            if self.txn.started == 0 {
                self.txn_next();
            }
            return;
        }
        let pending: Vec<Req> = self.txn.reqs.values().copied().collect();
        for (k, step) in live {
            let waiting = |r: &Req| match r {
                Req::NewTxn(j) | Req::AddPartition(j) | Req::AddSubscription(j) | Req::End(j) => {
                    *j == k
                }
                _ => false,
            };
            if pending.iter().any(waiting) {
                continue;
            }
            match step {
                Step::New => self.txn_new(k),
                Step::Adding => self.txn_add(k),
                Step::Open => self.txn_try_end(k),
                Step::Ending(commit) => {
                    self.txn.activity.end_retries += 1;
                    self.txn_end_send(k, commit);
                }
                Step::Done => {}
            }
        }
    }

    /// Begins the next transaction (if any is left).
    fn txn_next(&mut self) {
        if !self.txn.stopped && self.txn.until_acked {
            let published = self.producers.iter().all(|p| p.unpublished() == 0);
            if published {
                // While the consumers drain, transactions stay available;
                // once everything is acknowledged (or after a bound, as a
                // committed transaction's message is one more to
                // acknowledge) none begins.
                self.txn.stopped = self.checker.all_acked()
                    || self.txn.started_after_publish >= MAX_TXNS_AFTER_PUBLISH;
                self.txn.started_after_publish += 1;
            }
        }
        if self.txn_all_started() {
            self.txn.stopped = true;
            self.txn_check_grace();
            return;
        }
        let k = u64::from(self.txn.started);
        self.txn.started += 1;
        let tw = &self.w.txn;
        let draw: f64 = self.rng.random();
        let end = if draw < tw.timeout_ratio {
            End::Timeout
        } else if draw < tw.timeout_ratio + tw.abort_ratio {
            End::Abort
        } else {
            End::Commit
        };
        let ttl_ms = if end == End::Timeout {
            tw.timeout_ms
        } else {
            tw.ttl_ms
        };
        self.txn.txns.insert(
            k,
            Txn {
                end,
                step: Step::New,
                id: None,
                ttl_ms,
                sent_at: 0,
                partitions_added: false,
                subscriptions_added: false,
                sends: BTreeMap::new(),
                receipted: Vec::new(),
                acks_in_flight: 0,
                acks_receipted: 0,
                uncertain: false,
                closing: false,
                end_retried: false,
            },
        );
        self.txn_new(k);
    }

    fn txn_new(&mut self, k: u64) {
        if !self.txn_ready() {
            return;
        }
        let now = self.now();
        let Some(x) = self.txn.txns.get_mut(&k) else {
            return;
        };
        x.sent_at = now;
        let ttl = x.ttl_ms;
        let req = self.txn_req(Req::NewTxn(k));
        self.txn_send(
            &BrokerCommand {
                r#type: ty::NEW_TXN,
                new_txn: Some(CommandNewTxn {
                    request_id: req,
                    txn_ttl_millis: Some(ttl),
                    tc_id: Some(0),
                }),
                ..Default::default()
            },
            Vec::new(),
        );
    }

    fn txn_add(&mut self, k: u64) {
        if !self.txn_ready() {
            return;
        }
        let Some(x) = self.txn.txns.get(&k) else {
            return;
        };
        let Some(id) = x.id else { return };
        let (p, s) = (x.partitions_added, x.subscriptions_added);
        if !p {
            let req = self.txn_req(Req::AddPartition(k));
            self.txn_send(
                &BrokerCommand {
                    r#type: ty::ADD_PARTITION_TO_TXN,
                    add_partition_to_txn: Some(CommandAddPartitionToTxn {
                        request_id: req,
                        txnid_least_bits: Some(id.least_sig_bits),
                        txnid_most_bits: Some(id.most_sig_bits),
                        partitions: vec![TOPIC.into(), TOPIC2.into()],
                    }),
                    ..Default::default()
                },
                Vec::new(),
            );
        }
        if !s {
            let req = self.txn_req(Req::AddSubscription(k));
            let subscription = self
                .subs
                .iter()
                .map(|s| TxnSubscription {
                    topic: TOPIC.into(),
                    subscription: s.clone(),
                })
                .collect();
            self.txn_send(
                &BrokerCommand {
                    r#type: ty::ADD_SUBSCRIPTION_TO_TXN,
                    add_subscription_to_txn: Some(CommandAddSubscriptionToTxn {
                        request_id: req,
                        txnid_least_bits: Some(id.least_sig_bits),
                        txnid_most_bits: Some(id.most_sig_bits),
                        subscription,
                    }),
                    ..Default::default()
                },
                Vec::new(),
            );
        }
    }

    /// The transaction is open: its messages go out to both topics and
    /// its ack window starts.
    fn txn_open(&mut self, k: u64) {
        let now = self.now();
        let Some(id) = self.txn.txns.get(&k).and_then(|x| x.id) else {
            return;
        };
        for topic in 0..2u8 {
            for i in 0..self.w.txn.messages_per_topic {
                let p = usize::from(topic);
                let seq = self.txn.next_seq[p];
                self.txn.next_seq[p] += 1;
                let meta = MessageMetadata {
                    producer_name: format!("txn-{p}"),
                    sequence_id: seq,
                    publish_time: EPOCH_BASE_MS + now,
                    txnid_least_bits: Some(id.least_sig_bits),
                    txnid_most_bits: Some(id.most_sig_bits),
                    ..MessageMetadata::default()
                };
                let body = txn_payload(k, topic, i);
                let payload = encode_entry_payload(
                    &meta,
                    &[(
                        SingleMessageMetadata {
                            partition_key: None,
                            payload_size: body.len() as i32,
                            ..SingleMessageMetadata::default()
                        },
                        body,
                    )],
                );
                if let Some(x) = self.txn.txns.get_mut(&k) {
                    x.sends.insert((p, seq), (k, topic, i));
                }
                self.txn_send(
                    &BrokerCommand {
                        r#type: ty::SEND,
                        send: Some(proto::CommandSend {
                            producer_id: p as u64 + 1,
                            sequence_id: seq,
                            num_messages: Some(1),
                            txnid_least_bits: Some(id.least_sig_bits),
                            txnid_most_bits: Some(id.most_sig_bits),
                            highest_sequence_id: None,
                            is_chunk: None,
                        }),
                        ..Default::default()
                    },
                    payload,
                );
            }
        }
        let open = self.w.txn.open_ms;
        self.sched.after(open, Ev::Txn(TxnEv::Close(k)));
    }

    /// Ends transaction `k` once its window passed and nothing of it is
    /// in flight: as planned, or by abort when an op of it is uncertain.
    fn txn_try_end(&mut self, k: u64) {
        let Some(x) = self.txn.txns.get(&k) else {
            return;
        };
        if x.step != Step::Open || !x.closing || !x.sends.is_empty() || x.acks_in_flight > 0 {
            return;
        }
        if !self.txn_ready() {
            return; // resumed after the reconnect
        }
        let (end, uncertain, sent_at, ttl) = (x.end, x.uncertain, x.sent_at, x.ttl_ms);
        let commit = match (end, uncertain) {
            (_, true) => {
                self.txn.activity.aborted_uncertain += 1;
                false
            }
            (End::Commit, false) => true,
            (End::Abort, false) => false,
            (End::Timeout, false) => {
                // Left to the coordinator's timeout; the next transaction
                // begins now.
                self.txn.activity.timed_out += 1;
                if let Some(x) = self.txn.txns.get_mut(&k) {
                    x.step = Step::Done;
                }
                let at = sent_at + ttl;
                self.sched
                    .at(at.max(self.now()), Ev::Txn(TxnEv::TimedOut(k)));
                let gap = self.w.txn.gap_ms;
                self.sched.after(gap, Ev::Txn(TxnEv::Next));
                return;
            }
        };
        let now = self.now();
        self.checker.txn_end_requested(k, commit, now);
        if let Some(x) = self.txn.txns.get_mut(&k) {
            x.step = Step::Ending(commit);
        }
        self.txn_end_send(k, commit);
    }

    fn txn_end_send(&mut self, k: u64, commit: bool) {
        let Some(id) = self.txn.txns.get(&k).and_then(|x| x.id) else {
            return;
        };
        // Move the armed crash point into this END_TXN's durable writes.
        if self.txn.crashes_during_end > 0 && self.txn.conn.is_some() {
            if let Some(p) = self.storage.armed() {
                self.txn.crashes_during_end -= 1;
                let k = self.storage.durable_writes_since_open() + self.rng.random_range(1..=6);
                self.storage.arm(CrashPoint { k, kind: p.kind });
                self.txn.activity.crash_points_in_end += 1;
            }
        }
        let req = self.txn_req(Req::End(k));
        self.txn_send(
            &BrokerCommand {
                r#type: ty::END_TXN,
                end_txn: Some(CommandEndTxn {
                    request_id: req,
                    txnid_least_bits: Some(id.least_sig_bits),
                    txnid_most_bits: Some(id.most_sig_bits),
                    txn_action: Some(if commit {
                        txn_action::COMMIT
                    } else {
                        txn_action::ABORT
                    }),
                }),
                ..Default::default()
            },
            Vec::new(),
        );
    }

    /// END_TXN of `k` answered with `error`.
    fn txn_end_answered(&mut self, k: u64, error: Option<i32>) {
        let now = self.now();
        let Some(x) = self.txn.txns.get(&k) else {
            return;
        };
        let Step::Ending(commit) = x.step else {
            return;
        };
        let within_ttl = now < x.sent_at + x.ttl_ms;
        let outcome = match error {
            None => Some(if commit {
                TxnOutcome::Committed
            } else {
                TxnOutcome::Aborted
            }),
            Some(server_error::TRANSACTION_NOT_FOUND) => {
                Some(match (commit, x.end_retried && within_ttl) {
                    (false, _) => TxnOutcome::Aborted,
                    (true, true) => TxnOutcome::Committed,
                    (true, false) => TxnOutcome::Unknown,
                })
            }
            Some(server_error::INVALID_TXN_STATUS) if commit => Some(TxnOutcome::Aborted),
            Some(server_error::INVALID_TXN_STATUS) => Some(TxnOutcome::Unknown),
            // Not ready, persistence, coordinator recovering: the
            // transaction is Committing/Aborting or still Open; END_TXN
            // again (the coordinator resumes its steps).
            Some(_) => None,
        };
        let Some(outcome) = outcome else {
            // The retry may find it ended (recovery finished it): within
            // the ttl that is the end it asked for.
            if let Some(x) = self.txn.txns.get_mut(&k) {
                x.end_retried = true;
            }
            self.txn.activity.coordinator_retries += 1;
            self.txn_schedule_retry();
            return;
        };
        match outcome {
            TxnOutcome::Committed => {
                self.txn.activity.committed += 1;
                // Its messages of the run's topic are published now (those
                // delivered before the answer already are).
                let receipted = self
                    .txn
                    .txns
                    .get(&k)
                    .map(|x| x.receipted.clone())
                    .unwrap_or_default();
                for (_, pos) in receipted {
                    self.txn_register(MessageRef {
                        position: pos,
                        batch_index: 0,
                    });
                }
            }
            TxnOutcome::Aborted => self.txn.activity.aborted += 1,
            TxnOutcome::Unknown => self.txn.activity.unknown += 1,
        }
        self.checker.txn_ended(k, outcome, now);
        if let Some(x) = self.txn.txns.get_mut(&k) {
            x.step = Step::Done;
        }
        self.txn_cumulative_ended(k, outcome);
        let gap = self.w.txn.gap_ms;
        self.sched.after(gap, Ev::Txn(TxnEv::Next));
    }

    /// Registers a transactional message of the run's topic as published
    /// (once), exempt from the order checks (it becomes visible at its
    /// commit, after later plain messages).
    fn txn_register(&mut self, m: MessageRef) {
        if self.checker.knows(m) {
            return;
        }
        self.checker.published(m, TXN_KEY, 0);
        for s in &self.subs {
            self.checker.exempt_from_order(s, m);
        }
        // Visible after a clear-backlog that covers it: skipped by it.
        self.published_after_clears(&[m]);
    }

    fn txn_check_grace(&mut self) {
        if self.txn.grace_at.is_none()
            && self.txn_all_started()
            && self.txn.txns.values().all(|x| x.step == Step::Done)
        {
            let at = self.now() + READER_GRACE_MS;
            self.txn.grace_at = Some(at);
            self.sched.at(at, Ev::Txn(TxnEv::Grace));
        }
    }

    /// A delivery on the run's topic, before the delivery rules: the
    /// max-read-position and transactional-ack rules, and a transactional
    /// message's visibility (registered as published at its first
    /// delivery).
    pub(super) fn txn_on_delivery(&mut self, sub: &str, mref: MessageRef, payload: &[u8]) {
        if !self.txn.enabled {
            return;
        }
        let now = self.now();
        self.checker.txn_delivery(0, mref.position, now);
        self.checker.txn_ack_delivery(sub, mref, now);
        if let Some(m) = parse_txn_payload(payload) {
            self.checker.txn_message_delivered(m, mref.position, now);
            self.txn_register(mref);
        }
    }

    /// Whether the next acks go inside the open transaction: its number
    /// and id (counted in flight).
    pub(super) fn txn_for_ack(&mut self) -> Option<(u64, TxnId)> {
        if !self.txn.enabled || self.w.txn.ack_ratio <= 0.0 {
            return None;
        }
        let (k, id) = self.txn.txns.iter().find_map(|(k, x)| {
            (x.step == Step::Open && !x.closing && !x.uncertain)
                .then_some(())
                .and(x.id.map(|id| (*k, id)))
        })?;
        if !self.rng.random_bool(self.w.txn.ack_ratio) {
            return None;
        }
        if let Some(x) = self.txn.txns.get_mut(&k) {
            x.acks_in_flight += 1;
        }
        Some((k, id))
    }

    /// The open transaction acks may go into now, if any (no draw, nothing
    /// counted: `deleted_ack_probe.rs`).
    pub(super) fn any_txn_open_for_acks(&self) -> Option<TxnId> {
        if !self.txn.enabled {
            return None;
        }
        self.txn.txns.values().find_map(|x| {
            (x.step == Step::Open && !x.closing && !x.uncertain)
                .then_some(())
                .and(x.id)
        })
    }

    /// A transactional ack of `msgs` on `sub` answered (`error` None: it
    /// is pending in the transaction) or lost (`lost`).
    pub(super) fn txn_ack_settled(
        &mut self,
        k: u64,
        sub: &str,
        msgs: &[MessageRef],
        error: Option<i32>,
        lost: bool,
    ) {
        if let Some(x) = self.txn.txns.get_mut(&k) {
            x.acks_in_flight = x.acks_in_flight.saturating_sub(1);
            if lost || error.is_some() {
                x.uncertain = true;
            } else {
                x.acks_receipted += 1;
            }
        }
        if lost {
            for m in msgs {
                self.checker.txn_ack_uncertain(k, sub, *m);
            }
        } else if error.is_none() {
            self.txn.activity.acks += 1;
            for m in msgs {
                self.checker.txn_acked(k, sub, *m);
            }
        } else {
            self.txn.activity.acks_refused += 1;
        }
        self.txn_try_end(k);
    }

    /// Transaction `k`'s id while it takes acks (open, its window not
    /// passed, no op of it uncertain), counted in flight; `None` otherwise.
    pub(super) fn txn_open_for_acks(&mut self, k: u64) -> Option<TxnId> {
        let x = self.txn.txns.get_mut(&k)?;
        if x.step != Step::Open || x.closing || x.uncertain {
            return None;
        }
        x.acks_in_flight += 1;
        x.id
    }

    /// The core's clock stepped forward to `core_now_ms` (run time plus
    /// the clock jumps so far, `delayed.rs`): the coordinator times a
    /// transaction out by the broker's clock (Pulsar's
    /// `TransactionMetadataStore` timeout tracker), so one whose ttl that
    /// clock now passes may be aborted at the core's next input, before
    /// the run's clock reaches its ttl, and its acknowledged entries
    /// redelivered. The checker is told its timeout may have passed (its
    /// acks may come back, `txn_end_requested` with `commit` false); one
    /// still open takes no further acks and is ended with an abort (a
    /// commit would meet `TransactionNotFound`).
    pub(super) fn txn_clock_jumped(&mut self, core_now_ms: u64) {
        if !self.txn.enabled {
            return;
        }
        let now = self.now();
        let mut reachable = Vec::new();
        for (k, x) in self.txn.txns.iter_mut() {
            if x.id.is_none() || x.sent_at.saturating_add(x.ttl_ms) > core_now_ms {
                continue;
            }
            match x.step {
                Step::Adding | Step::Open => {
                    x.uncertain = true;
                    reachable.push(*k);
                }
                // Left to its timeout (a finished one is ended in the
                // checker already, which ignores this).
                Step::Done => reachable.push(*k),
                Step::New | Step::Ending(_) => {}
            }
        }
        for k in reachable {
            self.checker.txn_end_requested(k, false, now);
        }
    }

    /// Whether transaction `k`'s commit was requested and not answered
    /// (the broker may have applied its acks already).
    pub(super) fn txn_commit_in_flight(&self, k: u64) -> bool {
        self.txn
            .txns
            .get(&k)
            .is_some_and(|x| x.step == Step::Ending(true))
    }

    /// A transactional cumulative ack of `k` answered (`ok`: pending in
    /// it): [`Self::txn_ack_settled`]'s bookkeeping of the transaction
    /// (`txn_cumulative.rs` counts it and tells the checker).
    pub(super) fn txn_cumulative_op_settled(&mut self, k: u64, ok: bool) {
        if let Some(x) = self.txn.txns.get_mut(&k) {
            x.acks_in_flight = x.acks_in_flight.saturating_sub(1);
            if ok {
                x.acks_receipted += 1;
            } else {
                x.uncertain = true;
            }
        }
        self.txn_try_end(k);
    }

    /// A transaction drawn for a poll's acks that had none to make.
    pub(super) fn txn_ack_unused(&mut self, k: u64) {
        if let Some(x) = self.txn.txns.get_mut(&k) {
            x.acks_in_flight = x.acks_in_flight.saturating_sub(1);
        }
        self.txn_try_end(k);
    }

    fn reader_send(&mut self, cmd: &BrokerCommand) {
        if let Some(conn) = self.txn.reader_conn {
            self.send_to_broker(conn, frame(cmd, Vec::new()));
        }
    }

    fn reader_command(&mut self, _conn: u64, cmd: BrokerCommand, f: &CutFrame) {
        match cmd.r#type {
            ty::CONNECTED => {
                // Its FLOWs are fixed grants, not the PIP-491 client state's.
                #[cfg(feature = "trace")]
                crate::trace::permits::raw_client((_conn, 1));
                self.txn.reader_req += 1;
                let req = self.txn.reader_req;
                self.reader_send(&BrokerCommand {
                    r#type: ty::SUBSCRIBE,
                    subscribe: Some(CommandSubscribe {
                        topic: TOPIC2.into(),
                        subscription: READER_SUB.into(),
                        sub_type: wire::SubType::Shared as i32,
                        consumer_id: 1,
                        request_id: req,
                        consumer_name: Some("txn-reader".into()),
                        priority_level: None,
                        durable: None,
                        initial_position: Some(1),
                        key_shared_meta: None,
                        consumer_epoch: None,
                    }),
                    ..Default::default()
                });
            }
            ty::SUCCESS => {
                self.txn.reader_received = 0;
                self.reader_send(&BrokerCommand {
                    r#type: ty::FLOW,
                    flow: Some(CommandFlow {
                        consumer_id: 1,
                        message_permits: READER_PERMITS,
                    }),
                    ..Default::default()
                });
            }
            // A refused subscribe, or the broker closed the reader's
            // consumer (a failed MESSAGE write; Pulsar's client subscribes
            // again): reconnect, and the subscription redelivers what was
            // not acknowledged.
            ty::ERROR | ty::CLOSE_CONSUMER => {
                if cmd.r#type == ty::CLOSE_CONSUMER {
                    self.txn.activity.reader_closed_by_broker += 1;
                }
                if let Some(conn) = self.txn.reader_conn {
                    self.close_conn(conn);
                    self.connection_lost(conn, ClientRef::Txn(Role::Reader), false);
                }
            }
            ty::MESSAGE => {
                let Some(m) = cmd.message else { return };
                let pos =
                    Position::new(m.message_id.ledger_id as i64, m.message_id.entry_id as i64);
                let now = self.now();
                self.txn.activity.reader_deliveries += 1;
                self.checker.txn_delivery(1, pos, now);
                let payload = crate::proto::frame::parse_entry_payload(f.payload())
                    .ok()
                    .and_then(|p| parse_txn_payload(p.payload));
                match payload {
                    Some(t) => self.checker.txn_message_delivered(t, pos, now),
                    None => self.checker.livelock(
                        &format!("{READER_SUB}: {pos} on {TOPIC2} is not a transactional message of the run"),
                        now,
                    ),
                }
                self.reader_send(&BrokerCommand {
                    r#type: ty::ACK,
                    ack: Some(CommandAck {
                        consumer_id: 1,
                        ack_type: 0,
                        message_id: vec![MessageIdData {
                            ledger_id: m.message_id.ledger_id,
                            entry_id: m.message_id.entry_id,
                            ..Default::default()
                        }],
                        validation_error: None,
                        txnid_least_bits: None,
                        txnid_most_bits: None,
                        request_id: None,
                    }),
                    ..Default::default()
                });
                self.txn.reader_received += 1;
                if self.txn.reader_received >= READER_PERMITS / 2 {
                    let n = self.txn.reader_received;
                    self.txn.reader_received = 0;
                    self.reader_send(&BrokerCommand {
                        r#type: ty::FLOW,
                        flow: Some(CommandFlow {
                            consumer_id: 1,
                            message_permits: n,
                        }),
                        ..Default::default()
                    });
                }
            }
            _ => {}
        }
    }
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests {
    use super::*;

    #[test]
    fn a_transactional_payload_names_its_transaction_topic_and_index() {
        assert_eq!(parse_txn_payload(&txn_payload(7, 1, 2)), Some((7, 1, 2)));
        assert_eq!(parse_txn_payload(b"0 1 0 3 0"), None);
    }

    #[test]
    fn the_core_reads_the_txnid_of_a_transactional_message() {
        let meta = MessageMetadata {
            producer_name: "p".into(),
            sequence_id: 1,
            publish_time: 2,
            txnid_least_bits: Some(9),
            txnid_most_bits: Some(0),
            ..MessageMetadata::default()
        };
        let body = txn_payload(1, 0, 0);
        let e = encode_entry_payload(
            &meta,
            &[(
                SingleMessageMetadata {
                    partition_key: None,
                    payload_size: body.len() as i32,
                    ..SingleMessageMetadata::default()
                },
                body,
            )],
        );
        assert_eq!(
            crate::broker::txn::entry_txn(&e),
            crate::broker::txn::EntryTxn::Data(TxnId::new(0, 9))
        );
    }
}
