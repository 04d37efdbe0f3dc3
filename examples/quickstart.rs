//! The README's quick start (`tests/readme.rs` checks that the README shows
//! exactly this program): a subscription's acknowledgements on a managed
//! ledger, read with the lock-free hint, persisted and read back. Uses only
//! what `default-features = false` builds.
//!
//! Run: `cargo run --example quickstart`

use std::sync::Arc;

use pulsar_core::deletion::{CursorDeletionState, SkipDeleted};
use pulsar_core::ledger::{LedgerConfig, ManagedLedger, MemoryStore};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A topic's managed ledger and a subscription's cursor (RedbStore::open(path): durable).
    let store = Arc::new(MemoryStore::new());
    let topic = ManagedLedger::open("orders", LedgerConfig::default(), store)?;
    let sent = topic.append_batch(&[b"a", b"b", b"c", b"d"])?;
    let cursor = topic.open_cursor("sub")?;

    // Acknowledge "b" out of order: it is individually deleted, the mark-delete stays put.
    let acks = CursorDeletionState::new(cursor.mark_delete_position())?;
    acks.delete(&[sent[1]], &*topic)?;

    // Reads ask the lock-free hint and skip "b" without reading it (one run per read).
    let mut read = Vec::new();
    while cursor.has_more_entries() {
        read.extend(cursor.read_entries_with_skip_runs(10, &mut SkipDeleted::new(&acks))?);
    }
    let data: Vec<&[u8]> = read.iter().map(|e| &e.data[..]).collect();
    assert_eq!(data, [b"a", b"c", b"d"]);

    // Persist the acknowledgements with the cursor (one store transaction);
    // a restarted broker reads them back.
    cursor.persist_deletion_state(&acks, &[])?;
    let recovered = cursor.recover_deletion_state()?;
    assert!(recovered.is_message_deleted(sent[1]) && !recovered.is_message_deleted(sent[0]));
    Ok(())
}
