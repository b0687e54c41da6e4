//! Per-MountPod exponential backoff of failing mounts, so one mount that keeps failing
//! costs a few API writes a minute, not a stream: the agent's own status writes
//! trigger its watch, and without a gate every write would start the next attempt.
//!
//! ```text
//!  reconcile ─▶ wait(name, generation, now)? ── Some(left) ─▶ requeue(left), nothing done
//!                 │ None
//!                 ▼
//!              serve ── failed ─▶ failed(name, generation, now) = base · 2^(n-1) ≤ cap
//!                    └─ served ─▶ succeeded(name)
//! ```
//!
//! A new generation (the spec changed) starts over at once. Pure: the caller passes
//! the time.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The backoff of every MountPod of this node, by name.
#[derive(Debug)]
pub struct Backoffs {
    base: Duration,
    cap: Duration,
    entries: Mutex<HashMap<String, Entry>>,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    generation: Option<i64>,
    failures: u32,
    until: Instant,
}

impl Default for Backoffs {
    /// 1 s, doubling, at most 60 s.
    fn default() -> Self {
        Backoffs::new(Duration::from_secs(1), Duration::from_secs(60))
    }
}

impl Backoffs {
    /// Delays of `base`, doubling after each failure, at most `cap`.
    pub fn new(base: Duration, cap: Duration) -> Self {
        Backoffs {
            base,
            cap,
            entries: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How long `name` must still wait before it is tried again; `None`: now.
    pub fn wait(&self, name: &str, generation: Option<i64>, now: Instant) -> Option<Duration> {
        let mut entries = self.lock();
        let e = entries.get(name)?;
        if e.generation != generation {
            entries.remove(name);
            return None;
        }
        let left = e.until.saturating_duration_since(now);
        (!left.is_zero()).then_some(left)
    }

    /// Record a failure of `name`; the delay before the next attempt.
    pub fn failed(&self, name: &str, generation: Option<i64>, now: Instant) -> Duration {
        let mut entries = self.lock();
        let failures = match entries.get(name) {
            Some(e) if e.generation == generation => e.failures.saturating_add(1),
            _ => 1,
        };
        let factor = 1u32 << (failures - 1).min(20);
        let delay = self.base.saturating_mul(factor).min(self.cap);
        entries.insert(
            name.to_string(),
            Entry {
                generation,
                failures,
                until: now + delay,
            },
        );
        delay
    }

    /// `name` works (or is gone): the next failure starts over.
    pub fn succeeded(&self, name: &str) {
        self.lock().remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap_and_reset() {
        let b = Backoffs::default();
        let t0 = Instant::now();
        let s = Duration::from_secs;
        // (failures so far, delay after the next one)
        let table = [
            (0, 1),
            (1, 2),
            (2, 4),
            (3, 8),
            (4, 16),
            (5, 32),
            (6, 60),
            (7, 60),
            (30, 60),
        ];
        let mut n = 0;
        for (before, want) in table {
            while n < before {
                b.failed("mp", Some(1), t0);
                n += 1;
            }
            let got = b.failed("mp", Some(1), t0);
            n += 1;
            assert_eq!(got, s(want), "after {before} failures");
        }
        b.succeeded("mp");
        assert_eq!(b.failed("mp", Some(1), t0), s(1));
    }

    #[test]
    fn waits_until_the_delay_is_over_or_the_spec_changes() {
        let b = Backoffs::default();
        let t0 = Instant::now();
        let s = Duration::from_secs;
        assert_eq!(b.wait("mp", Some(1), t0), None, "never failed");
        b.failed("mp", Some(1), t0);
        b.failed("mp", Some(1), t0);
        let table = [
            (Some(1), 0, Some(s(2))),
            (Some(1), 1, Some(s(1))),
            (Some(1), 2, None),
            (Some(1), 3, None),
        ];
        for (generation, at, want) in table {
            assert_eq!(b.wait("mp", generation, t0 + s(at)), want, "at {at}s");
        }
        assert_eq!(b.wait("other", Some(1), t0), None);
        // A new generation is tried at once, and its failures count from one.
        assert_eq!(b.wait("mp", Some(2), t0), None);
        assert_eq!(b.failed("mp", Some(2), t0), s(1));
    }
}
