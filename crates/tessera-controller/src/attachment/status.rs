//! The statuses a decision leads to: pure functions from (the object with its old
//! status, the decision, what it was decided on, the time) to the new status, for the
//! VolumeAttachment and for the Volume. Writing them is the reconcile's business.
//!
//! ```text
//!  old status ─┐
//!  Decision ───┼─▶ attachment_status_holding ─▶ one status per ticket (but held ones),
//!  Input ──────┘                                counts, nodes, waiting
//!  nodes without an agent, held ─┘              + Ready (first blocked ticket)
//!  old status, Decision, MountPods ─▶ volume_status ─▶ state, attached nodes, conditions
//!  VolumeAttachment without its Volume ─▶ missing_volume_status ─▶ VolumeNotFound
//!  old status, new status ─▶ node_changes ─▶ Attaching / Attached / Detached per node (Events)
//!  old status, Decision, Input, pace ─▶ quiet_left ─▶ may these writes wait? (a new attach,
//!                                       < 1 s, longer while many wait together)
//!                                   └─▶ held ─▶ written anyway: which new attaches
//!                                       stay unreported (attachment_status_holding)
//! ```
//!
//! A new attach is written once, when it is done: while its tickets wait only for
//! their mount and were requested less than the quiet time ago ([`ATTACH_QUIET`], more
//! while many attaches wait together: `controller::pace`), [`quiet_left`] says
//! how long the writes may wait, and the reconcile comes back then. So a fast attach
//! costs one status write on each object, and a slow one shows why it waits (and its
//! Attaching Event) once a person would look. When the statuses are written for
//! something else (another attach done, on a volume used by many nodes), the attaches
//! still in their quiet time stay out of them ([`held`]).
//!
//! Both kinds carry a top-level `Ready` condition (for `kubectl wait
//! --for=condition=Ready`) and, while they are not Ready, one of kstatus's
//! abnormal-true conditions ([`health`]): `Reconciling` while Tessera works towards the
//! spec, `Stalled` when nothing moves until a person acts (a failed mount, a ticket
//! that cannot be honoured, a missing Volume, node or agent). Both are absent when
//! the object is settled, never present as False, so an attached volume's status has
//! no more conditions than before. Every condition carries `observedGeneration`, and
//! keeps its lastTransitionTime while its status and reason stay, so an unchanged
//! world yields an equal status and nothing is written. The Volume's `NodeFailover`
//! (fenced failover's, `controller::failover::report`) is carried over unchanged.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use tessera_api::CLEANUP_TICKET;
use tessera_api::tickets::{Decision, Input, TicketInput, TicketOutcome};
use tessera_api::{
    AttachmentTicketStatus, CONDITION_FAULTED, CONDITION_NODE_FAILOVER, CONDITION_READY,
    CONDITION_RECONCILING, CONDITION_SATISFIED, CONDITION_STALLED, MountPod, MountTask,
    TicketReason, Volume, VolumeAttachment, VolumeAttachmentStatus, VolumeState, VolumeStatus,
    condition_status,
};

/// Ready reason of a VolumeAttachment whose tickets are all satisfied.
pub const REASON_TICKETS_SATISFIED: &str = "TicketsSatisfied";
/// Ready reason of a VolumeAttachment waiting for a mount on a node with no agent.
pub const REASON_NO_AGENT: &str = "NoAgent";

/// A condition of `type_` built on `old` (the object's conditions before): it keeps its
/// lastTransitionTime while status and reason stay. (The failover conditions are
/// built with it too.)
pub(crate) fn condition(
    old: &[Condition],
    type_: &str,
    ok: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    let status = if ok {
        condition_status::TRUE
    } else {
        condition_status::FALSE
    };
    let transition = old
        .iter()
        .find(|c| c.type_ == type_ && c.status == status && c.reason == reason)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        last_transition_time: transition,
        observed_generation: generation,
    }
}

/// Where an object stands for kstatus: settled (Ready, or nothing to do), on its way,
/// or stuck until a person acts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// No abnormal condition: kstatus says Current (its generation observed).
    Settled,
    /// `Reconciling` True with this reason and message: kstatus says InProgress.
    Reconciling(String, String),
    /// `Stalled` True with this reason and message: kstatus says Failed.
    Stalled(String, String),
}

