//! The retry plan for retryable causes (`locked`, `compression`).
//!
//! Defaults live here so that every runtime waits the same way:
//! exponential backoff from [`RetryPlan::BASE_MS`] doubling to
//! [`RetryPlan::CAP_MS`], with "equal jitter" (half fixed, half drawn from
//! the observation's `seed`), within a patience budget of
//! [`RetryPlan::PATIENCE_MS`] elapsed *and* [`RetryPlan::MAX_ATTEMPTS`]
//! attempts. Once either is spent the answer is `None` and the caller diverts.
//!
//! Why these numbers: a writer that holds the lock for 2 s (a slow
//! checkpoint, a long turn of another process) must not cost a turn, and
//! the smallest possible sum of the first 12 delays is already above 2 s;
//! a user should not wait much more than SQLite's own customary 5 s before
//! the batch is kept safely elsewhere.

#[allow(unused_imports)]
use crate::prelude::*;
use core::num::NonZeroU64;

/// Backoff and patience, all in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPlan {
    pub base_ms: u64,
    pub cap_ms: u64,
    pub patience_ms: u64,
    pub max_attempts: u32,
}

impl RetryPlan {
    pub const BASE_MS: u64 = 20;
    pub const CAP_MS: u64 = 500;
    pub const PATIENCE_MS: u64 = 5_000;
    pub const MAX_ATTEMPTS: u32 = 32;

    pub const DEFAULT: RetryPlan = RetryPlan {
        base_ms: Self::BASE_MS,
        cap_ms: Self::CAP_MS,
        patience_ms: Self::PATIENCE_MS,
        max_attempts: Self::MAX_ATTEMPTS,
    };

    /// The delay before the next attempt, or `None` once patience is spent.
    ///
    /// `attempt` is the 1-based number of the attempt that just failed.
    /// The delay never carries the caller past the patience budget.
    pub fn next_delay(&self, attempt: u32, elapsed_ms: u64, seed: u64) -> Option<u64> {
        let attempt = attempt.max(1);
        if attempt >= self.max_attempts || elapsed_ms >= self.patience_ms {
            return None;
        }
        let exp = (attempt - 1).min(32);
        let ceiling = saturating_shl(self.base_ms, exp).min(self.cap_ms).max(1);
        let half = ceiling / 2;
        // The jitter is drawn from [0, ceiling - half]. The span is at least
        // 1 by its type, so the remainder has no division-by-zero path.
        let span = NonZeroU64::MIN.saturating_add(ceiling - half);
        let jitter = mix(seed ^ u64::from(attempt).wrapping_mul(0x9E37_79B9_7F4A_7C15)) % span;
        let delay = half + jitter;
        Some(delay.min(self.patience_ms - elapsed_ms).max(1))
    }
}

impl Default for RetryPlan {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// `x * 2^n`, saturated: `x.saturating_mul(1 << n)` without the 128-bit
/// multiply its overflow check needs on wasm32. `n` is at most 32.
fn saturating_shl(x: u64, n: u32) -> u64 {
    if x > u64::MAX >> n { u64::MAX } else { x << n }
}

/// splitmix64 finaliser: a well-spread, dependency-free hash of the seed.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saturating_shift_is_a_saturating_multiply() {
        for x in [
            0u64,
            1,
            2,
            20,
            500,
            u64::MAX >> 32,
            (u64::MAX >> 32) + 1,
            u64::MAX / 3,
            u64::MAX,
        ] {
            for n in 0..=32 {
                assert_eq!(saturating_shl(x, n), x.saturating_mul(1u64 << n), "{x} << {n}");
            }
        }
    }

    #[test]
    fn delays_stay_within_backoff_bounds() {
        let plan = RetryPlan::DEFAULT;
        for seed in [0u64, 1, 42, u64::MAX] {
            for attempt in 1..plan.max_attempts {
                let d = plan.next_delay(attempt, 0, seed).expect("within budget");
                let ceiling = (plan.base_ms << (attempt - 1).min(20)).min(plan.cap_ms);
                assert!(
                    d >= ceiling / 2 && d <= ceiling,
                    "attempt {attempt}: {d} not in [{}, {ceiling}]",
                    ceiling / 2
                );
            }
        }
    }

    #[test]
    fn the_smallest_schedule_outlasts_a_two_second_lock() {
        let plan = RetryPlan::DEFAULT;
        // Follow the plan itself, for many seeds, as a host retrying a lock
        // that is held for 2 s would: it must still be retrying past 2 s.
        for seed in 0..500u64 {
            let (mut elapsed, mut attempt) = (0u64, 1u32);
            while elapsed <= 2_000 {
                let delay = plan
                    .next_delay(attempt, elapsed, seed)
                    .unwrap_or_else(|| panic!("seed {seed}: gave up at {elapsed} ms, attempt {attempt}"));
                elapsed += delay;
                attempt += 1;
            }
            assert!(attempt < plan.max_attempts, "seed {seed}: needs {attempt} attempts");
            assert!(elapsed < plan.patience_ms);
        }
    }

    #[test]
    fn patience_is_counted_in_time_and_in_attempts() {
        let plan = RetryPlan::DEFAULT;
        assert_eq!(plan.next_delay(1, plan.patience_ms, 7), None);
        assert_eq!(plan.next_delay(plan.max_attempts, 0, 7), None);
        assert_eq!(plan.next_delay(3, plan.patience_ms - 3, 7), Some(3));
    }

    #[test]
    fn jitter_depends_on_seed_only_deterministically() {
        let plan = RetryPlan::DEFAULT;
        // Pinned: every runtime that embeds the policy waits exactly this.
        assert_eq!(plan.next_delay(6, 0, 99), Some(478));
        assert_eq!(plan.next_delay(6, 0, 100), Some(428));
        assert_eq!(plan.next_delay(3, 0, 7), Some(79));
        assert_eq!(plan.next_delay(1, 0, 0), Some(20));
        let distinct: std::collections::BTreeSet<_> = (0..64).filter_map(|s| plan.next_delay(6, 0, s)).collect();
        assert!(distinct.len() > 10, "jitter barely varies: {distinct:?}");
    }
}
