//! The VolumeAttachment controller: runs ticket arbitration for one volume and makes
//! the world match the decision.
//!
//! ```text
//!  VolumeAttachment (tickets) + Volume + MountPods (cache + own writes)
//!        │ input::gather (+ sightings: first sighting of undated tickets)
//!        │   ─▶ tickets::decide ─▶ Decision { nodes, outcome per ticket }
//!        ▼
//!  mountpods::sync_mountpods: delete on dropped nodes, create (POST) on chosen ones
//!        │ (decided again if it only attached)
//!        ▼
//!  detaching: a MountPod still there 2 s after its deletion timestamp ─▶ one
//!             Detaching Event; back when the next one is due; until then, the
//!             Volume status is not written for it (only the VolumeAttachment's)
//!        ▼
//!  a new attach, under its quiet time (1 s; more while many wait together: pace),
//!  nothing else changed? ─▶ no write; back when it may be slow
//!        ▼
//!  a large VolumeAttachment (≥ 100 tickets) written less than 2 s ago
//!  (runtime::spacing)? ─▶ no write yet; back when the period is over
//!        ▼
//!  recheck: a single-node ticket about to be satisfied ─▶ MountPods on the other
//!           candidate nodes re-read, decided again
//!        ▼
//!  status::attachment_status_holding ─▶ VolumeAttachment status (SSA, status subresource)
//!  status::volume_status ─────▶ Volume status             (SSA, status subresource)
//!                               + one Event per node that started (if slow), finished
//!                                 attaching or detaching
//! ```
//!
//! Nothing is written when nothing changed, and an attach that completes within
//! its quiet time ([`status::ATTACH_QUIET`], longer while many attaches wait together,
//! see `controller::pace`) writes each status once, when it is done; so does a detach
//! on the Volume (within [`detaching::DETACH_QUIET`]; the VolumeAttachment drops the
//! ticket's status at once). Ticket changes
//! that arrive while a volume's reconcile runs or is queued are decided together by
//! the next one (kube-runtime runs one reconcile per object at a time and folds the
//! triggers queued meanwhile), so a VolumeAttachment's status is written at most once
//! per reconcile, whatever the number of tickets that changed.
//!
//! A ticket of a single-node volume is never declared satisfied from the cache alone:
//! the status write carries the resourceVersion of the VolumeAttachment the decision
//! read (the API server refuses it if any ticket changed since), and the MountPods of
//! the other nodes the volume could be on are read from the API server and the
//! decision is recomputed, so a stale cache cannot make two nodes look like owners.

pub mod detaching;
pub mod input;
pub mod mountpods;
pub mod sightings;
pub mod status;
#[cfg(test)]
mod tests;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use serde_json::json;
use tracing::{debug, info, instrument, warn};

pub use self::input::{gather, mount_view};
pub use self::mountpods::desired_spec;
use super::context::{measured, merge_params};
use super::events::{publish_node, publish_tickets};
use super::protection;
use super::{Context, Error, FIELD_MANAGER, KubeContext};
use crate::api::{self, BackendScope, MountPod, Volume, VolumeAttachment};
use crate::runtime::error_chain;
use crate::tickets::{self, Decision, Input};

/// Reconcile one VolumeAttachment.
#[instrument(skip_all, fields(volume = %va.name_any()))]
pub async fn reconcile(va: Arc<VolumeAttachment>, ctx: Arc<Context>) -> Result<Action, Error> {
    let metrics = ctx.metrics.clone();
    measured(&metrics, "attachment", reconcile_inner(va, ctx)).await
}

/// Back off on errors.
pub fn error_policy(_va: Arc<VolumeAttachment>, err: &Error, _ctx: Arc<Context>) -> Action {
    debug!(error = %error_chain(err), "attachment reconcile failed");
    Action::requeue(Duration::from_secs(2))
}

