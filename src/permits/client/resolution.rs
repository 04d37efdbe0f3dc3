//! The resolution ladder: which P a command carries (explicit
//! `message_permits` → `ack_set` popcount → `num_messages_in_batch` → 1),
//! and the protocol errors that close the connection.

use crate::proto::frame::FrameError;
use crate::proto::wire::{self, CommandMessage, WireError, MAX_PERMITS};

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
/// returns no credit for the command (PIP-491's rule).
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
    /// The frame around the command is malformed (sizes, magic, command).
    #[error("malformed frame: {0}")]
    MalformedFrame(FrameError),
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
