//! The truth the delayed tracker's count is checked against: per
//! subscription, the delayed messages the tracker accepted
//! (`add_message` returned `true`) and has not scheduled, untracked
//! (an expired re-add) or dropped below the mark-delete it was given.
//!
//! Kept by the engine next to every call it makes into the tracker, so the
//! checker sees what the tracker was told, not what it says about itself:
//!
//! - after each step the tracker's `number_of_delayed_messages()` must
//!   equal [`DelayedTruth::len`], and the tracker's own structural check
//!   (`verify_invariants`: `CounterEqualsCardinality`, `NoSecondLiveCopy`
//!   and its bucket bookkeeping) must pass;
//! - a position the tracker schedules must be one it holds (scheduling it
//!   twice, or a position it was never given, is a violation);
//! - a message still held past its delivery time plus the late bound is
//!   late (a lost index shows up even if a later re-read would repair it).
//!
//! A restart drops the tracker; the recovered one is re-synchronised from
//! [`DelayedTruth::ever_added`] through `contains_message` (what recovery
//! restored), and its count must match that.
//!
//! The truth also remembers which indexes are sealed into a live bucket
//! snapshot (from the committed creates and deletes the
//! [`ObservedStorage`](super::delayed_storage::ObservedStorage) logs), so a
//! restart cannot hide a loss behind the cursor's re-read:
//!
//! - a merge must persist exactly what the tracker still held of its
//!   sources, and nothing it no longer holds (dispatched or acknowledged
//!   indexes are not persisted again, or a restart replays them);
//! - a recovery must restore every index the crashed tracker held that is
//!   sealed in a live snapshot, above the recovered mark-delete and not yet
//!   due (recovery restores them into the runtime index).
//!
//! A snapshot is live for a recovery only once its create is **durable**:
//! the core commits a turn's store writes (snapshot creates and deletes
//! among them) with one fsynced barrier at the end of the turn
//! (`broker::turn_commit`), so a crash before that barrier loses the
//! turn's seals, merges and deletes although `create` returned `Ok`. As in
//! Pulsar (a bucket is committed only once its snapshot and cursor property
//! are written; `recoverBucketSnapshot` reads only the committed bucket
//! keys), recovery cannot restore a bucket whose create never became
//! durable: its indexes lie above the recovered mark-delete and are re-read
//! by the dispatcher. The driver calls [`DelayedTruth::turn_durable`] after
//! every barrier that returned `Ok`; recovery is judged against the
//! snapshots durable at the last one.

use std::collections::{BTreeMap, BTreeSet};

use super::delayed_storage::{self, SnapshotEvent, SnapshotLog};
use crate::position::Position;

/// The truth for one subscription's tracker.
#[derive(Debug, Default)]
pub struct DelayedTruth {
    held: BTreeMap<Position, u64>,
    by_due: BTreeSet<(u64, Position)>,
    ever: BTreeMap<Position, u64>,
    /// A count mismatch was reported (reported once per broker lifetime).
    pub mismatch_reported: bool,
    /// A structural invariant violation of the tracker
    /// (`verify_invariants`) was reported (once per broker lifetime).
    pub invariant_reported: bool,
    /// The tracker's background-work counters at its last structural check.
    pub checked_stats: Option<crate::delayed::TrackerStats>,
    /// An overdue message was reported (reported once).
    pub overdue_reported: bool,
    /// Live snapshot id → the positions it persists (with delivery times),
    /// as the running tracker's storage holds it (durable or not yet).
    persisted: BTreeMap<i64, BTreeSet<(Position, u64)>>,
    /// The live snapshots as of the last durable barrier: what a crash
    /// now leaves in the store.
    durable: BTreeMap<i64, BTreeSet<(Position, u64)>>,
    /// The storage changes applied to `persisted` since the last durable
    /// barrier (lost by a crash before the next one).
    undurable: Vec<SnapshotEvent>,
    /// Storage changes become durable only at
    /// [`turn_durable`](Self::turn_durable) (a core committing its turns with one barrier);
    /// otherwise each is durable once its call returned `Ok` (a store that
    /// fsyncs every commit).
    deferred: bool,
    /// Where the subscription's observed snapshot storage logs.
    log: SnapshotLog,
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

    /// The log the subscription's
    /// [`ObservedStorage`](super::delayed_storage::ObservedStorage) appends
    /// to (the same for every broker lifetime: snapshots outlive a restart).
    pub fn snapshot_log(&self) -> SnapshotLog {
        SnapshotLog::clone(&self.log)
    }

