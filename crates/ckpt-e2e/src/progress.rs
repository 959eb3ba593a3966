//! Progress lines on stderr, the one way every `cargo xtask` command and the end-to-end suite
//! say what they are doing: `[deploy] …`, or stamped with the time since a start,
//! `[bench  12.3 s] …`. Stdout stays free for what a command prints as its result.

use std::time::{Duration, Instant};

/// Where progress lines come from, and the start they are timed from, if any.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    label: &'static str,
    started: Option<Instant>,
}

impl Progress {
    /// Lines `[label] message`.
    pub const fn new(label: &'static str) -> Progress {
        Progress { label, started: None }
    }

    /// Lines `[label  12.3 s] message`, timed from now.
    pub fn timed(label: &'static str) -> Progress {
        Progress {
            label,
            started: Some(Instant::now()),
        }
    }

    /// Prints one progress line.
    pub fn say(&self, message: &str) {
        eprintln!("{}", self.line(message));
    }

    fn line(&self, message: &str) -> String {
        match self.started {
            Some(started) => format!(
                "[{} {:>5.1} s] {message}",
                self.label,
                started.elapsed().as_secs_f64()
            ),
            None => format!("[{}] {message}", self.label),
        }
    }
}

/// `0.4 s`, `12.3 s`, `5 min 33 s`.
pub fn human_duration(duration: Duration) -> String {
    let secs = duration.as_secs_f64();
    if secs < 60.0 {
        format!("{secs:.1} s")
    } else {
        let whole = duration.as_secs();
        format!("{} min {} s", whole / 60, whole % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(progress: Progress, expected: &str) {
        assert_eq!(progress.line("building"), expected);
    }

    #[test]
    fn lines_carry_the_label_and_the_time_since_the_start() {
        check(Progress::new("deploy"), "[deploy] building");
        let a_minute_ago = Instant::now().checked_sub(Duration::from_secs(60));
        let started = Some(a_minute_ago.expect("the machine has been up for a minute"));
        check(
            Progress {
                label: "bench",
                started,
            },
            "[bench  60.0 s] building",
        );
        check(Progress::timed("demo"), "[demo   0.0 s] building");
    }

    #[test]
    fn durations_read_as_seconds_or_minutes() {
        assert_eq!(human_duration(Duration::from_millis(420)), "0.4 s");
        assert_eq!(human_duration(Duration::from_millis(59_940)), "59.9 s");
        assert_eq!(human_duration(Duration::from_secs(333)), "5 min 33 s");
    }
}
