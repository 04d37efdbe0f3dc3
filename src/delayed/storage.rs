//! Bucket snapshot storage: the [`BucketSnapshotStorage`] trait, the durable
//! [`RedbSnapshotStorage`] (default), the in-memory
//! [`MemorySnapshotStorage`] (tests) and the fault-injecting
//! [`FaultyStorage`] wrapper.

use std::collections::BTreeMap;
use std::fmt;

use prost::Message;
use redb::{ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};

use super::error::DelayedError;
use super::snapshot::{
    decode_metadata, decode_segment, parse_bucket_key, SnapshotMetadata, SnapshotSegment,
};
use crate::ledger::{completion_pair, Completion, FnWrite, RedbStore, StoreError, StoreWrite};
use crate::sync::{AtomicI64, AtomicU32, Mutex, Ordering};

/// Where bucket snapshots live (Pulsar `BucketSnapshotStorage`, backed by
/// BookKeeper ledgers there). One instance serves one subscription (managed
/// ledger + cursor): the bucket keys it writes are that cursor's properties.
///
/// A snapshot is immutable: entry 0 is the [`SnapshotMetadata`], entries
/// `1..=N` the [`SnapshotSegment`]s. It counts as committed once its cursor
/// property (the bucket key → snapshot id) is written; implementations write
/// both in one atomic step. Every method is atomic (all or nothing) and
/// synchronous; the tracker calls them under its lock, so they must not call
/// back into the tracker. Implementations are `Send + Sync`.
pub trait BucketSnapshotStorage: Send + Sync + fmt::Debug {
    /// Writes a new snapshot and the cursor property `bucket_key` → its id,
    /// and deletes the snapshots (and properties) listed in `replaces`, all
    /// atomically. Returns the new snapshot id (> 0).
    ///
    /// # Errors
    /// [`DelayedError::Storage`] if nothing could be written (nothing was).
    fn create(
        &self,
        metadata: &SnapshotMetadata,
        segments: &[SnapshotSegment],
        bucket_key: &str,
        replaces: &[(i64, String)],
    ) -> Result<i64, DelayedError>;

    /// Reads entry 0 of snapshot `snapshot_id`.
    ///
    /// # Errors
    /// [`DelayedError::SnapshotNotFound`], [`DelayedError::CorruptSnapshot`]
    /// (bad protobuf), [`DelayedError::Storage`].
    fn get_metadata(&self, snapshot_id: i64) -> Result<SnapshotMetadata, DelayedError>;

    /// Reads segments `first..=last` (segment number = entry id, from 1).
    ///
    /// # Errors
    /// [`DelayedError::SnapshotNotFound`] if the snapshot does not exist,
    /// [`DelayedError::CorruptSnapshot`] if a segment in the range is missing
    /// (segment count mismatch) or is bad protobuf,
    /// [`DelayedError::Storage`].
    fn get_segments(
        &self,
        snapshot_id: i64,
        first: u64,
        last: u64,
    ) -> Result<Vec<SnapshotSegment>, DelayedError>;

    /// Number of segment entries of the snapshot (entries after entry 0).
    ///
    /// # Errors
    /// [`DelayedError::SnapshotNotFound`], [`DelayedError::Storage`].
    fn length(&self, snapshot_id: i64) -> Result<u64, DelayedError>;

    /// Deletes the snapshot and removes the cursor property `bucket_key`,
    /// atomically. Deleting a missing snapshot succeeds ("bucket does not
    /// exist" counts as empty).
    ///
    /// # Errors
    /// [`DelayedError::Storage`] (nothing was deleted).
    fn delete(&self, snapshot_id: i64, bucket_key: &str) -> Result<(), DelayedError>;

    /// The committed bucket keys (cursor properties with the bucket prefix
    /// that parse as `<start>_<end>`) → snapshot id, in key order.
    ///
    /// # Errors
    /// [`DelayedError::Storage`].
    fn bucket_keys(&self) -> Result<Vec<(String, i64)>, DelayedError>;
}

fn encode_all(metadata: &SnapshotMetadata, segments: &[SnapshotSegment]) -> Vec<Vec<u8>> {
    let mut out = Vec::with_capacity(segments.len() + 1);
    out.push(metadata.encode_to_vec());
    out.extend(segments.iter().map(Message::encode_to_vec));
    out
}

