//! The CSI Node service, served by `tessera node`: binds this node's FUSE mount of a
//! volume (its MountPod's mount point) into kubelet's staging and target paths, and
//! records each target as a reference on the MountPod, so the agent can re-bind it
//! after repairing a broken mount and refuses to unmount while it is in use.
//!
//! ```text
//!  NodeStage:   MountPod Ready? ──▶ bind <mount point> ─▶ <staging path>
//!  NodePublish: bind <staging path> ─▶ <target path> (ro if asked) ──▶ reference added
//!  NodeUnpublish: unmount + remove target ──▶ reference removed
//!  NodeUnstage: unmount staging
//! ```
//!
//! Every path in a request is checked by [`super::paths::validate`]: absolute, no
//! `..`, under the kubelet directory, no symlinks. References are written with a
//! merge patch that carries the MountPod's resourceVersion, so two concurrent
//! publishes of one volume cannot lose each other's reference (a conflict is retried).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tonic::{Request, Response, Status};
use tracing::{info, instrument, warn};

use super::proto::node_server::Node;
use super::proto::node_service_capability::{self, rpc};
use super::proto::volume_capability::AccessType;
use super::proto::*;
use super::{InFlight, TOPOLOGY_NODE_KEY};
use crate::api::{self, MountPod, MountReference, Volume};
use crate::node::mounts::{Mounts, Probe};

/// Field manager of the references the Node service writes.
pub const FIELD_MANAGER: &str = "tessera-csi-node";

/// The Node service of one node.
#[derive(Clone)]
pub struct NodeService {
    client: Client,
    node_name: String,
    kubelet_dir: PathBuf,
    mounts: Arc<dyn Mounts>,
    inflight: InFlight,
}

impl NodeService {
    /// The Node service of `node_name`, accepting paths under `kubelet_dir`.
    pub fn new(
        client: Client,
        node_name: String,
        kubelet_dir: PathBuf,
        mounts: Arc<dyn Mounts>,
    ) -> Self {
        NodeService {
            client,
            node_name,
            kubelet_dir,
            mounts,
            inflight: InFlight::default(),
        }
    }

    fn path(&self, field: &'static str, p: &str) -> Result<PathBuf, Status> {
        super::paths::validate(field, p, &self.kubelet_dir)
            .map_err(|e| Status::invalid_argument(e.to_string()))
    }

    async fn volume_exists(&self, volume_id: &str) -> Result<bool, Status> {
        Api::<Volume>::all(self.client.clone())
            .get_opt(volume_id)
            .await
            .map(|v| v.is_some())
            .map_err(|e| Status::unavailable(format!("reading volume {volume_id}: {e}")))
    }

    async fn mountpod(&self, volume_id: &str) -> Result<Option<MountPod>, Status> {
        let name = api::mountpod_name(volume_id, &self.node_name);
        Api::<MountPod>::all(self.client.clone())
            .get_opt(&name)
            .await
            .map_err(|e| Status::unavailable(format!("reading MountPod {name}: {e}")))
    }

    /// Whether `target` has a mount whose device is the same as `of` (a bind of it).
    fn bound(&self, target: &Path, of: &Path) -> Result<Option<bool>, Status> {
        let table = self
            .mounts
            .table()
            .map_err(|e| Status::internal(e.to_string()))?;
        let source_dev = table
            .iter()
            .rev()
            .find(|m| m.mount_point == of)
            .map(|m| m.dev.clone());
        let at = table.iter().rev().find(|m| m.mount_point == target);
        Ok(match (at, source_dev) {
            (Some(m), Some(dev)) => Some(m.dev == dev),
            (Some(_), None) => Some(false),
            (None, _) => None,
        })
    }

