//! The simulation report: a table for people, JSON for machines.

use std::fmt;

use serde::Serialize;

use super::checker::CheckerCounts;
use super::crash_storage::{CrashRecord, CrashStorageStats};
#[cfg(feature = "race-hooks")]
use super::hint_race::HintRaceReport;
#[cfg(feature = "race-hooks")]
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
    /// Failover: changes of a subscription's active consumer from one
    /// consumer to another (the core's `ACTIVE_CONSUMER_CHANGE` rewinds;
    /// the first consumer's arrival is not a change).
    pub active_consumer_changes: u64,
    /// Failover: entries sent and unacknowledged, or waiting for
    /// redelivery, when the active consumer changed, which the core's
    /// rewind to the mark-delete handed to the new active consumer.
    pub handover_entries: u64,
    /// Cumulative acks the broker applied (plain and transactional).
    pub cumulative_acks: u64,
    /// Of those, transactional cumulative acks (through the pending-ack store).
    pub txn_cumulative_acks: u64,
    /// Transactional cumulative acks rejected because another transaction's
    /// cumulative ack was still pending on the subscription (Pulsar's
    /// transaction conflict); the client acks that range again later.
    pub txn_cumulative_conflicts: u64,
    /// Probe transactional acks of the subscription's mark-delete entry
    /// (already deleted) refused as a transaction conflict, as Pulsar's
    /// handle does after checking the subscription cursor.
    pub txn_acks_of_deleted_refused: u64,
    /// Committed transactional acks a pending-ack replay handed back after
    /// a restart or crash (the subscription had not persisted them) and the
    /// core re-applied and persisted.
    pub commits_reapplied: u64,
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
    /// Pending-ack replay attempts that failed (retried or given up on),
    /// over every handle of every core of the run.
    pub replay_failed_attempts: u64,
    /// Reads of the pending-ack logs issued by those failed attempts;
    /// divided by `replay_failed_attempts` it is the reads per failed
    /// attempt (Pulsar's bug spun at ~1,000 per second; the fix makes it 1
    /// or 2: the failing read, and the read-ahead issued before it failed).
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
    /// Pending-ack replays a completing read failure ended (fenced, closed
    /// cursor, non-recoverable data with auto-skip on): Ready with what was
    /// read before it.
    pub replays_ended_by_completing_failure: u64,
    /// Replays that gave up on non-recoverable data with auto-skip off
    /// (Pulsar's default: the subscription fails to load).
    pub replay_gave_up_non_recoverable: u64,
    /// Operator reloads with auto-skip turned on after such a give-up.
    pub operator_reloads: u64,
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
    /// Positions the dispatcher asked the lock-free read-scheduling hint
    /// about ([`crate::deletion::CursorDeletionState::is_deleted_for_read_scheduling`]).
    pub hint_lookups: u64,
    /// Most individually deleted ranges a subscription's deletion state
    /// held when its mark-delete and ranges were persisted.
    pub peak_individually_deleted_ranges: u64,
    /// Individual acks made inside a transaction (through the pending-ack
    /// log before the cursor).
    pub txn_individual_acks: u64,
    /// Transactions committed (individual and cumulative).
    pub txn_commits: u64,
    /// Transactions a replay found open after a restart and the broker
    /// aborted (their messages are redelivered).
    pub txn_aborts: u64,
    /// Pending-ack replay attempts that failed and were retried, over every
    /// handle (also those a restart or reload tore down before they were
    /// ready, which [`Activity::replay_failed_attempts`] does not count).
    pub replay_retries: u64,
    /// Delayed messages the bucket tracker accepted (`add_message` true).
    pub delayed_tracked: u64,
    /// Positions the bucket tracker handed out once due
    /// (`get_scheduled_messages`).
    pub delayed_scheduled: u64,
    /// MESSAGE commands the broker sent with an explicit `message_permits`.
    pub commands_with_permits: u64,
    /// Of those, partial batches: P below the entry's batch size (some
    /// batch indexes already acknowledged, the rest sent with `ack_set`).
    pub partial_batch_commands: u64,
    /// Batch-index acks the broker applied (an `ack_set` acknowledging some
    /// messages of a batch entry, the entry kept until none is left).
    pub batch_index_acks: u64,
    /// Negative acks the broker applied (the entry is redelivered, with the
    /// batch indexes acknowledged so far left out).
    pub negative_acks: u64,
    /// Duplicate Subscribes the broker answered with Success while keeping
    /// the consumer it had (no second incarnation or grant).
    pub duplicate_subscribes: u64,
    /// Crash points taken: each killed the broker at the k-th durable write
    /// since its last (re)start (`faults.crash_points`,
    /// `faults.crash_at_writes`), in order.
    pub crashes: Vec<CrashRecord>,
    /// Crash points drawn but not reached before the run ended (the last
    /// one drawn, when the run had fewer durable writes left than its k).
    pub crash_points_unreached: u64,
    /// The in-memory store of the run (`sim::crash_storage`): durable writes
    /// seen, bytes written, peak memory.
    pub crash_storage: Option<CrashStorageStats>,
    /// What the node engine did.
    pub node: Option<super::node::NodeActivity>,
}

