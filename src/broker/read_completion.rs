//! The cursor read of a subscription's dispatch, issued and completed as
//! two inputs (Pulsar's `cursor.asyncReadEntriesOrWait` →
//! `readEntriesComplete`, with `havePendingRead` allowing one normal read
//! in flight per dispatcher).
//!
//! Dispatch (`dispatch.rs`, step 3) asks the ledger for the next entries
//! with the lock-free read-scheduling hint, keeps them as the
//! subscription's read in flight and queues [`Output::ReadIssued`]. The
//! driver delivers the completion with [`Broker::complete_read`] — `serve`
//! in the same loop iteration, the simulator after a drawn read latency —
//! and other inputs (acks, Flows, closes, seeks) may come first. Only then
//! do the locked post-I/O filter (`filter_read_entries`: entries
//! acknowledged while the read was in flight are dropped), the delayed
//! tracker's add, routing and the PIP-491 send run on those entries, on the
//! state of that moment. While a read is in flight no other is issued;
//! replays and due delayed entries still go out.
//!
//! A completion arriving while the subscription cannot use it yet (no
//! consumer with permits, the pending-ack replay not applied, a read
//! backoff) is kept, completed, and delivered by the next dispatch.
//!
//! **Stale completions.** Whatever moves the read position back drops the
//! read in flight, since the cursor will read its entries again: a seek
//! (`seek.rs`), the consumer-set rewind of a Shared / Key_Shared
//! subscription (`consumer_set.rs`) and Failover's rewind on an
//! active-consumer change (`failover.rs`); so does an unsubscribe (the
//! subscription is gone). Its completion then matches no read in flight and
//! is dropped ([`DispatchCounters::stale_read_completions`](super::DispatchCounters)):
//! delivering those entries would hand out positions the reset put before
//! or behind the cursor. A consumer that closes while a read is in flight
//! drops nothing: the completion routes the entries to the consumers left,
//! or keeps them until one can receive. A crash or restart drops the core
//! and its reads; [`ReadId`]s are unique per core only, so a driver drops
//! the completions meant for a core it replaced.

use crate::ledger::{Entry, ManagedLedger};
use crate::Position;

use super::output::{Outbox, Output, ReadId};
use super::subscription::Subscription;
use super::Broker;

/// A subscription's cursor read in flight.
#[derive(Debug)]
pub(crate) struct InFlightRead {
    /// Its id ([`Output::ReadIssued`]).
    pub(crate) id: ReadId,
    /// What the ledger returned (the hint's skips already applied).
    entries: Vec<Entry>,
    /// The driver delivered the completion; dispatch has not used it yet.
    pub(crate) completed: bool,
}

impl Subscription {
    /// Keeps `entries` as the read in flight and announces it.
    pub(super) fn issue_read(&mut self, entries: Vec<Entry>, out: &mut Outbox) {
        let id = out.issue_read();
        self.read_in_flight = Some(InFlightRead {
            id,
            entries,
            completed: false,
        });
    }

    /// Drops the read in flight (the read position moved back, or the
    /// subscription goes away): its completion is stale.
    pub(crate) fn drop_read_in_flight(&mut self) {
        if let Some(r) = self.read_in_flight.take() {
            tracing::debug!(subscription = %self.name, read = r.id, "read in flight dropped: its completion is stale");
        }
    }

    /// The completed read's entries through the locked post-I/O filter,
    /// then to the consumers; returns true (the read is used, the next one
    /// may be issued).
    pub(super) fn deliver_completed_read(
        &mut self,
        out: &mut Outbox,
        skipped: &mut Vec<Position>,
    ) -> bool {
        let Some(read) = self.read_in_flight.take() else {
            return false;
        };
        let n = read.entries.len() as u64;
        let entries = self
            .deletion
            .filter_read_entries(read.entries, |e| e.position);
        self.counters.entries_read += n;
        self.counters.filtered_after_read += n - entries.len() as u64;
        self.deliver_entries(entries, false, out, skipped);
        true
    }

    /// Marks read `id` completed and dispatches; false when it is not this
    /// subscription's read in flight.
    fn complete_read(&mut self, id: ReadId, ml: &ManagedLedger, out: &mut Outbox) -> bool {
        match &mut self.read_in_flight {
            Some(r) if r.id == id => r.completed = true,
            _ => return false,
        }
        self.dispatch(ml, out);
        true
    }
}

impl Broker {
    /// Read `read` ([`Output::ReadIssued`]) completed: its subscription
    /// filters the entries against the acks that landed meanwhile and
    /// dispatches them (then issues its next read). Returns false for a
    /// stale completion (the read was dropped by a seek, a rewind or an
    /// unsubscribe, or was never issued by this core), which changes
    /// nothing but a counter.
    pub fn complete_read(&mut self, read: ReadId, now_ms: u64) -> bool {
        self.commit_sends();
        self.tick(now_ms);
        for t in self.topics.values_mut() {
            for s in t.subscriptions.values_mut() {
                if s.complete_read(read, &t.ml, &mut self.out) {
                    return true;
                }
            }
        }
        self.out.stale_reads += 1;
        tracing::debug!(read, "stale read completion dropped");
        false
    }

    /// Every read issued and still queued completes now (a driver without
    /// read latency: `serve`): takes the [`Output::ReadIssued`] queued, in
    /// order, completes each and repeats until none is left, keeping every
    /// other output queued in its order. It does not end the turn (no
    /// [`Broker::flush`]); a read issued by the turn's end (its acks'
    /// commit dispatches) comes out of [`Broker::poll_output`]. Returns the
    /// completions delivered.
    pub fn complete_reads(&mut self, now_ms: u64) -> usize {
        let mut done = 0;
        loop {
            let reads: Vec<ReadId> = self
                .out
                .queue
                .iter()
                .filter_map(|o| match o {
                    Output::ReadIssued { read } => Some(*read),
                    _ => None,
                })
                .collect();
            if reads.is_empty() {
                return done;
            }
            // Outputs a turn's durable commit already covers stay counted
            // as such (`turn_commit.rs`): the reads taken from among them
            // leave that count.
            let covered = self
                .out
                .queue
                .iter()
                .take(self.out.durable)
                .filter(|o| matches!(o, Output::ReadIssued { .. }))
                .count();
            self.out.durable -= covered;
            self.out
                .queue
                .retain(|o| !matches!(o, Output::ReadIssued { .. }));
            for r in reads {
                self.complete_read(r, now_ms);
                done += 1;
            }
        }
    }
}
