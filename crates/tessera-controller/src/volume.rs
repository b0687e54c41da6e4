//! The Volume controller: gives every Volume its VolumeAttachment, and removes a
//! deleted Volume's data through the ticket system itself.
//!
//! ```text
//!  Volume (new) ──▶ finalizer added ──▶ VolumeAttachment applied (owned, same name)
//!  Volume (deleted) ──▶ cleanup ticket `cleanup-data` for one node (merge patch)
//!        ──▶ arbitration gives that node a MountPod with task RemoveData
//!        ──▶ the node agent removes the data, reports Ready ──▶ ticket satisfied
//!        ──▶ finalizer removed; the VolumeAttachment and MountPods go with the Volume
//! ```
//!
//! The cleanup node is the volume's pinned node (node-local), else a node that has a
//! MountPod of the volume, else the node it was last attached to (if that Node still
//! exists), else the first node whose CSINode lists the Tessera driver
//! (a node where the agent runs), those carrying the controller's `--watch-selector`
//! labels first. `tessera.io/reclaim-policy: Retain` keeps the data.
//!
//! The cleanup ticket is satisfied only by a MountPod that removed the data (task
//! RemoveData), so a Volume deleted while attached keeps its finalizer until its
//! workload tickets are gone and the data is. A node-local volume whose node is gone
//! waits (the ticket's status and the Volume's `DataRemoved` condition say so) until
//! the node is back or the operator annotates it `tessera.io/abandon-data: "true"`;
//! a cleanup ticket of a shared volume whose node is gone moves to another node.
//!
//! The VolumeAttachment carries the finalizer of [`super::protection`]; one that was
//! deleted is recreated with its CSI tickets rebuilt from the storage.k8s.io ones (an
//! inline volume's csi-ephemeral ticket from its Pod).
//! One a previous Volume of the same name owns (deleted, not collected yet) is
//! deleted and made anew, never taken over: its cleanup ticket is not this Volume's.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment as StorageVolumeAttachment};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use serde_json::json;
use tracing::{debug, info, instrument, warn};

use tessera_api::{
    ANNOTATION_ABANDON_DATA, ANNOTATION_RECLAIM, ATTACHMENT_FINALIZER, AttacherType,
    AttachmentTicket, BackendScope, CLEANUP_TICKET, CONDITION_FAULTED, CONDITION_READY,
    CONDITION_STALLED, CONTROLLER_FIELD_MANAGER, CSI_DRIVER_NAME, VOLUME_FINALIZER, Volume,
    VolumeAttachment, finalizers,
};
use tessera_runtime::error_chain;
use tessera_runtime::labels::Labels;

use super::context::{measured, merge_params};
use super::events::publish;
use super::owner::{of_previous_volume, owner_reference};
use super::protection::{csi_tickets_from_storage, has_finalizer};
use super::{Context, Error, KubeContext};

