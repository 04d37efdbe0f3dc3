//! Transactions as a client sees them (PIP-31, read-committed): the
//! transactional messages it published with their transaction, the
//! END_TXN it requested and the outcome it was answered, its consumers'
//! transactional acks with their receipts, and every delivery. Nothing of
//! the broker's state (coordinator, transaction buffer, pending-ack store)
//! is read.
//!
//! Rules (each a `txn_violations` count and a named first violation):
//!
//! | rule | what breaks it |
//! |---|---|
//! | `committed-lost` | a message of a committed transaction never delivered (on the run's topic: to some subscription; on the second topic: to its reader) |
//! | `committed-duplicated` | a message of a committed transaction delivered at two positions (exactly once visible) |
//! | `aborted-visible` | a message of a transaction whose abort the client requested (or whose timeout passed, or whose commit was refused) delivered |
//! | `open-visible` | a message of a transaction delivered before the client requested its commit |
//! | `past-max-read-position` | an entry after a receipted entry of a transaction the client still holds open (no END_TXN requested, its timeout not reachable yet) delivered |
//! | `committed-ack-redelivered` | an entry a committed transaction acknowledged on a subscription delivered there again (after any crash) |
//! | `aborted-ack-not-redelivered` | an entry an aborted transaction acknowledged on a subscription (ack receipted) never delivered there again nor acknowledged otherwise |
//!
//! A transaction is "open" for the max-read-position rule until the client
//! requests its end or until `NEW_TXN` sent + its ttl (the broker's
//! timeout counts from when it handled `NEW_TXN`, never earlier). A
//! commit answered `TransactionNotFound` to a retried END_TXN (the first
//! one lost with its connection) within the ttl is committed (the
//! coordinator forgets a transaction only when it ended, and only the
//! client or the timeout ends it); after the ttl the outcome is unknown:
//! its messages may be visible at one position or not at all.

use std::collections::{BTreeMap, BTreeSet};

use super::{DeliveryChecker, MessageRef};
use crate::position::Position;

/// A transactional message: the client's transaction number, its topic
/// (0: the run's topic, 1: the second topic) and its index in the
/// transaction on that topic.
pub type TxnMsg = (u64, u8, u32);

/// The outcome of a transaction as its client learned it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnOutcome {
    /// END_TXN(commit) answered without an error (or `TransactionNotFound`
    /// to a retry within the ttl).
    Committed,
    /// END_TXN(abort) answered, or a commit refused, or its timeout passed
    /// without an END_TXN.
    Aborted,
    /// The client cannot tell.
    Unknown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Open,
    CommitRequested,
    AbortRequested,
    Ended(TxnOutcome),
}

#[derive(Debug, Default)]
struct TxnView {
    phase: Option<Phase>,
    /// Virtual ms before which the broker cannot have timed it out.
    open_until_ms: u64,
    /// Topic → lowest receipted position of its messages there.
    first: [Option<Position>; 2],
    /// Receipted messages.
    sent: BTreeSet<(u8, u32)>,
    /// Acks receipted inside it: (subscription, message).
    acks: Vec<(String, MessageRef)>,
}

/// The checker's transaction state (see the module docs).
#[derive(Debug, Default)]
pub(super) struct TxnState {
    txns: BTreeMap<u64, TxnView>,
    /// Message → the positions it was delivered at.
    seen: BTreeMap<TxnMsg, BTreeSet<Position>>,
    /// (subscription, message) acknowledged by a committed transaction.
    committed_acks: BTreeSet<(String, MessageRef)>,
    /// (subscription, message) acknowledged by an aborted transaction,
    /// not yet delivered there again.
    aborted_acks: BTreeSet<(String, MessageRef)>,
    /// The end-of-run rules ran (at a stall, before the stall is named).
    judged: bool,
}

impl DeliveryChecker {
    fn txn_violation(&mut self, now_ms: u64, rule: &str, what: String) {
        self.counts.txn_violations += 1;
        self.violation(now_ms, format!("transactions: {rule}: {what}"));
    }

    /// The client sent `NEW_TXN` for its transaction `k` at `now_ms` with
    /// ttl `ttl_ms` (answered: the transaction is open).
    pub fn txn_begun(&mut self, k: u64, sent_at_ms: u64, ttl_ms: u64) {
        let v = self.txn.txns.entry(k).or_default();
        v.phase = Some(Phase::Open);
        v.open_until_ms = sent_at_ms.saturating_add(ttl_ms);
    }

