//! The CSI Controller service: volumes become `Volume` objects, publishes become
//! `csi-attacher` tickets.
//!
//! ControllerPublishVolume takes the Volume, the Node and the VolumeAttachment from
//! the service's caches ([`publish_cache`]; a miss, or a VolumeAttachment older than
//! this process's last write of it, is a read), upserts the ticket (an identical
//! ticket is not written again, so repeated calls change nothing), then waits — by watch, not by polling —
//! until the ticket is granted: the service's MountPod watch shows its node's mount
//! decided and on its way ([`grant`]), or its status says satisfied. The FUSE
//! daemon's start is NodePublish's wait, not this one's (docs/csi.md, "The attach
//! flow"). Bounded by
//! `publish_timeout` (below the external-attacher's 15 s call timeout). While the
//! ticket is blocked the error carries its reason and message, so `kubectl describe` of
//! the storage.k8s.io VolumeAttachment says why. ControllerUnpublishVolume removes the
//! ticket (found in the copy in hand, else read: a ticket missing from a copy may be
//! another process's) and waits until the node's MountPod is gone (or another ticket
//! still wants the volume there): on the service's one MountPod list-watch
//! ([`super::mountpods`]) when its cache holds the MountPod, else by a read and a
//! watch of its own. The driver never arbitrates.
//!
//! | module | owns |
//! |---|---|
//! | this one | the RPCs: Kubernetes reads and writes, waits |
//! | [`request`] | what a request asks for (names, access modes, sizes, mount flags), no I/O |
//! | [`parameters`] | the StorageClass parameters: the one list of them, their parsing, the docs table; no I/O |
//! | [`grant`] | when a publish may return before its ticket is satisfied, no I/O |
//! | [`publish_wait`] | a publish's wait for that grant, or for its ticket satisfied |
//! | [`modify`] | a VolumeAttributesClass's parameters as Volume spec changes, no I/O |
//! | [`resources`] | the mount daemon's CPU and memory parameters, no I/O |
//! | [`snapshot`] | snapshots, restores and clones: volumes filled from another's data |
//! | [`copy_plan`] | the steps of such a fill (tickets), the copy node, sizes; no I/O |
//! | [`existing`] | Validate, List, Expand, Modify: reads and patches of existing Volumes |
//! | [`error`] | [`Error`] and its one mapping to gRPC codes |
//! | [`group_commit`] | ticket writes of one volume arriving together: one patch |
//! | [`memo`] | what the service remembers of its own recent calls: a map that starts over at its bound |
//! | [`space`] | the nodes' free space from their liveness Leases, for GetCapacity |
//! | [`publish_cache`] | the Volumes, Node names and VolumeAttachments a publish or unpublish reads, cached |
//! | [`super::shared_watch`] | one watch per VolumeAttachment for all its waiting calls |
//! | [`super::mountpods`] | one MountPod list-watch for the publishes and unpublishes waiting on one |
//!
//! Publish and unpublish of one volume on different nodes run concurrently (one
//! in-flight slot per volume and node, as the external-attacher keys its work): a
//! ReadWriteMany volume published to hundreds of nodes at once is not turned away
//! with ABORTED. Their ticket changes touch disjoint tickets and are written
//! together ([`group_commit`]), and they wait for their tickets on one shared watch
//! of the VolumeAttachment ([`super::shared_watch`]).

pub mod copy_plan;
pub mod error;
mod existing;
pub mod grant;
pub mod group_commit;
pub mod memo;
pub mod modify;
pub mod parameters;
mod publish_cache;
mod publish_wait;
pub mod request;
pub mod resources;
pub mod snapshot;
pub mod space;

use std::collections::BTreeMap;
use std::time::Duration;

