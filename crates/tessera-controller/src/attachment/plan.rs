//! The attachment reconcile as data: from what the reconcile read and the time, what
//! it writes, in which order, which Events it publishes and when it comes back. Pure:
//! no client, no cache, no clock; `execute` carries a [`Plan`] out.
//!
//! The reconcile reads between its phases (the MountPod sync happens before the
//! second decision; a re-check reads MountPods from the API server), so the plan is
//! made in phases, each from what was read up to then:
//!
//! ```text
//!  not_ready ─────────────────────────────────────────────▶ Plan (requeue)
//!  without_volume: VolumeAttachment, now ─────────────────▶ Plan (finalizer | status)
//!  start: Facts + MountPods ─▶ decide ─┬─ node-local, unpinned ─▶ Plan (pin, requeue)
//!                                      └─ Decided ─▶ (execute: sync MountPods)
//!  after_sync: Facts + Decided + Synced + what was read then
//!     ─▶ decide again (if it only attached); slow detaches ─▶ report step
//!     ─┬─ new attach in its quiet time, nothing else ─▶ requeue (Hold::Quiet)
//!      ├─ large VolumeAttachment written < 2 s ago ───▶ requeue (Hold::Spaced)
//!      └─ Pending (+ Recheck: which MountPods to read) ─▶ (execute: re-read)
//!  writes: Facts + Pending + re-read MountPods
//!     ─▶ decide again (if re-checked) ─▶ Plan: statuses (one after the other if
//!        re-checked, else at once; a 409 ends the reconcile), finalizer or
//!        DeletionBlocked, requeue at the next expiry / held attach / slow detach
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::runtime::controller::Action;

use tessera_api::tickets::{self, Decision, Input};
use tessera_api::{self as api, BackendScope, MountPod, Volume, VolumeAttachment};

use super::detaching;
use super::input::gather;
use super::mountpods::Synced;
use super::status;
use crate::protection;

/// Back after this while the caches have not had their first full list.
pub const CACHES_NOT_READY: Duration = Duration::from_millis(200);
/// Back after this once a node-local volume was pinned (the decision is taken again
/// on the pinned Volume).
pub const AFTER_PIN: Duration = Duration::from_millis(100);
/// Back after this when the VolumeAttachment status write was refused because its
/// tickets changed since they were read (409): decided again on the new ones.
pub const AFTER_CONFLICT: Duration = Duration::from_millis(100);
/// Back after this when a reconcile failed.
pub const AFTER_ERROR: Duration = Duration::from_secs(2);
/// Back after this at the latest: level-triggered reconciles also run without events.
pub const SAFETY_NET: Duration = Duration::from_secs(300);
/// Past a ticket's expiry, when the reconcile comes back to decide without it.
pub const PAST_EXPIRY: Duration = Duration::from_millis(50);
/// Past the end of a wait (a quiet time, a held attach, a detach becoming slow), when
/// the reconcile comes back.
pub const PAST_WAIT: Duration = Duration::from_millis(10);
/// Past the end of a large VolumeAttachment's status spacing, when the reconcile
/// comes back.
pub const PAST_SPACING: Duration = Duration::from_millis(5);

/// What the reconcile read before deciding, the same in every phase.
#[derive(Clone, Debug)]
pub struct Facts {
    /// The VolumeAttachment, as the cache and the controller's own writes show it.
    pub va: Arc<VolumeAttachment>,
    /// Its Volume, likewise.
    pub volume: Arc<Volume>,
    /// When each ticket the status does not date yet was first seen.
    pub first_seen: BTreeMap<String, Time>,
    /// The nodes of the tickets that exist.
    pub nodes: BTreeSet<String>,
    /// The reconcile's time.
    pub now: Time,
}

impl Facts {
    /// The arbitration input on `mountpods`, and its decision.
    fn decide(&self, mountpods: &[Arc<MountPod>]) -> (Input, Decision) {
        let input = gather(
            &self.volume,
            &self.va,
            mountpods,
            &self.first_seen,
            &self.now,
            |n| self.nodes.contains(n),
        );
        let decision = tickets::decide(&input);
        (input, decision)
    }

    fn name(&self) -> String {
        self.va.name_any()
    }
}

