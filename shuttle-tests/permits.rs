//! shuttle: N consumers end to end through the real broker
//! (`SharedDispatcher` / `Consumer::send_messages`) and the real client
//! (`ClientConsumer`, `ConsumerPermitState`, `ClientConnection`), with random
//! reconnects, same-connection recreates, corrupted batches (checksum,
//! invalid / inconsistent explicit P, truncated mid-batch), partial batches
//! (ack_set), compacted-out messages, admission rejections and write
//! failures, under random and PCT schedules.
//!
//! Threads: one broker dispatcher, and per consumer a connection task and
//! an application thread that dequeues messages and returns their permits.
//!
//! Checks:
//! - the broker never credits a Flow to an incarnation other than the one
//!   whose credit it carries;
//! - per incarnation: Σ P of its settled commands = command returns +
//!   message returns (accepted or stale), each message returning once;
//! - for each consumer's final incarnation: Σ P settled by the client =
//!   Σ P the broker debited = Σ permits returned;
//! - once the application drained everything, broker permits + the
//!   client's undrained accumulator = receiver queue size, and after
//!   flushing the residual the broker holds exactly the receiver queue.
//!
//! Negative control: a test-only model whose permit accumulator is shared
//! across incarnations (not replaced on recreate); shuttle must find the
//! schedule where the broker ends with more than the receiver queue.
//!
//! This end-to-end world draws its choices from shuttle's scheduler RNG, so
//! it runs under shuttle only. The smaller replacement scenario of
//! `tests/scenarios/permits.rs` (and its negative control) runs here and
//! under loom (`loom-tests/permits.rs`).
#![cfg(feature = "shuttle")]

#[path = "../tests/scenarios/permits.rs"]
mod shared;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use pulsar_core::__model::sync::{thread, Arc, AtomicU64, Mutex, Ordering};
use pulsar_core::permits::broker::{BrokerEntry, BrokerPermitError, ConsumerKey, SharedDispatcher};
use pulsar_core::permits::client::{
    encode_entry_payload, ClientConnection, ClientConsumer, ClientFrame, CloseReason,
    CommandOutcomeKind, Incarnation, ReturnOutcome,
};
use pulsar_core::proto::metadata::{MessageMetadata, SingleMessageMetadata};
use pulsar_core::proto::wire::{ack_set_from_indexes, CommandMessage};
use pulsar_core::Position;
use shuttle::rand::{thread_rng, Rng};

/// Coverage counters over all iterations (plain std atomics: statistics,
/// not model state).
mod stats {
    use std::sync::atomic::{AtomicUsize, Ordering};
    pub static DELIVERED: AtomicUsize = AtomicUsize::new(0);
    pub static CORRUPTED: AtomicUsize = AtomicUsize::new(0);
    pub static MID_BATCH: AtomicUsize = AtomicUsize::new(0);
    pub static PROTOCOL: AtomicUsize = AtomicUsize::new(0);
    pub static STALE_CMD: AtomicUsize = AtomicUsize::new(0);
    pub static RESUBSCRIBE: AtomicUsize = AtomicUsize::new(0);
    pub static WRITE_FAIL: AtomicUsize = AtomicUsize::new(0);
    pub static STALE_TOKEN: AtomicUsize = AtomicUsize::new(0);
    pub fn bump(c: &AtomicUsize) {
        c.fetch_add(1, Ordering::Relaxed);
    }
    pub fn report(name: &str) {
        let g = |c: &AtomicUsize| c.load(Ordering::Relaxed);
        println!(
            "{name}: commands delivered {} (mid-batch failures {}), corrupted {}, protocol closes {}, stale-incarnation commands {}, resubscribes {}, write failures {}, stale message returns {}",
            g(&DELIVERED), g(&MID_BATCH), g(&CORRUPTED), g(&PROTOCOL), g(&STALE_CMD), g(&RESUBSCRIBE), g(&WRITE_FAIL), g(&STALE_TOKEN)
        );
    }
}

