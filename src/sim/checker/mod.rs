//! The simulator's independent delivery checker.
//!
//! It sees only what a user of the broker could see — messages published,
//! messages delivered to consumers, acknowledgements, restarts and consumer
//! reconnects, admin seeks — and derives from those alone: duplicates (split
//! into the at-least-once redeliveries Pulsar allows once the consumer that
//! received a message reconnected or was removed, or after a restart or seek,
//! and violations), lost messages (unacknowledged messages at or below a
//! seek are *skipped*, not lost; delivering one that was dispatched after
//! the seek is a violation), per-key (Key_Shared) or total (Failover) order
//! violations (redeliveries included: within one consumer incarnation a
//! replay comes in order and before newer messages), acks — individual or
//! cumulative — that cover messages not delivered to the acking consumer's
//! current incarnation, early delayed deliveries and stalls. Consumers are
//! named by a stable id (the client's index); each reconnect starts a new
//! incarnation of it. It shares no state with the components it checks.
//!
//! Memory is bounded by the live window, not by the run: a message
//! acknowledged on every subscription can no longer change any count or
//! violation except as "redelivered after its ack" (an ack is final for the
//! checker: only persisted acks are recorded, and no restart, seek, rewind
//! or reconnect makes an acknowledged message deliverable again). So the
//! checker keeps dense per-message state only from the oldest message some
//! subscription has not acknowledged onwards (the window), and for the
//! retired prefix only which messages were published, as runs of entries
//! (ledger, entry range, batch size). Skipped-by-seek messages stay in the
//! window (a later ack or a delivery dispatched after the seek still
//! matters). The report is the same as with whole-run state.
//!
//! This file holds the checker's state and the events that need no rule
//! of their own; the rules (`impl` blocks of the one checker type) and the
//! state they keep live in:
//!
//! | file | job |
//! |---|---|
//! | `window.rs` | the live window, the retired prefix, retirement |
//! | `subscription.rs` | per-subscription state: delivery/ack state per message, seeks, consumer incarnations |
//! | `delivery.rs` | [`delivered`](DeliveryChecker::delivered): seek, duplicate, delay and order rules |
//! | `acks.rs` | individual and cumulative acks, applied and persisted |
//! | `seek.rs` | a seek's reset, backward or forward: skipped and reopened messages |
//! | `txn.rs` | transactions as the client sees them (read-committed visibility, transactional acks) |
//! | `txn_cumulative.rs` | transactional cumulative acks: applied at commit only, nothing at abort, Pulsar's conflict rules |
//! | `reader.rs` | readers (non-durable subscriptions): what a reader session must read, may not read, and the store's cursor list |
//! | `counts.rs` | [`CheckerCounts`] |
//! | `int_map.rs` | the integer-keyed maps' hasher |

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::position::Position;

mod acks;
mod counts;
mod delivery;
mod int_map;
mod producers;
mod reader;
mod seek;
mod subscription;
mod txn;
mod txn_cumulative;
mod window;

pub use counts::CheckerCounts;
use int_map::IntMap;
pub use reader::{ReaderSessionId, ReaderStart};
use subscription::{Published, SubState, NOT_ACKED, SKIPPED};
pub use txn::{TxnMsg, TxnOutcome};
use window::{Retired, RETIRE_EVERY};

/// Identity of one logical message: the entry holding it and its index in
/// the batch (0 for a non-batched entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageRef {
    /// The entry's position.
    pub position: Position,
    /// Index within the batch.
    pub batch_index: u32,
}

impl std::fmt::Display for MessageRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}#{}", self.position, self.batch_index)
    }
}

/// Which delivery order the subscription type guarantees (checked within
/// each consumer incarnation, and for first-time deliveries across the
/// consumers between two reconnects, restarts or seeks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrderCheck {
    /// No order guarantee (Shared).
    None,
    /// Per-key publish order (Key_Shared).
    PerKey,
    /// Total publish order of the subscription (Failover: one active consumer).
    Total,
}

