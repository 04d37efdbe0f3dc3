//! Trace recording for `specs/TracePermitConservation.tla`: one client
//! consumer (consumer_id 1, receiver queue RQ = 4) on one connection, its
//! broker-side consumer in a `SharedDispatcher`, and the two FIFO channels
//! between them, driven by fixed-seed random interleavings of the spec's
//! actions: the broker sends commands of P = 1..=3 (batches with some
//! messages compacted out, so a command hands off d <= P messages and
//! returns P - d itself; one in ten corrupted, returning all P) while its consumer has permits, processes the
//! client's frames (Subscribe, CloseConsumer, Flow), the client settles
//! commands and the Subscribe success (its initial grant), the application
//! dequeues messages, the connection task writes Flow requests, the idle
//! application's residual credit is flushed as a Flow at once
//! (`ClientConnection::flush_residual`, the spec's `FlushResidual`: no
//! node-engine client calls it), and the
//! client replaces its incarnation on the same connection (close/recreate)
//! up to twice, each time once the current incarnation's Subscribe
//! succeeded (see `run`). The glue is this file; every accounting step runs in the
//! library, where src/trace.rs's `permits` hooks record it.
//!
//! Every run, tagged `t` and headed by an `Init` line with the spec's
//! constants, goes to `$PULSAR_TRACE_DIR/PermitConservation.ndjson`
//! (default `target/traces`); `.ci/trace PermitConservation` has TLC
//! validate them (Conservation, NoExcessCredit, NoStaleCredit on the
//! implementation's own executions).
#![cfg(all(feature = "trace", not(any(loom, feature = "shuttle"))))]

use std::collections::VecDeque;
use std::io::Write;

use pulsar_core::permits::broker::{AdmitAll, BrokerEntry, ConsumerKey, SharedDispatcher};
use pulsar_core::permits::client::{
    encode_entry_payload, ClientConnection, ClientConsumer, ClientFrame, Incarnation,
};
use pulsar_core::proto::metadata::{MessageMetadata, SingleMessageMetadata};
use pulsar_core::proto::wire::CommandMessage;
use pulsar_core::{trace, Position};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;
use std::sync::Arc;

const RUNS: u64 = 40;
const STEPS: usize = 120;
const SEED: u64 = 0x0014_9e41_7003;
/// The trace cfg's RQ, MaxP and MaxInc.
const RQ: u32 = 4;
const MAX_P: u32 = 3;
const MAX_INC: u64 = 3;

enum Down {
    Command(CommandMessage, Vec<u8>),
    SubscribeSuccess(Incarnation),
}

