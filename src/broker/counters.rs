//! Per-component work counters of the core's dispatch and ack paths: what
//! the cursor deletion state, its read-scheduling hint and post-I/O filter,
//! the delayed tracker, the pending-ack handle and PIP-491's permits did.
//! Plain integers each subscription bumps on its own `&mut self` paths (no
//! synchronisation); [`super::Broker::counters`] sums them. Observability
//! only: nothing in the core reads them back.

use std::ops::AddAssign;

use crate::deletion::SkipDeleted;
use crate::ledger::ReadSkip;

/// What the core's components did, summed over subscriptions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DispatchCounters {
    /// Cursor reads issued by dispatch.
    pub cursor_reads: u64,
    /// Entries those reads returned (before the post-I/O filter).
    pub entries_read: u64,
    /// Positions the lock-free read-scheduling hint was asked about.
    pub hint_lookups: u64,
    /// Of those, answered "deleted": a read saved (a run of deleted
    /// entries hopped over counts once).
    pub hint_hits: u64,
    /// Entries the locked post-I/O filter dropped (deleted after the hint
    /// let their read be issued).
    pub filtered_after_read: u64,
    /// Delayed entries the tracker accepted (`add_message` true).
    pub delayed_added: u64,
    /// Positions the tracker handed out once due.
    pub delayed_scheduled: u64,
    /// Pending-ack handle operations (transactional acks, commits, aborts).
    pub pending_ack_ops: u64,
    /// MESSAGE commands sent (each with its `message_permits`).
    pub messages_sent: u64,
    /// Σ `message_permits` debited.
    pub permits_debited: u64,
    /// MESSAGE commands whose P is below the entry's batch size (a partial
    /// batch sent with its `ack_set`).
    pub partial_batches: u64,
    /// Batch-index acks applied (an `ack_set` leaving some indexes).
    pub batch_index_acks: u64,
    /// Most individually deleted ranges persisted at once.
    pub peak_deleted_ranges: u64,
    /// Cursor resets (seeks) applied; `seek.rs`.
    pub resets: u64,
    /// Pending-ack replays completed (handles Ready).
    pub replays_completed: u64,
    /// Pending-ack replay attempts that failed and were retried after
    /// their backoff.
    pub replay_failed_attempts: u64,
    /// Pending-ack handles that gave up (a non-retryable replay failure:
    /// non-recoverable data with auto-skip off).
    pub replays_gave_up: u64,
    /// Pending-ack replay attempts that failed (retried or given up on).
    pub replay_attempts_failed: u64,
    /// Reads of the pending-ack logs issued by those failed attempts.
    pub replay_reads_in_failed_attempts: u64,
    /// Pending-ack replays that a completing read failure ended (Ready
    /// with what was read before it: non-recoverable data with auto-skip
    /// on, a fenced ledger, a closed cursor).
    pub replays_ended_by_completing_failure: u64,
    /// Committed transactional acks a Ready pending-ack handle handed back
    /// that the subscription's persisted state lacked, re-applied and
    /// persisted (`txn::handlers`, after a crash between the commit's
    /// pending-ack record and the subscription's persist).
    pub commits_reapplied: u64,
    /// Failover: changes of a subscription's active consumer from one
    /// consumer to another (`failover.rs`; the first consumer's arrival
    /// is not a change).
    pub active_consumer_changes: u64,
    /// Failover: entries sent and unacknowledged, or waiting for
    /// redelivery, when the active consumer changed: the rewind to the
    /// mark-delete hands them to the new active consumer.
    pub failover_handover_entries: u64,
    /// Reads of subscriptions' entries that failed (each followed by the
    /// read backoff, `read_backoff.rs`).
    pub read_failures: u64,
    /// Consumer-set rewinds (`consumer_set.rs`).
    pub consumer_set_rewinds: u64,
    /// Clear-backlogs applied (`clear_backlog.rs`).
    pub backlogs_cleared: u64,
    /// Read completions that matched no read in flight and were dropped
    /// (the read was dropped by a seek, a rewind or an unsubscribe;
    /// `read_completion.rs`). Counted per core, not per subscription.
    pub stale_read_completions: u64,
}

