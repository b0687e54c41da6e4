//! MountPods made to match a decision: deleted on the nodes it dropped, created (a
//! plain POST, cheaper for the API server than an apply) or changed (SSA, only the
//! fields the controller owns) on the nodes it chose; detach before attach.
//!
//! ```text
//!  Decision.nodes ─┬─ MountPod on another node ─▶ delete (a slow detach: `detaching`)
//!                  └─ chosen node ─▶ desired_spec ─▶ same as now? skip
//!                                                    other task? delete, re-create later
//!                                                    none? create (POST; exists after
//!                                                      all? apply) (+ Event RemovingData)
//!                                                    else apply
//! ```
//!
//! The Attaching and Attached Events are the Volume status's business (see
//! `status::node_changes`): a fast attach has only the second.
//!
//! Every write is remembered in the controller's `written_mountpods` until the cache
//! shows it.

use std::sync::Arc;

use futures::{StreamExt, TryStreamExt, stream};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tracing::info;

use tessera_api::CONTROLLER_FIELD_MANAGER;
use tessera_api::tickets::Decision;
use tessera_api::{
    self as api, LABEL_NODE, LABEL_VOLUME, MountPod, MountPodSpec, MountTask, Volume,
};

use super::Ctx;
use crate::events::publish_node;
use crate::owner::owner_reference;
use crate::{Error, KubeContext, Labels};

/// What `sync_mountpods` did.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Synced {
    /// A MountPod was created or changed.
    pub created: bool,
    /// A MountPod was deleted.
    pub deleted: bool,
}

/// Make the MountPods match the decision: detach (delete) before attach (create).
pub(super) async fn sync_mountpods(
    ctx: &Ctx,
    volume: &Volume,
    mountpods: &[Arc<MountPod>],
    decision: &Decision,
) -> Result<Synced, Error> {
    let api: Api<MountPod> = Api::all(ctx.shared.client.clone());
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
            ctx.state
                .written_mountpods
                .record(&name, &mp_name, mp.resource_version(), after);
            synced.deleted = true;
            info!(volume = %name, node = %mp.spec.node_name, "detaching");
        }
    }
    if !decision.nodes.is_empty()
        && let Err(e) = ctx
            .shared
            .allowed_roots
            .check_root(&volume.spec.backend.root)
    {
        // The volume controller refuses such a Volume; never a MountPod for it.
        return Err(Error::InvalidVolume {
            volume: name.clone(),
            message: e.to_string(),
        });
    }
    // A Shared volume's MountPods name its root's anchor (one per root, kept; the
    // caches are read only until it is proven).
    let anchor = match crate::anchor::shared_root(volume, &ctx.shared.allowed_roots) {
        Some(root) if !decision.nodes.is_empty() => {
            use crate::anchor;
            let allowed = &ctx.shared.allowed_roots;
            let holds = |a: &str| {
                let cached = ctx.shared.caches.mountpods.state();
                let all: Vec<&MountPod> = cached.iter().map(|m| m.as_ref()).collect();
                anchor::holds(&root, a, &all, allowed)
            };
            Some(ctx.shared.anchors.get_or_choose(&root, holds, || {
                let cached = ctx.shared.caches.mountpods.state();
                let all: Vec<&MountPod> = cached.iter().map(|m| m.as_ref()).collect();
                let failed = anchor::failed_anchors(&root, &all, allowed);
                let volumes = ctx.shared.caches.volumes.state();
                let volumes: Vec<&Volume> = volumes.iter().map(|v| v.as_ref()).collect();
                // A node that already holds this volume (a MountPod made before
                // anchors were) holds its data: it anchors the root before any other;
                // then the nodes chosen now.
                let candidates: Vec<&str> = all
                    .iter()
                    .filter(|m| m.spec.volume == name)
                    .map(|m| m.spec.node_name.as_str())
                    .chain(decision.nodes.keys().map(String::as_str))
                    .collect();
                anchor::choose(&root, &candidates, &failed, &volumes, &all, allowed)
            }))
        }
        _ => None,
    };
    let mut writes = Vec::new();
    for (node, mount) in &decision.nodes {
        let task = if mount.removes_data {
            MountTask::RemoveData
        } else if mount.populates {
            MountTask::Populate
        } else {
            MountTask::Serve
        };
        let mut desired = desired_spec(volume, node, mount.read_only, task)?;
        desired.shared_root_anchor = anchor.clone();
        let existing = mountpods.iter().find(|mp| &mp.spec.node_name == node);
        // Taken at creation only: the running daemon fences itself or not as it was
        // started (the failover decision reads the MountPod's, docs/failover.md).
        if let Some(mp) = existing {
            desired.self_fence = mp.spec.self_fence;
        }
        match existing {
            Some(mp) if mp.metadata.deletion_timestamp.is_some() => continue, // old one must go first
            Some(mp) if mp.spec.task != task => {
                let after = api
                    .delete(&mp.name_any(), &DeleteParams::default())
                    .await
                    .context(|| format!("replacing MountPod {}", mp.name_any()))?
                    .left()
                    .map(Arc::new);
                ctx.state.written_mountpods.record(
                    &name,
                    &mp.name_any(),
                    mp.resource_version(),
                    after,
                );
                synced.deleted = true;
                continue;
            }
            Some(mp) if same_controlled_fields(&mp.spec, &desired) => continue,
            _ => {}
        }
        writes.push((node, task, desired, existing));
    }
    // Creates and changes at once (an RWX volume may gain many nodes in one
    // reconcile), a bounded number in flight.
    // (The futures are made first: a stream that maps with a closure over borrowed
    // tuples is not `Send` for every lifetime, which the reconcile's future must be.)
    let writes: Vec<_> = writes
        .into_iter()
        .map(|(node, task, desired, existing)| {
            write_mountpod(ctx, &api, volume, node, task, desired, existing)
        })
        .collect();
    let written: Vec<()> = stream::iter(writes)
        .buffer_unordered(MAX_IN_FLIGHT)
        .try_collect()
        .await?;
    synced.created = !written.is_empty();
    Ok(synced)
}

