//! Trace recording for trace validation (cargo feature `trace`).
//!
//! Every hook is called from the components as one line
//! (`crate::trace::deletion::advance(self.trace_id, md)`) whose no-op twin
//! (`src/trace_nop.rs`, every build without the feature: the default one,
//! `cargo bench`, an embedder's `default-features = false`) is an empty
//! inline function taking the same arguments, so the call compiles to
//! nothing (the layout of etcd-io/raft's `state_trace.go` /
//! `state_trace_nop.go`). A hook whose line needs more than a few loads
//! (a range list, a read position behind a lock, a tracker's state) takes
//! the component's own references and computes the line itself.
//!
//! Trace validation checks the implementation's own executions against the
//! TLA+ specs in `specs/`, in the style of etcd-io/raft's `tla/` folder and
//! of CCF's "smart casual verification": each hook is named after the spec
//! action it records and is called at the point of the code where that
//! action takes effect (for a lock-free reader: right after the atomic load
//! or store the action stands for, with no synchronisation operation in
//! between, so the global order of the lines is the order of the actions).
//! A line is one JSON object `{"action": NAME, ...}` holding the spec
//! variables (or the action's arguments) the action observes or sets.
//! `specs/Trace<Spec>.tla` replays a recorded file (TLC's `ndJsonDeserialize`)
//! and constrains the spec to follow it; a line the spec cannot follow is a
//! violation naming that line.
//!
//! Recording is off until [`start`] is called and after [`finish`]; while
//! off a hook costs one uncontended lock. The log is a `std::sync::Mutex`
//! on purpose, NOT the `crate::sync` facade: under shuttle or loom a
//! facade lock would be a scheduling point and change the schedules being
//! recorded. Recording is process-global: record one execution at a time.
//!
//! Recorders run under shuttle, not loom: the order of the lines is taken
//! as the order of the actions, which holds in shuttle's sequentially
//! consistent schedules but not in loom's weak-memory executions, where a
//! load may return a value older than a store already recorded (e.g. the
//! lookup's `Relaxed` epoch re-check returning the pre-reset epoch: a
//! correct execution that is not in recording order). Validating loom
//! executions would need a trace spec that searches the interleavings
//! allowed by each thread's program order and the values it read; the loom
//! layer checks the same code with assertions (`tests/scenarios/cursor.rs`).
//!
//! | spec                  | hooks                                 | recorded by |
//! |-----------------------|---------------------------------------|-------------|
//! | `DeletionLookup`      | [`deletion`] (src/deletion)             | `tests/trace_deletion.rs` (shuttle random schedules; PCT schedules of a mark-delete crossing the ledger boundary); `tests/trace_deletion_model.rs` (proptest cases from a fixed seed, each checked against a `BTreeSet` reference model while recorded: acks in and out of order, explicit mark-deletes, resets, restarts); `pulsar-core simulate --trace-dir` (`crate::sim::sim_trace`: one run per deletion state, with its cursor's `Persist` lines; a state recovered after a restart names its cursor's previous run) |
//! | `LedgerCursor`        | [`ledger_cursor`] (src/ledger)        | `tests/trace_ledger_cursor.rs` (the cases of the proptest model test `tests/ledger_cursor_model.rs`, fixed seed, each checked against the reference model while recorded); `pulsar-core simulate --trace-dir` (`crate::sim::sim_trace`: one run per cursor) |
//! | `PendingAckReplay`    | [`pending_ack`] (src/pending_ack)     | `tests/trace_pending_ack.rs` (handle runs: manual executor, virtual timer, inline reads, injected read failures); `tests/trace_pending_ack_threads.rs` (the same runs under shuttle schedules: executor thread, reader thread, timer); `pulsar-core simulate --trace-dir` (`crate::sim::sim_trace`) |
//! | `PermitConservation`  | [`permits`] (src/permits)             | `tests/trace_permits.rs`; `pulsar-core simulate --trace-dir` (`crate::sim::sim_trace`, feature `sim`) |
//! | `BucketMerge`         | [`bucket_merge`] (src/delayed)        | `tests/trace_bucket_merge.rs` (proptest cases from a fixed seed, each checked against a reference model: add, tick, deliver, ack, trim + merge, restart + re-read); `pulsar-core simulate --trace-dir` (`crate::sim::sim_trace`: one run per subscription, across its trackers) |
//!
//! A hook line names its component instance where the simulator drives
//! many and must split the lines into runs: the `deletion` lines carry
//! their deletion state's `ds` (its `Persist` lines, recorded by the
//! cursor's store writes, the managed ledger's `ml` and the cursor's `cur`
//! instead, joined to a state by the simulator's `Cursor` line), the
//! `permits` lines the
//! consumer's `[connection_id, consumer_id]`, the `pending_ack` lines the
//! handle's name (`h`), the `ledger_cursor` lines the managed ledger's
//! (`ml`) and the cursor's (`cur`), the `bucket_merge` lines their
//! tracker's id (`st.trk`, joined to a subscription by the simulator's
//! `Tracker` line).
//!
//! `bash .ci/trace [SPEC...]` records and validates; the negative controls
//! are the mutants with a `# trace:` line (`tests/mutants/README.md`).

use std::sync::Mutex;

static LOG: Mutex<Option<Vec<String>>> = Mutex::new(None);