impl AddAssign for DispatchCounters {
    fn add_assign(&mut self, o: Self) {
        self.cursor_reads += o.cursor_reads;
        self.entries_read += o.entries_read;
        self.hint_lookups += o.hint_lookups;
        self.hint_hits += o.hint_hits;
        self.filtered_after_read += o.filtered_after_read;
        self.delayed_added += o.delayed_added;
        self.delayed_scheduled += o.delayed_scheduled;
        self.pending_ack_ops += o.pending_ack_ops;
        self.messages_sent += o.messages_sent;
        self.permits_debited += o.permits_debited;
        self.partial_batches += o.partial_batches;
        self.batch_index_acks += o.batch_index_acks;
        self.peak_deleted_ranges = self.peak_deleted_ranges.max(o.peak_deleted_ranges);
        self.resets += o.resets;
        self.replays_completed += o.replays_completed;
        self.replay_failed_attempts += o.replay_failed_attempts;
        self.replays_gave_up += o.replays_gave_up;
        self.replay_attempts_failed += o.replay_attempts_failed;
        self.replay_reads_in_failed_attempts += o.replay_reads_in_failed_attempts;
        self.replays_ended_by_completing_failure += o.replays_ended_by_completing_failure;
        self.commits_reapplied += o.commits_reapplied;
        self.active_consumer_changes += o.active_consumer_changes;
        self.failover_handover_entries += o.failover_handover_entries;
        self.read_failures += o.read_failures;
        self.consumer_set_rewinds += o.consumer_set_rewinds;
        self.backlogs_cleared += o.backlogs_cleared;
        self.stale_read_completions += o.stale_read_completions;
    }
}

/// [`SkipDeleted`] counting the hint's answers.
pub(crate) struct CountingSkip<'a> {
    pub(crate) inner: SkipDeleted<'a>,
    pub(crate) hits: u64,
}

impl ReadSkip for CountingSkip<'_> {
    fn skip(&mut self, ledger_id: i64, entry_id: i64) -> bool {
        let s = self.inner.skip(ledger_id, entry_id);
        self.hits += u64::from(s);
        s
    }

    fn skipped_run_end(&mut self, ledger_id: i64, entry_id: i64) -> Option<i64> {
        self.inner.skipped_run_end(ledger_id, entry_id)
    }
}

impl super::Broker {
    /// The components' work so far, summed over every subscription.
    pub fn counters(&self) -> DispatchCounters {
        let mut c = DispatchCounters {
            stale_read_completions: self.out.stale_reads,
            ..DispatchCounters::default()
        };
        for t in self.topics.values() {
            for s in t.subscriptions.values() {
                c += s.counters;
                c.read_failures += s.read_backoff.failures;
                if let Some(h) = &s.pending_ack {
                    let st = h.stats();
                    c.replays_completed += u64::from(st.completed.is_some());
                    c.replay_failed_attempts += st.retry_delays_ms.len() as u64;
                    // Every attempt but the one that completed failed (the
                    // core's replays read inline: an attempt ends inside the
                    // input that started it, none is half-way here).
                    let done = st.completed.as_ref();
                    c.replay_attempts_failed +=
                        st.attempts.saturating_sub(u64::from(done.is_some()));
                    c.replay_reads_in_failed_attempts += st
                        .reads_issued
                        .saturating_sub(done.map_or(0, |r| r.reads_issued as u64));
                    c.replays_ended_by_completing_failure +=
                        u64::from(done.is_some_and(|r| r.completing_failure.is_some()));
                    c.replays_gave_up +=
                        u64::from(h.state() == crate::pending_ack::HandleState::Error);
                }
            }
        }
        c
    }
}
