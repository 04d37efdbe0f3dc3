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

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use serde::Serialize;

use crate::position::Position;

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

/// Hashes the checker's integer keys (a [`MessageRef`]'s three integers, a
/// key, a consumer id, a token) folded by multiply-rotate and finished with
/// a 64-bit mixer: the window's index is looked up on every delivery and
/// ack, and std's SipHash, built against adversarial keys, was the
/// checker's largest cost. The keys are the simulator's own, so no flooding
/// resistance is needed; no result depends on a map's iteration order (with
/// std's per-process random seeds it could not have been deterministic).
#[derive(Debug, Default, Clone, Copy)]
struct IntKeyHasher(u64);

/// A map keyed by integers (see [`IntKeyHasher`]).
type IntMap<K, V> = HashMap<K, V, BuildHasherDefault<IntKeyHasher>>;

impl Hasher for IntKeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }

    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(26) ^ x).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn write_i64(&mut self, x: i64) {
        self.write_u64(x as u64);
    }

    fn write_u32(&mut self, x: u32) {
        self.write_u64(u64::from(x));
    }

    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }

    fn finish(&self) -> u64 {
        // splitmix64's finaliser: every input bit reaches the top bits,
        // which hashbrown uses for its control bytes
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
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

/// Per-message state on one subscription.
const NOT_ACKED: u8 = 0;
const ACKED: u8 = 1;
/// Unacknowledged when an admin seek moved the mark-delete past it.
const SKIPPED: u8 = 2;

#[derive(Debug, Clone, Copy)]
struct Published {
    key: u32,
    /// Publish order of this message among messages with the same key.
    key_seq: u64,
    /// Earliest delivery time (virtual ms), 0 for an ordinary message.
    deliver_at_ms: u64,
}

/// Per subscription. `delivered` and `acked` are indexed by the message's
/// publish index minus the checker's retired count (`base`): ~5 bytes per
/// message and subscription in the live window.
#[derive(Debug, Default)]
struct SubState {
    /// Publish index − base → consumer incarnation (token) of its last
    /// delivery + 1 (0 = never delivered).
    delivered: VecDeque<u32>,
    /// Publish index − base → NOT_ACKED / ACKED (persisted) / SKIPPED (by a seek).
    acked: VecDeque<u8>,
    /// Publish indexes below this are ACKED on this subscription (absolute).
    acked_prefix: usize,
    acked_count: u64,
    skipped_count: u64,
    /// Mark-delete after each completed seek, in seek order (forward only).
    seeks: Vec<Position>,
    /// Publish indexes below this were checked by a seek.
    seek_scan_from: usize,
    /// Publish indexes below this were checked by an applied cumulative ack.
    cumulative_checked_to: usize,
    /// Publish indexes below this were marked by a persisted cumulative ack.
    cumulative_acked_to: usize,
    /// Bumped on every restart, seek and consumer reconnect of this
    /// subscription: first-time deliveries of a key (Key_Shared) or of the
    /// subscription (Failover) are in order across consumers within one epoch.
    epoch: u32,
    /// key → (epoch, highest key_seq delivered first-time in it).
    key_progress: IntMap<u32, (u32, u64)>,
    /// Consumer id → its current incarnation's token. A consumer's token
    /// ends when it reconnects (or is removed), on a restart and on a seek.
    consumer_token: IntMap<usize, u32>,
    /// Token → (consumer id, still the consumer's current incarnation).
    tokens: Vec<(usize, bool)>,
    /// Live token → order key → highest key_seq delivered to that consumer
    /// incarnation (first time or redelivered): what one consumer receives
    /// of a key (Key_Shared) or of the subscription (Failover) is in order,
    /// replays included.
    token_progress: IntMap<u32, IntMap<u32, u64>>,
    /// Publish indexes exempt from the per-key order check (replayed after
    /// a corrupted delivery); pruned below the retired count.
    order_exempt: BTreeSet<usize>,
}

impl SubState {
    /// The current incarnation token of `consumer` (a new one after its
    /// previous incarnation ended).
    fn token(&mut self, consumer: usize) -> u32 {
        if let Some(t) = self.consumer_token.get(&consumer) {
            return *t;
        }
        let t = self.tokens.len() as u32;
        self.tokens.push((consumer, true));
        self.consumer_token.insert(consumer, t);
        t
    }

    /// Ends the current incarnation of `consumer`: what it was delivered may
    /// be redelivered (to it or another consumer).
    fn end_incarnation(&mut self, consumer: usize) {
        if let Some(t) = self.consumer_token.remove(&consumer) {
            self.tokens[t as usize].1 = false;
            self.token_progress.remove(&t);
        }
        self.epoch += 1;
    }

    /// Ends every consumer's incarnation (restart, seek).
    fn end_all_incarnations(&mut self) {
        let consumers: Vec<usize> = self.consumer_token.keys().copied().collect();
        for c in consumers {
            self.end_incarnation(c);
        }
        self.epoch += 1;
    }
}

/// Counters and the first violation, as reported.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CheckerCounts {
    /// Logical messages published.
    pub published: u64,
    /// Deliveries to consumers (including duplicates), summed over subscriptions.
    pub delivered: u64,
    /// Distinct messages acknowledged, summed over subscriptions.
    pub acked: u64,
    /// Redeliveries after the consumer that received the message
    /// reconnected or was removed, or after a restart or seek (Pulsar's
    /// at-least-once).
    pub duplicates_allowed: u64,
    /// Duplicates while the consumer that received the message kept its
    /// incarnation (no reconnect of it, restart or seek in between), or
    /// after an ack.
    pub duplicate_violations: u64,
    /// Messages published but never acknowledged by some subscription
    /// (counted once per subscription) at the end of the run.
    pub lost: u64,
    /// Deliveries (first-time or redelivered) to one consumer incarnation
    /// that came after a later message of the same key (Key_Shared) or any
    /// later message (Failover), and first-time deliveries that overtook an
    /// earlier message of the key across consumers between two reconnects.
    pub order_violations: u64,
    /// Messages not acknowledged when an admin seek moved the subscription's
    /// mark-delete past them (skipped, not lost), summed over subscriptions.
    pub skipped_by_seek: u64,
    /// Deliveries of a message at or below a seek's mark-delete that the
    /// broker dispatched after the seek completed (e.g. a delayed tracker
    /// that keeps delivering trimmed indexes).
    pub delivered_after_seek: u64,
    /// Delayed messages delivered before their delivery time (minus the
    /// allowed tick).
    pub early_deliveries: u64,
    /// Acknowledgements (individual, or covered by a cumulative ack) of
    /// messages not delivered to the acking consumer's current incarnation,
    /// or deliveries of messages never published.
    pub invalid_events: u64,
    /// Consumers that had backlog and free receiver queue but got nothing for
    /// longer than the stall bound.
    pub stalls: u64,
    /// Consumers whose broker-side permits, once everything was delivered,
    /// acknowledged and returned, differ from their receiver queue size
    /// (PIP-491: a permit leaked or was returned twice).
    pub permit_mismatches: u64,
    /// Messages not published, plus planned faults not run, when the run hit
    /// its virtual-time limit (a cut-short run proves nothing).
    pub unfinished: u64,
    /// Delayed messages first delivered later than their delivery time plus
    /// the late bound, or still waiting in the tracker past it (a tracker
    /// that lost or delayed an index, even if a later re-read repairs it).
    pub late_deliveries: u64,
    /// Delayed tracker steps after which its reported count differs from the
    /// truth (messages it accepted and has not yet scheduled), or in which
    /// it scheduled a position it did not hold (twice, or never added).
    pub tracker_violations: u64,
    /// Pending-ack replays reported complete whose state differs from the
    /// log's records up to its end at the start, or that did not complete
    /// within the replay bound.
    pub replay_violations: u64,
    /// Entries the locked post-I/O filter let through although they were
    /// deleted (acknowledged, or at or below mark-delete) when it ran (seed
    /// 004's correctness boundary: an entry acked before the filter ran
    /// must never be delivered).
    pub filter_leaks: u64,
    /// Watchdog stops: virtual time did not advance for too many events, or
    /// the wall-clock bound was exceeded.
    pub livelocks: u64,
}