// ---------------------------------------------------------------- memory

#[derive(Debug, Default)]
struct MemoryInner {
    next_id: i64,
    /// snapshot id → encoded entries (0 = metadata).
    snapshots: BTreeMap<i64, Vec<Vec<u8>>>,
    /// bucket key → snapshot id (the cursor properties).
    properties: BTreeMap<String, i64>,
}

/// In-memory [`BucketSnapshotStorage`] holding encoded bytes (so decoding and
/// corruption behave as on disk). Share it through an `Arc` across tracker
/// "lifetimes" to simulate a crash and recovery. Nothing survives the process.
#[derive(Debug, Default)]
pub struct MemorySnapshotStorage {
    inner: Mutex<MemoryInner>,
}

impl MemorySnapshotStorage {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Test hook: replaces (`Some`) or removes (`None`) raw entry `entry` of
    /// snapshot `snapshot_id` (e.g. to inject corrupt bytes). Returns whether
    /// the snapshot exists.
    pub fn set_raw_entry(&self, snapshot_id: i64, entry: usize, bytes: Option<Vec<u8>>) -> bool {
        let mut inner = self.inner.lock();
        let Some(s) = inner.snapshots.get_mut(&snapshot_id) else {
            return false;
        };
        match bytes {
            Some(b) if entry < s.len() => s[entry] = b,
            Some(b) => s.push(b),
            None => {
                s.truncate(entry);
            }
        }
        true
    }

    /// Test hook: drops the snapshot data but keeps its cursor property (a
    /// dangling key, as after a crash between Pulsar's two steps).
    pub fn drop_snapshot_data(&self, snapshot_id: i64) -> bool {
        self.inner.lock().snapshots.remove(&snapshot_id).is_some()
    }

    /// Test hook: sets a raw cursor property.
    pub fn set_property(&self, key: &str, value: i64) {
        self.inner.lock().properties.insert(key.to_string(), value);
    }

    /// Ids of the stored snapshots.
    pub fn snapshot_ids(&self) -> Vec<i64> {
        self.inner.lock().snapshots.keys().copied().collect()
    }

    /// Bytes held by the stored snapshots (payload capacity), for memory
    /// reports that separate the storage from the tracker.
    pub fn stored_bytes(&self) -> usize {
        let inner = self.inner.lock();
        inner
            .snapshots
            .values()
            .map(|s| s.capacity() * 24 + s.iter().map(Vec::capacity).sum::<usize>())
            .sum::<usize>()
            + inner
                .properties
                .keys()
                .map(|k| k.capacity() + 64)
                .sum::<usize>()
    }
}

impl BucketSnapshotStorage for MemorySnapshotStorage {
    fn create(
        &self,
        metadata: &SnapshotMetadata,
        segments: &[SnapshotSegment],
        bucket_key: &str,
        replaces: &[(i64, String)],
    ) -> Result<i64, DelayedError> {
        let entries = encode_all(metadata, segments);
        let mut inner = self.inner.lock();
        inner.next_id += 1;
        let id = inner.next_id;
        inner.snapshots.insert(id, entries);
        inner.properties.insert(bucket_key.to_string(), id);
        for (old, key) in replaces {
            inner.snapshots.remove(old);
            if inner.properties.get(key) == Some(old) {
                inner.properties.remove(key);
            }
        }
        Ok(id)
    }

    fn get_metadata(&self, snapshot_id: i64) -> Result<SnapshotMetadata, DelayedError> {
        let inner = self.inner.lock();
        let s = inner
            .snapshots
            .get(&snapshot_id)
            .ok_or(DelayedError::SnapshotNotFound { snapshot_id })?;
        let bytes = s.first().ok_or(DelayedError::CorruptSnapshot {
            snapshot_id,
            reason: "entry 0 (metadata) is missing".into(),
        })?;
        decode_metadata(snapshot_id, bytes)
    }