fn log() -> std::sync::MutexGuard<'static, Option<Vec<String>>> {
    LOG.lock().unwrap_or_else(|e| e.into_inner())
}

/// Starts recording (discarding anything recorded before).
pub fn start() {
    *log() = Some(Vec::new());
}

/// Stops recording and returns the recorded ndjson lines, in order.
pub fn finish() -> Vec<String> {
    log().take().unwrap_or_default()
}

/// Appends one line `{"action": action, ..fields}` if recording.
pub(crate) fn record(action: &'static str, fields: serde_json::Value) {
    let mut g = log();
    if let Some(lines) = g.as_mut() {
        let mut obj = serde_json::Map::new();
        obj.insert("action".into(), action.into());
        if let serde_json::Value::Object(m) = fields {
            obj.extend(m);
        }
        lines.push(serde_json::Value::Object(obj).to_string());
    }
}

/// Hooks of `specs/DeletionLookup.tla` (src/deletion): every line names its
/// cursor deletion state (`ds`, from [`next_id`](deletion::next_id), so the
/// simulator's lines split into one run per state); positions are
/// `[ledger_id, entry_id]`, epochs the reset epoch as read or written.
pub mod deletion {
    use super::record;
    use crate::position::Position;
    use serde_json::json;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Ids of deletion states (trace-only; a std atomic on purpose, like
    /// the log: under shuttle a facade atomic would be a scheduling point).
    static NEXT_ID: AtomicU64 = AtomicU64::new(1);

    /// A deletion state's id in its lines (`ds`; a zero-sized type in the
    /// no-op twin).
    pub type Id = u64;

    /// A fresh id for a deletion state's lines. Relaxed: only uniqueness
    /// matters.
    pub fn next_id() -> Id {
        NEXT_ID.fetch_add(1, Ordering::Relaxed)
    }

    fn pos(p: Position) -> serde_json::Value {
        json!([p.ledger_id, p.entry_id])
    }

    /// The state as created (new, recovered or from a snapshot): its
    /// mark-delete and individually deleted ranges `(lower, upper]`; the
    /// trace's initial state. (`restore` refills the ranges inside its
    /// reset bracket without `Ack` lines: the spec's reset only clears, so
    /// no recorder calls it.)
    ///
    /// Gives the state a fresh id ([`next_id`]), also the id of its set's
    /// `Ack` lines, and returns it.
    pub(crate) fn open(md: Position, set: &mut crate::deletion::PositionRangeSet) -> Id {
        let ds = next_id();
        set.trace_id = ds;
        let ranges: Vec<_> = set
            .ranges()
            .iter()
            .map(|(a, b)| json!([pos(*a), pos(*b)]))
            .collect();
        record("Open", json!({ "ds": ds, "md": pos(md), "ranges": ranges }));
        ds
    }
    /// Not a spec action: deletion state `ds` is cursor `cur` of managed
    /// ledger `ml`'s (recorded where the state is created from the cursor's
    /// store record; `crate::sim::sim_trace` joins a cursor's states across
    /// restarts by it and files the cursor's [`persist`] lines in the run
    /// of its current state).
    pub fn cursor(state: &crate::deletion::CursorDeletionState, ml: &str, cur: &str) {
        let ds = state.trace_id();
        record("Cursor", json!({ "ds": ds, "ml": ml, "cur": cur }));
    }
    /// `Persist` (the observation of `RecoveredAsPersisted`): cursor `cur`
    /// of managed ledger `ml` committed its cursor info to the store:
    /// mark-delete `md` and the individually deleted ranges `(lower,
    /// upper]` (Pulsar's `ManagedCursorImpl` persisting `markDeletePosition`
    /// and `individualDeletedMessages`), recorded after the store write
    /// returned. What a cursor recovered after a restart must hold is the
    /// last such line before it (a cursor's lines carry no `ds`: the store
    /// write does not know the deletion state it came from).
    pub fn persist(
        ml: &str,
        cur: &str,
        md: Position,
        ranges: impl IntoIterator<Item = (Position, Position)>,
    ) {
        let ranges: Vec<_> = ranges
            .into_iter()
            .map(|(a, b)| json!([pos(a), pos(b)]))
            .collect();
        record(
            "Persist",
            json!({ "ml": ml, "cur": cur, "md": pos(md), "ranges": ranges }),
        );
    }
    /// `Ack(p)`: entry `p` entered its ledger's live bitmap (called under
    /// the bitmap's write lock, so no reader sees the bit before the line).
    pub fn ack(ds: Id, ledger_id: i64, entry: u32) {
        record("Ack", json!({ "ds": ds, "p": [ledger_id, entry] }));
    }
    /// `MarkDelete(t, _)` (the line's `c` is the spec's `t`): an explicit mark-delete to `c` while the
    /// mark-delete is `md` (under the write lock, before the `Advance` it
    /// causes); recorded only when `c` is past `md` (otherwise the advance,
    /// if any, is an ordinary `Advance` from `md`).
    pub fn mark_delete(ds: Id, c: Position, md: Position) {
        if c > md {
            record("MarkDelete", json!({ "ds": ds, "c": pos(c) }));
        }
    }
    /// `Advance(c)` (or the `MarkDelete` just recorded): mark-delete
    /// published at `md` (forward).
    pub fn advance(ds: Id, md: Position) {
        record("Advance", json!({ "ds": ds, "md": pos(md) }));
    }
    /// `ResetBegin`: the reset epoch became odd (`epoch`).
    pub fn reset_begin(ds: Id, epoch: u64) {
        record("ResetBegin", json!({ "ds": ds, "epoch": epoch }));
    }
    /// `ResetInvalidate`: the empty directory was published.
    pub fn reset_invalidate(ds: Id) {
        record("ResetInvalidate", json!({ "ds": ds }));
    }
    /// `ResetMarkDelete(t)`: mark-delete published at `md` (any direction).
    pub fn reset_mark_delete(ds: Id, md: Position) {
        record("ResetMarkDelete", json!({ "ds": ds, "md": pos(md) }));
    }
    /// `ResetClear`: the map is cleared.
    pub fn reset_clear(ds: Id) {
        record("ResetClear", json!({ "ds": ds }));
    }
    /// `ResetEnd`: the reset epoch became even again (`epoch`).
    pub fn reset_end(ds: Id, epoch: u64) {
        record("ResetEnd", json!({ "ds": ds, "epoch": epoch }));
    }
    /// `RStart(q)`: a lookup of `q` read the reset epoch `e1`.
    pub fn r_start(ds: Id, q: Position, e1: u64) {
        record("RStart", json!({ "ds": ds, "q": pos(q), "e1": e1 }));
    }
    /// `RMarkDelete`: the lookup read the mark-delete snapshot `rmd`.
    pub fn r_mark_delete(ds: Id, rmd: Position) {
        record("RMarkDelete", json!({ "ds": ds, "rmd": pos(rmd) }));
    }
    /// `RDirectory` (+ `RBits`): the lookup computed `ans` from `rmd` and
    /// the ledger's bitmap.
    pub fn r_lookup(ds: Id, ans: bool) {
        record("RLookup", json!({ "ds": ds, "ans": ans }));
    }
    /// `RRecheck`: the epoch re-check sent the lookup to `pc`
    /// (`"done"`: returns its answer, `"locked"`: falls back).
    pub fn r_recheck(ds: Id, pc: &'static str) {
        record("RRecheck", json!({ "ds": ds, "pc": pc }));
    }
    /// `RLocked`: the locked check answered `ans` (under the read lock).
    pub fn r_locked(ds: Id, ans: bool) {
        record("RLocked", json!({ "ds": ds, "ans": ans }));
    }
    /// `RFinish`: the lookup returned.
    pub fn r_finish(ds: Id) {
        record("RFinish", json!({ "ds": ds }));
    }
}

/// Hooks of `specs/LedgerCursor.tla` (src/ledger). Every line names its
/// managed ledger (`ml`), and a cursor's lines its cursor (`cur`), so the
/// simulator's lines split into one run per cursor (with its managed
/// ledger's appends). Positions are recorded as `[ledger_id, entry_id]`;
/// [`to_entry_numbers`](ledger_cursor::to_entry_numbers) flattens one
/// managed ledger's lines to the spec's entry numbers (the spec abstracts
/// ledger rollover away).
pub mod ledger_cursor {
    use super::record;
    use crate::position::Position;
    use serde_json::{json, Value};
    use std::collections::BTreeMap;