/// Records events and checks them (see the module docs). Single-threaded:
/// the simulator's event loop owns it.
#[derive(Debug)]
pub struct DeliveryChecker {
    /// Message in the window → absolute publish index.
    index: IntMap<MessageRef, usize>,
    /// The window: messages from publish index `base` on.
    published: VecDeque<(MessageRef, Published)>,
    /// Messages retired (publish indexes below `base`).
    base: usize,
    retired: Retired,
    /// Acks recorded since the last retirement pass.
    acks_since_retire: u32,
    /// Retire after this many acks ([`RETIRE_EVERY`]; tests vary it).
    retire_every: u32,
    next_key_seq: IntMap<u32, u64>,
    subs: BTreeMap<String, SubState>,
    counts: CheckerCounts,
    /// Sends receipted as duplicates with no copy stored (counted lost).
    receipted_not_stored: u64,
    first_violation: Option<String>,
    /// Delayed deliveries may come this many ms early (`tick` in non-strict mode).
    early_tolerance_ms: u64,
    /// A delayed message first delivered more than this after its delivery
    /// time is late (0 = no bound).
    late_bound_ms: u64,
    /// Which order is guaranteed and so checked.
    order: OrderCheck,
    /// Key_Shared: a key is held by one consumer at a time (see
    /// [`DeliveryChecker::set_key_exclusive`]).
    key_exclusive: bool,
    /// Transactions as the client sees them (`txn.rs`).
    txn: txn::TxnState,
    /// Readers' sessions and the publish log they are judged against
    /// (`reader.rs`).
    reader: reader::ReaderState,
    /// Producer admissions as the clients see them (`producers.rs`).
    access: producers::AccessState,
}

impl DeliveryChecker {
    /// A checker for the given subscriptions; every published message is
    /// expected once in each of them. `early_tolerance_ms` is how early a
    /// delayed message may be delivered (Pulsar's non-strict tick); `order`
    /// is the order the subscription type guarantees.
    pub fn new(
        subscriptions: impl IntoIterator<Item = String>,
        early_tolerance_ms: u64,
        order: OrderCheck,
    ) -> Self {
        Self {
            index: HashMap::default(),
            published: VecDeque::new(),
            base: 0,
            retired: Retired::default(),
            acks_since_retire: 0,
            retire_every: RETIRE_EVERY,
            next_key_seq: IntMap::default(),
            subs: subscriptions
                .into_iter()
                .map(|s| (s, SubState::default()))
                .collect(),
            counts: CheckerCounts::default(),
            receipted_not_stored: 0,
            first_violation: None,
            early_tolerance_ms,
            late_bound_ms: 0,
            order,
            key_exclusive: false,
            txn: txn::TxnState::default(),
            reader: reader::ReaderState::default(),
            access: producers::AccessState::default(),
        }
    }

    /// With `PerKey` order: a message of a key delivered to one consumer
    /// incarnation while another live incarnation holds a delivered and
    /// unacknowledged message of that key is an order violation (Pulsar 4's
    /// Key_Shared: a key's messages go to its new consumer only after the
    /// previous one acknowledged or lost what it holds, PIP-379). Off by
    /// default.
    pub fn set_key_exclusive(&mut self, on: bool) {
        self.key_exclusive = on;
    }

    /// Sets the late bound: a delayed message first delivered more than
    /// `ms` after its delivery time is a violation (0 = no bound).
    pub fn set_late_bound(&mut self, ms: u64) {
        self.late_bound_ms = ms;
    }

    /// The late bound (see [`DeliveryChecker::set_late_bound`]).
    pub fn late_bound(&self) -> u64 {
        self.late_bound_ms
    }

    fn violation(&mut self, at_ms: u64, what: String) {
        if self.first_violation.is_none() {
            self.first_violation = Some(format!("t={at_ms}ms: {what}"));
        }
    }