    /// A transactional SEND of `m` was receipted at `position`.
    pub fn txn_sent(&mut self, m: TxnMsg, position: Position) {
        let v = self.txn.txns.entry(m.0).or_default();
        v.sent.insert((m.1, m.2));
        let f = &mut v.first[usize::from(m.1.min(1))];
        if f.is_none_or(|p| position < p) {
            *f = Some(position);
        }
    }

    /// A transactional ack of `msg` on `sub` inside transaction `k` was
    /// receipted without an error.
    pub fn txn_acked(&mut self, k: u64, sub: &str, msg: MessageRef) {
        self.txn
            .txns
            .entry(k)
            .or_default()
            .acks
            .push((sub.to_string(), msg));
    }

    /// The client requested the end of transaction `k` (or, `commit`
    /// false, its timeout may have passed): from now on its acknowledged
    /// entries may come back (abort) and its messages be visible (commit).
    pub fn txn_end_requested(&mut self, k: u64, commit: bool, now_ms: u64) {
        let v = self.txn.txns.entry(k).or_default();
        if matches!(v.phase, Some(Phase::Ended(_))) {
            return;
        }
        v.phase = Some(if commit {
            Phase::CommitRequested
        } else {
            Phase::AbortRequested
        });
        if !commit {
            self.txn_release_acks(k, now_ms);
        }
    }

    /// An aborted transaction's acks: each entry may be redelivered once,
    /// and must be.
    fn txn_release_acks(&mut self, k: u64, now_ms: u64) {
        let acks = self
            .txn
            .txns
            .get(&k)
            .map(|v| v.acks.clone())
            .unwrap_or_default();
        for (sub, msg) in acks {
            if self.txn.aborted_acks.insert((sub.clone(), msg)) {
                self.txn_release(&sub, msg, now_ms);
            }
        }
    }

    /// `msg` on `sub` may be delivered once more (to any consumer) and out
    /// of order: its transactional ack was aborted.
    fn txn_release(&mut self, sub: &str, msg: MessageRef, _now_ms: u64) {
        if let (Some(s), Some(i)) = (self.subs.get_mut(sub), self.index.get(&msg)) {
            s.nacked.insert(*i);
            s.order_exempt.insert(*i);
        }
    }

    /// Transaction `k` ended with `outcome` as the client learned it.
    pub fn txn_ended(&mut self, k: u64, outcome: TxnOutcome, now_ms: u64) {
        let was = self.txn.txns.get(&k).and_then(|v| v.phase);
        if matches!(was, Some(Phase::Ended(_))) {
            return;
        }
        match outcome {
            TxnOutcome::Committed => {
                let acks = self
                    .txn
                    .txns
                    .get(&k)
                    .map(|v| v.acks.clone())
                    .unwrap_or_default();
                for (sub, msg) in acks {
                    self.acked(&sub, msg, now_ms);
                    self.txn.committed_acks.insert((sub, msg));
                }
            }
            TxnOutcome::Aborted => {
                if was != Some(Phase::AbortRequested) {
                    self.txn_release_acks(k, now_ms);
                }
                // A message of it already delivered (the commit was
                // requested, then refused) is visible although aborted.
                let seen: Vec<TxnMsg> = self
                    .txn
                    .seen
                    .range((k, 0, 0)..=(k, u8::MAX, u32::MAX))
                    .map(|(m, _)| *m)
                    .collect();
                if let Some(m) = seen.first() {
                    self.txn_violation(
                        now_ms,
                        "aborted-visible",
                        format!(
                            "message {} of transaction {k} on topic {} delivered, and its commit was refused",
                            m.2, m.1
                        ),
                    );
                }
            }
            TxnOutcome::Unknown => {
                // Its acks are taken as committed (so the run can end); its
                // messages may be visible at one position or not at all.
                let acks = self
                    .txn
                    .txns
                    .get(&k)
                    .map(|v| v.acks.clone())
                    .unwrap_or_default();
                for (sub, msg) in acks {
                    self.acked(&sub, msg, now_ms);
                }
            }
        }
        self.txn.txns.entry(k).or_default().phase = Some(Phase::Ended(outcome));
    }

    /// Whether every transaction of the client has an outcome.
    pub fn txn_all_ended(&self) -> bool {
        self.txn
            .txns
            .values()
            .all(|v| matches!(v.phase, Some(Phase::Ended(_)) | None))
    }

    /// Whether every message of every committed transaction on `topic` was
    /// delivered (the second topic's reader may stop waiting).
    pub fn txn_committed_seen(&self, topic: u8) -> bool {
        self.txn.txns.iter().all(|(k, v)| {
            v.phase != Some(Phase::Ended(TxnOutcome::Committed))
                || v.sent
                    .iter()
                    .filter(|(t, _)| *t == topic)
                    .all(|(t, i)| self.txn.seen.contains_key(&(*k, *t, *i)))
        })
    }

