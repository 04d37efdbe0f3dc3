//! The torn-pair negative control, shared by the cursor and published-cell
//! models under loom and shuttle: a pair published as two separate atomic
//! stores (the shape `sync::Published` and the cursor's packed mark-delete
//! exist to avoid). Both checkers must find the reader that sees a pair that
//! was never published.

use pulsar_core::__model::sync::{thread, Arc, AtomicI64, Ordering};

/// Published values: (5, 100), then (6, 3) in one writer step of two
/// stores. A reader that sees (6, 100) has a torn pair; read as a
/// mark-delete position it says (6, 50) is deleted, which it never was.
/// Must fail with "torn pair".
pub fn two_atomics_tear() {
    let ledger = Arc::new(AtomicI64::new(5));
    let entry = Arc::new(AtomicI64::new(100));
    let writer = {
        let (ledger, entry) = (Arc::clone(&ledger), Arc::clone(&entry));
        thread::spawn(move || {
            ledger.store(6, Ordering::SeqCst);
            entry.store(3, Ordering::SeqCst);
        })
    };
    let seen = (ledger.load(Ordering::SeqCst), entry.load(Ordering::SeqCst));
    assert!(
        seen == (5, 100) || seen == (6, 3),
        "torn pair {seen:?}: never published (as a mark-delete, (6,50) <= it says (6,50) is deleted)"
    );
    writer.join().unwrap();
}
