//! The RPCs on volumes that exist already: ValidateVolumeCapabilities and ListVolumes
//! read Volume objects (ListVolumes also one list of the VolumeAttachments, for the
//! published nodes); ControllerExpandVolume and ControllerModifyVolume merge-patch a
//! Volume's spec, and the controller and the agents carry the change to the mounts.
//! No tickets, no waits.

use kube::ResourceExt;
use kube::api::{ListParams, Patch};
use serde_json::json;
use tracing::info;

use tessera_api::{Volume, quantity_of};
use tessera_runtime::KubeContext;

use super::request::{compatible, csi_volume, size_for, volume_bytes};
use super::{ControllerService, Error, merge_params, modify, snapshot};
use crate::proto::*;
use crate::{existing_id, required, shown};

impl ControllerService {
    /// The Volume `volume_id`; NOT_FOUND when there is none.
    async fn existing_volume(&self, volume_id: &str) -> Result<Volume, Error> {
        self.volumes()
            .get_opt(volume_id)
            .await
            .context(|| format!("reading Volume {}", shown(volume_id)))?
            .ok_or_else(|| Error::VolumeNotFound(shown(volume_id)))
    }

    pub(super) async fn validate(
        &self,
        req: ValidateVolumeCapabilitiesRequest,
    ) -> Result<ValidateVolumeCapabilitiesResponse, Error> {
        let volume_id = existing_id(
            required("volume_id", &req.volume_id)?,
            Error::VolumeNotFound,
        )?;
        let caps = required("volume_capabilities", &req.volume_capabilities)?;
        let volume = self.existing_volume(volume_id).await?;
        let problems: Vec<String> = caps
            .iter()
            .filter_map(|c| compatible(volume.spec.access_mode, c).err())
            .map(|e| e.to_string())
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
        Ok(ValidateVolumeCapabilitiesResponse {
            confirmed,
            message: problems.join("; "),
        })
    }

    pub(super) async fn list(&self, req: ListVolumesRequest) -> Result<ListVolumesResponse, Error> {
        let start: usize = if req.starting_token.is_empty() {
            0
        } else {
            req.starting_token
                .parse()
                .map_err(|_| Error::BadToken(shown(&req.starting_token)))?
        };
        let selector = self.settings.labels.selector();
        let mut volumes = self
            .volumes()
            .list(&ListParams::default().labels(&selector))
            .await
            .context(|| "listing Volumes".into())?
            .items;
        // A Volume being deleted (its data being removed) is no longer a volume to list,
        // nor is a snapshot's.
        volumes.retain(|v| v.metadata.deletion_timestamp.is_none() && !snapshot::is_snapshot(v));
        volumes.sort_by_key(|v| v.name_any());
        if start > volumes.len() {
            return Err(Error::TokenPastEnd(start));
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
            .context(|| "listing VolumeAttachments".into())?
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
        Ok(ListVolumesResponse {
            entries,
            next_token,
        })
    }

    /// Patch the Volume's spec with what the VolumeAttributesClass asks (nothing
    /// written when it has it already); the MountPods follow (see [`modify`]).
    pub(super) async fn modify(
        &self,
        req: ControllerModifyVolumeRequest,
    ) -> Result<ControllerModifyVolumeResponse, Error> {
        let volume_id = existing_id(
            required("volume_id", &req.volume_id)?,
            Error::VolumeNotFound,
        )?;
        let changes = modify::parse(&req.mutable_parameters)?;
        let _guard = self.inflight.start(volume_id)?;
        let volume = self.existing_volume(volume_id).await?;
        if let Some(mut patch) = modify::patch(&volume, &changes)? {
            // Guarded by the version the changes were computed on.
            patch["metadata"] = json!({"resourceVersion": volume.resource_version()});
            self.volumes()
                .patch(volume_id, &merge_params(), &Patch::Merge(&patch))
                .await
                .context(|| format!("modifying Volume {volume_id}"))?;
            info!(changes = %patch["spec"], "volume modified");
        }
        Ok(ControllerModifyVolumeResponse {})
    }

    pub(super) async fn expand(
        &self,
        req: ControllerExpandVolumeRequest,
    ) -> Result<ControllerExpandVolumeResponse, Error> {
        let volume_id = existing_id(
            required("volume_id", &req.volume_id)?,
            Error::VolumeNotFound,
        )?;
        let range = required("capacity_range", req.capacity_range.as_ref())?;
        let want = size_for(Some(range))?;
        let _guard = self.inflight.start(volume_id)?;
        let volume = self.existing_volume(volume_id).await?;
        let have = volume_bytes(&volume)?;
        if want > have {
            let patch = json!({"spec": {"size": quantity_of(want)}});
            self.volumes()
                .patch(volume_id, &merge_params(), &Patch::Merge(&patch))
                .await
                .context(|| format!("growing Volume {volume_id}"))?;
            info!(
                from = have,
                to = want,
                "volume expanded (the mounts' quota grows online)"
            );
        }
        Ok(ControllerExpandVolumeResponse {
            capacity_bytes: i64::try_from(want.max(have)).unwrap_or(i64::MAX),
            node_expansion_required: false,
        })
    }
}
