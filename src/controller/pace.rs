//! How fast the API server answers this controller now, and so how long a new attach
//! may go unreported before its statuses say it is under way.
//!
//! ```text
//!  the attachment reconcile's writes (MountPod, VolumeAttachment and Volume statuses)
//!        │ timed: from the call to the answer (queueing in the API server included)
//!        ▼
//!  Pace { last SAMPLES round trips } ─▶ recent_round_trip (median of the last WINDOW)
//!        ─▶ attach_quiet: ATTACH_ROUND_TRIPS of them, within [ATTACH_QUIET, MAX_ATTACH_QUIET]
//! ```
//!
//! A new attach costs a few API round trips (the MountPod, the agent's status, the
//! watch events in between). On an idle API server that is tens of milliseconds, and an
//! attach still unsatisfied after [`ATTACH_QUIET`] (1 s) is worth a status and an Event:
//! a person looking would want to know. Under a burst the API server queues every
//! request, every attach takes seconds, and none is waiting on anything but that queue:
//! writing Attaching for each would add two writes (and an Event) per attach to the
//! very queue that makes them slow. So the quiet time is counted in round trips of the
//! API server as this controller measures them: an attach reports itself once it has
//! taken [`ATTACH_ROUND_TRIPS`] of them, never before 1 s and never after
//! [`MAX_ATTACH_QUIET`]. Waits on something else (another node holds the volume, a
//! detach, a node without an agent, a failed mount) are not quiet at all
//! (`status::quiet_left`).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a new attach goes unreported on a responsive API server.
pub const ATTACH_QUIET: Duration = Duration::from_secs(1);
/// The longest a new attach goes unreported, however slow the API server.
pub const MAX_ATTACH_QUIET: Duration = Duration::from_secs(30);
/// How many of the API server's current round trips an attach may take unreported:
/// it needs about three (the MountPod, the agent's status, the statuses) plus two
/// watch deliveries; past three times that, something more than the queue is slow.
pub const ATTACH_ROUND_TRIPS: u32 = 15;
/// How far back round trips count: the API server's pace now, not during the last
/// burst.
const WINDOW: Duration = Duration::from_secs(10);
/// How many round trips are kept.
const SAMPLES: usize = 256;

/// The controller's recent API round trips.
#[derive(Default)]
pub struct Pace {
    samples: Mutex<VecDeque<(Instant, Duration)>>,
}

impl Pace {
    /// Run `fut` (one API request) and record how long it took.
    pub async fn timed<F: std::future::Future>(&self, fut: F) -> F::Output {
        let start = Instant::now();
        let out = fut.await;
        self.record(Instant::now(), start.elapsed());
        out
    }

    /// Record a round trip that ended `at`.
    pub fn record(&self, at: Instant, took: Duration) {
        let mut s = self.samples.lock().expect("pace lock");
        if s.len() == SAMPLES {
            s.pop_front();
        }
        s.push_back((at, took));
    }

    /// How long a new attach may go unreported now.
    pub fn attach_quiet(&self) -> Duration {
        let mut s = self.samples.lock().expect("pace lock");
        attach_quiet(recent_round_trip(
            s.make_contiguous(),
            Instant::now(),
            WINDOW,
        ))
    }
}

/// The median of the round trips in `samples` (ended at, took) that ended within
/// `window` before `now`; `None` without any.
pub fn recent_round_trip(
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

/// How long a new attach may go unreported when the API server answers in
/// `round_trip` (`None`: nothing measured lately, so it is idle):
/// [`ATTACH_ROUND_TRIPS`] of them, within [`ATTACH_QUIET`] and [`MAX_ATTACH_QUIET`].
pub fn attach_quiet(round_trip: Option<Duration>) -> Duration {
    round_trip
        .map_or(ATTACH_QUIET, |rt| rt.saturating_mul(ATTACH_ROUND_TRIPS))
        .clamp(ATTACH_QUIET, MAX_ATTACH_QUIET)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(m: u64) -> Duration {
        Duration::from_millis(m)
    }

    #[test]
    fn the_quiet_time_is_a_number_of_current_round_trips_within_bounds() {
        // (what, round trip in ms, quiet time in ms)
        let cases = [
            ("nothing measured lately: idle", None, 1_000),
            ("an idle API server (10 ms)", Some(10), 1_000),
            ("still under a second's worth (60 ms)", Some(60), 1_000),
            ("busy (100 ms): 15 round trips", Some(100), 1_500),
            ("saturated (1.2 s)", Some(1_200), 18_000),
            ("beyond the bound (5 s)", Some(5_000), 30_000),
            ("absurd (a day)", Some(86_400_000), 30_000),
        ];
        for (what, rt, want) in cases {
            assert_eq!(attach_quiet(rt.map(ms)), ms(want), "{what}");
        }
    }

    #[test]
    fn the_round_trip_is_the_median_of_the_last_window() {
        let now = Instant::now() + Duration::from_secs(100);
        let ago = |s: u64| now - Duration::from_secs(s);
        // (what, samples (seconds ago, took ms), median ms)
        type Samples = &'static [(u64, u64)];
        let cases: [(&str, Samples, Option<u64>); 5] = [
            ("none", &[], None),
            ("all older than the window", &[(11, 900), (30, 2_000)], None),
            ("one recent", &[(11, 900), (2, 40)], Some(40)),
            (
                "the median, not the mean: one slow request does not count",
                &[(1, 10), (1, 12), (2, 5_000), (3, 11), (4, 9)],
                Some(11),
            ),
            (
                "a burst: most requests slow",
                &[(1, 1_500), (1, 2_000), (2, 20), (3, 1_800)],
                Some(1_800),
            ),
        ];
        for (what, samples, want) in cases {
            let samples: Vec<(Instant, Duration)> =
                samples.iter().map(|(s, m)| (ago(*s), ms(*m))).collect();
            assert_eq!(
                recent_round_trip(&samples, now, WINDOW),
                want.map(ms),
                "{what}"
            );
        }
    }

    #[test]
    fn only_the_last_samples_are_kept() {
        let pace = Pace::default();
        let now = Instant::now();
        for _ in 0..SAMPLES {
            pace.record(now, Duration::from_secs(2));
        }
        assert_eq!(pace.attach_quiet(), Duration::from_secs(30));
        for _ in 0..SAMPLES {
            pace.record(Instant::now(), ms(5));
        }
        assert_eq!(pace.samples.lock().unwrap().len(), SAMPLES);
        assert_eq!(pace.attach_quiet(), ATTACH_QUIET);
    }
}
