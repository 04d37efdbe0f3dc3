//! The pending-ack state a handle rebuilds by replay, with idempotent
//! handlers (re-reading applied records after a rewind is harmless) and the
//! log index that decides how far the pending-ack log may be trimmed.
//!
//! Handler rules (Pulsar's `PendingAckHandleImpl` replay handlers, with the
//! design note's §4 caveat fixed: cumulative COMMIT/ABORT are keyed by txn id,
//! so a re-read commit never acts on a later transaction's cumulative ack):
//!
//! * individual ACK — the whole record is skipped if any position is already
//!   deleted on the subscription (committed or at/below its mark-delete) or
//!   already pending;
//! * cumulative ACK — applied only past the subscription's mark-delete and
//!   when nothing is pending or the same txn moves to a larger position;
//!   its commit moves the mark-delete to its position, or to the entry
//!   before it when it carries an `ack_set` (a batch entry with indexes
//!   still unacknowledged, which the commit never deletes);
//! * COMMIT/ABORT — looked up by txn id; a txn that is gone is a no-op.

use std::collections::{BTreeMap, BTreeSet};

use super::error::PendingAckError;
use super::record::{AckType, PendingAckOp, PendingAckRecord, TxnId};
use super::replay::ReplaySink;
use super::subscription::{CommittedAck, SubscriptionView};
use crate::position::Position;

/// Who holds pending individual acks on one position: a whole-entry ack by
/// one txn, or batch indexes each held by one txn.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct PositionAcks {
    whole: Option<TxnId>,
    batch_size: i32,
    indexes: BTreeMap<u32, TxnId>,
}

/// What a txn holds on one position: `None` = the whole entry, `Some` = these
/// batch indexes.
type Held = Option<BTreeSet<u32>>;

/// Pending transactional acks of one subscription plus the subscription
/// effects of committed transactions. Owned by the handle under a lock;
/// mutated by the replay thread and by persisted appends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingAckState {
    individual: BTreeMap<TxnId, BTreeMap<Position, Held>>,
    position_acks: BTreeMap<Position, PositionAcks>,
    cumulative: Option<(TxnId, Position)>,
    /// Where committing the pending cumulative ack moves the mark-delete: its
    /// position, or the entry before it when its `ack_set` leaves batch
    /// indexes of that entry unacknowledged (they are never deleted).
    cumulative_commit_to: Position,
    deleted: BTreeSet<Position>,
    deleted_indexes: BTreeMap<Position, BTreeSet<u32>>,
    mark_delete: Position,
    log_unresolved: BTreeMap<Position, BTreeSet<TxnId>>,
    txn_log_entries: BTreeMap<TxnId, BTreeSet<Position>>,
    /// Per log entry, the committed acks of transactions whose first ACK
    /// record is in it: the entry may be trimmed only once the subscription
    /// holds every one of them durably.
    log_committed: BTreeMap<Position, Vec<CommittedAck>>,
    /// Acks committed by an applied COMMIT record whose log entry is not
    /// indexed yet ([`PendingAckState::index_log_entry`] files them).
    committed_unindexed: BTreeMap<TxnId, Vec<CommittedAck>>,
    records_applied: u64,
    records_skipped: u64,
}

impl Default for PendingAckState {
    fn default() -> Self {
        Self::new(Position::new(-1, -1))
    }
}

/// A comparable summary of a [`PendingAckState`]'s effects (what a reference
/// model of the log predicts), independent of bookkeeping counters.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PendingAckSummary {
    /// Pending individual acks: txn → positions (whole-entry or some batch
    /// indexes; see `batch_indexes`).
    pub individual: BTreeMap<TxnId, BTreeSet<Position>>,
    /// Pending batch-index acks: txn → position → the indexes it acks.
    pub batch_indexes: BTreeMap<TxnId, BTreeMap<Position, BTreeSet<u32>>>,
    /// The pending cumulative ack, if any.
    pub cumulative: Option<(TxnId, Position)>,
    /// Positions deleted individually (whole entry) by committed transactions.
    pub deleted: BTreeSet<Position>,
    /// Batch indexes deleted by committed transactions, for batch entries not
    /// yet deleted as a whole.
    pub deleted_batch_indexes: BTreeMap<Position, BTreeSet<u32>>,
    /// Subscription mark-delete moved by committed cumulative acks.
    pub mark_delete: Position,
}

