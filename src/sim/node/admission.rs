//! The admission contract of the core's [`AdmissionHook`], checked from the
//! embedder's side (PIP-491's `Consumer.sendMessages` step 3, Pulsar's
//! `PendingAcksMap.addPendingAckIfAllowed`): an entry the hook refused to a
//! consumer is neither sent to it nor debited from its permits. The node
//! engine is the embedder that installed the hook
//! (`faults.admission_reject_ratio`): the hook records every entry it
//! admitted, per consumer key (connection id, consumer id); every MESSAGE
//! the core queues for that consumer spends one admission of its position
//! (the core offers one entry per `send_messages` call, and asks the hook
//! again for every copy it sends). A MESSAGE with no admission left was
//! sent (and its P debited) although the hook refused it: a violation the
//! moment the core queues it, whether or not a later replay would deliver
//! the entry twice.

use std::collections::BTreeMap;
// Ownership handles use std's Arc in every build (see `ledger::managed_ledger`).
use std::sync::Arc;

use prost::Message;

use crate::broker::OutFrame;
use crate::permits::broker::ConsumerKey;
use crate::position::Position;
use crate::proto::command::{ty, BrokerCommand};
use crate::sync::Mutex;

use super::{ClientRef, Node};

/// Admissions not yet spent by a MESSAGE, per (connection id, consumer id,
/// position).
#[derive(Debug, Default)]
pub(super) struct Admissions {
    unspent: BTreeMap<(u64, u64, Position), u32>,
}

/// Shared by the hook (inside the core) and the driver.
pub(super) type SharedAdmissions = Arc<Mutex<Admissions>>;

impl Admissions {
    /// The hook admitted the entry at `p` to consumer `key`.
    pub(super) fn admitted(&mut self, key: ConsumerKey, p: Position) {
        *self
            .unspent
            .entry((key.connection_id, key.consumer_id, p))
            .or_insert(0) += 1;
    }

    /// The core queued a MESSAGE of the entry at `p` for `consumer_id` on
    /// `conn`: spends one admission; `false` if none was left (sent
    /// although refused).
    pub(super) fn spend(&mut self, conn: u64, consumer_id: u64, p: Position) -> bool {
        let key = (conn, consumer_id, p);
        match self.unspent.get_mut(&key) {
            Some(n) if *n > 1 => {
                *n -= 1;
                true
            }
            Some(_) => {
                self.unspent.remove(&key);
                true
            }
            None => false,
        }
    }
}

impl Node<'_> {
    /// Checks one frame the core queued for `conn` against the admissions
    /// (when the run's hook refuses entries): a MESSAGE must spend one.
    pub(super) fn check_admitted(&mut self, conn: u64, frame: &OutFrame) {
        let Some(admissions) = self.admissions.clone() else {
            return;
        };
        // `BaseCommand.type` is its first field: 0x08, then MESSAGE (9).
        if !frame.command.starts_with(&[0x08, ty::MESSAGE as u8]) {
            return;
        }
        let Some(m) = BrokerCommand::decode(frame.command.as_slice())
            .ok()
            .and_then(|c| c.message)
        else {
            return;
        };
        let (Ok(ledger_id), Ok(entry_id)) = (
            i64::try_from(m.message_id.ledger_id),
            i64::try_from(m.message_id.entry_id),
        ) else {
            return;
        };
        let p = Position::new(ledger_id, entry_id);
        if admissions.lock().spend(conn, m.consumer_id, p) {
            return;
        }
        let (sub, consumer) = match self.conns.get(&conn) {
            Some(ClientRef::Consumer(c)) => {
                let co = &self.consumers[*c];
                (self.subs[co.sub].clone(), co.id)
            }
            _ => ("(transaction reader)".to_string(), 0),
        };
        let now = self.now();
        self.checker.permit_violation(
            &sub,
            consumer,
            &format!("sent and debited {p}, which pending-ack admission rejected"),
            now,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_spends_one_admission_of_its_consumer_and_position() {
        let mut a = Admissions::default();
        let key = ConsumerKey {
            connection_id: 3,
            consumer_id: 1,
        };
        let p = Position::new(7, 2);
        assert!(!a.spend(3, 1, p), "nothing admitted yet: a refused entry");
        a.admitted(key, p);
        a.admitted(key, p);
        assert!(!a.spend(3, 2, p), "admitted to another consumer id");
        assert!(!a.spend(4, 1, p), "admitted on another connection");
        assert!(a.spend(3, 1, p));
        assert!(a.spend(3, 1, p));
        assert!(!a.spend(3, 1, p), "a third copy with two admissions");
        assert!(a.unspent.is_empty());
    }
}
