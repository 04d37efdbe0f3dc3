//! Cutting a connection's byte stream into Pulsar frames
//! (`[total_size][command_size][command][payload]`), the rule every driver
//! of the core applies before [`super::Broker::handle_frame`] (Pulsar's
//! `PulsarDecoder` with its `LengthFieldBasedFrameDecoder`): a
//! `total_size` above [`MAX_FRAME_SIZE`] or below 4, or a `command_size`
//! that does not fit in the frame, closes the connection; a frame is handed
//! on only once all of it arrived. Memory follows the bytes received: a
//! declared size allocates nothing up front.

use super::MAX_FRAME_SIZE;

/// Why a stream cannot be cut into frames (the connection closes).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    /// `total_size` above [`MAX_FRAME_SIZE`].
    #[error("frame of {0} bytes exceeds the limit of {MAX_FRAME_SIZE} bytes")]
    TooLarge(u64),
    /// `total_size` below 4 (no room for `command_size`).
    #[error("total_size {0} below 4")]
    TotalTooSmall(u64),
    /// `command_size` past the end of the frame.
    #[error("command_size {command_size} exceeds total_size {total_size}")]
    CommandPastEnd {
        /// The declared command size.
        command_size: u64,
        /// The declared frame size.
        total_size: u64,
    },
}

/// One frame cut from a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CutFrame {
    /// The frame as it was on the wire (sizes included).
    pub whole: Vec<u8>,
    /// Where the command ends in `whole` (the payload starts there).
    command_end: usize,
}

impl CutFrame {
    /// The `BaseCommand` bytes.
    pub fn command(&self) -> &[u8] {
        &self.whole[8..self.command_end]
    }

    /// The bytes after the command (metadata and payload of a SEND or
    /// MESSAGE, empty for most commands).
    pub fn payload(&self) -> &[u8] {
        &self.whole[self.command_end..]
    }
}

/// A connection's bytes as they arrive, cut into whole frames.
#[derive(Debug, Default)]
pub struct FrameCutter {
    pending: Vec<u8>,
}

impl FrameCutter {
    /// Appends bytes as they arrive.
    pub fn push(&mut self, bytes: &[u8]) {
        self.pending.extend_from_slice(bytes);
    }

    /// Bytes received that are not yet part of a whole frame.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// How many more bytes the frame in progress needs (at least 1): the
    /// rest of its 4-byte size, then the rest of the frame. A reader asks
    /// for no more than this, so it never reads past a frame it will
    /// refuse.
    pub fn bytes_wanted(&self) -> usize {
        match self.declared_total() {
            Some(total) => (4 + total as usize)
                .saturating_sub(self.pending.len())
                .max(1),
            None => 4 - self.pending.len(),
        }
    }

    fn declared_total(&self) -> Option<u64> {
        let p = self.pending.get(..4)?;
        Some(u64::from(u32::from_be_bytes([p[0], p[1], p[2], p[3]])))
    }

    /// The next whole frame, if one has arrived.
    ///
    /// # Errors
    /// [`FramingError`]: the connection must close (what is pending is
    /// left as it was).
    pub fn next_frame(&mut self) -> Result<Option<CutFrame>, FramingError> {
        let Some(total) = self.declared_total() else {
            return Ok(None);
        };
        if total as usize > MAX_FRAME_SIZE {
            return Err(FramingError::TooLarge(total));
        }
        if total < 4 {
            return Err(FramingError::TotalTooSmall(total));
        }
        let end = 4 + total as usize;
        if self.pending.len() < end {
            return Ok(None);
        }
        let p = &self.pending;
        let command_size = u64::from(u32::from_be_bytes([p[4], p[5], p[6], p[7]]));
        if command_size + 4 > total {
            return Err(FramingError::CommandPastEnd {
                command_size,
                total_size: total,
            });
        }
        let whole: Vec<u8> = self.pending.drain(..end).collect();
        Ok(Some(CutFrame {
            whole,
            command_end: 8 + command_size as usize,
        }))
    }
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests {
    use super::*;
    use crate::broker::OutFrame;
    use crate::proto::command::{ty, BrokerCommand, Empty};
    use prost::Message;

    fn frame(cmd: &BrokerCommand, payload: Vec<u8>) -> Vec<u8> {
        OutFrame {
            command: cmd.encode_to_vec(),
            payload,
        }
        .encode()
    }

    #[test]
    fn frames_split_anywhere_are_cut_whole_and_in_order() {
        let ping = BrokerCommand {
            r#type: ty::PING,
            ping: Some(Empty {}),
            ..Default::default()
        };
        let pong = BrokerCommand {
            r#type: ty::PONG,
            pong: Some(Empty {}),
            ..Default::default()
        };
        let a = frame(&ping, Vec::new());
        let b = frame(&pong, vec![1, 2, 3]);
        let stream: Vec<u8> = a.iter().chain(b.iter()).copied().collect();
        for split in 0..stream.len() {
            let mut c = FrameCutter::default();
            let mut got = Vec::new();
            for part in [&stream[..split], &stream[split..]] {
                c.push(part);
                while let Some(f) = c.next_frame().unwrap() {
                    got.push(f);
                }
            }
            assert_eq!(
                got.iter().map(|f| f.whole.clone()).collect::<Vec<_>>(),
                vec![a.clone(), b.clone()],
                "split at {split}"
            );
            assert_eq!(got[0].command(), ping.encode_to_vec().as_slice());
            assert_eq!(got[1].command(), pong.encode_to_vec().as_slice());
            assert_eq!(got[1].payload(), &[1, 2, 3]);
            assert_eq!(c.pending(), 0);
        }
    }

    #[test]
    fn bytes_wanted_stops_at_the_frame_in_progress() {
        let mut c = FrameCutter::default();
        assert_eq!(c.bytes_wanted(), 4);
        c.push(&[0, 0]);
        assert_eq!(c.bytes_wanted(), 2);
        c.push(&[0, 10]);
        assert_eq!(c.bytes_wanted(), 10);
        c.push(&[0; 9]);
        assert_eq!(c.bytes_wanted(), 1);
    }

    #[test]
    fn a_frame_above_the_limit_or_with_a_command_past_its_end_is_an_error() {
        let mut c = FrameCutter::default();
        c.push(&((MAX_FRAME_SIZE as u32) + 1).to_be_bytes());
        assert_eq!(
            c.next_frame(),
            Err(FramingError::TooLarge(MAX_FRAME_SIZE as u64 + 1))
        );
        let mut c = FrameCutter::default();
        c.push(&[0, 0, 0, 3]);
        assert_eq!(c.next_frame(), Err(FramingError::TotalTooSmall(3)));
        let mut c = FrameCutter::default();
        c.push(&[0, 0, 0, 5, 0, 0, 0, 9, 0]);
        assert_eq!(
            c.next_frame(),
            Err(FramingError::CommandPastEnd {
                command_size: 9,
                total_size: 5
            })
        );
        // Nothing is consumed by a refused frame.
        assert_eq!(c.pending(), 9);
    }
}