/// What to do, in order, and when to come back once it is done.
#[derive(Debug)]
pub struct Plan {
    /// The steps, in order; a step may end the reconcile early (a 409 on the status
    /// write: [`StatusWrites::on_conflict`]).
    pub steps: Vec<Step>,
    /// The requeue once every step is done.
    pub then: Action,
}

impl Plan {
    fn new(steps: Vec<Step>, then: Action) -> Self {
        Plan { steps, then }
    }
}

/// One step of a [`Plan`].
#[derive(Debug)]
pub enum Step {
    /// Remove the protection finalizer of the VolumeAttachment being deleted.
    ReleaseFinalizer,
    /// Pin a node-local Volume to its first chosen node.
    PinVolume { volume: Arc<Volume>, node: String },
    /// Publish a Detaching Event for each slow detach of `due` (node, MountPod uid)
    /// not reported before; forget the reported MountPods whose uid is not `present`.
    ReportSlowDetaches {
        volume: Arc<Volume>,
        due: Vec<(String, String)>,
        present: Vec<String>,
    },
    /// Write the statuses.
    WriteStatuses(Box<StatusWrites>),
    /// The VolumeAttachment is being deleted while workloads hold it: a Warning Event.
    DeletionBlocked {
        volume: Arc<Volume>,
        holders: Vec<String>,
        note: String,
    },
}

/// The status writes of a reconcile.
#[derive(Debug)]
pub struct StatusWrites {
    /// The VolumeAttachment's.
    pub attachment: AttachmentWrite,
    /// The Volume's; `None` while a young detach leaves it as it is.
    pub volume: Option<VolumeWrite>,
    /// Whether the Volume's waits until the VolumeAttachment's is in (and is not
    /// written if that failed): after a re-check, the Volume may only say Attached once
    /// the re-checked ticket status is in. Otherwise both at once.
    pub in_turn: bool,
    /// The requeue when the VolumeAttachment's is refused with 409 (its precondition);
    /// nothing else is done then. `None`: a 409 is an error like any other.
    pub on_conflict: Option<Action>,
}

/// A VolumeAttachment status write.
#[derive(Debug)]
pub struct AttachmentWrite {
    /// Seconds each newly satisfied ticket took (the latency histogram, the pace).
    pub latencies: Vec<f64>,
    /// The status to write; `None` when it is the one the object has.
    pub status: Option<api::VolumeAttachmentStatus>,
    /// The resourceVersion the cache shows, which the write supersedes.
    pub base: Option<String>,
    /// Write only if the object is still at this resourceVersion (else 409).
    pub precondition: Option<String>,
    /// The tickets whose satisfaction changes (logged once written): (id, satisfied,
    /// reason).
    pub changes: Vec<(String, bool, String)>,
}

/// A Volume status write: the status that `decision` and `mountpods` give, built when
/// it is written (its conditions' transition times are that moment's), if it differs;
/// an Event for each node that started attaching, finished attaching or detaching.
#[derive(Debug)]
pub struct VolumeWrite {
    pub volume: Arc<Volume>,
    pub mountpods: Vec<Arc<MountPod>>,
    pub decision: Decision,
}

/// The caches are not filled yet: come back soon.
pub fn not_ready() -> Plan {
    Plan::new(vec![], Action::requeue(CACHES_NOT_READY))
}

/// The VolumeAttachment `va` has no Volume (at `now`): one being deleted has nothing
/// left to protect, and lets go; tickets applied before their Volume are told so, and
/// wait for it (its watch triggers the reconcile).
pub fn without_volume(va: &VolumeAttachment, now: &Time) -> Plan {
    if va.metadata.deletion_timestamp.is_some() {
        let steps = if protection::has_finalizer(va) {
            vec![Step::ReleaseFinalizer]
        } else {
            vec![]
        };
        return Plan::new(steps, Action::await_change());
    }
    let status = status::missing_volume_status(va, now);
    let write = StatusWrites {
        attachment: AttachmentWrite {
            latencies: vec![],
            status: (va.status.as_ref() != Some(&status)).then_some(status),
            base: va.resource_version(),
            precondition: None,
            changes: vec![],
        },
        volume: None,
        in_turn: false,
        on_conflict: None,
    };
    Plan::new(
        vec![Step::WriteStatuses(Box::new(write))],
        Action::await_change(),
    )
}

