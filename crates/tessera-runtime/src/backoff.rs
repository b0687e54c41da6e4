//! How the API watches of every role retry: [`ShortBackoff`], 100 ms doubling up to
//! 1 s, so a watch broken by an API server restart resumes within a second of the
//! server's return (the controller's shared watches, its leader Lease, the CSI
//! controller's publish cache).

use std::time::Duration;

/// The retry delays of a watch: 100 ms doubling up to 1 s, back to 100 ms once an event
/// arrives. kube's default climbs to 30 s, so a watch broken by an API server restart
/// could resume half a minute after the server is back; this one resumes within a
/// second (the cost: at most one failed request per second while it is away).
#[derive(Clone, Debug)]
pub struct ShortBackoff {
    next: Duration,
}

impl ShortBackoff {
    const MIN: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(1);
}

impl Default for ShortBackoff {
    fn default() -> Self {
        ShortBackoff { next: Self::MIN }
    }
}

impl Iterator for ShortBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let now = self.next;
        self.next = (now * 2).min(Self::MAX);
        Some(now)
    }
}

impl kube::runtime::utils::Backoff for ShortBackoff {
    fn reset(&mut self) {
        self.next = Self::MIN;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watch_backoff_is_short_and_capped() {
        use kube::runtime::utils::Backoff;
        let mut b = ShortBackoff::default();
        let ms: Vec<u128> = b.by_ref().take(7).map(|d| d.as_millis()).collect();
        assert_eq!(ms, [100, 200, 400, 800, 1000, 1000, 1000]);
        b.reset();
        assert_eq!(b.next(), Some(Duration::from_millis(100)));
    }
}
