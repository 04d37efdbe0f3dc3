//! Instruction counts of the read-scheduling hint (the lookup of
//! `benches/deletion_lookup.rs`), for `valgrind --tool=callgrind`: a fixed
//! number of lookups and nothing else, so the instructions one lookup costs
//! are `(Ir(K lookups) - Ir(0 lookups)) / K` whatever the machine's load
//! (wall-clock benchmarks on a shared machine are not repeatable; counts
//! are).
//!
//! Same shape as `deletion_lookup`: mark-delete (1,0); N single-entry
//! ranges `(1:2i, 1:2i+1]`; query ledger 1, entry `counter & 32767`.
//!
//! ```text
//! cargo bench --no-run --no-default-features --bench deletion_lookup_ir
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     target/release/deps/deletion_lookup_ir-* N K
//! ```
//! (N: deleted ranges, K: lookups; `Collected :` on stderr is Ir). The
//! difference includes the loop's own instructions (6 on x86_64: the
//! counter, the mask, the sum and the loop branch). `callgrind_annotate
//! --auto=no --inclusive=no` on the two runs' output files gives the
//! per-lookup instructions by source file (the lookup is inlined into
//! `main`). Without arguments it runs N = 128, K = 1000 and prints how many
//! lookups said "deleted" (so `cargo bench` runs it as a smoke test).
//! Numbers: `docs/measurements/deletion-lookup-callgrind.toml`.

#[cfg(not(any(loom, feature = "shuttle")))]
fn main() {
    use pulsar_core::deletion::CursorDeletionState;
    use pulsar_core::Position;
    use std::hint::black_box;

    // Numbers only: `cargo bench` passes `--bench` and any name filter.
    let mut args = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse::<u64>().ok());
    let n = args.next().unwrap_or(128);
    let k = args.next().unwrap_or(1000);
    let ranges: Vec<(Position, Position)> = (0..n as i64)
        .map(|i| (Position::new(1, 2 * i), Position::new(1, 2 * i + 1)))
        .collect();
    let state = CursorDeletionState::recover(Position::new(1, 0), &ranges)
        .expect("benchmark ranges are valid");
    // The harness of `deletion_lookup`: the ledger id and the sweep's mask
    // are opaque to the optimiser (read once from `black_box`), so every
    // check of the lookup on its arguments stays in, without a store and
    // load through the stack per lookup.
    let (ledger_id, mask) = (black_box(1i64), black_box(32767u64));
    let mut deleted = 0u64;
    for counter in 0..k {
        let e = (counter & mask) as i64;
        deleted += u64::from(state.is_deleted_for_read_scheduling(ledger_id, e));
    }
    let deleted = black_box(deleted);
    println!("N = {n}, K = {k}: {deleted} lookups said deleted");
}

#[cfg(any(loom, feature = "shuttle"))]
fn main() {}