const RQ: u32 = 6;
const CONSUMERS: u64 = 2;
const BROKER_STEPS: usize = 12;
const TASK_STEPS: usize = 14;
const APP_STEPS: usize = 12;
const ITERATIONS: usize = 5_000;

enum Down {
    Message(CommandMessage, Vec<u8>),
    SubscribeSuccess(Incarnation),
    ClosedByBroker(Incarnation),
}

#[derive(Default)]
struct Broker {
    dispatcher: SharedDispatcher,
    registered: BTreeMap<ConsumerKey, Incarnation>,
    down: BTreeMap<u64, VecDeque<Down>>,
    closed_connections: BTreeSet<u64>,
    debited: BTreeMap<Incarnation, u64>,
    next_entry: i64,
}

impl Broker {
    fn apply_frames(&mut self, connection_id: u64, frames: Vec<ClientFrame>) {
        if self.closed_connections.contains(&connection_id) {
            return;
        }
        for frame in frames {
            match frame {
                ClientFrame::Subscribe {
                    consumer_id,
                    incarnation,
                } => {
                    let key = ConsumerKey {
                        connection_id,
                        consumer_id,
                    };
                    self.dispatcher
                        .add_consumer(key, 0)
                        .expect("client closes before it re-subscribes");
                    self.registered.insert(key, incarnation);
                    self.down
                        .entry(connection_id)
                        .or_default()
                        .push_back(Down::SubscribeSuccess(incarnation));
                }
                ClientFrame::Flow {
                    incarnation,
                    command,
                } => {
                    let key = ConsumerKey {
                        connection_id,
                        consumer_id: command.consumer_id,
                    };
                    if self.dispatcher.consumer(key).is_some() {
                        let reg = self.registered[&key];
                        assert_eq!(
                            reg, incarnation,
                            "Flow of {incarnation:?} credited to incarnation {reg:?}"
                        );
                    }
                    match self.dispatcher.consumer_flow(key, command.message_permits) {
                        Ok(()) | Err(BrokerPermitError::UnknownConsumer(_)) => {}
                        Err(e) => panic!("unexpected Flow error {e}"),
                    }
                }
                ClientFrame::CloseConsumer {
                    consumer_id,
                    incarnation,
                } => {
                    let key = ConsumerKey {
                        connection_id,
                        consumer_id,
                    };
                    if self.registered.get(&key) == Some(&incarnation) {
                        self.registered.remove(&key);
                        let _ = self.dispatcher.remove_consumer(key);
                    }
                }
                ClientFrame::AckValidationError { .. }
                | ClientFrame::RedeliverUnacknowledged { .. } => {}
            }
        }
    }

    fn close_connection(&mut self, connection_id: u64) {
        self.dispatcher.remove_connection(connection_id);
        self.registered
            .retain(|k, _| k.connection_id != connection_id);
        self.down.remove(&connection_id);
        self.closed_connections.insert(connection_id);
    }

