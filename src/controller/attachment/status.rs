//! The statuses a decision leads to: pure functions from (the object with its old
//! status, the decision, what it was decided on, the time) to the new status, for the
//! VolumeAttachment and for the Volume. Writing them is the reconcile's business.
//!
//! ```text
//!  old status ─┐
//!  Decision ───┼─▶ attachment_status ─▶ one status per ticket, counts, nodes, waiting
//!  Input ──────┘
//!  old status, Decision, MountPods ─▶ volume_status ─▶ state, attached nodes, conditions
//! ```
//!
//! A condition keeps its lastTransitionTime while its status and reason stay, so an
//! unchanged world yields an equal status and nothing is written.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::api::{
    AttachmentTicketStatus, CONDITION_SATISFIED, MountPod, MountTask, TicketReason, Volume,
    VolumeAttachment, VolumeAttachmentStatus, VolumeState, VolumeStatus, condition_status,
};
use crate::tickets::{Decision, Input};

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

/// The status of `va` that describes `decision`, taken on `input` at `now`.
pub fn attachment_status(
    va: &VolumeAttachment,
    decision: &Decision,
    input: &Input,
    now: &Time,
) -> VolumeAttachmentStatus {
    let old = va.status.clone().unwrap_or_default();
    let requested = requested_at(input);
    let mut statuses = BTreeMap::new();
    for (id, outcome) in &decision.tickets {
        let prev = old.attachment_ticket_statuses.get(id);
        let status_str = if outcome.satisfied {
            condition_status::TRUE
        } else {
            condition_status::FALSE
        };
        let prev_cond =
            prev.and_then(|p| p.conditions.iter().find(|c| c.type_ == CONDITION_SATISFIED));
        let transition = match prev_cond {
            Some(c) if c.status == status_str && c.reason == outcome.reason.as_str() => {
                c.last_transition_time.clone()
            }
            _ => now.clone(),
        };
        statuses.insert(
            id.clone(),
            AttachmentTicketStatus {
                id: id.clone(),
                satisfied: outcome.satisfied,
                generation: outcome.generation,
                requested_at: requested.get(id.as_str()).map(|t| (*t).clone()),
                conditions: vec![Condition {
                    type_: CONDITION_SATISFIED.into(),
                    status: status_str.into(),
                    reason: outcome.reason.as_str().into(),
                    message: outcome.message.clone(),
                    last_transition_time: transition,
                    observed_generation: va.metadata.generation,
                }],
            },
        );
    }
    let waiting = decision
        .tickets
        .iter()
        .find(|(_, o)| !o.satisfied)
        .map(|(id, o)| format!("{id}: {}", o.message));
    VolumeAttachmentStatus {
        ticket_count: i32::try_from(decision.tickets.len()).unwrap_or(i32::MAX),
        satisfied_count: i32::try_from(decision.tickets.values().filter(|o| o.satisfied).count())
            .unwrap_or(i32::MAX),
        nodes: decision.nodes.keys().cloned().collect(),
        waiting,
        attachment_ticket_statuses: statuses,
        observed_generation: va.metadata.generation,
    }
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
        let status = if ok {
            condition_status::TRUE
        } else {
            condition_status::FALSE
        };
        let transition = old
            .conditions
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
            observed_generation: volume.metadata.generation,
        }
    };
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
        conditions.push(cond("Faulted", true, "MountFailed", failed.join("; ")));
    }
    // Deleting: where the removal of the data stands (the cleanup ticket's outcome).
    if volume.metadata.deletion_timestamp.is_some()
        && let Some(o) = decision
            .tickets
            .get(crate::controller::volume::CLEANUP_TICKET)
    {
        conditions.push(cond(
            "DataRemoved",
            o.satisfied,
            o.reason.as_str(),
            o.message.clone(),
        ));
    }
    let last_attached_node = ready
        .iter()
        .find(|n| decision.nodes.contains_key(*n))
        .cloned()
        .or(old.last_attached_node.clone());
    VolumeStatus {
        last_attached_node,
        state: Some(state),
        attached_nodes: ready
            .into_iter()
            .filter(|n| decision.nodes.contains_key(n))
            .collect(),
        capacity: Some(volume.spec.size.clone()),
        conditions,
        observed_generation: volume.metadata.generation,
    }
}