/// Reconcile one Volume.
#[instrument(skip_all, fields(volume = %volume.name_any()))]
pub async fn reconcile(volume: Arc<Volume>, ctx: Arc<Context>) -> Result<Action, Error> {
    let metrics = ctx.metrics.clone();
    metrics.reconcile_started("volume", &volume.name_any());
    measured(&metrics, "volume", async {
        let api: Api<Volume> = Api::all(ctx.client.clone());
        let name = volume.name_any();
        // The cache, corrected by what this controller wrote and it does not show yet.
        let volume = ctx
            .written_volumes
            .view(&name, Some(volume.clone()))
            .unwrap_or(volume);
        let has_finalizer = volume.finalizers().iter().any(|f| f == VOLUME_FINALIZER);
        if volume.metadata.deletion_timestamp.is_none() {
            if let Err(e) = ctx
                .allowed_roots
                .check_scope(&volume.spec.backend.root, root_scope(&volume))
            {
                // Never created, mounted or deleted: no finalizer, no VolumeAttachment.
                refuse_backend_root(&volume, &ctx, &e).await?;
                return Ok(Action::await_change());
            }
            if !has_finalizer {
                // The finalizer first, so no Volume can be deleted before its data is.
                let patch = finalizers::add_patch(
                    volume.finalizers(),
                    volume.resource_version().as_deref(),
                    VOLUME_FINALIZER,
                )
                .expect("checked above");
                let written = api
                    .patch(&name, &merge_params(), &Patch::<()>::Json(patch))
                    .await
                    .context(|| format!("adding the finalizer to {name}"))?;
                ctx.written_volumes.record(
                    &name,
                    &name,
                    volume.resource_version(),
                    Some(Arc::new(written)),
                );
                return Ok(Action::await_change());
            }
            return apply(&volume, &ctx).await;
        }
        if !has_finalizer {
            return Ok(Action::await_change());
        }
        // Deleting: the finalizer stays until the data is removed (or retained).
        match cleanup(&volume, &ctx).await? {
            Cleanup::Pending(action) => Ok(action),
            Cleanup::Done => {
                let patch = finalizers::remove_patch(volume.finalizers(), VOLUME_FINALIZER)
                    .expect("checked above");
                match api
                    .patch(&name, &merge_params(), &Patch::<()>::Json(patch))
                    .await
                {
                    Ok(written) => ctx.written_volumes.record(
                        &name,
                        &name,
                        volume.resource_version(),
                        Some(Arc::new(written)),
                    ),
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => Err(e).context(|| format!("removing the finalizer of {name}"))?,
                }
                Ok(Action::await_change())
            }
        }
    })
    .await
}

/// Where the removal of a deleted volume's data stands.
enum Cleanup {
    /// Removed (or retained by policy): the finalizer may go.
    Done,
    /// Not yet: look again as the action says (or on a change).
    Pending(Action),
}

/// Back off on errors.
pub fn error_policy(_volume: Arc<Volume>, err: &Error, _ctx: Arc<Context>) -> Action {
    debug!(error = %error_chain(err), "volume reconcile failed");
    Action::requeue(Duration::from_secs(2))
}

/// The VolumeAttachment exists, is owned by the Volume and carries the watch labels.
async fn apply(volume: &Volume, ctx: &Context) -> Result<Action, Error> {
    if !ensure_attachment(volume, ctx).await? {
        return Ok(Action::requeue(Duration::from_millis(200)));
    }
    Ok(Action::requeue(Duration::from_secs(600)))
}

/// Returns false when it is to be looked at again soon: the caches are not ready yet
/// (nothing was decided), or a previous Volume's VolumeAttachment was deleted.
async fn ensure_attachment(volume: &Volume, ctx: &Context) -> Result<bool, Error> {
    if !ctx.caches_ready().await {
        debug!(volume = %volume.name_any(), "caches not ready; retrying");
        return Ok(false);
    }
    let name = volume.name_any();
    let uid = volume.uid().unwrap_or_default();
    let existing = ctx
        .written_attachments
        .view(&name, ctx.caches.attachments.get(&ObjectRef::new(&name)));
    if existing
        .as_ref()
        .is_some_and(|va| va.metadata.deletion_timestamp.is_some())
    {
        // Being deleted (it waits for its workloads, see `protection`): recreated once gone.
        return Ok(true);
    }
    if let Some(va) = existing
        .as_ref()
        .filter(|va| of_previous_volume(va.as_ref(), volume))
    {
        // A previous Volume of this name (deleted and made again) owns it and the
        // garbage collector has not removed it yet: its tickets are not this Volume's,
        // and its cleanup ticket would remove this one's data. Deleted (that one, by
        // its uid); made anew once gone.
        info!(volume = %name, "a previous Volume's VolumeAttachment of this name is still there; deleting it");
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: va.uid(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match Api::<VolumeAttachment>::all(ctx.client.clone())
            .delete(&name, &dp)
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(e) => {
                let failed: Result<(), kube::Error> = Err(e);
                failed
                    .context(|| format!("deleting a previous Volume's VolumeAttachment {name}"))?;
            }
        }
        return Ok(false);
    }
    let owned = existing.as_ref().is_some_and(|va| {
        has_finalizer(va)
            && va.owned_by(&uid)
            && ctx
                .labels
                .0
                .iter()
                .all(|(k, v)| va.labels().get(k) == Some(v))
    });
    if owned {
        return Ok(true);
    }
    // Server-side apply of only what the controller owns: the tickets map stays with
    // whoever wrote each ticket.
    let body = json!({
        "apiVersion": "tessera.io/v1alpha1",
        "kind": "VolumeAttachment",
        "metadata": {"name": name, "labels": ctx.labels.0, "ownerReferences": [owner_reference(volume)],
                     "finalizers": [ATTACHMENT_FINALIZER]},
        "spec": {"volume": name},
    });
    let written = Api::<VolumeAttachment>::all(ctx.client.clone())
        .patch(
            &name,
            &PatchParams::apply(CONTROLLER_FIELD_MANAGER),
            &Patch::Apply(&body),
        )
        .await
        .context(|| format!("applying VolumeAttachment {name}"))?;
    ctx.written_attachments.record(
        &name,
        &name,
        existing.as_ref().and_then(|va| va.resource_version()),
        Some(Arc::new(written)),
    );
    if existing.is_none() {
        info!(volume = %name, "created VolumeAttachment");
        // A Volume with a status had a VolumeAttachment before: it was deleted. Its CSI
        // tickets come back now, not when the external-attacher next calls.
        if volume.status.is_some() {
            rebuild_csi_tickets(volume, ctx).await?;
        }
    }
    Ok(true)
}

