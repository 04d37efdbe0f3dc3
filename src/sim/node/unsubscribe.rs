//! Unsubscribes on the node engine (`faults.unsubscribes`): a consumer
//! sends a real UNSUBSCRIBE frame (CommandUnsubscribe, `force` drawn) to
//! the broker core (`broker::unsubscribe`), which deletes the subscription
//! and its cursor (one store write) — or, unforced with other consumers
//! attached, refuses with `MetadataError` and changes nothing. A forced
//! one disconnects the other consumers (CLOSE_CONSUMER: they subscribe
//! again). The asking consumer, answered SUCCESS, is closed; it subscribes
//! again too, as a new consumer of that name would (refused, likewise).
//! Its application stops taking messages when it sends the UNSUBSCRIBE:
//! what it held, and what still arrives for it, may go to the others
//! (the core removes it first, so its messages may reach them before
//! their CLOSE_CONSUMER).
//!
//! The first SUBSCRIBE of that name the core handles after the deletion
//! creates a new subscription at its initial position (earliest: the
//! topic's first kept ledger). The checker is told that as a reset of the
//! subscription to `(first kept ledger, -1)` ([`DeliveryChecker::seek_reset`]),
//! when the subscribe's outputs reach the clients (the FIFO outbound
//! link): every retained message must be delivered and acknowledged again,
//! none of the old subscription's acks carries over. A core that kept the
//! old cursor (resuming its backlog) loses the acknowledged messages for
//! the checker. The reset's mark-delete is computed here from the core's
//! ledger list before the SUBSCRIBE (as the seek driver does), never read
//! from the new cursor.
//!
//! A core that died on the UNSUBSCRIBE's write is judged from the
//! recovered store (the cursor gone: applied); one that died on the
//! re-SUBSCRIBE's cursor creation likewise (the new cursor there: created
//! at its stored mark-delete). So is a core that died later in the turn,
//! before the turn's barrier made it durable: no client saw the turn's
//! outputs, and what the recovered store holds is what happened
//! (`Node::unsubs_check_store`).
//!
//! [`DeliveryChecker::seek_reset`]: crate::sim::checker::DeliveryChecker::seek_reset

use std::collections::{BTreeMap, BTreeSet};

use rand::Rng;

use crate::broker::OutFrame;
use crate::ledger::LedgerStore;
use crate::proto::command::{ty, BrokerCommand, CommandIdRequest};
use crate::Position;

use super::{ClientRef, Ev, Node, TOPIC};

/// The node's unsubscribes in flight.
#[derive(Debug, Default)]
pub(super) struct UnsubSide {
    /// (connection, request id) → (consumer, subscription).
    pending: BTreeMap<(u64, u64), (usize, String)>,
    /// Unsubscribes whose answer (SUCCESS, or the refusal's ERROR) the
    /// asking consumer awaits.
    answered: BTreeSet<(u64, u64)>,
    /// Consumers whose application called unsubscribe, until their
    /// connection is gone.
    leaving: BTreeSet<usize>,
    /// Subscriptions deleted whose next SUBSCRIBE creates them again.
    awaiting: BTreeSet<String>,
    /// Re-creations the core applied whose outputs are not yet on the link.
    applied: Vec<(String, Position)>,
    /// Resets scheduled and not yet told to the checker.
    in_flight: u32,
    /// Subscriptions the core deleted in the current turn (its outputs not
    /// yet on the link).
    deleted_in_turn: Vec<String>,
}

impl UnsubSide {
    /// Nothing of an unsubscribe is left to tell the checker.
    pub(super) fn settled(&self) -> bool {
        self.awaiting.is_empty() && self.applied.is_empty() && self.in_flight == 0
    }
}

/// What a frame the core is about to handle means for the unsubscribes.
pub(super) enum UnsubFrame {
    /// An UNSUBSCRIBE the node sent: its key, its subscription, and
    /// whether that subscription was open on the core before it.
    Unsubscribe((u64, u64), String, bool),
    /// The SUBSCRIBE that will create `sub` again, at mark-delete `md`.
    Recreate(String, Position),
}