    fn get_segments(
        &self,
        snapshot_id: i64,
        first: u64,
        last: u64,
    ) -> Result<Vec<SnapshotSegment>, DelayedError> {
        let inner = self.inner.lock();
        let s = inner
            .snapshots
            .get(&snapshot_id)
            .ok_or(DelayedError::SnapshotNotFound { snapshot_id })?;
        (first..=last)
            .map(|e| {
                let bytes = (e >= 1)
                    .then(|| s.get(e as usize))
                    .flatten()
                    .ok_or_else(|| DelayedError::CorruptSnapshot {
                        snapshot_id,
                        reason: format!(
                            "segment {e} missing (snapshot has {} segments)",
                            s.len().saturating_sub(1)
                        ),
                    })?;
                decode_segment(snapshot_id, e, bytes)
            })
            .collect()
    }

    fn length(&self, snapshot_id: i64) -> Result<u64, DelayedError> {
        let inner = self.inner.lock();
        let s = inner
            .snapshots
            .get(&snapshot_id)
            .ok_or(DelayedError::SnapshotNotFound { snapshot_id })?;
        Ok(s.len().saturating_sub(1) as u64)
    }

    fn delete(&self, snapshot_id: i64, bucket_key: &str) -> Result<(), DelayedError> {
        let mut inner = self.inner.lock();
        inner.snapshots.remove(&snapshot_id);
        inner.properties.remove(bucket_key);
        Ok(())
    }

    fn bucket_keys(&self) -> Result<Vec<(String, i64)>, DelayedError> {
        Ok(self
            .inner
            .lock()
            .properties
            .iter()
            .filter(|(k, _)| parse_bucket_key(k).is_some())
            .map(|(k, v)| (k.clone(), *v))
            .collect())
    }
}

// ---------------------------------------------------------------- redb

/// Name of the redb table [`RedbSnapshotStorage`] keeps its snapshot
/// entries in: `(snapshot id, entry id) → encoded entry` (entry 0 is the
/// `SnapshotMetadata`, entry `n ≥ 1` segment `n`).
pub const SNAPSHOT_ENTRIES_TABLE: &str = "delayed_bucket_snapshot_entries";

/// The raw snapshot entries of a store: `snapshot id → [(entry id, encoded
/// bytes)]`, entries in key order ([`RedbSnapshotStorage::read_only_entries`]).
pub type RawSnapshotEntries = BTreeMap<i64, Vec<(u64, Vec<u8>)>>;

/// `(snapshot id, entry id) → encoded entry`.
const SNAPSHOT_ENTRIES: TableDefinition<(i64, u64), &[u8]> =
    TableDefinition::new(SNAPSHOT_ENTRIES_TABLE);
/// `"next" → last assigned snapshot id`.
const SNAPSHOT_SEQ: TableDefinition<&str, i64> =
    TableDefinition::new("delayed_bucket_snapshot_seq");

/// Durable [`BucketSnapshotStorage`] in the crate's [`RedbStore`] database
/// file: snapshot entries live in table `delayed_bucket_snapshot_entries`, and
/// the commit point (the cursor property) is written with
/// [`RedbStore::set_cursor_property_in`] in the **same** write transaction,
/// so a process kill shows a snapshot and its key together or not at all. A
/// merge writes the new snapshot and deletes its sources in one transaction.
#[derive(Debug, Clone)]
pub struct RedbSnapshotStorage {
    store: RedbStore,
    managed_ledger: String,
    cursor: String,
}

fn be<E: fmt::Display>(op: &'static str) -> impl Fn(E) -> DelayedError {
    move |e| DelayedError::storage(op, e)
}

impl RedbSnapshotStorage {
    /// Snapshot storage for the subscription `cursor` of `managed_ledger`,
    /// sharing `store`'s database (creates its tables if needed).
    ///
    /// # Errors
    /// [`DelayedError::Storage`] if the tables cannot be created.
    ///
    /// # Blocking
    /// Yes: creates the snapshot tables (one store commit) on the calling
    /// thread.
    pub fn new(
        store: RedbStore,
        managed_ledger: impl Into<String>,
        cursor: impl Into<String>,
    ) -> Result<Self, DelayedError> {
        let txn = store
            .begin()
            .map_err(|e| DelayedError::from_store("open", e))?;
        txn.open_table(SNAPSHOT_ENTRIES).map_err(be("open"))?;
        txn.open_table(SNAPSHOT_SEQ).map_err(be("open"))?;
        txn.commit().map_err(be("open"))?;
        Ok(Self {
            store,
            managed_ledger: managed_ledger.into(),
            cursor: cursor.into(),
        })
    }

