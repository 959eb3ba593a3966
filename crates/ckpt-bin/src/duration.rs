//! Durations as operators write them: `500ms`, `2s`, `5m`, `1h30m`.

use std::time::Duration;

/// Parses `500ms`, `2s`, `5m`, `1h`, and sums like `1m30s`. A bare `0` is zero.
///
/// # Errors
///
/// Anything else, or a sum past [`Duration::MAX`]: the message quotes the text and
/// shows what is accepted.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let invalid = || format!("invalid duration {text:?} (use e.g. 500ms, 2s, 5m, 1h30m)");
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    if rest.is_empty() {
        return Err(invalid());
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(invalid)?;
        let value: u64 = rest[..digits].parse().map_err(|_| invalid())?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let unit = match &rest[..unit_len] {
            "ms" => Duration::from_millis(value),
            "s" => Duration::from_secs(value),
            "m" => Duration::from_secs(value.checked_mul(60).ok_or_else(invalid)?),
            "h" => Duration::from_secs(value.checked_mul(3600).ok_or_else(invalid)?),
            _ => return Err(invalid()),
        };
        total = total.checked_add(unit).ok_or_else(invalid)?;
        rest = &rest[unit_len..];
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_operators_write() {
        let check = |text: &str, expected: Option<u64>| {
            assert_eq!(
                parse_duration(text).ok().map(|d| d.as_millis() as u64),
                expected,
                "{text:?}"
            );
        };
        check("500ms", Some(500));
        check("2s", Some(2_000));
        check("5m", Some(300_000));
        check("1h30m", Some(5_400_000));
        check("1m30s", Some(90_000));
        check("0", Some(0));
        check("0s", Some(0));
        check(" 3s ", Some(3_000));
        for bad in ["", "5", "5x", "s", "-1s", "1.5s", "5m3", "99999999999999999999h"] {
            check(bad, None);
        }
        assert_eq!(
            parse_duration("5x").unwrap_err(),
            "invalid duration \"5x\" (use e.g. 500ms, 2s, 5m, 1h30m)"
        );
    }

    proptest::proptest! {
        /// Any text: an answer, never a panic (overflow included).
        #[test]
        fn any_text_parses_or_is_refused(text in "\\PC{0,24}|[0-9hms ]{0,24}") {
            let _ = parse_duration(&text);
        }

        /// What an operator writes is the sum of its parts.
        #[test]
        fn sums_of_units_are_summed(h in 0u64..1000, m in 0u64..1000, s in 0u64..100_000, ms in 0u64..100_000) {
            let text = format!("{h}h{m}m{s}s{ms}ms");
            let expected = Duration::from_millis(((h * 60 + m) * 60 + s) * 1000 + ms);
            proptest::prop_assert_eq!(parse_duration(&text), Ok(expected));
        }
    }
}
