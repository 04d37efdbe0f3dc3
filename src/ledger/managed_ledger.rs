//! The managed ledger: an append-only sequence of ledgers and the recovery
//! of its ledger list from the store ([`ManagedLedger`]).

use std::collections::BTreeMap;
use std::ops::Bound;

use super::cursor::ManagedCursor;
use super::error::{LedgerError, ReadFailureKind};
use super::faults::{ReadFaults, ReadRequest};
use super::store::{AppendSegment, LedgerStore, StoredLedgerInfo};
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

#[derive(Debug)]
pub(super) struct LedgerState {
    /// Ledger id → info, ascending. The last one is the current (open) ledger.
    pub(super) ledgers: BTreeMap<i64, StoredLedgerInfo>,
    /// Closed ledger id → when consumed-ledger trimming first saw it closed
    /// (epoch ms; the start of its retention time, see `trim.rs`).
    pub(super) closed_seen_at: BTreeMap<i64, u64>,
}

impl LedgerState {
    pub(super) fn current(&self) -> (i64, StoredLedgerInfo) {
        let (id, info) = self
            .ledgers
            .iter()
            .next_back()
            .expect("invariant: a managed ledger always has a current ledger");
        (*id, *info)
    }

    pub(super) fn last_confirmed(&self) -> Position {
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
    pub(super) fn next_valid_after(&self, p: Position) -> Position {
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

    /// As [`LedgerState::next_valid_after`], but with `skip_lost` a lost
    /// ledger holds no position: the first position after `p` outside every
    /// lost ledger (past-the-end when there is none).
    pub(super) fn next_valid_after_skipping_lost(&self, p: Position, skip_lost: bool) -> Position {
        let mut next = self.next_valid_after(p);
        if !skip_lost {
            return next;
        }
        while let Some(info) = self.ledgers.get(&next.ledger_id) {
            if !(info.lost && next.entry_id < info.entries) {
                break;
            }
            next = self.next_valid_after(Position::new(next.ledger_id, info.entries - 1));
        }
        next
    }

    /// The first ledger id still in the list: ledgers below it were deleted
    /// by consumed-ledger trimming (ids are assigned 1, 2, 3, … in order).
    pub(super) fn first_ledger_id(&self) -> i64 {
        *self
            .ledgers
            .keys()
            .next()
            .expect("invariant: a managed ledger always has a current ledger")
    }

    /// The smallest position `>= p` that holds an entry, or past-the-end.
    pub(super) fn first_valid_at_or_after(&self, p: Position) -> Position {
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
    pub(super) fn check_mark_delete_position(&self, p: Position) -> Result<(), LedgerError> {
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
            // A ledger deleted by consumed-ledger trimming: every durable
            // cursor had consumed it, so a mark-delete in it (e.g. at its
            // last entry, where the slowest cursor stood) stays valid.
            None if p.ledger_id >= 1 && p.ledger_id < self.first_ledger_id() => Ok(()),
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
    pub(super) fn check_deleted_ranges(
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

    pub(super) fn past_end(&self) -> Position {
        let lce = self.last_confirmed();
        Position::new(lce.ledger_id, lce.entry_id + 1)
    }
}

/// A managed ledger: an append-only sequence of ledgers persisted in a
/// [`LedgerStore`]. Cheap to share (`Arc<ManagedLedger>`); appends from any
/// thread are serialised by an internal lock.
pub struct ManagedLedger {
    pub(super) name: String,
    pub(super) config: LedgerConfig,
    pub(super) store: Arc<dyn LedgerStore>,
    pub(super) state: Mutex<LedgerState>,
    pub(super) fenced: AtomicBool,
    pub(super) faults: ReadFaults,
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
                closed_seen_at: BTreeMap::new(),
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
            let info = state.ledgers.entry(seg.ledger_id).or_default();
            info.entries = seg.first_entry_id + n;
            info.size_bytes += seg.payloads.iter().map(|p| p.len() as u64).sum::<u64>();
        }
        crate::trace::ledger_cursor::append_entries(&self.name, &out);
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

    /// As [`ManagedLedger::next_valid_position`], as every cursor's deletion
    /// state sees the ledger: with
    /// [`LedgerConfig::auto_skip_non_recoverable_data`] on, a lost ledger
    /// holds no position, so its entries count as deleted for every cursor
    /// and mark-delete moves past it once the entries around it are
    /// acknowledged (Pulsar's `skipNonRecoverableLedger`, PR #21210).
    /// With auto-skip off it is [`ManagedLedger::next_valid_position`]: a
    /// lost ledger's entries stay unacknowledged.
    pub fn next_valid_position_for_cursors(&self, p: Position) -> Position {
        self.state
            .lock()
            .next_valid_after_skipping_lost(p, self.config.auto_skip_non_recoverable_data)
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
    pub(super) fn fault_error(
        &self,
        kind: ReadFailureKind,
        at: Position,
        cursor: &str,
    ) -> LedgerError {
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
        state.ledgers.insert(
            ledger_id,
            StoredLedgerInfo {
                lost: true,
                size_bytes: 0,
                ..info
            },
        );
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

    /// A non-durable cursor `name` whose first read is the first entry after
    /// `mark_delete` (Pulsar's `newNonDurableCursor`, a reader's): never
    /// written to the store, so it holds no ledger against trimming and
    /// does not survive a restart. `mark_delete` is clamped into the
    /// ledger: below the first ledger it is just before the first entry,
    /// past the last confirmed entry it is the last confirmed entry.
    pub fn open_non_durable_cursor(
        self: &Arc<Self>,
        name: impl Into<String>,
        mark_delete: Position,
    ) -> ManagedCursor {
        let (first, last) = {
            let state = self.state.lock();
            let first = *state
                .ledgers
                .keys()
                .next()
                .expect("a current ledger exists");
            (Position::new(first, -1), state.last_confirmed())
        };
        let md = mark_delete.clamp(first, last.max(first));
        ManagedCursor::non_durable(Arc::clone(self), name.into(), md)
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
        let loaded = self.store.load_cursor(&self.name, &name)?;
        let recovered = loaded.is_some();
        let (mark_delete, individually_deleted) = match loaded {
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
        crate::trace::ledger_cursor::opened(
            &self.name,
            &name,
            recovered,
            mark_delete,
            read_position,
        );
        Ok(ManagedCursor::new(
            Arc::clone(self),
            name,
            read_position,
            mark_delete,
            individually_deleted,
        ))
    }
}
