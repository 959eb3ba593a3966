//! Wall-clock time as the planner sees it: a plain number, so plans are reproducible.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Milliseconds since the Unix epoch (UTC). Persisted in the state journal, so it must
/// survive restarts; the clock may go backwards, and every comparison tolerates it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Timestamp(pub i64);

impl Timestamp {
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

    /// RFC 3339 in UTC with millisecond precision, e.g. `2026-12-02T12:19:19.000Z`.
    pub fn to_rfc3339(self) -> String {
        let millis = self.0.rem_euclid(1000);
        let secs = self.0.div_euclid(1000);
        let (days, secs_of_day) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
        let (y, m, d) = civil_from_days(days);
        let (hh, mm, ss) = (secs_of_day / 3600, secs_of_day % 3600 / 60, secs_of_day % 60);
        format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}.{millis:03}Z")
    }

    /// Parses what [`Timestamp::to_rfc3339`] writes (and the same without fraction).
    pub fn parse_rfc3339(s: &str) -> Option<Self> {
        let s = s.strip_suffix('Z')?;
        let (date, time) = s.split_once('T')?;
        let mut date = date.splitn(3, '-').map(str::parse::<i64>);
        let (y, m, d) = (date.next()?.ok()?, date.next()?.ok()?, date.next()?.ok()?);
        let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
        let mut hms = hms.splitn(3, ':').map(str::parse::<i64>);
        let (hh, mm, ss) = (hms.next()?.ok()?, hms.next()?.ok()?, hms.next()?.ok()?);
        let valid = (1..=12).contains(&m) && (1..=31).contains(&d) && hh < 24 && mm < 60 && ss < 61;
        if !valid || frac.is_empty() || frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let millis: i64 = format!("{frac:0<3}")[..3].parse().ok()?;
        let secs = days_from_civil(y, m, d) * 86_400 + hh * 3600 + mm * 60 + ss;
        Some(Self(secs * 1000 + millis))
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

// Howard Hinnant's civil calendar algorithms (public domain).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
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
        assert_eq!(
            Timestamp::parse_rfc3339("2026-12-02T12:19:19Z"),
            Some(Timestamp(1_796_213_959_000))
        );
        for bad in [
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
