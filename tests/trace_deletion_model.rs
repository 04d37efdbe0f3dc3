//! Trace recording for `specs/TraceDeletionLookup.tla` from proptest model
//! runs: single-threaded operation sequences on one cursor deletion state
//! of `src/deletion` (`CursorDeletionState`), generated from a fixed seed,
//! each checked against a reference model while it is recorded.
//!
//! The managed ledger's layout is ledger_id 1 (entry_id 0..=3), 2 (no
//! entries), 3 (0..=2), 4, 5 and 6 (0..=1 each): the mark-delete crosses
//! an empty ledger (1:3 → 3:0) and adjacent ones (3:2 → 4:0), and up to
//! five ledgers hold individually deleted entries at once, one more than
//! the hint's summary slots, so lookups also take the published
//! directory's path and slots are freed and reused. A case starts
//! from a new state (mark-delete `1:-1`) or from a recovered one
//! (`CursorDeletionState::recover` with a mark-delete and individual
//! deleted ranges, parts of them at or below the mark-delete), then runs
//! 20..=40 of:
//!
//! - grouped acks (`delete`) of 1..=3 positions in any order, also ones
//!   already deleted, at or below the mark-delete, repeated in the group,
//!   or past the last confirmed entry (the whole group refused);
//! - explicit mark-deletes (`mark_delete`) to any position, also backward
//!   or past the last confirmed entry (refused), or to one a deleted run
//!   follows (the mark-delete extends through it);
//! - resets (`reset`) backward and forward to any read position, also one
//!   before the first ledger or past the end (refused), at most 4 per state
//!   (the trace cfg's MaxResets);
//! - lookups through the read-scheduling hint (`read_scheduling_lookup`,
//!   the path of `is_deleted_for_read_scheduling`), one at a time, never
//!   overlapping a reset;
//! - restarts: the state is persisted and a new one recovered from it
//!   (`recover` from its mark-delete and individual deleted ranges, or
//!   `from_snapshot` of its `compact` encoding), at most 2 per case.
//!
//! The reference model is the mark-delete plus a `BTreeSet<Position>` of
//! the individually deleted entries above it. After every step: the
//! mark-delete, the individual deleted ranges and their count equal the
//! model's, `is_message_deleted` (the locked lookup) and
//! `filter_read_entries` agree with it on every position, and the reset
//! epoch is twice the state's resets; a refused operation is refused by
//! both with the same error and changes nothing. Every hint answer
//! "deleted" must be deleted in the model (no stale positive) and, the
//! state being quiescent, every "not deleted" must be too (no stale
//! negative: the cursor's docs give a stale negative only to an ack,
//! advance or clear racing the lookup); the hint must not fall back to
//! the lock and must have read the model's mark-delete.
//!
//! Each deletion state is one run (tag `t`; a restart starts the next) in
//! `$PULSAR_TRACE_DIR/DeletionLookupModel.ndjson` (default
//! `target/traces`); the first line also holds the layout (`layout`, the
//! spec's `LastEntry`). `.ci/trace DeletionLookup` has TLC validate them
//! against DeletionLookup (`TraceFollowed`, `NoStalePositive`, ...). A model
//! disagreement fails the test after the file is written, so TLC judges
//! the lines first.
#![cfg(all(feature = "trace", not(any(loom, feature = "shuttle"))))]

use std::collections::BTreeSet;
use std::io::Write;

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use pulsar_core::deletion::{compact, CursorDeletionState, DeletionError, LedgerLayout};
use pulsar_core::{trace, Position};
use serde_json::Value;

mod common;
use common::{deleted_ranges, p};

/// Cases recorded.
const RUNS: u32 = 100;
const MIN_OPS: usize = 20;
const MAX_OPS: usize = 40;
const SEED: [u8; 32] = *b"pulsar-core trace DeletionModel1";
/// `(ledger_id, entries)`: entries `0..entries`; every entry id at most
/// the trace cfg's MaxEntry (3).
const LEDGERS: [(i64, i64); 6] = [(1, 4), (2, 0), (3, 3), (4, 2), (5, 2), (6, 2)];
/// Resets per deletion state: at most the trace cfg's MaxResets.
const MAX_RESETS: u64 = 4;
/// Bitmaps a run may create: the trace cfg's MaxIds less the ids of the
/// `Open` state (one per ledger).
const MAX_NEW_BITMAPS: usize = 40 - LEDGERS.len();
/// Restarts per case.
const MAX_RESTARTS: usize = 2;
/// Ledgers whose bitmaps the hint finds in summary slots (the others
/// through the published directory).
const SUMMARY_SLOTS: usize = 4;

