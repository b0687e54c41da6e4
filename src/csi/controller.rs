//! The CSI Controller service: volumes become `Volume` objects, publishes become
//! `csi-attacher` tickets.
//!
//! ControllerPublishVolume upserts the ticket (an identical ticket is not written
//! again, so repeated calls change nothing), then waits — by watch, not by polling —
//! until the ticket's status says satisfied for its generation, bounded by
//! `publish_timeout` (below the external-attacher's 15 s call timeout). While the
//! ticket is blocked the error carries its reason and message, so `kubectl describe` of
//! the storage.k8s.io VolumeAttachment says why. The driver never arbitrates.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::{Client, ResourceExt};
use serde_json::json;
use sha2::{Digest, Sha256};
use tonic::{Request, Response, Status};
use tracing::{info, instrument, warn};

use super::proto::controller_server::Controller;
use super::proto::controller_service_capability::{self, rpc};
use super::proto::volume_capability::{AccessType, access_mode};
use super::proto::*;
use super::{InFlight, TOPOLOGY_NODE_KEY, csi_ticket_id};
use crate::api::{
    self, AccessMode, AttacherType, AttachmentTicket, BackendScope, TicketReason, Volume,
    VolumeAttachment, tickets_removal_patch,
};

/// Annotation on a Volume with the CSI name it was created for.
pub const ANNOTATION_CSI_NAME: &str = "tessera.io/csi-name";
/// Field manager of the CSI controller's writes.
pub const FIELD_MANAGER: &str = "tessera-csi-controller";

/// Parameters of the service's merge patches (its field manager, so `managedFields`
/// tell who wrote what).
fn merge_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}
/// Default size when a request names none.
pub const DEFAULT_SIZE: u64 = 1 << 30;

/// Settings of the Controller service.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Backend root for volumes whose StorageClass names none (`backendRoot` parameter).
    pub default_backend_root: String,
    /// How long ControllerPublish waits for its ticket.
    pub publish_timeout: Duration,
    /// How long ControllerUnpublish waits for the detach.
    pub unpublish_timeout: Duration,
    /// Capacity reported by GetCapacity; `None`: the free space of the default backend
    /// root as seen from the controller, if it can see it.
    pub capacity_bytes: Option<u64>,
    /// Labels put on every Volume created, and required of every Volume listed (the
    /// controller's `--watch-selector`, so one instance sees only its own volumes).
    pub labels: crate::labels::Labels,
}

/// The Controller service.
#[derive(Clone)]
pub struct ControllerService {
    client: Client,
    settings: Settings,
    inflight: InFlight,
}

impl ControllerService {
    /// A Controller service using `client`.
    pub fn new(client: Client, settings: Settings) -> Self {
        ControllerService {
            client,
            settings,
            inflight: InFlight::default(),
        }
    }

    fn volumes(&self) -> Api<Volume> {
        Api::all(self.client.clone())
    }

    fn attachments(&self) -> Api<VolumeAttachment> {
        Api::all(self.client.clone())
    }
}

fn kube_status(action: &str, e: kube::Error) -> Status {
    match &e {
        kube::Error::Api(s) if s.code == 404 => {
            Status::not_found(format!("{action}: {}", s.message))
        }
        kube::Error::Api(s) if s.code == 409 => Status::aborted(format!("{action}: {}", s.message)),
        kube::Error::Api(s) if s.code == 422 || s.code == 400 => {
            Status::invalid_argument(format!("{action}: {}", s.message))
        }
        _ => Status::unavailable(format!("{action}: {e}")),
    }
}

/// The Volume object name for a CSI volume name: the name itself when it is a valid
/// object name, else `vol-` and a hash of it (csi-sanity uses spaces and capitals).
pub fn volume_name(csi_name: &str) -> String {
    let valid = !csi_name.is_empty()
        && csi_name.len() <= 253
        && csi_name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    if valid {
        csi_name.to_string()
    } else {
        format!(
            "vol-{}",
            &hex::encode(Sha256::digest(csi_name.as_bytes()))[..40]
        )
    }
}