/// How many MountPod writes of one reconcile are in flight at once.
const MAX_IN_FLIGHT: usize = 16;

/// Create (POST) or change (apply) the MountPod of `volume` on `node`, and remember
/// the write.
async fn write_mountpod(
    ctx: &Ctx,
    api: &Api<MountPod>,
    volume: &Volume,
    node: &str,
    task: MountTask,
    mut desired: MountPodSpec,
    existing: Option<&Arc<MountPod>>,
) -> Result<(), Error> {
    let name = volume.name_any();
    let mp_name = api::mountpod_name(&name, node);
    if existing.is_none() && desired.populate_from.is_some() {
        // The cache may not show the populated mark yet (its watch event can come
        // after the ticket's): read the Volume itself before a copy is ordered into
        // it, so data written since a fill is never replaced. (Once per fill.)
        let fresh = Api::<Volume>::all(ctx.shared.client.clone())
            .get(&name)
            .await
            .context(|| format!("reading Volume {name} before filling it"))?;
        if fresh.populated() {
            desired.populate_from = None;
        }
    }
    let body = apply_body(volume, &ctx.shared.labels, &desired);
    let created = match existing {
        None => {
            let body = create_body(body.clone(), ctx.shared.agent_registered(node));
            create(api, &mp_name, &body).await?
        }
        Some(_) => None,
    };
    let written = match created {
        Some(mp) => mp,
        None => api
            .patch(
                &mp_name,
                &PatchParams::apply(CONTROLLER_FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await
            .context(|| format!("applying MountPod {mp_name}"))?,
    };
    ctx.state
        .echoes
        .wrote("MountPod", &mp_name, written.resource_version());
    ctx.state.written_mountpods.record(
        &name,
        &mp_name,
        existing.and_then(|mp| mp.resource_version()),
        Some(Arc::new(written)),
    );
    if existing.is_none() {
        info!(volume = %name, %node, ?task, "attaching");
        if task == MountTask::RemoveData {
            let what = format!("removing the volume's data on node {node}");
            publish_node(&ctx.shared, volume, "RemovingData", node, &what);
        }
        if let (MountTask::Populate, Some(from)) = (task, &desired.populate_from) {
            let what = format!(
                "filling the volume on node {node} with a copy of volume {}",
                from.volume
            );
            publish_node(&ctx.shared, volume, "Populating", node, &what);
        }
    }
    Ok(())
}

/// The body that creates a MountPod: the apply body, with the node agent's finalizer
/// when the node has a registered agent, which would otherwise add it with a write of
/// its own before it mounts. (A node without an agent gets none: nothing would ever
/// remove it.)
pub(super) fn create_body(mut apply_body: serde_json::Value, agent: bool) -> serde_json::Value {
    if agent {
        apply_body["metadata"]["finalizers"] = json!([api::MOUNT_FINALIZER]);
    }
    apply_body
}

/// Create MountPod `name` from `body` with a POST; `None` if it exists already (the
/// cache did not show it yet): the caller applies instead.
async fn create(
    api: &Api<MountPod>,
    name: &str,
    body: &serde_json::Value,
) -> Result<Option<MountPod>, Error> {
    let mp: MountPod = serde_json::from_value(body.clone()).expect("a well-formed MountPod");
    let params = PostParams {
        field_manager: Some(CONTROLLER_FIELD_MANAGER.into()),
        ..Default::default()
    };
    match api.create(&params, &mp).await {
        Ok(mp) => Ok(Some(mp)),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(None),
        Err(e) => {
            let failed: Result<Option<MountPod>, kube::Error> = Err(e);
            Ok(failed.context(|| format!("creating MountPod {name}"))?)
        }
    }
}

/// The server-side apply body of the MountPod `desired` of `volume`: only the fields
/// the controller owns, never `references` (the CSI node's), with the watch `labels`
/// and the node and volume labels; and the Volume's claim annotations (the node
/// agent's per-volume metrics read them from the MountPod, `metrics::objects`).
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
    let mut body = json!({
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
            "sharedRootAnchor": desired.shared_root_anchor,
            "mountOptions": desired.mount_options,
            "resources": desired.resources,
            "attrCacheSeconds": desired.attr_cache_seconds,
        }
    });
    if desired.self_fence {
        body["spec"]["selfFence"] = json!(true);
    }
    if let Some(from) = &desired.populate_from {
        body["spec"]["populateFrom"] = json!(from);
    }
    let claim: std::collections::BTreeMap<_, _> =
        [api::ANNOTATION_PVC_NAME, api::ANNOTATION_PVC_NAMESPACE]
            .into_iter()
            .filter_map(|k| Some((k, volume.annotations().get(k)?)))
            .collect();
    if !claim.is_empty() {
        body["metadata"]["annotations"] = json!(claim);
    }
    body
}

