//! Storage backends of the managed-ledger substrate: the [`LedgerStore`]
//! trait, the in-memory [`MemoryStore`] (tests) and the durable
//! [`RedbStore`] (default for the CLI).

use std::collections::BTreeMap;
use std::path::Path;

use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction,
};

use super::committer::{FnWrite, GroupCommitConfig, GroupCommitStats, GroupCommitter};
use super::error::StoreError;
use super::store_write::{PendingWrite, RedbCommitBackend};
use crate::position::Position;
use crate::sync::{Mutex, SetOnce};
use std::sync::Arc;

/// What the store knows about one ledger of a managed ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoredLedgerInfo {
    /// Number of entries appended to the ledger (entry ids `0..entries`).
    pub entries: i64,
    /// The ledger's data was lost/deleted: reads of it fail with
    /// `LedgerNotExist`, but it stays in the ledger list.
    pub lost: bool,
    /// Payload bytes stored in the ledger (Pulsar's `LedgerInfo.size`; 0
    /// once its data is lost). Not a stored record: [`RedbStore`] sums it
    /// from the entries when it loads the ledger list. Counted by the retention size limit of
    /// [`ManagedLedger::trim_consumed_ledgers`](super::ManagedLedger::trim_consumed_ledgers).
    pub size_bytes: u64,
}

/// Persisted state of one managed ledger.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StoredLedger {
    /// Ledger id → info, ascending.
    pub ledgers: BTreeMap<i64, StoredLedgerInfo>,
}

/// Part of an atomic append: `payloads` become entries
/// `first_entry_id..first_entry_id + payloads.len()` of ledger `ledger_id`.
#[derive(Debug, Clone, Copy)]
pub struct AppendSegment<'a> {
    /// Target ledger (created if missing).
    pub ledger_id: i64,
    /// Entry id of the first payload.
    pub first_entry_id: i64,
    /// Entry payloads, in order.
    pub payloads: &'a [&'a [u8]],
}

/// Persisted state of one cursor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredCursor {
    /// Mark-delete position: every position `<=` it is acknowledged.
    pub mark_delete: Position,
    /// Cursor properties (string → i64), e.g. delayed-delivery bucket keys.
    pub properties: BTreeMap<String, i64>,
    /// Individually deleted ranges above mark-delete, open-closed
    /// `(lower, upper]`, ascending, as persisted by the cursor (the legacy
    /// ranges record, or, in [`RedbStore::read_only_contents`], the compact
    /// deletion state's runs when the cursor has one).
    pub individually_deleted: Vec<(Position, Position)>,
}

