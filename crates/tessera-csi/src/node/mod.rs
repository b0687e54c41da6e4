//! The CSI Node service, served by `tessera node`: binds this node's FUSE mount of a
//! volume (its MountPod's mount point) into kubelet's target paths, and records each
//! target as a reference on the MountPod, so the agent can re-bind it after repairing
//! a broken mount and refuses to unmount while it is in use.
//!
//! ```text
//!  NodePublish:   MountPod Ready (waited for, bounded)? ──▶ bind <mount point> ─▶ <target path>
//!                 (ro if asked) ──▶ reference added
//!  NodeUnpublish: unmount + remove target ──▶ reference removed
//! ```
//!
//! No staging (STAGE_UNSTAGE_VOLUME is not offered): see [`NodeService::publish`].
//!
//! **One writer (ReadWriteOncePod).** A volume whose Volume says ReadWriteOncePod, or
//! a publish whose capability says SINGLE_NODE_SINGLE_WRITER, is published to one
//! target at a time: a second target is FAILED_PRECONDITION, whoever calls (the
//! kubelet's own check and the scheduler's are not relied on). The MountPod's
//! references are the record: checked before the bind, and again in the reference
//! write, which carries the resourceVersion it read, so two racing publishes on one
//! node cannot both pass ([`single_writer_conflict`]). The ticket model keeps the
//! volume on one node, so one MountPod holds every reference there is.
//!
//! Every path in a request is checked by [`paths::under_without_symlinks`]: absolute,
//! no `..`, under the kubelet directory, no symlinks; then created, bound and
//! unmounted only through file descriptors resolved beneath the kubelet directory
//! ([`Mounts::bind_beneath`], [`Mounts::unmount_beneath`]), so a symlink swapped in
//! after the check is refused. References are written with a
//! merge patch that carries the MountPod's resourceVersion, so two concurrent
//! publishes of one volume cannot lose each other's reference (a conflict is retried).
//! Every RPC fails with an [`Error`], mapped to its gRPC code in [`error`].
//!
//! **Inline volumes.** A NodePublish whose context says `csi.storage.k8s.io/ephemeral`
//! first makes the Pod's own Volume and its ticket on this node ([`ephemeral`]); a
//! NodeUnpublish of such a target then removes them.

pub mod ephemeral;
pub mod error;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, Patch, PatchParams};
use kube::runtime::wait::await_condition;
use kube::{Client, ResourceExt};
use serde_json::json;
use tonic::{Request, Response, Status};
use tracing::{info, instrument, warn};

use tessera_api::{
    self as api, CSI_NODE_FIELD_MANAGER, MountPod, MountReference, TOPOLOGY_NODE_KEY, Volume,
};
use tessera_host::mounts::{Mounts, Probe};
use tessera_host::paths;
use tessera_runtime::{KubeContext, error_chain};

use super::proto::node_server::Node;
use super::proto::node_service_capability::{self, rpc};
use super::proto::volume_capability::AccessType;
use super::proto::*;
use super::watch::WatchError;
use super::{InFlight, VolumeTurns, existing_id, required, shown};

pub use error::Error;

/// The Node service of one node.
#[derive(Clone)]
pub struct NodeService {
    client: Client,
    node_name: String,
    kubelet_dir: PathBuf,
    mounts: Arc<dyn Mounts>,
    inflight: InFlight,
    turns: VolumeTurns,
    inline: ephemeral::Settings,
    mount_wait: Duration,
}

/// How long NodePublish waits for the mount by default (`--publish-mount-timeout`).
pub const DEFAULT_MOUNT_WAIT: Duration = Duration::from_secs(60);

/// One RPC's outcome as tonic wants it.
fn reply<T>(res: Result<T, Error>) -> Result<Response<T>, Status> {
    res.map(Response::new).map_err(Status::from)
}

fn shown_path(p: &Path) -> String {
    shown(&p.display().to_string())
}

impl NodeService {
    /// The Node service of `node_name`, accepting paths under `kubelet_dir`.
    pub fn new(
        client: Client,
        node_name: String,
        kubelet_dir: PathBuf,
        mounts: Arc<dyn Mounts>,
        inline: ephemeral::Settings,
    ) -> Self {
        NodeService {
            client,
            node_name,
            kubelet_dir,
            mounts,
            inflight: InFlight::default(),
            turns: VolumeTurns::default(),
            inline,
            mount_wait: DEFAULT_MOUNT_WAIT,
        }
    }

