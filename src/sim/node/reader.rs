//! Readers on the node engine (`faults.readers`): each reader client has
//! its own connection and speaks what Pulsar's Reader sends — a SUBSCRIBE
//! with `durable = false`, Exclusive, and a `start_message_id` (earliest,
//! latest, or a published message id), FLOW, cumulative ACKs (Pulsar's
//! `ReaderImpl` acknowledges cumulatively), CLOSE_CONSUMER — and filters
//! as Pulsar's client does: the broker starts a reader AT its start entry
//! (`broker::reader`), the client drops the messages of that entry before
//! the start's batch index, and the start itself unless inclusive
//! (`startMessageIdInclusive` is a client-side option).
//!
//! A session: the reader subscribes under a new name (`reader-R-N`, as
//! Pulsar's readers take a fresh subscription name), reads until it has
//! read what the checker says it must (everything published before it
//! subscribed, after its start, outside ledgers trimmed since) and a drawn
//! linger passed, closes, and opens the next session after a pause. A
//! session that waits longer than its stall bound for what it must read
//! is closed and judged (what it missed is a violation); one cut by a lost
//! connection, a restart, a crash or the broker closing its consumer is
//! not judged for completeness. The checker rules are
//! `sim::checker::reader`; after every (re)start the store's cursor list
//! is read: no reader's cursor may be in it.
//!
//! The one broker-side fact the driver reads is the topic's first kept
//! ledger (as the seek driver does for its reset): messages in ledgers
//! consumed-ledger trimming deleted are not required of a reader.

use rand::Rng;

use crate::broker::{FrameCutter, OutFrame};
use crate::ledger::LedgerStore;
use crate::proto::command::{ty, BrokerCommand};
use crate::proto::wire::{self, CommandAck, CommandFlow, CommandSubscribe, MessageIdData};
use crate::sim::checker::{MessageRef, ReaderSessionId, ReaderStart};
use crate::Position;

use super::{ClientRef, Ev, Node, TOPIC};
use crate::sim::scheduler::VirtualMs;

/// Every reader subscription's name starts so.
pub(super) const READER_PREFIX: &str = "reader-";
/// Permits a reader grants at a time (Pulsar's receiver queue default).
const READER_PERMITS: u32 = 1_000;
/// How often a reader session looks whether it is done, virtual ms.
const CHECK_MS: u64 = 200;
/// The pause between a reader's sessions, virtual ms: a session reads
/// the topic from its start, so the pause keeps readers from dominating a
/// long run's work.
const SESSION_PAUSE_MS: std::ops::RangeInclusive<u64> = 300..=2_000;
/// A session waiting longer than this with nothing read is judged
/// (besides the workload's outages and stall bound), virtual ms.
const STALL_MS: u64 = 30_000;

/// A reader's timed step.
#[derive(Debug)]
pub(super) enum ReaderEv {
    /// Reader `r` opens its next session.
    Open(usize),
    /// Reader `r` looks whether session `serial` is done or stalled.
    Check { r: usize, serial: u64 },
}

#[derive(Debug)]
struct Session {
    id: ReaderSessionId,
    /// Its consumer id on the connection (a new one per session).
    serial: u64,
    start: ReaderStart,
    subscribe_req: u64,
    subscribed: bool,
    linger_until: VirtualMs,
    last_progress: VirtualMs,
    /// Messages read since the last Flow.
    since_flow: u32,
}

/// One reader client.
#[derive(Debug, Default)]
pub(super) struct ReaderClient {
    conn: Option<u64>,
    cutter: FrameCutter,
    next_req: u64,
    serial: u64,
    session: Option<Session>,
}

/// The run's readers and what they did.
#[derive(Debug, Default)]
pub(super) struct ReaderSide {
    clients: Vec<ReaderClient>,
}

/// What the readers did (the report's node activity).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct ReaderActivity {
    /// Reader sessions opened (SUBSCRIBE with `durable = false` answered
    /// SUCCESS).
    pub opened: u64,
    /// Of those, sessions that read to their end and closed (judged).
    pub completed: u64,
    /// Sessions cut by a lost connection, a restart or crash, or the
    /// broker closing the consumer (not judged for completeness).
    pub cut: u64,
    /// Sessions by start: earliest / latest / inclusive id / exclusive id.
    pub starts: [u64; 4],
    /// Messages the reader applications read.
    pub messages_read: u64,
    /// Messages of a reader's start entry its client dropped (before the
    /// start, or the start itself when exclusive).
    pub dropped_by_start: u64,
    /// Cumulative ACKs readers sent.
    pub acks: u64,
    /// Store cursor lists read after a (re)start (no reader's cursor in
    /// them).
    pub store_checks: u64,
    /// Reader SUBSCRIBEs the core refused.
    pub refused: u64,
}

