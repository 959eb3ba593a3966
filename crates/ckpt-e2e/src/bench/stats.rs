//! Summaries of repeated measurements: min / median / max, as the tables report them.

use std::time::Duration;

use serde_json::{Value, json};

/// The summary of `n` samples.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    pub n: usize,
    pub min: f64,
    /// The middle sample; the mean of the two middle ones when `n` is even.
    pub median: f64,
    pub max: f64,
}

/// `None` for no samples.
pub fn summarize(samples: &[f64]) -> Option<Summary> {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let (&min, &max) = (sorted.first()?, sorted.last()?);
    let median = if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    };
    Some(Summary { n, min, median, max })
}

/// Latency samples, in seconds.
#[derive(Clone, Debug, Default)]
pub(crate) struct Samples(Vec<f64>);

impl Samples {
    pub(crate) fn push(&mut self, sample: Duration) {
        self.0.push(sample.as_secs_f64());
    }

    pub(crate) fn summary(&self) -> Option<Summary> {
        summarize(&self.0)
    }

    /// `{"n", "min_s", "median_s", "max_s", "samples_s"}`.
    pub(crate) fn to_json(&self) -> Value {
        let summary = self.summary();
        json!({
            "n": self.0.len(),
            "min_s": summary.map(|s| s.min),
            "median_s": summary.map(|s| s.median),
            "max_s": summary.map(|s| s.max),
            "samples_s": self.0,
        })
    }
}

/// A duration in seconds as the tables show it: `87 ms`, `2.31 s`.
pub fn seconds(secs: f64) -> String {
    if secs < 1.0 {
        format!("{:.0} ms", secs * 1000.0)
    } else {
        format!("{secs:.2} s")
    }
}

/// The agent's `pod_checkpointer_pass_duration_seconds` histogram (cumulative buckets).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct PassHistogram {
    pub(crate) count: u64,
    pub(crate) sum_seconds: f64,
    /// `(le, passes that took at most le seconds)`, ascending, without `+Inf`.
    pub(crate) buckets: Vec<(f64, u64)>,
}

const PASS_HISTOGRAM: &str = "pod_checkpointer_pass_duration_seconds";

impl PassHistogram {
    /// From a Prometheus text page; `None` when the histogram is missing.
    pub(crate) fn parse(page: &str) -> Option<PassHistogram> {
        let mut histogram = PassHistogram::default();
        let mut found = false;
        for line in page.lines().filter(|l| !l.starts_with('#')) {
            let Some(rest) = line.strip_prefix(PASS_HISTOGRAM) else {
                continue;
            };
            let (name, value) = rest.rsplit_once(' ')?;
            if name == "_count" {
                histogram.count = value.parse().ok()?;
                found = true;
            } else if name == "_sum" {
                histogram.sum_seconds = value.parse().ok()?;
            } else if let Some(le) = name
                .strip_prefix("_bucket{le=\"")
                .and_then(|l| l.strip_suffix("\"}"))
                .filter(|le| *le != "+Inf")
            {
                histogram.buckets.push((le.parse().ok()?, value.parse().ok()?));
            }
        }
        histogram.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        found.then_some(histogram)
    }

    /// The passes since `earlier` (a reading of the same agent).
    pub(crate) fn since(&self, earlier: &PassHistogram) -> PassHistogram {
        let before = |le: f64| {
            earlier
                .buckets
                .iter()
                .find(|(l, _)| *l == le)
                .map_or(0, |(_, n)| *n)
        };
        PassHistogram {
            count: self.count.saturating_sub(earlier.count),
            sum_seconds: self.sum_seconds - earlier.sum_seconds,
            buckets: self
                .buckets
                .iter()
                .map(|(le, n)| (*le, n.saturating_sub(before(*le))))
                .collect(),
        }
    }

    pub(crate) fn mean_seconds(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum_seconds / self.count as f64)
    }

    /// The smallest bucket bound every pass fits under: an upper bound of the slowest pass
    /// (`None` when the slowest is beyond the last bucket, or there were no passes).
    pub(crate) fn max_at_most(&self) -> Option<f64> {
        self.buckets
            .iter()
            .find(|(_, n)| *n == self.count && self.count > 0)
            .map(|(le, _)| *le)
    }

    pub(crate) fn to_json(&self) -> Value {
        json!({
            "passes": self.count,
            "mean_s": self.mean_seconds(),
            "slowest_at_most_s": self.max_at_most(),
            "buckets_le_s": self.buckets,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(samples: &[f64], expected: Option<(usize, f64, f64, f64)>) {
        let got = summarize(samples).map(|s| (s.n, s.min, s.median, s.max));
        assert_eq!(got, expected, "samples {samples:?}");
    }

    #[test]
    fn min_median_max() {
        check(&[], None);
        check(&[0.5], Some((1, 0.5, 0.5, 0.5)));
        check(&[3.0, 1.0, 2.0], Some((3, 1.0, 2.0, 3.0)));
        check(&[4.0, 1.0, 2.0, 3.0], Some((4, 1.0, 2.5, 4.0)));
        check(&[0.2, 0.2, 9.0, 0.1, 0.3], Some((5, 0.1, 0.2, 9.0)));
    }

    #[test]
    fn the_pass_histogram_parses_and_subtracts() {
        let page = |count: u64, sum: f64, small: u64, mid: u64| {
            format!(
                "# TYPE pod_checkpointer_pass_duration_seconds histogram\n\
                 pod_checkpointer_pass_duration_seconds_bucket{{le=\"0.005\"}} {small}\n\
                 pod_checkpointer_pass_duration_seconds_bucket{{le=\"0.05\"}} {mid}\n\
                 pod_checkpointer_pass_duration_seconds_bucket{{le=\"+Inf\"}} {count}\n\
                 pod_checkpointer_pass_duration_seconds_sum {sum}\n\
                 pod_checkpointer_pass_duration_seconds_count {count}\n"
            )
        };
        let before = PassHistogram::parse(&page(4, 0.01, 4, 4)).unwrap();
        assert_eq!(before.buckets, vec![(0.005, 4), (0.05, 4)]);
        assert_eq!(before.max_at_most(), Some(0.005));
        let after = PassHistogram::parse(&page(10, 0.13, 5, 9)).unwrap();
        let delta = after.since(&before);
        assert_eq!(delta.count, 6);
        assert_eq!(delta.buckets, vec![(0.005, 1), (0.05, 5)]);
        assert!((delta.mean_seconds().unwrap() - 0.02).abs() < 1e-9);
        // One pass beyond the last bucket: no bound.
        assert_eq!(delta.max_at_most(), None);
        assert_eq!(
            PassHistogram::parse("pod_checkpointer_activations_total 1\n"),
            None
        );
        assert_eq!(PassHistogram::default().mean_seconds(), None);
    }

    #[test]
    fn seconds_read_as_milliseconds_below_one() {
        assert_eq!(seconds(0.0874), "87 ms");
        assert_eq!(seconds(2.3149), "2.31 s");
    }
}
