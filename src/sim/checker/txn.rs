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
pub(super) enum Phase {
    Open,
    CommitRequested,
    AbortRequested,
    Ended(TxnOutcome),
}

#[derive(Debug, Default)]
pub(super) struct TxnView {
    pub(super) phase: Option<Phase>,
    /// Virtual ms before which the broker cannot have timed it out.
    pub(super) open_until_ms: u64,
    /// Topic → lowest receipted position of its messages there.
    first: [Option<Position>; 2],
    /// Receipted messages.
    sent: BTreeSet<(u8, u32)>,
    /// Acks receipted inside it: (subscription, message).
    acks: Vec<(String, MessageRef)>,
    /// Acks sent inside it whose receipt was lost (a crash, a closed
    /// connection): the broker may hold them pending; the client then
    /// aborts the transaction.
    maybe_acks: Vec<(String, MessageRef)>,
}

/// The checker's transaction state (see the module docs).
#[derive(Debug, Default)]
pub(super) struct TxnState {
    pub(super) txns: BTreeMap<u64, TxnView>,
    /// Message → the positions it was delivered at.
    seen: BTreeMap<TxnMsg, BTreeSet<Position>>,
    /// (subscription, message) acknowledged by a committed transaction.
    committed_acks: BTreeSet<(String, MessageRef)>,
    /// (subscription, message) acknowledged by an aborted transaction,
    /// not yet delivered there again.
    aborted_acks: BTreeSet<(String, MessageRef)>,
    /// The end-of-run rules ran (at a stall, before the stall is named).
    judged: bool,
    /// Transactional cumulative acks (`txn_cumulative.rs`).
    pub(super) cumulative: super::txn_cumulative::CumulativeState,
}

