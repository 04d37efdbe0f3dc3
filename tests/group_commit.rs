//! Group commit and the non-blocking forms of the durable writes: writes
//! that arrive while a commit is in flight share one redb transaction and
//! one fsync; each completion fires only once its own write is in the
//! durable image (what a crash would keep); a failed commit gives every
//! caller in it the typed error and changes no in-memory state.
//!
//! The store runs on `Disk`, a redb storage backend in memory that keeps
//! the image every `sync_data` made durable, can slow, hold or fail syncs,
//! and counts them.
#![cfg(not(any(loom, feature = "shuttle")))]

#[path = "common/watchdog.rs"]
mod watchdog;

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use pulsar_core::deletion::CursorDeletionState;
use pulsar_core::ledger::{
    completion_pair, Completion, GroupCommitConfig, LedgerConfig, LedgerError, LedgerStore,
    ManagedLedger, MemoryStore, RedbStore, StoreError, SyncMode,
};
use pulsar_core::Position;

const WAIT: Duration = Duration::from_secs(60);

#[derive(Default)]
struct DiskState {
    image: Vec<u8>,
    /// `durable[k]`: the image after sync `k + 1`.
    durable: Vec<Vec<u8>>,
    hold: bool,
    held: usize,
    fail_syncs: bool,
}

/// A redb backend in memory: see the module docs.
#[derive(Default)]
struct Disk {
    state: Mutex<DiskState>,
    released: Condvar,
    sync_delay_ms: AtomicU64,
    syncs: AtomicU64,
}

impl std::fmt::Debug for Disk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Disk")
    }
}

#[derive(Debug, Clone)]
struct DiskHandle(Arc<Disk>);

impl Disk {
    fn with_image(image: Vec<u8>) -> Arc<Self> {
        let d = Arc::new(Disk::default());
        d.state.lock().unwrap().image = image;
        d
    }
    fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::SeqCst)
    }
    fn durable_image(&self, after_sync: u64) -> Vec<u8> {
        let s = self.state.lock().unwrap();
        s.durable[after_sync as usize - 1].clone()
    }
    fn hold(&self, on: bool) {
        self.state.lock().unwrap().hold = on;
        self.released.notify_all();
    }
    fn held(&self) -> usize {
        self.state.lock().unwrap().held
    }
    fn fail_syncs(&self, on: bool) {
        self.state.lock().unwrap().fail_syncs = on;
    }
}

fn io(what: &str) -> std::io::Error {
    std::io::Error::other(what.to_string())
}

impl redb::StorageBackend for DiskHandle {
    fn len(&self) -> Result<u64, std::io::Error> {
        Ok(self.0.state.lock().unwrap().image.len() as u64)
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        let s = self.0.state.lock().unwrap();
        let start = offset as usize;
        let src = s
            .image
            .get(start..start + out.len())
            .ok_or_else(|| io("read past the end"))?;
        out.copy_from_slice(src);
        Ok(())
    }
    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        self.0.state.lock().unwrap().image.resize(len as usize, 0);
        Ok(())
    }
    fn sync_data(&self) -> Result<(), std::io::Error> {
        let mut s = self.0.state.lock().unwrap();
        if s.fail_syncs {
            return Err(io("injected: fsync failed"));
        }
        s.held += 1;
        while s.hold {
            s = self.0.released.wait(s).unwrap();
        }
        s.held -= 1;
        drop(s);
        let delay = self.0.sync_delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            std::thread::sleep(Duration::from_millis(delay));
        }
        let mut s = self.0.state.lock().unwrap();
        let image = s.image.clone();
        s.durable.push(image);
        self.0.syncs.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        let mut s = self.0.state.lock().unwrap();
        let start = offset as usize;
        let dst = s
            .image
            .get_mut(start..start + data.len())
            .ok_or_else(|| io("write past the end"))?;
        dst.copy_from_slice(data);
        Ok(())
    }
}

fn store_on(disk: &Arc<Disk>) -> RedbStore {
    RedbStore::open_on_backend(DiskHandle(Arc::clone(disk)), SyncMode::Immediate, 1 << 24)
        .expect("open the store on the in-memory disk")
}