/// The abnormal-true condition `health` calls for, built on `old` like every other
/// condition (its lastTransitionTime kept while its reason stays); `None` when settled.
pub fn health(
    old: &[Condition],
    health: Health,
    generation: Option<i64>,
    now: &Time,
) -> Option<Condition> {
    let (type_, reason, message) = match health {
        Health::Settled => return None,
        Health::Reconciling(r, m) => (CONDITION_RECONCILING, r, m),
        Health::Stalled(r, m) => (CONDITION_STALLED, r, m),
    };
    Some(condition(
        old, type_, true, &reason, message, generation, now,
    ))
}

pub use crate::pace::ATTACH_QUIET;

/// How long the status writes that `decision` leads to may wait: `Some(time left)`
/// when everything that changed since `old` is new tickets (no status yet) attaching
/// (chosen, their mount not ready yet) that were requested less than `quiet` before
/// `now`; `None` when anything else changed (a ticket satisfied, refused, removed, an
/// attached one waiting again…), a new ticket waits for a node in `without_agent`
/// (nothing will mount there: that is said at once), or nothing changed: then the
/// statuses are written as usual. `quiet` grows with the controller's backlog
/// (`pace::attach_quiet`): an attach slow only because it is one of many queued
/// together reports itself later, one waiting on anything else at once.
pub fn quiet_left(
    old: Option<&VolumeAttachmentStatus>,
    decision: &Decision,
    input: &Input,
    without_agent: &BTreeSet<String>,
    now: &Time,
    quiet: Duration,
) -> Option<Duration> {
    let old = old.map(|s| &s.attachment_ticket_statuses);
    if old.is_some_and(|s| s.keys().any(|id| !decision.tickets.contains_key(id))) {
        return None;
    }
    let tickets = by_id(input);
    let mut left: Option<Duration> = None;
    for (id, o) in &decision.tickets {
        let before = old.and_then(|s| s.get(id));
        let unchanged = before.is_some_and(|s| {
            s.satisfied == o.satisfied
                && s.generation == o.generation
                && s.reason() == Some(o.reason.as_str())
        });
        if unchanged {
            continue;
        }
        // Only a new ticket attaching may wait: any other change (a mount lost, a wait
        // behind another node over) is written at once.
        let rest = quiet_rest(
            o,
            before,
            tickets.get(id.as_str()).copied(),
            without_agent,
            now,
            quiet,
        )?;
        left = Some(left.map_or(rest, |l| l.min(rest)));
    }
    left
}

/// The tickets of `input` by id: each looked up once per ticket, not found by a scan
/// (a volume used by many nodes has hundreds).
fn by_id(input: &Input) -> BTreeMap<&str, &TicketInput> {
    input
        .tickets
        .iter()
        .map(|t| (t.ticket.id.as_str(), t))
        .collect()
}

/// How long a ticket (decided `o`, its input `ticket`) may still go unreported:
/// `Some(time left)` when it is new (`before`: no status of it yet), attaching (chosen,
/// its mount not ready), not on a node in `without_agent`, and was requested less than
/// `quiet` before `now`.
fn quiet_rest(
    o: &TicketOutcome,
    before: Option<&AttachmentTicketStatus>,
    ticket: Option<&TicketInput>,
    without_agent: &BTreeSet<String>,
    now: &Time,
    quiet: Duration,
) -> Option<Duration> {
    if before.is_some() || o.satisfied || o.reason != TicketReason::Attaching {
        return None;
    }
    let ticket = ticket?;
    if without_agent.contains(&ticket.ticket.node_id) {
        return None;
    }
    let waited = now.0.duration_since(ticket.requested_at.as_ref()?.0);
    let waited = if waited.is_negative() {
        Duration::ZERO
    } else {
        waited.unsigned_abs()
    };
    quiet.checked_sub(waited).filter(|d| !d.is_zero())
}

/// New attaches not reported yet (see [`quiet_left`]), when statuses are written for
/// something else: their tickets are left out of the VolumeAttachment status and
/// their nodes out of the Volume's mounted nodes (so no Attaching Event either) until
/// their quiet time is over or they are satisfied. Under a burst on a volume used by
/// many nodes, every status write would otherwise carry an Attaching status for each
/// attach under way, and an Event for each.
#[derive(Debug, Default, PartialEq)]
pub struct Held {
    /// The tickets left out.
    pub tickets: BTreeSet<String>,
    /// The nodes with no ticket but held ones.
    pub nodes: BTreeSet<String>,
    /// When the first of them is to be reported.
    pub left: Option<Duration>,
}

