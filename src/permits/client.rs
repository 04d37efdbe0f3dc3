//! Client side of PIP-491: resolve P, spend it through a command budget, and
//! return it to exactly the broker-consumer incarnation that was debited.
//!
//! - [`resolve_early`] / [`resolve_full`]: the resolution ladder
//!   (explicit `message_permits` → `ack_set` popcount → `num_messages_in_batch`
//!   → legacy 1). pulsar-core follows seed 003: an explicit P that is
//!   invalid (0, > `i32::MAX`) **or inconsistent** with the batch metadata
//!   and `ack_set` is a [`PermitProtocolError`]; the client closes the source
//!   connection and returns no credit for that command.
//! - [`CommandBudget`]: claim / restore / drain, so a command returns
//!   exactly P whatever mix of delivered, skipped, compacted-out,
//!   failed-mid-batch and stale-epoch messages it carried.
//! - [`ConsumerPermitState`]: one per broker-consumer incarnation; its
//!   atomic accumulator (checked arithmetic, drains at
//!   `receiver_queue_size / 2`) queues a Flow request; the connection task
//!   ([`ClientConnection::flush_flows`]) revalidates the incarnation right
//!   before writing the Flow, under the same lock that a replacement
//!   (Subscribe / CloseConsumer) takes, so no credit crosses incarnations.
//! - [`ClientConsumer`]: the message path that ties them together.
//!
//! Corresponds to Pulsar's `MessagePermitAccounting`, `ConsumerImpl`'s
//! native-message path and `ConsumerPermitState` (seed 003).
//!
//! # Concurrency contract
//!
//! [`ConsumerPermitState::return_permits`] and [`PermitToken::release`] may
//! be called from any thread, concurrently with each other, with
//! [`ClientConnection::flush_flows`] (the connection task) and with a
//! replacement ([`ClientConnection::subscribe`],
//! [`ClientConnection::close_consumer`], [`ClientConnection::close`]). All
//! synchronisation goes through [`crate::sync`], so loom and shuttle check
//! this exact code. [`ClientConsumer`] is `&mut self` (owned by the
//! connection task; share it behind a [`crate::sync::Mutex`]).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use prost::Message;

use crate::permits::wire::{
    self, CommandFlow, CommandMessage, MessageIdData, MessageMetadata, SingleMessageMetadata,
    WireError, MAX_PERMITS,
};
use crate::sync::{Arc, AtomicBool, AtomicU64, Mutex, Ordering};

// ---------------------------------------------------------------------------
// Resolution ladder
// ---------------------------------------------------------------------------

/// Where a resolved P came from (the rung of the ladder).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PermitSource {
    /// `CommandMessage.message_permits` (new broker).
    Explicit,
    /// Popcount of the command's `ack_set`.
    AckSet,
    /// `MessageMetadata.num_messages_in_batch`.
    BatchMetadata,
    /// The legacy value 1.
    Legacy,
}

/// A resolved permit value: `1..=i32::MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResolvedPermits {
    /// P, in permits (logical messages).
    pub permits: u32,
    /// The rung it came from.
    pub source: PermitSource,
}

/// A protocol violation: the client closes the source connection and
/// returns no credit for the command (seed 003's rule).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PermitProtocolError {
    /// Explicit `message_permits` outside `1..=i32::MAX`.
    #[error("explicit message_permits {0} is outside 1..=2147483647")]
    InvalidExplicit(u32),
    /// Explicit P disagrees with the batch metadata and `ack_set`.
    #[error(
        "explicit message_permits {explicit} is inconsistent with batch size {batch_size} and ack_set (expected {expected:?})"
    )]
    Inconsistent {
        /// The explicit value.
        explicit: u32,
        /// The batch size B, 0 when the metadata carried an invalid one.
        batch_size: u32,
        /// The expected P, `None` when nothing is deliverable.
        expected: Option<u32>,
    },
    /// The batch handed off more messages than P (a claim found the budget
    /// empty).
    #[error("command carried more deliverable messages than its {permits} permits")]
    BudgetExhausted {
        /// P of the command.
        permits: u32,
    },
    /// The `CommandMessage` frame itself is truncated or malformed.
    #[error("malformed CommandMessage: {0}")]
    Malformed(WireError),
    /// A return would overflow the incarnation's accumulator.
    #[error("permit accumulator overflow: {current} + {added} exceeds 2147483647")]
    AccumulatorOverflow {
        /// The accumulator before the return.
        current: u64,
        /// The rejected return.
        added: u32,
    },
}

fn validate_explicit(p: u32) -> Result<u32, PermitProtocolError> {
    if p == 0 || p > MAX_PERMITS {
        Err(PermitProtocolError::InvalidExplicit(p))
    } else {
        Ok(p)
    }
}

/// Early resolution, before checksum and metadata: explicit → popcount over
/// **all** `ack_set` words → 1. Used to settle commands whose payload
/// cannot be parsed.
///
/// # Errors
/// [`PermitProtocolError::InvalidExplicit`].
pub fn resolve_early(cmd: &CommandMessage) -> Result<ResolvedPermits, PermitProtocolError> {
    if let Some(p) = cmd.message_permits {
        return Ok(ResolvedPermits {
            permits: validate_explicit(p)?,
            source: PermitSource::Explicit,
        });
    }
    let bits = wire::popcount_all(&cmd.ack_set);
    if bits > 0 {
        return Ok(ResolvedPermits {
            permits: bits.min(u64::from(MAX_PERMITS)) as u32,
            source: PermitSource::AckSet,
        });
    }
    Ok(ResolvedPermits {
        permits: 1,
        source: PermitSource::Legacy,
    })
}

/// Full resolution, after the metadata gave the batch size `batch_size`
/// (B ≥ 1): expected = deliverable `ack_set` bits below B, or B without an
/// `ack_set`. An explicit value must equal expected. Without an explicit
/// value (old broker) expected is used, and the ambiguous case (a non-empty
/// `ack_set` with nothing deliverable below B) keeps the legacy 1.
///
/// # Errors
/// [`PermitProtocolError::InvalidExplicit`], [`PermitProtocolError::Inconsistent`].
pub fn resolve_full(
    cmd: &CommandMessage,
    batch_size: u32,
) -> Result<ResolvedPermits, PermitProtocolError> {
    let expected = if batch_size == 0 {
        None
    } else {
        wire::expected_permits(&cmd.ack_set, batch_size).ok()
    };
    if let Some(p) = cmd.message_permits {
        let p = validate_explicit(p)?;
        if expected != Some(p) {
            return Err(PermitProtocolError::Inconsistent {
                explicit: p,
                batch_size,
                expected,
            });
        }
        return Ok(ResolvedPermits {
            permits: p,
            source: PermitSource::Explicit,
        });
    }
    Ok(match expected {
        Some(n) if !cmd.ack_set.is_empty() => ResolvedPermits {
            permits: n,
            source: PermitSource::AckSet,
        },
        Some(n) => ResolvedPermits {
            permits: n,
            source: PermitSource::BatchMetadata,
        },
        None => ResolvedPermits {
            permits: 1,
            source: PermitSource::Legacy,
        },
    })
}

// ---------------------------------------------------------------------------
// Command budget
// ---------------------------------------------------------------------------

/// Errors of [`CommandBudget`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    /// `claim` with nothing left: the command carried more messages than P.
    #[error("budget of {permits} permits exhausted")]
    Exhausted {
        /// P of the command.
        permits: u32,
    },
    /// `restore` without a matching claim.
    #[error("restore without a matching claim (budget {permits})")]
    NothingClaimed {
        /// P of the command.
        permits: u32,
    },
}

/// The command-local budget of P permits during batch expansion.
///
/// Each message handed off to the application **claims** one unit (and
/// will return it itself when dequeued); a failed hand-off **restores** it;
/// skipped and unexpanded indexes claim nothing. [`CommandBudget::drain`]
/// consumes the budget and yields what the command itself must return, so
/// `claimed + drained = P` and nothing is returned twice.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a command budget must be drained, or its permits leak"]
pub struct CommandBudget {
    permits: u32,
    remaining: u32,
}

impl CommandBudget {
    /// A budget of `permits` (P), nothing claimed.
    pub fn new(permits: u32) -> Self {
        Self {
            permits,
            remaining: permits,
        }
    }

    /// P.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// Units not claimed.
    pub fn remaining(&self) -> u32 {
        self.remaining
    }

