//! Pulsar's binary protocol: the `PulsarApi.proto` (proto2) messages, the
//! frames that carry them, the metadata of a published entry, and the one
//! proto2 `required`-field walker every decoder runs. Every component
//! (`broker`, `permits`, `pending_ack`, `delayed`, the deletion state's
//! `PositionInfo`), `serve` and the simulator use these types, so the
//! bytes at each boundary are written and read by one codec
//! (`bash .ci/check protoc` compares them with protoc's).
//!
//! | submodule | what it holds | Pulsar counterpart |
//! |---|---|---|
//! | [`wire`] | the commands of the consumer path (`BaseCommand`, `CommandMessage`, `CommandFlow`, `CommandSubscribe`, `CommandAck`, ...), `MessageIdData`, required-field checks; `ack_set` helpers | `PulsarApi.proto` |
//! | [`metadata`] | `MessageMetadata` with every field (`deliver_at_time`, transaction ids, chunking, keys, ...), `SingleMessageMetadata`, `KeyValue`, `EncryptionKeys` | `PulsarApi.proto` |
//! | [`command`] | the broker core's envelope (`BaseCommand` with every command it handles: connect, lookup, producer, send, errors, transactions) | `PulsarApi.proto` |
//! | [`txn`] | transaction commands, the markers' metadata and entries, the coordinator's log entry | `PulsarApi.proto`, `PulsarTransactionMetadata.proto` |
//! | [`frame`] | simple / payload frames, entry payload (`0x0e01` crc32c, `0x0e02` broker-entry prefix), batch framing | `Commands` (binary protocol framing) |
//! | [`presence`] | the proto2 `required`-field presence walk shared by every decoder | protobuf-java `isInitialized` |
//!
//! This module depends on nothing else in the crate: it sits below every
//! component (`docs/internals/ARCHITECTURE.md`, the layer picture).

pub mod command;
pub mod frame;
pub mod metadata;
pub mod presence;
pub mod txn;
pub mod wire;
