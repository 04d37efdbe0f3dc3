//! A damaged store file is bad input: opening it and reading everything in it
//! through [`RedbStore`] and [`ManagedLedger`] must give a typed error or
//! (where the damage is in unused space) the data — never a panic and never a
//! huge allocation.
//!
//! Seeded mutation fuzzing: a real store file (several ledgers, cursors with
//! mark-delete positions, individually deleted ranges and properties) is
//! copied and damaged by random bit flips, random byte overwrites, zeroed
//! runs or truncation; every case opens the copy and reads every table. A
//! global allocator wrapper records the largest single allocation.
#![cfg(not(any(loom, feature = "shuttle")))]

use std::alloc::{GlobalAlloc, Layout, System};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pulsar_core::delayed::{
    BucketDelayedDeliveryTracker, BucketTrackerConfig, RedbSnapshotStorage, VirtualClock,
};
use pulsar_core::ledger::{LedgerConfig, LedgerStore, ManagedLedger, RedbStore};
use pulsar_core::Position;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Records the largest single allocation request of the process.
struct MaxAlloc;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for MaxAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: MaxAlloc = MaxAlloc;

/// No single allocation while reading a damaged store may exceed this (the
/// intact store's file is a few MiB; redb's default page cache is allocated
/// in pages, not at once).
const MAX_ALLOCATION: usize = 64 << 20;

const CASES: u32 = 400;
const TIME_BUDGET: Duration = Duration::from_secs(120);

fn cfg() -> LedgerConfig {
    LedgerConfig {
        max_entries_per_ledger: 7,
        // The intact store has a lost ledger; reads skip it rather than fail.
        auto_skip_non_recoverable_data: true,
    }
}

fn delayed_config() -> BucketTrackerConfig {
    BucketTrackerConfig {
        tick_time_ms: 10,
        min_index_count_per_bucket: 4,
        ..BucketTrackerConfig::default()
    }
}

/// The delayed-delivery tracker of subscription `sub-delayed` of `orders`, on the
/// store's database (recovery reads every bucket snapshot).
fn delayed_tracker(store: &RedbStore) -> Result<BucketDelayedDeliveryTracker, String> {
    let storage = RedbSnapshotStorage::new(store.clone(), "orders", "sub-delayed")
        .map_err(|e| e.to_string())?;
    BucketDelayedDeliveryTracker::new(
        delayed_config(),
        Arc::new(storage),
        Arc::new(VirtualClock::new(0)),
    )
    .map_err(|e| e.to_string())
}

/// Builds the intact store: 3 managed ledgers × 40 entries (rolled over every
/// 7), two cursors each with a mark-delete position, deleted ranges and
/// properties, one lost ledger, and sealed delayed-delivery buckets (their
/// snapshots in the same file).
fn build_store(path: &Path) {
    let redb = RedbStore::open(path).unwrap();
    {
        let tracker = delayed_tracker(&redb).unwrap();
        for l in 1..=4i64 {
            for e in 0..6i64 {
                tracker
                    .add_message(l, e, 10_000 + 100 * (6 * l + e))
                    .unwrap();
            }
        }
        tracker.close();
    }
    let store: Arc<dyn LedgerStore> = Arc::new(redb);
    for name in ["orders", "payments", "audit"] {
        let ml = ManagedLedger::open(name, cfg(), Arc::clone(&store)).unwrap();
        for i in 0..40u32 {
            let payload = format!("{name}-{i}-").repeat(1 + (i as usize % 9));
            ml.append(payload.as_bytes()).unwrap();
        }
        for c in ["sub-a", "sub-b"] {
            let cur = ml.open_cursor(c).unwrap();
            cur.mark_delete_with_ranges(
                Position::new(1, 3),
                vec![(Position::new(2, 0), Position::new(2, 3))],
            )
            .unwrap();
            cur.set_property("#pulsar.internal.delayed.bucket_1_9", 12)
                .unwrap();
            cur.set_property("k", 7).unwrap();
        }
        if name == "audit" {
            ml.mark_ledger_lost(3).unwrap();
        }
    }
}