fn layout() -> LedgerLayout {
    LedgerLayout::new(LEDGERS.map(|(l, n)| (l, n as u32)))
}

/// Every position holding an entry, ascending.
fn members() -> Vec<Position> {
    LEDGERS
        .iter()
        .flat_map(|&(l, n)| (0..n).map(move |e| p(l, e)))
        .collect()
}

/// The spec's `Positions`: the entries and each ledger's `(L, -1)` bound.
fn positions() -> Vec<Position> {
    LEDGERS
        .iter()
        .flat_map(|&(l, n)| (-1..n).map(move |e| p(l, e)))
        .collect()
}

fn last_confirmed() -> Position {
    *members().last().unwrap()
}

/// Where a case starts.
#[derive(Debug, Clone)]
enum Start {
    /// `CursorDeletionState::new(1:-1)`.
    New,
    /// `CursorDeletionState::recover(md, ranges of these entries)`.
    Recover(Position, BTreeSet<Position>),
}

/// One step of a case.
#[derive(Debug, Clone)]
enum Op {
    /// `delete(group)`: a grouped ack.
    Ack(Vec<Position>),
    /// `mark_delete(position)`.
    MarkDelete(Position),
    /// `reset(read position)` (skipped after `MAX_RESETS` in one state).
    Reset(Position),
    /// `read_scheduling_lookup(q)`: the hint.
    Hint(Position),
    /// Persist and recover (skipped after `MAX_RESTARTS`); `true`: through
    /// `snapshot` + `compact`, `false`: through `recover`.
    Restart(bool),
}

fn member() -> impl Strategy<Value = Position> {
    proptest::sample::select(members())
}

fn op() -> impl Strategy<Value = Op> {
    let acked = prop_oneof![
        14 => member(),
        // past the last confirmed entry: the group is refused
        1 => proptest::sample::select(vec![p(6, 2), p(7, 0)]),
    ];
    let read_positions: Vec<Position> = std::iter::once(p(0, 0))
        .chain(
            LEDGERS
                .iter()
                .flat_map(|&(l, n)| (0..=n).map(move |e| p(l, e))),
        )
        .chain([p(6, 3), p(7, 0)])
        .collect();
    prop_oneof![
        6 => proptest::collection::vec(acked, 1..=3).prop_map(Op::Ack),
        2 => prop_oneof![
            10 => proptest::sample::select(positions()),
            1 => Just(p(6, 2)),
        ]
        .prop_map(Op::MarkDelete),
        1 => proptest::sample::select(read_positions).prop_map(Op::Reset),
        6 => member().prop_map(Op::Hint),
        1 => any::<bool>().prop_map(Op::Restart),
    ]
}

fn case() -> impl Strategy<Value = (Start, Vec<Op>)> {
    (
        prop_oneof![
            3 => Just(Start::New),
            2 => (
                proptest::sample::select(positions()),
                proptest::collection::btree_set(member(), 0..=6),
            )
                .prop_map(|(md, set)| Start::Recover(md, set)),
        ],
        proptest::collection::vec(op(), MIN_OPS..=MAX_OPS),
    )
}

/// The entries that open-closed `ranges` hold.
fn entries_of(ranges: &[(Position, Position)]) -> BTreeSet<Position> {
    members()
        .into_iter()
        .filter(|m| ranges.iter().any(|(lo, hi)| lo < m && m <= hi))
        .collect()
}

/// The reference model of one deletion state.
struct Model {
    md: Position,
    /// Individually deleted entries, all above `md`.
    deleted: BTreeSet<Position>,
    resets: u64,
    /// Bitmaps created (the spec's `nextId` moves): an entry acknowledged
    /// in a ledger with no individually deleted entry.
    new_bitmaps: usize,
}

impl Model {
    fn new(md: Position, deleted: &BTreeSet<Position>) -> Self {
        Self {
            md,
            deleted: deleted.iter().copied().filter(|e| *e > md).collect(),
            resets: 0,
            new_bitmaps: 0,
        }
    }

    fn is_deleted(&self, q: Position) -> bool {
        q <= self.md || self.deleted.contains(&q)
    }

    /// The first entry after `q`.
    fn next_member(q: Position) -> Option<Position> {
        members().into_iter().find(|m| *m > q)
    }

