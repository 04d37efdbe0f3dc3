//! Negative controls: the judge must catch each doctored copy of a log.
//!
//! Plain: copies of a real passing run with one violation each. Txn: a
//! small synthetic log that the judge passes, then copies with one
//! violation each (the broker has no transactions yet, so no real run).

use crate::events::{Body, Ev, Mid, Rec};
use crate::judge::{self, Verdict};
use std::collections::HashMap;

fn check(name: &str, category: &str, v: &Verdict, failed: &mut u32) {
    if v.has(category) {
        println!("negative control {name}: caught ({category})");
    } else {
        println!(
            "negative control {name}: NOT caught (expected {category}; got {:?})",
            v.fails
        );
        *failed += 1;
    }
}

fn body_of(r: &Rec) -> Option<Body> {
    match &r.ev {
        Ev::Recv { body, .. } => serde_json::from_str(body).ok(),
        _ => None,
    }
}

/// Returns the number of controls not caught (0 = every one caught).
pub fn plain(recs: &[Rec], frame_lines: &[String]) -> Result<u32, String> {
    let mut failed = 0;
    let base = judge::plain(recs);
    if !base.fails.is_empty() {
        return Err(format!(
            "the undoctored run does not pass: {:?}",
            base.fails
        ));
    }
    let base = judge::frames(frame_lines);
    if !base.is_empty() {
        return Err(format!("the undoctored frames do not pass: {base:?}"));
    }

    // lost: every delivery of one confirmed message on sh removed
    let victim = recs
        .iter()
        .find_map(|r| match &r.ev {
            Ev::Recv { sub, .. } if sub == "sh" => body_of(r).map(|b| (b.p, b.seq)),
            _ => None,
        })
        .ok_or("no delivery on sh")?;
    let d: Vec<Rec> = recs
        .iter()
        .filter(|r| {
            !(matches!(&r.ev, Ev::Recv { sub, .. } if sub == "sh")
                && body_of(r).map(|b| (b.p, b.seq)) == Some(victim))
        })
        .cloned()
        .collect();
    check("lost message", "lost", &judge::plain(&d), &mut failed);

    // phantom: a delivery of a message never sent
    let mut d = recs.to_vec();
    let mut extra = d
        .iter()
        .find(|r| matches!(&r.ev, Ev::Recv { sub, .. } if sub == "fo"))
        .cloned()
        .ok_or("no delivery on fo")?;
    if let Ev::Recv { body, .. } = &mut extra.ev {
        *body = r#"{"p":99,"seq":0,"key":"k99-0"}"#.into();
    }
    d.push(extra);
    check(
        "message never sent",
        "phantom",
        &judge::plain(&d),
        &mut failed,
    );

    // phantom: a partition key that is not the one sent
    let mut d = recs.to_vec();
    if let Some(Ev::Recv { mkey, .. }) = d
        .iter_mut()
        .map(|r| &mut r.ev)
        .find(|e| matches!(e, Ev::Recv { .. }))
    {
        *mkey = Some("not-the-key".into());
    }
    check(
        "wrong partition key",
        "phantom",
        &judge::plain(&d),
        &mut failed,
    );

    // order: two first deliveries of one key on ex swapped
    let mut d = recs.to_vec();
    let mut by_key: HashMap<String, Vec<usize>> = HashMap::new();
    let mut seen = std::collections::HashSet::new();
    for (i, r) in d.iter().enumerate() {
        if let Ev::Recv { sub, mid, .. } = &r.ev {
            if sub == "ex" && seen.insert(*mid) {
                if let Some(b) = body_of(r) {
                    by_key.entry(b.key).or_default().push(i);
                }
            }
        }
    }
    let (a, b) = by_key
        .values()
        .find(|v| v.len() >= 2)
        .map(|v| (v[0], v[1]))
        .ok_or("no key with two deliveries on ex")?;
    let (ea, eb) = (d[a].ev.clone(), d[b].ev.clone());
    d[a].ev = eb;
    d[b].ev = ea;
    check(
        "key order on Exclusive",
        "order",
        &judge::plain(&d),
        &mut failed,
    );

    // acked-redispatched: a MESSAGE frame for an entry right after the broker confirmed its ack
    let d = redispatch_after_ack(frame_lines).ok_or("no confirmed individual ack in the frames")?;
    let fails = judge::frames(&d);
    let v = Verdict {
        fails,
        table: String::new(),
    };
    check(
        "acknowledged entry dispatched again (frames)",
        "acked-redispatched",
        &v,
        &mut failed,
    );

    // exclusive: the second consumer accepted
    let mut d = recs.to_vec();
    for r in &mut d {
        if let Ev::ExclusiveBusy { ok, .. } = &mut r.ev {
            *ok = false;
        }
    }
    check(
        "second Exclusive consumer accepted",
        "exclusive",
        &judge::plain(&d),
        &mut failed,
    );

    // kill: no kill -9 in the run
    let d: Vec<Rec> = recs
        .iter()
        .filter(|r| !matches!(r.ev, Ev::Kill))
        .cloned()
        .collect();
    check("no kill", "kill", &judge::plain(&d), &mut failed);

    // shutdown: SIGTERM exit status 1
    let mut d = recs.to_vec();
    for r in &mut d {
        if let Ev::Stopped { rc } = &mut r.ev {
            *rc = 1;
        }
    }
    check(
        "unclean shutdown",
        "shutdown",
        &judge::plain(&d),
        &mut failed,
    );
    Ok(failed)
}

