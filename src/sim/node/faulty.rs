//! Faulty frames on the way from the core to a consumer: the network (or
//! a faulty broker) damages a MESSAGE after the core sent it, so the
//! core stays the shipped one and the client library must cope:
//!
//! - `faults.corrupted_batch_ratio`: a byte of the entry payload flipped
//!   in transit (the stored entry is intact). The client's checksum check
//!   must fail: nothing of the batch reaches the application (a client
//!   that hands such a batch off is a violation), its early P is returned.
//!   Pulsar's client then acknowledges the entry with a validation error
//!   and the broker deletes it; since only the bytes in transit were
//!   damaged, the simulated client sends that frame as a negative ack of
//!   the entry instead (REDELIVER_UNACKNOWLEDGED_MESSAGES with its id), so
//!   the core redelivers it and the loss check stays exact. The
//!   redelivery comes after later entries: the batch is exempt from the
//!   order rule.
//! - `faults.invalid_permits_ratio`: `message_permits` replaced by 0 or by
//!   the batch's message count + 1 (PIP-491's invalid / inconsistent P);
//!   `faults.zero_permits_on_corrupted_ratio`: a corrupted batch carries
//!   P = 0 (the client resolves P from the command alone, and 0 is invalid
//!   there too). Either way the client must close its connection without
//!   credit ("accepted invalid message_permits" otherwise), and reconnects.
//!   After `faults.faulty_closes_without_progress` such closes of one
//!   consumer in a row with nothing received in between, P is left intact
//!   until the application receives a message (the fairness bound that
//!   keeps a run able to drain).

use rand::Rng;

use crate::permits::client::CommandOutcomeKind;
use crate::position::Position;
use crate::proto::command::BrokerCommand;
use crate::sim::checker::MessageRef;

use super::wire::frame;
use super::{ClientRef, Node};

/// What the network did to one MESSAGE frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Damage {
    /// Delivered as the core sent it.
    None,
    /// `message_permits` replaced by this invalid value.
    InvalidPermits(u32),
    /// A payload byte flipped (checksum broken); with `zero_permits`, P = 0.
    Corrupt { zero_permits: bool },
}

impl Damage {
    /// The invalid P the client must refuse, if any.
    pub(super) fn invalid_permits(self) -> Option<u32> {
        match self {
            Damage::InvalidPermits(p) => Some(p),
            Damage::Corrupt { zero_permits: true } => Some(0),
            _ => None,
        }
    }
}

impl Node<'_> {
    /// Draws what happens to a MESSAGE frame (`cmd`, its `payload`) on its
    /// way to a consumer that closed `faulty_closes` connections in a row
    /// on an invalid P; returns the damage and, if any, the damaged frame.
    pub(super) fn damage_message(
        &mut self,
        faulty_closes: u32,
        cmd: &BrokerCommand,
        payload: &[u8],
    ) -> (Damage, Option<Vec<u8>>) {
        let f = &self.w.faults;
        if !self.opts.faults || cmd.message.is_none() || payload.is_empty() {
            return (Damage::None, None);
        }
        let (corrupt_ratio, invalid_ratio, zero_ratio) = (
            f.corrupted_batch_ratio,
            f.invalid_permits_ratio,
            f.zero_permits_on_corrupted_ratio,
        );
        let fair = faulty_closes < f.faulty_closes_without_progress;
        let corrupt = corrupt_ratio > 0.0 && self.rng.random_bool(corrupt_ratio);
        let invalid = !corrupt && invalid_ratio > 0.0 && self.rng.random_bool(invalid_ratio);
        let zero = corrupt && zero_ratio > 0.0 && self.rng.random_bool(zero_ratio);
        if (invalid || zero) && !fair {
            self.activity.faulty_permits_held_back += 1;
        }
        let mut cmd = cmd.clone();
        let mut payload = payload.to_vec();
        let damage = if corrupt {
            // The last byte is message data, inside the crc32c's range.
            if let Some(b) = payload.last_mut() {
                *b ^= 0xff;
            }
            Damage::Corrupt {
                zero_permits: zero && fair,
            }
        } else if invalid && fair {
            let batch = crate::broker::entry_info(&payload).map_or(1, |i| i.batch_size);
            let p = if self.rng.random_bool(0.5) {
                0
            } else {
                batch.saturating_add(1)
            };
            Damage::InvalidPermits(p)
        } else {
            return (Damage::None, None);
        };
        if let (Some(p), Some(m)) = (damage.invalid_permits(), cmd.message.as_mut()) {
            m.message_permits = Some(p);
        }
        (damage, Some(frame(&cmd, payload)))
    }
}

