//! Carries a [`Plan`] out: each step in order, against the API server, remembering
//! every write (own writes, echoes, sightings, spacing, pace) so the next reconcile
//! sees it before the caches do.
//!
//! ```text
//!  Plan.steps ─▶ ReleaseFinalizer   JSON patch (test index, remove)
//!             ─▶ PinVolume          merge patch of the Volume's spec
//!             ─▶ ReportSlowDetaches Reported::fresh ─▶ Detaching Events
//!             ─▶ WriteStatuses      VolumeAttachment status (SSA) ─┐ at once, or in turn
//!                                   Volume status (SSA) + Events ──┘ 409 ─▶ stop, requeue
//!             ─▶ DeletionBlocked    Warning Event
//!  then ─▶ Plan.then
//! ```
//!
//! Also the one read between phases: [`recheck`], the MountPods a re-check reads by
//! name.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use serde_json::json;
use tracing::{debug, info, warn};

use tessera_api::{
    self as api, ATTACHMENT_FINALIZER, CONTROLLER_FIELD_MANAGER, MountPod, Volume,
    VolumeAttachment, finalizers,
};

use super::Ctx;
use super::plan::{AttachmentWrite, Plan, Recheck, StatusWrites, Step, VolumeWrite};
use super::status;
use crate::context::merge_params;
use crate::events::{publish_node, publish_tickets};
use crate::{Error, KubeContext};

/// Carry `plan` out on `va`: its steps in order, then its requeue (or the requeue of
/// the step that ended it).
pub async fn execute(ctx: &Ctx, va: &VolumeAttachment, plan: Plan) -> Result<Action, Error> {
    Ok(run_steps(ctx, va, plan.steps).await?.unwrap_or(plan.then))
}

/// Carry `steps` out in order; `Some(action)` when one ended the reconcile.
pub async fn run_steps(
    ctx: &Ctx,
    va: &VolumeAttachment,
    steps: Vec<Step>,
) -> Result<Option<Action>, Error> {
    for step in steps {
        if let Some(stop) = run(ctx, va, step).await? {
            return Ok(Some(stop));
        }
    }
    Ok(None)
}

/// One step; `Some(action)` when it ends the reconcile.
async fn run(ctx: &Ctx, va: &VolumeAttachment, step: Step) -> Result<Option<Action>, Error> {
    match step {
        Step::ReleaseFinalizer => release_finalizer(ctx, va).await?,
        Step::PinVolume { volume, node } => pin_volume(ctx, &volume, &node).await?,
        Step::ReportSlowDetaches {
            volume,
            due,
            present,
        } => {
            let name = va.name_any();
            let present = present.iter().map(String::as_str);
            for node in ctx.state.detaches_reported.fresh(&name, &due, present) {
                info!(volume = %name, %node, "detach slow");
                let note = format!("detaching from node {node}: waiting for its mount to end");
                publish_node(&ctx.shared, &volume, "Detaching", &node, &note);
            }
        }
        Step::WriteStatuses(writes) => return write_statuses(ctx, va, *writes).await,
        Step::DeletionBlocked {
            volume,
            holders,
            note,
        } => {
            let name = va.name_any();
            warn!(volume = %name, holders = %holders.join(", "), "deletion of a VolumeAttachment in use waits");
            publish_tickets(
                &ctx.shared,
                &volume,
                Some(va),
                EventType::Warning,
                "DeletionBlocked",
                "DeleteVolumeAttachment",
                &note,
            );
        }
    }
    Ok(None)
}

