//! Group commit of SENDs: the entries a driver turn hands the core, across
//! connections, producers and topics, are appended to their managed ledgers
//! in ONE store transaction (one fsync), and every SEND_RECEIPT waits for
//! that commit (Pulsar answers a publish when BookKeeper's journal, which
//! also groups adds, completes the add).
//!
//! A SEND that passes validation and deduplication joins the turn's batch
//! (`Broker::handle_send`): nothing is written and no reply is queued.
//! [`Broker::flush`] (run by [`Broker::poll_output`]) commits the batch:
//! every topic's entries are planned on its ledger
//! ([`crate::ledger::ManagedLedger::plan_append`]), written with
//! [`RedbStore::append_in`] in one transaction, and only after its commit
//! applied to the ledgers (so a new entry is readable and dispatchable only
//! once committed, and its MESSAGE, like its receipt, leaves only after the
//! turn's fsynced commit, `turn_commit.rs`, as Pulsar dispatches only after
//! the add completes),
//! recorded by deduplication and the transaction buffer, and answered:
//! SEND_RECEIPT with its position, or `PersistenceError` for every entry
//! of a failed commit (nothing of it is stored; the clients reconnect and
//! resend). Then the topics that got entries dispatch.
//!
//! Order: every reply to a SEND of the turn (a refusal, a duplicate's
//! receipt) is held behind the batch and released in arrival order, so a
//! producer's receipts and errors keep its send order (the clients match
//! receipts to their pending queue in order). A command that depends on the
//! batch's outcome (anything but SEND, ACK, FLOW, PING, PONG, redelivery and
//! lookups: producer and consumer changes, END_TXN and the other
//! transaction commands, seeks, GET_LAST_MESSAGE_ID) and a connection
//! opening or closing or the timer commit the batch first
//! (`Broker::commit_sends`), so a transaction's marker follows its
//! entries and a CLOSE_PRODUCER's success follows the producer's pending
//! receipts (Pulsar's `Producer.close` waits for pending publishes).
//!
//! Deduplication across the batch: an entry joining the batch is *pushed*
//! ([`super::dedup::Deduplication::pushed`]); a SEND at or below a pushed
//! sequence id is neither stored nor judged yet ([`Verdict::Pending`],
//! Pulsar's `Unknown`): after the commit it gets a duplicate's receipt
//! (`(-1, -1)`) when the batch committed, `PersistenceError` when it did
//! not. A crash inside the batch (before its commit is durable) loses every
//! entry of it and sends no receipt; the map is rebuilt from the ledger at
//! the next open, so a resend is stored exactly once either way.
//!
//! Bound: a batch holds at most [`MAX_BATCH_ENTRIES`] entries and
//! [`MAX_BATCH_BYTES`] payload bytes (one entry above the byte bound is a
//! batch alone); a SEND that would exceed either commits the batch first.
//! The added delay is the driver's handling of the turn's frames (`serve`:
//! the frames already buffered on every connection; the simulator's node
//! engine: every delivery of bytes at one virtual instant). A driver that polls after every frame
//! gets one commit per SEND, as without grouping.

use std::collections::BTreeMap;

use crate::ledger::{PlannedAppend, RedbStore};
use crate::proto::command::{self, server_error, ty, BrokerCommand};
use crate::proto::wire::MessageIdData;
use crate::Position;

use super::chunking::ChunkPart;
use super::txn::{EntryTxn, TxnId};
use super::{Broker, ConnectionId};

#[cfg(doc)]
use super::dedup::Verdict;

/// Most entries one group commit of SENDs holds.
pub const MAX_BATCH_ENTRIES: usize = 1024;
/// Most payload bytes one group commit of SENDs holds (a single larger
/// entry is committed alone).
pub const MAX_BATCH_BYTES: usize = 8 * 1024 * 1024;

/// The fields of a SEND its reply names.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SendId {
    pub(crate) producer_id: u64,
    pub(crate) sequence_id: u64,
    pub(crate) highest_sequence_id: Option<u64>,
}

impl SendId {
    pub(crate) fn of(s: &command::CommandSend) -> Self {
        Self {
            producer_id: s.producer_id,
            sequence_id: s.sequence_id,
            highest_sequence_id: s.highest_sequence_id,
        }
    }
}

/// An entry waiting for the batch's commit.
#[derive(Debug)]
pub(crate) struct PendingEntry {
    pub(crate) conn: ConnectionId,
    pub(crate) send: SendId,
    pub(crate) topic: String,
    pub(crate) producer_name: String,
    pub(crate) chunk: Option<ChunkPart>,
    pub(crate) txn: Option<TxnId>,
    pub(crate) payload: Vec<u8>,
}

