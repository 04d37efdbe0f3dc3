//! Threads of the active backend (std / loom / shuttle).

#[cfg(loom)]
pub use loom::thread::{current, spawn, yield_now, JoinHandle, ThreadId};

#[cfg(all(feature = "shuttle", not(loom)))]
pub use shuttle::thread::{current, spawn, yield_now, JoinHandle, ThreadId};

#[cfg(not(any(loom, feature = "shuttle")))]
pub use std::thread::{current, spawn, yield_now, JoinHandle, ThreadId};
