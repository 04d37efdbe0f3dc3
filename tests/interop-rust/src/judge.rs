//! The judge: reads a run's event log and names every violation.
//!
//! Plain scenario (per subscription sh / fo / ex):
//! - `lost`: a message whose send was confirmed (SEND_RECEIPT) is never
//!   delivered, or never acknowledged with an ACK_RESPONSE without error;
//! - `phantom`: a delivered message that no producer attempted to send (its
//!   payload is not one of the attempts, or its partition key is not the
//!   attempt's key);
//! - `order`: on a single-active-consumer subscription (Exclusive, Failover)
//!   the first deliveries of one key are not in position order, or not in
//!   the producer's send order (when that producer had no failed send);
//! - `acked-redispatched` (from `serve`'s recorded frames, see [`frames`]):
//!   an entry dispatched to a subscription after the broker confirmed its
//!   acknowledgment there, in the same boot (an ack may be lost with a
//!   kill -9, as in Pulsar). The client's own view cannot decide this: a
//!   copy dispatched before the ack may be received after it;
//! - `exclusive`: a second consumer on the Exclusive subscription accepted;
//! - `kill`: the kill -9 did not happen mid-run (deliveries before and after);
//! - `shutdown`: SIGTERM did not end `serve` with status 0.
//!
//! `message_permits` (PIP-491) is not checked: magnetar does not read it.

use crate::events::{Body, Ev, Mid, Rec};
use std::collections::{BTreeMap, HashMap, HashSet};

pub const PLAIN_SUBS: [&str; 3] = ["sh", "fo", "ex"];
/// Single-active-consumer subscriptions: Pulsar dispatches them in order.
const ORDERED_SUBS: [&str; 2] = ["fo", "ex"];

#[derive(Default)]
pub struct Verdict {
    pub fails: Vec<(String, String)>,
    pub table: String,
}

impl Verdict {
    fn fail(&mut self, category: &str, msg: String) {
        self.fails.push((category.to_string(), msg));
    }
    pub fn has(&self, category: &str) -> bool {
        self.fails.iter().any(|(c, _)| c == category)
    }
    pub fn print(&self) {
        let mut per: BTreeMap<&str, usize> = BTreeMap::new();
        for (c, m) in &self.fails {
            let n = per.entry(c).or_default();
            *n += 1;
            if *n <= 10 {
                println!("FAIL {c}: {m}");
            }
        }
        for (c, n) in per {
            if n > 10 {
                println!("FAIL {c}: ... {} more", n - 10);
            }
        }
    }
}

/// A message as the producers name it: (producer, seq).
type Msg = (u32, u32);
/// Per subscription: the messages delivered, and those covered by a confirmed ack.
type DeliveredAcked = HashMap<String, (HashSet<Msg>, HashSet<Msg>)>;
/// A subscription: (topic, name).
type SubName = (String, String);
/// A connection of one boot: (pid, connection id).
type ConnKey = (String, String);
/// An ACK awaiting its ACK_RESPONSE: its subscription, cumulative or not,
/// the whole entries it names.
type PendingAck = (SubName, bool, Vec<(u64, u64)>);

fn body(s: &str) -> Option<Body> {
    serde_json::from_str(s).ok()
}

/// Confirmed sends: (p, seq).
fn confirmed(recs: &[Rec]) -> HashSet<(u32, u32)> {
    recs.iter()
        .filter_map(|r| match &r.ev {
            Ev::Sent {
                p, seq, ok: true, ..
            } => Some((*p, *seq)),
            _ => None,
        })
        .collect()
}

