//! Durations on the command line: `500ms`, `30s`, `5m`, `1h` in, and short human text out.
//! What must never live here: anything that talks to a server.

use std::time::Duration;

/// Parses `500ms`, `30s`, `5m` or `1h` (a whole number and a unit; `0s` is allowed).
///
/// # Errors
///
/// A message naming the accepted forms, for clap to print as a usage error.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let form = "expected a whole number and a unit: 500ms, 30s, 5m or 1h";
    if number.is_empty() {
        return Err(format!("{text:?}: {form}"));
    }
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?}: the number is too large"))?;
    let millis_per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "" => return Err(format!("{text:?} has no unit: {form}")),
        _ => return Err(format!("{text:?}: unknown unit {unit:?}: {form}")),
    };
    number
        .checked_mul(millis_per_unit)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{text:?}: the duration is too large"))
}

/// Short human text: `850ms`, `30s`, `1m30s`, `2h5m`. Seconds are rounded down past 10 s.
pub fn format_duration(duration: Duration) -> String {
    let millis = duration.as_millis();
    if millis < 1_000 {
        return format!("{millis}ms");
    }
    let seconds = duration.as_secs();
    if seconds < 10 && !millis.is_multiple_of(1_000) {
        return format!("{:.1}s", duration.as_secs_f64());
    }
    let (hours, minutes, seconds) = (seconds / 3_600, seconds / 60 % 60, seconds % 60);
    match (hours, minutes, seconds) {
        (0, 0, seconds) => format!("{seconds}s"),
        (0, minutes, 0) => format!("{minutes}m"),
        (0, minutes, seconds) => format!("{minutes}m{seconds}s"),
        (hours, 0, _) => format!("{hours}h"),
        (hours, minutes, _) => format!("{hours}h{minutes}m"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        let good = [
            ("500ms", 500),
            ("30s", 30_000),
            ("5m", 300_000),
            ("1h", 3_600_000),
            ("0s", 0),
            (" 2s ", 2_000),
        ];
        for (text, millis) in good {
            assert_eq!(
                parse_duration(text),
                Ok(Duration::from_millis(millis)),
                "{text}"
            );
        }
        for bad in [
            "",
            "30",
            "s",
            "1.5s",
            "-1s",
            "5d",
            "ms",
            "99999999999999999999s",
            "1 s",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn durations_format() {
        let cases = [
            (850, "850ms"),
            (1_500, "1.5s"),
            (30_000, "30s"),
            (29_999, "29s"),
            (90_000, "1m30s"),
            (300_000, "5m"),
            (3_600_000, "1h"),
            (7_500_000, "2h5m"),
        ];
        for (millis, text) in cases {
            assert_eq!(
                format_duration(Duration::from_millis(millis)),
                text,
                "{millis}"
            );
        }
    }
}