/// BaseCommand bytes of a reader's SUBSCRIBE: `CommandSubscribe` with
/// `start_message_id = 9` appended to the struct's bytes (the decoded
/// struct has no field for it), as a client encodes it.
fn subscribe_bytes(
    name: &str,
    consumer_id: u64,
    request_id: u64,
    start: &MessageIdData,
) -> Vec<u8> {
    use prost::Message;
    let mut s = CommandSubscribe {
        topic: TOPIC.into(),
        subscription: name.into(),
        sub_type: wire::SubType::Exclusive as i32,
        consumer_id,
        request_id,
        consumer_name: Some(name.into()),
        priority_level: None,
        durable: Some(false),
        initial_position: None,
        key_shared_meta: None,
        consumer_epoch: None,
    }
    .encode_to_vec();
    prost::encoding::message::encode(9, start, &mut s);
    let mut base = Vec::new();
    prost::encoding::int32::encode(1, &ty::SUBSCRIBE, &mut base);
    prost::encoding::bytes::encode(4, &s, &mut base);
    base
}

/// The `start_message_id` of `start`.
fn start_id(start: ReaderStart) -> MessageIdData {
    let at = |m: MessageRef| MessageIdData {
        ledger_id: m.position.ledger_id as u64,
        entry_id: m.position.entry_id as u64,
        ..Default::default()
    };
    match start {
        // Pulsar's MessageId.earliest: (-1, -1).
        ReaderStart::Earliest => MessageIdData {
            ledger_id: u64::MAX,
            entry_id: u64::MAX,
            ..Default::default()
        },
        // MessageId.latest: (Long.MAX_VALUE, Long.MAX_VALUE).
        ReaderStart::Latest => MessageIdData {
            ledger_id: i64::MAX as u64,
            entry_id: i64::MAX as u64,
            ..Default::default()
        },
        ReaderStart::Inclusive(m) | ReaderStart::Exclusive(m) => at(m),
    }
}

