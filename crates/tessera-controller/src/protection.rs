//! A VolumeAttachment in use is not deleted, and one that was deleted is rebuilt.
//!
//! ```text
//!  VolumeAttachment (finalizer tessera.io/workload-protection, added with it)
//!    deleted ─▶ attachment reconcile: workload tickets satisfied? ─ yes ─▶ keep serving,
//!              │                                                   finalizer stays, Warning
//!              └ no (or its Volume is gone) ─▶ finalizer removed ─▶ gone
//!  gone, Volume still there ─▶ volume reconcile recreates it ─▶ csi-attacher tickets rebuilt
//!    at once from the storage.k8s.io VolumeAttachments of the volume (+ Warning)
//! ```
//!
//! A deleted VolumeAttachment takes every ticket with it, the workloads' too, so deleting
//! one that serves a workload (what a GitOps prune does) would unmount a volume in use.
//! A finalizer rather than an admission policy: it needs nothing installed besides the
//! CRDs and works on any cluster version, the controller sees the attempt (so it can say
//! so in an Event on the Volume), and the garbage collector's deletion of a deleted
//! Volume's VolumeAttachment goes through the same code. The price: the deletion is
//! accepted and waits (the object shows as Terminating) instead of being refused; it
//! completes once no workload ticket is satisfied.

use k8s_openapi::api::core::v1::{CSIPersistentVolumeSource, PersistentVolume};
use k8s_openapi::api::storage::v1::VolumeAttachment as StorageVolumeAttachment;
use kube::ResourceExt;

use tessera_api::ATTACHMENT_FINALIZER;
use tessera_api::tickets::{Decision, is_background};
use tessera_api::{AttacherType, AttachmentTicket, CSI_DRIVER_NAME, VolumeAttachment};

/// Whether `va` carries the finalizer.
pub fn has_finalizer(va: &VolumeAttachment) -> bool {
    va.finalizers().iter().any(|f| f == ATTACHMENT_FINALIZER)
}

/// The workload (not background) tickets of `va` that `decision` satisfies, as
/// `id (type on node)`.
pub fn satisfied_workloads(va: &VolumeAttachment, decision: &Decision) -> Vec<String> {
    va.spec
        .attachment_tickets
        .values()
        .filter(|t| !is_background(t.type_))
        .filter(|t| decision.tickets.get(&t.id).is_some_and(|o| o.satisfied))
        .map(|t| format!("{} ({} on {})", t.id, t.type_, t.node_id))
        .collect()
}

/// The Warning note while a deletion waits for `holders`.
pub fn blocked_note(name: &str, holders: &[String]) -> String {
    format!(
        "VolumeAttachment {name} is being deleted, but workload tickets are satisfied: {}. \
         It stays, and keeps serving them, until no workload ticket is satisfied. \
         Do not delete a VolumeAttachment to detach: remove the tickets (or stop the Pods) instead.",
        holders.join(", ")
    )
}