    fn pos(p: Position) -> Value {
        json!([p.ledger_id, p.entry_id])
    }

    /// The actions of these hooks' lines (the `deletion` hooks' `Persist`
    /// and `Cursor` lines also name a managed ledger and a cursor).
    pub const ACTIONS: [&str; 9] = [
        "AppendEntry",
        "Open",
        "Recover",
        "Read",
        "ReadRun",
        "SkipTo",
        "MarkDelete",
        "Rewind",
        "Reset",
    ];

    fn cursor_line(action: &'static str, ml: &str, cur: &str, mut fields: Value) {
        fields["ml"] = ml.into();
        fields["cur"] = cur.into();
        record(action, fields);
    }

    /// `AppendEntry`: entry `p` of managed ledger `ml` is confirmed (under
    /// the ledger lock).
    pub fn append_entry(ml: &str, p: Position) {
        record("AppendEntry", json!({ "ml": ml, "p": pos(p) }));
    }
    /// [`append_entry`] for each of `entries`, in order (one append call).
    pub fn append_entries(ml: &str, entries: &[Position]) {
        entries.iter().for_each(|p| append_entry(ml, *p));
    }
    /// A cursor opened on managed ledger `ml`: [`recover`] if its record
    /// was `recovered` from the store, else [`open`] and the `Persist` line
    /// of the new cursor's record ([`super::deletion::persist`]).
    pub fn opened(ml: &str, cur: &str, recovered: bool, md: Position, read: Position) {
        if recovered {
            recover(ml, cur, md, read);
        } else {
            open(ml, cur, md, read);
            // The new cursor's record, saved before.
            super::deletion::persist(ml, cur, md, []);
        }
    }
    /// `Open` (not a spec action): a new cursor starts at mark-delete `md`,
    /// read position `read`; the trace spec checks it is its `Init`.
    pub fn open(ml: &str, cur: &str, md: Position, read: Position) {
        cursor_line("Open", ml, cur, json!({ "md": pos(md), "read": pos(read) }));
    }
    /// `Recover`: a cursor was reopened from the store with mark-delete
    /// `md`; its read position is `read`.
    pub fn recover(ml: &str, cur: &str, md: Position, read: Position) {
        cursor_line(
            "Recover",
            ml,
            cur,
            json!({ "md": pos(md), "read": pos(read) }),
        );
    }
    /// `Read(k)`: a read of at most `k` entries returned some; the read
    /// position is now `read`.
    pub fn read(ml: &str, cur: &str, k: usize, read: Position) {
        cursor_line("Read", ml, cur, json!({ "k": k, "read": pos(read) }));
    }
    /// `ReadRun(first, last)`: a read with skip returned the entries
    /// `first..=last` (one ledger); the read position is now `read`.
    pub fn read_run(ml: &str, cur: &str, first: Position, last: Position, read: Position) {
        cursor_line(
            "ReadRun",
            ml,
            cur,
            json!({ "first": pos(first), "last": pos(last), "read": pos(read) }),
        );
    }
    /// The steps of one read that may skip lost ledgers (auto-skip on), in
    /// order: a lost ledger skipped (`(last entry, None)`) or a run of
    /// entries returned (`(first, Some(last))`). [`ReadSteps::record`]
    /// writes them as the spec's steps.
    #[derive(Debug, Default)]
    pub struct ReadSteps(Vec<(Position, Option<Position>)>);

