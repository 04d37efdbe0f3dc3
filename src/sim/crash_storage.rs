//! A redb storage backend in memory that can crash between two durable
//! writes: the simulator's crash points.
//!
//! [`CrashStorage`] keeps one database file image in memory as two layers:
//! what is durable (as of the last `sync_data`) and what the process wrote
//! since. A crash discards everything not synced, which is exactly what the
//! sync mode in use loses: with [`SyncMode::Immediate`] every commit ends in
//! a `sync_data`, so nothing committed is lost; with [`SyncMode::Deferred`]
//! commits stay in redb's write buffer (or reach the file unsynced) and
//! everything since the last fsync is lost.
//!
//! A *durable write* is one `sync_data` call (with `Immediate`, one per
//! commit, plus one when the file grows). The storage counts them per
//! backend instance (one instance per broker (re)start, so "the k-th
//! durable write since the last (re)start") and can be armed to die at the
//! k-th one ([`CrashStorage::arm`]), in one of two [`CrashKind`]s:
//!
//! - [`CrashKind::BeforeSync`]: the k-th `sync_data` fails and nothing of it
//!   reaches the durable layer (the commit it ends is lost, its caller gets
//!   an error and the client no answer);
//! - [`CrashKind::AfterSync`]: the k-th `sync_data` is durable and returns
//!   `Ok` (its caller may answer its client), then the process dies.
//!
//! Once dead, every further `write`, `set_len` and `sync_data` of that
//! instance fails with an I/O error, so no later write becomes durable;
//! `close` persists nothing. Reads still see what the dead process wrote
//! (its in-memory structures are dropped by the caller, not here).
//! [`CrashStorage::recover`] then rolls the image back to the durable layer
//! and fences every earlier instance; [`CrashStorage::backend`] gives the
//! restarted process a fresh instance over it.
//!
//! Costs: the image is one `Vec<u8>`; the unsynced layer is an undo log of
//! the durable bytes of each 4 KiB block first overwritten (or cut off by a
//! `set_len`) since the last sync, so a write costs O(its bytes) plus one
//! block copy per block touched for the first time, a sync O(1), a crash
//! O(blocks touched) — never a copy of the whole image. The undo log is one
//! byte arena and one block index whose capacity survives a sync, so a
//! store at steady state allocates nothing per write or per sync.
//! Memory is the image plus the undo log (at most the durable image's
//! size), reported by [`CrashStorage::stats`].
//!
//! [`SyncMode::Immediate`]: crate::ledger::SyncMode::Immediate
//! [`SyncMode::Deferred`]: crate::ledger::SyncMode::Deferred

use std::collections::HashMap;
use std::sync::Arc;

use crate::sync::Mutex;

/// Granularity of the undo log, bytes (redb's default page size).
const BLOCK: u64 = 4096;

/// Where a crash at the k-th durable write falls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CrashKind {
    /// Just before the k-th `sync_data`: it fails, nothing of it is durable.
    BeforeSync,
    /// Just after the k-th `sync_data`: it is durable and returns `Ok`.
    AfterSync,
}

/// A crash at the `k`-th durable write (1-based) of a backend instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct CrashPoint {
    /// Which durable write, counted from 1 since the instance was created.
    pub k: u64,
    /// Before or after it.
    pub kind: CrashKind,
}

/// A crash the simulator took, for the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct CrashRecord {
    /// The durable write it fell at, counted from 1 since the broker's last
    /// (re)start.
    pub k: u64,
    /// Before or after that write's fsync.
    pub kind: CrashKind,
    /// Virtual time of the crash, ms.
    pub at_ms: u64,
}

/// Sizes and counters of a [`CrashStorage`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CrashStorageStats {
    /// Bytes of the file image the process sees now.
    pub image_bytes: u64,
    /// Bytes of the undo log now (durable bytes overwritten since the last
    /// sync).
    pub undo_bytes: u64,
    /// Largest undo log seen, bytes.
    pub undo_peak_bytes: u64,
    /// Largest image plus undo log seen, bytes: the storage's peak memory.
    pub peak_bytes: u64,
    /// Bytes written by every instance.
    pub bytes_written: u64,
    /// Successful durable writes (`sync_data`) of every instance.
    pub durable_writes: u64,
    /// Crashes taken ([`CrashStorage::recover`] after a death).
    pub crashes: u64,
}