/// The Volume access mode a CSI capability asks for.
pub fn access_mode_of(cap: &VolumeCapability) -> Result<AccessMode, Status> {
    if let Some(AccessType::Block(_)) = cap.access_type {
        return Err(Status::invalid_argument(
            "block volumes are not supported: Tessera serves filesystems (access type mount)",
        ));
    }
    let mode = cap.access_mode.as_ref().map(|m| m.mode).unwrap_or(0);
    match access_mode::Mode::try_from(mode) {
        Ok(access_mode::Mode::SingleNodeWriter) | Ok(access_mode::Mode::SingleNodeMultiWriter) => {
            Ok(AccessMode::ReadWriteOnce)
        }
        Ok(access_mode::Mode::SingleNodeSingleWriter) => Ok(AccessMode::ReadWriteOncePod),
        Ok(access_mode::Mode::SingleNodeReaderOnly) => Ok(AccessMode::ReadWriteOnce),
        Ok(access_mode::Mode::MultiNodeReaderOnly) => Ok(AccessMode::ReadOnlyMany),
        Ok(access_mode::Mode::MultiNodeMultiWriter) => Ok(AccessMode::ReadWriteMany),
        Ok(access_mode::Mode::MultiNodeSingleWriter) => Err(Status::invalid_argument(
            "access mode MULTI_NODE_SINGLE_WRITER is not supported; use MULTI_NODE_MULTI_WRITER or a single-node mode",
        )),
        _ => Err(Status::invalid_argument(
            "volume capability has no access mode",
        )),
    }
}

/// Whether a volume of `mode` can serve capability `cap`.
fn compatible(mode: AccessMode, cap: &VolumeCapability) -> Result<(), String> {
    let want = access_mode_of(cap).map_err(|s| s.message().to_string())?;
    let ok = match mode {
        AccessMode::ReadWriteMany => true,
        AccessMode::ReadOnlyMany => want == AccessMode::ReadOnlyMany,
        AccessMode::ReadWriteOnce => matches!(
            want,
            AccessMode::ReadWriteOnce | AccessMode::ReadWriteOncePod
        ),
        AccessMode::ReadWriteOncePod => want == AccessMode::ReadWriteOncePod,
    };
    if ok {
        Ok(())
    } else {
        Err(format!("volume is {mode}; the capability asks for {want}"))
    }
}

fn size_for(range: Option<&CapacityRange>) -> Result<u64, Status> {
    let (required, limit) = range
        .map(|r| (r.required_bytes, r.limit_bytes))
        .unwrap_or((0, 0));
    if required < 0 || limit < 0 {
        return Err(Status::invalid_argument(
            "capacity range must not be negative",
        ));
    }
    let (required, limit) = (required as u64, limit as u64);
    if limit > 0 && required > limit {
        return Err(Status::out_of_range(format!(
            "required_bytes {required} exceeds limit_bytes {limit}"
        )));
    }
    Ok(match (required, limit) {
        (0, 0) => DEFAULT_SIZE,
        (0, l) => DEFAULT_SIZE.min(l),
        (r, _) => r,
    })
}

/// Bytes as the shortest exact Kubernetes quantity (`1Gi`, `500Mi`, `1000`), so
/// `kubectl get volumes` reads like the PVC that asked for it.
pub fn quantity_of(bytes: u64) -> String {
    for (suffix, unit) in [
        ("Ti", 1u64 << 40),
        ("Gi", 1 << 30),
        ("Mi", 1 << 20),
        ("Ki", 1 << 10),
    ] {
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{}{suffix}", bytes / unit);
        }
    }
    bytes.to_string()
}

fn topology_node(req: &CreateVolumeRequest) -> Option<String> {
    let reqs = req.accessibility_requirements.as_ref()?;
    reqs.preferred
        .iter()
        .chain(reqs.requisite.iter())
        .find_map(|t| t.segments.get(TOPOLOGY_NODE_KEY).cloned())
}

fn csi_volume(v: &Volume) -> Result<super::proto::Volume, Status> {
    let bytes = api::quantity_bytes(&v.spec.size.0).map_err(|e| Status::internal(e.to_string()))?;
    let mut ctx = std::collections::HashMap::new();
    ctx.insert("backendRoot".to_string(), v.spec.backend.root.clone());
    let topology = match (&v.spec.backend.scope, &v.spec.backend.node) {
        (BackendScope::NodeLocal, Some(node)) => {
            vec![Topology {
                segments: [(TOPOLOGY_NODE_KEY.to_string(), node.clone())].into(),
            }]
        }
        _ => vec![],
    };
    Ok(super::proto::Volume {
        capacity_bytes: i64::try_from(bytes).unwrap_or(i64::MAX),
        volume_id: v.name_any(),
        volume_context: ctx,
        content_source: None,
        accessible_topology: topology,
    })
}

