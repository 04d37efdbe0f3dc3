//! Memory report: resident heap bytes per tracked message of the bucket
//! delayed delivery tracker at 1M and 10M messages with Pulsar's default
//! configuration, measured with a counting global allocator. Snapshots go to
//! a file-per-entry storage defined here (nothing resident), so the number is
//! the tracker's own footprint: runtime index, mutable bucket heap, shared
//! queue (one loaded segment per bucket), frozen bitmaps and bucket
//! metadata. Baseline in the same run: a `BinaryHeap` of
//! `(timestamp, ledger_id, entry_id)` (Pulsar's in-memory tracker shape).
//!
//! Run: `cargo bench --bench delayed_memory` (`-- 1` for 1M only).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::{Arc, Mutex};

use prost::Message;
use pulsar_core::delayed::{
    BucketDelayedDeliveryTracker, BucketSnapshotStorage, BucketTrackerConfig, DelayedError,
    SnapshotMetadata, SnapshotSegment, VirtualClock,
};

struct Counting;
static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: delegates to the system allocator and only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// One file per snapshot entry; only the bucket keys stay in memory.
#[derive(Debug)]
struct FileStorage {
    dir: PathBuf,
    next: Mutex<i64>,
    keys: Mutex<BTreeMap<String, i64>>,
}

impl FileStorage {
    fn path(&self, id: i64, entry: u64) -> PathBuf {
        self.dir.join(format!("{id}.{entry}"))
    }
    fn read(&self, id: i64, entry: u64) -> Result<Vec<u8>, DelayedError> {
        std::fs::read(self.path(id, entry))
            .map_err(|_| DelayedError::SnapshotNotFound { snapshot_id: id })
    }
}

fn corrupt(id: i64, e: impl std::fmt::Display) -> DelayedError {
    DelayedError::CorruptSnapshot {
        snapshot_id: id,
        reason: e.to_string(),
    }
}

impl BucketSnapshotStorage for FileStorage {
    fn create(
        &self,
        m: &SnapshotMetadata,
        s: &[SnapshotSegment],
        key: &str,
        replaces: &[(i64, String)],
    ) -> Result<i64, DelayedError> {
        let id = {
            let mut n = self.next.lock().unwrap();
            *n += 1;
            *n
        };
        let io = |e: std::io::Error| DelayedError::Storage {
            op: "create",
            reason: e.to_string(),
        };
        std::fs::write(self.path(id, 0), m.encode_to_vec()).map_err(io)?;
        for (i, seg) in s.iter().enumerate() {
            std::fs::write(self.path(id, i as u64 + 1), seg.encode_to_vec()).map_err(io)?;
        }
        for (old, k) in replaces {
            self.delete(*old, k)?;
        }
        self.keys.lock().unwrap().insert(key.to_string(), id);
        Ok(id)
    }
    fn get_metadata(&self, id: i64) -> Result<SnapshotMetadata, DelayedError> {
        SnapshotMetadata::decode(self.read(id, 0)?.as_slice()).map_err(|e| corrupt(id, e))
    }
    fn get_segments(
        &self,
        id: i64,
        first: u64,
        last: u64,
    ) -> Result<Vec<SnapshotSegment>, DelayedError> {
        (first..=last)
            .map(|e| {
                SnapshotSegment::decode(self.read(id, e)?.as_slice()).map_err(|x| corrupt(id, x))
            })
            .collect()
    }
    fn length(&self, id: i64) -> Result<u64, DelayedError> {
        Ok(self.get_metadata(id)?.metadata_list.len() as u64)
    }
    fn delete(&self, id: i64, key: &str) -> Result<(), DelayedError> {
        let mut e = 0;
        while std::fs::remove_file(self.path(id, e)).is_ok() {
            e += 1;
        }
        self.keys.lock().unwrap().remove(key);
        Ok(())
    }
    fn bucket_keys(&self) -> Result<Vec<(String, i64)>, DelayedError> {
        Ok(self
            .keys
            .lock()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect())
    }
}

fn message(i: u64) -> (i64, i64, i64) {
    let ledger = 1 + (i / 10_000) as i64;
    let entry = (i % 10_000) as i64;
    let at = 10_000 + ((i * 7919) % 3_600_000) as i64;
    (ledger, entry, at)
}

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

fn report(n: u64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let storage = Arc::new(FileStorage {
        dir: dir.path().to_path_buf(),
        next: Mutex::new(0),
        keys: Mutex::new(BTreeMap::new()),
    });
    let clock = Arc::new(VirtualClock::new(0));
    let before = live();
    let t =
        BucketDelayedDeliveryTracker::new(BucketTrackerConfig::default(), storage.clone(), clock)
            .expect("tracker");
    for i in 0..n {
        let (l, e, at) = message(i);
        t.add_message(l, e, at).expect("add");
    }
    assert_eq!(t.number_of_delayed_messages(), n);
    let keys_bytes: usize = storage
        .keys
        .lock()
        .unwrap()
        .keys()
        .map(|k| k.capacity())
        .sum();
    let tracker_bytes = live() - before - keys_bytes as isize;
    let buckets = t.buckets().len();
    let queued = t.shared_queue_len();
    drop(t);

    let before = live();
    let mut h = BinaryHeap::new();
    for i in 0..n {
        let (l, e, at) = message(i);
        h.push(Reverse((at, l, e)));
    }
    let heap_bytes = live() - before;
    drop(h);
    println!(
        "{:>4}M messages: tracker {:>11} B = {:.2} B/msg ({} buckets, {} queued) | BinaryHeap baseline {:.2} B/msg | ratio {:.2}",
        n / 1_000_000,
        tracker_bytes,
        tracker_bytes as f64 / n as f64,
        buckets,
        queued,
        heap_bytes as f64 / n as f64,
        tracker_bytes as f64 / heap_bytes as f64
    );
}

fn main() {
    // `cargo bench` passes `--bench`; an explicit "1" limits the run to 1M.
    let only_1m = std::env::args().any(|a| a == "1");
    report(1_000_000);
    if !only_1m {
        report(10_000_000);
    }
}
