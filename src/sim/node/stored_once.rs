//! The rule "a message is stored once": every entry a producer sent (its
//! producer and sequence id, carried in the simulated payload) is at one
//! position of the topic. A send retried after a lost connection or a
//! crash that the broker stored again (no deduplication, or a
//! deduplication that forgot the sequence id) puts a second copy at
//! another position: the first delivery or receipt that shows it is a
//! violation. A SEND_RECEIPT with message id `(-1, -1)` is the broker's
//! answer to a duplicate (Pulsar's `MessageDeduplication`): nothing was
//! stored, the earlier copy is the message. A delayed message's copy
//! (PIP-26: `deliver_at_time`) is delivered only once due, so the run does
//! not end before every such copy was seen or was due
//! [`COPY_DUE_MARGIN_MS`] ago ([`StoredOnce::copies_settled`]); only then
//! is a copy never seen a loss.

use std::collections::BTreeMap;

use crate::proto::wire::MessageIdData;
use crate::Position;

/// Where each (producer, sequence id) was seen stored.
#[derive(Debug, Default)]
pub(super) struct StoredOnce {
    at: BTreeMap<(usize, u64), Position>,
    /// Sends the broker answered as duplicates (no position), with the
    /// virtual time their copy is due (its latest `deliver_at`, 0 for an
    /// ordinary message): an earlier copy must be in the topic, so it is
    /// delivered once due.
    deduplicated: BTreeMap<(usize, u64), u64>,
}

/// Time after a copy is due (virtual ms) within which the core delivers
/// it: its delayed tracker's tick, a read and the link, with room to spare.
pub(super) const COPY_DUE_MARGIN_MS: u64 = 2_000;

impl StoredOnce {
    /// Producer `p`'s entry `seq` is at `pos`; `Err(first)` when an entry at
    /// another position `first` already held it (stored twice).
    pub(super) fn stored(&mut self, p: usize, seq: u64, pos: Position) -> Result<(), Position> {
        match self.at.insert((p, seq), pos) {
            Some(first) if first != pos => {
                self.at.insert((p, seq), first);
                Err(first)
            }
            _ => Ok(()),
        }
    }
}

/// Whether a receipt's message id is the broker's answer to a duplicate.
impl StoredOnce {
    /// Producer `p`'s send `seq`, whose messages are due at `due_ms`
    /// (virtual; 0: not delayed), was answered as a duplicate.
    pub(super) fn deduplicated(&mut self, p: usize, seq: u64, due_ms: u64) {
        self.deduplicated.insert((p, seq), due_ms);
    }

    /// Whether every send answered as a duplicate had its copy seen, or
    /// was due at least [`COPY_DUE_MARGIN_MS`] before `now_ms` (a copy not
    /// seen by then never comes).
    pub(super) fn copies_settled(&self, now_ms: u64) -> bool {
        self.deduplicated.iter().all(|(k, due)| {
            self.at.contains_key(k) || due.saturating_add(COPY_DUE_MARGIN_MS) <= now_ms
        })
    }

    /// Sends answered as duplicates whose copy was never receipted nor
    /// delivered: receipted to the application, never stored.
    pub(super) fn never_stored(&self) -> Vec<(usize, u64)> {
        self.deduplicated
            .keys()
            .filter(|k| !self.at.contains_key(k))
            .copied()
            .collect()
    }

    /// When producer `p`'s send `seq` answered as a duplicate was due.
    pub(super) fn due_ms(&self, p: usize, seq: u64) -> u64 {
        self.deduplicated.get(&(p, seq)).copied().unwrap_or(0)
    }
}

pub(super) fn is_duplicate_receipt(id: &MessageIdData) -> bool {
    id.ledger_id == u64::MAX && id.entry_id == u64::MAX
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests {
    use super::*;

    #[test]
    fn a_second_position_for_one_send_is_caught() {
        let mut s = StoredOnce::default();
        assert_eq!(s.stored(0, 7, Position::new(1, 3)), Ok(()));
        // The same entry seen again (a redelivery, another batch index).
        assert_eq!(s.stored(0, 7, Position::new(1, 3)), Ok(()));
        // Another producer's entry with the same sequence id.
        assert_eq!(s.stored(1, 7, Position::new(1, 4)), Ok(()));
        // The retry stored again.
        assert_eq!(
            s.stored(0, 7, Position::new(1, 9)),
            Err(Position::new(1, 3))
        );
        // The first position stays the reference.
        assert_eq!(
            s.stored(0, 7, Position::new(1, 10)),
            Err(Position::new(1, 3))
        );
    }

    #[test]
    fn a_duplicate_receipt_without_a_stored_copy_is_caught() {
        let mut s = StoredOnce::default();
        s.deduplicated(0, 7, 0);
        s.deduplicated(1, 2, 0);
        assert_eq!(s.stored(0, 7, Position::new(1, 3)), Ok(()));
        assert_eq!(s.never_stored(), vec![(1, 2)]);
    }

    #[test]
    fn a_delayed_copy_is_awaited_until_due() {
        let mut s = StoredOnce::default();
        // An ordinary send's copy is due at once, a delayed one at 10 s.
        s.deduplicated(0, 3, 0);
        s.deduplicated(0, 7, 10_000);
        assert_eq!(s.stored(0, 3, Position::new(1, 1)), Ok(()));
        // Before the delayed copy is due the run may not end.
        assert!(!s.copies_settled(5_000));
        assert!(!s.copies_settled(10_000 + COPY_DUE_MARGIN_MS - 1));
        // Once due (with the margin) and still unseen: a loss.
        assert!(s.copies_settled(10_000 + COPY_DUE_MARGIN_MS));
        assert_eq!(s.never_stored(), vec![(0, 7)]);
        assert_eq!(s.due_ms(0, 7), 10_000);
        // Seen before it was due: settled, nothing lost.
        assert_eq!(s.stored(0, 7, Position::new(2, 4)), Ok(()));
        assert!(s.copies_settled(0));
        assert!(s.never_stored().is_empty());
    }
}