    impl ReadSteps {
        /// No step yet.
        pub fn new() -> Self {
            Self::default()
        }
        /// The lost ledger ending at `last` was skipped.
        pub fn skipped(&mut self, last: Position) {
            self.0.push((last, None));
        }
        /// The entries `first..=last` (one ledger) were returned.
        pub fn returned(&mut self, first: Position, last: Position) {
            self.0.push((first, Some(last)));
        }
        /// Records the read of at most `max_entries` by cursor `cur` of
        /// `ml`: one `Read` line if no lost ledger was `skipped` (and some
        /// entry was `returned`), else `SkipTo` past each lost ledger and
        /// `ReadRun` per run, each with the read position after it
        /// (`next_valid`: the managed ledger's next valid position).
        pub fn record(
            mut self,
            ml: &str,
            cur: &str,
            max_entries: usize,
            (skipped, returned): (bool, bool),
            read_position: Position,
            next_valid: impl Fn(Position) -> Position,
        ) {
            if !skipped {
                if returned {
                    read(ml, cur, max_entries, read_position);
                }
                return;
            }
            // The read position moved past the last entry returned, not past
            // a lost ledger skipped after it: those skips are not taken.
            if returned {
                let last_run = self.0.iter().rposition(|(_, end)| end.is_some());
                self.0.truncate(last_run.map_or(0, |i| i + 1));
            }
            for (at, run_end) in self.0 {
                let after = next_valid(run_end.unwrap_or(at));
                match run_end {
                    None => skip_to(ml, cur, after),
                    Some(end) => read_run(ml, cur, at, end, after),
                }
            }
        }
    }
    /// `SkipTo(r)`: a read with skip passed over entries declared deleted
    /// (or a lost ledger, with auto-skip on) without returning any; the
    /// read position is now `read`.
    pub fn skip_to(ml: &str, cur: &str, read: Position) {
        cursor_line("SkipTo", ml, cur, json!({ "read": pos(read) }));
    }
    /// A read found nothing past the last confirmed entry and moved the
    /// read position from `from` to `read`: [`skip_to`] if it moved.
    pub fn skip_to_end(ml: &str, cur: &str, from: Position, read: Position) {
        if from != read {
            skip_to(ml, cur, read);
        }
    }
    /// `MarkDelete(p)`: mark-delete persisted at `md`; read position `read`.
    pub fn mark_delete(ml: &str, cur: &str, md: Position, read: Position) {
        cursor_line(
            "MarkDelete",
            ml,
            cur,
            json!({ "md": pos(md), "read": pos(read) }),
        );
    }
    /// `Rewind`: the read position moved to `read`.
    pub fn rewind(ml: &str, cur: &str, read: Position) {
        cursor_line("Rewind", ml, cur, json!({ "read": pos(read) }));
    }
    /// `Reset(r)`: a seek persisted mark-delete `md` and moved the read
    /// position to `read`.
    pub fn reset(ml: &str, cur: &str, md: Position, read: Position) {
        cursor_line(
            "Reset",
            ml,
            cur,
            json!({ "md": pos(md), "read": pos(read) }),
        );
    }

    /// The position fields of the hook lines.
    const POSITIONS: [&str; 5] = ["p", "md", "read", "first", "last"];