/// Per subscription: the (p, seq) delivered, and those covered by a confirmed ack.
fn delivered_acked(recs: &[Rec]) -> DeliveredAcked {
    let mut out: DeliveredAcked = HashMap::new();
    let mut at: HashMap<String, HashMap<Mid, (u32, u32)>> = HashMap::new();
    let mut cum: HashMap<String, Vec<Mid>> = HashMap::new();
    for r in recs {
        match &r.ev {
            Ev::Recv {
                sub, mid, body: b, ..
            } => {
                if let Some(b) = body(b) {
                    at.entry(sub.clone())
                        .or_default()
                        .insert(*mid, (b.p, b.seq));
                    out.entry(sub.clone()).or_default().0.insert((b.p, b.seq));
                }
            }
            Ev::Ack {
                sub,
                mid,
                cumulative,
                ok: true,
                txn: None,
                ..
            } => {
                if *cumulative {
                    cum.entry(sub.clone()).or_default().push(*mid);
                } else if let Some(k) = at.get(sub).and_then(|m| m.get(mid)) {
                    out.entry(sub.clone()).or_default().1.insert(*k);
                }
            }
            _ => {}
        }
    }
    for (sub, ms) in cum {
        if let Some(top) = ms.iter().map(|m| m.pos()).max() {
            let e = out.entry(sub.clone()).or_default();
            for (mid, k) in at.get(&sub).into_iter().flatten() {
                if mid.pos() <= top {
                    e.1.insert(*k);
                }
            }
        }
    }
    out
}

/// Every confirmed message acknowledged on every subscription.
pub fn plain_complete(recs: &[Rec]) -> bool {
    let c = confirmed(recs);
    if c.is_empty() {
        return false;
    }
    let da = delivered_acked(recs);
    PLAIN_SUBS
        .iter()
        .all(|s| da.get(*s).is_some_and(|(_, a)| c.is_subset(a)))
}

pub fn plain(recs: &[Rec]) -> Verdict {
    let mut v = Verdict::default();
    let conf = confirmed(recs);
    let attempts: HashMap<(u32, u32), String> = recs
        .iter()
        .filter_map(|r| match &r.ev {
            Ev::Attempt { p, seq, key, .. } => Some(((*p, *seq), key.clone())),
            _ => None,
        })
        .collect();
    let failed_producers: HashSet<u32> = recs
        .iter()
        .filter_map(|r| match &r.ev {
            Ev::Sent { p, ok: false, .. } => Some(*p),
            _ => None,
        })
        .collect();
    if conf.is_empty() {
        v.fail("lost", "no send was confirmed at all".into());
    }

    // phantom
    for r in recs {
        if let Ev::Recv {
            sub,
            mid,
            body: b,
            mkey,
            ..
        } = &r.ev
        {
            match body(b) {
                None => v.fail("phantom", format!("{sub}: undecodable payload {b:?} at {mid}")),
                Some(bd) => match attempts.get(&(bd.p, bd.seq)) {
                    None => v.fail(
                        "phantom",
                        format!("{sub}: p{} seq {} at {mid} was never sent", bd.p, bd.seq),
                    ),
                    Some(k) if *k != bd.key || mkey.as_deref() != Some(k.as_str()) => v.fail(
                        "phantom",
                        format!(
                            "{sub}: p{} seq {} at {mid}: key {:?} / partition_key {mkey:?}, sent with {k:?}",
                            bd.p, bd.seq, bd.key
                        ),
                    ),
                    Some(_) => {}
                },
            }
        }
    }

    // lost
    let da = delivered_acked(recs);
    let empty = (HashSet::new(), HashSet::new());
    for s in PLAIN_SUBS {
        let (d, a) = da.get(s).unwrap_or(&empty);
        let mut missing: Vec<_> = conf.difference(d).collect();
        missing.sort();
        for (p, seq) in &missing {
            v.fail(
                "lost",
                format!("{s}: confirmed p{p} seq {seq} never delivered"),
            );
        }
        let mut unacked: Vec<_> = conf.difference(a).filter(|k| d.contains(k)).collect();
        unacked.sort();
        for (p, seq) in unacked {
            v.fail(
                "lost",
                format!("{s}: confirmed p{p} seq {seq} delivered but never acknowledged"),
            );
        }
    }

    // order (first deliveries on single-active-consumer subscriptions)
    for s in ORDERED_SUBS {
        let mut seen: HashSet<Mid> = HashSet::new();
        let mut last: HashMap<String, (Mid, u32, u32)> = HashMap::new();
        for r in recs {
            let Ev::Recv {
                sub, mid, body: b, ..
            } = &r.ev
            else {
                continue;
            };
            if sub != s || !seen.insert(*mid) {
                continue;
            }
            let Some(bd) = body(b) else { continue };
            if let Some((pm, pp, pseq)) = last.get(&bd.key) {
                if mid.pos() < pm.pos() {
                    v.fail(
                        "order",
                        format!("{s}: key {} first delivered at {mid} after {pm}", bd.key),
                    );
                }
                if *pp == bd.p && bd.seq < *pseq && !failed_producers.contains(&bd.p) {
                    v.fail(
                        "order",
                        format!(
                            "{s}: key {} seq {} first delivered after seq {pseq}",
                            bd.key, bd.seq
                        ),
                    );
                }
            }
            last.insert(bd.key.clone(), (*mid, bd.p, bd.seq));
        }
    }

    // exclusive
    match recs.iter().find_map(|r| match &r.ev {
        Ev::ExclusiveBusy { ok, err } => Some((*ok, err.clone())),
        _ => None,
    }) {
        Some((true, _)) => {}
        Some((false, e)) => v.fail("exclusive", format!("second Exclusive consumer: {e}")),
        None => v.fail(
            "exclusive",
            "the second Exclusive consumer was not tried".into(),
        ),
    }

    // kill mid-run
    match recs.iter().position(|r| matches!(r.ev, Ev::Kill)) {
        None => v.fail("kill", "no kill -9 in the run".into()),
        Some(k) => {
            let before = recs[..k].iter().any(|r| matches!(r.ev, Ev::Recv { .. }));
            let after = recs[k..].iter().any(|r| matches!(r.ev, Ev::Recv { .. }));
            if !(before && after) {
                v.fail(
                    "kill",
                    format!("deliveries before the kill: {before}, after: {after}"),
                );
            }
        }
    }

    match recs.iter().find_map(|r| match &r.ev {
        Ev::Stopped { rc } => Some(*rc),
        _ => None,
    }) {
        Some(0) => {}
        Some(rc) => v.fail("shutdown", format!("serve exited {rc} on SIGTERM")),
        None => v.fail("shutdown", "serve was not stopped with SIGTERM".into()),
    }

    v.table = plain_table(recs, &conf, &da);
    v
}