    /// A message was durably published with ordering key `key` (0 when the
    /// workload has no keys) and earliest delivery time `deliver_at_ms` (0 for
    /// an immediate message).
    pub fn published(&mut self, msg: MessageRef, key: u32, deliver_at_ms: u64) {
        let seq = self.next_key_seq.entry(key).or_insert(0);
        *seq += 1;
        let idx = self.base + self.published.len();
        self.index.insert(msg, idx);
        self.published.push_back((
            msg,
            Published {
                key,
                key_seq: *seq,
                deliver_at_ms,
            },
        ));
        for s in self.subs.values_mut() {
            s.delivered.push_back(0);
            // Registered after a seek reset the subscription past it (a
            // send whose receipt came late): at or below its mark-delete,
            // so skipped, as if it had been in the window at the reset.
            if s.reset_mark_delete.is_some_and(|md| msg.position <= md) {
                s.acked.push_back(SKIPPED);
                s.skipped_count += 1;
            } else {
                s.acked.push_back(NOT_ACKED);
            }
        }
        self.counts.published += 1;
        self.reader.published(msg, deliver_at_ms);
    }

    /// The broker restarted: every consumer of every subscription starts a
    /// new incarnation; what they were delivered may be redelivered.
    pub fn restarted(&mut self) {
        for s in self.subs.values_mut() {
            s.end_all_incarnations();
        }
    }

    /// Consumer `consumer` (a stable id across its reconnects) of `sub`
    /// reconnected (or was removed): its unacknowledged messages may be
    /// redelivered (to it or to another consumer); nothing else may.
    pub fn consumer_reconnected(&mut self, sub: &str, consumer: usize) {
        if let Some(s) = self.subs.get_mut(sub) {
            s.end_incarnation(consumer);
        }
    }

    /// An admin seek on `sub` completed at `now_ms`, leaving the mark-delete
    /// at `mark_delete` (forward only): every message at or below it that is
    /// not acknowledged is skipped; the consumers reconnected (a new
    /// redelivery generation). Returns the number of seeks completed on
    /// `sub`, the value later deliveries dispatched after it carry.
    pub fn seek_completed(&mut self, sub: &str, mark_delete: Position, now_ms: u64) -> u32 {
        let end = self.end_at_or_below(mark_delete);
        let base = self.base;
        let Some(s) = self.subs.get_mut(sub) else {
            self.counts.invalid_events += 1;
            self.violation(now_ms, format!("seek on unknown subscription {sub}"));
            return 0;
        };
        if let Some(last) = s.seeks.last().copied().filter(|l| mark_delete < *l) {
            let done = s.seeks.len() as u32;
            self.counts.invalid_events += 1;
            self.violation(
                now_ms,
                format!("{sub}: seek moved mark-delete backward from {last} to {mark_delete}"),
            );
            return done;
        }
        for state in s
            .acked
            .range_mut(s.seek_scan_from.clamp(base, end) - base..end - base)
        {
            if *state == NOT_ACKED {
                *state = SKIPPED;
                s.skipped_count += 1;
            }
        }
        s.seek_scan_from = s.seek_scan_from.max(end);
        s.seeks.push(mark_delete);
        s.end_all_incarnations();
        s.seeks.len() as u32
    }

    /// `msg`, registered as published after a seek (or clear-backlog) on
    /// `sub` whose mark-delete `mark_delete` covers it (its entry was
    /// appended before the seek, its receipt came after), was skipped by
    /// it, as the messages registered before the seek were.
    pub fn published_below_seek(&mut self, sub: &str, msg: MessageRef, mark_delete: Position) {
        if msg.position > mark_delete {
            return;
        }
        let window::Lookup::Live(i) = self.lookup(&msg) else {
            return;
        };
        let base = self.base;
        if let Some(s) = self.subs.get_mut(sub) {
            if let Some(state) = s.acked.get_mut(i - base) {
                if *state == NOT_ACKED {
                    *state = SKIPPED;
                    s.skipped_count += 1;
                }
            }
        }
    }

