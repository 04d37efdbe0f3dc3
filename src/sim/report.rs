//! The simulation report: a table for people, JSON for machines.

use std::fmt;

use serde::Serialize;

use super::checker::CheckerCounts;
use super::hint_race::HintRaceReport;
use super::replay_race::ReplayRaceReport;

/// Component activity during the run (what the faults exercised).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Activity {
    /// Broker restarts performed.
    pub restarts: u64,
    /// Consumer reconnects (new permit incarnations).
    pub reconnects: u64,
    /// Admin seeks (cursor reset forward) performed.
    pub seeks: u64,
    /// Failover: changes of a subscription's active consumer.
    pub active_consumer_changes: u64,
    /// Failover: entries the old active consumer held (sent and
    /// unacknowledged, or read for it and not yet sent) that were handed
    /// to the new active consumer for redelivery.
    pub handover_entries: u64,
    /// Cumulative acks the broker applied (plain and transactional).
    pub cumulative_acks: u64,
    /// Of those, transactional cumulative acks (through the pending-ack store).
    pub txn_cumulative_acks: u64,
    /// Transactional cumulative acks rejected because another transaction's
    /// cumulative ack was still pending on the subscription (Pulsar's
    /// transaction conflict); the client acks that range again later.
    pub txn_cumulative_conflicts: u64,
    /// Read failures injected into the topic and pending-ack ledgers.
    pub read_failures_injected: u64,
    /// Batches the client found corrupted.
    pub corrupted_batches: u64,
    /// Bucket snapshots sealed / merged / trimmed, and tracker recoveries.
    pub bucket_seals: u64,
    /// Bucket merges.
    pub bucket_merges: u64,
    /// Bucket trims.
    pub bucket_trims: u64,
    /// Delayed-tracker recoveries from snapshots.
    pub delayed_recoveries: u64,
    /// Consumer-set rewinds (cursor back to the mark-delete, tracker kept).
    pub rewinds: u64,
    /// Forward jumps of the broker's clock.
    pub clock_jumps: u64,
    /// Admin clear-backlogs (the delayed tracker cleared).
    pub clear_backlogs: u64,
    /// Delayed-tracker clears that failed on an undeletable bucket snapshot
    /// (after the earlier buckets were removed).
    pub delayed_clear_failures: u64,
    /// Snapshot create/delete failures injected.
    pub snapshot_failures_injected: u64,
    /// Pending-ack replay attempts that failed.
    pub replay_failed_attempts: u64,
    /// Reads issued by failed replay attempts (all handles); divided by
    /// `replay_failed_attempts` it is the reads per failed attempt (Pulsar's
    /// bug spun at ~1,000 per second; the fix makes it 1).
    pub replay_reads_in_failed_attempts: u64,
    /// Pending-ack replays that completed (handle Ready).
    pub replays_completed: u64,
    /// Flow commands written by clients.
    pub flows: u64,
    /// Reads the lock-free hint saved (entries skipped before I/O).
    pub reads_skipped_by_hint: u64,
    /// Entries dropped by the locked post-I/O filter (stale negatives:
    /// deleted after the hint let the read be issued, before it completed).
    pub entries_filtered_after_read: u64,
    /// Cursor reads that took virtual time (`read_latency_ms` > 0).
    pub reads_with_latency: u64,
    /// Read failures injected into pending-ack replays after an earlier
    /// read of the attempt succeeded (every class).
    pub replay_read_failures_injected: u64,
    /// Replays ended by a completing failure (fenced, closed cursor,
    /// non-recoverable data with auto-skip on).
    pub replays_ended_by_completing_failure: u64,
    /// Replays that gave up on non-recoverable data with auto-skip off
    /// (Pulsar's default: the subscription fails to load).
    pub replay_gave_up_non_recoverable: u64,
    /// Operator reloads with auto-skip turned on after such a give-up.
    pub operator_reloads: u64,
    /// Topic reloads after a replay a completing failure ended (nothing is
    /// served from its partial state; the next owner replays the whole log).
    pub topic_reloads: u64,
    /// Pending-ack ledgers lost.
    pub pending_ack_ledgers_lost: u64,
    /// Entries pending-ack admission rejected (neither sent nor debited).
    pub admission_rejections: u64,
    /// Consumers removed after an injected asynchronous write failure.
    pub write_failure_removals: u64,
    /// Connections the client closed on an invalid explicit P (faulty broker).
    pub invalid_permit_closes: u64,
    /// Invalid P the faulty broker drew but did not send because the
    /// consumer's connection had closed on one
    /// `faults.faulty_closes_without_progress` times in a row without the
    /// application receiving a message (the fault model's fairness).
    pub faulty_permits_held_back: u64,
    /// Consumers re-created on the same connection (queued Flow across it).
    pub same_connection_recreations: u64,
    /// Flow requests of a closed incarnation that the connection task's
    /// revalidation dropped (queued across a same-connection re-creation).
    pub stale_flows_dropped: u64,
    /// What the node engine did (`None` for the model engine).
    pub node: Option<super::node::NodeActivity>,
}