use kube::api::{Api, DeleteParams, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::{Client, ResourceExt};
use serde_json::json;
use tonic::{Request, Response, Status};
use tracing::{debug, info, instrument};

use tessera_api::{
    self as api, ANNOTATION_CSI_NAME, AttacherType, AttachmentTicket, BackendScope,
    CSI_CONTROLLER_FIELD_MANAGER, MAX_TICKETS, MountPod, TOPOLOGY_NODE_KEY, Volume,
    VolumeAttachment, quantity_of,
};
use tessera_runtime::KubeContext;

use super::mountpods::MountPodWatch;
use super::proto::controller_server::Controller;
use super::proto::controller_service_capability::{self, rpc};
use super::proto::*;
use super::shared_watch::SharedWatches;
use super::watch::{WatchError, await_from};
use super::{InFlight, csi_ticket_id, existing_id, idle_ticket_id, required, shown};
use parameters::Parameters;
use publish_cache::PublishCaches;
use request::{
    access_mode_for, compatible, idle_ticket, mount_options, size_fits, size_for, topology_node,
    volume_bytes,
};

pub use error::Error;
pub use request::{DEFAULT_SIZE, volume_name};

/// Parameters of the service's merge patches (its field manager, so `managedFields`
/// tell who wrote what).
fn merge_params() -> PatchParams {
    PatchParams {
        field_manager: Some(CSI_CONTROLLER_FIELD_MANAGER.into()),
        ..Default::default()
    }
}

/// Settings of the Controller service.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Backend root for volumes whose StorageClass names none (`backendRoot` parameter).
    pub default_backend_root: String,
    /// How long ControllerPublish waits for its ticket.
    pub publish_timeout: Duration,
    /// How long ControllerUnpublish waits for the detach.
    pub unpublish_timeout: Duration,
    /// Capacity reported by GetCapacity for every request; `None`: the free space the
    /// nodes report on their liveness Leases (`space`).
    pub capacity_bytes: Option<u64>,
    /// The namespace of the nodes' liveness Leases (Tessera's own).
    pub lease_namespace: String,
    /// Labels put on every Volume created, and required of every Volume listed (the
    /// controller's `--watch-selector`, so one instance sees only its own volumes).
    pub labels: tessera_runtime::labels::Labels,
    /// The backend roots a StorageClass may name (`backendRoot`); others are refused.
    pub allowed_roots: tessera_host::roots::AllowedRoots,
}

/// The Controller service.
#[derive(Clone)]
pub struct ControllerService {
    client: Client,
    settings: Settings,
    inflight: InFlight,
    tickets: group_commit::TicketWriter,
    watches: SharedWatches,
    caches: PublishCaches,
    mountpods: MountPodWatch,
    written_before: grant::WrittenBefore,
    refused: publish_cache::RefusedAtCap,
    spaces: space::NodeSpaces,
}

/// The in-flight slot of a publish or unpublish of `volume` on `node` (all nodes:
/// empty).
fn node_slot(volume: &str, node: &str) -> String {
    if node.is_empty() {
        format!("{volume} on every node")
    } else {
        format!("{volume} on node {node}")
    }
}

/// The change that writes `ticket` (its id, its body) in a [`group_commit`] batch.
fn ticket_change(ticket: &AttachmentTicket) -> Result<(String, serde_json::Value), Error> {
    let body = serde_json::to_value(ticket).map_err(|source| Error::Encode {
        name: ticket.id.clone(),
        source,
    })?;
    Ok((ticket.id.clone(), body))
}

/// Whether anything still wants `volume` on `node` once the tickets `ids` were
/// removed: a ticket on that node, or one of `ids` again.
fn still_wanted(va: Option<&VolumeAttachment>, node: &str, ids: &[String]) -> bool {
    va.is_some_and(|va| {
        let tickets = &va.spec.attachment_tickets;
        tickets.values().any(|t| t.node_id == node) || ids.iter().any(|id| tickets.contains_key(id))
    })
}

/// Answer an RPC the driver does not offer (UNIMPLEMENTED).
fn unimplemented<T>(what: &'static str) -> Result<Response<T>, Status> {
    Err(Error::Unimplemented(what).into())
}

/// One RPC's outcome as tonic wants it.
fn reply<T>(res: Result<T, Error>) -> Result<Response<T>, Status> {
    res.map(Response::new).map_err(Status::from)
}