impl PendingAckState {
    /// Empty state for a subscription whose mark-delete is `mark_delete`.
    pub fn new(mark_delete: Position) -> Self {
        Self {
            individual: BTreeMap::new(),
            position_acks: BTreeMap::new(),
            cumulative: None,
            cumulative_commit_to: mark_delete,
            deleted: BTreeSet::new(),
            deleted_indexes: BTreeMap::new(),
            mark_delete,
            log_unresolved: BTreeMap::new(),
            txn_log_entries: BTreeMap::new(),
            log_committed: BTreeMap::new(),
            committed_unindexed: BTreeMap::new(),
            records_applied: 0,
            records_skipped: 0,
        }
    }

    /// Applies one replayed record (idempotent, see the module docs): a
    /// conflicting ACK is skipped whole, as Pulsar's replay does. Returns
    /// whether it changed anything.
    pub fn apply(&mut self, record: &PendingAckRecord) -> bool {
        let changed = self.apply_checked(record).unwrap_or(false);
        if changed {
            self.records_applied += 1;
        } else {
            self.records_skipped += 1;
        }
        changed
    }

    /// Applies one record, reporting a conflicting ACK as an error and
    /// leaving the state unchanged. `Ok(false)` is a COMMIT/ABORT of a txn
    /// with nothing pending.
    ///
    /// # Errors
    /// [`PendingAckError::AckConflict`] (see [`PendingAckState::check`]).
    pub fn apply_checked(&mut self, record: &PendingAckRecord) -> Result<bool, PendingAckError> {
        self.check(record)?;
        Ok(self.apply_unchecked(record))
    }

    fn conflict(
        r: &PendingAckRecord,
        position: Position,
        batch_index: Option<u32>,
        holder: Option<TxnId>,
    ) -> PendingAckError {
        PendingAckError::AckConflict {
            txn_id: r.txn_id,
            position,
            batch_index,
            holder,
        }
    }