impl Node<'_> {
    /// Consumer `c` unsubscribes its subscription (forced or not, drawn).
    pub(super) fn unsubscribe(&mut self, c: usize) {
        use prost::Message;
        let force = self.rng.random_bool(0.5);
        let sub = self.subs[self.consumers[c].sub].clone();
        let Some((conn, request_id)) = self.consumer_request(c) else {
            return;
        };
        let mut inner = CommandIdRequest {
            id: super::client::CONSUMER_ID,
            request_id,
        }
        .encode_to_vec();
        if force {
            // CommandUnsubscribe.force = 3 (absent from the shared struct).
            prost::encoding::bool::encode(3, &true, &mut inner);
            self.node.unsubscribes.forced += 1;
        }
        let mut command = Vec::new();
        prost::encoding::int32::encode(1, &ty::UNSUBSCRIBE, &mut command);
        prost::encoding::bytes::encode(12, &inner, &mut command);
        self.unsubs.pending.insert((conn, request_id), (c, sub));
        self.unsubs.leaving.insert(c);
        self.consumer_leaves(c);
        self.node.unsubscribes.sent += 1;
        let bytes = OutFrame {
            command,
            payload: Vec::new(),
        }
        .encode();
        self.send_to_broker(conn, bytes);
    }

    /// Whether subscription `sub` is open on the live core.
    pub(super) fn sub_open(&self, sub: &str) -> bool {
        self.broker
            .as_ref()
            .and_then(|b| b.topics().get(TOPIC))
            .is_some_and(|t| t.subscriptions.contains_key(sub))
    }

    /// What frame `command` of `conn` means for the unsubscribes, before
    /// the core handles it.
    pub(super) fn unsub_frame(&self, conn: u64, command: &[u8]) -> Option<UnsubFrame> {
        use prost::Message;
        if command.starts_with(&[0x08, ty::UNSUBSCRIBE as u8]) {
            let cmd = BrokerCommand::decode(command).ok()?;
            let key = (conn, cmd.unsubscribe?.request_id);
            let (_, sub) = self.unsubs.pending.get(&key)?;
            return Some(UnsubFrame::Unsubscribe(
                key,
                sub.clone(),
                self.sub_open(sub),
            ));
        }
        if self.unsubs.awaiting.is_empty() || !command.starts_with(&[0x08, ty::SUBSCRIBE as u8]) {
            return None;
        }
        let cmd = BrokerCommand::decode(command).ok()?;
        let sub = cmd.subscribe?.subscription;
        if !self.unsubs.awaiting.contains(&sub) || self.sub_open(&sub) {
            return None;
        }
        let md = Position::new(self.first_kept_ledger(), -1);
        Some(UnsubFrame::Recreate(sub, md))
    }

    /// After the core handled `frame` (`died`: it died on it and restarted
    /// already on the recovered image).
    pub(super) fn unsub_handled(&mut self, frame: UnsubFrame, died: bool) {
        let store = self.broker.as_ref().map(|b| b.store().clone());
        match frame {
            UnsubFrame::Unsubscribe(key, sub, was_open) => {
                self.unsubs.pending.remove(&key);
                if !died {
                    self.unsubs.answered.insert(key);
                }
                let applied = if died {
                    store.is_some_and(|s| matches!(s.load_cursor(TOPIC, &sub), Ok(None)))
                } else {
                    // Deleted by this frame: open before, gone after. A
                    // core that has not opened the subscription (after a
                    // restart, before its consumer subscribed again)
                    // answers "Consumer not found" and deletes nothing.
                    was_open && !self.sub_open(&sub)
                };
                if applied {
                    self.node.unsubscribes.applied += 1;
                    if died {
                        self.node.unsubscribes.applied_at_crash += 1;
                    }
                    if !died {
                        self.unsubs.deleted_in_turn.push(sub.clone());
                    }
                    // Deleted before its creation was told: the
                    // re-creation's reset places it.
                    self.creation_superseded(&sub);
                    self.unsubs.awaiting.insert(sub);
                } else {
                    self.node.unsubscribes.refused += 1;
                }
            }
            UnsubFrame::Recreate(sub, md) => {
                if died {
                    let stored = store.and_then(|s| s.load_cursor(TOPIC, &sub).ok().flatten());
                    if let Some(c) = stored {
                        self.unsubs.awaiting.remove(&sub);
                        self.unsubs.in_flight += 1;
                        let now = self.now();
                        self.sched.at(
                            now,
                            Ev::Unsubscribed {
                                sub,
                                md: c.mark_delete,
                            },
                        );
                    }
                } else if self.sub_open(&sub) {
                    self.unsubs.awaiting.remove(&sub);
                    self.unsubs.applied.push((sub, md));
                }
            }
        }
    }

    /// After a (re)start, before the core opens, on the store the new core
    /// opens: what the previous core's last turn did to a subscription is
    /// what its store holds. A turn lost whole (a crash before its barrier
    /// made it durable, at the SUBSCRIBE or at a later frame of the turn)
    /// sent none of its outputs, so no client saw its SUCCESS: a
    /// re-creation it applied is judged from the recovered cursor (there:
    /// created at its stored mark-delete; absent: the subscription still
    /// awaits its creation), and an UNSUBSCRIBE it applied whose deletion
    /// did not survive left the old subscription in place (nothing to
    /// reset).
    pub(super) fn unsubs_check_store(&mut self, store: &crate::ledger::RedbStore) {
        let applied = std::mem::take(&mut self.unsubs.applied);
        let now = self.now();
        for (sub, _) in applied {
            self.node.unsubscribes.recreations_in_lost_turn += 1;
            match store.load_cursor(TOPIC, &sub) {
                Ok(Some(c)) => {
                    self.unsubs.in_flight += 1;
                    self.sched.at(
                        now,
                        Ev::Unsubscribed {
                            sub,
                            md: c.mark_delete,
                        },
                    );
                }
                _ => {
                    self.unsubs.awaiting.insert(sub);
                }
            }
        }
        // Only a deletion of the lost turn may be undone: one whose SUCCESS
        // left with an earlier turn was durable, and its cursor coming back
        // is the core's loss, for the reset to catch.
        for sub in std::mem::take(&mut self.unsubs.deleted_in_turn) {
            if matches!(store.load_cursor(TOPIC, &sub), Ok(Some(_))) {
                self.unsubs.awaiting.remove(&sub);
                self.node.unsubscribes.applied -= 1;
                self.node.unsubscribes.undone_by_crash += 1;
            }
        }
    }

    /// Called by `pump` once the turn's outputs are on the outbound link:
    /// each re-creation reaches the checker with the subscribe's SUCCESS.
    pub(super) fn schedule_recreated_subscriptions(&mut self) {
        self.unsubs.deleted_in_turn.clear();
        if self.unsubs.applied.is_empty() {
            return;
        }
        let at = self.from_broker_last.max(self.now());
        for (sub, md) in std::mem::take(&mut self.unsubs.applied) {
            self.unsubs.in_flight += 1;
            self.sched.at(at, Ev::Unsubscribed { sub, md });
        }
    }

    /// The new subscription's creation reached the clients: the checker's
    /// reset of `sub` to `md`.
    pub(super) fn subscription_recreated(&mut self, sub: &str, md: Position) {
        self.unsubs.in_flight = self.unsubs.in_flight.saturating_sub(1);
        self.node.unsubscribes.recreated += 1;
        let now = self.now();
        self.checker.seek_reset(sub, md, now);
    }

    /// Whether consumer `c`'s application called unsubscribe (what still
    /// arrives for it is discarded).
    pub(super) fn unsubscribing(&self, c: usize) -> bool {
        self.unsubs.leaving.contains(&c)
    }

    /// Consumer `c`'s connection is gone: a new one is a new consumer.
    pub(super) fn unsubs_consumer_gone(&mut self, c: usize) {
        self.unsubs.leaving.remove(&c);
    }

    /// Consumer `c` got SUCCESS or ERROR for request `req` on `conn`: if it
    /// answers an unsubscribe, the consumer is closed (applied: it is
    /// gone; refused: the application gave it up) and subscribes again, on
    /// a new connection here, as a new consumer of the name would.
    /// Whether it was one.
    pub(super) fn unsubscribe_answered(&mut self, c: usize, conn: u64, req: u64) -> bool {
        if !self.unsubs.answered.remove(&(conn, req)) {
            return false;
        }
        self.close_conn(conn);
        self.connection_lost(conn, ClientRef::Consumer(c), false);
        true
    }
}

/// What the unsubscribes did (the report's node activity).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct UnsubActivity {
    /// UNSUBSCRIBE frames sent.
    pub sent: u64,
    /// Of those, with `force`.
    pub forced: u64,
    /// Subscriptions the core deleted.
    pub applied: u64,
    /// Of those, found deleted in the recovered store after the core died
    /// on the UNSUBSCRIBE.
    pub applied_at_crash: u64,
    /// Unsubscribes the core refused (unforced with other consumers).
    pub refused: u64,
    /// Unsubscribes the core applied in memory whose turn's commit a crash
    /// cut (the recovered store still holds the cursor): not applied.
    pub undone_by_crash: u64,
    /// Subscriptions created again after an unsubscribe (the checker's
    /// reset to the initial position).
    pub recreated: u64,
    /// Re-creations the core applied in a turn a crash lost before its
    /// outputs left (judged from the recovered store).
    pub recreations_in_lost_turn: u64,
}