/// The entry at `p` as the store opened on `image` (a crash at that
/// point) holds it.
fn durable_entry(image: Vec<u8>, ledger: &str, p: Position) -> Option<Vec<u8>> {
    let store = store_on(&Disk::with_image(image));
    store
        .read(ledger, p.ledger_id, p.entry_id, p.entry_id)
        .expect("read the durable image")
        .pop()
        .map(|(_, d)| d)
}

fn cfg() -> LedgerConfig {
    LedgerConfig {
        max_entries_per_ledger: 20,
        auto_skip_non_recoverable_data: false,
    }
}

/// 64 appends submitted together while the disk takes 5 ms per fsync: far
/// fewer commits than appends, positions in submission order, and each
/// completion fires only once its entry is in the durable image.
#[test]
fn concurrent_appends_share_commits_and_complete_only_when_durable() {
    let _w = watchdog::arm("concurrent_appends_share_commits", WAIT);
    let disk = Arc::new(Disk::default());
    let store = Arc::new(store_on(&disk));
    disk.sync_delay_ms.store(5, Ordering::SeqCst);
    let ml = ManagedLedger::open("t", cfg(), store.clone() as Arc<dyn LedgerStore>).unwrap();
    let syncs_before = disk.syncs();
    let seen: Arc<Mutex<Vec<(usize, Position, u64)>>> = Arc::default();
    let mut waits = Vec::new();
    for i in 0..64usize {
        let (done, tx) = completion_pair::<(), LedgerError>(|| {
            LedgerError::Store(StoreError::Backend("dropped".into()))
        });
        let (seen, disk) = (Arc::clone(&seen), Arc::clone(&disk));
        ml.append_async(format!("m{i}").into_bytes())
            .on_complete(move |r| {
                // The syncs done when the completion fired: the image after
                // the last of them is what a crash right now would keep.
                let p = r.expect("append");
                seen.lock().unwrap().push((i, p, disk.syncs()));
                tx.complete(Ok(()));
            });
        waits.push(done);
    }
    for w in waits {
        w.wait_timeout(WAIT).expect("completion in time").unwrap();
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 64);
    for (k, &(i, p, syncs)) in seen.iter().enumerate() {
        assert_eq!(i, k, "completions fire in submission order");
        assert_eq!(p, Position::new(1 + i as i64 / 20, i as i64 % 20));
        assert!(
            syncs > syncs_before,
            "append {i} completed before any fsync"
        );
        assert_eq!(
            durable_entry(disk.durable_image(syncs), "t", p),
            Some(format!("m{i}").into_bytes()),
            "append {i} at {p} completed before it was durable"
        );
    }
    let stats = store.group_commit_stats().expect("the committer ran");
    assert_eq!(stats.writes, 64);
    assert!(
        stats.commits <= 16,
        "64 appends took {} commits; group commit should need far fewer",
        stats.commits
    );
    assert!(disk.syncs() - syncs_before <= 2 * stats.commits);
    assert_eq!(ml.last_confirmed_entry(), Position::new(4, 3));
    let c = ml.open_cursor("c").unwrap();
    assert_eq!(c.read_entries(100).unwrap().len(), 64);
}