    /// NodePublish waits at most `wait` for the volume's mount to be Ready.
    pub fn with_mount_wait(mut self, wait: Duration) -> Self {
        self.mount_wait = wait;
        self
    }

    /// The request field `field` as a path the driver may mount on or remove.
    fn path(&self, field: &'static str, p: &str) -> Result<PathBuf, Error> {
        paths::under_without_symlinks(p, &self.kubelet_dir)
            .map_err(|source| Error::Path { field, source })
    }

    /// The request field `field` as a path a volume may be at: any other is not found.
    fn volume_path(&self, field: &'static str, p: &str) -> Result<PathBuf, Error> {
        paths::under_without_symlinks(p, &self.kubelet_dir)
            .map_err(|source| Error::UnknownPath { field, source })
    }

    async fn volume(&self, volume_id: &str) -> Result<Volume, Error> {
        Api::<Volume>::all(self.client.clone())
            .get_opt(volume_id)
            .await
            .context(|| format!("reading Volume {}", shown(volume_id)))?
            .ok_or_else(|| Error::VolumeNotFound(shown(volume_id)))
    }

    async fn mountpod(&self, volume_id: &str) -> Result<Option<MountPod>, Error> {
        let name = api::mountpod_name(volume_id, &self.node_name);
        Ok(Api::<MountPod>::all(self.client.clone())
            .get_opt(&name)
            .await
            .context(|| format!("reading MountPod {}", shown(&name)))?)
    }

    /// Whether `target` has a mount whose device is the same as `of` (a bind of it).
    fn bound(&self, target: &Path, of: &Path) -> Result<Option<bool>, Error> {
        let table = self.mounts.table()?;
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
        add: Option<(MountReference, bool)>,
    ) -> Result<(), Error> {
        let api: Api<MountPod> = Api::all(self.client.clone());
        let name = api::mountpod_name(volume_id, &self.node_name);
        let target = target.display().to_string();
        for _ in 0..5 {
            let Some(mp) = api
                .get_opt(&name)
                .await
                .context(|| format!("reading MountPod {}", shown(&name)))?
            else {
                return match add {
                    Some(_) => Err(Error::MountPodGone(shown(&name))),
                    None => Ok(()),
                };
            };
            if let Some((_, true)) = &add {
                single_writer_conflict(volume_id, &mp.spec.references, Path::new(&target))?;
            }
            let mut refs = mp.spec.references.clone();
            refs.retain(|r| r.target_path != target);
            if let Some((reference, _)) = &add {
                refs.push(reference.clone());
            }
            if refs == mp.spec.references {
                return Ok(());
            }
            let patch = json!({
                "metadata": {"resourceVersion": mp.resource_version()},
                "spec": {"references": refs},
            });
            let params = PatchParams {
                field_manager: Some(CSI_NODE_FIELD_MANAGER.into()),
                ..Default::default()
            };
            match api.patch(&name, &params, &Patch::Merge(&patch)).await {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => Err(e).context(|| format!("updating references of {}", shown(&name)))?,
            }
        }
        Err(Error::KeptChanging(shown(&name)))
    }

    fn unmount_and_remove(&self, target: &Path, remove_dir: bool) -> Result<(), Error> {
        // Unmount every layer stacked on the target, then remove the directory: both
        // through file descriptors resolved beneath the kubelet directory.
        self.mounts.unmount_beneath(&self.kubelet_dir, target, 16)?;
        if remove_dir && let Ok(rel) = target.strip_prefix(&self.kubelet_dir) {
            tessera_host::beneath::remove_dir(&self.kubelet_dir, rel).map_err(|errno| {
                Error::Dir {
                    action: "removing",
                    path: shown_path(target),
                    source: errno.into(),
                }
            })?;
        }
        Ok(())
    }

