//! Running one workload file of tests/workloads/ at a seed, as the
//! simulator's feature tests do: faults on, `--sync always`, a 60 s hang
//! bound and a wall-clock bound (180 s unless given; a hang is a named
//! failure).
//!
//! Include with `#[path = "common/sim_run.rs"] mod sim_run;`.
#![allow(dead_code)]

use pulsar_core::sim::report::ComponentReport;
use pulsar_core::sim::{run, Report, SimError, SimOptions, Watchdog, Workload};

/// The workload file `tests/workloads/NAME`.
pub fn workload_file(name: &str) -> Workload {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/workloads")
        .join(name);
    Workload::from_toml_file(&path).unwrap()
}

/// Runs `w` at `seed` on a fresh temporary data dir (180 s wall-clock
/// bound).
pub fn run_seed(w: &Workload, seed: u64) -> pulsar_core::sim::Report {
    run_seed_within(w, seed, std::time::Duration::from_secs(180))
}

/// [`run_seed`] with a wall-clock bound of `wall_limit` (a longer
/// workload file).
pub fn run_seed_within(
    w: &Workload,
    seed: u64,
    wall_limit: std::time::Duration,
) -> pulsar_core::sim::Report {
    run_with(w, seed, wall_limit, |_| {}).unwrap()
}

/// [`run_seed_within`] with the options changed by `adjust` (a
/// self-test defect, another sync mode), returning the run's error (a
/// workload the run refuses).
pub fn run_with(
    w: &Workload,
    seed: u64,
    wall_limit: std::time::Duration,
    adjust: impl FnOnce(&mut SimOptions),
) -> Result<Report, SimError> {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = SimOptions {
        seed,
        data_dir: dir.path().join("data"),
        faults: true,
        sabotage: None,
        sync: pulsar_core::ledger::SyncMode::Immediate,
        watchdog: Watchdog {
            exit_on_hang: Some(std::time::Duration::from_secs(60)),
            wall_limit: Some(wall_limit),
            ..Watchdog::default()
        },
        trace_dir: None,
    };
    adjust(&mut opts);
    run(w, &opts, None)
}

/// The component of the report `r` whose name starts with `prefix`, if
/// the report lists it.
pub fn component<'a>(r: &'a Report, prefix: &str) -> Option<&'a ComponentReport> {
    r.components
        .iter()
        .find(|c| c.component.starts_with(prefix))
}

/// Asserts the run `r` (named `what`, e.g. the seed) found no violation;
/// the failure names the first violation, the count and the messages lost.
pub fn assert_clean(r: &Report, what: &str) {
    assert!(
        r.is_clean(),
        "{what}: {:?} ({} violations, {} lost)",
        r.first_violation,
        r.violations,
        r.counts.lost
    );
}