    /// Units claimed (messages handed off).
    pub fn claimed(&self) -> u32 {
        self.permits - self.remaining
    }

    /// Claims one unit for a handed-off message.
    ///
    /// # Errors
    /// [`BudgetError::Exhausted`]; the budget is unchanged.
    pub fn claim(&mut self) -> Result<(), BudgetError> {
        if self.remaining == 0 {
            return Err(BudgetError::Exhausted {
                permits: self.permits,
            });
        }
        self.remaining -= 1;
        Ok(())
    }

    /// Gives back one claimed unit (the hand-off failed).
    ///
    /// # Errors
    /// [`BudgetError::NothingClaimed`]; the budget is unchanged.
    pub fn restore(&mut self) -> Result<(), BudgetError> {
        if self.remaining == self.permits {
            return Err(BudgetError::NothingClaimed {
                permits: self.permits,
            });
        }
        self.remaining += 1;
        Ok(())
    }

    /// Ends the command: returns the unclaimed units (the command's own
    /// return). Consumes the budget, so it cannot be drained twice.
    pub fn drain(self) -> u32 {
        self.remaining
    }
}

// ---------------------------------------------------------------------------
// Per-incarnation permit state and the connection
// ---------------------------------------------------------------------------

/// Identity of one broker-consumer incarnation: the connection and a serial
/// number unique on that connection. Each Subscribe creates a new one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Incarnation {
    /// Client connection id.
    pub connection_id: u64,
    /// Serial number on that connection (from 1).
    pub serial: u64,
}

/// Why a connection was closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseReason {
    /// A permit protocol violation (invalid / inconsistent explicit P,
    /// budget exhausted, accumulator overflow).
    Protocol(PermitProtocolError),
    /// Closed by the application or a lost socket.
    Requested,
}

/// A Flow the returning thread asks the connection task to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FlowRequest {
    consumer_id: u64,
    incarnation: Incarnation,
    permits: u32,
}

/// State shared between the connection and its permit states (no `Arc`
/// back to either, so there is no reference cycle).
#[derive(Debug)]
struct FlowQueue {
    pending: Mutex<VecDeque<FlowRequest>>,
    close_request: Mutex<Option<PermitProtocolError>>,
}

/// Outcome of a permit return.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReturnOutcome {
    /// Added to the accumulator; `flow_requested` permits (0 if below the
    /// threshold or Flow not yet enabled) were drained into a Flow request.
    Accepted {
        /// Permits drained into a Flow request by this call.
        flow_requested: u32,
    },
    /// The incarnation was replaced or closed: no credit.
    Stale,
}

/// One broker-consumer incarnation's permit state (Pulsar's
/// `ConsumerPermitState`): the identity and its atomic accumulator.
///
/// Replaced on every (re)subscribe and consumer close, also when the same
/// connection is reused; old credit is never copied. Returns to a closed
/// state are dropped. Flow is disabled until Subscribe succeeds.
#[derive(Debug)]
pub struct ConsumerPermitState {
    consumer_id: u64,
    incarnation: Incarnation,
    receiver_queue_size: u32,
    accumulator: AtomicU64,
    flow_enabled: AtomicBool,
    closed: AtomicBool,
    flows: Arc<FlowQueue>,
}

impl ConsumerPermitState {
    /// The incarnation identity.
    pub fn incarnation(&self) -> Incarnation {
        self.incarnation
    }

    /// The client `consumer_id`.
    pub fn consumer_id(&self) -> u64 {
        self.consumer_id
    }

    /// Receiver queue size (permits granted at Subscribe).
    pub fn receiver_queue_size(&self) -> u32 {
        self.receiver_queue_size
    }

    /// The drain threshold: `receiver_queue_size / 2` (integer division).
    pub fn threshold(&self) -> u64 {
        u64::from(self.receiver_queue_size / 2)
    }

    /// Permits accumulated and not yet drained into a Flow request.
    pub fn accumulated(&self) -> u64 {
        self.accumulator.load(Ordering::Acquire)
    }

    /// Whether this incarnation was replaced or closed.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Returns `permits` to this incarnation (callable from any thread).
    /// Checked addition; at or above the threshold (and once Flow is
    /// enabled) the accumulator is swapped to 0 and a Flow request queued
    /// for the connection task.
    ///
    /// # Errors
    /// [`PermitProtocolError::AccumulatorOverflow`]: the state is closed and
    /// the connection asked to close; nothing is added.
    pub fn return_permits(&self, permits: u32) -> Result<ReturnOutcome, PermitProtocolError> {
        if self.is_closed() {
            return Ok(ReturnOutcome::Stale);
        }
        if permits == 0 {
            return Ok(ReturnOutcome::Accepted { flow_requested: 0 });
        }
        let mut current = self.accumulator.load(Ordering::Acquire);
        let total = loop {
            let next = match current.checked_add(u64::from(permits)) {
                Some(n) if n <= u64::from(MAX_PERMITS) => n,
                _ => {
                    let err = PermitProtocolError::AccumulatorOverflow {
                        current,
                        added: permits,
                    };
                    tracing::error!(incarnation = ?self.incarnation, %err, "closing connection");
                    self.closed.store(true, Ordering::Release);
                    let mut req = self.flows.close_request.lock();
                    if req.is_none() {
                        *req = Some(err.clone());
                    }
                    return Err(err);
                }
            };
            match self.accumulator.compare_exchange(
                current,
                next,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break next,
                Err(actual) => current = actual,
            }
        };
        let mut flow_requested = 0;
        if total >= self.threshold() && self.flow_enabled.load(Ordering::Acquire) {
            let drained = self.accumulator.swap(0, Ordering::AcqRel);
            if drained > 0 {
                // drained <= MAX_PERMITS: every stored value passed the check.
                flow_requested = drained as u32;
                self.flows.pending.lock().push_back(FlowRequest {
                    consumer_id: self.consumer_id,
                    incarnation: self.incarnation,
                    permits: flow_requested,
                });
            }
        }
        Ok(ReturnOutcome::Accepted { flow_requested })
    }

    /// Marks the state closed and takes its residual accumulator (credit
    /// that is abandoned with the incarnation).
    fn close(&self) -> u64 {
        self.closed.store(true, Ordering::Release);
        self.flow_enabled.store(false, Ordering::Release);
        self.accumulator.swap(0, Ordering::AcqRel)
    }
}

/// A frame the client writes to its connection, in order. The incarnation
/// is local bookkeeping (the wire `CommandFlow` carries only consumer_id
/// and permits), used by checks to attribute every Flow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientFrame {
    /// Subscribe of a new incarnation.
    Subscribe {
        /// consumer_id.
        consumer_id: u64,
        /// The new incarnation.
        incarnation: Incarnation,
    },
    /// `CommandFlow` written for `incarnation`.
    Flow {
        /// The incarnation whose credit this is.
        incarnation: Incarnation,
        /// The wire command.
        command: CommandFlow,
    },
    /// `CommandCloseConsumer` ending `incarnation`.
    CloseConsumer {
        /// consumer_id.
        consumer_id: u64,
        /// The ended incarnation.
        incarnation: Incarnation,
    },
    /// `CommandAck` with a `validation_error` (corrupted entry).
    AckValidationError {
        /// consumer_id.
        consumer_id: u64,
        /// The entry.
        message_id: MessageIdData,
        /// The validation error.
        validation_error: ValidationError,
    },
    /// `CommandRedeliverUnacknowledgedMessages` with the new epoch.
    RedeliverUnacknowledged {
        /// consumer_id.
        consumer_id: u64,
        /// The consumer epoch after the bump.
        consumer_epoch: u64,
    },
}

/// `CommandAck.ValidationError` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValidationError {
    /// 0: UncompressedSizeCorruption.
    UncompressedSizeCorruption = 0,
    /// 1: DecompressionError.
    DecompressionError = 1,
    /// 2: ChecksumMismatch.
    ChecksumMismatch = 2,
    /// 3: BatchDeSerializeError.
    BatchDeSerializeError = 3,
    /// 4: DecryptionError.
    DecryptionError = 4,
}

/// What [`ClientConnection::flush_flows`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlushReport {
    /// Flows written: (incarnation, permits).
    pub written: Vec<(Incarnation, u32)>,
    /// Flow requests dropped because their incarnation is no longer current
    /// (or the connection is closed): (incarnation, permits).
    pub dropped: Vec<(Incarnation, u32)>,
}

