//! Unit tests for the cursor module (std build only).

use super::*;
use crate::Position;

use crate::test_support::p;

#[test]
fn adjacent_acks_coalesce_into_one_open_closed_range() {
    let mut s = PositionRangeSet::new();
    for e in [3, 4, 5, 7] {
        s.add(p(1, e)).unwrap();
    }
    assert_eq!(s.ranges(), vec![(p(1, 2), p(1, 5)), (p(1, 6), p(1, 7))]);
    assert_eq!(s.cardinality(), 4);
    assert_eq!(s.range_count(), 2);
    assert_eq!(s.first_range(), Some((p(1, 2), p(1, 5))));
    assert_eq!(s.last_range(), Some((p(1, 6), p(1, 7))));
    assert!(s.contains(1, 4) && !s.contains(1, 6) && !s.contains(2, 4));
    assert!(s.contains_any(1, 6, 9) && !s.contains_any(1, 8, 100) && !s.contains_any(1, 6, 5));
}

#[test]
fn ranges_never_span_ledgers_and_entry_zero_reports_minus_one() {
    let mut s = PositionRangeSet::new();
    s.add_open_closed(p(1, 8), p(1, 9)).unwrap();
    s.add_open_closed(p(2, -1), p(2, 1)).unwrap();
    assert_eq!(s.ranges(), vec![(p(1, 8), p(1, 9)), (p(2, -1), p(2, 1))]);
}

#[test]
fn cross_ledger_add_extends_lower_ledger_only_if_it_has_a_later_bit() {
    // Lower ledger absent: nothing invented for it; upper gets 0..=y.
    let mut s = PositionRangeSet::new();
    s.add_open_closed(p(2, 10), p(4, 2)).unwrap();
    assert_eq!(s.ranges(), vec![(p(4, -1), p(4, 2))]);
    // Lower ledger has a bit after x: filled from x+1 up to its highest bit.
    let mut s = PositionRangeSet::new();
    s.add(p(2, 15)).unwrap();
    s.add_open_closed(p(2, 10), p(3, 0)).unwrap();
    assert_eq!(s.ranges(), vec![(p(2, 10), p(2, 15)), (p(3, -1), p(3, 0))]);
    // Lower ledger's highest bit is at or before x: untouched.
    let mut s = PositionRangeSet::new();
    s.add(p(2, 5)).unwrap();
    s.add_open_closed(p(2, 10), p(3, 0)).unwrap();
    assert_eq!(s.ranges(), vec![(p(2, 4), p(2, 5)), (p(3, -1), p(3, 0))]);
}

#[test]
fn cross_ledger_remove_keeps_highest_bit_of_lower_ledger() {
    let mut s = PositionRangeSet::new();
    for e in 0..10 {
        s.add(p(1, e)).unwrap();
        s.add(p(2, e)).unwrap();
        s.add(p(3, e)).unwrap();
    }
    s.remove_closed(p(1, 4), p(3, 2)).unwrap();
    // Ledger 1: 4..=8 cleared, 9 (its highest) kept; ledger 2 dropped; 3: 0..=2 cleared.
    assert_eq!(
        s.ranges(),
        vec![(p(1, -1), p(1, 3)), (p(1, 8), p(1, 9)), (p(3, 2), p(3, 9))]
    );
    s.remove_closed(p(3, 5), p(3, 5)).unwrap();
    assert!(!s.contains(3, 5));
}

#[test]
fn remove_at_most_drops_lower_ledgers_and_empty_bitmaps() {
    let mut s = PositionRangeSet::new();
    s.add(p(1, 1)).unwrap();
    s.add(p(2, 1)).unwrap();
    s.add(p(2, 5)).unwrap();
    s.remove_at_most(2, 1).unwrap();
    assert_eq!(s.ranges(), vec![(p(2, 4), p(2, 5))]);
    assert_eq!(s.ledger_count(), 1);
    s.remove_at_most(2, 5).unwrap();
    assert!(s.is_empty());
    assert_eq!(s.ledger_count(), 0);
    s.add(p(3, 0)).unwrap();
    s.remove_at_most(3, -1).unwrap();
    assert!(s.contains(3, 0));
}

#[test]
fn bad_entry_ids_are_typed_errors_and_leave_the_set_unchanged() {
    let mut s = PositionRangeSet::new();
    s.add(p(1, 1)).unwrap();
    let before = s.ranges();
    let max = i64::from(u32::MAX);
    assert!(matches!(
        s.add(p(1, max + 1)),
        Err(RangeSetError::EntryIdOutOfRange { entry_id, .. }) if entry_id == max + 1
    ));
    assert!(matches!(
        s.add(p(1, -1)),
        Err(RangeSetError::EntryIdOutOfRange { .. })
    ));
    assert!(matches!(
        s.add_open_closed(p(1, -2), p(1, 3)),
        Err(RangeSetError::BoundOutOfRange { .. })
    ));
    assert!(matches!(
        s.add_open_closed(p(1, 5), p(1, 5)),
        Err(RangeSetError::InvalidRange { .. })
    ));
    assert!(matches!(
        s.remove_closed(p(1, 5), p(1, 4)),
        Err(RangeSetError::InvalidRange { .. })
    ));
    assert!(matches!(
        s.remove_at_most(1, -7),
        Err(RangeSetError::BoundOutOfRange { .. })
    ));
    assert!(s
        .rebuild(&[(p(1, 0), p(1, 2)), (p(2, 0), p(2, max + 9))])
        .is_err());
    assert_eq!(s.ranges(), before);
    let msg = s.add(p(1, -5)).unwrap_err().to_string();
    assert!(msg.contains("outside 0..=4294967295"), "{msg}");
    // Edge ids are fine.
    s.add(p(7, max)).unwrap();
    s.add(p(7, 0)).unwrap();
    s.add(p(7, i64::from(i32::MAX))).unwrap();
    assert!(s.contains(7, max) && s.contains(7, 0) && s.contains(7, i64::from(i32::MAX)));
    assert!(!s.contains(7, max + 1) && !s.contains(7, -1));
    assert_eq!(s.last_range(), Some((p(7, max - 1), p(7, max))));
}