impl DeliveryChecker {
    pub(super) fn txn_violation(&mut self, now_ms: u64, rule: &str, what: String) {
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
    /// receipted without an error. Receipted after its timeout may have
    /// passed (`txn_end_requested` with `commit` false already ran), it is
    /// released at once: the abort may have given its entry back already.
    pub fn txn_acked(&mut self, k: u64, sub: &str, msg: MessageRef) {
        let v = self.txn.txns.entry(k).or_default();
        v.acks.push((sub.to_string(), msg));
        if v.phase == Some(Phase::AbortRequested)
            && self.txn.aborted_acks.insert((sub.to_string(), msg))
        {
            self.txn_release(sub, msg, 0);
        }
    }

    /// A transactional ack of `msg` on `sub` inside transaction `k` lost
    /// its receipt: the broker may hold it pending, and the abort that
    /// follows then redelivers the entry, after later ones of its key (it
    /// is released for one redelivery, out of order, at the abort; nothing
    /// requires it to come back).
    pub fn txn_ack_uncertain(&mut self, k: u64, sub: &str, msg: MessageRef) {
        self.txn
            .txns
            .entry(k)
            .or_default()
            .maybe_acks
            .push((sub.to_string(), msg));
    }

    /// The store lost a pending-ack ledger of `sub` holding a record of
    /// transaction `k` (a deleted BookKeeper ledger, skipped or given up
    /// by the replay): what `k` acknowledged on `sub` until now may be
    /// neither held while it is open nor applied at its commit, so those
    /// entries may be delivered once more (out of order) and are judged
    /// by neither transactional-ack rule; they must still be acknowledged.
    pub fn txn_acks_lost(&mut self, k: u64, sub: &str, now_ms: u64) {
        self.txn_cumulative_lost(k, sub);
        let Some(v) = self.txn.txns.get_mut(&k) else {
            return;
        };
        let (lost, kept): (Vec<_>, Vec<_>) = v.acks.drain(..).partition(|(s, _)| s == sub);
        v.acks = kept;
        for (s, msg) in lost {
            let key = (s, msg);
            self.txn.committed_acks.remove(&key);
            self.txn.aborted_acks.remove(&key);
            self.txn_release(&key.0, msg, now_ms);
        }
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
        let maybe = self
            .txn
            .txns
            .get_mut(&k)
            .map(|v| std::mem::take(&mut v.maybe_acks))
            .unwrap_or_default();
        for (sub, msg) in maybe {
            self.txn_release(&sub, msg, now_ms);
        }
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
    /// of order: its transactional ack was aborted. So may every other
    /// unacknowledged message of its entry: Pulsar's abort gives the
    /// acknowledged positions back with `redeliverUnacknowledgedMessages`
    /// (`PendingAckHandleImpl.handleAbort`), which takes the whole entry
    /// from the consumer holding it and dispatches it again with the
    /// batch's ack set (only acknowledged indexes left out), so the indexes
    /// that consumer still holds come again too.
    fn txn_release(&mut self, sub: &str, msg: MessageRef, _now_ms: u64) {
        let base = self.base;
        let Some(s) = self.subs.get_mut(sub) else {
            return;
        };
        // Batches of the simulator's producers hold at most 512 messages
        // (`Workload::validate`); retired (acknowledged) ones are gone.
        for batch_index in 0..512 {
            let m = MessageRef {
                position: msg.position,
                batch_index,
            };
            let Some(i) = self.index.get(&m) else {
                continue;
            };
            if m == msg || s.acked[*i - base] == super::subscription::NOT_ACKED {
                s.nacked.insert(*i);
                s.order_exempt.insert(*i);
                let holder = s.delivered[*i - base];
                if holder != 0 {
                    s.released_from.insert(*i, holder);
                }
                if holder == 0 || !s.tokens[(holder - 1) as usize].1 {
                    s.released_while_unheld.insert(*i);
                }
            }
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
        self.txn_cumulative_end(k, outcome);
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
        // The broker's clock runs ahead of the run's by the clock jumps so
        // far (`allow_early`): its timeout ends a transaction that much
        // sooner.
        let broker_now = now_ms.saturating_add(self.early_tolerance_ms);
        let blocking = self.txn.txns.iter().find_map(|(k, v)| {
            let first = v.first[usize::from(topic.min(1))]?;
            (v.phase == Some(Phase::Open) && broker_now < v.open_until_ms && first < position)
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
        self.txn_cumulative_delivery(sub, msg, now_ms);
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
        self.txn_cumulative_finish(now_ms);
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

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests {
    use super::*;
    use crate::sim::checker::OrderCheck;

    fn m(e: i64) -> MessageRef {
        MessageRef {
            position: Position::new(1, e),
            batch_index: 0,
        }
    }

    fn checker() -> DeliveryChecker {
        DeliveryChecker::new(["s".to_string()], 0, OrderCheck::None)
    }

    /// The rule a finished checker names (`None`: no transaction rule broke).
    fn rule(c: DeliveryChecker) -> Option<String> {
        let (counts, first) = c.finish(1_000);
        (counts.txn_violations > 0).then(|| first.unwrap_or_default())
    }

    /// A transaction with one message on each topic (topic 0 at 1:5,
    /// topic 1 at 2:5), committed, each delivered once; an entry acked
    /// inside it: the clean run every negative control below breaks once.
    fn committed(c: &mut DeliveryChecker, deliver: bool) {
        c.published(m(1), 0, 0);
        c.delivered("s", 0, m(1), 1, 0);
        c.txn_begun(0, 0, 60_000);
        c.txn_sent((0, 0, 0), m(5).position);
        c.txn_sent((0, 1, 0), Position::new(2, 5));
        c.txn_acked(0, "s", m(1));
        c.txn_end_requested(0, true, 10);
        c.txn_ended(0, TxnOutcome::Committed, 11);
        if deliver {
            c.published(m(5), TXN_KEY_FOR_TEST, 0);
            c.txn_message_delivered((0, 0, 0), m(5).position, 12);
            c.delivered("s", 0, m(5), 12, 0);
            c.acked("s", m(5), 13);
            c.txn_message_delivered((0, 1, 0), Position::new(2, 5), 12);
        }
    }

    const TXN_KEY_FOR_TEST: u32 = u32::MAX;

    #[test]
    fn a_committed_transaction_delivered_once_is_clean() {
        let mut c = checker();
        committed(&mut c, true);
        assert_eq!(rule(c), None);
    }

    #[test]
    fn committed_lost_names_a_committed_message_never_delivered() {
        let mut c = checker();
        committed(&mut c, false);
        assert!(rule(c).unwrap().contains("committed-lost"));
    }

    #[test]
    fn committed_duplicated_names_a_message_visible_at_two_positions() {
        let mut c = checker();
        committed(&mut c, true);
        c.txn_message_delivered((0, 1, 0), Position::new(2, 9), 20);
        assert!(rule(c).unwrap().contains("committed-duplicated"));
    }

    #[test]
    fn committed_ack_redelivered_names_an_entry_delivered_after_its_commit() {
        let mut c = checker();
        committed(&mut c, true);
        c.txn_ack_delivery("s", m(1), 20);
        assert!(rule(c).unwrap().contains("committed-ack-redelivered"));
    }

    #[test]
    fn open_visible_names_a_message_delivered_before_its_commit_was_requested() {
        let mut c = checker();
        c.txn_begun(0, 0, 60_000);
        c.txn_sent((0, 1, 0), Position::new(2, 5));
        c.txn_message_delivered((0, 1, 0), Position::new(2, 5), 5);
        assert!(rule(c).unwrap().contains("open-visible"));
    }

    #[test]
    fn aborted_visible_names_a_message_of_an_aborted_transaction() {
        let mut c = checker();
        c.txn_begun(0, 0, 60_000);
        c.txn_sent((0, 1, 0), Position::new(2, 5));
        c.txn_end_requested(0, false, 5);
        c.txn_ended(0, TxnOutcome::Aborted, 6);
        c.txn_message_delivered((0, 1, 0), Position::new(2, 5), 7);
        assert!(rule(c).unwrap().contains("aborted-visible"));
    }

    #[test]
    fn past_max_read_position_names_an_entry_after_an_open_transaction() {
        let mut c = checker();
        c.txn_begun(0, 0, 1_000);
        c.txn_sent((0, 0, 0), m(5).position);
        // Before it and after its timeout may pass: allowed.
        c.txn_delivery(0, m(4).position, 10);
        c.txn_delivery(0, m(6).position, 1_000);
        assert_eq!(c.counts.txn_violations, 0);
        c.txn_delivery(0, m(6).position, 999);
        assert!(rule(c).unwrap().contains("past-max-read-position"));
    }

    /// An ack whose receipt was lost may be pending on the broker: after
    /// the abort the entry may come back once, out of order; before it,
    /// the live incarnation holding it must not get it again.
    #[test]
    fn a_transactional_ack_without_receipt_is_released_at_the_abort_only() {
        for aborted in [false, true] {
            let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::PerKey);
            c.published(m(1), 0, 0);
            c.published(m(2), 0, 0);
            c.delivered("s", 0, m(1), 1, 0);
            c.delivered("s", 0, m(2), 1, 0);
            c.txn_begun(0, 0, 60_000);
            c.txn_ack_uncertain(0, "s", m(1));
            if aborted {
                c.txn_end_requested(0, false, 5);
                c.txn_ended(0, TxnOutcome::Aborted, 6);
            }
            c.delivered("s", 0, m(1), 7, 0);
            c.acked("s", m(1), 8);
            c.acked("s", m(2), 8);
            let (counts, first) = c.finish(20);
            assert_eq!(counts.violations() == 0, aborted, "{first:?}");
        }
    }

    #[test]
    fn aborted_ack_not_redelivered_names_an_entry_that_never_came_back() {
        for redelivered in [true, false] {
            let mut c = checker();
            c.published(m(1), 0, 0);
            c.delivered("s", 0, m(1), 1, 0);
            c.txn_begun(0, 0, 60_000);
            c.txn_acked(0, "s", m(1));
            c.txn_end_requested(0, false, 10);
            c.txn_ended(0, TxnOutcome::Aborted, 11);
            if redelivered {
                // Released for one redelivery to the same incarnation.
                c.txn_ack_delivery("s", m(1), 12);
                c.delivered("s", 0, m(1), 12, 0);
                c.acked("s", m(1), 13);
                let (counts, first) = c.finish(20);
                assert_eq!(counts.violations(), 0, "{first:?}");
            } else {
                assert!(rule(c).unwrap().contains("aborted-ack-not-redelivered"));
            }
        }
    }
}
