//! Durations, one grammar for every flag, StorageClass parameter and `kubectl
//! tessera` argument: jiff's friendly format (`500ms`, `15s`, `2m`, `1h30m`, `2d`,
//! `1.5s`, `1 hour 30 minutes`) or a bare number of seconds (`15`, `1.5`, what the
//! older `--…-seconds` flags and `idleMountDelay` took). Days are 24 hours. What a
//! caller accepts is then its own bound: [`parse`] reads the text, [`Bounds`] says
//! which durations a field takes.

use std::time::Duration;

use jiff::{Span, SpanRelativeTo};

/// A value that is not a duration, or not one its field takes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// Not a duration in the grammar.
    #[error("{0:?} is not a duration such as 500ms, 15s, 2m, 1h30m, 2d or 15")]
    Syntax(String),
    /// A duration outside what the field takes.
    #[error("{0:?} must be {1}")]
    Range(String, &'static str),
    /// A fraction of a second where whole seconds are taken.
    #[error("{0:?} must be a whole number of seconds")]
    Fraction(String),
}

/// The longest duration a flag may take.
pub const MAX: Duration = Duration::from_secs(3600);

/// The longest text read: no duration anyone writes is longer, and nothing unbounded
/// reaches the parser.
const MAX_LEN: usize = 64;

/// `s` as a duration, in the grammar of this module; negative durations are refused.
pub fn parse(s: &str) -> Result<Duration, DurationError> {
    let syntax = || DurationError::Syntax(s.to_string());
    let text = s.trim();
    if text.is_empty() || text.len() > MAX_LEN {
        return Err(syntax());
    }
    if text.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        // A bare number: seconds.
        let secs: f64 = text.parse().map_err(|_| syntax())?;
        return Duration::try_from_secs_f64(secs).map_err(|_| syntax());
    }
    let span: Span = text.parse().map_err(|_| syntax())?;
    let signed = span
        .to_duration(SpanRelativeTo::days_are_24_hours())
        .map_err(|_| syntax())?;
    Duration::try_from(signed).map_err(|_| syntax())
}

/// Which durations a field takes.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Whether zero is taken.
    pub zero: bool,
    /// The longest taken.
    pub max: Duration,
    /// Whether only whole seconds are taken.
    pub whole_seconds: bool,
    /// The bounds in words, for the error.
    pub said: &'static str,
}

impl Bounds {
    /// Every duration flag of every role: more than 0 and at most an hour.
    pub const FLAG: Bounds = Bounds {
        zero: false,
        max: MAX,
        whole_seconds: false,
        said: "more than 0 and at most 1 hour",
    };

    /// `s` as a duration within these bounds.
    pub fn parse(&self, s: &str) -> Result<Duration, DurationError> {
        let d = parse(s)?;
        if (d.is_zero() && !self.zero) || d > self.max {
            return Err(DurationError::Range(s.to_string(), self.said));
        }
        if self.whole_seconds && d.subsec_nanos() != 0 {
            return Err(DurationError::Fraction(s.to_string()));
        }
        Ok(d)
    }
}

/// A flag's value: more than 0 and at most an hour (clap's `value_parser`).
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    Bounds::FLAG.parse(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_of_the_three_former_grammars_reads_the_same() {
        // The flags' `500ms`/`15s`/`2m`/`1h`/bare seconds, the StorageClass's
        // `idleMountDelay` (`90`, `90s`, `5m`, `24h`) and the plugin's `2d`.
        let ok = [
            ("15s", 15_000),
            ("15", 15_000),
            ("500ms", 500),
            ("1.5s", 1_500),
            ("1.5", 1_500),
            ("2m", 120_000),
            ("3600", 3_600_000),
            ("1h", 3_600_000),
            ("90", 90_000),
            ("24h", 86_400_000),
            ("2d", 172_800_000),
            ("0", 0),
            // New: several units, words, spaces.
            ("1h30m", 5_400_000),
            ("1h 30m", 5_400_000),
            ("1 hour 30 minutes", 5_400_000),
            ("1.5m", 90_000),
            (" 15s ", 15_000),
        ];
        for (s, ms) in ok {
            assert_eq!(parse(s).map(|d| d.as_millis()), Ok(ms), "{s}");
        }
        for bad in [
            "", "s", "-1s", "1e9", "abc", "NaN", "m", "1x", "1.2.3", "-5", "1s1h", "ago",
        ] {
            assert!(
                matches!(parse(bad), Err(DurationError::Syntax(_))),
                "{bad:?}"
            );
        }
        let long = "1".repeat(MAX_LEN + 1);
        assert!(parse(&long).is_err(), "an unbounded text is not read");
    }

    #[test]
    fn a_flag_takes_more_than_zero_and_at_most_an_hour() {
        for (s, ms) in [("15s", 15_000), ("1h", 3_600_000), ("59m59s", 3_599_000)] {
            assert_eq!(parse_duration(s).map(|d| d.as_millis()), Ok(ms), "{s}");
        }
        for bad in ["0", "0s", "2h", "61m", "1h0.5s", "1d"] {
            assert!(
                matches!(parse_duration(bad), Err(DurationError::Range(..))),
                "{bad:?}: {:?}",
                parse_duration(bad)
            );
        }
    }

    #[test]
    fn whole_seconds_refuse_a_fraction() {
        let b = Bounds {
            zero: true,
            max: Duration::from_secs(86_400),
            whole_seconds: true,
            said: "from 0 to 1 day",
        };
        assert_eq!(b.parse("0"), Ok(Duration::ZERO));
        assert_eq!(b.parse("1.5m"), Ok(Duration::from_secs(90)));
        assert!(matches!(b.parse("1.5s"), Err(DurationError::Fraction(_))));
        assert!(matches!(b.parse("25h"), Err(DurationError::Range(..))));
    }
}