#[test]
fn persistence_shape_round_trips_and_caps() {
    let mut s = PositionRangeSet::new();
    for e in [0, 1, 5, 9] {
        s.add(p(1, e)).unwrap();
    }
    s.add(p(4, 2)).unwrap();
    let all = s.to_ranges(usize::MAX);
    assert_eq!(all.len(), 4);
    assert_eq!(s.to_ranges(2), all[..2].to_vec());
    let back = PositionRangeSet::from_ranges(&all).unwrap();
    assert_eq!(back.ranges(), all);
    assert_eq!(back.directory().ledger_count(), 2);
}

#[test]
fn directory_republished_on_new_ledger_only_and_invalidated_by_clear() {
    let mut s = PositionRangeSet::new();
    let d = s.directory();
    assert_eq!(d.ledger_count(), 0);
    s.add(p(1, 3)).unwrap();
    assert_eq!(d.ledger_count(), 1);
    assert!(d.contains(1, 3));
    s.add(p(1, 4)).unwrap(); // existing ledger: the shared bitmap changes in place
    assert!(d.contains(1, 4));
    assert_eq!(d.ledger_count(), 1);
    s.add(p(2, 0)).unwrap();
    assert_eq!(d.ledger_count(), 2);
    let old = d.ledger_count();
    s.remove_at_most(1, 10).unwrap(); // ledger 1 emptied and dropped: republished
    assert_eq!((old, d.ledger_count()), (2, 1));
    assert!(!d.contains(1, 3));
    s.clear();
    assert_eq!(d.ledger_count(), 0);
    assert!(!d.contains(2, 0));
}

fn layout() -> LedgerLayout {
    LedgerLayout::new([(1, 10), (2, 0), (3, 10)])
}

#[test]
fn grouped_delete_skips_already_deleted_and_advances_through_contiguous_ranges() {
    let l = layout();
    let st = CursorDeletionState::new(p(1, -1)).unwrap();
    let o = st.delete(&[p(1, 2), p(1, 3), p(1, 5)], &l).unwrap();
    assert_eq!(o.newly_deleted, 3);
    assert!(!o.mark_delete_advanced);
    let o = st.delete(&[p(1, 3), p(1, 0), p(1, 1)], &l).unwrap();
    assert_eq!((o.newly_deleted, o.already_deleted), (2, 1));
    assert_eq!(o.mark_delete, p(1, 3));
    assert!(o.mark_delete_advanced);
    assert_eq!(st.individually_deleted_ranges(), vec![(p(1, 4), p(1, 5))]);
    // Ledger 2 is empty: acking the rest of ledger 1 and (3,0) jumps across it.
    st.delete(&[p(3, 0), p(3, 1)], &l).unwrap();
    let o = st
        .delete(&[p(1, 4), p(1, 6), p(1, 7), p(1, 8), p(1, 9)], &l)
        .unwrap();
    assert_eq!(o.mark_delete, p(3, 1));
    assert!(st.individually_deleted_ranges().is_empty());
    assert_eq!(st.individually_deleted_count(), 0);
}

#[test]
fn delete_beyond_last_confirmed_is_rejected_atomically() {
    let l = layout();
    let st = CursorDeletionState::new(p(1, -1)).unwrap();
    let e = st.delete(&[p(1, 2), p(3, 10)], &l).unwrap_err();
    assert_eq!(
        e,
        DeletionError::BeyondLastConfirmed {
            position: p(3, 10),
            last_confirmed: p(3, 9)
        }
    );
    assert!(matches!(
        st.delete(&[p(1, 2), p(1, -1)], &l),
        Err(DeletionError::RangeSet(
            RangeSetError::EntryIdOutOfRange { .. }
        ))
    ));
    assert!(!st.is_message_deleted(p(1, 2)));
    assert!(st.individually_deleted_ranges().is_empty());
}

#[test]
fn mark_delete_refuses_backward_and_extends_forward() {
    let l = layout();
    let st = CursorDeletionState::new(p(1, -1)).unwrap();
    st.delete(&[p(1, 3), p(1, 4), p(1, 7)], &l).unwrap();
    assert_eq!(st.mark_delete(p(1, 2), &l).unwrap(), p(1, 4));
    assert_eq!(st.individually_deleted_ranges(), vec![(p(1, 6), p(1, 7))]);
    assert_eq!(
        st.mark_delete(p(1, 1), &l).unwrap_err(),
        DeletionError::MarkDeleteBackward {
            current: p(1, 4),
            requested: p(1, 1)
        }
    );
    assert!(matches!(
        st.mark_delete(p(3, 10), &l),
        Err(DeletionError::BeyondLastConfirmed { .. })
    ));
    assert_eq!(st.mark_delete_position(), p(1, 4));
}