    /// Every snapshot entry of a store opened read-only (for example the
    /// database [`RedbStore::read_only_contents`] returns), as `snapshot id
    /// → [(entry id, encoded bytes)]` in key order; no table is created, so
    /// the file is unchanged. A store without the table has no snapshots.
    ///
    /// # Errors
    /// [`DelayedError::Storage`] if the table cannot be read, also when redb
    /// panics on a damaged file (the panic is contained here).
    pub fn read_only_entries(
        db: &redb::ReadOnlyDatabase,
    ) -> Result<RawSnapshotEntries, DelayedError> {
        let read = || -> Result<_, DelayedError> {
            let op = "read_only_entries";
            let mut out = RawSnapshotEntries::new();
            let txn = db.begin_read().map_err(be(op))?;
            let t = match txn.open_table(SNAPSHOT_ENTRIES) {
                Ok(t) => t,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(out),
                Err(e) => return Err(DelayedError::storage(op, e)),
            };
            for row in t.iter().map_err(be(op))? {
                let (k, v) = row.map_err(be(op))?;
                let (id, entry) = k.value();
                out.entry(id).or_default().push((entry, v.value().to_vec()));
            }
            Ok(out)
        };
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(read)).unwrap_or_else(|panic| {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no message".into());
            Err(DelayedError::storage(
                "read_only_entries",
                format!("the store file is damaged: {what}"),
            ))
        })
    }

    /// The body of [`BucketSnapshotStorage::create`] inside `txn` (the
    /// blocking form and [`RedbSnapshotStorage::create_async`] share it).
    fn create_in(
        &self,
        txn: &WriteTransaction,
        entries: &[Vec<u8>],
        bucket_key: &str,
        replaces: &[(i64, String)],
    ) -> Result<i64, DelayedError> {
        const OP: &str = "create";
        let id = {
            let mut seq = txn.open_table(SNAPSHOT_SEQ).map_err(be(OP))?;
            let id = seq.get("next").map_err(be(OP))?.map_or(0, |v| v.value()) + 1;
            seq.insert("next", id).map_err(be(OP))?;
            let mut t = txn.open_table(SNAPSHOT_ENTRIES).map_err(be(OP))?;
            for (i, e) in entries.iter().enumerate() {
                t.insert((id, i as u64), e.as_slice()).map_err(be(OP))?;
            }
            for (old, _) in replaces {
                t.retain_in((*old, 0)..=(*old, u64::MAX), |_, _| false)
                    .map_err(be(OP))?;
            }
            id
        };
        for (_, key) in replaces {
            RedbStore::set_cursor_property_in(txn, &self.managed_ledger, &self.cursor, key, None)
                .map_err(|e| DelayedError::from_store(OP, e))?;
        }
        RedbStore::set_cursor_property_in(
            txn,
            &self.managed_ledger,
            &self.cursor,
            bucket_key,
            Some(id),
        )
        .map_err(|e| DelayedError::from_store(OP, e))?;
        Ok(id)
    }

    /// The body of [`BucketSnapshotStorage::delete`] inside `txn`.
    fn delete_in(
        &self,
        txn: &WriteTransaction,
        snapshot_id: i64,
        bucket_key: &str,
    ) -> Result<(), DelayedError> {
        const OP: &str = "delete";
        {
            let mut t = txn.open_table(SNAPSHOT_ENTRIES).map_err(be(OP))?;
            t.retain_in((snapshot_id, 0)..=(snapshot_id, u64::MAX), |_, _| false)
                .map_err(be(OP))?;
        }
        RedbStore::set_cursor_property_in(txn, &self.managed_ledger, &self.cursor, bucket_key, None)
            .map_err(|e| DelayedError::from_store(OP, e))
    }

    /// Non-blocking [`BucketSnapshotStorage::create`]: the snapshot, its
    /// cursor property and the removal of `replaces` are queued on the
    /// store's group committer as ONE write (atomic as the blocking form:
    /// a crash shows the old or the new set of buckets); the completion
    /// gets the new snapshot id once it is durable.
    ///
    /// # Blocking
    /// Never blocks on I/O: encodes the snapshot and queues it.
    ///
    /// # Errors
    /// Through the completion: [`DelayedError::Storage`] (nothing was
    /// written).
    pub fn create_async(
        &self,
        metadata: &SnapshotMetadata,
        segments: &[SnapshotSegment],
        bucket_key: &str,
        replaces: &[(i64, String)],
    ) -> Completion<i64, DelayedError> {
        let entries = encode_all(metadata, segments);
        let bytes = entries.iter().map(Vec::len).sum();
        let (me, key, replaces) = (self.clone(), bucket_key.to_string(), replaces.to_vec());
        self.queue("create", bytes, move |txn: &WriteTransaction| {
            me.create_in(txn, &entries, &key, &replaces)
        })
    }

    /// Non-blocking [`BucketSnapshotStorage::delete`]: queued on the
    /// store's group committer; the completion fires once it is durable.
    ///
    /// # Blocking
    /// Never blocks on I/O.
    ///
    /// # Errors
    /// Through the completion: [`DelayedError::Storage`] (nothing was
    /// deleted).
    pub fn delete_async(&self, snapshot_id: i64, bucket_key: &str) -> Completion<(), DelayedError> {
        let (me, key) = (self.clone(), bucket_key.to_string());
        self.queue("delete", 0, move |txn: &WriteTransaction| {
            me.delete_in(txn, snapshot_id, &key)
        })
    }

    /// Queues `apply` on the store's group committer.
    fn queue<R: Send + 'static>(
        &self,
        op: &'static str,
        bytes: usize,
        apply: impl FnOnce(&WriteTransaction) -> Result<R, DelayedError> + Send + 'static,
    ) -> Completion<R, DelayedError> {
        let (completion, completer) = completion_pair(|| {
            DelayedError::storage(
                "group commit",
                "the store writer stopped before the write completed",
            )
        });
        let write = FnWrite::new(
            bytes,
            move |txn: &WriteTransaction| {
                apply(txn).map_err(|e| StoreError::Backend(e.to_string()))
            },
            move |r: Result<R, StoreError>| {
                completer.complete(r.map_err(|e| DelayedError::from_store(op, e)));
            },
        );
        self.store
            .group_committer(|c| match c.check_capacity(bytes) {
                // Backpressure: refused before it is queued, so nothing of it
                // is applied and the tracker keeps its state.
                Err(e) => StoreWrite::<WriteTransaction>::finish(Box::new(write), Err(e)),
                Ok(()) => c.submit(Box::new(write)),
            });
        completion
    }

    fn read_entry(
        &self,
        op: &'static str,
        id: i64,
        entry: u64,
    ) -> Result<Option<Vec<u8>>, DelayedError> {
        let txn = self.store.database().begin_read().map_err(be(op))?;
        let t = txn.open_table(SNAPSHOT_ENTRIES).map_err(be(op))?;
        let v = t.get((id, entry)).map_err(be(op))?;
        Ok(v.map(|g| g.value().to_vec()))
    }
}