/// Opens the store at `path` and reads every table through every read API.
/// Returns `None` if anything gave an error, else everything read, rendered.
fn open_and_read_everything(path: &Path) -> Option<String> {
    let store = match RedbStore::open(path) {
        Ok(s) => s,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return None;
        }
    };
    let mut clean = true;
    let mut seen = String::new();
    let mut note = |clean: &mut bool, r: Result<String, String>| match r {
        Ok(s) => seen.push_str(&s),
        Err(_) => *clean = false,
    };
    let delayed = delayed_tracker(&store).map(|t| {
        let r = format!("{} {:?}", t.number_of_delayed_messages(), t.buckets());
        t.close();
        r
    });
    note(&mut clean, delayed);
    for name in ["orders", "payments", "audit"] {
        match store.load_ledger(name) {
            Ok(l) => {
                note(&mut clean, Ok(format!("{l:?}")));
                for (&id, info) in l.ledgers.iter().take(64) {
                    let rows = store.read(name, id, 0, info.entries.min(1 << 20));
                    note(
                        &mut clean,
                        rows.map(|r| format!("{r:?}")).map_err(|e| e.to_string()),
                    );
                }
            }
            Err(_) => clean = false,
        }
        match store.list_cursors(name) {
            Ok(cursors) => {
                for c in cursors.iter().take(16) {
                    let cursor = store.load_cursor(name, c);
                    note(
                        &mut clean,
                        cursor.map(|r| format!("{r:?}")).map_err(|e| e.to_string()),
                    );
                    let props = store.cursor_properties(name, c);
                    note(
                        &mut clean,
                        props.map(|r| format!("{r:?}")).map_err(|e| e.to_string()),
                    );
                }
            }
            Err(_) => clean = false,
        }
        let store: Arc<dyn LedgerStore> = Arc::new(store.clone());
        match ManagedLedger::open(name, cfg(), store) {
            Ok(ml) => match ml.open_cursor("sub-a") {
                Ok(cur) => {
                    // Bounded: a damaged ledger list must not make this loop forever.
                    for _ in 0..1_000 {
                        match cur.read_entries(16) {
                            Ok(batch) if batch.is_empty() => break,
                            Ok(batch) => note(&mut clean, Ok(format!("{batch:?}"))),
                            Err(_) => {
                                clean = false;
                                break;
                            }
                        }
                    }
                    let props = cur.properties();
                    note(
                        &mut clean,
                        props.map(|r| format!("{r:?}")).map_err(|e| e.to_string()),
                    );
                }
                Err(_) => clean = false,
            },
            Err(_) => clean = false,
        }
    }
    clean.then_some(seen)
}

/// One damaged copy of `original`.
fn mutate(original: &[u8], rng: &mut ChaCha8Rng) -> Vec<u8> {
    let mut bytes = original.to_vec();
    let len = bytes.len();
    match rng.random_range(0..10) {
        // Flip 1..=8 random bits anywhere.
        0..=3 => {
            for _ in 0..rng.random_range(1..=8) {
                let i = rng.random_range(0..len);
                bytes[i] ^= 1 << rng.random_range(0..8);
            }
        }
        // Flip bits in the first 4 KiB (the header and the first pages).
        4..=5 => {
            for _ in 0..rng.random_range(1..=4) {
                let i = rng.random_range(0..len.min(4096));
                bytes[i] ^= 1 << rng.random_range(0..8);
            }
        }
        // Overwrite 1..=16 random bytes with random values.
        6..=7 => {
            for _ in 0..rng.random_range(1..=16) {
                let i = rng.random_range(0..len);
                bytes[i] = rng.random();
            }
        }
        // Zero a run of up to 512 bytes.
        8 => {
            let start = rng.random_range(0..len);
            let end = (start + rng.random_range(1..=512)).min(len);
            bytes[start..end].fill(0);
        }
        // Truncate.
        _ => bytes.truncate(rng.random_range(0..len)),
    }
    bytes
}

#[test]
fn damaged_store_files_give_typed_errors_never_panics_or_huge_allocations() {
    let dir = tempfile::tempdir().unwrap();
    let original_path = dir.path().join("original.redb");
    build_store(&original_path);
    let original = std::fs::read(&original_path).unwrap();
    let intact = open_and_read_everything(&original_path).expect("the intact store reads cleanly");
    assert!(
        !intact.starts_with("0 "),
        "the intact store holds recovered delayed messages: {intact:.80}"
    );

    let mut rng = ChaCha8Rng::seed_from_u64(0x5eed_c0de);
    let start = Instant::now();
    let (mut cases, mut panics, mut rejected) = (0u32, Vec::new(), 0u32);
    let mut silently_different = Vec::new();
    let before = LARGEST.load(Ordering::Relaxed);
    while cases < CASES && start.elapsed() < TIME_BUDGET {
        let damaged = mutate(&original, &mut rng);
        let path = dir.path().join(format!("case-{cases}.redb"));
        std::fs::write(&path, &damaged).unwrap();
        match catch_unwind(AssertUnwindSafe(|| open_and_read_everything(&path))) {
            Ok(Some(seen)) if seen == intact => {}
            Ok(Some(_)) => silently_different.push(cases),
            Ok(None) => rejected += 1,
            Err(_) => panics.push(cases),
        }
        let _ = std::fs::remove_file(&path);
        cases += 1;
    }
    let largest = LARGEST.load(Ordering::Relaxed);
    eprintln!(
        "{cases} damaged copies of a {}-byte store in {:.1?}: {rejected} gave a typed error, \
         {} read the intact data, {} read different data without an error, {} panicked; \
         largest allocation {largest} bytes (before: {before})",
        original.len(),
        start.elapsed(),
        cases - rejected - panics.len() as u32 - silently_different.len() as u32,
        silently_different.len(),
        panics.len()
    );
    assert!(
        cases >= 100,
        "only {cases} cases ran within the time budget"
    );
    assert!(panics.is_empty(), "cases that panicked: {panics:?}");
    assert!(
        silently_different.is_empty(),
        "cases that read damaged data without an error: {silently_different:?}"
    );
    assert!(
        largest <= MAX_ALLOCATION,
        "largest single allocation {largest} bytes exceeds {MAX_ALLOCATION}"
    );
    assert!(
        rejected > 0,
        "no damage was detected: the mutations are inert"
    );
}
