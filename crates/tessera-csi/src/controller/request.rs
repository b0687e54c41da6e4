//! What the Controller service reads out of a request, with no I/O: the Volume name
//! of a CSI name, the access mode of a capability, the size of a capacity range, the
//! mount flags, the idle-mount ticket, and the CSI view of a Volume (the StorageClass
//! parameters are [`super::parameters`]'s).

use std::collections::HashMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use sha2::{Digest, Sha256};

use tessera_api::{
    self as api, AccessMode, AttacherType, AttachmentTicket, TOPOLOGY_NODE_KEY, Volume,
    VolumeAttachment,
};

use super::Error;
use crate::is_object_name;
use crate::proto::volume_capability::{AccessType, access_mode};
use crate::proto::{self, CapacityRange, CreateVolumeRequest, VolumeCapability};

/// Default size when a request names none.
pub const DEFAULT_SIZE: u64 = 1 << 30;

/// The Volume object name for a CSI volume name: the name itself when it is a valid
/// object name, else `vol-` and a hash of it (csi-sanity uses spaces and capitals).
pub fn volume_name(csi_name: &str) -> String {
    let valid = is_object_name(csi_name);
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
pub fn access_mode_of(cap: &VolumeCapability) -> Result<AccessMode, Error> {
    if let Some(AccessType::Block(_)) = cap.access_type {
        return Err(Error::Block);
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
        Ok(access_mode::Mode::MultiNodeSingleWriter) => Err(Error::MultiNodeSingleWriter),
        _ => Err(Error::NoAccessMode),
    }
}

/// The access mode a volume needs to serve every capability of a CreateVolume: the
/// first one's, widened to a multi-node mode, and to ReadWriteMany, when a later one
/// asks for it.
pub fn access_mode_for(caps: &[VolumeCapability]) -> Result<AccessMode, Error> {
    let (first, rest) = caps
        .split_first()
        .ok_or(crate::Missing("volume_capabilities"))?;
    let mut mode = access_mode_of(first)?;
    for cap in rest {
        let m = access_mode_of(cap)?;
        if m.is_multi_node() && !mode.is_multi_node() || m == AccessMode::ReadWriteMany {
            mode = m;
        }
    }
    Ok(mode)
}

/// Whether a volume of `mode` can serve capability `cap`.
pub fn compatible(mode: AccessMode, cap: &VolumeCapability) -> Result<(), Error> {
    let want = access_mode_of(cap)?;
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
        Err(Error::Incompatible { have: mode, want })
    }
}

/// The size a capacity range asks for: its required bytes, else the default within
/// its limit.
pub fn size_for(range: Option<&CapacityRange>) -> Result<u64, Error> {
    let (required, limit) = range
        .map(|r| (r.required_bytes, r.limit_bytes))
        .unwrap_or((0, 0));
    if required < 0 || limit < 0 {
        return Err(Error::NegativeCapacity);
    }
    let (required, limit) = (required as u64, limit as u64);
    if required > api::MAX_VOLUME_BYTES {
        return Err(Error::TooLarge(required));
    }
    if limit > 0 && required > limit {
        return Err(Error::CapacityAboveLimit { required, limit });
    }
    Ok(match (required, limit) {
        (0, 0) => DEFAULT_SIZE,
        (0, l) => DEFAULT_SIZE.min(l),
        (r, _) => r,
    })
}

/// Whether an existing volume of `bytes` serves a capacity range.
pub fn size_fits(bytes: u64, range: Option<&CapacityRange>) -> bool {
    let (required, limit) = range
        .map(|r| (r.required_bytes as u64, r.limit_bytes as u64))
        .unwrap_or((0, 0));
    bytes >= required && (limit == 0 || bytes <= limit)
}

/// The mount flags of every mount capability, in order.
pub fn mount_options(caps: &[VolumeCapability]) -> Vec<String> {
    caps.iter()
        .filter_map(|c| match &c.access_type {
            Some(AccessType::Mount(m)) => Some(m.mount_flags.clone()),
            _ => None,
        })
        .flatten()
        .collect()
}

/// The node a node-local volume is created on: the first topology naming one,
/// preferred before requisite.
pub fn topology_node(req: &CreateVolumeRequest) -> Option<String> {
    let reqs = req.accessibility_requirements.as_ref()?;
    reqs.preferred
        .iter()
        .chain(reqs.requisite.iter())
        .find_map(|t| t.segments.get(TOPOLOGY_NODE_KEY).cloned())
}

