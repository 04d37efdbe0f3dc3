//! The cursor's individually deleted ranges and the lock-free
//! read-scheduling hint: acknowledge out of order, ask the hint which
//! positions need not be read, and reset the cursor (which un-deletes).
//!
//! Run: `cargo run --example cursor`

use pulsar_core::deletion::{CursorDeletionState, LedgerLayout};
use pulsar_core::Position;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Two ledgers of 10 entries each.
    let ledger = LedgerLayout::new([(1, 10), (2, 10)]);
    let state = CursorDeletionState::new(Position::new(1, -1))?;

    // Acks of (1,0), (1,2) and (2,5): mark-delete moves to (1,0); the others
    // stay individually deleted.
    state.delete(
        &[
            Position::new(1, 0),
            Position::new(1, 2),
            Position::new(2, 5),
        ],
        &ledger,
    )?;
    println!("mark-delete {}", state.mark_delete_position());
    for (l, e) in [(1, 1), (1, 2), (2, 5), (2, 6)] {
        println!(
            "({l},{e}) deleted for read scheduling: {}",
            state.is_deleted_for_read_scheduling(l, e)
        );
    }
    assert!(state.is_deleted_for_read_scheduling(1, 2));
    assert!(!state.is_deleted_for_read_scheduling(1, 1));

    // A reset moves mark-delete back and un-deletes everything after it.
    state.reset(Position::new(1, 0), &ledger)?;
    assert!(!state.is_deleted_for_read_scheduling(1, 0));
    println!("after reset: mark-delete {}", state.mark_delete_position());
    Ok(())
}
