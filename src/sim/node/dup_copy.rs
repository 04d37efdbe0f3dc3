//! The copy a duplicate's answer stands for. A SEND answered as a
//! duplicate (SEND_RECEIPT `(-1, -1)`, Pulsar's `MessageDeduplication`) is
//! right only if an earlier copy of that producer's sequence id was durably
//! appended, typically by a send whose receipt a crash lost. When the
//! answer arrives the copy is looked up in the core's store (the entries'
//! `MessageMetadata`: `producer_name`, `sequence_id`,
//! `highest_sequence_id`) and, found, it is published to the checker at its
//! position, as a lost receipt's copy is when first delivered: from then on
//! the checker's own rules say to which subscription it is owed (a
//! subscription unsubscribed and re-created past it, after the ledger
//! holding it was trimmed, is not owed it). Not found, nothing is told: the
//! "stored once" rule reports the answer as receipted, never stored,
//! unless a delivery shows the copy.

use crate::ledger::LedgerStore;
use crate::Position;

use super::{Node, TOPIC};

impl Node<'_> {
    /// Where the live core's store holds producer `p`'s entry with sequence
    /// id `seq` (the newest such entry; for a chunked message, its last
    /// chunk), if it does.
    pub(super) fn stored_copy(&self, p: usize, seq: u64) -> Option<Position> {
        let store = self.broker.as_ref()?.store();
        let ledger = store.load_ledger(TOPIC).ok()?;
        let name = format!("p-{p}");
        for (&lid, info) in ledger.ledgers.iter().rev() {
            if info.lost || info.entries == 0 {
                continue;
            }
            let Ok(entries) = store.read(TOPIC, lid, 0, info.entries - 1) else {
                continue;
            };
            for (eid, data) in entries.iter().rev() {
                let Ok(parsed) = crate::proto::frame::parse_entry_payload(data) else {
                    continue;
                };
                let md = parsed.metadata;
                // A chunked message is stored where its last chunk is (its
                // receipt's position); an earlier chunk, or a chunk of an
                // attempt a crash cut, is not a copy of the message.
                if let (Some(n), Some(id)) = (md.num_chunks_from_msg, md.chunk_id) {
                    if n > 1 && id + 1 != n {
                        continue;
                    }
                }
                let highest = md.highest_sequence_id.unwrap_or(md.sequence_id);
                if md.producer_name == name
                    && md.sequence_id <= seq
                    && seq <= highest.max(md.sequence_id)
                {
                    return Some(Position::new(lid, *eid));
                }
            }
        }
        None
    }
}