    /// Replaces the positions of `lines` (one managed ledger's, in
    /// recording order, its `AppendEntry` lines included) by the spec's
    /// entry numbers: entries numbered in append order from 0, `(L, e)` is
    /// the number of ledger L's first entry plus `e` (so `(L, -1)` is the
    /// entry before it, and a position past a ledger's last entry is the
    /// next ledger's first). Returns the number of entries appended.
    pub fn to_entry_numbers(lines: &mut [Value]) -> usize {
        let mut per_ledger: BTreeMap<i64, i64> = BTreeMap::new();
        for v in lines.iter().filter(|v| v["action"] == "AppendEntry") {
            if let Some(l) = v["p"][0].as_i64() {
                *per_ledger.entry(l).or_default() += 1;
            }
        }
        let flat = |p: &Value| -> Option<Value> {
            let (l, e) = (p[0].as_i64()?, p[1].as_i64()?);
            let offset: i64 = per_ledger.range(..l).map(|(_, n)| n).sum();
            Some(Value::from(offset + e))
        };
        for v in lines.iter_mut() {
            for key in POSITIONS {
                if let Some(n) = v.get(key).and_then(flat) {
                    v[key] = n;
                }
            }
        }
        per_ledger.values().sum::<i64>() as usize
    }
}

/// Hooks of `specs/PendingAckReplay.tla` (src/pending_ack): one line per
/// spec action, at the code point where it takes effect. Read positions are
/// recorded as `[ledger_id, entry_id]`; the recorder maps them to the spec's
/// entry numbers `1..N+1` (the log's entries in order; N+1 past the end).
pub mod pending_ack {
    use crate::ledger::ManagedCursor;
    use crate::position::Position;
    use serde_json::json;

    fn pos(p: Position) -> serde_json::Value {
        json!([p.ledger_id, p.entry_id])
    }

    /// The spec actions these hooks record (the other hook lines of this
    /// module, `Init` and `PartialLoss`, are the environment's).
    pub const ACTIONS: [&str; 15] = [
        "HStart",
        "RLoop",
        "FqRoom",
        "FqCount",
        "FqFlag",
        "FqIssue",
        "FqRet",
        "Poll",
        "REnd",
        "EnvTake",
        "ReadOk",
        "ReadFail",
        "EnvFinish",
        "HDone",
        "HTimer",
    ];

    /// Records `action` with `fields` and `"h"`: the handle's name. `h` is
    /// the handle's name, or a replay attempt's (`handle#generation`, whose
    /// `#digits` suffix is removed). A handle whose own name ends in
    /// `#digits` would be split the same way; the simulator's and the
    /// tests' names never do.
    fn record(action: &'static str, h: &str, fields: serde_json::Value) {
        let handle = match h.rsplit_once('#') {
            Some((name, gen)) if !gen.is_empty() && gen.bytes().all(|b| b.is_ascii_digit()) => name,
            _ => h,
        };
        let mut fields = fields;
        fields["h"] = handle.into();
        super::record(action, fields);
    }

    /// Entry number of the position `p` (`[ledger_id, entry_id]`) in the
    /// spec's terms: 1 + the entries of `log` (in order) before it, so the
    /// log's entries are 1..=N and N+1 is past the end.
    pub fn entry_number(log: &[Position], p: &serde_json::Value) -> usize {
        let p = Position::new(
            p[0].as_i64().unwrap_or(i64::MIN),
            p[1].as_i64().unwrap_or(i64::MIN),
        );
        1 + log.iter().filter(|q| **q < p).count()
    }

    /// Rewrites a hook line's positions (`rp`, `entry`) as entry numbers
    /// ([`entry_number`]); an empty poll (`entry: null`) becomes 0.
    pub fn to_entry_numbers(line: &mut serde_json::Value, log: &[Position]) {
        for key in ["rp", "entry"] {
            match line.get(key).cloned() {
                Some(serde_json::Value::Null) => line[key] = 0.into(),
                Some(p) => line[key] = entry_number(log, &p).into(),
                None => {}
            }
        }
    }

    /// `Init` (the environment's initial choice, written by the simulator
    /// when it creates handle `h`, before `init()`): the pending-ack log's
    /// entries after the cursor's mark-delete (`log`, in order), the
    /// cursor's read position `rp`, whether a ledger of the log is lost and
    /// whether auto-skip is on.
    pub fn init(h: &str, log: &[Position], rp: Position, lost: bool, auto_skip: bool) {
        let log: Vec<_> = log.iter().map(|p| pos(*p)).collect();
        record(
            "Init",
            h,
            json!({ "log": log, "rp": pos(rp), "lost": lost, "autoSkip": auto_skip }),
        );
    }

    /// [`init`] of a handle the broker core opened (`crate::broker`'s
    /// transaction wiring, before the handle's `init()`), from the
    /// components themselves: the log is the entries of `ledger` after
    /// `cursor`'s mark-delete, `rp` its read position; the line also holds
    /// the replay's read batch and queue capacity (`b`, `cap`: the trace
    /// cfg's B and Cap, which `crate::sim::sim_trace` names in the file).
    /// `lost` is false: the core's store loses no ledger of a log.
    pub fn opened(
        h: &str,
        ledger: &crate::ledger::ManagedLedger,
        cursor: &ManagedCursor,
        replay: &crate::pending_ack::ReplayConfig,
        auto_skip: bool,
    ) {
        let md = cursor.mark_delete_position();
        let log: Vec<_> = ledger
            .ledgers()
            .into_iter()
            .flat_map(|(id, entries)| (0..entries).map(move |e| Position::new(id, e)))
            .filter(|p| *p > md)
            .map(pos)
            .collect();
        record(
            "Init",
            h,
            json!({ "log": log, "rp": pos(cursor.read_position()), "lost": false,
                    "autoSkip": auto_skip, "b": replay.read_batch, "cap": replay.queue_capacity }),
        );
    }