    /// Add or remove the reference of `target` on the volume's MountPod.
    async fn set_reference(
        &self,
        volume_id: &str,
        target: &Path,
        add: Option<(String, bool)>,
    ) -> Result<(), Status> {
        let api: Api<MountPod> = Api::all(self.client.clone());
        let name = api::mountpod_name(volume_id, &self.node_name);
        let target = target.display().to_string();
        for _ in 0..5 {
            let Some(mp) = api
                .get_opt(&name)
                .await
                .map_err(|e| Status::unavailable(e.to_string()))?
            else {
                return match add {
                    Some(_) => Err(Status::failed_precondition(format!(
                        "MountPod {name} is gone"
                    ))),
                    None => Ok(()),
                };
            };
            let mut refs = mp.spec.references.clone();
            refs.retain(|r| r.target_path != target);
            if let Some((owner, read_only)) = &add {
                refs.push(MountReference {
                    target_path: target.clone(),
                    owner: owner.clone(),
                    read_only: *read_only,
                });
            }
            if refs == mp.spec.references {
                return Ok(());
            }
            let patch = json!({
                "metadata": {"resourceVersion": mp.resource_version()},
                "spec": {"references": refs},
            });
            let params = PatchParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..Default::default()
            };
            match api.patch(&name, &params, &Patch::Merge(&patch)).await {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => {
                    return Err(Status::unavailable(format!(
                        "updating references of {name}: {e}"
                    )));
                }
            }
        }
        Err(Status::aborted(format!(
            "MountPod {name} kept changing; retry"
        )))
    }

    fn unmount_and_remove(&self, target: &Path, remove_dir: bool) -> Result<(), Status> {
        // Unmount every layer stacked on the target, then remove the directory.
        self.mounts
            .unmount_all_lazy(target, 16)
            .map_err(|e| Status::internal(e.to_string()))?;
        if remove_dir {
            match std::fs::remove_dir(target) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(Status::internal(format!(
                        "removing {}: {e}",
                        target.display()
                    )));
                }
            }
        }
        Ok(())
    }
}

fn check_capability(cap: Option<&VolumeCapability>) -> Result<(), Status> {
    let cap = cap.ok_or_else(|| Status::invalid_argument("volume_capability is required"))?;
    if let Some(AccessType::Block(_)) = cap.access_type {
        return Err(Status::invalid_argument(
            "block volumes are not supported: Tessera serves filesystems",
        ));
    }
    if cap.access_mode.is_none() {
        return Err(Status::invalid_argument(
            "volume_capability.access_mode is required",
        ));
    }
    Ok(())
}

fn mkdir(p: &Path) -> Result<(), Status> {
    std::fs::create_dir_all(p)
        .map_err(|e| Status::internal(format!("creating {}: {e}", p.display())))
}

#[tonic::async_trait]
impl Node for NodeService {
    #[instrument(skip_all, fields(volume = %req.get_ref().volume_id))]
    async fn node_stage_volume(
        &self,
        req: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        let req = req.into_inner();
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        if req.staging_target_path.is_empty() {
            return Err(Status::invalid_argument("staging_target_path is required"));
        }
        check_capability(req.volume_capability.as_ref())?;
        let staging = self.path("staging_target_path", &req.staging_target_path)?;
        let _guard = self.inflight.start(&req.volume_id)?;
        if !self.volume_exists(&req.volume_id).await? {
            return Err(Status::not_found(format!(
                "volume {} not found",
                req.volume_id
            )));
        }
        let mp = self.mountpod(&req.volume_id).await?.ok_or_else(|| {
            Status::failed_precondition(format!(
                "volume {} is not attached to node {}",
                req.volume_id, self.node_name
            ))
        })?;
        if !mp.is_ready() {
            let status = mp.status.clone().unwrap_or_default();
            return Err(Status::failed_precondition(format!(
                "the mount of volume {} on node {} is not ready (phase {:?}{})",
                req.volume_id,
                self.node_name,
                status.phase,
                status
                    .last_error
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default()
            )));
        }
        let mount_point = PathBuf::from(
            mp.status
                .as_ref()
                .and_then(|s| s.mount_point.clone())
                .ok_or_else(|| Status::unavailable("MountPod has no mount point yet"))?,
        );
        match self.bound(&staging, &mount_point)? {
            Some(true) => return Ok(Response::new(NodeStageVolumeResponse {})),
            Some(false) => {
                return Err(Status::already_exists(format!(
                    "{} is mounted, but not from volume {}",
                    staging.display(),
                    req.volume_id
                )));
            }
            None => {}
        }
        mkdir(&staging)?;
        self.mounts
            .bind(&mount_point, &staging, false)
            .map_err(|e| Status::internal(e.to_string()))?;
        info!(staging = %staging.display(), "staged");
        Ok(Response::new(NodeStageVolumeResponse {}))
    }

