//! Pulsar's binary-protocol framing: simple and payload frames, the entry
//! payload (`headersAndPayload`) with its crc32c, the broker-entry metadata
//! prefix and the batch (`SingleMessageMetadata`) framing.
//!
//! All integers are big-endian.
//!
//! ```text
//! simple frame   [total_size u32][command_size u32][BaseCommand]
//! payload frame  [total_size u32][command_size u32][BaseCommand][headers_and_payload]
//!                  total_size = 4 + command_size + len(headers_and_payload)
//! headers_and_payload
//!   [0x0e02 u16][size u32][BrokerEntryMetadata]     optional, recognised and skipped
//!   [0x0e01 u16][crc32c u32]                         optional (no checksum without it)
//!   [metadata_size u32][MessageMetadata][payload]
//!                  crc32c (Castagnoli) covers metadata_size + metadata + payload
//! batch payload  per message: [size u32][SingleMessageMetadata][payload_size bytes]
//! ```
//!
//! Corresponds to Pulsar's `Commands` (`serializeWithSize`,
//! `serializeMetadataAndPayload`, `skipBrokerEntryMetadataIfExist`,
//! `hasChecksum`, `parseMessageMetadata`), `ClientCnx`/`ConsumerImpl`
//! checksum verification and `Commands.deSerializeSingleMessageInBatch`.
//!
//! # Errors and allocation
//! Every malformed input is a [`FrameError`]: sizes that disagree with each
//! other or with the buffer, truncation, a frame above the size limit, an
//! unknown `0x0eXX` magic, a checksum mismatch, a bad command or metadata.
//! Decoders only slice the input; no length read off the wire is used to
//! allocate, and a frame is rejected before anything is decoded when its
//! `total_size` exceeds the caller's limit.
//!
//! # Guarantees
//!
//! No spec models the framing; `tests/wire_frames.rs` checks it:
//!
//! - a MESSAGE frame with a batch payload settles exactly P on the client
//!   ([`decode_frame`], [`parse_entry_payload`], `ClientConsumer::handle_frame`;
//!   `golden_message_frame_with_batch_payload_settles_exactly_p`);
//! - encoder output is the protocol's bytes ([`encode_payload_frame`],
//!   [`encode_simple_frame`], [`encode_entry_payload`]; the `golden_message_frame_*`
//!   tests, `golden_flow_frame`);
//! - crc32c is Castagnoli over metadata size + metadata + payload
//!   ([`crc32c()`], [`parse_entry_payload`];
//!   `crc32c_matches_the_castagnoli_check_value`, `malformed_frames_are_typed_errors`);
//! - every malformed frame is a typed error, never a panic or a large
//!   allocation (all decoders; `malformed_frames_are_typed_errors`,
//!   `decoders_never_panic_on_random_and_mutated_bytes`).
//!
//! Pure functions on byte slices: no shared state, callable from any thread.

use prost::Message;

use crate::proto::metadata::{MessageMetadata, SingleMessageMetadata};
use crate::proto::wire::{self, BaseCommand, Command, WireError};

/// Magic number that precedes the crc32c of an entry payload.
pub const MAGIC_CRC32C: u16 = 0x0e01;
/// Magic number of the broker-entry metadata prefix.
pub const MAGIC_BROKER_ENTRY_METADATA: u16 = 0x0e02;
/// Pulsar's default frame limit: `maxMessageSize` (5 MiB) plus
/// `Commands.MESSAGE_SIZE_FRAME_PADDING` (10 KiB), in bytes.
pub const DEFAULT_MAX_FRAME_SIZE: usize = 5 * 1024 * 1024 + 10 * 1024;