impl ControllerService {
    /// A Controller service using `client`.
    pub fn new(client: Client, settings: Settings) -> Self {
        ControllerService {
            caches: PublishCaches::start(&client, &settings.labels),
            mountpods: MountPodWatch::start(&client, &settings.labels),
            written_before: Default::default(),
            refused: Default::default(),
            spaces: space::NodeSpaces::new(client.clone(), settings.lease_namespace.clone()),
            tickets: group_commit::TicketWriter::new(Api::all(client.clone())),
            watches: SharedWatches::new(Api::all(client.clone())),
            client,
            settings,
            inflight: InFlight::default(),
        }
    }

    /// GetCapacity: the free space of the StorageClass's root on the segment's node as
    /// that node last reported it, or the most any live node has (no segment).
    async fn capacity(&self, req: GetCapacityRequest) -> Result<GetCapacityResponse, Error> {
        let available = match self.settings.capacity_bytes {
            Some(c) => c,
            None => {
                let params =
                    Parameters::parse(&req.parameters, &self.settings.default_backend_root)?;
                parameters::scope_for(&params, &self.settings.allowed_roots)?;
                let root = self
                    .settings
                    .allowed_roots
                    .check_root(&params.backend_root)
                    .map_err(Error::BackendRoot)?;
                let node = req
                    .accessible_topology
                    .as_ref()
                    .and_then(|t| t.segments.get(TOPOLOGY_NODE_KEY))
                    .map(String::as_str);
                let spaces = self.spaces.now().await;
                crate::topology::capacity(&root.to_string_lossy(), node, &spaces)
            }
        };
        Ok(GetCapacityResponse {
            available_capacity: i64::try_from(available).unwrap_or(i64::MAX),
            maximum_volume_size: None,
            minimum_volume_size: None,
        })
    }

    fn volumes(&self) -> Api<Volume> {
        Api::all(self.client.clone())
    }

    fn attachments(&self) -> Api<VolumeAttachment> {
        Api::all(self.client.clone())
    }

    async fn create(&self, req: CreateVolumeRequest) -> Result<CreateVolumeResponse, Error> {
        let csi_name = required("name", &req.name)?;
        let caps = required("volume_capabilities", &req.volume_capabilities)?;
        let mode = access_mode_for(caps)?;
        let source = self.content_source(&req).await?;
        let size = match &source {
            Some(src) => copy_plan::fill_size(
                req.capacity_range.as_ref(),
                volume_bytes(&src.volume)?,
                &src.describe(),
            )?,
            None => size_for(req.capacity_range.as_ref())?,
        };
        let params = Parameters::parse(&req.parameters, &self.settings.default_backend_root)?;
        // A VolumeAttributesClass named at creation: its settings from the start.
        let vac = modify::parse(&req.mutable_parameters)?;
        let scope = parameters::scope_for(&params, &self.settings.allowed_roots)?;
        let name = volume_name(csi_name);
        let _guard = self.inflight.start(&name)?;

        if let Some(existing) = self
            .volumes()
            .get_opt(&name)
            .await
            .context(|| format!("reading Volume {name}"))?
        {
            if existing.annotations().get(ANNOTATION_CSI_NAME) != Some(&req.name) {
                return Err(Error::NameTaken(name));
            }
            if existing.metadata.deletion_timestamp.is_none() {
                let bytes = volume_bytes(&existing)?;
                if !size_fits(bytes, req.capacity_range.as_ref())
                    || existing.spec.access_mode != mode
                {
                    return Err(Error::ExistsOtherwise {
                        name: shown(csi_name),
                        bytes,
                        mode: existing.spec.access_mode,
                    });
                }
                return self.filled(&existing, source).await;
            }
            // The same name deleted a moment ago (its data is being removed): a new
            // volume once the old one is gone, within the publish timeout.
            let gone = await_from(self.volumes(), existing, |v: Option<&Volume>| v.is_none());
            match tokio::time::timeout(self.settings.publish_timeout, gone).await {
                Ok(res) => drop(res?),
                Err(_) => return Err(Error::BeingDeleted(name)),
            }
        }
        // A node-local volume filled from another lives where that one's data is.
        let node = (scope == BackendScope::NodeLocal)
            .then(|| {
                source
                    .as_ref()
                    .and_then(|s| s.node())
                    .or_else(|| topology_node(&req))
            })
            .flatten();
        // The claim, when the provisioner names it: the per-volume metrics' `pvc` and
        // `pvc_namespace` labels.
        let mut annotations = parameters::claim_annotations(&req.parameters);
        annotations.insert(ANNOTATION_CSI_NAME.into(), csi_name.to_string());
        let body = json!({
            "apiVersion": "tessera.io/v1alpha1", "kind": "Volume",
            "metadata": {"name": name, "annotations": annotations, "labels": self.settings.labels.0},
            "spec": {
                "size": quantity_of(size), "accessMode": mode,
                "backend": {"root": params.backend_root, "scope": scope, "node": node},
                "mountOptions": mount_options(caps),
                "idleMountDelaySeconds": vac.idle_mount_delay.filter(|d| *d > 0).or(params.idle_mount_delay),
                "mountResources": modify::with_resources(params.mount_resources.as_ref(), &vac.resources)?,
                "attrCacheSeconds": vac.attr_cache_seconds.or(params.attr_cache_seconds),
                "dataSource": source.as_ref().map(|s| s.data_source()),
                "nodeFailover": params.node_failover,
            }
        });
        let created = self.post_volume(&name, body, "Volume").await?;
        info!(volume = %name, size, %mode, "created volume");
        self.filled(&created, source).await
    }