    /// The mark-delete moves through the deleted entries right after it.
    fn extend(&mut self) {
        while let Some(n) = Self::next_member(self.md).filter(|n| self.deleted.contains(n)) {
            self.md = n;
            self.deleted.remove(&n);
        }
    }

    fn move_to(&mut self, md: Position) {
        self.md = md;
        self.deleted.retain(|e| *e > md);
        self.extend();
    }

    /// `delete(group)`: `Err` = refused; else the newly deleted count.
    fn ack(&mut self, group: &[Position]) -> Result<usize, ()> {
        if group.iter().any(|q| *q > last_confirmed()) {
            return Err(());
        }
        let before = self.md;
        let mut newly = 0;
        for &q in group {
            if q > before && !self.deleted.contains(&q) {
                if !self.deleted.iter().any(|e| e.ledger_id == q.ledger_id) {
                    self.new_bitmaps += 1;
                }
                self.deleted.insert(q);
                newly += 1;
            }
        }
        self.extend();
        Ok(newly)
    }

    fn mark_delete(&mut self, c: Position) -> Result<Position, ()> {
        if c > last_confirmed() || c < self.md {
            return Err(());
        }
        self.move_to(c);
        Ok(self.md)
    }

    fn reset(&mut self, read: Position) -> Result<Position, ()> {
        let requested = read.previous_in_ledger();
        if requested > last_confirmed() {
            return Err(());
        }
        let next = Self::next_member(requested).unwrap_or(last_confirmed().next_in_ledger());
        self.md = next.previous_in_ledger();
        self.deleted.clear();
        self.resets += 1;
        Ok(self.md)
    }
}

/// What the cases exercised (printed, and each required at least once).
#[derive(Default, Debug)]
struct Coverage {
    /// Acks of an entry that is not the one right after the mark-delete.
    out_of_order_acks: usize,
    /// Acks that moved the mark-delete.
    advancing_acks: usize,
    /// Acks of entries already deleted or at or below the mark-delete.
    already_deleted: usize,
    /// Explicit mark-deletes that moved the mark-delete.
    mark_deletes: usize,
    /// ... that went on through a deleted run after their position.
    mark_deletes_through_runs: usize,
    backward_resets: usize,
    forward_resets: usize,
    /// Hint answers "deleted" for an entry above the mark-delete (from a
    /// bitmap).
    hint_bitmap_positives: usize,
    hint_negatives: usize,
    /// Lookups while more ledgers than the summary slots hold individually
    /// deleted entries.
    hints_beyond_slots: usize,
    /// Refused operations.
    refused: usize,
    /// States recovered with individual deleted ranges.
    recovered_with_ranges: usize,
    restarts: usize,
}

/// Keeps the first disagreement of a case.
fn note(first: &mut Option<String>, i: usize, op: &Op, e: String) {
    if first.is_none() {
        *first = Some(format!("step {i} ({op:?}): {e}"));
    }
}

fn check(first: &mut Option<String>, i: usize, op: &Op, ok: bool, what: &dyn Fn() -> String) {
    if !ok {
        note(first, i, op, what());
    }
}

