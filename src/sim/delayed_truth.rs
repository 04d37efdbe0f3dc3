//! The truth the delayed tracker's count is checked against: per
//! subscription, the delayed messages the tracker accepted
//! (`add_message` returned `true`) and has not scheduled, untracked
//! (an expired re-add) or dropped below the mark-delete it was given.
//!
//! Kept by the engine next to every call it makes into the tracker, so the
//! checker sees what the tracker was told, not what it says about itself:
//!
//! - after each step the tracker's `number_of_delayed_messages()` must
//!   equal [`DelayedTruth::len`];
//! - a position the tracker schedules must be one it holds (scheduling it
//!   twice, or a position it was never given, is a violation);
//! - a message still held past its delivery time plus the late bound is
//!   late (a lost index shows up even if a later re-read would repair it).
//!
//! A restart drops the tracker; the recovered one is re-synchronised from
//! [`DelayedTruth::ever_added`] through `contains_message` (what recovery
//! restored), and its count must match that.

use std::collections::{BTreeMap, BTreeSet};

use crate::position::Position;

/// The truth for one subscription's tracker.
#[derive(Debug, Default)]
pub struct DelayedTruth {
    held: BTreeMap<Position, u64>,
    by_due: BTreeSet<(u64, Position)>,
    ever: BTreeMap<Position, u64>,
    /// A count mismatch was reported (reported once per broker lifetime).
    pub mismatch_reported: bool,
    /// An overdue message was reported (reported once).
    pub overdue_reported: bool,
}

impl DelayedTruth {
    /// The tracker accepted `p`, due at `due_ms`.
    pub fn accepted(&mut self, p: Position, due_ms: u64) {
        self.ever.insert(p, due_ms);
        if self.held.insert(p, due_ms).is_none() {
            self.by_due.insert((due_ms, p));
        }
    }

    /// The tracker declined (or untracked) `p`.
    pub fn declined(&mut self, p: Position) {
        if let Some(d) = self.held.remove(&p) {
            self.by_due.remove(&(d, p));
        }
    }

    /// The tracker scheduled `p`; `false` if it did not hold it.
    pub fn scheduled(&mut self, p: Position) -> bool {
        match self.held.remove(&p) {
            Some(d) => {
                self.by_due.remove(&(d, p));
                true
            }
            None => false,
        }
    }

    /// The tracker was given mark-delete `md`: everything at or below it is
    /// untracked.
    pub fn mark_delete(&mut self, md: Position) {
        let above = self
            .held
            .split_off(&Position::new(md.ledger_id, md.entry_id + 1));
        for (p, d) in std::mem::replace(&mut self.held, above) {
            self.by_due.remove(&(d, p));
        }
    }

    /// Messages the tracker should hold.
    pub fn len(&self) -> u64 {
        self.held.len() as u64
    }

    /// Whether it should hold nothing.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// The held message due first, if any.
    pub fn first_due(&self) -> Option<(u64, Position)> {
        self.by_due.first().copied()
    }

    /// Every position the tracker ever accepted, with its delivery time (kept
    /// below the mark-delete too: a restart recovers the mark-delete last
    /// persisted, which may be below the one the crashed broker had given the
    /// tracker, and the recovered tracker rightly holds what lies between).
    pub fn ever_added(&self) -> impl Iterator<Item = (Position, u64)> + '_ {
        self.ever.iter().map(|(p, d)| (*p, *d))
    }

    /// After a restart: the recovered tracker holds exactly `held`.
    pub fn resync(&mut self, held: Vec<(Position, u64)>) {
        self.held.clear();
        self.by_due.clear();
        for (p, d) in held {
            self.held.insert(p, d);
            self.by_due.insert((d, p));
        }
        self.mismatch_reported = false;
    }
}