    /// Binds the volume's FUSE mount on this node straight into the target path.
    ///
    /// There is no staging step (no STAGE_UNSTAGE_VOLUME): a staging bind of the mount
    /// root would share device and root with the FUSE mount itself, and the kubelet
    /// counts every such mount as another user of the staged volume
    /// (`GetDeviceMountRefs`), so it never calls NodeUnstageVolume and the volume never
    /// detaches once the kubelet can see Tessera's mounts, as it does in production.
    async fn publish(
        &self,
        req: NodePublishVolumeRequest,
    ) -> Result<NodePublishVolumeResponse, Error> {
        let raw_id = required("volume_id", &req.volume_id)?;
        let is_inline = ephemeral::is_inline(&req.volume_context);
        // An inline volume's id is the kubelet's handle, `csi-` and 64 hex digits: no
        // object name (a label is at most 63 characters).
        let volume_id = match is_inline {
            true if ephemeral::is_kubelet_handle(raw_id) => raw_id,
            _ => existing_id(raw_id, Error::VolumeNotFound)?,
        };
        let target = required("target_path", &req.target_path)?;
        let single_cap = check_capability(req.volume_capability.as_ref())?;
        let target = self.path("target_path", target)?;
        // ControllerPublish returned once the ticket was granted: the mount may still
        // be starting. Waited for (the Volume known first: an unknown one is NOT_FOUND
        // at once) before the in-flight slot and the volume's turn, so other targets of
        // the volume are not held up meanwhile. (An inline volume waits for its ticket,
        // satisfied.)
        let read = match is_inline {
            true => None,
            false => {
                let volume = self.volume(volume_id).await?;
                self.mount_ready(volume_id).await?;
                Some(volume)
            }
        };
        // The same call again while it runs: ABORTED. Another target of the volume (a
        // Pod beside it): waits its turn.
        let _guard = self.inflight.start(&inflight_key(volume_id, &target))?;
        let _turn = self.turns.take(volume_id).await;
        // An inline volume: the Pod's own Volume, attached here, stands for it.
        let inline = match is_inline {
            true => Some(
                self.attach_inline(&req.volume_context, volume_id, &target, req.readonly)
                    .await?,
            ),
            false => None,
        };
        let volume_id = inline.as_deref().unwrap_or(volume_id);
        let volume = match read {
            Some(volume) => volume,
            None => self.volume(volume_id).await?,
        };
        let single = single_cap || volume.spec.access_mode == api::AccessMode::ReadWriteOncePod;
        let (mp, mount_point) = self.ready_mount_point(volume_id).await?;
        if single {
            // Refused before anything is bound; checked again where the reference is
            // written, against the version read there.
            single_writer_conflict(volume_id, &mp.spec.references, &target)?;
        }
        let owner = req
            .volume_context
            .get("csi.storage.k8s.io/pod.uid")
            .map(|uid| format!("pod/{uid}"))
            .unwrap_or_else(|| format!("csi/{volume_id}"));
        let reference = MountReference {
            target_path: target.display().to_string(),
            owner,
            read_only: req.readonly,
            pod: pod_of(&req.volume_context),
        };
        match self.bound(&target, &mount_point)? {
            Some(true) => {}
            Some(false) => return Err(Error::TargetTaken(shown_path(&target))),
            None => {
                // Created, resolved and bound through file descriptors beneath the
                // kubelet directory: a symlink swapped in meanwhile is refused.
                self.mounts
                    .bind_beneath(&mount_point, &self.kubelet_dir, &target, req.readonly)?;
            }
        }
        if let Err(e) = self
            .set_reference(volume_id, &target, Some((reference, single)))
            .await
        {
            // Without its reference the mount could be torn down under the pod: undo.
            warn!(error = %error_chain(&e), "recording the reference failed; unpublishing");
            if let Err(undo) = self.unmount_and_remove(&target, true) {
                warn!(error = %error_chain(&undo), "undoing the publish");
            }
            return Err(e);
        }
        info!(target = %target.display(), read_only = req.readonly, "published");
        Ok(NodePublishVolumeResponse {})
    }

