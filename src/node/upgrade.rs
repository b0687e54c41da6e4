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

/// One mount of this node, as the decision sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The image its daemon runs (`None`: not known, e.g. process mode).
    pub serving: Option<String>,
    /// The daemon runs and the mount answers.
    pub healthy: bool,
    /// The fd holder holds its connection (a successor can take it over).
    pub held: bool,
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
/// whether a replacement is under way.
pub fn next(candidates: &[Candidate], desired: Option<&str>, busy: bool) -> Next {
    let mut out = Next::default();
    for (i, c) in candidates.iter().enumerate() {
        if !differs(c.serving.as_deref(), desired) {
            continue;
        }
        if !c.held {
            out.blocked.push(i);
        } else if c.healthy && !busy && out.upgrade.is_none() {
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
        }
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