/// One counter of a component's work in the run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ComponentCounter {
    /// What it counts.
    pub name: String,
    /// Its value in the run.
    pub value: u64,
    /// Whether the component counts as exercised only when this is non-zero.
    pub key: bool,
}

/// What one of the four components did in the run, and the verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ComponentReport {
    /// The component, in the README's words.
    pub component: String,
    /// The counters that show its work (key ones decide the verdict).
    pub counters: Vec<ComponentCounter>,
    /// Every key counter is non-zero: the run checked this component's
    /// paths. `false` means the run says nothing about it.
    pub exercised: bool,
}

impl ComponentReport {
    pub(crate) fn new(component: &str, counters: &[(&str, u64, bool)]) -> Self {
        let counters: Vec<ComponentCounter> = counters
            .iter()
            .map(|(name, value, key)| ComponentCounter {
                name: (*name).to_string(),
                value: *value,
                key: *key,
            })
            .collect();
        let exercised = counters.iter().all(|c| !c.key || c.value > 0);
        Self {
            component: component.to_string(),
            counters,
            exercised,
        }
    }

    /// The key counters that are zero.
    pub fn missing(&self) -> Vec<&str> {
        self.counters
            .iter()
            .filter(|c| c.key && c.value == 0)
            .map(|c| c.name.as_str())
            .collect()
    }
}

/// The per-component section of the report: for each of the four
/// components, the counters of the event loop (deterministic, so the same
/// seed gives the same verdict; the `hint_race` and `replay_race` stages
/// are reported apart) and whether every key counter is non-zero.
pub fn components(a: &Activity) -> Vec<ComponentReport> {
    vec![
        ComponentReport::new(
            "cursor deletion state + read-scheduling hint + post-I/O filter",
            &[
                ("hint lookups", a.hint_lookups, true),
                ("entries skipped by the hint", a.reads_skipped_by_hint, true),
                (
                    "entries dropped by the post-I/O filter",
                    a.entries_filtered_after_read,
                    true,
                ),
                (
                    "individually deleted ranges (peak at persist)",
                    a.peak_individually_deleted_ranges,
                    true,
                ),
                ("batch-index acks", a.batch_index_acks, false),
                ("reads with latency", a.reads_with_latency, false),
            ],
        ),
        ComponentReport::new(
            "pending-ack replay",
            &[
                (
                    "transactional acks (individual + cumulative)",
                    a.txn_individual_acks + a.txn_cumulative_acks,
                    true,
                ),
                ("commits", a.txn_commits, true),
                ("aborts after a replay", a.txn_aborts, true),
                ("replays completed", a.replays_completed, true),
                ("failed replay attempts retried", a.replay_retries, true),
                (
                    "replay read failures after read-ahead",
                    a.replay_read_failures_injected,
                    false,
                ),
                (
                    "replays ended by a completing failure",
                    a.replays_ended_by_completing_failure,
                    false,
                ),
            ],
        ),
        ComponentReport::new(
            "bucket delayed delivery",
            &[
                ("delayed messages tracked", a.delayed_tracked, true),
                ("delivered when due", a.delayed_scheduled, true),
                ("bucket seals", a.bucket_seals, true),
                ("bucket merges", a.bucket_merges, true),
                ("tracker recoveries", a.delayed_recoveries, true),
                ("bucket trims", a.bucket_trims, false),
            ],
        ),
        ComponentReport::new(
            "PIP-491 exact permits",
            &[
                (
                    "MESSAGE commands with message_permits",
                    a.commands_with_permits,
                    true,
                ),
                (
                    "partial-batch commands (P < batch size)",
                    a.partial_batch_commands,
                    true,
                ),
                ("Flow commands", a.flows, true),
                ("negative acks", a.negative_acks, false),
                ("stale Flows dropped", a.stale_flows_dropped, false),
                ("duplicate Subscribes", a.duplicate_subscribes, false),
                ("admission rejections", a.admission_rejections, false),
            ],
        ),
    ]
}