/// The `idle-mount` ticket that ControllerUnpublish leaves on `node` in place of the
/// CSI ticket `csi_id` it removes, ending `now` + the volume's delay: only when the
/// volume keeps idle mounts, is not being deleted, and the CSI ticket is satisfied
/// (the mount is there to keep). It has the CSI ticket's parameters, so the mount
/// stays as it is (a read-only mount stays read-only).
pub fn idle_ticket(
    volume: &Volume,
    va: &VolumeAttachment,
    csi_id: &str,
    now: jiff::Timestamp,
) -> Option<AttachmentTicket> {
    let delay = volume
        .spec
        .idle_mount_delay_seconds
        .filter(|d| *d > 0)?
        .min(super::parameters::MAX_IDLE_MOUNT_DELAY);
    if volume.metadata.deletion_timestamp.is_some() || !va.ticket_satisfied(csi_id) {
        return None;
    }
    let csi = va.spec.attachment_tickets.get(csi_id)?;
    let id = crate::idle_ticket_id(&volume.name_any(), &csi.node_id);
    let mut t = AttachmentTicket::new(id, AttacherType::IdleMount, &csi.node_id);
    t.parameters = csi.parameters.clone();
    t.expires_at = Some(Time(now + jiff::SignedDuration::from_secs(delay)));
    Some(t)
}

/// The size of a Volume in bytes.
pub fn volume_bytes(v: &Volume) -> Result<u64, Error> {
    api::quantity_bytes(&v.spec.size.0).map_err(|source| Error::Size {
        volume: v.name_any(),
        source,
    })
}