async fn reconcile_inner(va: Arc<VolumeAttachment>, ctx: Arc<Context>) -> Result<Action, Error> {
    debug!("attachment reconcile");
    if !ctx.caches_ready().await {
        return Ok(Action::requeue(Duration::from_millis(200)));
    }
    let name = va.name_any();
    // The caches, corrected by what this controller wrote and they do not show yet.
    let va = ctx
        .written_attachments
        .view(&name, Some(va.clone()))
        .unwrap_or(va);
    // What the next reconcile's cache will show until it catches up with our writes.
    let va_base = va.resource_version();
    let Some(volume) = ctx
        .written_volumes
        .view(&name, ctx.volumes.get(&ObjectRef::new(&name)))
    else {
        // Its Volume is gone: nothing left to protect from deletion.
        if va.metadata.deletion_timestamp.is_some() {
            if protection::has_finalizer(&va) {
                release_finalizer(&ctx, &va).await?;
            }
            return Ok(Action::await_change());
        }
        // Tickets applied before their Volume: say so, and wait for it (its watch
        // triggers us).
        let now = Time(jiff::Timestamp::now());
        let status = status::missing_volume_status(&va, &now);
        write_status(&ctx, &va, va_base, None, status).await?;
        return Ok(Action::await_change());
    };
    let mountpods = mountpods_of(&ctx, &name);
    let now = Time(jiff::Timestamp::now());
    let first_seen = ctx.ticket_sightings.first_seen(&va, &now);
    let gather_on = |mountpods: &[Arc<MountPod>]| {
        gather(&volume, &va, mountpods, &first_seen, &now, |n| {
            ctx.node_exists(n)
        })
    };

    let input = gather_on(&mountpods);
    let decision = tickets::decide(&input);

    // A node-local volume without a node is pinned to the first node chosen for it.
    if volume.spec.backend.scope == BackendScope::NodeLocal
        && volume.spec.backend.node.is_none()
        && let Some(node) = decision.nodes.keys().next()
    {
        pin_volume(&ctx, &volume, node).await?;
        return Ok(Action::requeue(Duration::from_millis(100)));
    }

    let synced = mountpods::sync_mountpods(&ctx, &volume, &mountpods, &decision).await?;
    // After attaching, decide again on the world as this reconcile left it (the
    // MountPods it just created), so the statuses describe that and not the moment
    // before: otherwise the next reconcile writes them a second time only to say so.
    // Not after a detach: the statuses must say which ticket was interrupted and why.
    let (mountpods, input, decision) = if synced.created && !synced.deleted {
        let mountpods = mountpods_of(&ctx, &name);
        let input = gather_on(&mountpods);
        let decision = tickets::decide(&input);
        (mountpods, input, decision)
    } else {
        (mountpods, input, decision)
    };

    // The MountPods as this reconcile left them: the Volume status describes these
    // (a MountPod deleted at once is gone, one with finalizers terminating).
    let after_delete = synced.deleted.then(|| mountpods_of(&ctx, &name));
    let view: &[Arc<MountPod>] = after_delete.as_deref().unwrap_or(&mountpods);
    // A detach still under way after its quiet time says so, once (a fast one has
    // only its Detached Event, and the Volume status written when it is done); every
    // way out of this reconcile comes back in time for the next one.
    let (detaches, volume_waits) = {
        let slow = detaching::slow_detaches(view, &decision, &now, detaching::DETACH_QUIET);
        let uids = view.iter().filter_map(|mp| mp.metadata.uid.as_deref());
        for node in ctx.detaches_reported.fresh(&name, &slow.due, uids) {
            info!(volume = %name, %node, "detach slow");
            let note = format!("detaching from node {node}: waiting for its mount to end");
            publish_node(&ctx, &volume, "Detaching", &node, &note);
        }
        let waits =
            detaching::volume_status_waits(&volume, view, &decision, &now, detaching::DETACH_QUIET);
        (slow.left, waits)
    };
    let requeue = |after: Duration| {
        let next = detaches.map_or(after, |d| after.min(d + Duration::from_millis(10)));
        Action::requeue(next)
    };

    // A new attach that may still be fast: nothing is written yet (the attach is done
    // in a few tens of milliseconds, and then each status is written once); come back
    // when it has taken long enough for a person to look. (Not while the
    // VolumeAttachment is being deleted: its finalizer is this reconcile's business.)
    let without_agent = ctx.nodes_without_agent(&va);
    let quiet_time = ctx.pace.attach_quiet(ctx.ticket_sightings.pending());
    let quiet = status::quiet_left(
        va.status.as_ref(),
        &decision,
        &input,
        &without_agent,
        &now,
        quiet_time,
    );
    if let Some(left) = quiet
        && va.metadata.deletion_timestamp.is_none()
    {
        let volume_now = status::volume_status(&volume, &mountpods, &decision, &now);
        if volume.status.as_ref() == Some(&volume_now)
            || status::only_attaching(volume.status.as_ref(), &volume_now)
        {
            debug!(volume = %name, left_ms = left.as_millis() as u64, "attaching; statuses wait");
            return Ok(requeue(left + Duration::from_millis(10)));
        }
    }

    // A large VolumeAttachment's status is written at most once per
    // runtime::spacing::PERIOD: a change waits out the period of the last write, and
    // what changes meanwhile goes out with it.
    // The new attaches still in their quiet time, when statuses are written anyway.
    let held_of = |decision: &Decision, input: &Input| {
        status::held(
            va.status.as_ref(),
            decision,
            input,
            &without_agent,
            &now,
            quiet_time,
        )
    };
    if let Some(left) = ctx.status_spacing.left(&name, Instant::now())
        && va.status.as_ref()
            != Some(&status::attachment_status_holding(
                &va,
                &decision,
                &input,
                &without_agent,
                &now,
                &held_of(&decision, &input).tickets,
            ))
    {
        debug!(volume = %name, left_ms = left.as_millis() as u64, "status write spaced");
        return Ok(requeue(left + Duration::from_millis(5)));
    }

    let recheck = needs_recheck(&volume, &va, &decision);
    let (input, decision) = if recheck {
        recheck_mountpods(&ctx, &va, &mountpods, &decision, gather_on).await?
    } else {
        (input, decision)
    };

    // Written for something else: the new attaches still in their quiet time stay
    // unreported (no status, not among the Volume's mounted nodes, no Event).
    let held = held_of(&decision, &input);
    // The re-checked tickets: the status write carries the resourceVersion of the
    // VolumeAttachment this decision read, so the API server refuses it (409) if any
    // ticket changed since.
    let precondition = if recheck { va.resource_version() } else { None };
    let attachment = write_attachment_status(
        &ctx,
        &va,
        va_base,
        precondition,
        &decision,
        &input,
        &without_agent,
        &now,
        &held.tickets,
    );
    let shown: Vec<Arc<MountPod>> = view
        .iter()
        .filter(|mp| !held.nodes.contains(&mp.spec.node_name))
        .cloned()
        .collect();
    let volume_status = async {
        if volume_waits {
            debug!(volume = %name, "detaching; the Volume status waits");
            return Ok(());
        }
        write_volume_status(&ctx, &volume, &shown, &decision).await
    };
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
        Err(Error::Kube(crate::runtime::KubeError {
            source: kube::Error::Api(s),
            ..
        })) if s.code == 409 => {
            debug!(volume = %name, "tickets changed since they were read; deciding again");
            return Ok(Action::requeue(Duration::from_millis(100)));
        }
        res => res?,
    }
    volume_status?;
    if va.metadata.deletion_timestamp.is_some() && protection::has_finalizer(&va) {
        let holders = protection::satisfied_workloads(&va, &decision);
        if holders.is_empty() {
            release_finalizer(&ctx, &va).await?;
        } else {
            let note = protection::blocked_note(&name, &holders);
            warn!(volume = %name, holders = %holders.join(", "), "deletion of a VolumeAttachment in use waits");
            publish_tickets(
                &ctx,
                &volume,
                Some(&va),
                EventType::Warning,
                "DeletionBlocked",
                "DeleteVolumeAttachment",
                &note,
            );
        }
    }
    // A safety net: level-triggered reconciles also run without events. A ticket that
    // expires changes the decision with no event at all: decide again just after.
    let safety_net = Duration::from_secs(300);
    let wake = tickets::next_expiry(&input).map_or(safety_net, |at| {
        let until = now.0.duration_until(at.0).unsigned_abs();
        until.min(safety_net) + Duration::from_millis(50)
    });
    // A held attach is reported once its quiet time is over.
    let wake = held
        .left
        .map_or(wake, |left| wake.min(left + Duration::from_millis(10)));
    Ok(requeue(wake))
}

