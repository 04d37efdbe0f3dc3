//! Helpers shared by every test crate: the integration tests (`mod common;`),
//! the loom and shuttle models (`#[path = "../tests/common/mod.rs"] mod
//! common;`) and the library's unit tests (`crate::test_support`).
// Each test crate uses a subset of the helpers.
#![allow(dead_code)]

use pulsar_core::Position;

/// `Position::new(ledger_id, entry_id)`, short for test tables.
pub fn p(ledger_id: i64, entry_id: i64) -> Position {
    Position::new(ledger_id, entry_id)
}
