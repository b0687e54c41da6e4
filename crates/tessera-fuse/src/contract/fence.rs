//! Self-fencing (docs/failover.md): the node's fence file, which the node agent
//! writes after each successful renewal of its node's liveness Lease, and the
//! daemon's pure fence state machine over it.
//!
//! ```text
//!  agent: t = boottime_ns() ─▶ Lease update ─ok─▶ <state>/node.fence = news_text(News{epoch, t, F})
//!  daemon (--fence-file): News::parse ─▶ Fence::hear ─▶ Fence::verdict(boottime_ns())
//!        Writable (now < t + F) │ Fenced (no news for F: mutations wait) │ Revoked (epoch changed: EIO)
//! ```
//!
//! Times are `CLOCK_BOOTTIME` nanoseconds: one clock for every process of the host,
//! and it keeps counting while the machine is suspended. `t` is read *before* the
//! update is sent, so it is never later than the moment the controller can see the
//! renewal. Nothing here reads a clock except [`boottime_ns`]: the machine takes
//! the time as input.

use std::time::Duration;

/// The first word of a fence file (a new layout gets a new one).
const MAGIC: &str = "tessera-fence-v1";
/// The largest fence file read.
pub const MAX_FILE: usize = 256;

/// What one successful renewal tells the daemons of its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct News {
    /// The agent's tenure of the Lease: a new epoch revokes every daemon that heard
    /// an older one.
    pub epoch: u64,
    /// `CLOCK_BOOTTIME` when the renewal was sent, in nanoseconds.
    pub renewed_ns: u64,
    /// How long after `renewed_ns` the daemons stop completing writes.
    pub fence_after: Duration,
}

/// The text of a fence file: `tessera-fence-v1 <epoch> <renewed_ns> <fence_after_ms>`.
pub fn news_text(n: &News) -> String {
    format!(
        "{MAGIC} {} {} {}\n",
        n.epoch,
        n.renewed_ns,
        n.fence_after.as_millis()
    )
}

impl News {
    /// The news a fence file holds, if it is one.
    pub fn parse(text: &str) -> Option<News> {
        let mut w = text.split_ascii_whitespace();
        if w.next()? != MAGIC {
            return None;
        }
        let epoch = w.next()?.parse().ok()?;
        let renewed_ns = w.next()?.parse().ok()?;
        let ms: u64 = w.next()?.parse().ok()?;
        if w.next().is_some() || ms == 0 {
            return None;
        }
        Some(News {
            epoch,
            renewed_ns,
            fence_after: Duration::from_millis(ms),
        })
    }

    /// The boot-clock instant from which writes stop, in nanoseconds.
    pub fn deadline_ns(&self) -> u64 {
        self.renewed_ns
            .saturating_add(self.fence_after.as_nanos().min(u128::from(u64::MAX)) as u64)
    }
}

/// What a mutation may do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Complete it.
    Writable,
    /// Wait: the node has not proven it is alive for `fence_after` (or never did).
    Fenced,
    /// Fail it (EIO), for good: the node's tenure this daemon started under ended.
    Revoked,
}

/// The daemon's fence: the epoch it serves under and the latest deadline it heard.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fence {
    epoch: Option<u64>,
    deadline_ns: Option<u64>,
    revoked: bool,
}

impl Fence {
    /// A fence that has heard nothing: fenced until the first news.
    pub fn new() -> Fence {
        Fence::default()
    }

    /// A fence that serves under `epoch` already (a handoff successor, under its
    /// predecessor's): news of any other epoch revokes it, fenced until news.
    pub fn bound(epoch: u64) -> Fence {
        Fence {
            epoch: Some(epoch),
            ..Fence::default()
        }
    }

    /// The epoch it serves under, once bound.
    pub fn epoch(&self) -> Option<u64> {
        self.epoch
    }

    /// Take in the news of a fence file. The first news binds the epoch; news of
    /// another epoch revokes for good. A deadline never moves back (a stale file
    /// read late changes nothing).
    pub fn hear(&mut self, n: &News) {
        if self.revoked {
            return;
        }
        match self.epoch {
            None => self.epoch = Some(n.epoch),
            Some(e) if e != n.epoch => {
                self.revoked = true;
                return;
            }
            Some(_) => {}
        }
        let d = n.deadline_ns();
        if self.deadline_ns.is_none_or(|old| d > old) {
            self.deadline_ns = Some(d);
        }
    }

