//! The rule "a message is stored once": every entry a producer sent (its
//! producer and sequence id, carried in the simulated payload) is at one
//! position of the topic. A send retried after a lost connection or a
//! crash that the broker stored again (no deduplication, or a
//! deduplication that forgot the sequence id) puts a second copy at
//! another position: the first delivery or receipt that shows it is a
//! violation. A SEND_RECEIPT with message id `(-1, -1)` is the broker's
//! answer to a duplicate (Pulsar's `MessageDeduplication`): nothing was
//! stored, the earlier copy is the message.

use std::collections::BTreeMap;

use crate::proto::wire::MessageIdData;
use crate::Position;

/// Where each (producer, sequence id) was seen stored.
#[derive(Debug, Default)]
pub(super) struct StoredOnce {
    at: BTreeMap<(usize, u64), Position>,
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
}