    /// Create the Volume `body` describes (as this driver's field manager); `what`
    /// names it in an error ("Volume", "snapshot Volume").
    async fn post_volume(
        &self,
        name: &str,
        body: serde_json::Value,
        what: &str,
    ) -> Result<Volume, Error> {
        let volume: Volume = serde_json::from_value(body).map_err(|source| Error::Encode {
            name: name.into(),
            source,
        })?;
        let post = PostParams {
            field_manager: Some(CSI_CONTROLLER_FIELD_MANAGER.into()),
            ..Default::default()
        };
        self.volumes()
            .create(&post, &volume)
            .await
            .context(|| format!("creating {what} {name}"))
            .map_err(Into::into)
    }

    async fn delete(&self, req: DeleteVolumeRequest) -> Result<DeleteVolumeResponse, Error> {
        let volume = required("volume_id", &req.volume_id)?;
        if !super::is_object_name(volume) {
            // No Volume can have that name: deleted already, as the spec wants it.
            return Ok(DeleteVolumeResponse {});
        }
        let _guard = self.inflight.start(volume)?;
        if let Ok(Some(v)) = self.volumes().get_opt(volume).await {
            self.abandon_fill(&v).await?;
        }
        match self
            .volumes()
            .delete(volume, &DeleteParams::default())
            .await
        {
            Ok(_) => {
                info!(
                    volume,
                    "deleting volume (its data is removed through a cleanup ticket)"
                )
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            // An id that is no valid object name cannot name a Volume: nothing to delete.
            Err(kube::Error::Api(s)) if s.code == 400 || s.code == 422 => {}
            Err(e) => Err(e).context(|| format!("deleting Volume {}", shown(volume)))?,
        }
        Ok(DeleteVolumeResponse {})
    }

    async fn publish(
        &self,
        req: ControllerPublishVolumeRequest,
    ) -> Result<ControllerPublishVolumeResponse, Error> {
        let volume_id = existing_id(
            required("volume_id", &req.volume_id)?,
            Error::VolumeNotFound,
        )?;
        let node_id = existing_id(required("node_id", &req.node_id)?, Error::NodeNotFound)?;
        let cap = required("volume_capability", req.volume_capability.as_ref())?;
        // One slot per volume and node: publishes to other nodes run meanwhile (their
        // tickets are others, and their writes are grouped). Taken before the reads, so
        // that an unpublish of the same pair is either wholly before them (and its
        // write is this process's last one, which the copy read must show) or after.
        let _guard = self.inflight.start(&node_slot(volume_id, node_id))?;
        // The Volume, the Node and the VolumeAttachment: from the caches when they hold
        // them (a VolumeAttachment only as new as this process's last write of it),
        // else read from the API server, at once (one round trip).
        let started = std::time::Instant::now();
        let api = self.attachments();
        let (volume, node, va) = tokio::join!(
            self.published_volume(volume_id),
            self.node_exists(node_id),
            self.attachment(volume_id),
        );
        let (volume, volume_from) = volume?;
        let node_from = node?;
        compatible(volume.spec.access_mode, cap)?;

        let id = csi_ticket_id(volume_id, node_id);
        let mut params = BTreeMap::new();
        params.insert("readOnly".to_string(), req.readonly.to_string());
        let (va, va_from) = va?;
        let reads = started.elapsed();
        let va = match va {
            Some(va) => va,
            // A Volume created a moment ago may not have its VolumeAttachment yet (the
            // volume controller creates it): wait for it, within the publish timeout.
            None => {
                let exists = await_condition(api.clone(), volume_id, |va: Option<&_>| va.is_some());
                match tokio::time::timeout(self.settings.publish_timeout, exists).await {
                    Ok(Ok(Some(va))) => va,
                    Ok(Ok(None)) | Err(_) => return Err(Error::NoAttachment(volume_id.into())),
                    Ok(Err(source)) => {
                        return Err(WatchError::Wait {
                            kind: "VolumeAttachment".into(),
                            name: volume_id.into(),
                            source,
                        }
                        .into());
                    }
                }
            }
        };
        let existing = va.spec.attachment_tickets.get(&id);
        let same = existing.is_some_and(|t| {
            t.node_id == node_id && t.type_ == AttacherType::CsiAttacher && t.parameters == params
        });
        // "Volume published but is incompatible" (CSI spec): the same volume on the same
        // node with other parameters is ALREADY_EXISTS; the caller unpublishes first.
        if let Some(t) = existing.filter(|_| !same) {
            return Err(Error::PublishedOtherwise {
                volume: volume_id.into(),
                node: t.node_id.clone(),
                parameters: t.parameters.clone(),
            });
        }
        let mut current = va.clone();
        // A workload back on a node that kept its idle mount: the CSI ticket takes the
        // idle-mount ticket's place, in the same write (the node stays chosen, the
        // mount stays as it is).
        let idle_id = idle_ticket_id(volume_id, node_id);
        let idle = va.spec.attachment_tickets.contains_key(&idle_id);
        let wrote = !same || idle;
        // A volume wanted on as many nodes as one VolumeAttachment holds: told as
        // such, and retried by the csi-attacher until a node lets the volume go; its
        // unpublish need not read (publish_cache::RefusedAtCap).
        let full = || {
            self.refused.record(&id);
            Error::TicketsFull {
                volume: volume_id.into(),
                max: MAX_TICKETS,
            }
        };
        if wrote && !va.has_room_for(&id, idle.then_some(idle_id.as_str())) {
            return Err(full());
        }
        if wrote {
            let mut ticket = AttachmentTicket::new(&id, AttacherType::CsiAttacher, node_id);
            ticket.parameters = params.clone();
            // Above any status left of a ticket of this id removed a moment ago (an
            // unpublish just before): that status must not satisfy this one.
            ticket.generation = va.next_ticket_generation(&id);
            let mut changes: group_commit::Changes = [ticket_change(&ticket)?].into();
            if idle {
                changes.insert(idle_id, serde_json::Value::Null);
            }
            current = self
                .tickets
                .write(
                    volume_id,
                    changes,
                    format!("adding ticket {id} to VolumeAttachment {volume_id}"),
                )
                .await
                .map_err(|e| match error::too_many_tickets(&e) {
                    true => full(),
                    false => e.into(),
                })?;
            self.refused.forget(&id);
            info!(
                ticket = %id, replaced_idle = idle, %volume_from, %node_from, %va_from,
                reads_ms = reads.as_secs_f64() * 1e3,
                write_ms = (started.elapsed() - reads).as_secs_f64() * 1e3,
                "ticket upserted"
            );
        } else {
            debug!(
                ticket = %id, %volume_from, %node_from, %va_from,
                reads_ms = reads.as_secs_f64() * 1e3, "ticket in place"
            );
        }
        let wait = publish_wait::Publish {
            volume: volume_id,
            node: node_id,
            id: &id,
            mode: volume.spec.access_mode,
            read_only: req.readonly,
            wrote,
        };
        self.wait_granted(wait, current).await
    }

    async fn unpublish(
        &self,
        req: ControllerUnpublishVolumeRequest,
    ) -> Result<ControllerUnpublishVolumeResponse, Error> {
        let volume_id = required("volume_id", &req.volume_id)?;
        if !super::is_object_name(volume_id) {
            // No such volume: nothing is published (CSI spec).
            return Ok(ControllerUnpublishVolumeResponse {});
        }
        let _guard = self.inflight.start(&node_slot(volume_id, &req.node_id))?;
        let node = req.node_id.clone();
        let read = self.unpublished_attachment(volume_id, &node).await?;
        // A refusal at the cap serves one unpublish: a repeat reads.
        self.refused.forget(&csi_ticket_id(volume_id, &node));
        let Some(mut va) = read else {
            return Ok(ControllerUnpublishVolumeResponse {});
        };
        // No node: unpublish from every node (CSI spec).
        let ids: Vec<String> = if node.is_empty() {
            va.spec
                .attachment_tickets
                .values()
                .filter(|t| t.type_ == AttacherType::CsiAttacher)
                .map(|t| t.id.clone())
                .collect()
        } else {
            vec![csi_ticket_id(volume_id, &node)]
        };
        let present: Vec<&String> = ids
            .iter()
            .filter(|id| va.spec.attachment_tickets.contains_key(*id))
            .collect();
        // A volume that keeps idle mounts: the named node's satisfied CSI ticket is
        // replaced by an idle-mount ticket, in the same write, so the mount stays for
        // the delay (and, a ticket still wanting the node, this returns at once).
        let idle = match ids.as_slice() {
            [id] if !node.is_empty() && va.ticket_satisfied(id) => {
                match self.published_volume(volume_id).await {
                    Ok((v, _)) => idle_ticket(&v, &va, id, jiff::Timestamp::now()),
                    Err(Error::VolumeNotFound(_)) => None,
                    Err(e) => return Err(e),
                }
            }
            _ => None,
        };
        if !present.is_empty() {
            let mut changes: group_commit::Changes = present
                .iter()
                .map(|id| (id.to_string(), serde_json::Value::Null))
                .collect();
            if let Some(t) = &idle {
                changes.extend([ticket_change(t)?]);
            }
            va = self
                .tickets
                .write(
                    volume_id,
                    changes,
                    format!("removing tickets from VolumeAttachment {volume_id}"),
                )
                .await?;
            match &idle {
                Some(t) => {
                    info!(tickets = ?present, idle = %t.id, "tickets removed; the idle mount stays")
                }
                None => info!(tickets = ?present, "tickets removed"),
            }
        }
        // Detached when no ticket of ours is left and, for a named node that no other
        // ticket still wants, its MountPod is gone: watched, from the versions in hand.
        let wanted = {
            let node = node.clone();
            move |va: Option<&VolumeAttachment>| still_wanted(va, &node, &ids)
        };
        if node.is_empty() || wanted(Some(&va)) {
            return Ok(ControllerUnpublishVolumeResponse {});
        }
        let mp_name = api::mountpod_name(volume_id, &node);
        let detached = async {
            tokio::select! {
                res = self.watches.wait(va, wanted) => res.map(drop).map_err(Error::from),
                res = self.mountpod_gone(&mp_name) => res,
            }
        };
        match tokio::time::timeout(self.settings.unpublish_timeout, detached).await {
            Ok(res) => Ok(res.map(|()| ControllerUnpublishVolumeResponse {})?),
            Err(_) => Err(Error::StillDetaching {
                volume: volume_id.into(),
                node: shown(&node),
            }),
        }
    }
}

impl ControllerService {
    /// Wait until MountPod `name` is gone: on the shared MountPod watch when its cache
    /// (listed) holds it; else, as it may have been created a moment ago, read from
    /// the API server and, if there, watched from the version read.
    async fn mountpod_gone(&self, name: &str) -> Result<(), Error> {
        if self.mountpods.wait_gone(name).await.is_some() {
            return Ok(());
        }
        let mps: Api<MountPod> = Api::all(self.client.clone());
        let Some(mp) = mps
            .get_opt(name)
            .await
            .context(|| format!("reading MountPod {name}"))?
        else {
            return Ok(());
        };
        await_from(mps, mp, |mp: Option<&MountPod>| mp.is_none()).await?;
        Ok(())
    }
}

#[tonic::async_trait]
impl Controller for ControllerService {
    #[instrument(skip_all, fields(name = %req.get_ref().name))]
    async fn create_volume(
        &self,
        req: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        reply(self.create(req.into_inner()).await)
    }

