//! The managed-ledger substrate: an append-only log split into ledgers that
//! roll over after a configurable number of entries, with cursors that keep a
//! read position, a mark-delete position and properties (Pulsar's
//! `ManagedLedgerImpl` / `ManagedCursorImpl`, reduced to what the four seed
//! components and the simulator need).
//!
//! - [`ManagedLedger::append`] / [`ManagedLedger::append_batch`] return the new
//!   [`Position`]s; a batch is stored atomically.
//! - [`ManagedCursor::read_entries`] reads forward from the read position;
//!   [`ManagedCursor::rewind`] moves it back to the entry after mark-delete;
//!   [`ManagedCursor::mark_delete`] never moves backward (only
//!   [`ManagedCursor::reset`] may).
//! - Read failures can be injected per call ([`ReadFaults`]) with the shapes
//!   Pulsar distinguishes ([`ReadFailureKind`]); a ledger whose data was lost
//!   ([`ManagedLedger::mark_ledger_lost`]) fails reads with
//!   [`LedgerError::LedgerNotExist`] unless
//!   [`LedgerConfig::auto_skip_non_recoverable_data`] is on.
//! - Storage is a [`LedgerStore`]: [`RedbStore`] (durable, default) or
//!   [`MemoryStore`] (tests).
//!
//! Concurrency: a `ManagedLedger` and its cursors may be shared between
//! threads (`Arc`); appends are serialised by the ledger's lock and each
//! cursor has its own lock. User code is called as follows:
//!
//! - a [`ReadFaults`] policy runs with no lock held, so it may call any
//!   method of the ledger or its cursors (including the reading cursor);
//! - the `skip` predicate of [`ManagedCursor::read_entries_with_skip`] runs
//!   with that cursor's lock held and must not call back into that cursor.

mod error;
mod store;

pub use error::{LedgerError, ReadFailureKind, StoreError};
pub use store::StoreContents;
pub use store::{
    AppendSegment, LedgerStore, MemoryStore, RedbStore, StoredCursor, StoredLedger,
    StoredLedgerInfo, SyncMode,
};

use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;

use crate::position::Position;
use crate::sync::{AtomicBool, Mutex, Ordering};
// Ownership handles (the store trait object, `Arc<ManagedLedger>` receivers)
// use std's Arc in every build: they carry no modelled synchronisation, and
// loom's Arc supports neither unsized coercion nor `self: &Arc<Self>`.
use std::sync::Arc;

/// Configuration of a [`ManagedLedger`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerConfig {
    /// Entries per ledger before rolling over to a new ledger
    /// (`managedLedgerMaxEntriesPerLedger`, default 50,000). Must be ≥ 1.
    pub max_entries_per_ledger: u32,
    /// `autoSkipNonRecoverableData` (default false): reads skip over ledgers
    /// whose data is lost instead of failing with
    /// [`LedgerError::LedgerNotExist`].
    pub auto_skip_non_recoverable_data: bool,
}

impl Default for LedgerConfig {
    fn default() -> Self {
        Self {
            max_entries_per_ledger: 50_000,
            auto_skip_non_recoverable_data: false,
        }
    }
}

/// One entry read from a ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Where the entry is stored.
    pub position: Position,
    /// The entry payload.
    pub data: Vec<u8>,
}

/// A read request as seen by a [`ReadFaults`] policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadRequest<'a> {
    /// Managed-ledger name.
    pub ledger: &'a str,
    /// Cursor name.
    pub cursor: &'a str,
    /// Read position at the start of the read.
    pub from: Position,
    /// Maximum number of entries requested.
    pub max_entries: usize,
}

type FaultPolicy = dyn Fn(&ReadRequest<'_>) -> Option<ReadFailureKind> + Send + Sync;

/// Per-call read-failure injection for one managed ledger (every cursor of
/// it): a queue of one-shot failures consumed by the next reads, plus an
/// optional policy consulted on every read (e.g. a storage outage window on
/// virtual time). Thread-safe; any thread may arm faults at any time.
#[derive(Default)]
pub struct ReadFaults {
    queued: Mutex<VecDeque<ReadFailureKind>>,
    policy: Mutex<Option<Arc<FaultPolicy>>>,
}

impl std::fmt::Debug for ReadFaults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadFaults")
            .field("queued", &self.queued.lock().len())
            .field("policy", &self.policy.lock().is_some())
            .finish()
    }
}

impl ReadFaults {
    /// The next `count` reads (of any cursor of this ledger) fail with `kind`.
    pub fn fail_next_reads(&self, kind: ReadFailureKind, count: usize) {
        let mut q = self.queued.lock();
        for _ in 0..count {
            q.push_back(kind);
        }
    }

