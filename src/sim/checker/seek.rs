//! A seek as a client sees it (Pulsar's `resetCursor`, backward or
//! forward): [`DeliveryChecker::seek_reset`].
//!
//! After a reset to mark-delete `md` on a subscription:
//! - every message at or below `md` counts as acknowledged by the reset:
//!   one not acknowledged is *skipped* (a forward seek skips it), never
//!   lost, and delivering it again after the reset is a violation
//!   (`delivered_after_seek`, judged by the seek count a delivery carries);
//! - every message above `md` is deliverable again, also an acknowledged
//!   one (a backward seek clears the cursor's individually deleted ranges
//!   and batch ack sets): it is unacknowledged again and must be
//!   delivered and acknowledged again before the run ends, else it is lost;
//! - every consumer's incarnation ends (Pulsar disconnects the consumers):
//!   what they held may be redelivered;
//! - a message registered after the reset (a send whose receipt came late)
//!   at or below the latest reset's mark-delete is skipped at once.
//!
//! The window keeps per-message state only from the oldest message some
//! subscription has not acknowledged; a backward seek below it (a target
//! drawn before a retirement pass) reopens retired messages the checker
//! no longer tracks: their redelivery on that subscription is allowed
//! (counted, not required).

use super::subscription::{ACKED, NOT_ACKED, SKIPPED};
use super::DeliveryChecker;
use crate::position::Position;

impl DeliveryChecker {
    /// A seek on `sub` completed at `now_ms`, leaving its mark-delete at
    /// `mark_delete` (backward or forward; see the module docs). Returns
    /// the number of seeks completed on `sub`, the value deliveries
    /// dispatched after it carry.
    pub fn seek_reset(&mut self, sub: &str, mark_delete: Position, now_ms: u64) -> u32 {
        let base = self.base;
        let Some(s) = self.subs.get_mut(sub) else {
            self.counts.invalid_events += 1;
            self.violation(now_ms, format!("seek on unknown subscription {sub}"));
            return 0;
        };
        // The first window index above the new mark-delete (publish order
        // is not position order: a scan, not a partition point).
        let mut first_reopened = base + self.published.len();
        for (i, (m, _)) in self.published.iter().enumerate() {
            let state = &mut s.acked[i];
            if m.position <= mark_delete {
                if *state == NOT_ACKED {
                    *state = SKIPPED;
                    s.skipped_count += 1;
                }
                continue;
            }
            first_reopened = first_reopened.min(base + i);
            match *state {
                ACKED => {
                    *state = NOT_ACKED;
                    s.acked_count -= 1;
                    self.counts.reopened_by_seek += 1;
                }
                SKIPPED => {
                    *state = NOT_ACKED;
                    s.skipped_count -= 1;
                }
                _ => {}
            }
        }
        // Prefix bookkeeping assumed acks only grow: cut it back.
        s.acked_prefix = s.acked_prefix.min(first_reopened);
        s.seek_scan_from = s.seek_scan_from.min(base);
        s.cumulative_checked_to = s.cumulative_checked_to.min(first_reopened);
        s.cumulative_checked_upto = s.cumulative_checked_upto.map(|u| u.min(mark_delete));
        s.cumulative_acked_to = s.cumulative_acked_to.min(first_reopened);
        s.cumulative_acked_upto = s.cumulative_acked_upto.map(|u| u.min(mark_delete));
        if base > 0 {
            s.reopened_retired_above = Some(
                s.reopened_retired_above
                    .map_or(mark_delete, |r| r.min(mark_delete)),
            );
        }
        s.seeks.push(mark_delete);
        s.reset_mark_delete = Some(mark_delete);
        // Pulsar closes every consumer of the subscription: their
        // incarnations end (a driver that delivers the close later also
        // reports it as a reconnect).
        s.end_all_incarnations();
        self.counts.seek_resets += 1;
        s.seeks.len() as u32
    }

    /// Subscription `sub` came into existence (its first creation became
    /// durable and reached its client) at mark-delete `mark_delete`: its
    /// initial position, earliest, is `(first ledger the topic kept, -1)`.
    /// A subscription that does not exist retains nothing (Pulsar trims a
    /// ledger no durable cursor holds), so what was published before it in
    /// a ledger deleted meanwhile (at or below `mark_delete`) is not owed
    /// to it: such a message is skipped, as a reset skips it, and one
    /// registered later at or below `mark_delete` (a late receipt) too.
    /// Nothing else changes: no consumer incarnation had anything of the
    /// subscription, and the seek count deliveries carry is untouched.
    /// Everything above `mark_delete` stays owed (a core that creates the
    /// subscription further on loses it). Returns how many were skipped.
    pub fn subscription_created(&mut self, sub: &str, mark_delete: Position, now_ms: u64) -> u64 {
        let Some(s) = self.subs.get_mut(sub) else {
            self.counts.invalid_events += 1;
            self.violation(now_ms, format!("creation of unknown subscription {sub}"));
            return 0;
        };
        let mut skipped = 0;
        for (i, (m, _)) in self.published.iter().enumerate() {
            if m.position <= mark_delete && s.acked[i] == NOT_ACKED {
                s.acked[i] = SKIPPED;
                s.skipped_count += 1;
                skipped += 1;
            }
        }
        s.reset_mark_delete = Some(
            s.reset_mark_delete
                .map_or(mark_delete, |r| r.max(mark_delete)),
        );
        skipped
    }

