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
//! * COMMIT/ABORT — looked up by txn id; a txn that is gone is a no-op.

use std::collections::{BTreeMap, BTreeSet};

use super::record::{AckType, AckedPosition, PendingAckOp, PendingAckRecord, TxnId};
use super::replay::ReplaySink;
use crate::position::Position;

/// Pending transactional acks of one subscription plus the subscription
/// effects of committed transactions. Owned by the handle under a lock;
/// mutated by the replay thread and by persisted appends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingAckState {
    individual: BTreeMap<TxnId, BTreeMap<Position, AckedPosition>>,
    position_owner: BTreeMap<Position, TxnId>,
    cumulative: Option<(TxnId, Position)>,
    deleted: BTreeSet<Position>,
    mark_delete: Position,
    log_unresolved: BTreeMap<Position, BTreeSet<TxnId>>,
    txn_log_entries: BTreeMap<TxnId, BTreeSet<Position>>,
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
    /// Pending individual acks: txn → positions.
    pub individual: BTreeMap<TxnId, BTreeSet<Position>>,
    /// The pending cumulative ack, if any.
    pub cumulative: Option<(TxnId, Position)>,
    /// Positions deleted individually by committed transactions.
    pub deleted: BTreeSet<Position>,
    /// Subscription mark-delete moved by committed cumulative acks.
    pub mark_delete: Position,
}

impl PendingAckState {
    /// Empty state for a subscription whose mark-delete is `mark_delete`.
    pub fn new(mark_delete: Position) -> Self {
        Self {
            individual: BTreeMap::new(),
            position_owner: BTreeMap::new(),
            cumulative: None,
            deleted: BTreeSet::new(),
            mark_delete,
            log_unresolved: BTreeMap::new(),
            txn_log_entries: BTreeMap::new(),
            records_applied: 0,
            records_skipped: 0,
        }
    }

    /// Applies one record (idempotent, see the module docs). Returns whether
    /// it changed anything.
    pub fn apply(&mut self, record: &PendingAckRecord) -> bool {
        let changed = self.apply_inner(record);
        if changed {
            self.records_applied += 1;
        } else {
            self.records_skipped += 1;
        }
        changed
    }

    fn apply_inner(&mut self, r: &PendingAckRecord) -> bool {
        let t = r.txn_id;
        match (r.op, r.ack_type) {
            (PendingAckOp::Ack, AckType::Individual) => {
                let clash = r.positions.iter().any(|p| {
                    p.position <= self.mark_delete
                        || self.deleted.contains(&p.position)
                        || self.position_owner.contains_key(&p.position)
                });
                if clash {
                    return false;
                }
                let acks = self.individual.entry(t).or_default();
                for p in &r.positions {
                    acks.insert(p.position, p.clone());
                    self.position_owner.insert(p.position, t);
                }
                true
            }
            (PendingAckOp::Ack, AckType::Cumulative) => {
                let Some(p) = r.positions.first().map(|p| p.position) else {
                    return false;
                };
                if p <= self.mark_delete {
                    return false;
                }
                match self.cumulative {
                    None => {
                        self.cumulative = Some((t, p));
                        true
                    }
                    Some((owner, q)) if owner == t && p > q => {
                        self.cumulative = Some((t, p));
                        true
                    }
                    _ => false,
                }
            }
            (op, AckType::Individual) => {
                let Some(acks) = self.individual.remove(&t) else {
                    return false;
                };
                for p in acks.keys() {
                    self.position_owner.remove(p);
                    if op == PendingAckOp::Commit {
                        self.deleted.insert(*p);
                    }
                }
                true
            }
            (op, AckType::Cumulative) => match self.cumulative {
                Some((owner, p)) if owner == t => {
                    self.cumulative = None;
                    if op == PendingAckOp::Commit && p > self.mark_delete {
                        self.mark_delete = p;
                        self.deleted = self.deleted.split_off(&p);
                        self.deleted.remove(&p);
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
                if let Some(entries) = self.txn_log_entries.remove(&r.txn_id) {
                    for e in entries {
                        if let Some(set) = self.log_unresolved.get_mut(&e) {
                            set.remove(&r.txn_id);
                        }
                    }
                }
            }
        }
    }

    /// Forgets the prefix of indexed log entries whose transactions are all
    /// resolved and returns the last of them: the position the pending-ack
    /// log may be mark-deleted (trimmed) to. `None` if nothing new.
    pub fn take_trim(&mut self) -> Option<Position> {
        let mut trim = None;
        while let Some(entry) = self.log_unresolved.first_entry() {
            if !entry.get().is_empty() {
                break;
            }
            trim = Some(*entry.key());
            entry.remove();
        }
        trim
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
            cumulative: self.cumulative,
            deleted: self.deleted.clone(),
            mark_delete: self.mark_delete,
        }
    }

    /// The txn holding a pending individual ack on `position`, if any.
    pub fn pending_owner(&self, position: Position) -> Option<TxnId> {
        self.position_owner.get(&position).copied()
    }
}

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
        self.take_trim()
    }
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests {
    use super::*;

    fn p(e: i64) -> Position {
        Position::new(5, e)
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
    fn trim_stops_at_first_unresolved_entry() {
        let t1 = TxnId::new(0, 1);
        let t2 = TxnId::new(0, 2);
        let mut s = PendingAckState::default();
        let ack = |t, e| PendingAckRecord::individual_ack(t, vec![AckedPosition::whole(p(e))]);
        assert_eq!(s.apply_entry(Position::new(1, 0), &[ack(t1, 1)]), None);
        assert_eq!(s.apply_entry(Position::new(1, 1), &[ack(t2, 2)]), None);
        let c1 = PendingAckRecord::commit(t1, AckType::Individual);
        assert_eq!(
            s.apply_entry(Position::new(1, 2), &[c1]),
            Some(Position::new(1, 0))
        );
        let a2 = PendingAckRecord::abort(t2, AckType::Individual);
        assert_eq!(
            s.apply_entry(Position::new(1, 3), &[a2]),
            Some(Position::new(1, 3))
        );
    }
}