#[test]
fn reset_moves_mark_delete_backward_clears_ranges_and_bumps_epoch() {
    let l = layout();
    let st = CursorDeletionState::new(p(1, -1)).unwrap();
    st.delete(&[p(1, 0), p(1, 1), p(1, 5), p(3, 2)], &l)
        .unwrap();
    assert!(st.is_deleted_for_read_scheduling(1, 5));
    assert!(st.is_deleted_for_read_scheduling(3, 2));
    assert_eq!(st.reset_epoch(), 0);
    assert_eq!(st.reset(p(1, 1), &l).unwrap(), p(1, 0));
    assert_eq!(st.reset_epoch(), 2);
    for (q, want) in [
        (p(1, 0), true),
        (p(1, 1), false),
        (p(1, 5), false),
        (p(3, 2), false),
    ] {
        assert_eq!(st.is_message_deleted(q), want, "{q}");
        let look = st.read_scheduling_lookup(q.ledger_id, q.entry_id);
        assert_eq!(look.deleted, want, "{q}");
        assert!(!look.fell_back);
    }
    // Forward reset too.
    assert_eq!(st.reset(p(3, 0), &l).unwrap(), p(3, -1));
    assert!(st.is_message_deleted(p(1, 9)) && !st.is_message_deleted(p(3, 0)));
    let err = st.reset(p(3, 11), &l).unwrap_err();
    assert_eq!(
        err,
        DeletionError::ResetBeyondEnd {
            requested: p(3, 11),
            last_confirmed: p(3, 9)
        }
    );
    assert!(err.to_string().contains("3:11"), "names the input: {err}");
    assert!(matches!(
        st.reset(p(3, -1), &l),
        Err(DeletionError::RangeSet(_))
    ));
    assert_eq!(st.reset_epoch(), 4);
}

#[test]
fn reset_to_a_position_without_an_entry_moves_to_the_next_one() {
    // Ledgers 1 and 3 (no ledger 2), 10 entries each.
    let l = LedgerLayout::new([(1, 10), (3, 10)]);
    let st = CursorDeletionState::new(p(1, -1)).unwrap();
    // A ledger the layout lacks: the next entry is (3,0).
    assert_eq!(st.reset(p(2, 5), &l).unwrap(), p(3, -1));
    // Past its ledger's end: the first entry of the next ledger.
    assert_eq!(st.reset(p(1, 15), &l).unwrap(), p(3, -1));
    // Before every ledger: from the first entry.
    assert_eq!(st.reset(p(-1, 0), &l).unwrap(), p(1, -1));
    // Just past the last confirmed entry: everything is deleted.
    assert_eq!(st.reset(p(3, 10), &l).unwrap(), p(3, 9));
    assert!(st.is_message_deleted(p(3, 9)));
    assert_eq!(st.reset_epoch(), 8);
}

#[test]
fn delete_rejects_a_negative_ledger_id_and_changes_nothing() {
    let l = layout();
    let st = CursorDeletionState::new(p(1, 2)).unwrap();
    let err = st.delete(&[p(1, 5), p(-1, 0)], &l).unwrap_err();
    assert_eq!(
        err,
        DeletionError::RangeSet(RangeSetError::NegativeLedgerId {
            ledger_id: -1,
            entry_id: 0
        })
    );
    assert!(err.to_string().contains("negative ledger id"), "{err}");
    assert!(!st.is_message_deleted(p(1, 5)));
    assert_eq!(st.mark_delete_position(), p(1, 2));
}

#[test]
fn mark_delete_snapshot_packs_or_falls_back_to_the_published_cell() {
    let big = 1i64 << 40;
    let l = LedgerLayout::new([(1, 10), (big, 10)]);
    let st = CursorDeletionState::new(p(1, -1)).unwrap();
    st.delete(&[p(1, 0)], &l).unwrap();
    assert!(st.is_deleted_for_read_scheduling(1, 0));
    // Unpackable ledger id: the mark-delete goes through the Published cell.
    st.mark_delete(p(big, 3), &l).unwrap();
    for (q, want) in [(p(1, 9), true), (p(big, 3), true), (p(big, 4), false)] {
        assert_eq!(
            st.is_deleted_for_read_scheduling(q.ledger_id, q.entry_id),
            want,
            "{q}"
        );
    }
    // Back to a packable one (reset backward).
    st.reset(p(1, 5), &l).unwrap();
    for (q, want) in [(p(1, 4), true), (p(1, 5), false), (p(big, 0), false)] {
        assert_eq!(
            st.is_deleted_for_read_scheduling(q.ledger_id, q.entry_id),
            want,
            "{q}"
        );
    }
    // Entry id u32::MAX does not pack either.
    let lx = LedgerLayout::new([(1, u32::MAX), (2, 1)]);
    let st = CursorDeletionState::new(p(1, i64::from(u32::MAX))).unwrap();
    assert!(st.is_deleted_for_read_scheduling(1, i64::from(u32::MAX)));
    assert!(!st.is_deleted_for_read_scheduling(2, 0));
    st.delete(&[p(2, 0)], &lx).unwrap();
    assert_eq!(st.mark_delete_position(), p(2, 0)); // packable again
    assert!(st.is_deleted_for_read_scheduling(2, 0));
}

