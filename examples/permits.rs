//! PIP-491 exact permit accounting on the client: resolve the permits P of a
//! partially acknowledged batch from the broker's `message_permits`, hand
//! messages to the application and return exactly P to the broker.
//!
//! Run: `cargo run --example permits`

use pulsar_core::permits::client::{resolve_full, CommandBudget};
use pulsar_core::proto::wire::CommandMessage;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A batch of 10 messages of which indexes 0, 1, 2 are still deliverable
    // (ack_set bits), sent with message_permits = 3.
    let cmd = CommandMessage {
        ack_set: vec![0b111],
        message_permits: Some(3),
        ..Default::default()
    };
    let resolved = resolve_full(&cmd, 10)?;
    println!("the broker charged P = {} permits", resolved.permits);
    assert_eq!(resolved.permits, 3);

    // An invalid P (more than the batch holds) is a typed error: the client
    // closes the connection instead of returning a wrong count.
    let bad = CommandMessage {
        ack_set: vec![0b111],
        message_permits: Some(11),
        ..Default::default()
    };
    println!(
        "P = 11 for a batch of 10: {}",
        resolve_full(&bad, 10).unwrap_err()
    );

    // The command's budget: each message handed to the application returns 1
    // permit; whatever is left when the command is done is returned at once.
    let mut budget = CommandBudget::new(resolved.permits);
    budget.claim()?;
    let drained = budget.drain();
    println!("one message handed off, the command returns the other {drained}");
    assert_eq!(drained, 2);
    Ok(())
}
