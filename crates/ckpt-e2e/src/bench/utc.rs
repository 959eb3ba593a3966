//! UTC timestamps in the forms the bench needs (file names, report headers, the API
//! server's audit-log format for comparisons with it), on ckpt-core's calendar.

use std::time::{SystemTime, UNIX_EPOCH};

use ckpt_core::Timestamp;

/// `2026-12-02T16:30:05` for whole seconds since the epoch: ckpt-core's calendar, without
/// its milliseconds.
fn date_time(secs: u64) -> String {
    let millis = i64::try_from(secs).unwrap_or(i64::MAX).saturating_mul(1000);
    let rfc3339 = Timestamp(millis).to_rfc3339();
    rfc3339.split('.').next().unwrap_or_default().to_owned()
}

/// `20261202T163005Z`, for file names.
pub(crate) fn compact_utc(secs: u64) -> String {
    format!("{}Z", date_time(secs).replace(['-', ':'], ""))
}

/// `2026-12-02 16:30:05 UTC`.
pub(crate) fn iso_utc(secs: u64) -> String {
    format!("{} UTC", date_time(secs).replacen('T', " ", 1))
}

/// `2026-12-02T16:30:05.123456Z`: the API server's `MicroTime`, as its audit log writes
/// timestamps, so the two compare as strings.
pub(crate) fn rfc3339_micros(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    format!("{}.{:06}Z", date_time(since.as_secs()), since.subsec_micros())
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