/// A malformed frame or entry payload.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The input ends before `what` is complete.
    #[error("truncated {what}: needs {needed} bytes, {available} available")]
    Truncated {
        /// The part being read.
        what: &'static str,
        /// Bytes needed from the part's start.
        needed: u64,
        /// Bytes available from the part's start.
        available: usize,
    },
    /// `total_size` above the frame limit.
    #[error("frame total_size {total_size} exceeds the limit of {max} bytes")]
    FrameTooLarge {
        /// Declared total size.
        total_size: u32,
        /// The limit.
        max: usize,
    },
    /// The buffer holds more or fewer bytes than `4 + total_size`.
    #[error("frame declares total_size {total_size} but {actual} bytes follow it")]
    TotalSizeMismatch {
        /// Declared total size.
        total_size: u32,
        /// Bytes after the size field.
        actual: usize,
    },
    /// `total_size` below 4: the frame cannot hold its `command_size`.
    #[error("frame total_size {total_size} is below 4, the size of its command_size field")]
    FrameTooSmall {
        /// Declared total size.
        total_size: u32,
    },
    /// `command_size` does not fit inside `total_size`.
    #[error("command_size {command_size} does not fit in total_size {total_size}")]
    CommandSizeExceedsFrame {
        /// Declared command size.
        command_size: u32,
        /// Declared total size.
        total_size: u32,
    },
    /// A payload follows a command type that never carries one, or a
    /// MESSAGE frame has none.
    #[error("{command} frame {problem}")]
    UnexpectedPayload {
        /// The command type name.
        command: &'static str,
        /// `"carries a payload"` or `"has no payload"`.
        problem: &'static str,
    },
    /// A `0x0eXX` magic other than the two Pulsar defines.
    #[error("unknown magic number {0:#06x}")]
    BadMagic(u16),
    /// The crc32c over metadata size + metadata + payload differs.
    #[error("checksum mismatch: frame says {expected:#010x}, computed {computed:#010x}")]
    ChecksumMismatch {
        /// The checksum carried in the payload.
        expected: u32,
        /// The checksum computed over the bytes.
        computed: u32,
    },
    /// The command or metadata protobuf is malformed or misses a required field.
    #[error("bad {what}: {source}")]
    Proto {
        /// `"BaseCommand"`, `"MessageMetadata"`, `"SingleMessageMetadata"`.
        what: &'static str,
        /// The decoder's error.
        source: WireError,
    },
    /// `SingleMessageMetadata.payload_size` is negative.
    #[error("negative payload_size {0} in SingleMessageMetadata")]
    NegativePayloadSize(i32),
}

/// CRC32C (Castagnoli), the checksum of Pulsar entry payloads (the `crc32c`
/// crate; SSE4.2 / ARMv8 CRC when available).
pub fn crc32c(data: &[u8]) -> u32 {
    ::crc32c::crc32c(data)
}

fn read_u32(buf: &[u8], at: usize, what: &'static str) -> Result<u32, FrameError> {
    match buf.get(at..).and_then(|b| b.get(..4)) {
        Some(b) => Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]])),
        None => Err(FrameError::Truncated {
            what,
            needed: 4,
            available: buf.len().saturating_sub(at),
        }),
    }
}

fn peek_u16(buf: &[u8], at: usize) -> Option<u16> {
    let b = buf.get(at..)?.get(..2)?;
    Some(u16::from_be_bytes([b[0], b[1]]))
}

fn take<'a>(
    buf: &'a [u8],
    at: usize,
    len: u32,
    what: &'static str,
) -> Result<&'a [u8], FrameError> {
    let available = buf.len().saturating_sub(at);
    if u64::from(len) > available as u64 {
        return Err(FrameError::Truncated {
            what,
            needed: u64::from(len),
            available,
        });
    }
    Ok(&buf[at..at + len as usize])
}

/// One decoded frame. `headers_and_payload` borrows from the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame<'a> {
    /// The envelope as decoded.
    pub base: BaseCommand,
    /// The command it carries.
    pub command: Command,
    /// The payload section of a payload frame (MESSAGE), `None` for a
    /// simple frame.
    pub headers_and_payload: Option<&'a [u8]>,
}

/// Decodes the first frame of `buf`; returns it and the bytes it used
/// (`4 + total_size`), so a stream can be decoded frame by frame.
///
/// # Errors
/// [`FrameError::Truncated`] when `buf` holds less than one whole frame
/// (read more and retry), [`FrameError::FrameTooLarge`] (checked before
/// anything else is read), [`FrameError::FrameTooSmall`],
/// [`FrameError::CommandSizeExceedsFrame`],
/// [`FrameError::Proto`] for the command, [`FrameError::UnexpectedPayload`].
pub fn decode_frame_prefix(
    buf: &[u8],
    max_frame_size: usize,
) -> Result<(Frame<'_>, usize), FrameError> {
    let total_size = read_u32(buf, 0, "frame total_size")?;
    if total_size as usize > max_frame_size {
        return Err(FrameError::FrameTooLarge {
            total_size,
            max: max_frame_size,
        });
    }
    if total_size < 4 {
        return Err(FrameError::FrameTooSmall { total_size });
    }
    let body = take(buf, 4, total_size, "frame")?;
    let command_size = read_u32(body, 0, "frame command_size")?;
    if u64::from(command_size) + 4 > u64::from(total_size) {
        return Err(FrameError::CommandSizeExceedsFrame {
            command_size,
            total_size,
        });
    }
    let command_bytes = &body[4..4 + command_size as usize];
    let rest = &body[4 + command_size as usize..];
    let (base, command) =
        wire::decode_base_command(command_bytes).map_err(|source| FrameError::Proto {
            what: "BaseCommand",
            source,
        })?;
    let headers_and_payload = match (&command, rest.is_empty()) {
        (Command::Message(_), false) => Some(rest),
        (Command::Message(_), true) => {
            return Err(FrameError::UnexpectedPayload {
                command: "MESSAGE",
                problem: "has no payload",
            })
        }
        (_, true) => None,
        (c, false) => {
            return Err(FrameError::UnexpectedPayload {
                command: c.type_name(),
                problem: "carries a payload",
            })
        }
    };
    Ok((
        Frame {
            base,
            command,
            headers_and_payload,
        },
        4 + total_size as usize,
    ))
}

