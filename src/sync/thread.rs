//! Threads of the active backend (std / loom / shuttle).

#[cfg(loom)]
pub use loom::thread::{current, spawn, yield_now, JoinHandle, ThreadId};

#[cfg(all(feature = "shuttle", not(loom)))]
pub use shuttle::thread::{current, spawn, yield_now, JoinHandle, ThreadId};

#[cfg(not(any(loom, feature = "shuttle")))]
pub use std::thread::{current, spawn, yield_now, JoinHandle, ThreadId};

// Thread-local storage of the active backend: loom and shuttle run their
// threads on one OS thread, so a model needs their per-model-thread keys.
#[cfg(loom)]
pub use loom::thread_local;

#[cfg(all(feature = "shuttle", not(loom)))]
pub use shuttle::thread_local;

#[cfg(not(any(loom, feature = "shuttle")))]
pub use std::thread_local;