    /// One dispatch round to a random consumer with permits.
    fn dispatch_step(&mut self) {
        let mut rng = thread_rng();
        let ready: Vec<ConsumerKey> = self
            .dispatcher
            .consumers()
            .filter(|c| c.available_permits() > 0)
            .map(|c| c.key())
            .collect();
        if ready.is_empty() {
            return;
        }
        let key = ready[rng.gen_range(0..ready.len())];
        let mut entries = Vec::new();
        for _ in 0..rng.gen_range(1..=2) {
            let b: u32 = rng.gen_range(1..=5);
            let ack_set = if b > 1 && rng.gen_bool(0.3) {
                ack_set_from_indexes((0..b).filter(|_| rng.gen_bool(0.5)))
            } else {
                Vec::new()
            };
            entries.push(BrokerEntry {
                position: Position::new(1, self.next_entry),
                batch_size: b,
                ack_set,
            });
            self.next_entry += 1;
        }
        let sizes: BTreeMap<i64, u32> = entries
            .iter()
            .map(|e| (e.position.entry_id, e.batch_size))
            .collect();
        let mut admission = |_k: ConsumerKey, _e: &BrokerEntry| !thread_rng().gen_bool(0.15);
        let dispatch = self
            .dispatcher
            .send_to_consumer(key, entries, &mut admission)
            .expect("consumer is registered");
        let _ = self.dispatcher.take_replay();
        assert_eq!(
            self.dispatcher.total_available_permits(),
            self.dispatcher.sum_consumer_permits(),
            "dispatcher debit differs from consumer debit"
        );
        let Some(write_id) = dispatch.write_id else {
            return;
        };
        let inc = self.registered[&key];
        *self.debited.entry(inc).or_default() += u64::from(dispatch.result.total_permits());
        if rng.gen_bool(0.05) {
            // asynchronous write failure: consumer removed, no re-credit
            let removed = self
                .dispatcher
                .on_write_complete(write_id, Err("write failed".into()))
                .unwrap();
            assert!(removed.is_some());
            stats::bump(&stats::WRITE_FAIL);
            self.registered.remove(&key);
            self.down
                .entry(key.connection_id)
                .or_default()
                .push_back(Down::ClosedByBroker(inc));
            return;
        }
        self.dispatcher.on_write_complete(write_id, Ok(())).unwrap();
        for mut cmd in dispatch.commands {
            let b = sizes[&(cmd.message_id.entry_id as i64)];
            let md = MessageMetadata {
                producer_name: "p".into(),
                num_messages_in_batch: (b > 1 || rng.gen_bool(0.5)).then_some(b as i32),
                ..Default::default()
            };
            let mut msgs: Vec<_> = (0..b)
                .map(|i| {
                    (
                        SingleMessageMetadata {
                            payload_size: 1,
                            compacted_out: rng.gen_bool(0.1).then_some(true),
                            ..Default::default()
                        },
                        vec![i as u8],
                    )
                })
                .collect();
            let roll: f64 = rng.gen();
            let mut payload;
            if roll < 0.06 && md.num_messages_in_batch.is_some() {
                // truncated mid-batch (valid checksum)
                msgs.last_mut().unwrap().0.payload_size = 40;
                payload = encode_entry_payload(&md, &msgs);
            } else {
                payload = encode_entry_payload(&md, &msgs);
                if roll < 0.12 {
                    let last = payload.len() - 1;
                    payload[last] ^= 0x5A; // checksum mismatch
                } else if roll < 0.15 {
                    cmd.message_permits = cmd.message_permits.map(|p| p + 1); // inconsistent
                } else if roll < 0.17 {
                    cmd.message_permits = Some(0); // invalid
                }
            }
            self.down
                .entry(key.connection_id)
                .or_default()
                .push_back(Down::Message(cmd, payload));
        }
    }
}

#[derive(Default, Debug, Clone, Copy)]
struct IncTally {
    settled_p: u64,
    cmd_returned: u64,
    token_accepted: u64,
    token_stale: u64,
}

struct World {
    broker: Mutex<Broker>,
    consumers: Vec<Mutex<ClientConsumer>>,
    tally: Mutex<BTreeMap<Incarnation, IncTally>>,
    next_connection: AtomicU64,
}

impl World {
    fn new() -> Arc<Self> {
        let mut consumers = Vec::new();
        for c in 0..CONSUMERS {
            let conn = Arc::new(ClientConnection::new(c + 1));
            consumers.push(Mutex::new(ClientConsumer::subscribe(conn, c, RQ).unwrap()));
        }
        let world = Arc::new(World {
            broker: Mutex::new(Broker::default()),
            consumers,
            tally: Mutex::new(BTreeMap::new()),
            next_connection: AtomicU64::new(100),
        });
        for c in 0..CONSUMERS as usize {
            let consumer = world.consumers[c].lock();
            world.deliver(&consumer);
        }
        world
    }