fn ticket_blocked(va: &VolumeAttachment, id: &str) -> Option<(TicketReason, String)> {
    let (reason, message) = va.ticket_status(id)?.blocked_by()?;
    Some((reason, message.to_owned()))
}

fn satisfied(va: Option<&VolumeAttachment>, id: &str) -> bool {
    va.is_some_and(|va| va.ticket_satisfied(id))
}

/// Wait until `cond` holds for the object `from` is a version of: checked on `from`
/// itself, then on every change watched from `from`'s resourceVersion (no list first).
/// Falls back to a fresh list + watch when the server no longer has that version.
async fn await_from<K, F>(api: Api<K>, from: K, cond: F) -> Result<Option<K>, String>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    K: Sync,
    F: Fn(Option<&K>) -> bool + Send + Clone + 'static,
{
    use futures::TryStreamExt;
    use kube::api::WatchEvent;
    use kube::core::params::WatchParams;
    if cond(Some(&from)) {
        return Ok(Some(from));
    }
    let name = from.meta().name.clone().unwrap_or_default();
    let mut rv = from.meta().resource_version.clone().unwrap_or_default();
    let wp = WatchParams::default().fields(&format!("metadata.name={name}"));
    loop {
        let stream = api.watch(&wp, &rv).await.map_err(|e| e.to_string())?;
        futures::pin_mut!(stream);
        while let Some(event) = stream.try_next().await.map_err(|e| e.to_string())? {
            match event {
                WatchEvent::Added(o) | WatchEvent::Modified(o) => {
                    rv = o.meta().resource_version.clone().unwrap_or(rv);
                    if cond(Some(&o)) {
                        return Ok(Some(o));
                    }
                }
                WatchEvent::Deleted(o) => {
                    rv = o.meta().resource_version.clone().unwrap_or(rv);
                    if cond(None) {
                        return Ok(None);
                    }
                }
                WatchEvent::Bookmark(b) => rv = b.metadata.resource_version,
                // Too old (410 Gone) or any other watch error: list and watch afresh.
                WatchEvent::Error(_) => {
                    return await_condition(api, &name, cond)
                        .await
                        .map_err(|e| e.to_string());
                }
            }
        }
        // The server ended the watch (its timeout): resume from the last version.
    }
}