/// Write the csi-attacher tickets that the storage.k8s.io VolumeAttachments of `volume`
/// stand for, and an inline volume's csi-ephemeral ticket while its Pod uses it
/// ([`super::inline::ticket_of_pod`]), into its (recreated) VolumeAttachment, with a
/// Warning.
async fn rebuild_csi_tickets(volume: &Volume, ctx: &Context) -> Result<(), Error> {
    let name = volume.name_any();
    let (storage, pvs) = futures::future::try_join(
        async {
            Api::<StorageVolumeAttachment>::all(ctx.client.clone())
                .list(&ListParams::default())
                .await
                .context(|| "listing storage.k8s.io VolumeAttachments".to_string())
        },
        async {
            Api::<PersistentVolume>::all(ctx.client.clone())
                .list(&ListParams::default())
                .await
                .context(|| "listing PersistentVolumes".to_string())
        },
    )
    .await?;
    let mut tickets = csi_tickets_from_storage(&name, &storage.items, &pvs.items);
    // An inline volume's ticket, from the Pod that still uses it.
    tickets.extend(super::inline::ticket_back(ctx, volume).await?);
    if !tickets.is_empty() {
        let map: serde_json::Map<String, serde_json::Value> = tickets
            .iter()
            .map(|t| {
                (
                    t.id.clone(),
                    serde_json::to_value(t).expect("a ticket serializes"),
                )
            })
            .collect();
        Api::<VolumeAttachment>::all(ctx.client.clone())
            .patch(
                &name,
                &merge_params(),
                &Patch::Merge(json!({"spec": {"attachmentTickets": map}})),
            )
            .await
            .context(|| format!("rebuilding the CSI tickets of {name}"))?;
    }
    let ids: Vec<&str> = tickets.iter().map(|t| t.id.as_str()).collect();
    warn!(volume = %name, tickets = %ids.join(", "), "VolumeAttachment was deleted; recreated");
    publish(
        ctx,
        volume,
        EventType::Warning,
        "VolumeAttachmentRecreated",
        &format!(
            "VolumeAttachment {name} was deleted and is recreated; {} CSI ticket(s) rebuilt (csi-attacher from storage.k8s.io VolumeAttachments, csi-ephemeral from the inline volume's Pod){}{}. Manual tickets must be applied again; to detach, remove tickets instead of deleting the VolumeAttachment",
            ids.len(),
            if ids.is_empty() { "" } else { ": " },
            ids.join(", ")
        ),
    )
    .await;
    Ok(())
}

