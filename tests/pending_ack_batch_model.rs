//! proptest: batch-index pending acks (`PendingAckState::check` / `apply`)
//! against a simple reference model of one batch entry (the same rules as
//! `specs/PendingAckReplayBatch.tla`): an index is held by at most one txn,
//! an ack conflicts exactly when one of its indexes is pending or deleted,
//! commit deletes only the committing txn's indexes, abort frees them; and
//! replaying the log the handle would have written rebuilds the same state.
#![cfg(not(any(loom, feature = "shuttle")))]

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use pulsar_core::pending_ack::*;
use pulsar_core::Position;

const K: u32 = 6;

#[derive(Debug, Clone)]
enum Op {
    Ack(u64, BTreeSet<u32>),
    Commit(u64),
    Abort(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1u64..4, prop::collection::btree_set(0..K, 1..=3)).prop_map(|(t, s)| Op::Ack(t, s)),
        1 => (1u64..4).prop_map(Op::Commit),
        1 => (1u64..4).prop_map(Op::Abort),
    ]
}

#[derive(Default, Debug)]
struct Model {
    owner: BTreeMap<u32, u64>,
    deleted: BTreeSet<u32>,
}

impl Model {
    /// Returns whether the ack is accepted.
    fn ack(&mut self, t: u64, s: &BTreeSet<u32>) -> bool {
        if s.iter()
            .any(|i| self.owner.contains_key(i) || self.deleted.contains(i))
        {
            return false;
        }
        for i in s {
            self.owner.insert(*i, t);
        }
        true
    }

    fn end(&mut self, t: u64, commit: bool) {
        let mine: Vec<u32> = self
            .owner
            .iter()
            .filter(|(_, o)| **o == t)
            .map(|(i, _)| *i)
            .collect();
        for i in mine {
            self.owner.remove(&i);
            if commit {
                self.deleted.insert(i);
            }
        }
    }
}

fn entry() -> Position {
    Position::new(7, 3)
}

fn record(op: &Op) -> PendingAckRecord {
    match op {
        Op::Ack(t, s) => {
            let idx: Vec<u32> = s.iter().copied().collect();
            PendingAckRecord::individual_ack(
                TxnId::new(0, *t),
                vec![AckedPosition::batch_indexes(entry(), K as i32, &idx).unwrap()],
            )
        }
        Op::Commit(t) => PendingAckRecord::commit(TxnId::new(0, *t), AckType::Individual),
        Op::Abort(t) => PendingAckRecord::abort(TxnId::new(0, *t), AckType::Individual),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn batch_index_acks_match_the_reference_model(ops in prop::collection::vec(op(), 0..24)) {
        let mut state = PendingAckState::default();
        let mut model = Model::default();
        let mut log = Vec::new();
        let mut resolved = BTreeSet::new();
        for o in &ops {
            // A transaction ends once (Pulsar never reuses a txn id).
            let t = match o { Op::Ack(t, _) | Op::Commit(t) | Op::Abort(t) => *t };
            if resolved.contains(&t) {
                continue;
            }
            if !matches!(o, Op::Ack(..)) {
                resolved.insert(t);
            }
            let r = record(o);
            let got = state.apply_checked(&r);
            match o {
                Op::Ack(t, s) => {
                    let accepted = model.ack(*t, s);
                    prop_assert_eq!(got.is_ok(), accepted, "ack {:?}: {:?}", o, got);
                    if let Err(e) = &got {
                        prop_assert!(matches!(e, PendingAckError::AckConflict { .. }), "{}", e);
                    }
                    if accepted {
                        log.push(r);
                    }
                }
                Op::Commit(t) => { model.end(*t, true); log.push(r); }
                Op::Abort(t) => { model.end(*t, false); log.push(r); }
            }
            for i in 0..K {
                prop_assert_eq!(
                    state.pending_index_owner(entry(), i).map(|t| t.least_sig_bits),
                    model.owner.get(&i).copied(),
                    "owner of index {}", i
                );
            }
            let s = state.summary();
            let deleted: BTreeSet<u32> = if s.deleted.contains(&entry()) {
                (0..K).collect()
            } else {
                s.deleted_batch_indexes.get(&entry()).cloned().unwrap_or_default()
            };
            prop_assert_eq!(&deleted, &model.deleted);
        }
        // Replaying what was logged (twice: a rewind re-reads) rebuilds it.
        let mut replayed = PendingAckState::default();
        for r in log.iter().chain(log.iter()) {
            replayed.apply(r);
        }
        let (a, b) = (replayed.summary(), state.summary());
        prop_assert_eq!(a.batch_indexes, b.batch_indexes);
        prop_assert_eq!(a.individual, b.individual);
    }
}

/// The model is not trivial: some acks are refused, some accepted.
#[test]
fn reference_model_refuses_and_accepts() {
    let mut m = Model::default();
    assert!(m.ack(1, &BTreeSet::from([0, 1])));
    assert!(m.ack(2, &BTreeSet::from([2])));
    assert!(!m.ack(3, &BTreeSet::from([1, 3])));
    m.end(1, true);
    assert!(!m.ack(3, &BTreeSet::from([0])));
    assert!(m.ack(3, &BTreeSet::from([3])));
}