    /// Not a spec action: the log of handle `h` (after its `init` line) has
    /// some but not all ledgers lost, which the spec does not model (its
    /// `lost` is the whole log); the simulator's trace writer drops the run.
    pub fn partial_loss(h: &str) {
        record("PartialLoss", h, json!({}));
    }
    /// `HStart`: an attempt started and rewound `cursor` (its read
    /// position is the line's `rp`).
    pub fn h_start(h: &str, cursor: &ManagedCursor) {
        let rp = cursor.read_position();
        record("HStart", h, json!({ "rp": pos(rp) }));
    }
    /// `RLoop`: the loop head went to `"end"` (interrupted or caught up)
    /// or `"fq_room"` (fill the queue).
    pub fn r_loop(h: &str, to: &'static str) {
        record("RLoop", h, json!({ "to": to }));
    }
    /// `FqRoom`: `queued` entries were queued; `room` for another batch.
    pub fn fq_room(h: &str, queued: usize, room: bool) {
        record("FqRoom", h, json!({ "queued": queued, "room": room }));
    }
    /// `FqCount` (R1): the outstanding-read counter loaded as `outstanding`.
    pub fn fq_count(h: &str, outstanding: usize) {
        record("FqCount", h, json!({ "outstanding": outstanding }));
    }
    /// `FqFlag` (R2): `is_readable` loaded as `readable`.
    pub fn fq_flag(h: &str, readable: bool) {
        record("FqFlag", h, json!({ "readable": readable }));
    }
    /// `FqIssue`: a read was issued (`issued`), or the cursor had no more
    /// entries (and `is_readable` was cleared if the queue was empty).
    pub fn fq_issue(h: &str, issued: bool) {
        record("FqIssue", h, json!({ "issued": issued }));
    }
    /// [`fq_issue`] with no read issued, if the cursor had no `more`
    /// entries (nothing otherwise).
    pub fn fq_no_more(h: &str, more: bool) {
        if !more {
            fq_issue(h, false);
        }
    }
    /// `FqRet`: `fill_queue` returned `readable`.
    pub fn fq_ret(h: &str, readable: bool) {
        record("FqRet", h, json!({ "readable": readable }));
    }
    /// `Poll`: the queue's head `entry` was applied (`None`: queue empty).
    pub fn poll(h: &str, entry: Option<Position>) {
        record("Poll", h, json!({ "entry": entry.map(pos) }));
    }
    /// `REnd`: the attempt ended `outcome` (`"complete"` / `"failed"`),
    /// leaving `cursor`'s read position at the line's `rp`.
    pub fn r_end(h: &str, outcome: &'static str, cursor: &ManagedCursor) {
        let rp = cursor.read_position();
        record("REnd", h, json!({ "outcome": outcome, "rp": pos(rp) }));
    }
    /// `EnvTake`: an issued read is performed (its job runs).
    pub fn env_take(h: &str) {
        record("EnvTake", h, json!({}));
    }
    /// `ReadOk`: the read moved `cursor` (its read position is the line's
    /// `rp`) and `queued` entries are queued now (nothing enqueued if the
    /// attempt had stopped).
    pub fn read_ok(h: &str, cursor: &ManagedCursor, queued: usize) {
        let rp = cursor.read_position();
        record("ReadOk", h, json!({ "rp": pos(rp), "queued": queued }));
    }
    /// `ReadFail(k)` (W1): the read failed with `error`, classified and
    /// stored; `k` is the spec's kind: `"nonrec"` (non-recoverable data),
    /// `"completing"` (fenced, cursor closed), `"transient"` (the rest).
    pub fn read_fail(h: &str, error: &crate::ledger::LedgerError) {
        use crate::ledger::LedgerError;
        let k = match error {
            e if e.is_non_recoverable() => "nonrec",
            LedgerError::Fenced { .. } | LedgerError::CursorAlreadyClosed { .. } => "completing",
            _ => "transient",
        };
        record("ReadFail", h, json!({ "k": k }));
    }
    /// `EnvFinish`: the callback's step `w`: `"w2"` (`is_readable`
    /// cleared), `"w3"` (a failure's decrement), `"dec"` (a completion's).
    pub fn env_finish(h: &str, w: &'static str) {
        record("EnvFinish", h, json!({ "w": w }));
    }
    /// `HDone`: the attempt's end reached the handle, now in `state`.
    pub fn h_done(h: &str, state: &'static str) {
        record("HDone", h, json!({ "state": state }));
    }
    /// [`h_done`] if the call is where a replay `attempt_end`ed (nothing
    /// otherwise).
    pub fn h_done_at_end(h: &str, attempt_end: bool, state: &'static str) {
        if attempt_end {
            h_done(h, state);
        }
    }
    /// `HTimer`: the retry timer fired (None -> Initializing).
    pub fn h_timer(h: &str) {
        record("HTimer", h, json!({}));
    }
}

/// Hooks of `specs/PermitConservation.tla` (src/permits): the broker's
/// dispatcher and the client's per-incarnation permit state. Incarnations
/// are the client's serials on the connection (1, 2, ...), as the spec's.
/// Every line carries `c`: `[connection_id, consumer_id]`, the one consumer
/// id on one connection a spec run describes (a recorder driving several
/// consumers, like the simulator, splits its lines into runs by `c`).
pub mod permits {
    use super::record;
    use serde_json::json;

    fn rec(action: &'static str, c: (u64, u64), mut fields: serde_json::Value) {
        fields["c"] = json!([c.0, c.1]);
        record(action, fields);
    }