/// The csi-attacher tickets of volume `volume` as the storage.k8s.io VolumeAttachments
/// of the Tessera driver for it stand for them (same id: the storage object's name;
/// same node; `readOnly` from the persistent volume's CSI source). Attachments being
/// deleted, of other drivers or of other volumes are left out.
pub fn csi_tickets_from_storage(
    volume: &str,
    storage: &[StorageVolumeAttachment],
    pvs: &[PersistentVolume],
) -> Vec<AttachmentTicket> {
    let ours = |csi: &CSIPersistentVolumeSource| {
        csi.driver == CSI_DRIVER_NAME && csi.volume_handle == volume
    };
    let mut tickets: Vec<AttachmentTicket> = storage
        .iter()
        .filter(|s| s.spec.attacher == CSI_DRIVER_NAME && s.metadata.deletion_timestamp.is_none())
        .filter_map(|s| {
            let source = &s.spec.source;
            let csi = match &source.persistent_volume_name {
                Some(pv) => pvs
                    .iter()
                    .find(|p| p.metadata.name.as_deref() == Some(pv.as_str()))?
                    .spec
                    .as_ref()?
                    .csi
                    .clone()?,
                None => source.inline_volume_spec.as_ref()?.csi.clone()?,
            };
            if !ours(&csi) {
                return None;
            }
            let mut t =
                AttachmentTicket::new(s.name_any(), AttacherType::CsiAttacher, &s.spec.node_name);
            t.parameters.insert(
                "readOnly".into(),
                csi.read_only.unwrap_or(false).to_string(),
            );
            Some(t)
        })
        .collect();
    tickets.sort_by(|a, b| a.id.cmp(&b.id));
    tickets
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    use tessera_api::tickets::TicketOutcome;
    use tessera_api::{TicketReason, VolumeAttachmentSpec};

    use super::*;

    fn sva(
        name: &str,
        attacher: &str,
        node: &str,
        source: serde_json::Value,
    ) -> StorageVolumeAttachment {
        serde_json::from_value(json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
            "metadata": {"name": name},
            "spec": {"attacher": attacher, "nodeName": node, "source": source},
        }))
        .unwrap()
    }

    fn pv(name: &str, driver: &str, handle: &str, read_only: Option<bool>) -> PersistentVolume {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": name},
            "spec": {"csi": {"driver": driver, "volumeHandle": handle, "readOnly": read_only}},
        }))
        .unwrap()
    }

    #[test]
    fn csi_tickets_come_from_the_storage_attachments_of_the_volume() {
        let pvs = vec![
            pv("pv-v", CSI_DRIVER_NAME, "v", None),
            pv("pv-v-ro", CSI_DRIVER_NAME, "v", Some(true)),
            pv("pv-other", CSI_DRIVER_NAME, "w", None),
            pv("pv-foreign", "other.csi.io", "v", None),
        ];
        let mut going = sva(
            "csi-going",
            CSI_DRIVER_NAME,
            "n9",
            json!({"persistentVolumeName": "pv-v"}),
        );
        going.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        let storage = vec![
            sva(
                "csi-b",
                CSI_DRIVER_NAME,
                "n2",
                json!({"persistentVolumeName": "pv-v-ro"}),
            ),
            sva(
                "csi-a",
                CSI_DRIVER_NAME,
                "n1",
                json!({"persistentVolumeName": "pv-v"}),
            ),
            sva(
                "csi-other-volume",
                CSI_DRIVER_NAME,
                "n1",
                json!({"persistentVolumeName": "pv-other"}),
            ),
            sva(
                "csi-foreign-pv",
                CSI_DRIVER_NAME,
                "n1",
                json!({"persistentVolumeName": "pv-foreign"}),
            ),
            sva(
                "csi-foreign-attacher",
                "other.csi.io",
                "n1",
                json!({"persistentVolumeName": "pv-v"}),
            ),
            sva(
                "csi-pv-gone",
                CSI_DRIVER_NAME,
                "n1",
                json!({"persistentVolumeName": "pv-gone"}),
            ),
            sva(
                "csi-inline",
                CSI_DRIVER_NAME,
                "n3",
                json!({"inlineVolumeSpec": {"csi": {"driver": CSI_DRIVER_NAME, "volumeHandle": "v"}}}),
            ),
            going,
        ];
        let got: Vec<(String, String, String)> = csi_tickets_from_storage("v", &storage, &pvs)
            .into_iter()
            .map(|t| {
                assert_eq!(t.type_, AttacherType::CsiAttacher);
                (t.id, t.node_id, t.parameters["readOnly"].clone())
            })
            .collect();
        let want = [
            ("csi-a", "n1", "false"),
            ("csi-b", "n2", "true"),
            ("csi-inline", "n3", "false"),
        ];
        assert_eq!(
            got,
            want.map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
        );
    }

    #[test]
    fn only_satisfied_workload_tickets_hold_a_deletion() {
        let tickets = [
            AttachmentTicket::new("csi-a", AttacherType::CsiAttacher, "n1"),
            AttachmentTicket::new("manual-b", AttacherType::Manual, "n2"),
            AttachmentTicket::new("backup-c", AttacherType::Backup, "n1"),
            AttachmentTicket::new("csi-d", AttacherType::CsiAttacher, "n3"),
        ];
        let va = VolumeAttachment::new(
            "v",
            VolumeAttachmentSpec {
                volume: "v".into(),
                attachment_tickets: tickets.iter().map(|t| (t.id.clone(), t.clone())).collect(),
            },
        );
        let outcome = |satisfied| TicketOutcome {
            satisfied,
            reason: if satisfied {
                TicketReason::Attached
            } else {
                TicketReason::Attaching
            },
            message: "m".into(),
            generation: 0,
        };
        let decision = |sat: &[(&str, bool)]| Decision {
            nodes: Default::default(),
            tickets: sat
                .iter()
                .map(|(id, s)| (id.to_string(), outcome(*s)))
                .collect(),
        };
        let cases: [(&str, Decision, Vec<&str>); 4] = [
            (
                "none satisfied",
                decision(&[("csi-a", false), ("manual-b", false)]),
                vec![],
            ),
            (
                "a background ticket does not hold",
                decision(&[("backup-c", true)]),
                vec![],
            ),
            (
                "workloads hold",
                decision(&[
                    ("csi-a", true),
                    ("manual-b", true),
                    ("csi-d", false),
                    ("backup-c", true),
                ]),
                vec!["csi-a (csi-attacher on n1)", "manual-b (manual on n2)"],
            ),
            (
                "an outcome without a ticket does not",
                decision(&[("gone", true)]),
                vec![],
            ),
        ];
        for (what, d, want) in cases {
            assert_eq!(satisfied_workloads(&va, &d), want, "{what}");
        }
        let note = blocked_note("v", &["csi-a (csi-attacher on n1)".into()]);
        assert!(
            note.contains("csi-a") && note.contains("remove the tickets"),
            "{note}"
        );
    }
}