fn run(seed: u64) -> Vec<String> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let conn = Arc::new(ClientConnection::new(1));
    let key = ConsumerKey {
        connection_id: 1,
        consumer_id: 1,
    };
    let mut broker = SharedDispatcher::new();
    let mut down: VecDeque<Down> = VecDeque::new();
    let mut up: VecDeque<ClientFrame> = VecDeque::new();
    let mut next_entry = 0i64;
    // The current incarnation's Subscribe succeeded (its grant is written).
    let mut granted = false;
    trace::start();
    let mut client = ClientConsumer::subscribe(Arc::clone(&conn), 1, RQ).unwrap();
    up.extend(conn.take_outbox());
    for _ in 0..STEPS {
        match rng.random_range(0..7) {
            0 => {
                // BrokerSend: only to a consumer with permits (Pulsar skips
                // consumers in debt)
                if broker
                    .consumer(key)
                    .is_some_and(|c| c.available_permits() > 0)
                {
                    let p = rng.random_range(1..=MAX_P);
                    let md = MessageMetadata {
                        producer_name: "p".into(),
                        num_messages_in_batch: Some(p as i32),
                        ..Default::default()
                    };
                    let msgs: Vec<_> = (0..p)
                        .map(|i| {
                            let smm = SingleMessageMetadata {
                                payload_size: 1,
                                compacted_out: rng.random_bool(0.2).then_some(true),
                                ..Default::default()
                            };
                            (smm, vec![i as u8])
                        })
                        .collect();
                    let mut payload = encode_entry_payload(&md, &msgs);
                    if rng.random_bool(0.1) {
                        // corrupted in transit: checksum mismatch, the
                        // command returns its P itself (d = 0)
                        let last = payload.len() - 1;
                        payload[last] ^= 0xff;
                    }
                    let entry = BrokerEntry {
                        position: Position::new(7, next_entry),
                        batch_size: p,
                        ack_set: vec![],
                    };
                    next_entry += 1;
                    let d = broker
                        .send_to_consumer(key, vec![entry], &mut AdmitAll)
                        .unwrap();
                    for cmd in d.commands {
                        down.push_back(Down::Command(cmd, payload.clone()));
                    }
                }
            }
            1 => {
                // BrokerRecv: the next client frame, in order
                match up.pop_front() {
                    Some(ClientFrame::Subscribe { incarnation, .. }) => {
                        broker.add_consumer(key, 0).unwrap();
                        down.push_back(Down::SubscribeSuccess(incarnation));
                    }
                    Some(ClientFrame::CloseConsumer { .. }) => {
                        let _ = broker.remove_consumer(key);
                    }
                    Some(ClientFrame::Flow { command, .. }) => {
                        let _ = broker.consumer_flow(key, command.message_permits);
                    }
                    // the corrupted entry's ack: no permit effect (outside the spec)
                    Some(ClientFrame::AckValidationError { .. }) => {}
                    Some(other) => panic!("unexpected client frame {other:?}"),
                    None => {}
                }
            }
            2 => {
                // ClientReceive (or the Subscribe success: the initial grant)
                match down.pop_front() {
                    Some(Down::Command(cmd, payload)) => {
                        client.handle_message(&cmd, &payload).unwrap();
                    }
                    Some(Down::SubscribeSuccess(inc)) => {
                        granted |= client.subscribe_succeeded(inc).is_ok();
                    }
                    None => {}
                }
            }
            3 => {
                // AppReturn: dequeue one message, release its permit
                if let Some(m) = client.receive() {
                    m.release_permit().unwrap();
                }
            }
            4 => {
                // ConnTaskWrite
                conn.flush_flows();
            }
            5 => {
                // FlushResidual: the idle application's residual credit
                // written as a Flow at once (consumer 1 is always known to
                // the open connection)
                conn.flush_residual(1).unwrap();
            }
            _ => {
                // Replace: close/recreate on the same connection
                // Only once the current Subscribe succeeded: the spec writes
                // Subscribe and the receiver-queue grant together, the code
                // writes the grant on success and never for an incarnation
                // replaced before it (runs the spec does not describe).
                if granted && client.state().incarnation().serial < MAX_INC && rng.random_bool(0.3)
                {
                    client.resubscribe(Arc::clone(&conn)).unwrap();
                    granted = false;
                }
            }
        }
        up.extend(conn.take_outbox());
    }
    trace::finish()
}

#[test]
fn record_permit_conservation_traces() {
    let dir = std::env::var("PULSAR_TRACE_DIR").unwrap_or_else(|_| "target/traces".into());
    std::fs::create_dir_all(&dir).unwrap();
    let path = format!("{dir}/PermitConservation.ndjson");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    let (mut steps, mut replaces, mut flushes) = (0, 0, 0);
    for k in 0..RUNS {
        let init = serde_json::json!({
            "action": "Init", "rq": RQ, "maxP": MAX_P, "maxInc": MAX_INC, "t": k + 1,
        });
        writeln!(out, "{init}").unwrap();
        for l in run(SEED + k) {
            let mut v: Value = serde_json::from_str(&l).unwrap();
            replaces += usize::from(v["action"] == "Replace");
            flushes += usize::from(v["action"] == "FlushResidual");
            v["t"] = Value::from(k + 1);
            writeln!(out, "{v}").unwrap();
            steps += 1;
        }
    }
    out.flush().unwrap();
    assert!(steps > RUNS as usize * 10, "runs recorded almost nothing");
    assert!(replaces > 0, "no run replaced its incarnation");
    assert!(flushes > 0, "no run flushed a residual credit");
    eprintln!(
        "recorded {RUNS} traces, {steps} steps ({replaces} replacements, {flushes} residual flushes): {path}"
    );
}