    /// What a mutation may do at boot-clock instant `now_ns`.
    pub fn verdict(&self, now_ns: u64) -> Verdict {
        match (self.revoked, self.deadline_ns) {
            (true, _) => Verdict::Revoked,
            (false, Some(d)) if now_ns < d => Verdict::Writable,
            _ => Verdict::Fenced,
        }
    }

    /// The deadline heard last (none before any news).
    pub fn deadline_ns(&self) -> Option<u64> {
        self.deadline_ns
    }
}

/// `CLOCK_BOOTTIME` now, in nanoseconds.
pub fn boottime_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec; CLOCK_BOOTTIME exists on every Linux we run on.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    assert_eq!(r, 0, "clock_gettime(CLOCK_BOOTTIME)");
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn news(epoch: u64, renewed_s: u64) -> News {
        News {
            epoch,
            renewed_ns: renewed_s * S,
            fence_after: Duration::from_secs(20),
        }
    }

    #[test]
    fn a_fence_file_written_reads_back() {
        let n = News {
            epoch: 3,
            renewed_ns: u64::MAX,
            fence_after: Duration::from_millis(1500),
        };
        assert_eq!(News::parse(&news_text(&n)), Some(n));
        for bad in [
            "",
            "tessera-fence-v2 1 2 3",
            "tessera-fence-v1 1 2",
            "tessera-fence-v1 1 2 3 4",
            "tessera-fence-v1 1 2 0",
            "tessera-fence-v1 -1 2 3",
            "tessera-fence-v1 a 2 3",
        ] {
            assert_eq!(News::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn verdicts() {
        type Step = (&'static str, Vec<News>, u64, Verdict);
        let table: Vec<Step> = vec![
            ("no news yet", vec![], 5 * S, Verdict::Fenced),
            ("fresh news", vec![news(1, 10)], 10 * S, Verdict::Writable),
            (
                "late, within fenceAfter",
                vec![news(1, 10)],
                30 * S - 1,
                Verdict::Writable,
            ),
            (
                "fenceAfter passed",
                vec![news(1, 10)],
                30 * S,
                Verdict::Fenced,
            ),
            (
                "news again",
                vec![news(1, 10), news(1, 40)],
                45 * S,
                Verdict::Writable,
            ),
            (
                "a stale file read late",
                vec![news(1, 40), news(1, 10)],
                45 * S,
                Verdict::Writable,
            ),
            (
                "another epoch",
                vec![news(1, 10), news(2, 12)],
                12 * S,
                Verdict::Revoked,
            ),
            (
                "revoked for good",
                vec![news(1, 10), news(2, 12), news(1, 50)],
                50 * S,
                Verdict::Revoked,
            ),
            (
                "the first news binds any epoch",
                vec![news(7, 10)],
                11 * S,
                Verdict::Writable,
            ),
        ];
        for (name, heard, now, want) in table {
            let mut f = Fence::new();
            for n in &heard {
                f.hear(n);
            }
            assert_eq!(f.verdict(now), want, "{name}");
        }
    }

    #[test]
    fn the_boot_clock_moves_forward() {
        let a = boottime_ns();
        let b = boottime_ns();
        assert!(a > 0 && b >= a);
    }

    #[test]
    fn a_bound_fence_is_revoked_by_news_of_another_epoch() {
        let mut f = Fence::bound(3);
        assert_eq!(f.verdict(0), Verdict::Fenced, "no news yet");
        f.hear(&news(3, 10));
        assert_eq!(f.verdict(10 * 1_000_000_000), Verdict::Writable);
        let mut g = Fence::bound(3);
        g.hear(&news(4, 10));
        assert_eq!(g.verdict(10 * 1_000_000_000), Verdict::Revoked);
        assert_eq!(
            (f.epoch(), g.epoch(), Fence::new().epoch()),
            (Some(3), Some(3), None)
        );
    }
}