/// The new attaches of `decision` that may still go unreported (see [`Held`]).
pub fn held(
    old: Option<&VolumeAttachmentStatus>,
    decision: &Decision,
    input: &Input,
    without_agent: &BTreeSet<String>,
    now: &Time,
    quiet: Duration,
) -> Held {
    let old = old.map(|s| &s.attachment_ticket_statuses);
    let tickets = by_id(input);
    let mut held = Held::default();
    let mut shown_nodes = BTreeSet::new();
    for (id, o) in &decision.tickets {
        let before = old.and_then(|s| s.get(id));
        let ticket = tickets.get(id.as_str()).copied();
        let node = ticket.map(|t| t.ticket.node_id.clone());
        match quiet_rest(o, before, ticket, without_agent, now, quiet) {
            Some(rest) => {
                held.tickets.insert(id.clone());
                held.nodes.extend(node);
                held.left = Some(held.left.map_or(rest, |l| l.min(rest)));
            }
            None => shown_nodes.extend(node),
        }
    }
    held.nodes.retain(|n| !shown_nodes.contains(n));
    held
}

/// Whether the Volume status `new` differs from `old` only by a node that started
/// attaching: the state is Attaching (so nothing failed) and no node left the attached
/// or mounted nodes. Such a status may wait with its VolumeAttachment's
/// ([`quiet_left`]).
pub fn only_attaching(old: Option<&VolumeStatus>, new: &VolumeStatus) -> bool {
    let empty = VolumeStatus::default();
    let old = old.unwrap_or(&empty);
    new.state == Some(VolumeState::Attaching)
        && new.attached_nodes == old.attached_nodes
        && old
            .mounted_nodes
            .iter()
            .all(|n| new.mounted_nodes.contains(n))
}

/// The tickets `decision` satisfies that `old` did not say were satisfied.
pub fn newly_satisfied<'a>(
    old: Option<&'a VolumeAttachmentStatus>,
    decision: &'a Decision,
) -> impl Iterator<Item = &'a str> + 'a {
    decision
        .tickets
        .iter()
        .filter(move |(id, o)| {
            o.satisfied
                && !old
                    .and_then(|s| s.attachment_ticket_statuses.get(*id))
                    .is_some_and(|s| s.satisfied)
        })
        .map(|(id, _)| id.as_str())
}

/// Seconds from each newly satisfied ticket's first sighting (its `requested_at` in
/// `input`) to `now`, for the ticket latency histogram.
pub fn satisfaction_latencies(
    old: Option<&VolumeAttachmentStatus>,
    decision: &Decision,
    input: &Input,
    now: &Time,
) -> Vec<f64> {
    let requested = requested_at(input);
    newly_satisfied(old, decision)
        .filter_map(|id| requested.get(id))
        .map(|req| now.0.duration_since(req.0).as_secs_f64().max(0.0))
        .collect()
}

fn requested_at(input: &Input) -> BTreeMap<&str, &Time> {
    input
        .tickets
        .iter()
        .filter_map(|t| t.requested_at.as_ref().map(|r| (t.ticket.id.as_str(), r)))
        .collect()
}

/// [`attachment_status_holding`] with nothing held (the tests' shorthand).
#[cfg(test)]
pub fn attachment_status(
    va: &VolumeAttachment,
    decision: &Decision,
    input: &Input,
    without_agent: &BTreeSet<String>,
    now: &Time,
) -> VolumeAttachmentStatus {
    attachment_status_holding(va, decision, input, without_agent, now, &BTreeSet::new())
}