    /// The position of the window message at `fraction` (0..=1) of the
    /// window, in publish order: a seek target the checker still tracks.
    /// `None` when the window is empty.
    pub fn window_position(&self, fraction: f64) -> Option<crate::position::Position> {
        let n = self.published.len();
        if n == 0 {
            return None;
        }
        let i = ((n - 1) as f64 * fraction.clamp(0.0, 1.0)).round() as usize;
        Some(self.published[i.min(n - 1)].0.position)
    }
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests {
    use super::super::{DeliveryChecker, MessageRef, OrderCheck};
    use crate::position::Position;

    fn m(e: i64) -> MessageRef {
        MessageRef {
            position: Position::new(1, e),
            batch_index: 0,
        }
    }

    fn checker(n: i64) -> DeliveryChecker {
        let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::Total);
        for e in 0..n {
            c.published(m(e), 0, 0);
        }
        c
    }

    /// A backward seek makes acknowledged messages deliverable again: their
    /// redelivery is allowed (in order, to the new incarnation), and they
    /// must be acknowledged again.
    #[test]
    fn a_backward_seek_reopens_what_follows_the_new_mark_delete() {
        let mut c = checker(4);
        for e in 0..4 {
            c.delivered("s", 0, m(e), 1, 0);
            c.acked("s", m(e), 2);
        }
        assert!(c.all_acked());
        c.seek_reset("s", Position::new(1, 0), 3);
        assert!(!c.all_acked(), "1..=3 reopened");
        for e in 1..4 {
            c.delivered("s", 0, m(e), 4, 0);
            c.acked("s", m(e), 5);
        }
        let (counts, first) = c.finish(6);
        assert_eq!(counts.violations(), 0, "{first:?}");
        assert_eq!(counts.reopened_by_seek, 3);
        assert_eq!(counts.duplicates_allowed, 3);
    }

    /// The rule fails on real loss: a reopened message the broker never
    /// delivers again is lost (the check's negative control).
    #[test]
    fn a_reopened_message_never_redelivered_is_lost() {
        let mut c = checker(3);
        for e in 0..3 {
            c.delivered("s", 0, m(e), 1, 0);
            c.acked("s", m(e), 2);
        }
        c.seek_reset("s", Position::new(1, 0), 3);
        // The broker kept 1:2 deleted (its range survived the reset).
        c.delivered("s", 0, m(1), 4, 0);
        c.acked("s", m(1), 5);
        let (counts, first) = c.finish(6);
        assert_eq!(counts.lost, 1);
        assert!(first.unwrap().contains("1:2#0 never acknowledged"));
    }

    /// A forward seek acknowledges what it skips; a message it skipped that
    /// is dispatched after it is a violation; a backward seek then reopens
    /// the skipped ones too.
    #[test]
    fn a_forward_seek_skips_and_a_later_backward_one_reopens() {
        let mut c = checker(4);
        c.delivered("s", 0, m(0), 1, 0);
        let n = c.seek_reset("s", Position::new(1, 2), 2);
        assert_eq!(n, 1);
        c.delivered("s", 0, m(3), 3, n);
        c.acked("s", m(3), 4);
        assert!(c.all_acked(), "0..=2 skipped, 3 acked");
        c.delivered("s", 0, m(1), 5, n);
        let n = c.seek_reset("s", Position::new(1, -1), 6);
        assert_eq!(n, 2);
        for e in 0..4 {
            c.delivered("s", 0, m(e), 7, n);
            c.acked("s", m(e), 8);
        }
        let (counts, first) = c.finish(9);
        assert_eq!(counts.delivered_after_seek, 1, "{first:?}");
        assert_eq!(counts.violations(), 1);
        assert_eq!(counts.lost, 0);
        assert_eq!(
            counts.skipped_by_seek, 0,
            "every skipped one acked after the reopen"
        );
    }

    /// A message registered after a reset, at or below its mark-delete (a
    /// late receipt), is skipped, not lost; one above it must come.
    #[test]
    fn a_message_registered_after_a_reset_below_its_mark_delete_is_skipped() {
        let mut c = checker(1);
        c.seek_reset("s", Position::new(1, 5), 1);
        c.published(m(3), 0, 0);
        c.published(m(7), 0, 0);
        let (counts, first) = c.finish(2);
        assert_eq!(counts.lost, 1, "{first:?}");
        assert!(first.unwrap().contains("1:7#0"));
        assert_eq!(counts.skipped_by_seek, 2, "1:0 and 1:3");
    }

    /// Retirement and a backward seek: with retirement after every ack, a
    /// seek below the window reopens retired messages, whose redelivery is
    /// allowed on that subscription only.
    #[test]
    fn a_backward_seek_below_the_window_allows_redelivery_of_retired_messages() {
        let mut c = checker(3);
        c.retire_every = 1;
        for e in 0..3 {
            c.delivered("s", 0, m(e), 1, 0);
            c.acked("s", m(e), 2);
        }
        c.seek_reset("s", Position::new(1, -1), 3);
        c.delivered("s", 0, m(0), 4, 0);
        let (counts, first) = c.finish(5);
        assert_eq!(counts.violations(), 0, "{first:?}");
        // Without the seek the same delivery is a redelivery after its ack.
        let mut c = checker(1);
        c.retire_every = 1;
        c.delivered("s", 0, m(0), 1, 0);
        c.acked("s", m(0), 2);
        c.delivered("s", 0, m(0), 3, 0);
        let (counts, _) = c.finish(4);
        assert_eq!(counts.duplicate_violations, 1);
    }
}
