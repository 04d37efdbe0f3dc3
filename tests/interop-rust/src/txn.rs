//! The transactional scenario (PIP-31, through magnetar's transaction API).
//!
//! Inputs are produced (plainly) to two topics, `in1` and `in2`; each
//! transaction receives one input from each (subscription `work` on both),
//! acknowledges both inside the transaction, produces one output to each of
//! `out1` and `out2` inside the transaction, and commits, or aborts (every
//! fourth). An observer subscription `obs` on `out1` and `out2` consumes
//! throughout: it must never see an aborted message, nor one of a
//! transaction whose commit was not yet requested. `serve` is killed with
//! SIGKILL once with a transaction open (its commit is tried after the
//! restart) and once during a commit (END_TXN in flight), and restarted on
//! the same data dir each time. The judge (`judge_txn`) then checks
//! exactly-once visibility of committed outputs, all-or-nothing for a
//! transaction whose outcome the client never learned, no aborted output
//! ever delivered, and every committed ack durable (a committed input is
//! never delivered to `work` again, and no input is consumed by two
//! committed transactions).

use crate::events::{Body, Ev, Log, Mid};
use crate::plain::{app_message, client, subscribe};
use crate::server::Server;
use magnetar::proto::pb::command_subscribe::SubType;
use magnetar::runtime_tokio::Consumer;
use magnetar::{OutgoingMessage, PulsarClient, Transaction};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::time::timeout;

const OP: Duration = Duration::from_secs(15);
pub const TXNS: u32 = 12;
const INPUTS: u32 = 20;
/// The transactions' timeout: one whose END_TXN never reached the broker (a
/// kill) is aborted by the coordinator after it, so it blocks the outputs
/// after it (read-committed: the max read position) for at most this long.
const TXN_TIMEOUT: Duration = Duration::from_secs(10);

