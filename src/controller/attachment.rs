//! The VolumeAttachment controller: runs ticket arbitration for one volume and makes
//! the world match the decision.
//!
//! ```text
//!  VolumeAttachment (tickets) + Volume + MountPods (cache)
//!        │ gather ─▶ tickets::decide ─▶ Decision { nodes, outcome per ticket }
//!        ▼
//!  MountPods: create (SSA) on chosen nodes, delete elsewhere   — detach before attach
//!  VolumeAttachment status: one status per ticket (SSA, status subresource)
//!  Volume status: state, attached nodes, capacity, conditions  (SSA, status subresource)
//! ```
//!
//! Nothing is written when nothing changed. A ticket of a single-node volume is never
//! declared satisfied from the cache alone: before such a status is written the
//! MountPods and tickets are read again from the API server and the decision is
//! recomputed, so a stale cache cannot make two nodes look like owners.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::{debug, info, instrument};

use super::{Context, Error, FIELD_MANAGER, KubeContext};
use crate::api::{
    self, AttacherType, AttachmentTicketStatus, BackendScope, CONDITION_SATISFIED, LABEL_NODE,
    LABEL_VOLUME, MountPhase, MountPod, MountPodSpec, MountTask, TicketReason, Volume,
    VolumeAttachment, VolumeAttachmentStatus, VolumeState, VolumeStatus, condition_status,
};
use crate::tickets::{self, Decision, Input, MountState, MountView, TicketInput};

/// Reconcile one VolumeAttachment.
#[instrument(skip_all, fields(volume = %va.name_any()))]
pub async fn reconcile(va: Arc<VolumeAttachment>, ctx: Arc<Context>) -> Result<Action, Error> {
    let metrics = ctx.metrics.clone();
    super::measured(&metrics, "attachment", reconcile_inner(va, ctx)).await
}

/// Back off on errors.
pub fn error_policy(_va: Arc<VolumeAttachment>, err: &Error, _ctx: Arc<Context>) -> Action {
    debug!(error = %err, "attachment reconcile failed");
    Action::requeue(Duration::from_secs(2))
}

