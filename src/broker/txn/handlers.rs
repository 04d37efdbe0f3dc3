//! The transactional commands of a connection and the node-internal END_TXN
//! steps (see the module docs of [`super`]).

use std::collections::{BTreeMap, BTreeSet};
// Ownership handles use std's Arc in every build (see `ledger::managed_ledger`).
use std::sync::Arc;

use crate::ledger::ManagedLedger;
use crate::pending_ack::{
    AckType, AckedPosition, CursorSubscription, HandleConfig, HandleState, InlineReads,
    PendingAckError, PendingAckHandle, PendingAckRecord,
};
use crate::proto::wire::CommandAck;
use crate::sync::Mutex;
use crate::Position;

use super::buffer::{entry_txn, EntryTxn, TxnBuffer};
use super::coordinator::{Coordinator, TxnError};
use super::{backoff_ms, TxnId};
use crate::broker::entry::entry_info;
use crate::broker::error::{comp, BrokerError};
use crate::broker::subscription::{sub_type, Subscription};
use crate::broker::{Broker, ConnectionId, Topic};
use crate::proto::command::{self, ty, BrokerCommand};
use crate::proto::txn::{self as tproto, marker_type, txn_action};

/// Name of the pending-ack log cursor (Pulsar's `__pending_ack_state`).
pub const PENDING_ACK_CURSOR: &str = "__pending_ack_state";

fn txn_of(most: Option<u64>, least: Option<u64>) -> TxnId {
    TxnId::new(most.unwrap_or(0), least.unwrap_or(0))
}

/// Appends `record` through `h` (Ready, batching off: the append and its
/// callback complete inside the call).
fn append_sync(h: &PendingAckHandle, record: PendingAckRecord) -> Result<(), PendingAckError> {
    let slot = Arc::new(Mutex::new(None));
    let s2 = Arc::clone(&slot);
    h.append(
        record,
        Box::new(move |r| {
            *s2.lock() = Some(r.map(|_| ()));
        }),
    );
    let r = slot.lock().take();
    r.unwrap_or_else(|| {
        Err(PendingAckError::NotReady {
            name: h.name().to_string(),
            state: "append not completed",
        })
    })
}

fn pa_error(e: PendingAckError) -> TxnError {
    match e {
        PendingAckError::AckConflict { .. } => TxnError::Conflict(e.to_string()),
        PendingAckError::InvalidRecord(m) => TxnError::NotAllowed(m),
        PendingAckError::NotReady { .. } | PendingAckError::Closed { .. } => {
            TxnError::NotReady(e.to_string())
        }
        other => TxnError::Persistence(other.to_string()),
    }
}

impl Broker {
    /// The coordinator, opening (recovering) it if needed; a failed open
    /// is retried only after its backoff.
    pub(crate) fn txn_ready(&mut self) -> Result<(), TxnError> {
        if self.txn.coordinator.is_none() {
            let now = self.now();
            if now < self.txn.coordinator_retry_at {
                return Err(TxnError::CoordinatorNotFound(format!(
                    "transaction coordinator 0 is recovering (next attempt at {})",
                    self.txn.coordinator_retry_at
                )));
            }
            match Coordinator::open(&self.store, 0) {
                Ok(c) => {
                    self.txn.coordinator = Some(c);
                    self.txn.coordinator_failures = 0;
                }
                Err(e) => {
                    self.txn.coordinator_retry_at =
                        now.saturating_add(backoff_ms(self.txn.coordinator_failures));
                    self.txn.coordinator_failures += 1;
                    tracing::warn!(error = %e, retry_at = self.txn.coordinator_retry_at, "transaction coordinator recovery failed");
                    return Err(TxnError::CoordinatorNotFound(format!(
                        "transaction coordinator 0 not loaded: {e}"
                    )));
                }
            }
            self.finish_ending();
        }
        Ok(())
    }