    #[instrument(skip_all, fields(volume = %req.get_ref().volume_id))]
    async fn node_unstage_volume(
        &self,
        req: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        let req = req.into_inner();
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        if req.staging_target_path.is_empty() {
            return Err(Status::invalid_argument("staging_target_path is required"));
        }
        let staging = self.path("staging_target_path", &req.staging_target_path)?;
        let _guard = self.inflight.start(&req.volume_id)?;
        self.unmount_and_remove(&staging, false)?;
        Ok(Response::new(NodeUnstageVolumeResponse {}))
    }

    #[instrument(skip_all, fields(volume = %req.get_ref().volume_id))]
    async fn node_publish_volume(
        &self,
        req: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let req = req.into_inner();
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        if req.target_path.is_empty() {
            return Err(Status::invalid_argument("target_path is required"));
        }
        check_capability(req.volume_capability.as_ref())?;
        if req.staging_target_path.is_empty() {
            return Err(Status::invalid_argument(
                "staging_target_path is required: the driver stages volumes (STAGE_UNSTAGE_VOLUME)",
            ));
        }
        let target = self.path("target_path", &req.target_path)?;
        let staging = self.path("staging_target_path", &req.staging_target_path)?;
        let _guard = self.inflight.start(&req.volume_id)?;
        if !self.volume_exists(&req.volume_id).await? {
            return Err(Status::not_found(format!(
                "volume {} not found",
                req.volume_id
            )));
        }
        if !matches!(
            self.mounts.probe(&staging, Duration::from_secs(5)),
            Probe::Answers { .. }
        ) {
            return Err(Status::failed_precondition(format!(
                "volume {} is not staged at {}",
                req.volume_id,
                staging.display()
            )));
        }
        let owner = req
            .volume_context
            .get("csi.storage.k8s.io/pod.uid")
            .map(|uid| format!("pod/{uid}"))
            .unwrap_or_else(|| format!("csi/{}", req.volume_id));
        match self.bound(&target, &staging)? {
            Some(true) => {}
            Some(false) => {
                return Err(Status::already_exists(format!(
                    "{} is mounted from something else",
                    target.display()
                )));
            }
            None => {
                mkdir(&target)?;
                self.mounts
                    .bind(&staging, &target, req.readonly)
                    .map_err(|e| Status::internal(e.to_string()))?;
            }
        }
        if let Err(e) = self
            .set_reference(&req.volume_id, &target, Some((owner, req.readonly)))
            .await
        {
            // Without its reference the mount could be torn down under the pod: undo.
            warn!(error = %e, "recording the reference failed; unpublishing");
            let _ = self.unmount_and_remove(&target, true);
            return Err(e);
        }
        info!(target = %target.display(), read_only = req.readonly, "published");
        Ok(Response::new(NodePublishVolumeResponse {}))
    }