/// One SEND of the turn, in arrival order.
#[derive(Debug)]
enum Held {
    /// To append; its receipt after the commit.
    Entry(PendingEntry),
    /// A duplicate of an entry of this batch ([`Verdict::Pending`]).
    DupOfPending { conn: ConnectionId, send: SendId },
    /// A reply already decided (a refusal, a duplicate of a persisted
    /// entry), held to keep the producer's order.
    Reply {
        conn: ConnectionId,
        cmd: Box<BrokerCommand>,
    },
}

/// The SENDs of the current turn.
#[derive(Debug, Default)]
pub(crate) struct SendBatch {
    held: Vec<Held>,
    entries: usize,
    bytes: usize,
}

impl SendBatch {
    /// Whether a SEND's reply must wait behind the batch.
    pub(crate) fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Whether an entry of `len` bytes fits without exceeding a bound.
    pub(crate) fn fits(&self, len: usize) -> bool {
        self.entries == 0
            || (self.entries < MAX_BATCH_ENTRIES
                && self.bytes.saturating_add(len) <= MAX_BATCH_BYTES)
    }
}

/// SEND_RECEIPT of `send` at message id `(ledger_id, entry_id)`.
pub(crate) fn receipt_cmd(send: SendId, ledger_id: u64, entry_id: u64) -> BrokerCommand {
    BrokerCommand {
        r#type: ty::SEND_RECEIPT,
        send_receipt: Some(command::CommandSendReceipt {
            producer_id: send.producer_id,
            sequence_id: send.sequence_id,
            message_id: Some(MessageIdData {
                ledger_id,
                entry_id,
                ..Default::default()
            }),
            highest_sequence_id: Some(send.highest_sequence_id.unwrap_or(0)),
        }),
        ..Default::default()
    }
}

/// SEND_ERROR of `send`.
pub(crate) fn send_error_cmd(send: SendId, error: i32, message: String) -> BrokerCommand {
    BrokerCommand {
        r#type: ty::SEND_ERROR,
        send_error: Some(command::CommandSendError {
            producer_id: send.producer_id,
            sequence_id: send.sequence_id,
            error,
            message,
        }),
        ..Default::default()
    }
}

/// The receipt of a duplicate (Pulsar's `(-1, -1)`).
pub(crate) fn dup_receipt_cmd(send: SendId) -> BrokerCommand {
    receipt_cmd(send, u64::MAX, u64::MAX)
}

/// Whether a command of type `t` may be handled with SENDs of the turn
/// still uncommitted (it neither reads nor changes what their outcome
/// decides).
pub(crate) fn passes_batch(t: i32) -> bool {
    matches!(
        t,
        ty::SEND
            | ty::ACK
            | ty::FLOW
            | ty::PING
            | ty::PONG
            | ty::REDELIVER_UNACKNOWLEDGED_MESSAGES
            | ty::LOOKUP
            | ty::PARTITIONED_METADATA
    )
}

impl Broker {
    /// A SEND's reply: queued now, or held behind the turn's batch when it
    /// holds SENDs (the producer's order).
    pub(crate) fn send_reply(&mut self, conn: ConnectionId, cmd: BrokerCommand) {
        if self.sends.is_empty() {
            self.reply(conn, cmd);
        } else {
            self.sends.held.push(Held::Reply {
                conn,
                cmd: Box::new(cmd),
            });
        }
    }

    /// A duplicate of an entry of the batch: answered after its commit.
    pub(crate) fn hold_dup_of_pending(&mut self, conn: ConnectionId, send: SendId) {
        self.sends.held.push(Held::DupOfPending { conn, send });
    }

    /// Adds `e` to the turn's batch (committing the batch first when `e`
    /// would exceed its bound).
    pub(crate) fn hold_entry(&mut self, e: PendingEntry) {
        if !self.sends.fits(e.payload.len()) {
            self.commit_sends();
        }
        if let Some(t) = self.topics.get_mut(&e.topic) {
            t.dedup.pushed(
                &e.producer_name,
                e.send.sequence_id,
                e.send.highest_sequence_id.unwrap_or(0),
                e.chunk,
            );
        }
        self.sends.entries += 1;
        self.sends.bytes = self.sends.bytes.saturating_add(e.payload.len());
        self.sends.held.push(Held::Entry(e));
    }