    /// `BrokerSend(p)`: one command finalised with P = `p` and debited.
    pub fn broker_send(c: (u64, u64), p: u32) {
        rec("BrokerSend", c, json!({ "p": p }));
    }
    /// `BrokerRecv` of a Subscribe: the consumer is registered with 0 permits.
    pub fn broker_recv_subscribe(c: (u64, u64)) {
        rec("BrokerRecv", c, json!({ "f": "sub" }));
    }
    /// `BrokerRecv` of a CloseConsumer: the registered consumer (if any) is
    /// removed.
    pub fn broker_recv_close(c: (u64, u64)) {
        rec("BrokerRecv", c, json!({ "f": "close" }));
    }
    /// `BrokerRecv` of a Flow of `n` permits (credited to the consumer
    /// registered now, if any).
    pub fn broker_recv_flow(c: (u64, u64), n: u32) {
        rec("BrokerRecv", c, json!({ "f": "flow", "n": n }));
    }
    /// `BrokerWriteFailure`: the broker removed the registered consumer on
    /// its own, with no client frame: an asynchronous write failed
    /// (`why` `"write"`) or its connection closed (`"connection"`); its
    /// balance is dropped, nothing is credited back.
    pub fn broker_remove(c: (u64, u64), why: &'static str) {
        rec("BrokerWriteFailure", c, json!({ "why": why }));
    }
    /// `ClientReceive`: a command was settled by the current incarnation
    /// with `d` messages handed off (`stale`: discarded as a replaced
    /// incarnation's, nothing settled).
    pub fn client_receive(c: (u64, u64), d: u32, stale: bool) {
        rec("ClientReceive", c, json!({ "d": d, "stale": stale }));
    }
    /// `AppReturn(i)`: a dequeued message of incarnation `i` (the token's
    /// `state`, if it still has one) returned its permit.
    pub fn app_return(state: Option<&crate::permits::client::ConsumerPermitState>) {
        if let Some(s) = state {
            rec(
                "AppReturn",
                s.trace_key(),
                json!({ "i": s.incarnation().serial }),
            );
        }
    }
    /// `Drain`: the accumulator was swapped to 0 into a Flow request of `n`.
    pub fn drain(c: (u64, u64), n: u32) {
        rec("Drain", c, json!({ "n": n }));
    }
    /// `FlushResidual`: the idle application's residual credit `n` was
    /// swapped to 0 and written as a Flow at once (under the connection lock).
    pub fn flush_residual(c: (u64, u64), n: u32) {
        rec("FlushResidual", c, json!({ "n": n }));
    }
    /// `ConnTaskWrite`: the connection task took a Flow request of `n`
    /// and wrote it (`written`) or dropped it as stale.
    pub fn conn_task_write(c: (u64, u64), n: u32, written: bool) {
        rec("ConnTaskWrite", c, json!({ "n": n, "written": written }));
    }
    /// Not a spec action: consumer `c` is a raw client's (its Flows are not
    /// the PIP-491 client state's, like the node engine's reader of its
    /// transactions' second topic): `crate::sim::sim_trace` does not write
    /// its run.
    pub fn raw_client(c: (u64, u64)) {
        rec("RawClient", c, json!({}));
    }
    /// `Replace`: a new incarnation replaced the current one on the same
    /// connection (CloseConsumer + Subscribe written; old credit abandoned).
    pub fn replace(c: (u64, u64)) {
        rec("Replace", c, json!({}));
    }
}

/// Hooks of `specs/BucketMerge.tla` (src/delayed): one line per spec
/// action, at the point of the tracker (under its lock) where the action
/// takes effect. A position is recorded as its ledger id (the spec has one
/// entry per ledger; `tests/trace_bucket_merge.rs` adds entry 0 of each
/// ledger). Every line carries `st`, the tracker's state after the action
/// mapped to the spec's variables: `clock`, `index` (tracked ledgers),
/// `counter`, `queue` (the shared queue's ledgers, one per entry), `mheap`
/// (the mutable bucket's ledgers) and `buckets` (`[lo, hi, cur]` per
/// in-memory immutable bucket: its range and loaded segment).
pub mod bucket_merge {
    use super::record;
    use crate::delayed::snapshot::CutSegment;
    use crate::delayed::tracker::Inner;
    use crate::delayed::BucketDelayedDeliveryTracker as Tracker;
    use serde_json::{json, Value};

    /// A tracker's id in its lines (`st.trk`; a zero-sized type in the
    /// no-op twin).
    pub type Id = u64;

    /// Each sealed or merged snapshot segment's ledgers, in heap order
    /// (the `segs` of a `Seal` / `Merge` line).
    pub type Segments = Value;

    /// The `segs` of `segments`, taken before the tracker consumes them.
    pub(crate) fn segments(segments: &[CutSegment]) -> Segments {
        let v: Vec<Vec<i64>> = segments
            .iter()
            .map(|s| s.indexes.iter().map(|i| i.ledger_id).collect())
            .collect();
        json!(v)
    }

    /// Ids of trackers (trace-only; `st.trk`). Relaxed: only uniqueness
    /// matters.
    static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

