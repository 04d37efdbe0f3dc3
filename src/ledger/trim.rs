//! Consumed-ledger trimming (Pulsar's
//! `ManagedLedgerImpl.trimConsumedLedgersInBackground` /
//! `internalTrimLedgers`): a ledger every durable cursor has consumed is
//! deleted, its entries and its store space, once the retention policy
//! lets it go ([`ManagedLedger::trim_consumed_ledgers`]).
//!
//! # What holds a ledger
//!
//! A ledger is kept while anything may still read it:
//!
//! - **a durable cursor**, by its *persisted* mark-delete `md` (the one a
//!   recovery starts from, never ahead of the cursor's state in memory):
//!   it holds `md`'s ledger and every later one, except that a mark-delete
//!   at the last entry of a closed ledger (or `(L, -1)` of an empty one)
//!   holds from the next ledger on (Pulsar's
//!   `slowestReaderLedgerId = md.ledger + 1` when `md` is the ledger's last
//!   entry). A cursor's individually deleted ranges and batch ack sets lie
//!   above its mark-delete, so they never name a deleted ledger. Every
//!   cursor persisted for the managed ledger counts, whether or not it is
//!   open: a subscription without consumers keeps its backlog.
//! - **other holders**, through the `held` position of the call: the
//!   smallest position the caller's replay set, delayed tracker (its bucket
//!   snapshots' first ledger), pending-ack log (entries acknowledged in
//!   open transactions) or transaction buffer (first entry of an open
//!   transaction) may still read. The broker core passes it
//!   (`broker::lifecycle`); every one of those positions also lies above
//!   its subscription's mark-delete, so `held` is a second guard, not the
//!   only one.
//! - **the current ledger** is never deleted (Pulsar rolls over first).
//!
//! With no durable cursor at all every closed ledger is consumed (as in
//! Pulsar, data nobody subscribed to is kept only by retention).
//!
//! # Retention ([`RetentionPolicy`], Pulsar's `retentionTimeInMinutes` /
//! `retentionSizeInMB`)
//!
//! Walking the consumed ledgers oldest first, ledger `L` is deleted when
//! its retention time has expired (`time_ms >= 0` and
//! `now - closed(L) > time_ms`) **or** the managed ledger stays at or above
//! the size limit without it and the ledgers before it (`size_bytes >= 0`
//! and `total - deleted_so_far >= size_bytes`); the walk stops at the first
//! ledger neither lets go. `-1` is unlimited (that limit never deletes);
//! the default, `0` and `0`, is Pulsar's default "no retention": a consumed
//! ledger goes at the first trim. `closed(L)` is when trimming first saw
//! `L` closed (kept in memory: after a restart the retention time of the
//! ledgers closed before it starts again, so data is kept longer, never
//! shorter; a caller that trims every `t` ms deletes at most `t` late).
//!
//! # Failure and crashes
//!
//! The deletion is one atomic store write
//! ([`LedgerStore::delete_ledgers`](super::LedgerStore::delete_ledgers)):
//! on a store failure the call returns [`LedgerError::Store`] and nothing
//! changed (the in-memory ledger list is updated only after the commit); a
//! crash shows every listed ledger or none. Because the holds are read from
//! the persisted mark-deletes, a recovery never finds a cursor whose next
//! entry is in a deleted ledger.

use super::error::LedgerError;
use super::managed_ledger::ManagedLedger;
use crate::position::Position;
use crate::sync::Ordering;

/// How long consumed ledgers are kept (Pulsar's retention policy of a
/// namespace). `-1`: unlimited; `0` (the default): not kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RetentionPolicy {
    /// `retentionTimeInMinutes`, in ms: a consumed ledger is kept until it
    /// has been closed this long.
    pub time_ms: i64,
    /// `retentionSizeInMB`, in bytes: consumed ledgers are kept while the
    /// managed ledger's payload bytes stay below this.
    pub size_bytes: i64,
}

impl RetentionPolicy {
    /// Nothing consumed is ever deleted (both limits unlimited).
    pub const INFINITE: RetentionPolicy = RetentionPolicy {
        time_ms: -1,
        size_bytes: -1,
    };
}

/// What [`ManagedLedger::trim_consumed_ledgers`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrimOutcome {
    /// The ledgers deleted, ascending (empty: nothing was deleted). A
    /// component that keeps per-ledger state of this managed ledger (e.g.
    /// a transaction buffer's aborted transactions) drops what it kept for
    /// them.
    pub deleted_ledgers: Vec<i64>,
    /// Entries those ledgers held.
    pub deleted_entries: i64,
    /// Payload bytes those ledgers held.
    pub deleted_bytes: u64,
    /// The first ledger kept because something holds it (the slowest
    /// durable cursor, `held`, or the current ledger).
    pub kept_from: i64,
}

