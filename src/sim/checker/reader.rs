//! Readers as a client sees them (Pulsar's Reader: a non-durable
//! subscription opened at a start message id): [`DeliveryChecker::reader_open`],
//! [`DeliveryChecker::reader_read`], [`DeliveryChecker::reader_close`],
//! [`DeliveryChecker::reader_cursors_in_store`].
//!
//! A reader session opens at a start — earliest, latest, or a published
//! message id, inclusive or exclusive — and its *end* is what was published
//! (receipted) when it sent its SUBSCRIBE. Within one session:
//! - it reads every message after its start that was published before the
//!   session's end (a delayed message is not required: its delivery time
//!   may hold it back; a message in a ledger consumed-ledger trimming
//!   deleted before the session closed is not required either: a reader
//!   holds no ledger, Pulsar's readers rely on retention);
//! - it reads none before its start (inclusive: none below the start id;
//!   exclusive: not the start id either; latest: none published before the
//!   session's end);
//! - it reads no message twice, none never published (a copy of a send
//!   whose receipt was lost is no message of the run: the driver says
//!   which), and each producer's messages in that producer's publish order.
//!
//! A reader's acks and reads never move a durable subscription's state:
//! that needs no rule here, the durable subscriptions' own rules (every
//! message delivered and acknowledged on each, none lost) judge it while
//! readers run beside them. A reader is never persisted: the store's
//! cursor list, read at every (re)start, names no reader's subscription.
//!
//! Memory: the publish log the sessions are judged against holds every
//! message of the run (16 bytes each) once readers are on
//! ([`DeliveryChecker::enable_readers`]), nothing otherwise.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use super::{DeliveryChecker, MessageRef};
use crate::position::Position;

/// Where a reader session starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReaderStart {
    /// The first entry of the topic.
    Earliest,
    /// After the last entry.
    Latest,
    /// At this message (`startMessageIdInclusive`).
    Inclusive(MessageRef),
    /// After this message.
    Exclusive(MessageRef),
}

impl ReaderStart {
    /// Whether `m` comes after the start (a message the session may read).
    fn admits(self, m: MessageRef) -> bool {
        match self {
            ReaderStart::Earliest | ReaderStart::Latest => true,
            ReaderStart::Inclusive(s) => m >= s,
            ReaderStart::Exclusive(s) => m > s,
        }
    }
}

impl std::fmt::Display for ReaderStart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReaderStart::Earliest => write!(f, "earliest"),
            ReaderStart::Latest => write!(f, "latest"),
            ReaderStart::Inclusive(m) => write!(f, "{m} inclusive"),
            ReaderStart::Exclusive(m) => write!(f, "{m} exclusive"),
        }
    }
}

/// A reader session's handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ReaderSessionId(u64);

#[derive(Debug)]
struct Session {
    name: String,
    start: ReaderStart,
    /// Publish-log length at the open: the session's end.
    end: usize,
    /// Messages the session must still read (ordered by position, so the
    /// ones in trimmed ledgers are a prefix).
    expected: BTreeSet<MessageRef>,
    seen: HashSet<MessageRef>,
    /// Per producer, the last (sequence id, batch index) read.
    last: BTreeMap<usize, (u64, u32)>,
}

/// The readers' state (see the module docs).
#[derive(Debug, Default)]
pub(super) struct ReaderState {
    enabled: bool,
    /// Every message published, in publish order, with whether it is
    /// delayed.
    log: Vec<(MessageRef, bool)>,
    /// Message → its publish index.
    index: std::collections::HashMap<MessageRef, usize>,
    sessions: BTreeMap<ReaderSessionId, Session>,
    next: u64,
}

impl ReaderState {
    /// A message was published (registered by the checker).
    pub(super) fn published(&mut self, msg: MessageRef, deliver_at_ms: u64) {
        if !self.enabled {
            return;
        }
        self.index.entry(msg).or_insert(self.log.len());
        self.log.push((msg, deliver_at_ms > 0));
    }
}

impl DeliveryChecker {
    /// Keeps the publish log reader sessions are judged against (off by
    /// default: it holds every message of the run).
    pub fn enable_readers(&mut self) {
        self.reader.enabled = true;
    }

    /// A published message at `fraction` (0..=1) of the run's publish log:
    /// a reader's start id. `None` before anything was published.
    pub fn reader_start_candidate(&self, fraction: f64) -> Option<MessageRef> {
        let n = self.reader.log.len();
        if n == 0 {
            return None;
        }
        let i = ((n - 1) as f64 * fraction.clamp(0.0, 1.0)).round() as usize;
        Some(self.reader.log[i.min(n - 1)].0)
    }