    /// Installs a policy consulted on every read after the queued faults; it
    /// returns the failure to inject, if any. Replaces any previous policy.
    ///
    /// The policy is called with no lock held (neither the reading cursor's
    /// nor the ledger's), so it may inspect the cursor or ledger, e.g. call
    /// [`ManagedCursor::read_position`]. Its [`ReadRequest::from`] is the read
    /// position when the read started; a concurrent read, rewind or reset of
    /// the same cursor may move the read position before the read proceeds.
    pub fn set_policy(
        &self,
        policy: impl Fn(&ReadRequest<'_>) -> Option<ReadFailureKind> + Send + Sync + 'static,
    ) {
        *self.policy.lock() = Some(Arc::new(policy));
    }

    /// Removes the policy and every queued fault.
    pub fn clear(&self) {
        self.queued.lock().clear();
        *self.policy.lock() = None;
    }

    fn next(&self, req: &ReadRequest<'_>) -> Option<ReadFailureKind> {
        if let Some(k) = self.queued.lock().pop_front() {
            return Some(k);
        }
        let policy = self.policy.lock().clone();
        policy.and_then(|p| p(req))
    }
}

#[derive(Debug)]
struct LedgerState {
    /// Ledger id → info, ascending. The last one is the current (open) ledger.
    ledgers: BTreeMap<i64, StoredLedgerInfo>,
}

impl LedgerState {
    fn current(&self) -> (i64, StoredLedgerInfo) {
        let (id, info) = self
            .ledgers
            .iter()
            .next_back()
            .expect("invariant: a managed ledger always has a current ledger");
        (*id, *info)
    }

    fn last_confirmed(&self) -> Position {
        for (id, info) in self.ledgers.iter().rev() {
            if info.entries > 0 {
                return Position::new(*id, info.entries - 1);
            }
        }
        let first = *self
            .ledgers
            .keys()
            .next()
            .expect("invariant: a managed ledger always has a current ledger");
        Position::new(first, -1)
    }

    /// The first position strictly after `p` that holds an entry, or the
    /// position just past the last confirmed entry when there is none.
    fn next_valid_after(&self, p: Position) -> Position {
        if let Some(info) = self.ledgers.get(&p.ledger_id) {
            // `entry_id < entries - 1` rather than `entry_id + 1 < entries`:
            // no overflow at `i64::MAX` (entries >= 0).
            if p.entry_id < info.entries - 1 {
                return Position::new(p.ledger_id, p.entry_id.max(-1) + 1);
            }
        }
        let later = (Bound::Excluded(p.ledger_id), Bound::Unbounded);
        for (id, info) in self.ledgers.range(later) {
            if info.entries > 0 {
                return Position::new(*id, 0);
            }
        }
        self.past_end()
    }

    /// The smallest position `>= p` that holds an entry, or past-the-end.
    fn first_valid_at_or_after(&self, p: Position) -> Position {
        if let Some(info) = self.ledgers.get(&p.ledger_id) {
            if p.entry_id >= 0 && p.entry_id < info.entries {
                return p;
            }
        }
        self.next_valid_after(p)
    }

    /// Checks that `p` may be a mark-delete position: entry id `>= -1`; not
    /// beyond the last confirmed entry, except `(L, -1)` for an existing
    /// ledger `L` that holds no entry yet (just after a rollover); otherwise
    /// in an existing ledger and not past its end.
    fn check_mark_delete_position(&self, p: Position) -> Result<(), LedgerError> {
        let invalid = |reason: String| LedgerError::InvalidPosition {
            position: p,
            reason,
        };
        if p.entry_id < -1 {
            return Err(invalid("entry id is below -1".into()));
        }
        let lce = self.last_confirmed();
        if p > lce {
            if p.entry_id == -1 && self.ledgers.contains_key(&p.ledger_id) {
                return Ok(());
            }
            return Err(LedgerError::BeyondLastConfirmed {
                position: p,
                last_confirmed: lce,
            });
        }
        match self.ledgers.get(&p.ledger_id) {
            None => Err(invalid(format!("there is no ledger {}", p.ledger_id))),
            Some(info) if p.entry_id >= info.entries => Err(invalid(format!(
                "ledger {} holds only {} entries",
                p.ledger_id, info.entries
            ))),
            Some(_) => Ok(()),
        }
    }

    /// Checks individually deleted ranges `(lower, upper]` to persist with
    /// mark-delete position `md`: each non-empty, `lower` entry id `>= -1`,
    /// `lower >= md`, `upper` an existing entry (so not beyond the last
    /// confirmed one), ascending and non-overlapping (adjacent is fine).
    fn check_deleted_ranges(
        &self,
        md: Position,
        ranges: &[(Position, Position)],
    ) -> Result<(), LedgerError> {
        let lce = self.last_confirmed();
        let mut previous_upper: Option<Position> = None;
        for &(lower, upper) in ranges {
            let invalid = |reason: String| LedgerError::InvalidDeletedRange {
                lower,
                upper,
                reason,
            };
            if lower >= upper {
                return Err(invalid("the range is empty or inverted".into()));
            }
            if lower.entry_id < -1 {
                return Err(invalid("lower entry id is below -1".into()));
            }
            if lower < md {
                return Err(invalid(format!(
                    "it starts below the mark-delete position {md}"
                )));
            }
            if let Some(prev) = previous_upper {
                if lower < prev {
                    return Err(invalid(format!(
                        "ranges must be ascending and disjoint (previous range ends at {prev})"
                    )));
                }
            }
            if upper > lce {
                return Err(invalid(format!(
                    "it ends beyond the last confirmed entry {lce}"
                )));
            }
            match self.ledgers.get(&upper.ledger_id) {
                Some(info) if upper.entry_id >= 0 && upper.entry_id < info.entries => {}
                _ => return Err(invalid(format!("upper bound {upper} is not an entry"))),
            }
            previous_upper = Some(upper);
        }
        Ok(())
    }