/// The first decision, on the MountPods the caches show.
#[derive(Clone, Debug)]
pub struct Decided {
    pub mountpods: Vec<Arc<MountPod>>,
    pub input: Input,
    pub decision: Decision,
}

/// What [`start`] leads to.
#[derive(Debug)]
pub enum Start {
    /// Only this plan.
    Done(Plan),
    /// Make the MountPods match this decision, then [`after_sync`].
    Sync(Decided),
}

/// Decide on `mountpods`: a node-local volume without a node is pinned to the first
/// node chosen for it (and decided again once pinned); any other goes on to the
/// MountPod sync.
pub fn start(facts: &Facts, mountpods: Vec<Arc<MountPod>>) -> Start {
    let (input, decision) = facts.decide(&mountpods);
    let backend = &facts.volume.spec.backend;
    if backend.scope == BackendScope::NodeLocal
        && backend.node.is_none()
        && let Some(node) = decision.nodes.keys().next()
    {
        let pin = Step::PinVolume {
            volume: facts.volume.clone(),
            node: node.clone(),
        };
        return Start::Done(Plan::new(vec![pin], Action::requeue(AFTER_PIN)));
    }
    Start::Sync(Decided {
        mountpods,
        input,
        decision,
    })
}

/// What the reconcile read after the MountPod sync.
#[derive(Debug)]
pub struct AfterSync {
    /// What the sync did.
    pub synced: Synced,
    /// The MountPods as the cache and the controller's writes show them after the
    /// sync: read only when it wrote something.
    pub mountpods: Option<Vec<Arc<MountPod>>>,
    /// The tickets' nodes that exist but have no Tessera agent.
    pub without_agent: BTreeSet<String>,
    /// How long a new attach may go unreported now (`controller::pace`).
    pub quiet_time: Duration,
    /// How long the VolumeAttachment status waits for its spacing, if it does.
    pub spacing_left: Option<Duration>,
}

/// What [`after_sync`] leads to.
#[derive(Debug)]
pub struct Settled {
    /// The steps due now (the slow detaches' report), whatever comes next.
    pub steps: Vec<Step>,
    /// What comes next.
    pub next: Next,
}

/// After the steps of [`Settled`].
#[derive(Debug)]
pub enum Next {
    /// Nothing is written yet (for the reason and time left of [`Hold`]): come back
    /// then.
    Requeue(Action, Hold),
    /// The statuses are due: read the MountPods of `recheck` if some, then [`writes`].
    Write {
        recheck: Option<Recheck>,
        pending: Box<Pending>,
    },
}

/// Why the statuses are held back, and for how long.
#[derive(Debug, PartialEq)]
pub enum Hold {
    /// A new attach in its quiet time, nothing else changed.
    Quiet(Duration),
    /// A large VolumeAttachment's status spacing.
    Spaced(Duration),
}

/// The MountPods a re-check reads from the API server (by name, one per node), and
/// the cached ones it keeps (on the nodes being satisfied).
#[derive(Debug)]
pub struct Recheck {
    pub read: BTreeSet<String>,
    pub keep: Vec<Arc<MountPod>>,
}

/// What the status writes are made of, carried from [`after_sync`] to [`writes`].
#[derive(Debug)]
pub struct Pending {
    decided: Decided,
    /// The MountPods as this reconcile left them (the Volume status describes these).
    view: Vec<Arc<MountPod>>,
    volume_waits: bool,
    detaches_left: Option<Duration>,
    without_agent: BTreeSet<String>,
    quiet_time: Duration,
}

/// Back after `after`, or sooner when a slow detach becomes due (`detaches_left`).
fn requeue(detaches_left: Option<Duration>, after: Duration) -> Action {
    let next = detaches_left.map_or(after, |d| after.min(d + PAST_WAIT));
    Action::requeue(next)
}

