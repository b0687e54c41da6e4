//! The last line of every benchmark, for machines: `BENCH <name> key=value …`
//! (bench/README.md). Keys and values never hold spaces, so a line splits on
//! whitespace and then on the first `=`; figures carry their unit in the key
//! (`_s`, `_ms`, `_mib`), ratios are plain numbers.

use std::fmt::{Display, Write};

/// A `BENCH` line being built.
pub struct BenchLine(String);

impl BenchLine {
    pub fn new(name: &str) -> Self {
        BenchLine(format!("BENCH {}", word(name)))
    }

    /// `key=value`, with any whitespace in either replaced by `_`.
    pub fn field(mut self, key: &str, value: impl Display) -> Self {
        let _ = write!(self.0, " {}={}", word(key), word(&value.to_string()));
        self
    }

    /// `key=value` with `decimals` digits after the point.
    pub fn num(self, key: &str, value: f64, decimals: usize) -> Self {
        self.field(key, format!("{value:.decimals$}"))
    }

    pub fn print(self) {
        println!("{}", self.0);
    }
}

/// The 1-, 5- and 15-minute load averages now, as `a/b/c` (the machine is shared:
/// every line says how loaded it was).
pub fn loadavg() -> String {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    load.split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join("/")
}

/// `s` with whitespace replaced by `_` (an empty `s` becomes `-`).
fn word(s: &str) -> String {
    if s.is_empty() {
        return "-".into();
    }
    s.chars()
        .map(|c| if c.is_whitespace() { '_' } else { c })
        .collect()
}