/// Say in the Volume's status (once) and in a Warning Event that its backend root is
/// not one the administrator allowed.
async fn refuse_backend_root(
    volume: &Volume,
    ctx: &Context,
    err: &tessera_host::roots::RootError,
) -> Result<(), Error> {
    let name = volume.name_any();
    let mismatch = refusal_reason(err) == BACKEND_SCOPE_MISMATCH;
    // (Constants at the call sites: tests/arch reads the reasons written from there.)
    let reason = if mismatch {
        BACKEND_SCOPE_MISMATCH
    } else {
        BACKEND_ROOT_NOT_ALLOWED
    };
    let message = format!("backend.root refused: {err}; the volume is not served");
    let said = volume.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.reason == reason && c.message == message)
    });
    if said {
        return Ok(());
    }
    warn!(volume = %name, %message, "Volume refused");
    let now = jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .unwrap_or(jiff::Timestamp::now());
    // Faulted, not Ready, and Stalled (kstatus: Failed): only the administrator's
    // allow-list or a new Volume changes this.
    let conditions: Vec<_> = [
        (CONDITION_FAULTED, "True"),
        (CONDITION_READY, "False"),
        (CONDITION_STALLED, "True"),
    ]
    .iter()
    .map(|(type_, status)| {
        let mut c = if mismatch {
            json!({"reason": BACKEND_SCOPE_MISMATCH})
        } else {
            json!({"reason": BACKEND_ROOT_NOT_ALLOWED})
        };
        c["type"] = json!(type_);
        c["status"] = json!(status);
        c["message"] = json!(message);
        c["lastTransitionTime"] = json!(now.to_string());
        c["observedGeneration"] = json!(volume.metadata.generation);
        c
    })
    .collect();
    let patch = json!({"status": {
        "state": "Faulted",
        "conditions": conditions,
        "observedGeneration": volume.metadata.generation,
    }});
    Api::<Volume>::all(ctx.client.clone())
        .patch_status(&name, &merge_params(), &Patch::Merge(&patch))
        .await
        .context(|| format!("writing the status of {name}"))?;
    publish(
        ctx,
        volume,
        EventType::Warning,
        if mismatch {
            BACKEND_SCOPE_MISMATCH
        } else {
            BACKEND_ROOT_NOT_ALLOWED
        },
        &message,
    )
    .await;
    Ok(())
}

/// Reason of a Volume whose backend root is not allowed.
pub const BACKEND_ROOT_NOT_ALLOWED: &str = "BackendRootNotAllowed";

/// Reason of a Shared Volume on a root the administrator declared NodeLocal.
pub const BACKEND_SCOPE_MISMATCH: &str = "BackendScopeMismatch";

/// The reason a Volume refused for `err` carries.
pub fn refusal_reason(err: &tessera_host::roots::RootError) -> &'static str {
    match err {
        tessera_host::roots::RootError::ScopeMismatch { .. } => BACKEND_SCOPE_MISMATCH,
        _ => BACKEND_ROOT_NOT_ALLOWED,
    }
}

/// A Volume's scope as the allowed roots know it.
pub fn root_scope(volume: &Volume) -> tessera_host::roots::RootScope {
    match volume.spec.backend.scope {
        BackendScope::Shared => tessera_host::roots::RootScope::Shared,
        BackendScope::NodeLocal => tessera_host::roots::RootScope::NodeLocal,
    }
}

