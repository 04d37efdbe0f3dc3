//! proptest: `PositionRangeSet` against a `BTreeSet<Position>` oracle over
//! random add / remove / remove_at_most / contains / contains_any /
//! cardinality sequences, switching ledgers, with entry ids at the edges
//! (0, 2^31−1, 2^31, u32::MAX) and invalid ids (typed error, set unchanged).
#![cfg(not(any(loom, feature = "shuttle")))]

mod common;
use common::{deleted_ranges, p};

use std::collections::BTreeSet;

use proptest::prelude::*;
use pulsar_core::deletion::{PositionRangeSet, RangeSetError};
use pulsar_core::Position;

const U32_MAX: i64 = u32::MAX as i64;

/// Entries of each ledger live in a small window so that the oracle stays
/// small even when a cross-ledger add fills a ledger from entry 0: ledgers
/// 3 and 4 start at 0, ledger 5 straddles entry 4,096 (a boundary of the
/// lock-free mirror's words and chunks), ledger 6 straddles 65,536 (the
/// mirror's end: above it the hint reads the roaring bitmap), ledger 2
/// straddles 2^31−1, ledger 1 ends at u32::MAX.
fn base(ledger: i64) -> i64 {
    match ledger {
        1 => U32_MAX - 11,
        2 => (1i64 << 31) - 6,
        5 => 4096 - 6,
        6 => 65_536 - 6,
        _ => 0,
    }
}

fn entry(ledger: i64, off: i64) -> i64 {
    base(ledger) + off // off in -1..12 → within -1..=u32::MAX
}

#[derive(Debug, Clone)]
enum Op {
    /// add_open_closed((l, base+lo-1), (l, base+hi)), lo <= hi
    AddSame(i64, i64, i64),
    /// add_open_closed((a, base+x-1), (b, y)) with a < b, b ∈ {3, 4}
    AddCross(i64, i64, i64, i64),
    Add(i64, i64),
    RemoveSame(i64, i64, i64),
    RemoveCross(i64, i64, i64, i64),
    RemoveAtMost(i64, i64),
    /// Invalid entry id: must be a typed error and leave the set unchanged.
    AddInvalid(i64, i64),
    /// Persist with to_ranges and rebuild in place.
    Rebuild,
}

fn op() -> impl Strategy<Value = Op> {
    // Six ledgers: more than the directory's four summary slots, so that
    // both the slotted and the published-cell lookup paths are exercised.
    let l = 1i64..=6;
    let off = 0i64..12;
    prop_oneof![
        3 => (l.clone(), off.clone(), off.clone())
            .prop_map(|(l, a, b)| Op::AddSame(l, a.min(b), a.max(b))),
        1 => (1i64..=3, off.clone(), 3i64..=4, 0i64..12).prop_filter_map("a < b", |(a, x, b, y)| {
            (a < b).then_some(Op::AddCross(a, x, b, y))
        }),
        3 => (l.clone(), off.clone()).prop_map(|(l, o)| Op::Add(l, o)),
        2 => (l.clone(), off.clone(), off.clone())
            .prop_map(|(l, a, b)| Op::RemoveSame(l, a.min(b), a.max(b))),
        1 => (1i64..=3, off.clone(), 3i64..=4, 0i64..12).prop_filter_map("a < b", |(a, x, b, y)| {
            (a < b).then_some(Op::RemoveCross(a, x, b, y))
        }),
        1 => (l.clone(), off.clone()).prop_map(|(l, o)| Op::RemoveAtMost(l, o)),
        1 => (l, prop_oneof![Just(-2i64), Just(-1), Just(U32_MAX + 1), Just(i64::MAX)])
            .prop_map(|(l, e)| Op::AddInvalid(l, e)),
        1 => Just(Op::Rebuild),
    ]
}

fn max_in(oracle: &BTreeSet<Position>, l: i64) -> Option<i64> {
    oracle
        .range(p(l, 0)..=p(l, U32_MAX))
        .next_back()
        .map(|q| q.entry_id)
}