/// The storage a managed ledger and its cursors persist to.
///
/// Every method is atomic: it either applies completely or not at all (a
/// crash or error in the middle leaves the previous state visible), so a torn
/// write is never observed. Implementations are `Send + Sync`; callers
/// serialise writes per managed ledger (the [`super::ManagedLedger`] lock).
pub trait LedgerStore: Send + Sync + std::fmt::Debug {
    /// Loads the ledger list of managed ledger `name` (empty if unknown).
    fn load_ledger(&self, name: &str) -> Result<StoredLedger, StoreError>;
    /// Creates ledger `ledger_id` (0 entries) in managed ledger `name`.
    fn create_ledger(&self, name: &str, ledger_id: i64) -> Result<(), StoreError>;
    /// Appends every segment (creating ledgers that do not exist yet) in ONE
    /// atomic write: after a crash either all of them are visible or none.
    fn append(&self, name: &str, segments: &[AppendSegment<'_>]) -> Result<(), StoreError>;
    /// Reads entries `first..=last` of ledger `ledger_id` (missing ones are
    /// absent from the result).
    fn read(
        &self,
        name: &str,
        ledger_id: i64,
        first: i64,
        last: i64,
    ) -> Result<Vec<(i64, Vec<u8>)>, StoreError>;
    /// Drops the data of ledger `ledger_id` and marks it lost (simulates a
    /// deleted BookKeeper ledger). Idempotent.
    fn mark_ledger_lost(&self, name: &str, ledger_id: i64) -> Result<(), StoreError>;
    /// Deletes ledgers `ledger_ids` of managed ledger `name` in ONE atomic
    /// write: their entries, sizes and ledger-list rows (Pulsar's consumed
    /// ledger trimming, after which the space is free for reuse). Unknown
    /// ids are ignored. After a crash either every listed ledger is gone or
    /// none is.
    fn delete_ledgers(&self, name: &str, ledger_ids: &[i64]) -> Result<(), StoreError>;
    /// Loads cursor `cursor` of managed ledger `name`.
    fn load_cursor(&self, name: &str, cursor: &str) -> Result<Option<StoredCursor>, StoreError>;
    /// Persists the mark-delete position and individually deleted ranges of
    /// cursor `cursor` (creating the cursor record), atomically. Cursor
    /// properties are left untouched.
    fn save_mark_delete(
        &self,
        name: &str,
        cursor: &str,
        mark_delete: Position,
        individually_deleted: &[(Position, Position)],
    ) -> Result<(), StoreError>;
    /// Sets (`Some`) or removes (`None`) one cursor property, atomically.
    fn set_cursor_property(
        &self,
        name: &str,
        cursor: &str,
        key: &str,
        value: Option<i64>,
    ) -> Result<(), StoreError>;
    /// Lists the cursors persisted for managed ledger `name`.
    fn list_cursors(&self, name: &str) -> Result<Vec<String>, StoreError>;
    /// Persists cursor `cursor`'s whole deletion state in ONE atomic write:
    /// the mark-delete position, the compact deletion-state chunks
    /// ([`crate::deletion::compact`], replacing any earlier chunks and the
    /// legacy range record) and the property updates (`Some` sets, `None`
    /// removes). A crash shows either all of it or the previous state.
    fn save_deletion_state(
        &self,
        name: &str,
        cursor: &str,
        mark_delete: Position,
        chunks: &[Vec<u8>],
        property_updates: &[(&str, Option<i64>)],
    ) -> Result<(), StoreError>;
    /// The compact deletion-state chunks saved by
    /// [`LedgerStore::save_deletion_state`], in order, or `None` if the
    /// cursor's last mark-delete was saved without them
    /// ([`LedgerStore::save_mark_delete`] drops them).
    fn load_deletion_state(
        &self,
        name: &str,
        cursor: &str,
    ) -> Result<Option<Vec<Vec<u8>>>, StoreError>;
    /// Deletes cursor `cursor` of managed ledger `name` in ONE atomic
    /// write: its mark-delete, individually deleted ranges, compact
    /// deletion state and properties (Pulsar's `asyncDeleteCursor`, an
    /// unsubscribe). Afterwards it is no longer listed, so it holds no
    /// ledger against trimming. Unknown cursors are ignored. The default
    /// refuses (a store that cannot delete keeps every cursor).
    fn delete_cursor(&self, name: &str, cursor: &str) -> Result<(), StoreError> {
        Err(StoreError::Backend(format!(
            "this store cannot delete cursor {cursor} of {name}"
        )))
    }

    /// Queues `write` for the store's writer and returns at once where the
    /// store has one ([`RedbStore`]: its [`GroupCommitter`] thread, which
    /// commits the writes that arrive meanwhile in one transaction and one
    /// fsync); `write`'s completion runs after its commit returned, with
    /// its outcome.
    ///
    /// # Blocking
    /// The default implementation (and [`MemoryStore`]) applies the write
    /// on the calling thread through the methods above and completes it
    /// before returning: it blocks for the duration of that write.
    /// [`RedbStore`] never blocks on I/O here.
    fn submit(&self, write: PendingWrite) {
        let (write, mut admit, done) = write.into_parts();
        let outcome = admit().and_then(|()| write.apply_to(self));
        done(outcome);
    }

    /// The counters of the store's group committer, if it has one that
    /// has started.
    fn group_commit_stats(&self) -> Option<GroupCommitStats> {
        None
    }

    /// Whether a write of about `bytes` bytes may be queued by
    /// [`LedgerStore::submit`] now (backpressure): the store's
    /// non-blocking writes call it before they plan or queue anything.
    /// The default (and [`MemoryStore`]) has no queue: always `Ok`.
    /// [`RedbStore`] asks its [`GroupCommitter`]
    /// ([`GroupCommitter::check_capacity`]).
    ///
    /// # Errors
    /// [`StoreError::Throttled`] while the writer's queue is full; nothing
    /// changed.
    ///
    /// # Blocking
    /// Never blocks on I/O.
    fn write_capacity(&self, bytes: usize) -> Result<(), StoreError> {
        let _ = bytes;
        Ok(())
    }
}

// ---------------------------------------------------------------- in-memory

#[derive(Debug, Default)]
struct MemoryInner {
    ledgers: BTreeMap<String, StoredLedger>,
    entries: BTreeMap<(String, i64, i64), Vec<u8>>,
    cursors: BTreeMap<(String, String), StoredCursor>,
    deletion_chunks: BTreeMap<(String, String), Vec<Vec<u8>>>,
}

/// In-memory [`LedgerStore`] for tests: nothing survives the process.
#[derive(Debug, Default)]
pub struct MemoryStore {
    inner: Mutex<MemoryInner>,
}

impl MemoryStore {
    /// Creates an empty store.
    pub fn new() -> Self {
        Self::default()
    }
}

impl LedgerStore for MemoryStore {
    fn load_ledger(&self, name: &str) -> Result<StoredLedger, StoreError> {
        Ok(self
            .inner
            .lock()
            .ledgers
            .get(name)
            .cloned()
            .unwrap_or_default())
    }

    fn create_ledger(&self, name: &str, ledger_id: i64) -> Result<(), StoreError> {
        let mut inner = self.inner.lock();
        inner
            .ledgers
            .entry(name.to_string())
            .or_default()
            .ledgers
            .entry(ledger_id)
            .or_default();
        Ok(())
    }

    fn append(&self, name: &str, segments: &[AppendSegment<'_>]) -> Result<(), StoreError> {
        let mut inner = self.inner.lock();
        for seg in segments {
            for (i, p) in seg.payloads.iter().enumerate() {
                inner.entries.insert(
                    (
                        name.to_string(),
                        seg.ledger_id,
                        seg.first_entry_id + i as i64,
                    ),
                    p.to_vec(),
                );
            }
            let info = inner
                .ledgers
                .entry(name.to_string())
                .or_default()
                .ledgers
                .entry(seg.ledger_id)
                .or_default();
            info.entries = seg.first_entry_id + seg.payloads.len() as i64;
            info.size_bytes += payload_bytes(seg.payloads);
        }
        Ok(())
    }

    fn read(
        &self,
        name: &str,
        ledger_id: i64,
        first: i64,
        last: i64,
    ) -> Result<Vec<(i64, Vec<u8>)>, StoreError> {
        if first > last {
            return Ok(Vec::new());
        }
        let inner = self.inner.lock();
        let lo = (name.to_string(), ledger_id, first);
        let hi = (name.to_string(), ledger_id, last);
        Ok(inner
            .entries
            .range(lo..=hi)
            .map(|((_, _, e), v)| (*e, v.clone()))
            .collect())
    }

    fn mark_ledger_lost(&self, name: &str, ledger_id: i64) -> Result<(), StoreError> {
        let mut inner = self.inner.lock();
        let lo = (name.to_string(), ledger_id, i64::MIN);
        let hi = (name.to_string(), ledger_id, i64::MAX);
        let keys: Vec<_> = inner
            .entries
            .range(lo..=hi)
            .map(|(k, _)| k.clone())
            .collect();
        for k in keys {
            inner.entries.remove(&k);
        }
        if let Some(info) = inner
            .ledgers
            .get_mut(name)
            .and_then(|l| l.ledgers.get_mut(&ledger_id))
        {
            info.lost = true;
            info.size_bytes = 0;
        }
        Ok(())
    }

    fn delete_ledgers(&self, name: &str, ledger_ids: &[i64]) -> Result<(), StoreError> {
        let mut inner = self.inner.lock();
        for &ledger_id in ledger_ids {
            let lo = (name.to_string(), ledger_id, i64::MIN);
            let hi = (name.to_string(), ledger_id, i64::MAX);
            let keys: Vec<_> = inner
                .entries
                .range(lo..=hi)
                .map(|(k, _)| k.clone())
                .collect();
            for k in keys {
                inner.entries.remove(&k);
            }
            if let Some(l) = inner.ledgers.get_mut(name) {
                l.ledgers.remove(&ledger_id);
            }
        }
        Ok(())
    }

    fn load_cursor(&self, name: &str, cursor: &str) -> Result<Option<StoredCursor>, StoreError> {
        Ok(self
            .inner
            .lock()
            .cursors
            .get(&(name.to_string(), cursor.to_string()))
            .cloned())
    }

    fn save_mark_delete(
        &self,
        name: &str,
        cursor: &str,
        mark_delete: Position,
        individually_deleted: &[(Position, Position)],
    ) -> Result<(), StoreError> {
        let mut inner = self.inner.lock();
        let c = inner
            .cursors
            .entry((name.to_string(), cursor.to_string()))
            .or_insert_with(|| StoredCursor {
                mark_delete,
                properties: BTreeMap::new(),
                individually_deleted: Vec::new(),
            });
        c.mark_delete = mark_delete;
        c.individually_deleted = individually_deleted.to_vec();
        inner
            .deletion_chunks
            .remove(&(name.to_string(), cursor.to_string()));
        Ok(())
    }

    fn save_deletion_state(
        &self,
        name: &str,
        cursor: &str,
        mark_delete: Position,
        chunks: &[Vec<u8>],
        property_updates: &[(&str, Option<i64>)],
    ) -> Result<(), StoreError> {
        let mut inner = self.inner.lock();
        let key = (name.to_string(), cursor.to_string());
        let c = inner
            .cursors
            .entry(key.clone())
            .or_insert_with(|| StoredCursor {
                mark_delete,
                properties: BTreeMap::new(),
                individually_deleted: Vec::new(),
            });
        c.mark_delete = mark_delete;
        c.individually_deleted.clear();
        for (k, v) in property_updates {
            match v {
                Some(v) => {
                    c.properties.insert((*k).to_string(), *v);
                }
                None => {
                    c.properties.remove(*k);
                }
            }
        }
        inner.deletion_chunks.insert(key, chunks.to_vec());
        Ok(())
    }

    fn load_deletion_state(
        &self,
        name: &str,
        cursor: &str,
    ) -> Result<Option<Vec<Vec<u8>>>, StoreError> {
        Ok(self
            .inner
            .lock()
            .deletion_chunks
            .get(&(name.to_string(), cursor.to_string()))
            .cloned())
    }

    fn set_cursor_property(
        &self,
        name: &str,
        cursor: &str,
        key: &str,
        value: Option<i64>,
    ) -> Result<(), StoreError> {
        let mut inner = self.inner.lock();
        let c = inner
            .cursors
            .entry((name.to_string(), cursor.to_string()))
            .or_insert_with(|| StoredCursor {
                mark_delete: Position::EARLIEST,
                properties: BTreeMap::new(),
                individually_deleted: Vec::new(),
            });
        match value {
            Some(v) => {
                c.properties.insert(key.to_string(), v);
            }
            None => {
                c.properties.remove(key);
            }
        }
        Ok(())
    }

    fn list_cursors(&self, name: &str) -> Result<Vec<String>, StoreError> {
        Ok(self
            .inner
            .lock()
            .cursors
            .keys()
            .filter(|(n, _)| n == name)
            .map(|(_, c)| c.clone())
            .collect())
    }

    fn delete_cursor(&self, name: &str, cursor: &str) -> Result<(), StoreError> {
        let mut inner = self.inner.lock();
        let key = (name.to_string(), cursor.to_string());
        inner.cursors.remove(&key);
        inner.deletion_chunks.remove(&key);
        Ok(())
    }
}

// ---------------------------------------------------------------- redb

/// `(managed ledger, ledger id, entry id) → payload`.
const ENTRIES: TableDefinition<(&str, i64, i64), &[u8]> = TableDefinition::new("ml_entries");
/// `(managed ledger, ledger id) → (entry count, lost)`.
const LEDGERS: TableDefinition<(&str, i64), (i64, bool)> = TableDefinition::new("ml_ledgers");
/// `(managed ledger, cursor) → mark-delete (ledger id, entry id)`.
const CURSOR_MARK_DELETE: TableDefinition<(&str, &str), (i64, i64)> =
    TableDefinition::new("ml_cursor_mark_delete");
/// `(managed ledger, cursor, key) → value`: cursor properties.
const CURSOR_PROPERTIES: TableDefinition<(&str, &str, &str), i64> =
    TableDefinition::new("ml_cursor_properties");
/// `(managed ledger, cursor) → individually deleted ranges` as little-endian
/// i64 quadruples `(lower.ledger, lower.entry, upper.ledger, upper.entry)`.
const CURSOR_RANGES: TableDefinition<(&str, &str), &[u8]> =
    TableDefinition::new("ml_cursor_individually_deleted");
/// `(managed ledger, cursor, chunk index) → chunk` of the compact deletion
/// state ([`crate::deletion::compact`]); chunk indexes `0..n`, no gaps.
const CURSOR_DELETION_CHUNKS: TableDefinition<(&str, &str, u32), &[u8]> =
    TableDefinition::new("ml_cursor_deletion_chunks");

/// How hard [`RedbStore`] commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SyncMode {
    /// Every commit is fsynced before it returns (survives power loss).
    #[default]
    Immediate,
    /// Commits are atomic and visible at once, but reach the disk only with
    /// a later `Immediate` commit, [`RedbStore::sync`] or a clean close (the
    /// last handle dropped): a process crash or power loss before then loses
    /// them (the store reopens at the last durable commit, still consistent).
    Deferred,
}

impl std::fmt::Display for SyncMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SyncMode::Immediate => "immediate",
            SyncMode::Deferred => "deferred",
        })
    }
}