    /// Commits the turn's SENDs in one store transaction, then answers
    /// them in arrival order and dispatches the topics that got entries
    /// (see the module docs). A no-op without SENDs.
    pub(crate) fn commit_sends(&mut self) {
        if self.sends.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut self.sends);
        // Each topic's entries, in arrival order (indexes into `held`).
        let mut by_topic: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (i, h) in batch.held.iter().enumerate() {
            if let Held::Entry(e) = h {
                by_topic.entry(e.topic.clone()).or_default().push(i);
            }
        }
        let payloads = |ids: &[usize]| -> Vec<&[u8]> {
            ids.iter()
                .filter_map(|i| match &batch.held[*i] {
                    Held::Entry(e) => Some(e.payload.as_slice()),
                    _ => None,
                })
                .collect()
        };
        let committed = self.append_all(&by_topic, &payloads);
        let mut positions: BTreeMap<usize, Position> = BTreeMap::new();
        let now = self.now();
        if let Ok(applied) = &committed {
            for (topic, ids) in &by_topic {
                let Some(ps) = applied.get(topic) else {
                    continue;
                };
                let Some(t) = self.topics.get_mut(topic) else {
                    continue;
                };
                for (i, pos) in ids.iter().zip(ps) {
                    let Held::Entry(e) = &batch.held[*i] else {
                        continue;
                    };
                    t.dedup.persisted(
                        &e.producer_name,
                        e.send.sequence_id,
                        e.send.highest_sequence_id.unwrap_or(0),
                        e.chunk,
                        *pos,
                        now,
                    );
                    if let Some(id) = e.txn {
                        t.buffer.lock().observe(*pos, EntryTxn::Data(id));
                    }
                    positions.insert(*i, *pos);
                }
            }
        }
        for topic in by_topic.keys() {
            if let Some(t) = self.topics.get_mut(topic) {
                t.dedup.commit_ended();
            }
        }
        if let Err(e) = &committed {
            tracing::warn!(entries = batch.entries, error = %e, "group commit of SENDs failed");
        }
        for (i, h) in batch.held.into_iter().enumerate() {
            let (conn, cmd) = match h {
                Held::Entry(e) => match positions.get(&i) {
                    Some(p) => (
                        e.conn,
                        receipt_cmd(e.send, p.ledger_id as u64, p.entry_id as u64),
                    ),
                    None => (
                        e.conn,
                        send_error_cmd(
                            e.send,
                            server_error::PERSISTENCE_ERROR,
                            committed
                                .as_ref()
                                .err()
                                .cloned()
                                .unwrap_or_else(|| format!("topic {} is gone", e.topic)),
                        ),
                    ),
                },
                Held::DupOfPending { conn, send } => match &committed {
                    Ok(_) => (conn, dup_receipt_cmd(send)),
                    Err(msg) => (
                        conn,
                        send_error_cmd(send, server_error::PERSISTENCE_ERROR, msg.clone()),
                    ),
                },
                Held::Reply { conn, cmd } => (conn, *cmd),
            };
            // A connection gone since: its client resends on a new one.
            if self.conns.contains_key(&conn) {
                self.reply(conn, cmd);
            }
        }
        for topic in by_topic.keys() {
            if let Some(t) = self.topics.get_mut(topic) {
                for sub in t.subscriptions.values_mut() {
                    if !sub.consumers.is_empty() {
                        sub.dispatch(&t.ml, &mut self.out);
                    }
                }
            }
        }
    }

    /// Plans every topic's entries, writes them in one store transaction,
    /// commits, and applies them to the ledgers: each topic's positions.
    fn append_all<'a>(
        &self,
        by_topic: &BTreeMap<String, Vec<usize>>,
        payloads: &dyn Fn(&[usize]) -> Vec<&'a [u8]>,
    ) -> Result<BTreeMap<String, Vec<Position>>, String> {
        let mut plans: Vec<(&String, PlannedAppend, Vec<&[u8]>)> = Vec::new();
        for (topic, ids) in by_topic {
            let t = self
                .topics
                .get(topic)
                .ok_or_else(|| format!("topic {topic} is gone"))?;
            let ps = payloads(ids);
            let plan = t.ml.plan_append(&ps).map_err(|e| e.to_string())?;
            plans.push((topic, plan, ps));
        }
        let txn = self.store.begin().map_err(|e| e.to_string())?;
        for (topic, plan, ps) in &plans {
            let ledger = self.topics.get(*topic).map_or("", |t| t.ml.name());
            RedbStore::append_in(&txn, ledger, &plan.segments(ps)).map_err(|e| e.to_string())?;
        }
        txn.commit().map_err(|e| e.to_string())?;
        let mut out = BTreeMap::new();
        for (topic, plan, _) in &plans {
            if let Some(t) = self.topics.get(*topic) {
                let ps = t.ml.apply_append(plan).map_err(|e| e.to_string())?;
                out.insert((*topic).clone(), ps);
            }
        }
        Ok(out)
    }
}
