//! `pulsar-core simulate` end to end: every preset (small) runs clean on the
//! redb store with its faults on; the checker catches deliberate defects;
//! the same seed gives the same report; bad input is a clear error.
#![cfg(not(any(loom, feature = "shuttle")))]

use std::process::Command;

use pulsar_core::sim::{run, Report, Sabotage, SimOptions, Watchdog, Workload};

/// Per-run watchdogs: a hang inside one event exits the test process with
/// a livelock report within 30 s; a run past 120 s of wall time stops with
/// a violation (no test may hang CI).
fn test_watchdog() -> Watchdog {
    Watchdog {
        exit_on_hang: Some(std::time::Duration::from_secs(30)),
        wall_limit: Some(std::time::Duration::from_secs(120)),
        ..Watchdog::default()
    }
}

fn small(name: &str, messages: u64) -> Workload {
    let mut w = Workload::preset(name).unwrap();
    w.messages = messages;
    w
}

fn run_in_tempdir(w: &Workload, seed: u64, sabotage: Option<Sabotage>) -> Report {
    run_with(w, seed, true, sabotage)
}

/// Runs `tests/workloads/FILE` with `seed` and asserts the report is clean;
/// returns the workload and the report for the caller's activity checks.
fn run_workload_file_clean(file: &str, seed: u64) -> (Workload, Report) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/workloads")
        .join(file);
    let w = Workload::from_toml_file(&path).unwrap();
    let r = run_in_tempdir(&w, seed, None);
    assert!(
        r.is_clean(),
        "{file} seed {seed}: {:?} ({} violations)",
        r.first_violation,
        r.violations
    );
    (w, r)
}

fn run_with(w: &Workload, seed: u64, faults: bool, sabotage: Option<Sabotage>) -> Report {
    let dir = tempfile::tempdir().unwrap();
    let opts = SimOptions {
        seed,
        data_dir: dir.path().join("data"),
        faults,
        sabotage,
        sync: pulsar_core::ledger::SyncMode::Immediate,
        watchdog: test_watchdog(),
        trace_dir: None,
    };
    run(w, &opts, None).unwrap()
}

/// Messages per preset in the small runs: `delayed` needs a few ledgers
/// below its seeks for buckets to be trimmed.
fn small_size(name: &str) -> u64 {
    match name {
        "delayed" => 4_000,
        _ => 2_000,
    }
}

#[test]
fn every_preset_runs_clean_with_faults() {
    for name in Workload::PRESETS {
        let messages = small_size(name);
        let w = small(name, messages);
        let r = run_in_tempdir(&w, 7, None);
        assert!(r.is_clean(), "{name}: {r}");
        // On the node engine a send whose receipt a restart lost is sent
        // again: the stored original is registered as published when it is
        // delivered (a copy), and the resend is either stored too (another
        // message) or answered as a duplicate by the core's deduplication
        // (not stored, never published). A duplicate answer's copy the
        // store holds is registered when the answer arrives, if no delivery
        // showed it first (`dup_copies_in_store`).
        let (copies, deduplicated) = r.activity.node.as_ref().map_or((0, 0), |n| {
            (
                n.lost_receipt_copies + n.dup_copies_in_store,
                n.deduplicated_messages,
            )
        });
        assert_eq!(
            r.counts.published + deduplicated,
            messages + copies,
            "{name}"
        );
        assert_eq!(
            r.counts.acked + r.counts.skipped_by_seek,
            r.counts.published * u64::from(w.subscriptions),
            "{name}: every message acknowledged (or skipped by a seek) on every subscription"
        );
        // The node engine's seeks are its clients' SEEK commands.
        let seeks = r
            .activity
            .node
            .as_ref()
            .map_or(r.activity.seeks, |n| n.seeks_sent);
        assert_eq!(
            u64::from(w.faults.seeks),
            seeks,
            "{name}: planned seeks happened"
        );
        // On the node engine a crash point is a restart too: the clean
        // ones are the planned ones.
        let restarts = r
            .activity
            .node
            .as_ref()
            .map_or(r.activity.restarts, |n| n.clean_restarts);
        assert_eq!(
            u64::from(w.faults.restarts),
            restarts,
            "{name}: planned restarts happened"
        );
        match name {
            "delayed" => {
                // On the shipped core: its trackers seal, merge and recover
                // under the truth checks; the rewinds, clock jumps and
                // clear-backlogs planned all ran.
                assert!(r.activity.bucket_seals > 0, "{name}: {r}");
                assert!(r.activity.bucket_merges > 0, "{name}: {r}");
                assert!(r.activity.delayed_recoveries > 0, "{name}: {r}");
                assert!(r.activity.snapshot_failures_injected > 0, "{name}: {r}");
                assert!(r.counts.skipped_by_seek > 0, "{name}: {r}");
                assert_eq!(
                    (
                        u64::from(w.faults.clear_backlogs),
                        u64::from(w.faults.rewinds),
                        u64::from(w.faults.clock_jumps)
                    ),
                    (
                        r.activity.clear_backlogs,
                        r.activity.rewinds,
                        r.activity.clock_jumps
                    ),
                    "{name}: planned clear-backlogs, rewinds and clock jumps happened"
                );
            }
            "failover" => {
                // On the node engine: the core's ACTIVE_CONSUMER_CHANGE
                // notices to the consumers that stopped being active.
                assert!(r.activity.cumulative_acks > 0, "{name}: {r}");
                assert!(r.activity.txn_cumulative_acks > 0, "{name}: {r}");
                let changes = r
                    .activity
                    .node
                    .as_ref()
                    .map_or(r.activity.active_consumer_changes, |n| n.inactive_notices);
                assert!(changes > 0, "{name}: {r}");
            }
            "txn-outage" => {
                // On the node engine: the lost ledger with auto-skip off
                // makes the replay give up until the operator reloads with
                // auto-skip on; the outages fail reads.
                assert!(r.activity.read_failures_injected > 0, "{name}: {r}");
                assert!(r.activity.pending_ack_ledgers_lost > 0, "{name}: {r}");
                assert_eq!(r.activity.operator_reloads, 1, "{name}: {r}");
            }
            "permit-churn" => assert!(r.activity.reconnects > 0, "{name}: {r}"),
            _ => {}
        }
    }
}

