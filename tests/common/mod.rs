//! Helpers shared by every test crate: the integration tests (`mod common;`),
//! the loom and shuttle models (`#[path = "../tests/common/mod.rs"] mod
//! common;`) and the library's unit tests (`crate::test_support`).
// Each test crate uses a subset of the helpers.
#![allow(dead_code)]

use std::collections::BTreeSet;

use pulsar_core::Position;

/// `Position::new(ledger_id, entry_id)`, short for test tables.
pub fn p(ledger_id: i64, entry_id: i64) -> Position {
    Position::new(ledger_id, entry_id)
}

/// A set of individually deleted entries as Pulsar's individual deleted
/// ranges: open-closed `(lower, upper]`, one per run of consecutive
/// entry ids within a ledger, ascending.
pub fn deleted_ranges(set: &BTreeSet<Position>) -> Vec<(Position, Position)> {
    let mut out: Vec<(Position, Position)> = Vec::new();
    for &q in set {
        match out.last_mut() {
            Some((_, upper))
                if upper.ledger_id == q.ledger_id && upper.entry_id + 1 == q.entry_id =>
            {
                *upper = q
            }
            _ => out.push((p(q.ledger_id, q.entry_id - 1), q)),
        }
    }
    out
}