#[tonic::async_trait]
impl Controller for ControllerService {
    #[instrument(skip_all, fields(name = %req.get_ref().name))]
    async fn create_volume(
        &self,
        req: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        let req = req.into_inner();
        if req.name.is_empty() {
            return Err(Status::invalid_argument("name is required"));
        }
        if req.volume_capabilities.is_empty() {
            return Err(Status::invalid_argument("volume_capabilities are required"));
        }
        if req.volume_content_source.is_some() {
            return Err(Status::invalid_argument(
                "creating a volume from a snapshot or another volume is not supported",
            ));
        }
        let mut mode = access_mode_of(&req.volume_capabilities[0])?;
        for cap in &req.volume_capabilities[1..] {
            let m = access_mode_of(cap)?;
            if m.is_multi_node() && !mode.is_multi_node() || m == AccessMode::ReadWriteMany {
                mode = m;
            }
        }
        let size = size_for(req.capacity_range.as_ref())?;
        let mut root = self.settings.default_backend_root.clone();
        let mut scope = BackendScope::Shared;
        for (k, v) in &req.parameters {
            match k.as_str() {
                "backendRoot" => root = v.clone(),
                "scope" => {
                    scope = match v.as_str() {
                        "Shared" => BackendScope::Shared,
                        "NodeLocal" => BackendScope::NodeLocal,
                        other => {
                            return Err(Status::invalid_argument(format!(
                                "parameter scope must be Shared or NodeLocal, not {other:?}"
                            )));
                        }
                    }
                }
                k if k.starts_with("csi.storage.k8s.io/") => {}
                other => {
                    return Err(Status::invalid_argument(format!(
                        "unknown StorageClass parameter {other:?} (known: backendRoot, scope)"
                    )));
                }
            }
        }
        let mount_options: Vec<String> = req
            .volume_capabilities
            .iter()
            .filter_map(|c| match &c.access_type {
                Some(AccessType::Mount(m)) => Some(m.mount_flags.clone()),
                _ => None,
            })
            .flatten()
            .collect();
        let name = volume_name(&req.name);
        let _guard = self.inflight.start(&name)?;

        if let Some(existing) = self
            .volumes()
            .get_opt(&name)
            .await
            .map_err(|e| kube_status("reading volume", e))?
        {
            if existing.annotations().get(ANNOTATION_CSI_NAME) != Some(&req.name) {
                return Err(Status::already_exists(format!(
                    "a Volume named {name} exists for another request"
                )));
            }
            if existing.metadata.deletion_timestamp.is_some() {
                return Err(Status::aborted(format!(
                    "volume {name} is still being deleted"
                )));
            }
            let have = api::quantity_bytes(&existing.spec.size.0)
                .map_err(|e| Status::internal(e.to_string()))?;
            let limit = req
                .capacity_range
                .as_ref()
                .map(|r| r.limit_bytes as u64)
                .unwrap_or(0);
            let required = req
                .capacity_range
                .as_ref()
                .map(|r| r.required_bytes as u64)
                .unwrap_or(0);
            if have < required || (limit > 0 && have > limit) || existing.spec.access_mode != mode {
                return Err(Status::already_exists(format!(
                    "volume {} exists with size {have} bytes and access mode {}",
                    req.name, existing.spec.access_mode
                )));
            }
            return Ok(Response::new(CreateVolumeResponse {
                volume: Some(csi_volume(&existing)?),
            }));
        }
        let node = (scope == BackendScope::NodeLocal)
            .then(|| topology_node(&req))
            .flatten();
        let volume: Volume = serde_json::from_value(json!({
            "apiVersion": "tessera.io/v1alpha1", "kind": "Volume",
            "metadata": {"name": name, "annotations": {ANNOTATION_CSI_NAME: req.name}, "labels": self.settings.labels.0},
            "spec": {
                "size": quantity_of(size), "accessMode": mode,
                "backend": {"root": root, "scope": scope, "node": node},
                "mountOptions": mount_options,
            }
        }))
        .map_err(|e| Status::internal(e.to_string()))?;
        let created = self
            .volumes()
            .create(
                &PostParams {
                    field_manager: Some(FIELD_MANAGER.into()),
                    ..Default::default()
                },
                &volume,
            )
            .await
            .map_err(|e| kube_status("creating volume", e))?;
        info!(volume = %name, size, %mode, "created volume");
        Ok(Response::new(CreateVolumeResponse {
            volume: Some(csi_volume(&created)?),
        }))
    }