/// `pulsar-core simulate` without `--workload` runs the `default` preset on
/// the shipped broker core, and every component does work at the default
/// seed: the hint skips reads and the post-I/O filter
/// drops entries acknowledged while their read was in flight; transactional
/// acks commit and abort, with pending-ack replays after the restarts and
/// crashes and failed replay attempts retried; the bucket tracker seals,
/// merges and recovers under the truth checks, every planned rewind, clock
/// jump and clear-backlog runs; the permits see partial batches. The
/// component section says all four were exercised. The whole preset, as
/// `pulsar-core simulate` runs it (a shorter run merges no bucket).
#[test]
fn the_default_run_exercises_all_four_components() {
    let w = Workload::preset("default").unwrap();
    assert_eq!(w.engine, pulsar_core::sim::Engine::Node);
    let dir = tempfile::tempdir().unwrap();
    // `--sync always` (the CLI's default): transactions with crash points
    // need it. The whole preset takes about 30 s in a debug build on an
    // idle machine: a wider wall-clock bound than the other tests'.
    let opts = SimOptions {
        watchdog: Watchdog {
            wall_limit: Some(std::time::Duration::from_secs(400)),
            ..test_watchdog()
        },
        ..SimOptions::new(1, dir.path().join("data"))
    };
    let r = run(&w, &opts, None).unwrap();
    assert!(r.is_clean(), "{r}");
    let a = &r.activity;
    // Cursor deletion state, hint and post-I/O filter (reads in flight).
    assert!(a.hint_lookups > 0 && a.reads_skipped_by_hint > 0, "{r}");
    assert!(a.reads_with_latency > 0, "{r}");
    assert!(a.entries_filtered_after_read > 0, "{r}");
    assert!(a.peak_individually_deleted_ranges > 0, "{r}");
    // Transactional acks, pending-ack replay after restarts and crashes,
    // failed attempts retried.
    assert!(a.txn_individual_acks > 0, "{r}");
    assert!(a.txn_commits > 0 && a.txn_aborts > 0, "{r}");
    assert!(a.replays_completed > 0, "{r}");
    assert!(a.replay_retries > 0, "{r}");
    let node = a.node.as_ref().unwrap();
    assert!(node.crash_points > 0, "{r}");
    // Bucket delayed delivery.
    assert!(a.delayed_tracked > 0 && a.delayed_scheduled > 0, "{r}");
    assert!(a.bucket_seals > 0 && a.bucket_merges > 0, "{r}");
    assert!(a.delayed_recoveries > 0, "{r}");
    assert!(a.snapshot_failures_injected > 0, "{r}");
    assert_eq!(
        (a.rewinds, a.clock_jumps, a.clear_backlogs),
        (
            u64::from(w.faults.rewinds),
            u64::from(w.faults.clock_jumps),
            u64::from(w.faults.clear_backlogs)
        ),
        "{r}"
    );
    // PIP-491 permits with partial batches.
    assert!(a.commands_with_permits > 0 && a.flows > 0, "{r}");
    assert!(
        a.partial_batch_commands > 0 && a.batch_index_acks > 0,
        "{r}"
    );
    assert!(a.negative_acks > 0 && a.duplicate_subscribes > 0, "{r}");
    assert!(
        r.components.iter().all(|c| c.exercised),
        "every component section exercised: {r}"
    );
    assert!(r.not_exercised().is_empty(), "{r}");
}

/// A duplicate Subscribe keeps the broker consumer as it is (Pulsar answers
/// Success and keeps it): its balance and pending messages stay, so every
/// permit rule holds.
#[test]
fn a_duplicate_subscribe_keeps_the_consumer() {
    let mut w = small("permit-churn", 1_000);
    w.faults = pulsar_core::sim::Faults {
        duplicate_subscribes: 6,
        ..pulsar_core::sim::Faults::none()
    };
    let clean = run_in_tempdir(&w, 3, None);
    assert!(clean.is_clean(), "{clean}");
    assert!(clean.activity.duplicate_subscribes > 0, "{clean}");
}