    /// Connection task: flush Flow requests, send the outbox to the broker.
    fn deliver(&self, consumer: &ClientConsumer) {
        let conn = consumer.connection();
        conn.flush_flows();
        let frames = conn.take_outbox();
        self.broker.lock().apply_frames(conn.id(), frames);
    }

    fn resubscribe(&self, consumer: &mut ClientConsumer, new_connection: bool) {
        let old = Arc::clone(consumer.connection());
        let target = if new_connection || old.is_closed() {
            if !old.is_closed() {
                old.close(CloseReason::Requested);
            }
            self.broker.lock().close_connection(old.id());
            let id = self.next_connection.fetch_add(1, Ordering::Relaxed);
            Arc::new(ClientConnection::new(id))
        } else {
            old
        };
        let r = consumer.resubscribe(target).unwrap();
        stats::bump(&stats::RESUBSCRIBE);
        self.tally.lock().entry(r.previous).or_default().token_stale += u64::from(r.cleared);
        self.deliver(consumer);
    }

    /// Handles one frame from the broker; false if there was none.
    fn receive_one(&self, consumer: &mut ClientConsumer) -> bool {
        let conn_id = consumer.connection().id();
        let next = self
            .broker
            .lock()
            .down
            .get_mut(&conn_id)
            .and_then(|q| q.pop_front());
        let Some(down) = next else { return false };
        match down {
            Down::Message(cmd, payload) => {
                let inc = consumer.state().incarnation();
                let out = consumer.handle_message(&cmd, &payload).unwrap();
                match &out.kind {
                    CommandOutcomeKind::ProtocolError(_) => stats::bump(&stats::PROTOCOL),
                    CommandOutcomeKind::StaleIncarnation => stats::bump(&stats::STALE_CMD),
                    CommandOutcomeKind::Corrupted(_) => stats::bump(&stats::CORRUPTED),
                    CommandOutcomeKind::Delivered {
                        failed_mid_batch, ..
                    } => {
                        stats::bump(&stats::DELIVERED);
                        if *failed_mid_batch {
                            stats::bump(&stats::MID_BATCH);
                        }
                    }
                    CommandOutcomeKind::StaleEpoch => {}
                }
                match out.kind {
                    CommandOutcomeKind::ProtocolError(_) | CommandOutcomeKind::StaleIncarnation => {
                        assert_eq!((out.permits, out.returned), (0, 0));
                    }
                    _ => {
                        assert_eq!(out.delivered + out.returned, out.permits, "{out:?}");
                        let mut t = self.tally.lock();
                        let e = t.entry(inc).or_default();
                        e.settled_p += u64::from(out.permits);
                        e.cmd_returned += u64::from(out.returned);
                    }
                }
            }
            Down::SubscribeSuccess(inc) => {
                let _ = consumer.subscribe_succeeded(inc);
            }
            Down::ClosedByBroker(inc) => {
                if consumer.state().incarnation() == inc && !consumer.connection().is_closed() {
                    self.resubscribe(consumer, false);
                }
            }
        }
        true
    }

    fn task_step(&self, c: usize, recreates: &mut u32) {
        let mut consumer = self.consumers[c].lock();
        if consumer.connection().is_closed() {
            // protocol error closed the connection: reconnect
            self.resubscribe(&mut consumer, true);
            return;
        }
        let roll = thread_rng().gen_range(0..10);
        match roll {
            0..=5 => {
                self.receive_one(&mut consumer);
            }
            6 | 7 => {}
            _ if *recreates > 0 => {
                *recreates -= 1;
                self.resubscribe(&mut consumer, roll == 9);
            }
            _ => {}
        }
        self.deliver(&consumer);
    }

