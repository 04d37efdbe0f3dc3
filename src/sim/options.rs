//! What one run takes besides its workload ([`SimOptions`]), the self-test
//! defects ([`Sabotage`]) and why a run could not be carried out
//! ([`SimError`]).

use std::path::PathBuf;

use crate::ledger::SyncMode;

use super::watchdog::Watchdog;

/// A deliberate defect for checking that the checker catches it (used by the
/// self-tests; never enabled by the CLI). Each is a defect of the simulated
/// client or of the core's configuration, never an edit of the shipped
/// broker core (those are the mutation suite's, `tests/mutants/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sabotage {
    /// The client library silently drops one message it received (never
    /// handed to the application, never acknowledged).
    DropOneDelivery,
    /// The client library hands one message to the application twice.
    DeliverOneTwice,
    /// The broker core runs without deduplication, so a send retried after
    /// a lost receipt (a crash, a reconnect) is stored again (the "stored
    /// once" rule must catch it).
    NoDeduplication,
}

/// Options of one run besides the workload.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// RNG seed: same seed (and workload), same report.
    pub seed: u64,
    /// Directory for a run's files: the store lives in memory
    /// (`sim::crash_storage`); if this directory exists, the store file
    /// (`pulsar-core.redb`) is written to it at the end of the run.
    pub data_dir: PathBuf,
    /// Inject the workload's faults (restarts, outages, …).
    pub faults: bool,
    /// Self-test defect, if any.
    pub sabotage: Option<Sabotage>,
    /// How the store commits ([`SyncMode::Immediate`]: fsync every commit).
    /// A crash point loses what was not fsynced, so with `Deferred` the
    /// checker reports the published messages and acks it lost.
    pub sync: SyncMode,
    /// Livelock and wall-clock watchdogs.
    pub watchdog: Watchdog,
    /// Trace validation (cargo feature `trace`): the directory simulate
    /// trace runs are written to (`src/sim/sim_trace.rs`). The node engine
    /// records none yet: a run with it set is a [`SimError::Component`]
    /// error.
    pub trace_dir: Option<PathBuf>,
}

impl SimOptions {
    /// Options for a run with `seed` on `data_dir`: faults on, no sabotage,
    /// default watchdogs (no process exit on a hang).
    pub fn new(seed: u64, data_dir: PathBuf) -> Self {
        Self {
            seed,
            data_dir,
            faults: true,
            sabotage: None,
            sync: SyncMode::Immediate,
            watchdog: Watchdog::default(),
            trace_dir: None,
        }
    }
}

/// Why a run could not be carried out (not a violation: a violation is in
/// the report).
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The data directory or a trace file cannot be created or written.
    #[error("data dir {path}: {reason}")]
    DataDir {
        /// The directory.
        path: String,
        /// What failed.
        reason: String,
    },
    /// The store or a component failed in a way the run cannot continue from.
    #[error("simulation aborted: {0}")]
    Component(String),
}