/// Negative control of the component verdicts: presets that give some
/// components no work report exactly those as NOT EXERCISED, in the
/// component section and in the result line, never as a bare OK.
#[test]
fn a_run_without_work_for_a_component_reports_it_not_exercised() {
    let fanout = run_in_tempdir(&small("fanout", 500), 1, None);
    assert!(fanout.is_clean(), "{fanout}");
    let missing = fanout.not_exercised();
    assert!(
        missing.iter().any(|c| c.starts_with("pending-ack replay"))
            && missing
                .iter()
                .any(|c| c.starts_with("bucket delayed delivery"))
            && missing.iter().any(|c| c.starts_with("PIP-491")),
        "{fanout}"
    );
    let text = fanout.to_string();
    assert!(!text.contains("all four components exercised"), "{text}");
    let result = text.lines().find(|l| l.starts_with("result:")).unwrap();
    assert!(
        result.contains("NOT EXERCISED")
            && result.contains("pending-ack replay")
            && result.contains("bucket delayed delivery"),
        "{result}"
    );
    // Transactions without delayed messages: only the delayed tracker idle.
    let txn = run_in_tempdir(&small("txn-outage", 1_000), 1, None);
    assert!(txn.is_clean(), "{txn}");
    let delayed = txn
        .components
        .iter()
        .find(|c| c.component.starts_with("bucket delayed delivery"))
        .unwrap();
    assert!(!delayed.exercised, "{txn}");
    assert!(
        delayed.missing().contains(&"delayed messages tracked"),
        "{txn}"
    );
    let pending_ack = txn
        .components
        .iter()
        .find(|c| c.component.starts_with("pending-ack replay"))
        .unwrap();
    assert!(
        pending_ack.counters.iter().any(|c| c.key && c.value > 0),
        "{txn}"
    );
    let json: serde_json::Value = serde_json::from_str(&txn.to_json()).unwrap();
    assert_eq!(json["components"][2]["exercised"], false);
}

