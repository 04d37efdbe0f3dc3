//! The stages that run after a simulation's event loop on real threads:
//! `hint_race` (the cursor deletion state's lock-free hint and post-I/O
//! filter, `sim::hint_race`) and `replay_race` (the pending-ack replay
//! on a real managed ledger, `sim::replay_race`). Both exercise the
//! shipped components directly, so any engine runs them the same way
//! after its loop (`faults.hint_race`, `faults.replay_race`).
//!
//! Both need the components' test hooks, built only with the `race-hooks`
//! feature: a build without it records which stages the workload asked for
//! and did not get ([`Stages::not_built`]), and the report says so.

use std::sync::Arc;

#[cfg(feature = "race-hooks")]
use super::hint_race::{HintRaceConfig, HintRaceReport};
#[cfg(feature = "race-hooks")]
use super::replay_race::{ReplayRaceConfig, ReplayRaceReport};
use super::watchdog::Heartbeat;
use super::workload::Workload;

/// What the stages found.
pub struct Stages {
    /// The `hint_race` stage's report, if it ran.
    #[cfg(feature = "race-hooks")]
    pub hint_race: Option<HintRaceReport>,
    /// The `replay_race` stage's report, if it ran.
    #[cfg(feature = "race-hooks")]
    pub replay_race: Option<ReplayRaceReport>,
    /// The stages the workload asked for that this build does not have.
    pub not_built: Vec<&'static str>,
}

impl Stages {
    /// Violations of both stages.
    #[cfg(feature = "race-hooks")]
    pub fn violations(&self) -> u64 {
        self.hint_race
            .as_ref()
            .map_or(0, HintRaceReport::violations)
            + self
                .replay_race
                .as_ref()
                .map_or(0, ReplayRaceReport::violations)
    }

    /// The first violation of the stages (hint_race first).
    #[cfg(feature = "race-hooks")]
    pub fn first_violation(&self) -> Option<String> {
        self.hint_race
            .as_ref()
            .and_then(|h| h.first_violation.clone())
            .or_else(|| {
                self.replay_race
                    .as_ref()
                    .and_then(|r| r.first_violation.clone())
            })
    }

    /// Violations of both stages (none in a build without them).
    #[cfg(not(feature = "race-hooks"))]
    pub fn violations(&self) -> u64 {
        0
    }

    /// The first violation of the stages (none in a build without them).
    #[cfg(not(feature = "race-hooks"))]
    pub fn first_violation(&self) -> Option<String> {
        None
    }
}

/// Runs the stages `workload` asks for (only with faults on, and not after
/// a run the hang watchdog cancelled). The replay_race stage reports its
/// progress through `heartbeat`, so the hang watchdog watches it too.
#[cfg(feature = "race-hooks")]
pub fn run(workload: &Workload, faults: bool, heartbeat: &Arc<Heartbeat>) -> Stages {
    let cancelled = heartbeat.hang_report().is_some();
    let go = faults && !cancelled;
    let hint_race = (go && workload.faults.hint_race)
        .then(|| super::hint_race::run(&HintRaceConfig::default()));
    let replay_race = (go && workload.faults.replay_race).then(|| {
        heartbeat.enter("replay_race stage");
        let hb = Arc::clone(heartbeat);
        super::replay_race::run_with_progress(
            &ReplayRaceConfig {
                race: std::time::Duration::from_millis(workload.faults.replay_race_ms),
            },
            &move || hb.end(),
        )
    });
    Stages {
        hint_race,
        replay_race,
        not_built: Vec::new(),
    }
}

/// A build without the `race-hooks` feature runs neither stage: it lists
/// the ones `workload` asked for (with faults on) as not built.
#[cfg(not(feature = "race-hooks"))]
pub fn run(workload: &Workload, faults: bool, _heartbeat: &Arc<Heartbeat>) -> Stages {
    let not_built = [
        (workload.faults.hint_race, "hint_race"),
        (workload.faults.replay_race, "replay_race"),
    ]
    .into_iter()
    .filter_map(|(asked, stage)| (faults && asked).then_some(stage))
    .collect();
    Stages { not_built }
}