    /// Application: dequeue one message and return its permit.
    fn app_step(&self, c: usize) -> bool {
        let msg = self.consumers[c].lock().receive();
        let Some(msg) = msg else { return false };
        let inc = msg.token.incarnation().unwrap();
        let outcome = msg.release_permit().unwrap();
        let mut t = self.tally.lock();
        let e = t.entry(inc).or_default();
        match outcome {
            ReturnOutcome::Accepted { .. } => e.token_accepted += 1,
            ReturnOutcome::Stale => {
                stats::bump(&stats::STALE_TOKEN);
                e.token_stale += 1
            }
        }
        true
    }

    /// Quiescence: everything in flight is processed and the application
    /// drains every queue.
    fn drain_everything(&self) {
        for _round in 0..200 {
            let mut progress = false;
            for c in 0..CONSUMERS as usize {
                {
                    let mut consumer = self.consumers[c].lock();
                    if consumer.connection().is_closed() {
                        self.resubscribe(&mut consumer, true);
                        progress = true;
                    }
                    while self.receive_one(&mut consumer) {
                        progress = true;
                    }
                }
                while self.app_step(c) {
                    progress = true;
                }
                let consumer = self.consumers[c].lock();
                self.deliver(&consumer);
                let conn_id = consumer.connection().id();
                if self
                    .broker
                    .lock()
                    .down
                    .get(&conn_id)
                    .is_some_and(|q| !q.is_empty())
                {
                    progress = true;
                }
            }
            if !progress {
                return;
            }
        }
        panic!("no quiescence after 200 rounds");
    }

    fn final_checks(&self) {
        let tally = self.tally.lock().clone();
        for (inc, t) in &tally {
            assert_eq!(
                t.settled_p,
                t.cmd_returned + t.token_accepted + t.token_stale,
                "incarnation {inc:?}: P settled != returned (leak or double return): {t:?}"
            );
        }
        for c in 0..CONSUMERS as usize {
            let consumer = self.consumers[c].lock();
            let state = Arc::clone(consumer.state());
            let inc = state.incarnation();
            let t = tally.get(&inc).copied().unwrap_or_default();
            assert_eq!(
                t.token_stale, 0,
                "current incarnation {inc:?} has stale returns"
            );
            let debited = self.broker.lock().debited.get(&inc).copied().unwrap_or(0);
            assert_eq!(
                debited, t.settled_p,
                "incarnation {inc:?}: broker debited {debited}, client settled {}",
                t.settled_p
            );
            let key = ConsumerKey {
                connection_id: inc.connection_id,
                consumer_id: consumer.consumer_id(),
            };
            let broker_permits = |w: &World| {
                w.broker
                    .lock()
                    .dispatcher
                    .consumer(key)
                    .expect("current incarnation registered at the broker")
                    .available_permits()
            };
            assert_eq!(
                broker_permits(self) + state.accumulated() as i64,
                i64::from(RQ),
                "broker permits for the current incarnation + undrained != receiver queue"
            );
            assert!(state.accumulated() < u64::from(RQ / 2).max(1));
            consumer
                .connection()
                .flush_residual(consumer.consumer_id())
                .unwrap();
            self.deliver(&consumer);
            assert_eq!(
                broker_permits(self),
                i64::from(RQ),
                "broker permits for the current incarnation != receiver queue after drain"
            );
        }
        let b = self.broker.lock();
        assert_eq!(
            b.dispatcher.total_available_permits(),
            b.dispatcher.sum_consumer_permits()
        );
    }
}