/// Errors of connection / consumer operations.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientPermitError {
    /// The connection is closed.
    #[error("connection {0} is closed")]
    ConnectionClosed(u64),
    /// No current incarnation for that consumer_id on the connection.
    #[error("no consumer {consumer_id} on connection {connection_id}")]
    UnknownConsumer {
        /// Connection.
        connection_id: u64,
        /// consumer_id.
        consumer_id: u64,
    },
    /// The state passed in is not the current incarnation.
    #[error("incarnation {0:?} is not current")]
    NotCurrent(Incarnation),
    /// Subscribe success was already applied to this incarnation (Pulsar
    /// grants the receiver queue once per broker-consumer incarnation; a
    /// second grant would credit the broker twice).
    #[error("incarnation {0:?} already applied its Subscribe success (the receiver queue is granted once per incarnation)")]
    AlreadySubscribed(Incarnation),
    /// A command addressed to a different consumer_id.
    #[error("command for consumer {got} delivered to consumer {expected}")]
    WrongConsumer {
        /// This consumer's id.
        expected: u64,
        /// The command's consumer_id.
        got: u64,
    },
    /// A permit protocol violation (the connection was closed).
    #[error(transparent)]
    Protocol(#[from] PermitProtocolError),
}

#[derive(Debug)]
struct ConnectionInner {
    consumers: BTreeMap<u64, Arc<ConsumerPermitState>>,
    next_serial: u64,
    outbox: Vec<ClientFrame>,
    closed: Option<CloseReason>,
}

/// A client connection (Pulsar's `ClientCnx`) as far as permits go: the
/// current incarnation per consumer_id, the pending Flow requests and the
/// ordered outbox of written frames.
///
/// Subscribe, CloseConsumer, close and the Flow write all happen under one
/// lock, so a Flow revalidated there is ordered entirely before or after a
/// replacement's Subscribe.
#[derive(Debug)]
pub struct ClientConnection {
    id: u64,
    flows: Arc<FlowQueue>,
    inner: Mutex<ConnectionInner>,
}

impl ClientConnection {
    /// An open connection with id `id`.
    pub fn new(id: u64) -> Self {
        Self {
            id,
            flows: Arc::new(FlowQueue {
                pending: Mutex::new(VecDeque::new()),
                close_request: Mutex::new(None),
            }),
            inner: Mutex::new(ConnectionInner {
                consumers: BTreeMap::new(),
                next_serial: 1,
                outbox: Vec::new(),
                closed: None,
            }),
        }
    }

    /// The connection id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Applies a pending close request (accumulator overflow).
    fn apply_close_request(&self, inner: &mut ConnectionInner) {
        if inner.closed.is_some() {
            return;
        }
        if let Some(err) = self.flows.close_request.lock().take() {
            Self::close_locked(inner, CloseReason::Protocol(err));
        }
    }

    fn close_locked(inner: &mut ConnectionInner, reason: CloseReason) {
        tracing::warn!(?reason, "closing client connection");
        inner.closed = Some(reason);
        for state in std::mem::take(&mut inner.consumers).into_values() {
            state.close();
        }
    }

    /// Whether the connection is closed (also applies a pending overflow
    /// close request).
    pub fn is_closed(&self) -> bool {
        let mut inner = self.inner.lock();
        self.apply_close_request(&mut inner);
        inner.closed.is_some()
    }

    /// Why the connection was closed, if it was.
    pub fn close_reason(&self) -> Option<CloseReason> {
        let mut inner = self.inner.lock();
        self.apply_close_request(&mut inner);
        inner.closed.clone()
    }

    /// Closes the connection: every incarnation on it is closed (its credit
    /// abandoned), pending Flow requests will be dropped.
    pub fn close(&self, reason: CloseReason) {
        let mut inner = self.inner.lock();
        if inner.closed.is_none() {
            Self::close_locked(&mut inner, reason);
        }
    }

    /// Writes Subscribe for a **new** incarnation of `consumer_id` (closing
    /// the current one, if any, with a CloseConsumer frame and without
    /// copying its credit). Flow stays
    /// disabled until [`subscribe_succeeded`](Self::subscribe_succeeded).
    ///
    /// # Errors
    /// [`ClientPermitError::ConnectionClosed`].
    pub fn subscribe(
        &self,
        consumer_id: u64,
        receiver_queue_size: u32,
    ) -> Result<Arc<ConsumerPermitState>, ClientPermitError> {
        let mut inner = self.inner.lock();
        self.apply_close_request(&mut inner);
        if inner.closed.is_some() {
            return Err(ClientPermitError::ConnectionClosed(self.id));
        }
        if let Some(old) = inner.consumers.remove(&consumer_id) {
            // close/recreate on the same connection
            old.close();
            inner.outbox.push(ClientFrame::CloseConsumer {
                consumer_id,
                incarnation: old.incarnation,
            });
        }
        let incarnation = Incarnation {
            connection_id: self.id,
            serial: inner.next_serial,
        };
        inner.next_serial += 1;
        let state = Arc::new(ConsumerPermitState {
            consumer_id,
            incarnation,
            receiver_queue_size,
            accumulator: AtomicU64::new(0),
            flow_enabled: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            flows: Arc::clone(&self.flows),
        });
        inner.outbox.push(ClientFrame::Subscribe {
            consumer_id,
            incarnation,
        });
        inner.consumers.insert(consumer_id, Arc::clone(&state));
        Ok(state)
    }

    /// Subscribe succeeded: enables Flow and writes the initial grant of the
    /// whole receiver queue (plus anything accumulated meanwhile). Applies
    /// once per incarnation (Pulsar's client grants the receiver queue once
    /// per Subscribe; PIP-491 scopes that credit to the incarnation's
    /// `ConsumerPermitState`).
    ///
    /// # Errors
    /// [`ClientPermitError::ConnectionClosed`], [`ClientPermitError::NotCurrent`];
    /// [`ClientPermitError::AlreadySubscribed`] for a second call on the same
    /// incarnation (a duplicate Success): nothing is written, the
    /// accumulator is untouched.
    pub fn subscribe_succeeded(
        &self,
        state: &ConsumerPermitState,
    ) -> Result<u32, ClientPermitError> {
        let mut inner = self.inner.lock();
        self.apply_close_request(&mut inner);
        if inner.closed.is_some() {
            return Err(ClientPermitError::ConnectionClosed(self.id));
        }
        let current = inner
            .consumers
            .get(&state.consumer_id)
            .is_some_and(|c| c.incarnation == state.incarnation);
        if !current || state.is_closed() {
            return Err(ClientPermitError::NotCurrent(state.incarnation));
        }
        // `flow_enabled` is set only here, under the connection lock, and
        // cleared only when the state closes (checked above): set means this
        // incarnation was already granted its receiver queue.
        if state.flow_enabled.load(Ordering::Acquire) {
            return Err(ClientPermitError::AlreadySubscribed(state.incarnation));
        }
        state.flow_enabled.store(true, Ordering::Release);
        let extra = state.accumulator.swap(0, Ordering::AcqRel);
        // extra <= MAX_PERMITS (checked on every add); the grant saturates
        // at the protocol maximum rather than wrapping.
        let grant =
            (u64::from(state.receiver_queue_size) + extra).min(u64::from(MAX_PERMITS)) as u32;
        if grant > 0 {
            inner.outbox.push(ClientFrame::Flow {
                incarnation: state.incarnation,
                command: CommandFlow {
                    consumer_id: state.consumer_id,
                    message_permits: grant,
                },
            });
        }
        Ok(grant)
    }

    /// Closes the current incarnation of `consumer_id` (CommandCloseConsumer)
    /// and returns its abandoned residual credit.
    ///
    /// # Errors
    /// [`ClientPermitError::ConnectionClosed`], [`ClientPermitError::UnknownConsumer`].
    pub fn close_consumer(&self, consumer_id: u64) -> Result<u64, ClientPermitError> {
        let mut inner = self.inner.lock();
        self.apply_close_request(&mut inner);
        if inner.closed.is_some() {
            return Err(ClientPermitError::ConnectionClosed(self.id));
        }
        let state =
            inner
                .consumers
                .remove(&consumer_id)
                .ok_or(ClientPermitError::UnknownConsumer {
                    connection_id: self.id,
                    consumer_id,
                })?;
        let residual = state.close();
        inner.outbox.push(ClientFrame::CloseConsumer {
            consumer_id,
            incarnation: state.incarnation,
        });
        Ok(residual)
    }