impl BucketSnapshotStorage for RedbSnapshotStorage {
    fn create(
        &self,
        metadata: &SnapshotMetadata,
        segments: &[SnapshotSegment],
        bucket_key: &str,
        replaces: &[(i64, String)],
    ) -> Result<i64, DelayedError> {
        const OP: &str = "create";
        let entries = encode_all(metadata, segments);
        let txn = self
            .store
            .begin()
            .map_err(|e| DelayedError::from_store(OP, e))?;
        let id = self.create_in(&txn, &entries, bucket_key, replaces)?;
        txn.commit().map_err(be(OP))?;
        Ok(id)
    }

    fn get_metadata(&self, snapshot_id: i64) -> Result<SnapshotMetadata, DelayedError> {
        match self.read_entry("get_metadata", snapshot_id, 0)? {
            Some(b) => decode_metadata(snapshot_id, &b),
            None => Err(DelayedError::SnapshotNotFound { snapshot_id }),
        }
    }

    fn get_segments(
        &self,
        snapshot_id: i64,
        first: u64,
        last: u64,
    ) -> Result<Vec<SnapshotSegment>, DelayedError> {
        const OP: &str = "get_segments";
        let txn = self.store.database().begin_read().map_err(be(OP))?;
        let t = txn.open_table(SNAPSHOT_ENTRIES).map_err(be(OP))?;
        if t.get((snapshot_id, 0)).map_err(be(OP))?.is_none() {
            return Err(DelayedError::SnapshotNotFound { snapshot_id });
        }
        let mut out = Vec::new();
        let mut expect = first.max(1);
        if first == 0 || first > last {
            return Err(DelayedError::CorruptSnapshot {
                snapshot_id,
                reason: format!("invalid segment range {first}..={last}"),
            });
        }
        for row in t
            .range((snapshot_id, first)..=(snapshot_id, last))
            .map_err(be(OP))?
        {
            let (k, v) = row.map_err(be(OP))?;
            let e = k.value().1;
            if e != expect {
                break;
            }
            out.push(decode_segment(snapshot_id, e, v.value())?);
            expect += 1;
        }
        if expect != last + 1 {
            return Err(DelayedError::CorruptSnapshot {
                snapshot_id,
                reason: format!("segment {expect} missing (asked for {first}..={last})"),
            });
        }
        Ok(out)
    }