/// Durable [`LedgerStore`] on an embedded [redb](https://docs.rs/redb)
/// database file: every method is one ACID write transaction, so closing and
/// reopening the file (or killing the process) shows each operation either
/// completely or not at all.
///
/// The database is shared: other modules (delayed-delivery bucket snapshots)
/// keep their own tables in the same file and can commit them together with
/// cursor properties through [`RedbStore::database`] and
/// [`RedbStore::set_cursor_property_in`].
#[derive(Clone)]
pub struct RedbStore {
    db: Arc<Database>,
    mode: SyncMode,
    /// The group committer of [`LedgerStore::submit`], started on first
    /// use and shared by every clone of this store.
    committer: Arc<SetOnce<GroupCommitter<RedbCommitBackend>>>,
    group_commit: GroupCommitConfig,
    /// Commits deferred to one durable barrier ([`RedbStore::defer_to_barrier`]),
    /// shared by every clone of this store.
    pub(super) barrier: Arc<Mutex<super::barrier::BarrierState>>,
}

impl std::fmt::Debug for RedbStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedbStore")
            .field("mode", &self.mode)
            .field("group_commit", &self.group_commit)
            .finish_non_exhaustive()
    }
}

/// Page cache [`RedbStore::open_with`] gives redb: its own default, 1 GiB.
pub const DEFAULT_CACHE_BYTES: usize = 1 << 30;