/// Decodes `buf` as exactly one frame.
///
/// # Errors
/// As [`decode_frame_prefix`], plus [`FrameError::TotalSizeMismatch`] when
/// bytes follow the frame.
pub fn decode_frame(buf: &[u8], max_frame_size: usize) -> Result<Frame<'_>, FrameError> {
    let (frame, used) = decode_frame_prefix(buf, max_frame_size)?;
    if used != buf.len() {
        return Err(FrameError::TotalSizeMismatch {
            total_size: (used - 4) as u32,
            actual: buf.len() - 4,
        });
    }
    Ok(frame)
}

/// Encodes a simple frame `[total_size][command_size][BaseCommand]`.
pub fn encode_simple_frame(command: &BaseCommand) -> Vec<u8> {
    encode_payload_frame(command, &[])
}

/// Encodes a payload frame `[total_size][command_size][BaseCommand][headers_and_payload]`
/// (a simple frame when `headers_and_payload` is empty).
pub fn encode_payload_frame(command: &BaseCommand, headers_and_payload: &[u8]) -> Vec<u8> {
    let cmd = command.encode_to_vec();
    let total = 4 + cmd.len() + headers_and_payload.len();
    let mut out = Vec::with_capacity(4 + total);
    out.extend_from_slice(&(total as u32).to_be_bytes());
    out.extend_from_slice(&(cmd.len() as u32).to_be_bytes());
    out.extend_from_slice(&cmd);
    out.extend_from_slice(headers_and_payload);
    out
}

/// A parsed entry payload (`headersAndPayload`), borrowing from the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryPayload<'a> {
    /// The broker-entry metadata bytes (undecoded), if the prefix is present.
    pub broker_entry_metadata: Option<&'a [u8]>,
    /// The verified crc32c, `None` when the payload carries no checksum.
    pub checksum: Option<u32>,
    /// The message metadata.
    pub metadata: MessageMetadata,
    /// The bytes after the metadata: one message, or the batch framing.
    pub payload: &'a [u8],
}

/// Where [`parse_entry_payload`] failed, so a consumer can report the
/// matching `CommandAck.ValidationError`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PayloadError {
    /// Before or at the checksum (broker-entry prefix, magic, crc value).
    #[error("entry payload checksum section: {0}")]
    Checksum(FrameError),
    /// The metadata size or `MessageMetadata`.
    #[error("entry payload metadata: {0}")]
    Metadata(FrameError),
}

/// Parses `[0x0e02 …]? [0x0e01][crc32c]? [metadata_size][MessageMetadata][payload]`
/// and verifies the checksum when present.
///
/// # Errors
/// [`PayloadError::Checksum`] (truncated prefix, [`FrameError::BadMagic`],
/// [`FrameError::ChecksumMismatch`]), [`PayloadError::Metadata`]
/// (truncated / oversized metadata size, bad or incomplete `MessageMetadata`).
pub fn parse_entry_payload(buf: &[u8]) -> Result<EntryPayload<'_>, PayloadError> {
    let mut at = 0usize;
    let mut broker_entry_metadata = None;
    if peek_u16(buf, at) == Some(MAGIC_BROKER_ENTRY_METADATA) {
        let size =
            read_u32(buf, at + 2, "broker-entry metadata size").map_err(PayloadError::Checksum)?;
        let bytes =
            take(buf, at + 6, size, "broker-entry metadata").map_err(PayloadError::Checksum)?;
        broker_entry_metadata = Some(bytes);
        at += 6 + size as usize;
    }
    let mut checksum = None;
    match peek_u16(buf, at) {
        Some(MAGIC_CRC32C) => {
            let expected = read_u32(buf, at + 2, "checksum").map_err(PayloadError::Checksum)?;
            at += 6;
            let computed = crc32c(&buf[at..]);
            if computed != expected {
                return Err(PayloadError::Checksum(FrameError::ChecksumMismatch {
                    expected,
                    computed,
                }));
            }
            checksum = Some(expected);
        }
        Some(m) if m >> 8 == 0x0e => return Err(PayloadError::Checksum(FrameError::BadMagic(m))),
        _ => {}
    }
    let size = read_u32(buf, at, "metadata size").map_err(PayloadError::Metadata)?;
    let md_bytes = take(buf, at + 4, size, "MessageMetadata").map_err(PayloadError::Metadata)?;
    let metadata = super::metadata::decode_message_metadata(md_bytes).map_err(|source| {
        PayloadError::Metadata(FrameError::Proto {
            what: "MessageMetadata",
            source,
        })
    })?;
    at += 4 + size as usize;
    Ok(EntryPayload {
        broker_entry_metadata,
        checksum,
        metadata,
        payload: &buf[at..],
    })
}

