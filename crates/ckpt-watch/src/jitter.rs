//! Equal jitter for every retry delay: a fleet of nodes that lost the API server together
//! must not come back to it in step.

use std::time::Duration;

/// A random delay between half of `delay` and `delay` ("equal jitter"): at least half the
/// back-off is kept, so a failing peer is still spared, and the rest is spread.
pub fn equal_jitter(delay: Duration) -> Duration {
    spread(delay, fastrand::u64(..))
}

/// `delay / 2 + (delay / 2) * fraction`, the fraction being the top 32 bits of `random`
/// over `u32::MAX`: the pure part of [`equal_jitter`], with the random number as an input
/// so the bounds can be tested.
fn spread(delay: Duration, random: u64) -> Duration {
    const NANOS_PER_SEC: u128 = 1_000_000_000;
    let half = delay / 2;
    // At most 2^63 s in nanoseconds times 2^32: within u128.
    let extra = half.as_nanos() * u128::from(random >> 32) / u128::from(u32::MAX);
    let extra = Duration::new(
        u64::try_from(extra / NANOS_PER_SEC).unwrap_or(u64::MAX),
        (extra % NANOS_PER_SEC) as u32,
    );
    (delay - half).saturating_add(extra).min(delay)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(input: (Duration, u64), expected: Duration) {
        assert_eq!(spread(input.0, input.1), expected, "{input:?}");
    }

    #[test]
    fn the_delay_is_spread_over_its_upper_half() {
        let ms = Duration::from_millis;
        let cases = [
            ((ms(1000), 0), ms(500)),
            ((ms(1000), u64::MAX), ms(1000)),
            ((ms(1000), 1 << 63), ms(750)),
            ((ms(250), 0), ms(125)),
            ((ms(250), u64::MAX), ms(250)),
            // An odd number of nanoseconds keeps the whole delay as its top.
            ((Duration::from_nanos(3), u64::MAX), Duration::from_nanos(3)),
            ((Duration::from_nanos(3), 0), Duration::from_nanos(2)),
            ((Duration::ZERO, u64::MAX), Duration::ZERO),
            ((Duration::MAX, u64::MAX), Duration::MAX),
        ];
        for (input, expected) in cases {
            check(input, expected);
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