#[test]
fn hint_agrees_with_authoritative_when_quiescent() {
    let l = LedgerLayout::new([(1, 64), (2, 64)]);
    let st = CursorDeletionState::new(p(1, -1)).unwrap();
    let acks: Vec<_> = (0..64).filter(|e| e % 3 != 1).map(|e| p(1, e)).collect();
    st.delete(&acks, &l).unwrap();
    st.delete(&[p(2, 7), p(2, 8)], &l).unwrap();
    for lg in 0..=3 {
        for e in -1..70 {
            assert_eq!(
                st.is_deleted_for_read_scheduling(lg, e),
                st.is_message_deleted(p(lg, e)),
                "{lg}:{e}"
            );
        }
    }
}

#[test]
fn filter_read_entries_drops_deleted_and_short_circuits() {
    let l = layout();
    let st = CursorDeletionState::new(p(1, 1)).unwrap();
    st.delete(&[p(1, 4), p(3, 2)], &l).unwrap();
    let batch: Vec<_> = (2..=6).map(|e| p(1, e)).collect();
    assert_eq!(
        st.filter_read_entries(batch, |x| *x),
        vec![p(1, 2), p(1, 3), p(1, 5), p(1, 6)]
    );
    let clean: Vec<_> = (5..=9).map(|e| p(1, e)).collect();
    assert_eq!(st.filter_read_entries(clean.clone(), |x| *x), clean);
    let mixed = vec![p(3, 2), p(1, 0), p(3, 3), p(1, 4)];
    assert_eq!(st.filter_read_entries(mixed, |x| *x), vec![p(3, 3)]);
    assert!(st
        .filter_read_entries(Vec::<Position>::new(), |x| *x)
        .is_empty());
}

#[test]
fn recover_trims_ranges_at_or_below_mark_delete() {
    let st =
        CursorDeletionState::recover(p(1, 5), &[(p(1, 2), p(1, 4)), (p(1, 6), p(1, 8))]).unwrap();
    assert_eq!(st.individually_deleted_ranges(), vec![(p(1, 6), p(1, 8))]);
    assert!(matches!(
        CursorDeletionState::new(p(1, -3)),
        Err(DeletionError::RangeSet(_))
    ));
}

#[test]
fn negative_ledger_ids_are_rejected_everywhere_a_member_is_named() {
    // i64::MIN is the free summary-slot marker, so a ledger with that id
    // would share a slot with the next new ledger: every negative ledger id
    // is rejected.
    for ledger in [-1, i64::MIN] {
        let err = CursorDeletionState::recover(p(ledger, -1), &[(p(ledger, -1), p(ledger, 5))])
            .unwrap_err();
        assert!(
            matches!(
                err,
                DeletionError::RangeSet(RangeSetError::NegativeLedgerId { .. })
            ),
            "{err}"
        );
        let mut set = PositionRangeSet::new();
        assert!(set.add(p(ledger, 5)).is_err());
        assert!(set.add_entries(ledger, &[5]).is_err());
        assert!(set.remove_closed(p(ledger, 1), p(ledger, 2)).is_err());
        assert!(set.is_empty() && set.ledger_count() == 0);
        // A negative ledger is fine as an open lower bound (EARLIEST-like).
        set.add_open_closed(p(ledger, -1), p(1, 2)).unwrap();
        assert_eq!(set.ranges(), vec![(p(1, -1), p(1, 2))]);
    }
    // Mark-delete may still be the EARLIEST sentinel.
    let st = CursorDeletionState::new(p(-1, -1)).unwrap();
    st.delete(&[p(1, 3)], &layout()).unwrap();
    assert!(st.is_deleted_for_read_scheduling(1, 3));
}

#[test]
fn cross_ledger_range_from_the_last_u32_entry_does_not_overflow() {
    // `(1:u32::MAX, 2:5]` holds nothing of ledger 1 past its last u32
    // entry: splitting it by ledger must not compute u32::MAX + 1.
    let max = i64::from(u32::MAX);
    let mut set = PositionRangeSet::new();
    set.add(p(1, max)).unwrap();
    set.add_open_closed(p(1, max), p(2, 5)).unwrap();
    assert_eq!(
        set.ranges(),
        vec![(p(1, max - 1), p(1, max)), (p(2, -1), p(2, 5))]
    );
    let rebuilt = PositionRangeSet::from_ranges(&[(p(1, max), p(2, 5))]).unwrap();
    assert_eq!(rebuilt.ranges(), vec![(p(2, -1), p(2, 5))]);
    let st = CursorDeletionState::recover(p(1, 0), &[(p(1, max), p(2, 5))]).unwrap();
    assert!(st.is_message_deleted(p(2, 5)) && !st.is_message_deleted(p(1, 5)));
    // rebuild validates before it clears: an invalid input leaves the set.
    let mut set = PositionRangeSet::from_ranges(&[(p(1, 1), p(1, 3))]).unwrap();
    assert!(set
        .rebuild(&[(p(1, 5), p(1, 9)), (p(-3, 1), p(-3, 2))])
        .is_err());
    assert_eq!(set.ranges(), vec![(p(1, 1), p(1, 3))]);
}