    /// Wait, at most `mount_wait`, until the volume's MountPod on this node is Ready
    /// (serving) or Failed: watched by name, so a MountPod not created yet is waited
    /// for too. A Failed one, or none Ready in time, is an error that says where the
    /// mount stands (the kubelet puts it in the Pod's FailedMount Event).
    async fn mount_ready(&self, volume_id: &str) -> Result<(), Error> {
        let name = api::mountpod_name(volume_id, &self.node_name);
        let api: Api<MountPod> = Api::all(self.client.clone());
        let done = |mp: Option<&MountPod>| mp.is_some_and(|mp| mp.is_serving() || failed(mp));
        let started = std::time::Instant::now();
        match tokio::time::timeout(self.mount_wait, await_condition(api, &name, done)).await {
            // Served, or Failed: what to answer is ready_mount_point's business.
            Ok(Ok(_)) => {
                let waited = started.elapsed();
                if waited > Duration::from_millis(50) {
                    info!(volume = %volume_id, waited_ms = waited.as_millis() as u64, "mount ready");
                }
                Ok(())
            }
            Ok(Err(source)) => Err(Error::Watch(WatchError::Wait {
                kind: "MountPod".into(),
                name,
                source,
            })),
            Err(_) => {
                let state = match self.mountpod(volume_id).await? {
                    None => format!(
                        "no MountPod {} (the controller has not attached the volume here: kubectl get volumeattachments.tessera.io {})",
                        shown(&name),
                        shown(volume_id)
                    ),
                    Some(mp) => {
                        let status = mp.status.clone().unwrap_or_default();
                        let last = status
                            .last_error
                            .map(|e| format!(": {e}"))
                            .unwrap_or_default();
                        let deleting = mp.metadata.deletion_timestamp.is_some();
                        format!(
                            "MountPod {} {}phase {:?}{last}",
                            shown(&name),
                            if deleting { "being deleted, " } else { "" },
                            status.phase
                        )
                    }
                };
                warn!(volume = %volume_id, %state, "mount not ready in time");
                Err(Error::MountTimeout {
                    volume: shown(volume_id),
                    node: self.node_name.clone(),
                    seconds: self.mount_wait.as_secs(),
                    state,
                })
            }
        }
    }

    /// The volume's MountPod on this node and its mount point, once it is Ready. (A
    /// mount that breaks later is repaired by the agent, which re-binds every reference.)
    async fn ready_mount_point(&self, volume_id: &str) -> Result<(MountPod, PathBuf), Error> {
        let mp = self
            .mountpod(volume_id)
            .await?
            .ok_or_else(|| Error::NotAttached {
                volume: shown(volume_id),
                node: self.node_name.clone(),
            })?;
        if !mp.is_serving() {
            let status = mp.status.clone().unwrap_or_default();
            return Err(Error::NotReady {
                volume: shown(volume_id),
                node: self.node_name.clone(),
                phase: format!("{:?}", status.phase),
                last_error: status
                    .last_error
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default(),
            });
        }
        let mount_point = PathBuf::from(
            mp.status
                .as_ref()
                .and_then(|s| s.mount_point.clone())
                .ok_or(Error::NoMountPoint)?,
        );
        Ok((mp, mount_point))
    }

    async fn unpublish(
        &self,
        req: NodeUnpublishVolumeRequest,
    ) -> Result<NodeUnpublishVolumeResponse, Error> {
        let raw_id = required("volume_id", &req.volume_id)?;
        // The kubelet's handle of an inline volume is no object name: see publish.
        let handle = ephemeral::is_kubelet_handle(raw_id);
        let volume_id = match handle {
            true => raw_id,
            false => existing_id(raw_id, Error::VolumeNotFound)?,
        };
        let target = required("target_path", &req.target_path)?;
        let target = self.path("target_path", target)?;
        let _guard = self.inflight.start(&inflight_key(volume_id, &target))?;
        let _turn = self.turns.take(volume_id).await;
        self.unmount_and_remove(&target, true)?;
        let inline = self.inline_volume_at(volume_id, &target).await?;
        match &inline {
            Some(name) => {
                self.set_reference(name, &target, None).await?;
                self.release_inline(name).await?;
            }
            // An inline volume released already (a retry): nothing of it is left.
            None if handle => {}
            None => self.set_reference(volume_id, &target, None).await?,
        }
        info!(target = %target.display(), inline = inline.is_some(), "unpublished");
        Ok(NodeUnpublishVolumeResponse {})
    }