impl Node<'_> {
    /// The client library's answer to a damaged MESSAGE (`payload` as the
    /// core sent it; `kind`, `None` if the client refused the frame): an invalid P must close the connection (the
    /// client reconnects; returns true), a broken checksum must keep the
    /// batch from the application (and the entry is asked for again).
    pub(super) fn damaged_message(
        &mut self,
        c: usize,
        conn: u64,
        cmd: &BrokerCommand,
        payload: &[u8],
        damage: Damage,
        kind: Option<CommandOutcomeKind>,
    ) -> bool {
        let now = self.now();
        let sub = self.subs[self.consumers[c].sub].clone();
        let id = self.consumers[c].id;
        let stale = matches!(
            kind,
            Some(CommandOutcomeKind::StaleEpoch | CommandOutcomeKind::StaleIncarnation)
        );
        if let Damage::Corrupt { .. } = damage {
            self.activity.corrupted_batches += 1;
        }
        if let Some(p) = damage.invalid_permits() {
            if matches!(kind, Some(CommandOutcomeKind::ProtocolError(_))) {
                self.activity.invalid_permit_closes += 1;
                self.consumers[c].faulty_closes += 1;
                self.close_conn(conn);
                self.connection_lost(conn, ClientRef::Consumer(c), false);
                return true;
            }
            if !stale {
                self.checker.permit_violation(
                    &sub,
                    id,
                    &format!(
                        "the client accepted invalid message_permits {:?} without closing the connection",
                        Some(p)
                    ),
                    now,
                );
            }
        }
        let Damage::Corrupt { .. } = damage else {
            return false;
        };
        let Some(m) = cmd.message.as_ref() else {
            return false;
        };
        match kind {
            Some(CommandOutcomeKind::Corrupted(_)) => {}
            _ if stale => return false,
            _ => {
                self.checker.permit_violation(
                    &sub,
                    id,
                    "the client handed off a batch whose checksum is broken",
                    now,
                );
                return false;
            }
        }
        // Nothing of the batch reached the application. The corruption is
        // in transit only (the stored entry is intact), so the client's
        // validation-error ack goes out as a negative ack of the entry
        // (`flush_consumer`) and the core redelivers it, after later
        // entries: the batch is exempt from the order rule, and the loss
        // check stays exact.
        let position = Position::new(m.message_id.ledger_id as i64, m.message_id.entry_id as i64);
        // Pulsar's client verifies the checksum before the epoch, so a
        // corrupted copy of an earlier epoch is answered too; but its entry
        // was given back by the REDELIVER_UNACKNOWLEDGED_MESSAGES that
        // bumped the epoch (the core stamped the copy before it saw that
        // request), so no negative ack stands in for the validation-error
        // ack: a second give-back would deliver the epoch's copy twice.
        let epoch = self.consumers[c].client_epoch();
        if m.consumer_epoch
            .zip(epoch)
            .is_some_and(|(sent, now)| sent < now)
        {
            self.consumers[c].corrupt_given_back.insert(position);
            self.node.corrupted_of_earlier_epoch += 1;
        }
        let batch = crate::broker::entry_info(payload).map_or(1, |i| i.batch_size);
        for batch_index in 0..batch {
            self.checker.exempt_from_order(
                &sub,
                MessageRef {
                    position,
                    batch_index,
                },
            );
        }
        false
    }
}