/// A layout's last confirmed entry is the last entry of its last non-empty
/// ledger; with no entry at all, `(first ledger, -1)` (`(-1, -1)` for no
/// ledger); `set_entries` grows or adds a ledger.
#[test]
fn ledger_layout_last_confirmed_entry_and_set_entries() {
    let mut l = LedgerLayout::new([(1, 3), (2, 0)]);
    assert_eq!(l.last_confirmed_entry(), p(1, 2));
    assert_eq!(l.next_valid_position(p(1, 2)), p(1, 3));
    l.set_entries(2, 2);
    assert_eq!(l.last_confirmed_entry(), p(2, 1));
    assert_eq!(l.next_valid_position(p(1, 2)), p(2, 0));
    l.set_entries(4, 1);
    assert_eq!(l.last_confirmed_entry(), p(4, 0));
    assert_eq!(
        LedgerLayout::new([(5, 0), (6, 0)]).last_confirmed_entry(),
        p(5, -1)
    );
    assert_eq!(LedgerLayout::new([]).last_confirmed_entry(), p(-1, -1));
}

/// Deleting the last confirmed entry itself is allowed; positions at or
/// below mark-delete are counted as already deleted; the count of
/// individually deleted entries follows the set.
#[test]
fn delete_at_the_bounds_and_the_individually_deleted_count() {
    let l = layout();
    let st = CursorDeletionState::new(p(1, -1)).unwrap();
    let o = st.delete(&[p(3, 9), p(1, 4), p(1, 5)], &l).unwrap();
    assert_eq!((o.newly_deleted, o.already_deleted), (3, 0));
    assert_eq!(st.individually_deleted_count(), 3);
    st.mark_delete(p(1, 1), &l).unwrap();
    let o = st.delete(&[p(1, 1), p(1, 0), p(1, 6)], &l).unwrap();
    assert_eq!(
        (o.newly_deleted, o.already_deleted),
        (1, 2),
        "(1,1) is the mark-delete, (1,0) below it"
    );
    assert_eq!(st.individually_deleted_count(), 4);
    assert_eq!(st.mark_delete_position(), p(1, 1));
}

/// A mark-delete bound must be an entry id of -1 or a u32: `new`,
/// `recover` and `mark_delete` refuse anything else with a typed error.
#[test]
fn mark_delete_bounds_out_of_range_are_typed_errors() {
    let bad = [p(1, -2), p(1, i64::from(u32::MAX) + 1)];
    for b in bad {
        assert!(matches!(
            CursorDeletionState::new(b),
            Err(DeletionError::RangeSet(
                RangeSetError::BoundOutOfRange { .. }
            ))
        ));
        assert!(matches!(
            CursorDeletionState::recover(b, &[]),
            Err(DeletionError::RangeSet(
                RangeSetError::BoundOutOfRange { .. }
            ))
        ));
    }
    let st = CursorDeletionState::new(p(1, -1)).unwrap();
    assert!(matches!(
        st.mark_delete(p(1, -2), &layout()),
        Err(DeletionError::RangeSet(
            RangeSetError::BoundOutOfRange { .. }
        ))
    ));
    assert_eq!(st.mark_delete_position(), p(1, -1));
}

/// The Debug form names the mark-delete, the individually deleted ranges
/// and the reset epoch.
#[test]
fn debug_shows_mark_delete_ranges_and_epoch() {
    let st = CursorDeletionState::new(p(1, 2)).unwrap();
    st.delete(&[p(1, 5)], &layout()).unwrap();
    let s = format!("{st:?}");
    assert!(s.starts_with("CursorDeletionState"), "{s}");
    for part in ["mark_delete", "individually_deleted", "reset_epoch: 0"] {
        assert!(s.contains(part), "{part} in {s}");
    }
    assert!(s.contains(&format!("{:?}", p(1, 2))), "{s}");
    assert!(s.contains("[(1:4, 1:5]]"), "the ranges, open-closed: {s}");
}

/// The directory's Debug form gives the number of ledgers it holds.
#[test]
fn directory_debug_counts_its_ledgers() {
    let mut s = PositionRangeSet::new();
    s.add(p(1, 3)).unwrap();
    s.add(p(4, 0)).unwrap();
    assert_eq!(
        format!("{:?}", s.directory()),
        "DeletionDirectory { ledgers: 2 }"
    );
}

/// Mark-delete may be set at the last confirmed entry itself (everything
/// acknowledged), not past it.
#[test]
fn mark_delete_at_the_last_confirmed_entry() {
    let st = CursorDeletionState::new(p(1, -1)).unwrap();
    assert_eq!(st.mark_delete(p(3, 9), &layout()), Ok(p(3, 9)));
    assert!(matches!(
        st.mark_delete(p(3, 10), &layout()),
        Err(DeletionError::BeyondLastConfirmed { .. })
    ));
}

