//! Status building: the VolumeAttachment's ticket statuses and the Volume's status.

use super::*;

pub(super) fn input_requested(tickets: &[(&str, i64)]) -> Input {
    Input {
        access_mode: AccessMode::ReadWriteOnce,
        deleting: false,
        pinned_node: None,
        tickets: tickets
            .iter()
            .map(|(id, at)| tessera_api::tickets::TicketInput {
                ticket: ticket(id, AttacherType::CsiAttacher, "n1"),
                requested_at: Some(t(*at)),
            })
            .collect(),
        mounts: Default::default(),
        now: t(0),
        missing_nodes: Default::default(),
    }
}

#[test]
fn one_status_per_ticket_with_counts_nodes_and_the_first_waiting() {
    let va = va(&[]);
    let mut later = outcome(false, TicketReason::HeldByOtherNode, "held by a on n1");
    later.generation = 3;
    let d = decision(
        &["n1"],
        &[
            ("a", outcome(true, TicketReason::Attached, "attached to n1")),
            ("b", later),
            (
                "c",
                outcome(false, TicketReason::LowerPriority, "a comes first"),
            ),
        ],
    );
    let input = input_requested(&[("a", 10), ("b", 20), ("c", 30)]);
    let s = attachment_status(&va, &d, &input, &Default::default(), &t(100));
    assert_eq!((s.ticket_count, s.satisfied_count), (3, 1));
    assert_eq!(s.nodes, vec!["n1".to_string()]);
    assert_eq!(s.waiting.as_deref(), Some("b: held by a on n1"));
    assert_eq!(s.observed_generation, Some(7));
    let a = &s.attachment_ticket_statuses["a"];
    assert!(
        a.satisfied && a.conditions.is_empty(),
        "satisfied: no condition: {a:?}"
    );
    assert_eq!((a.generation, &a.requested_at), (0, &Some(t(10))));
    assert_eq!(a.reason(), Some("Attached"));
    let cases = [
        (
            "b",
            false,
            "False",
            "HeldByOtherNode",
            "held by a on n1",
            3,
            20,
        ),
        ("c", false, "False", "LowerPriority", "a comes first", 0, 30),
    ];
    for (id, satisfied, status, reason, message, generation, requested) in cases {
        let ts = &s.attachment_ticket_statuses[id];
        assert_eq!(ts.id, id);
        assert_eq!(ts.satisfied, satisfied, "{id}");
        assert_eq!(ts.generation, generation, "{id}");
        assert_eq!(ts.requested_at, Some(t(requested)), "{id}");
        let c = satisfied_condition(ts);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
            (status, reason, message),
            "{id}"
        );
        assert_eq!(c.last_transition_time, t(100), "{id}: new, so now");
        assert_eq!(c.observed_generation, Some(7), "{id}");
    }
}

#[test]
fn nothing_waits_when_every_ticket_is_satisfied() {
    let d = decision(
        &["n1", "n2"],
        &[
            ("a", outcome(true, TicketReason::Attached, "on n1")),
            ("b", outcome(true, TicketReason::Attached, "on n2")),
        ],
    );
    let s = attachment_status(
        &va(&[]),
        &d,
        &input_requested(&[]),
        &Default::default(),
        &t(1),
    );
    assert_eq!((s.ticket_count, s.satisfied_count), (2, 2));
    assert_eq!(s.waiting, None);
    assert_eq!(s.nodes, vec!["n1".to_string(), "n2".to_string()]);
    assert_eq!(
        s.attachment_ticket_statuses["a"].requested_at, None,
        "not in the input: no sighting"
    );
    let empty = attachment_status(
        &va(&[]),
        &Decision::default(),
        &input_requested(&[]),
        &Default::default(),
        &t(1),
    );
    assert_eq!(
        VolumeAttachmentStatus {
            conditions: vec![],
            ..empty.clone()
        },
        VolumeAttachmentStatus {
            observed_generation: Some(7),
            ..Default::default()
        }
    );
    let ready = &empty.conditions[0];
    assert_eq!(
        (
            ready.type_.as_str(),
            ready.status.as_str(),
            ready.reason.as_str()
        ),
        ("Ready", "True", "TicketsSatisfied")
    );
}

