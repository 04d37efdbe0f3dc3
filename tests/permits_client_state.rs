//! PIP-491 client side, the per-incarnation permit state and its connection
//! (Pulsar's `ConsumerPermitState`, `ClientCnx`): the drain threshold is half
//! the receiver queue, returns before Subscribe success accumulate and are
//! granted with the receiver queue, an idle consumer's residual credit can be
//! flushed below the threshold (once, and only once Flow is enabled), and a
//! closed connection or unknown consumer gets a typed error, not credit.
//!
//! Plain std test: compiled out in loom/shuttle builds.
#![cfg(not(any(loom, feature = "shuttle")))]

use std::sync::Arc;

use pulsar_core::permits::client::{
    ClientConnection, ClientConsumer, ClientFrame, ClientPermitError, CloseReason, CommandBudget,
    Incarnation, ReturnOutcome,
};
use pulsar_core::proto::wire::CommandFlow;

fn accepted(
    flow_requested: u32,
) -> Result<ReturnOutcome, pulsar_core::permits::PermitProtocolError> {
    Ok(ReturnOutcome::Accepted { flow_requested })
}

#[test]
fn returns_drain_at_half_the_receiver_queue_and_residual_credit_flushes_once() {
    let conn = Arc::new(ClientConnection::new(7));
    let st = conn.subscribe(3, 10).unwrap();
    assert_eq!(st.consumer_id(), 3);
    assert_eq!(st.receiver_queue_size(), 10);
    assert_eq!(st.threshold(), 5);
    let inc = Incarnation {
        connection_id: 7,
        serial: 1,
    };
    assert_eq!(st.incarnation(), inc);
    assert!(Arc::ptr_eq(&conn.current(3).unwrap(), &st));
    assert!(conn.current(4).is_none());

    // Before Subscribe success: returns accumulate, nothing is flushed.
    assert_eq!(st.return_permits(0), accepted(0));
    assert_eq!(st.return_permits(6), accepted(0), "Flow not enabled yet");
    assert_eq!(conn.flush_residual(3), Ok(0));
    assert_eq!(st.accumulated(), 6);
    // The grant is the receiver queue plus what accumulated meanwhile.
    assert_eq!(conn.subscribe_succeeded(&st), Ok(16));
    assert_eq!(st.accumulated(), 0);

    // Below the threshold the credit stays; reaching it drains all of it.
    assert_eq!(st.return_permits(4), accepted(0));
    assert_eq!(st.accumulated(), 4);
    assert_eq!(st.return_permits(1), accepted(5));
    assert_eq!(st.accumulated(), 0);
    let report = conn.flush_flows();
    assert_eq!(report.written, vec![(inc, 5)]);
    assert!(report.dropped.is_empty());

    // An idle consumer's residual credit, below the threshold: flushed once.
    assert_eq!(st.return_permits(3), accepted(0));
    assert_eq!(conn.flush_residual(3), Ok(3));
    assert_eq!(conn.flush_residual(3), Ok(0), "nothing left to flush");
    assert_eq!(st.accumulated(), 0);
    let flows: Vec<u32> = conn
        .take_outbox()
        .into_iter()
        .filter_map(|f| match f {
            ClientFrame::Flow {
                incarnation,
                command:
                    CommandFlow {
                        consumer_id,
                        message_permits,
                    },
            } => {
                assert_eq!((incarnation, consumer_id), (inc, 3));
                Some(message_permits)
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        flows,
        vec![16, 5, 3],
        "grant, drain, residual: nothing else"
    );
    assert_eq!(
        conn.flush_residual(9),
        Err(ClientPermitError::UnknownConsumer {
            connection_id: 7,
            consumer_id: 9
        })
    );

    // A closed connection: typed errors, and the state takes no credit.
    assert_eq!(conn.close_reason(), None);
    assert!(!conn.is_closed());
    conn.close(CloseReason::Requested);
    assert!(conn.is_closed());
    assert_eq!(conn.close_reason(), Some(CloseReason::Requested));
    assert_eq!(
        conn.flush_residual(3),
        Err(ClientPermitError::ConnectionClosed(7))
    );
    assert!(st.is_closed());
    assert_eq!(st.return_permits(1), Ok(ReturnOutcome::Stale));
    assert!(conn.current(3).is_none());
}

#[test]
fn redeliver_unacknowledged_bumps_the_epoch_and_tells_the_broker() {
    let conn = Arc::new(ClientConnection::new(1));
    let mut c = ClientConsumer::subscribe(Arc::clone(&conn), 4, 10).unwrap();
    assert_eq!(c.consumer_id(), 4);
    assert_eq!(c.epoch(), 0);
    assert!(Arc::ptr_eq(c.connection(), &conn));
    conn.take_outbox();
    c.redeliver_unacknowledged();
    c.redeliver_unacknowledged();
    assert_eq!(c.epoch(), 2);
    assert_eq!(
        conn.take_outbox(),
        vec![
            ClientFrame::RedeliverUnacknowledged {
                consumer_id: 4,
                consumer_epoch: 1
            },
            ClientFrame::RedeliverUnacknowledged {
                consumer_id: 4,
                consumer_epoch: 2
            }
        ]
    );
}

#[test]
fn a_command_budget_counts_what_is_left_to_claim() {
    let mut b = CommandBudget::new(3);
    assert_eq!((b.permits(), b.remaining(), b.claimed()), (3, 3, 0));
    b.claim().unwrap();
    b.claim().unwrap();
    assert_eq!((b.remaining(), b.claimed()), (1, 2));
    b.restore().unwrap();
    assert_eq!((b.remaining(), b.claimed()), (2, 1));
    assert_eq!(b.drain(), 2);
}

/// PIP-491's valid range for an explicit `message_permits` is `1..=i32::MAX`:
/// both ends are accepted, one past either end closes the connection.
#[test]
fn explicit_permits_are_valid_from_1_to_i32_max_inclusive() {
    use pulsar_core::permits::client::{resolve_early, PermitProtocolError, PermitSource};
    use pulsar_core::proto::wire::{CommandMessage, MAX_PERMITS};
    let early = |p: u32| {
        resolve_early(&CommandMessage {
            message_permits: Some(p),
            ..Default::default()
        })
        .map(|r| (r.permits, r.source))
    };
    assert_eq!(MAX_PERMITS, i32::MAX as u32);
    assert_eq!(early(1), Ok((1, PermitSource::Explicit)));
    assert_eq!(
        early(MAX_PERMITS),
        Ok((MAX_PERMITS, PermitSource::Explicit))
    );
    assert_eq!(early(0), Err(PermitProtocolError::InvalidExplicit(0)));
    assert_eq!(
        early(MAX_PERMITS + 1),
        Err(PermitProtocolError::InvalidExplicit(MAX_PERMITS + 1))
    );
}

/// A connection grants the receiver queue only to its own current
/// incarnation: another connection's open incarnation is `NotCurrent` and
/// gets nothing. The connection reports its own id.
#[test]
fn subscribe_succeeded_refuses_another_connections_incarnation() {
    let (a, b) = (
        Arc::new(ClientConnection::new(7)),
        Arc::new(ClientConnection::new(8)),
    );
    assert_eq!((a.id(), b.id()), (7, 8));
    let on_a = a.subscribe(1, 10).unwrap();
    b.subscribe(1, 10).unwrap();
    assert_eq!(
        b.subscribe_succeeded(&on_a),
        Err(ClientPermitError::NotCurrent(on_a.incarnation()))
    );
    assert_eq!(on_a.accumulated(), 0);
    assert_eq!(a.subscribe_succeeded(&on_a), Ok(10));
}

/// A zero-queue consumer (receiver queue 0) with nothing accumulated is
/// granted 0 permits and no Flow is written: Flow(0) is a protocol error.
#[test]
fn a_zero_grant_writes_no_flow() {
    let conn = Arc::new(ClientConnection::new(7));
    let st = conn.subscribe(1, 0).unwrap();
    conn.take_outbox();
    assert_eq!(conn.subscribe_succeeded(&st), Ok(0));
    assert!(
        !conn
            .take_outbox()
            .iter()
            .any(|f| matches!(f, ClientFrame::Flow { .. })),
        "no Flow(0)"
    );
}