/// The status of `va` that describes `decision`, taken on `input` at `now`, without a
/// status for the tickets in `held` (new attaches not reported yet: [`Held`]; the
/// counts and the Ready condition still count them); `without_agent` are the tickets'
/// nodes known to have no Tessera agent (no CSINode lists the driver), named by the
/// Ready condition when a ticket waits for a mount there.
pub fn attachment_status_holding(
    va: &VolumeAttachment,
    decision: &Decision,
    input: &Input,
    without_agent: &BTreeSet<String>,
    now: &Time,
    held: &BTreeSet<String>,
) -> VolumeAttachmentStatus {
    let old = va.status.clone().unwrap_or_default();
    let requested = requested_at(input);
    let mut statuses = BTreeMap::new();
    for (id, outcome) in &decision.tickets {
        if held.contains(id) {
            continue;
        }
        // A satisfied ticket's status is `satisfied: true` alone: its condition would
        // add seven fields per ticket to every write of the object.
        let conditions = if outcome.satisfied {
            vec![]
        } else {
            let prev = old.attachment_ticket_statuses.get(id);
            let no_conditions = Vec::new();
            vec![condition(
                prev.map_or(&no_conditions, |p| &p.conditions),
                CONDITION_SATISFIED,
                false,
                outcome.reason.as_str(),
                outcome.message.clone(),
                va.metadata.generation,
                now,
            )]
        };
        statuses.insert(
            id.clone(),
            AttachmentTicketStatus {
                id: id.clone(),
                satisfied: outcome.satisfied,
                generation: outcome.generation,
                requested_at: requested.get(id.as_str()).map(|t| (*t).clone()),
                conditions,
            },
        );
    }
    let node_of = |id: &str| {
        va.spec
            .attachment_tickets
            .get(id)
            .map(|t| t.node_id.as_str())
    };
    // A ticket waiting for a mount on a node no agent serves says so: nothing else will.
    let agentless = decision.tickets.iter().find_map(|(id, o)| {
        let node = node_of(id)?;
        (!o.satisfied && o.reason == TicketReason::Attaching && without_agent.contains(node))
            .then(|| {
                format!(
                    "{id}: node {node} has no Tessera agent (no CSINode lists {}): nothing will mount the volume there",
                    tessera_api::CSI_DRIVER_NAME
                )
            })
    });
    let blocked = decision.tickets.iter().find(|(_, o)| !o.satisfied);
    let waiting = agentless
        .clone()
        .or_else(|| blocked.map(|(id, o)| format!("{id}: {}", o.message)));
    // Stalled when any waiting ticket waits for a person (the first such one named);
    // else Reconciling with the first waiting ticket's reason.
    let stalled = agentless
        .clone()
        .map(|m| (REASON_NO_AGENT.to_string(), m))
        .or_else(|| {
            decision
                .tickets
                .iter()
                .find(|(_, o)| !o.satisfied && o.reason.stalls())
                .map(|(id, o)| {
                    (
                        o.reason.as_str().to_string(),
                        format!("{id}: {}", o.message),
                    )
                })
        });
    let (ready, reason, message) = match (&agentless, blocked) {
        (Some(message), _) => (false, REASON_NO_AGENT, message.clone()),
        (None, Some((id, o))) => (false, o.reason.as_str(), format!("{id}: {}", o.message)),
        (None, None) if decision.tickets.is_empty() => {
            (true, REASON_TICKETS_SATISFIED, "no tickets".to_string())
        }
        (None, None) => (
            true,
            REASON_TICKETS_SATISFIED,
            format!("all {} tickets satisfied", decision.tickets.len()),
        ),
    };
    let progress = match stalled {
        Some((reason, message)) => Health::Stalled(reason, message),
        None if ready => Health::Settled,
        None => Health::Reconciling(reason.to_string(), message.clone()),
    };
    let mut conditions = vec![condition(
        &old.conditions,
        CONDITION_READY,
        ready,
        reason,
        message,
        va.metadata.generation,
        now,
    )];
    conditions.extend(health(
        &old.conditions,
        progress,
        va.metadata.generation,
        now,
    ));
    let nodes: Vec<String> = decision.nodes.keys().cloned().collect();
    VolumeAttachmentStatus {
        ticket_count: i32::try_from(decision.tickets.len()).unwrap_or(i32::MAX),
        satisfied_count: i32::try_from(decision.tickets.values().filter(|o| o.satisfied).count())
            .unwrap_or(i32::MAX),
        node_list: nodes.join(","),
        nodes,
        waiting,
        attachment_ticket_statuses: statuses,
        observed_generation: va.metadata.generation,
        conditions,
    }
}