async fn reconcile_inner(va: Arc<VolumeAttachment>, ctx: Arc<Context>) -> Result<Action, Error> {
    if !ctx.caches_ready().await {
        return Ok(Action::requeue(Duration::from_millis(200)));
    }
    let name = va.name_any();
    // The caches, corrected by what this controller wrote and they do not show yet.
    let va = ctx
        .recent_attachments
        .view(&name, Some(va.clone()))
        .unwrap_or(va);
    // What the next reconcile's cache will show until it catches up with our writes.
    let va_base = va.resource_version();
    let Some(volume) = ctx
        .recent_volumes
        .view(&name, ctx.volumes.get(&ObjectRef::new(&name)))
    else {
        // Tickets applied before their Volume: wait for it (its watch triggers us).
        return Ok(Action::await_change());
    };
    let mountpods = mountpods_of(&ctx, &name);
    let now = Time(jiff::Timestamp::now());

    let input = gather(&volume, &va, &mountpods, &now);
    let decision = tickets::decide(&input);

    // A node-local volume without a node is pinned to the first node chosen for it.
    if volume.spec.backend.scope == BackendScope::NodeLocal
        && volume.spec.backend.node.is_none()
        && let Some(node) = decision.nodes.keys().next()
    {
        pin_volume(&ctx, &volume, node).await?;
        return Ok(Action::requeue(Duration::from_millis(100)));
    }

    let synced = sync_mountpods(&ctx, &volume, &va, &mountpods, &decision).await?;
    // After attaching, decide again on the world as this reconcile left it (the
    // MountPods it just created), so the statuses describe that and not the moment
    // before: otherwise the next reconcile writes them a second time only to say so.
    // Not after a detach: the statuses must say which ticket was interrupted and why.
    let (mountpods, input, mut decision) = if synced.created && !synced.deleted {
        let mountpods = mountpods_of(&ctx, &name);
        let input = gather(&volume, &va, &mountpods, &now);
        let decision = tickets::decide(&input);
        (mountpods, input, decision)
    } else {
        (mountpods, input, decision)
    };

    // Re-check with the API server before declaring a single-node ticket newly
    // satisfied. The tickets: the status write carries the resourceVersion of the
    // VolumeAttachment this decision read, so the API server refuses it (409) if any
    // ticket changed since. The MountPods: they have deterministic names and only this
    // controller creates them, so reading each candidate by name (a node of a ticket,
    // or one the cache knows) sees every MountPod a stale cache could miss, without
    // listing them all.
    let old = va.status.clone().unwrap_or_default();
    let newly_satisfied = decision.tickets.iter().any(|(id, o)| {
        o.satisfied
            && !old
                .attachment_ticket_statuses
                .get(id)
                .is_some_and(|s| s.satisfied)
    });
    let recheck = newly_satisfied && !volume.spec.access_mode.is_multi_node();
    let input = if recheck {
        let mp_api = Api::<MountPod>::all(ctx.client.clone());
        let mut nodes: BTreeSet<String> = va
            .spec
            .attachment_tickets
            .values()
            .map(|t| t.node_id.clone())
            .collect();
        nodes.extend(mountpods.iter().map(|mp| mp.spec.node_name.clone()));
        let read_mp = |node: &String| {
            let mp_api = mp_api.clone();
            let mp_name = api::mountpod_name(&name, node);
            ctx.metrics.read("MountPod", "get");
            async move {
                mp_api
                    .get_opt(&mp_name)
                    .await
                    .context(|| format!("re-reading MountPod {mp_name}"))
            }
        };
        // All candidates at once.
        let fresh_mps: Vec<Arc<MountPod>> = futures::future::join_all(nodes.iter().map(read_mp))
            .await
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .flatten()
            .filter(|mp| mp.spec.volume == name)
            .map(Arc::new)
            .collect();
        let input = gather(&volume, &va, &fresh_mps, &now);
        decision = tickets::decide(&input);
        input
    } else {
        input
    };

    let precondition = if recheck { va.resource_version() } else { None };
    let attachment =
        write_attachment_status(&ctx, &va, va_base, precondition, &decision, &input, &now);
    let volume_status = write_volume_status(&ctx, &volume, &mountpods, &decision);
    let (attachment, volume_status) = if recheck {
        // The Volume may only say Attached once the re-checked ticket status is in.
        let attachment = attachment.await;
        let volume_status = if attachment.is_ok() {
            volume_status.await
        } else {
            Ok(())
        };
        (attachment, volume_status)
    } else {
        // Two objects, two independent writes: at once, so the next reconcile of this
        // volume (say, for the MountPod that just became Ready) does not queue behind both.
        tokio::join!(attachment, volume_status)
    };
    match attachment {
        Err(Error::Kube {
            source: kube::Error::Api(s),
            ..
        }) if s.code == 409 => {
            debug!(volume = %name, "tickets changed since they were read; deciding again");
            return Ok(Action::requeue(Duration::from_millis(100)));
        }
        res => res?,
    }
    volume_status?;
    // A safety net: level-triggered reconciles also run without events.
    Ok(Action::requeue(Duration::from_secs(300)))
}

/// The arbitration input for a volume, from its objects.
pub fn gather(
    volume: &Volume,
    va: &VolumeAttachment,
    mountpods: &[Arc<MountPod>],
    now: &Time,
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
        MountState::Failed(status.last_error.unwrap_or_else(|| "mount failed".into()))
    } else {
        MountState::Starting
    };
    MountView {
        state,
        read_only: mp.spec.read_only,
    }
}

