//! Rolling mount image upgrades, decided without I/O: which mount of this node is
//! replaced next by a daemon of the desired image, through the /dev/fuse handoff.
//!
//! ```text
//!  health loop: every record ─▶ Candidate (image serving it, healthy?, held?)
//!        next(candidates, desired, busy) ─▶ Upgrade(i) ─▶ reconcile of that MountPod
//!                                                  (agent::serve: MountService::replace_daemon;
//!                                                   pod mode: a standby Pod first)
//!                                        └─▶ blocked: not held (reported, left alone)
//! ```
//!
//! One replacement at a time per agent (so never two of one volume), only of a
//! healthy mount whose connection the fd holder holds: an upgrade never remounts
//! (that would break every open file). A mount not held keeps its image until it is
//! next started for another reason; the agent says so (Event `UpgradeBlocked`).
//!
//! A replacement that failed (pod mode: the standby Pod never started, its image
//! cannot be pulled, say) is tried again only when its [`Retries`] backoff is over
//! (10 s, doubling, at most 10 min, per mount and image), not on every health tick:
//! each attempt creates a Pod and waits out the start timeout.

use std::time::{Duration, Instant};

use super::backoff::Backoffs;

/// One mount of this node, as the decision sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The image its daemon runs (`None`: not known, e.g. process mode).
    pub serving: Option<String>,
    /// The daemon runs and the mount answers.
    pub healthy: bool,
    /// The fd holder holds its connection (a successor can take it over).
    pub held: bool,
    /// An earlier replacement to this image failed and its backoff is not over.
    pub waiting: bool,
}

/// When a failed replacement may be tried again, per mount (its MountPod) and image:
/// a new image is tried at once.
#[derive(Debug)]
pub struct Retries(Backoffs);

impl Default for Retries {
    /// 10 s, doubling, at most 10 min.
    fn default() -> Self {
        Retries(Backoffs::new(
            Duration::from_secs(10),
            Duration::from_secs(600),
        ))
    }
}

impl Retries {
    fn key(mountpod: &str, image: &str) -> String {
        format!("{mountpod} {image}")
    }

    /// Whether a replacement of `mountpod`'s daemon by one of `image` must still wait.
    pub fn waiting(&self, mountpod: &str, image: &str, now: Instant) -> bool {
        self.0
            .wait(&Self::key(mountpod, image), None, now)
            .is_some()
    }

    /// A replacement failed; the delay before the next one.
    pub fn failed(&self, mountpod: &str, image: &str, now: Instant) -> Duration {
        self.0.failed(&Self::key(mountpod, image), None, now)
    }

    /// A replacement worked: the next failure starts over.
    pub fn succeeded(&self, mountpod: &str, image: &str) {
        self.0.succeeded(&Self::key(mountpod, image));
    }
}

/// What to do next.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Next {
    /// The candidate to replace now (its index).
    pub upgrade: Option<usize>,
    /// Candidates whose image differs but that cannot be replaced without a remount
    /// (their connection is not held): left alone.
    pub blocked: Vec<usize>,
}

/// Whether a daemon of `serving` should be replaced by one of `desired`.
pub fn differs(serving: Option<&str>, desired: Option<&str>) -> bool {
    matches!((serving, desired), (Some(s), Some(d)) if s != d)
}

