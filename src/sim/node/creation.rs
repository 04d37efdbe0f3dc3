//! Subscriptions' first creation on the node engine. A subscription exists
//! once the core created it: at its consumers' first SUBSCRIBE, or when a
//! transaction ends on it before any consumer came back
//! (`END_TXN_ON_SUBSCRIPTION` opens it, as Pulsar's
//! `handleEndTxnOnSubscription` creates a missing one at earliest). Until
//! then it retains nothing: consumed-ledger trimming deletes a ledger no
//! durable cursor holds, as Pulsar does, so what was published before it
//! in a ledger deleted meanwhile is not owed to it. The checker is told the
//! creation ([`DeliveryChecker::subscription_created`]) at its initial
//! position, earliest: `(first kept ledger, -1)`, computed here from the
//! core's ledger list, never read from the new cursor.
//!
//! When: a creation the core applied reaches the checker with that turn's
//! outputs (the FIFO outbound link, after the SUBSCRIBE's SUCCESS). A crash
//! before the turn's barrier made it durable sent none of its outputs; what
//! happened is what the recovered store holds (`creations_check_store`):
//! the cursor there, the subscription was created at its stored
//! mark-delete; absent, it still does not exist and its consumers' next
//! SUBSCRIBE creates it. This is how a re-creation after an unsubscribe is
//! judged (`unsubscribe.rs`); a subscription deleted before its creation
//! was told is placed by the re-creation's reset instead.
//!
//! [`DeliveryChecker::subscription_created`]: crate::sim::checker::DeliveryChecker::subscription_created

use std::collections::BTreeSet;

use crate::ledger::LedgerStore;
use crate::Position;

use super::{Ev, Node, TOPIC};

/// The run's subscriptions not yet created, as the checker knows them.
#[derive(Debug, Default)]
pub(super) struct CreationSide {
    /// Subscriptions no creation of which the core applied (as far as its
    /// outputs or its store tell).
    uncreated: BTreeSet<String>,
    /// Creations scheduled and not yet told to the checker.
    in_flight: BTreeSet<String>,
}

impl CreationSide {
    /// The run's subscriptions, none created.
    pub(super) fn new(subs: &[String]) -> Self {
        Self {
            uncreated: subs.iter().cloned().collect(),
            in_flight: BTreeSet::new(),
        }
    }

    /// Every subscription's creation was told to the checker.
    pub(super) fn settled(&self) -> bool {
        self.uncreated.is_empty() && self.in_flight.is_empty()
    }
}

impl Node<'_> {
    /// Called by `pump` once the turn's outputs are on the outbound link:
    /// each subscription the turn created reaches the checker after them.
    pub(super) fn schedule_created_subscriptions(&mut self) {
        if self.creations.uncreated.is_empty() {
            return;
        }
        let created: Vec<String> = self
            .creations
            .uncreated
            .iter()
            .filter(|s| self.sub_open(s))
            .cloned()
            .collect();
        if created.is_empty() {
            return;
        }
        let md = Position::new(self.first_kept_ledger(), -1);
        let at = self.from_broker_last.max(self.now());
        for sub in created {
            self.creations.uncreated.remove(&sub);
            self.creations.in_flight.insert(sub.clone());
            self.sched.at(at, Ev::Created { sub, md });
        }
    }

    /// After a (re)start, before the core opens, on the store it opens: a
    /// subscription not yet created whose cursor the store holds was
    /// created by a turn a crash cut before its outputs left (or at the
    /// frame the core died on), at the stored mark-delete.
    pub(super) fn creations_check_store(&mut self, store: &crate::ledger::RedbStore) {
        if self.creations.uncreated.is_empty() {
            return;
        }
        let now = self.now();
        let subs: Vec<String> = self.creations.uncreated.iter().cloned().collect();
        for sub in subs {
            if let Ok(Some(c)) = store.load_cursor(TOPIC, &sub) {
                self.creations.uncreated.remove(&sub);
                self.creations.in_flight.insert(sub.clone());
                self.node.creations.in_lost_turn += 1;
                self.sched.at(
                    now,
                    Ev::Created {
                        sub,
                        md: c.mark_delete,
                    },
                );
            }
        }
    }

    /// The creation of `sub` reached its client: the checker's creation at
    /// mark-delete `md`.
    pub(super) fn subscription_created(&mut self, sub: &str, md: Position) {
        if !self.creations.in_flight.remove(sub) {
            return;
        }
        self.node.creations.created += 1;
        let now = self.now();
        self.node.creations.skipped_before_creation +=
            self.checker.subscription_created(sub, md, now);
    }

    /// `sub` was deleted (an unsubscribe) before its creation was told:
    /// the re-creation's reset places it.
    pub(super) fn creation_superseded(&mut self, sub: &str) {
        if self.creations.uncreated.remove(sub) || self.creations.in_flight.remove(sub) {
            self.node.creations.superseded += 1;
        }
    }
}

/// What the subscriptions' first creations did (the report's node activity).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct CreationActivity {
    /// Subscriptions created, told to the checker at their initial position.
    pub created: u64,
    /// Of those, found in the recovered store after a crash cut the turn
    /// that created them (or the frame the core died on).
    pub in_lost_turn: u64,
    /// Messages published before their subscription existed, in ledgers
    /// trimming deleted meanwhile: not owed to it.
    pub skipped_before_creation: u64,
    /// Subscriptions deleted by an unsubscribe before their creation was
    /// told (the re-creation's reset places them).
    pub superseded: u64,
}