    fn past_end(&self) -> Position {
        let lce = self.last_confirmed();
        Position::new(lce.ledger_id, lce.entry_id + 1)
    }
}

/// A managed ledger: an append-only sequence of ledgers persisted in a
/// [`LedgerStore`]. Cheap to share (`Arc<ManagedLedger>`); appends from any
/// thread are serialised by an internal lock.
pub struct ManagedLedger {
    name: String,
    config: LedgerConfig,
    store: Arc<dyn LedgerStore>,
    state: Mutex<LedgerState>,
    fenced: AtomicBool,
    faults: ReadFaults,
}

impl std::fmt::Debug for ManagedLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagedLedger")
            .field("name", &self.name)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl ManagedLedger {
    /// Opens (or creates) managed ledger `name` in `store`, recovering its
    /// ledger list. A new managed ledger starts with ledger id 1.
    ///
    /// One owner per name: the caller must ensure that at most one open
    /// `ManagedLedger` per `name` writes to a store at a time, as one Pulsar
    /// broker owns a topic. The store has no ownership or fencing, so two
    /// instances opened on the same store and name (e.g. through two clones
    /// of one `Arc<dyn LedgerStore>`) each append from their own view of the
    /// ledger list and overwrite each other's entries and cursor state (last
    /// write wins). To hand a managed ledger over, [`ManagedLedger::fence`]
    /// the old instance (and stop using its cursors) before opening the new
    /// one.
    ///
    /// # Errors
    /// [`LedgerError::InvalidArgument`] for `max_entries_per_ledger == 0` or an
    /// empty name; [`LedgerError::Store`] if the store fails.
    pub fn open(
        name: impl Into<String>,
        config: LedgerConfig,
        store: Arc<dyn LedgerStore>,
    ) -> Result<Arc<Self>, LedgerError> {
        let name = name.into();
        if name.is_empty() {
            return Err(LedgerError::InvalidArgument(
                "managed ledger name must not be empty".into(),
            ));
        }
        if config.max_entries_per_ledger == 0 {
            return Err(LedgerError::InvalidArgument(
                "max_entries_per_ledger must be at least 1".into(),
            ));
        }
        let mut stored = store.load_ledger(&name)?;
        if stored.ledgers.is_empty() {
            store.create_ledger(&name, 1)?;
            stored.ledgers.insert(1, StoredLedgerInfo::default());
        }
        Ok(Arc::new(Self {
            name,
            config,
            store,
            state: Mutex::new(LedgerState {
                ledgers: stored.ledgers,
            }),
            fenced: AtomicBool::new(false),
            faults: ReadFaults::default(),
        }))
    }

    /// The managed ledger's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its configuration.
    pub fn config(&self) -> &LedgerConfig {
        &self.config
    }

    /// The read-failure injection point shared by all its cursors.
    pub fn faults(&self) -> &ReadFaults {
        &self.faults
    }

    /// Appends one entry and returns its position.
    ///
    /// # Errors
    /// [`LedgerError::Fenced`] after [`ManagedLedger::fence`];
    /// [`LedgerError::Store`] if the store fails (nothing is appended).
    pub fn append(&self, data: &[u8]) -> Result<Position, LedgerError> {
        let mut v = self.append_batch(&[data])?;
        Ok(v.pop()
            .expect("append_batch returns one position per payload"))
    }

    /// Appends `payloads` in order and returns their positions. The batch may
    /// span ledger rollovers; it is stored in ONE atomic write, so after a
    /// crash either the whole batch is visible or none of it (never a torn
    /// batch or entry). An empty batch is a no-op.
    ///
    /// # Errors
    /// As [`ManagedLedger::append`]. On error nothing is appended.
    pub fn append_batch(&self, payloads: &[&[u8]]) -> Result<Vec<Position>, LedgerError> {
        if self.fenced.load(Ordering::Acquire) {
            return Err(LedgerError::Fenced {
                ledger: self.name.clone(),
            });
        }
        if payloads.is_empty() {
            return Ok(Vec::new());
        }
        let mut state = self.state.lock();
        let max = i64::from(self.config.max_entries_per_ledger);
        // Plan the segments against a copy of the ledger list; commit the
        // in-memory state only after the store accepted the whole batch.
        let (mut id, mut info) = state.current();
        let mut planned: Vec<(i64, i64, &[&[u8]])> = Vec::new();
        let mut rest = payloads;
        while !rest.is_empty() {
            // A full ledger rolls over; so does a lost one (closed by
            // `mark_ledger_lost`): nothing is ever appended to a lost ledger.
            if info.entries >= max || info.lost {
                id += 1;
                info = StoredLedgerInfo::default();
            }
            let take = ((max - info.entries) as usize).min(rest.len());
            let (chunk, tail) = rest.split_at(take);
            planned.push((id, info.entries, chunk));
            info.entries += take as i64;
            rest = tail;
        }
        let segments: Vec<AppendSegment<'_>> = planned
            .iter()
            .map(|(ledger_id, first_entry_id, payloads)| AppendSegment {
                ledger_id: *ledger_id,
                first_entry_id: *first_entry_id,
                payloads,
            })
            .collect();
        self.store.append(&self.name, &segments)?;
        let mut out = Vec::with_capacity(payloads.len());
        for seg in &segments {
            let n = seg.payloads.len() as i64;
            out.extend((0..n).map(|i| Position::new(seg.ledger_id, seg.first_entry_id + i)));
            state.ledgers.entry(seg.ledger_id).or_default().entries = seg.first_entry_id + n;
        }
        Ok(out)
    }

    /// The last confirmed (appended) entry; `(first ledger, -1)` when empty.
    pub fn last_confirmed_entry(&self) -> Position {
        self.state.lock().last_confirmed()
    }

    /// The first position after `p` that holds an entry, or the position just
    /// past the last confirmed entry. Any `p` is accepted: an entry id past
    /// the end of its ledger (up to `i64::MAX`) moves to the next ledger that
    /// holds an entry.
    pub fn next_valid_position(&self, p: Position) -> Position {
        self.state.lock().next_valid_after(p)
    }

    /// Ledger ids with their entry counts, ascending.
    pub fn ledgers(&self) -> Vec<(i64, i64)> {
        self.state
            .lock()
            .ledgers
            .iter()
            .map(|(id, i)| (*id, i.entries))
            .collect()
    }

    /// Number of entries strictly after `from` up to the last confirmed entry
    /// (any `from`, including entry ids past a ledger's end or below -1).
    pub fn entries_after(&self, from: Position) -> i64 {
        let state = self.state.lock();
        let after = from.entry_id.max(-1);
        let mut n = 0;
        for (id, info) in state.ledgers.range(from.ledger_id..) {
            if *id == from.ledger_id {
                // entries - 1 >= -1 and after >= -1: no overflow.
                n += (info.entries - 1 - after).max(0);
            } else {
                n += info.entries;
            }
        }
        n
    }

    /// The typed error an injected fault of `kind` produces for a read at `at`
    /// by cursor `cursor` (`""` for reads outside a cursor).
    fn fault_error(&self, kind: ReadFailureKind, at: Position, cursor: &str) -> LedgerError {
        match kind {
            ReadFailureKind::LedgerNotExist => LedgerError::LedgerNotExist {
                ledger_id: at.ledger_id,
            },
            ReadFailureKind::NonRecoverableData => LedgerError::NonRecoverableData { position: at },
            ReadFailureKind::Fenced => LedgerError::Fenced {
                ledger: self.name.clone(),
            },
            ReadFailureKind::CursorAlreadyClosed => LedgerError::CursorAlreadyClosed {
                ledger: self.name.clone(),
                cursor: cursor.to_string(),
            },
            ReadFailureKind::StorageUnavailable => LedgerError::StorageUnavailable {
                reason: "injected: bookie handle not available".into(),
            },
            ReadFailureKind::TooManyRequests => LedgerError::TooManyRequests,
        }
    }

    /// Reads the entries at `positions` (in the given order), e.g. to
    /// redeliver messages a consumer did not acknowledge. Does not move any
    /// cursor. Injected faults apply (with cursor name `""`).
    ///
    /// # Errors
    /// [`LedgerError::Fenced`], an injected fault,
    /// [`LedgerError::LedgerNotExist`] for a lost ledger,
    /// [`LedgerError::BeyondLastConfirmed`] / [`LedgerError::NonRecoverableData`]
    /// for a position that holds no entry, [`LedgerError::Store`].
    pub fn read_positions(&self, positions: &[Position]) -> Result<Vec<Entry>, LedgerError> {
        if self.is_fenced() {
            return Err(LedgerError::Fenced {
                ledger: self.name.clone(),
            });
        }
        if let Some(first) = positions.first() {
            let req = ReadRequest {
                ledger: &self.name,
                cursor: "",
                from: *first,
                max_entries: positions.len(),
            };
            if let Some(kind) = self.faults.next(&req) {
                return Err(self.fault_error(kind, *first, ""));
            }
        }
        let mut out = Vec::with_capacity(positions.len());
        for p in positions {
            let info = self.state.lock().ledgers.get(&p.ledger_id).copied();
            let lce = self.last_confirmed_entry();
            match info {
                Some(i) if p.entry_id >= 0 && p.entry_id < i.entries => {
                    if i.lost {
                        return Err(LedgerError::LedgerNotExist {
                            ledger_id: p.ledger_id,
                        });
                    }
                }
                _ if *p > lce => {
                    return Err(LedgerError::BeyondLastConfirmed {
                        position: *p,
                        last_confirmed: lce,
                    })
                }
                _ => return Err(LedgerError::NonRecoverableData { position: *p }),
            }
            let mut rows = self
                .store
                .read(&self.name, p.ledger_id, p.entry_id, p.entry_id)?;
            let Some((_, data)) = rows.pop() else {
                return Err(LedgerError::NonRecoverableData { position: *p });
            };
            out.push(Entry { position: *p, data });
        }
        Ok(out)
    }

    /// Drops the data of ledger `ledger_id` (simulating a deleted or lost
    /// BookKeeper ledger). The ledger stays in the list; reads of it fail with
    /// [`LedgerError::LedgerNotExist`] (or are skipped with auto-skip on).
    ///
    /// Marking the current ledger lost closes it, as Pulsar closes a failed
    /// BookKeeper ledger and opens a new one: the next append rolls over to a
    /// new ledger (id + 1), so nothing is ever appended to a lost ledger and
    /// reads agree before and after a reopen.
    ///
    /// # Errors
    /// [`LedgerError::InvalidArgument`] for an unknown ledger id;
    /// [`LedgerError::Store`] if the store fails.
    pub fn mark_ledger_lost(&self, ledger_id: i64) -> Result<(), LedgerError> {
        let mut state = self.state.lock();
        let Some(info) = state.ledgers.get(&ledger_id).copied() else {
            return Err(LedgerError::InvalidArgument(format!(
                "managed ledger {} has no ledger {ledger_id}",
                self.name
            )));
        };
        self.store.mark_ledger_lost(&self.name, ledger_id)?;
        state
            .ledgers
            .insert(ledger_id, StoredLedgerInfo { lost: true, ..info });
        Ok(())
    }

    /// Fences the ledger: every later append and read fails with
    /// [`LedgerError::Fenced`] (another owner took over).
    pub fn fence(&self) {
        self.fenced.store(true, Ordering::Release);
    }

    /// Whether [`ManagedLedger::fence`] was called.
    pub fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::Acquire)
    }

    /// Opens (or recovers) cursor `name`. A new cursor starts with its
    /// mark-delete at `(first ledger, -1)` (nothing acknowledged); a recovered
    /// one at its persisted mark-delete. The read position is the first entry
    /// after the mark-delete.
    ///
    /// # Errors
    /// [`LedgerError::InvalidArgument`] for an empty name;
    /// [`LedgerError::Store`] if the store fails.
    pub fn open_cursor(
        self: &Arc<Self>,
        name: impl Into<String>,
    ) -> Result<ManagedCursor, LedgerError> {
        let name = name.into();
        if name.is_empty() {
            return Err(LedgerError::InvalidArgument(
                "cursor name must not be empty".into(),
            ));
        }
        let (mark_delete, individually_deleted) = match self.store.load_cursor(&self.name, &name)? {
            Some(c) => (c.mark_delete, c.individually_deleted),
            None => {
                let first = {
                    let state = self.state.lock();
                    *state
                        .ledgers
                        .keys()
                        .next()
                        .expect("a current ledger exists")
                };
                let md = Position::new(first, -1);
                self.store.save_mark_delete(&self.name, &name, md, &[])?;
                (md, Vec::new())
            }
        };
        let read_position = self.state.lock().next_valid_after(mark_delete);
        Ok(ManagedCursor {
            ledger: Arc::clone(self),
            name,
            state: Mutex::new(CursorState {
                read_position,
                mark_delete,
                individually_deleted,
                closed: false,
            }),
        })
    }
}

