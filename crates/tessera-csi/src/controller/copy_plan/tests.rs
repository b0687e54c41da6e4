use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use tonic::Code;

use tessera_api::{
    AttacherType, AttachmentTicket, AttachmentTicketStatus, VolumeAttachmentSpec,
    VolumeAttachmentStatus, VolumeStatus,
};

use super::*;

fn va(tickets: &[(&str, Option<TicketReason>)]) -> VolumeAttachment {
    let mut spec = VolumeAttachmentSpec::default();
    let mut status = VolumeAttachmentStatus::default();
    for (id, reason) in tickets {
        spec.attachment_tickets.insert(
            id.to_string(),
            AttachmentTicket::new(*id, AttacherType::Snapshot, "node-a"),
        );
        if let Some(r) = reason {
            let ok = *r == TicketReason::Attached;
            status.attachment_ticket_statuses.insert(
                id.to_string(),
                AttachmentTicketStatus {
                    id: id.to_string(),
                    satisfied: ok,
                    generation: 0,
                    requested_at: None,
                    conditions: vec![Condition {
                        type_: "Satisfied".into(),
                        status: if ok { "True" } else { "False" }.into(),
                        reason: format!("{r:?}"),
                        message: format!("because {r:?}"),
                        last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                        ),
                        observed_generation: None,
                    }],
                },
            );
        }
    }
    let mut va = VolumeAttachment::new("v", spec);
    va.status = Some(status);
    va
}

#[test]
fn a_fill_goes_source_ticket_then_restore_ticket_then_done() {
    use Step::*;
    use TicketReason as R;
    let (s, r) = ("snapshot-d", "restore-s");
    let none = va(&[]);
    let table: Vec<(Option<VolumeAttachment>, VolumeAttachment, Step)> = vec![
        // Nothing yet: the source ticket first.
        (Some(none.clone()), none.clone(), AddSourceTicket),
        // It waits (the source is being mounted).
        (
            Some(va(&[(s, Some(R::Attaching))])),
            none.clone(),
            WaitSource(R::Attaching, "because Attaching".into()),
        ),
        // No status yet.
        (
            Some(va(&[(s, None)])),
            none.clone(),
            WaitSource(R::Attaching, "waiting for the controller".into()),
        ),
        // Satisfied: now the copy.
        (
            Some(va(&[(s, Some(R::Attached))])),
            none.clone(),
            AddRestoreTicket,
        ),
        // A source that is gone has nothing to sync: straight to the copy.
        (None, none.clone(), AddRestoreTicket),
        // The copy runs; even if the source ticket was interrupted meanwhile, the
        // restore ticket decides.
        (
            Some(va(&[(s, Some(R::Interrupted))])),
            va(&[(r, Some(R::Attaching))]),
            WaitRestore(R::Attaching, "because Attaching".into()),
        ),
        (
            Some(va(&[(s, Some(R::Attached))])),
            va(&[(r, Some(R::MountFailed))]),
            WaitRestore(R::MountFailed, "because MountFailed".into()),
        ),
        (
            Some(va(&[(s, Some(R::Attached))])),
            va(&[(r, Some(R::Attached))]),
            Done,
        ),
        (None, va(&[(r, Some(R::Attached))]), Done),
    ];
    for (i, (source, dest, want)) in table.into_iter().enumerate() {
        assert_eq!(next_step(source.as_ref(), s, &dest, r), want, "row {i}");
    }
}

#[test]
fn the_copy_node_is_where_the_source_is_attached_else_pinned_else_last() {
    let v = |attached: &[&str], pinned: Option<&str>, last: Option<&str>| {
        let mut v: Volume = serde_json::from_value(serde_json::json!({
            "apiVersion": "tessera.io/v1alpha1", "kind": "Volume", "metadata": {"name": "a"},
            "spec": {"size": "1Gi", "accessMode": "ReadWriteOnce", "backend": {"root": "/srv"}}
        }))
        .unwrap();
        v.spec.backend.node = pinned.map(str::to_string);
        v.status = Some(VolumeStatus {
            attached_nodes: attached.iter().map(|s| s.to_string()).collect(),
            last_attached_node: last.map(str::to_string),
            ..Default::default()
        });
        v
    };
    let table = [
        (v(&["n2", "n3"], Some("n1"), Some("n4")), Some("n2")),
        (v(&[], Some("n1"), Some("n4")), Some("n1")),
        (v(&[], None, Some("n4")), Some("n4")),
        (v(&[], None, None), None),
    ];
    for (vol, want) in table {
        assert_eq!(copy_node(&vol, None).as_deref(), want, "{:?}", vol.status);
    }
}