/// A copy of the frame lines with a MESSAGE for the entry of the first
/// confirmed individual ACK inserted right after its ACK_RESPONSE.
fn redispatch_after_ack(lines: &[String]) -> Option<Vec<String>> {
    use magnetar::proto::pb::{base_command::Type, BaseCommand, CommandMessage, MessageIdData};
    use prost::Message as _;
    let decode = |l: &str| -> Option<(String, String, String, BaseCommand)> {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() != 5 {
            return None;
        }
        let bytes: Vec<u8> = (0..f[4].len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&f[4][i..i + 2], 16).ok())
            .collect::<Option<_>>()?;
        Some((
            f[0].into(),
            f[1].into(),
            f[2].into(),
            BaseCommand::decode(&bytes[..]).ok()?,
        ))
    };
    for (i, l) in lines.iter().enumerate() {
        let Some((dir, pid, conn, cmd)) = decode(l) else {
            continue;
        };
        if dir != "in" || cmd.r#type != Type::Ack as i32 {
            continue;
        }
        let Some(a) = cmd.ack else { continue };
        let (Some(rid), Some(m)) = (a.request_id, a.message_id.first()) else {
            continue;
        };
        if a.ack_type != 0 || !m.ack_set.is_empty() {
            continue;
        }
        for (j, l2) in lines.iter().enumerate().skip(i + 1) {
            let Some((d2, p2, c2, r)) = decode(l2) else {
                continue;
            };
            if d2 == "out" && p2 == pid && c2 == conn && r.r#type == Type::AckResponse as i32 {
                let Some(resp) = r.ack_response else { continue };
                if resp.request_id == Some(rid) && resp.error.is_none() {
                    let msg = BaseCommand {
                        r#type: Type::Message as i32,
                        message: Some(CommandMessage {
                            consumer_id: a.consumer_id,
                            message_id: MessageIdData {
                                ledger_id: m.ledger_id,
                                entry_id: m.entry_id,
                                ..Default::default()
                            },
                            ..Default::default()
                        }),
                        ..Default::default()
                    };
                    let hex: String = msg
                        .encode_to_vec()
                        .iter()
                        .map(|b| format!("{b:02x}"))
                        .collect();
                    let mut out = lines.to_vec();
                    out.insert(j + 1, format!("out {pid} {conn} 0 {hex}"));
                    return Some(out);
                }
            }
        }
    }
    None
}

fn rec(i: u64, ev: Ev) -> Rec {
    Rec {
        i,
        boot: 1,
        t: i,
        ev,
    }
}