#[derive(Debug, Default)]
struct State {
    /// What the running process sees: durable bytes overlaid with every
    /// write since the last sync.
    image: Vec<u8>,
    /// Length of the file as of the last sync.
    durable_len: u64,
    /// Block index → where the block's durable bytes (the part below
    /// `durable_len`), saved before its first change since the last sync,
    /// start in `undo_arena` (they run to the block's end or `durable_len`).
    undo: HashMap<u64, usize>,
    /// The saved blocks' bytes, back to back; `undo_arena.len()` is the
    /// undo log's size.
    undo_arena: Vec<u8>,
    undo_bytes: u64,
    /// The instance allowed to do I/O; earlier ones are fenced.
    epoch: u64,
    /// The current instance died (a crash point was reached or
    /// [`CrashStorage::crash`] was called).
    dead: bool,
    /// Durable writes of the current instance.
    syncs: u64,
    armed: Option<CrashPoint>,
    /// The crash point the current instance died at.
    fired: Option<CrashPoint>,
    stats: CrashStorageStats,
}

impl State {
    /// Saves the durable bytes of every block in `[from, to)` not saved
    /// since the last sync.
    fn save_blocks(&mut self, from: u64, to: u64) {
        let to = to.min(self.durable_len);
        if from >= to {
            return;
        }
        for b in from / BLOCK..to.div_ceil(BLOCK) {
            let at = self.undo_arena.len();
            if let std::collections::hash_map::Entry::Vacant(v) = self.undo.entry(b) {
                v.insert(at);
                let start = (b * BLOCK) as usize;
                let end = ((b + 1) * BLOCK).min(self.durable_len) as usize;
                self.undo_arena.extend_from_slice(&self.image[start..end]);
                self.undo_bytes += (end - start) as u64;
            }
        }
        self.stats.undo_peak_bytes = self.stats.undo_peak_bytes.max(self.undo_bytes);
        self.stats.peak_bytes = self
            .stats
            .peak_bytes
            .max(self.image.len() as u64 + self.undo_bytes);
    }

    /// The unsynced layer becomes durable.
    fn make_durable(&mut self) {
        self.undo.clear();
        self.undo_arena.clear();
        self.undo_bytes = 0;
        self.durable_len = self.image.len() as u64;
        self.syncs += 1;
        self.stats.durable_writes += 1;
    }

    /// Turns `image` (the running image or a copy of it) into the durable
    /// layer: every saved block restored, the length cut to the last sync's.
    fn restore_durable(&self, image: &mut Vec<u8>) {
        let durable_len = self.durable_len as usize;
        if image.len() < durable_len {
            image.resize(durable_len, 0);
        }
        // Saved blocks are disjoint: the order of the copies does not matter.
        for (&b, &at) in &self.undo {
            let start = (b * BLOCK) as usize;
            let end = ((b + 1) * BLOCK).min(self.durable_len) as usize;
            image[start..end].copy_from_slice(&self.undo_arena[at..at + (end - start)]);
        }
        image.truncate(durable_len);
    }

    /// The image goes back to the durable layer.
    fn roll_back(&mut self) {
        let mut image = std::mem::take(&mut self.image);
        self.restore_durable(&mut image);
        self.image = image;
        self.undo.clear();
        self.undo_arena.clear();
        self.undo_bytes = 0;
    }
}

/// The shared file image and crash control of the simulator's store (see
/// the module docs). Cloning shares it.
#[derive(Debug, Clone, Default)]
pub struct CrashStorage {
    state: Arc<Mutex<State>>,
}

impl CrashStorage {
    /// An empty image (a new store).
    pub fn new() -> Self {
        Self::default()
    }

    /// The durable layer of the image (what a crash now would leave): the
    /// store file a data dir keeps after a run.
    pub fn durable_image(&self) -> Vec<u8> {
        let s = self.state.lock();
        let mut image = s.image.clone();
        s.restore_durable(&mut image);
        image
    }

    /// A backend instance for a new process over the current image: its
    /// durable-write count starts at 0 and every earlier instance is fenced
    /// (all of its I/O fails). Keeps an armed crash point armed.
    pub fn backend(&self) -> CrashBackend {
        let mut s = self.state.lock();
        s.epoch += 1;
        s.dead = false;
        s.syncs = 0;
        CrashBackend {
            state: Arc::clone(&self.state),
            epoch: s.epoch,
        }
    }

