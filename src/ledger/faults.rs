//! Per-call read-failure injection for a managed ledger ([`ReadFaults`]).

use std::collections::VecDeque;

use super::error::ReadFailureKind;
#[cfg(doc)]
use super::ManagedCursor;
use crate::position::Position;
use crate::sync::Mutex;
// The policy handle carries no modelled synchronisation: std's Arc in every build.
use std::sync::Arc;

/// A read request as seen by a [`ReadFaults`] policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadRequest<'a> {
    /// Managed-ledger name.
    pub ledger: &'a str,
    /// Cursor name.
    pub cursor: &'a str,
    /// Read position at the start of the read.
    pub from: Position,
    /// Maximum number of entries requested.
    pub max_entries: usize,
}

type FaultPolicy = dyn Fn(&ReadRequest<'_>) -> Option<ReadFailureKind> + Send + Sync;

/// Per-call read-failure injection for one managed ledger (every cursor of
/// it): a queue of one-shot failures consumed by the next reads, plus an
/// optional policy consulted on every read (e.g. a storage outage window on
/// virtual time). Thread-safe; any thread may arm faults at any time.
#[derive(Default)]
pub struct ReadFaults {
    queued: Mutex<VecDeque<ReadFailureKind>>,
    policy: Mutex<Option<Arc<FaultPolicy>>>,
}

impl std::fmt::Debug for ReadFaults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadFaults")
            .field("queued", &self.queued.lock().len())
            .field("policy", &self.policy.lock().is_some())
            .finish()
    }
}

impl ReadFaults {
    /// The next `count` reads (of any cursor of this ledger) fail with `kind`.
    pub fn fail_next_reads(&self, kind: ReadFailureKind, count: usize) {
        let mut q = self.queued.lock();
        for _ in 0..count {
            q.push_back(kind);
        }
    }

    /// Installs a policy consulted on every read after the queued faults; it
    /// returns the failure to inject, if any. Replaces any previous policy.
    ///
    /// The policy is called with no lock held (neither the reading cursor's
    /// nor the ledger's), so it may inspect the cursor or ledger, e.g. call
    /// [`ManagedCursor::read_position`]. Its [`ReadRequest::from`] is the read
    /// position when the read started; a concurrent read, rewind or reset of
    /// the same cursor may move the read position before the read proceeds.
    pub fn set_policy(
        &self,
        policy: impl Fn(&ReadRequest<'_>) -> Option<ReadFailureKind> + Send + Sync + 'static,
    ) {
        *self.policy.lock() = Some(Arc::new(policy));
    }

    /// Removes the policy and every queued fault.
    pub fn clear(&self) {
        self.queued.lock().clear();
        *self.policy.lock() = None;
    }

    pub(super) fn next(&self, req: &ReadRequest<'_>) -> Option<ReadFailureKind> {
        if let Some(k) = self.queued.lock().pop_front() {
            return Some(k);
        }
        let policy = self.policy.lock().clone();
        policy.and_then(|p| p(req))
    }
}