    /// As [`Self::seek_completed`]'s skipping, over the whole window: every
    /// message of `sub` at or below `mark_delete` not acknowledged is
    /// skipped, wherever it sits in publish order (a driver whose messages
    /// are registered out of position order: the node engine registers a
    /// send at its receipt and a lost receipt's copy at its delivery).
    pub fn skip_at_or_below(&mut self, sub: &str, mark_delete: Position) {
        let Some(s) = self.subs.get_mut(sub) else {
            return;
        };
        for (i, (msg, _)) in self.published.iter().enumerate() {
            if msg.position <= mark_delete && s.acked[i] == NOT_ACKED {
                s.acked[i] = SKIPPED;
                s.skipped_count += 1;
            }
        }
    }

    /// A consumer of `sub` with backlog and free receiver queue received
    /// nothing for `idle_ms`.
    pub fn stalled(&mut self, sub: &str, consumer: &str, idle_ms: u64, now_ms: u64) {
        self.counts.stalls += 1;
        self.violation(
            now_ms,
            format!("{sub}/{consumer}: stalled for {idle_ms}ms with backlog and free permits"),
        );
    }

    /// At quiescence a consumer of `sub` holds `permits` on the broker where
    /// `expected` (its receiver queue size) was due.
    pub fn permit_balance(
        &mut self,
        sub: &str,
        consumer: usize,
        permits: i64,
        expected: i64,
        now_ms: u64,
    ) {
        if permits != expected {
            self.counts.permit_mismatches += 1;
            self.violation(
                now_ms,
                format!(
                    "{sub}/consumer-{consumer}: broker holds {permits} permits after draining, expected {expected}"
                ),
            );
        }
    }

    /// `msg` on `sub` will be replayed after later messages (its delivery
    /// failed before reaching the application): exempt it from the per-key
    /// order check.
    pub fn exempt_from_order(&mut self, sub: &str, msg: MessageRef) {
        // A retired message is never order-checked again (any delivery of
        // it is a redelivery after its ack).
        if let (Some(s), Some(i)) = (self.subs.get_mut(sub), self.index.get(&msg)) {
            s.order_exempt.insert(*i);
        }
    }

    /// A PIP-491 rule broke on consumer `consumer` of `sub` (a debit other
    /// than the P sent, an invalid P accepted, a consumer kept after a failed
    /// write); counted with the permit mismatches.
    pub fn permit_violation(&mut self, sub: &str, consumer: usize, what: &str, now_ms: u64) {
        self.counts.permit_mismatches += 1;
        self.violation(
            now_ms,
            format!("{sub}/consumer-{consumer}: permits: {what}"),
        );
    }

    /// A watchdog stopped the run (`what` names it, the component and the
    /// last events).
    pub fn livelock(&mut self, what: &str, now_ms: u64) {
        self.counts.livelocks += 1;
        self.violation(now_ms, what.to_string());
    }

    /// The broker's clock jumped `ms` forward: from now on delayed messages
    /// may come that much earlier (by the producers' clock) too.
    pub fn allow_early(&mut self, ms: u64) {
        self.early_tolerance_ms = self.early_tolerance_ms.saturating_add(ms);
    }

    /// The delayed tracker of `sub` broke the count rule (`what` says how).
    pub fn tracker_violation(&mut self, sub: &str, what: &str, now_ms: u64) {
        self.counts.tracker_violations += 1;
        self.violation(now_ms, format!("{sub}: delayed tracker: {what}"));
    }

    /// A delayed message of `sub` is late (`what` says which and by how much).
    pub fn late(&mut self, sub: &str, what: &str, now_ms: u64) {
        self.counts.late_deliveries += 1;
        self.violation(now_ms, format!("{sub}: late delayed message: {what}"));
    }

    /// The pending-ack replay of `sub` broke the replay rule.
    pub fn replay_violation(&mut self, sub: &str, what: &str, now_ms: u64) {
        self.counts.replay_violations += 1;
        self.violation(now_ms, format!("{sub}: pending-ack replay: {what}"));
    }

