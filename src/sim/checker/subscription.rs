//! What the checker keeps per subscription: each message's delivery and
//! ack state in the window, the seeks, and the consumer incarnations
//! (tokens) that decide whether a redelivery is allowed.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::int_map::IntMap;
use crate::position::Position;

/// Per-message state on one subscription.
pub(super) const NOT_ACKED: u8 = 0;
pub(super) const ACKED: u8 = 1;
/// Unacknowledged when an admin seek moved the mark-delete past it.
pub(super) const SKIPPED: u8 = 2;

#[derive(Debug, Clone, Copy)]
pub(super) struct Published {
    pub(super) key: u32,
    /// Publish order of this message among messages with the same key.
    pub(super) key_seq: u64,
    /// Earliest delivery time (virtual ms), 0 for an ordinary message.
    pub(super) deliver_at_ms: u64,
}

/// Per subscription. `delivered` and `acked` are indexed by the message's
/// publish index minus the checker's retired count (`base`): ~5 bytes per
/// message and subscription in the live window.
#[derive(Debug, Default)]
pub(super) struct SubState {
    /// Publish index − base → consumer incarnation (token) of its last
    /// delivery + 1 (0 = never delivered).
    pub(super) delivered: VecDeque<u32>,
    /// Publish index − base → NOT_ACKED / ACKED (persisted) / SKIPPED (by a seek).
    pub(super) acked: VecDeque<u8>,
    /// Publish indexes below this are ACKED on this subscription (absolute).
    pub(super) acked_prefix: usize,
    pub(super) acked_count: u64,
    pub(super) skipped_count: u64,
    /// First deliveries of ordinary (not delayed) messages as (virtual ms,
    /// position), kept as suffix maxima: positions strictly decrease
    /// along it, so the first record after a time holds the highest
    /// position first delivered after that time ([`SubState::passed_after`]).
    pub(super) dispatch_front: Vec<(u64, Position)>,
    /// Mark-delete after each completed seek, in seek order.
    pub(super) seeks: Vec<Position>,
    /// The mark-delete of the latest seek reset (`seek.rs`): a message
    /// registered later at or below it is skipped.
    pub(super) reset_mark_delete: Option<Position>,
    /// The lowest mark-delete of a seek that reopened retired messages
    /// (`seek.rs`): their redelivery above it is allowed.
    pub(super) reopened_retired_above: Option<Position>,
    /// Publish indexes below this were checked by a seek.
    pub(super) seek_scan_from: usize,
    /// Publish indexes below this were checked by an applied cumulative ack.
    pub(super) cumulative_checked_to: usize,
    /// The highest position an applied cumulative ack covered: a message is
    /// checked by the first one that covers its position.
    pub(super) cumulative_checked_upto: Option<Position>,
    /// Publish indexes below this were marked by a persisted cumulative ack.
    pub(super) cumulative_acked_to: usize,
    /// The highest position a persisted cumulative ack covered.
    pub(super) cumulative_acked_upto: Option<Position>,
    /// Bumped on every restart, seek and consumer reconnect of this
    /// subscription: first-time deliveries of a key (Key_Shared) or of the
    /// subscription (Failover) are in order across consumers within one epoch.
    pub(super) epoch: u32,
    /// key → (epoch, highest key_seq delivered first-time in it).
    pub(super) key_progress: IntMap<u32, (u32, u64)>,
    /// Consumer id → its current incarnation's token. A consumer's token
    /// ends when it reconnects (or is removed), on a restart and on a seek.
    pub(super) consumer_token: IntMap<usize, u32>,
    /// Token → (consumer id, still the consumer's current incarnation).
    pub(super) tokens: Vec<(usize, bool)>,
    /// Live token → order key → highest key_seq delivered to that consumer
    /// incarnation (first time or redelivered): what one consumer receives
    /// of a key (Key_Shared) or of the subscription (Failover) is in order,
    /// replays included.
    pub(super) token_progress: IntMap<u32, IntMap<u32, u64>>,
    /// Publish indexes exempt from the per-key order check (replayed after
    /// a corrupted delivery); pruned below the retired count.
    pub(super) order_exempt: BTreeSet<usize>,
    /// Publish indexes the consumer holding them negatively acknowledged
    /// (in the incarnation they were delivered to): each may be redelivered
    /// once while that incarnation lives; pruned below the retired count.
    pub(super) nacked: BTreeSet<usize>,
    /// Publish index → the delivery (token + 1) that held it when an
    /// aborted transaction gave its entry back (`txn.rs`): that holder may
    /// still acknowledge it after the entry went to another consumer.
    pub(super) released_from: BTreeMap<usize, u32>,
    /// Publish indexes an aborted transaction gave back while no live
    /// consumer held them (never delivered, or their holder reconnected or
    /// restarted since): a copy may already be on its way, which the
    /// reconnect allows by itself, so the release is kept for the abort's
    /// own copy after it (`txn.rs`, `delivery.rs`); pruned below the
    /// retired count.
    pub(super) released_while_unheld: BTreeSet<usize>,
    /// Key → live token → messages of the key delivered to that consumer
    /// incarnation and not acknowledged (kept only when the checker is
    /// told keys are exclusive, see `DeliveryChecker::set_key_exclusive`).
    pub(super) key_holders: IntMap<u32, IntMap<u32, u32>>,
}

impl SubState {
    /// The current incarnation token of `consumer` (a new one after its
    /// previous incarnation ended).
    pub(super) fn token(&mut self, consumer: usize) -> u32 {
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
    pub(super) fn end_incarnation(&mut self, consumer: usize) {
        if let Some(t) = self.consumer_token.remove(&consumer) {
            self.tokens[t as usize].1 = false;
            self.token_progress.remove(&t);
            for holders in self.key_holders.values_mut() {
                holders.remove(&t);
            }
        }
        self.epoch += 1;
    }

    /// Ends every consumer's incarnation (restart, seek).
    /// An ordinary message at `position` was first delivered at `now_ms`.
    pub(super) fn first_delivered_ordinary(&mut self, now_ms: u64, position: Position) {
        while self
            .dispatch_front
            .last()
            .is_some_and(|(_, p)| *p <= position)
        {
            self.dispatch_front.pop();
        }
        self.dispatch_front.push((now_ms, position));
    }

    /// The highest position of an ordinary message first delivered after
    /// `after_ms` (and at or before `until_ms`), with when: how far the
    /// subscription's dispatch went then. A record a later, higher one
    /// superseded is not seen (the answer may be lower, never higher).
    pub(super) fn passed_between(&self, after_ms: u64, until_ms: u64) -> Option<(u64, Position)> {
        let i = self.dispatch_front.partition_point(|(t, _)| *t <= after_ms);
        self.dispatch_front
            .get(i)
            .copied()
            .filter(|(t, _)| *t <= until_ms)
    }

    pub(super) fn end_all_incarnations(&mut self) {
        let consumers: Vec<usize> = self.consumer_token.keys().copied().collect();
        for c in consumers {
            self.end_incarnation(c);
        }
        self.epoch += 1;
    }
}