    /// Pulsar's conflict rules for a transactional ACK (COMMIT/ABORT never
    /// conflict):
    ///
    /// * individual, whole entry: the position is at/below the mark-delete,
    ///   deleted, has a batch index deleted, or has any pending ack (whole
    ///   or index, by any txn);
    /// * individual, batch indexes: the position is at/below the mark-delete
    ///   or deleted, has a whole-entry pending ack, or one of the acked
    ///   indexes is deleted or pending (by any txn); disjoint indexes of one
    ///   entry held by different txns do not conflict;
    /// * cumulative: the position is at/below the mark-delete, another txn's
    ///   cumulative ack is pending, or this txn's pending one is not below it.
    ///
    /// # Errors
    /// [`PendingAckError::AckConflict`] naming the position, the index (for a
    /// batch-index conflict) and the holding txn (`None` = already
    /// acknowledged on the subscription).
    pub fn check(&self, r: &PendingAckRecord) -> Result<(), PendingAckError> {
        if r.op != PendingAckOp::Ack {
            return Ok(());
        }
        if r.ack_type == AckType::Cumulative {
            let Some(p) = r.positions.first().map(|p| p.position) else {
                return Ok(());
            };
            if p <= self.mark_delete {
                return Err(Self::conflict(r, p, None, None));
            }
            return match self.cumulative {
                Some((owner, _)) if owner != r.txn_id => {
                    Err(Self::conflict(r, p, None, Some(owner)))
                }
                Some((owner, q)) if p <= q => Err(Self::conflict(r, p, None, Some(owner))),
                _ => Ok(()),
            };
        }
        for ap in &r.positions {
            let p = ap.position;
            if p <= self.mark_delete || self.deleted.contains(&p) {
                return Err(Self::conflict(r, p, None, None));
            }
            let pending = self.position_acks.get(&p);
            if let Some(owner) = pending.and_then(|a| a.whole) {
                return Err(Self::conflict(r, p, None, Some(owner)));
            }
            match ap.acked_indexes() {
                None => {
                    if let Some(a) = pending {
                        if let Some((i, owner)) = a.indexes.iter().next() {
                            return Err(Self::conflict(r, p, Some(*i), Some(*owner)));
                        }
                    }
                    if let Some(i) = self.deleted_indexes.get(&p).and_then(|d| d.first()) {
                        return Err(Self::conflict(r, p, Some(*i), None));
                    }
                }
                Some(acked) => {
                    for i in acked {
                        if let Some(owner) = pending.and_then(|a| a.indexes.get(&i)) {
                            return Err(Self::conflict(r, p, Some(i), Some(*owner)));
                        }
                        if self.deleted_indexes.get(&p).is_some_and(|d| d.contains(&i)) {
                            return Err(Self::conflict(r, p, Some(i), None));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn apply_unchecked(&mut self, r: &PendingAckRecord) -> bool {
        let t = r.txn_id;
        match (r.op, r.ack_type) {
            (PendingAckOp::Ack, AckType::Individual) => {
                let held = self.individual.entry(t).or_default();
                for ap in &r.positions {
                    let p = ap.position;
                    let acks = self.position_acks.entry(p).or_default();
                    match ap.acked_indexes() {
                        None => {
                            acks.whole = Some(t);
                            held.insert(p, None);
                        }
                        Some(acked) => {
                            acks.batch_size = ap.batch_size;
                            for i in &acked {
                                acks.indexes.insert(*i, t);
                            }
                            // A whole-entry hold (None) already covers every index.
                            if let Some(set) =
                                held.entry(p).or_insert_with(|| Some(BTreeSet::new()))
                            {
                                set.extend(acked);
                            }
                        }
                    }
                }
                true
            }
            (PendingAckOp::Ack, AckType::Cumulative) => match r.positions.first() {
                Some(p) => {
                    self.cumulative = Some((t, p.position));
                    self.cumulative_commit_to = if p.ack_set.is_empty() {
                        p.position
                    } else {
                        Position::new(p.position.ledger_id, p.position.entry_id - 1)
                    };
                    true
                }
                None => false,
            },
            (op, AckType::Individual) => {
                let Some(held) = self.individual.remove(&t) else {
                    return false;
                };
                let commit = op == PendingAckOp::Commit;
                let mut committed = Vec::new();
                for (p, what) in held {
                    match what {
                        None => {
                            self.position_acks.remove(&p);
                            if commit {
                                self.deleted.insert(p);
                                self.deleted_indexes.remove(&p);
                                committed.push(CommittedAck::Entry(p));
                            }
                        }
                        Some(indexes) => {
                            let mut batch_size = 0;
                            if let Some(a) = self.position_acks.get_mut(&p) {
                                batch_size = a.batch_size;
                                for i in &indexes {
                                    a.indexes.remove(i);
                                }
                                if a.indexes.is_empty() && a.whole.is_none() {
                                    self.position_acks.remove(&p);
                                }
                            }
                            if commit {
                                let d = self.deleted_indexes.entry(p).or_default();
                                d.extend(indexes.iter().copied());
                                if batch_size > 0 && d.len() >= batch_size as usize {
                                    self.deleted_indexes.remove(&p);
                                    self.deleted.insert(p);
                                }
                                committed.push(CommittedAck::BatchIndexes {
                                    position: p,
                                    batch_size,
                                    indexes,
                                });
                            }
                        }
                    }
                }
                if !committed.is_empty() {
                    self.committed_unindexed
                        .entry(t)
                        .or_default()
                        .extend(committed);
                }
                true
            }
            (op, AckType::Cumulative) => match self.cumulative {
                Some((owner, _)) if owner == t => {
                    self.cumulative = None;
                    let p = self.cumulative_commit_to;
                    if op == PendingAckOp::Commit {
                        self.committed_unindexed
                            .entry(t)
                            .or_default()
                            .push(CommittedAck::MarkDelete(p));
                    }
                    if op == PendingAckOp::Commit && p > self.mark_delete {
                        self.mark_delete = p;
                        self.deleted = self.deleted.split_off(&p);
                        self.deleted.remove(&p);
                        self.deleted_indexes = self.deleted_indexes.split_off(&p);
                        self.deleted_indexes.remove(&p);
                    }
                    true
                }
                _ => false,
            },
        }
    }

    /// Records that log entry `position` holds `records` (for trimming):
    /// ACKs make their txn unresolved in that entry, COMMIT/ABORT resolve
    /// the txn everywhere. Call [`PendingAckState::take_trim`] once the whole
    /// entry is indexed.
    pub fn index_log_entry(&mut self, position: Position, records: &[PendingAckRecord]) {
        let unresolved = self.log_unresolved.entry(position).or_default();
        for r in records {
            if r.op == PendingAckOp::Ack {
                unresolved.insert(r.txn_id);
                self.txn_log_entries
                    .entry(r.txn_id)
                    .or_default()
                    .insert(position);
            }
        }
        for r in records {
            if r.op != PendingAckOp::Ack {
                let entries = self.txn_log_entries.remove(&r.txn_id);
                // The commit is re-applied by a replay only while the log
                // still holds the transaction's first ACK record: its
                // committed acks keep that entry (and so every later one)
                // until the subscription holds them durably.
                if let Some(acks) = self.committed_unindexed.remove(&r.txn_id) {
                    let first = entries
                        .as_ref()
                        .and_then(|e| e.first().copied())
                        .map_or(position, |e| e.min(position));
                    self.log_committed.entry(first).or_default().extend(acks);
                }
                for e in entries.into_iter().flatten() {
                    if let Some(set) = self.log_unresolved.get_mut(&e) {
                        set.remove(&r.txn_id);
                    }
                }
            }
        }
    }

    /// Forgets the prefix of indexed log entries whose transactions are all
    /// resolved and whose committed acks `subscription` holds durably, and
    /// returns the last of them: the position the pending-ack log may be
    /// mark-deleted (trimmed) to. `None` if nothing new. Never past a
    /// committed ack the subscription has not persisted: until then the
    /// untrimmed log is its only durable copy.
    pub fn take_trim(&mut self, subscription: &dyn SubscriptionView) -> Option<Position> {
        self.trim_prefix(&|a| subscription.holds_durably(a))
    }

    fn trim_prefix(&mut self, durable: &dyn Fn(&CommittedAck) -> bool) -> Option<Position> {
        let mut trim = None;
        while let Some(entry) = self.log_unresolved.first_entry() {
            if !entry.get().is_empty() {
                break;
            }
            let key = *entry.key();
            if let Some(acks) = self.log_committed.get_mut(&key) {
                acks.retain(|a| !durable(a));
                if !acks.is_empty() {
                    break;
                }
                self.log_committed.remove(&key);
            }
            trim = Some(key);
            entry.remove();
        }
        trim
    }

    /// The committed acks still recorded in the untrimmed log (in log
    /// order): a replay recovers them, and those the subscription does not
    /// hold durably must be re-applied to it.
    pub fn committed_acks(&self) -> Vec<CommittedAck> {
        self.log_committed.values().flatten().cloned().collect()
    }

    /// Applies the records of log entry `position` (as a replay does) and
    /// returns how far the log may be trimmed given what `subscription`
    /// holds durably ([`PendingAckState::take_trim`]).
    pub fn apply_log_entry(
        &mut self,
        position: Position,
        records: &[PendingAckRecord],
        subscription: &dyn SubscriptionView,
    ) -> Option<Position> {
        for r in records {
            self.apply(r);
        }
        self.index_log_entry(position, records);
        self.take_trim(subscription)
    }

    /// Records applied (that changed state) since creation.
    pub fn records_applied(&self) -> u64 {
        self.records_applied
    }

    /// Records skipped as duplicates or no-ops since creation.
    pub fn records_skipped(&self) -> u64 {
        self.records_skipped
    }

    /// The effects, for comparison with a reference model.
    pub fn summary(&self) -> PendingAckSummary {
        PendingAckSummary {
            individual: self
                .individual
                .iter()
                .map(|(t, m)| (*t, m.keys().copied().collect()))
                .collect(),
            batch_indexes: self
                .individual
                .iter()
                .filter_map(|(t, m)| {
                    let b: BTreeMap<Position, BTreeSet<u32>> = m
                        .iter()
                        .filter_map(|(p, h)| h.clone().map(|s| (*p, s)))
                        .collect();
                    (!b.is_empty()).then_some((*t, b))
                })
                .collect(),
            cumulative: self.cumulative,
            deleted: self.deleted.clone(),
            deleted_batch_indexes: self.deleted_indexes.clone(),
            mark_delete: self.mark_delete,
        }
    }

    /// The txn holding a pending whole-entry individual ack on `position`,
    /// if any.
    pub fn pending_owner(&self, position: Position) -> Option<TxnId> {
        self.position_acks.get(&position).and_then(|a| a.whole)
    }

    /// The txn holding a pending ack of batch index `index` of `position`.
    pub fn pending_index_owner(&self, position: Position, index: u32) -> Option<TxnId> {
        self.position_acks
            .get(&position)
            .and_then(|a| a.indexes.get(&index).copied())
    }
}

/// A replay into a state with no subscription (tools, models): no committed
/// ack counts as durable, so the log is never trimmed past a commit.
impl ReplaySink for PendingAckState {
    fn apply_entry(
        &mut self,
        position: Position,
        records: &[PendingAckRecord],
    ) -> Option<Position> {
        for r in records {
            self.apply(r);
        }
        self.index_log_entry(position, records);
        self.trim_prefix(&|_| false)
    }
}

/// A replay into the handle's state, trimming the log as far as the
/// handle's subscription holds the commits durably.
pub(crate) struct SubscribedState<'a> {
    pub(crate) state: &'a mut PendingAckState,
    pub(crate) subscription: &'a dyn SubscriptionView,
}

impl ReplaySink for SubscribedState<'_> {
    fn apply_entry(
        &mut self,
        position: Position,
        records: &[PendingAckRecord],
    ) -> Option<Position> {
        self.state
            .apply_log_entry(position, records, self.subscription)
    }
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests {
    use super::*;
    use crate::pending_ack::record::AckedPosition;
    use crate::pending_ack::subscription::CommittedAck;

    /// Ledger 5 holds every position of these tests.
    fn p(e: i64) -> Position {
        crate::test_support::p(5, e)
    }

    #[test]
    fn applied_and_skipped_records_are_counted() {
        let t1 = TxnId::new(0, 1);
        let t2 = TxnId::new(0, 2);
        let mut s = PendingAckState::default();
        let ack = |t, e| PendingAckRecord::individual_ack(t, vec![AckedPosition::whole(p(e))]);
        assert!(s.apply(&ack(t1, 1)));
        assert!(s.apply(&ack(t1, 2)));
        assert!(!s.apply(&ack(t2, 1)), "t1's pending ack: a conflict");
        assert!(!s.apply(&ack(t1, 1)), "a re-read duplicate");
        assert!(
            !s.apply(&PendingAckRecord::abort(t2, AckType::Individual)),
            "nothing held"
        );
        assert_eq!((s.records_applied(), s.records_skipped()), (2, 3));
    }

    #[test]
    fn a_cumulative_ack_conflicts_with_another_txns_and_with_its_own_at_or_below() {
        let t1 = TxnId::new(0, 1);
        let t2 = TxnId::new(0, 2);
        let mut s = PendingAckState::default();
        assert_eq!(
            s.apply_checked(&PendingAckRecord::cumulative_ack(t1, p(5))),
            Ok(true)
        );
        let holder = |r: Result<(), PendingAckError>| match r {
            Err(PendingAckError::AckConflict { holder, .. }) => holder,
            other => panic!("expected a conflict, got {other:?}"),
        };
        // Another transaction, even above t1's position.
        assert_eq!(
            holder(s.check(&PendingAckRecord::cumulative_ack(t2, p(9)))),
            Some(t1)
        );
        // t1 again, at or below its own pending position.
        for e in [3, 5] {
            assert_eq!(
                holder(s.check(&PendingAckRecord::cumulative_ack(t1, p(e)))),
                Some(t1)
            );
        }
        // t1 moving its cumulative ack forward.
        assert_eq!(s.check(&PendingAckRecord::cumulative_ack(t1, p(6))), Ok(()));
    }

    #[test]
    fn rereading_after_rewind_is_harmless() {
        let t1 = TxnId::new(0, 1);
        let t2 = TxnId::new(0, 2);
        let log = vec![
            PendingAckRecord::individual_ack(t1, vec![AckedPosition::whole(p(1))]),
            PendingAckRecord::commit(t1, AckType::Individual),
            PendingAckRecord::cumulative_ack(t1, p(3)),
            PendingAckRecord::commit(t1, AckType::Cumulative),
            PendingAckRecord::cumulative_ack(t2, p(7)),
            PendingAckRecord::individual_ack(t2, vec![AckedPosition::whole(p(9))]),
        ];
        let mut once = PendingAckState::default();
        for r in &log {
            once.apply(r);
        }
        let mut twice = PendingAckState::default();
        for r in log.iter().chain(log.iter()) {
            twice.apply(r);
        }
        assert_eq!(once.summary(), twice.summary());
        // The §4 caveat: re-reading COMMIT(t1, cumulative) must not commit t2.
        assert_eq!(twice.summary().cumulative, Some((t2, p(7))));
        assert_eq!(twice.summary().mark_delete, p(3));
        assert_eq!(twice.pending_owner(p(9)), Some(t2));
        assert!(
            twice.summary().deleted.is_empty(),
            "p(1) <= mark-delete is pruned"
        );
    }

    #[test]
    fn trim_stops_at_first_unresolved_entry_and_at_commits_the_subscription_has_not_persisted() {
        use crate::pending_ack::subscription::{MemorySubscription, SubscriptionView};
        let t1 = TxnId::new(0, 1);
        let t2 = TxnId::new(0, 2);
        let sub = MemorySubscription::default();
        let mut s = PendingAckState::default();
        let ack = |t, e| PendingAckRecord::individual_ack(t, vec![AckedPosition::whole(p(e))]);
        let l = |e| Position::new(1, e);
        assert_eq!(s.apply_log_entry(l(0), &[ack(t1, 1)], &sub), None);
        assert_eq!(s.apply_log_entry(l(1), &[ack(t2, 2)], &sub), None);
        let c1 = PendingAckRecord::commit(t1, AckType::Individual);
        assert_eq!(
            s.apply_log_entry(l(2), &[c1], &sub),
            None,
            "t1's commit is not in the subscription's durable state"
        );
        assert_eq!(s.committed_acks(), vec![CommittedAck::Entry(p(1))]);
        // Applied to the subscription but not persisted: still kept.
        sub.apply(&CommittedAck::Entry(p(1)));
        assert!(sub.is_deleted(p(1), None));
        assert_eq!(s.take_trim(&sub), None);
        sub.persist();
        assert_eq!(s.take_trim(&sub), Some(l(0)), "t2 still pending at l(1)");
        assert!(s.committed_acks().is_empty());
        let a2 = PendingAckRecord::abort(t2, AckType::Individual);
        assert_eq!(s.apply_log_entry(l(3), &[a2], &sub), Some(l(3)));
    }

    #[test]
    fn a_replay_without_a_subscription_never_trims_past_a_commit() {
        let t1 = TxnId::new(0, 1);
        let t2 = TxnId::new(0, 2);
        let mut s = PendingAckState::default();
        let ack = |t, e| PendingAckRecord::individual_ack(t, vec![AckedPosition::whole(p(e))]);
        let l = |e| Position::new(1, e);
        assert_eq!(s.apply_entry(l(0), &[ack(t1, 1)]), None);
        let a1 = PendingAckRecord::abort(t1, AckType::Individual);
        assert_eq!(
            s.apply_entry(l(1), &[a1]),
            Some(l(1)),
            "aborted: nothing to keep"
        );
        assert_eq!(s.apply_entry(l(2), &[ack(t2, 2)]), None);
        let c2 = PendingAckRecord::commit(t2, AckType::Individual);
        assert_eq!(s.apply_entry(l(3), &[c2]), None);
    }
}