/// Runs one case; every deletion state's lines are pushed to `runs` (a
/// restart starts the next run). Returns the first disagreement with the
/// model, after the case ran to its end.
fn run_case(
    start: &Start,
    ops: &[Op],
    runs: &mut Vec<Vec<String>>,
    cov: &mut Coverage,
) -> Option<String> {
    let ledger = layout();
    trace::start();
    let (mut state, mut m) = match start {
        Start::New => (
            CursorDeletionState::new(p(1, -1)).unwrap(),
            Model::new(p(1, -1), &BTreeSet::new()),
        ),
        Start::Recover(md, set) => (
            CursorDeletionState::recover(*md, &deleted_ranges(set)).unwrap(),
            Model::new(*md, set),
        ),
    };
    cov.recovered_with_ranges += usize::from(!m.deleted.is_empty());
    let mut restarts = 0;
    let mut first: Option<String> = None;
    for (i, op) in ops.iter().enumerate() {
        match op {
            Op::Ack(group) => {
                let md = m.md;
                let next = Model::next_member(md);
                for q in group {
                    if m.is_deleted(*q) {
                        cov.already_deleted += 1;
                    } else if Some(*q) != next && *q <= last_confirmed() {
                        cov.out_of_order_acks += 1;
                    }
                }
                let want = m.ack(group);
                let got = state.delete(group, &ledger);
                match (&got, want) {
                    (Ok(o), Ok(newly)) => {
                        cov.advancing_acks += usize::from(o.mark_delete_advanced);
                        check(
                            &mut first,
                            i,
                            op,
                            o.newly_deleted == newly
                                && o.already_deleted == group.len() - newly
                                && o.mark_delete == m.md
                                && o.mark_delete_advanced == (m.md > md),
                            &|| {
                                format!(
                                    "outcome {o:?}, model: {newly} newly deleted, mark-delete {}",
                                    m.md
                                )
                            },
                        );
                    }
                    (Err(DeletionError::BeyondLastConfirmed { .. }), Err(())) => cov.refused += 1,
                    _ => note(
                        &mut first,
                        i,
                        op,
                        format!("got {got:?}, model refuses: {}", want.is_err()),
                    ),
                }
            }
            Op::MarkDelete(c) => {
                let md = m.md;
                let want = m.mark_delete(*c);
                let got = state.mark_delete(*c, &ledger);
                match (&got, want) {
                    (Ok(g), Ok(w)) => {
                        cov.mark_deletes += usize::from(w > md);
                        cov.mark_deletes_through_runs += usize::from(w > *c);
                        check(&mut first, i, op, *g == w, &|| {
                            format!("mark-delete {g}, model {w}")
                        });
                    }
                    (
                        Err(
                            DeletionError::BeyondLastConfirmed { .. }
                            | DeletionError::MarkDeleteBackward { .. },
                        ),
                        Err(()),
                    ) => cov.refused += 1,
                    _ => note(&mut first, i, op, format!("got {got:?}, model {want:?}")),
                }
            }
            Op::Reset(read) => {
                if m.resets == MAX_RESETS {
                    continue;
                }
                let md = m.md;
                let want = m.reset(*read);
                let got = state.reset(*read, &ledger);
                match (&got, want) {
                    (Ok(g), Ok(w)) => {
                        cov.backward_resets += usize::from(w < md);
                        cov.forward_resets += usize::from(w > md);
                        check(&mut first, i, op, *g == w, &|| {
                            format!("reset to {g}, model {w}")
                        });
                    }
                    (Err(DeletionError::ResetBeyondEnd { .. }), Err(())) => {
                        cov.refused += 1;
                    }
                    _ => note(&mut first, i, op, format!("got {got:?}, model {want:?}")),
                }
            }
            Op::Hint(q) => {
                let r = state.read_scheduling_lookup(q.ledger_id, q.entry_id);
                let want = m.is_deleted(*q);
                if r.deleted && !want {
                    note(
                        &mut first,
                        i,
                        op,
                        format!("stale positive: {q} is not deleted ({r:?})"),
                    );
                } else if !r.deleted && want {
                    note(
                        &mut first,
                        i,
                        op,
                        format!("stale negative with no concurrent writer: {q} ({r:?})"),
                    );
                }
                check(
                    &mut first,
                    i,
                    op,
                    !r.fell_back && r.epoch == 2 * m.resets && r.mark_delete_seen == Some(m.md),
                    &|| {
                        format!(
                            "lookup {r:?}, model mark-delete {}, epoch {}",
                            m.md,
                            2 * m.resets
                        )
                    },
                );
                if r.deleted && *q > m.md {
                    cov.hint_bitmap_positives += 1;
                }
                cov.hint_negatives += usize::from(!r.deleted);
                let ledgers: BTreeSet<i64> = m.deleted.iter().map(|e| e.ledger_id).collect();
                cov.hints_beyond_slots += usize::from(ledgers.len() > SUMMARY_SLOTS);
            }
            Op::Restart(compacted) => {
                if restarts == MAX_RESTARTS {
                    continue;
                }
                restarts += 1;
                cov.restarts += 1;
                runs.push(trace::finish());
                trace::start();
                state = if *compacted {
                    let chunks = compact::encode(&state.snapshot(), 16);
                    CursorDeletionState::from_snapshot(compact::decode(&chunks).unwrap()).unwrap()
                } else {
                    CursorDeletionState::recover(
                        state.mark_delete_position(),
                        &state.individually_deleted_ranges(),
                    )
                    .unwrap()
                };
                let deleted = m.deleted.clone();
                m = Model::new(m.md, &deleted);
                cov.recovered_with_ranges += usize::from(!m.deleted.is_empty());
            }
        }
        // The whole state against the model (no trace lines: locked reads).
        let md = state.mark_delete_position();
        check(&mut first, i, op, md == m.md, &|| {
            format!("mark-delete {md}, model {}", m.md)
        });
        let ranges = state.individually_deleted_ranges();
        check(
            &mut first,
            i,
            op,
            entries_of(&ranges) == m.deleted
                && state.individually_deleted_count() == m.deleted.len() as u64,
            &|| {
                format!(
                    "individual deleted ranges {ranges:?}, model {:?}",
                    m.deleted
                )
            },
        );
        let epoch = state.reset_epoch();
        check(&mut first, i, op, epoch == 2 * m.resets, &|| {
            format!("reset epoch {epoch}, model resets {}", m.resets)
        });
        for q in positions() {
            let got = state.is_message_deleted(q);
            check(&mut first, i, op, got == m.is_deleted(q), &|| {
                format!("is_message_deleted({q}) = {got}, model {}", !got)
            });
        }
        let kept = state.filter_read_entries(members(), |q| *q);
        let want: Vec<Position> = members()
            .into_iter()
            .filter(|q| !m.is_deleted(*q))
            .collect();
        check(&mut first, i, op, kept == want, &|| {
            format!("filter_read_entries kept {kept:?}, model {want:?}")
        });
        assert!(
            m.new_bitmaps <= MAX_NEW_BITMAPS,
            "a run creates more bitmaps than the trace cfg's MaxIds allows: shorten the cases"
        );
    }
    runs.push(trace::finish());
    first
}

