//! Jitter for every retry delay: a fleet of nodes that lost the API server together must
//! not come back to it in step. Equal jitter keeps half of each back-off; a first retry can
//! be spread over a whole interval instead.

use std::time::Duration;

/// A random delay between half of `delay` and `delay` ("equal jitter"): at least half the
/// back-off is kept, so a failing peer is still spared, and the rest is spread.
pub fn equal_jitter(delay: Duration) -> Duration {
    between(delay - delay / 2, delay, fastrand::u64(..))
}

/// A random delay between `lo` and `hi` (`lo` if `hi` is shorter): spreads a fleet's first
/// retry over a whole interval.
pub fn uniform_between(lo: Duration, hi: Duration) -> Duration {
    between(lo, hi, fastrand::u64(..))
}

/// `lo + (hi - lo) * fraction`, the fraction being the top 32 bits of `random` over
/// `u32::MAX`: the pure part of [`equal_jitter`] and [`uniform_between`], with the random
/// number as an input so the bounds can be tested.
fn between(lo: Duration, hi: Duration, random: u64) -> Duration {
    const NANOS_PER_SEC: u128 = 1_000_000_000;
    let hi = hi.max(lo);
    // At most 2^64 s in nanoseconds times 2^32: within u128.
    let extra = (hi - lo).as_nanos() * u128::from(random >> 32) / u128::from(u32::MAX);
    let extra = Duration::new(
        u64::try_from(extra / NANOS_PER_SEC).unwrap_or(u64::MAX),
        (extra % NANOS_PER_SEC) as u32,
    );
    lo.saturating_add(extra).min(hi)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(input: (Duration, Duration, u64), expected: Duration) {
        assert_eq!(between(input.0, input.1, input.2), expected, "{input:?}");
    }

    #[test]
    fn the_delay_is_spread_between_its_bounds() {
        let ms = Duration::from_millis;
        // Equal jitter: the upper half of the delay.
        let equal = |delay: Duration| (delay - delay / 2, delay);
        let cases = [
            ((equal(ms(1000)), 0), ms(500)),
            ((equal(ms(1000)), u64::MAX), ms(1000)),
            ((equal(ms(1000)), 1 << 63), ms(750)),
            ((equal(ms(250)), 0), ms(125)),
            ((equal(ms(250)), u64::MAX), ms(250)),
            // An odd number of nanoseconds keeps the whole delay as its top.
            (
                (equal(Duration::from_nanos(3)), u64::MAX),
                Duration::from_nanos(3),
            ),
            ((equal(Duration::from_nanos(3)), 0), Duration::from_nanos(2)),
            ((equal(Duration::ZERO), u64::MAX), Duration::ZERO),
            ((equal(Duration::MAX), u64::MAX), Duration::MAX),
            // A whole interval.
            (((ms(250), ms(6000)), 0), ms(250)),
            (((ms(250), ms(6000)), 1 << 63), ms(3125)),
            (((ms(250), ms(6000)), u64::MAX), ms(6000)),
            // Bounds the wrong way round: the lower one.
            (((ms(6000), ms(250)), u64::MAX), ms(6000)),
            (((Duration::ZERO, Duration::MAX), u64::MAX), Duration::MAX),
        ];
        for (((lo, hi), random), expected) in cases {
            check((lo, hi, random), expected);
        }
    }

    #[test]
    fn nodes_do_not_retry_in_step() {
        let delay = Duration::from_secs(10);
        let delays: std::collections::BTreeSet<_> = (0..64).map(|_| equal_jitter(delay)).collect();
        assert!(
            delays.iter().all(|d| *d >= delay / 2 && *d <= delay),
            "{delays:?}"
        );
        assert!(delays.len() > 32, "64 draws, {} distinct delays", delays.len());
    }
}