#[derive(Debug)]
struct CursorState {
    read_position: Position,
    mark_delete: Position,
    individually_deleted: Vec<(Position, Position)>,
    closed: bool,
}

/// A cursor over a [`ManagedLedger`]: a read position that moves forward as
/// entries are read, a persisted mark-delete position (every entry `<=` it is
/// acknowledged) and persisted properties. All methods may be called from any
/// thread; each takes the cursor's lock for its duration.
pub struct ManagedCursor {
    ledger: Arc<ManagedLedger>,
    name: String,
    state: Mutex<CursorState>,
}

impl std::fmt::Debug for ManagedCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.state.lock();
        f.debug_struct("ManagedCursor")
            .field("ledger", &self.ledger.name)
            .field("name", &self.name)
            .field("read_position", &s.read_position)
            .field("mark_delete", &s.mark_delete)
            .finish()
    }
}

impl ManagedCursor {
    /// The cursor's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The managed ledger it reads.
    pub fn ledger(&self) -> &Arc<ManagedLedger> {
        &self.ledger
    }

    /// The next position a read starts from.
    pub fn read_position(&self) -> Position {
        self.state.lock().read_position
    }

    /// The mark-delete position.
    pub fn mark_delete_position(&self) -> Position {
        self.state.lock().mark_delete
    }