/// The Volume is being deleted: remove its data via a cleanup ticket, then let go.
async fn cleanup(volume: &Volume, ctx: &Context) -> Result<Cleanup, Error> {
    let name = volume.name_any();
    if let Err(e) = ctx.allowed_roots.check_root(&volume.spec.backend.root) {
        // Nothing there is Tessera's to remove.
        publish(
            ctx,
            volume,
            EventType::Warning,
            BACKEND_ROOT_NOT_ALLOWED,
            &format!("backend.root refused: {e}; nothing is removed there"),
        )
        .await;
        return Ok(Cleanup::Done);
    }
    if volume
        .annotations()
        .get(ANNOTATION_RECLAIM)
        .is_some_and(|p| p == "Retain")
    {
        publish(
            ctx,
            volume,
            EventType::Normal,
            "DataRetained",
            "reclaim policy Retain: the data is kept",
        )
        .await;
        return Ok(Cleanup::Done);
    }
    if volume
        .annotations()
        .get(ANNOTATION_ABANDON_DATA)
        .is_some_and(|v| v == "true")
    {
        warn!(volume = %name, "data abandoned by annotation; not removed");
        publish(
            ctx,
            volume,
            EventType::Warning,
            "DataAbandoned",
            &format!("{ANNOTATION_ABANDON_DATA}=true: the Volume goes without its data being removed; any data left stays under {}", volume.spec.backend.root),
        )
        .await;
        return Ok(Cleanup::Done);
    }
    if !ensure_attachment(volume, ctx).await? {
        return Ok(Cleanup::Pending(Action::requeue(Duration::from_millis(
            200,
        ))));
    }
    let va = Api::<VolumeAttachment>::all(ctx.client.clone())
        .get_opt(&name)
        .await
        .context(|| format!("reading VolumeAttachment {name}"))?;
    let Some(va) = va else {
        return Ok(Cleanup::Pending(Action::requeue(Duration::from_secs(1))));
    };
    let existing = va.spec.attachment_tickets.get(CLEANUP_TICKET);
    if let Some(ticket) = existing {
        // Satisfied means the node agent removed the data: only a Ready MountPod whose
        // task is RemoveData satisfies a cleanup ticket, never one serving the volume.
        if va.ticket_satisfied(CLEANUP_TICKET) {
            info!(volume = %name, node = %ticket.node_id, "data removed");
            publish(
                ctx,
                volume,
                EventType::Normal,
                "DataRemoved",
                &format!("data removed on node {}", ticket.node_id),
            )
            .await;
            return Ok(Cleanup::Done);
        }
        if ctx.node_exists(&ticket.node_id) || pinned(volume).is_some() {
            // Waiting for the node agent (or, for a node-local volume whose node is
            // gone, for the node or the abandon annotation: the ticket's status says
            // so); the VolumeAttachment's status change wakes us.
            return Ok(Cleanup::Pending(Action::requeue(Duration::from_secs(30))));
        }
        // Its node is gone: the data is removed elsewhere (a shared backend).
    }
    let Some(node) = cleanup_node(volume, ctx).await? else {
        publish(
            ctx,
            volume,
            EventType::Warning,
            "NoNodeForCleanup",
            &format!("no node runs the Tessera node agent (no CSINode lists {CSI_DRIVER_NAME}); the data cannot be removed yet"),
        )
        .await;
        return Ok(Cleanup::Pending(Action::requeue(Duration::from_secs(30))));
    };
    if existing.is_some_and(|t| t.node_id == node) {
        return Ok(Cleanup::Pending(Action::requeue(Duration::from_secs(30))));
    }
    let patch = AttachmentTicket::new(CLEANUP_TICKET, AttacherType::Cleanup, &node).upsert_patch();
    Api::<VolumeAttachment>::all(ctx.client.clone())
        .patch(&name, &merge_params(), &Patch::Merge(&patch))
        .await
        .context(|| format!("adding the cleanup ticket to {name}"))?;
    publish(
        ctx,
        volume,
        EventType::Normal,
        "RemovingData",
        &format!("cleanup ticket added for node {node}"),
    )
    .await;
    Ok(Cleanup::Pending(Action::requeue(Duration::from_secs(30))))
}

/// The node a node-local volume is pinned to, if any.
fn pinned(volume: &Volume) -> Option<&String> {
    match volume.spec.backend.scope {
        BackendScope::NodeLocal => volume.spec.backend.node.as_ref(),
        BackendScope::Shared => None,
    }
}