impl RedbStore {
    /// Opens (creating if needed) the store at `path` with
    /// [`SyncMode::Immediate`].
    ///
    /// # Errors
    /// [`StoreError::Backend`] if the file cannot be created/opened (e.g. an
    /// unwritable directory, or the file is locked by another process).
    ///
    /// # Blocking
    /// Yes: opens (or creates) the file, verifies every page checksum and
    /// creates the tables (one commit).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_with(path, SyncMode::Immediate)
    }

    /// Opens the store at `path` with the given commit mode.
    ///
    /// # Errors
    /// As [`RedbStore::open`].
    ///
    /// # Blocking
    /// As [`RedbStore::open`].
    pub fn open_with(path: impl AsRef<Path>, mode: SyncMode) -> Result<Self, StoreError> {
        Self::open_with_cache(path, mode, DEFAULT_CACHE_BYTES)
    }

    /// Opens the store at `path` with the given commit mode and at most
    /// `cache_bytes` of page cache in memory (redb's read cache plus its
    /// buffer of pages written but not yet flushed; the file itself is not
    /// limited). The cache fills with every page read or written up to this
    /// bound, so a process that appends for a long time holds
    /// `min(file size, cache_bytes)` of it; a bounded process (the
    /// simulator) passes less than [`DEFAULT_CACHE_BYTES`].
    ///
    /// # Errors
    /// As [`RedbStore::open`].
    ///
    /// # Blocking
    /// As [`RedbStore::open`].
    pub fn open_with_cache(
        path: impl AsRef<Path>,
        mode: SyncMode,
        cache_bytes: usize,
    ) -> Result<Self, StoreError> {
        let path = path.as_ref();
        contained("open", || {
            // Verify every page checksum on open: a file altered since redb
            // wrote it is `StoreError::Corrupt` here instead of a panic or a
            // garbage-sized allocation on a later read.
            let db = Database::builder()
                .set_check_integrity_on_open(true)
                .set_cache_size(cache_bytes)
                .create(path)
                .map_err(open_error)?;
            Self::with_tables(db, mode)
        })
    }

    /// Opens (creating if empty) the store on an embedder's own storage: a
    /// [`redb::StorageBackend`] (an in-memory image, a block device, a
    /// crash-injecting wrapper such as the simulator's), with the given
    /// commit mode and page cache as in [`RedbStore::open_with_cache`].
    /// What survives a crash is what the backend made durable at its
    /// `sync_data` calls: with [`SyncMode::Immediate`] every commit ends in
    /// one.
    ///
    /// # Errors
    /// [`StoreError::Corrupt`] if the backend holds a damaged database,
    /// [`StoreError::Backend`] if its I/O fails.
    ///
    /// # Blocking
    /// As [`RedbStore::open`], on the backend's I/O.
    pub fn open_on_backend(
        backend: impl redb::StorageBackend,
        mode: SyncMode,
        cache_bytes: usize,
    ) -> Result<Self, StoreError> {
        contained("open", || {
            let db = Database::builder()
                .set_check_integrity_on_open(true)
                .set_cache_size(cache_bytes)
                .create_with_backend(backend)
                .map_err(open_error)?;
            Self::with_tables(db, mode)
        })
    }

    /// Wraps an open database and creates every table once, so read
    /// transactions never see a missing table.
    fn with_tables(db: Database, mode: SyncMode) -> Result<Self, StoreError> {
        let store = Self {
            db: Arc::new(db),
            mode,
            committer: Arc::new(SetOnce::new()),
            group_commit: GroupCommitConfig::default(),
            barrier: Arc::new(Mutex::new(super::barrier::BarrierState::default())),
        };
        let txn = store.begin()?;
        txn.open_table(ENTRIES)?;
        txn.open_table(LEDGERS)?;
        txn.open_table(CURSOR_MARK_DELETE)?;
        txn.open_table(CURSOR_PROPERTIES)?;
        txn.open_table(CURSOR_RANGES)?;
        txn.open_table(CURSOR_DELETION_CHUNKS)?;
        txn.commit()?;
        Ok(store)
    }

    /// How this store commits.
    pub fn sync_mode(&self) -> SyncMode {
        self.mode
    }

    /// The underlying database, for modules that keep their own tables in
    /// the same file.
    pub fn database(&self) -> &Arc<Database> {
        &self.db
    }

    /// Begins a write transaction with this store's [`SyncMode`].
    ///
    /// # Errors
    /// [`StoreError::Backend`] if the database refuses the transaction.
    ///
    /// While commits are deferred to a barrier
    /// ([`RedbStore::defer_to_barrier`]) the transaction commits without an
    /// fsync (atomic and visible at once, durable with the next
    /// [`RedbStore::commit_barrier`]).
    ///
    /// # Blocking
    /// Waits while another write transaction of the database is open (the
    /// group committer's included).
    pub fn begin(&self) -> Result<WriteTransaction, StoreError> {
        begin_write(&self.db, self.begin_mode())
    }

    /// The same store with the group committer bounded by `config` (batch
    /// size, batch bytes, how long a batch may wait to fill; see
    /// [`GroupCommitConfig`]). Takes effect if the committer has not
    /// started yet (it starts at the first non-blocking write), so call it
    /// right after opening.
    pub fn with_group_commit(mut self, config: GroupCommitConfig) -> Self {
        self.group_commit = config;
        self
    }

    /// The store's group committer (started on first use): the writer
    /// thread every non-blocking write of this store goes through
    /// ([`LedgerStore::submit`], the delayed-delivery snapshot storage's
    /// `*_async` forms).
    ///
    /// # Blocking
    /// Never blocks on I/O (the first call spawns the writer thread).
    pub fn group_committer<R>(&self, f: impl FnOnce(&GroupCommitter<RedbCommitBackend>) -> R) -> R {
        self.committer.with_or_init(
            || {
                GroupCommitter::start(
                    RedbCommitBackend::new(Arc::clone(&self.db), self.mode),
                    self.group_commit,
                )
            },
            f,
        )
    }

    /// Applies `ops` to `txn` (the body of the blocking methods and of the
    /// group committer's writes: one copy of each write). Also the broker's
    /// group commit of SENDs: the entries of several managed ledgers in one
    /// transaction (plan them with
    /// [`ManagedLedger::plan_append`](super::ManagedLedger::plan_append),
    /// apply them after the commit).
    ///
    /// # Errors
    /// [`StoreError::Backend`] on a database error (the caller drops the
    /// transaction: nothing is written).
    pub fn append_in(
        txn: &WriteTransaction,
        name: &str,
        segments: &[AppendSegment<'_>],
    ) -> Result<(), StoreError> {
        contained("append", || {
            let mut e = txn.open_table(ENTRIES)?;
            let mut l = txn.open_table(LEDGERS)?;
            for seg in segments {
                for (i, p) in seg.payloads.iter().enumerate() {
                    e.insert((name, seg.ledger_id, seg.first_entry_id + i as i64), *p)?;
                }
                l.insert(
                    (name, seg.ledger_id),
                    (seg.first_entry_id + seg.payloads.len() as i64, false),
                )?;
            }
            Ok(())
        })
    }

    /// The body of [`LedgerStore::save_mark_delete`] inside `txn`.
    pub(super) fn save_mark_delete_in(
        txn: &WriteTransaction,
        name: &str,
        cursor: &str,
        mark_delete: Position,
        individually_deleted: &[(Position, Position)],
    ) -> Result<(), StoreError> {
        contained("save_mark_delete", || {
            let mut md = txn.open_table(CURSOR_MARK_DELETE)?;
            md.insert(
                (name, cursor),
                (mark_delete.ledger_id, mark_delete.entry_id),
            )?;
            let mut ranges = txn.open_table(CURSOR_RANGES)?;
            let encoded = encode_ranges(individually_deleted);
            ranges.insert((name, cursor), encoded.as_slice())?;
            let mut chunks = txn.open_table(CURSOR_DELETION_CHUNKS)?;
            remove_chunks(&mut chunks, name, cursor)?;
            Ok(())
        })
    }

    /// The body of [`LedgerStore::save_deletion_state`] inside `txn`.
    pub(super) fn save_deletion_state_in(
        txn: &WriteTransaction,
        name: &str,
        cursor: &str,
        mark_delete: Position,
        chunks: &[Vec<u8>],
        property_updates: &[(&str, Option<i64>)],
    ) -> Result<(), StoreError> {
        let count = u32::try_from(chunks.len()).map_err(|_| {
            StoreError::Backend(format!("{} deletion-state chunks exceed u32", chunks.len()))
        })?;
        contained("save_deletion_state", || {
            {
                let mut md = txn.open_table(CURSOR_MARK_DELETE)?;
                md.insert(
                    (name, cursor),
                    (mark_delete.ledger_id, mark_delete.entry_id),
                )?;
                let mut ranges = txn.open_table(CURSOR_RANGES)?;
                ranges.insert((name, cursor), [].as_slice())?;
                let mut table = txn.open_table(CURSOR_DELETION_CHUNKS)?;
                remove_chunks(&mut table, name, cursor)?;
                for (i, chunk) in (0..count).zip(chunks) {
                    table.insert((name, cursor, i), chunk.as_slice())?;
                }
            }
            for (k, v) in property_updates {
                Self::set_cursor_property_in(txn, name, cursor, k, *v)?;
            }
            Ok(())
        })
    }

    /// Forces everything committed so far to disk (an empty `Immediate`
    /// commit).
    ///
    /// # Errors
    /// [`StoreError::Backend`] on I/O failure.
    ///
    /// # Blocking
    /// Yes: one fsynced commit on the calling thread (waits for any write
    /// transaction in progress, the group committer's included).
    pub fn sync(&self) -> Result<(), StoreError> {
        contained("sync", || {
            let txn = self.db.begin_write()?;
            txn.commit()?;
            Ok(())
        })?;
        self.barrier_synced();
        Ok(())
    }

    /// Reads every cursor property of cursor `cursor` on managed ledger
    /// `ledger` (empty if there are none), whether or not the cursor has a
    /// persisted mark-delete position. Used by the delayed-delivery bucket
    /// snapshot storage to list its `#pulsar.internal.delayed.bucket_*` keys.
    ///
    /// # Errors
    /// [`StoreError::Backend`] on a database error.
    pub fn cursor_properties(
        &self,
        ledger: &str,
        cursor: &str,
    ) -> Result<BTreeMap<String, i64>, StoreError> {
        contained("cursor_properties", || {
            let txn = self.db.begin_read()?;
            let t = txn.open_table(CURSOR_PROPERTIES)?;
            let mut out = BTreeMap::new();
            for row in t.range((ledger, cursor, "")..)? {
                let (k, v) = row?;
                let (n, c, key) = k.value();
                if n != ledger || c != cursor {
                    break;
                }
                out.insert(key.to_string(), v.value());
            }
            Ok(out)
        })
    }

    /// Sets (`Some`) or removes (`None`) cursor property `key` of cursor
    /// `cursor` on managed ledger `ledger` inside an existing transaction, so
    /// callers can make it part of a larger atomic commit (e.g. a bucket
    /// snapshot and its cursor-property commit point).
    ///
    /// # Errors
    /// [`StoreError::Backend`] on a database error.
    pub fn set_cursor_property_in(
        txn: &WriteTransaction,
        ledger: &str,
        cursor: &str,
        key: &str,
        value: Option<i64>,
    ) -> Result<(), StoreError> {
        contained("set_cursor_property_in", || {
            let mut t = txn.open_table(CURSOR_PROPERTIES)?;
            match value {
                Some(v) => {
                    t.insert((ledger, cursor, key), v)?;
                }
                None => {
                    t.remove((ledger, cursor, key))?;
                }
            }
            Ok(())
        })
    }
}

