//! proptest model test of the managed-ledger cursor (`src/ledger`): random
//! appends across ledger rollovers, reads, reads with skip, mark-deletes
//! (forward, backward, at `(L, -1)`, past the last entry), rewinds, resets
//! and reopening the managed ledger, checked after every step
//! against a reference model in `specs/LedgerCursor.tla`'s terms
//! (`tests/common/ledger_cursor_model.rs`). The trace recorder
//! (`tests/trace_ledger_cursor.rs`, feature `trace`) records the spec's
//! traces from cases of the same strategy.
#![cfg(not(any(loom, feature = "shuttle")))]

use proptest::prelude::*;

#[path = "common/ledger_cursor_model.rs"]
mod ledger_cursor_model;
use ledger_cursor_model::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn cursor_matches_reference_model(ops in ops(60)) {
        run_case(&ops, 24)?;
    }
}