    /// The current incarnation of `consumer_id`, if any.
    pub fn current(&self, consumer_id: u64) -> Option<Arc<ConsumerPermitState>> {
        self.inner.lock().consumers.get(&consumer_id).cloned()
    }

    /// The connection task's step: pops every queued Flow request and, for
    /// each, **revalidates** under the connection lock that its incarnation
    /// is still current (and the connection open) right before writing the
    /// Flow; otherwise drops it.
    pub fn flush_flows(&self) -> FlushReport {
        let mut report = FlushReport::default();
        loop {
            let next = self.flows.pending.lock().pop_front();
            let Some(req) = next else { break };
            let mut inner = self.inner.lock();
            self.apply_close_request(&mut inner);
            let current = inner.closed.is_none()
                && inner
                    .consumers
                    .get(&req.consumer_id)
                    .is_some_and(|c| c.incarnation == req.incarnation && !c.is_closed());
            if current {
                inner.outbox.push(ClientFrame::Flow {
                    incarnation: req.incarnation,
                    command: CommandFlow {
                        consumer_id: req.consumer_id,
                        message_permits: req.permits,
                    },
                });
                report.written.push((req.incarnation, req.permits));
            } else {
                tracing::debug!(incarnation = ?req.incarnation, permits = req.permits, "dropping stale Flow");
                report.dropped.push((req.incarnation, req.permits));
            }
        }
        report
    }

    /// Drains any residual credit of the current incarnation of
    /// `consumer_id` into a Flow right away (e.g. when the application is
    /// idle), bypassing the threshold. Returns the permits written.
    ///
    /// # Errors
    /// [`ClientPermitError::ConnectionClosed`], [`ClientPermitError::UnknownConsumer`].
    pub fn flush_residual(&self, consumer_id: u64) -> Result<u32, ClientPermitError> {
        let mut inner = self.inner.lock();
        self.apply_close_request(&mut inner);
        if inner.closed.is_some() {
            return Err(ClientPermitError::ConnectionClosed(self.id));
        }
        let state = inner.consumers.get(&consumer_id).cloned().ok_or(
            ClientPermitError::UnknownConsumer {
                connection_id: self.id,
                consumer_id,
            },
        )?;
        if !state.flow_enabled.load(Ordering::Acquire) {
            return Ok(0);
        }
        let drained = state.accumulator.swap(0, Ordering::AcqRel);
        if drained > 0 {
            // drained <= MAX_PERMITS, see return_permits.
            inner.outbox.push(ClientFrame::Flow {
                incarnation: state.incarnation,
                command: CommandFlow {
                    consumer_id,
                    message_permits: drained as u32,
                },
            });
        }
        Ok(drained as u32)
    }

    /// Takes the frames written so far, in order (the socket's view).
    pub fn take_outbox(&self) -> Vec<ClientFrame> {
        std::mem::take(&mut self.inner.lock().outbox)
    }

    fn push_frame(&self, frame: ClientFrame) {
        let mut inner = self.inner.lock();
        if inner.closed.is_none() {
            inner.outbox.push(frame);
        }
    }
}

// ---------------------------------------------------------------------------
// Messages, tokens, payload format
// ---------------------------------------------------------------------------

/// The one permit a handed-off message owes its source incarnation.
/// Released exactly once: by [`PermitToken::release`] or on drop.
#[derive(Debug)]
pub struct PermitToken {
    state: Option<Arc<ConsumerPermitState>>,
}

impl PermitToken {
    fn new(state: Arc<ConsumerPermitState>) -> Self {
        Self { state: Some(state) }
    }

    /// The source incarnation.
    pub fn incarnation(&self) -> Option<Incarnation> {
        self.state.as_ref().map(|s| s.incarnation)
    }

    /// Returns the permit to the source incarnation (a no-op credit if it
    /// was replaced). Consumes the token.
    ///
    /// # Errors
    /// [`PermitProtocolError::AccumulatorOverflow`] (the connection closes).
    pub fn release(mut self) -> Result<ReturnOutcome, PermitProtocolError> {
        match self.state.take() {
            Some(s) => s.return_permits(1),
            None => Ok(ReturnOutcome::Stale),
        }
    }
}

impl Drop for PermitToken {
    fn drop(&mut self) {
        if let Some(s) = self.state.take() {
            if let Err(e) = s.return_permits(1) {
                tracing::error!(%e, "permit return on drop failed");
            }
        }
    }
}

/// A message handed off to the application; dequeuing it releases its
/// permit (drop it or call [`ReceivedMessage::release_permit`]).
#[derive(Debug)]
pub struct ReceivedMessage {
    /// Id (with `batch_index` for batched messages).
    pub message_id: MessageIdData,
    /// Payload bytes.
    pub payload: Vec<u8>,
    /// The permit it owes.
    pub token: PermitToken,
}

impl ReceivedMessage {
    /// Returns this message's permit now.
    ///
    /// # Errors
    /// [`PermitProtocolError::AccumulatorOverflow`].
    pub fn release_permit(self) -> Result<ReturnOutcome, PermitProtocolError> {
        self.token.release()
    }
}

/// CRC32C (Castagnoli), the checksum of the entry payload format.
pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Encodes an entry payload: `[crc32c u32 BE][metadata len u32 BE][MessageMetadata]`
/// then, for a batch, per message `[len u32 BE][SingleMessageMetadata][payload]`,
/// or for a non-batched entry (`messages.len() == 1` and
/// `num_messages_in_batch` absent) the single payload directly. The
/// checksum covers everything after it.
pub fn encode_entry_payload(
    metadata: &MessageMetadata,
    messages: &[(SingleMessageMetadata, Vec<u8>)],
) -> Vec<u8> {
    let mut body = Vec::new();
    let md = metadata.encode_to_vec();
    body.extend_from_slice(&(md.len() as u32).to_be_bytes());
    body.extend_from_slice(&md);
    if metadata.num_messages_in_batch.is_none() && messages.len() == 1 {
        body.extend_from_slice(&messages[0].1);
    } else {
        for (smm, payload) in messages {
            let s = smm.encode_to_vec();
            body.extend_from_slice(&(s.len() as u32).to_be_bytes());
            body.extend_from_slice(&s);
            body.extend_from_slice(payload);
        }
    }
    let mut out = crc32c(&body).to_be_bytes().to_vec();
    out.extend_from_slice(&body);
    out
}

fn read_u32(buf: &[u8], at: usize) -> Option<u32> {
    let bytes = buf.get(at..at.checked_add(4)?)?;
    Some(u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
}

// ---------------------------------------------------------------------------
// Client consumer: the native-message path
// ---------------------------------------------------------------------------

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommandOutcomeKind {
    /// Expanded (possibly partially: `skipped` and a mid-batch failure are
    /// settled by the command's own return).
    Delivered {
        /// Deliverable indexes skipped (compacted-out, duplicate).
        skipped: u32,
        /// Whether expansion stopped at a corrupted message.
        failed_mid_batch: bool,
    },
    /// Corrupted before expansion (checksum / metadata): the whole early P
    /// was returned.
    Corrupted(ValidationError),
    /// The command's epoch is older than the consumer's: P returned.
    StaleEpoch,
    /// The consumer's incarnation was replaced, or its Subscribe is not yet
    /// acknowledged (the command was sent to the previous broker consumer):
    /// nothing returned (the broker consumer it was debited from is gone).
    StaleIncarnation,
    /// Protocol violation: the connection was closed, no credit.
    ProtocolError(PermitProtocolError),
}

/// Result of [`ClientConsumer::handle_message`]. For every non-protocol
/// outcome `delivered + returned = permits` (the messages return
/// `delivered` themselves when dequeued).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandOutcome {
    /// P settled for this command (0 on protocol error or stale incarnation).
    pub permits: u32,
    /// Messages handed off to the application.
    pub delivered: u32,
    /// Permits returned by the command itself (drained budget).
    pub returned: u32,
    /// What happened.
    pub kind: CommandOutcomeKind,
}

/// What [`ClientConsumer::resubscribe`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resubscribed {
    /// The replaced incarnation.
    pub previous: Incarnation,
    /// The new incarnation (awaiting Subscribe success).
    pub incarnation: Incarnation,
    /// Messages of the previous incarnation cleared from the receiver
    /// queue (their returns were no-ops).
    pub cleared: u32,
}

