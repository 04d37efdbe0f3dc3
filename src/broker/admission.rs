//! Pending-ack admission in the dispatch path (PIP-491's
//! `Consumer.sendMessages` step 3, Pulsar's
//! `PendingAcksMap.addPendingAckIfAllowed`): an embedder's rule that may
//! refuse an entry to a consumer. A refused entry is neither sent nor
//! debited ([`crate::permits::broker::Consumer::send_messages`]); the core
//! puts it back in the replay set, and every later entry that must not
//! overtake it (Exclusive / Failover: any later entry; Key_Shared: a later
//! entry of its key) sees it there, because the ordering check re-reads
//! the replay set for every entry, and waits behind it. The next dispatch
//! round reads the replay set first.

use std::fmt;
// Ownership handles use std's Arc in every build (see `ledger::managed_ledger`).
use std::sync::Arc;

use crate::permits::broker::ConsumerKey;
use crate::Position;

use super::subscription::{sub_type, Subscription};

/// An admission rule: `true` admits the entry at the position to the
/// consumer. It must not block; it runs inside dispatch.
#[derive(Clone)]
pub struct AdmissionHook(pub Arc<dyn Fn(ConsumerKey, Position) -> bool + Send + Sync>);

impl AdmissionHook {
    /// A hook from a closure.
    pub fn new(f: impl Fn(ConsumerKey, Position) -> bool + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }

    pub(crate) fn admit(&self, key: ConsumerKey, p: Position) -> bool {
        (self.0)(key, p)
    }
}

impl fmt::Debug for AdmissionHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AdmissionHook")
    }
}

impl Subscription {
    /// Whether the entry at `p` (key slot `key_hash`) must wait behind an
    /// entry of the replay set: on Exclusive / Failover any earlier entry
    /// (total order), on Key_Shared an earlier entry of its key. Reads the
    /// replay set as it is now, so an entry refused by admission or put
    /// back earlier in the same batch holds back what follows it.
    pub(crate) fn blocked_by_replay(&self, p: Position, key_hash: u32) -> bool {
        match self.sub_type {
            sub_type::KEY_SHARED => self.replay.range(..p).any(|(_, h)| *h == key_hash),
            sub_type::EXCLUSIVE | sub_type::FAILOVER => self.replay.range(..p).next().is_some(),
            _ => false,
        }
    }
}
