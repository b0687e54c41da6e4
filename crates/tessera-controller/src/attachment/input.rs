//! The arbitration input of one volume, built from its objects: pure, no cache and
//! no client.
//!
//! ```text
//!  Volume (access mode, deletion, pin) ─┐
//!  VolumeAttachment (tickets, requestedAt) ─┼─▶ gather ─▶ tickets::Input
//!  first sightings of undated tickets ──────┤
//!  MountPods ─▶ mount_view (one per node) ──┤
//!  Node names (which exist), time ──────────┘
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use tessera_api::tickets::{Input, MountState, MountView, TicketInput};
use tessera_api::{BackendScope, MountPhase, MountPod, MountTask, Volume, VolumeAttachment};

/// The arbitration input for a volume, from its objects, decided at `now`; `node_exists`
/// tells which of the tickets' nodes exist. A ticket the status does not date yet is
/// requested when the controller first saw it (`first_seen`), else `now`.
pub fn gather(
    volume: &Volume,
    va: &VolumeAttachment,
    mountpods: &[Arc<MountPod>],
    first_seen: &BTreeMap<String, Time>,
    now: &Time,
    node_exists: impl Fn(&str) -> bool,
) -> Input {
    let statuses = va.status.as_ref().map(|s| &s.attachment_ticket_statuses);
    let tickets = va
        .spec
        .attachment_tickets
        .values()
        .map(|t| TicketInput {
            ticket: t.clone(),
            requested_at: Some(
                statuses
                    .and_then(|s| s.get(&t.id))
                    .and_then(|s| s.requested_at.clone())
                    .or_else(|| first_seen.get(&t.id).cloned())
                    .unwrap_or_else(|| now.clone()),
            ),
        })
        .collect();
    let mut mounts = BTreeMap::new();
    for mp in mountpods {
        mounts.insert(mp.spec.node_name.clone(), mount_view(mp));
    }
    Input {
        access_mode: volume.spec.access_mode,
        deleting: volume.metadata.deletion_timestamp.is_some(),
        pinned_node: match volume.spec.backend.scope {
            BackendScope::NodeLocal => volume.spec.backend.node.clone(),
            BackendScope::Shared => None,
        },
        tickets,
        mounts,
        now: now.clone(),
        missing_nodes: va
            .spec
            .attachment_tickets
            .values()
            .map(|t| &t.node_id)
            .filter(|n| !node_exists(n))
            .cloned()
            .collect(),
    }
}

/// How arbitration sees a MountPod.
pub fn mount_view(mp: &MountPod) -> MountView {
    let status = mp.status.clone().unwrap_or_default();
    let state = if mp.metadata.deletion_timestamp.is_some() {
        MountState::Terminating
    } else if mp.is_ready() {
        MountState::Ready
    } else if status.phase == Some(MountPhase::Failed) {
        let error = status.last_error.unwrap_or_else(|| "mount failed".into());
        let not_shared = status.conditions.iter().any(|c| {
            c.type_ == tessera_api::CONDITION_READY
                && c.reason == tessera_api::TicketReason::BackendNotShared.as_str()
        });
        if not_shared {
            MountState::NotShared(error)
        } else {
            MountState::Failed(error)
        }
    } else {
        MountState::Starting
    };
    MountView {
        state,
        read_only: mp.spec.read_only,
        removes_data: mp.spec.task == MountTask::RemoveData,
        populates: mp.spec.task == MountTask::Populate,
    }
}