/// Wall-clock figures (excluded from determinism comparisons).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Timing {
    /// The `hint_race` stage (real threads; its counters vary with timing,
    /// its violations are also counted in [`Report::violations`]), if run.
    #[cfg(feature = "race-hooks")]
    pub hint_race: Option<HintRaceReport>,
    /// The `replay_race` stage (real threads on the pending-ack replay; its
    /// counters vary with timing, its violations are also counted in
    /// [`Report::violations`]), if run.
    #[cfg(feature = "race-hooks")]
    pub replay_race: Option<ReplayRaceReport>,
    /// The real-thread stages the workload asked for that this build does
    /// not have (`hint_race`, `replay_race`: they need the components' test
    /// hooks, built with the `race-hooks` feature only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stages_not_built: Vec<&'static str>,
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
    /// Per component: the counters of its work and whether the run
    /// exercised it ([`components`] of [`Report::activity`]).
    pub components: Vec<ComponentReport>,
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

    /// The components the run did not exercise (a key counter is zero).
    pub fn not_exercised(&self) -> Vec<&str> {
        self.components
            .iter()
            .filter(|c| !c.exercised)
            .map(|c| c.component.as_str())
            .collect()
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
        let rows: [(&str, String); 42] = [
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
                "seek resets (acknowledged messages reopened)",
                format!("{} ({})", c.seek_resets, c.reopened_by_seek),
            ),
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
            (
                "late delayed messages (late behind the re-read backlog, allowed)",
                format!("{} ({})", c.late_deliveries, c.late_behind_backlog),
            ),
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
            ("transaction rule violations", c.txn_violations.to_string()),
            ("reader rule violations", c.reader_violations.to_string()),
            ("chunked messages broken", c.chunk_violations.to_string()),
            (
                "producer access violations",
                c.producer_access_violations.to_string(),
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
                "txn acks of deleted entries refused / commits re-applied after a restart",
                format!(
                    "{} / {}",
                    a.txn_acks_of_deleted_refused, a.commits_reapplied
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
                "replay read failures after read-ahead / completing / gave up, operator reloads",
                format!(
                    "{} / {} / {}, {}",
                    a.replay_read_failures_injected,
                    a.replays_ended_by_completing_failure,
                    a.replay_gave_up_non_recoverable,
                    a.operator_reloads
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
        #[cfg(feature = "race-hooks")]
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
        #[cfg(feature = "race-hooks")]
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
        let crashes = a.crash_storage.as_ref().map(|st| {
            let ks: Vec<String> = a
                .crashes
                .iter()
                .map(|c| {
                    let kind = match c.kind {
                        super::crash_storage::CrashKind::BeforeSync => "before",
                        super::crash_storage::CrashKind::AfterSync => "after",
                    };
                    format!("{} {kind}", c.k)
                })
                .collect();
            [
                (
                    "crash points taken [k-th durable write, before/after its fsync] / unreached",
                    format!(
                        "{} [{}] / {}",
                        a.crashes.len(),
                        ks.join(", "),
                        a.crash_points_unreached
                    ),
                ),
                (
                    "durable writes / store in memory, peak",
                    format!(
                        "{} / {:.1} MiB",
                        st.durable_writes,
                        st.peak_bytes as f64 / (1024.0 * 1024.0)
                    ),
                ),
            ]
        });
        let node = a.node.as_ref().map(|n| {
            (
                "node: crash points (after fsync; during a recovery) / clean restarts / resent entries (copies delivered) / ack receipts (retries) / batch-index acks / redelivery requests / stale commands / ledgers deleted",
                format!(
                    "{} ({}; {}) / {} / {} ({}) / {} ({}) / {} / {} / {} / {}",
                    n.crash_points,
                    n.crashes_after_sync,
                    n.crashes_in_recovery,
                    n.clean_restarts,
                    n.resent_entries,
                    n.lost_receipt_copies,
                    n.ack_receipts,
                    n.ack_retries,
                    n.batch_index_acks,
                    n.redelivery_requests,
                    n.stale_commands,
                    n.ledgers_deleted
                ),
            )
        });
        let rows: Vec<(&str, String)> = rows
            .into_iter()
            .chain(crashes.into_iter().flatten())
            .chain(node)
            .collect();
        #[cfg(feature = "race-hooks")]
        let rows: Vec<(&str, String)> = rows
            .into_iter()
            .chain(hint_race)
            .chain(replay_race)
            .collect();
        let not_built = (!t.stages_not_built.is_empty()).then(|| {
            (
                "stages not built (feature race-hooks)",
                t.stages_not_built.join(", "),
            )
        });
        let rows: Vec<(&str, String)> = rows.into_iter().chain(not_built).collect();
        let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        for (k, v) in rows {
            writeln!(f, "  {k:<width$}  {v}")?;
        }
        writeln!(f)?;
        writeln!(
            f,
            "components (exercised only when every * counter is non-zero):"
        )?;
        for c in &self.components {
            let verdict = if c.exercised {
                "exercised".to_string()
            } else {
                format!("NOT EXERCISED (zero: {})", c.missing().join(", "))
            };
            writeln!(f, "  {}: {verdict}", c.component)?;
            let parts: Vec<String> = c
                .counters
                .iter()
                .map(|k| format!("{}{} {}", k.name, if k.key { "*" } else { "" }, k.value))
                .collect();
            writeln!(f, "    {}", parts.join(", "))?;
        }
        writeln!(f)?;
        let not_exercised = self.not_exercised();
        match &self.first_violation {
            None if self.is_clean() && not_exercised.is_empty() => writeln!(
                f,
                "result: OK (no violations; all four components exercised)"
            ),
            None if self.is_clean() => writeln!(
                f,
                "result: OK (no violations) for what ran; NOT EXERCISED, so not checked by this run: {}",
                not_exercised.join("; ")
            ),
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