/// Whether `decision` is to be re-checked with the API server before its statuses are
/// written: it newly satisfies a ticket of a single-node volume.
fn needs_recheck(volume: &Volume, va: &VolumeAttachment, decision: &Decision) -> bool {
    status::newly_satisfied(va.status.as_ref(), decision)
        .next()
        .is_some()
        && !volume.spec.access_mode.is_multi_node()
}

/// The decision again, with the MountPods of the other nodes read from the API server
/// instead of the cache. They have deterministic names and only this controller
/// creates them, so reading each candidate by name (a node of a ticket, or one the
/// cache knows) sees every MountPod a stale cache could miss, without listing them all.
/// The nodes `decision` newly satisfies a ticket on keep their cached MountPod: a stale
/// one there cannot put the volume on a second node. With no other candidate (one
/// ticket, one node: the common attach), nothing is read. (The tickets are re-checked
/// by the status write's precondition.)
async fn recheck_mountpods(
    ctx: &Context,
    va: &VolumeAttachment,
    mountpods: &[Arc<MountPod>],
    decision: &Decision,
    gather_on: impl Fn(&[Arc<MountPod>]) -> Input,
) -> Result<(Input, Decision), Error> {
    let name = va.name_any();
    let mp_api = Api::<MountPod>::all(ctx.client.clone());
    let satisfying: BTreeSet<&str> = status::newly_satisfied(va.status.as_ref(), decision)
        .filter_map(|id| va.spec.attachment_tickets.get(id))
        .map(|t| t.node_id.as_str())
        .collect();
    let others = recheck_nodes(va, mountpods, &satisfying);
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
    // All candidates at once.
    let mut fresh_mps: Vec<Arc<MountPod>> = futures::future::join_all(others.iter().map(read_mp))
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .flatten()
        .filter(|mp| mp.spec.volume == name)
        .map(Arc::new)
        .collect();
    fresh_mps.extend(
        mountpods
            .iter()
            .filter(|mp| satisfying.contains(mp.spec.node_name.as_str()))
            .cloned(),
    );
    let input = gather_on(&fresh_mps);
    let decision = tickets::decide(&input);
    Ok((input, decision))
}