    async fn stats(
        &self,
        req: NodeGetVolumeStatsRequest,
    ) -> Result<NodeGetVolumeStatsResponse, Error> {
        let volume_id = existing_id(
            required("volume_id", &req.volume_id)?,
            Error::VolumeNotFound,
        )?;
        let path = required("volume_path", &req.volume_path)?;
        self.volume(volume_id).await?;
        // Only paths under the kubelet directory are looked at; any other is no path of
        // this volume.
        let path = self.volume_path("volume_path", path)?;
        // A probe tells a missing path from a broken mount (both fail a plain stat).
        if matches!(
            self.mounts.probe(&path, Duration::from_secs(2)),
            Probe::Missing
        ) {
            return Err(Error::PathMissing(shown_path(&path)));
        }
        let probe_path = path.clone();
        let stats = tokio::task::spawn_blocking(move || nix::sys::statvfs::statvfs(&probe_path))
            .await
            .map_err(Error::Statfs)?;
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
        Ok(NodeGetVolumeStatsResponse {
            usage,
            volume_condition: Some(condition),
        })
    }

    async fn expand(
        &self,
        req: NodeExpandVolumeRequest,
    ) -> Result<NodeExpandVolumeResponse, Error> {
        let volume_id = existing_id(
            required("volume_id", &req.volume_id)?,
            Error::VolumeNotFound,
        )?;
        let path = required("volume_path", &req.volume_path)?;
        let volume = self.volume(volume_id).await?;
        self.volume_path("volume_path", path)?;
        // The quota grows online when the controller raises spec.size: nothing to do here.
        let bytes = api::quantity_bytes(&volume.spec.size.0).map_err(|source| Error::Size {
            volume: volume.name_any(),
            source,
        })?;
        Ok(NodeExpandVolumeResponse {
            capacity_bytes: i64::try_from(bytes).unwrap_or(i64::MAX),
        })
    }
}

/// Check a publish's capability; whether it asks for a single writer
/// (SINGLE_NODE_SINGLE_WRITER: a ReadWriteOncePod claim).
/// The Pod a publish is for, from the kubelet's pod info (`podInfoOnMount`), when
/// its namespace and name are valid object names.
/// Whether the agent reports `mp` Failed (a mount that will not come by waiting).
fn failed(mp: &MountPod) -> bool {
    mp.metadata.deletion_timestamp.is_none()
        && mp
            .status
            .as_ref()
            .is_some_and(|s| s.phase == Some(api::MountPhase::Failed))
}

fn pod_of(context: &HashMap<String, String>) -> Option<api::PodRef> {
    let namespace = context.get("csi.storage.k8s.io/pod.namespace")?;
    let name = context.get("csi.storage.k8s.io/pod.name")?;
    (super::is_object_name(namespace) && namespace.len() <= 63 && super::is_object_name(name)).then(
        || api::PodRef {
            namespace: namespace.clone(),
            name: name.clone(),
        },
    )
}

fn check_capability(cap: Option<&VolumeCapability>) -> Result<bool, Error> {
    let cap = required("volume_capability", cap)?;
    if let Some(AccessType::Block(_)) = cap.access_type {
        return Err(Error::Block);
    }
    let mode = required("volume_capability.access_mode", cap.access_mode.as_ref())?;
    Ok(mode.mode == volume_capability::access_mode::Mode::SingleNodeSingleWriter as i32)
}

/// For a single-writer volume: refuse publishing to `target` while another target
/// holds it (a reference of `target` itself is a repeated publish, which is fine).
pub fn single_writer_conflict(
    volume_id: &str,
    references: &[MountReference],
    target: &Path,
) -> Result<(), Error> {
    match references
        .iter()
        .find(|r| Path::new(&r.target_path) != target)
    {
        Some(other) => Err(Error::SingleWriter {
            volume: shown(volume_id),
            target: shown(&other.target_path),
            owner: shown(&other.owner),
        }),
        None => Ok(()),
    }
}

#[tonic::async_trait]
impl Node for NodeService {
    #[instrument(skip_all, fields(volume = %req.get_ref().volume_id))]
    async fn node_stage_volume(
        &self,
        req: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        let _ = req;
        Err(Status::unimplemented(
            "NodeStageVolume: the driver does not stage volumes (no STAGE_UNSTAGE_VOLUME)",
        ))
    }

    #[instrument(skip_all, fields(volume = %req.get_ref().volume_id))]
    async fn node_unstage_volume(
        &self,
        req: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        let _ = req;
        Err(Status::unimplemented(
            "NodeUnstageVolume: the driver does not stage volumes (no STAGE_UNSTAGE_VOLUME)",
        ))
    }