    /// Every delivery on `topic` (0 or 1) at `position`, before any other
    /// rule sees it: the max-read-position rule.
    pub fn txn_delivery(&mut self, topic: u8, position: Position, now_ms: u64) {
        let blocking = self.txn.txns.iter().find_map(|(k, v)| {
            let first = v.first[usize::from(topic.min(1))]?;
            (v.phase == Some(Phase::Open) && now_ms < v.open_until_ms && first < position)
                .then_some((*k, first))
        });
        if let Some((k, first)) = blocking {
            self.txn_violation(
                now_ms,
                "past-max-read-position",
                format!(
                    "topic {topic}: {position} delivered while transaction {k}, open, has an entry at {first}"
                ),
            );
        }
    }

    /// A delivery of transactional message `m` at `position` on `sub` (the
    /// second topic's reader passes its subscription name).
    pub fn txn_message_delivered(&mut self, m: TxnMsg, position: Position, now_ms: u64) {
        let phase = self.txn.txns.get(&m.0).and_then(|v| v.phase);
        let (k, topic, i) = m;
        match phase {
            Some(Phase::Open) | None => self.txn_violation(
                now_ms,
                "open-visible",
                format!("message {i} of transaction {k} on topic {topic} delivered at {position} before its commit was requested"),
            ),
            Some(Phase::AbortRequested | Phase::Ended(TxnOutcome::Aborted)) => self.txn_violation(
                now_ms,
                "aborted-visible",
                format!("message {i} of aborted transaction {k} on topic {topic} delivered at {position}"),
            ),
            _ => {}
        }
        let seen = self.txn.seen.entry(m).or_default();
        seen.insert(position);
        if seen.len() > 1 {
            let at: Vec<String> = seen.iter().map(ToString::to_string).collect();
            self.txn_violation(
                now_ms,
                "committed-duplicated",
                format!(
                    "message {i} of transaction {k} on topic {topic} visible at {} positions: {}",
                    at.len(),
                    at.join(", ")
                ),
            );
        }
    }

    /// Every delivery of `msg` on `sub` of the run's topic, before the
    /// delivery rules: the transactional-ack rules.
    pub fn txn_ack_delivery(&mut self, sub: &str, msg: MessageRef, now_ms: u64) {
        if self.txn.committed_acks.is_empty() && self.txn.aborted_acks.is_empty() {
            return;
        }
        let key = (sub.to_string(), msg);
        if self.txn.committed_acks.contains(&key) {
            self.txn_violation(
                now_ms,
                "committed-ack-redelivered",
                format!("{sub}: {msg} delivered again after the transaction that acknowledged it committed"),
            );
        }
        self.txn.aborted_acks.remove(&key);
    }

    /// End of the run (or a stall: nothing more can be delivered):
    /// committed messages never delivered, aborted acks whose entries
    /// never came back. Runs once.
    pub fn txn_finish(&mut self, now_ms: u64) {
        if std::mem::replace(&mut self.txn.judged, true) {
            return;
        }
        let mut lost = Vec::new();
        for (k, v) in &self.txn.txns {
            if v.phase == Some(Phase::Ended(TxnOutcome::Committed)) {
                for (t, i) in &v.sent {
                    if !self.txn.seen.contains_key(&(*k, *t, *i)) {
                        lost.push((*k, *t, *i));
                    }
                }
            }
        }
        if let Some((k, t, i)) = lost.first().copied() {
            let n = lost.len();
            self.txn_violation(
                now_ms,
                "committed-lost",
                format!("message {i} of committed transaction {k} on topic {t} never delivered ({n} such messages)"),
            );
        }
        let pending: Vec<(String, MessageRef)> = self
            .txn
            .aborted_acks
            .iter()
            .filter(|(sub, msg)| !self.is_acked(sub, *msg))
            .cloned()
            .collect();
        if let Some((sub, msg)) = pending.first() {
            let n = pending.len();
            self.txn_violation(
                now_ms,
                "aborted-ack-not-redelivered",
                format!("{sub}: {msg}, acknowledged by an aborted transaction, never delivered again ({n} such entries)"),
            );
        }
    }

    /// Whether `msg` is acknowledged on `sub` (retired counts as acknowledged).
    fn is_acked(&self, sub: &str, msg: MessageRef) -> bool {
        match self.lookup(&msg) {
            super::window::Lookup::Retired => true,
            super::window::Lookup::Live(i) => self
                .subs
                .get(sub)
                .is_some_and(|s| s.acked[i - self.base] != super::subscription::NOT_ACKED),
            super::window::Lookup::Unknown => false,
        }
    }
}