/// Reads the header of the batch message starting at `at` in a batch
/// payload: `[size][SingleMessageMetadata]`. Returns the metadata and the
/// offset where its `payload_size` bytes start (they may be truncated; the
/// caller slices them).
///
/// # Errors
/// [`FrameError::Truncated`], [`FrameError::Proto`],
/// [`FrameError::NegativePayloadSize`].
pub fn read_batch_message_header(
    batch: &[u8],
    at: usize,
) -> Result<(SingleMessageMetadata, usize), FrameError> {
    let size = read_u32(batch, at, "SingleMessageMetadata size")?;
    let bytes = take(batch, at + 4, size, "SingleMessageMetadata")?;
    let smm = super::metadata::decode_single_message_metadata(bytes).map_err(|source| {
        FrameError::Proto {
            what: "SingleMessageMetadata",
            source,
        }
    })?;
    if smm.payload_size < 0 {
        return Err(FrameError::NegativePayloadSize(smm.payload_size));
    }
    Ok((smm, at + 4 + size as usize))
}

/// One message of a batch payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchMessage<'a> {
    /// Its header.
    pub metadata: SingleMessageMetadata,
    /// Its payload.
    pub payload: &'a [u8],
}

/// Splits a whole batch payload of `batch_size` messages.
///
/// # Errors
/// As [`read_batch_message_header`]; [`FrameError::Truncated`] when a
/// payload runs past the end; [`FrameError::TotalSizeMismatch`] when bytes
/// remain after the last message.
pub fn split_batch(batch: &[u8], batch_size: u32) -> Result<Vec<BatchMessage<'_>>, FrameError> {
    let mut out = Vec::new();
    let mut at = 0usize;
    for _ in 0..batch_size {
        let (metadata, start) = read_batch_message_header(batch, at)?;
        let payload = take(
            batch,
            start,
            metadata.payload_size as u32,
            "batch message payload",
        )?;
        at = start + payload.len();
        out.push(BatchMessage { metadata, payload });
    }
    if at != batch.len() {
        return Err(FrameError::TotalSizeMismatch {
            total_size: at as u32,
            actual: batch.len(),
        });
    }
    Ok(out)
}

/// Encodes an entry payload as a Pulsar producer/broker writes it:
/// `[0x0e01][crc32c][metadata_size][MessageMetadata][payload]`, where the
/// payload is, for a batch, per message
/// `[size][SingleMessageMetadata][payload]`, or for a non-batched entry
/// (`messages.len() == 1` and `num_messages_in_batch` absent) the single
/// payload directly.
pub fn encode_entry_payload(
    metadata: &MessageMetadata,
    messages: &[(SingleMessageMetadata, Vec<u8>)],
) -> Vec<u8> {
    let batched = metadata.num_messages_in_batch.is_some();
    let mut body = Vec::new();
    let md = metadata.encode_to_vec();
    body.extend_from_slice(&(md.len() as u32).to_be_bytes());
    body.extend_from_slice(&md);
    if !batched && messages.len() == 1 {
        body.extend_from_slice(&messages[0].1);
    } else {
        for (smm, payload) in messages {
            let s = smm.encode_to_vec();
            body.extend_from_slice(&(s.len() as u32).to_be_bytes());
            body.extend_from_slice(&s);
            body.extend_from_slice(payload);
        }
    }
    let mut out = Vec::with_capacity(6 + body.len());
    out.extend_from_slice(&MAGIC_CRC32C.to_be_bytes());
    out.extend_from_slice(&crc32c(&body).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// Prefixes an entry payload with broker-entry metadata:
/// `[0x0e02][size][broker_entry_metadata][entry_payload]`.
pub fn with_broker_entry_metadata(broker_entry_metadata: &[u8], entry_payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(6 + broker_entry_metadata.len() + entry_payload.len());
    out.extend_from_slice(&MAGIC_BROKER_ENTRY_METADATA.to_be_bytes());
    out.extend_from_slice(&(broker_entry_metadata.len() as u32).to_be_bytes());
    out.extend_from_slice(broker_entry_metadata);
    out.extend_from_slice(entry_payload);
    out
}