/// END_TXN(commit) of `txn`, re-sent (as Pulsar's Java client does after a
/// reconnect) while the answer is a lost session: a request written to a
/// connection that a kill closed never reached the broker.
async fn commit_retrying(
    client: &PulsarClient,
    txn: Transaction,
) -> Result<magnetar::TxnState, String> {
    let mut last = String::new();
    for _ in 0..5 {
        match timeout(OP, client.commit_transaction(txn)).await {
            Ok(Ok(state)) => return Ok(state),
            Ok(Err(e)) => last = e.to_string(),
            Err(_) => last = "no END_TXN answer".into(),
        }
        if !(last.contains("SessionLost") || last.contains("PeerClosed")) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(last)
}

/// NEW_TXN, re-sent while the answer is a lost session: after a restart the
/// client may write it to the coordinator connection the kill closed before
/// it reconnects; such a request never reached the broker, so no
/// transaction was opened (an application retries it the same way).
async fn new_transaction_retrying(client: &PulsarClient) -> Result<Transaction, String> {
    let mut last = String::new();
    for _ in 0..5 {
        match timeout(OP, client.new_transaction(TXN_TIMEOUT)).await {
            Ok(Ok(txn)) => return Ok(txn),
            Ok(Err(e)) => last = e.to_string(),
            Err(_) => last = "no NEW_TXN answer".into(),
        }
        if !(last.contains("SessionLost") || last.contains("PeerClosed")) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(last)
}

pub fn topic(base: &str, name: &str) -> String {
    format!("persistent://public/default/{base}-{name}")
}

fn txn_name(t: &Transaction) -> String {
    let id = t.id();
    format!("({},{})", id.most_sig_bits, id.least_sig_bits)
}

/// One step of the transactional flow; its failure ends the scenario with the
/// step's name and the broker's error.
async fn step<T, E: std::fmt::Display>(
    log: &Log,
    txn: &str,
    name: &str,
    f: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, String> {
    let r = match timeout(OP, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {OP:?}")),
    };
    log.write(Ev::TxnStep {
        txn: txn.to_string(),
        step: name.to_string(),
        ok: r.is_ok(),
        err: r.as_ref().err().cloned(),
    });
    r.map_err(|e| format!("txn scenario FAILED at step {name} (transaction {txn}): {e}"))
}

async fn observer(
    client: Arc<PulsarClient>,
    log: Arc<Log>,
    topic: String,
    stop: Arc<AtomicBool>,
) -> Result<(), String> {
    let c = subscribe(&client, &topic, "obs", SubType::Shared, "obs")
        .await
        .map_err(|e| format!("obs on {topic}: subscribe: {e}"))?;
    while !stop.load(Ordering::Acquire) {
        match c.receive_with_timeout(Duration::from_millis(200)).await {
            Ok(Some(m)) => {
                let (body, mkey, unwrapped) = app_message(&m);
                log.write(Ev::Recv {
                    topic: topic.clone(),
                    sub: "obs".into(),
                    c: "obs".into(),
                    mid: Mid::from_magnetar(&m.message_id),
                    body,
                    mkey,
                    redelivery: m.redelivery_count,
                    unwrapped,
                });
                let sent_boot = log.boot();
                let r = timeout(OP, c.ack(m.message_id)).await;
                log.write(Ev::Ack {
                    topic: topic.clone(),
                    sub: "obs".into(),
                    c: "obs".into(),
                    mid: Mid::from_magnetar(&m.message_id),
                    cumulative: false,
                    ok: matches!(r, Ok(Ok(()))),
                    err: match r {
                        Ok(Ok(())) => None,
                        Ok(Err(e)) => Some(e.to_string()),
                        Err(_) => Some("no ack response".into()),
                    },
                    sent_boot,
                    txn: None,
                });
            }
            Ok(None) => {}
            Err(e) => {
                log.write(Ev::RecvErr {
                    sub: "obs".into(),
                    c: "obs".into(),
                    err: e.to_string(),
                });
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    let _ = timeout(Duration::from_secs(5), c.close()).await;
    Ok(())
}

async fn receive_input(
    log: &Log,
    c: &Consumer,
    topic: &str,
) -> Result<magnetar::MessageId, String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        match c.receive_with_timeout(Duration::from_millis(500)).await {
            Ok(Some(m)) => {
                let (body, mkey, unwrapped) = app_message(&m);
                log.write(Ev::Recv {
                    topic: topic.to_string(),
                    sub: "work".into(),
                    c: "work".into(),
                    mid: Mid::from_magnetar(&m.message_id),
                    body,
                    mkey,
                    redelivery: m.redelivery_count,
                    unwrapped,
                });
                return Ok(m.message_id);
            }
            Ok(None) => {}
            Err(e) => {
                log.write(Ev::RecvErr {
                    sub: "work".into(),
                    c: "work".into(),
                    err: e.to_string(),
                });
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    Err(format!("no input from {topic} within 20 s"))
}

enum End {
    Commit,
    Abort,
    /// Kill -9 with the transaction open; commit after the restart.
    KillOpen,
    /// Kill -9 while END_TXN(commit) is in flight.
    KillDuringCommit,
}

pub async fn run(server: &mut Server, log: Arc<Log>) -> Result<(), String> {
    let base = format!(
        "magnetar-txn-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    );
    let (in1, in2, out1, out2) = (
        topic(&base, "in1"),
        topic(&base, "in2"),
        topic(&base, "out1"),
        topic(&base, "out2"),
    );
    let client = Arc::new(client(&server.url(), OP).await?);

    // The inputs, produced plainly.
    for (p, t) in [(10u32, &in1), (11u32, &in2)] {
        let prod = client
            .producer(t.as_str())
            .name(format!("magnetar-in{p}"))
            .create()
            .await
            .map_err(|e| format!("input producer {t}: {e}"))?;
        for seq in 0..INPUTS {
            let key = format!("in{p}");
            log.write(Ev::Attempt {
                topic: t.clone(),
                p,
                seq,
                key: key.clone(),
                txn: None,
            });
            let body = serde_json::to_vec(&Body {
                p,
                seq,
                key: key.clone(),
                txn: None,
            })
            .expect("a body serialises");
            let r = timeout(OP, OutgoingMessage::with_payload(body).key(key).send(&prod)).await;
            let r = match r {
                Ok(Ok(m)) => Ok(m),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err("no send receipt".to_string()),
            };
            log.write(Ev::Sent {
                topic: t.clone(),
                p,
                seq,
                ok: r.is_ok(),
                mid: r.as_ref().ok().map(Mid::from_magnetar),
                err: r.as_ref().err().cloned(),
            });
            r.map_err(|e| format!("input {t} seq {seq}: {e}"))?;
        }
        let _ = timeout(Duration::from_secs(5), prod.close()).await;
    }

    let stop = Arc::new(AtomicBool::new(false));
    let observers: Vec<_> = [out1.clone(), out2.clone()]
        .into_iter()
        .map(|t| {
            tokio::spawn(observer(
                Arc::clone(&client),
                Arc::clone(&log),
                t,
                Arc::clone(&stop),
            ))
        })
        .collect();
    let w1 = subscribe(&client, &in1, "work", SubType::Shared, "work")
        .await
        .map_err(|e| format!("work on {in1}: {e}"))?;
    let w2 = subscribe(&client, &in2, "work", SubType::Shared, "work")
        .await
        .map_err(|e| format!("work on {in2}: {e}"))?;
    let o1 = client
        .producer(out1.as_str())
        .name("magnetar-out1")
        .create()
        .await
        .map_err(|e| format!("producer {out1}: {e}"))?;
    let o2 = client
        .producer(out2.as_str())
        .name("magnetar-out2")
        .create()
        .await
        .map_err(|e| format!("producer {out2}: {e}"))?;

    for i in 0..TXNS {
        let end = if i == TXNS / 3 {
            End::KillOpen
        } else if i == 2 * TXNS / 3 {
            End::KillDuringCommit
        } else if i % 4 == 3 {
            End::Abort
        } else {
            End::Commit
        };
        // The first transactional step: TC lookup
        // (transaction_coordinator_assign-partition-0), TC_CLIENT_CONNECT,
        // NEW_TXN.
        let txn = step(
            &log,
            "-",
            "new_transaction",
            new_transaction_retrying(&client),
        )
        .await?;
        let tn = txn_name(&txn);
        log.write(Ev::TxnOpen { txn: tn.clone() });
        let m1 = receive_input(&log, &w1, &in1).await?;
        let m2 = receive_input(&log, &w2, &in2).await?;
        for (t, c, m) in [(&in1, &w1, m1), (&in2, &w2, m2)] {
            step(
                &log,
                &tn,
                "add_subscription_to_txn",
                client.register_subscription_to_transaction(txn, t.as_str(), "work"),
            )
            .await?;
            let sent_boot = log.boot();
            let r = step(&log, &tn, "ack_with_txn", c.ack_with_txn(m, txn.id())).await;
            log.write(Ev::Ack {
                topic: t.clone(),
                sub: "work".into(),
                c: "work".into(),
                mid: Mid::from_magnetar(&m),
                cumulative: false,
                ok: r.is_ok(),
                err: r.as_ref().err().cloned(),
                sent_boot,
                txn: Some(tn.clone()),
            });
            r?;
        }
        for (p, t, prod) in [(20u32, &out1, &o1), (21u32, &out2, &o2)] {
            step(
                &log,
                &tn,
                "add_partition_to_txn",
                client.register_partition_to_transaction(txn, t.as_str()),
            )
            .await?;
            let key = format!("out{p}");
            log.write(Ev::Attempt {
                topic: t.clone(),
                p,
                seq: i,
                key: key.clone(),
                txn: Some(tn.clone()),
            });
            let body = serde_json::to_vec(&Body {
                p,
                seq: i,
                key: key.clone(),
                txn: Some(tn.clone()),
            })
            .expect("a body serialises");
            let r = step(
                &log,
                &tn,
                "send_with_txn",
                OutgoingMessage::with_payload(body)
                    .key(key)
                    .txn(txn.id())
                    .send(prod),
            )
            .await;
            log.write(Ev::Sent {
                topic: t.clone(),
                p,
                seq: i,
                ok: r.is_ok(),
                mid: r.as_ref().ok().map(Mid::from_magnetar),
                err: r.as_ref().err().cloned(),
            });
            r?;
        }
        let commit = !matches!(end, End::Abort);
        match end {
            End::KillOpen => {
                log.write(Ev::Note {
                    text: format!("kill -9 with transaction {tn} open"),
                });
                log.write(Ev::Kill);
                server.kill9();
                tokio::time::sleep(Duration::from_millis(500)).await;
                server.start()?;
                log.write(Ev::Restart);
            }
            End::KillDuringCommit => {}
            End::Commit | End::Abort => {}
        }
        log.write(Ev::TxnStep {
            txn: tn.clone(),
            step: if commit {
                "commit_requested"
            } else {
                "abort_requested"
            }
            .into(),
            ok: true,
            err: None,
        });
        let r = if matches!(end, End::KillDuringCommit) {
            let c2 = Arc::clone(&client);
            let h = tokio::spawn(async move { commit_retrying(&c2, txn).await });
            tokio::time::sleep(Duration::from_millis(2)).await;
            log.write(Ev::Note {
                text: format!("kill -9 during the commit of {tn}"),
            });
            log.write(Ev::Kill);
            server.kill9();
            tokio::time::sleep(Duration::from_millis(500)).await;
            server.start()?;
            log.write(Ev::Restart);
            match timeout(Duration::from_secs(60), h).await {
                Ok(Ok(r)) => r,
                Ok(Err(e)) => Err(format!("commit task: {e}")),
                Err(_) => Err("no END_TXN answer within 30 s".into()),
            }
        } else if matches!(end, End::KillOpen) {
            commit_retrying(&client, txn).await
        } else if commit {
            timeout(OP, client.commit_transaction(txn))
                .await
                .map_err(|_| "no END_TXN answer".to_string())
                .and_then(|r| r.map_err(|e| e.to_string()))
        } else {
            timeout(OP, client.abort_transaction(txn))
                .await
                .map_err(|_| "no END_TXN answer".to_string())
                .and_then(|r| r.map_err(|e| e.to_string()))
        };
        let known = matches!(end, End::Commit | End::Abort);
        log.write(Ev::TxnEnd {
            txn: tn.clone(),
            commit,
            ok: Some(r.is_ok()).filter(|_| known || r.is_ok()),
            err: r.as_ref().err().cloned(),
        });
        if known {
            r.clone().map_err(|e| {
                format!(
                    "txn scenario FAILED at step {} (transaction {tn}): {e}",
                    if commit { "commit" } else { "abort" }
                )
            })?;
        }
        if !commit || r.is_err() {
            // The inputs of an aborted transaction are unacknowledged again.
            w1.redeliver_unacked();
            w2.redeliver_unacked();
        }
    }

    // Let the observers catch up with the committed outputs (bounded).
    let until = Instant::now() + Duration::from_secs(30);
    while Instant::now() < until && crate::judge::txn(&log.snapshot()).has("committed-lost") {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await; // a late aborted or duplicate output shows up
    log.write(Ev::Stopping);
    stop.store(true, Ordering::Release);
    for h in observers {
        match timeout(Duration::from_secs(30), h).await {
            Err(_) => return Err("HANG: an observer did not stop within 30 s".into()),
            Ok(Err(e)) => return Err(format!("observer task: {e}")),
            Ok(Ok(r)) => r?,
        }
    }
    let _ = timeout(Duration::from_secs(5), w1.close()).await;
    let _ = timeout(Duration::from_secs(5), w2.close()).await;
    let _ = timeout(Duration::from_secs(5), o1.close()).await;
    let _ = timeout(Duration::from_secs(5), o2.close()).await;
    let rc = server.stop()?;
    log.write(Ev::Stopped { rc });
    Ok(())
}

/// Probe: a transactional ACK naming a transaction that no coordinator ever
/// opened, on a broker without transactions. Pulsar answers it with an error
/// and leaves the message unacknowledged; this prints what `serve` does.
pub async fn ack_probe(server: &Server, log: Arc<Log>) -> Result<String, String> {
    let t = topic(
        &format!(
            "magnetar-txnack-{}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0)
        ),
        "probe",
    );
    let client = client(&server.url(), OP).await?;
    let c = subscribe(&client, &t, "probe", SubType::Shared, "probe").await?;
    let prod = client
        .producer(t.as_str())
        .create()
        .await
        .map_err(|e| e.to_string())?;
    timeout(
        OP,
        OutgoingMessage::with_payload(b"probe".as_slice()).send(&prod),
    )
    .await
    .map_err(|_| "no receipt".to_string())?
    .map_err(|e| e.to_string())?;
    let m = c
        .receive_with_timeout(Duration::from_secs(10))
        .await
        .map_err(|e| e.to_string())?
        .ok_or("no delivery within 10 s")?;
    let fake = magnetar::proto::TxnId {
        most_sig_bits: 0,
        least_sig_bits: 424242,
    };
    let r = timeout(OP, c.ack_with_txn(m.message_id, fake)).await;
    let ack = match &r {
        Ok(Ok(())) => "ACK_RESPONSE without error (accepted)".to_string(),
        Ok(Err(e)) => format!("error: {e}"),
        Err(_) => "no ACK_RESPONSE".to_string(),
    };
    log.write(Ev::Note {
        text: format!(
            "transactional ack of {} with txn (0,424242): {ack}",
            m.message_id
        ),
    });
    let _ = timeout(Duration::from_secs(5), c.close()).await;
    let c = subscribe(&client, &t, "probe", SubType::Shared, "probe").await?;
    let again = c
        .receive_with_timeout(Duration::from_secs(3))
        .await
        .map_err(|e| e.to_string())?;
    let after = match again {
        Some(m2) => format!(
            "redelivered after a re-subscribe ({}): the ack was not applied",
            m2.message_id
        ),
        None => {
            "NOT redelivered after a re-subscribe: the transactional ack was applied as a plain ack"
                .to_string()
        }
    };
    let _ = timeout(Duration::from_secs(5), c.close()).await;
    let _ = timeout(Duration::from_secs(5), prod.close()).await;
    let report =
        format!("transactional ACK (txn (0,424242), never opened): {ack}; message {after}");
    // The check: a transactional ack is never applied as a plain ack (the
    // message comes back to a new consumer of the subscription).
    if after.starts_with("NOT redelivered") {
        return Err(format!("txn-ack-probe FAILED: {report}"));
    }
    Ok(report)
}