/// The post-I/O filter drops every deleted entry of a batch in any order,
/// also one outside the span from the batch's first to its last entry, or
/// in another ledger between two of the first ledger's, or at or below
/// mark-delete.
#[test]
fn filter_read_entries_drops_deleted_entries_of_unsorted_and_mixed_batches() {
    let l = LedgerLayout::new([(1, 10), (2, 10)]);
    let st = CursorDeletionState::new(p(1, 4)).unwrap();
    st.delete(&[p(1, 7), p(2, 1)], &l).unwrap();
    let keep = |batch: Vec<Position>| st.filter_read_entries(batch, |p| *p);
    assert_eq!(keep(vec![p(1, 9), p(1, 7)]), vec![p(1, 9)], "descending");
    assert_eq!(
        keep(vec![p(2, 5), p(2, 1), p(2, 9)]),
        vec![p(2, 5), p(2, 9)],
        "unsorted within one ledger"
    );
    assert_eq!(
        keep(vec![p(2, 5), p(1, 7), p(2, 9)]),
        vec![p(2, 5), p(2, 9)],
        "another ledger's entry between"
    );
    assert_eq!(
        keep(vec![p(1, 4), p(1, 5)]),
        vec![p(1, 5)],
        "the mark-delete itself"
    );
    assert_eq!(
        keep(vec![p(1, 2), p(1, 3)]),
        Vec::<Position>::new(),
        "below it"
    );
    assert_eq!(keep(vec![p(1, 5), p(1, 6)]), vec![p(1, 5), p(1, 6)]);
}

/// Mark-delete set at its current position is accepted and changes nothing.
#[test]
fn mark_delete_at_the_current_position_is_a_no_op() {
    let st = CursorDeletionState::new(p(1, 3)).unwrap();
    st.delete(&[p(1, 6)], &layout()).unwrap();
    assert_eq!(st.mark_delete(p(1, 3), &layout()), Ok(p(1, 3)));
    assert_eq!(st.individually_deleted_ranges(), vec![(p(1, 5), p(1, 6))]);
    assert_eq!(st.reset_epoch(), 0);
    st.reset(p(1, 0), &layout()).unwrap();
    assert_eq!(st.reset_epoch(), 2, "one completed reset");
}

/// Runs `f` on its own thread and fails if it does not return within 5 s
/// (a spinning advance holds the cursor lock forever).
fn within_5s<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(5))
        .unwrap_or_else(|_| panic!("HANG: {what} did not return within 5 s"))
}

/// Ranges recovered past the topology's last entry (or left there by a
/// layout that shrank) do not make mark-delete advances loop: an advance
/// stops where the next position is not past mark-delete.
#[test]
fn advances_end_when_ranges_lie_past_the_last_entry() {
    let md = within_5s("mark_delete over ranges past the end", || {
        let st = CursorDeletionState::recover(p(1, -1), &[(p(1, -1), p(1, 6))]).unwrap();
        st.mark_delete(p(1, -1), &LedgerLayout::new([(1, 3)]))
            .unwrap()
    });
    assert!(md >= p(1, -1));
    let md = within_5s("delete after the layout shrank", || {
        let mut l = LedgerLayout::new([(1, 10)]);
        let st = CursorDeletionState::new(p(1, -1)).unwrap();
        st.delete(&[p(1, 3), p(1, 4), p(1, 5), p(1, 6)], &l)
            .unwrap();
        l.set_entries(1, 4);
        st.delete(&[p(1, 0), p(1, 1), p(1, 2)], &l).unwrap();
        st.mark_delete_position()
    });
    assert!(md >= p(1, 2), "{md}");
}

/// A batch spanning two ledgers goes through the full filter: an
/// acknowledged entry of the second ledger is dropped.
#[test]
fn filter_read_entries_checks_a_batch_ending_in_another_ledger() {
    let st = CursorDeletionState::new(p(1, 4)).unwrap();
    st.delete(&[p(2, 1)], &LedgerLayout::new([(1, 10), (2, 10)]))
        .unwrap();
    assert_eq!(
        st.filter_read_entries(vec![p(1, 5), p(2, 1)], |q| *q),
        vec![p(1, 5)]
    );
}

/// Ledger id 0 is a ledger like any other: its entries can be deleted and
/// looked up.
#[test]
fn ledger_zero_entries_are_members() {
    let l = LedgerLayout::new([(0, 5)]);
    let st = CursorDeletionState::new(p(0, -1)).unwrap();
    let o = st.delete(&[p(0, 2)], &l).unwrap();
    assert_eq!(o.newly_deleted, 1);
    assert!(st.is_message_deleted(p(0, 2)));
    assert_eq!(st.individually_deleted_ranges(), vec![(p(0, 1), p(0, 2))]);
}

