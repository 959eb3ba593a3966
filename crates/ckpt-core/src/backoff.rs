//! Exponential retry delays: every doubling back-off of the agent (the watches, failed
//! passes, Events, the unreachable API's probe, credential mints, a rejected handoff's
//! retry) takes its delays from backon's [`ExponentialBuilder`] (already in the tree
//! through kube-runtime's watcher) rather than from arithmetic of its own. Here, beside the
//! planner, because the planner's handoff retry is one of them.
//!
//! The jitter stays the agent's (`ckpt_watch::jitter::equal_jitter`), applied where each
//! delay is slept: backon's `with_jitter` is not equal jitter. It adds a random part
//! of the delay on top (between `d` and `2d`), so it would let a delay run past its cap,
//! where equal jitter keeps the upper half of it (between `d/2` and `d`).

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};

/// The delays of [`doubling`], one per call of `next` (never `None`).
pub type Doubling = <ExponentialBuilder as BackoffBuilder>::Backoff;

/// Delays from `first` doubling to `cap`, then `cap` for ever, unjittered (`first` is
/// capped too). A reset is a new iterator.
///
/// backon multiplies in `f32` seconds: exact for the delays used here (250 ms, 1 s, 10 s
/// and their doublings are binary fractions of a second), a few nanoseconds short for
/// others (20 ms doubles to 39.999999 ms).
pub fn doubling(first: Duration, cap: Duration) -> Doubling {
    ExponentialBuilder::new()
        .with_min_delay(first.min(cap))
        .with_max_delay(cap)
        .with_factor(2.0)
        // backon's default gives up after 3 delays; our retries go on until they succeed.
        .without_max_times()
        .build()
}

/// The delay after `n` earlier ones of [`doubling`]`(first, cap)` (`n = 0`: `first`), for
/// a retry that counts its failures instead of keeping the iterator.
pub fn nth_delay(first: Duration, cap: Duration, n: u32) -> Duration {
    let mut delay = first.min(cap);
    for next in doubling(first, cap).take((n as usize).saturating_add(1)) {
        delay = next;
        // backon keeps the cap once there: no need to step through a long outage's count.
        if delay >= cap {
            break;
        }
    }
    delay
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each input is (first, cap) in milliseconds; the output, the first delays.
    fn check(input: (u64, u64), expected: &[u64]) {
        let ms = Duration::from_millis;
        let (first, cap) = (ms(input.0), ms(input.1));
        let expected: Vec<Duration> = expected.iter().map(|d| ms(*d)).collect();
        let delays: Vec<Duration> = doubling(first, cap).take(expected.len()).collect();
        assert_eq!(delays, expected, "{input:?}");
        for (n, delay) in expected.iter().enumerate() {
            assert_eq!(nth_delay(first, cap, n as u32), *delay, "{input:?}, n = {n}");
        }
    }

    #[test]
    fn delays_double_to_the_cap_and_stay_there() {
        let cases: &[((u64, u64), &[u64])] = &[
            // More than backon's default three, for ever.
            (
                (250, 10_000),
                &[250, 500, 1000, 2000, 4000, 8000, 10_000, 10_000, 10_000],
            ),
            (
                (10_000, 300_000),
                &[10_000, 20_000, 40_000, 80_000, 160_000, 300_000, 300_000],
            ),
            ((1000, 1000), &[1000, 1000, 1000]),
            // A first delay past the cap is capped.
            ((2000, 1000), &[1000, 1000]),
        ];
        for (input, expected) in cases {
            check(*input, expected);
        }
    }

    #[test]
    fn a_long_outage_counts_to_the_cap_at_once() {
        let cases = [
            (
                (Duration::from_secs(10), Duration::from_secs(300), u32::MAX),
                Duration::from_secs(300),
            ),
            ((Duration::from_nanos(1), Duration::MAX, u32::MAX), Duration::MAX),
        ];
        for ((first, cap, n), expected) in cases {
            assert_eq!(
                nth_delay(first, cap, n),
                expected,
                "{first:?} to {cap:?}, n = {n}"
            );
        }
    }
}