/// The CLI's default workload is `default` and its report carries the
/// component section.
#[test]
fn the_cli_default_workload_is_the_all_component_run() {
    let out = cli(&["simulate", "--messages", "300", "--quiet"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.starts_with("pulsar-core simulate: workload default, seed 1"),
        "{text}"
    );
    assert!(text.contains("components (exercised only when"), "{text}");
}

/// The checker's negative controls on the broker core: a client library
/// that drops one message it received is reported as loss, one that hands a
/// message to the application twice as a duplicate.
#[test]
fn the_checker_catches_each_deliberate_defect() {
    // Without faults, so no reconnect or restart redelivers what the
    // defect dropped (at-least-once would otherwise repair it).
    let w = small("permit-churn", 1_000);
    let baseline = run_with(&w, 3, false, None);
    assert!(baseline.is_clean(), "{baseline}");
    let dropped = run_with(&w, 3, false, Some(Sabotage::DropOneDelivery));
    assert!(!dropped.is_clean());
    assert!(dropped.counts.lost > 0, "{dropped}");

    let twice = run_with(&w, 3, false, Some(Sabotage::DeliverOneTwice));
    assert!(!twice.is_clean());
    assert!(twice.counts.duplicate_violations > 0, "{twice}");
}

/// Pulsar's clear-backlog clears the delayed tracker; when a later
/// bucket's snapshot cannot be deleted, `clear` fails part-way and the
/// tracker must stay consistent (`CounterEqualsCardinality`, checked right
/// after it returns) and deliver nothing it dropped.
#[test]
fn a_clear_backlog_failing_on_a_later_bucket_snapshot_leaves_the_tracker_consistent() {
    let mut w = small("delayed", 4_000);
    w.faults.clear_delete_failure_ratio = 1.0;
    let r = run_in_tempdir(&w, 7, None);
    assert!(r.is_clean(), "{r}");
    assert_eq!(r.activity.clear_backlogs, 1, "{r}");
    assert_eq!(r.activity.delayed_clear_failures, 1, "{r}");
    assert!(r.counts.skipped_by_seek > 0, "{r}");
}

#[test]
fn the_cli_exits_non_zero_on_a_violation_only() {
    // The sabotages are test-only (not reachable from the CLI), so the exit
    // status is checked on the clean path here and on `is_clean` above;
    // a run cut short is a violation the CLI can produce.
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("slow.toml");
    std::fs::write(
        &f,
        "messages = 20\nproducers = 1\nbatch_size = 1\npublish_interval_ms = 3600000\n[faults]\nrestarts = 0\nread_outages = 0\nreconnects = 0\n",
    )
    .unwrap();
    let out = cli(&[
        "simulate",
        "--workload",
        f.to_str().unwrap(),
        "--quiet",
        "--json",
    ]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cli(&[
        "simulate",
        "--workload",
        "failover",
        "--messages",
        "300",
        "--quiet",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("cumulative acks"));
}

#[test]
fn same_seed_same_report() {
    let w = small("txn-outage", 1_000);
    let strip = |mut r: Report| {
        r.timing = Default::default();
        r.data_dir = String::new();
        r
    };
    let a = strip(run_in_tempdir(&w, 11, None));
    let b = strip(run_in_tempdir(&w, 11, None));
    assert_eq!(a.to_json(), b.to_json());
    let seeking = Workload::from_toml_file(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workloads/node_seek.toml"),
    )
    .unwrap();
    let c = strip(run_in_tempdir(&seeking, 11, None));
    let d = strip(run_in_tempdir(&seeking, 11, None));
    assert_eq!(c.to_json(), d.to_json());
    assert!(
        c.activity
            .node
            .as_ref()
            .is_some_and(|n| n.seeks_applied > 0),
        "seeks are part of the determinism check: {c}"
    );
    // The node engine's delayed run: snapshot faults, clock jumps,
    // rewinds and the clear-backlog drawn from the seed alone.
    let c = strip(run_in_tempdir(&small("delayed", 1_000), 11, None));
    let d = strip(run_in_tempdir(&small("delayed", 1_000), 11, None));
    assert_eq!(c.to_json(), d.to_json());
    assert_eq!(c.activity.clear_backlogs, 1, "{c}");
    let e = strip(run_in_tempdir(&small("failover", 1_000), 11, None));
    let f = strip(run_in_tempdir(&small("failover", 1_000), 11, None));
    assert_eq!(e.to_json(), f.to_json());
    assert!(e.activity.cumulative_acks > 0);
}

/// `txn-outage` at its full size on the shipped broker core (the node
/// engine): every checker rule passes at seed 1 while the store under the
/// core fails reads for two 10 s outages (the dispatcher's read backoff,
/// the transaction buffer's and the pending-ack replay's retries), the
/// pending-ack logs' reads fail after a restart (failed replay attempts
/// retried after their backoff), and a pending-ack ledger is lost with
/// auto-skip off (the replay gives up; the operator reloads with auto-skip
/// on). After the second restart the replay waits out the read failures
/// while a commit is ending, and once Ready hands back committed acks the
/// subscription had not persisted, which the core re-applies (the report's
/// `commits_reapplied`). About 20-40 s in a debug build.
#[test]
fn txn_outage_runs_clean_on_the_broker_core_at_seed_1() {
    let w = Workload::preset("txn-outage").unwrap();
    assert_eq!(w.engine, pulsar_core::sim::Engine::Node);
    let r = run_in_tempdir(&w, 1, None);
    assert!(r.is_clean(), "{r}");
    let a = &r.activity;
    assert!(a.read_failures_injected > 0, "{r}");
    assert!(a.replay_retries > 0, "failed replay attempts retried: {r}");
    assert!(a.pending_ack_ledgers_lost > 0, "{r}");
    assert_eq!(a.operator_reloads, 1, "{r}");
    assert!(a.txn_individual_acks > 0 && a.txn_commits > 0, "{r}");
    assert!(a.commits_reapplied > 0, "{r}");
    assert_eq!(r.counts.published, w.messages, "{r}");
}

fn cli(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_pulsar-core"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn cli_runs_and_reports_json_and_exit_status() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let out = cli(&[
        "simulate",
        "--workload",
        "txn-outage",
        "--messages",
        "500",
        "--json",
        "--quiet",
        "--data-dir",
        data.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["counts"]["published"], 500);
    // txn-outage runs on the node engine, whose store is in memory (the
    // data dir holds no store).
    assert!(
        json["data_dir"]
            .as_str()
            .is_some_and(|d| d.contains("in memory")),
        "{json}"
    );
}

#[test]
fn cli_bad_input_is_a_clear_error() {
    let out = cli(&["simulate", "--messages", "0", "--quiet"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("messages must be at least 1"));

    let out = cli(&["simulate", "--workload", "no-such-preset", "--quiet"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown workload"));

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("w.toml");
    std::fs::write(&bad, "messages = \"lots\"\n").unwrap();
    let out = cli(&["simulate", "--workload", bad.to_str().unwrap(), "--quiet"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid workload file"));

    // The data dir the run's store is saved to cannot be made.
    let file = dir.path().join("plain-file");
    std::fs::write(&file, b"x").unwrap();
    let out = cli(&[
        "simulate",
        "--messages",
        "10",
        "--quiet",
        "--data-dir",
        file.join("sub").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("data dir"));

    // A workload file naming the removed model engine.
    let model = dir.path().join("model.toml");
    std::fs::write(&model, "engine = \"model\"\nmessages = 10\n").unwrap();
    let out = cli(&["simulate", "--workload", model.to_str().unwrap(), "--quiet"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("model engine was removed"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_run_cut_short_by_the_time_limit_is_a_violation() {
    let mut w = small("permit-churn", 1_000);
    w.producers = 1;
    w.publish_interval_ms = 3_600_000; // one batch an hour: cannot finish in 6 virtual hours
    let r = run_with(&w, 1, false, None);
    assert!(!r.is_clean(), "{r}");
    assert!(r.counts.unfinished > 0, "{r}");
    assert!(r.first_violation.unwrap().contains("cut short"));
}

#[test]
fn an_injected_outage_longer_than_the_stall_bound_is_not_a_stall() {
    let mut w = small("permit-churn", 500);
    w.faults = pulsar_core::sim::Faults {
        read_outages: 1,
        outage_ms: 40_000,
        ..pulsar_core::sim::Faults::none()
    };
    let r = run_in_tempdir(&w, 1, None);
    assert!(r.is_clean(), "{r}");
    assert_eq!(r.counts.stalls, 0);
}

#[test]
fn extreme_workload_values_are_rejected_or_finish() {
    for toml in [
        "publish_interval_ms = 18446744073709551615\n",
        "producers = 4000000000\n",
        "[faults]\noutage_ms = 18446744073709551615\n",
        "[faults]\ncorrupted_batch_ratio = 1.0\n",
        "delayed_min_index_count_per_bucket = 0\n",
        "[faults]\nseeks = 1000\n",
        // Beyond 2 h a delayed message could be due after the run's 6 h
        // limit and be reported as lost.
        "max_delay_ms = 28800000\n",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("w.toml");
        std::fs::write(&f, toml).unwrap();
        let err = Workload::resolve(f.to_str().unwrap()).unwrap_err();
        assert!(err.to_string().contains("must be"), "{toml}: {err}");
    }
    // Unsupported combinations are typed errors with a clear message.
    for toml in [
        "subscription_type = \"failover\"\ndelayed_ratio = 0.5\n",
        "subscription_type = \"shared\"\ncumulative_ack_every = 10\n",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("w.toml");
        std::fs::write(&f, toml).unwrap();
        let err = Workload::resolve(f.to_str().unwrap()).unwrap_err();
        assert!(
            matches!(err, pulsar_core::sim::WorkloadError::Unsupported(_)),
            "{toml}: {err}"
        );
        let out = cli(&["simulate", "--workload", f.to_str().unwrap(), "--quiet"]);
        assert_eq!(out.status.code(), Some(2), "{toml}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("unsupported workload"));
    }
    // A tiny stall bound must not make the stall check spin at one instant.
    let mut w = small("permit-churn", 200);
    w.stall_bound_ms = 1;
    let r = run_with(&w, 1, false, None);
    assert_eq!(r.counts.published, 200);
}

/// The reported virtual time is when the workload finished, not the end of
/// the final drain (the drain runs to the next stall check: 100 s here for
/// a run that ends in about a tenth of a second).
#[test]
fn virtual_time_is_when_the_workload_finished() {
    let mut w = small("failover", 300);
    w.subscriptions = 1;
    w.consumers_per_subscription = 1;
    w.publish_interval_ms = 5;
    w.stall_bound_ms = 400_000;
    let r = run_with(&w, 1, false, None);
    assert!(r.is_clean(), "{r}");
    assert!(r.virtual_ms < 10_000, "virtual time {} ms", r.virtual_ms);
}

/// Fault-model regression found by the swarm (seed 1212): one Key_Shared
/// consumer with a 1,000-message receiver queue against the faulty broker.
/// A dispatch pass's whole window arrives at one virtual instant, before
/// the application polls, so nearly every window carries an invalid P and
/// closes the connection, and the reconnect redelivers the same window.
/// With the fault model's fairness bound (16 such closes in a row without
/// a message taken by the application) the run finishes clean and the
/// bound is reached; with the bound off it makes no progress, and the
/// watchdogs must stop it within seconds as a named livelock, not at the
/// wall-clock limit. Its due delayed messages wait behind each rewind's
/// re-read of the backlog from the mark-delete: late by the clock, never
/// passed by the dispatch, so not a violation (counted as late behind the
/// backlog).
#[test]
fn a_faulty_broker_closing_every_window_is_bounded_and_its_livelock_is_named() {
    let (w, r) = run_workload_file_clean("faulty_broker_full_window.toml", 1212);
    assert_eq!(
        w.faults.faulty_closes_without_progress,
        pulsar_core::sim::workload::FAULTY_CLOSES_WITHOUT_PROGRESS
    );
    assert!(
        r.activity.invalid_permit_closes >= u64::from(w.faults.faulty_closes_without_progress),
        "{r}"
    );
    assert!(
        r.activity.faulty_permits_held_back > 0,
        "the fairness bound was never reached: {r}"
    );
    assert!(
        r.counts.late_behind_backlog > 0 && r.counts.late_deliveries == 0,
        "{r}"
    );

    // Every window closed (an invalid P on every MESSAGE): the first
    // MESSAGE of each window closes the connection before the application
    // takes anything. The bound still lets the run drain...
    let mut every = w.clone();
    every.faults.invalid_permits_ratio = 1.0;
    let r = run_in_tempdir(&every, 1212, None);
    assert!(r.is_clean(), "{r}");
    assert!(r.activity.faulty_permits_held_back > 0, "{r}");
    // ...without it nothing is ever received: a livelock, named.
    let mut unbounded = every.clone();
    unbounded.faults.faulty_closes_without_progress = u32::MAX;
    let r = run_in_tempdir(&unbounded, 1212, None);
    assert_eq!(r.counts.livelocks, 1, "{r}");
    assert_eq!(r.activity.faulty_permits_held_back, 0, "{r}");
    let first = r.first_violation.clone().unwrap_or_default();
    assert!(
        first.contains("livelock at t=")
            && first.contains("no message received or acknowledged for"),
        "{first}"
    );
    // Virtual time stuck: the same run with a same-instant bound below
    // one window's burst (a window's MESSAGE frames reach the client at one instant).
    let dir = tempfile::tempdir().unwrap();
    let opts = SimOptions {
        seed: 1212,
        data_dir: dir.path().join("data"),
        faults: true,
        sabotage: None,
        sync: pulsar_core::ledger::SyncMode::Immediate,
        watchdog: Watchdog {
            same_time_events: 500,
            ..test_watchdog()
        },
        trace_dir: None,
    };
    let r = run(&unbounded, &opts, None).unwrap();
    assert_eq!(r.counts.livelocks, 1, "{r}");
    let first = r.first_violation.clone().unwrap_or_default();
    assert!(
        first.contains("livelock at t=")
            && first.contains("virtual time did not advance for 501 events"),
        "{first}"
    );
}

/// Dispatch regressions found by the swarm, each a workload file with the
/// seed it runs with, on the broker core: an entry acknowledged in an open transaction is
/// never dispatched to a second consumer (Shared + delayed + transactions +
/// restarts), Failover stays ordered after an admission rejection so a
/// cumulative ack never covers an entry waiting for replay, and an entry
/// rejected by admission in a subscription's last dispatch pass (nothing
/// sent, nothing new to read, no ack or Flow to come) is still replayed
/// (Key_Shared and Failover). Each run must stay clean and must actually
/// exercise its fault (admission rejections, transactional acks).
///
/// `shared_delayed_txn_restarts.toml` (seed 135) protects a clean run of
/// that shape on the broker core only: with the core's hold of entries
/// acknowledged in an open transaction removed (`txn_pending` not checked
/// in `broker::Subscription::deliver_entries`) it still runs clean (seeds
/// 135 and 3): the checker allows a copy delivered across a restart or a
/// reconnect of its holder and has no rule for the delivery of an entry
/// acknowledged in a transaction still open. The unit layer catches
/// that edit: `broker::tests::txn::an_open_transaction_survives_a_crash_and_commits_after_it`
/// and `broker::tests::txn::store_faults::a_pending_ack_replay_that_fails_holds_dispatch_and_refuses_transactional_acks_until_a_retry_completes`.
/// Its seed 1 protects the core's timer while a restarted subscription's
/// pending-ack replay is retried: a delayed entry the recovered tracker
/// holds as due must not make `Broker::poll_timeout` report a time already
/// past (fired once, it hides the replay's retry deadline, and dispatch
/// stays held for the rest of the run: late delayed messages, lost entries).
#[test]
fn swarm_found_dispatch_regressions_stay_clean() {
    for (file, seed) in [
        ("shared_delayed_txn_restarts.toml", 135),
        ("shared_delayed_txn_restarts.toml", 1),
        ("failover_admission_rejections.toml", 3),
        ("failover_admission_rejections_txn.toml", 18),
        ("key_shared_rejected_in_last_pass.toml", 2),
        ("failover_rejected_in_last_pass.toml", 8497),
    ] {
        let (w, r) = run_workload_file_clean(file, seed);
        if w.faults.admission_reject_ratio > 0.0 {
            assert!(
                r.activity.admission_rejections > 0,
                "{file}: no admission rejection"
            );
        }
    }
}

/// Key_Shared per-key order across a reconnect while a cursor read is in
/// flight, and after admission refusals: an entry of a key waiting in
/// replay (a reconnecting consumer's unacknowledged entries, an entry
/// admission refused) goes out before a completed read's newer entries of
/// the same key (Pulsar's Key_Shared dispatcher serves its replay set first
/// and holds back a normal read's entries of a key hash waiting for
/// replay). The run must stay clean and must actually reconnect with reads
/// in flight and refuse entries. With the hold-back removed
/// (`tests/mutants/broker_key_shared_replay_not_held_back.patch`) seed 6
/// fails through the admission refusals; with the replay step also moved
/// after the completed read, through the reconnects alone.
#[test]
fn key_shared_replay_is_not_overtaken_by_a_read_in_flight() {
    let file = "key_shared_reconnect_during_read.toml";
    let (_, r) = run_workload_file_clean(file, 6);
    assert!(r.activity.reconnects > 0, "{file}: no reconnect");
    assert!(
        r.activity.reads_with_latency > 0,
        "{file}: no read in flight"
    );
    assert!(
        r.activity.admission_rejections > 0,
        "{file}: no admission refusal"
    );
}

/// Pending-ack regressions found by the swarm, each a workload file with the
/// seed it ran with, on the broker core: a replay whose reads fail (seed
/// 6779) is retried after its backoff and then finds every durable record;
/// a replay that gives up on a lost ledger with auto-skip off (seeds 436,
/// 5930, 9114) serves nothing from its partial state and the operator's
/// reload with auto-skip on finds every durable record; a pending-ack retry
/// due during the end-of-run drain fires instead of rescheduling itself at
/// the same virtual millisecond forever (seeds 5930, 9114: the hang
/// watchdog's livelock). Each run must stay clean and exercise its path.
#[test]
fn swarm_found_pending_ack_regressions_stay_clean() {
    for (file, seed) in [
        ("pending_ack_fenced_replay_reload.toml", 6779),
        ("pending_ack_completing_failure_reload.toml", 436),
        ("pending_ack_retry_in_drain.toml", 5930),
        ("pending_ack_retry_in_drain_2.toml", 9114),
    ] {
        let (w, r) = run_workload_file_clean(file, seed);
        assert_eq!(w.engine, pulsar_core::sim::Engine::Node, "{file}");
        assert!(
            r.activity.pending_ack_ledgers_lost > 0,
            "{file}: no lost ledger"
        );
        assert!(
            r.activity.read_failures_injected > 0,
            "{file}: no read failure"
        );
        if w.faults.pending_ack_auto_skip {
            assert!(
                r.activity.replay_retries > 0,
                "{file}: no failed replay attempt retried"
            );
        } else {
            assert!(
                r.activity.operator_reloads > 0,
                "{file}: no operator reload"
            );
        }
    }
}

fn run_synced(w: &Workload, seed: u64, sync: pulsar_core::ledger::SyncMode) -> Report {
    let dir = tempfile::tempdir().unwrap();
    let opts = SimOptions {
        sync,
        watchdog: test_watchdog(),
        ..SimOptions::new(seed, dir.path().join("data"))
    };
    run(w, &opts, None).unwrap()
}

/// Crash points: the broker core dies at a durable write of the store
/// (before or after its fsync), everything in memory is dropped and it
/// recovers from exactly what was fsynced; every checker rule must hold over
/// the whole run (no published message lost, no persisted ack undone, no
/// reordering beyond Pulsar's), on the shapes that write the most: delayed
/// delivery with bucket snapshots and transactional acks (Shared), and
/// cumulative and transactional acks with END_TXN crashes (the `failover`
/// preset). Crashes during a recovery: `swarm_found_crash_point_regressions_stay_clean`.
#[test]
fn crash_points_are_explored_and_every_checker_rule_holds() {
    use pulsar_core::ledger::SyncMode;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/workloads/shared_delayed_txn_restarts.toml");
    let mut delayed_txn = Workload::from_toml_file(&path).unwrap();
    delayed_txn.faults.crash_points = 4;
    let failover = small("failover", 1_500);
    for (w, seed) in [(&delayed_txn, 135), (&delayed_txn, 7), (&failover, 3)] {
        assert_eq!(w.engine, pulsar_core::sim::Engine::Node, "{}", w.name);
        let r = run_synced(w, seed, SyncMode::Immediate);
        assert!(
            r.is_clean(),
            "{} seed {seed}: {:?} ({} violations)",
            w.name,
            r.first_violation,
            r.violations
        );
        let n = r.activity.node.as_ref().expect("node activity");
        assert_eq!(
            n.crash_points,
            u64::from(w.faults.crash_points),
            "{} seed {seed}: crash points taken {n:?}",
            w.name
        );
        assert_eq!(r.counts.lost, 0, "{} seed {seed}", w.name);
    }
}

/// Crash-point regressions found by the swarm on the broker model, each a
/// workload file, now run on the broker core: a crash during the recovery
/// after a crash (the store dies again while the broker reopens) leaves no
/// event of a dead broker (a transaction commit, an ack) to be applied by
/// the recovered one (swarm seed 1211: a commit of a transaction the
/// recovery had aborted made a message acknowledged in a later transaction
/// come back after its ack; swarm seed 937: the pending-ack replay missed 15
/// open transactions; the Key_Shared file runs at seed 1, where the core
/// crashes during a recovery). Each run must stay clean and must crash
/// during a recovery.
#[test]
fn swarm_found_crash_point_regressions_stay_clean() {
    for (file, seed) in [
        ("crash_during_recovery_failover_txn.toml", 1211),
        ("crash_during_recovery_key_shared_txn.toml", 1),
    ] {
        // On the broker core: after a crash the next crash point falls
        // within `faults.crash_recovery_window` durable writes of the
        // reopen.
        let (w, r) = run_workload_file_clean(file, seed);
        let n = r.activity.node.as_ref().expect("node engine");
        assert_eq!(
            n.crash_points,
            u64::from(w.faults.crash_points),
            "{file}: crash points taken {n:?}"
        );
        assert!(
            n.crashes_in_recovery > 0,
            "{file}: no crash during a recovery: {n:?}"
        );
    }
}

/// The node engine's presets: the shipped broker core driven by clients
/// that speak real frames, with clean restarts, crashes at durable writes,
/// reconnects, same-connection resubscribes and redelivery requests; each
/// runs clean and reaches its crash points.
#[test]
fn every_node_preset_runs_clean_with_crashes() {
    for (file, seed) in [
        ("node_shared_batches.toml", 1),
        ("node_failover.toml", 1),
        ("node_key_shared.toml", 1),
        ("node_delayed.toml", 1),
        ("node_dispatch_faults.toml", 1),
        ("node_cumulative.toml", 1),
    ] {
        let (w, r) = run_workload_file_clean(file, seed);
        if w.faults.admission_reject_ratio > 0.0 {
            assert!(r.activity.admission_rejections > 0, "{file}: no rejection");
        }
        if w.faults.write_failure_ratio > 0.0 {
            assert!(
                r.activity.write_failure_removals > 0,
                "{file}: no failed write"
            );
        }
        // A handover needs a standby: one consumer a subscription is never
        // told it is inactive.
        if w.subscription_type == pulsar_core::sim::SubscriptionType::Failover
            && w.consumers_per_subscription > 1
        {
            let n = r.activity.node.as_ref().expect("node activity");
            assert!(n.inactive_notices > 0, "{file}: no active-consumer change");
        }
        // The core's own counters reach the report.
        assert!(
            r.activity.hint_lookups > 0 && r.activity.commands_with_permits > 0,
            "{file}: core counters not reported"
        );
        assert_eq!(w.engine, pulsar_core::sim::Engine::Node, "{file}");
        let n = r.activity.node.as_ref().expect("node activity");
        assert!(n.crash_points >= 1, "{file}: no crash point reached: {n:?}");
        assert!(
            n.ack_receipts > 0 && n.frames_to_broker > 0,
            "{file}: {n:?}"
        );
        assert_eq!(r.counts.lost, 0, "{file}");
        assert!(r.counts.published >= w.messages, "{file}");
        // Individual acks of batch indexes, or cumulative acks inside a
        // batch: both carry an ack_set.
        if w.batch_size > 1 {
            assert!(n.batch_index_acks > 0, "{file}: no ack_set sent");
        }
    }
}

/// A node-engine run is a function of its seed (wall-clock figures aside).
#[test]
fn node_engine_same_seed_same_report() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/workloads/node_key_shared.toml");
    let mut w = Workload::from_toml_file(&path).unwrap();
    w.messages = 800;
    let a = run_in_tempdir(&w, 7, None);
    let b = run_in_tempdir(&w, 7, None);
    assert_eq!(a.counts, b.counts);
    assert_eq!(a.activity, b.activity);
    assert_eq!(a.virtual_ms, b.virtual_ms);
}

/// The node engine refuses what the broker core has no path for, with a
/// typed error naming the setting; redelivery requests need the node engine.
#[test]
fn node_engine_unsupported_settings_are_typed_errors() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/workloads/node_shared_batches.toml");
    let mut w = Workload::from_toml_file(&path).unwrap();
    w.faults.crash_at_writes = vec![5];
    let e = w.validate().unwrap_err().to_string();
    assert!(e.contains("crash_at_writes") && e.contains("node"), "{e}");
}

/// Seeks on the node engine (`faults.seeks`, `sim::node::seek`): simulated
/// consumers send real SEEK frames, backward and forward; the core resets
/// the cursor (one durable write, a crash point among the others) and the
/// checker (`sim::checker::seek`) accepts the redelivery a backward seek
/// causes, counts what a forward seek skips as acknowledged, and still
/// requires every reopened message to be delivered and acknowledged again.
#[test]
fn node_seeks_backward_and_forward_run_clean() {
    let (_, r) = run_workload_file_clean("node_seek.toml", 1);
    let n = r.activity.node.as_ref().expect("node activity");
    assert!(n.seeks_sent > 0 && n.seeks_applied > 0, "{n:?}");
    assert!(n.crash_points >= 1, "no crash point reached: {n:?}");
    let c = &r.counts;
    assert!(c.seek_resets > 0, "{c:?}");
    assert!(
        c.reopened_by_seek > 0,
        "no backward seek reopened an acknowledged message: {c:?}"
    );
    assert!(
        c.skipped_by_seek > 0,
        "no forward seek skipped a message: {c:?}"
    );
    assert_eq!(c.lost, 0);
}

/// Seeks on the node engine with cumulative acks run clean (a send whose
/// receipt comes after a reset past it is skipped by the checker); with
/// transactions or delayed messages they are a typed error naming the
/// setting (the transaction rules and the delayed tracker's truth do not
/// know seeks).
#[test]
fn node_seeks_with_cumulative_run_clean_and_with_txn_or_delayed_are_typed_errors() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workloads");
    let mut w = Workload::from_toml_file(&dir.join("node_cumulative.toml")).unwrap();
    w.faults.seeks = 6;
    let r = run_in_tempdir(&w, 1, None);
    assert!(
        r.is_clean(),
        "node_cumulative.toml with seeks: {:?}",
        r.first_violation
    );
    assert!(r.counts.seek_resets > 0, "no seek applied");
    for (file, what) in [
        ("node_txn.toml", "transactions"),
        ("node_delayed.toml", "delayed"),
    ] {
        let mut w = Workload::from_toml_file(&dir.join(file)).unwrap();
        w.faults.seeks = 1;
        let e = w.validate().unwrap_err().to_string();
        assert!(
            e.contains("faults.seeks") && e.contains(what),
            "{file}: {e}"
        );
    }
}