    /// The individually deleted ranges persisted with the last mark-delete.
    pub fn individually_deleted_ranges(&self) -> Vec<(Position, Position)> {
        self.state.lock().individually_deleted.clone()
    }

    /// Whether an entry exists at or after the read position.
    pub fn has_more_entries(&self) -> bool {
        let read = self.state.lock().read_position;
        read <= self.ledger.last_confirmed_entry()
    }

    /// Number of entries from the read position to the last confirmed entry.
    pub fn number_of_entries_to_read(&self) -> i64 {
        let read = self.state.lock().read_position;
        self.ledger.entries_after(read.previous_in_ledger())
    }

    /// Reads up to `max_entries` entries from the read position and advances
    /// the read position past them. Returns an empty vector when there is
    /// nothing to read.
    ///
    /// Order of checks, as in Pulsar: closed cursor → fenced ledger →
    /// injected fault → data. A ledger whose data is lost fails with
    /// [`LedgerError::LedgerNotExist`] (read position unchanged) unless
    /// auto-skip is on, in which case the read moves on to the next ledger; if
    /// entries were already collected before reaching the lost ledger they are
    /// returned and the failure surfaces on the next read.
    ///
    /// # Errors
    /// [`LedgerError::CursorAlreadyClosed`], [`LedgerError::Fenced`], any
    /// injected [`ReadFailureKind`], [`LedgerError::LedgerNotExist`],
    /// [`LedgerError::InvalidArgument`] for `max_entries == 0`,
    /// [`LedgerError::Store`]. On error the read position is unchanged.
    ///
    /// Any `max_entries >= 1` is valid; a huge one (up to `usize::MAX`) reads
    /// everything available.
    pub fn read_entries(&self, max_entries: usize) -> Result<Vec<Entry>, LedgerError> {
        if max_entries == 0 {
            return Err(LedgerError::InvalidArgument(
                "read_entries needs max_entries >= 1".into(),
            ));
        }
        let mut cursor = self.lock_readable(max_entries)?;
        let mut out: Vec<Entry> = Vec::new();
        let (start, ledgers): (Position, Vec<(i64, StoredLedgerInfo)>) = {
            let state = self.ledger.state.lock();
            let start = state.first_valid_at_or_after(cursor.read_position);
            let ledgers = state
                .ledgers
                .range(start.ledger_id..)
                .map(|(k, v)| (*k, *v))
                .collect();
            (start, ledgers)
        };
        // Last position of the last lost ledger skipped with auto-skip on.
        let mut skipped_to: Option<Position> = None;
        for (id, info) in ledgers {
            if out.len() >= max_entries {
                break;
            }
            let first = if id == start.ledger_id {
                start.entry_id.max(0)
            } else {
                0
            };
            if first >= info.entries {
                continue;
            }
            if info.lost {
                if self.ledger.config.auto_skip_non_recoverable_data {
                    skipped_to = Some(Position::new(id, info.entries - 1));
                    continue;
                }
                if out.is_empty() {
                    return Err(LedgerError::LedgerNotExist { ledger_id: id });
                }
                break;
            }
            // Saturating: a `max_entries` beyond i64 means "all available".
            let want = i64::try_from(max_entries - out.len()).unwrap_or(i64::MAX);
            // want >= 1 (out.len() < max_entries), so `want - 1` cannot wrap.
            let last = first.saturating_add(want - 1).min(info.entries - 1);
            let rows = self.ledger.store.read(&self.ledger.name, id, first, last)?;
            if rows.len() as i64 != last - first + 1 {
                if out.is_empty() {
                    return Err(LedgerError::NonRecoverableData {
                        position: Position::new(id, first),
                    });
                }
                break;
            }
            out.extend(rows.into_iter().map(|(e, data)| Entry {
                position: Position::new(id, e),
                data,
            }));
        }
        if let Some(last) = out.last() {
            cursor.read_position = self.ledger.next_valid_position(last.position);
        } else if let Some(skipped) = skipped_to {
            cursor.read_position = self.ledger.next_valid_position(skipped);
        }
        Ok(out)
    }

