//! Input building: `gather` and `mount_view`.

use super::*;

#[test]
fn mount_view_by_phase_and_deletion() {
    let mut ready_old_spec = mountpod("n", Some(MountPhase::Ready));
    ready_old_spec.metadata.generation = Some(3);
    let mut failed = mountpod("n", Some(MountPhase::Failed));
    failed.status.as_mut().unwrap().last_error = Some("backend root missing".into());
    let mut read_only = mountpod("n", Some(MountPhase::Ready));
    read_only.spec.read_only = true;
    let mut not_shared = failed.clone();
    not_shared.status.as_mut().unwrap().last_error = Some("no marker".into());
    not_shared.status.as_mut().unwrap().conditions = vec![
        serde_json::from_value(serde_json::json!({
            "type": "Ready", "status": "False", "reason": "BackendNotShared",
            "message": "no marker", "lastTransitionTime": "2026-01-01T00:00:00Z"}))
        .unwrap(),
    ];
    let cases: Vec<(&str, MountPod, MountState, bool)> = vec![
        (
            "no status yet",
            mountpod("n", None),
            MountState::Starting,
            false,
        ),
        (
            "pending",
            mountpod("n", Some(MountPhase::Pending)),
            MountState::Starting,
            false,
        ),
        (
            "mounting",
            mountpod("n", Some(MountPhase::Mounting)),
            MountState::Starting,
            false,
        ),
        (
            "ready",
            mountpod("n", Some(MountPhase::Ready)),
            MountState::Ready,
            false,
        ),
        (
            "ready for an older spec",
            ready_old_spec,
            MountState::Starting,
            false,
        ),
        (
            "failed with its error",
            failed.clone(),
            MountState::Failed("backend root missing".into()),
            false,
        ),
        (
            "refused: the node does not share the root",
            not_shared,
            MountState::NotShared("no marker".into()),
            false,
        ),
        (
            "failed without an error",
            mountpod("n", Some(MountPhase::Failed)),
            MountState::Failed("mount failed".into()),
            false,
        ),
        (
            "terminating phase, not yet deleted",
            mountpod("n", Some(MountPhase::Terminating)),
            MountState::Starting,
            false,
        ),
        (
            "ready but deleted",
            deleting(mountpod("n", Some(MountPhase::Ready))),
            MountState::Terminating,
            false,
        ),
        (
            "failed and deleted",
            deleting(failed),
            MountState::Terminating,
            false,
        ),
        ("read-only", read_only, MountState::Ready, true),
    ];
    for (what, mp, state, read_only) in cases {
        assert_eq!(
            mount_view(&mp),
            MountView {
                state,
                read_only,
                removes_data: false,
                populates: false,
            },
            "{what}"
        );
    }
}