/// The nodes whose MountPods a re-check reads: every node of a ticket of `va` or of a
/// cached MountPod, but those of the tickets about to be satisfied (`satisfying`).
fn recheck_nodes(
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

/// Let a VolumeAttachment being deleted go: remove the protection finalizer (a JSON
/// patch that first tests it is still at that index).
async fn release_finalizer(ctx: &Context, va: &VolumeAttachment) -> Result<(), Error> {
    let name = va.name_any();
    let Some(idx) = va
        .finalizers()
        .iter()
        .position(|f| f == protection::ATTACHMENT_FINALIZER)
    else {
        return Ok(());
    };
    let patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": format!("/metadata/finalizers/{idx}"), "value": protection::ATTACHMENT_FINALIZER},
        {"op": "remove", "path": format!("/metadata/finalizers/{idx}")},
    ]))
    .expect("well-formed JSON patch");
    match Api::<VolumeAttachment>::all(ctx.client.clone())
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

async fn pin_volume(ctx: &Context, volume: &Volume, node: &str) -> Result<(), Error> {
    let name = volume.name_any();
    let patch = json!({"spec": {"backend": {"node": node}}});
    let written = Api::<Volume>::all(ctx.client.clone())
        .patch(&name, &merge_params(), &Patch::Merge(&patch))
        .await
        .context(|| format!("pinning node-local volume {name} to {node}"))?;
    ctx.written_volumes.record(
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
    ctx.written_mountpods.view_scope(
        name,
        ctx.mountpods
            .state()
            .into_iter()
            .filter(|mp| mp.spec.volume == name)
            .collect(),
    )
}

/// Write the VolumeAttachment status `decision` leads to, if it differs; with
/// `precondition`, only if the object is still at that resourceVersion (else 409).
/// `base` is the resourceVersion the cache shows, which the write supersedes.
#[allow(clippy::too_many_arguments)]
async fn write_attachment_status(
    ctx: &Context,
    va: &VolumeAttachment,
    base: Option<String>,
    precondition: Option<String>,
    decision: &Decision,
    input: &Input,
    without_agent: &BTreeSet<String>,
    now: &Time,
    held: &BTreeSet<String>,
) -> Result<(), Error> {
    for secs in status::satisfaction_latencies(va.status.as_ref(), decision, input, now) {
        ctx.metrics.ticket_satisfied_seconds.observe(secs);
        ctx.pace.attached(Duration::from_secs_f64(secs));
    }
    let status = status::attachment_status_holding(va, decision, input, without_agent, now, held);
    if !write_status(ctx, va, base, precondition, status).await? {
        return Ok(());
    }
    let name = va.name_any();
    for (id, o) in &decision.tickets {
        let was = va.ticket_status(id).is_some_and(|s| s.satisfied);
        if o.satisfied != was {
            info!(volume = %name, ticket = %id, satisfied = o.satisfied, reason = %o.reason, "ticket status changed");
        }
    }
    Ok(())
}

/// Write `status` on `va` if it differs (see [`write_attachment_status`] for `base`
/// and `precondition`); whether it was written.
async fn write_status(
    ctx: &Context,
    va: &VolumeAttachment,
    base: Option<String>,
    precondition: Option<String>,
    status: api::VolumeAttachmentStatus,
) -> Result<bool, Error> {
    if va.status.as_ref() == Some(&status) {
        return Ok(false);
    }
    let name = va.name_any();
    ctx.status_spacing
        .wrote(&name, Instant::now(), va.spec.attachment_tickets.len());
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
    ctx.echoes
        .wrote("VolumeAttachment", &name, written.resource_version());
    ctx.ticket_sightings.written(&written);
    ctx.written_attachments
        .record(&name, &name, base, Some(Arc::new(written)));
    Ok(true)
}

/// Write the Volume status `decision` leads to, if it differs; an Event for each node
/// that started attaching (only a slow attach writes that status), finished attaching
/// or finished detaching.
async fn write_volume_status(
    ctx: &Context,
    volume: &Volume,
    mountpods: &[Arc<MountPod>],
    decision: &Decision,
) -> Result<(), Error> {
    let now = Time(jiff::Timestamp::now());
    let status = status::volume_status(volume, mountpods, decision, &now);
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
    ctx.echoes
        .wrote("Volume", &name, written.resource_version());
    ctx.written_volumes.record(
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
                publish_node(ctx, volume, "Attaching", &node, &note);
            }
            status::NodeChange::Attached(node) => {
                info!(volume = %name, %node, "attached");
                let note = format!("attached to node {node}: the mount is ready");
                publish_node(ctx, volume, "Attached", &node, &note);
            }
            status::NodeChange::Detached(node) => {
                info!(volume = %name, %node, "detached");
                let note = format!("detached from node {node}: the mount is gone");
                publish_node(ctx, volume, "Detached", &node, &note);
            }
        }
    }
    Ok(())
}