/// Wall-clock figures (excluded from determinism comparisons).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Timing {
    /// The `hint_race` stage (real threads; its counters vary with timing,
    /// its violations are also counted in [`Report::violations`]), if run.
    pub hint_race: Option<HintRaceReport>,
    /// The `replay_race` stage (real threads on the pending-ack replay; its
    /// counters vary with timing, its violations are also counted in
    /// [`Report::violations`]), if run.
    pub replay_race: Option<ReplayRaceReport>,
    /// Wall time of the run, ms.
    pub wall_ms: u64,
    /// Deliveries per wall-clock second.
    pub deliveries_per_sec: f64,
    /// Peak resident memory of the process, KiB (VmHWM), if known.
    pub peak_memory_kib: Option<u64>,
}

/// Everything `pulsar-core simulate` reports.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// Workload name.
    pub workload: String,
    /// Seed of the run.
    pub seed: u64,
    /// Where the store lived.
    pub data_dir: String,
    /// How the store committed, in `pulsar-core simulate --sync`'s words:
    /// `always` (`SyncMode::Immediate`: every commit fsynced) or `deferred`
    /// (`SyncMode::Deferred`: fsynced when the store is closed).
    pub sync: String,
    /// Virtual time until the workload finished (every message published
    /// and acknowledged, every planned fault run) or the time limit stopped
    /// it, ms; the final drain of in-flight traffic is not included.
    pub virtual_ms: u64,
    /// Delivery accounting from the independent checker.
    pub counts: CheckerCounts,
    /// Component activity.
    pub activity: Activity,
    /// Total violations (all kinds); 0 means the run is clean.
    pub violations: u64,
    /// The first violating event, if any.
    pub first_violation: Option<String>,
    /// Wall-clock figures.
    pub timing: Timing,
}

impl Report {
    /// Whether the run found no violation.
    pub fn is_clean(&self) -> bool {
        self.violations == 0 && self.first_violation.is_none()
    }