    /// A fresh id for a tracker's lines.
    pub fn next_id() -> Id {
        NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// Not a spec action: the simulator created tracker `trk` for
    /// subscription `sub` (`crate::sim::sim_trace` joins a subscription's
    /// trackers, across restarts, into one run).
    pub fn tracker(trk: u64, sub: &str) {
        record("Tracker", json!({ "trk": trk, "sub": sub }));
    }

    /// [`tracker`] for the broker core's tracker `t` of subscription `sub`
    /// of managed ledger `ml` (the run's key `ml/sub`), with the spec's
    /// view of its clock and segments: `tick` what its cutoff adds to the
    /// clock (0 with `deliver_at_time_strict`), `maxIdx` its indexes per
    /// snapshot segment.
    pub fn tracker_of(t: &Tracker, ml: &str, sub: &str) {
        let c = t.config();
        let tick = if c.deliver_at_time_strict {
            0
        } else {
            c.tick_time_ms
        };
        record(
            "Tracker",
            json!({ "trk": t.trace_id(), "sub": format!("{ml}/{sub}"), "tick": tick,
                    "maxIdx": c.max_indexes_per_bucket_snapshot_segment }),
        );
    }

    /// `Add` (or `ReReadAt(p)` when `p` was added before a restart):
    /// `add_message` of ledger `p` due at `at` ms: tracked in the mutable
    /// bucket or the shared queue (`due` false), or already due and
    /// untracked (`due`).
    pub(crate) fn add(t: &Tracker, inner: &Inner, p: i64, at: i64, due: bool) {
        let st = t.trace_state(inner);
        record("Add", json!({ "p": p, "at": at, "due": due, "st": st }));
    }
    /// `MoveDue`: due mutable-bucket entries moved to the shared queue.
    pub(crate) fn move_due(t: &Tracker, inner: &Inner, moved: bool) {
        if !moved {
            return;
        }
        let st = t.trace_state(inner);
        record("MoveDue", json!({ "st": st }));
    }
    /// `Seal(B)`: the mutable bucket became a persisted bucket whose
    /// snapshot holds `segs` (each segment's ledgers, in heap order; B: the
    /// cuts between them).
    pub(crate) fn seal(t: &Tracker, inner: &Inner, segs: Segments) {
        let st = t.trace_state(inner);
        record("Seal", json!({ "segs": segs, "st": st }));
    }
    /// `SealFail`: the mutable bucket's entries went to the shared queue
    /// unpersisted (snapshot create failed, or its range overlaps a bucket).
    pub(crate) fn seal_fail(t: &Tracker, inner: &Inner) {
        let st = t.trace_state(inner);
        record("SealFail", json!({ "st": st }));
    }
    /// `Pop` / `PopOrphan`: the queue head `p` was popped (`orphan`: below
    /// the mark-delete ledger); `delivered`: returned to the dispatcher.
    pub(crate) fn pop(t: &Tracker, inner: &Inner, p: i64, orphan: bool, delivered: bool) {
        let st = t.trace_state(inner);
        record(
            "Pop",
            json!({ "p": p, "orphan": orphan, "delivered": delivered, "st": st }),
        );
    }
    /// `LoadNextSegment(s, deleteOk)`: bucket `lo` loaded its next segment,
    /// or was retired after its last one (`delete_ok`: its snapshot delete
    /// succeeded).
    pub(crate) fn load_next_segment(t: &Tracker, inner: &Inner, lo: i64, delete_ok: bool) {
        let st = t.trace_state(inner);
        record(
            "LoadNextSegment",
            json!({ "lo": lo, "deleteOk": delete_ok, "st": st }),
        );
    }
    /// `Merge(S, B)`: the buckets starting at `srcs` (S) were replaced by
    /// one snapshot holding `segs` (B: its cuts; `[]`: nothing kept, sources
    /// retired).
    pub(crate) fn merge(t: &Tracker, inner: &Inner, srcs: &[i64], segs: Segments) {
        let st = t.trace_state(inner);
        record("Merge", json!({ "srcs": srcs, "segs": segs, "st": st }));
    }
    /// [`merge`] of sources that kept nothing (`segs` `[]`: retired).
    pub(crate) fn merge_retired(t: &Tracker, inner: &Inner, srcs: &[i64]) {
        merge(t, inner, srcs, json!([]));
    }
    /// `Trim(s)`: bucket `lo` (wholly below the mark-delete) was deleted and
    /// its frozen bitmap untracked.
    pub(crate) fn trim(t: &Tracker, inner: &Inner, lo: i64) {
        let st = t.trace_state(inner);
        record("Trim", json!({ "lo": lo, "st": st }));
    }
    /// `Ack`: the mark-delete moved to `(md, e)`; with `e = -1` (as
    /// `tests/trace_bucket_merge.rs` records it) `md` is the first live
    /// ledger.
    pub(crate) fn ack(t: &Tracker, inner: &Inner, md: i64, e: i64) {
        let st = t.trace_state(inner);
        record("Ack", json!({ "md": md, "e": e, "st": st }));
    }
    /// `Crash(m)`: a new tracker recovered the committed buckets; the
    /// dispatcher's re-read (`Add` lines below `nextP`, the spec's
    /// `ReReadAt`) follows, interleaved with the tracker's other steps.
    pub(crate) fn recover(t: &Tracker, inner: &Inner) {
        let st = t.trace_state(inner);
        record("Recover", json!({ "st": st }));
    }
}