fn plain_table(recs: &[Rec], conf: &HashSet<(u32, u32)>, da: &DeliveredAcked) -> String {
    let mut t = String::from(
        "| subscription | confirmed | delivered | distinct | lost | redelivered | acks (ok/failed) | nacks |\n|---|---|---|---|---|---|---|---|\n",
    );
    for s in PLAIN_SUBS {
        let delivered = recs
            .iter()
            .filter(|r| matches!(&r.ev, Ev::Recv { sub, .. } if sub == s))
            .count();
        let distinct = da.get(s).map_or(0, |x| x.0.len());
        let lost = conf
            .difference(&da.get(s).map(|x| x.0.clone()).unwrap_or_default())
            .count();
        let (ok, bad) = recs.iter().fold((0, 0), |(o, b), r| match &r.ev {
            Ev::Ack { sub, ok: true, .. } if sub == s => (o + 1, b),
            Ev::Ack { sub, ok: false, .. } if sub == s => (o, b + 1),
            _ => (o, b),
        });
        let nacks = recs
            .iter()
            .filter(|r| matches!(&r.ev, Ev::Nack { sub, .. } if sub == s))
            .count();
        t += &format!(
            "| {s} | {} | {delivered} | {distinct} | {lost} | {} | {ok}/{bad} | {nacks} |\n",
            conf.len(),
            delivered.saturating_sub(distinct)
        );
    }
    let batched: HashSet<(u64, u64)> = recs
        .iter()
        .filter_map(|r| match &r.ev {
            Ev::Recv { mid, .. } if mid.n > 1 => Some(mid.entry()),
            _ => None,
        })
        .collect();
    let send_fail = recs
        .iter()
        .filter(|r| matches!(r.ev, Ev::Sent { ok: false, .. }))
        .count();
    let recv_err = recs
        .iter()
        .filter(|r| matches!(r.ev, Ev::RecvErr { .. }))
        .count();
    let kills = recs.iter().filter(|r| matches!(r.ev, Ev::Kill)).count();
    let unwrapped = recs
        .iter()
        .filter(|r| {
            matches!(
                r.ev,
                Ev::Recv {
                    unwrapped: true,
                    ..
                }
            )
        })
        .count();
    t += &format!(
        "\nbatched entries delivered: {}; one-message batches unwrapped by the program (magnetar hands them over framed): {unwrapped}; failed sends (sent again): {send_fail}; receive errors: {recv_err}; kills: {kills}\n",
        batched.len()
    );
    t
}