    #[instrument(skip_all, fields(volume = %req.get_ref().volume_id))]
    async fn node_unpublish_volume(
        &self,
        req: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let req = req.into_inner();
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        if req.target_path.is_empty() {
            return Err(Status::invalid_argument("target_path is required"));
        }
        let target = self.path("target_path", &req.target_path)?;
        let _guard = self.inflight.start(&req.volume_id)?;
        self.unmount_and_remove(&target, true)?;
        self.set_reference(&req.volume_id, &target, None).await?;
        info!(target = %target.display(), "unpublished");
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        req: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        let req = req.into_inner();
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        if req.volume_path.is_empty() {
            return Err(Status::invalid_argument("volume_path is required"));
        }
        if !self.volume_exists(&req.volume_id).await? {
            return Err(Status::not_found(format!(
                "volume {} not found",
                req.volume_id
            )));
        }
        // Only paths under the kubelet directory are looked at; any other is no path of
        // this volume.
        let path = self
            .path("volume_path", &req.volume_path)
            .map_err(|e| Status::not_found(e.message().to_string()))?;
        // A probe tells a missing path from a broken mount (both fail a plain stat).
        if matches!(
            self.mounts.probe(&path, Duration::from_secs(2)),
            Probe::Missing
        ) {
            return Err(Status::not_found(format!(
                "{} does not exist",
                path.display()
            )));
        }
        let probe_path = path.clone();
        let stats = tokio::task::spawn_blocking(move || nix::sys::statvfs::statvfs(&probe_path))
            .await
            .map_err(|e| Status::internal(e.to_string()))?;
        let (usage, condition) = match stats {
            Ok(s) => {
                let frag = s.fragment_size();
                let total = s.blocks() * frag;
                let available = s.blocks_available() * frag;
                let used = total.saturating_sub(s.blocks_free() * frag);
                let i = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
                (
                    vec![
                        VolumeUsage {
                            available: i(available),
                            total: i(total),
                            used: i(used),
                            unit: volume_usage::Unit::Bytes as i32,
                        },
                        VolumeUsage {
                            available: i(s.files_available()),
                            total: i(s.files()),
                            used: i(s.files().saturating_sub(s.files_free())),
                            unit: volume_usage::Unit::Inodes as i32,
                        },
                    ],
                    VolumeCondition {
                        abnormal: false,
                        message: "mount answers".into(),
                    },
                )
            }
            Err(errno) => (
                vec![],
                VolumeCondition {
                    abnormal: true,
                    message: format!("the FUSE mount does not answer: {errno}"),
                },
            ),
        };
        Ok(Response::new(NodeGetVolumeStatsResponse {
            usage,
            volume_condition: Some(condition),
        }))
    }

    async fn node_expand_volume(
        &self,
        req: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        let req = req.into_inner();
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        if req.volume_path.is_empty() {
            return Err(Status::invalid_argument("volume_path is required"));
        }
        let volume = Api::<Volume>::all(self.client.clone())
            .get_opt(&req.volume_id)
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?
            .ok_or_else(|| Status::not_found(format!("volume {} not found", req.volume_id)))?;
        self.path("volume_path", &req.volume_path)
            .map_err(|e| Status::not_found(e.message().to_string()))?;
        // The quota grows online when the controller raises spec.size: nothing to do here.
        let bytes = api::quantity_bytes(&volume.spec.size.0)
            .map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(NodeExpandVolumeResponse {
            capacity_bytes: i64::try_from(bytes).unwrap_or(i64::MAX),
        }))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        let capabilities = [
            rpc::Type::StageUnstageVolume,
            rpc::Type::GetVolumeStats,
            rpc::Type::VolumeCondition,
            rpc::Type::ExpandVolume,
        ]
        .into_iter()
        .map(|t| NodeServiceCapability {
            r#type: Some(node_service_capability::Type::Rpc(
                node_service_capability::Rpc { r#type: t as i32 },
            )),
        })
        .collect();
        Ok(Response::new(NodeGetCapabilitiesResponse { capabilities }))
    }

    async fn node_get_info(
        &self,
        _: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        let segments: HashMap<String, String> =
            [(TOPOLOGY_NODE_KEY.to_string(), self.node_name.clone())].into();
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.node_name.clone(),
            max_volumes_per_node: 0,
            accessible_topology: Some(Topology { segments }),
        }))
    }
}
