//! Atomics, `fence` and `Ordering` of the active backend.
//!
//! With the `race-hooks` feature (the simulator's `hint_race` stage and its
//! tests) on the std backend the atomics are [`super::hooked_atomic`]'s
//! `repr(transparent)` wrappers, whose every access is also a
//! [`super::hook`] point; every other build (default, an embedder's
//! `--no-default-features`, `cargo bench`) uses `std::sync::atomic`'s.

#[cfg(loom)]
pub use loom::sync::atomic::{
    fence, AtomicBool, AtomicI64, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};

#[cfg(all(feature = "shuttle", not(loom)))]
pub use shuttle::sync::atomic::{
    fence, AtomicBool, AtomicI64, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};

#[cfg(not(any(loom, feature = "shuttle")))]
pub use std::sync::atomic::{fence, Ordering};

#[cfg(all(feature = "race-hooks", not(any(loom, feature = "shuttle"))))]
pub use super::hooked_atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, AtomicUsize};

#[cfg(not(any(loom, feature = "shuttle", feature = "race-hooks")))]
pub use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, AtomicUsize};