/// A Volume as CSI describes it.
pub fn csi_volume(v: &Volume) -> Result<proto::Volume, Error> {
    let bytes = volume_bytes(v)?;
    let mut ctx = HashMap::new();
    ctx.insert("backendRoot".to_string(), v.spec.backend.root.clone());
    let topology = crate::topology::volume_topology(
        &v.spec.backend.scope,
        &v.spec.backend.root,
        v.spec.backend.node.as_deref(),
    );
    Ok(proto::Volume {
        capacity_bytes: i64::try_from(bytes).unwrap_or(i64::MAX),
        volume_id: v.name_any(),
        volume_context: ctx,
        content_source: None,
        accessible_topology: topology,
    })
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::*;
    use crate::proto::volume_capability;

    fn cap(m: access_mode::Mode) -> VolumeCapability {
        VolumeCapability {
            access_mode: Some(volume_capability::AccessMode { mode: m as i32 }),
            access_type: Some(AccessType::Mount(volume_capability::MountVolume::default())),
        }
    }

    fn code(e: Error) -> Code {
        tonic::Status::from(e).code()
    }

    #[test]
    fn volume_names_from_csi_names() {
        assert_eq!(volume_name("pvc-1234"), "pvc-1234");
        let hashed = volume_name("sanity-Node Service-ABC");
        assert!(hashed.starts_with("vol-") && hashed.len() == 44, "{hashed}");
        assert_eq!(hashed, volume_name("sanity-Node Service-ABC"), "stable");
        assert_ne!(volume_name("-bad"), "-bad");
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
        assert_eq!(size_for(Some(&r(0, 2 << 30))).unwrap(), DEFAULT_SIZE);
        assert_eq!(
            code(size_for(Some(&r(200, 100))).unwrap_err()),
            Code::OutOfRange
        );
        assert_eq!(
            code(size_for(Some(&r(-1, 0))).unwrap_err()),
            Code::InvalidArgument
        );
        assert_eq!(
            code(size_for(Some(&r(i64::MAX, 0))).unwrap_err()),
            Code::OutOfRange
        );
        let max = api::MAX_VOLUME_BYTES as i64;
        assert_eq!(size_for(Some(&r(max, 0))).unwrap(), max as u64);
        assert!(size_for(Some(&r(max + 1, 0))).is_err());
        assert!(size_fits(10, Some(&r(10, 0))));
        assert!(size_fits(10, None));
        assert!(!size_fits(9, Some(&r(10, 0))));
        assert!(!size_fits(101, Some(&r(0, 100))));
    }

    #[test]
    fn capabilities_map_to_access_modes() {
        use access_mode::Mode::*;
        for (mode, want) in [
            (SingleNodeWriter, Some(AccessMode::ReadWriteOnce)),
            (SingleNodeMultiWriter, Some(AccessMode::ReadWriteOnce)),
            (SingleNodeReaderOnly, Some(AccessMode::ReadWriteOnce)),
            (SingleNodeSingleWriter, Some(AccessMode::ReadWriteOncePod)),
            (MultiNodeReaderOnly, Some(AccessMode::ReadOnlyMany)),
            (MultiNodeMultiWriter, Some(AccessMode::ReadWriteMany)),
            (MultiNodeSingleWriter, None),
            (Unknown, None),
        ] {
            assert_eq!(access_mode_of(&cap(mode)).ok(), want, "{mode:?}");
        }
        let block = VolumeCapability {
            access_type: Some(AccessType::Block(volume_capability::BlockVolume {})),
            ..cap(SingleNodeWriter)
        };
        assert_eq!(
            code(access_mode_of(&block).unwrap_err()),
            Code::InvalidArgument
        );
    }

    #[test]
    fn a_create_takes_the_widest_mode_asked() {
        use access_mode::Mode::*;
        for (caps, want) in [
            (vec![SingleNodeWriter], AccessMode::ReadWriteOnce),
            (
                vec![SingleNodeWriter, MultiNodeReaderOnly],
                AccessMode::ReadOnlyMany,
            ),
            (
                vec![MultiNodeReaderOnly, MultiNodeMultiWriter],
                AccessMode::ReadWriteMany,
            ),
            (
                vec![MultiNodeMultiWriter, SingleNodeWriter],
                AccessMode::ReadWriteMany,
            ),
        ] {
            let caps: Vec<_> = caps.into_iter().map(cap).collect();
            assert_eq!(access_mode_for(&caps).unwrap(), want, "{caps:?}");
        }
        assert!(matches!(access_mode_for(&[]), Err(Error::Missing(_))));
    }

    #[test]
    fn compatibility_of_modes() {
        use access_mode::Mode::*;
        for (have, asked, ok) in [
            (AccessMode::ReadWriteOnce, MultiNodeMultiWriter, false),
            (AccessMode::ReadWriteOnce, SingleNodeSingleWriter, true),
            (AccessMode::ReadWriteMany, SingleNodeWriter, true),
            (AccessMode::ReadOnlyMany, MultiNodeReaderOnly, true),
            (AccessMode::ReadOnlyMany, MultiNodeMultiWriter, false),
            (AccessMode::ReadWriteOncePod, SingleNodeWriter, false),
        ] {
            assert_eq!(
                compatible(have, &cap(asked)).is_ok(),
                ok,
                "{have} {asked:?}"
            );
        }
    }

    #[test]
    fn an_unpublish_leaves_an_idle_mount_ticket_only_where_a_mount_is_kept() {
        use tessera_api::{AttachmentTicketStatus, VolumeAttachmentSpec, VolumeAttachmentStatus};
        let volume = |delay: Option<i64>, deleting: bool| -> Volume {
            let mut v: Volume = serde_json::from_value(serde_json::json!({
                "apiVersion": "tessera.io/v1alpha1", "kind": "Volume",
                "metadata": {"name": "v"},
                "spec": {"size": "1Gi", "accessMode": "ReadWriteOnce",
                         "backend": {"root": "/r"}, "idleMountDelaySeconds": delay},
            }))
            .unwrap();
            if deleting {
                v.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::now()));
            }
            v
        };
        let va = |satisfied: bool| {
            let mut csi = AttachmentTicket::new("csi-1", AttacherType::CsiAttacher, "node-a");
            csi.parameters.insert("readOnly".into(), "true".into());
            let mut spec = VolumeAttachmentSpec::default();
            spec.attachment_tickets.insert("csi-1".into(), csi);
            let mut va = VolumeAttachment::new("v", spec);
            let status = AttachmentTicketStatus {
                id: "csi-1".into(),
                satisfied,
                ..Default::default()
            };
            va.status = Some(VolumeAttachmentStatus {
                attachment_ticket_statuses: [("csi-1".to_string(), status)].into(),
                ..Default::default()
            });
            va
        };
        let now = jiff::Timestamp::from_second(1_700_000_000).unwrap();
        let t = idle_ticket(&volume(Some(30), false), &va(true), "csi-1", now).unwrap();
        assert_eq!(t.id, crate::idle_ticket_id("v", "node-a"));
        assert_eq!(t.type_, AttacherType::IdleMount);
        assert_eq!(t.node_id, "node-a");
        assert_eq!(
            t.parameters.get("readOnly").map(String::as_str),
            Some("true")
        );
        assert_eq!(
            t.expires_at,
            Some(Time(now + jiff::SignedDuration::from_secs(30)))
        );
        for (what, v, va, id) in [
            ("no delay", volume(None, false), va(true), "csi-1"),
            ("delay 0", volume(Some(0), false), va(true), "csi-1"),
            (
                "volume being deleted",
                volume(Some(30), true),
                va(true),
                "csi-1",
            ),
            (
                "nothing mounted for it",
                volume(Some(30), false),
                va(false),
                "csi-1",
            ),
            ("no such ticket", volume(Some(30), false), va(true), "csi-2"),
        ] {
            assert_eq!(idle_ticket(&v, &va, id, now), None, "{what}");
        }
    }
}