/// The VolumeAttachment status and the Volume status: one after the other, or at once
/// (two objects, two independent writes: the next reconcile of this volume, say for
/// the MountPod that just became Ready, does not queue behind both).
async fn write_statuses(
    ctx: &Ctx,
    va: &VolumeAttachment,
    writes: StatusWrites,
) -> Result<Option<Action>, Error> {
    let StatusWrites {
        attachment,
        volume,
        in_turn,
        on_conflict,
    } = writes;
    let name = va.name_any();
    let attachment = write_attachment_status(ctx, va, attachment);
    let volume_status = async {
        match volume {
            Some(write) => write_volume_status(ctx, write).await,
            None => {
                debug!(volume = %name, "detaching; the Volume status waits");
                Ok(())
            }
        }
    };
    let (attachment, volume_status) = if in_turn {
        let attachment = attachment.await;
        let volume_status = if attachment.is_ok() {
            volume_status.await
        } else {
            Ok(())
        };
        (attachment, volume_status)
    } else {
        tokio::join!(attachment, volume_status)
    };
    match (attachment, on_conflict) {
        (
            Err(Error::Kube(tessera_runtime::KubeError {
                source: kube::Error::Api(s),
                ..
            })),
            Some(action),
        ) if s.code == 409 => {
            debug!(volume = %name, "tickets changed since they were read; deciding again");
            return Ok(Some(action));
        }
        (res, _) => res?,
    }
    volume_status?;
    Ok(None)
}

/// Let a VolumeAttachment being deleted go: remove the protection finalizer (a JSON
/// patch that first tests it is still at that index).
async fn release_finalizer(ctx: &Ctx, va: &VolumeAttachment) -> Result<(), Error> {
    let name = va.name_any();
    let Some(patch) = finalizers::remove_patch(va.finalizers(), ATTACHMENT_FINALIZER) else {
        return Ok(());
    };
    match Api::<VolumeAttachment>::all(ctx.shared.client.clone())
        .patch(&name, &merge_params(), &Patch::<()>::Json(patch))
        .await
    {
        Ok(_) => {}
        // Gone already, or the finalizers changed: the next reconcile sees.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 422 => return Ok(()),
        Err(e) => {
            Err(e).context(|| format!("removing the finalizer of VolumeAttachment {name}"))?;
        }
    }
    info!(volume = %name, "no workload ticket is satisfied: the VolumeAttachment may go");
    Ok(())
}

async fn pin_volume(ctx: &Ctx, volume: &Volume, node: &str) -> Result<(), Error> {
    let name = volume.name_any();
    let patch = json!({"spec": {"backend": {"node": node}}});
    let written = Api::<Volume>::all(ctx.shared.client.clone())
        .patch(&name, &merge_params(), &Patch::Merge(&patch))
        .await
        .context(|| format!("pinning node-local volume {name} to {node}"))?;
    ctx.shared.written_volumes.record(
        &name,
        &name,
        volume.resource_version(),
        Some(Arc::new(written)),
    );
    info!(volume = %name, %node, "pinned node-local volume");
    Ok(())
}

/// Read the MountPods of `recheck` from the API server, all at once (those of another
/// volume are left out), and add the ones it keeps.
pub async fn recheck(
    ctx: &Ctx,
    va: &VolumeAttachment,
    recheck: Recheck,
) -> Result<Vec<Arc<MountPod>>, Error> {
    let name = va.name_any();
    let mp_api = Api::<MountPod>::all(ctx.shared.client.clone());
    let read_mp = |node: &String| {
        let mp_api = mp_api.clone();
        let mp_name = api::mountpod_name(&name, node);
        async move {
            mp_api
                .get_opt(&mp_name)
                .await
                .context(|| format!("re-reading MountPod {mp_name}"))
        }
    };
    let mut fresh: Vec<Arc<MountPod>> = futures::future::join_all(recheck.read.iter().map(read_mp))
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .flatten()
        .filter(|mp| mp.spec.volume == name)
        .map(Arc::new)
        .collect();
    fresh.extend(recheck.keep);
    Ok(fresh)
}