/// Begins a write transaction on `db` with `mode`'s durability.
pub(super) fn begin_write(db: &Database, mode: SyncMode) -> Result<WriteTransaction, StoreError> {
    contained("begin", || {
        let mut txn = db.begin_write()?;
        let durability = match mode {
            SyncMode::Immediate => Durability::Immediate,
            SyncMode::Deferred => Durability::None,
        };
        txn.set_durability(durability)
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        Ok(txn)
    })
}

/// Maps an open failure: a damaged file is [`StoreError::Corrupt`], anything
/// else (I/O, a lock held by another process) [`StoreError::Backend`].
fn open_error(e: redb::DatabaseError) -> StoreError {
    match e {
        redb::DatabaseError::Storage(redb::StorageError::Corrupted(msg)) => {
            StoreError::Corrupt(format!("the store file is damaged: {msg}"))
        }
        other => StoreError::from(other),
    }
}

/// Runs one store operation with redb's panics contained: redb may panic on
/// a page that passed its checksum but is inconsistent (or on a file changed
/// behind its back while open), and a panic must not cross this crate's
/// boundary. The panic becomes [`StoreError::Corrupt`] naming the operation.
/// (The default panic hook still prints the message to stderr.)
pub(super) fn contained<T>(
    operation: &str,
    f: impl FnOnce() -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(payload) => {
            let msg = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no message".into());
            Err(StoreError::Corrupt(format!(
                "the embedded store failed during {operation}: {msg}"
            )))
        }
    }
}

