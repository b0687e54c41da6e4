//! MountPods made to match a decision: deleted on the nodes it dropped, applied (SSA,
//! only the fields the controller owns) on the nodes it chose; detach before attach.
//!
//! ```text
//!  Decision.nodes ─┬─ MountPod on another node ─▶ delete (+ Event Detaching)
//!                  └─ chosen node ─▶ desired_spec ─▶ same as now? skip
//!                                                    other task? delete, re-create later
//!                                                    else apply (+ Event Attaching or
//!                                                    RemovingData, per node)
//! ```
//!
//! Every write is remembered in the Context's `written_mountpods` until the cache
//! shows it.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::info;

use crate::api::{
    self, LABEL_NODE, LABEL_VOLUME, MountPod, MountPodSpec, MountTask, Volume, VolumeAttachment,
};
use crate::controller::events::publish_node;
use crate::controller::{Context, Error, FIELD_MANAGER, KubeContext, Labels};
use crate::tickets::Decision;

/// What [`sync_mountpods`] did.
#[derive(Default)]
pub(super) struct Synced {
    /// A MountPod was created or changed.
    pub created: bool,
    /// A MountPod was deleted.
    pub deleted: bool,
}

/// Make the MountPods match the decision: detach (delete) before attach (create).
pub(super) async fn sync_mountpods(
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
                Err(e) => Err(e).context(|| format!("deleting MountPod {mp_name}"))?,
            };
            ctx.metrics.write("MountPod", "delete");
            ctx.written_mountpods
                .record(&name, &mp_name, mp.resource_version(), after);
            synced.deleted = true;
            info!(volume = %name, node = %mp.spec.node_name, "detaching");
            publish_node(
                ctx,
                volume,
                Some(va),
                "Detaching",
                &mp.spec.node_name,
                &format!("detaching from node {}", mp.spec.node_name),
            );
        }
    }
    if !decision.nodes.is_empty()
        && let Err(e) = ctx.allowed_roots.check_root(&volume.spec.backend.root)
    {
        // The volume controller refuses such a Volume; never a MountPod for it.
        return Err(Error::InvalidVolume {
            volume: name.clone(),
            message: e.to_string(),
        });
    }
    for (node, mount) in &decision.nodes {
        let task = if mount.removes_data {
            MountTask::RemoveData
        } else {
            MountTask::Serve
        };
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
                ctx.written_mountpods
                    .record(&name, &mp.name_any(), mp.resource_version(), after);
                synced.deleted = true;
                continue;
            }
            Some(mp) if same_controlled_fields(&mp.spec, &desired) => continue,
            _ => {}
        }
        let mp_name = api::mountpod_name(&name, node);
        let body = apply_body(volume, &ctx.labels, &desired);
        let written = api
            .patch(
                &mp_name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await
            .context(|| format!("applying MountPod {mp_name}"))?;
        ctx.metrics.write("MountPod", "apply");
        ctx.written_mountpods.record(
            &name,
            &mp_name,
            existing.and_then(|mp| mp.resource_version()),
            Some(Arc::new(written)),
        );
        synced.created = true;
        if existing.is_none() {
            info!(volume = %name, %node, ?task, "attaching");
            let (reason, what) = match task {
                MountTask::Serve => ("Attaching", format!("attaching to node {node}")),
                MountTask::RemoveData => (
                    "RemovingData",
                    format!("removing the volume's data on node {node}"),
                ),
            };
            publish_node(ctx, volume, Some(va), reason, node, &what);
        }
    }
    Ok(synced)
}

/// The server-side apply body of the MountPod `desired` of `volume`: only the fields
/// the controller owns, never `references` (the CSI node's), with the watch `labels`
/// and the node and volume labels.
pub(super) fn apply_body(
    volume: &Volume,
    labels: &Labels,
    desired: &MountPodSpec,
) -> serde_json::Value {
    let name = volume.name_any();
    let mp_name = api::mountpod_name(&name, &desired.node_name);
    let mut labels = labels.0.clone();
    labels.insert(LABEL_NODE.into(), desired.node_name.clone());
    labels.insert(LABEL_VOLUME.into(), name);
    let owner = owner_reference(volume);
    json!({
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
            "sharedBackend": desired.shared_backend,
            "mountOptions": desired.mount_options,
        }
    })
}

/// Whether two specs agree on every field the controller sets (so no apply is due).
pub(super) fn same_controlled_fields(a: &MountPodSpec, b: &MountPodSpec) -> bool {
    a.source == b.source
        && a.capacity_bytes == b.capacity_bytes
        && a.read_only == b.read_only
        && a.shared_backend == b.shared_backend
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
    let capacity = api::quantity_bytes(&volume.spec.size.0)
        .map_err(|e| e.to_string())
        .and_then(|c| i64::try_from(c).map_err(|_| "size too large".to_string()));
    let capacity = match (capacity, task) {
        (Ok(c), _) => c,
        // Removing the data needs no size: a Volume whose size cannot be served can
        // still be deleted.
        (Err(_), MountTask::RemoveData) => 0,
        (Err(message), MountTask::Serve) => {
            return Err(Error::InvalidVolume {
                volume: name.clone(),
                message,
            });
        }
    };
    let root = volume.spec.backend.root.trim_end_matches('/');
    Ok(MountPodSpec {
        volume: name.clone(),
        node_name: node.to_string(),
        source: format!("{root}/{name}"),
        task,
        capacity_bytes: capacity,
        read_only,
        shared_backend: volume.spec.backend.scope == api::BackendScope::Shared,
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
