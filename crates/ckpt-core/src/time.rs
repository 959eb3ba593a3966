//! Wall-clock time as the planner sees it: a plain number, so plans are reproducible;
//! its text form is RFC 3339, through `jiff`.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Milliseconds since the Unix epoch (UTC). Persisted in the state journal, so it must
/// survive restarts; the clock may go backwards, and every comparison tolerates it.
///
/// Arithmetic saturates and text outside [`Timestamp::MIN`]..=[`Timestamp::MAX`] is
/// written as the limit, so no value overflows; a stored value outside that range (a
/// corrupted journal) does not deserialize, with an error that says so.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct Timestamp(pub i64);

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let ms = i64::deserialize(d)?;
        if (Self::MIN.0..=Self::MAX.0).contains(&ms) {
            Ok(Self(ms))
        } else {
            Err(serde::de::Error::custom(format_args!(
                "time {ms} ms since the epoch is outside the calendar ({} to {})",
                Self::MIN,
                Self::MAX
            )))
        }
    }
}

impl Timestamp {
    /// The earliest time RFC 3339 text can carry both ways (`-009999-01-02T01:59:59Z`:
    /// years down to -9999 with any UTC offset).
    pub const MIN: Self = Self(-377_705_023_201_000);
    /// The latest such time (`9999-12-30T22:00:00.999Z`).
    pub const MAX: Self = Self(253_402_207_200_999);

    /// The current wall-clock time (the only impure function here, for callers).
    pub fn now() -> Self {
        Self::from(SystemTime::now())
    }

    /// This time plus a duration, saturating.
    pub fn saturating_add(self, d: Duration) -> Self {
        Self(
            self.0
                .saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
        )
    }

    /// How long after `earlier` this is; zero if the clock went backwards.
    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(u64::try_from(self.0.saturating_sub(earlier.0)).unwrap_or(0))
    }

    /// RFC 3339 in UTC with millisecond precision, e.g. `2026-12-02T12:19:19.000Z`. A
    /// time beyond what the calendar holds (years past ±9999) is written as its limit.
    pub fn to_rfc3339(self) -> String {
        let time = jiff::Timestamp::from_millisecond(self.0).unwrap_or(if self.0 < 0 {
            jiff::Timestamp::MIN
        } else {
            jiff::Timestamp::MAX
        });
        format!("{time:.3}")
    }

    /// Parses an RFC 3339 time (what [`Timestamp::to_rfc3339`] writes, with or without a
    /// fraction, with any UTC offset); `None` for anything else, including dates that do
    /// not exist (`2026-02-31`). Digits below the millisecond are dropped.
    pub fn parse_rfc3339(s: &str) -> Option<Self> {
        let time: jiff::Timestamp = s.parse().ok()?;
        Some(Self(time.as_millisecond()))
    }
}

