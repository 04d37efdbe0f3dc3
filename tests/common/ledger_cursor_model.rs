//! The managed-ledger cursor of `src/ledger` against a reference model in
//! the terms of `specs/LedgerCursor.tla`: entries are numbered in append
//! order (ledger rollover only renumbers them), `md` is the number of the
//! last acknowledged entry (-1: none), `read` the number of the next entry a
//! read returns. Shared by the proptest model test
//! (`tests/ledger_cursor_model.rs`) and the trace recorder
//! (`tests/trace_ledger_cursor.rs`), which records the spec's traces from
//! the same proptest cases.
//!
//! After every operation the cursor must agree with the model: the entries
//! a read returns (positions and payloads), the mark-delete position, the
//! number of entries left to read. Rejected mark-deletes (backward, beyond
//! the last confirmed entry) must return their typed error and change
//! nothing. Reads with skip return the first run of entries the skip
//! predicate keeps within a window of `k` entries of one ledger, passing
//! over windows it skips entirely; a reset (seek) moves the mark-delete to
//! just before the new read position in either direction; a reopened
//! managed ledger recovers the cursor at its persisted mark-delete.

use std::sync::Arc;

use proptest::prelude::*;
use proptest::sample::Index;
use pulsar_core::ledger::{LedgerConfig, LedgerError, ManagedCursor, ManagedLedger, MemoryStore};
use pulsar_core::Position;

/// Entries per ledger: a run of a few dozen appends rolls over several
/// ledgers.
pub const ENTRIES_PER_LEDGER: u32 = 3;

#[derive(Debug, Clone)]
pub enum Op {
    /// `append_batch` of 1..=2 entries (none once `max_entries` are in).
    Append(usize),
    /// `read_entries(k)`, k in 1..=3.
    Read(usize),
    /// `mark_delete` at one of the appended entries or at `(L, -1)` of a
    /// ledger the managed ledger has (picked by the index; one below the
    /// current mark-delete must be refused).
    MarkDelete(Index),
    /// `mark_delete` one entry past the last confirmed one (refused).
    MarkDeleteBeyond,
    /// `rewind`.
    Rewind,
    /// `read_entries_with_skip(k)`, k in 1..=3, skipping the entries whose
    /// number's bit is set in the mask.
    ReadSkip(usize, u32),
    /// `reset` to one of the appended entries or just past the last one.
    Reset(Index),
    /// The managed ledger and the cursor are dropped and reopened from the
    /// store (a broker restart).
    Reopen,
}

pub fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1usize..=2).prop_map(Op::Append),
        3 => (1usize..=3).prop_map(Op::Read),
        2 => any::<Index>().prop_map(Op::MarkDelete),
        1 => Just(Op::MarkDeleteBeyond),
        1 => Just(Op::Rewind),
        3 => ((1usize..=3), any::<u32>()).prop_map(|(k, mask)| Op::ReadSkip(k, mask)),
        1 => any::<Index>().prop_map(Op::Reset),
        1 => Just(Op::Reopen),
    ]
}

pub fn ops(max_len: usize) -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(op(), 1..=max_len)
}

/// The reference model.
struct Model {
    /// Appended entries, in append order (entry number = index).
    entries: Vec<Position>,
    /// The number of the last acknowledged entry (-1: none).
    md: i64,
    /// Number of the next entry a read returns.
    read: usize,
}

impl Model {
    /// The entry number of `p`: its index in the log, or for `(L, -1)` the
    /// number of the last entry before ledger L (-1 if none).
    fn number(&self, p: Position) -> i64 {
        let before = self.entries.iter().filter(|e| **e < p).count() as i64;
        if self.entries.contains(&p) {
            before
        } else {
            before - 1
        }
    }

    /// What `read_entries_with_skip(k, skip)` returns (entry numbers) and
    /// the read position after it: windows of up to `k` entries of one
    /// ledger from the read position; a window whose entries are all
    /// skipped is passed over; otherwise the first run of kept entries in
    /// it is returned and reading goes on after it.
    fn read_with_skip(&self, k: usize, skip: impl Fn(usize) -> bool) -> (Vec<usize>, usize) {
        let mut pos = self.read;
        loop {
            if pos >= self.entries.len() {
                return (Vec::new(), self.entries.len());
            }
            let ledger = self.entries[pos].ledger_id;
            let ledger_end = (pos..self.entries.len())
                .take_while(|i| self.entries[*i].ledger_id == ledger)
                .last()
                .unwrap_or(pos);
            let window_end = (pos + k - 1).min(ledger_end);
            match (pos..=window_end).find(|i| !skip(*i)) {
                None => pos = window_end + 1,
                Some(first) => {
                    let last = (first..=window_end)
                        .take_while(|i| !skip(*i))
                        .last()
                        .unwrap_or(first);
                    return ((first..=last).collect(), last + 1);
                }
            }
        }
    }
}