/// The client consumer's native-message path (Pulsar's `ConsumerImpl`
/// message handling) with exact permit accounting.
///
/// Owned by the connection task (`&mut self`); returns from dequeued
/// messages happen on any thread through their [`PermitToken`].
#[derive(Debug)]
pub struct ClientConsumer {
    consumer_id: u64,
    receiver_queue_size: u32,
    connection: Arc<ClientConnection>,
    state: Arc<ConsumerPermitState>,
    epoch: u64,
    queue: VecDeque<ReceivedMessage>,
    acknowledged: BTreeSet<(u64, u64, i32)>,
}

impl ClientConsumer {
    /// Writes Subscribe for `consumer_id` on `connection`. The new
    /// incarnation accepts commands and writes Flow only after
    /// [`subscribe_succeeded`](Self::subscribe_succeeded) (the broker's
    /// Success, which follows on the connection every command the broker
    /// sent to a previous incarnation).
    ///
    /// # Errors
    /// [`ClientPermitError::ConnectionClosed`].
    pub fn subscribe(
        connection: Arc<ClientConnection>,
        consumer_id: u64,
        receiver_queue_size: u32,
    ) -> Result<Self, ClientPermitError> {
        let state = connection.subscribe(consumer_id, receiver_queue_size)?;
        Ok(Self {
            consumer_id,
            receiver_queue_size,
            connection,
            state,
            epoch: 0,
            queue: VecDeque::new(),
            acknowledged: BTreeSet::new(),
        })
    }

    /// The broker acknowledged the Subscribe of `incarnation`: if it is
    /// still the current one, Flow is enabled and the full receiver queue
    /// granted (returns the permits granted).
    ///
    /// # Errors
    /// [`ClientPermitError::NotCurrent`] for a replaced incarnation (ignore
    /// it), [`ClientPermitError::AlreadySubscribed`] for a second call on the
    /// same incarnation (no second grant), [`ClientPermitError::ConnectionClosed`].
    pub fn subscribe_succeeded(
        &mut self,
        incarnation: Incarnation,
    ) -> Result<u32, ClientPermitError> {
        if incarnation != self.state.incarnation {
            return Err(ClientPermitError::NotCurrent(incarnation));
        }
        self.connection.subscribe_succeeded(&self.state)
    }

    /// The current permit state.
    pub fn state(&self) -> &Arc<ConsumerPermitState> {
        &self.state
    }

    /// The current connection.
    pub fn connection(&self) -> &Arc<ClientConnection> {
        &self.connection
    }

    /// consumer_id.
    pub fn consumer_id(&self) -> u64 {
        self.consumer_id
    }

    /// Current consumer epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Messages waiting in the receiver queue.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Dequeues the next message; the caller releases its permit (drop or
    /// [`ReceivedMessage::release_permit`]).
    pub fn receive(&mut self) -> Option<ReceivedMessage> {
        self.queue.pop_front()
    }

    /// Records an acknowledgment: redeliveries of it to this incarnation are
    /// skipped as duplicates (Pulsar's ack-grouping `isDuplicate`). The record
    /// is dropped by [`resubscribe`](Self::resubscribe): an ack sent on the
    /// old connection may have been lost with it (or with a broker restart),
    /// and the broker's redelivery must then reach the application again
    /// (at-least-once), or the message would never be acknowledged.
    pub fn acknowledge(&mut self, id: &MessageIdData) {
        self.acknowledged
            .insert((id.ledger_id, id.entry_id, id.batch_index()));
    }