impl CheckerCounts {
    /// Total number of violations of any kind.
    pub fn violations(&self) -> u64 {
        self.duplicate_violations
            + self.lost
            + self.order_violations
            + self.delivered_after_seek
            + self.early_deliveries
            + self.invalid_events
            + self.stalls
            + self.permit_mismatches
            + self.unfinished
            + self.late_deliveries
            + self.tracker_violations
            + self.replay_violations
            + self.filter_leaks
            + self.livelocks
    }
}

/// Consecutive retired entries of one ledger with the same batch size.
#[derive(Debug, Clone, Copy)]
struct RetiredRun {
    ledger_id: i64,
    first_entry: i64,
    last_entry: i64,
    batch_size: u32,
}

/// The retired prefix of the published messages (acknowledged on every
/// subscription): only which messages they were, run-length encoded by
/// entry, so a late event about one of them is judged as before.
#[derive(Debug, Default)]
struct Retired {
    /// Complete entries, in position order.
    runs: Vec<RetiredRun>,
    /// The last entry retired so far and how many of its messages.
    open: Option<(Position, u32)>,
}

impl Retired {
    /// Retires message `m` (in publish order).
    fn push(&mut self, m: MessageRef) {
        match &mut self.open {
            Some((p, n)) if *p == m.position => *n = (*n).max(m.batch_index + 1),
            _ => {
                self.close();
                self.open = Some((m.position, m.batch_index + 1));
            }
        }
    }

    /// Moves the open entry into the runs.
    fn close(&mut self) {
        let Some((p, n)) = self.open.take() else {
            return;
        };
        if let Some(r) = self.runs.last_mut() {
            if r.ledger_id == p.ledger_id && r.last_entry + 1 == p.entry_id && r.batch_size == n {
                r.last_entry = p.entry_id;
                return;
            }
        }
        self.runs.push(RetiredRun {
            ledger_id: p.ledger_id,
            first_entry: p.entry_id,
            last_entry: p.entry_id,
            batch_size: n,
        });
    }

    /// Whether `m` was published and retired.
    fn contains(&self, m: MessageRef) -> bool {
        if let Some((p, n)) = self.open {
            if p == m.position {
                return m.batch_index < n;
            }
        }
        let key = (m.position.ledger_id, m.position.entry_id);
        let i = self
            .runs
            .partition_point(|r| (r.ledger_id, r.first_entry) <= key);
        i > 0 && {
            let r = self.runs[i - 1];
            r.ledger_id == key.0 && key.1 <= r.last_entry && m.batch_index < r.batch_size
        }
    }
}