/// A deletion state restored from a snapshot keeps ledger 0's entries (a
/// ledger like any other); a negative ledger id is refused.
#[test]
fn restore_keeps_ledger_zero_and_refuses_negative_ledgers() {
    let mut snapshot = DeletionSnapshot::new(p(0, -1));
    snapshot.ledgers.insert(0, [2u32, 3].into_iter().collect());
    let st = CursorDeletionState::from_snapshot(snapshot).unwrap();
    assert!(st.is_message_deleted(p(0, 2)) && !st.is_message_deleted(p(0, 1)));
    let restored = CursorDeletionState::new(p(0, -1)).unwrap();
    let mut again = DeletionSnapshot::new(p(0, -1));
    again.ledgers.insert(0, [3u32].into_iter().collect());
    restored.restore(again).unwrap();
    assert_eq!(
        restored.individually_deleted_ranges(),
        vec![(p(0, 2), p(0, 3))]
    );
    let mut bad = DeletionSnapshot::new(p(0, -1));
    bad.ledgers.insert(-1, [1u32].into_iter().collect());
    assert!(CursorDeletionState::from_snapshot(bad).is_err());
}

/// The closed window `[lower, upper]` counts an entry at either end, also
/// the largest entry id (u32::MAX); a window above it counts nothing.
#[test]
fn cardinality_between_counts_both_ends_up_to_the_largest_entry_id() {
    let max = i64::from(u32::MAX);
    let mut s = PositionRangeSet::new();
    for e in [0, 5, max] {
        s.add(p(1, e)).unwrap();
    }
    assert_eq!(s.cardinality_between(p(1, 0), p(1, 5)), 2);
    assert_eq!(s.cardinality_between(p(1, max), p(1, max)), 1);
    assert_eq!(s.cardinality_between(p(1, max + 1), p(2, 0)), 0);
    assert_eq!(s.cardinality_between(p(1, 6), p(1, 4)), 0, "empty window");
}

/// `DeletionSnapshot::normalize` keeps a batch ack set only for an entry
/// above mark-delete that is not already a whole deleted entry, and trims
/// the ack set's trailing zero words (an all-zero set stays as `[]`).
#[test]
fn normalize_keeps_only_ack_sets_of_undeleted_entries_above_mark_delete() {
    let mut s = DeletionSnapshot::new(p(3, 5));
    s.ledgers.insert(3, [7u32, 9].into_iter().collect());
    for (e, words) in [
        (4, vec![1i64]),     // below mark-delete
        (5, vec![1]),        // at mark-delete
        (6, vec![5, 0, 0]),  // above, undeleted: kept, trailing zeros trimmed
        (7, vec![1]),        // above, already a whole deleted entry
        (8, vec![0, 0]),     // above, undeleted, fully acknowledged: []
        (10, vec![0, 3, 0]), // inner zero word kept
    ] {
        s.batch_ack_sets.insert(p(3, e), words);
    }
    s.normalize();
    let kept: Vec<(Position, Vec<i64>)> = s.batch_ack_sets.into_iter().collect();
    assert_eq!(
        kept,
        vec![
            (p(3, 6), vec![5]),
            (p(3, 8), vec![]),
            (p(3, 10), vec![0, 3])
        ]
    );
}

/// `EpochOddIffResetting`: while a reset holds the write lock the epoch is
/// odd, so a lookup whose epoch re-check falls inside the reset falls back
/// to the locked check (which waits for the reset) instead of returning
/// what it computed from the state before the reset. The lookup reads
/// mark-delete 1:4 and pauses; the reset moves mark-delete back to 1:1; the
/// lookup of 1:3 resumes from inside the reset's write section. A lookup
/// that returned then would report 1:3 deleted while the reset un-deletes
/// it.
#[cfg(feature = "race-hooks")]
#[test]
fn a_lookup_rechecking_inside_a_reset_falls_back_and_waits() {
    use crate::sync::hook::{install, Point};
    use std::sync::mpsc::{channel, RecvTimeoutError};
    use std::time::Duration;

    let ledger = LedgerLayout::new([(1, 10)]);
    let state = std::sync::Arc::new(CursorDeletionState::new(p(1, 4)).unwrap());
    let (paused_tx, paused_rx) = channel::<()>();
    let (go_tx, go_rx) = channel::<()>();
    let (done_tx, done_rx) = channel();
    let reader = {
        let state = std::sync::Arc::clone(&state);
        std::thread::spawn(move || {
            let _hook = install(move |point| {
                if point == Point::SchedulingLookupAfterMarkDelete {
                    paused_tx.send(()).unwrap();
                    go_rx.recv_timeout(Duration::from_secs(10)).unwrap();
                }
            });
            let look = state.read_scheduling_lookup(1, 3);
            done_tx.send(look).unwrap();
        })
    };
    paused_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let done_rx = std::rc::Rc::new(done_rx);
    let returned_inside = std::rc::Rc::new(std::cell::Cell::new(None));
    {
        let (returned_inside, done_rx) = (returned_inside.clone(), done_rx.clone());
        let _hook = install(move |point| {
            if point == Point::ResetBeforeEnd {
                go_tx.send(()).unwrap();
                // The reader either returns now (inside the reset) or
                // blocks on the read lock this thread holds.
                match done_rx.recv_timeout(Duration::from_millis(300)) {
                    Ok(look) => returned_inside.set(Some(look)),
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(e) => panic!("reader gone: {e}"),
                }
            }
        });
        assert_eq!(state.reset(p(1, 2), &ledger).unwrap(), p(1, 1));
    }
    assert_eq!(
        returned_inside.get(),
        None,
        "a lookup returned a lock-free answer while a reset held the write lock"
    );
    let look = done_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    reader.join().unwrap();
    assert!(look.fell_back && !look.deleted, "{look:?}");
}

