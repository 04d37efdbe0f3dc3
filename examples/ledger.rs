//! A managed ledger on the durable redb store: append entries (rolling over
//! to a new ledger every 3 entries), read them through a cursor, persist a
//! mark-delete position with an individually deleted range, close, reopen and
//! find everything again.
//!
//! Run: `cargo run --example ledger`

use std::sync::Arc;

use pulsar_core::ledger::{LedgerConfig, ManagedLedger, RedbStore};
use pulsar_core::Position;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("store.redb");
    let config = LedgerConfig {
        max_entries_per_ledger: 3,
        ..LedgerConfig::default()
    };

    {
        let store = Arc::new(RedbStore::open(&path)?);
        let ml = ManagedLedger::open("persistent://public/default/orders", config.clone(), store)?;
        let payloads: Vec<Vec<u8>> = (0..7).map(|i| format!("order-{i}").into_bytes()).collect();
        let refs: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
        let positions = ml.append_batch(&refs)?;
        println!("appended {} entries: {:?}", positions.len(), ml.ledgers());

        let cursor = ml.open_cursor("sub")?;
        let entries = cursor.read_entries(10)?;
        println!(
            "read {} entries, last at {}",
            entries.len(),
            entries[6].position
        );
        // Acknowledge everything up to (1,2) plus (2,1) individually: the
        // range (2,0]..(2,1] is open-closed, as Pulsar persists it.
        cursor.mark_delete_with_ranges(
            Position::new(1, 2),
            vec![(Position::new(2, 0), Position::new(2, 1))],
        )?;
        cursor.set_property("example", 42)?;
    } // the store is closed here

    let store = Arc::new(RedbStore::open(&path)?);
    let ml = ManagedLedger::open("persistent://public/default/orders", config, store)?;
    let cursor = ml.open_cursor("sub")?;
    println!(
        "after reopen: mark-delete {}, deleted ranges {:?}, properties {:?}, {} entries to read",
        cursor.mark_delete_position(),
        cursor.individually_deleted_ranges(),
        cursor.properties()?,
        cursor.number_of_entries_to_read()
    );
    assert_eq!(cursor.mark_delete_position(), Position::new(1, 2));
    assert_eq!(cursor.properties()?["example"], 42);
    Ok(())
}