    /// Replaces the incarnation: on `connection` (a reconnect when it is a
    /// different connection, a close/recreate when it is the same). Writes
    /// CloseConsumer for the old incarnation if it is still open, clears the
    /// receiver queue (those messages belong to the old incarnation, so
    /// their returns are no-ops) and writes Subscribe; the full receiver
    /// queue is granted on [`subscribe_succeeded`](Self::subscribe_succeeded).
    ///
    /// # Errors
    /// [`ClientPermitError::ConnectionClosed`] (nothing changed).
    pub fn resubscribe(
        &mut self,
        connection: Arc<ClientConnection>,
    ) -> Result<Resubscribed, ClientPermitError> {
        let state = connection.subscribe(self.consumer_id, self.receiver_queue_size)?;
        let previous = self.state.incarnation;
        if !Arc::ptr_eq(&connection, &self.connection) && !self.state.is_closed() {
            match self.connection.close_consumer(self.consumer_id) {
                Ok(_)
                | Err(ClientPermitError::ConnectionClosed(_))
                | Err(ClientPermitError::UnknownConsumer { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        // same connection: `subscribe` above already closed the old state
        let cleared = self.queue.len() as u32;
        self.queue.clear();
        self.acknowledged.clear();
        let incarnation = state.incarnation;
        self.state = state;
        self.connection = connection;
        Ok(Resubscribed {
            previous,
            incarnation,
            cleared,
        })
    }

    /// Bumps the consumer epoch (redeliver unacknowledged): the queued
    /// messages are cleared and return their permits; commands of older
    /// epochs are discarded and return their P.
    pub fn redeliver_unacknowledged(&mut self) {
        self.epoch += 1;
        self.queue.clear();
        self.connection
            .push_frame(ClientFrame::RedeliverUnacknowledged {
                consumer_id: self.consumer_id,
                consumer_epoch: self.epoch,
            });
    }

    fn protocol_error(&self, err: PermitProtocolError) -> CommandOutcome {
        self.connection.close(CloseReason::Protocol(err.clone()));
        CommandOutcome {
            permits: 0,
            delivered: 0,
            returned: 0,
            kind: CommandOutcomeKind::ProtocolError(err),
        }
    }

    fn settle(
        &self,
        permits: u32,
        delivered: u32,
        returned: u32,
        kind: CommandOutcomeKind,
    ) -> CommandOutcome {
        if returned > 0 {
            if let Err(e) = self.state.return_permits(returned) {
                return self.protocol_error(e);
            }
        }
        CommandOutcome {
            permits,
            delivered,
            returned,
            kind,
        }
    }

    fn corrupted(&self, cmd: &CommandMessage, early: u32, err: ValidationError) -> CommandOutcome {
        self.connection.push_frame(ClientFrame::AckValidationError {
            consumer_id: self.consumer_id,
            message_id: cmd.message_id.clone(),
            validation_error: err,
        });
        self.settle(early, 0, early, CommandOutcomeKind::Corrupted(err))
    }

    /// Decodes a `CommandMessage` frame and handles it with
    /// [`handle_message`](Self::handle_message). A truncated or malformed
    /// frame cannot be settled (P is unknown): the connection is closed and
    /// no credit returned ([`PermitProtocolError::Malformed`]).
    ///
    /// # Errors
    /// As [`handle_message`](Self::handle_message).
    pub fn handle_command_bytes(
        &mut self,
        command: &[u8],
        payload: &[u8],
    ) -> Result<CommandOutcome, ClientPermitError> {
        match wire::decode_command_message(command) {
            Ok(cmd) => self.handle_message(&cmd, payload),
            Err(e) => Ok(self.protocol_error(PermitProtocolError::Malformed(e))),
        }
    }

    /// Handles one delivered command with its entry payload (see
    /// [`encode_entry_payload`]): resolve P, validate, expand, settle.
    ///
    /// Outcomes: invalid / inconsistent explicit P closes the connection and
    /// returns 0; checksum or metadata corruption returns the early P; a
    /// stale epoch returns P; otherwise every deliverable, non-skipped
    /// message is handed off with one permit and the command returns the
    /// rest, so the total is exactly P.
    ///
    /// # Errors
    /// [`ClientPermitError::WrongConsumer`] (nothing settled: the caller
    /// routed the command wrongly).
    pub fn handle_message(
        &mut self,
        cmd: &CommandMessage,
        payload: &[u8],
    ) -> Result<CommandOutcome, ClientPermitError> {
        if cmd.consumer_id != self.consumer_id {
            return Err(ClientPermitError::WrongConsumer {
                expected: self.consumer_id,
                got: cmd.consumer_id,
            });
        }
        if self.state.is_closed() || !self.state.flow_enabled.load(Ordering::Acquire) {
            // a replaced incarnation, or a command the broker sent to the
            // previous incarnation before it saw our Subscribe
            return Ok(CommandOutcome {
                permits: 0,
                delivered: 0,
                returned: 0,
                kind: CommandOutcomeKind::StaleIncarnation,
            });
        }
        let early = match resolve_early(cmd) {
            Ok(r) => r.permits,
            Err(e) => return Ok(self.protocol_error(e)),
        };
        // checksum
        let (Some(crc), Some(body)) = (read_u32(payload, 0), payload.get(4..)) else {
            return Ok(self.corrupted(cmd, early, ValidationError::ChecksumMismatch));
        };
        if crc32c(body) != crc {
            return Ok(self.corrupted(cmd, early, ValidationError::ChecksumMismatch));
        }
        // metadata
        let metadata = read_u32(body, 0).and_then(|len| {
            let end = 4usize.checked_add(len as usize)?;
            let bytes = body.get(4..end)?;
            wire::decode_message_metadata(bytes).ok().map(|m| (m, end))
        });
        let Some((metadata, mut at)) = metadata else {
            return Ok(self.corrupted(cmd, early, ValidationError::BatchDeSerializeError));
        };
        let batch_size = match metadata.batch_size() {
            Ok(b) => b,
            Err(WireError::InvalidBatchSize(b)) if cmd.message_permits.is_some() => {
                return Ok(self.protocol_error(PermitProtocolError::Inconsistent {
                    explicit: cmd.message_permits.unwrap_or(0),
                    batch_size: b.max(0) as u32,
                    expected: None,
                }));
            }
            Err(_) => {
                return Ok(self.corrupted(cmd, early, ValidationError::BatchDeSerializeError));
            }
        };
        let full = match resolve_full(cmd, batch_size) {
            Ok(r) => r.permits,
            Err(e) => return Ok(self.protocol_error(e)),
        };
        let mut budget = CommandBudget::new(full);
        if cmd.consumer_epoch.is_some_and(|e| e < self.epoch) {
            let returned = budget.drain();
            return Ok(self.settle(full, 0, returned, CommandOutcomeKind::StaleEpoch));
        }
        let mut skipped = 0;
        let mut failed_mid_batch = false;
        let is_batch = metadata.num_messages_in_batch.is_some();
        for index in 0..batch_size {
            // parse message `index` (also for non-deliverable ones, to advance)
            let (smm, payload_start) = if is_batch {
                let parsed = read_u32(body, at).and_then(|len| {
                    let start = at.checked_add(4)?;
                    let end = start.checked_add(len as usize)?;
                    let smm = wire::decode_single_message_metadata(body.get(start..end)?).ok()?;
                    Some((smm, end))
                });
                match parsed {
                    Some((smm, end)) => (Some(smm), end),
                    None => {
                        failed_mid_batch = true;
                        break;
                    }
                }
            } else {
                (None, at)
            };
            let payload_len = match &smm {
                Some(s) if s.payload_size >= 0 => s.payload_size as usize,
                Some(_) => {
                    failed_mid_batch = true;
                    break;
                }
                None => body.len().saturating_sub(payload_start),
            };
            let payload_end = payload_start.saturating_add(payload_len);
            at = payload_end;
            if !wire::is_deliverable(&cmd.ack_set, index) {
                continue;
            }
            let batch_index = if is_batch { index as i32 } else { -1 };
            let duplicate = self.acknowledged.contains(&(
                cmd.message_id.ledger_id,
                cmd.message_id.entry_id,
                batch_index,
            ));
            if smm.as_ref().is_some_and(|s| s.compacted_out()) || duplicate {
                skipped += 1;
                continue;
            }
            if let Err(BudgetError::Exhausted { permits }) = budget.claim() {
                // more deliverable messages than P: malformed command
                let _ = budget.drain();
                return Ok(self.protocol_error(PermitProtocolError::BudgetExhausted { permits }));
            }
            // hand-off: build the message; a truncated payload fails it
            match body.get(payload_start..payload_end) {
                Some(bytes) => {
                    self.queue.push_back(ReceivedMessage {
                        message_id: MessageIdData {
                            batch_index: is_batch.then_some(batch_index),
                            batch_size: is_batch.then_some(batch_size as i32),
                            ack_set: Vec::new(),
                            ..cmd.message_id.clone()
                        },
                        payload: bytes.to_vec(),
                        token: PermitToken::new(Arc::clone(&self.state)),
                    });
                }
                None => {
                    // invariant: claim() just succeeded, so a unit is claimed
                    let _ = budget.restore();
                    failed_mid_batch = true;
                    break;
                }
            }
        }
        if failed_mid_batch {
            self.connection.push_frame(ClientFrame::AckValidationError {
                consumer_id: self.consumer_id,
                message_id: cmd.message_id.clone(),
                validation_error: ValidationError::BatchDeSerializeError,
            });
        }
        let delivered = budget.claimed();
        let returned = budget.drain();
        Ok(self.settle(
            full,
            delivered,
            returned,
            CommandOutcomeKind::Delivered {
                skipped,
                failed_mid_batch,
            },
        ))
    }
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests {
    use super::*;

    fn cmd(permits: Option<u32>, ack_set: Vec<i64>) -> CommandMessage {
        CommandMessage {
            consumer_id: 1,
            message_id: MessageIdData {
                ledger_id: 3,
                entry_id: 4,
                ..Default::default()
            },
            ack_set,
            message_permits: permits,
            consumer_epoch: Some(0),
            ..Default::default()
        }
    }

    fn batch(b: usize, compacted: &[usize]) -> Vec<u8> {
        let md = MessageMetadata {
            producer_name: "p".into(),
            num_messages_in_batch: Some(b as i32),
            ..Default::default()
        };
        let msgs: Vec<_> = (0..b)
            .map(|i| {
                (
                    SingleMessageMetadata {
                        payload_size: 2,
                        compacted_out: compacted.contains(&i).then_some(true),
                        ..Default::default()
                    },
                    vec![i as u8, 0xAB],
                )
            })
            .collect();
        encode_entry_payload(&md, &msgs)
    }

    /// rq = 100 (threshold 50): returns stay in the accumulator, so tests can
    /// read exactly what a command returned.
    fn consumer() -> (Arc<ClientConnection>, ClientConsumer) {
        let conn = Arc::new(ClientConnection::new(1));
        let mut c = ClientConsumer::subscribe(Arc::clone(&conn), 1, 100).unwrap();
        let inc = c.state().incarnation();
        assert_eq!(c.subscribe_succeeded(inc).unwrap(), 100);
        let frames = conn.take_outbox();
        assert_eq!(frames.len(), 2, "Subscribe then Flow(rq)");
        (conn, c)
    }

    fn flows(frames: &[ClientFrame]) -> Vec<(Incarnation, u32)> {
        frames
            .iter()
            .filter_map(|f| match f {
                ClientFrame::Flow {
                    incarnation,
                    command,
                } => Some((*incarnation, command.message_permits)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn ladder_early_and_full() {
        let explicit = cmd(Some(3), vec![0b111]);
        assert_eq!(resolve_early(&explicit).unwrap().permits, 3);
        assert_eq!(
            resolve_full(&explicit, 10).unwrap().source,
            PermitSource::Explicit
        );
        // early counts all words; full only bits below B
        let legacy_ack = cmd(None, vec![0b111 | (1 << 40)]);
        assert_eq!(resolve_early(&legacy_ack).unwrap().permits, 4);
        assert_eq!(
            resolve_full(&legacy_ack, 10).unwrap(),
            ResolvedPermits {
                permits: 3,
                source: PermitSource::AckSet
            }
        );
        let legacy = cmd(None, vec![]);
        assert_eq!(resolve_early(&legacy).unwrap().source, PermitSource::Legacy);
        assert_eq!(
            resolve_full(&legacy, 10).unwrap(),
            ResolvedPermits {
                permits: 10,
                source: PermitSource::BatchMetadata
            }
        );
        // old broker, ambiguous: keeps the legacy 1, never an error
        assert_eq!(
            resolve_full(&cmd(None, vec![0b10]), 1).unwrap(),
            ResolvedPermits {
                permits: 1,
                source: PermitSource::Legacy
            }
        );
    }

    #[test]
    fn ladder_rejects_invalid_and_inconsistent_explicit() {
        assert_eq!(
            resolve_early(&cmd(Some(0), vec![])),
            Err(PermitProtocolError::InvalidExplicit(0))
        );
        assert_eq!(
            resolve_early(&cmd(Some(u32::MAX), vec![])),
            Err(PermitProtocolError::InvalidExplicit(u32::MAX))
        );
        assert_eq!(
            resolve_full(&cmd(Some(2), vec![0b111]), 10),
            Err(PermitProtocolError::Inconsistent {
                explicit: 2,
                batch_size: 10,
                expected: Some(3)
            })
        );
        assert_eq!(
            resolve_full(&cmd(Some(1), vec![]), 10),
            Err(PermitProtocolError::Inconsistent {
                explicit: 1,
                batch_size: 10,
                expected: Some(10)
            })
        );
        assert_eq!(
            resolve_full(&cmd(Some(1), vec![0]), 4),
            Err(PermitProtocolError::Inconsistent {
                explicit: 1,
                batch_size: 4,
                expected: None
            })
        );
    }

    /// An ack recorded before a reconnect may have been lost with the old
    /// connection: the redelivery to the new incarnation must reach the
    /// application (found by the simulator: a restart dropped in-flight acks
    /// and the redelivered batch was skipped forever, so it was never acked).
    #[test]
    fn redelivery_after_resubscribe_is_not_skipped_as_duplicate() {
        let (_conn, mut c) = consumer();
        let out = c
            .handle_message(&cmd(Some(2), vec![]), &batch(2, &[]))
            .unwrap();
        assert_eq!(out.delivered, 2);
        while let Some(m) = c.receive() {
            c.acknowledge(&m.message_id);
        }
        // Same incarnation: a redelivery is a duplicate, its P comes back.
        let dup = c
            .handle_message(&cmd(Some(2), vec![]), &batch(2, &[]))
            .unwrap();
        assert_eq!((dup.delivered, dup.returned), (0, 2));
        // New connection, new incarnation: delivered again.
        let conn2 = Arc::new(ClientConnection::new(2));
        let r = c.resubscribe(Arc::clone(&conn2)).unwrap();
        c.subscribe_succeeded(r.incarnation).unwrap();
        let again = c
            .handle_message(&cmd(Some(2), vec![]), &batch(2, &[]))
            .unwrap();
        assert_eq!(again.delivered, 2, "{again:?}");
    }

    #[test]
    fn explicit_zero_closes_connection_with_zero_credit() {
        let (conn, mut c) = consumer();
        let out = c
            .handle_message(&cmd(Some(0), vec![]), &batch(1, &[]))
            .unwrap();
        assert_eq!(out.returned, 0);
        assert_eq!(out.delivered, 0);
        assert_eq!(
            out.kind,
            CommandOutcomeKind::ProtocolError(PermitProtocolError::InvalidExplicit(0))
        );
        assert!(conn.is_closed());
        assert!(c.state().is_closed());
        assert_eq!(c.state().accumulated(), 0);
        assert!(flows(&conn.take_outbox()).is_empty());
        // later commands on the dead incarnation settle nothing
        let later = c
            .handle_message(&cmd(Some(1), vec![]), &batch(1, &[]))
            .unwrap();
        assert_eq!(later.kind, CommandOutcomeKind::StaleIncarnation);
    }

    #[test]
    fn inconsistent_explicit_closes_connection_with_zero_credit() {
        let (conn, mut c) = consumer();
        let out = c
            .handle_message(&cmd(Some(2), vec![0b111]), &batch(10, &[]))
            .unwrap();
        assert!(matches!(
            out.kind,
            CommandOutcomeKind::ProtocolError(PermitProtocolError::Inconsistent { .. })
        ));
        assert_eq!((out.delivered, out.returned), (0, 0));
        assert_eq!(c.queued(), 0);
        assert!(matches!(
            conn.close_reason(),
            Some(CloseReason::Protocol(
                PermitProtocolError::Inconsistent { .. }
            ))
        ));
    }

    #[test]
    fn checksum_failure_on_p10_batch_returns_exactly_10() {
        let (conn, mut c) = consumer();
        let mut payload = batch(10, &[]);
        let last = payload.len() - 1;
        payload[last] ^= 0xFF;
        let out = c.handle_message(&cmd(Some(10), vec![]), &payload).unwrap();
        assert_eq!(
            out.kind,
            CommandOutcomeKind::Corrupted(ValidationError::ChecksumMismatch)
        );
        assert_eq!((out.permits, out.delivered, out.returned), (10, 0, 10));
        assert_eq!(c.state().accumulated(), 10);
        assert!(!conn.is_closed());
        assert!(conn.take_outbox().iter().any(|f| matches!(
            f,
            ClientFrame::AckValidationError {
                validation_error: ValidationError::ChecksumMismatch,
                ..
            }
        )));
    }

    #[test]
    fn partial_batch_with_compacted_out_and_duplicate_returns_exactly_p() {
        let (_conn, mut c) = consumer();
        // B = 8, indexes 0,2,3,5,7 deliverable (P = 5); 3 compacted out, 5 acked
        let ack = wire::ack_set_from_indexes([0, 2, 3, 5, 7]);
        c.acknowledge(&MessageIdData {
            ledger_id: 3,
            entry_id: 4,
            batch_index: Some(5),
            ..Default::default()
        });
        let out = c
            .handle_message(&cmd(Some(5), ack), &batch(8, &[3]))
            .unwrap();
        assert_eq!(
            out.kind,
            CommandOutcomeKind::Delivered {
                skipped: 2,
                failed_mid_batch: false
            }
        );
        assert_eq!((out.delivered, out.returned), (3, 2));
        let ids: Vec<i32> = std::iter::from_fn(|| c.receive())
            .map(|m| {
                let i = m.message_id.batch_index();
                assert_eq!(
                    m.release_permit().unwrap(),
                    ReturnOutcome::Accepted { flow_requested: 0 }
                );
                i
            })
            .collect();
        assert_eq!(ids, vec![0, 2, 7]);
        assert_eq!(c.state().accumulated(), 5);
    }

    #[test]
    fn mid_batch_failure_and_failed_handoff_return_the_rest() {
        let (_conn, mut c) = consumer();
        // message 2's payload_size runs past the end: claim, restore, stop
        let md = MessageMetadata {
            producer_name: "p".into(),
            num_messages_in_batch: Some(4),
            ..Default::default()
        };
        let mut msgs: Vec<_> = (0..3)
            .map(|i| {
                (
                    SingleMessageMetadata {
                        payload_size: 1,
                        ..Default::default()
                    },
                    vec![i],
                )
            })
            .collect();
        msgs[2].0.payload_size = 50;
        let payload = encode_entry_payload(&md, &msgs);
        let out = c.handle_message(&cmd(Some(4), vec![]), &payload).unwrap();
        assert_eq!(
            out.kind,
            CommandOutcomeKind::Delivered {
                skipped: 0,
                failed_mid_batch: true
            }
        );
        assert_eq!((out.delivered, out.returned), (2, 2));
        // payload cut inside message 1's header: only message 0 delivered
        let full = batch(4, &[]);
        let mut cut = full[4..30].to_vec();
        let crc = crc32c(&cut);
        cut.splice(0..0, crc.to_be_bytes());
        let out = c.handle_message(&cmd(Some(4), vec![]), &cut).unwrap();
        assert_eq!(out.delivered + out.returned, 4);
        assert!(matches!(
            out.kind,
            CommandOutcomeKind::Delivered {
                failed_mid_batch: true,
                ..
            }
        ));
    }

    #[test]
    fn stale_epoch_returns_p_and_cleared_messages_return_once() {
        let (_conn, mut c) = consumer();
        let out = c
            .handle_message(&cmd(Some(3), vec![]), &batch(3, &[]))
            .unwrap();
        assert_eq!((out.delivered, out.returned), (3, 0));
        c.redeliver_unacknowledged();
        // the 3 queued messages were cleared and returned 1 each
        assert_eq!(c.state().accumulated(), 3);
        let stale = c
            .handle_message(&cmd(Some(3), vec![]), &batch(3, &[]))
            .unwrap();
        assert_eq!(stale.kind, CommandOutcomeKind::StaleEpoch);
        assert_eq!(stale.returned, 3);
        assert_eq!(c.state().accumulated(), 6);
    }

    #[test]
    fn metadata_corruption_and_old_broker_paths() {
        let (conn, mut c) = consumer();
        // invalid B without explicit: corruption, early P (1) returned
        let md = MessageMetadata {
            producer_name: "p".into(),
            num_messages_in_batch: Some(0),
            ..Default::default()
        };
        let payload = encode_entry_payload(&md, &[]);
        let out = c.handle_message(&cmd(None, vec![]), &payload).unwrap();
        assert_eq!(
            out.kind,
            CommandOutcomeKind::Corrupted(ValidationError::BatchDeSerializeError)
        );
        assert_eq!(out.returned, 1);
        // invalid B with explicit: protocol error
        let out = c.handle_message(&cmd(Some(1), vec![]), &payload).unwrap();
        assert!(matches!(out.kind, CommandOutcomeKind::ProtocolError(_)));
        assert!(conn.is_closed());
        // truncated / empty payload: checksum failure, never a panic
        let (_conn, mut c) = consumer();
        for p in [&[][..], &[1, 2][..], &[0, 0, 0, 0][..]] {
            let out = c.handle_message(&cmd(Some(2), vec![]), p).unwrap();
            assert_eq!(out.returned, 2);
        }
    }

    #[test]
    fn flow_drains_at_half_queue_and_is_revalidated_on_same_connection_recreate() {
        let conn = Arc::new(ClientConnection::new(7));
        let mut c = ClientConsumer::subscribe(Arc::clone(&conn), 1, 4).unwrap();
        let first = c.state().incarnation();
        c.subscribe_succeeded(first).unwrap();
        let old = Arc::clone(c.state());
        assert_eq!(
            old.return_permits(1),
            Ok(ReturnOutcome::Accepted { flow_requested: 0 })
        );
        assert_eq!(
            old.return_permits(1),
            Ok(ReturnOutcome::Accepted { flow_requested: 2 })
        );
        // recreate on the SAME connection before the connection task runs
        let r = c.resubscribe(Arc::clone(&conn)).unwrap();
        let second = c.state().incarnation();
        assert_eq!((r.previous, r.incarnation, r.cleared), (first, second, 0));
        assert_ne!(first, second);
        // a command the broker sent to `first` before it saw the new
        // Subscribe arrives before Success: discarded, no credit
        let early = c
            .handle_message(&cmd(Some(1), vec![]), &batch(1, &[]))
            .unwrap();
        assert_eq!(early.kind, CommandOutcomeKind::StaleIncarnation);
        assert_eq!(
            c.subscribe_succeeded(first),
            Err(ClientPermitError::NotCurrent(first))
        );
        assert_eq!(c.subscribe_succeeded(second).unwrap(), 4);
        assert_eq!(old.return_permits(5), Ok(ReturnOutcome::Stale));
        let report = conn.flush_flows();
        assert_eq!(report.written, vec![]);
        assert_eq!(report.dropped, vec![(first, 2)]);
        let frames = conn.take_outbox();
        assert_eq!(
            flows(&frames),
            vec![(first, 4), (second, 4)],
            "initial grants only; the old incarnation's queued Flow was dropped"
        );
        assert!(
            matches!(frames[2], ClientFrame::CloseConsumer { incarnation, .. } if incarnation == first)
        );
        assert!(
            matches!(frames[3], ClientFrame::Subscribe { incarnation, .. } if incarnation == second)
        );
        c.state().return_permits(2).unwrap();
        assert_eq!(conn.flush_flows().written, vec![(second, 2)]);
        // reconnect to a different connection: full queue granted there
        let conn2 = Arc::new(ClientConnection::new(8));
        let r = c.resubscribe(Arc::clone(&conn2)).unwrap();
        assert_eq!(r.incarnation.connection_id, 8);
        assert_eq!(c.subscribe_succeeded(r.incarnation).unwrap(), 4);
        let old_frames = conn.take_outbox();
        assert_eq!(flows(&old_frames), vec![(second, 2)]);
        assert!(
            matches!(old_frames.last(), Some(ClientFrame::CloseConsumer { incarnation, .. }) if *incarnation == second)
        );
        assert_eq!(flows(&conn2.take_outbox()), vec![(r.incarnation, 4)]);
    }

    /// P2 regression: Subscribe succeeds once per incarnation, so the
    /// receiver queue is granted once; a second call is a typed error that
    /// writes nothing and changes nothing.
    #[test]
    fn subscribe_succeeded_twice_grants_once() {
        let conn = Arc::new(ClientConnection::new(1));
        let st = conn.subscribe(7, 100).unwrap();
        assert_eq!(conn.subscribe_succeeded(&st), Ok(100));
        st.return_permits(3).unwrap();
        assert_eq!(
            conn.subscribe_succeeded(&st),
            Err(ClientPermitError::AlreadySubscribed(st.incarnation()))
        );
        assert_eq!(st.accumulated(), 3, "the accumulator is left alone");
        let frames = conn.take_outbox();
        assert_eq!(flows(&frames), vec![(st.incarnation(), 100)]);
        // Through the consumer too.
        let mut c = ClientConsumer::subscribe(Arc::clone(&conn), 8, 10).unwrap();
        let inc = c.state().incarnation();
        assert_eq!(c.subscribe_succeeded(inc), Ok(10));
        assert_eq!(
            c.subscribe_succeeded(inc),
            Err(ClientPermitError::AlreadySubscribed(inc))
        );
        assert_eq!(flows(&conn.take_outbox()), vec![(inc, 10)]);
        // A new incarnation is granted again.
        let r = c.resubscribe(Arc::clone(&conn)).unwrap();
        assert_eq!(c.subscribe_succeeded(r.incarnation), Ok(10));
    }

    #[test]
    fn accumulator_overflow_closes_the_connection() {
        let conn = Arc::new(ClientConnection::new(1));
        let state = conn.subscribe(1, 0).unwrap();
        // flow disabled: returns accumulate
        state.return_permits(MAX_PERMITS).unwrap();
        assert_eq!(
            state.return_permits(1),
            Err(PermitProtocolError::AccumulatorOverflow {
                current: u64::from(MAX_PERMITS),
                added: 1
            })
        );
        assert!(state.is_closed());
        assert!(conn.is_closed());
        assert_eq!(state.return_permits(1), Ok(ReturnOutcome::Stale));
        assert_eq!(
            conn.subscribe(2, 10).unwrap_err(),
            ClientPermitError::ConnectionClosed(1)
        );
    }

    #[test]
    fn budget_claim_restore_drain() {
        let mut b = CommandBudget::new(2);
        assert_eq!(b.restore(), Err(BudgetError::NothingClaimed { permits: 2 }));
        b.claim().unwrap();
        b.claim().unwrap();
        assert_eq!(b.claim(), Err(BudgetError::Exhausted { permits: 2 }));
        b.restore().unwrap();
        assert_eq!(b.claimed(), 1);
        assert_eq!(b.drain(), 1);
    }

    #[test]
    fn truncated_command_frame_closes_with_zero_credit() {
        let (conn, mut c) = consumer();
        let bytes = cmd(Some(3), vec![]).encode_to_vec();
        let ok = c.handle_command_bytes(&bytes, &batch(3, &[])).unwrap();
        assert_eq!((ok.delivered, ok.returned), (3, 0));
        // cut inside the last field (message_permits' value): a decode error
        // (a cut on a field boundary is a valid shorter message; the frame's
        // length prefix, not protobuf, detects that)
        let out = c
            .handle_command_bytes(&bytes[..bytes.len() - 1], &batch(3, &[]))
            .unwrap();
        assert!(matches!(
            out.kind,
            CommandOutcomeKind::ProtocolError(PermitProtocolError::Malformed(
                WireError::Decode { .. }
            ))
        ));
        assert_eq!(out.returned, 0);
        assert!(conn.is_closed());
        // the 3 delivered messages now belong to a closed incarnation
        while let Some(m) = c.receive() {
            assert_eq!(m.release_permit(), Ok(ReturnOutcome::Stale));
        }
        assert_eq!(c.state().accumulated(), 0);
    }

    #[test]
    fn wrong_consumer_is_rejected_without_settling() {
        let (_conn, mut c) = consumer();
        let mut m = cmd(Some(1), vec![]);
        m.consumer_id = 9;
        assert_eq!(
            c.handle_message(&m, &batch(1, &[])),
            Err(ClientPermitError::WrongConsumer {
                expected: 1,
                got: 9
            })
        );
        assert_eq!(c.state().accumulated(), 0);
    }
}
