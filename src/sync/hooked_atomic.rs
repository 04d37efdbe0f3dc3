//! Atomics whose every access is a hook point ([`Point::AtomicWrite`] after
//! a write, [`Point::AtomicRead`] after a load), for the simulator's
//! deterministic stages.
//!
//! Built only with the `race-hooks` feature on the std backend; every other
//! build (the default one, an embedder's `--no-default-features`,
//! `cargo bench`, loom, shuttle) uses the backend's atomics unchanged. Each type is `repr(transparent)` over its
//! `std::sync::atomic` counterpart and offers the subset of its API the crate
//! uses; orderings and results are the std atomic's. An access first runs
//! on the std atomic, then calls [`hook::at`]: with no hook installed in the
//! process that is one relaxed load of a static and a predictable branch. A
//! failed compare-exchange or `fetch_update` is a write point too.
//!
//! Why: a window between two accesses of one operation (a value published
//! as two separate atomics: between the writer's two stores, or between a
//! reader's two loads) exists only in the code that has it, so no named
//! point of the real code can sit inside it. A hook run after each access
//! can: the simulator's `hint_race` stage runs a lock-free lookup after
//! every write of a mark-delete across a ledger boundary, and a complete
//! mark-delete after every load of a lock-free lookup, and reports any
//! lookup that answers from a state no complete mark-delete published.

// The wrappers mirror the std atomics' API (the subset the crate uses
// anywhere), so a method one build does not call is not a defect.
#![allow(dead_code)]

use std::sync::atomic::{self, Ordering};

use super::hook::{self, Point};

/// Methods `fn op(&self, v, order) -> old` that run the std atomic's `op`,
/// then the write point.
macro_rules! write_point_ops {
    ($t:ty; $($op:ident),+) => {
        $(
            #[doc = concat!("As the std atomic's `", stringify!($op), "`, then the write point.")]
            #[inline]
            pub fn $op(&self, v: $t, order: Ordering) -> $t {
                let old = self.0.$op(v, order);
                hook::at(Point::AtomicWrite);
                old
            }
        )+
    };
}

macro_rules! write_point_atomic {
    ($(#[$m:meta])* $name:ident, $raw:ty, $t:ty) => {
        $(#[$m])*
        #[derive(Default)]
        #[repr(transparent)]
        pub struct $name($raw);

        impl $name {
            /// A new atomic holding `v`.
            pub const fn new(v: $t) -> Self {
                Self(<$raw>::new(v))
            }

            /// As the std atomic's `load`, then the read point.
            #[inline]
            pub fn load(&self, order: Ordering) -> $t {
                let v = self.0.load(order);
                hook::at(Point::AtomicRead);
                v
            }

            /// As the std atomic's `store`, then the write point.
            #[inline]
            pub fn store(&self, v: $t, order: Ordering) {
                self.0.store(v, order);
                hook::at(Point::AtomicWrite);
            }

            write_point_ops!($t; swap);

            /// As the std atomic's `compare_exchange`, then the write point
            /// (also on failure: the caller's next step may depend on it).
            #[inline]
            pub fn compare_exchange(
                &self,
                current: $t,
                new: $t,
                success: Ordering,
                failure: Ordering,
            ) -> Result<$t, $t> {
                let r = self.0.compare_exchange(current, new, success, failure);
                hook::at(Point::AtomicWrite);
                r
            }

            /// As the std atomic's `fetch_update`, then the write point.
            #[inline]
            pub fn fetch_update<F>(
                &self,
                set_order: Ordering,
                fetch_order: Ordering,
                f: F,
            ) -> Result<$t, $t>
            where
                F: FnMut($t) -> Option<$t>,
            {
                let r = self.0.fetch_update(set_order, fetch_order, f);
                hook::at(Point::AtomicWrite);
                r
            }

            /// As the std atomic's `get_mut` (exclusive access: no point).
            #[inline]
            pub fn get_mut(&mut self) -> &mut $t {
                self.0.get_mut()
            }

            /// As the std atomic's `into_inner`.
            #[inline]
            pub fn into_inner(self) -> $t {
                self.0.into_inner()
            }
        }

        impl From<$t> for $name {
            fn from(v: $t) -> Self {
                Self::new(v)
            }
        }

        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                std::fmt::Debug::fmt(&self.0, f)
            }
        }
    };
}

macro_rules! write_point_integer {
    ($(#[$m:meta])* $name:ident, $raw:ty, $t:ty) => {
        write_point_atomic!($(#[$m])* $name, $raw, $t);

        impl $name {
            write_point_ops!($t; fetch_add, fetch_sub, fetch_max, fetch_min, fetch_or, fetch_and);
        }
    };
}

write_point_atomic!(
    /// `std::sync::atomic::AtomicBool` whose writes are hook points.
    AtomicBool,
    atomic::AtomicBool,
    bool
);
write_point_integer!(
    /// `std::sync::atomic::AtomicI64` whose writes are hook points.
    AtomicI64,
    atomic::AtomicI64,
    i64
);
write_point_integer!(
    /// `std::sync::atomic::AtomicU32` whose writes are hook points.
    AtomicU32,
    atomic::AtomicU32,
    u32
);
write_point_integer!(
    /// `std::sync::atomic::AtomicU64` whose writes are hook points.
    AtomicU64,
    atomic::AtomicU64,
    u64
);
write_point_integer!(
    /// `std::sync::atomic::AtomicUsize` whose writes are hook points.
    AtomicUsize,
    atomic::AtomicUsize,
    usize
);

impl AtomicBool {
    write_point_ops!(bool; fetch_or, fetch_and);
}