#[test]
fn a_condition_keeps_its_transition_time_until_status_or_reason_change() {
    let input = input_requested(&[("a", 10)]);
    let attaching = decision(
        &["n1"],
        &[(
            "a",
            outcome(false, TicketReason::Attaching, "mounting on n1"),
        )],
    );
    let mut va = va(&[]);
    let s1 = attachment_status(&va, &attaching, &input, &Default::default(), &t(100));
    va.status = Some(s1.clone());
    let cases: Vec<(&str, TicketOutcome, Time)> = vec![
        (
            "same status and reason",
            outcome(false, TicketReason::Attaching, "mounting on n1"),
            t(100),
        ),
        (
            "same status and reason, new message",
            outcome(false, TicketReason::Attaching, "still mounting on n1"),
            t(100),
        ),
        (
            "same status, new reason",
            outcome(false, TicketReason::WaitingForDetach, "n2 detaching"),
            t(200),
        ),
    ];
    for (what, o, transition) in cases {
        let d = decision(&["n1"], &[("a", o)]);
        let s = attachment_status(&va, &d, &input, &Default::default(), &t(200));
        let c = satisfied_condition(&s.attachment_ticket_statuses["a"]);
        assert_eq!(c.last_transition_time, transition, "{what}");
    }
    // Satisfied: no condition at all (`satisfied: true` says it, reason Attached);
    // waiting again after that, a condition from that moment on.
    let d = decision(
        &["n1"],
        &[("a", outcome(true, TicketReason::Attached, "attached to n1"))],
    );
    let satisfied = attachment_status(&va, &d, &input, &Default::default(), &t(200));
    let a = &satisfied.attachment_ticket_statuses["a"];
    assert!(a.satisfied && a.conditions.is_empty(), "{a:?}");
    assert_eq!(a.reason(), Some("Attached"));
    let mut attached = va.clone();
    attached.status = Some(satisfied);
    let again = attachment_status(&attached, &attaching, &input, &Default::default(), &t(300));
    let c = satisfied_condition(&again.attachment_ticket_statuses["a"]);
    assert_eq!(
        (c.reason.as_str(), &c.last_transition_time),
        ("Attaching", &t(300))
    );
    // The same decision later is the same status: nothing to write.
    assert_eq!(
        attachment_status(&va, &attaching, &input, &Default::default(), &t(300)),
        s1
    );
    // A ticket gone from the decision is gone from the status.
    let s = attachment_status(
        &va,
        &Decision::default(),
        &input,
        &Default::default(),
        &t(300),
    );
    assert!(s.attachment_ticket_statuses.is_empty());
}

#[test]
fn newly_satisfied_tickets_and_their_latency() {
    let old = VolumeAttachmentStatus {
        attachment_ticket_statuses: [
            (
                "was".to_string(),
                AttachmentTicketStatus {
                    id: "was".into(),
                    satisfied: true,
                    ..Default::default()
                },
            ),
            (
                "wasnt".to_string(),
                AttachmentTicketStatus {
                    id: "wasnt".into(),
                    satisfied: false,
                    ..Default::default()
                },
            ),
        ]
        .into(),
        ..Default::default()
    };
    let d = decision(
        &["n1"],
        &[
            ("was", outcome(true, TicketReason::Attached, "on n1")),
            ("wasnt", outcome(true, TicketReason::Attached, "on n1")),
            ("new", outcome(true, TicketReason::Attached, "on n1")),
            (
                "blocked",
                outcome(false, TicketReason::LowerPriority, "later"),
            ),
        ],
    );
    assert_eq!(
        newly_satisfied(Some(&old), &d).collect::<Vec<_>>(),
        vec!["new", "wasnt"]
    );
    assert_eq!(
        newly_satisfied(None, &d).collect::<Vec<_>>(),
        vec!["new", "was", "wasnt"]
    );
    // Seconds since each one's first sighting; one the input never saw has none.
    let input = input_requested(&[("was", 1), ("wasnt", 40), ("blocked", 0)]);
    assert_eq!(
        satisfaction_latencies(Some(&old), &d, &input, &t(100)),
        vec![60.0]
    );
    // A clock behind the sighting counts zero, not negative.
    assert_eq!(
        satisfaction_latencies(Some(&old), &d, &input, &t(10)),
        vec![0.0]
    );
}