impl Node<'_> {
    /// Creates the workload's readers and schedules their connects.
    pub(super) fn setup_readers(&mut self) {
        let n = self.w.faults.readers;
        if n == 0 || !self.opts.faults {
            return;
        }
        self.checker.enable_readers();
        for r in 0..n as usize {
            self.readers.clients.push(ReaderClient::default());
            let at = self.rng.random_range(30..=100);
            self.sched.at(at, Ev::Connect(ClientRef::Reader(r)));
        }
    }

    /// The topic's first kept ledger on the live core (`i64::MIN` when none
    /// runs, or the topic has no ledger): what consumed-ledger trimming
    /// deleted lies before it. A core that has not opened the topic yet
    /// (the first SUBSCRIBE after a restart opens it) answers from its
    /// store's ledger list, the list the open will load: trimming deleted
    /// ledgers there too.
    pub(super) fn first_kept_ledger(&self) -> i64 {
        let Some(b) = self.broker.as_ref() else {
            return i64::MIN;
        };
        match b.topics().get(TOPIC) {
            Some(t) => t.ml.ledgers().first().map(|(l, _)| *l),
            None => b
                .store()
                .load_ledger(TOPIC)
                .ok()
                .and_then(|l| l.ledgers.keys().next().copied()),
        }
        .unwrap_or(i64::MIN)
    }

    /// After a (re)start, before the core opens: the store holds no
    /// reader's cursor.
    pub(super) fn readers_check_store(&mut self, store: &crate::ledger::RedbStore) {
        if self.readers.clients.is_empty() {
            return;
        }
        let now = self.now();
        match store.list_cursors(TOPIC) {
            Ok(cursors) => {
                self.node.readers.store_checks += 1;
                self.checker.reader_cursors_in_store(
                    &cursors,
                    |c| c.starts_with(READER_PREFIX),
                    now,
                );
            }
            Err(e) => self
                .checker
                .livelock(&format!("the store's cursor list does not read: {e}"), now),
        }
    }

    /// Reader `r`'s new connection `conn` (CONNECT follows).
    pub(super) fn readers_connecting(&mut self, r: usize, conn: u64) {
        let c = &mut self.readers.clients[r];
        c.conn = Some(conn);
        c.cutter = FrameCutter::default();
    }

    /// Reader `r`'s frame cutter.
    pub(super) fn readers_cutter(&mut self, r: usize) -> &mut FrameCutter {
        &mut self.readers.clients[r].cutter
    }

    /// Reader `r`'s connection `conn` is gone; whether it was its current
    /// one (then it reconnects). Its session is cut.
    pub(super) fn readers_connection_lost(&mut self, r: usize, conn: u64) -> bool {
        if self.readers.clients[r].conn != Some(conn) {
            return false;
        }
        self.readers.clients[r].conn = None;
        self.readers_cut(r);
        !self.done
    }

    /// Ends reader `r`'s session without judging its completeness.
    fn readers_cut(&mut self, r: usize) {
        if let Some(s) = self.readers.clients[r].session.take() {
            let now = self.now();
            self.checker.reader_close(s.id, false, i64::MIN, now);
            if s.subscribed {
                self.node.readers.cut += 1;
            }
        }
    }

    fn readers_send(&mut self, r: usize, command: Vec<u8>) {
        if let Some(conn) = self.readers.clients[r].conn {
            let bytes = OutFrame {
                command,
                payload: Vec::new(),
            }
            .encode();
            self.send_to_broker(conn, bytes);
        }
    }

    fn readers_send_cmd(&mut self, r: usize, cmd: &BrokerCommand) {
        use prost::Message;
        self.readers_send(r, cmd.encode_to_vec());
    }

    /// A reader's timed step.
    pub(super) fn reader_event(&mut self, e: ReaderEv) {
        match e {
            ReaderEv::Open(r) => self.readers_open(r),
            ReaderEv::Check { r, serial } => {
                let current = self.readers.clients[r]
                    .session
                    .as_ref()
                    .is_some_and(|s| s.serial == serial && s.subscribed);
                if current && !self.readers_maybe_done(r) {
                    self.sched
                        .after(CHECK_MS, Ev::Reader(ReaderEv::Check { r, serial }));
                }
            }
        }
    }

    /// Reader `r` opens a session at a drawn start.
    fn readers_open(&mut self, r: usize) {
        if self.done || self.readers.clients[r].conn.is_none() {
            return;
        }
        if self.readers.clients[r].session.is_some() {
            return;
        }
        let kind = self.rng.random_range(0..4usize);
        let fraction: f64 = self.rng.random();
        let candidate = self.checker.reader_start_candidate(fraction);
        let start = match (kind, candidate) {
            (1, _) => ReaderStart::Latest,
            (2, Some(m)) => ReaderStart::Inclusive(m),
            (3, Some(m)) => ReaderStart::Exclusive(m),
            _ => ReaderStart::Earliest,
        };
        let slot = match start {
            ReaderStart::Earliest => 0,
            ReaderStart::Latest => 1,
            ReaderStart::Inclusive(_) => 2,
            ReaderStart::Exclusive(_) => 3,
        };
        self.node.readers.starts[slot] += 1;
        let now = self.now();
        let linger = self.rng.random_range(0..=300);
        let c = &mut self.readers.clients[r];
        c.serial += 1;
        c.next_req += 1;
        let (serial, req) = (c.serial, c.next_req);
        let name = format!("{READER_PREFIX}{r}-{serial}");
        let id = self.checker.reader_open(&name, start);
        self.readers.clients[r].session = Some(Session {
            id,
            serial,
            start,
            subscribe_req: req,
            subscribed: false,
            linger_until: now + linger,
            last_progress: now,
            since_flow: 0,
        });
        let bytes = subscribe_bytes(&name, serial, req, &start_id(start));
        self.readers_send(r, bytes);
    }

    /// Reader `r`'s session is done when it read what it must and its
    /// linger passed, or judged when it stalled: it closes and the next
    /// opens after a pause. Whether it closed.
    fn readers_maybe_done(&mut self, r: usize) -> bool {
        let now = self.now();
        let Some(s) = self.readers.clients[r].session.as_ref() else {
            return true;
        };
        let first_kept = self.first_kept_ledger();
        let remaining = self.checker.reader_remaining(s.id, first_kept);
        let stall = STALL_MS + self.w.stall_bound_ms + 3 * self.w.faults.outage_ms;
        let stalled = now.saturating_sub(s.last_progress) > stall;
        if !stalled && (remaining > 0 || now < s.linger_until) {
            return false;
        }
        let Some(s) = self.readers.clients[r].session.take() else {
            return true;
        };
        self.checker.reader_close(s.id, true, first_kept, now);
        self.node.readers.completed += 1;
        self.readers.clients[r].next_req += 1;
        let req = self.readers.clients[r].next_req;
        self.readers_send_cmd(
            r,
            &BrokerCommand {
                r#type: ty::CLOSE_CONSUMER,
                close_consumer: Some(crate::proto::command::CommandIdRequest {
                    id: s.serial,
                    request_id: req,
                }),
                ..Default::default()
            },
        );
        let pause = self.rng.random_range(SESSION_PAUSE_MS);
        self.sched.after(pause, Ev::Reader(ReaderEv::Open(r)));
        true
    }

    /// A frame from the core to reader `r`.
    pub(super) fn readers_command(
        &mut self,
        r: usize,
        conn: u64,
        cmd: BrokerCommand,
        payload: &[u8],
    ) {
        let serial = self.readers.clients[r].session.as_ref().map(|s| s.serial);
        match cmd.r#type {
            ty::CONNECTED => self.readers_open(r),
            ty::SUCCESS => {
                let Some(ok) = cmd.success else { return };
                let now = self.now();
                let Some(s) = self.readers.clients[r]
                    .session
                    .as_mut()
                    .filter(|s| s.subscribe_req == ok.request_id)
                else {
                    return; // a CLOSE_CONSUMER's
                };
                s.subscribed = true;
                s.last_progress = now;
                let serial = s.serial;
                self.node.readers.opened += 1;
                self.readers_send_cmd(
                    r,
                    &BrokerCommand {
                        r#type: ty::FLOW,
                        flow: Some(CommandFlow {
                            consumer_id: serial,
                            message_permits: READER_PERMITS,
                        }),
                        ..Default::default()
                    },
                );
                self.sched
                    .after(CHECK_MS, Ev::Reader(ReaderEv::Check { r, serial }));
            }
            ty::ERROR => {
                let Some(e) = cmd.error else { return };
                let refused = self.readers.clients[r]
                    .session
                    .as_ref()
                    .is_some_and(|s| s.subscribe_req == e.request_id);
                if refused {
                    self.node.readers.refused += 1;
                    self.readers_cut(r);
                    let pause = self.rng.random_range(100..=300);
                    self.sched.after(pause, Ev::Reader(ReaderEv::Open(r)));
                }
            }
            // The broker closed the reader's consumer (a failed write):
            // Pulsar's reader subscribes again; here the next session opens.
            ty::CLOSE_CONSUMER => {
                let closed = cmd.close_consumer.map(|c| c.id);
                if closed.is_some() && closed == serial {
                    self.readers_cut(r);
                    let pause = self.rng.random_range(100..=300);
                    self.sched.after(pause, Ev::Reader(ReaderEv::Open(r)));
                }
            }
            ty::MESSAGE => {
                let Some(m) = cmd.message else { return };
                if Some(m.consumer_id) != serial {
                    return; // a closed session's
                }
                self.readers_message(r, conn, &m.message_id, payload);
            }
            _ => {}
        }
    }

    /// Reader `r` receives the entry at `id` (`payload`: its metadata and
    /// messages): the client drops what precedes its start in the start
    /// entry, the application reads the rest.
    fn readers_message(&mut self, r: usize, _conn: u64, id: &MessageIdData, payload: &[u8]) {
        let now = self.now();
        let position = Position::new(id.ledger_id as i64, id.entry_id as i64);
        let Ok(entry) = crate::proto::frame::parse_entry_payload(payload) else {
            self.checker.livelock(
                &format!("a reader got an entry at {position} that does not parse"),
                now,
            );
            return;
        };
        let bodies: Vec<Vec<u8>> = match entry.metadata.num_messages_in_batch {
            Some(n) => match crate::proto::frame::split_batch(entry.payload, n.max(0) as u32) {
                Ok(ms) => ms.into_iter().map(|m| m.payload.to_vec()).collect(),
                Err(e) => {
                    self.checker.livelock(
                        &format!("a reader got a batch at {position} that does not split: {e}"),
                        now,
                    );
                    return;
                }
            },
            None => vec![entry.payload.to_vec()],
        };
        let Some(s) = self.readers.clients[r].session.as_ref() else {
            return;
        };
        let (sid, start) = (s.id, s.start);
        let mut read = 0u32;
        for (i, body) in bodies.iter().enumerate() {
            let mref = MessageRef {
                position,
                batch_index: i as u32,
            };
            // Pulsar's client: within the start entry, what precedes the
            // start (and the start itself unless inclusive) is dropped.
            let dropped = match start {
                ReaderStart::Inclusive(s) => s.position == position && mref < s,
                ReaderStart::Exclusive(s) => s.position == position && mref <= s,
                _ => false,
            };
            read += 1;
            if dropped {
                self.node.readers.dropped_by_start += 1;
                continue;
            }
            let origin = super::client::payload_origin(body);
            let copy = origin.is_some_and(|(p, seq, _)| {
                self.producers.get(p).is_some_and(|pr| pr.is_uncertain(seq))
            });
            self.node.readers.messages_read += 1;
            self.checker.reader_read(sid, mref, origin, copy, now);
        }
        let s = self.readers.clients[r]
            .session
            .as_mut()
            .expect("the session read above");
        s.last_progress = now;
        s.since_flow += read;
        let serial = s.serial;
        if s.since_flow >= READER_PERMITS / 2 {
            let n = std::mem::take(&mut s.since_flow);
            self.readers_send_cmd(
                r,
                &BrokerCommand {
                    r#type: ty::FLOW,
                    flow: Some(CommandFlow {
                        consumer_id: serial,
                        message_permits: n,
                    }),
                    ..Default::default()
                },
            );
        }
        // Pulsar's reader acknowledges cumulatively as it reads: it only
        // moves the reader's own cursor, in memory.
        if self.rng.random_bool(0.05) {
            self.node.readers.acks += 1;
            self.readers_send_cmd(
                r,
                &BrokerCommand {
                    r#type: ty::ACK,
                    ack: Some(CommandAck {
                        consumer_id: serial,
                        ack_type: 1,
                        message_id: vec![MessageIdData {
                            ledger_id: id.ledger_id,
                            entry_id: id.entry_id,
                            ..Default::default()
                        }],
                        validation_error: None,
                        txnid_least_bits: None,
                        txnid_most_bits: None,
                        request_id: None,
                    }),
                    ..Default::default()
                },
            );
        }
        self.readers_maybe_done(r);
    }
}