/// Transactional scenario (see txn.rs): per transaction, its outcome as the
/// client learned it (committed / aborted / unknown), then
/// - `aborted-visible`: an output of an aborted transaction delivered to `obs`;
/// - `open-visible`: an output delivered before its transaction's commit was requested;
/// - `committed-lost` / `committed-duplicated`: a committed output not
///   delivered, or stored at more than one position (exactly-once visibility);
/// - `atomicity`: a transaction of unknown outcome visible on one output topic only;
/// - `committed-ack-lost`: an input delivered to `work` again after the
///   transaction that acknowledged it committed; `double-processed`: an input
///   acknowledged by two committed transactions;
/// - `shutdown`: SIGTERM did not end `serve` with status 0.
pub fn txn(recs: &[Rec]) -> Verdict {
    let mut v = Verdict::default();
    #[derive(Clone, Copy, PartialEq, Debug)]
    enum Outcome {
        Committed,
        Aborted,
        Unknown,
    }
    let mut outcome: HashMap<String, (Outcome, usize)> = HashMap::new();
    let mut end_requested: HashMap<String, usize> = HashMap::new();
    let mut opened: Vec<String> = Vec::new();
    for (i, r) in recs.iter().enumerate() {
        match &r.ev {
            Ev::TxnOpen { txn } => opened.push(txn.clone()),
            Ev::TxnStep { txn, step, .. }
                if step == "commit_requested" || step == "abort_requested" =>
            {
                end_requested.insert(txn.clone(), i);
            }
            Ev::TxnEnd {
                txn, commit, ok, ..
            } => {
                let o = match (commit, ok) {
                    (true, Some(true)) => Outcome::Committed,
                    (false, Some(true)) => Outcome::Aborted,
                    // A failed abort leaves the transaction to time out: aborted.
                    (false, Some(false)) => Outcome::Aborted,
                    _ => Outcome::Unknown,
                };
                outcome.insert(txn.clone(), (o, i));
            }
            _ => {}
        }
    }
    for t in &opened {
        outcome
            .entry(t.clone())
            .or_insert((Outcome::Unknown, recs.len()));
    }
    // Outputs: (topic, txn) -> the positions they were seen at.
    let mut seen: HashMap<(String, String), HashSet<Mid>> = HashMap::new();
    for (i, r) in recs.iter().enumerate() {
        let Ev::Recv {
            topic,
            sub,
            mid,
            body: b,
            ..
        } = &r.ev
        else {
            continue;
        };
        if sub != "obs" {
            continue;
        }
        let Some(bd) = body(b) else {
            v.fail("phantom", format!("obs: undecodable payload {b:?}"));
            continue;
        };
        let Some(t) = bd.txn.clone() else {
            v.fail(
                "phantom",
                format!("obs: an output without a transaction: {b}"),
            );
            continue;
        };
        match outcome.get(&t) {
            None => v.fail("phantom", format!("obs: output of unknown transaction {t}")),
            Some((Outcome::Aborted, _)) => v.fail(
                "aborted-visible",
                format!("{topic}: output of aborted {t} delivered at {mid}"),
            ),
            _ => {}
        }
        if end_requested.get(&t).is_none_or(|&e| i < e) {
            v.fail(
                "open-visible",
                format!(
                    "{topic}: output of {t} delivered at {mid} before its commit was requested"
                ),
            );
        }
        seen.entry((topic.clone(), t)).or_default().insert(*mid);
    }
    let out_topics: Vec<String> = {
        let mut s: Vec<String> = recs
            .iter()
            .filter_map(|r| match &r.ev {
                Ev::Attempt {
                    topic,
                    txn: Some(_),
                    ..
                } => Some(topic.clone()),
                _ => None,
            })
            .collect();
        s.sort();
        s.dedup();
        s
    };
    for (t, (o, _)) in &outcome {
        let vis: Vec<usize> = out_topics
            .iter()
            .map(|tp| seen.get(&(tp.clone(), t.clone())).map_or(0, |s| s.len()))
            .collect();
        match o {
            Outcome::Committed => {
                for (tp, n) in out_topics.iter().zip(&vis) {
                    if *n == 0 {
                        v.fail(
                            "committed-lost",
                            format!("{tp}: output of committed {t} never delivered"),
                        );
                    } else if *n > 1 {
                        v.fail(
                            "committed-duplicated",
                            format!("{tp}: output of committed {t} at {n} positions"),
                        );
                    }
                }
            }
            Outcome::Unknown => {
                if vis.iter().any(|n| *n > 0) && vis.contains(&0) {
                    v.fail(
                        "atomicity",
                        format!(
                            "{t} (outcome unknown) visible on some output topics only: {vis:?}"
                        ),
                    );
                }
                if vis.iter().any(|n| *n > 1) {
                    v.fail(
                        "committed-duplicated",
                        format!("{t} (outcome unknown) at more than one position: {vis:?}"),
                    );
                }
            }
            Outcome::Aborted => {}
        }
    }
    // Committed acks: the input (topic, p, seq) acked by a committed transaction.
    let mut at: HashMap<(String, Mid), (u32, u32)> = HashMap::new();
    let mut consumed_by: HashMap<(String, u32, u32), Vec<String>> = HashMap::new();
    let mut committed_inputs: Vec<((String, u32, u32), usize)> = Vec::new();
    for r in recs {
        match &r.ev {
            Ev::Recv {
                topic,
                sub,
                mid,
                body: b,
                ..
            } if sub == "work" => {
                if let Some(bd) = body(b) {
                    at.insert((topic.clone(), *mid), (bd.p, bd.seq));
                }
            }
            Ev::Ack {
                topic,
                sub,
                mid,
                ok: true,
                txn: Some(t),
                ..
            } if sub == "work" => {
                if let (Some(k), Some((Outcome::Committed, end_i))) =
                    (at.get(&(topic.clone(), *mid)), outcome.get(t))
                {
                    let key = (topic.clone(), k.0, k.1);
                    consumed_by.entry(key.clone()).or_default().push(t.clone());
                    committed_inputs.push((key, *end_i));
                }
            }
            _ => {}
        }
    }
    for (k, ts) in &consumed_by {
        if ts.len() > 1 {
            v.fail(
                "double-processed",
                format!(
                    "{}: input p{} seq {} acknowledged by committed {ts:?}",
                    k.0, k.1, k.2
                ),
            );
        }
    }
    for ((tp, p, seq), end_i) in &committed_inputs {
        for r in &recs[*end_i..] {
            if let Ev::Recv {
                topic,
                sub,
                body: b,
                mid,
                ..
            } = &r.ev
            {
                if sub == "work"
                    && topic == tp
                    && body(b).is_some_and(|bd| bd.p == *p && bd.seq == *seq)
                {
                    v.fail("committed-ack-lost", format!("{tp}: input p{p} seq {seq} delivered again at {mid} after its transaction committed"));
                }
            }
        }
    }
    match recs.iter().find_map(|r| match &r.ev {
        Ev::Stopped { rc } => Some(*rc),
        _ => None,
    }) {
        Some(0) => {}
        Some(rc) => v.fail("shutdown", format!("serve exited {rc} on SIGTERM")),
        None => v.fail("shutdown", "serve was not stopped with SIGTERM".into()),
    }
    let count = |o: Outcome| outcome.values().filter(|(x, _)| *x == o).count();
    v.table = format!(
        "transactions: {} committed, {} aborted, {} of unknown outcome; outputs seen by obs: {}; kills: {}\n",
        count(Outcome::Committed),
        count(Outcome::Aborted),
        count(Outcome::Unknown),
        seen.values().map(|s| s.len()).sum::<usize>(),
        recs.iter().filter(|r| matches!(r.ev, Ev::Kill)).count()
    );
    v
}