/// The same from 16 threads at once (64 appends each, each thread waiting
/// for its own): the commits stay far below the appends.
#[test]
fn appends_from_many_threads_share_commits() {
    let _w = watchdog::arm("appends_from_many_threads_share_commits", WAIT);
    let disk = Arc::new(Disk::default());
    disk.sync_delay_ms.store(2, Ordering::SeqCst);
    let store = Arc::new(store_on(&disk));
    let ml = ManagedLedger::open("t", cfg(), store.clone() as Arc<dyn LedgerStore>).unwrap();
    let threads: Vec<_> = (0..16)
        .map(|t| {
            let ml = Arc::clone(&ml);
            std::thread::spawn(move || {
                for i in 0..4 {
                    ml.append_async(vec![t, i])
                        .wait_timeout(WAIT)
                        .expect("completion in time")
                        .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let stats = store.group_commit_stats().unwrap();
    assert_eq!(stats.writes, 64);
    assert!(
        stats.commits < 64,
        "{} commits for 64 appends",
        stats.commits
    );
    assert_eq!(ml.last_confirmed_entry(), Position::new(4, 3));
}

/// A commit whose fsync fails: every append in it gets the typed store
/// error, the managed ledger's state is what it was before them, and the
/// durable image holds none of them.
#[test]
fn a_failed_group_commit_fails_every_write_in_it_and_changes_nothing() {
    let _w = watchdog::arm("a_failed_group_commit_fails_every_write", WAIT);
    let disk = Arc::new(Disk::default());
    let store = Arc::new(store_on(&disk));
    let ml = ManagedLedger::open("t", cfg(), store.clone() as Arc<dyn LedgerStore>).unwrap();
    // First append: its commit is held inside its fsync.
    disk.hold(true);
    let first = ml.append_async(b"first".to_vec());
    while disk.held() == 0 {
        std::thread::yield_now();
    }
    // 32 more arrive during that commit: one batch behind it.
    let batch: Vec<_> = (0..32u8).map(|i| ml.append_async(vec![i])).collect();
    // The next fsync fails; the held one goes through.
    disk.fail_syncs(true);
    disk.hold(false);
    let first = first.wait_timeout(WAIT).expect("first in time");
    let lce_after_first = ml.last_confirmed_entry();
    let errors: Vec<LedgerError> = batch
        .into_iter()
        .map(|c| {
            c.wait_timeout(WAIT)
                .expect("completion in time")
                .expect_err("a write in a failed commit must fail")
        })
        .collect();
    assert_eq!(errors.len(), 32);
    for e in &errors {
        assert!(
            matches!(e, LedgerError::Store(_)),
            "typed store error, got {e:?}"
        );
    }
    match first {
        // One fsync per commit: the held commit succeeded before the failure.
        Ok(p) => assert_eq!(
            (p, lce_after_first),
            (Position::new(1, 0), Position::new(1, 0))
        ),
        // Or its own second fsync failed: then nothing at all was appended.
        Err(e) => {
            assert!(matches!(e, LedgerError::Store(_)));
            assert_eq!(lce_after_first, Position::new(1, -1));
        }
    }
    // Nothing of the failed batch is in memory ...
    assert_eq!(ml.last_confirmed_entry(), lce_after_first);
    let stats = store.group_commit_stats().unwrap();
    assert!(stats.failed_commits >= 1);
    // ... or in the durable image.
    let last = disk.durable_image(disk.syncs());
    for e in 0..40 {
        let p = Position::new(1, e);
        if p > lce_after_first {
            assert_eq!(
                durable_entry(last.clone(), "t", p),
                None,
                "{p} survived a failed commit"
            );
        }
    }
    // Later writes get a typed error too (the store refuses after a failed
    // fsync), never a hang or a panic.
    disk.fail_syncs(false);
    let later = ml
        .append_async(b"later".to_vec())
        .wait_timeout(WAIT)
        .expect("in time");
    if let Err(e) = later {
        assert!(matches!(e, LedgerError::Store(_)));
        assert_eq!(ml.last_confirmed_entry(), lce_after_first);
    }
}

/// Cursor persists of many cursors in one group commit; each cursor's
/// mark-delete moves only when its completion fires, and a reopened store
/// recovers every persisted state.
#[test]
fn cursor_persists_share_commits_and_recover_after_reopen() {
    let _w = watchdog::arm("cursor_persists_share_commits", WAIT);
    let disk = Arc::new(Disk::default());
    let store = Arc::new(store_on(&disk));
    let ml = ManagedLedger::open("t", cfg(), store.clone() as Arc<dyn LedgerStore>).unwrap();
    let payloads: Vec<Vec<u8>> = (0..40u8).map(|i| vec![i]).collect();
    let refs: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
    ml.append_batch(&refs).unwrap();
    let cursors: Vec<_> = (0..16)
        .map(|i| ml.open_cursor(format!("c{i}")).unwrap())
        .collect();
    let before = store.group_commit_stats().map_or(0, |s| s.commits);
    disk.hold(true);
    let mut pending = Vec::new();
    for (i, c) in cursors.iter().enumerate() {
        let ds = CursorDeletionState::new(Position::new(1, -1)).unwrap();
        ds.mark_delete(Position::new(1, i as i64), &*ml).unwrap();
        ds.delete(&[Position::new(2, 5)], &*ml).unwrap();
        pending.push(c.persist_deletion_state_async(&ds, vec![("k".into(), Some(i as i64))]));
        assert_eq!(
            c.mark_delete_position(),
            Position::new(1, -1),
            "moved before durable"
        );
    }
    disk.hold(false);
    for (i, done) in pending.into_iter().enumerate() {
        let r = done.wait_timeout(WAIT).expect("in time").unwrap();
        assert_eq!(r.mark_delete, Position::new(1, i as i64));
        assert_eq!(
            cursors[i].mark_delete_position(),
            Position::new(1, i as i64)
        );
    }
    let commits = store.group_commit_stats().unwrap().commits - before;
    assert!(commits <= 3, "16 persists took {commits} commits");
    drop((cursors, ml, store));
    let image = disk.durable_image(disk.syncs());
    let store = Arc::new(store_on(&Disk::with_image(image)));
    let ml = ManagedLedger::open("t", cfg(), store as Arc<dyn LedgerStore>).unwrap();
    for i in 0..16 {
        let c = ml.open_cursor(format!("c{i}")).unwrap();
        assert_eq!(c.mark_delete_position(), Position::new(1, i));
        let ds = c.recover_deletion_state().unwrap();
        assert!(ds.is_message_deleted(Position::new(2, 5)));
        assert_eq!(c.properties().unwrap()["k"], i);
    }
}

/// A blocking call made while non-blocking writes of the same ledger or
/// cursor are queued goes behind them: positions and mark-deletes stay in
/// call order.
#[test]
fn blocking_calls_queue_behind_non_blocking_ones() {
    let _w = watchdog::arm("blocking_calls_queue_behind_non_blocking_ones", WAIT);
    let disk = Arc::new(Disk::default());
    let store = Arc::new(store_on(&disk));
    let ml = ManagedLedger::open("t", cfg(), store.clone() as Arc<dyn LedgerStore>).unwrap();
    let c = ml.open_cursor("c").unwrap();
    disk.hold(true);
    let a = ml.append_async(b"a".to_vec());
    while disk.held() == 0 {
        std::thread::yield_now();
    }
    let b = ml.append_async(b"b".to_vec());
    let ml2 = Arc::clone(&ml);
    let sync_append = std::thread::spawn(move || ml2.append(b"c").unwrap());
    std::thread::sleep(Duration::from_millis(20));
    disk.hold(false);
    assert_eq!(a.wait_timeout(WAIT).unwrap().unwrap(), Position::new(1, 0));
    assert_eq!(b.wait_timeout(WAIT).unwrap().unwrap(), Position::new(1, 1));
    assert_eq!(sync_append.join().unwrap(), Position::new(1, 2));
    let m1 = c.mark_delete_async(Position::new(1, 0));
    c.mark_delete(Position::new(1, 1)).unwrap();
    m1.wait_timeout(WAIT).unwrap().unwrap();
    assert_eq!(c.mark_delete_position(), Position::new(1, 1));
    // Backward against the queued one is refused at once, nothing changes.
    let back = c.mark_delete_async(Position::new(1, 0));
    assert!(matches!(
        back.wait_timeout(WAIT).unwrap(),
        Err(LedgerError::MarkDeleteBackward { .. })
    ));
    assert_eq!(c.mark_delete_position(), Position::new(1, 1));
}

/// Batch bounds: with `max_batch_writes = 4`, 32 writes queued behind a
/// held commit are committed in batches of at most 4.
#[test]
fn batches_are_bounded_by_max_batch_writes() {
    let _w = watchdog::arm("batches_are_bounded_by_max_batch_writes", WAIT);
    let disk = Arc::new(Disk::default());
    let store = Arc::new(store_on(&disk).with_group_commit(GroupCommitConfig {
        max_batch_writes: 4,
        ..GroupCommitConfig::default()
    }));
    let ml = ManagedLedger::open("t", cfg(), store.clone() as Arc<dyn LedgerStore>).unwrap();
    disk.hold(true);
    let first = ml.append_async(vec![0]);
    while disk.held() == 0 {
        std::thread::yield_now();
    }
    let rest: Vec<_> = (1..33u8).map(|i| ml.append_async(vec![i])).collect();
    disk.hold(false);
    first.wait_timeout(WAIT).unwrap().unwrap();
    for c in rest {
        c.wait_timeout(WAIT).unwrap().unwrap();
    }
    let s = store.group_commit_stats().unwrap();
    assert_eq!(s.writes, 33);
    assert!(s.largest_batch <= 4, "largest batch {}", s.largest_batch);
    assert!(s.commits >= 9);
}

/// With the default `submit` (the in-memory store) the non-blocking forms
/// complete on the calling thread, before they return.
#[test]
fn memory_store_completes_inline() {
    let ml = ManagedLedger::open("t", cfg(), Arc::new(MemoryStore::new())).unwrap();
    let mut c = ml.append_async(b"x".to_vec());
    assert_eq!(c.try_take(), Some(Ok(Position::new(1, 0))));
    let cur = ml.open_cursor("c").unwrap();
    let mut m = cur.mark_delete_async(Position::new(1, 0));
    assert_eq!(m.try_take(), Some(Ok(())));
    assert_eq!(cur.mark_delete_position(), Position::new(1, 0));
}

struct CountWaker(AtomicUsize);
impl Wake for CountWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// The completion as a `Future` with no runtime: pending until the writer
/// completes it, which wakes the stored waker once; a dropped completer
/// delivers its typed error instead of leaving the waiter hanging.
#[test]
fn completion_future_wakes_once_and_a_dropped_completer_is_an_error() {
    let (mut fut, tx) = completion_pair::<u32, StoreError>(|| StoreError::Backend("gone".into()));
    let count = Arc::new(CountWaker(AtomicUsize::new(0)));
    let waker = Waker::from(Arc::clone(&count));
    let mut cx = Context::from_waker(&waker);
    assert!(pin!(&mut fut).poll(&mut cx).is_pending());
    tx.complete(Ok(7));
    assert_eq!(count.0.load(Ordering::SeqCst), 1);
    assert_eq!(pin!(&mut fut).poll(&mut cx), Poll::Ready(Ok(7)));

    let (c, tx) = completion_pair::<u32, StoreError>(|| StoreError::Backend("gone".into()));
    drop(tx);
    assert_eq!(
        c.wait_timeout(WAIT).unwrap(),
        Err(StoreError::Backend("gone".into()))
    );

    let (c, tx) = completion_pair::<u32, StoreError>(|| StoreError::Backend("gone".into()));
    let got = Arc::new(AtomicBool::new(false));
    let g = Arc::clone(&got);
    c.on_complete(move |r| {
        assert_eq!(r, Ok(3));
        g.store(true, Ordering::SeqCst);
    });
    assert!(!got.load(Ordering::SeqCst));
    tx.complete(Ok(3));
    assert!(got.load(Ordering::SeqCst));

    let c: Completion<u32, StoreError> = Completion::ready(Ok(1));
    assert!(c.is_complete());
}

/// Delayed-delivery bucket snapshots written with `create_async` from 16
/// subscriptions share commits; each snapshot and its cursor property
/// (the commit point) are durable together when the completion fires; a
/// merge-style create that replaces a snapshot and `delete_async` are
/// atomic the same way.
#[test]
fn delayed_snapshot_writes_share_commits_and_are_durable_on_completion() {
    use pulsar_core::delayed::{
        bucket_key, BucketSnapshotStorage, RedbSnapshotStorage, SnapshotMetadata, SnapshotSegment,
    };
    let _w = watchdog::arm("delayed_snapshot_writes_share_commits", WAIT);
    let disk = Arc::new(Disk::default());
    let store = store_on(&disk);
    let storages: Vec<_> = (0..16)
        .map(|i| RedbSnapshotStorage::new(store.clone(), "t", format!("sub-{i}")).unwrap())
        .collect();
    let before = store.group_commit_stats().map_or(0, |s| s.commits);
    disk.hold(true);
    let meta = SnapshotMetadata::default();
    let segs = [SnapshotSegment::default()];
    let pending: Vec<_> = storages
        .iter()
        .map(|s| s.create_async(&meta, &segs, &bucket_key(1, 2), &[]))
        .collect();
    disk.hold(false);
    let ids: Vec<i64> = pending
        .into_iter()
        .map(|c| c.wait_timeout(WAIT).expect("in time").unwrap())
        .collect();
    let commits = store.group_commit_stats().unwrap().commits - before;
    assert!(commits <= 3, "16 snapshot creates took {commits} commits");
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), 16, "each snapshot got its own id");
    // A merge: the new snapshot replaces the first one atomically.
    let merged = storages[0]
        .create_async(
            &meta,
            &segs,
            &bucket_key(1, 3),
            &[(ids[0], bucket_key(1, 2))],
        )
        .wait_timeout(WAIT)
        .unwrap()
        .unwrap();
    storages[1]
        .delete_async(ids[1], &bucket_key(1, 2))
        .wait_timeout(WAIT)
        .unwrap()
        .unwrap();
    // What a crash now keeps.
    drop(storages);
    let reopened = store_on(&Disk::with_image(disk.durable_image(disk.syncs())));
    let s0 = RedbSnapshotStorage::new(reopened.clone(), "t", "sub-0").unwrap();
    assert_eq!(s0.bucket_keys().unwrap(), vec![(bucket_key(1, 3), merged)]);
    assert!(
        s0.get_metadata(ids[0]).is_err(),
        "replaced snapshot survived"
    );
    let s1 = RedbSnapshotStorage::new(reopened.clone(), "t", "sub-1").unwrap();
    assert!(s1.bucket_keys().unwrap().is_empty());
    for (i, id) in ids.iter().enumerate().skip(2) {
        let s = RedbSnapshotStorage::new(reopened.clone(), "t", format!("sub-{i}")).unwrap();
        assert_eq!(s.bucket_keys().unwrap(), vec![(bucket_key(1, 2), *id)]);
    }
}

/// The pending-ack log on the redb store: `append_async` returns at once,
/// its callback runs once the record is durable and applied (the summary
/// holds it), and 32 appends share commits.
#[test]
fn pending_ack_append_async_completes_after_the_record_is_durable() {
    use pulsar_core::pending_ack::{
        AckedPosition, ExecutorMode, HandleConfig, InlineReads, MemorySubscription,
        PendingAckHandle, PendingAckRecord, ReplayExecutorPool, TxnId, VirtualTimer,
    };
    let _w = watchdog::arm("pending_ack_append_async", WAIT);
    let disk = Arc::new(Disk::default());
    let store = Arc::new(store_on(&disk));
    let ml = ManagedLedger::open(
        "t-sub__transaction_pending_ack",
        cfg(),
        store.clone() as Arc<dyn LedgerStore>,
    )
    .unwrap();
    let cursor = Arc::new(ml.open_cursor("__pending_ack_state").unwrap());
    let pool = ReplayExecutorPool::new(1, ExecutorMode::Manual).unwrap();
    let handle = PendingAckHandle::new(
        "t-sub",
        cursor,
        Arc::new(MemorySubscription::default()),
        &pool,
        Arc::new(InlineReads),
        Arc::new(VirtualTimer::new()),
        HandleConfig::default(),
    )
    .unwrap();
    let waiter = handle.ready_waiter();
    handle.init();
    pool.run_pending();
    assert_eq!(waiter.try_result(), Some(Ok(())));
    let before = store.group_commit_stats().map_or(0, |s| s.commits);
    disk.hold(true);
    let mut pending = Vec::new();
    for i in 0..32 {
        let (done, tx) =
            completion_pair(|| pulsar_core::pending_ack::PendingAckError::WriterClosed);
        let record = PendingAckRecord::individual_ack(
            TxnId::new(0, i),
            vec![AckedPosition::whole(Position::new(3, i as i64))],
        );
        let h = handle.clone();
        let syncs_at_submit = disk.syncs();
        let disk2 = Arc::clone(&disk);
        handle.append_async(
            record,
            Box::new(move |r| {
                // Applied by the time the callback runs, and an fsync
                // happened since the submission.
                let applied = h.summary().individual.contains_key(&TxnId::new(0, i));
                tx.complete(r.map(|ack| (ack, applied, disk2.syncs() > syncs_at_submit)));
            }),
        );
        pending.push(done);
    }
    assert_eq!(
        handle.summary().individual.len(),
        0,
        "applied before durable"
    );
    disk.hold(false);
    for done in pending {
        let (ack, applied, synced) = done.wait_timeout(WAIT).expect("in time").unwrap();
        assert!(
            applied && synced,
            "{ack:?}: applied {applied}, fsync since submit {synced}"
        );
    }
    assert_eq!(handle.summary().individual.len(), 32);
    let commits = store.group_commit_stats().unwrap().commits - before;
    assert!(
        commits <= 3,
        "32 pending-ack appends took {commits} commits"
    );
}

/// `max_delay`: the writer waits for a batch to fill (here up to 2 s, or
/// until it holds `max_batch_writes` = 8), so 8 appends submitted one
/// after another share one commit even with no commit in flight.
#[test]
fn max_delay_lets_a_batch_fill_up_to_max_batch_writes() {
    let _w = watchdog::arm("max_delay_lets_a_batch_fill", WAIT);
    let disk = Arc::new(Disk::default());
    let store = Arc::new(store_on(&disk).with_group_commit(GroupCommitConfig {
        max_batch_writes: 8,
        max_delay: Duration::from_secs(2),
        ..GroupCommitConfig::default()
    }));
    let ml = ManagedLedger::open("t", cfg(), store.clone() as Arc<dyn LedgerStore>).unwrap();
    let pending: Vec<_> = (0..8u8).map(|i| ml.append_async(vec![i])).collect();
    for c in pending {
        c.wait_timeout(WAIT).unwrap().unwrap();
    }
    let s = store.group_commit_stats().unwrap();
    assert_eq!((s.commits, s.writes, s.largest_batch), (1, 8, 8));
}

/// A non-durable cursor (a reader's) writes nothing on the non-blocking
/// path either: its mark-delete moves at once and no commit happens.
#[test]
fn a_non_durable_cursor_completes_at_once_without_a_commit() {
    let _w = watchdog::arm("a_non_durable_cursor_completes_at_once", WAIT);
    let disk = Arc::new(Disk::default());
    let store = Arc::new(store_on(&disk));
    let ml = ManagedLedger::open("t", cfg(), store.clone() as Arc<dyn LedgerStore>).unwrap();
    ml.append_batch(&[b"a", b"b"]).unwrap();
    let syncs = disk.syncs();
    let reader = ml.open_non_durable_cursor("reader", Position::new(1, -1));
    let mut done = reader.mark_delete_async(Position::new(1, 0));
    assert_eq!(done.try_take(), Some(Ok(())));
    assert_eq!(reader.mark_delete_position(), Position::new(1, 0));
    assert_eq!(
        disk.syncs(),
        syncs,
        "a non-durable cursor wrote to the store"
    );
    assert!(store.group_commit_stats().is_none_or(|s| s.writes == 0));
}

/// Releases a held disk when the test ends, so a failed assertion while
/// a commit is held fails the test instead of hanging the committer's join.
struct ReleaseOnDrop<'a>(&'a Disk);

impl Drop for ReleaseOnDrop<'_> {
    fn drop(&mut self) {
        self.0.hold(false);
    }
}

/// Backpressure: while `max_queued_writes` writes wait behind a held
/// commit, the next append and cursor persist are refused at once with
/// `Throttled` and change nothing — the appends queued before them still
/// commit at their planned positions, the next append after the queue
/// drained takes the position right after them (no gap), and the cursor's
/// mark-delete stays where it was.
#[test]
fn a_full_writer_queue_refuses_writes_at_once_and_changes_nothing() {
    let _w = watchdog::arm("a_full_writer_queue_refuses_writes", WAIT);
    let disk = Arc::new(Disk::default());
    let store = Arc::new(store_on(&disk).with_group_commit(GroupCommitConfig {
        max_queued_writes: 2,
        ..GroupCommitConfig::default()
    }));
    let ml = ManagedLedger::open("t", cfg(), store.clone() as Arc<dyn LedgerStore>).unwrap();
    let cursor = ml.open_cursor("c").unwrap();
    disk.hold(true);
    let _release = ReleaseOnDrop(&disk);
    let first = ml.append_async(vec![0]);
    while disk.held() == 0 {
        std::thread::yield_now();
    }
    let queued: Vec<_> = (1..3u8).map(|i| ml.append_async(vec![i])).collect();
    let mut refused = ml.append_async(vec![3]);
    match refused.try_take() {
        Some(Err(LedgerError::Store(StoreError::Throttled(msg)))) => {
            assert!(msg.contains("max_queued_writes 2"), "{msg}");
        }
        other => panic!("a full queue must refuse the append at once, got {other:?}"),
    }
    let mut persist = cursor.mark_delete_async(Position::new(1, 0));
    assert!(
        matches!(
            persist.try_take(),
            Some(Err(LedgerError::Store(StoreError::Throttled(_))))
        ),
        "a full queue must refuse the cursor persist at once"
    );
    disk.hold(false);
    assert_eq!(
        first.wait_timeout(WAIT).unwrap().unwrap(),
        Position::new(1, 0)
    );
    for (i, c) in queued.into_iter().enumerate() {
        assert_eq!(
            c.wait_timeout(WAIT).unwrap().unwrap(),
            Position::new(1, 1 + i as i64),
            "an append queued before the refused one commits at its planned position"
        );
    }
    assert_eq!(cursor.mark_delete_position(), Position::new(1, -1));
    let next = ml.append_async(vec![4]);
    assert_eq!(
        next.wait_timeout(WAIT).unwrap().unwrap(),
        Position::new(1, 3)
    );
    let stats = store.group_commit_stats().unwrap();
    assert_eq!(stats.throttled, 2);
    assert_eq!(stats.writes, 4);
    let read: Vec<Vec<u8>> = cursor
        .read_entries(10)
        .unwrap()
        .into_iter()
        .map(|e| e.data)
        .collect();
    assert_eq!(read, vec![vec![0], vec![1], vec![2], vec![4]]);
}

/// The byte bound: one large write is taken into an empty queue, the next
/// one that would pass `max_queued_bytes` is refused.
#[test]
fn the_queued_bytes_bound_refuses_a_write_that_would_pass_it() {
    let _w = watchdog::arm("the_queued_bytes_bound", WAIT);
    let disk = Arc::new(Disk::default());
    let store = Arc::new(store_on(&disk).with_group_commit(GroupCommitConfig {
        max_queued_bytes: 100,
        ..GroupCommitConfig::default()
    }));
    let ml = ManagedLedger::open("t", cfg(), store.clone() as Arc<dyn LedgerStore>).unwrap();
    disk.hold(true);
    let _release = ReleaseOnDrop(&disk);
    let first = ml.append_async(vec![0]);
    while disk.held() == 0 {
        std::thread::yield_now();
    }
    let big = ml.append_async(vec![7; 150]);
    let mut refused = ml.append_async(vec![8; 10]);
    assert!(
        matches!(
            refused.try_take(),
            Some(Err(LedgerError::Store(StoreError::Throttled(_))))
        ),
        "a write past max_queued_bytes must be refused at once"
    );
    disk.hold(false);
    first.wait_timeout(WAIT).unwrap().unwrap();
    assert_eq!(
        big.wait_timeout(WAIT).unwrap().unwrap(),
        Position::new(1, 1)
    );
    assert_eq!(store.group_commit_stats().unwrap().throttled, 1);
}