/// The status of a VolumeAttachment whose Volume does not exist: every ticket waits
/// (VolumeNotFound), and so does Ready; Stalled, since only a person (or the GitOps
/// tool applying the Volume) makes it.
pub fn missing_volume_status(va: &VolumeAttachment, now: &Time) -> VolumeAttachmentStatus {
    let old = va.status.clone().unwrap_or_default();
    let message = format!("Volume {} does not exist", va.spec.volume);
    let reason = TicketReason::VolumeNotFound.as_str();
    let statuses: BTreeMap<String, AttachmentTicketStatus> = va
        .spec
        .attachment_tickets
        .values()
        .map(|t| {
            let prev = old.attachment_ticket_statuses.get(&t.id);
            let no_conditions = Vec::new();
            let prev_conditions = prev.map_or(&no_conditions, |p| &p.conditions);
            let status = AttachmentTicketStatus {
                id: t.id.clone(),
                satisfied: false,
                generation: t.generation,
                requested_at: prev.and_then(|p| p.requested_at.clone()),
                conditions: vec![condition(
                    prev_conditions,
                    CONDITION_SATISFIED,
                    false,
                    reason,
                    message.clone(),
                    va.metadata.generation,
                    now,
                )],
            };
            (t.id.clone(), status)
        })
        .collect();
    VolumeAttachmentStatus {
        ticket_count: i32::try_from(statuses.len()).unwrap_or(i32::MAX),
        satisfied_count: 0,
        waiting: statuses.keys().next().map(|id| format!("{id}: {message}")),
        attachment_ticket_statuses: statuses,
        nodes: vec![],
        node_list: String::new(),
        observed_generation: va.metadata.generation,
        conditions: vec![
            condition(
                &old.conditions,
                CONDITION_READY,
                false,
                reason,
                message.clone(),
                va.metadata.generation,
                now,
            ),
            condition(
                &old.conditions,
                CONDITION_STALLED,
                true,
                reason,
                message,
                va.metadata.generation,
                now,
            ),
        ],
    }
}

/// What happened on each node between two Volume statuses: a node newly mounted but
/// not attached started attaching (a status written only for a slow attach, see
/// [`quiet_left`]); a node newly among the attached nodes finished attaching; a node
/// gone from the mounted nodes finished detaching. One Event each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeChange {
    /// The node has a mount that is not ready yet.
    Attaching(String),
    /// The mount on the node is ready and the volume is attached there.
    Attached(String),
    /// The node's mount is gone.
    Detached(String),
}

/// The [`NodeChange`]s from `old` to `new`.
pub fn node_changes(old: Option<&VolumeStatus>, new: &VolumeStatus) -> Vec<NodeChange> {
    let empty = VolumeStatus::default();
    let old = old.unwrap_or(&empty);
    let mut changes: Vec<NodeChange> = new
        .mounted_nodes
        .iter()
        .filter(|n| !old.mounted_nodes.contains(n) && !new.attached_nodes.contains(n))
        .map(|n| NodeChange::Attaching(n.clone()))
        .collect();
    changes.extend(
        new.attached_nodes
            .iter()
            .filter(|n| !old.attached_nodes.contains(n))
            .map(|n| NodeChange::Attached(n.clone())),
    );
    changes.extend(
        old.mounted_nodes
            .iter()
            .filter(|n| !new.mounted_nodes.contains(n))
            .map(|n| NodeChange::Detached(n.clone())),
    );
    changes
}

