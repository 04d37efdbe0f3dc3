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

    #[test]
    fn a_fixed_delay_is_valid_initial_equal_to_max() {
        let fixed = BackoffConfig {
            initial_ms: 250,
            max_ms: 250,
        };
        assert!(fixed.validate().is_ok());
        let mut b = Backoff::new(fixed, 1);
        for _ in 0..5 {
            // Never below the initial delay: the jitter is clamped away.
            assert_eq!(b.next_delay_ms(), 250);
        }
    }

    #[test]
    fn delays_above_10_ms_are_jittered_down_by_less_than_a_tenth() {
        // 100 ms (jitter clamped back up to the initial delay), then 200 ms
        // less a jitter in [0, 20).
        let second: Vec<u64> = (0..32)
            .map(|seed| {
                let mut b = Backoff::new(BackoffConfig::default(), seed);
                assert_eq!(b.next_delay_ms(), 100);
                b.next_delay_ms()
            })
            .collect();
        assert!(second.iter().all(|d| (181..=200).contains(d)), "{second:?}");
        assert!(second.iter().any(|d| *d < 200), "no jitter: {second:?}");
        assert!(
            second
                .iter()
                .collect::<std::collections::BTreeSet<_>>()
                .len()
                > 8,
            "the seeds give the same jitter: {second:?}"
        );
    }

    #[test]
    fn delays_of_10_ms_or_less_are_exact_and_draw_no_jitter() {
        // 1 ms doubling: 1, 2, 4, 8, 10 (capped) are exact.
        let mut small = Backoff::new(
            BackoffConfig {
                initial_ms: 1,
                max_ms: 10,
            },
            3,
        );
        let exact: Vec<u64> = (0..6).map(|_| small.next_delay_ms()).collect();
        assert_eq!(exact, [1, 2, 4, 8, 10, 10]);
        // The jitter of a delay depends only on the seed and on how many
        // delays above 10 ms came before it: from 10 ms (10, 20, 40, 80) and
        // from 20 ms (20, 40, 80) one seed gives the same 40 and 80 ms.
        for seed in 0..16 {
            let mut from_10 = Backoff::new(
                BackoffConfig {
                    initial_ms: 10,
                    max_ms: 80,
                },
                seed,
            );
            let mut from_20 = Backoff::new(
                BackoffConfig {
                    initial_ms: 20,
                    max_ms: 80,
                },
                seed,
            );
            assert_eq!(from_10.next_delay_ms(), 10);
            from_10.next_delay_ms();
            from_20.next_delay_ms();
            let a: Vec<u64> = (0..2).map(|_| from_10.next_delay_ms()).collect();
            let b: Vec<u64> = (0..2).map(|_| from_20.next_delay_ms()).collect();
            assert_eq!(a, b, "seed {seed}");
        }
    }
}