    /// The post-I/O filter of `sub` let an entry through that was deleted
    /// when it ran (`what` says which).
    pub fn filter_leak(&mut self, sub: &str, what: &str, now_ms: u64) {
        self.counts.filter_leaks += 1;
        self.violation(now_ms, format!("{sub}: post-I/O filter leak: {what}"));
    }

    /// A producer's entry was stored twice (`what` says where): counted
    /// with the duplicates (a retried send must be stored once).
    pub fn stored_twice(&mut self, what: &str, now_ms: u64) {
        self.counts.duplicate_violations += 1;
        self.violation(now_ms, format!("stored twice: {what}"));
    }

    /// A send was receipted to its application as a duplicate, and no
    /// copy of it was ever receipted or delivered: receipted, never stored.
    pub fn receipted_never_stored(&mut self, what: &str, now_ms: u64) {
        self.receipted_not_stored += 1;
        self.violation(now_ms, format!("lost: {what}"));
    }

    /// A chunked message the consumer reassembled is not the message its
    /// `uuid` names or not of its `total_chunk_msg_size` (a chunk dropped,
    /// reordered or mixed in).
    pub fn chunked_message_broken(&mut self, what: &str, now_ms: u64) {
        self.counts.chunk_violations += 1;
        self.violation(now_ms, format!("chunked message broken: {what}"));
    }

    /// Whether `msg` was published (in the window or retired).
    pub fn knows(&self, msg: MessageRef) -> bool {
        !matches!(self.lookup(&msg), window::Lookup::Unknown)
    }

    /// The delivery time of published message `msg` (0 if immediate,
    /// unknown, or already acknowledged on every subscription and so
    /// forgotten).
    pub fn deliver_at(&self, msg: MessageRef) -> u64 {
        self.index
            .get(&msg)
            .map_or(0, |i| self.published[*i - self.base].1.deliver_at_ms)
    }

    /// The run stopped at its virtual-time limit with `unpublished` messages
    /// not published and `faults_not_run` planned faults not injected.
    pub fn unfinished(&mut self, unpublished: u64, faults_not_run: u64, now_ms: u64) {
        if unpublished + faults_not_run > 0 {
            self.counts.unfinished += unpublished + faults_not_run;
            self.violation(
                now_ms,
                format!(
                    "run cut short at the virtual-time limit: {unpublished} messages not published, {faults_not_run} planned faults not run"
                ),
            );
        }
    }

    /// Messages received by an application plus messages acknowledged so
    /// far: it grows whenever the run makes progress (the no-progress
    /// watchdog's signal).
    pub fn progress(&self) -> u64 {
        self.counts.delivered + self.counts.acked
    }

    /// Whether every published message is acknowledged (or skipped by a
    /// seek) on every subscription.
    pub fn all_acked(&self) -> bool {
        let n = self.counts.published;
        self.subs
            .values()
            .all(|s| s.acked_count + s.skipped_count == n)
    }

    /// Ends the run: counts messages never acknowledged as lost and returns
    /// the counts and the first violation.
    pub fn finish(mut self, now_ms: u64) -> (CheckerCounts, Option<String>) {
        self.txn_finish(now_ms);
        let mut first_lost = None;
        let mut lost = 0;
        let mut skipped = 0;
        // Retired messages are acknowledged everywhere: only the window
        // can hold lost ones.
        for (name, s) in &self.subs {
            skipped += s.skipped_count;
            for (i, (msg, _)) in self.published.iter().enumerate() {
                if s.acked[i] == NOT_ACKED {
                    lost += 1;
                    if first_lost.is_none() {
                        first_lost = Some(format!("{name}: {msg} never acknowledged"));
                    }
                }
            }
        }
        self.counts.lost = lost + self.receipted_not_stored;
        self.counts.skipped_by_seek = skipped;
        if let Some(l) = first_lost {
            self.violation(now_ms, l);
        }
        (self.counts, self.first_violation)
    }
}

#[cfg(test)]
mod tests;
