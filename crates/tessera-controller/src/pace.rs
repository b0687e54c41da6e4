//! How long a new attach may go unreported before its statuses say it is under way:
//! longer while many attaches wait together, as long as it takes them to get through.
//!
//! ```text
//!  attachment reconcile: a ticket newly satisfied ─▶ Pace::attached(first sighting → now)
//!  Sightings::pending (tickets seen, status not written: the backlog) ─┐
//!  Pace { attach times of the last WINDOW } ─▶ recent_attach (median) ─┴▶ attach_quiet
//! ```
//!
//! An attach that waits alone for more than [`ATTACH_QUIET`] (1 s) is worth a status
//! and an Event: a person looking would want to know, and nothing but its mount can hold
//! it up. Under a burst, hundreds of attaches share the API server, every one takes
//! seconds, and none is waiting on anything but that queue: writing Attaching for each
//! would add two writes and an Event per attach to the very queue that makes them slow.
//! So while other attaches wait too (a backlog of more than one), an attach reports
//! itself only once it has taken [`RECENT_FACTOR`] times as long as the attaches done
//! in the last [`WINDOW`]; with none done yet (a burst's first), after
//! [`COLD_PER_ATTACH`] per attach waiting. Never before 1 s, never after
//! [`MAX_ATTACH_QUIET`]. Waits on anything else (another node holds the volume, a
//! detach, a node without an agent, a failed mount) are not quiet at all
//! (`status::quiet_left`).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a new attach goes unreported when it waits alone.
pub const ATTACH_QUIET: Duration = Duration::from_secs(1);
/// The longest a new attach goes unreported, however many wait.
pub const MAX_ATTACH_QUIET: Duration = Duration::from_secs(30);
/// An attach in a backlog is slow once it took this many times as long as the recent
/// ones. A burst is served about in order: those done so far took about half the time
/// the burst has run (their median), and its last ones take the whole of it, twice
/// that median; so the factor leaves twice that margin (with 2, 48–112 attaches of
/// each 200 in bench-controller's rounds were reported Attaching at the tail).
pub const RECENT_FACTOR: u32 = 4;
/// With nothing done lately, the quiet time per attach waiting.
pub const COLD_PER_ATTACH: Duration = Duration::from_millis(100);
/// How far back attach times count.
const WINDOW: Duration = Duration::from_secs(10);
/// How many attach times are kept.
const SAMPLES: usize = 256;

/// The times of the recent attaches.
#[derive(Default)]
pub struct Pace {
    samples: Mutex<VecDeque<(Instant, Duration)>>,
}

impl Pace {
    /// An attach was satisfied `took` after its ticket was first seen.
    pub fn attached(&self, took: Duration) {
        self.record(Instant::now(), took);
    }

    fn record(&self, at: Instant, took: Duration) {
        let mut s = self.samples.lock().expect("pace lock");
        if s.len() == SAMPLES {
            s.pop_front();
        }
        s.push_back((at, took));
    }

    /// How long a new attach may go unreported now, with `backlog` new attaches
    /// (this one included) under way.
    pub fn attach_quiet(&self, backlog: usize) -> Duration {
        let mut s = self.samples.lock().expect("pace lock");
        let recent = recent_attach(s.make_contiguous(), Instant::now(), WINDOW);
        attach_quiet(backlog, recent)
    }
}

/// The median of the attach times in `samples` (done at, took) done within `window`
/// before `now`; `None` without any.
pub fn recent_attach(
    samples: &[(Instant, Duration)],
    now: Instant,
    window: Duration,
) -> Option<Duration> {
    let mut recent: Vec<Duration> = samples
        .iter()
        .filter(|(at, _)| now.saturating_duration_since(*at) <= window)
        .map(|(_, took)| *took)
        .collect();
    if recent.is_empty() {
        return None;
    }
    recent.sort();
    Some(recent[recent.len() / 2])
}

