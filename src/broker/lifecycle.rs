//! Consumed-ledger trimming driven by the broker core (Pulsar's
//! `BrokerService.checkConsumedLedgers` every
//! `retentionCheckIntervalInSeconds`, which calls each topic's
//! `ManagedLedgerImpl.trimConsumedLedgersInBackground`).
//!
//! The timer: [`Broker::handle_timeout`] trims every open topic once
//! [`BrokerConfig::retention_check_interval_ms`] has passed since the last
//! trim; [`Broker::poll_timeout`] asks for that deadline only while some
//! topic has a closed ledger (nothing else can be deleted), so an idle core
//! or one whose topics never roll over has no trimming timer.
//!
//! What a topic's subscriptions hold (the `held` position of
//! [`ManagedLedger::trim_consumed_ledgers`], on top of every durable
//! cursor's persisted mark-delete): the smallest of
//! - the replay set and the entries delivered and not acknowledged,
//! - the entries acknowledged inside open transactions (the pending-ack
//!   log's state: `txn_pending`),
//! - the first ledger of the delayed tracker's oldest bucket snapshot
//!   (`(start_ledger_id, -1)`),
//! - the first entry of the oldest open transaction of the topic's
//!   transaction buffer.
//!
//! Every one of them also lies above its subscription's mark-delete, so
//! the cursors alone would keep them; `held` states it and guards it.
//!
//! Hook for per-ledger state of other components: [`Broker::trim_ledgers`]
//! returns the deleted ledger ids per topic, and
//! `Broker::ledgers_deleted` is where the core tells its own components
//! about them (the transaction buffer's aborted set:
//! `TxnBuffer::ledgers_deleted`).

use crate::ledger::{ManagedLedger, RetentionPolicy, TrimOutcome};
use crate::Position;

use super::topic::Topic;
use super::{Broker, BrokerConfig};

/// Trimming state of the core.
#[derive(Debug, Default)]
pub(crate) struct Lifecycle {
    /// When the last trim ran (epoch ms; 0: never).
    pub(crate) last_trim_ms: u64,
    /// Ledgers deleted since the core started.
    pub(crate) ledgers_deleted: u64,
    /// Trims that failed (the store refused; retried at the next interval).
    pub(crate) trim_failures: u64,
}

/// The smallest position `t`'s subscriptions and transaction buffer may
/// still read, beyond what their cursors' mark-deletes keep.
fn held_by(t: &Topic) -> Option<Position> {
    let mut held: Option<Position> = None;
    let mut hold = |p: Position| held = Some(held.map_or(p, |h: Position| h.min(p)));
    for s in t.subscriptions.values() {
        if let Some(p) = s.replay.keys().next() {
            hold(*p);
        }
        if let Some(p) = s.inflight.keys().next() {
            hold(*p);
        }
        if let Some(p) = s.txn_pending.iter().next() {
            hold(*p);
        }
        if let Some(start) = s
            .tracker
            .buckets()
            .iter()
            .map(|(ctx, ..)| ctx.start_ledger_id)
            .filter(|l| *l >= 0)
            .min()
        {
            hold(Position::new(start, -1));
        }
    }
    if let Some(p) = t.buffer.lock().ongoing().values().min() {
        hold(*p);
    }
    held
}

impl Broker {
    /// Trims every open topic's consumed ledgers now (what
    /// [`Broker::handle_timeout`] does every
    /// [`BrokerConfig::retention_check_interval_ms`]); returns, per topic
    /// that deleted any, what was deleted. A topic whose store write fails
    /// keeps everything and is retried at the next interval.
    pub fn trim_ledgers(&mut self, now_ms: u64) -> Vec<(String, TrimOutcome)> {
        self.lifecycle.last_trim_ms = now_ms;
        let retention = self.config.retention;
        let mut done = Vec::new();
        for t in self.topics.values_mut() {
            // The deduplication cursor is durable and holds every entry
            // after its last snapshot: snapshot it first, as Pulsar's
            // periodic deduplication snapshot does, so it holds nothing the
            // subscriptions released (a failure keeps it where it was).
            if t.dedup.behind_snapshot() {
                if let Err(e) = t.dedup.snapshot() {
                    tracing::warn!(topic = %t.name, error = %e, "deduplication snapshot before trimming failed");
                }
            }
            let mut held = held_by(t);
            // A transaction buffer snapshot system topic keeps each topic's
            // latest snapshot, the one its buffer recovers from (Pulsar's
            // system topic is compacted to the latest message per key):
            // the smallest indexed position is held, and a topic open
            // without its index holds everything.
            if super::txn::snapshot::is_snapshot_topic(&t.name) {
                let latest = match self.txn.snapshot_index.get(&t.name) {
                    Some(index) => index.values().min().copied(),
                    None => Some(Position::new(i64::MIN, -1)),
                };
                if let Some(p) = latest {
                    held = Some(held.map_or(p, |h| h.min(p)));
                }
            }
            match t.ml.trim_consumed_ledgers(now_ms, retention, held) {
                Ok(out) if !out.deleted_ledgers.is_empty() => done.push((t.name.clone(), out)),
                Ok(_) => {}
                Err(e) => {
                    self.lifecycle.trim_failures += 1;
                    tracing::warn!(topic = %t.name, error = %e, "consumed-ledger trimming failed; retried at the next interval");
                }
            }
        }
        for (topic, out) in &done {
            self.lifecycle.ledgers_deleted += out.deleted_ledgers.len() as u64;
            self.ledgers_deleted(topic, &out.deleted_ledgers);
        }
        done
    }

    /// Ledgers `deleted` of `topic` are gone (always a prefix of its ledger
    /// list): components that keep state per ledger of the topic drop it
    /// here. The transaction buffer forgets the aborted transactions whose
    /// abort marker was in one of them.
    fn ledgers_deleted(&mut self, topic: &str, deleted: &[i64]) {
        let (Some(t), Some(up_to)) = (self.topics.get(topic), deleted.iter().max()) else {
            return;
        };
        let forgotten = t.buffer.lock().ledgers_deleted(*up_to);
        tracing::debug!(topic, ?deleted, forgotten, "ledgers deleted");
    }

    /// Ledgers deleted by trimming since the core started.
    pub fn ledgers_deleted_total(&self) -> u64 {
        self.lifecycle.ledgers_deleted
    }

    /// The next trimming deadline: `None` while no open topic has a closed
    /// ledger.
    pub(crate) fn trim_deadline(&self) -> Option<u64> {
        let any_closed = self.topics.values().any(|t| has_closed_ledger(&t.ml));
        any_closed.then(|| {
            self.lifecycle
                .last_trim_ms
                .saturating_add(self.config.retention_check_interval_ms)
        })
    }

    /// Trims if the interval has passed (called by `handle_timeout`).
    pub(crate) fn trim_if_due(&mut self) {
        let now = self.now();
        if self.trim_deadline().is_some_and(|d| d <= now) {
            self.trim_ledgers(now);
        }
    }
}

fn has_closed_ledger(ml: &ManagedLedger) -> bool {
    ml.ledgers().len() > 1
}

impl BrokerConfig {
    /// Pulsar's defaults: no retention (`retentionTimeInMinutes = 0`,
    /// `retentionSizeInMB = 0`), trimming every 120 s
    /// (`retentionCheckIntervalInSeconds`).
    pub const DEFAULT_RETENTION: RetentionPolicy = RetentionPolicy {
        time_ms: 0,
        size_bytes: 0,
    };
    /// `retentionCheckIntervalInSeconds` (120 s) in ms.
    pub const DEFAULT_RETENTION_CHECK_INTERVAL_MS: u64 = 120_000;
}