    /// Reader subscription `name` sends its SUBSCRIBE from `start`: its
    /// session's end is what is published now.
    pub fn reader_open(&mut self, name: &str, start: ReaderStart) -> ReaderSessionId {
        let r = &mut self.reader;
        let end = r.log.len();
        let expected = match start {
            ReaderStart::Latest => BTreeSet::new(),
            _ => r.log[..end]
                .iter()
                .filter(|(m, delayed)| !delayed && start.admits(*m))
                .map(|(m, _)| *m)
                .collect(),
        };
        r.next += 1;
        let id = ReaderSessionId(r.next);
        r.sessions.insert(
            id,
            Session {
                name: name.to_string(),
                start,
                end,
                expected,
                seen: HashSet::new(),
                last: BTreeMap::new(),
            },
        );
        id
    }

    /// Session `id` read `msg`; `origin` is its producer, sequence id and
    /// batch index (from the payload), `copy` whether it is the copy of a
    /// send whose receipt was lost (no message of the run).
    pub fn reader_read(
        &mut self,
        id: ReaderSessionId,
        msg: MessageRef,
        origin: Option<(usize, u64, u32)>,
        copy: bool,
        now_ms: u64,
    ) {
        let Some(s) = self.reader.sessions.get_mut(&id) else {
            return;
        };
        let known = self.reader.index.get(&msg).copied();
        let mut bad = Vec::new();
        if !s.seen.insert(msg) {
            bad.push(format!("read {msg} twice"));
        }
        match known {
            None if !copy => bad.push(format!("read {msg}, never published")),
            None => {}
            Some(i) => {
                if !s.start.admits(msg) || (s.start == ReaderStart::Latest && i < s.end) {
                    bad.push(format!("read {msg}, before its start {}", s.start));
                }
                s.expected.remove(&msg);
                // A delayed message comes at its time (if the tracker
                // holds it): not in its producer's order.
                let delayed = self.reader.log[i].1;
                if let Some((p, seq, bi)) = origin.filter(|_| !delayed) {
                    // The same (sequence id, index) at a second position is
                    // a lost receipt's copy, not a reorder.
                    if let Some(prev) = s.last.insert(p, (seq, bi)) {
                        if prev > (seq, bi) {
                            bad.push(format!(
                                "read {msg} (producer p-{p} sequence id {seq} #{bi}) after p-{p} {} #{}: out of publish order",
                                prev.0, prev.1
                            ));
                        }
                    }
                }
            }
        }
        let name = s.name.clone();
        for what in bad {
            self.counts.reader_violations += 1;
            self.violation(now_ms, format!("reader {name}: {what}"));
        }
    }

    /// How many messages session `id` must still read, not counting those
    /// in ledgers before `first_kept_ledger` (deleted by consumed-ledger
    /// trimming).
    pub fn reader_remaining(&self, id: ReaderSessionId, first_kept_ledger: i64) -> usize {
        self.reader.sessions.get(&id).map_or(0, |s| {
            s.expected
                .range(
                    MessageRef {
                        position: Position::new(first_kept_ledger, -1),
                        batch_index: 0,
                    }..,
                )
                .count()
        })
    }

    /// Session `id` ends. `reached_end`: it closed because it read what it
    /// must (or gave up waiting for it): what it must still read (above
    /// `first_kept_ledger`) is missed. Otherwise it was cut (its
    /// connection or consumer lost): nothing is required of it. Returns
    /// the messages it missed.
    pub fn reader_close(
        &mut self,
        id: ReaderSessionId,
        reached_end: bool,
        first_kept_ledger: i64,
        now_ms: u64,
    ) -> usize {
        let missed = if reached_end {
            self.reader_remaining(id, first_kept_ledger)
        } else {
            0
        };
        let Some(s) = self.reader.sessions.remove(&id) else {
            return 0;
        };
        if missed > 0 {
            let first = s
                .expected
                .range(
                    MessageRef {
                        position: Position::new(first_kept_ledger, -1),
                        batch_index: 0,
                    }..,
                )
                .next()
                .copied();
            self.counts.reader_violations += missed as u64;
            self.violation(
                now_ms,
                format!(
                    "reader {}: missed {missed} messages published after its start {} before its end (first: {})",
                    s.name,
                    s.start,
                    first.map(|m| m.to_string()).unwrap_or_default()
                ),
            );
        }
        missed
    }