    #[instrument(skip_all, fields(volume = %req.get_ref().volume_id))]
    async fn delete_volume(
        &self,
        req: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        reply(self.delete(req.into_inner()).await)
    }

    #[instrument(skip_all, fields(volume = %req.get_ref().volume_id, node = %req.get_ref().node_id))]
    async fn controller_publish_volume(
        &self,
        req: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        reply(self.publish(req.into_inner()).await)
    }

    #[instrument(skip_all, fields(volume = %req.get_ref().volume_id, node = %req.get_ref().node_id))]
    async fn controller_unpublish_volume(
        &self,
        req: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        reply(self.unpublish(req.into_inner()).await)
    }

    async fn validate_volume_capabilities(
        &self,
        req: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        reply(self.validate(req.into_inner()).await)
    }

    async fn list_volumes(
        &self,
        req: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        reply(self.list(req.into_inner()).await)
    }

    async fn get_capacity(
        &self,
        req: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        reply(self.capacity(req.into_inner()).await)
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
            // So that Kubernetes tells ReadWriteOnce (SINGLE_NODE_MULTI_WRITER) from
            // ReadWriteOncePod (SINGLE_NODE_SINGLE_WRITER).
            rpc::Type::SingleNodeMultiWriter,
            // A VolumeAttributesClass change on a bound claim (the external-resizer).
            rpc::Type::ModifyVolume,
            rpc::Type::CreateDeleteSnapshot,
            rpc::Type::CloneVolume,
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
        reply(self.expand(req.into_inner()).await)
    }

