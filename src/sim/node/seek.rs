//! Seeks on the node engine (`faults.seeks`): a simulated consumer sends a
//! real SEEK frame (CommandSeek by message id) to the broker core, which
//! disconnects the subscription's consumers (CLOSE_CONSUMER: they
//! subscribe again, as Pulsar clients do) and resets the cursor, backward
//! or forward (`broker::seek`).
//!
//! The target is a published message the checker still tracks
//! ([`DeliveryChecker::window_position`], drawn uniformly over the window:
//! below or above the subscription's mark-delete, so both directions
//! come). The checker is told the reset (its mark-delete: the entry before
//! the target, computed here from the request, not read from the core)
//! when the core has applied it (the frame was handled and the
//! subscription's reset counter moved), at the moment its outputs reach
//! the clients over the FIFO outbound link. A core that died on the SEEK's
//! durable write is judged from the recovered cursor: the reset counts
//! when the store holds its mark-delete with no individually deleted entry
//! (the reset's one write), else it was lost with the process. So is a
//! SEEK the core applied in a turn a crash cut before its barrier made it
//! durable (`Node::seeks_check_store`): none of the turn's outputs left, so
//! no client saw the reset, and only the recovered store says whether it
//! happened.
//!
//! [`DeliveryChecker::window_position`]: crate::sim::checker::DeliveryChecker::window_position

use rand::Rng;

use crate::ledger::LedgerStore;
use crate::proto::command::{ty, BrokerCommand, CommandSeek};
use crate::proto::wire::MessageIdData;
use crate::Position;

use super::wire::frame;
use super::{Node, TOPIC};

/// The node's seeks in flight.
#[derive(Debug, Default)]
pub(super) struct SeekSide {
    /// (connection, request id) → (subscription, the reset's mark-delete).
    pending: std::collections::BTreeMap<(u64, u64), (String, Position)>,
    /// A SEEK the core died on: judged after the restart.
    in_crash: Option<(String, Position)>,
    /// Resets the core applied whose outputs are not yet on the link.
    applied: Vec<(String, Position)>,
}