    /// The report as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("Report serializes: plain data, string keys")
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.counts;
        let a = &self.activity;
        let t = &self.timing;
        writeln!(
            f,
            "pulsar-core simulate: workload {}, seed {}",
            self.workload, self.seed
        )?;
        let what = match self.sync.as_str() {
            "always" => ", every commit fsynced",
            "deferred" => ", fsynced when the store is closed",
            _ => "",
        };
        writeln!(f, "data dir: {} (sync: {}{what})", self.data_dir, self.sync)?;
        writeln!(f)?;
        let rows: [(&str, String); 36] = [
            ("published", c.published.to_string()),
            ("delivered", c.delivered.to_string()),
            ("acked", c.acked.to_string()),
            (
                "duplicates allowed (after restart/reconnect)",
                c.duplicates_allowed.to_string(),
            ),
            ("duplicate violations", c.duplicate_violations.to_string()),
            ("lost", c.lost.to_string()),
            ("order violations", c.order_violations.to_string()),
            ("skipped by seek", c.skipped_by_seek.to_string()),
            (
                "delivered after a seek skipped them",
                c.delivered_after_seek.to_string(),
            ),
            ("early delayed deliveries", c.early_deliveries.to_string()),
            ("invalid events", c.invalid_events.to_string()),
            ("stalls", c.stalls.to_string()),
            (
                "permit mismatches after drain",
                c.permit_mismatches.to_string(),
            ),
            ("unfinished (time limit)", c.unfinished.to_string()),
            ("late delayed messages", c.late_deliveries.to_string()),
            (
                "delayed tracker violations",
                c.tracker_violations.to_string(),
            ),
            (
                "pending-ack replay violations",
                c.replay_violations.to_string(),
            ),
            (
                "acked entries past the post-I/O filter",
                c.filter_leaks.to_string(),
            ),
            ("livelocks (watchdog)", c.livelocks.to_string()),
            (
                "restarts / reconnects",
                format!("{} / {}", a.restarts, a.reconnects),
            ),
            (
                "seeks / active consumer changes (entries handed over)",
                format!(
                    "{} / {} ({})",
                    a.seeks, a.active_consumer_changes, a.handover_entries
                ),
            ),
            (
                "cumulative acks (transactional; txn conflicts)",
                format!(
                    "{} ({}; {})",
                    a.cumulative_acks, a.txn_cumulative_acks, a.txn_cumulative_conflicts
                ),
            ),
            (
                "read failures injected",
                a.read_failures_injected.to_string(),
            ),
            (
                "replay failed attempts / reads per failed attempt",
                format!(
                    "{} / {}",
                    a.replay_failed_attempts,
                    if a.replay_failed_attempts == 0 {
                        "-".to_string()
                    } else {
                        format!(
                            "{:.2}",
                            a.replay_reads_in_failed_attempts as f64
                                / a.replay_failed_attempts as f64
                        )
                    }
                ),
            ),
            (
                "bucket seals / merges / trims / recoveries",
                format!(
                    "{} / {} / {} / {}",
                    a.bucket_seals, a.bucket_merges, a.bucket_trims, a.delayed_recoveries
                ),
            ),
            (
                "consumer-set rewinds / broker clock jumps",
                format!("{} / {}", a.rewinds, a.clock_jumps),
            ),
            (
                "clear-backlogs / delayed clears failed on a snapshot delete",
                format!("{} / {}", a.clear_backlogs, a.delayed_clear_failures),
            ),
            (
                "replay read failures after read-ahead / completing / gave up, reloads (operator / after a completing failure)",
                format!(
                    "{} / {} / {}, {} / {}",
                    a.replay_read_failures_injected,
                    a.replays_ended_by_completing_failure,
                    a.replay_gave_up_non_recoverable,
                    a.operator_reloads,
                    a.topic_reloads
                ),
            ),
            ("corrupted batches", a.corrupted_batches.to_string()),
            (
                "invalid P held back (faulty-broker fairness)",
                a.faulty_permits_held_back.to_string(),
            ),
            (
                "admission rejections / write-failure removals / invalid-P closes / same-connection re-creations",
                format!(
                    "{} / {} / {} / {}",
                    a.admission_rejections,
                    a.write_failure_removals,
                    a.invalid_permit_closes,
                    a.same_connection_recreations
                ),
            ),
            (
                "flows / stale Flows dropped",
                format!("{} / {}", a.flows, a.stale_flows_dropped),
            ),
            (
                "reads with latency / skipped by hint / filtered after read",
                format!(
                    "{} / {} / {}",
                    a.reads_with_latency, a.reads_skipped_by_hint, a.entries_filtered_after_read
                ),
            ),
            ("virtual time", format!("{} ms", self.virtual_ms)),
            ("wall time", format!("{} ms", t.wall_ms)),
            (
                "deliveries/s, peak memory",
                format!(
                    "{:.0}, {}",
                    t.deliveries_per_sec,
                    t.peak_memory_kib
                        .map(|k| format!("{:.1} MiB", k as f64 / 1024.0))
                        .unwrap_or_else(|| "unknown".into())
                ),
            ),
        ];
        let hint_race = t.hint_race.as_ref().map(|h| {
            (
                "hint_race: lookups / positives / filtered (violations)",
                format!(
                    "{} / {} / {} ({} stale positives, {} filter leaks, {} quiescent disagreements)",
                    h.lookups,
                    h.positives,
                    h.entries_filtered,
                    h.stale_positives,
                    h.filter_leaks,
                    h.quiescent_disagreements
                ),
            )
        });
        let replay_race = t.replay_race.as_ref().map(|r| {
            (
                "replay_race: ready / failed attempts / race trials (violations)",
                format!(
                    "{} / {} / {} ({} incomplete ready, {} writers left open, {} never ready, {} reads after a failure)",
                    r.handles_ready,
                    r.failed_attempts,
                    r.race_trials,
                    r.incomplete_ready,
                    r.writers_left_open,
                    r.never_ready,
                    r.reads_after_failure
                ),
            )
        });
        let node = a.node.as_ref().map(|n| {
            (
                "node: crash points (after fsync; not reached) / clean restarts / resent entries (copies delivered) / ack receipts (retries) / batch-index acks / redelivery requests / stale commands",
                format!(
                    "{} ({}; {}) / {} / {} ({}) / {} ({}) / {} / {} / {}",
                    n.crash_points,
                    n.crashes_after_sync,
                    n.crash_points_not_reached,
                    n.clean_restarts,
                    n.resent_entries,
                    n.lost_receipt_copies,
                    n.ack_receipts,
                    n.ack_retries,
                    n.batch_index_acks,
                    n.redelivery_requests,
                    n.stale_commands
                ),
            )
        });
        let rows: Vec<(&str, String)> = rows
            .into_iter()
            .chain(node)
            .chain(hint_race)
            .chain(replay_race)
            .collect();
        let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        for (k, v) in rows {
            writeln!(f, "  {k:<width$}  {v}")?;
        }
        writeln!(f)?;
        match &self.first_violation {
            None if self.is_clean() => writeln!(f, "result: OK (no violations)"),
            None => writeln!(f, "result: FAILED ({} violations)", self.violations),
            Some(v) => writeln!(
                f,
                "result: FAILED ({} violations); first: {v}",
                self.violations
            ),
        }
    }
}

/// Peak resident set size of this process in KiB (Linux `VmHWM`), if known.
pub fn peak_memory_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}