/// How long a new attach may go unreported with `backlog` new attaches under way (this
/// one included) and the recent ones taking `recent` (median; `None`: none done lately).
pub fn attach_quiet(backlog: usize, recent: Option<Duration>) -> Duration {
    if backlog <= 1 {
        return ATTACH_QUIET;
    }
    let backlog = u32::try_from(backlog).unwrap_or(u32::MAX);
    recent
        .map_or_else(
            || COLD_PER_ATTACH.saturating_mul(backlog),
            |r| r.saturating_mul(RECENT_FACTOR),
        )
        .clamp(ATTACH_QUIET, MAX_ATTACH_QUIET)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(m: u64) -> Duration {
        Duration::from_millis(m)
    }

    #[test]
    fn the_quiet_time_grows_with_the_backlog_and_the_recent_attach_times() {
        // (what, backlog, recent attach time in ms, quiet time in ms)
        let cases = [
            ("alone, nothing done lately", 1, None, 1_000),
            (
                "alone after a burst of slow ones: its wait is its own",
                1,
                Some(8_000),
                1_000,
            ),
            (
                "none under way (a reconcile of another kind)",
                0,
                None,
                1_000,
            ),
            ("a few at once, none done yet", 5, None, 1_000),
            (
                "a burst's first: 60 waiting, none done yet",
                60,
                None,
                6_000,
            ),
            ("a burst's first: 1,000 waiting", 1_000, None, 30_000),
            ("a few at once, fast lately", 5, Some(80), 1_000),
            ("a burst, 4 s per attach lately", 200, Some(4_000), 16_000),
            // 200 attaches of one burst, done in order over 3.5 s: those done so far
            // took 1 s (median); the last of them take the whole 3.5 s and must not
            // be reported as slow (measured: bench/controller/README.md, run C).
            ("a burst's tail", 20, Some(1_000), 4_000),
            ("a burst, 20 s per attach lately", 200, Some(20_000), 30_000),
            ("absurd", usize::MAX, Some(86_400_000), 30_000),
        ];
        for (what, backlog, recent, want) in cases {
            assert_eq!(attach_quiet(backlog, recent.map(ms)), ms(want), "{what}");
        }
    }

    #[test]
    fn the_recent_attach_time_is_the_median_of_the_last_window() {
        let now = Instant::now() + Duration::from_secs(100);
        let ago = |s: u64| now - Duration::from_secs(s);
        // (what, samples (seconds ago, took ms), median ms)
        type Samples = &'static [(u64, u64)];
        let cases: [(&str, Samples, Option<u64>); 5] = [
            ("none", &[], None),
            ("all older than the window", &[(11, 900), (30, 2_000)], None),
            ("one recent", &[(11, 900), (2, 40)], Some(40)),
            (
                "the median, not the mean: one slow attach does not count",
                &[(1, 10), (1, 12), (2, 5_000), (3, 11), (4, 9)],
                Some(11),
            ),
            (
                "a burst: most attaches slow",
                &[(1, 1_500), (1, 2_000), (2, 20), (3, 1_800)],
                Some(1_800),
            ),
        ];
        for (what, samples, want) in cases {
            let samples: Vec<(Instant, Duration)> =
                samples.iter().map(|(s, m)| (ago(*s), ms(*m))).collect();
            assert_eq!(recent_attach(&samples, now, WINDOW), want.map(ms), "{what}");
        }
    }

    #[test]
    fn only_the_last_samples_are_kept() {
        let pace = Pace::default();
        for _ in 0..SAMPLES {
            pace.attached(Duration::from_secs(20));
        }
        assert_eq!(pace.attach_quiet(10), MAX_ATTACH_QUIET);
        assert_eq!(pace.attach_quiet(1), ATTACH_QUIET);
        for _ in 0..SAMPLES {
            pace.attached(ms(5));
        }
        assert_eq!(pace.samples.lock().unwrap().len(), SAMPLES);
        assert_eq!(pace.attach_quiet(10), ATTACH_QUIET);
    }
}
