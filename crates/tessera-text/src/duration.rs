//! Durations given on the command line: `500ms`, `15s`, `2m`, `1h`, or a bare number of
//! seconds (`15`, what the older `--…-seconds` flags took), more than 0 and at most
//! an hour. Every duration flag of every role takes this one syntax.

use std::time::Duration;

/// A flag value that is not such a duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// Not a number with a unit.
    #[error("{0:?} is not a duration such as 500ms, 15s, 2m, 1h or 15")]
    Syntax(String),
    /// Zero, negative or above the bound.
    #[error("{0:?} must be more than 0 and at most 1 hour")]
    Range(String),
}

/// The longest duration a flag may take.
pub const MAX: Duration = Duration::from_secs(3600);

/// `s` as a duration: `500ms`, `15s`, `2m`, `1h`, or a number of seconds (`15`).
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let (number, unit) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (s.strip_suffix('s').unwrap_or(s), 1.0)
    };
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| DurationError::Syntax(s.to_string()))?;
    let secs = value * unit;
    if !secs.is_finite() || secs <= 0.0 || secs > MAX.as_secs_f64() {
        return Err(DurationError::Range(s.to_string()));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let ok = [
            ("15s", 15_000),
            ("15", 15_000),
            ("500ms", 500),
            ("1.5s", 1_500),
            ("2m", 120_000),
            ("3600", 3_600_000),
            ("1h", 3_600_000),
        ];
        for (s, ms) in ok {
            assert_eq!(parse_duration(s).map(|d| d.as_millis()), Ok(ms), "{s}");
        }
        for bad in ["", "s", "0", "-1s", "2h", "61m", "1e9", "abc", "NaN", "m"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }
}
