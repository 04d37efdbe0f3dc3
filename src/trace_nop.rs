//! The no-op twin of `src/trace.rs` (every build without the `trace`
//! feature: the default one, `cargo bench`, `serve`, an embedder's
//! `default-features = false`): each hook the components call is an empty
//! inline function with the same parameters, and each id a zero-sized
//! type, so a hook call compiles to nothing (etcd-io/raft's
//! `state_trace_nop.go`). Crate-private: the recorder API (`start`,
//! `finish`, the line helpers) exists only with the feature.
//!
//! The hooks' parameters are the components' own values and references
//! (never a line computed at the call site), so nothing is evaluated for a
//! hook here; a hook whose line needs more computes it in `src/trace.rs`.

/// No-op twin of the `deletion` hooks.
pub(crate) mod deletion {
    use crate::position::Position;

    /// A deletion state's id in its lines: nothing to hold.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub(crate) struct Id;

    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn open(_md: Position, _set: &mut crate::deletion::PositionRangeSet) -> Id {
        Id
    }
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn cursor(_state: &crate::deletion::CursorDeletionState, _ml: &str, _cur: &str) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn persist(
        _ml: &str,
        _cur: &str,
        _md: Position,
        _ranges: impl IntoIterator<Item = (Position, Position)>,
    ) {
    }
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn ack(_ds: Id, _ledger_id: i64, _entry: u32) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn mark_delete(_ds: Id, _c: Position, _md: Position) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn advance(_ds: Id, _md: Position) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn reset_begin(_ds: Id, _epoch: u64) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn reset_invalidate(_ds: Id) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn reset_mark_delete(_ds: Id, _md: Position) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn reset_clear(_ds: Id) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn reset_end(_ds: Id, _epoch: u64) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn r_start(_ds: Id, _q: Position, _e1: u64) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn r_mark_delete(_ds: Id, _rmd: Position) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn r_lookup(_ds: Id, _ans: bool) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn r_recheck(_ds: Id, _pc: &'static str) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn r_locked(_ds: Id, _ans: bool) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn r_finish(_ds: Id) {}
}

/// No-op twin of the `ledger_cursor` hooks.
pub(crate) mod ledger_cursor {
    use crate::position::Position;

    /// The steps of one read: nothing to hold.
    #[derive(Debug, Default)]
    pub(crate) struct ReadSteps;