    fn length(&self, snapshot_id: i64) -> Result<u64, DelayedError> {
        const OP: &str = "length";
        let txn = self.store.database().begin_read().map_err(be(OP))?;
        let t = txn.open_table(SNAPSHOT_ENTRIES).map_err(be(OP))?;
        let mut n = 0u64;
        for row in t
            .range((snapshot_id, 0)..=(snapshot_id, u64::MAX))
            .map_err(be(OP))?
        {
            row.map_err(be(OP))?;
            n += 1;
        }
        if n == 0 {
            return Err(DelayedError::SnapshotNotFound { snapshot_id });
        }
        Ok(n - 1)
    }

    fn delete(&self, snapshot_id: i64, bucket_key: &str) -> Result<(), DelayedError> {
        const OP: &str = "delete";
        let txn = self
            .store
            .begin()
            .map_err(|e| DelayedError::from_store(OP, e))?;
        self.delete_in(&txn, snapshot_id, bucket_key)?;
        txn.commit().map_err(be(OP))?;
        Ok(())
    }

    fn bucket_keys(&self) -> Result<Vec<(String, i64)>, DelayedError> {
        let props = self
            .store
            .cursor_properties(&self.managed_ledger, &self.cursor)
            .map_err(|e| DelayedError::from_store("bucket_keys", e))?;
        Ok(props
            .into_iter()
            .filter(|(k, _)| parse_bucket_key(k).is_some())
            .collect())
    }
}

// ---------------------------------------------------------------- faults

/// How many of the next calls of each kind [`FaultyStorage`] fails.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultPlan {
    /// Next `create` calls that fail.
    pub create: u32,
    /// Next reads (`get_metadata`, `get_segments`, `length`) that fail.
    pub read: u32,
    /// Next `delete` calls that fail.
    pub delete: u32,
}

/// Fault-injecting wrapper: fails the next N creates / reads / deletes with
/// [`DelayedError::Storage`] (reason `"injected fault"`) without touching
/// the inner storage, then passes calls through. Counters are atomics
/// (the crate's sync facade); any thread may re-arm them with [`FaultyStorage::arm`].
#[derive(Debug)]
pub struct FaultyStorage<S> {
    inner: S,
    create: AtomicU32,
    read: AtomicU32,
    delete: AtomicU32,
    /// Snapshot id whose every delete fails ([`NO_SNAPSHOT`]: none).
    failing_snapshot: AtomicI64,
    injected: AtomicU32,
}

/// [`FaultyStorage`]'s "no snapshot" marker (snapshot ids are non-negative).
const NO_SNAPSHOT: i64 = -1;

