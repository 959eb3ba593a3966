//! What a power cut of the self-hosted node is timed with: samplers that look at the world
//! every 100 ms from a thread of their own (the API server's `/readyz`, the runtime's
//! containers), and the pure summaries of their samples (when something first held, the
//! longest stretch it did not, how long it held in all).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// One look, and when it was taken (when the look started).
pub type Sample<T> = (Instant, T);

/// Takes a sample every `interval` (or as fast as one look allows) until stopped.
pub struct Sampler<T> {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Vec<Sample<T>>>,
}

impl<T: Send + 'static> Sampler<T> {
    pub fn start(interval: Duration, mut look: impl FnMut() -> T + Send + 'static) -> Sampler<T> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let handle = thread::spawn(move || {
            let mut samples = Vec::new();
            while !stopped.load(Ordering::Relaxed) {
                let at = Instant::now();
                samples.push((at, look()));
                if let Some(rest) = interval.checked_sub(at.elapsed()) {
                    thread::sleep(rest);
                }
            }
            samples
        });
        Sampler { stop, handle }
    }

    /// Stops and returns every sample, oldest first (none if the sampling thread panicked).
    pub fn stop(self) -> Vec<Sample<T>> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap_or_default()
    }
}

/// When `holds` first held at or after `from`.
pub fn first_at<T>(samples: &[Sample<T>], from: Instant, holds: impl Fn(&T) -> bool) -> Option<Instant> {
    samples
        .iter()
        .find(|(at, value)| *at >= from && holds(value))
        .map(|(at, _)| *at)
}

/// The longest stretch within `[from, to]` during which `holds` did not hold: from the
/// first sample that failed to the next one that held (or to `to`).
pub fn longest_lapse<T>(
    samples: &[Sample<T>],
    from: Instant,
    to: Instant,
    holds: impl Fn(&T) -> bool,
) -> Duration {
    let mut longest = Duration::ZERO;
    let mut lapse_start: Option<Instant> = None;
    for (at, value) in samples.iter().filter(|(at, _)| *at >= from && *at <= to) {
        match (holds(value), lapse_start) {
            (false, None) => lapse_start = Some(*at),
            (true, Some(start)) => {
                longest = longest.max(*at - start);
                lapse_start = None;
            }
            _ => {}
        }
    }
    if let Some(start) = lapse_start {
        longest = longest.max(to.saturating_duration_since(start));
    }
    longest
}

/// How long `holds` held in all: each sample that holds counts until the next sample.
pub fn time_holding<T>(samples: &[Sample<T>], holds: impl Fn(&T) -> bool) -> Duration {
    samples
        .windows(2)
        .filter(|pair| holds(&pair[0].1))
        .map(|pair| pair[1].0 - pair[0].0)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Samples 100 ms apart from `t0`, one per character: `+` holds, `-` does not.
    fn samples(t0: Instant, pattern: &str) -> Vec<Sample<bool>> {
        pattern
            .chars()
            .enumerate()
            .map(|(i, c)| (t0 + Duration::from_millis(100 * i as u64), c == '+'))
            .collect()
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// `pattern` sampled from `t0`, the window `[from, to]` in ms → (first holding, longest
    /// lapse, time holding) in ms.
    fn check(pattern: &str, (from, to): (u64, u64), expected: (Option<u64>, u64, u64)) {
        let t0 = Instant::now();
        let holds = |v: &bool| *v;
        let s = samples(t0, pattern);
        let (from, to) = (t0 + ms(from), t0 + ms(to));
        let first = first_at(&s, from, holds).map(|at| (at - t0).as_millis() as u64);
        let lapse = longest_lapse(&s, from, to, holds).as_millis() as u64;
        let holding = time_holding(&s, holds).as_millis() as u64;
        assert_eq!((first, lapse, holding), expected, "{pattern}");
    }

    #[test]
    fn summaries_of_sample_patterns() {
        check("+++++", (0, 400), (Some(0), 0, 400));
        check("--+++", (0, 400), (Some(200), 200, 200));
        check("++---++", (0, 600), (Some(0), 300, 300));
        check("+--+----+", (0, 800), (Some(0), 400, 200));
        // A lapse still open at `to` lasts until `to`.
        check("++---", (0, 1000), (Some(0), 800, 200));
        // Only the window counts: the early lapse is outside it.
        check("---+-+", (300, 500), (Some(300), 100, 100));
        check("-----", (0, 400), (None, 400, 0));
    }

    #[test]
    fn a_sampler_samples_until_stopped() {
        let mut n = 0;
        let sampler = Sampler::start(ms(10), move || {
            n += 1;
            n
        });
        thread::sleep(ms(100));
        let samples = sampler.stop();
        assert!(samples.len() >= 3, "{} samples", samples.len());
        assert!(
            samples
                .windows(2)
                .all(|w| w[0].0 < w[1].0 && w[0].1 + 1 == w[1].1)
        );
    }
}
