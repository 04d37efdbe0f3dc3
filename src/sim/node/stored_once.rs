//! The rule "a message is stored once": every entry a producer sent (its
//! producer and sequence id, carried in the simulated payload) is at one
//! position of the topic. A send retried after a lost connection or a
//! crash that the broker stored again (no deduplication, or a
//! deduplication that forgot the sequence id) puts a second copy at
//! another position: the first delivery or receipt that shows it is a
//! violation. A SEND_RECEIPT with message id `(-1, -1)` is the broker's
//! answer to a duplicate (Pulsar's `MessageDeduplication`): nothing was
//! stored, the earlier copy is the message.

use std::collections::{BTreeMap, BTreeSet};

use crate::proto::wire::MessageIdData;
use crate::Position;

/// Where each (producer, sequence id) was seen stored.
#[derive(Debug, Default)]
pub(super) struct StoredOnce {
    at: BTreeMap<(usize, u64), Position>,
    /// Sends the broker answered as duplicates (no position): an earlier
    /// copy must be in the topic, so it is delivered by the end of the run.
    deduplicated: BTreeSet<(usize, u64)>,
}

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
    /// Producer `p`'s send `seq` was answered as a duplicate.
    pub(super) fn deduplicated(&mut self, p: usize, seq: u64) {
        self.deduplicated.insert((p, seq));
    }

    /// Sends answered as duplicates whose copy was never receipted nor
    /// delivered: receipted to the application, never stored.
    pub(super) fn never_stored(&self) -> Vec<(usize, u64)> {
        self.deduplicated
            .iter()
            .filter(|k| !self.at.contains_key(k))
            .copied()
            .collect()
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
        s.deduplicated(0, 7);
        s.deduplicated(1, 2);
        assert_eq!(s.stored(0, 7, Position::new(1, 3)), Ok(()));
        assert_eq!(s.never_stored(), vec![(1, 2)]);
    }
}
