//! PIP-491: the permits a command settles are credited to the
//! incarnation exactly once. Whatever the outcome (delivered, corrupted
//! payload, invalid metadata), the credit the incarnation accumulates for one
//! command equals the `returned` the outcome reports (the rest is owed by the
//! handed-off messages' tokens), so no command's budget is returned twice.
//!
//! Plain std test: compiled out in loom/shuttle builds.
#![cfg(not(any(loom, feature = "shuttle")))]

use pulsar_core::permits::client::{
    encode_entry_payload, ClientConnection, ClientConsumer, CommandOutcomeKind,
};
use pulsar_core::proto::metadata::MessageMetadata;
use pulsar_core::proto::wire::CommandMessage;
use std::sync::Arc;

/// A consumer with a large receiver queue, so returns accumulate below the
/// Flow threshold and the accumulator shows every credit.
fn consumer() -> ClientConsumer {
    let conn = Arc::new(ClientConnection::new(1));
    let mut c = ClientConsumer::subscribe(Arc::clone(&conn), 1, 10_000).unwrap();
    let inc = c.state().incarnation();
    c.subscribe_succeeded(inc).unwrap();
    conn.take_outbox();
    c
}

fn credit_of(c: &mut ClientConsumer, cmd: &CommandMessage, payload: &[u8]) -> (u64, u32, u32) {
    let before = c.state().accumulated();
    let out = c.handle_message(cmd, payload).unwrap();
    assert!(
        !matches!(out.kind, CommandOutcomeKind::ProtocolError(_)),
        "{out:?}"
    );
    (
        c.state().accumulated() - before,
        out.returned,
        out.delivered,
    )
}

#[test]
fn corrupted_payload_credits_its_permits_once() {
    let mut c = consumer();
    for (p, payload) in [(2u32, &[][..]), (3, &[1, 2][..]), (5, &[0, 0, 0, 0][..])] {
        let cmd = CommandMessage {
            consumer_id: 1,
            message_permits: Some(p),
            ..Default::default()
        };
        let (credited, returned, delivered) = credit_of(&mut c, &cmd, payload);
        assert_eq!(delivered, 0);
        assert_eq!(returned, p, "a corrupted command returns its P");
        assert_eq!(
            credited,
            u64::from(returned),
            "credited {credited} for a command that returned {returned} (budget returned twice?)"
        );
    }
}

#[test]
fn invalid_batch_metadata_without_explicit_permits_credits_the_early_p_once() {
    let mut c = consumer();
    let md = MessageMetadata {
        producer_name: "p".into(),
        num_messages_in_batch: Some(0),
        ..Default::default()
    };
    let payload = encode_entry_payload(&md, &[]);
    let cmd = CommandMessage {
        consumer_id: 1,
        ..Default::default()
    };
    let (credited, returned, _) = credit_of(&mut c, &cmd, &payload);
    assert_eq!(returned, 1);
    assert_eq!(credited, 1, "the early P is credited once");
}
