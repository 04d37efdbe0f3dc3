//! The events the scheduler runs, and the label each gives the watchdogs.

use super::*;

#[derive(Debug)]
pub(super) enum Ev {
    Publish,
    Dispatch(SubIdx),
    /// A cursor read of `sub` issued with latency completes.
    ReadComplete {
        sub: SubIdx,
        /// The broker that issued it (a restart drops it).
        broker_generation: u64,
        /// Its id (`SubRt::pending_read`; a seek or rewind cancels it).
        read: u64,
        entries: Vec<crate::ledger::Entry>,
    },
    Deliver {
        sub: SubIdx,
        consumer: ConsumerIdx,
        /// The connection the broker wrote the command to.
        connection_id: u64,
        /// The client incarnation registered when the broker wrote it (a
        /// consumer re-created on the same connection drops frames of its
        /// closed predecessor: the connection is ordered).
        incarnation: crate::permits::client::Incarnation,
        command: CommandMessage,
        payload: Arc<Vec<u8>>,
        /// Seeks completed on the subscription when the broker dispatched it.
        seeks_before_dispatch: u32,
    },
    AppPoll {
        sub: SubIdx,
        consumer: ConsumerIdx,
    },
    Ack {
        sub: SubIdx,
        /// The client incarnation that sent it (a consumer re-created on
        /// the same connection keeps its key).
        incarnation: crate::permits::client::Incarnation,
        broker_generation: u64,
        key: ConsumerKey,
        position: Position,
        messages: Vec<MessageRef>,
        txn: Option<TxnId>,
        /// A cumulative ack up to `position` (Failover).
        cumulative: bool,
        /// A batch-index ack: the indexes of the entry still unacknowledged
        /// after it (Pulsar's `ack_set`; empty = the whole entry).
        ack_set: Vec<i64>,
    },
    /// A negative ack of `messages` of the entry at `position`
    /// (`CommandRedeliverUnacknowledgedMessages` with its message id).
    Nack {
        sub: SubIdx,
        incarnation: crate::permits::client::Incarnation,
        broker_generation: u64,
        key: ConsumerKey,
        position: Position,
        messages: Vec<MessageRef>,
    },
    Commit {
        sub: SubIdx,
        broker_generation: u64,
        txn: TxnId,
        positions: Vec<(Position, Vec<MessageRef>)>,
        /// The transaction's ack is cumulative (up to its one position).
        cumulative: bool,
    },
    /// A Failover consumer sends its pending cumulative ack (ack grouping).
    AckFlush {
        sub: SubIdx,
        consumer: ConsumerIdx,
    },
    FlushFlows {
        sub: SubIdx,
        consumer: ConsumerIdx,
    },
    Persist(SubIdx),
    DelayedTick(SubIdx),
    ReplayTimers,
    Restart,
    /// A drawn crash point is armed: the store dies a few durable writes
    /// later (`crashes`).
    ArmCrash,
    Reconnect {
        sub: SubIdx,
        consumer: ConsumerIdx,
    },
    OutageStart,
    OutageEnd,
    StallCheck,
    /// Consumer `consumer` of `sub` is re-created on the same connection.
    Recreate {
        sub: SubIdx,
        consumer: ConsumerIdx,
        /// The planned re-creation's deadline (it waits for a poll that
        /// queues a Flow, at most until then).
        deadline: bool,
    },
    /// The operator turns the pending-ack logs' auto-skip on and reloads
    /// the topic (after a replay gave up on non-recoverable data).
    OperatorReload,
    /// The topic is reloaded after a pending-ack replay a completing failure
    /// ended (its next owner replays the whole log).
    TopicReload,
    /// Admin seek of subscription `sub` forward to its read position.
    Seek {
        sub: SubIdx,
    },
    /// Every consumer of `sub` reconnects; the dispatcher rewinds.
    Rewind {
        sub: SubIdx,
    },
    /// The broker's clock steps forward.
    ClockJump,
    /// Consumer `consumer` of `sub` sends its Subscribe again on the same
    /// connection with the same consumer id.
    DuplicateSubscribe {
        sub: SubIdx,
        consumer: ConsumerIdx,
    },
    /// Admin clear-backlog of subscription `sub` (the delayed tracker is
    /// cleared).
    ClearBacklog {
        sub: SubIdx,
    },
}

impl Ev {
    /// The component an event runs in, its name and subscription (for the
    /// watchdogs' livelock report).
    pub(super) fn label(&self) -> (&'static str, &'static str, Option<usize>) {
        match self {
            Ev::Publish => ("producer", "Publish", None),
            Ev::Dispatch(s) => (
                "dispatcher (cursor, permits, delayed)",
                "Dispatch",
                Some(s.0),
            ),
            Ev::ReadComplete { sub, .. } => (
                "dispatcher read completion (cursor filter, delayed)",
                "ReadComplete",
                Some(sub.0),
            ),
            Ev::Deliver { sub, .. } => ("client (permits)", "Deliver", Some(sub.0)),
            Ev::AppPoll { sub, .. } => ("client (permits)", "AppPoll", Some(sub.0)),
            Ev::Ack { sub, .. } => ("broker ack path (cursor, pending_ack)", "Ack", Some(sub.0)),
            Ev::Nack { sub, .. } => ("broker ack path (negative ack)", "Nack", Some(sub.0)),
            Ev::Commit { sub, .. } => ("broker ack path (pending_ack)", "Commit", Some(sub.0)),
            Ev::AckFlush { sub, .. } => ("client (acks)", "AckFlush", Some(sub.0)),
            Ev::FlushFlows { sub, .. } => ("client (flows)", "FlushFlows", Some(sub.0)),
            Ev::Persist(s) => ("cursor persistence", "Persist", Some(s.0)),
            Ev::DelayedTick(s) => ("delayed", "DelayedTick", Some(s.0)),
            Ev::ReplayTimers => ("pending_ack replay", "ReplayTimers", None),
            Ev::Restart => ("broker restart (recovery)", "Restart", None),
            Ev::ArmCrash => ("store (crash point)", "ArmCrash", None),
            Ev::Reconnect { sub, .. } => ("client reconnect", "Reconnect", Some(sub.0)),
            Ev::OutageStart => ("storage", "OutageStart", None),
            Ev::OutageEnd => ("storage", "OutageEnd", None),
            Ev::StallCheck => ("checker", "StallCheck", None),
            Ev::OperatorReload => ("operator reload (pending_ack)", "OperatorReload", None),
            Ev::TopicReload => ("topic reload (pending_ack)", "TopicReload", None),
            Ev::Recreate { sub, .. } => ("client re-creation (permits)", "Recreate", Some(sub.0)),
            Ev::Seek { sub } => ("admin seek", "Seek", Some(sub.0)),
            Ev::Rewind { sub } => ("dispatcher rewind (delayed)", "Rewind", Some(sub.0)),
            Ev::ClockJump => ("broker clock (delayed)", "ClockJump", None),
            Ev::DuplicateSubscribe { sub, .. } => (
                "client duplicate Subscribe (permits)",
                "DuplicateSubscribe",
                Some(sub.0),
            ),
            Ev::ClearBacklog { sub } => (
                "admin clear-backlog (delayed clear)",
                "ClearBacklog",
                Some(sub.0),
            ),
        }
    }
}
