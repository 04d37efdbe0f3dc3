//! `pulsar-core simulate`: a seeded, fault-injected, end-to-end run of the
//! four components on the durable store, with a report that counts loss,
//! duplicates, disorder and stalls.
//!
//! - [`workload`]: presets and the TOML workload format;
//! - [`scheduler`]: the discrete-event scheduler on virtual time;
//! - [`node`]: the node engine, driving the shipped broker core
//!   ([`crate::broker::Broker`]) with clients that speak real frames, and
//!   crashes at durable writes (the only engine: the simulator has no
//!   broker model of its own);
//! - [`options`]: a run's options, the self-test defects and run errors;
//! - `hint_race` (feature `race-hooks`): real threads on the real cursor deletion state (the
//!   lock-free hint and the post-I/O filter against an external oracle), the
//!   first of the two stages that are not single-threaded and deterministic;
//! - `replay_race` (feature `race-hooks`): the real pending-ack replay on real threads and a real
//!   managed ledger (read-ahead failures, a reload over a cached cursor, the
//!   read-failure race) against an external oracle;
//! - [`stages`]: runs those two stages after the event loop;
//! - [`delayed_truth`]: what the delayed tracker should hold (its count rule,
//!   and what its merges and recoveries must keep);
//! - [`delayed_storage`]: the snapshot storage as the checker observes it;
//! - [`checker`]: the independent delivery checker (loss, duplicates, order,
//!   stalls);
//! - [`crash_storage`]: the store's file image in memory, which can crash
//!   between two durable writes (the crash points);
//! - [`report`]: the report (table and JSON);
//! - [`watchdog`]: livelock and wall-clock watchdogs.
//!
//! Determinism: one thread, virtual time, one seeded RNG, ordered maps
//! wherever iteration order matters: the same seed and workload give the
//! same report (wall-clock figures aside).

pub mod checker;
pub mod crash_storage;
pub mod delayed_storage;
pub mod delayed_truth;
#[cfg(feature = "race-hooks")]
pub mod hint_race;
pub mod node;
pub mod options;
#[cfg(feature = "race-hooks")]
pub mod replay_race;
pub mod report;
pub mod scheduler;
#[cfg(feature = "trace")]
pub mod sim_trace;
pub mod stages;
pub mod watchdog;
pub mod workload;

pub use options::{Sabotage, SimError, SimOptions};
pub use report::Report;
pub use watchdog::Watchdog;
pub use workload::{Engine, Faults, SubscriptionType, TxnWorkload, Workload, WorkloadError};

/// Runs `workload` on the shipped broker core ([`node::run`]).
///
/// # Errors
/// As [`node::run`].
pub fn run(
    workload: &Workload,
    opts: &SimOptions,
    progress: Option<&dyn Fn(u64, u64)>,
) -> Result<Report, SimError> {
    node::run(workload, opts, progress)
}