impl Node<'_> {
    /// Consumer `c` seeks its subscription to a message of the window.
    pub(super) fn seek(&mut self, c: usize) {
        let fraction: f64 = self.rng.random();
        let Some(target) = self.checker.window_position(fraction) else {
            return;
        };
        let sub = self.subs[self.consumers[c].sub].clone();
        let Some((conn, request_id)) = self.consumer_request(c) else {
            return;
        };
        let cmd = BrokerCommand {
            r#type: ty::SEEK,
            seek: Some(CommandSeek {
                consumer_id: super::client::CONSUMER_ID,
                request_id,
                message_id: Some(MessageIdData {
                    ledger_id: target.ledger_id as u64,
                    entry_id: target.entry_id as u64,
                    ..Default::default()
                }),
                message_publish_time: None,
            }),
            ..Default::default()
        };
        self.seeks
            .pending
            .insert((conn, request_id), (sub, target.previous_in_ledger()));
        self.node.seeks_sent += 1;
        self.send_to_broker(conn, frame(&cmd, Vec::new()));
    }

    /// The SEEK this frame of `conn` carries, if it is one the node sent:
    /// its key and subscription.
    pub(super) fn seek_frame(&self, conn: u64, command: &[u8]) -> Option<((u64, u64), String)> {
        use prost::Message;
        if !command.starts_with(&[0x08, ty::SEEK as u8]) {
            return None;
        }
        let cmd = BrokerCommand::decode(command).ok()?;
        let s = cmd.seek?;
        let key = (conn, s.request_id);
        let (sub, _) = self.seeks.pending.get(&key)?;
        Some((key, sub.clone()))
    }

    /// The reset count of subscription `sub` on the live core.
    pub(super) fn resets_of(&self, sub: &str) -> Option<u64> {
        self.broker
            .as_ref()?
            .topics()
            .get(TOPIC)?
            .subscriptions
            .get(sub)
            .map(|s| s.counters.resets)
    }

    /// After the core handled SEEK `key` (`before`: its subscription's reset
    /// count before; `died`: the core died on it): the checker is told a
    /// reset the core applied.
    pub(super) fn seek_handled(&mut self, key: (u64, u64), before: Option<u64>, died: bool) {
        let Some((sub, md)) = self.seeks.pending.remove(&key) else {
            return;
        };
        if died {
            // The core restarted already (on the recovered image).
            self.seeks.in_crash = Some((sub, md));
            self.seek_after_crash();
            return;
        }
        if self.resets_of(&sub).unwrap_or(0) > before.unwrap_or(0) {
            let md = md.max(self.first_position_before());
            self.seeks.applied.push((sub, md));
        }
    }

    /// Called by `pump` once the turn's outputs are on the outbound link:
    /// each reset the core applied reaches the checker when the seek's
    /// outputs (CLOSE_CONSUMER to every consumer of the subscription, then
    /// SUCCESS) reach the clients. The link is FIFO, so what the core sent
    /// before the seek (MESSAGEs, ack receipts) is judged before the reset
    /// and what it sends after it (dispatch to the consumers that
    /// subscribe again) after.
    pub(super) fn schedule_applied_seeks(&mut self) {
        if self.seeks.applied.is_empty() {
            return;
        }
        let at = self.from_broker_last.max(self.now());
        for (sub, md) in std::mem::take(&mut self.seeks.applied) {
            self.sched.at(at, super::Ev::SeekApplied { sub, md });
        }
    }

    /// The seek's outputs reached the clients (see
    /// [`Node::schedule_applied_seeks`]).
    pub(super) fn seek_applied(&mut self, sub: &str, md: Position) {
        self.apply_seek(sub, md);
    }

    /// `(first ledger, -1)` of the live core's topic: a seek into a ledger
    /// consumed-ledger trimming deleted lands on the first entry kept, as
    /// Pulsar's reset does (`getNextValidPosition`).
    fn first_position_before(&self) -> Position {
        self.broker
            .as_ref()
            .and_then(|b| b.topics().get(TOPIC))
            .and_then(|t| t.ml.ledgers().first().map(|(l, _)| Position::new(*l, -1)))
            .unwrap_or(Position::new(i64::MIN, -1))
    }

    fn apply_seek(&mut self, sub: &str, md: Position) {
        let now = self.now();
        self.node.seeks_applied += 1;
        self.checker.seek_reset(sub, md, now);
    }

    /// After the restart: a SEEK the previous core died on counts when the
    /// recovered cursor is the reset's (its mark-delete, nothing deleted
    /// above it).
    fn seek_after_crash(&mut self) {
        let Some((sub, md)) = self.seeks.in_crash.take() else {
            return;
        };
        let Some(store) = self.broker.as_ref().map(|b| b.store().clone()) else {
            return;
        };
        let md = md.max(self.first_position_before());
        if reset_is_stored(&store, &sub, md) {
            self.node.seeks_applied_at_crash += 1;
            self.apply_seek(&sub, md);
        }
    }

    /// After a (re)start, before the core opens, on the store the new core
    /// opens: a SEEK the previous core applied in a turn a crash lost before
    /// its barrier made it durable sent none of its outputs (no
    /// CLOSE_CONSUMER, no SUCCESS), so what happened is what the recovered
    /// store holds: the reset's cursor there, it counts (told to the
    /// checker now); else the old cursor stands and no reset happened.
    pub(super) fn seeks_check_store(&mut self, store: &crate::ledger::RedbStore) {
        for (sub, md) in std::mem::take(&mut self.seeks.applied) {
            if reset_is_stored(store, &sub, md) {
                self.node.seeks_applied_at_crash += 1;
                self.apply_seek(&sub, md);
            } else {
                self.node.seeks_lost_in_crash += 1;
            }
        }
    }
}

/// Whether `store` holds the cursor a reset of `sub` to `md` writes (its
/// one write): mark-delete `md`, no individually deleted entry, no batch
/// ack set.
fn reset_is_stored(store: &crate::ledger::RedbStore, sub: &str, md: Position) -> bool {
    let Ok(Some(cursor)) = store.load_cursor(TOPIC, sub) else {
        return false;
    };
    if cursor.mark_delete != md || !cursor.individually_deleted.is_empty() {
        return false;
    }
    match store.load_deletion_state(TOPIC, sub) {
        Ok(None) => true,
        Ok(Some(chunks)) => crate::deletion::compact::decode(&chunks)
            .is_ok_and(|s| s.deleted_entries() == 0 && s.batch_ack_sets.is_empty()),
        Err(_) => false,
    }
}