    #[instrument(skip_all, fields(volume = %req.get_ref().volume_id))]
    async fn node_publish_volume(
        &self,
        req: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        reply(self.publish(req.into_inner()).await)
    }

    #[instrument(skip_all, fields(volume = %req.get_ref().volume_id))]
    async fn node_unpublish_volume(
        &self,
        req: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        reply(self.unpublish(req.into_inner()).await)
    }

    async fn node_get_volume_stats(
        &self,
        req: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        reply(self.stats(req.into_inner()).await)
    }

    async fn node_expand_volume(
        &self,
        req: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        reply(self.expand(req.into_inner()).await)
    }

    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        let capabilities = [
            rpc::Type::GetVolumeStats,
            rpc::Type::VolumeCondition,
            rpc::Type::ExpandVolume,
            // ReadWriteOnce arrives as SINGLE_NODE_MULTI_WRITER and ReadWriteOncePod as
            // SINGLE_NODE_SINGLE_WRITER (SINGLE_NODE_WRITER still accepted).
            rpc::Type::SingleNodeMultiWriter,
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
        // Which Shared roots this node has: a stat each, off the runtime and bounded
        // (a hung backend must not keep the plugin from registering; it then
        // registers without that root).
        let (node, roots) = (self.node_name.clone(), self.inline.allowed_roots.clone());
        let probe = tokio::task::spawn_blocking(move || {
            crate::topology::node_segments(&node, &roots, |p| p.is_dir())
        });
        let segments = match tokio::time::timeout(ROOT_PROBE_TIMEOUT, probe).await {
            Ok(Ok(segments)) => segments,
            _ => {
                warn!(timeout = ?ROOT_PROBE_TIMEOUT, "the backend roots did not answer: registering with the node's name only");
                [(TOPOLOGY_NODE_KEY.to_string(), self.node_name.clone())].into()
            }
        };
        info!(?segments, "topology reported to the kubelet");
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.node_name.clone(),
            max_volumes_per_node: 0,
            accessible_topology: Some(Topology { segments }),
        }))
    }
}

/// How long NodeGetInfo waits for the backend roots to answer a stat.
const ROOT_PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// The [`InFlight`] key of a publish or unpublish: the volume and the target.
fn inflight_key(volume_id: &str, target: &Path) -> String {
    format!("{volume_id} {}", target.display())
}

#[cfg(test)]
mod tests {
    use super::*;
    use volume_capability::access_mode::Mode;

    fn reference(target: &str) -> MountReference {
        MountReference {
            target_path: target.into(),
            owner: "pod/a".into(),
            read_only: false,
            pod: None,
        }
    }

    #[test]
    fn one_target_at_a_time_for_a_single_writer() {
        let t = Path::new("/k/pods/b/mount");
        for (refs, ok) in [
            (vec![], true),
            // The same target again: a repeated publish.
            (vec![reference("/k/pods/b/mount")], true),
            (vec![reference("/k/pods/a/mount")], false),
            (
                vec![reference("/k/pods/b/mount"), reference("/k/pods/a/mount")],
                false,
            ),
        ] {
            let res = single_writer_conflict("v", &refs, t);
            assert_eq!(res.is_ok(), ok, "{refs:?}");
            if let Err(e) = res {
                assert_eq!(e.code(), tonic::Code::FailedPrecondition);
                assert!(e.to_string().contains("/k/pods/a/mount"), "{e}");
            }
        }
    }

    #[test]
    fn the_capability_says_whether_one_writer_is_asked() {
        let cap = |m: Mode| VolumeCapability {
            access_mode: Some(volume_capability::AccessMode { mode: m as i32 }),
            access_type: Some(AccessType::Mount(Default::default())),
        };
        for (mode, single) in [
            (Mode::SingleNodeSingleWriter, true),
            (Mode::SingleNodeMultiWriter, false),
            (Mode::SingleNodeWriter, false),
            (Mode::MultiNodeMultiWriter, false),
        ] {
            assert_eq!(
                check_capability(Some(&cap(mode))).unwrap(),
                single,
                "{mode:?}"
            );
        }
        assert!(check_capability(None).is_err());
    }
}