#[test]
fn gather_keeps_first_sightings_and_maps_mounts_by_node() {
    let now = t(100);
    let mut va = va(&[
        ticket("seen", AttacherType::CsiAttacher, "n1"),
        ticket("new", AttacherType::Manual, "n2"),
    ]);
    va.status = Some(VolumeAttachmentStatus {
        attachment_ticket_statuses: [
            (
                "seen".to_string(),
                AttachmentTicketStatus {
                    id: "seen".into(),
                    requested_at: Some(t(10)),
                    ..Default::default()
                },
            ),
            // A status without a ticket (removed since) is ignored.
            (
                "gone".to_string(),
                AttachmentTicketStatus {
                    id: "gone".into(),
                    requested_at: Some(t(1)),
                    ..Default::default()
                },
            ),
        ]
        .into(),
        ..Default::default()
    });
    let mps = vec![
        Arc::new(mountpod("n1", Some(MountPhase::Ready))),
        Arc::new(deleting(mountpod("n3", Some(MountPhase::Ready)))),
    ];
    let requested = |first_seen: &[(&str, i64)]| {
        let first_seen = first_seen
            .iter()
            .map(|(id, at)| (id.to_string(), t(*at)))
            .collect();
        let input = gather(
            &volume(AccessMode::ReadWriteOnce),
            &va,
            &mps,
            &first_seen,
            &now,
            |_| true,
        );
        let requested: Vec<(String, Option<Time>)> = input
            .tickets
            .iter()
            .map(|t| (t.ticket.id.clone(), t.requested_at.clone()))
            .collect();
        (input, requested)
    };
    // (first sightings remembered, requestedAt of "new" and "seen")
    type Sighted<'a> = &'a [(&'a str, i64)];
    let cases: [(Sighted, i64, i64); 3] = [
        // A new ticket is seen now; a dated one keeps its date.
        (&[], 100, 10),
        // A ticket seen before and not dated yet keeps its first sighting.
        (&[("new", 50)], 50, 10),
        // The status's date wins over a remembered sighting.
        (&[("new", 50), ("seen", 60)], 50, 10),
    ];
    for (first_seen, new_at, seen_at) in cases {
        assert_eq!(
            requested(first_seen).1,
            vec![
                ("new".to_string(), Some(t(new_at))),
                ("seen".to_string(), Some(t(seen_at)))
            ],
            "{first_seen:?}"
        );
    }
    let (input, _) = requested(&[]);
    assert_eq!(input.tickets[1].ticket, va.spec.attachment_tickets["seen"]);
    let mounts: Vec<(&str, &MountState)> = input
        .mounts
        .iter()
        .map(|(n, m)| (n.as_str(), &m.state))
        .collect();
    assert_eq!(
        mounts,
        vec![("n1", &MountState::Ready), ("n3", &MountState::Terminating)]
    );
    assert_eq!(input.access_mode, AccessMode::ReadWriteOnce);
    assert!(!input.deleting);
    assert_eq!(input.pinned_node, None);
    assert_eq!(input.now, now);
    assert!(input.missing_nodes.is_empty());
}

#[test]
fn gather_names_the_ticket_nodes_that_do_not_exist() {
    let va = va(&[
        ticket("a", AttacherType::Manual, "n1"),
        ticket("b", AttacherType::CsiAttacher, "gone"),
        ticket("c", AttacherType::CsiAttacher, "gone"),
        ticket("d", AttacherType::Cleanup, "never"),
    ]);
    // A MountPod on a node no ticket names is not the tickets' business.
    let mps = vec![Arc::new(mountpod("elsewhere", Some(MountPhase::Ready)))];
    let input = gather(
        &volume(AccessMode::ReadWriteMany),
        &va,
        &mps,
        &Default::default(),
        &t(1),
        |n| n == "n1",
    );
    assert_eq!(
        input.missing_nodes.iter().collect::<Vec<_>>(),
        ["gone", "never"]
    );
}

#[test]
fn gather_reads_deletion_and_the_pin_from_the_volume() {
    let va = va(&[]);
    let now = t(1);
    let with_backend = |scope, node: Option<&str>| {
        let mut v = volume(AccessMode::ReadWriteMany);
        v.spec.backend.scope = scope;
        v.spec.backend.node = node.map(Into::into);
        v
    };
    let cases: Vec<(&str, Volume, bool, Option<&str>)> = vec![
        (
            "shared",
            with_backend(BackendScope::Shared, None),
            false,
            None,
        ),
        (
            "shared, a node named anyway",
            with_backend(BackendScope::Shared, Some("n1")),
            false,
            None,
        ),
        (
            "node-local, not pinned yet",
            with_backend(BackendScope::NodeLocal, None),
            false,
            None,
        ),
        (
            "node-local, pinned",
            with_backend(BackendScope::NodeLocal, Some("n1")),
            false,
            Some("n1"),
        ),
        (
            "deleting",
            deleting(with_backend(BackendScope::Shared, None)),
            true,
            None,
        ),
    ];
    for (what, v, deleting, pinned) in cases {
        let input = gather(&v, &va, &[], &Default::default(), &now, |_| true);
        assert_eq!(
            (input.deleting, input.pinned_node.as_deref()),
            (deleting, pinned),
            "{what}"
        );
        assert_eq!(input.access_mode, AccessMode::ReadWriteMany, "{what}");
        assert!(
            input.tickets.is_empty() && input.mounts.is_empty(),
            "{what}"
        );
    }
}