fn apply(set: &mut PositionRangeSet, oracle: &mut BTreeSet<Position>, op: &Op) {
    match *op {
        Op::AddSame(l, lo, hi) => {
            let (lower, upper) = (p(l, entry(l, lo) - 1), p(l, entry(l, hi)));
            set.add_open_closed(lower, upper).unwrap();
            for e in entry(l, lo)..=entry(l, hi) {
                oracle.insert(p(l, e));
            }
        }
        Op::AddCross(a, x, b, y) => {
            let lower = p(a, entry(a, x) - 1);
            set.add_open_closed(lower, p(b, y)).unwrap();
            if let Some(max) = max_in(oracle, a) {
                if max > lower.entry_id {
                    for e in lower.entry_id + 1..=max {
                        oracle.insert(p(a, e));
                    }
                }
            }
            for e in 0..=y {
                oracle.insert(p(b, e));
            }
        }
        Op::Add(l, o) => {
            set.add(p(l, entry(l, o))).unwrap();
            oracle.insert(p(l, entry(l, o)));
        }
        Op::RemoveSame(l, lo, hi) => {
            set.remove_closed(p(l, entry(l, lo)), p(l, entry(l, hi)))
                .unwrap();
            oracle.retain(|q| {
                !(q.ledger_id == l && q.entry_id >= entry(l, lo) && q.entry_id <= entry(l, hi))
            });
        }
        Op::RemoveCross(a, x, b, y) => {
            let lo = entry(a, x);
            set.remove_closed(p(a, lo), p(b, y)).unwrap();
            // Legacy quirk: the lower ledger keeps its highest entry.
            let max_a = max_in(oracle, a);
            oracle.retain(|q| {
                let in_a = q.ledger_id == a && q.entry_id >= lo && Some(q.entry_id) != max_a;
                let between = q.ledger_id > a && q.ledger_id < b;
                let in_b = q.ledger_id == b && q.entry_id <= y;
                !(in_a || between || in_b)
            });
        }
        Op::RemoveAtMost(l, o) => {
            let bound = p(l, entry(l, o) - 1);
            set.remove_at_most(bound.ledger_id, bound.entry_id).unwrap();
            oracle.retain(|q| *q > bound);
        }
        Op::AddInvalid(l, e) => {
            let before = set.ranges();
            let err = set.add(p(l, e)).unwrap_err();
            assert!(
                matches!(err, RangeSetError::EntryIdOutOfRange { .. }),
                "{err}"
            );
            if e != -1 {
                let err = set.add_open_closed(p(l, e), p(l + 1, 0)).unwrap_err();
                assert!(
                    matches!(err, RangeSetError::BoundOutOfRange { .. }),
                    "{err}"
                );
                let err = set.remove_at_most(l, e).unwrap_err();
                assert!(
                    matches!(err, RangeSetError::BoundOutOfRange { .. }),
                    "{err}"
                );
            }
            assert_eq!(set.ranges(), before, "failed op changed the set");
        }
        Op::Rebuild => {
            let persisted = set.to_ranges(usize::MAX);
            set.rebuild(&persisted).unwrap();
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn range_set_matches_btreeset_oracle(ops in prop::collection::vec(op(), 1..40)) {
        let mut set = PositionRangeSet::new();
        let dir = set.directory();
        let mut oracle = BTreeSet::new();
        for op in &ops {
            apply(&mut set, &mut oracle, op);
            let expected = deleted_ranges(&oracle);
            prop_assert_eq!(set.ranges(), expected.clone(), "after {:?}", op);
            prop_assert_eq!(set.cardinality(), oracle.len() as u64);
            prop_assert_eq!(set.is_empty(), oracle.is_empty());
            prop_assert_eq!(set.first_range(), expected.first().copied());
            prop_assert_eq!(set.last_range(), expected.last().copied());
            prop_assert_eq!(set.to_ranges(2), expected.iter().take(2).copied().collect::<Vec<_>>());
            for l in 1..=6 {
                for off in -1..13 {
                    let e = entry(l, off);
                    let member = oracle.contains(&p(l, e));
                    prop_assert_eq!(set.contains(l, e), member, "contains {}:{}", l, e);
                    // The published directory shares the live bitmaps; its
                    // lock-free read (the mirror below entry 65,536, the
                    // roaring bitmap above) equals the set when uncontended.
                    prop_assert_eq!(dir.contains(l, e), member, "directory {}:{}", l, e);
                    let last = e + 3;
                    let any = oracle.range(p(l, e)..=p(l, last)).next().is_some();
                    prop_assert_eq!(set.contains_any(l, e, last), any, "contains_any {}:{}..={}", l, e, last);
                }
            }
        }
    }
}
