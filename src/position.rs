//! [`Position`]: the (ledger_id, entry_id) address of an entry in a managed
//! ledger, ordered lexicographically (Pulsar's `Position` / `PositionImpl`).

use std::fmt;
use std::str::FromStr;

/// The address of one entry: `ledger_id` then `entry_id`, ordered
/// lexicographically (ledger first). Corresponds to Pulsar's
/// `org.apache.bookkeeper.mledger.Position`.
///
/// Entry id `-1` means "before the first entry of that ledger": `(L, -1)` is
/// used as an open lower bound and as a mark-delete position right after a
/// ledger switch. [`Position::EARLIEST`] is `(-1, -1)` and [`Position::LATEST`]
/// is `(i64::MAX, i64::MAX)`.
///
/// Text form is `ledger_id:entry_id` (e.g. `3:17`), see [`Position::from_str`].
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub struct Position {
    /// Ledger id (a BookKeeper ledger id in Pulsar).
    pub ledger_id: i64,
    /// Entry id within the ledger, from 0 (or -1 as the "before first" bound).
    pub entry_id: i64,
}

impl Position {
    /// The smallest position, `(-1, -1)`.
    pub const EARLIEST: Position = Position::new(-1, -1);
    /// The largest position, `(i64::MAX, i64::MAX)`.
    pub const LATEST: Position = Position::new(i64::MAX, i64::MAX);

    /// Creates a position.
    pub const fn new(ledger_id: i64, entry_id: i64) -> Self {
        Self {
            ledger_id,
            entry_id,
        }
    }

    /// The position just before this one within the same ledger
    /// (`(L, e-1)`), which is the open lower bound of the single-entry range
    /// `(L:e-1, L:e]`. Saturates at `i64::MIN`.
    pub const fn previous_in_ledger(self) -> Self {
        Self::new(self.ledger_id, self.entry_id.saturating_sub(1))
    }

    /// The next entry in the same ledger (`(L, e+1)`), saturating at `i64::MAX`.
    pub const fn next_in_ledger(self) -> Self {
        Self::new(self.ledger_id, self.entry_id.saturating_add(1))
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.ledger_id, self.entry_id)
    }
}

/// Why a string could not be parsed as a [`Position`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PositionParseError {
    /// The string has no `:` separating ledger id and entry id.
    #[error("invalid position {input:?}: expected `ledger_id:entry_id`")]
    MissingSeparator {
        /// The rejected input.
        input: String,
    },
    /// The ledger id part is not a valid signed 64-bit integer.
    #[error("invalid position {input:?}: ledger id {part:?} is not an i64")]
    InvalidLedgerId {
        /// The rejected input.
        input: String,
        /// The offending part.
        part: String,
    },
    /// The entry id part is not a valid signed 64-bit integer.
    #[error("invalid position {input:?}: entry id {part:?} is not an i64")]
    InvalidEntryId {
        /// The rejected input.
        input: String,
        /// The offending part.
        part: String,
    },
}

impl FromStr for Position {
    type Err = PositionParseError;

    /// Parses `ledger_id:entry_id` (both signed decimal i64, no whitespace).
    ///
    /// # Errors
    /// [`PositionParseError`] naming the offending part.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (l, e) = s
            .split_once(':')
            .ok_or_else(|| PositionParseError::MissingSeparator { input: s.into() })?;
        let ledger_id = l
            .parse::<i64>()
            .map_err(|_| PositionParseError::InvalidLedgerId {
                input: s.into(),
                part: l.into(),
            })?;
        let entry_id = e
            .parse::<i64>()
            .map_err(|_| PositionParseError::InvalidEntryId {
                input: s.into(),
                part: e.into(),
            })?;
        Ok(Position::new(ledger_id, entry_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordering_is_ledger_then_entry() {
        let a = Position::new(1, 100);
        let b = Position::new(2, 0);
        let c = Position::new(2, 1);
        assert!(a < b && b < c);
        assert!(Position::EARLIEST < Position::new(0, 0));
        assert!(Position::new(i64::MAX, i64::MAX - 1) < Position::LATEST);
        let mut v = vec![c, a, b];
        v.sort();
        assert_eq!(v, vec![a, b, c]);
    }

    #[test]
    fn display_and_parse_round_trip() {
        for p in [
            Position::new(3, 17),
            Position::EARLIEST,
            Position::LATEST,
            Position::new(5, -1),
        ] {
            assert_eq!(p.to_string().parse::<Position>().unwrap(), p);
        }
        assert_eq!(Position::new(3, 17).to_string(), "3:17");
    }

    #[test]
    fn bad_strings_are_typed_errors() {
        assert!(matches!(
            "317".parse::<Position>(),
            Err(PositionParseError::MissingSeparator { .. })
        ));
        assert!(matches!(
            "x:1".parse::<Position>(),
            Err(PositionParseError::InvalidLedgerId { .. })
        ));
        assert!(matches!(
            "1:".parse::<Position>(),
            Err(PositionParseError::InvalidEntryId { .. })
        ));
        assert!(matches!(
            "1:2:3".parse::<Position>(),
            Err(PositionParseError::InvalidEntryId { .. })
        ));
        assert!(matches!(
            "99999999999999999999:0".parse::<Position>(),
            Err(PositionParseError::InvalidLedgerId { .. })
        ));
        let msg = "a:b".parse::<Position>().unwrap_err().to_string();
        assert!(msg.contains("ledger id"), "{msg}");
    }

    #[test]
    fn neighbours_saturate() {
        assert_eq!(
            Position::new(1, 5).previous_in_ledger(),
            Position::new(1, 4)
        );
        assert_eq!(Position::new(1, 5).next_in_ledger(), Position::new(1, 6));
        assert_eq!(
            Position::new(1, i64::MAX).next_in_ledger(),
            Position::new(1, i64::MAX)
        );
    }
}
