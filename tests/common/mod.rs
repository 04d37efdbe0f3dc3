//! Helpers shared by the integration tests (`mod common;` in each test file).
// Each test crate uses a subset of the helpers.
#![allow(dead_code)]

use pulsar_core::Position;

/// `Position::new(ledger_id, entry_id)`, short for test tables.
pub fn p(ledger_id: i64, entry_id: i64) -> Position {
    Position::new(ledger_id, entry_id)
}
