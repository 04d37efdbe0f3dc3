//! Skip APIs of the deletion state against a `BTreeSet<Position>` oracle
//! (proptest), and the read-scheduling scan's hop over deleted runs: the
//! work of `read_entries_with_skip_runs` is per deleted run, not per
//! deleted entry (Pulsar PR #26299).
#![cfg(not(any(loom, feature = "shuttle")))]

use std::collections::BTreeSet;
use std::sync::Arc;

use proptest::prelude::*;
use pulsar_core::deletion::{CursorDeletionState, LedgerLayout, SkipDeleted, SkipMode};
use pulsar_core::ledger::{LedgerConfig, ManagedLedger, MemoryStore};
use pulsar_core::Position;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The oracle: the layout's positions and the acknowledged set.
struct Oracle {
    positions: Vec<Position>,
    acked: BTreeSet<Position>,
}

impl Oracle {
    fn deleted(&self, md: Position, p: Position) -> bool {
        p <= md || self.acked.contains(&p)
    }
    fn individually_deleted(&self, md: Position, p: Position) -> bool {
        p > md && self.acked.contains(&p)
    }
    fn last(&self) -> Position {
        *self.positions.last().unwrap()
    }
}

/// Mark-delete after Pulsar's advance: through every following deleted
/// position (positions holding entries only).
fn extend(o: &Oracle, mut md: Position) -> Position {
    let from = md;
    for p in o.positions.iter().filter(|p| **p > from) {
        if o.acked.contains(p) {
            md = *p;
        } else {
            break;
        }
    }
    md
}