    /// Applies the storage changes logged since the last call, against what
    /// the tracker holds now (call it right after each tracker call, before
    /// recording that call's result). Returns a description of each merge
    /// that broke the merge rule.
    pub fn apply_snapshot_events(&mut self) -> Vec<String> {
        let mut violations = Vec::new();
        for ev in delayed_storage::drain(&self.log) {
            self.undurable.push(ev.clone());
            match ev {
                SnapshotEvent::Created {
                    id,
                    positions,
                    replaces,
                } => {
                    if !replaces.is_empty() {
                        let sources: BTreeSet<Position> = replaces
                            .iter()
                            .filter_map(|r| self.persisted.remove(r))
                            .flatten()
                            .map(|(p, _)| p)
                            .collect();
                        let merged: BTreeSet<Position> =
                            positions.iter().map(|(p, _)| *p).collect();
                        let lost: Vec<Position> = sources
                            .iter()
                            .filter(|p| self.held.contains_key(p) && !merged.contains(p))
                            .copied()
                            .collect();
                        if let Some(p) = lost.first() {
                            violations.push(format!(
                                "merge lost held indexes: merged snapshot {id} lacks {} index(es) the tracker still held in its source snapshots {replaces:?} (first {p}); after a restart they are never recovered",
                                lost.len()
                            ));
                        }
                        let stale: Vec<Position> = merged
                            .iter()
                            .filter(|p| !self.held.contains_key(p))
                            .copied()
                            .collect();
                        if let Some(p) = stale.first() {
                            violations.push(format!(
                                "merge persisted dispatched indexes: merged snapshot {id} persists {} index(es) the tracker no longer holds (dispatched or acknowledged; first {p}); a restart would deliver them again",
                                stale.len()
                            ));
                        }
                    }
                    self.persisted.insert(id, positions);
                }
                SnapshotEvent::Deleted { id } => {
                    self.persisted.remove(&id);
                }
            }
        }
        if !self.deferred {
            self.make_durable();
        }
        violations
    }

    /// From now on, storage changes are durable only once the driver calls
    /// [`turn_durable`](Self::turn_durable) (the node engine: the core
    /// commits each turn with one barrier).
    pub fn defer_durability_to_barriers(&mut self) {
        self.deferred = true;
    }

    /// The core's turn barrier returned `Ok`: every storage change so far
    /// is durable (a later crash keeps it). Applies the changes logged
    /// since the last tracker call first; returns the merge violations
    /// among them, as [`apply_snapshot_events`](Self::apply_snapshot_events).
    pub fn turn_durable(&mut self) -> Vec<String> {
        let violations = self.apply_snapshot_events();
        self.make_durable();
        violations
    }

    /// The process died: the storage changes since the last durable
    /// barrier are gone (a later [`turn_durable`](Self::turn_durable) of the
    /// next process does not make them durable).
    pub fn crashed(&mut self) {
        // Changes the crashed process logged but nobody drained yet.
        drop(delayed_storage::drain(&self.log));
        self.undurable.clear();
        self.persisted = self.durable.clone();
    }

    /// Applies the changes since the last durable point to `durable`.
    fn make_durable(&mut self) {
        for ev in std::mem::take(&mut self.undurable) {
            match ev {
                SnapshotEvent::Created {
                    id,
                    positions,
                    replaces,
                } => {
                    for r in &replaces {
                        self.durable.remove(r);
                    }
                    self.durable.insert(id, positions);
                }
                SnapshotEvent::Deleted { id } => {
                    self.durable.remove(&id);
                }
            }
        }
    }