/// The report's component for readers and unsubscribes of a node run
/// whose workload asks for them (`faults.readers`, `faults.unsubscribes`;
/// `None` when it asks for neither): NOT EXERCISED when a key counter of
/// what it asked for is zero.
pub(super) fn component(
    a: &ReaderActivity,
    u: &super::unsubscribe::UnsubActivity,
    readers_asked: bool,
    unsubscribes_asked: bool,
) -> Option<crate::sim::report::ComponentReport> {
    if !readers_asked && !unsubscribes_asked {
        return None;
    }
    Some(crate::sim::report::ComponentReport::new(
        "readers (non-durable cursors) + unsubscribe, over the wire",
        &[
            ("reader sessions opened", a.opened, readers_asked),
            (
                "reader sessions read to their end",
                a.completed,
                readers_asked,
            ),
            ("messages read by readers", a.messages_read, readers_asked),
            ("reader sessions cut", a.cut, false),
            (
                "start-entry messages the reader client dropped",
                a.dropped_by_start,
                false,
            ),
            ("store cursor lists without a reader", a.store_checks, false),
            ("unsubscribes applied", u.applied, unsubscribes_asked),
            ("unsubscribes refused (others attached)", u.refused, false),
            (
                "subscriptions created again",
                u.recreated,
                unsubscribes_asked,
            ),
        ],
    ))
}

#[cfg(test)]
mod tests {
    use super::super::unsubscribe::UnsubActivity;
    use super::*;

    /// Not asked for: not listed. Asked for without work: NOT EXERCISED,
    /// naming the zero key counters of what was asked for only.
    #[test]
    fn the_component_is_listed_when_asked_for_and_not_exercised_without_work() {
        let (r, u) = (ReaderActivity::default(), UnsubActivity::default());
        assert!(component(&r, &u, false, false).is_none());
        let c = component(&r, &u, true, false).expect("asked for readers");
        assert!(!c.exercised);
        assert!(c.missing().contains(&"reader sessions opened"));
        assert!(!c.missing().contains(&"unsubscribes applied"));
        let r = ReaderActivity {
            opened: 2,
            completed: 1,
            messages_read: 5,
            ..ReaderActivity::default()
        };
        assert!(component(&r, &u, true, false).unwrap().exercised);
        assert!(!component(&r, &u, true, true).unwrap().exercised);
    }
}
