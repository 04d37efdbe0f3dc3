//! Retry backoff of the pending-ack handle (Pulsar's `Backoff` as used by
//! `PendingAckHandleImpl`): 100 ms initial, doubling, capped at 60 s, with up
//! to 10% jitter subtracted and never below the initial delay.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::error::PendingAckError;

/// Backoff parameters, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffConfig {
    /// First delay (ms). Default 100. Must be ≥ 1.
    pub initial_ms: u64,
    /// Largest delay (ms). Default 60 000. Must be ≥ `initial_ms`.
    pub max_ms: u64,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        Self {
            initial_ms: 100,
            max_ms: 60_000,
        }
    }
}

impl BackoffConfig {
    /// Checks the ranges documented on the fields.
    ///
    /// # Errors
    /// [`PendingAckError::InvalidConfig`].
    pub fn validate(&self) -> Result<(), PendingAckError> {
        if self.initial_ms == 0 || self.max_ms < self.initial_ms {
            return Err(PendingAckError::InvalidConfig(format!(
                "backoff needs 1 <= initial_ms <= max_ms, got initial {} max {}",
                self.initial_ms, self.max_ms
            )));
        }
        Ok(())
    }
}

/// Per-handle backoff state. Not thread-safe by itself: the handle keeps it
/// under its state lock. Jitter comes from a seeded ChaCha RNG so runs on
/// virtual time are reproducible.
#[derive(Debug, Clone)]
pub struct Backoff {
    config: BackoffConfig,
    next_ms: u64,
    rng: ChaCha8Rng,
}

impl Backoff {
    /// A fresh backoff with jitter seeded by `seed`.
    pub fn new(config: BackoffConfig, seed: u64) -> Self {
        Self {
            config,
            next_ms: config.initial_ms,
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }

    /// Returns the next delay (ms) and doubles the stored one (capped). When
    /// the delay exceeds 10 ms a random amount in `[0, delay/10)` is
    /// subtracted; the result is never below `initial_ms`.
    pub fn next_delay_ms(&mut self) -> u64 {
        let current = self.next_ms;
        self.next_ms = current.saturating_mul(2).min(self.config.max_ms);
        let mut delay = current;
        if delay > 10 {
            delay -= self.rng.random_range(0..delay / 10);
        }
        delay.max(self.config.initial_ms)
    }

    /// The delay (ms) the next call starts from, before jitter.
    pub fn peek_ms(&self) -> u64 {
        self.next_ms
    }
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests {
    use super::*;

    #[test]
    fn schedule_doubles_caps_and_jitters_down_only() {
        let mut b = Backoff::new(BackoffConfig::default(), 7);
        let mut nominal = 100u64;
        for _ in 0..20 {
            let d = b.next_delay_ms();
            assert!(d <= nominal, "{d} > {nominal}");
            assert!(d >= 100 && d * 10 >= nominal * 9 - 10, "{d} vs {nominal}");
            nominal = (nominal * 2).min(60_000);
        }
        assert_eq!(b.peek_ms(), 60_000);
        assert!(BackoffConfig {
            initial_ms: 0,
            max_ms: 1
        }
        .validate()
        .is_err());
        assert!(BackoffConfig {
            initial_ms: 5,
            max_ms: 1
        }
        .validate()
        .is_err());
    }
}
