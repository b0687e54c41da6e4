//! Snapshots, restores and clones: the RPCs and the fill they share.
//!
//! A snapshot is a Volume of its own (label `tessera.io/snapshot`, annotation
//! `tessera.io/snapshot-of`), never published, whose directory `<root>/<snapshot>`
//! sits next to its source's under the same backend root and holds a copy of the
//! source's data. Its `spec.dataSource` names the source; it is filled like a restored
//! or cloned volume is (see [`super::copy_plan`] for the steps, each a ticket). The
//! snapshot id is the Volume's name: DeleteSnapshot deletes the Volume, and the usual
//! `cleanup` ticket removes its data.
//!
//! CreateSnapshot answers `ready_to_use: false` until the copy is done (the
//! csi-snapshotter asks again); CreateVolume from a snapshot or a volume answers
//! UNAVAILABLE until its copy is done (the external-provisioner asks again). Each call
//! drives the fill a step further and waits for it, by watch, within the publish
//! timeout.

use std::time::Instant;

use kube::api::{DeleteParams, Patch};
use kube::{ResourceExt, api::Api};
use serde_json::json;
use tracing::info;

use tessera_api::{
    ANNOTATION_CSI_NAME, ANNOTATION_FILLED_ON, ANNOTATION_POPULATED, ANNOTATION_SNAPSHOT_OF,
    AttacherType, AttachmentTicket, BackendScope, DataSource, LABEL_SNAPSHOT, TicketReason, Volume,
    VolumeAttachment, quantity_of, tickets_removal_patch,
};
use tessera_runtime::KubeContext;

use super::copy_plan::{self, Step, next_step};
use super::request::{csi_volume, volume_bytes};
use super::{ControllerService, Error, merge_params};
use crate::proto::volume_content_source::Type as SourceType;
use crate::proto::*;
use crate::watch::await_from;
use crate::{existing_id, required, shown};

/// Whether `v` is a snapshot's Volume.
pub fn is_snapshot(v: &Volume) -> bool {
    v.labels().get(LABEL_SNAPSHOT).is_some_and(|l| l == "true")
}

/// The data source of a volume filled from `source`: its directory.
fn data_source(source: &Volume) -> DataSource {
    let root = source.spec.backend.root.trim_end_matches('/');
    DataSource {
        volume: source.name_any(),
        source: format!("{root}/{}", source.name_any()),
    }
}

/// What a CreateVolume fills the new volume from.
pub(super) struct Source {
    /// The snapshot's Volume or the source volume.
    pub volume: Volume,
    /// The request's content source, echoed in the answer.
    pub content: VolumeContentSource,
}

impl Source {
    /// `snapshot X` or `volume X`, for messages.
    pub fn describe(&self) -> String {
        match &self.content.r#type {
            Some(SourceType::Snapshot(_)) => format!("snapshot {}", self.volume.name_any()),
            _ => format!("volume {}", self.volume.name_any()),
        }
    }

    /// The `dataSource` of the new volume.
    pub fn data_source(&self) -> DataSource {
        data_source(&self.volume)
    }

    /// The node a node-local new volume is pinned to: where the source's data is.
    pub fn node(&self) -> Option<String> {
        copy_plan::copy_node(&self.volume, None)
    }
}