async fn pin_volume(ctx: &Context, volume: &Volume, node: &str) -> Result<(), Error> {
    let name = volume.name_any();
    let patch = json!({"spec": {"backend": {"node": node}}});
    let written = Api::<Volume>::all(ctx.client.clone())
        .patch(&name, &super::merge_params(), &Patch::Merge(&patch))
        .await
        .context(|| format!("pinning node-local volume {name} to {node}"))?;
    ctx.metrics.write("Volume", "patch");
    ctx.recent_volumes.record(
        &name,
        &name,
        volume.resource_version(),
        Some(Arc::new(written)),
    );
    info!(volume = %name, %node, "pinned node-local volume");
    Ok(())
}

/// The MountPods of volume `name`: the cache, corrected by what this controller wrote
/// and it does not show yet.
fn mountpods_of(ctx: &Context, name: &str) -> Vec<Arc<MountPod>> {
    ctx.recent_mountpods.view_scope(
        name,
        ctx.mountpods
            .state()
            .into_iter()
            .filter(|mp| mp.spec.volume == name)
            .collect(),
    )
}

/// What [`sync_mountpods`] did.
#[derive(Default)]
struct Synced {
    /// A MountPod was created or changed.
    created: bool,
    /// A MountPod was deleted.
    deleted: bool,
}

