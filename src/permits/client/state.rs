//! Per-incarnation permit state ([`ConsumerPermitState`]) and the client
//! connection that writes Flow after revalidating the incarnation.

use std::collections::{BTreeMap, VecDeque};

use super::resolution::PermitProtocolError;
use crate::proto::wire::{CommandFlow, MessageIdData, MAX_PERMITS};
use crate::sync::{Arc, AtomicBool, AtomicU64, Mutex, Ordering};

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
    pub(super) flow_enabled: AtomicBool,
    closed: AtomicBool,
    flows: Arc<FlowQueue>,
}

impl ConsumerPermitState {
    /// The incarnation identity.
    pub fn incarnation(&self) -> Incarnation {
        self.incarnation
    }

    /// `[connection_id, consumer_id]` of the trace lines (src/trace.rs).
    pub(crate) fn trace_key(&self) -> (u64, u64) {
        (self.incarnation.connection_id, self.consumer_id)
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
                crate::trace::permits::drain(self.trace_key(), flow_requested);
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
    /// A well-formed frame that is not a MESSAGE reached the message path.
    #[error("{0} frame is not a MESSAGE")]
    UnexpectedCommand(&'static str),
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
            crate::trace::permits::replace((self.id, consumer_id));
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
                crate::trace::permits::conn_task_write(
                    (self.id, req.consumer_id),
                    req.permits,
                    true,
                );
            } else {
                tracing::debug!(incarnation = ?req.incarnation, permits = req.permits, "dropping stale Flow");
                report.dropped.push((req.incarnation, req.permits));
                crate::trace::permits::conn_task_write(
                    (self.id, req.consumer_id),
                    req.permits,
                    false,
                );
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
            crate::trace::permits::flush_residual((self.id, consumer_id), drained as u32);
        }
        Ok(drained as u32)
    }

    /// Takes the frames written so far, in order (the socket's view).
    pub fn take_outbox(&self) -> Vec<ClientFrame> {
        std::mem::take(&mut self.inner.lock().outbox)
    }

    pub(super) fn push_frame(&self, frame: ClientFrame) {
        let mut inner = self.inner.lock();
        if inner.closed.is_none() {
            inner.outbox.push(frame);
        }
    }
}
