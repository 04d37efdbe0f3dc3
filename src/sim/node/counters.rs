//! The core's per-component counters in the node engine's report: summed
//! over every core of the run (each restart or crash starts a new one, so
//! a core's counters are taken just before it is dropped) and copied into
//! the report's activity, so the component section shows what the shipped
//! core did (hint lookups and hits, post-I/O filter drops, delayed adds,
//! pending-ack operations, permits) instead of NOT EXERCISED. The checker
//! never reads them.

use crate::broker::DispatchCounters;

use super::super::report::Activity;
use super::Node;

impl Node<'_> {
    /// Adds the live core's counters to the run's (before it is dropped).
    pub(super) fn collect_core_counters(&mut self) {
        if let Some(b) = &self.broker {
            self.core_counters += b.counters();
        }
    }
}

/// Copies the run's core counters into the report's activity.
pub(super) fn into_activity(c: &DispatchCounters, a: &mut Activity) {
    a.hint_lookups += c.hint_lookups;
    a.reads_skipped_by_hint += c.hint_hits;
    a.entries_filtered_after_read += c.filtered_after_read;
    a.delayed_tracked += c.delayed_added;
    a.delayed_scheduled += c.delayed_scheduled;
    a.commands_with_permits += c.messages_sent;
    a.partial_batch_commands += c.partial_batches;
    a.batch_index_acks += c.batch_index_acks;
    a.replays_completed += c.replays_completed;
    a.replay_failed_attempts += c.replay_attempts_failed;
    a.replay_reads_in_failed_attempts += c.replay_reads_in_failed_attempts;
    a.replay_retries += c.replay_failed_attempts;
    a.replay_gave_up_non_recoverable += c.replays_gave_up;
    a.replays_ended_by_completing_failure += c.replays_ended_by_completing_failure;
    a.commits_reapplied += c.commits_reapplied;
    a.active_consumer_changes += c.active_consumer_changes;
    a.handover_entries += c.failover_handover_entries;
    a.peak_individually_deleted_ranges = a
        .peak_individually_deleted_ranges
        .max(c.peak_deleted_ranges);
}