    /// Finishes every transaction left Committing/Aborting (recovery, or a
    /// step that failed): redoes the partition and subscription steps, then
    /// logs the final state. A failure leaves it for the next retry.
    fn finish_ending(&mut self) {
        let ending = self
            .txn
            .coordinator
            .as_ref()
            .map(Coordinator::ending)
            .unwrap_or_default();
        let mut failed = false;
        for t in ending {
            let commit = t.status == tproto::txn_status::COMMITTING;
            match self.end_steps(t.id, commit) {
                Ok(()) => tracing::info!(txn = ?t.id, commit, "ending transaction finished"),
                Err(e) => {
                    failed = true;
                    tracing::warn!(txn = ?t.id, error = %e, "ending transaction not finished yet");
                }
            }
        }
        if failed {
            let now = self.now();
            self.txn.coordinator_retry_at =
                now.saturating_add(backoff_ms(self.txn.coordinator_failures));
            self.txn.coordinator_failures += 1;
        }
    }

    /// The next transaction deadline: an open transaction's timeout, a
    /// pending-ack replay retry, a coordinator recovery retry.
    pub(crate) fn txn_timeout(&self) -> Option<u64> {
        let c = match &self.txn.coordinator {
            None => Some(self.txn.coordinator_retry_at),
            Some(c) if !c.ending().is_empty() => Some(self.txn.coordinator_retry_at),
            Some(c) => c.next_timeout(),
        };
        let pending_ack_retry = self.txn.timer.next_due_ms();
        let unapplied = self
            .topics
            .values()
            .flat_map(|t| t.subscriptions.values())
            .any(|s| {
                !s.pending_ack_applied
                    && s.pending_ack
                        .as_ref()
                        .is_some_and(|h| h.state() == HandleState::Ready)
            });
        [
            c,
            pending_ack_retry,
            unapplied.then(|| self.now()),
            self.snapshot_timeout(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Timer work: recovery retries, timed-out transactions aborted, the
    /// commits of pending-ack replays that became Ready re-applied.
    pub(crate) fn txn_timers(&mut self) {
        let now = self.now();
        if self.txn.coordinator.is_none() {
            let _ = self.txn_ready();
        } else if self
            .txn
            .coordinator
            .as_ref()
            .is_some_and(|c| !c.ending().is_empty())
            && now >= self.txn.coordinator_retry_at
        {
            self.finish_ending();
        }
        let expired = self
            .txn
            .coordinator
            .as_ref()
            .map(|c| c.expired(now))
            .unwrap_or_default();
        for id in expired {
            tracing::info!(txn = ?id, "transaction timed out: aborting");
            if let Err(e) = self.end_txn(id, false) {
                tracing::warn!(txn = ?id, error = %e, "timeout abort not finished yet");
            }
        }
        let subs: Vec<(String, String)> = self
            .topics
            .iter()
            .flat_map(|(t, topic)| {
                topic
                    .subscriptions
                    .iter()
                    .filter(|(_, s)| !s.pending_ack_applied && s.pending_ack.is_some())
                    .map(move |(n, _)| (t.clone(), n.clone()))
            })
            .collect();
        for (t, s) in subs {
            self.apply_recovered_commits(&t, &s);
            self.dispatch_sub(&t, &s);
        }
        self.snapshot_timers();
    }

    /// Recovers the transaction buffer of topic `name` (backoff after a
    /// failed attempt; a failed attempt never opens the topic).
    pub(crate) fn recover_buffer(
        &mut self,
        name: &str,
        ml: &Arc<ManagedLedger>,
    ) -> Result<TxnBuffer, BrokerError> {
        let now = self.now();
        if let Some((_, at)) = self.txn.buffer_retry.get(name) {
            if now < *at {
                return Err(BrokerError::NotReady(format!(
                    "topic {}: transaction buffer recovering (next attempt at {at})",
                    crate::broker::name_for_error(name)
                )));
            }
        }
        match self.recover_buffer_attempt(name, ml) {
            Ok(b) => {
                self.txn.buffer_retry.remove(name);
                if !b.ongoing().is_empty() {
                    tracing::info!(
                        topic = name,
                        ongoing = b.ongoing().len(),
                        "transaction buffer recovered"
                    );
                }
                Ok(b)
            }
            Err(e) => {
                let failures = self.txn.buffer_retry.get(name).map_or(0, |(n, _)| *n);
                let at = now.saturating_add(backoff_ms(failures));
                self.txn
                    .buffer_retry
                    .insert(name.to_string(), (failures + 1, at));
                tracing::warn!(topic = name, error = %e, retry_at = at, "transaction buffer recovery failed; topic not opened");
                Err(e)
            }
        }
    }

    /// Wires subscription `sub` of `topic` into transactions: the topic's
    /// buffer, and its pending-ack handle (opened and replayed now; the
    /// commits the replay hands back are re-applied and persisted).
    pub(crate) fn attach_txn(&mut self, topic: &str, sub: &str) -> Result<(), BrokerError> {
        let store = Arc::clone(&self.ledgers);
        let auto_skip = self.config.ledger.auto_skip_non_recoverable_data;
        let pending_ack_log = crate::ledger::LedgerConfig {
            auto_skip_non_recoverable_data: auto_skip,
            ..crate::ledger::LedgerConfig::default()
        };
        let pool = Arc::clone(&self.txn.pool);
        let timer = Arc::clone(&self.txn.timer);
        let Some(t) = self.topics.get_mut(topic) else {
            return Ok(());
        };
        let buffer = Arc::clone(&t.buffer);
        let ml = Arc::clone(&t.ml);
        let Some(s) = t.subscriptions.get_mut(sub) else {
            return Ok(());
        };
        s.buffer = buffer;
        if s.pending_ack.is_none() {
            let pa = ManagedLedger::open(
                format!("{topic}-{sub}__transaction_pending_ack"),
                pending_ack_log,
                store,
            )
            .map_err(comp)?;
            let cursor = Arc::new(pa.open_cursor(PENDING_ACK_CURSOR).map_err(comp)?);
            let view = CursorSubscription::new(Arc::clone(&s.cursor), Arc::clone(&s.deletion));
            let config = HandleConfig::default();
            let replay = config.replay;
            let h = PendingAckHandle::new(
                format!("{topic}-{sub}"),
                Arc::clone(&cursor),
                Arc::new(view),
                &pool,
                Arc::new(InlineReads),
                timer,
                config,
            )
            .map_err(comp)?;
            // The log's own auto-skip setting: the spec's `autoSkip`.
            crate::trace::pending_ack::opened(h.name(), &pa, &cursor, &replay, auto_skip);
            h.init();
            pool.run_pending();
            s.pending_ack = Some(h);
            s.pending_ack_applied = false;
            let _ = &ml;
        }
        self.apply_recovered_commits(topic, sub);
        Ok(())
    }

    /// Once the pending-ack handle of `topic`/`sub` is Ready: re-applies
    /// the commits its log holds that the subscription's persisted state
    /// lacks, persists the subscription, tells the handle; and rebuilds the
    /// set of entries pending in open transactions (not dispatched).
    fn apply_recovered_commits(&mut self, topic: &str, sub: &str) {
        let Some(t) = self.topics.get_mut(topic) else {
            return;
        };
        let ml = Arc::clone(&t.ml);
        let Some(s) = t.subscriptions.get_mut(sub) else {
            return;
        };
        if s.pending_ack_applied {
            return;
        }
        let Some(h) = s.pending_ack.clone() else {
            return;
        };
        if h.state() != HandleState::Ready {
            return;
        }
        let acks = h.committed_acks();
        if !acks.is_empty() {
            let view = CursorSubscription::new(Arc::clone(&s.cursor), Arc::clone(&s.deletion));
            for a in &acks {
                if let Err(e) = view.apply(a, ml.as_ref()) {
                    tracing::warn!(topic, subscription = sub, error = %e, "re-applying a committed ack failed");
                    return;
                }
            }
            if let Err(e) = s.persist_and_settle() {
                tracing::warn!(topic, subscription = sub, error = %e, "persisting re-applied commits failed");
                return;
            }
            h.subscription_persisted();
            s.counters.commits_reapplied += acks.len() as u64;
            tracing::info!(
                topic,
                subscription = sub,
                reapplied = acks.len(),
                "committed transactional acks re-applied"
            );
        }
        let summary = h.summary();
        s.txn_pending = summary.individual.values().flatten().copied().collect();
        s.refresh_txn_batch_pending(&summary);
        s.pending_ack_applied = true;
    }

    /// A transactional command (`TC_CLIENT_CONNECT_REQUEST`, `NEW_TXN`,
    /// `ADD_PARTITION_TO_TXN`, `ADD_SUBSCRIPTION_TO_TXN`, `END_TXN`).
    pub(crate) fn handle_txn_command(&mut self, conn: ConnectionId, cmd: BrokerCommand) {
        match cmd.r#type {
            ty::TC_CLIENT_CONNECT_REQUEST => {
                let c = cmd.tc_client_connect_request.unwrap_or_default();
                let r = if c.tc_id != 0 {
                    Err(TxnError::CoordinatorNotFound(format!(
                        "transaction coordinator {} not found (this node runs coordinator 0)",
                        c.tc_id
                    )))
                } else {
                    self.txn_ready()
                };
                let (error, message) = split(&r);
                self.reply_cmd(
                    conn,
                    BrokerCommand {
                        r#type: ty::TC_CLIENT_CONNECT_RESPONSE,
                        tc_client_connect_response: Some(tproto::CommandTcClientConnectResponse {
                            request_id: c.request_id,
                            error,
                            message,
                        }),
                        ..Default::default()
                    },
                );
            }
            ty::NEW_TXN => {
                let c = cmd.new_txn.unwrap_or_default();
                let now = self.now();
                let r = if c.tc_id.unwrap_or(0) != 0 {
                    Err(TxnError::CoordinatorNotFound(format!(
                        "transaction coordinator {} not found",
                        c.tc_id.unwrap_or(0)
                    )))
                } else {
                    self.txn_ready().and_then(|()| {
                        self.coordinator()?
                            .new_txn(c.txn_ttl_millis.unwrap_or(0), now)
                    })
                };
                let id = r.as_ref().ok().copied();
                let (error, message) = split(&r);
                self.reply_cmd(
                    conn,
                    BrokerCommand {
                        r#type: ty::NEW_TXN_RESPONSE,
                        new_txn_response: Some(response(c.request_id, id, error, message)),
                        ..Default::default()
                    },
                );
            }
            ty::ADD_PARTITION_TO_TXN => {
                let c = cmd.add_partition_to_txn.unwrap_or_default();
                let id = txn_of(c.txnid_most_bits, c.txnid_least_bits);
                let now = self.now();
                let r = c
                    .partitions
                    .iter()
                    .map(|p| {
                        crate::broker::normalize_topic(p)
                            .map_err(|e| TxnError::NotAllowed(e.to_string()))
                    })
                    .collect::<Result<Vec<String>, TxnError>>()
                    .and_then(|ps| {
                        self.txn_ready()?;
                        self.coordinator()?.add_partitions(id, &ps, now)
                    });
                let (error, message) = split(&r);
                self.reply_cmd(
                    conn,
                    BrokerCommand {
                        r#type: ty::ADD_PARTITION_TO_TXN_RESPONSE,
                        add_partition_to_txn_response: Some(response(
                            c.request_id,
                            Some(id),
                            error,
                            message,
                        )),
                        ..Default::default()
                    },
                );
            }
            ty::ADD_SUBSCRIPTION_TO_TXN => {
                let c = cmd.add_subscription_to_txn.unwrap_or_default();
                let id = txn_of(c.txnid_most_bits, c.txnid_least_bits);
                let now = self.now();
                let r = c
                    .subscription
                    .iter()
                    .map(|s| {
                        crate::broker::normalize_topic(&s.topic)
                            .map(|t| (t, s.subscription.clone()))
                            .map_err(|e| TxnError::NotAllowed(e.to_string()))
                    })
                    .collect::<Result<Vec<(String, String)>, TxnError>>()
                    .and_then(|ss| {
                        self.txn_ready()?;
                        self.coordinator()?.add_subscriptions(id, &ss, now)
                    });
                let (error, message) = split(&r);
                self.reply_cmd(
                    conn,
                    BrokerCommand {
                        r#type: ty::ADD_SUBSCRIPTION_TO_TXN_RESPONSE,
                        add_subscription_to_txn_response: Some(response(
                            c.request_id,
                            Some(id),
                            error,
                            message,
                        )),
                        ..Default::default()
                    },
                );
            }
            ty::END_TXN => {
                let c = cmd.end_txn.unwrap_or_default();
                let id = txn_of(c.txnid_most_bits, c.txnid_least_bits);
                let r = match c.txn_action {
                    Some(txn_action::COMMIT) => self.end_txn(id, true),
                    Some(txn_action::ABORT) => self.end_txn(id, false),
                    other => Err(TxnError::NotAllowed(format!(
                        "END_TXN with txn_action {other:?}"
                    ))),
                };
                let (error, message) = split(&r);
                self.reply_cmd(
                    conn,
                    BrokerCommand {
                        r#type: ty::END_TXN_RESPONSE,
                        end_txn_response: Some(response(c.request_id, Some(id), error, message)),
                        ..Default::default()
                    },
                );
            }
            _ => {}
        }
    }

    fn reply_cmd(&mut self, conn: ConnectionId, cmd: BrokerCommand) {
        self.out.frame(conn, &cmd, Vec::new());
    }

    pub(crate) fn coordinator(&mut self) -> Result<&mut Coordinator, TxnError> {
        self.txn.coordinator.as_mut().ok_or_else(|| {
            TxnError::CoordinatorNotFound("transaction coordinator 0 not loaded".into())
        })
    }

    /// `END_TXN`: Open → Committing/Aborting (durable), then the steps.
    pub(crate) fn end_txn(&mut self, id: TxnId, commit: bool) -> Result<(), TxnError> {
        self.txn_ready()?;
        let now = self.now();
        self.coordinator()?.begin_end(id, commit, now)?;
        self.end_steps(id, commit)
    }

    /// The steps after the coordinator logged Committing/Aborting:
    /// `END_TXN_ON_PARTITION` for each partition, `END_TXN_ON_SUBSCRIPTION`
    /// for each subscription, then Committed/Aborted (durable).
    fn end_steps(&mut self, id: TxnId, commit: bool) -> Result<(), TxnError> {
        let meta = self
            .coordinator()?
            .get(id)
            .cloned()
            .ok_or(TxnError::NotFound(id))?;
        for p in &meta.partitions {
            self.end_on_partition(p, id, commit)?;
        }
        for (t, s) in &meta.subscriptions {
            self.end_on_subscription(t, s, id, commit)?;
        }
        let now = self.now();
        self.coordinator()?.finish_end(id, now)
    }

    /// `END_TXN_ON_PARTITION`: the marker appended (durable), the buffer
    /// updated, the topic's subscriptions dispatched. A topic whose buffer
    /// no longer holds the transaction as ongoing gets no marker (the step
    /// already ran, or the transaction never wrote there).
    pub(crate) fn end_on_partition(
        &mut self,
        topic: &str,
        id: TxnId,
        commit: bool,
    ) -> Result<(), TxnError> {
        let topic = self
            .topic(topic)
            .map_err(|e| TxnError::NotReady(e.to_string()))?;
        let now = self.now();
        let Some(t) = self.topics.get_mut(&topic) else {
            return Err(TxnError::NotReady(format!("topic {topic} not open")));
        };
        if !t.buffer.lock().is_ongoing(id) {
            return Ok(());
        }
        let marker = tproto::txn_marker(
            if commit {
                marker_type::TXN_COMMIT
            } else {
                marker_type::TXN_ABORT
            },
            id.least_sig_bits,
            now,
            id.most_sig_bits,
            id.least_sig_bits,
        );
        let p =
            t.ml.append(&tproto::marker_entry(&marker))
                .map_err(|e| TxnError::Persistence(e.to_string()))?;
        t.buffer.lock().observe(
            p,
            if commit {
                EntryTxn::Commit(id)
            } else {
                EntryTxn::Abort(id)
            },
        );
        for s in t.subscriptions.values_mut() {
            if !s.consumers.is_empty() {
                s.dispatch(&t.ml, &mut self.out);
            }
        }
        self.txn_ended_on(&topic);
        Ok(())
    }

    /// `END_TXN_ON_SUBSCRIPTION`: COMMIT/ABORT appended to the pending-ack
    /// log; on commit the acks applied to the subscription and persisted,
    /// then the handle told; on abort the positions redelivered.
    pub(crate) fn end_on_subscription(
        &mut self,
        topic: &str,
        sub: &str,
        id: TxnId,
        commit: bool,
    ) -> Result<(), TxnError> {
        let topic = self
            .topic(topic)
            .map_err(|e| TxnError::NotReady(e.to_string()))?;
        let opened = self.open_subscription(&topic, sub)?;
        if opened {
            self.attach_txn(&topic, sub)
                .map_err(|e| TxnError::NotReady(e.to_string()))?;
        }
        let (s, ml, h) = ready_pending_ack(&mut self.topics, &topic, sub)?;
        let summary = h.summary();
        let individual: BTreeSet<Position> =
            summary.individual.get(&id).cloned().unwrap_or_default();
        let cumulative = summary.cumulative.filter(|(t, _)| *t == id).map(|(_, p)| p);
        if !individual.is_empty() {
            let r = if commit {
                PendingAckRecord::commit(id, AckType::Individual)
            } else {
                PendingAckRecord::abort(id, AckType::Individual)
            };
            append_sync(&h, r).map_err(pa_error)?;
        }
        if cumulative.is_some() {
            let r = if commit {
                PendingAckRecord::commit(id, AckType::Cumulative)
            } else {
                PendingAckRecord::abort(id, AckType::Cumulative)
            };
            append_sync(&h, r).map_err(pa_error)?;
        }
        for p in &individual {
            s.txn_pending.remove(p);
        }
        s.refresh_txn_batch_pending(&h.summary());
        if commit {
            // The acks applied to the subscription's cursor and persisted,
            // then the handle may trim its log.
            let view = CursorSubscription::new(Arc::clone(&s.cursor), Arc::clone(&s.deletion));
            for a in h.committed_acks() {
                view.apply(&a, ml.as_ref())
                    .map_err(|e| TxnError::Persistence(e.to_string()))?;
            }
            s.persist_and_settle().map_err(TxnError::Persistence)?;
            h.subscription_persisted();
        } else {
            // Redelivered (Pulsar's `redeliverUnacknowledgedMessages` of the
            // aborted positions): each leaves the pending set of the consumer
            // holding it (a batch-index ack leaves the entry there) and goes
            // back to the replay set with its key hash: the one recorded at
            // its delivery, else read from the entry; an entry that cannot be
            // read now (a storage outage) goes back with hash 0 until the
            // replay read delivers it (the dispatch routes a replayed entry
            // by its own key).
            let live: Vec<Position> = individual
                .iter()
                .copied()
                .filter(|p| !s.deletion.is_message_deleted(*p))
                .collect();
            let mut unknown = Vec::new();
            for p in live {
                s.settle_pending(p);
                match s.inflight.remove(&p) {
                    Some(h) => {
                        s.replay.insert(p, h);
                    }
                    None => unknown.push(p),
                }
            }
            match ml.read_positions(&unknown) {
                Ok(entries) => {
                    for e in entries {
                        let hash = entry_info(&e.data).map_or(0, |i| i.key_hash);
                        s.replay.insert(e.position, hash);
                    }
                }
                Err(e) => {
                    tracing::warn!(topic, subscription = sub, error = %e, "aborted acks' entries not readable now: replayed without their key hash");
                    for p in unknown {
                        s.replay.entry(p).or_insert(0);
                    }
                }
            }
        }
        if !s.consumers.is_empty() {
            s.dispatch(&ml, &mut self.out);
        }
        Ok(())
    }

    /// Opens subscription `sub` of open topic `topic` if it is not (a
    /// recovery finishing a transaction before any consumer came back);
    /// whether it was opened now.
    fn open_subscription(&mut self, topic: &str, sub: &str) -> Result<bool, TxnError> {
        let now = self.now();
        let clock: Arc<dyn crate::delayed::Clock> = self.clock.clone();
        let Some(t) = self.topics.get_mut(topic) else {
            return Err(TxnError::NotReady(format!("topic {topic} not open")));
        };
        if t.subscriptions.contains_key(sub) {
            return Ok(false);
        }
        let s = self
            .config
            .open_subscription(&self.store, &t.ml, sub, sub_type::SHARED, true, clock, now)
            .map_err(|e| TxnError::NotReady(e.to_string()))?;
        t.subscriptions.insert(sub.to_string(), s);
        Ok(true)
    }

    /// Checks a transactional SEND before its append: the transaction is
    /// Open and has the topic as a partition, and the entry's metadata
    /// carries the same transaction id.
    pub(crate) fn txn_send_check(
        &mut self,
        topic: &str,
        most: Option<u64>,
        least: Option<u64>,
        payload: &[u8],
    ) -> Result<TxnId, TxnError> {
        let id = txn_of(most, least);
        if entry_txn(payload) != EntryTxn::Data(id) {
            return Err(TxnError::NotAllowed(format!(
                "transactional SEND of {id:?}: the message metadata must carry the same txnid"
            )));
        }
        self.txn_ready()?;
        let c = self.coordinator()?;
        let meta = c.get(id).ok_or(TxnError::NotFound(id))?;
        if meta.status != tproto::txn_status::OPEN {
            return Err(TxnError::InvalidStatus {
                txn: id,
                status: super::coordinator::status_name(meta.status),
                expected: "OPEN",
            });
        }
        if !meta.partitions.contains(topic) {
            return Err(TxnError::NotAllowed(format!(
                "topic {topic} was not added to transaction {id:?} (ADD_PARTITION_TO_TXN)"
            )));
        }
        if super::snapshot::is_snapshot_topic(topic) {
            return Err(TxnError::NotAllowed(format!(
                "topic {topic} is a system topic (no transaction buffer)"
            )));
        }
        // The topic's first snapshot before its first transactional entry.
        self.first_snapshot(topic)
            .map_err(|e| TxnError::NotReady(e.to_string()))?;
        Ok(id)
    }

    /// A transactional ACK: logged as pending in the subscription's
    /// pending-ack log (never applied to the subscription before the
    /// commit); the entries leave their consumer's unacknowledged set and
    /// are not dispatched while the transaction is open.
    pub(crate) fn txn_ack(
        &mut self,
        conn: ConnectionId,
        topic: &str,
        sub: &str,
        a: &CommandAck,
    ) -> Result<(), TxnError> {
        let id = txn_of(a.txnid_most_bits, a.txnid_least_bits);
        self.txn_ready()?;
        {
            let c = self.coordinator()?;
            let meta = c.get(id).ok_or(TxnError::NotFound(id))?;
            if meta.status != tproto::txn_status::OPEN {
                return Err(TxnError::InvalidStatus {
                    txn: id,
                    status: super::coordinator::status_name(meta.status),
                    expected: "OPEN",
                });
            }
            if !meta
                .subscriptions
                .contains(&(topic.to_string(), sub.to_string()))
            {
                return Err(TxnError::NotAllowed(format!(
                    "subscription {sub} of {topic} was not added to transaction {id:?} (ADD_SUBSCRIPTION_TO_TXN)"
                )));
            }
        }
        let (s, ml, h) = ready_pending_ack(&mut self.topics, topic, sub)?;
        let mut whole = Vec::new();
        let record = if a.ack_type == 1 {
            let m = a.message_id.first().ok_or_else(|| {
                TxnError::NotAllowed("cumulative ACK without a message id".into())
            })?;
            PendingAckRecord::cumulative_ack(id, position(m)?)
        } else {
            let mut ps = Vec::with_capacity(a.message_id.len());
            for m in &a.message_id {
                let p = position(m)?;
                if m.ack_set.is_empty() {
                    whole.push(p);
                    ps.push(AckedPosition::whole(p));
                } else {
                    let size = s.batch_size_of(&ml, p).map_err(TxnError::NotAllowed)?;
                    // A set bit is an index still unacknowledged (missing
                    // words are zero: acknowledged).
                    let acked: Vec<u32> = (0..size)
                        .filter(|i| !crate::proto::wire::is_deliverable(&m.ack_set, *i))
                        .collect();
                    if acked.is_empty() {
                        continue;
                    }
                    if acked.len() as u32 == size {
                        whole.push(p);
                        ps.push(AckedPosition::whole(p));
                    } else {
                        ps.push(
                            AckedPosition::batch_indexes(p, size as i32, &acked)
                                .map_err(pa_error)?,
                        );
                    }
                }
            }
            if ps.is_empty() {
                return Ok(());
            }
            PendingAckRecord::individual_ack(id, ps)
        };
        append_sync(&h, record).map_err(pa_error)?;
        s.refresh_txn_batch_pending(&h.summary());
        for p in whole {
            s.txn_pending.insert(p);
            s.inflight.remove(&p);
            s.settle_pending(p);
        }
        let _ = conn;
        Ok(())
    }
}

/// Subscription `sub` of open topic `topic`, its managed ledger and its
/// pending-ack handle, which must be Ready: where a transaction's acks and
/// its END_TXN reach a subscription ([`TxnError::NotReady`] otherwise).
fn ready_pending_ack<'a>(
    topics: &'a mut BTreeMap<String, Topic>,
    topic: &str,
    sub: &str,
) -> Result<(&'a mut Subscription, Arc<ManagedLedger>, PendingAckHandle), TxnError> {
    let Some(t) = topics.get_mut(topic) else {
        return Err(TxnError::NotReady(format!("topic {topic} not open")));
    };
    let ml = Arc::clone(&t.ml);
    let Some(s) = t.subscriptions.get_mut(sub) else {
        return Err(TxnError::NotReady(format!("subscription {sub} not open")));
    };
    let h = s
        .pending_ack
        .clone()
        .ok_or_else(|| TxnError::NotReady(format!("subscription {sub}: no pending-ack handle")))?;
    if h.state() != HandleState::Ready {
        return Err(TxnError::NotReady(format!(
            "subscription {sub}: pending-ack handle {:?}",
            h.state()
        )));
    }
    // One pending-ack operation follows (a transactional ack or an END_TXN).
    s.counters.pending_ack_ops += 1;
    Ok((s, ml, h))
}

fn position(m: &crate::proto::wire::MessageIdData) -> Result<Position, TxnError> {
    Ok(Position::new(
        i64::try_from(m.ledger_id)
            .map_err(|_| TxnError::NotAllowed("ledger_id above i64::MAX".into()))?,
        i64::try_from(m.entry_id)
            .map_err(|_| TxnError::NotAllowed("entry_id above i64::MAX".into()))?,
    ))
}

fn split<T>(r: &Result<T, TxnError>) -> (Option<i32>, Option<String>) {
    match r {
        Ok(_) => (None, None),
        Err(e) => (Some(e.server_error()), Some(e.to_string())),
    }
}

fn response(
    request_id: u64,
    id: Option<TxnId>,
    error: Option<i32>,
    message: Option<String>,
) -> tproto::CommandTxnResponse {
    tproto::CommandTxnResponse {
        request_id,
        txnid_least_bits: id.map(|t| t.least_sig_bits),
        txnid_most_bits: id.map(|t| t.most_sig_bits),
        error,
        message,
    }
}

/// The `CommandAckResponse` of a transactional ACK (Pulsar sets the
/// transaction id on it).
pub(crate) fn txn_ack_response(
    a: &CommandAck,
    r: &Result<(), TxnError>,
) -> command::CommandAckResponse {
    let (error, message) = split(r);
    command::CommandAckResponse {
        consumer_id: a.consumer_id,
        txnid_least_bits: Some(a.txnid_least_bits.unwrap_or(0)),
        txnid_most_bits: Some(a.txnid_most_bits.unwrap_or(0)),
        error,
        message,
        request_id: a.request_id,
    }
}