/// Whether two specs agree on every field the controller sets (so no apply is due).
pub(super) fn same_controlled_fields(a: &MountPodSpec, b: &MountPodSpec) -> bool {
    a.source == b.source
        && a.capacity_bytes == b.capacity_bytes
        && a.read_only == b.read_only
        && a.shared_backend == b.shared_backend
        && a.shared_root_anchor == b.shared_root_anchor
        && a.mount_options == b.mount_options
        && a.task == b.task
        && a.resources == b.resources
        && a.attr_cache_seconds == b.attr_cache_seconds
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
        (Err(message), MountTask::Serve | MountTask::Populate) => {
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
        // Never again once filled: a restore ticket on a volume in use must not
        // replace its data (the agent refuses a Populate task without a source).
        populate_from: (task == MountTask::Populate && !volume.populated())
            .then(|| volume.spec.data_source.clone())
            .flatten(),
        capacity_bytes: capacity,
        read_only,
        shared_backend: volume.spec.backend.scope == api::BackendScope::Shared,
        // Set by `sync_mountpods` (the root's anchor).
        shared_root_anchor: None,
        mount_options: volume.spec.mount_options.clone(),
        references: vec![],
        retain_seconds: None,
        resources: volume.spec.mount_resources.clone(),
        attr_cache_seconds: volume.spec.attr_cache_seconds,
        // Its daemon fences itself: a single-writer volume that may leave a dead node.
        self_fence: !volume.spec.access_mode.is_multi_node()
            && volume.spec.node_failover == Some(api::NodeFailover::Fenced),
    })
}