/// Observe the newly satisfied tickets' latencies, and write the VolumeAttachment
/// status if it changed.
async fn write_attachment_status(
    ctx: &Ctx,
    va: &VolumeAttachment,
    write: AttachmentWrite,
) -> Result<(), Error> {
    for secs in &write.latencies {
        ctx.shared.metrics.ticket_satisfied_seconds.observe(*secs);
        ctx.state.pace.attached(Duration::from_secs_f64(*secs));
    }
    let Some(status) = write.status else {
        return Ok(());
    };
    write_status(ctx, va, write.base, write.precondition, status).await?;
    let name = va.name_any();
    for (id, satisfied, reason) in &write.changes {
        info!(volume = %name, ticket = %id, satisfied = *satisfied, reason = %reason, "ticket status changed");
    }
    Ok(())
}

/// Write `status` on `va` (server-side apply of the status subresource; with
/// `precondition`, only if the object is still at that resourceVersion, else 409),
/// and remember it. `base` is the resourceVersion the cache shows, which the write
/// supersedes.
async fn write_status(
    ctx: &Ctx,
    va: &VolumeAttachment,
    base: Option<String>,
    precondition: Option<String>,
    status: api::VolumeAttachmentStatus,
) -> Result<(), Error> {
    let name = va.name_any();
    ctx.state
        .spacing
        .wrote(&name, Instant::now(), va.spec.attachment_tickets.len());
    let mut body =
        json!({"apiVersion": "tessera.io/v1alpha1", "kind": "VolumeAttachment", "status": status});
    if let Some(rv) = precondition {
        // Optimistic concurrency: refused with 409 unless the object is still `rv`.
        body["metadata"] = json!({"name": name, "resourceVersion": rv});
    }
    let written = Api::<VolumeAttachment>::all(ctx.shared.client.clone())
        .patch_status(
            &name,
            &PatchParams::apply(CONTROLLER_FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .context(|| format!("writing status of VolumeAttachment {name}"))?;
    ctx.state
        .echoes
        .wrote("VolumeAttachment", &name, written.resource_version());
    ctx.state.sightings.written(&written);
    ctx.shared
        .written_attachments
        .record(&name, &name, base, Some(Arc::new(written)));
    Ok(())
}

/// Write the Volume status of `write`, if it differs; an Event for each node that
/// started attaching (only a slow attach writes that status), finished attaching or
/// finished detaching.
async fn write_volume_status(ctx: &Ctx, write: VolumeWrite) -> Result<(), Error> {
    let VolumeWrite {
        volume,
        mountpods,
        decision,
    } = write;
    let now = Time(jiff::Timestamp::now());
    let status = status::volume_status(&volume, &mountpods, &decision, &now);
    if volume.status.as_ref() == Some(&status) {
        return Ok(());
    }
    let name = volume.name_any();
    let body = json!({"apiVersion": "tessera.io/v1alpha1", "kind": "Volume", "status": status});
    let written = Api::<Volume>::all(ctx.shared.client.clone())
        .patch_status(
            &name,
            &PatchParams::apply(CONTROLLER_FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .context(|| format!("writing status of Volume {name}"))?;
    ctx.state
        .echoes
        .wrote("Volume", &name, written.resource_version());
    ctx.shared.written_volumes.record(
        &name,
        &name,
        volume.resource_version(),
        Some(Arc::new(written)),
    );
    for change in status::node_changes(volume.status.as_ref(), &status) {
        match change {
            status::NodeChange::Attaching(node) => {
                info!(volume = %name, %node, "attaching");
                let note = format!("attaching to node {node}: waiting for the mount");
                publish_node(&ctx.shared, &volume, "Attaching", &node, &note);
            }
            status::NodeChange::Attached(node) => {
                info!(volume = %name, %node, "attached");
                let note = format!("attached to node {node}: the mount is ready");
                publish_node(&ctx.shared, &volume, "Attached", &node, &note);
            }
            status::NodeChange::Detached(node) => {
                info!(volume = %name, %node, "detached");
                let note = format!("detached from node {node}: the mount is gone");
                publish_node(&ctx.shared, &volume, "Detached", &node, &note);
            }
        }
    }
    Ok(())
}