    /// The current instance dies at its `point.k`-th durable write (counted
    /// since [`CrashStorage::backend`] created it, writes already done
    /// included). Replaces any armed point.
    pub fn arm(&self, point: CrashPoint) {
        self.state.lock().armed = Some(point);
    }

    /// Removes the armed crash point, if any, and returns it.
    pub fn disarm(&self) -> Option<CrashPoint> {
        self.state.lock().armed.take()
    }

    /// The armed crash point, if any.
    pub fn armed(&self) -> Option<CrashPoint> {
        self.state.lock().armed
    }

    /// The current instance dies now (as at a crash point).
    pub fn crash(&self) {
        let mut s = self.state.lock();
        s.dead = true;
        s.armed = None;
        s.fired = None;
    }

    /// Whether the current instance has died.
    pub fn is_dead(&self) -> bool {
        self.state.lock().dead
    }

    /// Durable writes of the current instance so far.
    pub fn durable_writes_since_open(&self) -> u64 {
        self.state.lock().syncs
    }

    /// After a death: every earlier instance is fenced and the image goes
    /// back to the durable layer (everything written since the last sync is
    /// lost). Counts a crash and returns the crash point it fell at (`None`
    /// after [`CrashStorage::crash`]). Create the restarted process's
    /// instance with [`CrashStorage::backend`].
    pub fn recover(&self) -> Option<CrashPoint> {
        let mut s = self.state.lock();
        s.roll_back();
        s.epoch += 1;
        s.dead = false;
        s.stats.crashes += 1;
        s.fired.take()
    }

    /// Sizes and counters.
    pub fn stats(&self) -> CrashStorageStats {
        let s = self.state.lock();
        CrashStorageStats {
            image_bytes: s.image.len() as u64,
            undo_bytes: s.undo_bytes,
            ..s.stats
        }
    }
}

/// One process's handle on a [`CrashStorage`] image: a
/// [`redb::StorageBackend`] for [`crate::ledger::RedbStore::open_on_backend`].
#[derive(Debug)]
pub struct CrashBackend {
    state: Arc<Mutex<State>>,
    epoch: u64,
}

fn io_error(what: &str) -> std::io::Error {
    std::io::Error::other(what.to_string())
}

impl CrashBackend {
    /// The state, if this instance may write: alive and not fenced.
    fn writable(&self) -> Result<crate::sync::MutexGuard<'_, State>, std::io::Error> {
        let s = self.state.lock();
        if s.epoch != self.epoch {
            return Err(io_error("crash storage: instance fenced by a restart"));
        }
        if s.dead {
            return Err(io_error("crash storage: the process crashed"));
        }
        Ok(s)
    }
}

impl redb::StorageBackend for CrashBackend {
    fn len(&self) -> Result<u64, std::io::Error> {
        let s = self.state.lock();
        if s.epoch != self.epoch {
            return Err(io_error("crash storage: instance fenced by a restart"));
        }
        Ok(s.image.len() as u64)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        let s = self.state.lock();
        if s.epoch != self.epoch {
            return Err(io_error("crash storage: instance fenced by a restart"));
        }
        let start = usize::try_from(offset).map_err(|_| io_error("offset out of range"))?;
        let source = start
            .checked_add(out.len())
            .and_then(|end| s.image.get(start..end))
            .ok_or_else(|| io_error("read past the end of the image"))?;
        out.copy_from_slice(source);
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        let mut s = self.writable()?;
        let new_len = usize::try_from(len).map_err(|_| io_error("length out of range"))?;
        let old = s.image.len() as u64;
        if len < old {
            s.save_blocks(len, old);
        }
        s.image.resize(new_len, 0);
        let peak = s.image.len() as u64 + s.undo_bytes;
        s.stats.peak_bytes = s.stats.peak_bytes.max(peak);
        Ok(())
    }

