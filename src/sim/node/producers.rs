//! Producer access modes and unique names on the node engine
//! (`faults.producer_access_modes`): the workload's producers open their
//! producer on the one topic in a drawn access mode (PIP-68: `Shared`,
//! `Exclusive`, `WaitForExclusive`, `ExclusiveWithFencing`), each keeping
//! its name (`p-N`) across opens, so deduplication and the stored-once
//! rule keep their meaning. What a client does, as Pulsar's does:
//!
//! - refused (ERROR `ProducerBusy` / `ProducerFenced`): the connection is
//!   closed and the application opens the producer again after a backoff,
//!   with a new draw; what it had sent without a receipt is resent then;
//! - queued (`WaitForExclusive`: PRODUCER_SUCCESS `producer_ready =
//!   false`): it sends nothing until the second PRODUCER_SUCCESS;
//! - fenced (CLOSE_PRODUCER from the core): it reconnects likewise;
//! - admitted: it publishes; after a receipt with nothing pending it
//!   releases the topic with a drawn chance, and always once it has sent
//!   everything (CLOSE_PRODUCER and its SUCCESS, or its connection dropped
//!   as a crashed application's), then opens again unless done;
//! - admitted, it sometimes asks for a second producer (producer id 2, on
//!   the same connection, `Shared`) of its own name: Pulsar answers
//!   `ProducerBusy` (a name conflict, or an exclusive holder), the
//!   application keeps its first producer.
//!
//! The checker (`sim::checker::producers`) is told every admission,
//! queueing, release and receipt as the client sees it. A SEND sent after
//! the checker judged its admission fenced out is not counted as possibly
//! stored when its connection is lost (it must have been refused), so a
//! delivery of it is an unknown message for the checker.

use std::collections::BTreeSet;

use rand::Rng;
use serde::Serialize;

use crate::proto::command::{self, server_error, ty, BrokerCommand};

use super::wire::frame;
use super::{ClientRef, Node, TOPIC};

/// `ProducerAccessMode` wire values.
const SHARED: i32 = 0;
const WAIT_FOR_EXCLUSIVE: i32 = 2;
const EXCLUSIVE_WITH_FENCING: i32 = 3;
/// The producer id of a producer's same-name second producer.
const TWIN_ID: u64 = 2;
/// Chance that an admitted producer asks for a second one of its name.
const TWIN_CHANCE: f64 = 0.3;
/// Chance that a producer releases the topic after a receipt that left
/// nothing pending.
const RELEASE_CHANCE: f64 = 0.15;

/// What the access-mode clients did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AccessActivity {
    /// PRODUCER commands sent, by access mode asked.
    pub opened_shared: u64,
    /// `Exclusive` asked.
    pub opened_exclusive: u64,
    /// `WaitForExclusive` asked.
    pub opened_wait_for_exclusive: u64,
    /// `ExclusiveWithFencing` asked.
    pub opened_fencing: u64,
    /// Admissions in `Shared` mode.
    pub shared_grants: u64,
    /// Admissions in an exclusive mode (promotions included).
    pub exclusive_grants: u64,
    /// ERROR `ProducerBusy` answers to a PRODUCER.
    pub producer_busy: u64,
    /// ERROR `ProducerFenced` answers to a PRODUCER.
    pub producer_fenced: u64,
    /// CLOSE_PRODUCER from the core (fenced out by `ExclusiveWithFencing`).
    pub fenced_out: u64,
    /// `WaitForExclusive` producers queued (`producer_ready = false`).
    pub queued: u64,
    /// Queued producers later admitted (the second PRODUCER_SUCCESS).
    pub waited_then_promoted: u64,
    /// Second producers of a live name refused with `ProducerBusy`.
    pub same_name_refused: u64,
    /// Releases by CLOSE_PRODUCER.
    pub released_by_close: u64,
    /// Releases by dropping the connection.
    pub released_by_drop: u64,
    /// SENDs sent after their admission was fenced out (each must go
    /// unreceipted).
    pub sends_after_fence: u64,
}

/// One producer's access-mode state.
#[derive(Debug, Default)]
struct PerProducer {
    /// The mode asked on the current connection.
    mode: i32,
    /// The current PRODUCER's request id.
    request_id: Option<u64>,
    /// Queued (`producer_ready = false` seen, not yet promoted).
    queued: bool,
    /// The checker's id of the current admission.
    admission: Option<u64>,
    /// The same-name second producer's PRODUCER request id.
    twin_req: Option<u64>,
    /// The CLOSE_PRODUCER request id of a release.
    close_req: Option<u64>,
    /// Done: sent everything and released; never opens again.
    retired: bool,
    /// Sequence ids sent (since their last receipt) under a live admission.
    valid_sent: BTreeSet<u64>,
    /// Sequence ids sent under the current admission after it was fenced
    /// out.
    void_sent: BTreeSet<u64>,
}

/// The access-mode side of the node.
#[derive(Debug, Default)]
pub(super) struct AccessSide {
    per: Vec<PerProducer>,
    pub(super) activity: AccessActivity,
}

