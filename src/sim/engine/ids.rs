//! Typed indexes into the simulator's per-subscription and per-consumer
//! tables, so a subscription index is never used as a consumer index (both
//! were bare `usize`s).

use std::fmt;
use std::ops::{Index, IndexMut};

/// A subscription of the workload (`sub-{n}`): the index into every
/// per-subscription table (broker subscriptions, clients, truths).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct SubIdx(pub(super) usize);

/// A consumer slot within its subscription: the client's index, stable
/// across reconnects and re-creations (the checker's consumer id), not the
/// broker's [`ConsumerKey`](crate::permits::ConsumerKey), which changes
/// with every connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct ConsumerIdx(pub(super) usize);

impl SubIdx {
    /// Every subscription of a workload with `n` of them.
    pub(super) fn all(n: u32) -> impl Iterator<Item = SubIdx> {
        (0..n as usize).map(SubIdx)
    }
}

impl ConsumerIdx {
    /// Every consumer slot of a subscription with `n` consumers.
    pub(super) fn all(n: u32) -> impl Iterator<Item = ConsumerIdx> {
        (0..n as usize).map(ConsumerIdx)
    }
}

impl fmt::Display for SubIdx {
    /// The number alone (`sub-{s}` formats the subscription's name).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for ConsumerIdx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<T> Index<SubIdx> for Vec<T> {
    type Output = T;
    fn index(&self, i: SubIdx) -> &T {
        &self[i.0]
    }
}

impl<T> IndexMut<SubIdx> for Vec<T> {
    fn index_mut(&mut self, i: SubIdx) -> &mut T {
        &mut self[i.0]
    }
}

impl<T> Index<ConsumerIdx> for Vec<T> {
    type Output = T;
    fn index(&self, i: ConsumerIdx) -> &T {
        &self[i.0]
    }
}

impl<T> IndexMut<ConsumerIdx> for Vec<T> {
    fn index_mut(&mut self, i: ConsumerIdx) -> &mut T {
        &mut self[i.0]
    }
}