    fn sync_data(&self) -> Result<(), std::io::Error> {
        let mut s = self.writable()?;
        let next = s.syncs + 1;
        match s.armed {
            Some(p) if p.k <= next => {
                s.armed = None;
                s.dead = true;
                s.fired = Some(CrashPoint { k: next, ..p });
                match p.kind {
                    CrashKind::BeforeSync => Err(io_error("crash storage: crashed before a sync")),
                    CrashKind::AfterSync => {
                        s.make_durable();
                        Ok(())
                    }
                }
            }
            _ => {
                s.make_durable();
                Ok(())
            }
        }
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        let mut s = self.writable()?;
        let end = offset
            .checked_add(data.len() as u64)
            .filter(|&e| e <= s.image.len() as u64)
            .ok_or_else(|| io_error("write past the end of the image"))?;
        s.save_blocks(offset, end);
        s.image[offset as usize..end as usize].copy_from_slice(data);
        s.stats.bytes_written += data.len() as u64;
        Ok(())
    }

    fn close(&self) -> Result<(), std::io::Error> {
        // Nothing to release, and nothing is persisted here: what is durable
        // is what the last sync made durable.
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb::{Database, Durability, ReadableDatabase, StorageBackend, TableDefinition};

    const T: TableDefinition<u64, u64> = TableDefinition::new("t");

    fn open(storage: &CrashStorage) -> Database {
        Database::builder()
            .create_with_backend(storage.backend())
            .expect("open on the crash storage")
    }

    fn put(db: &Database, key: u64, durability: Durability) -> Result<(), redb::Error> {
        let mut txn = db.begin_write()?;
        txn.set_durability(durability)?;
        {
            let mut t = txn.open_table(T)?;
            t.insert(key, key * 10)?;
        }
        txn.commit()?;
        Ok(())
    }

    fn keys(db: &Database) -> Vec<u64> {
        let txn = db.begin_read().unwrap();
        let Ok(t) = txn.open_table(T) else {
            return Vec::new();
        };
        use redb::ReadableTable;
        t.iter()
            .unwrap()
            .map(|r| {
                let (k, v) = r.unwrap();
                assert_eq!(v.value(), k.value() * 10);
                k.value()
            })
            .collect()
    }

    #[test]
    fn a_crash_loses_exactly_the_unsynced_writes() {
        let storage = CrashStorage::new();
        let b = storage.backend();
        b.set_len(3 * BLOCK).unwrap();
        b.write(0, &[1; 100]).unwrap();
        b.write(BLOCK + 10, &[2; 100]).unwrap();
        b.sync_data().unwrap();
        let durable = {
            let mut out = vec![0; (3 * BLOCK) as usize];
            b.read(0, &mut out).unwrap();
            out
        };
        // Unsynced: an overwrite, a write across a block boundary, a growth
        // and a shrink below the durable length.
        b.write(50, &[9; 100]).unwrap();
        b.write(2 * BLOCK - 20, &[8; 40]).unwrap();
        b.set_len(5 * BLOCK).unwrap();
        b.write(4 * BLOCK, &[7; 10]).unwrap();
        b.set_len(BLOCK + 50).unwrap();
        storage.crash();
        assert!(b.write(0, &[0]).is_err(), "a dead instance refuses writes");
        assert!(b.sync_data().is_err(), "a dead instance refuses syncs");
        assert!(b.set_len(0).is_err(), "a dead instance refuses set_len");
        storage.recover();
        let after = storage.backend();
        assert_eq!(after.len().unwrap(), 3 * BLOCK);
        let mut out = vec![0; (3 * BLOCK) as usize];
        after.read(0, &mut out).unwrap();
        assert_eq!(out, durable);
        assert!(
            b.read(0, &mut [0; 1]).is_err(),
            "the old instance is fenced"
        );
        assert_eq!(storage.stats().undo_bytes, 0);
    }

    #[test]
    fn a_synced_write_survives_and_the_undo_log_is_bounded_by_the_image() {
        let storage = CrashStorage::new();
        let b = storage.backend();
        b.set_len(2 * BLOCK).unwrap();
        b.write(0, &[1; 10]).unwrap();
        b.sync_data().unwrap();
        // Many overwrites of one block keep one saved copy.
        for i in 0..100u8 {
            b.write(0, &[i; 10]).unwrap();
        }
        assert_eq!(storage.stats().undo_bytes, BLOCK);
        b.sync_data().unwrap();
        assert_eq!(storage.stats().undo_bytes, 0);
        storage.crash();
        storage.recover();
        let after = storage.backend();
        let mut out = [0; 10];
        after.read(0, &mut out).unwrap();
        assert_eq!(out, [99; 10]);
        let st = storage.stats();
        assert!(st.peak_bytes <= 2 * st.image_bytes, "{st:?}");
        assert_eq!(st.durable_writes, 2);
        assert_eq!(st.crashes, 1);
    }

    #[test]
    fn an_armed_crash_point_dies_before_or_after_the_kth_sync() {
        for kind in [CrashKind::BeforeSync, CrashKind::AfterSync] {
            let storage = CrashStorage::new();
            let b = storage.backend();
            b.set_len(BLOCK).unwrap();
            storage.arm(CrashPoint { k: 2, kind });
            b.write(0, &[1]).unwrap();
            b.sync_data().unwrap();
            assert!(!storage.is_dead());
            b.write(0, &[2]).unwrap();
            let second = b.sync_data();
            assert_eq!(second.is_ok(), kind == CrashKind::AfterSync, "{kind:?}");
            assert!(storage.is_dead());
            assert!(b.write(0, &[3]).is_err());
            storage.recover();
            let mut out = [0];
            storage.backend().read(0, &mut out).unwrap();
            let expected = if kind == CrashKind::AfterSync { 2 } else { 1 };
            assert_eq!(out, [expected], "{kind:?}");
        }
    }

    /// With `Immediate` commits, a crash at the k-th durable write leaves a
    /// consistent database holding exactly the commits whose sync completed.
    #[test]
    fn reopening_after_a_crash_shows_exactly_the_durable_commits_immediate() {
        for kind in [CrashKind::BeforeSync, CrashKind::AfterSync] {
            for k in 1..=6u64 {
                let storage = CrashStorage::new();
                let db = open(&storage);
                let base = storage.durable_writes_since_open();
                storage.arm(CrashPoint { k: base + k, kind });
                let mut committed = Vec::new();
                for key in 0..10u64 {
                    match put(&db, key, Durability::Immediate) {
                        Ok(()) => committed.push(key),
                        Err(_) => break,
                    }
                    if storage.is_dead() {
                        break;
                    }
                }
                assert!(
                    storage.is_dead(),
                    "k={k} {kind:?}: the crash point was reached"
                );
                drop(db); // a dead process's close persists nothing
                storage.recover();
                let db = open(&storage);
                assert_eq!(keys(&db), committed, "k={k} {kind:?}");
                // And it takes new commits.
                put(&db, 100, Durability::Immediate).unwrap();
                drop(db);
                let db = open(&storage);
                assert_eq!(keys(&db).last(), Some(&100));
            }
        }
    }

    /// redb does not create a database atomically: a crash between the
    /// fsyncs of its creation leaves an image it refuses to open (so the
    /// simulator creates the store before the broker's first start).
    #[test]
    fn a_crash_during_the_creation_of_the_database_leaves_an_image_redb_refuses() {
        let storage = CrashStorage::new();
        storage.arm(CrashPoint {
            k: 2,
            kind: CrashKind::BeforeSync,
        });
        let created = Database::builder().create_with_backend(storage.backend());
        assert!(created.is_err() || storage.is_dead());
        drop(created);
        storage.recover();
        let reopened = Database::builder().create_with_backend(storage.backend());
        let err = reopened.expect_err("redb opens a half-created image");
        assert!(err.to_string().contains("magic number"), "{err}");
    }

    /// With deferred commits (`Durability::None`) nothing reaches the
    /// durable layer before an `Immediate` commit: a crash loses everything
    /// since the last one, and the database reopens consistent at it.
    #[test]
    fn reopening_after_a_crash_shows_exactly_the_durable_commits_deferred() {
        let storage = CrashStorage::new();
        let db = open(&storage);
        put(&db, 1, Durability::None).unwrap();
        put(&db, 2, Durability::Immediate).unwrap(); // fsync: 1 and 2 durable
        put(&db, 3, Durability::None).unwrap();
        put(&db, 4, Durability::None).unwrap();
        assert_eq!(keys(&db), vec![1, 2, 3, 4], "visible to the process");
        storage.crash();
        drop(db);
        storage.recover();
        let db = open(&storage);
        assert_eq!(keys(&db), vec![1, 2]);
        // A clean close makes deferred commits durable.
        put(&db, 5, Durability::None).unwrap();
        drop(db);
        let db = open(&storage);
        assert_eq!(keys(&db), vec![1, 2, 5]);
    }
}
