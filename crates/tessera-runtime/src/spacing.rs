//! How often one writer may write one VolumeAttachment: a big one (a volume used by
//! many nodes) at most once per [`PERIOD`], every change meanwhile going out together.
//!
//! ```text
//!  write of an object with n tickets began at t ─▶ Spacing::wrote(name, t, n)
//!  next write of it ─▶ Spacing::left(name, now) ─▶ None: write now
//!                                                └▶ Some(d): wait d, gathering changes
//! ```
//!
//! A write of a VolumeAttachment costs kube-apiserver about 1 ms of CPU per ticket in
//! the object (decoding, validation, managed fields, encoding for etcd and every
//! watcher; bench/rwx/README.md, "Many nodes, one RWX volume"), however small the change.
//! While hundreds of nodes attach one volume, each ticket write and each status write
//! made as soon as the previous one returned would cost O(n) each, O(n²) for the
//! burst, and starve every other client of the API server. So an object of
//! [`LARGE`] tickets or more is written at most once per [`PERIOD`] by each of its
//! writers (the CSI driver's ticket writes, `csi::controller::group_commit`, and the
//! controller's status writes), as kube-controller-manager batches the updates of
//! big Endpoints objects (`--endpoint-updates-batch-period`). Smaller objects are
//! written at once, as before: a volume used by a few nodes waits for nothing.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// From this many tickets an object is written at most once per [`PERIOD`] (such a
/// write costs the API server about 0.1 s of CPU).
pub const LARGE: usize = 100;
/// The least time between the starts of two writes of a large object by one writer.
pub const PERIOD: Duration = Duration::from_secs(2);

/// The least time from the start of a write of an object holding `tickets` tickets to
/// the start of the next write of it by the same writer.
pub fn after(tickets: usize) -> Duration {
    if tickets >= LARGE {
        PERIOD
    } else {
        Duration::ZERO
    }
}

/// When the next write may start, per object name, for a writer of many objects.
/// Entries past their time are dropped as new ones come, so it holds only the objects
/// written in the last [`PERIOD`].
#[derive(Default)]
pub struct Spacing {
    next: Mutex<HashMap<String, Instant>>,
}

impl Spacing {
    /// A write of `name`, holding `tickets` tickets, began at `at`.
    pub fn wrote(&self, name: &str, at: Instant, tickets: usize) {
        let mut next = self.next.lock().expect("spacing lock");
        next.retain(|_, t| *t > at);
        let spacing = after(tickets);
        if !spacing.is_zero() {
            next.insert(name.to_string(), at + spacing);
        }
    }

    /// How long the next write of `name` waits from `now`: `None` when it may start.
    pub fn left(&self, name: &str, now: Instant) -> Option<Duration> {
        let next = self.next.lock().expect("spacing lock");
        next.get(name)
            .map(|t| t.saturating_duration_since(now))
            .filter(|d| !d.is_zero())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_large_object_waits_between_writes() {
        let ms = Duration::from_millis;
        // (tickets in the object written, spacing)
        let cases = [
            (0, ms(0)),
            (1, ms(0)),
            (99, ms(0)),
            (100, ms(2_000)),
            (500, ms(2_000)),
            (usize::MAX, ms(2_000)),
        ];
        for (tickets, want) in cases {
            assert_eq!(after(tickets), want, "{tickets} tickets");
        }
    }

    #[test]
    fn a_write_waits_out_the_period_of_the_last_one_of_its_object_only() {
        let s = Spacing::default();
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(s.left("a", t0), None, "never written: at once");
        s.wrote("a", t0, 500);
        assert_eq!(s.left("a", t0 + ms(150)), Some(ms(1_850)));
        assert_eq!(s.left("b", t0 + ms(150)), None, "another object");
        assert_eq!(s.left("a", t0 + ms(2_000)), None, "period over");
        s.wrote("c", t0, 10);
        assert_eq!(s.left("c", t0), None, "a small object: at once");
    }

    #[test]
    fn objects_past_their_time_are_forgotten() {
        let s = Spacing::default();
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        s.wrote("a", t0, 100); // until t0 + 2 s
        s.wrote("b", t0 + ms(1_000), 100); // until t0 + 3 s
        s.wrote("c", t0 + ms(2_500), 100);
        let mut names: Vec<String> = s.next.lock().unwrap().keys().cloned().collect();
        names.sort();
        assert_eq!(names, ["b", "c"], "a's time was over when c was written");
    }
}