    #[instrument(skip_all, fields(volume = %req.get_ref().volume_id))]
    async fn delete_volume(
        &self,
        req: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        let req = req.into_inner();
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        let _guard = self.inflight.start(&req.volume_id)?;
        match self
            .volumes()
            .delete(&req.volume_id, &DeleteParams::default())
            .await
        {
            Ok(_) => {
                info!(volume = %req.volume_id, "deleting volume (its data is removed through a cleanup ticket)")
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            // An id that is no valid object name cannot name a Volume: nothing to delete.
            Err(kube::Error::Api(s)) if s.code == 400 || s.code == 422 => {}
            Err(e) => return Err(kube_status("deleting volume", e)),
        }
        Ok(Response::new(DeleteVolumeResponse {}))
    }

    #[instrument(skip_all, fields(volume = %req.get_ref().volume_id, node = %req.get_ref().node_id))]
    async fn controller_publish_volume(
        &self,
        req: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        let req = req.into_inner();
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        if req.node_id.is_empty() {
            return Err(Status::invalid_argument("node_id is required"));
        }
        let cap = req
            .volume_capability
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("volume_capability is required"))?;
        // The Volume, the Node and the VolumeAttachment, read at once (one round trip).
        let volumes = self.volumes();
        let nodes = Api::<Node>::all(self.client.clone());
        let api = self.attachments();
        let (volume, node, va) = tokio::join!(
            volumes.get_opt(&req.volume_id),
            nodes.get_opt(&req.node_id),
            api.get_opt(&req.volume_id),
        );
        let volume = volume
            .map_err(|e| kube_status("reading volume", e))?
            .ok_or_else(|| Status::not_found(format!("volume {} not found", req.volume_id)))?;
        node.map_err(|e| kube_status("reading node", e))?
            .ok_or_else(|| Status::not_found(format!("node {} not found", req.node_id)))?;
        compatible(volume.spec.access_mode, cap).map_err(Status::invalid_argument)?;
        let _guard = self.inflight.start(&req.volume_id)?;

        let id = csi_ticket_id(&req.volume_id, &req.node_id);
        let mut params = BTreeMap::new();
        params.insert("readOnly".to_string(), req.readonly.to_string());
        let va = match va.map_err(|e| kube_status("reading attachment", e))? {
            Some(va) => va,
            // A Volume created a moment ago may not have its VolumeAttachment yet (the
            // volume controller creates it): wait for it, within the publish timeout.
            None => {
                let exists = await_condition(
                    api.clone(),
                    &req.volume_id,
                    |va: Option<&VolumeAttachment>| va.is_some(),
                );
                match tokio::time::timeout(self.settings.publish_timeout, exists).await {
                    Ok(Ok(Some(va))) => va,
                    Ok(Ok(None)) | Err(_) => {
                        return Err(Status::unavailable(format!(
                            "volume {} has no VolumeAttachment yet (is the controller running?); retry",
                            req.volume_id
                        )));
                    }
                    Ok(Err(e)) => {
                        return Err(Status::unavailable(format!(
                            "watching VolumeAttachment {}: {e}",
                            req.volume_id
                        )));
                    }
                }
            }
        };
        let existing = va.spec.attachment_tickets.get(&id);
        let same = existing.is_some_and(|t| {
            t.node_id == req.node_id
                && t.type_ == AttacherType::CsiAttacher
                && t.parameters == params
        });
        // "Volume published but is incompatible" (CSI spec): the same volume on the same
        // node with other parameters is ALREADY_EXISTS; the caller unpublishes first.
        if let Some(t) = existing.filter(|_| !same) {
            return Err(Status::already_exists(format!(
                "volume {} is already published to node {} with parameters {:?}; unpublish it first",
                req.volume_id, t.node_id, t.parameters
            )));
        }
        let mut current = va.clone();
        if !same {
            let mut ticket = AttachmentTicket::new(&id, AttacherType::CsiAttacher, &req.node_id);
            ticket.parameters = params.clone();
            ticket.generation = existing.map(|t| t.generation + 1).unwrap_or(0);
            current = api
                .patch(
                    &req.volume_id,
                    &merge_params(),
                    &Patch::Merge(ticket.upsert_patch()),
                )
                .await
                .map_err(|e| kube_status("adding ticket", e))?;
            info!(ticket = %id, "ticket upserted");
        }
        // Watch from the version just read or written: no list round trip before the
        // watch, and no change after it can be missed.
        let wait = await_from(api.clone(), current, {
            let id = id.clone();
            move |va: Option<&VolumeAttachment>| satisfied(va, &id)
        });
        match tokio::time::timeout(self.settings.publish_timeout, wait).await {
            Ok(Ok(_)) => {
                let mp = api::mountpod_name(&req.volume_id, &req.node_id);
                let ctx = [("tessera.io/mountpod".to_string(), mp)].into();
                Ok(Response::new(ControllerPublishVolumeResponse {
                    publish_context: ctx,
                }))
            }
            Ok(Err(e)) => Err(Status::unavailable(format!("watching ticket {id}: {e}"))),
            Err(_) => {
                let va = api
                    .get(&req.volume_id)
                    .await
                    .map_err(|e| kube_status("reading attachment", e))?;
                let (reason, message) = ticket_blocked(&va, &id)
                    .unwrap_or((TicketReason::Attaching, "waiting for the controller".into()));
                let text = format!("ticket {id} not satisfied: {reason}: {message}");
                warn!(ticket = %id, %reason, "publish not done in time");
                Err(match reason {
                    TicketReason::HeldByOtherNode | TicketReason::NodeLocalElsewhere => {
                        Status::failed_precondition(text)
                    }
                    TicketReason::InvalidParameters => Status::invalid_argument(text),
                    _ => Status::deadline_exceeded(text),
                })
            }
        }
    }

