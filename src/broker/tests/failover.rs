//! Failover's active-consumer change: Pulsar's order (rewind to the
//! mark-delete) and `ACTIVE_CONSUMER_CHANGE`.

use super::*;

fn active_change(cid: u64, is_active: bool) -> BrokerCommand {
    BrokerCommand {
        r#type: ty::ACTIVE_CONSUMER_CHANGE,
        active_consumer_change: Some(command::CommandActiveConsumerChange {
            consumer_id: cid,
            is_active: Some(is_active),
        }),
        ..Default::default()
    }
}

/// The MESSAGE positions sent to `conn` in `out`, in order.
fn positions_to(out: &[(u64, BrokerCommand, usize)], conn: u64) -> Vec<Position> {
    out.iter()
        .filter(|(c, f, _)| *c == conn && f.r#type == ty::MESSAGE)
        .map(|(_, f, _)| {
            let m = &f.message.as_ref().unwrap().message_id;
            Position::new(m.ledger_id as i64, m.entry_id as i64)
        })
        .collect()
}

#[test]
fn a_new_active_consumer_gets_the_former_ones_unacknowledged_entries_first() {
    let (_d, mut b) = with_producer();
    let ps: Vec<Position> = (0..3)
        .map(|i| send(&mut b, 1, 1, i, &entry(None, None, None)))
        .collect();
    connect(&mut b, 2);
    // "b" alone: active, told so.
    let out = feed(&mut b, 1, subscribe_cmd(7, "f", sub_type::FAILOVER, "b", 0));
    assert_eq!(
        out,
        vec![(1, success(207), 0), (1, active_change(7, true), 0)]
    );
    let out = flow(&mut b, 1, 7, 10);
    assert_eq!(positions_to(&out, 1), ps);
    // "a" sorts first: it becomes active; both are told, in attach order.
    let out = feed(&mut b, 2, subscribe_cmd(8, "f", sub_type::FAILOVER, "a", 0));
    assert_eq!(
        out,
        vec![
            (2, success(208), 0),
            (2, active_change(8, true), 0),
            (1, active_change(7, false), 0),
        ]
    );
    let p3 = send(&mut b, 1, 1, 3, &entry(None, None, None));
    // The dispatcher rewound to the mark-delete: "a" gets 0, 1, 2 (which
    // "b" holds unacknowledged) before 3, in publish order.
    let out = flow(&mut b, 2, 8, 10);
    let mut expected = ps.clone();
    expected.push(p3);
    assert_eq!(positions_to(&out, 2), expected);
    assert!(positions_to(&out, 1).is_empty());
    // An ack of the former active consumer still counts for the subscription.
    ack(&mut b, 1, 7, false, vec![mid(ps[0], vec![])], None);
    assert!(sub(&b, "f").deletion().is_message_deleted(ps[0]));
}

#[test]
fn a_consumer_that_is_not_active_is_told_so_and_nothing_rewinds() {
    let (_d, mut b) = with_producer();
    let p0 = send(&mut b, 1, 1, 0, &entry(None, None, None));
    connect(&mut b, 2);
    feed(&mut b, 1, subscribe_cmd(7, "f", sub_type::FAILOVER, "a", 0));
    assert_eq!(positions_to(&flow(&mut b, 1, 7, 10), 1), vec![p0]);
    // "b" sorts after "a": only "b" is told (inactive); "a" keeps p0.
    let out = feed(&mut b, 2, subscribe_cmd(8, "f", sub_type::FAILOVER, "b", 0));
    assert_eq!(
        out,
        vec![(2, success(208), 0), (2, active_change(8, false), 0)]
    );
    assert!(flow(&mut b, 2, 8, 10).is_empty());
    // "a" leaves: "b" becomes active and gets p0 (rewind).
    let out = feed(
        &mut b,
        1,
        BrokerCommand {
            r#type: ty::CLOSE_CONSUMER,
            close_consumer: Some(command::CommandIdRequest {
                id: 7,
                request_id: 9,
            }),
            ..Default::default()
        },
    );
    assert!(out.contains(&(2, active_change(8, true), 0)), "{out:?}");
    assert_eq!(positions_to(&out, 2), vec![p0]);
}

#[test]
fn clients_before_protocol_12_get_no_active_consumer_change() {
    let (_d, mut b) = with_producer();
    b.handle_open(3, T0);
    let out = feed(
        &mut b,
        3,
        BrokerCommand {
            r#type: ty::CONNECT,
            connect: Some(command::CommandConnect {
                client_version: "old".into(),
                protocol_version: Some(11),
            }),
            ..Default::default()
        },
    );
    assert_eq!(out[0].1.r#type, ty::CONNECTED);
    let out = feed(&mut b, 3, subscribe_cmd(7, "f", sub_type::FAILOVER, "a", 0));
    assert_eq!(out, vec![(3, success(207), 0)]);
}