/// The Volume's status is written after its VolumeAttachment's, and may never be
/// written for a fill whose ticket is removed at once: a satisfied ticket and the
/// node a fill recorded with its `populated` annotation count too (a snapshot whose
/// status did not say where it was filled was restored empty, in CI).
#[test]
fn the_copy_node_does_not_wait_for_the_volume_status() {
    let mut snap: Volume = serde_json::from_value(serde_json::json!({
        "apiVersion": "tessera.io/v1alpha1", "kind": "Volume",
        "metadata": {"name": "s", "annotations": {
            tessera_api::ANNOTATION_POPULATED: "true",
            tessera_api::ANNOTATION_FILLED_ON: "n5"}},
        "spec": {"size": "1Gi", "accessMode": "ReadWriteOnce", "backend": {"root": "/srv"}}
    }))
    .unwrap();
    assert_eq!(copy_node(&snap, None).as_deref(), Some("n5"));
    snap.status = Some(VolumeStatus {
        last_attached_node: Some("n4".into()),
        ..Default::default()
    });
    assert_eq!(copy_node(&snap, None).as_deref(), Some("n4"));

    let mut src: Volume = serde_json::from_value(serde_json::json!({
        "apiVersion": "tessera.io/v1alpha1", "kind": "Volume", "metadata": {"name": "a"},
        "spec": {"size": "1Gi", "accessMode": "ReadWriteOnce", "backend": {"root": "/srv"}}
    }))
    .unwrap();
    let mut va: VolumeAttachment = serde_json::from_value(serde_json::json!({
        "apiVersion": "tessera.io/v1alpha1", "kind": "VolumeAttachment",
        "metadata": {"name": "a"},
        "spec": {"volume": "a", "attachmentTickets": {
            "w": {"id": "w", "type": "csi-attacher", "nodeID": "n7", "generation": 1},
            "x": {"id": "x", "type": "manual", "nodeID": "n8", "generation": 1}}},
        "status": {"attachmentTicketStatuses": {
            "x": {"id": "x", "satisfied": false, "generation": 1},
            "w": {"id": "w", "satisfied": true, "generation": 1}}}
    }))
    .unwrap();
    assert_eq!(copy_node(&src, Some(&va)).as_deref(), Some("n7"));
    va.status = None;
    assert_eq!(copy_node(&src, Some(&va)).as_deref(), None, "not satisfied");
    src.status = Some(VolumeStatus {
        attached_nodes: vec!["n2".into()],
        ..Default::default()
    });
    assert_eq!(copy_node(&src, Some(&va)).as_deref(), Some("n2"));
}

#[test]
fn a_fill_is_at_least_the_source_and_never_smaller() {
    const G: i64 = 1 << 30;
    let range = |required: i64, limit: i64| CapacityRange {
        required_bytes: required,
        limit_bytes: limit,
    };
    let have = 2 * G as u64;
    let ok: &[(Option<CapacityRange>, u64)] = &[
        (None, have),
        (Some(range(0, 0)), have),
        (Some(range(2 * G, 0)), have),
        (Some(range(3 * G, 0)), 3 * G as u64),
        (Some(range(0, 5 * G)), have),
        (Some(range(2 * G, 2 * G)), have),
    ];
    for (r, want) in ok {
        assert_eq!(
            fill_size(r.as_ref(), have, "snapshot s").unwrap(),
            *want,
            "{r:?}"
        );
    }
    for r in [range(G, 0), range(0, G), range(G, G)] {
        let e = fill_size(Some(&r), have, "snapshot s").unwrap_err();
        assert_eq!(e.code(), Code::OutOfRange, "{r:?}");
        let msg = e.to_string();
        assert!(
            msg.contains("snapshot s") && msg.contains("2147483648"),
            "{msg}"
        );
    }
}

#[test]
fn ticket_ids_stay_valid_for_long_names() {
    assert_eq!(ticket_id("clone", "pvc-1"), "clone-pvc-1");
    let long = "a".repeat(253);
    let id = ticket_id("snapshot", &long);
    assert!(id.len() <= 253 && id.starts_with("snapshot-"), "{id}");
}

/// A Volume made again under a deleted one's name sees the old VolumeAttachment for a
/// moment: it is not the source's (csi-sanity's clone of a source made anew found it,
/// and its source ticket went with it: NotFound).
#[test]
fn the_sources_attachment_is_its_own_not_a_previous_volumes() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
    let mut source: Volume = serde_json::from_value(serde_json::json!({
        "apiVersion": "tessera.io/v1alpha1", "kind": "Volume",
        "metadata": {"name": "v", "uid": "new"},
        "spec": {"size": "1Gi", "accessMode": "ReadWriteOnce", "backend": {"root": "/srv"}}
    }))
    .unwrap();
    let owned_by = |uid: Option<&str>, deleting: bool| {
        let mut a = va(&[]);
        a.metadata.owner_references = uid.map(|uid| {
            vec![OwnerReference {
                api_version: "tessera.io/v1alpha1".into(),
                kind: "Volume".into(),
                name: "v".into(),
                uid: uid.into(),
                ..Default::default()
            }]
        });
        a.metadata.deletion_timestamp = deleting.then_some(Time(jiff::Timestamp::UNIX_EPOCH));
        a
    };
    assert!(attachment_of(&owned_by(Some("new"), false), &source));
    assert!(!attachment_of(&owned_by(Some("old"), false), &source));
    assert!(!attachment_of(&owned_by(Some("new"), true), &source));
    assert!(!attachment_of(&owned_by(None, false), &source));
    source.metadata.uid = None;
    assert!(!attachment_of(&owned_by(Some(""), false), &source));
}