impl<S: BucketSnapshotStorage> FaultyStorage<S> {
    /// Wraps `inner` with no faults armed.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            create: AtomicU32::new(0),
            read: AtomicU32::new(0),
            delete: AtomicU32::new(0),
            failing_snapshot: AtomicI64::new(NO_SNAPSHOT),
            injected: AtomicU32::new(0),
        }
    }

    /// Makes every `delete` of snapshot `snapshot_id` fail (so it fails
    /// after all the tracker's retries: a snapshot whose ledger cannot be
    /// deleted, e.g. while the metadata store is unreachable) until called
    /// again with `None`. Deletes of other snapshots pass (subject to the
    /// plan of [`arm`](Self::arm)).
    pub fn fail_deletes_of(&self, snapshot_id: Option<i64>) {
        self.failing_snapshot
            .store(snapshot_id.unwrap_or(NO_SNAPSHOT), Ordering::SeqCst);
    }

    /// Sets the number of upcoming failures per kind (replacing the old plan).
    pub fn arm(&self, plan: FaultPlan) {
        self.create.store(plan.create, Ordering::SeqCst);
        self.read.store(plan.read, Ordering::SeqCst);
        self.delete.store(plan.delete, Ordering::SeqCst);
    }

    /// Total faults injected so far.
    pub fn injected(&self) -> u32 {
        self.injected.load(Ordering::SeqCst)
    }

    /// The wrapped storage.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    fn trip(&self, counter: &AtomicU32, op: &'static str) -> Result<(), DelayedError> {
        let hit = counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if hit {
            self.injected.fetch_add(1, Ordering::SeqCst);
            return Err(DelayedError::storage(op, "injected fault"));
        }
        Ok(())
    }
}

impl<S: BucketSnapshotStorage> BucketSnapshotStorage for FaultyStorage<S> {
    fn create(
        &self,
        metadata: &SnapshotMetadata,
        segments: &[SnapshotSegment],
        bucket_key: &str,
        replaces: &[(i64, String)],
    ) -> Result<i64, DelayedError> {
        self.trip(&self.create, "create")?;
        self.inner.create(metadata, segments, bucket_key, replaces)
    }

    fn get_metadata(&self, snapshot_id: i64) -> Result<SnapshotMetadata, DelayedError> {
        self.trip(&self.read, "get_metadata")?;
        self.inner.get_metadata(snapshot_id)
    }

    fn get_segments(
        &self,
        snapshot_id: i64,
        first: u64,
        last: u64,
    ) -> Result<Vec<SnapshotSegment>, DelayedError> {
        self.trip(&self.read, "get_segments")?;
        self.inner.get_segments(snapshot_id, first, last)
    }

    fn length(&self, snapshot_id: i64) -> Result<u64, DelayedError> {
        self.trip(&self.read, "length")?;
        self.inner.length(snapshot_id)
    }

    fn delete(&self, snapshot_id: i64, bucket_key: &str) -> Result<(), DelayedError> {
        if snapshot_id != NO_SNAPSHOT && self.failing_snapshot.load(Ordering::SeqCst) == snapshot_id
        {
            self.injected.fetch_add(1, Ordering::SeqCst);
            return Err(DelayedError::storage("delete", "injected fault"));
        }
        self.trip(&self.delete, "delete")?;
        self.inner.delete(snapshot_id, bucket_key)
    }

    fn bucket_keys(&self) -> Result<Vec<(String, i64)>, DelayedError> {
        self.inner.bucket_keys()
    }
}

impl<S: BucketSnapshotStorage + ?Sized> BucketSnapshotStorage for std::sync::Arc<S> {
    fn create(
        &self,
        metadata: &SnapshotMetadata,
        segments: &[SnapshotSegment],
        bucket_key: &str,
        replaces: &[(i64, String)],
    ) -> Result<i64, DelayedError> {
        (**self).create(metadata, segments, bucket_key, replaces)
    }
    fn get_metadata(&self, snapshot_id: i64) -> Result<SnapshotMetadata, DelayedError> {
        (**self).get_metadata(snapshot_id)
    }
    fn get_segments(
        &self,
        snapshot_id: i64,
        first: u64,
        last: u64,
    ) -> Result<Vec<SnapshotSegment>, DelayedError> {
        (**self).get_segments(snapshot_id, first, last)
    }
    fn length(&self, snapshot_id: i64) -> Result<u64, DelayedError> {
        (**self).length(snapshot_id)
    }
    fn delete(&self, snapshot_id: i64, bucket_key: &str) -> Result<(), DelayedError> {
        (**self).delete(snapshot_id, bucket_key)
    }
    fn bucket_keys(&self) -> Result<Vec<(String, i64)>, DelayedError> {
        (**self).bucket_keys()
    }
}