/// The next upgrade among `candidates` (in a stable order: the first due wins), with
/// `desired` the image new daemons run (`None`: no upgrades, process mode) and `busy`
/// whether a replacement is under way. A candidate `waiting` for its backoff is
/// neither replaced nor blocked: it is tried again later.
pub fn next(candidates: &[Candidate], desired: Option<&str>, busy: bool) -> Next {
    let mut out = Next::default();
    for (i, c) in candidates.iter().enumerate() {
        if !differs(c.serving.as_deref(), desired) {
            continue;
        }
        if !c.held {
            out.blocked.push(i);
        } else if c.healthy && !c.waiting && !busy && out.upgrade.is_none() {
            out.upgrade = Some(i);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(serving: Option<&str>, healthy: bool, held: bool) -> Candidate {
        Candidate {
            serving: serving.map(String::from),
            healthy,
            held,
            waiting: false,
        }
    }

    /// A standby that never starts, as the health loop sees it every second for 10
    /// minutes: each attempt fails, and the next waits 10 s, 20 s, 40 s, … (at most
    /// 10 min) instead of coming on the next tick; the other mount due meanwhile is
    /// upgraded at once, and a new image is tried at once.
    #[test]
    fn a_failing_replacement_is_retried_ever_later() {
        let retries = Retries::default();
        let t0 = Instant::now();
        let (old, new) = ("t:1", "t:2");
        let mut attempts = vec![];
        let mut other_upgraded = None;
        for tick in 0..600u64 {
            let now = t0 + Duration::from_secs(tick);
            // Mount 0 keeps failing; mount 1 becomes due at 35 s.
            let mut candidates = vec![c(Some(old), true, true)];
            candidates[0].waiting = retries.waiting("mp-0", new, now);
            if tick >= 35 && other_upgraded.is_none() {
                candidates.push(c(Some(old), true, true));
            }
            match next(&candidates, Some(new), false).upgrade {
                Some(0) => {
                    attempts.push(tick);
                    retries.failed("mp-0", new, now);
                }
                Some(1) => other_upgraded = Some(tick),
                Some(i) => panic!("no candidate {i}"),
                None => {}
            }
        }
        println!("attempts at {attempts:?} s");
        assert_eq!(attempts, [0, 10, 30, 70, 150, 310], "retries spacing out");
        assert_eq!(other_upgraded, Some(35), "the other mount does not wait");
        let later = t0 + Duration::from_secs(600);
        assert!(retries.waiting("mp-0", new, later));
        assert!(
            !retries.waiting("mp-0", "t:3", later),
            "a new image: at once"
        );
        retries.succeeded("mp-0", new);
        assert!(!retries.waiting("mp-0", new, later));
    }

    #[test]
    fn one_healthy_held_mount_at_a_time() {
        let old = Some("t:1");
        let new = Some("t:2");
        let table: Vec<(Vec<Candidate>, Option<&str>, bool, Next)> = vec![
            // Nothing to do: same image, no image known, no desired image.
            (vec![c(new, true, true)], new, false, Next::default()),
            (vec![c(None, true, true)], new, false, Next::default()),
            (vec![c(old, true, true)], None, false, Next::default()),
            // The first due is replaced, the others wait their turn.
            (
                vec![c(new, true, true), c(old, true, true), c(old, true, true)],
                new,
                false,
                Next {
                    upgrade: Some(1),
                    blocked: vec![],
                },
            ),
            // One under way: none more.
            (vec![c(old, true, true)], new, true, Next::default()),
            // Not healthy (starting, broken: the repair's business): later.
            (
                vec![c(old, false, true), c(old, true, true)],
                new,
                false,
                Next {
                    upgrade: Some(1),
                    blocked: vec![],
                },
            ),
            // Not held: never through a remount; said so, and the next one goes.
            (
                vec![c(old, true, false), c(old, true, true)],
                new,
                false,
                Next {
                    upgrade: Some(1),
                    blocked: vec![0],
                },
            ),
            (
                vec![c(old, true, false)],
                new,
                true,
                Next {
                    upgrade: None,
                    blocked: vec![0],
                },
            ),
        ];
        for (candidates, desired, busy, want) in table {
            assert_eq!(
                next(&candidates, desired, busy),
                want,
                "{candidates:?} → {desired:?}, busy {busy}"
            );
        }
    }

    #[test]
    fn only_a_known_different_image_is_an_upgrade() {
        assert!(differs(Some("a"), Some("b")));
        assert!(!differs(Some("a"), Some("a")));
        assert!(!differs(None, Some("b")));
        assert!(!differs(Some("a"), None));
    }
}