/// Runs `ops` on a fresh managed ledger (memory store,
/// [`ENTRIES_PER_LEDGER`] per ledger) with at most `max_entries` appended,
/// checking the cursor against the model after every step.
pub fn run_case(ops: &[Op], max_entries: usize) -> Result<(), TestCaseError> {
    let config = LedgerConfig {
        max_entries_per_ledger: ENTRIES_PER_LEDGER,
        auto_skip_non_recoverable_data: false,
    };
    let store = Arc::new(MemoryStore::new());
    let open = || -> Result<(Arc<ManagedLedger>, ManagedCursor), TestCaseError> {
        let ml = ManagedLedger::open("model", config.clone(), store.clone())
            .map_err(|e| TestCaseError::fail(format!("open: {e}")))?;
        let cursor = ml
            .open_cursor("sub")
            .map_err(|e| TestCaseError::fail(format!("open_cursor: {e}")))?;
        Ok((ml, cursor))
    };
    let (mut ml, mut cursor) = open()?;
    let mut m = Model {
        entries: Vec::new(),
        md: -1,
        read: 0,
    };
    prop_assert_eq!(
        m.number(cursor.mark_delete_position()),
        -1,
        "a new cursor has acknowledged nothing"
    );
    for (step, op) in ops.iter().enumerate() {
        match op {
            Op::Append(n) => {
                let n = (*n).min(max_entries - m.entries.len());
                if n == 0 {
                    continue;
                }
                let payloads: Vec<Vec<u8>> = (0..n)
                    .map(|i| format!("m{}", m.entries.len() + i).into_bytes())
                    .collect();
                let refs: Vec<&[u8]> = payloads.iter().map(|p| p.as_slice()).collect();
                let got = ml
                    .append_batch(&refs)
                    .map_err(|e| TestCaseError::fail(format!("step {step}: append: {e}")))?;
                prop_assert_eq!(got.len(), n);
                for p in &got {
                    prop_assert!(
                        m.entries.last().is_none_or(|last| last < p),
                        "step {}: append returned {} after {:?}",
                        step,
                        p,
                        m.entries.last()
                    );
                }
                m.entries.extend(got);
            }
            Op::Read(k) => {
                let got = cursor
                    .read_entries(*k)
                    .map_err(|e| TestCaseError::fail(format!("step {step}: read: {e}")))?;
                let end = (m.read + k).min(m.entries.len());
                let want = &m.entries[m.read.min(end)..end];
                let positions: Vec<Position> = got.iter().map(|e| e.position).collect();
                prop_assert_eq!(&positions[..], want, "step {}: read_entries({})", step, k);
                for e in &got {
                    let n = m.number(e.position);
                    prop_assert_eq!(
                        &e.data,
                        &format!("m{n}").into_bytes(),
                        "payload of {}",
                        e.position
                    );
                }
                m.read = end.max(m.read);
            }
            Op::MarkDelete(ix) => {
                let mut candidates = m.entries.clone();
                candidates.extend(ml.ledgers().iter().map(|(l, _)| Position::new(*l, -1)));
                candidates.sort();
                let p = *ix.get(&candidates);
                // "Backward" is decided on positions, as the cursor does
                // ((L, -1) is above the last entry of ledger L - 1).
                let current = cursor.mark_delete_position();
                let r = cursor.mark_delete(p);
                if p < current {
                    prop_assert!(
                        matches!(r, Err(LedgerError::MarkDeleteBackward { .. })),
                        "step {}: mark_delete({}) below {}: {:?}",
                        step,
                        p,
                        current,
                        r
                    );
                } else {
                    prop_assert!(r.is_ok(), "step {}: mark_delete({}): {:?}", step, p, r);
                    m.md = m.number(p);
                    m.read = m.read.max((m.md + 1) as usize);
                }
            }
            Op::MarkDeleteBeyond => {
                let lce = ml.last_confirmed_entry();
                let beyond = Position::new(lce.ledger_id, lce.entry_id + 1);
                let r = cursor.mark_delete(beyond);
                prop_assert!(
                    matches!(
                        r,
                        Err(LedgerError::BeyondLastConfirmed { .. }
                            | LedgerError::InvalidPosition { .. })
                    ),
                    "step {}: mark_delete({}) past the last entry: {:?}",
                    step,
                    beyond,
                    r
                );
            }
            Op::Rewind => {
                cursor.rewind();
                m.read = (m.md + 1) as usize;
            }
            Op::ReadSkip(k, mask) => {
                let skipped = |i: usize| i < 32 && mask & (1 << i) != 0;
                let (want, read) = m.read_with_skip(*k, skipped);
                let number = |l: i64, e: i64| m.number(Position::new(l, e)) as usize;
                let got = cursor
                    .read_entries_with_skip(*k, |l, e| skipped(number(l, e)))
                    .map_err(|e| {
                        TestCaseError::fail(format!("step {step}: read with skip: {e}"))
                    })?;
                let got: Vec<usize> = got
                    .iter()
                    .map(|e| number(e.position.ledger_id, e.position.entry_id))
                    .collect();
                prop_assert_eq!(
                    got,
                    want,
                    "step {}: read_entries_with_skip({}, {:#x})",
                    step,
                    k,
                    mask
                );
                m.read = read;
            }
            Op::Reset(ix) => {
                let n = ix.index(m.entries.len() + 1);
                let target = match m.entries.get(n) {
                    Some(p) => *p,
                    None => ml.last_confirmed_entry().next_in_ledger(),
                };
                cursor.reset(target).map_err(|e| {
                    TestCaseError::fail(format!("step {step}: reset({target}): {e}"))
                })?;
                m.read = n;
                m.md = n as i64 - 1;
            }
            Op::Reopen => {
                drop(cursor);
                drop(ml);
                (ml, cursor) = open()?;
                m.read = (m.md + 1) as usize;
            }
        }
        prop_assert_eq!(
            m.number(cursor.mark_delete_position()),
            m.md,
            "step {}: mark-delete {}",
            step,
            cursor.mark_delete_position()
        );
        prop_assert_eq!(
            cursor.number_of_entries_to_read(),
            (m.entries.len() - m.read) as i64,
            "step {}: entries left to read",
            step
        );
        prop_assert_eq!(
            cursor.has_more_entries(),
            m.read < m.entries.len(),
            "step {}: has_more_entries",
            step
        );
    }
    Ok(())
}
