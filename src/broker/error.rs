//! The core's errors: [`BrokerError`] (a request refused, answered to the
//! client with a `ServerError` code; the connection stays open) and
//! [`ConnectionError`] (the connection is closed, with the reason logged by
//! the adapter).

use crate::proto::command::server_error;

/// A refused request, answered as `CommandError` (or the response's error
/// fields) with [`BrokerError::server_error`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BrokerError {
    /// Storage or component failure (`PersistenceError`).
    #[error("{0}")]
    Component(String),
    /// Topic name not `persistent://tenant/namespace/topic` (`InvalidTopicName`).
    #[error("invalid topic name {0:?}: expected persistent://tenant/namespace/topic")]
    InvalidTopic(String),
    /// A `non-persistent://` topic: answered `NotAllowedError`, which the
    /// official clients treat as final (the C++ client's
    /// `isResultRetryable` lists `ResultNotAllowedError` as not retryable),
    /// so the application's create or subscribe fails at once instead of
    /// retrying `InvalidTopicName` until its operation timeout.
    #[error("non-persistent topics are not supported by pulsar-core: {0:?}")]
    NonPersistent(String),
    /// Exclusive subscription already has a consumer, or a sub type
    /// mismatch (`ConsumerBusy`).
    #[error("{0}")]
    ConsumerBusy(String),
    /// The topic cannot serve yet: its transaction buffer has not recovered
    /// (`ServiceNotReady`).
    #[error("{0}")]
    NotReady(String),
    /// A producer name already in use on the topic, or a shared producer
    /// while an exclusive one holds or waits for the topic (`ProducerBusy`).
    #[error("{0}")]
    ProducerBusy(String),
    /// An exclusive producer refused or fenced out (`ProducerFenced`).
    #[error("{0}")]
    ProducerFenced(String),
    /// A request Pulsar refuses as not allowed, e.g. a non-durable
    /// subscribe to a durable subscription's name (`NotAllowedError`).
    #[error("{0}")]
    NotAllowed(String),
}

impl BrokerError {
    /// The `ServerError` value Pulsar answers with.
    pub fn server_error(&self) -> i32 {
        match self {
            BrokerError::Component(_) => server_error::PERSISTENCE_ERROR,
            BrokerError::InvalidTopic(_) => server_error::INVALID_TOPIC_NAME,
            BrokerError::NonPersistent(_) => server_error::NOT_ALLOWED_ERROR,
            BrokerError::ConsumerBusy(_) => server_error::CONSUMER_BUSY,
            BrokerError::NotReady(_) => server_error::SERVICE_NOT_READY,
            BrokerError::ProducerBusy(_) => server_error::PRODUCER_BUSY,
            BrokerError::ProducerFenced(_) => server_error::PRODUCER_FENCED,
            BrokerError::NotAllowed(_) => server_error::NOT_ALLOWED_ERROR,
        }
    }
}

pub(crate) fn comp(e: impl std::fmt::Display) -> BrokerError {
    BrokerError::Component(e.to_string())
}

/// Why the core closed a connection (Pulsar's `ServerCnx` closes the channel
/// on each): the adapter closes its socket. The core has already forgotten
/// the connection (its consumers' unacknowledged entries went to replay).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnectionError {
    /// A command that does not decode, lacks a required field, has a type
    /// that is no `BaseCommand.Type`, or carries a payload it cannot have.
    #[error("malformed frame: {0}")]
    Malformed(String),
    /// A command before CONNECT, or a second CONNECT.
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// An input for a connection the core does not know (never opened, or
    /// already closed).
    #[error("unknown connection {0}")]
    UnknownConnection(u64),
}