    /// A new tracker recovered from the snapshots: every position the
    /// crashed tracker held (the truth before [`resync`](Self::resync);
    /// [`mark_delete`](Self::mark_delete) with the recovered mark-delete
    /// first) that a live snapshot persists and that is due after `cutoff_ms`
    /// must be tracked again (`contains`). Returns a description of the
    /// first one missing, with how many are.
    pub fn check_recovery(
        &mut self,
        cutoff_ms: u64,
        contains: impl Fn(Position) -> bool,
    ) -> Option<String> {
        // Recovery's own cleanup (expired, enclosed, dangling snapshots).
        let merge_violations = self.apply_snapshot_events();
        debug_assert!(merge_violations.is_empty(), "recovery merges nothing");
        let sealed: BTreeMap<Position, i64> = self
            .persisted
            .iter()
            .flat_map(|(id, ps)| ps.iter().map(move |(p, _)| (*p, *id)))
            .collect();
        let missing: Vec<(Position, u64, i64)> = self
            .held
            .iter()
            .filter(|(_, due)| **due > cutoff_ms)
            .filter_map(|(p, due)| sealed.get(p).map(|id| (*p, *due, *id)))
            .filter(|(p, _, _)| !contains(*p))
            .collect();
        let (p, due, id) = missing.first()?;
        Some(format!(
            "recovery lost held indexes: {} index(es) the crashed tracker held, sealed in live snapshots and not yet due, are not tracked after recovery (first {p}, due {due}ms, snapshot {id})",
            missing.len()
        ))
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
        self.invariant_reported = false;
        self.checked_stats = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn created(t: &DelayedTruth, id: i64, ps: &[(Position, u64)], replaces: Vec<i64>) {
        t.snapshot_log()
            .lock()
            .unwrap()
            .push(SnapshotEvent::Created {
                id,
                positions: ps.iter().copied().collect(),
                replaces,
            });
    }

    #[test]
    fn merge_and_recovery_rules_fail_on_a_lost_or_stale_index() {
        let (a, b, c) = (
            (Position::new(1, 0), 100),
            (Position::new(1, 1), 200),
            (Position::new(2, 0), 300),
        );
        let mut t = DelayedTruth::default();
        for (p, d) in [a, b, c] {
            t.accepted(p, d);
        }
        created(&t, 1, &[a, b], vec![]);
        created(&t, 2, &[c], vec![]);
        assert!(t.apply_snapshot_events().is_empty(), "seals are not merges");
        assert!(t.scheduled(a.0));
        // A correct merge: what is still held, nothing dispatched.
        created(&t, 3, &[b, c], vec![1, 2]);
        assert!(t.apply_snapshot_events().is_empty());
        // One that loses a held index and persists a dispatched one.
        created(&t, 4, &[a, c], vec![3]);
        let v = t.apply_snapshot_events();
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(v[0].starts_with("merge lost held indexes"), "{v:?}");
        assert!(
            v[1].starts_with("merge persisted dispatched indexes"),
            "{v:?}"
        );
        // Recovery must restore c (held, sealed in snapshot 4, due later)...
        assert!(t.check_recovery(150, |_| true).is_none());
        let miss = t.check_recovery(150, |p| p != c.0).unwrap();
        assert!(miss.starts_with("recovery lost held indexes"), "{miss}");
        // ...but not b (held, in no live snapshot) nor what is due already.
        assert!(t.check_recovery(150, |p| p == c.0).is_none());
        assert!(t.check_recovery(300, |_| false).is_none());
    }

    /// With turn commits, a seal is durable only at its turn's barrier: a
    /// crash before the barrier takes the snapshot with it (Pulsar's
    /// recovery reads only committed bucket keys), so recovery owes none of
    /// its indexes; once the barrier returned, it owes all of them, and a
    /// merge or delete of a later, lost turn does not change that.
    #[test]
    fn recovery_owes_only_snapshots_durable_at_the_last_barrier() {
        let (a, b) = ((Position::new(1, 0), 500), (Position::new(1, 1), 600));
        let c = (Position::new(2, 0), 700);
        let mut t = DelayedTruth::default();
        t.defer_durability_to_barriers();
        for (p, d) in [a, b, c] {
            t.accepted(p, d);
        }
        // Sealed in a turn whose barrier never returned (crash before it).
        created(&t, 1, &[a, b], vec![]);
        assert!(t.apply_snapshot_events().is_empty());
        t.crashed();
        // The next process's first barrier does not revive it.
        assert!(t.turn_durable().is_empty());
        assert!(
            t.check_recovery(100, |_| false).is_none(),
            "a seal lost with its turn is not owed by recovery"
        );
        // The same seal, its barrier returned: owed (negative control).
        created(&t, 2, &[a, b], vec![]);
        assert!(t.turn_durable().is_empty());
        let miss = t.check_recovery(100, |_| false).unwrap();
        assert!(miss.starts_with("recovery lost held indexes: 2 "), "{miss}");
        assert!(t.check_recovery(100, |_| true).is_none());
        // A merge and a delete in a turn lost to a crash: the durable seal
        // (2) is still what the store holds; c (only in the lost merge) is
        // not owed.
        created(&t, 3, &[a, b, c], vec![2]);
        t.apply_snapshot_events();
        t.snapshot_log()
            .lock()
            .unwrap()
            .push(SnapshotEvent::Deleted { id: 3 });
        t.apply_snapshot_events();
        t.crashed();
        let miss = t.check_recovery(100, |p| p != a.0).unwrap();
        assert!(
            miss.contains("first 1:0") && miss.contains("snapshot 2"),
            "{miss}"
        );
        assert!(t.check_recovery(100, |p| p != c.0).is_none());
        // Without deferral (a store fsyncing every commit) a change is
        // durable once its call returned.
        let mut t = DelayedTruth::default();
        t.accepted(a.0, a.1);
        created(&t, 1, &[a], vec![]);
        assert!(t.apply_snapshot_events().is_empty());
        assert!(t.check_recovery(100, |_| false).is_some());
    }
}