pub(super) fn ready_on(node: &str) -> Arc<MountPod> {
    Arc::new(mountpod(node, Some(MountPhase::Ready)))
}

pub(super) fn starting_on(node: &str) -> Arc<MountPod> {
    Arc::new(mountpod(node, Some(MountPhase::Mounting)))
}

#[test]
fn volume_state_attached_nodes_and_conditions() {
    let ok = outcome(true, TicketReason::Attached, "on n1");
    let failed = outcome(false, TicketReason::MountFailed, "mount on n1 failed: boom");
    let mut cleanup_mount = mountpod("n1", Some(MountPhase::Ready));
    cleanup_mount.spec.task = MountTask::RemoveData;
    let rwo = volume(AccessMode::ReadWriteOnce);
    // (case, volume, mountpods, decision, state, attached nodes, Attached condition
    // status, reason, message)
    #[allow(clippy::type_complexity)]
    let cases: Vec<(
        &str,
        Volume,
        Vec<Arc<MountPod>>,
        Decision,
        VolumeState,
        Vec<&str>,
        &str,
        &str,
        &str,
    )> = vec![
        (
            "nothing",
            rwo.clone(),
            vec![],
            decision(&[], &[]),
            VolumeState::Detached,
            vec![],
            "False",
            "NotAttached",
            "state Detached",
        ),
        (
            "a mount left, no node chosen",
            rwo.clone(),
            vec![ready_on("n1")],
            decision(&[], &[]),
            VolumeState::Detaching,
            vec![],
            "False",
            "NotAttached",
            "state Detaching",
        ),
        (
            "chosen and ready",
            rwo.clone(),
            vec![ready_on("n1")],
            decision(&["n1"], &[("a", ok.clone())]),
            VolumeState::Attached,
            vec!["n1"],
            "True",
            "MountsReady",
            "mounted and ready on n1",
        ),
        (
            "two chosen, both ready",
            volume(AccessMode::ReadWriteMany),
            vec![ready_on("n2"), ready_on("n1")],
            decision(&["n1", "n2"], &[]),
            VolumeState::Attached,
            vec!["n1", "n2"],
            "True",
            "MountsReady",
            "mounted and ready on n1, n2",
        ),
        (
            "two chosen, one ready",
            volume(AccessMode::ReadWriteMany),
            vec![ready_on("n1"), starting_on("n2")],
            decision(&["n1", "n2"], &[]),
            VolumeState::Attaching,
            vec!["n1"],
            "False",
            "NotAttached",
            "state Attaching",
        ),
        (
            "chosen, mounting",
            rwo.clone(),
            vec![starting_on("n1")],
            decision(&["n1"], &[]),
            VolumeState::Attaching,
            vec![],
            "False",
            "NotAttached",
            "state Attaching",
        ),
        (
            "chosen, no MountPod yet",
            rwo.clone(),
            vec![],
            decision(&["n1"], &[]),
            VolumeState::Attaching,
            vec![],
            "False",
            "NotAttached",
            "state Attaching",
        ),
        (
            "moving: ready elsewhere",
            rwo.clone(),
            vec![ready_on("n1")],
            decision(&["n2"], &[]),
            VolumeState::Detaching,
            vec![],
            "False",
            "NotAttached",
            "state Detaching",
        ),
        (
            "a cleanup mount serves nothing",
            rwo.clone(),
            vec![Arc::new(cleanup_mount)],
            decision(&["n1"], &[]),
            VolumeState::Attaching,
            vec![],
            "False",
            "NotAttached",
            "state Attaching",
        ),
        (
            "a failed mount",
            rwo.clone(),
            vec![ready_on("n1")],
            decision(&["n1"], &[("a", failed.clone())]),
            VolumeState::Faulted,
            vec!["n1"],
            "False",
            "NotAttached",
            "state Faulted",
        ),
        (
            "deleting",
            deleting(rwo.clone()),
            vec![ready_on("n1")],
            decision(&["n1"], &[("a", failed)]),
            VolumeState::Deleting,
            vec!["n1"],
            "False",
            "NotAttached",
            "state Deleting",
        ),
    ];
    for (what, v, mps, d, state, nodes, status, reason, message) in cases {
        let s = volume_status(&v, &mps, &d, &t(100));
        assert_eq!(s.state, Some(state), "{what}");
        assert_eq!(s.attached_nodes, nodes, "{what}");
        assert_eq!(s.capacity, Some(Quantity("1Gi".into())), "{what}");
        assert_eq!(s.observed_generation, Some(4), "{what}");
        let c = &s.conditions[0];
        assert_eq!(
            (
                c.type_.as_str(),
                c.status.as_str(),
                c.reason.as_str(),
                c.message.as_str()
            ),
            ("Attached", status, reason, message),
            "{what}"
        );
        assert_eq!(
            (c.last_transition_time.clone(), c.observed_generation),
            (t(100), Some(4)),
            "{what}"
        );
    }
}