/// Removes every deletion-state chunk of one cursor.
fn remove_chunks(
    table: &mut redb::Table<'_, (&'static str, &'static str, u32), &'static [u8]>,
    name: &str,
    cursor: &str,
) -> Result<(), StoreError> {
    let mut indexes = Vec::new();
    for row in table.range((name, cursor, 0u32)..=(name, cursor, u32::MAX))? {
        let (k, _) = row?;
        indexes.push(k.value().2);
    }
    for i in indexes {
        table.remove((name, cursor, i))?;
    }
    Ok(())
}

/// Payload bytes of one append segment.
fn payload_bytes(payloads: &[&[u8]]) -> u64 {
    payloads.iter().map(|p| p.len() as u64).sum()
}

fn encode_ranges(ranges: &[(Position, Position)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(ranges.len() * 32);
    for (lo, hi) in ranges {
        for v in [lo.ledger_id, lo.entry_id, hi.ledger_id, hi.entry_id] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    out
}

fn decode_ranges(bytes: &[u8]) -> Result<Vec<(Position, Position)>, StoreError> {
    if !bytes.len().is_multiple_of(32) {
        return Err(StoreError::Corrupt(format!(
            "individually deleted ranges record has {} bytes, not a multiple of 32",
            bytes.len()
        )));
    }
    Ok(bytes
        .chunks_exact(32)
        .map(|c| {
            let v = |i: usize| {
                let mut b = [0u8; 8];
                b.copy_from_slice(&c[i * 8..i * 8 + 8]);
                i64::from_le_bytes(b)
            };
            (Position::new(v(0), v(1)), Position::new(v(2), v(3)))
        })
        .collect())
}

impl LedgerStore for RedbStore {
    fn load_ledger(&self, name: &str) -> Result<StoredLedger, StoreError> {
        contained("load_ledger", || {
            let txn = self.db.begin_read()?;
            let t = txn.open_table(LEDGERS)?;
            let mut out = StoredLedger::default();
            for row in t.range((name, i64::MIN)..=(name, i64::MAX))? {
                let (k, v) = row?;
                let (_, id) = k.value();
                let (entries, lost) = v.value();
                out.ledgers.insert(
                    id,
                    StoredLedgerInfo {
                        entries,
                        lost,
                        size_bytes: 0,
                    },
                );
            }
            // Sizes are not a stored record: summed from the entries (one
            // pass over the managed ledger's entries at open; trimming keeps
            // it short), so the write path is unchanged.
            let e = txn.open_table(ENTRIES)?;
            for row in e.range((name, i64::MIN, i64::MIN)..=(name, i64::MAX, i64::MAX))? {
                let (k, v) = row?;
                if let Some(info) = out.ledgers.get_mut(&k.value().1) {
                    info.size_bytes += v.value().len() as u64;
                }
            }
            Ok(out)
        })
    }

    fn create_ledger(&self, name: &str, ledger_id: i64) -> Result<(), StoreError> {
        contained("create_ledger", || {
            let txn = self.begin()?;
            {
                let mut t = txn.open_table(LEDGERS)?;
                let exists = t.get((name, ledger_id))?.is_some();
                if !exists {
                    t.insert((name, ledger_id), (0i64, false))?;
                }
            }
            txn.commit()?;
            Ok(())
        })
    }

    fn append(&self, name: &str, segments: &[AppendSegment<'_>]) -> Result<(), StoreError> {
        contained("append", || {
            let txn = self.begin()?;
            Self::append_in(&txn, name, segments)?;
            txn.commit()?;
            Ok(())
        })
    }

    fn read(
        &self,
        name: &str,
        ledger_id: i64,
        first: i64,
        last: i64,
    ) -> Result<Vec<(i64, Vec<u8>)>, StoreError> {
        contained("read", || {
            if first > last {
                return Ok(Vec::new());
            }
            let txn = self.db.begin_read()?;
            let t = txn.open_table(ENTRIES)?;
            let mut out = Vec::with_capacity((last - first + 1).min(1024) as usize);
            for row in t.range((name, ledger_id, first)..=(name, ledger_id, last))? {
                let (k, v) = row?;
                out.push((k.value().2, v.value().to_vec()));
            }
            Ok(out)
        })
    }

    fn mark_ledger_lost(&self, name: &str, ledger_id: i64) -> Result<(), StoreError> {
        contained("mark_ledger_lost", || {
            let txn = self.begin()?;
            {
                let mut e = txn.open_table(ENTRIES)?;
                e.retain_in(
                    (name, ledger_id, i64::MIN)..=(name, ledger_id, i64::MAX),
                    |_, _| false,
                )?;
                let mut l = txn.open_table(LEDGERS)?;
                let entries = l.get((name, ledger_id))?.map(|v| v.value().0).unwrap_or(0);
                l.insert((name, ledger_id), (entries, true))?;
            }
            txn.commit()?;
            Ok(())
        })
    }

    fn delete_ledgers(&self, name: &str, ledger_ids: &[i64]) -> Result<(), StoreError> {
        contained("delete_ledgers", || {
            let txn = self.begin()?;
            {
                let mut e = txn.open_table(ENTRIES)?;
                let mut l = txn.open_table(LEDGERS)?;
                for &ledger_id in ledger_ids {
                    e.retain_in(
                        (name, ledger_id, i64::MIN)..=(name, ledger_id, i64::MAX),
                        |_, _| false,
                    )?;
                    l.remove((name, ledger_id))?;
                }
            }
            txn.commit()?;
            Ok(())
        })
    }

    fn load_cursor(&self, name: &str, cursor: &str) -> Result<Option<StoredCursor>, StoreError> {
        contained("load_cursor", || {
            let txn = self.db.begin_read()?;
            let md = txn.open_table(CURSOR_MARK_DELETE)?;
            let Some(md) = md.get((name, cursor))?.map(|v| v.value()) else {
                return Ok(None);
            };
            let props_t = txn.open_table(CURSOR_PROPERTIES)?;
            let mut properties = BTreeMap::new();
            for row in props_t.range((name, cursor, "")..)? {
                let (k, v) = row?;
                let (n, c, key) = k.value();
                if n != name || c != cursor {
                    break;
                }
                properties.insert(key.to_string(), v.value());
            }
            let ranges_t = txn.open_table(CURSOR_RANGES)?;
            let individually_deleted = match ranges_t.get((name, cursor))? {
                Some(v) => decode_ranges(v.value())?,
                None => Vec::new(),
            };
            Ok(Some(StoredCursor {
                mark_delete: Position::new(md.0, md.1),
                properties,
                individually_deleted,
            }))
        })
    }

    fn save_mark_delete(
        &self,
        name: &str,
        cursor: &str,
        mark_delete: Position,
        individually_deleted: &[(Position, Position)],
    ) -> Result<(), StoreError> {
        contained("save_mark_delete", || {
            let txn = self.begin()?;
            Self::save_mark_delete_in(&txn, name, cursor, mark_delete, individually_deleted)?;
            txn.commit()?;
            Ok(())
        })
    }

    fn save_deletion_state(
        &self,
        name: &str,
        cursor: &str,
        mark_delete: Position,
        chunks: &[Vec<u8>],
        property_updates: &[(&str, Option<i64>)],
    ) -> Result<(), StoreError> {
        contained("save_deletion_state", || {
            let txn = self.begin()?;
            Self::save_deletion_state_in(
                &txn,
                name,
                cursor,
                mark_delete,
                chunks,
                property_updates,
            )?;
            txn.commit()?;
            Ok(())
        })
    }

    fn load_deletion_state(
        &self,
        name: &str,
        cursor: &str,
    ) -> Result<Option<Vec<Vec<u8>>>, StoreError> {
        contained("load_deletion_state", || {
            let txn = self.db.begin_read()?;
            let t = txn.open_table(CURSOR_DELETION_CHUNKS)?;
            let mut out = Vec::new();
            for row in t.range((name, cursor, 0u32)..=(name, cursor, u32::MAX))? {
                let (k, v) = row?;
                let (_, _, i) = k.value();
                if i as usize != out.len() {
                    return Err(StoreError::Corrupt(format!(
                        "cursor {cursor} of {name}: deletion-state chunk {} missing",
                        out.len()
                    )));
                }
                out.push(v.value().to_vec());
            }
            Ok((!out.is_empty()).then_some(out))
        })
    }

    fn set_cursor_property(
        &self,
        name: &str,
        cursor: &str,
        key: &str,
        value: Option<i64>,
    ) -> Result<(), StoreError> {
        contained("set_cursor_property", || {
            let txn = self.begin()?;
            Self::set_cursor_property_in(&txn, name, cursor, key, value)?;
            txn.commit()?;
            Ok(())
        })
    }

    fn submit(&self, write: PendingWrite) {
        let (write, admit, done) = write.into_parts();
        let bytes = write.bytes();
        let job = FnWrite::new(
            bytes,
            move |txn: &WriteTransaction| write.apply_in(txn),
            done,
        )
        .with_admit(admit);
        self.group_committer(|c| c.submit(Box::new(job)));
    }

    fn group_commit_stats(&self) -> Option<GroupCommitStats> {
        self.committer.with(GroupCommitter::stats)
    }

    fn write_capacity(&self, bytes: usize) -> Result<(), StoreError> {
        self.committer
            .with(|c| c.check_capacity(bytes))
            .unwrap_or(Ok(()))
    }

    fn list_cursors(&self, name: &str) -> Result<Vec<String>, StoreError> {
        contained("list_cursors", || {
            let txn = self.db.begin_read()?;
            let md = txn.open_table(CURSOR_MARK_DELETE)?;
            let mut out = Vec::new();
            for row in md.range((name, "")..)? {
                let (k, _) = row?;
                let (n, c) = k.value();
                if n != name {
                    break;
                }
                out.push(c.to_string());
            }
            Ok(out)
        })
    }

    fn delete_cursor(&self, name: &str, cursor: &str) -> Result<(), StoreError> {
        contained("delete_cursor", || {
            let txn = self.begin()?;
            {
                txn.open_table(CURSOR_MARK_DELETE)?.remove((name, cursor))?;
                txn.open_table(CURSOR_RANGES)?.remove((name, cursor))?;
                let mut chunks = txn.open_table(CURSOR_DELETION_CHUNKS)?;
                remove_chunks(&mut chunks, name, cursor)?;
                let mut props = txn.open_table(CURSOR_PROPERTIES)?;
                let mut keys = Vec::new();
                for row in props.range((name, cursor, "")..)? {
                    let (k, _) = row?;
                    let (n, c, key) = k.value();
                    if n != name || c != cursor {
                        break;
                    }
                    keys.push(key.to_string());
                }
                for key in keys {
                    props.remove((name, cursor, key.as_str()))?;
                }
            }
            txn.commit()?;
            Ok(())
        })
    }
}

// ------------------------------------------------- read-only open (inspect / verify)

/// Everything a [`RedbStore`] file holds about managed ledgers and cursors,
/// read by [`RedbStore::read_only_contents`].
#[derive(Debug, Default)]
pub struct StoreContents {
    /// Managed ledger name → its ledger list.
    pub ledgers: BTreeMap<String, StoredLedger>,
    /// `(managed ledger, cursor)` → persisted cursor state (a cursor that
    /// only has properties gets mark-delete [`Position::EARLIEST`]).
    pub cursors: BTreeMap<(String, String), StoredCursor>,
    /// `(managed ledger, ledger id, entry id)` → payload, for the managed
    /// ledgers the caller selected.
    pub entries: BTreeMap<(String, i64, i64), Vec<u8>>,
    /// Managed ledger name → (entries stored, payload bytes), for all of them.
    pub entry_stats: BTreeMap<String, (u64, u64)>,
}

impl RedbStore {
    /// Reads the store file at `path` through a **read-only** redb handle:
    /// no write transaction is begun and no table is created, so the file
    /// is left byte-for-byte unchanged (unlike [`RedbStore::open`]). Entry
    /// payloads are kept only for managed ledgers for which `keep_entries`
    /// returns true. Also returns the read-only database, so callers can
    /// read the tables other modules keep in the same file.
    ///
    /// # Errors
    /// [`StoreError::Backend`] if the file cannot be opened read-only (not
    /// a redb file, locked by a writer, needs repair) or a table has another
    /// type; [`StoreError::Corrupt`] for an undecodable ranges record or
    /// compact deletion state.
    /// redb's panics on a damaged file are contained: they become
    /// [`StoreError::Corrupt`].
    pub fn read_only_contents(
        path: impl AsRef<Path>,
        keep_entries: &dyn Fn(&str) -> bool,
    ) -> Result<(StoreContents, redb::ReadOnlyDatabase), StoreError> {
        contained("read_only_contents", || {
            Self::read_only_contents_uncontained(path.as_ref(), keep_entries)
        })
    }

    fn read_only_contents_uncontained(
        path: &Path,
        keep_entries: &dyn Fn(&str) -> bool,
    ) -> Result<(StoreContents, redb::ReadOnlyDatabase), StoreError> {
        let db = redb::ReadOnlyDatabase::open(path)?;
        let mut out = StoreContents::default();
        {
            let txn = db.begin_read()?;
            let missing =
                |e: &redb::TableError| matches!(e, redb::TableError::TableDoesNotExist(_));
            match txn.open_table(LEDGERS) {
                Ok(t) => {
                    for row in t.iter()? {
                        let (k, v) = row?;
                        let (name, id) = k.value();
                        let (entries, lost) = v.value();
                        out.ledgers
                            .entry(name.to_string())
                            .or_default()
                            .ledgers
                            .insert(
                                id,
                                StoredLedgerInfo {
                                    entries,
                                    lost,
                                    size_bytes: 0,
                                },
                            );
                    }
                }
                Err(e) if missing(&e) => {}
                Err(e) => return Err(e.into()),
            }
            match txn.open_table(ENTRIES) {
                Ok(t) => {
                    for row in t.iter()? {
                        let (k, v) = row?;
                        let (name, l, e) = k.value();
                        let stats = out.entry_stats.entry(name.to_string()).or_default();
                        stats.0 += 1;
                        stats.1 += v.value().len() as u64;
                        if let Some(info) = out
                            .ledgers
                            .get_mut(name)
                            .and_then(|led| led.ledgers.get_mut(&l))
                        {
                            info.size_bytes += v.value().len() as u64;
                        }
                        if keep_entries(name) {
                            out.entries
                                .insert((name.to_string(), l, e), v.value().to_vec());
                        }
                    }
                }
                Err(e) if missing(&e) => {}
                Err(e) => return Err(e.into()),
            }
            let blank = || StoredCursor {
                mark_delete: Position::EARLIEST,
                properties: BTreeMap::new(),
                individually_deleted: Vec::new(),
            };
            match txn.open_table(CURSOR_MARK_DELETE) {
                Ok(t) => {
                    for row in t.iter()? {
                        let (k, v) = row?;
                        let (name, cursor) = k.value();
                        let (l, e) = v.value();
                        out.cursors
                            .entry((name.to_string(), cursor.to_string()))
                            .or_insert_with(blank)
                            .mark_delete = Position::new(l, e);
                    }
                }
                Err(e) if missing(&e) => {}
                Err(e) => return Err(e.into()),
            }
            match txn.open_table(CURSOR_RANGES) {
                Ok(t) => {
                    for row in t.iter()? {
                        let (k, v) = row?;
                        let (name, cursor) = k.value();
                        out.cursors
                            .entry((name.to_string(), cursor.to_string()))
                            .or_insert_with(blank)
                            .individually_deleted = decode_ranges(v.value())?;
                    }
                }
                Err(e) if missing(&e) => {}
                Err(e) => return Err(e.into()),
            }
            // A cursor persisted with `persist_deletion_state` keeps its
            // individually deleted entries in the compact record (and no
            // ranges record): its ranges are read from there.
            match txn.open_table(CURSOR_DELETION_CHUNKS) {
                Ok(t) => {
                    let mut chunks: BTreeMap<(String, String), Vec<Vec<u8>>> = BTreeMap::new();
                    for row in t.iter()? {
                        let (k, v) = row?;
                        let (name, cursor, i) = k.value();
                        let list = chunks
                            .entry((name.to_string(), cursor.to_string()))
                            .or_default();
                        if i as usize != list.len() {
                            return Err(StoreError::Corrupt(format!(
                                "cursor {cursor} of {name}: deletion-state chunk {} missing",
                                list.len()
                            )));
                        }
                        list.push(v.value().to_vec());
                    }
                    for (key, list) in chunks {
                        let snapshot = crate::deletion::compact::decode(&list).map_err(|e| {
                            StoreError::Corrupt(format!("cursor {} of {}: {e}", key.1, key.0))
                        })?;
                        out.cursors
                            .entry(key)
                            .or_insert_with(blank)
                            .individually_deleted = snapshot.ranges().collect();
                    }
                }
                Err(e) if missing(&e) => {}
                Err(e) => return Err(e.into()),
            }
            match txn.open_table(CURSOR_PROPERTIES) {
                Ok(t) => {
                    for row in t.iter()? {
                        let (k, v) = row?;
                        let (name, cursor, key) = k.value();
                        out.cursors
                            .entry((name.to_string(), cursor.to_string()))
                            .or_insert_with(blank)
                            .properties
                            .insert(key.to_string(), v.value());
                    }
                }
                Err(e) if missing(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok((out, db))
    }
}