fn layout_and_acks() -> impl Strategy<Value = (Vec<u32>, Vec<(usize, u32)>, u32)> {
    (
        proptest::collection::vec(1u32..40, 1..4),
        proptest::collection::vec((0usize..3, 0u32..40), 0..80),
        0u32..50,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn skip_apis_agree_with_the_oracle((sizes, acks, n) in layout_and_acks()) {
        let layout = LedgerLayout::new(sizes.iter().enumerate().map(|(i, n)| (i as i64 + 1, *n)));
        let positions: Vec<Position> = sizes
            .iter()
            .enumerate()
            .flat_map(|(i, n)| (0..*n as i64).map(move |e| Position::new(i as i64 + 1, e)))
            .collect();
        let acked: BTreeSet<Position> = acks
            .iter()
            .filter(|(l, _)| *l < sizes.len())
            .map(|(l, e)| Position::new(*l as i64 + 1, i64::from(*e % sizes[*l])))
            .collect();
        let o = Oracle { positions, acked };
        let state = CursorDeletionState::new(Position::new(1, -1)).unwrap();
        let group: Vec<Position> = o.acked.iter().copied().collect();
        state.delete(&group, &layout).unwrap();
        let md = state.mark_delete_position();
        prop_assert_eq!(md, extend(&o, Position::new(1, -1)));

        // nth_undeleted: the nth live position after mark-delete.
        let live: Vec<Position> = o.positions.iter().copied().filter(|p| !o.deleted(md, *p)).collect();
        for k in 0..=live.len() as u64 + 1 {
            let want = if k == 0 { None } else { live.get(k as usize - 1).copied() };
            prop_assert_eq!(state.nth_undeleted(k, &layout), want, "n = {}", k);
        }

        for (i, a) in o.positions.iter().enumerate() {
            // cardinality_between(a, b) for every b >= a (same or later ledger).
            for b in o.positions[i..].iter().step_by(3) {
                let want = o.positions[i..]
                    .iter()
                    .take_while(|p| *p <= b)
                    .filter(|p| o.individually_deleted(md, **p))
                    .count() as u64;
                prop_assert_eq!(state.cardinality_between(*a, *b), want, "[{}, {}]", a, b);
            }
            // range_containing: the maximal run of the ledger holding a.
            let want_range = o.individually_deleted(md, *a).then(|| {
                let same: Vec<Position> = o.positions.iter().copied().filter(|p| p.ledger_id == a.ledger_id).collect();
                let at = same.iter().position(|p| p == a).unwrap();
                let mut s = at;
                while s > 0 && o.individually_deleted(md, same[s - 1]) { s -= 1; }
                let mut e = at;
                while e + 1 < same.len() && o.individually_deleted(md, same[e + 1]) { e += 1; }
                (same[s].previous_in_ledger(), same[e])
            });
            prop_assert_eq!(state.range_containing(*a), want_range, "{}", a);
            // deleted_run_end: the last deleted entry of the run from a.
            let want_end = o.deleted(md, *a).then(|| {
                if a.ledger_id < md.ledger_id {
                    return i64::MAX;
                }
                let mut e = a.entry_id;
                while o.deleted(md, Position::new(a.ledger_id, e + 1))
                    && (Position::new(a.ledger_id, e + 1) <= md
                        || o.acked.contains(&Position::new(a.ledger_id, e + 1)))
                {
                    e += 1;
                }
                e
            });
            prop_assert_eq!(state.deleted_run_end(a.ledger_id, a.entry_id), want_end, "{}", a);
        }

        // skip_entries on copies of the state, both modes.
        for mode in [SkipMode::Include, SkipMode::Exclude] {
            let copy = CursorDeletionState::from_snapshot(state.snapshot()).unwrap();
            let got = copy.skip_entries(u64::from(n), mode, &layout).unwrap();
            let target = if n == 0 {
                md
            } else {
                match mode {
                    SkipMode::Include => o
                        .positions
                        .iter()
                        .copied()
                        .filter(|p| *p > md)
                        .nth(n as usize - 1)
                        .unwrap_or(o.last()),
                    SkipMode::Exclude => live.get(n as usize - 1).copied().unwrap_or(o.last()),
                }
            };
            let want = if target > md { extend(&o, target) } else { md };
            prop_assert_eq!(got, want, "{:?} n = {}", mode, n);
            prop_assert_eq!(copy.mark_delete_position(), want);
            // Everything at or below the new mark-delete is deleted, the rest unchanged.
            for p in &o.positions {
                prop_assert_eq!(copy.is_message_deleted(*p), *p <= want || o.acked.contains(p));
            }
        }
    }
}

fn ledger_with(entries: usize) -> Arc<ManagedLedger> {
    let ml = ManagedLedger::open(
        "hop",
        LedgerConfig {
            max_entries_per_ledger: 1_000_000,
            ..LedgerConfig::default()
        },
        Arc::new(MemoryStore::new()),
    )
    .unwrap();
    let payload: Vec<&[u8]> = vec![b"x"; 50_000];
    let mut left = entries;
    while left > 0 {
        let n = left.min(payload.len());
        ml.append_batch(&payload[..n]).unwrap();
        left -= n;
    }
    ml
}

#[test]
fn a_300k_deleted_run_behind_a_pinned_mark_delete_is_one_hop() {
    // Entry 0 unacknowledged pins mark-delete at (1,-1); entries
    // 1..=300,000 are acknowledged; entry 300,001 is live.
    let ml = ledger_with(300_002);
    let cursor = ml.open_cursor("sub").unwrap();
    let state = CursorDeletionState::new(cursor.mark_delete_position()).unwrap();
    let acked: Vec<Position> = (1..=300_000).map(|e| Position::new(1, e)).collect();
    state.delete(&acked, &*ml).unwrap();
    assert_eq!(state.mark_delete_position(), Position::new(1, -1));

    let mut skip = SkipDeleted::new(&state);
    let first = cursor.read_entries_with_skip_runs(100, &mut skip).unwrap();
    assert_eq!(first.len(), 1, "entry 0, then the run stops at entry 1");
    let next = cursor.read_entries_with_skip_runs(100, &mut skip).unwrap();
    assert_eq!(
        next.iter().map(|e| e.position).collect::<Vec<_>>(),
        vec![Position::new(1, 300_001)]
    );
    // O(number of ranges): one run query, a handful of hint lookups.
    assert_eq!(skip.run_queries, 1);
    // Entries 0 and 1 (first read), 1 again (skipped: the hop), 300,001.
    assert_eq!(skip.hint_calls, 4);

    // The per-entry predicate (no run ends) asks once per deleted entry.
    cursor.rewind();
    let mut calls = 0u64;
    let _ = cursor.read_entries_with_skip(100, |l, e| {
        calls += 1;
        state.is_deleted_for_read_scheduling(l, e)
    });
    let again = cursor
        .read_entries_with_skip(100, |l, e| {
            calls += 1;
            state.is_deleted_for_read_scheduling(l, e)
        })
        .unwrap();
    assert_eq!(again[0].position, Position::new(1, 300_001));
    assert!(calls > 300_000, "{calls}");
}

#[test]
fn random_holes_are_read_exactly_with_work_per_run() {
    let ml = ledger_with(20_000);
    let cursor = ml.open_cursor("sub").unwrap();
    let state = CursorDeletionState::new(cursor.mark_delete_position()).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(26_299);
    let mut acked = BTreeSet::new();
    let mut e = 0i64;
    while e < 20_000 {
        let run = rng.random_range(1..200);
        if rng.random_bool(0.6) {
            acked.extend((e..(e + run).min(20_000)).map(|x| Position::new(1, x)));
        }
        e += run;
    }
    let group: Vec<Position> = acked.iter().copied().collect();
    state.delete(&group, &*ml).unwrap();
    let ranges = state.individually_deleted_ranges().len() as u64 + 1;
    let mut skip = SkipDeleted::new(&state);
    let mut read = Vec::new();
    let mut calls = 0u64;
    loop {
        let batch = cursor.read_entries_with_skip_runs(500, &mut skip).unwrap();
        calls += 1;
        if batch.is_empty() {
            break;
        }
        read.extend(batch.into_iter().map(|e| e.position));
    }
    let want: Vec<Position> = (0..20_000)
        .map(|e| Position::new(1, e))
        .filter(|p| !state.is_message_deleted(*p))
        .collect();
    assert_eq!(read, want);
    assert!(
        skip.run_queries <= ranges + calls,
        "{} runs, {ranges} ranges",
        skip.run_queries
    );
    assert!(
        skip.hint_calls <= read.len() as u64 + skip.run_queries + 2 * calls,
        "{} hint calls for {} entries read",
        skip.hint_calls,
        read.len()
    );
}

/// A managed ledger is a ledger topology like a fixed layout of the same
/// shape: counting and skipping positions across its ledgers (three entries
/// each here) gives the same positions.
#[test]
fn a_managed_ledger_counts_positions_across_its_ledgers() {
    let ml = ManagedLedger::open(
        "topology",
        LedgerConfig {
            max_entries_per_ledger: 3,
            ..LedgerConfig::default()
        },
        Arc::new(MemoryStore::new()),
    )
    .unwrap();
    let appended = ml.append_batch(&[&b"x"[..]; 8]).unwrap();
    let mut shape: Vec<(i64, u32)> = Vec::new();
    for p in &appended {
        match shape.last_mut() {
            Some((l, n)) if *l == p.ledger_id => *n += 1,
            _ => shape.push((p.ledger_id, 1)),
        }
    }
    assert!(shape.len() >= 3, "8 entries in ledgers of 3: {shape:?}");
    let layout = LedgerLayout::new(shape.iter().copied());
    let acked = [appended[1], appended[3], appended[4]];
    let on_ml = CursorDeletionState::new(Position::new(appended[0].ledger_id, -1)).unwrap();
    let on_layout = CursorDeletionState::new(Position::new(appended[0].ledger_id, -1)).unwrap();
    on_ml.delete(&acked, &*ml).unwrap();
    on_layout.delete(&acked, &layout).unwrap();
    // Undeleted: entries 0, 2, 5, 6, 7.
    let undeleted = [0, 2, 5, 6, 7].map(|i| appended[i]);
    for (n, want) in undeleted.iter().enumerate() {
        let n = n as u64 + 1;
        assert_eq!(on_ml.nth_undeleted(n, &*ml), Some(*want), "n = {n}");
        assert_eq!(on_layout.nth_undeleted(n, &layout), Some(*want));
    }
    assert_eq!(on_ml.nth_undeleted(6, &*ml), None);
    // Skipping 3 undeleted entries acknowledges 0, 2, 5 (and 3, 4 with them).
    let md = on_ml.skip_entries(3, SkipMode::Exclude, &*ml).unwrap();
    assert_eq!(md, appended[5]);
    assert_eq!(
        on_layout
            .skip_entries(3, SkipMode::Exclude, &layout)
            .unwrap(),
        md
    );
    // Skipping 2 more positions, deleted or not, reaches entry 7.
    assert_eq!(
        on_ml.skip_entries(2, SkipMode::Include, &*ml).unwrap(),
        appended[7]
    );
}

/// Skips over a managed ledger count its ledgers' entries (Pulsar's
/// `getNumberOfEntries` across a rollover): skipping 4 from the start of two
/// ledgers of 3 entries lands on the second ledger's entry 0, and skipping
/// undeleted entries passes over an acknowledged one.
#[test]
fn skips_count_the_managed_ledgers_entries_across_a_rollover() {
    let ml = ManagedLedger::open(
        "skip-rollover",
        LedgerConfig {
            max_entries_per_ledger: 3,
            ..LedgerConfig::default()
        },
        Arc::new(MemoryStore::new()),
    )
    .unwrap();
    let ps: Vec<Position> = (0..6).map(|_| ml.append(b"x").unwrap()).collect();
    assert_ne!(ps[2].ledger_id, ps[3].ledger_id, "rolled over");
    let first = CursorDeletionState::new(Position::new(ps[0].ledger_id, -1)).unwrap();
    assert_eq!(
        first.skip_entries(4, SkipMode::Include, &*ml).unwrap(),
        ps[3]
    );
    let second = CursorDeletionState::new(Position::new(ps[0].ledger_id, -1)).unwrap();
    second.delete(&[ps[1]], &*ml).unwrap();
    assert_eq!(
        second.skip_entries(2, SkipMode::Exclude, &*ml).unwrap(),
        ps[2]
    );
}
