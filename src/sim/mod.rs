//! `pulsar-core simulate`: a seeded, fault-injected, end-to-end run of the
//! four components on the durable store (work in progress: the pieces below
//! are complete; the broker-in-a-box that drives the components is not yet
//! wired, so the CLI does not expose `simulate`).
//!
//! - [`workload`]: presets and the TOML workload format;
//! - [`scheduler`]: the discrete-event scheduler on virtual time;
//! - [`checker`]: the independent delivery checker (loss, duplicates, order,
//!   stalls);
//! - [`report`]: the report (table and JSON).

pub mod checker;
pub mod report;
pub mod scheduler;
pub mod workload;
