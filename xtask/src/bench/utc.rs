//! UTC timestamps without a date-time dependency: file names, report headers, and the
//! API server's audit-log format for comparisons with it.

use std::time::{SystemTime, UNIX_EPOCH};

/// Civil date (year, month, day) of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn utc_parts(secs: u64) -> (i64, i64, i64, u64, u64, u64) {
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    let rest = secs % 86_400;
    (y, m, d, rest / 3600, rest / 60 % 60, rest % 60)
}

/// `20261202T163005Z`, for file names.
pub(crate) fn compact_utc(secs: u64) -> String {
    let (y, m, d, h, min, s) = utc_parts(secs);
    format!("{y:04}{m:02}{d:02}T{h:02}{min:02}{s:02}Z")
}

/// `2026-12-02 16:30:05 UTC`.
pub(crate) fn iso_utc(secs: u64) -> String {
    let (y, m, d, h, min, s) = utc_parts(secs);
    format!("{y:04}-{m:02}-{d:02} {h:02}:{min:02}:{s:02} UTC")
}

/// `2026-12-02T16:30:05.123456Z`: the API server's `MicroTime`, as its audit log writes
/// timestamps, so the two compare as strings.
pub(crate) fn rfc3339_micros(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let (y, m, d, h, min, s) = utc_parts(since.as_secs());
    format!(
        "{y:04}-{m:02}-{d:02}T{h:02}:{min:02}:{s:02}.{:06}Z",
        since.subsec_micros()
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn check(secs: u64, expected: (&str, &str)) {
        assert_eq!((compact_utc(secs).as_str(), iso_utc(secs).as_str()), expected);
    }

    #[test]
    fn timestamps_are_utc() {
        check(0, ("19700101T000000Z", "1970-01-01 00:00:00 UTC"));
        check(1_796_229_005, ("20261202T163005Z", "2026-12-02 16:30:05 UTC"));
        check(1_709_251_199, ("20240229T235959Z", "2024-02-29 23:59:59 UTC"));
        let time = UNIX_EPOCH + Duration::from_micros(1_796_229_005_000_042);
        assert_eq!(rfc3339_micros(time), "2026-12-02T16:30:05.000042Z");
    }
}