impl ControllerService {
    /// The source a CreateVolume names, read and checked: NOT_FOUND when it does not
    /// exist, UNAVAILABLE for a snapshot whose copy is not done.
    pub(super) async fn content_source(
        &self,
        req: &CreateVolumeRequest,
    ) -> Result<Option<Source>, Error> {
        let Some(content) = req.volume_content_source.clone() else {
            return Ok(None);
        };
        let (id, snapshot) = match &content.r#type {
            Some(SourceType::Snapshot(s)) => (s.snapshot_id.as_str(), true),
            Some(SourceType::Volume(v)) => (v.volume_id.as_str(), false),
            None => return Err(Error::ContentSource),
        };
        let not_found = |id: String| {
            if snapshot {
                Error::SnapshotNotFound(id)
            } else {
                Error::VolumeNotFound(id)
            }
        };
        let id = existing_id(id, not_found)?;
        let volume = self
            .volumes()
            .get_opt(id)
            .await
            .context(|| format!("reading Volume {}", shown(id)))?
            .filter(|v| is_snapshot(v) == snapshot && v.metadata.deletion_timestamp.is_none())
            .ok_or_else(|| not_found(shown(id)))?;
        if snapshot && !volume.populated() {
            return Err(Error::SnapshotNotReady(id.into()));
        }
        Ok(Some(Source { volume, content }))
    }

    /// The answer for a created volume: at once without a source, else once its copy
    /// is done (UNAVAILABLE until then, so that the provisioner asks again).
    pub(super) async fn filled(
        &self,
        volume: &Volume,
        source: Option<Source>,
    ) -> Result<CreateVolumeResponse, Error> {
        let mut out = csi_volume(volume)?;
        if let Some(src) = source {
            if let Some((reason, message)) = self.fill(volume, AttacherType::Clone).await? {
                return Err(Error::Populating {
                    volume: volume.name_any(),
                    source_volume: src.describe(),
                    message: format!("{reason}: {message}"),
                });
            }
            out.content_source = Some(src.content);
        }
        Ok(CreateVolumeResponse { volume: Some(out) })
    }

    /// CreateSnapshot: the snapshot's Volume, created once, filled step by step.
    pub(super) async fn snapshot(
        &self,
        req: CreateSnapshotRequest,
    ) -> Result<CreateSnapshotResponse, Error> {
        let csi_name = required("name", &req.name)?;
        let source_id = existing_id(
            required("source_volume_id", &req.source_volume_id)?,
            Error::VolumeNotFound,
        )?;
        let name = super::volume_name(csi_name);
        let _guard = self.inflight.start(&name)?;
        let source = self
            .volumes()
            .get_opt(source_id)
            .await
            .context(|| format!("reading Volume {}", shown(source_id)))?
            .filter(|v| !is_snapshot(v))
            .ok_or_else(|| Error::VolumeNotFound(shown(source_id)))?;
        let existing = self
            .volumes()
            .get_opt(&name)
            .await
            .context(|| format!("reading Volume {name}"))?;
        let snap = match existing {
            Some(s) => {
                let of = s.annotations().get(ANNOTATION_SNAPSHOT_OF).cloned();
                if s.annotations().get(ANNOTATION_CSI_NAME) != Some(&req.name)
                    || of.as_deref() != Some(source_id)
                {
                    return Err(Error::SnapshotNameTaken {
                        name: shown(csi_name),
                        source_volume: of.unwrap_or_default(),
                    });
                }
                if s.metadata.deletion_timestamp.is_some() {
                    return Err(Error::BeingDeleted(name));
                }
                s
            }
            None => {
                self.create_snapshot_volume(&name, csi_name, &source)
                    .await?
            }
        };
        let ready = self.fill(&snap, AttacherType::Snapshot).await?.is_none();
        Ok(CreateSnapshotResponse {
            snapshot: Some(Snapshot {
                size_bytes: i64::try_from(volume_bytes(&snap)?).unwrap_or(i64::MAX),
                snapshot_id: name,
                source_volume_id: source_id.into(),
                creation_time: snap.metadata.creation_timestamp.as_ref().map(|t| {
                    prost_types::Timestamp {
                        seconds: t.0.as_second(),
                        nanos: t.0.subsec_nanosecond(),
                    }
                }),
                ready_to_use: ready,
                group_snapshot_id: String::new(),
            }),
        })
    }

    async fn create_snapshot_volume(
        &self,
        name: &str,
        csi_name: &str,
        source: &Volume,
    ) -> Result<Volume, Error> {
        let node = match source.spec.backend.scope {
            BackendScope::NodeLocal => copy_plan::copy_node(source, None),
            BackendScope::Shared => None,
        };
        let mut labels = self.settings.labels.0.clone();
        labels.insert(LABEL_SNAPSHOT.into(), "true".into());
        let body = json!({
            "apiVersion": "tessera.io/v1alpha1", "kind": "Volume",
            "metadata": {
                "name": name, "labels": labels,
                "annotations": {ANNOTATION_CSI_NAME: csi_name, ANNOTATION_SNAPSHOT_OF: source.name_any()},
            },
            "spec": {
                "size": quantity_of(volume_bytes(source)?), "accessMode": "ReadWriteOnce",
                "backend": {"root": source.spec.backend.root, "scope": source.spec.backend.scope, "node": node},
                "dataSource": data_source(source),
            }
        });
        let created = self.post_volume(name, body, "snapshot Volume").await?;
        info!(snapshot = %name, source = %source.name_any(), "snapshot volume created");
        Ok(created)
    }

    /// DeleteSnapshot: the snapshot's Volume goes; its data follows (cleanup ticket).
    pub(super) async fn delete_snapshot_volume(
        &self,
        req: DeleteSnapshotRequest,
    ) -> Result<DeleteSnapshotResponse, Error> {
        let id = required("snapshot_id", &req.snapshot_id)?;
        if !crate::is_object_name(id) {
            return Ok(DeleteSnapshotResponse {});
        }
        let _guard = self.inflight.start(id)?;
        let Some(v) = self
            .volumes()
            .get_opt(id)
            .await
            .context(|| format!("reading Volume {}", shown(id)))?
        else {
            return Ok(DeleteSnapshotResponse {});
        };
        if !is_snapshot(&v) {
            // Not a snapshot of ours: nothing of that id to delete.
            return Ok(DeleteSnapshotResponse {});
        }
        self.abandon_fill(&v).await?;
        match self.volumes().delete(id, &DeleteParams::default()).await {
            Ok(_) => info!(
                snapshot = id,
                "deleting snapshot (its data is removed through a cleanup ticket)"
            ),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => Err(e).context(|| format!("deleting snapshot Volume {id}"))?,
        }
        Ok(DeleteSnapshotResponse {})
    }

    /// Drive the fill of `dest` from its `dataSource` (see [`copy_plan`]), waiting
    /// within the publish timeout. `None`: populated; else what it waits for.
    pub(super) async fn fill(
        &self,
        dest: &Volume,
        kind: AttacherType,
    ) -> Result<Option<(TicketReason, String)>, Error> {
        let Some(from) = dest.spec.data_source.clone() else {
            return Ok(None);
        };
        let name = dest.name_any();
        let source_ticket = copy_plan::ticket_id(kind.as_str(), &name);
        let restore_ticket = copy_plan::ticket_id("restore", &from.volume);
        let vas = self.attachments();
        if dest.populated() {
            self.drop_tickets(&from.volume, &source_ticket, &name, &restore_ticket)
                .await?;
            return Ok(None);
        }
        let source = self
            .volumes()
            .get_opt(&from.volume)
            .await
            .context(|| format!("reading Volume {}", from.volume))?;
        let source_va = self
            .source_attachment(source.as_ref(), &from.volume)
            .await?;
        let node = source
            .as_ref()
            .and_then(|s| copy_plan::copy_node(s, source_va.as_ref()))
            .or_else(|| dest.spec.backend.node.clone());
        let Some(node) = node else {
            // Never attached anywhere: the source has no data; nor has the copy.
            info!(volume = %name, source = %from.volume, "source never attached: nothing to copy");
            return self.mark_populated(&name, None).await.map(|()| None);
        };
        let deadline = Instant::now() + self.settings.publish_timeout;
        // The first pass uses the attachment read for the copy node; later ones read anew.
        let mut first = Some(source_va);
        loop {
            let dest_va = self.attachment_of(&name).await?;
            let source_va = match first.take() {
                Some(read) => read,
                None => {
                    self.source_attachment(source.as_ref(), &from.volume)
                        .await?
                }
            };
            let step = next_step(
                source_va.as_ref(),
                &source_ticket,
                &dest_va,
                &restore_ticket,
            );
            let waited = match step {
                Step::Done => {
                    self.drop_tickets(&from.volume, &source_ticket, &name, &restore_ticket)
                        .await?;
                    self.mark_populated(&name, Some(&node)).await?;
                    info!(volume = %name, source = %from.volume, "filled");
                    return Ok(None);
                }
                Step::AddSourceTicket => {
                    let t = AttachmentTicket::new(&source_ticket, kind, &node);
                    vas.patch(
                        &from.volume,
                        &merge_params(),
                        &Patch::Merge(t.upsert_patch()),
                    )
                    .await
                    .context(|| format!("adding ticket {source_ticket} to {}", from.volume))?;
                    info!(ticket = %source_ticket, %node, "source ticket added");
                    continue;
                }
                Step::AddRestoreTicket => {
                    let t =
                        AttachmentTicket::new(&restore_ticket, AttacherType::VolumeRestore, &node);
                    vas.patch(&name, &merge_params(), &Patch::Merge(t.upsert_patch()))
                        .await
                        .context(|| format!("adding ticket {restore_ticket} to {name}"))?;
                    info!(ticket = %restore_ticket, %node, "restore ticket added");
                    continue;
                }
                Step::WaitSource(reason, message) => {
                    let va = source_va.expect("a source ticket waits on a source");
                    let id = source_ticket.clone();
                    let wait = await_from(vas.clone(), va, move |va: Option<&VolumeAttachment>| {
                        va.is_none_or(|va| va.ticket_satisfied(&id))
                    });
                    (
                        tokio::time::timeout_at(deadline.into(), wait).await,
                        reason,
                        message,
                    )
                }
                Step::WaitRestore(reason, message) => {
                    let id = restore_ticket.clone();
                    let wait = await_from(
                        vas.clone(),
                        dest_va,
                        move |va: Option<&VolumeAttachment>| {
                            va.is_none_or(|va| va.ticket_satisfied(&id))
                        },
                    );
                    (
                        tokio::time::timeout_at(deadline.into(), wait).await,
                        reason,
                        message,
                    )
                }
            };
            match waited {
                (Ok(res), _, _) => {
                    res?;
                }
                (Err(_), reason, message) => return Ok(Some((reason, message))),
            }
        }
    }

    /// A volume deleted before its fill was done: its ticket on the source goes too
    /// (nothing else would remove it). Its own restore ticket goes with it.
    pub(super) async fn abandon_fill(&self, v: &Volume) -> Result<(), Error> {
        let Some(from) = v.spec.data_source.as_ref().filter(|_| !v.populated()) else {
            return Ok(());
        };
        let name = v.name_any();
        let api = self.attachments();
        let Some(va) = api
            .get_opt(&from.volume)
            .await
            .context(|| format!("reading VolumeAttachment {}", from.volume))?
        else {
            return Ok(());
        };
        let ours: Vec<String> = [AttacherType::Snapshot, AttacherType::Clone]
            .iter()
            .map(|k| copy_plan::ticket_id(k.as_str(), &name))
            .filter(|id| va.spec.attachment_tickets.contains_key(id))
            .collect();
        if !ours.is_empty() {
            api.patch(
                &from.volume,
                &merge_params(),
                &Patch::Merge(tickets_removal_patch(ours.iter().map(String::as_str))),
            )
            .await
            .context(|| format!("removing tickets {ours:?} from {}", from.volume))?;
            info!(tickets = ?ours, source = %from.volume, "fill abandoned: source tickets removed");
        }
        Ok(())
    }

    /// The VolumeAttachment of a fill's `source` (named `name`), read now. None for a
    /// snapshot: it is never written (never published), so nothing needs syncing and a
    /// restore from it copies at once, without mounting it first.
    /// The source Volume's own VolumeAttachment (none for a snapshot). One of a
    /// previous Volume of the same name, or none yet, is waited for (the publish
    /// timeout) until the controller has made the source's.
    async fn source_attachment(
        &self,
        source: Option<&Volume>,
        name: &str,
    ) -> Result<Option<VolumeAttachment>, Error> {
        let Some(source) = source.filter(|s| !is_snapshot(s)) else {
            return Ok(None);
        };
        let api = self.attachments();
        let read = api
            .get_opt(name)
            .await
            .context(|| format!("reading VolumeAttachment {name}"))?;
        if let Some(va) = read.filter(|va| copy_plan::attachment_of(va, source)) {
            return Ok(Some(va));
        }
        let source = source.clone();
        let own = move |va: Option<&VolumeAttachment>| {
            va.is_some_and(|va| copy_plan::attachment_of(va, &source))
        };
        let made = kube::runtime::wait::await_condition(api, name, own);
        match tokio::time::timeout(self.settings.publish_timeout, made).await {
            Ok(Ok(Some(va))) => Ok(Some(va)),
            _ => Err(Error::NoAttachment(name.into())),
        }
    }

    async fn attachment_of(&self, name: &str) -> Result<VolumeAttachment, Error> {
        let api = self.attachments();
        if let Some(va) = api
            .get_opt(name)
            .await
            .context(|| format!("reading VolumeAttachment {name}"))?
        {
            return Ok(va);
        }
        let exists = kube::runtime::wait::await_condition(api, name, |va: Option<&_>| va.is_some());
        match tokio::time::timeout(self.settings.publish_timeout, exists).await {
            Ok(Ok(Some(va))) => Ok(va),
            _ => Err(Error::NoAttachment(name.into())),
        }
    }

    async fn drop_tickets(
        &self,
        source: &str,
        source_ticket: &str,
        dest: &str,
        restore_ticket: &str,
    ) -> Result<(), Error> {
        let api = self.attachments();
        for (va_name, id) in [(dest, restore_ticket), (source, source_ticket)] {
            let Some(va) = api
                .get_opt(va_name)
                .await
                .context(|| format!("reading VolumeAttachment {va_name}"))?
            else {
                continue;
            };
            if va.spec.attachment_tickets.contains_key(id) {
                api.patch(
                    va_name,
                    &merge_params(),
                    &Patch::Merge(tickets_removal_patch([id])),
                )
                .await
                .context(|| format!("removing ticket {id} from {va_name}"))?;
                info!(ticket = id, volume = va_name, "ticket removed");
            }
        }
        Ok(())
    }

    /// Annotate `name` populated, with the node that copied its data (`None`: nothing
    /// was copied), in one change.
    async fn mark_populated(&self, name: &str, filled_on: Option<&str>) -> Result<(), Error> {
        let patch = json!({"metadata": {"annotations": {
            ANNOTATION_POPULATED: "true",
            ANNOTATION_FILLED_ON: filled_on,
        }}});
        let api: Api<Volume> = self.volumes();
        api.patch(name, &merge_params(), &Patch::Merge(&patch))
            .await
            .context(|| format!("marking Volume {name} populated"))?;
        Ok(())
    }
}