impl ManagedLedger {
    /// Deletes the ledgers every durable cursor has consumed, as far as
    /// `retention` lets it and never at or after `held` (see the module
    /// docs of `ledger::trim` for what holds a ledger). `now_ms` is the
    /// caller's clock (epoch ms) for the retention time. Runs under the
    /// managed ledger's lock (appends wait for it); one store write.
    ///
    /// A cursor reset (seek) racing with a trim may land in a deleted
    /// ledger; its next read starts at the first entry kept.
    ///
    /// # Errors
    /// [`LedgerError::Fenced`] after [`ManagedLedger::fence`];
    /// [`LedgerError::Store`] if listing the cursors or the deletion fails.
    /// On error nothing is deleted and nothing changes.
    ///
    /// # Blocking
    /// Yes: deleting the consumed ledgers is one store commit on the calling
    /// thread, under the ledger's lock.
    pub fn trim_consumed_ledgers(
        &self,
        now_ms: u64,
        retention: RetentionPolicy,
        held: Option<Position>,
    ) -> Result<TrimOutcome, LedgerError> {
        if self.fenced.load(Ordering::Acquire) {
            return Err(LedgerError::Fenced {
                ledger: self.name.clone(),
            });
        }
        let mut state = self.state.lock();
        let (current, _) = state.current();
        // The slowest durable cursor, by its persisted mark-delete.
        let mut slowest: Option<Position> = None;
        for cursor in self.store.list_cursors(&self.name)? {
            if let Some(c) = self.store.load_cursor(&self.name, &cursor)? {
                slowest = Some(slowest.map_or(c.mark_delete, |s| s.min(c.mark_delete)));
            }
        }
        let mut kept_from = match slowest {
            None => current,
            Some(md) => match state.ledgers.get(&md.ledger_id) {
                // A closed ledger the cursor has consumed to its end.
                Some(info) if md.ledger_id != current && md.entry_id + 1 >= info.entries => {
                    md.ledger_id + 1
                }
                Some(_) => md.ledger_id,
                // Below the first ledger (already deleted): it holds what
                // comes after.
                None if md.ledger_id < state.first_ledger_id() => md.ledger_id.saturating_add(1),
                // Not a ledger of this managed ledger: hold everything.
                None => i64::MIN,
            },
        };
        if let Some(h) = held {
            kept_from = kept_from.min(h.ledger_id);
        }
        kept_from = kept_from.min(current);
        let total: u64 = state.ledgers.values().map(|i| i.size_bytes).sum();
        let mut out = TrimOutcome {
            kept_from,
            ..TrimOutcome::default()
        };
        let mut size_to_delete = 0u64;
        for (id, info) in state.ledgers.range(..kept_from) {
            let closed_at = *state.closed_seen_at.get(id).unwrap_or(&now_ms);
            size_to_delete += info.size_bytes;
            let over_size = retention.size_bytes >= 0
                && total.saturating_sub(size_to_delete) >= retention.size_bytes as u64;
            let expired = retention.time_ms >= 0
                && now_ms.saturating_sub(closed_at) > retention.time_ms as u64;
            // Default retention (0 ms, 0 bytes): over_size holds for every
            // consumed ledger.
            if !(expired || over_size) {
                out.kept_from = *id;
                break;
            }
            out.deleted_ledgers.push(*id);
            out.deleted_entries += info.entries;
            out.deleted_bytes += info.size_bytes;
        }
        if !out.deleted_ledgers.is_empty() {
            self.store
                .delete_ledgers(&self.name, &out.deleted_ledgers)?;
        }
        for id in &out.deleted_ledgers {
            state.ledgers.remove(id);
            state.closed_seen_at.remove(id);
        }
        // Closed ledgers seen for the first time start their retention now.
        let closed: Vec<i64> = state.ledgers.range(..current).map(|(id, _)| *id).collect();
        for id in closed {
            state.closed_seen_at.entry(id).or_insert(now_ms);
        }
        if out.deleted_ledgers.is_empty() {
            return Ok(out);
        }
        tracing::info!(
            ledger = %self.name,
            deleted = ?out.deleted_ledgers,
            entries = out.deleted_entries,
            bytes = out.deleted_bytes,
            kept_from = out.kept_from,
            "consumed ledgers deleted"
        );
        Ok(out)
    }
}