    impl ReadSteps {
        /// No step.
        #[inline(always)]
        pub(crate) fn new() -> Self {
            Self
        }
        /// Nothing recorded.
        #[inline(always)]
        pub(crate) fn skipped(&mut self, _last: Position) {}
        /// Nothing recorded.
        #[inline(always)]
        pub(crate) fn returned(&mut self, _first: Position, _last: Position) {}
        /// Nothing recorded.
        #[inline(always)]
        pub(crate) fn record(
            self,
            _ml: &str,
            _cur: &str,
            _max_entries: usize,
            _skipped_returned: (bool, bool),
            _read_position: Position,
            _next_valid: impl Fn(Position) -> Position,
        ) {
        }
    }

    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn append_entries(_ml: &str, _entries: &[Position]) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn opened(_ml: &str, _cur: &str, _recovered: bool, _md: Position, _read: Position) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn skip_to_end(_ml: &str, _cur: &str, _from: Position, _read: Position) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn skip_to(_ml: &str, _cur: &str, _read: Position) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn read_run(
        _ml: &str,
        _cur: &str,
        _first: Position,
        _last: Position,
        _read: Position,
    ) {
    }
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn mark_delete(_ml: &str, _cur: &str, _md: Position, _read: Position) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn rewind(_ml: &str, _cur: &str, _read: Position) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn reset(_ml: &str, _cur: &str, _md: Position, _read: Position) {}
}

/// No-op twin of the `pending_ack` hooks.
pub(crate) mod pending_ack {
    use crate::ledger::{LedgerError, ManagedCursor};
    use crate::position::Position;

    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn opened(
        _h: &str,
        _ledger: &crate::ledger::ManagedLedger,
        _cursor: &ManagedCursor,
        _replay: &crate::pending_ack::ReplayConfig,
        _auto_skip: bool,
    ) {
    }
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn h_start(_h: &str, _cursor: &ManagedCursor) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn r_loop(_h: &str, _to: &'static str) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn fq_room(_h: &str, _queued: usize, _room: bool) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn fq_count(_h: &str, _outstanding: usize) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn fq_flag(_h: &str, _readable: bool) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn fq_issue(_h: &str, _issued: bool) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn fq_no_more(_h: &str, _more: bool) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn fq_ret(_h: &str, _readable: bool) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn poll(_h: &str, _entry: Option<Position>) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn r_end(_h: &str, _outcome: &'static str, _cursor: &ManagedCursor) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn env_take(_h: &str) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn read_ok(_h: &str, _cursor: &ManagedCursor, _queued: usize) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn read_fail(_h: &str, _error: &LedgerError) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn env_finish(_h: &str, _w: &'static str) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn h_done(_h: &str, _state: &'static str) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn h_done_at_end(_h: &str, _attempt_end: bool, _state: &'static str) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn h_timer(_h: &str) {}
}

/// No-op twin of the `permits` hooks.
pub(crate) mod permits {
    use crate::permits::client::ConsumerPermitState;

    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn broker_send(_c: (u64, u64), _p: u32) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn broker_recv_subscribe(_c: (u64, u64)) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn broker_recv_close(_c: (u64, u64)) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn broker_recv_flow(_c: (u64, u64), _n: u32) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn broker_remove(_c: (u64, u64), _why: &'static str) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn client_receive(_c: (u64, u64), _d: u32, _stale: bool) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn app_return(_state: Option<&ConsumerPermitState>) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn drain(_c: (u64, u64), _n: u32) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn flush_residual(_c: (u64, u64), _n: u32) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn conn_task_write(_c: (u64, u64), _n: u32, _written: bool) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn replace(_c: (u64, u64)) {}
}

/// No-op twin of the `bucket_merge` hooks.
pub(crate) mod bucket_merge {
    use crate::delayed::snapshot::CutSegment;
    use crate::delayed::tracker::Inner;
    use crate::delayed::BucketDelayedDeliveryTracker as Tracker;

    /// A tracker's id in its lines: nothing to hold.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub(crate) struct Id;

    /// No id.
    #[inline(always)]
    pub(crate) fn next_id() -> Id {
        Id
    }

    /// A `Seal` / `Merge` line's segments: nothing to hold.
    pub(crate) struct Segments;

    /// Nothing taken.
    #[inline(always)]
    pub(crate) fn segments(_segments: &[CutSegment]) -> Segments {
        Segments
    }

    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn tracker_of(_t: &Tracker, _ml: &str, _sub: &str) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn add(_t: &Tracker, _inner: &Inner, _p: i64, _at: i64, _due: bool) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn move_due(_t: &Tracker, _inner: &Inner, _moved: bool) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn seal(_t: &Tracker, _inner: &Inner, _segs: Segments) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn seal_fail(_t: &Tracker, _inner: &Inner) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn pop(_t: &Tracker, _inner: &Inner, _p: i64, _orphan: bool, _delivered: bool) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn load_next_segment(_t: &Tracker, _inner: &Inner, _lo: i64, _delete_ok: bool) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn merge(_t: &Tracker, _inner: &Inner, _srcs: &[i64], _segs: Segments) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn merge_retired(_t: &Tracker, _inner: &Inner, _srcs: &[i64]) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn trim(_t: &Tracker, _inner: &Inner, _lo: i64) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn ack(_t: &Tracker, _inner: &Inner, _md: i64, _e: i64) {}
    /// Nothing recorded.
    #[inline(always)]
    pub(crate) fn recover(_t: &Tracker, _inner: &Inner) {}
}