/// After the sync: decide again if it only attached (the statuses then describe the
/// world this reconcile left, not the moment before; not after a detach: they must
/// say which ticket was interrupted and why), report the slow detaches, and hold the
/// statuses back while a new attach is in its quiet time or a large VolumeAttachment's
/// spacing runs; else go on to the writes, through a re-check when a single-node
/// ticket is about to be satisfied.
pub fn after_sync(facts: &Facts, first: Decided, read: AfterSync) -> Settled {
    let AfterSync {
        synced,
        mountpods: after,
        without_agent,
        quiet_time,
        spacing_left,
    } = read;
    let decided = match &after {
        Some(mps) if synced.created && !synced.deleted => {
            let (input, decision) = facts.decide(mps);
            Decided {
                mountpods: mps.clone(),
                input,
                decision,
            }
        }
        _ => first,
    };
    // The MountPods as this reconcile left them: a MountPod deleted at once is gone,
    // one with finalizers terminating.
    let view = after.unwrap_or_else(|| decided.mountpods.clone());
    let Decided {
        mountpods,
        input,
        decision,
    } = &decided;
    let (va, volume, now) = (&facts.va, &facts.volume, &facts.now);

    // A detach still under way after its quiet time says so, once; every way out of
    // this reconcile comes back in time for the next one.
    let slow = detaching::slow_detaches(&view, decision, now, detaching::DETACH_QUIET);
    let report = Step::ReportSlowDetaches {
        volume: volume.clone(),
        present: view
            .iter()
            .filter_map(|mp| mp.metadata.uid.clone())
            .collect(),
        due: slow.due,
    };
    let volume_waits =
        detaching::volume_status_waits(volume, &view, decision, now, detaching::DETACH_QUIET);
    let detaches_left = slow.left;
    let steps = vec![report];

    // A new attach that may still be fast: nothing is written yet; back when it has
    // taken long enough for a person to look. (Not while the VolumeAttachment is being
    // deleted: its finalizer is this reconcile's business.)
    let quiet = status::quiet_left(
        va.status.as_ref(),
        decision,
        input,
        &without_agent,
        now,
        quiet_time,
    );
    if let Some(left) = quiet
        && va.metadata.deletion_timestamp.is_none()
    {
        let volume_now = status::volume_status(volume, mountpods, decision, now);
        if volume.status.as_ref() == Some(&volume_now)
            || status::only_attaching(volume.status.as_ref(), &volume_now)
        {
            let next = Next::Requeue(requeue(detaches_left, left + PAST_WAIT), Hold::Quiet(left));
            return Settled { steps, next };
        }
    }

    // A large VolumeAttachment's status is written at most once per
    // runtime::spacing::PERIOD: a change waits out the period of the last write, and
    // what changes meanwhile goes out with it.
    if let Some(left) = spacing_left {
        let held = status::held(
            va.status.as_ref(),
            decision,
            input,
            &without_agent,
            now,
            quiet_time,
        );
        let status = status::attachment_status_holding(
            va,
            decision,
            input,
            &without_agent,
            now,
            &held.tickets,
        );
        if va.status.as_ref() != Some(&status) {
            let next = Next::Requeue(
                requeue(detaches_left, left + PAST_SPACING),
                Hold::Spaced(left),
            );
            return Settled { steps, next };
        }
    }

    let recheck = needs_recheck(volume, va, decision).then(|| {
        let satisfying: BTreeSet<&str> = status::newly_satisfied(va.status.as_ref(), decision)
            .filter_map(|id| va.spec.attachment_tickets.get(id))
            .map(|t| t.node_id.as_str())
            .collect();
        Recheck {
            read: recheck_nodes(va, mountpods, &satisfying),
            keep: mountpods
                .iter()
                .filter(|mp| satisfying.contains(mp.spec.node_name.as_str()))
                .cloned()
                .collect(),
        }
    });
    let pending = Box::new(Pending {
        decided,
        view,
        volume_waits,
        detaches_left,
        without_agent,
        quiet_time,
    });
    Settled {
        steps,
        next: Next::Write { recheck, pending },
    }
}