#[test]
fn record_deletion_lookup_model_traces() {
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &SEED),
    );
    let strategy = case();
    let mut runs: Vec<Vec<String>> = Vec::new();
    let mut cov = Coverage::default();
    // Every case is recorded, also one that disagrees with the model: TLC
    // judges its lines first; the disagreements fail the test after the
    // file is written.
    let mut disagreements = Vec::new();
    for case in 0..RUNS {
        let (start, ops) = strategy.new_tree(&mut runner).unwrap().current();
        if let Some(e) = run_case(&start, &ops, &mut runs, &mut cov) {
            disagreements.push(format!(
                "case {case}: {e}; start = {start:?}, ops = {ops:?}"
            ));
        }
    }
    let dir = std::env::var("PULSAR_TRACE_DIR").unwrap_or_else(|_| "target/traces".into());
    std::fs::create_dir_all(&dir).unwrap();
    let path = format!("{dir}/DeletionLookupModel.ndjson");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    // The spec's LastEntry: [ledger_id, last entry_id] pairs.
    let layout: Value = LEDGERS.iter().map(|&(l, n)| vec![l, n - 1]).collect();
    let mut steps = 0;
    for (k, lines) in runs.iter().enumerate() {
        assert!(
            lines.first().is_some_and(|l| l.contains("\"Open\"")),
            "run {k} does not start with its Open line"
        );
        for l in lines {
            let v: Value = serde_json::from_str(l).unwrap();
            let mut line = serde_json::Map::new();
            line.insert("t".into(), Value::from(k + 1));
            line.extend(v.as_object().unwrap().clone());
            if steps == 0 {
                line.insert("layout".into(), layout.clone());
            }
            writeln!(out, "{}", Value::Object(line)).unwrap();
            steps += 1;
        }
    }
    out.flush().unwrap();
    assert!(
        disagreements.is_empty(),
        "the deletion state disagreed with the reference model:\n{}",
        disagreements.join("\n")
    );
    let c = &cov;
    for (what, n) in [
        ("out-of-order ack", c.out_of_order_acks),
        ("advancing ack", c.advancing_acks),
        ("ack of a deleted entry", c.already_deleted),
        ("explicit mark-delete", c.mark_deletes),
        (
            "mark-delete through a deleted run",
            c.mark_deletes_through_runs,
        ),
        ("backward reset", c.backward_resets),
        ("forward reset", c.forward_resets),
        ("hint positive from a bitmap", c.hint_bitmap_positives),
        ("hint negative", c.hint_negatives),
        ("lookup beyond the summary slots", c.hints_beyond_slots),
        ("refused operation", c.refused),
        ("state recovered with ranges", c.recovered_with_ranges),
        ("restart", c.restarts),
    ] {
        assert!(n > 0, "no {what} recorded");
    }
    eprintln!(
        "recorded {} traces ({RUNS} cases), {steps} steps: {path} ({cov:?})",
        runs.len()
    );
}
