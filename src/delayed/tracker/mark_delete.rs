//! The subscription's mark-delete position: every acknowledged position is
//! untracked at once, so the count is exactly the pending delayed messages.

use super::{BucketDelayedDeliveryTracker, Inner};
use crate::position::Position;

impl BucketDelayedDeliveryTracker {
    /// Records the subscription's mark-delete position (Pulsar reads it from
    /// the cursor; call it after construction and whenever it advances): its
    /// ledger is `firstLive` for trim and for dropping orphaned queue entries,
    /// and every tracked position `<= position` is untracked, and later
    /// [`add_message`](Self::add_message) calls at or below it return
    /// `Ok(false)` without tracking: the tracker never schedules nor counts an
    /// acknowledged position (Pulsar keeps them counted until trim and relies
    /// on the dispatcher's deletion check).
    ///
    /// Only moves forward: a position at or below the recorded one is
    /// ignored, so a late call from a racing ack path cannot move it back. A
    /// cursor reset (seek) to an earlier position must instead call
    /// [`clear`](Self::clear) (which forgets the mark-delete) or
    /// [`reset_mark_delete`](Self::reset_mark_delete); otherwise messages
    /// re-added below the old mark-delete would be counted but never
    /// delivered.
    pub fn update_mark_delete(&self, position: Position) {
        let mut inner = self.inner.lock();
        if inner.mark_delete.is_none_or(|p| position > p) {
            self.set_mark_delete(&mut inner, position);
        }
        self.debug_check(&inner);
    }

    /// Records the mark-delete position after a cursor reset (Pulsar's
    /// `resetCursor` / seek; Pulsar's tracker reads the cursor's mark-delete
    /// live, so it follows a reset in both directions). Unlike
    /// [`update_mark_delete`](Self::update_mark_delete) it also moves
    /// **backward**: the tracked messages are kept (all of them lie above
    /// the old mark-delete, hence above the new one) and messages the
    /// dispatcher re-reads between the new and the old mark-delete can be
    /// added and are delivered when due. Moving forward untracks every
    /// position `<= position`, as `update_mark_delete` does.
    ///
    /// Call it from the thread that resets the cursor, before the dispatcher
    /// re-reads from the new read position.
    pub fn reset_mark_delete(&self, position: Position) {
        let mut inner = self.inner.lock();
        inner.reset_backward |= inner.mark_delete.is_some_and(|md| position < md);
        self.set_mark_delete(&mut inner, position);
        self.debug_check(&inner);
    }

    pub(super) fn set_mark_delete(&self, inner: &mut Inner, position: Position) {
        inner.mark_delete = Some(position);
        inner
            .index
            .untrack_up_to(position.ledger_id, position.entry_id);
        crate::trace::bucket_merge::ack(self, inner, position.ledger_id, position.entry_id);
    }
}