/// A restored snapshot's batch ack sets must name real entries: ledger 0
/// and entry 0 are valid, a negative ledger or an entry id outside u32 is a
/// typed error that leaves the state unchanged.
#[test]
fn restore_checks_the_positions_of_batch_ack_sets() {
    let with_ack_set = |at: Position| {
        let mut s = DeletionSnapshot::new(p(0, -1));
        s.batch_ack_sets.insert(at, vec![0b11]);
        s
    };
    let st = CursorDeletionState::from_snapshot(with_ack_set(p(0, 0))).unwrap();
    assert_eq!(st.batch_ack_set(p(0, 0)), Some(vec![0b11]));
    for bad in [p(-1, 3), p(0, -2), p(0, i64::from(u32::MAX) + 1)] {
        assert!(
            matches!(
                st.restore(with_ack_set(bad)),
                Err(DeletionError::RangeSet(
                    RangeSetError::EntryIdOutOfRange { .. }
                ))
            ),
            "{bad}"
        );
        assert!(CursorDeletionState::from_snapshot(with_ack_set(bad)).is_err());
        assert_eq!(
            st.batch_ack_set(p(0, 0)),
            Some(vec![0b11]),
            "unchanged after {bad}"
        );
    }
}

/// A layout's last confirmed entry is the last entry of the last ledger
/// holding one; trailing empty ledgers do not count, and a layout without
/// entries reports "before the first ledger's entry 0".
#[test]
fn layout_last_confirmed_entry_skips_empty_ledgers() {
    assert_eq!(
        LedgerLayout::new([(1, 5), (2, 0)]).last_confirmed_entry(),
        p(1, 4)
    );
    assert_eq!(
        LedgerLayout::new([(3, 0), (4, 0)]).last_confirmed_entry(),
        p(3, -1)
    );
    assert_eq!(LedgerLayout::new([]).last_confirmed_entry(), p(-1, -1));
}

/// The deletion state's Debug output shows mark-delete, the ranges and the
/// reset epoch.
#[test]
fn deletion_state_debug_names_its_parts() {
    let st = CursorDeletionState::recover(p(1, 4), &[(p(1, 6), p(1, 7))]).unwrap();
    let s = format!("{st:?}");
    for part in [
        "CursorDeletionState",
        "mark_delete",
        "individually_deleted",
        "reset_epoch",
    ] {
        assert!(s.contains(part), "{s}");
    }
}

/// The hint's mark-delete comparison (`MarkDeleteSeen::covers`: one u64
/// compare against the packed word when the query's ids fit in 32 bits)
/// equals `Position`'s order for every combination of boundary values:
/// negative ids, entry -1, the 2^31 / 2^32 edges of the packed form,
/// `u32::MAX`, the `i64` extremes, for packed and unpackable mark-deletes.
/// A `<=` in place of `<` on the keys, or a missing range check on either
/// half of the query, makes it fail.
#[test]
fn hint_mark_delete_comparison_equals_position_order_at_every_boundary() {
    let ledgers = [
        i64::MIN,
        -1,
        0,
        1,
        (1 << 31) - 1,
        1 << 31,
        (1 << 32) - 1,
        1 << 32,
        i64::MAX,
    ];
    let entries = [
        i64::MIN,
        -2,
        -1,
        0,
        1,
        i64::from(u32::MAX) - 1,
        i64::from(u32::MAX),
        1 << 32,
        i64::MAX,
    ];
    let mut checked = 0;
    for &ml in &ledgers {
        for &me in &entries {
            let md = Position::new(ml, me);
            for &l in &ledgers {
                for &e in &entries {
                    assert_eq!(
                        super::state::hint_covers_for_test(md, l, e),
                        Position::new(l, e) <= md,
                        "({l}, {e}) <= {md}"
                    );
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, 9 * 9 * 9 * 9);
}

/// The bounds filter of the lock-free lookup (`range_set::admits`, one
/// subtraction and one compare) admits exactly `min..=max`: at and around
/// both ends, at 0 and `u32::MAX`, for one-entry and full-width bounds; an
/// empty bitmap's bounds admit only `u32::MAX` (a needless read, never a
/// positive: the bits answer). Comparing against `max` with `<` instead of
/// `<=`, or without the wrapping subtraction, makes it fail.
#[test]
fn hint_bounds_filter_admits_exactly_min_to_max() {
    use super::range_set::{admits, encode_bounds as encode, EMPTY_BOUNDS};
    let edges = [
        0u32,
        1,
        2,
        100,
        65_535,
        65_536,
        u32::MAX - 2,
        u32::MAX - 1,
        u32::MAX,
    ];
    let mut checked = 0;
    for &min in &edges {
        for &max in edges.iter().filter(|&&m| m >= min) {
            let b = encode(min, max);
            let probes =
                edges
                    .iter()
                    .copied()
                    .chain([min.wrapping_sub(1), min, max, max.wrapping_add(1)]);
            for e in probes {
                assert_eq!(
                    admits(b, e),
                    (min..=max).contains(&e),
                    "{e} in {min}..={max}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 400);
    for e in edges {
        assert_eq!(
            admits(EMPTY_BOUNDS, e),
            e == u32::MAX,
            "{e} in the empty bounds"
        );
    }
}