fn scenario() {
    let world = World::new();
    let mut handles = Vec::new();
    {
        let world = Arc::clone(&world);
        handles.push(thread::spawn(move || {
            for _ in 0..BROKER_STEPS {
                world.broker.lock().dispatch_step();
                thread::yield_now();
            }
        }));
    }
    for c in 0..CONSUMERS as usize {
        let w = Arc::clone(&world);
        handles.push(thread::spawn(move || {
            let mut recreates = 2;
            for _ in 0..TASK_STEPS {
                w.task_step(c, &mut recreates);
            }
        }));
        let w = Arc::clone(&world);
        handles.push(thread::spawn(move || {
            for _ in 0..APP_STEPS {
                w.app_step(c);
                thread::yield_now();
            }
        }));
    }
    for h in handles {
        h.join().unwrap();
    }
    world.drain_everything();
    world.final_checks();
}

#[test]
fn permits_conserved_random() {
    shuttle::check_random(scenario, ITERATIONS);
    stats::report("after random (cumulative)");
}

#[test]
fn permits_conserved_pct() {
    shuttle::check_pct(scenario, ITERATIONS, 3);
    stats::report("after pct (cumulative)");
}

/// The scenario shared with loom: a consumer replacement racing two
/// application threads' returns and the connection task's Flow writes.
#[test]
fn flow_never_crosses_incarnations_random() {
    shuttle::check_random(shared::replacement_during_returns, ITERATIONS);
}

#[test]
fn flow_never_crosses_incarnations_pct() {
    shuttle::check_pct(shared::replacement_during_returns, ITERATIONS, 3);
}

#[test]
#[should_panic(expected = "old incarnation Flow written after replacement's Subscribe")]
fn negative_control_flow_without_revalidation_crosses_incarnations() {
    shuttle::check_pct(shared::flow_without_revalidation, ITERATIONS, 3);
}

// ---------------------------------------------------------------------------
// Negative control: TEST-ONLY model with the accumulator shared across
// incarnations (the permit state is not replaced on recreate).
// ---------------------------------------------------------------------------

struct SharedStateModel {
    broker_permits: Mutex<BTreeMap<u64, i64>>,
    current: AtomicU64,
    shared_accumulator: AtomicU64,
    queue: Mutex<Vec<u64>>, // messages, tagged with their incarnation
}

fn shared_state_scenario() {
    let m = Arc::new(SharedStateModel {
        broker_permits: Mutex::new(BTreeMap::from([(1, i64::from(RQ))])),
        current: AtomicU64::new(1),
        shared_accumulator: AtomicU64::new(0),
        queue: Mutex::new(Vec::new()),
    });
    // the broker delivers 2 messages to incarnation 1
    *m.broker_permits.lock().get_mut(&1).unwrap() -= 2;
    m.queue.lock().extend([1, 1]);
    let app = {
        let m = Arc::clone(&m);
        thread::spawn(move || {
            for _ in 0..2 {
                let msg = m.queue.lock().pop();
                if msg.is_some() {
                    // BUG: the return goes to whatever state is current
                    m.shared_accumulator.fetch_add(1, Ordering::AcqRel);
                }
            }
        })
    };
    let task = {
        let m = Arc::clone(&m);
        thread::spawn(move || {
            // recreate: incarnation 2 gets the full queue; the old messages
            // stay with the application (its dequeues still return)
            m.current.store(2, Ordering::Release);
            m.shared_accumulator.store(0, Ordering::Release);
            m.broker_permits.lock().insert(2, i64::from(RQ));
        })
    };
    app.join().unwrap();
    task.join().unwrap();
    let cur = m.current.load(Ordering::Acquire);
    let credit = m.shared_accumulator.swap(0, Ordering::AcqRel) as i64;
    *m.broker_permits.lock().get_mut(&cur).unwrap() += credit;
    let permits = m.broker_permits.lock()[&cur];
    assert_eq!(
        permits,
        i64::from(RQ),
        "broker permits for the current incarnation != receiver queue after drain"
    );
}

#[test]
#[should_panic(
    expected = "broker permits for the current incarnation != receiver queue after drain"
)]
fn negative_control_shared_state_leaks_credit_into_replacement() {
    shuttle::check_random(shared_state_scenario, 400);
}