#[test]
fn a_failed_mount_adds_a_faulted_condition_naming_each_ticket() {
    let d = decision(
        &["n1"],
        &[
            ("a", outcome(false, TicketReason::MountFailed, "boom on n1")),
            ("b", outcome(false, TicketReason::MountFailed, "boom again")),
            ("c", outcome(false, TicketReason::LowerPriority, "later")),
        ],
    );
    let s = volume_status(&volume(AccessMode::ReadWriteOnce), &[], &d, &t(1));
    let types: Vec<&str> = s.conditions.iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(types, ["Attached", "Faulted", "Ready", "Stalled"]);
    let f = &s.conditions[1];
    assert_eq!(
        (
            f.type_.as_str(),
            f.status.as_str(),
            f.reason.as_str(),
            f.message.as_str()
        ),
        (
            "Faulted",
            "True",
            "MountFailed",
            "a: boom on n1; b: boom again"
        )
    );
    let fine = volume_status(
        &volume(AccessMode::ReadWriteOnce),
        &[],
        &decision(&[], &[]),
        &t(1),
    );
    assert_eq!(
        fine.conditions
            .iter()
            .map(|c| c.type_.as_str())
            .collect::<Vec<_>>(),
        ["Attached", "Ready"],
        "no Faulted condition without a failure"
    );
}

#[test]
fn the_last_attached_node_and_transition_times_outlive_a_detach() {
    let mut v = volume(AccessMode::ReadWriteOnce);
    let attached = volume_status(&v, &[ready_on("n1")], &decision(&["n1"], &[]), &t(100));
    assert_eq!(attached.last_attached_node.as_deref(), Some("n1"));
    v.status = Some(attached.clone());
    // Nothing changed: the same status, so nothing is written.
    assert_eq!(
        volume_status(&v, &[ready_on("n1")], &decision(&["n1"], &[]), &t(200)),
        attached
    );
    // Detached: the node is remembered, the condition flips at the new time.
    let detached = volume_status(&v, &[], &decision(&[], &[]), &t(300));
    assert_eq!(detached.last_attached_node.as_deref(), Some("n1"));
    assert!(detached.attached_nodes.is_empty());
    assert_eq!(detached.conditions[0].last_transition_time, t(300));
    v.status = Some(detached);
    // Still not attached (another state, same reason): the time stays.
    let attaching = volume_status(&v, &[starting_on("n2")], &decision(&["n2"], &[]), &t(400));
    assert_eq!(attaching.conditions[0].message, "state Attaching");
    assert_eq!(attaching.conditions[0].last_transition_time, t(300));
    assert_eq!(attaching.last_attached_node.as_deref(), Some("n1"));
    // Attached on n2: it becomes the last attached node.
    v.status = Some(attaching);
    let moved = volume_status(&v, &[ready_on("n2")], &decision(&["n2"], &[]), &t(500));
    assert_eq!(moved.last_attached_node.as_deref(), Some("n2"));
    assert_eq!(moved.conditions[0].last_transition_time, t(500));
    // An old status's other fields are not carried over.
    let mut stale = volume(AccessMode::ReadWriteOnce);
    stale.status = Some(VolumeStatus {
        attached_nodes: vec!["n9".into()],
        capacity: Some(Quantity("1Mi".into())),
        ..Default::default()
    });
    let s = volume_status(&stale, &[], &decision(&[], &[]), &t(1));
    assert!(s.attached_nodes.is_empty());
    assert_eq!(s.capacity, Some(Quantity("1Gi".into())));
}