    /// The store's cursor list after a (re)start: a reader's cursor
    /// (`is_reader` names them) is a violation (never persisted).
    pub fn reader_cursors_in_store(
        &mut self,
        cursors: &[String],
        is_reader: impl Fn(&str) -> bool,
        now_ms: u64,
    ) {
        for c in cursors.iter().filter(|c| is_reader(c)) {
            self.counts.reader_violations += 1;
            self.violation(
                now_ms,
                format!("reader {c}: its cursor is in the store (a non-durable cursor is never persisted)"),
            );
        }
    }
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests {
    use super::super::{DeliveryChecker, MessageRef, OrderCheck};
    use super::ReaderStart;
    use crate::position::Position;

    fn m(e: i64) -> MessageRef {
        MessageRef {
            position: Position::new(3, e),
            batch_index: 0,
        }
    }

    fn checker(n: i64) -> DeliveryChecker {
        let mut c = DeliveryChecker::new(["s".to_string()], 0, OrderCheck::None);
        c.enable_readers();
        for e in 0..n {
            c.published(m(e), 0, 0);
        }
        c
    }

    fn violations(c: DeliveryChecker) -> (u64, Option<String>) {
        let (counts, first) = c.finish(100);
        (counts.reader_violations, first)
    }

    /// A session that reads everything after its start, in order, once,
    /// is clean; inclusive starts at the id, exclusive after it.
    #[test]
    fn a_session_reading_from_its_start_to_its_end_is_clean() {
        let mut c = checker(5);
        let s = c.reader_open("r", ReaderStart::Inclusive(m(2)));
        for e in 2..5 {
            c.reader_read(s, m(e), Some((0, e as u64, 0)), false, 1);
        }
        assert_eq!(c.reader_remaining(s, 0), 0);
        assert_eq!(c.reader_close(s, true, 0, 2), 0);
        let s = c.reader_open("r2", ReaderStart::Exclusive(m(2)));
        assert_eq!(c.reader_remaining(s, 0), 2, "3 and 4");
        let (v, first) = violations(c);
        assert_eq!(v, 0, "{first:?}");
    }

    /// The negative controls: each reader rule fails when broken.
    #[test]
    fn each_reader_rule_fails_when_broken() {
        // The exclusive start id itself.
        let mut c = checker(4);
        let s = c.reader_open("r", ReaderStart::Exclusive(m(1)));
        c.reader_read(s, m(1), None, false, 1);
        let (v, first) = violations(c);
        assert_eq!(v, 1);
        assert!(first.unwrap().contains("before its start"));
        // A message missed (not in a trimmed ledger).
        let mut c = checker(4);
        let s = c.reader_open("r", ReaderStart::Earliest);
        for e in [0, 1, 3] {
            c.reader_read(s, m(e), None, false, 1);
        }
        assert_eq!(c.reader_close(s, true, 0, 2), 1);
        let (v, first) = violations(c);
        assert_eq!(v, 1);
        assert!(first.unwrap().contains("missed 1"));
        // ... but not when its ledger was trimmed, nor in a cut session.
        let mut c = checker(2);
        let s = c.reader_open("r", ReaderStart::Earliest);
        assert_eq!(c.reader_close(s, true, 4, 2), 0);
        let s = c.reader_open("r", ReaderStart::Earliest);
        assert_eq!(c.reader_close(s, false, 0, 2), 0);
        assert_eq!(violations(c).0, 0);
        // Twice, never published, out of a producer's order, latest.
        let mut c = checker(4);
        let s = c.reader_open("r", ReaderStart::Earliest);
        c.reader_read(s, m(0), Some((0, 1, 0)), false, 1);
        c.reader_read(s, m(0), Some((0, 1, 0)), false, 1);
        c.reader_read(s, m(9), None, false, 1);
        c.reader_read(s, m(10), None, true, 1);
        c.reader_read(s, m(2), Some((1, 5, 0)), false, 1);
        c.reader_read(s, m(3), Some((1, 4, 0)), false, 1);
        let l = c.reader_open("l", ReaderStart::Latest);
        c.reader_read(l, m(3), None, false, 1);
        let (v, _) = violations(c);
        assert_eq!(v, 4, "twice, unknown, order, latest");
        // A reader's cursor in the store.
        let mut c = checker(0);
        c.reader_cursors_in_store(
            &["sub-0".into(), "reader-1-2".into()],
            |n| n.starts_with("reader-"),
            1,
        );
        assert_eq!(violations(c).0, 1);
    }
}