    /// The checks every read makes first, in Pulsar's order: closed cursor,
    /// fenced ledger, injected fault; returns the cursor lock for the read.
    ///
    /// The [`ReadFaults`] policy is user code: it runs with NO lock held (the
    /// cursor lock is released around it and taken again afterwards), so it
    /// may call back into this cursor or the ledger. The closed check is
    /// repeated once the lock is re-taken, as the cursor may have been closed
    /// while the policy ran.
    fn lock_readable(
        &self,
        max_entries: usize,
    ) -> Result<crate::sync::MutexGuard<'_, CursorState>, LedgerError> {
        let from = self.live()?.read_position;
        if self.ledger.is_fenced() {
            return Err(LedgerError::Fenced {
                ledger: self.ledger.name.clone(),
            });
        }
        let req = ReadRequest {
            ledger: &self.ledger.name,
            cursor: &self.name,
            from,
            max_entries,
        };
        if let Some(kind) = self.ledger.faults.next(&req) {
            return Err(self.ledger.fault_error(kind, from, &self.name));
        }
        self.live()
    }

    /// Reads like [`ManagedCursor::read_entries`] but skips positions for
    /// which `skip(ledger_id, entry_id)` is true without reading them
    /// (Pulsar's `readEntriesWithSkip`, used with the lock-free deletion
    /// hint). Within the window `[read, read + max_entries - 1]` (saturating:
    /// a huge `max_entries` is the rest of the ledger) of the current ledger
    /// it reads only the first contiguous run of non-skipped entries; a
    /// window that is entirely skipped moves the read position past it and
    /// the scan continues with the next window. Returns an empty vector
    /// when everything up to the last confirmed entry is skipped or read.
    ///
    /// `skip` is called with this cursor's lock held: it must not call back
    /// into this cursor. A `true` from `skip` means the entry is never read by
    /// this call, so a stale "deleted" answer loses the entry for this pass
    /// (see `cursor::is_deleted_for_read_scheduling` for the contract).
    ///
    /// # Errors
    /// As [`ManagedCursor::read_entries`]. On error the read position keeps
    /// only the progress over windows that were skipped entirely before the
    /// failure (entries `skip` declared deleted), never past an unread entry.
    pub fn read_entries_with_skip(
        &self,
        max_entries: usize,
        mut skip: impl FnMut(i64, i64) -> bool,
    ) -> Result<Vec<Entry>, LedgerError> {
        if max_entries == 0 {
            return Err(LedgerError::InvalidArgument(
                "read_entries_with_skip needs max_entries >= 1".into(),
            ));
        }
        let mut cursor = self.lock_readable(max_entries)?;
        let mut pos = cursor.read_position;
        loop {
            let (start, info) = {
                let state = self.ledger.state.lock();
                let start = state.first_valid_at_or_after(pos);
                (start, state.ledgers.get(&start.ledger_id).copied())
            };
            let Some(info) = info.filter(|i| start.entry_id >= 0 && start.entry_id < i.entries)
            else {
                // Past the last confirmed entry.
                cursor.read_position = start;
                return Ok(Vec::new());
            };
            // Saturating: a `max_entries` beyond i64 means "all available";
            // max_entries >= 1, so `window - 1` cannot wrap.
            let window = i64::try_from(max_entries).unwrap_or(i64::MAX);
            let window_end = start
                .entry_id
                .saturating_add(window - 1)
                .min(info.entries - 1);
            let run_start = (start.entry_id..=window_end).find(|e| !skip(start.ledger_id, *e));
            let Some(run_start) = run_start else {
                pos = self
                    .ledger
                    .next_valid_position(Position::new(start.ledger_id, window_end));
                cursor.read_position = pos;
                continue;
            };
            let run_end = (run_start..=window_end)
                .take_while(|e| !skip(start.ledger_id, *e))
                .last()
                .unwrap_or(run_start);
            if info.lost {
                if self.ledger.config.auto_skip_non_recoverable_data {
                    pos = self
                        .ledger
                        .next_valid_position(Position::new(start.ledger_id, info.entries - 1));
                    cursor.read_position = pos;
                    continue;
                }
                return Err(LedgerError::LedgerNotExist {
                    ledger_id: start.ledger_id,
                });
            }
            let rows =
                self.ledger
                    .store
                    .read(&self.ledger.name, start.ledger_id, run_start, run_end)?;
            if rows.len() as i64 != run_end - run_start + 1 {
                return Err(LedgerError::NonRecoverableData {
                    position: Position::new(start.ledger_id, run_start),
                });
            }
            cursor.read_position = self
                .ledger
                .next_valid_position(Position::new(start.ledger_id, run_end));
            return Ok(rows
                .into_iter()
                .map(|(e, data)| Entry {
                    position: Position::new(start.ledger_id, e),
                    data,
                })
                .collect());
        }
    }

    fn closed_error(&self) -> LedgerError {
        LedgerError::CursorAlreadyClosed {
            ledger: self.ledger.name.clone(),
            cursor: self.name.clone(),
        }
    }

    /// Moves the read position back to the first entry after the mark-delete
    /// position (Pulsar's `rewind()`).
    pub fn rewind(&self) {
        let mut cursor = self.state.lock();
        cursor.read_position = self.ledger.next_valid_position(cursor.mark_delete);
    }

    /// Persists a new mark-delete position (and no individually deleted
    /// ranges). Moves the read position forward if it fell behind.
    ///
    /// `position` must be an entry of the managed ledger, or `(L, -1)` ("just
    /// before the first entry of ledger `L`") for a ledger `L` it has.
    ///
    /// # Errors
    /// [`LedgerError::MarkDeleteBackward`] if `position` is below the current
    /// mark-delete; [`LedgerError::BeyondLastConfirmed`] past the last entry
    /// (in position order, so `(1000, -1)` is beyond `(1, 2)` unless ledger
    /// 1000 exists); [`LedgerError::InvalidPosition`] for an entry id below
    /// -1, a position past the end of its ledger or in a ledger that does not
    /// exist; [`LedgerError::CursorAlreadyClosed`]; [`LedgerError::Store`].
    /// On error nothing changes.
    pub fn mark_delete(&self, position: Position) -> Result<(), LedgerError> {
        self.mark_delete_with_ranges(position, Vec::new())
    }

    /// As [`ManagedCursor::mark_delete`], also persisting the individually
    /// deleted ranges above it (open-closed `(lower, upper]`, ascending) in the
    /// same atomic write. Every range must be non-empty, start at or above
    /// `position` (lower entry id `>= -1`), end at an existing entry (so not
    /// beyond the last confirmed one), and not overlap the previous range
    /// (adjacent ranges are accepted).
    ///
    /// # Errors
    /// As [`ManagedCursor::mark_delete`], plus
    /// [`LedgerError::InvalidDeletedRange`] for the first range that breaks
    /// the rules above. On error nothing changes.
    pub fn mark_delete_with_ranges(
        &self,
        position: Position,
        individually_deleted: Vec<(Position, Position)>,
    ) -> Result<(), LedgerError> {
        let mut cursor = self.state.lock();
        if cursor.closed {
            return Err(self.closed_error());
        }
        if position < cursor.mark_delete {
            return Err(LedgerError::MarkDeleteBackward {
                current: cursor.mark_delete,
                requested: position,
            });
        }
        {
            let state = self.ledger.state.lock();
            state.check_mark_delete_position(position)?;
            state.check_deleted_ranges(position, &individually_deleted)?;
        }
        self.ledger.store.save_mark_delete(
            &self.ledger.name,
            &self.name,
            position,
            &individually_deleted,
        )?;
        cursor.mark_delete = position;
        cursor.individually_deleted = individually_deleted;
        if cursor.read_position <= position {
            cursor.read_position = self.ledger.next_valid_position(position);
        }
        Ok(())
    }

    /// Resets the cursor so that the next read starts at `new_read_position`
    /// (Pulsar's `resetCursor`): the mark-delete becomes the position just
    /// before it and may move backward or forward; individually deleted
    /// ranges are cleared. Any position is accepted: one that holds no entry
    /// moves to the next one that does (an entry id past the end of its
    /// ledger, up to `i64::MAX`, moves to the next ledger), or past the last
    /// confirmed entry when there is none.
    ///
    /// # Errors
    /// [`LedgerError::CursorAlreadyClosed`]; [`LedgerError::Store`] (nothing
    /// changes).
    pub fn reset(&self, new_read_position: Position) -> Result<(), LedgerError> {
        let mut cursor = self.state.lock();
        if cursor.closed {
            return Err(self.closed_error());
        }
        let read = {
            let state = self.ledger.state.lock();
            state.first_valid_at_or_after(new_read_position)
        };
        let md = read.previous_in_ledger();
        self.ledger
            .store
            .save_mark_delete(&self.ledger.name, &self.name, md, &[])?;
        cursor.mark_delete = md;
        cursor.individually_deleted.clear();
        cursor.read_position = read;
        Ok(())
    }

    /// The cursor's persisted properties (string → i64), read from the store.
    ///
    /// # Errors
    /// [`LedgerError::Store`].
    pub fn properties(&self) -> Result<BTreeMap<String, i64>, LedgerError> {
        Ok(self
            .ledger
            .store
            .load_cursor(&self.ledger.name, &self.name)?
            .map(|c| c.properties)
            .unwrap_or_default())
    }

    /// Sets one property durably.
    ///
    /// # Errors
    /// [`LedgerError::CursorAlreadyClosed`]; [`LedgerError::Store`].
    pub fn set_property(&self, key: &str, value: i64) -> Result<(), LedgerError> {
        let _cursor = self.live()?;
        self.ledger
            .store
            .set_cursor_property(&self.ledger.name, &self.name, key, Some(value))?;
        Ok(())
    }

    /// Removes one property durably (no error if absent).
    ///
    /// # Errors
    /// [`LedgerError::CursorAlreadyClosed`]; [`LedgerError::Store`].
    pub fn remove_property(&self, key: &str) -> Result<(), LedgerError> {
        let _cursor = self.live()?;
        self.ledger
            .store
            .set_cursor_property(&self.ledger.name, &self.name, key, None)?;
        Ok(())
    }

    fn live(&self) -> Result<crate::sync::MutexGuard<'_, CursorState>, LedgerError> {
        let cursor = self.state.lock();
        if cursor.closed {
            return Err(self.closed_error());
        }
        Ok(cursor)
    }

    /// Closes the cursor: every later read, mark-delete or property change
    /// fails with [`LedgerError::CursorAlreadyClosed`]. Idempotent.
    pub fn close(&self) {
        self.state.lock().closed = true;
    }

    /// Whether [`ManagedCursor::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.state.lock().closed
    }
}
