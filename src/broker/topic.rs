//! Topics (Pulsar's `PersistentTopic`): a topic name's normal form and one
//! managed ledger with its subscriptions.

use std::collections::BTreeMap;

use crate::ledger::ManagedLedger;
// Ownership handles use std's Arc in every build (see `ledger::managed_ledger`).
use std::sync::Arc;

use super::dedup::Deduplication;
use super::error::BrokerError;
use super::producer::TopicProducers;
use super::subscription::Subscription;
use super::txn::TxnBuffer;
use crate::sync::Mutex;

/// Longest topic or subscription name accepted, in bytes (a bound of
/// the core's own: each name is a store key and stays in memory while the
/// node runs).
pub const MAX_NAME_BYTES: usize = 1024;

/// `name` for an error message: at most 64 characters of it.
pub fn name_for_error(name: &str) -> String {
    match name.char_indices().nth(64) {
        Some((at, _)) => format!("{}… ({} bytes)", &name[..at], name.len()),
        None => name.to_string(),
    }
}

/// Normalises `my-topic` / `public/default/my-topic` to
/// `persistent://public/default/my-topic`; names above [`MAX_NAME_BYTES`]
/// are invalid.
///
/// # Errors
/// [`BrokerError::InvalidTopic`] for any other form (another domain, empty
/// parts, a name above the bound).
pub fn normalize_topic(name: &str) -> Result<String, BrokerError> {
    if name.len() > MAX_NAME_BYTES {
        return Err(BrokerError::InvalidTopic(name_for_error(name)));
    }
    if name.starts_with("non-persistent://") {
        return Err(BrokerError::NonPersistent(name_for_error(name)));
    }
    if let Some(rest) = name.strip_prefix("persistent://") {
        if rest.split('/').count() == 3 && rest.split('/').all(|p| !p.is_empty()) {
            return Ok(name.to_string());
        }
        return Err(BrokerError::InvalidTopic(name_for_error(name)));
    }
    if name.contains("://") {
        return Err(BrokerError::InvalidTopic(name_for_error(name)));
    }
    match name.split('/').count() {
        1 if !name.is_empty() => Ok(format!("persistent://public/default/{name}")),
        3 if name.split('/').all(|p| !p.is_empty()) => Ok(format!("persistent://{name}")),
        _ => Err(BrokerError::InvalidTopic(name_for_error(name))),
    }
}

/// One topic: its managed ledger and subscriptions (by name; `BTreeMap` so
/// every walk over them is in name order).
pub struct Topic {
    /// `persistent://tenant/namespace/topic`.
    pub name: String,
    /// Its managed ledger.
    pub ml: Arc<ManagedLedger>,
    /// Subscriptions by name.
    pub subscriptions: BTreeMap<String, Subscription>,
    /// Its transaction buffer (shared with its subscriptions' dispatch).
    pub buffer: Arc<Mutex<TxnBuffer>>,
    /// Its producers (access modes, names, the topic epoch).
    pub producers: TopicProducers,
    /// Its deduplication state (and the durable topic epoch).
    pub dedup: Deduplication,
}