/// Make the MountPods match the decision: detach (delete) before attach (create).
async fn sync_mountpods(
    ctx: &Context,
    volume: &Volume,
    va: &VolumeAttachment,
    mountpods: &[Arc<MountPod>],
    decision: &Decision,
) -> Result<Synced, Error> {
    let api: Api<MountPod> = Api::all(ctx.client.clone());
    let name = volume.name_any();
    let mut synced = Synced::default();
    for mp in mountpods {
        if mp.metadata.deletion_timestamp.is_none()
            && !decision.nodes.contains_key(&mp.spec.node_name)
        {
            let mp_name = mp.name_any();
            let after = match api.delete(&mp_name, &DeleteParams::default()).await {
                Ok(either) => either.left().map(Arc::new),
                Err(kube::Error::Api(s)) if s.code == 404 => None,
                Err(e) => return Err(e).context(|| format!("deleting MountPod {mp_name}")),
            };
            ctx.metrics.write("MountPod", "delete");
            ctx.recent_mountpods
                .record(&name, &mp_name, mp.resource_version(), after);
            synced.deleted = true;
            info!(volume = %name, node = %mp.spec.node_name, "detaching");
            publish(
                ctx,
                volume,
                EventType::Normal,
                "Detaching",
                &format!("detaching from node {}", mp.spec.node_name),
            )
            .await;
        }
    }
    for (node, mount) in &decision.nodes {
        let task = node_task(va, node);
        let desired = desired_spec(volume, node, mount.read_only, task)?;
        let existing = mountpods.iter().find(|mp| &mp.spec.node_name == node);
        match existing {
            Some(mp) if mp.metadata.deletion_timestamp.is_some() => continue, // old one must go first
            Some(mp) if mp.spec.task != task => {
                let after = api
                    .delete(&mp.name_any(), &DeleteParams::default())
                    .await
                    .context(|| format!("replacing MountPod {}", mp.name_any()))?
                    .left()
                    .map(Arc::new);
                ctx.metrics.write("MountPod", "delete");
                ctx.recent_mountpods
                    .record(&name, &mp.name_any(), mp.resource_version(), after);
                synced.deleted = true;
                continue;
            }
            Some(mp) if same_controlled_fields(&mp.spec, &desired) => continue,
            _ => {}
        }
        let mp_name = api::mountpod_name(&name, node);
        let mut labels = ctx.labels.0.clone();
        labels.insert(LABEL_NODE.into(), node.clone());
        labels.insert(LABEL_VOLUME.into(), name.clone());
        let owner = owner_reference(volume);
        // Only the fields the controller owns: never `references` (the CSI node's).
        let body = json!({
            "apiVersion": "tessera.io/v1alpha1",
            "kind": "MountPod",
            "metadata": {"name": mp_name, "labels": labels, "ownerReferences": [owner]},
            "spec": {
                "volume": desired.volume,
                "nodeName": desired.node_name,
                "source": desired.source,
                "task": desired.task,
                "capacityBytes": desired.capacity_bytes,
                "readOnly": desired.read_only,
                "mountOptions": desired.mount_options,
            }
        });
        let written = api
            .patch(
                &mp_name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await
            .context(|| format!("applying MountPod {mp_name}"))?;
        ctx.metrics.write("MountPod", "apply");
        ctx.recent_mountpods.record(
            &name,
            &mp_name,
            existing.and_then(|mp| mp.resource_version()),
            Some(Arc::new(written)),
        );
        synced.created = true;
        if existing.is_none() {
            info!(volume = %name, %node, ?task, "attaching");
            let what = match task {
                MountTask::Serve => format!("attaching to node {node}"),
                MountTask::RemoveData => format!("removing the volume's data on node {node}"),
            };
            publish(ctx, volume, EventType::Normal, "Attaching", &what).await;
        }
    }
    Ok(synced)
}

/// A node whose only tickets are cleanup tickets removes the data instead of serving.
fn node_task(va: &VolumeAttachment, node: &str) -> MountTask {
    let mut on_node = va
        .spec
        .attachment_tickets
        .values()
        .filter(|t| t.node_id == node)
        .peekable();
    if on_node.peek().is_some() && on_node.all(|t| t.type_ == AttacherType::Cleanup) {
        MountTask::RemoveData
    } else {
        MountTask::Serve
    }
}

fn same_controlled_fields(a: &MountPodSpec, b: &MountPodSpec) -> bool {
    a.source == b.source
        && a.capacity_bytes == b.capacity_bytes
        && a.read_only == b.read_only
        && a.mount_options == b.mount_options
        && a.task == b.task
}

/// The MountPod spec the controller wants for `volume` on `node`.
pub fn desired_spec(
    volume: &Volume,
    node: &str,
    read_only: bool,
    task: MountTask,
) -> Result<MountPodSpec, Error> {
    let name = volume.name_any();
    let capacity = api::quantity_bytes(&volume.spec.size.0).map_err(|e| Error::InvalidVolume {
        volume: name.clone(),
        message: e.to_string(),
    })?;
    let capacity = i64::try_from(capacity).map_err(|_| Error::InvalidVolume {
        volume: name.clone(),
        message: "size too large".into(),
    })?;
    let root = volume.spec.backend.root.trim_end_matches('/');
    Ok(MountPodSpec {
        volume: name.clone(),
        node_name: node.to_string(),
        source: format!("{root}/{name}"),
        task,
        capacity_bytes: capacity,
        read_only,
        mount_options: volume.spec.mount_options.clone(),
        references: vec![],
        retain_seconds: None,
    })
}

/// Controller owner reference to the Volume.
pub fn owner_reference(volume: &Volume) -> OwnerReference {
    volume
        .controller_owner_ref(&())
        .expect("a Volume read from the API has a uid")
}

/// Publish an Event about the Volume; failures are logged, never fatal.
pub(crate) async fn publish(
    ctx: &Context,
    volume: &Volume,
    type_: EventType,
    reason: &str,
    note: &str,
) {
    publish_action(ctx, volume, type_, reason, reason, note).await
}

/// Publish an Event with an explicit action. Events with the same reason and action
/// on one object are folded into one series, so distinct happenings (one per ticket)
/// need distinct actions.
pub(crate) async fn publish_action(
    ctx: &Context,
    volume: &Volume,
    type_: EventType,
    reason: &str,
    action: &str,
    note: &str,
) {
    let ev = Event {
        type_,
        reason: reason.into(),
        note: Some(note.into()),
        action: action.chars().take(128).collect(),
        secondary: None,
    };
    ctx.metrics.write("Event", "create");
    // Off the reconcile's path: an Event is news, not state, and must not delay the
    // status writes that the CSI driver (and so the attach) waits for.
    let recorder = ctx.recorder.clone();
    let object = volume.object_ref(&());
    tokio::spawn(async move {
        if let Err(e) = recorder.publish(&ev, &object).await {
            debug!(error = %e, "publishing event");
        }
    });
}

/// Build and (if it differs) write the VolumeAttachment status.
async fn write_attachment_status(
    ctx: &Context,
    va: &VolumeAttachment,
    base: Option<String>,
    precondition: Option<String>,
    decision: &Decision,
    input: &Input,
    now: &Time,
) -> Result<(), Error> {
    let old = va.status.clone().unwrap_or_default();
    let requested: BTreeMap<&str, &Time> = input
        .tickets
        .iter()
        .filter_map(|t| t.requested_at.as_ref().map(|r| (t.ticket.id.as_str(), r)))
        .collect();
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
        if outcome.satisfied
            && !prev.is_some_and(|p| p.satisfied)
            && let Some(req) = requested.get(id.as_str())
        {
            let secs = now.0.duration_since(req.0).as_secs_f64().max(0.0);
            ctx.metrics.ticket_satisfied_seconds.observe(secs);
        }
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
    let status = VolumeAttachmentStatus {
        ticket_count: i32::try_from(decision.tickets.len()).unwrap_or(i32::MAX),
        satisfied_count: i32::try_from(decision.tickets.values().filter(|o| o.satisfied).count())
            .unwrap_or(i32::MAX),
        nodes: decision.nodes.keys().cloned().collect(),
        waiting,
        attachment_ticket_statuses: statuses,
        observed_generation: va.metadata.generation,
    };
    if va.status.as_ref() == Some(&status) {
        return Ok(());
    }
    let name = va.name_any();
    let mut body =
        json!({"apiVersion": "tessera.io/v1alpha1", "kind": "VolumeAttachment", "status": status});
    if let Some(rv) = precondition {
        // Optimistic concurrency: refused with 409 unless the object is still `rv`.
        body["metadata"] = json!({"name": name, "resourceVersion": rv});
    }
    let written = Api::<VolumeAttachment>::all(ctx.client.clone())
        .patch_status(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .context(|| format!("writing status of VolumeAttachment {name}"))?;
    ctx.metrics.write("VolumeAttachment", "status");
    ctx.recent_attachments
        .record(&name, &name, base, Some(Arc::new(written)));
    for (id, o) in &decision.tickets {
        let was = old
            .attachment_ticket_statuses
            .get(id)
            .is_some_and(|s| s.satisfied);
        if o.satisfied != was {
            info!(volume = %name, ticket = %id, satisfied = o.satisfied, reason = %o.reason, "ticket status changed");
        }
    }
    Ok(())
}

/// Build and (if it differs) write the Volume status.
async fn write_volume_status(
    ctx: &Context,
    volume: &Volume,
    mountpods: &[Arc<MountPod>],
    decision: &Decision,
) -> Result<(), Error> {
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
    let now = Time(jiff::Timestamp::now());
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
    let last_attached_node = ready
        .iter()
        .find(|n| decision.nodes.contains_key(*n))
        .cloned()
        .or(old.last_attached_node.clone());
    let status = VolumeStatus {
        last_attached_node,
        state: Some(state),
        attached_nodes: ready
            .into_iter()
            .filter(|n| decision.nodes.contains_key(n))
            .collect(),
        capacity: Some(volume.spec.size.clone()),
        conditions,
        observed_generation: volume.metadata.generation,
    };
    if volume.status.as_ref() == Some(&status) {
        return Ok(());
    }
    let name = volume.name_any();
    let body = json!({"apiVersion": "tessera.io/v1alpha1", "kind": "Volume", "status": status});
    let written = Api::<Volume>::all(ctx.client.clone())
        .patch_status(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .context(|| format!("writing status of Volume {name}"))?;
    ctx.metrics.write("Volume", "status");
    ctx.recent_volumes.record(
        &name,
        &name,
        volume.resource_version(),
        Some(Arc::new(written)),
    );
    Ok(())
}