impl From<SystemTime> for Timestamp {
    fn from(t: SystemTime) -> Self {
        match t.duration_since(UNIX_EPOCH) {
            Ok(d) => Self(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
            Err(e) => Self(-i64::try_from(e.duration().as_millis()).unwrap_or(i64::MAX)),
        }
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_rfc3339())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trip() {
        let check = |ms: i64, text: &str| {
            assert_eq!(Timestamp(ms).to_rfc3339(), text);
            assert_eq!(Timestamp::parse_rfc3339(text), Some(Timestamp(ms)));
        };
        check(0, "1970-01-01T00:00:00.000Z");
        check(1_796_213_959_123, "2026-12-02T12:19:19.123Z");
        check(951_782_400_000, "2000-02-29T00:00:00.000Z");
        check(-1, "1969-12-31T23:59:59.999Z");
        for (text, ms) in [
            ("2026-12-02T12:19:19Z", 1_796_213_959_000),
            // Another offset is the same instant.
            ("2026-12-02T13:19:19.123+01:00", 1_796_213_959_123),
            // Digits below the millisecond are dropped.
            ("2026-12-02T12:19:19.123999999Z", 1_796_213_959_123),
            ("2024-02-29T00:00:00Z", 1_709_164_800_000),
        ] {
            assert_eq!(Timestamp::parse_rfc3339(text), Some(Timestamp(ms)), "{text:?}");
        }
        // Beyond the calendar's years: written as its limit, not as garbage.
        assert_eq!(Timestamp(i64::MAX).to_rfc3339(), "9999-12-30T22:00:00.999Z");
        for bad in [
            // Days that do not exist.
            "2026-02-31T00:00:00Z",
            "2025-02-29T00:00:00Z",
            "2026-04-31T00:00:00Z",
            "2026-12-00T00:00:00Z",
            // No offset: not an instant.
            "2026-12-02T12:19:19",
            "",
            "2026-12-02",
            "2026-13-02T00:00:00Z",
            "2026-12-02T25:00:00Z",
            "x-y-zTa:b:cZ",
            "2026-12-02T00:00:00.Z",
        ] {
            assert_eq!(Timestamp::parse_rfc3339(bad), None, "{bad:?}");
        }
    }

    /// Huge years and `i64` extremes never overflow: text outside the calendar does
    /// not parse, times outside it are written as its limit, arithmetic saturates, and
    /// a stored time outside it is refused with a clear error.
    #[test]
    fn extremes_saturate_or_are_refused() {
        fn check(text: &str, parsed: Option<i64>) {
            assert_eq!(Timestamp::parse_rfc3339(text), parsed.map(Timestamp), "{text:?}");
        }
        check("9999-12-30T22:00:00.999Z", Some(Timestamp::MAX.0));
        check("-009999-01-02T01:59:59Z", Some(Timestamp::MIN.0));
        check("9999-12-31T23:59:59.999Z", None);
        check("-009999-01-01T00:00:00Z", None);
        check("+010000-01-01T00:00:00Z", None);
        check("10000-01-01T00:00:00Z", None);
        check("275760-09-13T00:00:00Z", None);
        check("292278994-08-17T07:12:55.807Z", None);
        check("99999999999999999999-01-01T00:00:00Z", None);
        check("2026-12-02T12:19:19+99:00", None);

        for ms in [i64::MAX, Timestamp::MAX.0] {
            assert_eq!(Timestamp(ms).to_rfc3339(), "9999-12-30T22:00:00.999Z", "{ms}");
        }
        for ms in [i64::MIN, Timestamp::MIN.0] {
            assert_eq!(Timestamp(ms).to_rfc3339(), "-009999-01-02T01:59:59.000Z", "{ms}");
        }
        assert_eq!(Timestamp::MAX.0, jiff::Timestamp::MAX.as_millisecond());
        assert_eq!(Timestamp::MIN.0, jiff::Timestamp::MIN.as_millisecond());

        let far = Duration::from_secs(u64::MAX);
        assert_eq!(Timestamp(0).saturating_add(far), Timestamp(i64::MAX));
        assert_eq!(Timestamp(i64::MIN).saturating_add(far), Timestamp(-1));
        assert_eq!(
            Timestamp(i64::MAX).since(Timestamp(i64::MIN)),
            Duration::from_millis(u64::MAX >> 1)
        );
        assert_eq!(Timestamp(i64::MIN).since(Timestamp(i64::MAX)), Duration::ZERO);
        let future = UNIX_EPOCH.checked_add(Duration::from_secs(1 << 62));
        if let Some(future) = future {
            assert_eq!(Timestamp::from(future), Timestamp(i64::MAX));
        }

        for (json, ok) in [
            ("1796213959000", true),
            ("253402207200999", true),
            ("-377705023201000", true),
            ("253402207201000", false),
            ("-377705023201001", false),
            ("9223372036854775807", false),
            ("-9223372036854775808", false),
        ] {
            let read = serde_json::from_str::<Timestamp>(json);
            assert_eq!(read.is_ok(), ok, "{json}: {read:?}");
            if let Err(e) = read {
                assert!(e.to_string().contains("is outside the calendar"), "{e}");
            }
        }
    }

    #[test]
    fn arithmetic_tolerates_clock_going_backwards() {
        assert_eq!(Timestamp(5_000).since(Timestamp(7_000)), Duration::ZERO);
        assert_eq!(Timestamp(7_000).since(Timestamp(5_000)), Duration::from_secs(2));
        assert_eq!(
            Timestamp(i64::MAX - 1).saturating_add(Duration::from_secs(1)),
            Timestamp(i64::MAX)
        );
    }
}