/// The statuses, the finalizer and the requeue. `rechecked`: the MountPods a re-check
/// read (and kept), on which the decision is taken again; the VolumeAttachment status
/// write then carries the resourceVersion the decision read, so the API server
/// refuses it (409) if any ticket changed since.
pub fn writes(facts: &Facts, pending: Pending, rechecked: Option<Vec<Arc<MountPod>>>) -> Plan {
    let Pending {
        decided,
        view,
        volume_waits,
        detaches_left,
        without_agent,
        quiet_time,
    } = pending;
    let recheck = rechecked.is_some();
    let (input, decision) = match &rechecked {
        Some(mps) => facts.decide(mps),
        None => (decided.input, decided.decision),
    };
    let (va, volume, now) = (&facts.va, &facts.volume, &facts.now);
    // Written for something else: the new attaches still in their quiet time stay
    // unreported (no status, not among the Volume's mounted nodes, no Event).
    let held = status::held(
        va.status.as_ref(),
        &decision,
        &input,
        &without_agent,
        now,
        quiet_time,
    );
    let status = status::attachment_status_holding(
        va,
        &decision,
        &input,
        &without_agent,
        now,
        &held.tickets,
    );
    let attachment = AttachmentWrite {
        latencies: status::satisfaction_latencies(va.status.as_ref(), &decision, &input, now),
        status: (va.status.as_ref() != Some(&status)).then_some(status),
        base: va.resource_version(),
        precondition: if recheck { va.resource_version() } else { None },
        changes: decision
            .tickets
            .iter()
            .filter(|(id, o)| o.satisfied != va.ticket_status(id).is_some_and(|s| s.satisfied))
            .map(|(id, o)| (id.clone(), o.satisfied, o.reason.to_string()))
            .collect(),
    };
    let volume_write = (!volume_waits).then(|| VolumeWrite {
        volume: volume.clone(),
        mountpods: view
            .iter()
            .filter(|mp| !held.nodes.contains(&mp.spec.node_name))
            .cloned()
            .collect(),
        decision: decision.clone(),
    });
    let mut steps = vec![Step::WriteStatuses(Box::new(StatusWrites {
        attachment,
        volume: volume_write,
        in_turn: recheck,
        on_conflict: Some(Action::requeue(AFTER_CONFLICT)),
    }))];
    if va.metadata.deletion_timestamp.is_some() && protection::has_finalizer(va) {
        let holders = protection::satisfied_workloads(va, &decision);
        if holders.is_empty() {
            steps.push(Step::ReleaseFinalizer);
        } else {
            steps.push(Step::DeletionBlocked {
                volume: volume.clone(),
                note: protection::blocked_note(&facts.name(), &holders),
                holders,
            });
        }
    }
    // A ticket that expires changes the decision with no event at all: decide again
    // just after.
    let wake = tickets::next_expiry(&input).map_or(SAFETY_NET, |at| {
        let until = now.0.duration_until(at.0).unsigned_abs();
        until.min(SAFETY_NET) + PAST_EXPIRY
    });
    // A held attach is reported once its quiet time is over.
    let wake = held.left.map_or(wake, |left| wake.min(left + PAST_WAIT));
    Plan::new(steps, requeue(detaches_left, wake))
}

/// Whether `decision` is to be re-checked with the API server before its statuses are
/// written: it newly satisfies a ticket of a single-node volume.
pub(super) fn needs_recheck(volume: &Volume, va: &VolumeAttachment, decision: &Decision) -> bool {
    status::newly_satisfied(va.status.as_ref(), decision)
        .next()
        .is_some()
        && !volume.spec.access_mode.is_multi_node()
}

/// The nodes whose MountPods a re-check reads: every node of a ticket of `va` or of a
/// cached MountPod, but those of the tickets about to be satisfied (`satisfying`).
/// MountPods have deterministic names and only this controller creates them, so
/// reading each candidate by name sees every MountPod a stale cache could miss,
/// without listing them all. The nodes being satisfied keep their cached MountPod: a
/// stale one there cannot put the volume on a second node. With no other candidate
/// (one ticket, one node: the common attach), nothing is read.
pub(super) fn recheck_nodes(
    va: &VolumeAttachment,
    mountpods: &[Arc<MountPod>],
    satisfying: &BTreeSet<&str>,
) -> BTreeSet<String> {
    va.spec
        .attachment_tickets
        .values()
        .map(|t| t.node_id.as_str())
        .chain(mountpods.iter().map(|mp| mp.spec.node_name.as_str()))
        .filter(|n| !satisfying.contains(n))
        .map(str::to_string)
        .collect()
}