/// The status of `volume` that describes `decision` and its `mountpods` at `now`.
pub fn volume_status(
    volume: &Volume,
    mountpods: &[Arc<MountPod>],
    decision: &Decision,
    now: &Time,
) -> VolumeStatus {
    let ready: BTreeSet<String> = mountpods
        .iter()
        .filter(|mp| mp.is_ready() && mp.spec.task == MountTask::Serve)
        .map(|mp| mp.spec.node_name.clone())
        .collect();
    let failed: Vec<String> = decision
        .tickets
        .iter()
        .filter(|(_, o)| o.reason == TicketReason::MountFailed)
        .map(|(id, o)| format!("{id}: {}", o.message))
        .collect();
    let state = if volume.metadata.deletion_timestamp.is_some() {
        VolumeState::Deleting
    } else if !failed.is_empty() {
        VolumeState::Faulted
    } else if decision.nodes.is_empty() {
        if mountpods.is_empty() {
            VolumeState::Detached
        } else {
            VolumeState::Detaching
        }
    } else if decision.nodes.keys().all(|n| ready.contains(n)) {
        VolumeState::Attached
    } else if mountpods
        .iter()
        .any(|mp| !decision.nodes.contains_key(&mp.spec.node_name))
    {
        VolumeState::Detaching
    } else {
        VolumeState::Attaching
    };
    let old = volume.status.clone().unwrap_or_default();
    let cond = |type_: &str, ok: bool, reason: &str, message: String| {
        condition(
            &old.conditions,
            type_,
            ok,
            reason,
            message,
            volume.metadata.generation,
            now,
        )
    };
    let mounted_nodes: Vec<String> = mountpods
        .iter()
        .filter(|mp| mp.spec.task == MountTask::Serve)
        .map(|mp| mp.spec.node_name.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let attached = state == VolumeState::Attached;
    let mut conditions = vec![cond(
        "Attached",
        attached,
        if attached {
            "MountsReady"
        } else {
            "NotAttached"
        },
        if attached {
            format!(
                "mounted and ready on {}",
                ready.iter().cloned().collect::<Vec<_>>().join(", ")
            )
        } else {
            format!("state {state:?}")
        },
    )];
    if !failed.is_empty() {
        conditions.push(cond(
            CONDITION_FAULTED,
            true,
            "MountFailed",
            failed.join("; "),
        ));
    }
    let (ok, reason, message) = volume_ready(state, &ready, decision, &mounted_nodes, &failed);
    let progress = match state {
        VolumeState::Faulted => Health::Stalled(reason.into(), message.clone()),
        _ if ok => Health::Settled,
        _ => Health::Reconciling(reason.into(), message.clone()),
    };
    conditions.push(cond(CONDITION_READY, ok, reason, message));
    conditions.extend(health(
        &old.conditions,
        progress,
        volume.metadata.generation,
        now,
    ));
    // Deleting: where the removal of the data stands (the cleanup ticket's outcome).
    if volume.metadata.deletion_timestamp.is_some()
        && let Some(o) = decision.tickets.get(CLEANUP_TICKET)
    {
        conditions.push(cond(
            "DataRemoved",
            o.satisfied,
            o.reason.as_str(),
            o.message.clone(),
        ));
    }
    // Fenced failover's condition is the failover loop's (`failover::report`): carried
    // over as it is, so this write does not undo that one.
    conditions.extend(
        old.conditions
            .iter()
            .filter(|c| c.type_ == CONDITION_NODE_FAILOVER)
            .cloned(),
    );
    // A node that filled the volume from its data source (task Populate) wrote its
    // data: it counts as where the volume was last attached (a restore from a
    // snapshot copies on that node; the data is removed there).
    let filled: BTreeSet<String> = mountpods
        .iter()
        .filter(|mp| mp.is_ready() && mp.spec.task == MountTask::Populate)
        .map(|mp| mp.spec.node_name.clone())
        .collect();
    let last_attached_node = ready
        .iter()
        .chain(&filled)
        .find(|n| decision.nodes.contains_key(*n))
        .cloned()
        .or(old.last_attached_node.clone());
    let attached_nodes: Vec<String> = ready
        .into_iter()
        .filter(|n| decision.nodes.contains_key(n))
        .collect();
    VolumeStatus {
        last_attached_node,
        state: Some(state),
        attached_node_list: attached_nodes.join(","),
        attached_nodes,
        mounted_nodes,
        capacity: Some(volume.spec.size.clone()),
        conditions,
        observed_generation: volume.metadata.generation,
    }
}

/// The Volume's Ready condition (status, reason, message) in `state`: True when the
/// volume is where its tickets want it (Attached or Detached), False while it moves, is
/// deleted or a mount failed.
fn volume_ready(
    state: VolumeState,
    ready: &BTreeSet<String>,
    decision: &Decision,
    mounted: &[String],
    failed: &[String],
) -> (bool, &'static str, String) {
    let list = |nodes: &mut dyn Iterator<Item = &String>| {
        nodes.map(String::as_str).collect::<Vec<_>>().join(", ")
    };
    match state {
        VolumeState::Attached => (
            true,
            "Attached",
            format!("attached to {}", list(&mut ready.iter())),
        ),
        VolumeState::Detached => (true, "Detached", "no node holds the volume".into()),
        VolumeState::Attaching => (
            false,
            "Attaching",
            format!(
                "waiting for the mount on {}",
                list(&mut decision.nodes.keys().filter(|n| !ready.contains(*n)))
            ),
        ),
        VolumeState::Detaching => {
            let from = list(&mut mounted.iter().filter(|n| !decision.nodes.contains_key(*n)));
            let message = if from.is_empty() {
                "mounts are being torn down".to_string()
            } else {
                format!("detaching from {from}")
            };
            (false, "Detaching", message)
        }
        VolumeState::Deleting => (false, "Deleting", "the volume is being deleted".into()),
        VolumeState::Faulted => (false, "MountFailed", failed.join("; ")),
        VolumeState::Creating => (false, "Creating", "the volume is being created".into()),
    }
}