    #[instrument(skip_all, fields(name = %req.get_ref().name, source = %req.get_ref().source_volume_id))]
    async fn create_snapshot(
        &self,
        req: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        reply(self.snapshot(req.into_inner()).await)
    }
    #[instrument(skip_all, fields(snapshot = %req.get_ref().snapshot_id))]
    async fn delete_snapshot(
        &self,
        req: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        reply(self.delete_snapshot_volume(req.into_inner()).await)
    }
    async fn list_snapshots(
        &self,
        _: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        unimplemented("snapshots")
    }
    async fn get_snapshot(
        &self,
        _: Request<GetSnapshotRequest>,
    ) -> Result<Response<GetSnapshotResponse>, Status> {
        unimplemented("snapshots")
    }
    async fn controller_get_volume(
        &self,
        _: Request<ControllerGetVolumeRequest>,
    ) -> Result<Response<ControllerGetVolumeResponse>, Status> {
        unimplemented("ControllerGetVolume")
    }
    async fn controller_modify_volume(
        &self,
        req: Request<ControllerModifyVolumeRequest>,
    ) -> Result<Response<ControllerModifyVolumeResponse>, Status> {
        reply(self.modify(req.into_inner()).await)
    }
}

#[cfg(test)]
mod tests {
    use tessera_api::{AttachmentTicket, VolumeAttachmentSpec};

    use super::*;

    #[test]
    fn a_volume_is_still_wanted_on_a_node_while_a_ticket_asks_for_it() {
        let va = |tickets: &[(&str, &str)]| {
            let mut spec = VolumeAttachmentSpec::default();
            for (id, node) in tickets {
                spec.attachment_tickets.insert(
                    id.to_string(),
                    AttachmentTicket::new(*id, AttacherType::Manual, *node),
                );
            }
            VolumeAttachment::new("v", spec)
        };
        let ours = vec!["csi-a".to_string()];
        for (tickets, wanted) in [
            (&[][..], false),
            (&[("manual-1", "node-b")][..], false),
            (&[("manual-1", "node-a")][..], true),
            // Our ticket back (a publish after the unpublish).
            (&[("csi-a", "node-b")][..], true),
        ] {
            assert_eq!(
                still_wanted(Some(&va(tickets)), "node-a", &ours),
                wanted,
                "{tickets:?}"
            );
        }
        assert!(!still_wanted(None, "node-a", &ours));
    }
}