/// `serve`'s recorded frames (`--record-frames`: `DIR PID CONN LEN HEX`),
/// checked for `acked-redispatched`: within one boot (pid), a MESSAGE frame
/// to a consumer of subscription S for an entry that S had already
/// acknowledged: an individual ACK of the whole entry (no ack_set) or a
/// cumulative ACK at or past it, whose ACK_RESPONSE without error was
/// written before that MESSAGE. Frames are recorded under each connection's
/// queue lock, so the file's order is the order the broker decided them in.
/// (After a kill -9 an ack may be lost, as in Pulsar; a new pid starts over.)
pub fn frames(lines: &[String]) -> Vec<(String, String)> {
    use magnetar::proto::pb::{base_command::Type, command_ack::AckType, BaseCommand};
    use prost::Message as _;
    let mut fails = Vec::new();
    let mut subs: HashMap<(ConnKey, u64), SubName> = HashMap::new();
    let mut pending: HashMap<(ConnKey, u64), PendingAck> = HashMap::new();
    let mut acked: HashMap<(String, SubName), HashSet<(u64, u64)>> = HashMap::new();
    let mut cum: HashMap<(String, SubName), (u64, u64)> = HashMap::new();
    let mut decoded = 0usize;
    for (n, line) in lines.iter().enumerate() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() != 5 {
            continue;
        }
        let (dir, pid, conn) = (f[0], f[1].to_string(), f[2].to_string());
        let Some(bytes) = (0..f[4].len())
            .step_by(2)
            .map(|i| {
                f[4].get(i..i + 2)
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
            })
            .collect::<Option<Vec<u8>>>()
        else {
            fails.push(("frames".into(), format!("line {}: not hex", n + 1)));
            continue;
        };
        let Ok(cmd) = BaseCommand::decode(&bytes[..]) else {
            continue; // a hostile frame the server rejected; not ours
        };
        decoded += 1;
        let key = (pid.clone(), conn);
        match (dir, cmd.r#type) {
            ("in", t) if t == Type::Subscribe as i32 => {
                if let Some(s) = cmd.subscribe {
                    subs.insert((key, s.consumer_id), (s.topic, s.subscription));
                }
            }
            ("in", t) if t == Type::Ack as i32 => {
                if let Some(a) = cmd.ack {
                    if a.txnid_most_bits.is_some() || a.txnid_least_bits.is_some() {
                        continue; // transactional: applied at commit
                    }
                    if let (Some(rid), Some(s)) =
                        (a.request_id, subs.get(&(key.clone(), a.consumer_id)))
                    {
                        let whole: Vec<(u64, u64)> = a
                            .message_id
                            .iter()
                            .filter(|m| m.ack_set.is_empty())
                            .map(|m| (m.ledger_id, m.entry_id))
                            .collect();
                        pending.insert(
                            (key, rid),
                            (s.clone(), a.ack_type == AckType::Cumulative as i32, whole),
                        );
                    }
                }
            }
            ("out", t) if t == Type::AckResponse as i32 => {
                if let Some(r) = cmd.ack_response {
                    let Some(rid) = r.request_id else { continue };
                    if let Some((s, cumulative, ids)) = pending.remove(&(key, rid)) {
                        if r.error.is_some() {
                            continue;
                        }
                        let k = (pid.clone(), s);
                        if cumulative {
                            if let Some(top) = ids.iter().max() {
                                let e = cum.entry(k).or_insert(*top);
                                if top > e {
                                    *e = *top;
                                }
                            }
                        } else {
                            acked.entry(k).or_default().extend(ids);
                        }
                    }
                }
            }
            ("out", t) if t == Type::Message as i32 => {
                if let Some(m) = cmd.message {
                    let Some(s) = subs.get(&(key, m.consumer_id)) else {
                        continue;
                    };
                    let pos = (m.message_id.ledger_id, m.message_id.entry_id);
                    let k = (pid.clone(), s.clone());
                    let hit = acked.get(&k).is_some_and(|a| a.contains(&pos))
                        || cum.get(&k).is_some_and(|t| pos <= *t);
                    if hit {
                        fails.push((
                            "acked-redispatched".into(),
                            format!(
                                "frames line {}: MESSAGE ({},{}) to subscription {} after the broker confirmed an ack of it (pid {pid})",
                                n + 1, pos.0, pos.1, s.1
                            ),
                        ));
                    }
                }
            }
            _ => {}
        }
    }
    if decoded == 0 {
        fails.push((
            "frames".into(),
            "no frame decoded (was serve run with --record-frames?)".into(),
        ));
    }
    fails
}
