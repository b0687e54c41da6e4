//! A detach is reported only when slow. The controller deletes a MountPod when its
//! node is no longer chosen; the detach is done when the MountPod is gone (the Volume
//! status drops the node: its Detached Event). A MountPod still there
//! [`DETACH_QUIET`] after its deletion timestamp gets one Detaching Event, and until
//! then the Volume status is not rewritten for it, so a person looking at a stuck
//! detach sees what it waits for, and a fast detach costs one Event and one Volume
//! status write, not two of each.
//!
//! ```text
//!  MountPods, Decision, now ─▶ slow_detaches ─▶ due: terminating ≥ quiet, node not chosen
//!                                           └─▶ left: until the next one is due
//!  due ─▶ Reported::fresh (once per MountPod; forgets the ones gone) ─▶ Events
//!  Volume, MountPods, Decision, now ─▶ volume_status_waits: the young detaches seen as
//!                                      not begun leave the Volume status as it is?
//! ```
//!
//! The deletion timestamp has a resolution of a second, so a quiet time of 2 s from
//! it is 1–2 s from the delete. After a controller restart a detach still under way
//! is reported again.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use tessera_api::tickets::{Decision, NodeMount};
use tessera_api::{MountPod, MountTask, Volume};

use crate::attachment::status::volume_status;

/// How long after its deletion timestamp a MountPod still there is a slow detach.
pub const DETACH_QUIET: Duration = Duration::from_secs(2);

/// What [`slow_detaches`] found.
#[derive(Debug, Default, PartialEq)]
pub struct SlowDetaches {
    /// The MountPods to report: (node, uid).
    pub due: Vec<(String, String)>,
    /// When the next terminating MountPod becomes due, if one is still quiet.
    pub left: Option<Duration>,
}

/// The MountPods of `mountpods` being deleted because `decision` no longer chooses
/// their node, and deleted at least `quiet` before `now`; and how long until the
/// first of the others is.
pub fn slow_detaches(
    mountpods: &[Arc<MountPod>],
    decision: &Decision,
    now: &Time,
    quiet: Duration,
) -> SlowDetaches {
    let mut out = SlowDetaches::default();
    for mp in mountpods {
        let Some(rest) = detach_rest(mp, decision, now, quiet) else {
            continue;
        };
        let Some(uid) = &mp.metadata.uid else {
            continue;
        };
        match rest {
            None => out.due.push((mp.spec.node_name.clone(), uid.clone())),
            Some(rest) => out.left = Some(out.left.map_or(rest, |l| l.min(rest))),
        }
    }
    out
}

/// Whether `mp` is detaching (being deleted, its node not chosen by `decision`):
/// then `Some(the rest of its quiet time)`, `Some(None)` once that is over.
fn detach_rest(
    mp: &MountPod,
    decision: &Decision,
    now: &Time,
    quiet: Duration,
) -> Option<Option<Duration>> {
    let deleted = mp.metadata.deletion_timestamp.as_ref()?;
    if decision.nodes.contains_key(&mp.spec.node_name) {
        return None; // replaced on a chosen node, not detached
    }
    let waited = now.0.duration_since(deleted.0);
    let waited = if waited.is_negative() {
        Duration::ZERO
    } else {
        waited.unsigned_abs()
    };
    Some(quiet.checked_sub(waited).filter(|d| !d.is_zero()))
}

/// Whether the Volume status may wait for the detaches still in their `quiet` time:
/// seen as not begun (their MountPods not deleted, their nodes chosen again), the
/// world gives the status `volume` has. Then nothing else changed, and a fast detach
/// writes the Volume status once, when its MountPod is gone; a slow one, when it
/// becomes due (the reconcile comes back then: [`SlowDetaches::left`]). `false` when
/// no detach is that young.
pub fn volume_status_waits(
    volume: &Volume,
    mountpods: &[Arc<MountPod>],
    decision: &Decision,
    now: &Time,
    quiet: Duration,
) -> bool {
    let young = |mp: &MountPod| matches!(detach_rest(mp, decision, now, quiet), Some(Some(_)));
    // The common reconcile (nothing detaching) copies nothing.
    let Some(written) = volume
        .status
        .as_ref()
        .filter(|_| mountpods.iter().any(|mp| young(mp)))
    else {
        return false;
    };
    let mut before = decision.clone();
    let view: Vec<Arc<MountPod>> = mountpods
        .iter()
        .map(|mp| {
            if !young(mp) {
                return mp.clone();
            }
            before.nodes.insert(
                mp.spec.node_name.clone(),
                NodeMount {
                    read_only: mp.spec.read_only,
                    removes_data: mp.spec.task == MountTask::RemoveData,
                    populates: mp.spec.task == MountTask::Populate,
                },
            );
            let mut undeleted = MountPod::clone(mp);
            undeleted.metadata.deletion_timestamp = None;
            Arc::new(undeleted)
        })
        .collect();
    volume_status(volume, &view, &before, now) == *written
}

/// The slow detaches already reported, by volume: MountPod uids.
#[derive(Default)]
pub struct Reported {
    by_volume: Mutex<HashMap<String, BTreeSet<String>>>,
}

impl Reported {
    /// The nodes of `due` not reported before for `volume`, now remembered as
    /// reported; the MountPods of `volume` whose uid is not in `present` are
    /// forgotten.
    pub fn fresh<'a>(
        &self,
        volume: &str,
        due: &[(String, String)],
        present: impl IntoIterator<Item = &'a str>,
    ) -> Vec<String> {
        let mut by_volume = self.by_volume.lock().expect("detaches lock");
        if due.is_empty() && !by_volume.contains_key(volume) {
            return Vec::new(); // the common reconcile: nothing to report or forget
        }
        let present: BTreeSet<&str> = present.into_iter().collect();
        let mut fresh = Vec::new();
        let reported = by_volume.entry(volume.to_string()).or_default();
        reported.retain(|uid| present.contains(uid.as_str()));
        for (node, uid) in due {
            if reported.insert(uid.clone()) {
                fresh.push(node.clone());
            }
        }
        if reported.is_empty() {
            by_volume.remove(volume);
        }
        fresh
    }

    /// Volumes with a reported detach remembered (for tests).
    #[cfg(test)]
    pub(crate) fn volumes(&self) -> usize {
        self.by_volume.lock().expect("detaches lock").len()
    }
}