async fn cleanup_node(volume: &Volume, ctx: &Context) -> Result<Option<String>, Error> {
    if let Some(node) = pinned(volume) {
        // Even if that node is gone: the data is there and nowhere else.
        return Ok(Some(node.clone()));
    }
    let name = volume.name_any();
    let mut from_mounts: Vec<String> = ctx
        .caches
        .mountpods_of(&name)
        .iter()
        .filter(|mp| ctx.node_exists(&mp.spec.node_name))
        .map(|mp| mp.spec.node_name.clone())
        .collect();
    from_mounts.sort();
    if let Some(node) = from_mounts.into_iter().next() {
        return Ok(Some(node));
    }
    // Where it was last attached, if that Node still exists.
    if let Some(node) = volume
        .status
        .as_ref()
        .and_then(|s| s.last_attached_node.as_ref())
    {
        let exists = Api::<Node>::all(ctx.client.clone())
            .get_metadata_opt(node)
            .await
            .context(|| format!("reading Node {node}"))?
            .is_some();
        if exists {
            return Ok(Some(node.clone()));
        }
    }
    let csinodes = Api::<CSINode>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await
        .context(|| "listing CSINodes".to_string())?;
    Ok(first_agent_node(&csinodes.items, &ctx.labels))
}

/// The first (by name) node whose CSINode lists the Tessera driver, preferring the
/// CSINodes that carry all of `labels` (the controller's `--watch-selector`): an agent
/// scoped to other labels would never serve the cleanup MountPod of this controller's
/// volumes.
pub(crate) fn first_agent_node(csinodes: &[CSINode], labels: &Labels) -> Option<String> {
    let mut nodes: Vec<(bool, String)> = csinodes
        .iter()
        .filter(|n| n.spec.drivers.iter().any(|d| d.name == CSI_DRIVER_NAME))
        .map(|n| {
            let own = n.labels();
            let in_scope = labels.0.iter().all(|(k, v)| own.get(k) == Some(v));
            (!in_scope, n.name_any())
        })
        .collect();
    nodes.sort();
    nodes.into_iter().next().map(|(_, name)| name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn csinode(name: &str, labels: &[(&str, &str)], drivers: &[&str]) -> CSINode {
        let labels: std::collections::BTreeMap<&str, &str> = labels.iter().copied().collect();
        let drivers: Vec<serde_json::Value> = drivers
            .iter()
            .map(|d| json!({"name": d, "nodeID": name}))
            .collect();
        serde_json::from_value(json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
            "metadata": {"name": name, "labels": labels},
            "spec": {"drivers": drivers},
        }))
        .unwrap()
    }

    #[test]
    fn the_cleanup_node_is_an_agent_node_in_the_controllers_scope_first() {
        let nodes = vec![
            csinode("a-other-driver", &[], &["other.csi.io"]),
            csinode(
                "b-other-scope",
                &[("tessera.io/test", "t2")],
                &[CSI_DRIVER_NAME],
            ),
            csinode("c-unlabelled", &[], &[CSI_DRIVER_NAME]),
            csinode(
                "d-mine",
                &[("tessera.io/test", "t1"), ("x", "y")],
                &[CSI_DRIVER_NAME],
            ),
        ];
        let scope = |pairs: &[(&str, &str)]| {
            Labels(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
        };
        // No scope: the first node with the driver, as before.
        assert_eq!(
            first_agent_node(&nodes, &Labels::default()).as_deref(),
            Some("b-other-scope")
        );
        // Scoped: its own node, though others sort first.
        assert_eq!(
            first_agent_node(&nodes, &scope(&[("tessera.io/test", "t1")])).as_deref(),
            Some("d-mine")
        );
        // Scoped, but no node of its own: any node with the driver.
        assert_eq!(
            first_agent_node(&nodes, &scope(&[("tessera.io/test", "t3")])).as_deref(),
            Some("b-other-scope")
        );
        assert_eq!(first_agent_node(&nodes[..1], &Labels::default()), None);
    }
}