fn label(p: usize, conn: u64) -> String {
    format!("p-{p} (connection {conn})")
}

impl Node<'_> {
    fn access_on(&self) -> bool {
        self.w.faults.producer_access_modes > 0.0
    }

    fn per(&mut self, p: usize) -> &mut PerProducer {
        if self.access.per.len() <= p {
            self.access.per.resize_with(p + 1, PerProducer::default);
        }
        &mut self.access.per[p]
    }

    /// The access mode producer `p` opens with (PRODUCER `request_id`):
    /// `None` (Shared, no field) without the knob.
    pub(super) fn access_open(&mut self, p: usize, request_id: u64) -> Option<i32> {
        if !self.access_on() {
            return None;
        }
        let mode = if self.rng.random_bool(self.w.faults.producer_access_modes) {
            self.rng.random_range(1..=3)
        } else {
            SHARED
        };
        let a = &mut self.access.activity;
        match mode {
            SHARED => a.opened_shared += 1,
            WAIT_FOR_EXCLUSIVE => a.opened_wait_for_exclusive += 1,
            EXCLUSIVE_WITH_FENCING => a.opened_fencing += 1,
            _ => a.opened_exclusive += 1,
        }
        let per = self.per(p);
        per.mode = mode;
        per.request_id = Some(request_id);
        per.queued = false;
        Some(mode)
    }

    /// PRODUCER_SUCCESS `s` for producer `p` on `conn`: whether the
    /// producer is ready to publish now.
    pub(super) fn access_success(
        &mut self,
        p: usize,
        conn: u64,
        s: &command::CommandProducerSuccess,
    ) -> bool {
        if !self.access_on() {
            return true;
        }
        let now = self.now();
        let per = self.per(p);
        if per.twin_req == Some(s.request_id) {
            per.twin_req = None;
            self.checker
                .same_name_admitted(&format!("p-{p} on connection {conn}"), now);
            self.send_close_producer(conn, TWIN_ID, u64::MAX - 1);
            return false;
        }
        if per.request_id != Some(s.request_id) || per.admission.is_some() {
            return false;
        }
        if s.producer_ready == Some(false) {
            per.queued = true;
            self.access.activity.queued += 1;
            self.checker.producer_queued(&label(p, conn));
            return false;
        }
        let (mode, promoted) = (per.mode, std::mem::take(&mut per.queued));
        let exclusive = mode != SHARED;
        let id = self.checker.producer_granted(
            &label(p, conn),
            exclusive,
            mode == EXCLUSIVE_WITH_FENCING,
            promoted,
            now,
        );
        let per = self.per(p);
        per.admission = Some(id);
        per.void_sent.clear();
        let a = &mut self.access.activity;
        if exclusive {
            a.exclusive_grants += 1;
        } else {
            a.shared_grants += 1;
        }
        if promoted {
            a.waited_then_promoted += 1;
        }
        if self.rng.random_bool(TWIN_CHANCE) {
            let pr = &mut self.producers[p];
            pr.next_req += 1;
            let req = pr.next_req;
            self.per(p).twin_req = Some(req);
            let c = BrokerCommand {
                r#type: ty::PRODUCER,
                producer: Some(command::CommandProducer {
                    topic: TOPIC.into(),
                    producer_id: TWIN_ID,
                    request_id: req,
                    producer_name: Some(format!("p-{p}")),
                    producer_access_mode: Some(SHARED),
                    topic_epoch: None,
                }),
                ..Default::default()
            };
            self.send_to_broker(conn, frame(&c, Vec::new()));
        }
        true
    }

    /// ERROR `e` for a request of producer `p`: whether it is handled here
    /// (the same-name second producer's refusal: the connection stays).
    pub(super) fn access_error(&mut self, p: usize, conn: u64, e: &command::CommandError) -> bool {
        if !self.access_on() {
            return false;
        }
        let per = self.per(p);
        let twin = per.twin_req == Some(e.request_id);
        let own = per.request_id == Some(e.request_id);
        if twin {
            per.twin_req = None;
        }
        if own && std::mem::take(&mut per.queued) {
            self.checker.producer_waiter_left(&label(p, conn));
        }
        if twin || own {
            let a = &mut self.access.activity;
            match e.error {
                server_error::PRODUCER_BUSY if twin => a.same_name_refused += 1,
                server_error::PRODUCER_BUSY => a.producer_busy += 1,
                server_error::PRODUCER_FENCED => a.producer_fenced += 1,
                _ => {}
            }
        }
        twin
    }

    /// CLOSE_PRODUCER from the core for producer `p`'s producer `id`:
    /// whether the client closes its connection and opens again (the
    /// main producer was fenced out).
    pub(super) fn access_closed_by_core(&mut self, id: u64) -> bool {
        if !self.access_on() || id == TWIN_ID {
            return false;
        }
        self.access.activity.fenced_out += 1;
        true
    }

    /// SUCCESS `request_id` for producer `p` on `conn`: a release by
    /// CLOSE_PRODUCER completes (the connection is closed; the producer
    /// opens again unless it is done).
    pub(super) fn access_success_answer(&mut self, p: usize, conn: u64, request_id: u64) {
        if !self.access_on() || self.per(p).close_req != Some(request_id) {
            return;
        }
        self.close_conn(conn);
        self.connection_lost(conn, ClientRef::Producer(p), false);
    }

    /// Producer `p` sends sequence id `seq`: recorded as sent under a live
    /// or a fenced-out admission.
    pub(super) fn access_sending(&mut self, p: usize, seq: u64) {
        if !self.access_on() {
            return;
        }
        let Some(id) = self.per(p).admission else {
            return;
        };
        if self.checker.producer_void(id) {
            self.access.activity.sends_after_fence += 1;
            self.per(p).void_sent.insert(seq);
        } else {
            self.per(p).valid_sent.insert(seq);
        }
    }

    /// A receipt for producer `p`'s sequence id `seq` on `conn`.
    pub(super) fn access_receipt(&mut self, p: usize, conn: u64, seq: u64) {
        if !self.access_on() {
            return;
        }
        let now = self.now();
        let per = self.per(p);
        per.valid_sent.remove(&seq);
        if per.void_sent.remove(&seq) {
            self.checker
                .fenced_send_receipted(&format!("{} sequence id {seq}", label(p, conn)), now);
        }
    }

    /// Whether a lost connection leaves producer `p`'s send `seq` possibly
    /// stored: not when every SEND of it went after a fence.
    pub(super) fn access_may_be_stored(&self, p: usize, seq: u64) -> bool {
        self.access
            .per
            .get(p)
            .is_none_or(|per| !per.void_sent.contains(&seq) || per.valid_sent.contains(&seq))
    }

    /// Producer `p` with nothing pending may release the topic (always
    /// once it has sent everything).
    pub(super) fn access_maybe_release(&mut self, p: usize) {
        if !self.access_on() {
            return;
        }
        let pr = &self.producers[p];
        let Some(conn) = pr.conn.filter(|_| pr.ready) else {
            return;
        };
        if !pr.pending.is_empty() || self.per(p).close_req.is_some() {
            return;
        }
        let done = self.producers[p].to_create == 0;
        if !done && !self.rng.random_bool(RELEASE_CHANCE) {
            return;
        }
        if done {
            self.per(p).retired = true;
        }
        self.producers[p].ready = false;
        if self.rng.random_bool(0.5) {
            let pr = &mut self.producers[p];
            pr.next_req += 1;
            let req = pr.next_req;
            self.per(p).close_req = Some(req);
            if let Some(id) = self.per(p).admission {
                self.checker.producer_closing(id);
            }
            self.access.activity.released_by_close += 1;
            self.send_close_producer(conn, super::client::PRODUCER_ID, req);
        } else {
            self.access.activity.released_by_drop += 1;
            self.close_conn(conn);
            self.connection_lost(conn, ClientRef::Producer(p), false);
        }
    }

    /// Producer `p`'s connection is gone: its admission or queue place
    /// ends. Whether it opens again (not once done).
    pub(super) fn access_conn_lost(&mut self, p: usize, conn: u64) -> bool {
        if !self.access_on() {
            return true;
        }
        let per = self.per(p);
        let admission = per.admission.take();
        let queued = std::mem::take(&mut per.queued);
        per.twin_req = None;
        per.close_req = None;
        per.request_id = None;
        let retired = per.retired;
        if let Some(id) = admission {
            self.checker.producer_left(id);
        }
        if queued {
            self.checker.producer_waiter_left(&label(p, conn));
        }
        !retired
    }

    fn send_close_producer(&mut self, conn: u64, id: u64, request_id: u64) {
        let c = BrokerCommand {
            r#type: ty::CLOSE_PRODUCER,
            close_producer: Some(command::CommandIdRequest { id, request_id }),
            ..Default::default()
        };
        self.send_to_broker(conn, frame(&c, Vec::new()));
    }
}

/// The report's component for the access modes (`None` unless asked).
pub(super) fn component(
    a: &AccessActivity,
    asked: bool,
) -> Option<crate::sim::report::ComponentReport> {
    if !asked {
        return None;
    }
    Some(crate::sim::report::ComponentReport::new(
        "producer access modes and names (PIP-68), over the wire",
        &[
            ("exclusive admissions", a.exclusive_grants, true),
            ("shared admissions", a.shared_grants, true),
            ("PRODUCER refused ProducerFenced", a.producer_fenced, false),
            ("PRODUCER refused ProducerBusy", a.producer_busy, false),
            (
                "same-name producers refused ProducerBusy",
                a.same_name_refused,
                true,
            ),
            ("fenced out by ExclusiveWithFencing", a.fenced_out, false),
            ("WaitForExclusive queued", a.queued, false),
            ("WaitForExclusive promoted", a.waited_then_promoted, false),
            (
                "SENDs after a fence (none receipted)",
                a.sends_after_fence,
                false,
            ),
            ("releases by CLOSE_PRODUCER", a.released_by_close, false),
            (
                "releases by a dropped connection",
                a.released_by_drop,
                false,
            ),
        ],
    ))
}