/// Where a message stands for the checker.
#[derive(Debug, Clone, Copy)]
enum Lookup {
    /// In the window at this absolute publish index.
    Live(usize),
    /// Published and acknowledged on every subscription (forgotten).
    Retired,
    /// Never published.
    Unknown,
}

/// Retire acknowledged messages after this many acks.
const RETIRE_EVERY: u32 = 4096;

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
    first_violation: Option<String>,
    /// Delayed deliveries may come this many ms early (`tick` in non-strict mode).
    early_tolerance_ms: u64,
    /// A delayed message first delivered more than this after its delivery
    /// time is late (0 = no bound).
    late_bound_ms: u64,
    /// Which order is guaranteed and so checked.
    order: OrderCheck,
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
            first_violation: None,
            early_tolerance_ms,
            late_bound_ms: 0,
            order,
        }
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

    /// Where `msg` stands (window index, retired, or never published).
    fn lookup(&self, msg: &MessageRef) -> Lookup {
        match self.index.get(msg) {
            Some(i) => Lookup::Live(*i),
            None if self.retired.contains(*msg) => Lookup::Retired,
            None => Lookup::Unknown,
        }
    }

    /// Absolute publish index one past the last message at or below `upto`
    /// (at least `base`: every retired message is acknowledged everywhere,
    /// so range scans need not distinguish below it).
    fn end_at_or_below(&self, upto: Position) -> usize {
        self.base + self.published.partition_point(|(m, _)| m.position <= upto)
    }

    /// Forgets the window's prefix that is acknowledged on every
    /// subscription (see the module docs).
    fn retire(&mut self) {
        self.acks_since_retire = 0;
        let base = self.base;
        let mut upto = usize::MAX;
        for s in self.subs.values_mut() {
            let mut p = s.acked_prefix.max(base);
            while s.acked.get(p - base) == Some(&ACKED) {
                p += 1;
            }
            s.acked_prefix = p;
            upto = upto.min(p);
        }
        if upto == usize::MAX || upto <= base {
            return;
        }
        let n = upto - base;
        for (m, _) in self.published.drain(..n) {
            self.index.remove(&m);
            self.retired.push(m);
        }
        for s in self.subs.values_mut() {
            s.delivered.drain(..n);
            s.acked.drain(..n);
            s.order_exempt = s.order_exempt.split_off(&upto);
            s.seek_scan_from = s.seek_scan_from.max(upto);
            s.cumulative_checked_to = s.cumulative_checked_to.max(upto);
            s.cumulative_acked_to = s.cumulative_acked_to.max(upto);
        }
        self.base = upto;
    }

    /// Counts one recorded ack; retires now and then.
    fn ack_recorded(&mut self) {
        self.acks_since_retire += 1;
        if self.acks_since_retire >= self.retire_every {
            self.retire();
        }
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
            s.acked.push_back(NOT_ACKED);
        }
        self.counts.published += 1;
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

    /// `msg` was handed to consumer `consumer` of `sub` at `now_ms`; the
    /// broker dispatched it after `seeks_before_dispatch` seeks on `sub` had
    /// completed. A redelivery is allowed only if the consumer it was last
    /// delivered to has started a new incarnation since (reconnect, removal,
    /// restart, seek); every delivery of an ordered message, redeliveries
    /// included, must come in order within the receiving consumer's
    /// incarnation.
    pub fn delivered(
        &mut self,
        sub: &str,
        consumer: usize,
        msg: MessageRef,
        now_ms: u64,
        seeks_before_dispatch: u32,
    ) {
        self.counts.delivered += 1;
        let found = self.lookup(&msg);
        if let Lookup::Unknown = found {
            self.counts.invalid_events += 1;
            self.violation(now_ms, format!("{sub}: delivered unknown message {msg}"));
            return;
        }
        let base = self.base;
        let Some(s) = self.subs.get_mut(sub) else {
            self.counts.invalid_events += 1;
            self.violation(now_ms, format!("delivery on unknown subscription {sub}"));
            return;
        };
        let epoch = s.epoch;
        let token = s.token(consumer);
        if let Some(seek) = (seeks_before_dispatch as usize)
            .checked_sub(1)
            .and_then(|i| s.seeks.get(i))
        {
            if msg.position <= *seek {
                let seek = *seek;
                self.counts.delivered_after_seek += 1;
                self.violation(
                    now_ms,
                    format!(
                        "{sub}: {msg} dispatched after a seek to mark-delete {seek} skipped it"
                    ),
                );
                return;
            }
        }
        // A retired message is acknowledged on every subscription.
        let idx = match found {
            Lookup::Live(i) if s.acked[i - base] != ACKED => i,
            _ => {
                self.counts.duplicate_violations += 1;
                self.violation(now_ms, format!("{sub}: {msg} redelivered after its ack"));
                return;
            }
        };
        let p = self.published[idx - base].1;
        let prev = std::mem::replace(&mut s.delivered[idx - base], token + 1);
        let first_time = prev == 0;
        if !first_time {
            let (holder, live) = s.tokens[(prev - 1) as usize];
            if live {
                self.counts.duplicate_violations += 1;
                let what = if holder == consumer {
                    format!("{sub}: {msg} delivered twice to consumer-{consumer} with no restart or reconnect between")
                } else {
                    format!("{sub}: {msg} delivered to consumer-{consumer} while consumer-{holder}, which received it, neither reconnected nor restarted")
                };
                self.violation(now_ms, what);
                return;
            }
            self.counts.duplicates_allowed += 1;
        }
        if p.deliver_at_ms > 0 {
            if first_time && self.late_bound_ms > 0 && now_ms > p.deliver_at_ms + self.late_bound_ms
            {
                self.counts.late_deliveries += 1;
                let bound = self.late_bound_ms;
                self.violation(
                    now_ms,
                    format!(
                        "{sub}: late delayed message: {msg} first delivered at {now_ms}ms, due at {}ms (bound {bound}ms)",
                        p.deliver_at_ms
                    ),
                );
            }
            if now_ms + self.early_tolerance_ms < p.deliver_at_ms {
                self.counts.early_deliveries += 1;
                self.violation(
                    now_ms,
                    format!(
                        "{sub}: delayed {msg} delivered at {now_ms}ms, due at {}ms",
                        p.deliver_at_ms
                    ),
                );
            }
            return; // delayed messages carry no ordering guarantee
        }
        if self.order == OrderCheck::None || s.order_exempt.contains(&idx) {
            return;
        }
        // Total order: one pseudo-key whose sequence is the publish index.
        let (order_key, key_seq) = match self.order {
            OrderCheck::Total => (0, idx as u64 + 1),
            _ => (p.key, p.key_seq),
        };
        let what = || match self.order {
            OrderCheck::Total => "subscription order".to_string(),
            _ => format!("key {}", p.key),
        };
        // Within the consumer's incarnation: a replay of a key (Key_Shared)
        // or of the subscription from its mark-delete (Failover) comes in
        // publish order and before newer messages of that key.
        let mine = s
            .token_progress
            .entry(token)
            .or_default()
            .entry(order_key)
            .or_insert(0);
        if key_seq < *mine {
            let last = *mine;
            let kind = if first_time { "" } else { "redelivered " };
            let what = what();
            self.counts.order_violations += 1;
            self.violation(
                now_ms,
                format!("{sub}/consumer-{consumer}: {what}: {kind}message #{key_seq} ({msg}) delivered after #{last}"),
            );
            return;
        }
        *mine = key_seq;
        if !first_time {
            return;
        }
        // Across consumers: first-time deliveries in one epoch are in order.
        let progress = s.key_progress.entry(order_key).or_insert((epoch, 0));
        if progress.0 != epoch {
            *progress = (epoch, 0);
        }
        if key_seq < progress.1 {
            self.counts.order_violations += 1;
            let last = progress.1;
            let what = what();
            self.violation(
                now_ms,
                format!("{sub}: {what}: message #{key_seq} ({msg}) delivered after #{last}"),
            );
        } else {
            progress.1 = key_seq;
        }
    }

    /// `msg` was acknowledged on `sub` (the ack reached the cursor).
    pub fn acked(&mut self, sub: &str, msg: MessageRef, now_ms: u64) {
        let base = self.base;
        let known = self.subs.contains_key(sub);
        let idx = match self.lookup(&msg) {
            // Acknowledged (so delivered) on every subscription already.
            Lookup::Retired if known => return,
            Lookup::Live(i)
                if self
                    .subs
                    .get(sub)
                    .is_some_and(|s| s.delivered[i - base] != 0) =>
            {
                i
            }
            _ => {
                self.counts.invalid_events += 1;
                self.violation(now_ms, format!("{sub}: ack of undelivered {msg}"));
                return;
            }
        };
        if let Some(s) = self.subs.get_mut(sub) {
            Self::mark_acked(s, idx - base, &mut self.counts);
        }
        self.ack_recorded();
    }

    /// The broker applied an individual ack from consumer `consumer` of
    /// `sub` for `msgs` (the messages of one entry; into the cursor's
    /// deletion state or the pending-ack store): each must have been
    /// delivered to this consumer in its current incarnation (or already be
    /// acknowledged or skipped); each one that was not is an invalid event.
    /// The ack counts once it is persisted ([`DeliveryChecker::acked`]).
    pub fn ack_applied(&mut self, sub: &str, consumer: usize, msgs: &[MessageRef], now_ms: u64) {
        let Some(s) = self.subs.get_mut(sub) else {
            self.counts.invalid_events += 1;
            self.violation(now_ms, format!("ack on unknown subscription {sub}"));
            return;
        };
        let token = s.token(consumer) + 1;
        let base = self.base;
        let mut first = None;
        let mut bad = 0;
        for msg in msgs {
            let ok = match self.index.get(msg) {
                Some(i) => s.delivered[i - base] == token || s.acked[i - base] != NOT_ACKED,
                None => self.retired.contains(*msg),
            };
            if !ok {
                bad += 1;
                first.get_or_insert(*msg);
            }
        }
        if let Some(msg) = first {
            self.counts.invalid_events += bad;
            self.violation(
                now_ms,
                format!("{sub}/consumer-{consumer}: ack of {msg}, not delivered to this consumer"),
            );
        }
    }

    /// Marks window index `idx` (absolute − base) acknowledged on `s`.
    fn mark_acked(s: &mut SubState, idx: usize, counts: &mut CheckerCounts) {
        match std::mem::replace(&mut s.acked[idx], ACKED) {
            ACKED => {}
            SKIPPED => {
                s.skipped_count -= 1;
                s.acked_count += 1;
                counts.acked += 1;
            }
            _ => {
                s.acked_count += 1;
                counts.acked += 1;
            }
        }
    }

    /// The broker applied a cumulative ack from consumer `consumer` up to
    /// entry `upto` on `sub` (into the cursor, or into the pending-ack store
    /// for a transaction): every message at or below it (not covered by an
    /// earlier applied cumulative ack) must have been delivered to this
    /// consumer in its current incarnation (or be acknowledged or skipped)
    /// by now; each one that was not is an invalid event.
    pub fn cumulative_ack_applied(
        &mut self,
        sub: &str,
        consumer: usize,
        upto: Position,
        now_ms: u64,
    ) {
        let end = self.end_at_or_below(upto);
        let base = self.base;
        let Some(s) = self.subs.get_mut(sub) else {
            self.counts.invalid_events += 1;
            self.violation(
                now_ms,
                format!("cumulative ack on unknown subscription {sub}"),
            );
            return;
        };
        let from = s.cumulative_checked_to.clamp(base, end) - base;
        let token = s.token(consumer) + 1;
        let mut first = None;
        let mut bad = 0;
        for i in from..end - base {
            if s.delivered[i] != token && s.acked[i] == NOT_ACKED {
                bad += 1;
                first.get_or_insert(i);
            }
        }
        s.cumulative_checked_to = s.cumulative_checked_to.max(end);
        if let Some(i) = first {
            let what = if s.delivered[i] == 0 {
                "undelivered"
            } else {
                "a message not delivered to this consumer:"
            };
            self.counts.invalid_events += bad;
            let msg = self.published[i].0;
            self.violation(
                now_ms,
                format!(
                    "{sub}/consumer-{consumer}: cumulative ack up to {upto} covers {what} {msg}"
                ),
            );
        }
    }

    /// A cumulative ack up to entry `upto` on `sub` reached the store: every
    /// delivered message at or below it is acknowledged (an undelivered one
    /// stays unacknowledged: it was reported when the ack was applied).
    /// Returns how many messages it newly acknowledged.
    pub fn cumulative_acked(&mut self, sub: &str, upto: Position) -> u64 {
        let end = self.end_at_or_below(upto);
        let base = self.base;
        let before = self.counts.acked;
        if let Some(s) = self.subs.get_mut(sub) {
            for i in s.cumulative_acked_to.clamp(base, end) - base..end - base {
                if s.delivered[i] != 0 {
                    Self::mark_acked(s, i, &mut self.counts);
                }
            }
            s.cumulative_acked_to = s.cumulative_acked_to.max(end);
        }
        let newly = self.counts.acked - before;
        self.acks_since_retire = self
            .acks_since_retire
            .saturating_add(u32::try_from(newly).unwrap_or(u32::MAX));
        if self.acks_since_retire >= self.retire_every {
            self.retire();
        }
        newly
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
        self.counts.lost = lost;
        self.counts.skipped_by_seek = skipped;
        if let Some(l) = first_lost {
            self.violation(now_ms, l);
        }
        (self.counts, self.first_violation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(e: i64) -> MessageRef {
        MessageRef {
            position: Position::new(1, e),
            batch_index: 0,
        }
    }

    /// Forgetting acknowledged messages changes nothing: random event
    /// sequences (acks, duplicates, restarts, reconnects, seeks, cumulative
    /// acks, unknown messages) give the same counts and first violation with
    /// retirement after every ack as with none, and the window shrinks.
    #[test]
    fn retiring_acknowledged_messages_keeps_the_report() {
        use rand::{Rng, SeedableRng};
        let mut retired = 0;
        for seed in 0..300u64 {
            for order in [OrderCheck::None, OrderCheck::PerKey, OrderCheck::Total] {
                let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
                let subs = ["a".to_string(), "b".to_string()];
                let mut eager = DeliveryChecker::new(subs.clone(), 0, order);
                eager.retire_every = 1;
                let mut never = DeliveryChecker::new(subs, 0, order);
                never.retire_every = u32::MAX;
                let mut next_entry = 0i64;
                let mut published: Vec<MessageRef> = Vec::new();
                let mut seeks = 0u32;
                for _ in 0..400 {
                    let now = r.random_range(0..1_000u64);
                    let sub = ["a", "b", "c"][r.random_range(0..3)];
                    let consumer = r.random_range(0..3usize);
                    let pick = |r: &mut rand_chacha::ChaCha8Rng, p: &[MessageRef]| {
                        if p.is_empty() || r.random_bool(0.05) {
                            MessageRef {
                                position: Position::new(
                                    1 + r.random_range(0..2),
                                    r.random_range(0..60),
                                ),
                                batch_index: r.random_range(0..4),
                            }
                        } else {
                            // Mostly recent messages, sometimes old ones.
                            let n = p.len();
                            let back = if r.random_bool(0.8) {
                                r.random_range(0..n.min(8))
                            } else {
                                r.random_range(0..n)
                            };
                            p[n - 1 - back]
                        }
                    };
                    match r.random_range(0..100) {
                        0..=19 => {
                            let batch = r.random_range(1..4u32);
                            let ledger = 1 + next_entry / 40;
                            for b in 0..batch {
                                let m = MessageRef {
                                    position: Position::new(ledger, next_entry % 40),
                                    batch_index: b,
                                };
                                let key = r.random_range(0..3);
                                let due = if r.random_bool(0.1) {
                                    r.random_range(0..1_000)
                                } else {
                                    0
                                };
                                eager.published(m, key, due);
                                never.published(m, key, due);
                                published.push(m);
                            }
                            next_entry += 1 + i64::from(r.random_bool(0.1));
                        }
                        20..=54 => {
                            let m = pick(&mut r, &published);
                            eager.delivered(sub, consumer, m, now, seeks);
                            never.delivered(sub, consumer, m, now, seeks);
                            if r.random_bool(0.6) {
                                eager.acked(sub, m, now);
                                never.acked(sub, m, now);
                            }
                        }
                        55..=79 => {
                            let m = pick(&mut r, &published);
                            eager.ack_applied(sub, consumer, &[m], now);
                            never.ack_applied(sub, consumer, &[m], now);
                            eager.acked(sub, m, now);
                            never.acked(sub, m, now);
                        }
                        80..=84 => {
                            let m = pick(&mut r, &published);
                            eager.cumulative_ack_applied(sub, consumer, m.position, now);
                            never.cumulative_ack_applied(sub, consumer, m.position, now);
                            assert_eq!(
                                eager.cumulative_acked(sub, m.position),
                                never.cumulative_acked(sub, m.position)
                            );
                        }
                        85..=89 => {
                            eager.consumer_reconnected(sub, consumer);
                            never.consumer_reconnected(sub, consumer);
                        }
                        90..=92 => {
                            eager.restarted();
                            never.restarted();
                        }
                        93..=95 => {
                            let m = pick(&mut r, &published);
                            eager.exempt_from_order(sub, m);
                            never.exempt_from_order(sub, m);
                        }
                        _ => {
                            let m = pick(&mut r, &published);
                            let a = eager.seek_completed(sub, m.position, now);
                            assert_eq!(a, never.seek_completed(sub, m.position, now));
                            seeks = seeks.max(a);
                        }
                    }
                    assert_eq!(eager.all_acked(), never.all_acked());
                    assert_eq!(eager.counts, never.counts, "seed {seed}");
                }
                // Acknowledge everything delivered, then re-deliver the oldest.
                for m in published.clone() {
                    for s in ["a", "b"] {
                        eager.delivered(s, 9, m, 2_000, 0);
                        never.delivered(s, 9, m, 2_000, 0);
                        eager.acked(s, m, 2_000);
                        never.acked(s, m, 2_000);
                    }
                }
                if let Some(m) = published.first() {
                    eager.delivered("a", 0, *m, 2_001, seeks);
                    never.delivered("a", 0, *m, 2_001, seeks);
                }
                assert!(never.base == 0 && eager.base <= published.len());
                retired += eager.base;
                let (e, ef) = eager.finish(3_000);
                let (n, nf) = never.finish(3_000);
                assert_eq!(e, n, "seed {seed} {order:?}");
                assert_eq!(ef, nf, "seed {seed} {order:?}");
            }
        }
        assert!(
            retired > 1_000,
            "the sequences exercise retirement: {retired}"
        );
    }

    /// A long clean run keeps only the unacknowledged window.
    #[test]
    fn window_is_bounded_by_the_unacknowledged_messages() {
        let mut c = DeliveryChecker::new(["s".to_string(), "t".to_string()], 0, OrderCheck::PerKey);
        c.retire_every = 16;
        for e in 0..100_000 {
            c.published(m(e), (e % 7) as u32, 0);
            for s in ["s", "t"] {
                c.delivered(s, 0, m(e), 1, 0);
                c.acked(s, m(e), 2);
            }
            assert!(c.published.len() <= 17, "window {}", c.published.len());
        }
        c.delivered("s", 0, m(3), 3, 0); // forgotten, still a duplicate
        c.delivered("s", 0, m(100_000), 3, 0); // never published
        let (counts, first) = c.finish(4);
        assert_eq!(counts.duplicate_violations, 1);
        assert_eq!(counts.invalid_events, 1);
        assert!(first.unwrap().contains("1:3#0 redelivered after its ack"));
    }

    #[test]
    fn clean_run_has_no_violations() {
        let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::PerKey);
        for e in 0..3 {
            c.published(m(e), 7, 0);
        }
        for e in 0..3 {
            c.delivered("s", 0, m(e), 10, 0);
            c.acked("s", m(e), 11);
        }
        assert!(c.all_acked());
        let (counts, first) = c.finish(20);
        assert_eq!(counts.violations(), 0, "{first:?}");
        assert_eq!(
            (counts.published, counts.delivered, counts.acked),
            (3, 3, 3)
        );
    }

    #[test]
    fn duplicate_without_restart_is_a_violation_with_restart_allowed() {
        let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::PerKey);
        c.published(m(0), 1, 0);
        c.delivered("s", 0, m(0), 1, 0);
        c.restarted();
        c.delivered("s", 0, m(0), 2, 0);
        c.delivered("s", 0, m(0), 3, 0);
        c.acked("s", m(0), 4);
        let (counts, first) = c.finish(5);
        assert_eq!(counts.duplicates_allowed, 1);
        assert_eq!(counts.duplicate_violations, 1);
        assert!(first.unwrap().contains("delivered twice"));
    }

    #[test]
    fn redelivery_after_ack_loss_and_order_are_caught() {
        let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::PerKey);
        for e in 0..3 {
            c.published(m(e), 1, 0);
        }
        c.delivered("s", 0, m(1), 1, 0);
        c.delivered("s", 0, m(0), 2, 0); // overtaken by #2
        c.acked("s", m(0), 3);
        c.restarted();
        c.delivered("s", 0, m(0), 4, 0); // after its ack
        c.acked("s", m(2), 5); // never delivered
        let (counts, _) = c.finish(6);
        assert_eq!(counts.order_violations, 1);
        assert_eq!(counts.duplicate_violations, 1);
        assert_eq!(counts.invalid_events, 1);
        assert_eq!(counts.lost, 2); // 1 and 2 never acked
    }

    #[test]
    fn delayed_messages_must_not_come_early() {
        let mut c = DeliveryChecker::new(["s".to_string()], 100, OrderCheck::PerKey);
        c.published(m(0), 0, 1_000);
        c.published(m(1), 0, 1_000);
        c.delivered("s", 0, m(0), 950, 0); // within the tick tolerance
        c.delivered("s", 0, m(1), 800, 0);
        let (counts, _) = c.finish(2_000);
        assert_eq!(counts.early_deliveries, 1);
    }

    #[test]
    fn seek_skips_unacked_and_catches_a_delivery_dispatched_after_it() {
        let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::None);
        for e in 0..4 {
            c.published(m(e), 0, 0);
        }
        c.delivered("s", 0, m(0), 1, 0);
        c.acked("s", m(0), 2);
        c.delivered("s", 0, m(1), 3, 0); // dispatched before the seek
        let epoch = c.seek_completed("s", Position::new(1, 2), 4);
        assert_eq!(epoch, 1);
        assert!(!c.all_acked());
        c.delivered("s", 0, m(1), 5, 0); // in flight before the seek: allowed
        c.acked("s", m(1), 6); // skipped → acked
        c.delivered("s", 0, m(2), 7, epoch); // dispatched after the seek: violation
        c.delivered("s", 0, m(3), 8, epoch);
        c.acked("s", m(3), 9);
        assert!(c.all_acked(), "m(2) is skipped, the rest acked");
        let (counts, first) = c.finish(10);
        assert_eq!(counts.skipped_by_seek, 1);
        assert_eq!(counts.delivered_after_seek, 1);
        assert_eq!(counts.lost, 0);
        assert_eq!(counts.violations(), 1);
        assert!(first.unwrap().contains("after a seek"));
    }

    #[test]
    fn cumulative_ack_covering_an_undelivered_message_and_total_order() {
        let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::Total);
        for e in 0..4 {
            c.published(m(e), e as u32, 0); // distinct keys: order is total
        }
        c.delivered("s", 0, m(0), 1, 0);
        c.delivered("s", 0, m(1), 2, 0);
        c.cumulative_ack_applied("s", 0, Position::new(1, 1), 3);
        c.cumulative_acked("s", Position::new(1, 1));
        c.delivered("s", 0, m(3), 4, 0);
        c.cumulative_ack_applied("s", 0, Position::new(1, 3), 5); // m(2) undelivered
        c.cumulative_acked("s", Position::new(1, 3));
        c.delivered("s", 0, m(2), 6, 0); // overtaken by m(3)
        c.delivered("s", 0, m(1), 7, 0); // after its cumulative ack
        let (counts, first) = c.finish(8);
        assert_eq!(counts.acked, 3);
        assert_eq!(counts.invalid_events, 1);
        assert_eq!(counts.order_violations, 1);
        assert_eq!(counts.duplicate_violations, 1);
        assert_eq!(counts.lost, 1);
        assert!(first.unwrap().contains("covers undelivered"));
    }

    /// Per-consumer duplicates across reconnects: a standby's reconnect must not license a duplicate to, or reset
    /// the order progress of, the active consumer (Failover).
    #[test]
    fn unrelated_reconnect_allows_no_duplicate_or_disorder() {
        let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::Total);
        for e in 0..4 {
            c.published(m(e), e as u32, 0);
        }
        c.delivered("s", 0, m(0), 1, 0);
        c.delivered("s", 0, m(1), 2, 0);
        c.delivered("s", 0, m(3), 3, 0);
        c.consumer_reconnected("s", 1); // a standby: nothing is redelivered
        c.delivered("s", 0, m(1), 4, 0); // duplicate to the active consumer
        c.delivered("s", 0, m(2), 5, 0); // 2 after 3 to the same incarnation
        for e in 0..4 {
            c.acked("s", m(e), 6);
        }
        let (counts, first) = c.finish(7);
        assert_eq!(counts.duplicates_allowed, 0);
        assert_eq!(counts.duplicate_violations, 1);
        assert_eq!(counts.order_violations, 1);
        assert!(first.unwrap().contains("delivered twice to consumer-0"));
    }

    /// The same on Shared: consumer 1's reconnect does not allow a duplicate to
    /// consumer 0 of what consumer 0 received, nor a copy to consumer 1 of
    /// what consumer 0 still holds; it does allow redelivering consumer 1's.
    #[test]
    fn shared_duplicate_needs_the_holder_to_reconnect() {
        let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::None);
        for e in 0..3 {
            c.published(m(e), 0, 0);
        }
        c.delivered("s", 0, m(0), 1, 0);
        c.delivered("s", 1, m(1), 1, 0);
        c.consumer_reconnected("s", 1);
        c.delivered("s", 0, m(1), 2, 0); // consumer 1's: allowed
        c.delivered("s", 0, m(0), 3, 0); // consumer 0 never reconnected
        c.delivered("s", 1, m(0), 4, 0); // held by consumer 0: not allowed
        let (counts, first) = c.finish(5);
        assert_eq!(counts.duplicates_allowed, 1);
        assert_eq!(counts.duplicate_violations, 2);
        assert!(first.unwrap().contains("delivered twice to consumer-0"));
    }

    /// Redelivery order: a replay after a failover must come in order (Failover) and a
    /// Key_Shared key's replay before newer messages of that key.
    #[test]
    fn redeliveries_are_order_checked() {
        let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::Total);
        for e in 0..3 {
            c.published(m(e), e as u32, 0);
        }
        for e in 0..3 {
            c.delivered("s", 0, m(e), 1, 0);
        }
        c.consumer_reconnected("s", 0); // real failover to consumer 1
        for e in (0..3).rev() {
            c.delivered("s", 1, m(e), 2, 0); // replayed 2, 1, 0
        }
        let (counts, first) = c.finish(3);
        assert_eq!(counts.duplicates_allowed, 3);
        assert_eq!(counts.order_violations, 2);
        assert!(first.unwrap().contains("redelivered message #2"));

        let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::PerKey);
        for e in 0..4 {
            c.published(m(e), 7, 0);
        }
        c.delivered("s", 0, m(0), 1, 0);
        c.delivered("s", 0, m(1), 1, 0);
        c.consumer_reconnected("s", 0);
        c.delivered("s", 1, m(2), 2, 0); // newer message of key 7 first
        c.delivered("s", 1, m(0), 3, 0); // then the replay
        c.delivered("s", 1, m(1), 3, 0);
        c.delivered("s", 1, m(3), 3, 0);
        let (counts, first) = c.finish(4);
        assert_eq!(counts.order_violations, 2);
        assert!(first.unwrap().contains("key 7: redelivered message #1"));

        // The same replay in order, before newer messages: clean.
        let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::PerKey);
        for e in 0..4 {
            c.published(m(e), 7, 0);
        }
        c.delivered("s", 0, m(0), 1, 0);
        c.delivered("s", 0, m(1), 1, 0);
        c.consumer_reconnected("s", 0);
        for e in 0..4 {
            c.delivered("s", 1, m(e), 2, 0);
            c.acked("s", m(e), 3);
        }
        let (counts, first) = c.finish(4);
        assert_eq!(counts.violations(), 0, "{first:?}");
        assert_eq!(counts.duplicates_allowed, 2);
    }

    /// Cumulative acks cover only delivered messages: after a failover the new active consumer's cumulative ack must
    /// not cover the old active consumer's messages it never received.
    #[test]
    fn cumulative_ack_must_cover_only_this_consumers_deliveries() {
        let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::Total);
        for e in 0..4 {
            c.published(m(e), 0, 0);
        }
        c.delivered("s", 0, m(0), 1, 0);
        c.delivered("s", 0, m(1), 1, 0);
        c.consumer_reconnected("s", 0); // handover to consumer 1 ...
        c.delivered("s", 1, m(2), 2, 0); // ... that skipped the redelivery
        c.delivered("s", 1, m(3), 2, 0);
        c.cumulative_ack_applied("s", 1, Position::new(1, 3), 3);
        let (counts, first) = c.finish(4);
        assert_eq!(counts.invalid_events, 2);
        assert!(first
            .unwrap()
            .contains("covers a message not delivered to this consumer: 1:0#0"));

        // With the redelivery (in order) the same ack is clean.
        let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::Total);
        for e in 0..4 {
            c.published(m(e), 0, 0);
        }
        c.delivered("s", 0, m(0), 1, 0);
        c.delivered("s", 0, m(1), 1, 0);
        c.consumer_reconnected("s", 0);
        for e in 0..4 {
            c.delivered("s", 1, m(e), 2, 0);
        }
        c.cumulative_ack_applied("s", 1, Position::new(1, 3), 3);
        assert_eq!(c.cumulative_acked("s", Position::new(1, 3)), 4);
        let (counts, first) = c.finish(4);
        assert_eq!(counts.violations(), 0, "{first:?}");
    }

    /// An individual ack must come from the consumer incarnation the message
    /// was delivered to.
    #[test]
    fn individual_ack_must_come_from_the_receiving_incarnation() {
        let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::None);
        for e in 0..3 {
            c.published(m(e), 0, 0);
        }
        c.delivered("s", 0, m(0), 1, 0);
        c.delivered("s", 0, m(1), 1, 0);
        c.delivered("s", 1, m(2), 1, 0);
        c.ack_applied("s", 0, &[m(0)], 2); // fine
        c.ack_applied("s", 1, &[m(1)], 2); // consumer 1 never got it
        c.consumer_reconnected("s", 1);
        c.ack_applied("s", 1, &[m(2)], 3); // the old incarnation's
        let (counts, first) = c.finish(4);
        assert_eq!(counts.invalid_events, 2);
        assert!(first
            .unwrap()
            .contains("consumer-1: ack of 1:1#0, not delivered to this consumer"));
    }
}