    #[instrument(skip_all, fields(volume = %req.get_ref().volume_id, node = %req.get_ref().node_id))]
    async fn controller_unpublish_volume(
        &self,
        req: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        let req = req.into_inner();
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        let _guard = self.inflight.start(&req.volume_id)?;
        let api = self.attachments();
        let Some(va) = api
            .get_opt(&req.volume_id)
            .await
            .map_err(|e| kube_status("reading attachment", e))?
        else {
            return Ok(Response::new(ControllerUnpublishVolumeResponse {}));
        };
        // No node: unpublish from every node (CSI spec).
        let ids: Vec<String> = if req.node_id.is_empty() {
            va.spec
                .attachment_tickets
                .values()
                .filter(|t| t.type_ == AttacherType::CsiAttacher)
                .map(|t| t.id.clone())
                .collect()
        } else {
            vec![csi_ticket_id(&req.volume_id, &req.node_id)]
        };
        let present: Vec<&String> = ids
            .iter()
            .filter(|id| va.spec.attachment_tickets.contains_key(*id))
            .collect();
        if !present.is_empty() {
            let patch = tickets_removal_patch(present.iter().map(|id| id.as_str()));
            api.patch(&req.volume_id, &merge_params(), &Patch::Merge(&patch))
                .await
                .map_err(|e| kube_status("removing ticket", e))?;
            info!(tickets = ?present, "tickets removed");
        }
        // Detached when no ticket of ours is left and, for a named node that no other
        // ticket still wants, its MountPod is gone.
        let node = req.node_id.clone();
        let mp_name = (!node.is_empty()).then(|| api::mountpod_name(&req.volume_id, &node));
        let mps: Api<api::MountPod> = Api::all(self.client.clone());
        let wait = async {
            loop {
                let va = api
                    .get_opt(&req.volume_id)
                    .await
                    .map_err(|e| kube_status("reading attachment", e))?;
                let still_wanted = va.as_ref().is_some_and(|va| {
                    va.spec
                        .attachment_tickets
                        .values()
                        .any(|t| t.node_id == node)
                        || ids
                            .iter()
                            .any(|id| va.spec.attachment_tickets.contains_key(id))
                });
                let mp_gone = match &mp_name {
                    Some(n) => mps
                        .get_opt(n)
                        .await
                        .map_err(|e| kube_status("reading mountpod", e))?
                        .is_none(),
                    None => true,
                };
                if still_wanted || mp_gone {
                    return Ok::<(), Status>(());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        match tokio::time::timeout(self.settings.unpublish_timeout, wait).await {
            Ok(res) => res.map(|()| Response::new(ControllerUnpublishVolumeResponse {})),
            Err(_) => Err(Status::deadline_exceeded(format!(
                "the mount of volume {} on node {} is still being removed",
                req.volume_id, req.node_id
            ))),
        }
    }

    async fn validate_volume_capabilities(
        &self,
        req: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        let req = req.into_inner();
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        if req.volume_capabilities.is_empty() {
            return Err(Status::invalid_argument("volume_capabilities are required"));
        }
        let volume = self
            .volumes()
            .get_opt(&req.volume_id)
            .await
            .map_err(|e| kube_status("reading volume", e))?
            .ok_or_else(|| Status::not_found(format!("volume {} not found", req.volume_id)))?;
        let problems: Vec<String> = req
            .volume_capabilities
            .iter()
            .filter_map(|c| compatible(volume.spec.access_mode, c).err())
            .collect();
        let confirmed =
            problems
                .is_empty()
                .then(|| validate_volume_capabilities_response::Confirmed {
                    volume_context: req.volume_context.clone(),
                    volume_capabilities: req.volume_capabilities.clone(),
                    parameters: req.parameters.clone(),
                    mutable_parameters: req.mutable_parameters.clone(),
                });
        Ok(Response::new(ValidateVolumeCapabilitiesResponse {
            confirmed,
            message: problems.join("; "),
        }))
    }

    async fn list_volumes(
        &self,
        req: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        let req = req.into_inner();
        let start: usize = if req.starting_token.is_empty() {
            0
        } else {
            req.starting_token.parse().map_err(|_| {
                Status::aborted(format!(
                    "starting_token {:?} is not valid",
                    req.starting_token
                ))
            })?
        };
        let selector = self.settings.labels.selector();
        let mut volumes = self
            .volumes()
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| kube_status("listing volumes", e))?
            .items;
        // A Volume being deleted (its data being removed) is no longer a volume to list.
        volumes.retain(|v| v.metadata.deletion_timestamp.is_none());
        volumes.sort_by_key(|v| v.name_any());
        if start > volumes.len() {
            return Err(Status::aborted(format!(
                "starting_token {start} is past the end"
            )));
        }
        let max = if req.max_entries > 0 {
            req.max_entries as usize
        } else {
            usize::MAX
        };
        let page: Vec<&Volume> = volumes.iter().skip(start).take(max).collect();
        let next = start + page.len();
        // One list of the VolumeAttachments, not one read per volume: the
        // external-attacher calls this to reconcile every attachment it knows.
        let published: std::collections::HashMap<String, Vec<String>> = self
            .attachments()
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| kube_status("listing attachments", e))?
            .items
            .into_iter()
            .map(|va| {
                (
                    va.name_any(),
                    va.status.map(|s| s.nodes).unwrap_or_default(),
                )
            })
            .collect();
        let mut entries = vec![];
        for v in page {
            entries.push(list_volumes_response::Entry {
                volume: Some(csi_volume(v)?),
                status: Some(list_volumes_response::VolumeStatus {
                    published_node_ids: published.get(&v.name_any()).cloned().unwrap_or_default(),
                    volume_condition: None,
                }),
            });
        }
        let next_token = if next < volumes.len() {
            next.to_string()
        } else {
            String::new()
        };
        Ok(Response::new(ListVolumesResponse {
            entries,
            next_token,
        }))
    }

    async fn get_capacity(
        &self,
        _req: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        let available = match self.settings.capacity_bytes {
            Some(c) => c,
            None => nix::sys::statvfs::statvfs(self.settings.default_backend_root.as_str())
                .map(|s| s.blocks_available() * s.fragment_size())
                .unwrap_or(0),
        };
        Ok(Response::new(GetCapacityResponse {
            available_capacity: i64::try_from(available).unwrap_or(i64::MAX),
            maximum_volume_size: None,
            minimum_volume_size: None,
        }))
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        let capabilities = [
            rpc::Type::CreateDeleteVolume,
            rpc::Type::PublishUnpublishVolume,
            rpc::Type::ListVolumes,
            rpc::Type::ListVolumesPublishedNodes,
            rpc::Type::GetCapacity,
            rpc::Type::ExpandVolume,
            rpc::Type::PublishReadonly,
        ]
        .into_iter()
        .map(|t| ControllerServiceCapability {
            r#type: Some(controller_service_capability::Type::Rpc(
                controller_service_capability::Rpc { r#type: t as i32 },
            )),
        })
        .collect();
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities,
        }))
    }

    #[instrument(skip_all, fields(volume = %req.get_ref().volume_id))]
    async fn controller_expand_volume(
        &self,
        req: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        let req = req.into_inner();
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        let range = req
            .capacity_range
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("capacity_range is required"))?;
        let want = size_for(Some(range))?;
        let _guard = self.inflight.start(&req.volume_id)?;
        let volume = self
            .volumes()
            .get_opt(&req.volume_id)
            .await
            .map_err(|e| kube_status("reading volume", e))?
            .ok_or_else(|| Status::not_found(format!("volume {} not found", req.volume_id)))?;
        let have = api::quantity_bytes(&volume.spec.size.0)
            .map_err(|e| Status::internal(e.to_string()))?;
        if want > have {
            let patch = json!({"spec": {"size": quantity_of(want)}});
            self.volumes()
                .patch(&req.volume_id, &merge_params(), &Patch::Merge(&patch))
                .await
                .map_err(|e| kube_status("growing volume", e))?;
            info!(
                from = have,
                to = want,
                "volume expanded (the mounts' quota grows online)"
            );
        }
        Ok(Response::new(ControllerExpandVolumeResponse {
            capacity_bytes: i64::try_from(want.max(have)).unwrap_or(i64::MAX),
            node_expansion_required: false,
        }))
    }

    async fn create_snapshot(
        &self,
        _: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        Err(Status::unimplemented("snapshots are not supported"))
    }
    async fn delete_snapshot(
        &self,
        _: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        Err(Status::unimplemented("snapshots are not supported"))
    }
    async fn list_snapshots(
        &self,
        _: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        Err(Status::unimplemented("snapshots are not supported"))
    }
    async fn get_snapshot(
        &self,
        _: Request<GetSnapshotRequest>,
    ) -> Result<Response<GetSnapshotResponse>, Status> {
        Err(Status::unimplemented("snapshots are not supported"))
    }
    async fn controller_get_volume(
        &self,
        _: Request<ControllerGetVolumeRequest>,
    ) -> Result<Response<ControllerGetVolumeResponse>, Status> {
        Err(Status::unimplemented(
            "ControllerGetVolume is not supported",
        ))
    }
    async fn controller_modify_volume(
        &self,
        _: Request<ControllerModifyVolumeRequest>,
    ) -> Result<Response<ControllerModifyVolumeResponse>, Status> {
        Err(Status::unimplemented(
            "ControllerModifyVolume is not supported",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_names_from_csi_names() {
        assert_eq!(volume_name("pvc-1234"), "pvc-1234");
        let hashed = volume_name("sanity-Node Service-ABC");
        assert!(hashed.starts_with("vol-") && hashed.len() == 44, "{hashed}");
        assert_eq!(hashed, volume_name("sanity-Node Service-ABC"), "stable");
        assert_ne!(volume_name("-bad"), "-bad");
    }

    #[test]
    fn quantities_from_bytes() {
        assert_eq!(quantity_of(1 << 30), "1Gi");
        assert_eq!(quantity_of(3 << 29), "1536Mi");
        assert_eq!(quantity_of(1000), "1000");
        assert_eq!(
            api::quantity_bytes(&quantity_of(123_456_789)).unwrap(),
            123_456_789
        );
    }

    #[test]
    fn sizes_from_capacity_ranges() {
        let r = |req, lim| CapacityRange {
            required_bytes: req,
            limit_bytes: lim,
        };
        assert_eq!(size_for(None).unwrap(), DEFAULT_SIZE);
        assert_eq!(size_for(Some(&r(10, 0))).unwrap(), 10);
        assert_eq!(size_for(Some(&r(0, 100))).unwrap(), 100);
        assert_eq!(
            size_for(Some(&r(200, 100))).unwrap_err().code(),
            tonic::Code::OutOfRange
        );
    }

    #[test]
    fn capabilities_map_to_access_modes() {
        let cap = |m: access_mode::Mode| VolumeCapability {
            access_mode: Some(volume_capability::AccessMode { mode: m as i32 }),
            access_type: Some(AccessType::Mount(volume_capability::MountVolume::default())),
        };
        assert_eq!(
            access_mode_of(&cap(access_mode::Mode::SingleNodeWriter)).unwrap(),
            AccessMode::ReadWriteOnce
        );
        assert_eq!(
            access_mode_of(&cap(access_mode::Mode::MultiNodeMultiWriter)).unwrap(),
            AccessMode::ReadWriteMany
        );
        assert_eq!(
            access_mode_of(&cap(access_mode::Mode::SingleNodeSingleWriter)).unwrap(),
            AccessMode::ReadWriteOncePod
        );
        assert!(
            compatible(
                AccessMode::ReadWriteOnce,
                &cap(access_mode::Mode::MultiNodeMultiWriter)
            )
            .is_err()
        );
        assert!(
            compatible(
                AccessMode::ReadWriteMany,
                &cap(access_mode::Mode::SingleNodeWriter)
            )
            .is_ok()
        );
        let block = VolumeCapability {
            access_mode: Some(volume_capability::AccessMode {
                mode: access_mode::Mode::SingleNodeWriter as i32,
            }),
            access_type: Some(AccessType::Block(volume_capability::BlockVolume {})),
        };
        assert_eq!(
            access_mode_of(&block).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }
}