fn out(topic: &str, txn: &str, seq: u32, e: u64) -> Ev {
    Ev::Recv {
        topic: topic.into(),
        sub: "obs".into(),
        c: "obs".into(),
        mid: Mid {
            l: 1,
            e,
            b: -1,
            n: -1,
        },
        body: format!(r#"{{"p":20,"seq":{seq},"key":"out20","txn":"{txn}"}}"#),
        mkey: Some("out20".into()),
        redelivery: 0,
        unwrapped: false,
    }
}

/// A synthetic transactional log: T1 committed (inputs in1/0 and in2/0,
/// outputs on out1 and out2), T2 aborted (input in1/1, no output seen).
pub fn synthetic_txn() -> Vec<Rec> {
    let input = |topic: &str, seq: u32, e: u64| Ev::Recv {
        topic: topic.into(),
        sub: "work".into(),
        c: "work".into(),
        mid: Mid {
            l: 1,
            e,
            b: -1,
            n: -1,
        },
        body: format!(r#"{{"p":10,"seq":{seq},"key":"in10"}}"#),
        mkey: Some("in10".into()),
        redelivery: 0,
        unwrapped: false,
    };
    let ack = |topic: &str, e: u64, txn: &str| Ev::Ack {
        topic: topic.into(),
        sub: "work".into(),
        c: "work".into(),
        mid: Mid {
            l: 1,
            e,
            b: -1,
            n: -1,
        },
        cumulative: false,
        ok: true,
        err: None,
        sent_boot: 1,
        txn: Some(txn.into()),
    };
    let attempt = |topic: &str, txn: &str| Ev::Attempt {
        topic: topic.into(),
        p: 20,
        seq: 0,
        key: "out20".into(),
        txn: Some(txn.into()),
    };
    let step = |txn: &str, s: &str| Ev::TxnStep {
        txn: txn.into(),
        step: s.into(),
        ok: true,
        err: None,
    };
    let evs = vec![
        Ev::TxnOpen {
            txn: "(0,1)".into(),
        },
        input("in1", 0, 0),
        input("in2", 0, 0),
        ack("in1", 0, "(0,1)"),
        ack("in2", 0, "(0,1)"),
        attempt("out1", "(0,1)"),
        attempt("out2", "(0,1)"),
        step("(0,1)", "commit_requested"),
        Ev::TxnEnd {
            txn: "(0,1)".into(),
            commit: true,
            ok: Some(true),
            err: None,
        },
        out("out1", "(0,1)", 0, 0),
        out("out2", "(0,1)", 0, 0),
        Ev::TxnOpen {
            txn: "(0,2)".into(),
        },
        input("in1", 1, 1),
        ack("in1", 1, "(0,2)"),
        attempt("out1", "(0,2)"),
        attempt("out2", "(0,2)"),
        step("(0,2)", "abort_requested"),
        Ev::TxnEnd {
            txn: "(0,2)".into(),
            commit: false,
            ok: Some(true),
            err: None,
        },
        Ev::Stopped { rc: 0 },
    ];
    evs.into_iter()
        .enumerate()
        .map(|(i, e)| rec(i as u64, e))
        .collect()
}

pub fn txn() -> Result<u32, String> {
    let mut failed = 0;
    let base = synthetic_txn();
    let v = judge::txn(&base);
    if !v.fails.is_empty() {
        return Err(format!(
            "the synthetic transactional log does not pass: {:?}",
            v.fails
        ));
    }
    println!("txn judge: the synthetic log passes ({})", v.table.trim());
    let before_stop = base.len() - 1;

    let mut d = base.clone();
    d.insert(before_stop, rec(99, out("out1", "(0,2)", 1, 5)));
    check(
        "aborted output delivered",
        "aborted-visible",
        &judge::txn(&d),
        &mut failed,
    );

    let mut d = base.clone();
    d.insert(7, rec(99, out("out1", "(0,1)", 0, 0)));
    check(
        "output delivered while its transaction is open",
        "open-visible",
        &judge::txn(&d),
        &mut failed,
    );

    let d: Vec<Rec> = base
        .iter()
        .filter(
            |r| !matches!(&r.ev, Ev::Recv { topic, sub, .. } if topic == "out2" && sub == "obs"),
        )
        .cloned()
        .collect();
    check(
        "committed output lost",
        "committed-lost",
        &judge::txn(&d),
        &mut failed,
    );

    let mut d = base.clone();
    d.insert(before_stop, rec(99, out("out1", "(0,1)", 0, 7)));
    check(
        "committed output at two positions",
        "committed-duplicated",
        &judge::txn(&d),
        &mut failed,
    );

    let mut d = base.clone();
    let redelivered = d[1].clone();
    d.insert(before_stop, redelivered);
    check(
        "committed ack lost (input redelivered)",
        "committed-ack-lost",
        &judge::txn(&d),
        &mut failed,
    );

    let mut d = base.clone();
    // T1's commit answer never came: outcome unknown, visible on out1 only.
    if let Ev::TxnEnd { ok, .. } = &mut d[8].ev {
        *ok = None;
    }
    d.retain(|r| !matches!(&r.ev, Ev::Recv { topic, sub, .. } if topic == "out2" && sub == "obs"));
    check(
        "transaction of unknown outcome half visible",
        "atomicity",
        &judge::txn(&d),
        &mut failed,
    );
    Ok(failed)
}
